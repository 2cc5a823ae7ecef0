"""The LM head compressed and run on the accelerator like the other linears: its logits equal
the model-level twin's bit for bit, with and without the vector engine, for a head of its own
and for one tied to the embedding (untied first, the embedding left float)."""

import copy

import pytest
import torch
from compile_testutil import SMALL, tiny_lm, twin_step_logits

from hw.config import VECTOR_PRESET_SPADS
from hw.format import WeightFormat
from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model
from sw.compress.model import compress_llama, untie_head, use_hardware_numerics
from sw.models.recipes import HEAD
from sw.runtime import Runtime

PROMPT, STEPS = 5, 3


def _greedy_on_chip(lm, ws, cfg, exe) -> None:
    """Greedy decoding of ``exe`` on the fast model takes one program a decode step, no host
    work (the token id read back alone), and its tokens equal the twin's."""
    from sw.models.generate import generate

    rt = Runtime(exe, make_backend("model", cfg), vector=True)
    ids = torch.randint(0, lm.config.vocab_size, (1, PROMPT),
                        generator=torch.Generator().manual_seed(4))
    gen = rt.generate(ids[0].tolist(), STEPS + 1, logits=False)
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True, attention=True)
    with torch.no_grad():
        want = generate(twin, ids[0], STEPS + 1)[PROMPT:].tolist()
    assert gen.tokens == want
    decode = [s for s in gen.steps if s.phase == "decode"]
    assert len(decode) == STEPS
    assert all(len(s.programs) == 1 and s.host_wall_s == 0 and s.read_back_bytes <= 4
               for s in decode), decode


@pytest.mark.parametrize("tied", [False, True], ids=["own-head", "tied-head"])
@pytest.mark.parametrize("vector", [False, True], ids=["default", "vector"])
@pytest.mark.parametrize("bits", [8, 4])
def test_head_on_the_accelerator_equals_the_twin(tied, vector, bits):
    lm = tiny_lm(tie_word_embeddings=tied)
    embed = lm.model.embed_tokens.weight.detach().clone()
    untie_head(lm)
    ws = compress_llama(lm, lambda name, _: (WeightFormat("dense", bits, 32) if name == HEAD
                                             else WeightFormat("2:4", 4, 32)),
                        "magnitude", skip=(), progress=False)
    assert HEAD in ws and torch.equal(lm.model.embed_tokens.weight, embed)
    cfg = SMALL.replace(**VECTOR_PRESET_SPADS) if vector else SMALL
    exe = compile_model(lm, cfg, CompileOptions(PROMPT, PROMPT + STEPS), weights=ws)
    assert {p.node for p in exe.programs if p.phase == "decode"} >= {HEAD}  # not on the host
    ids = torch.randint(0, lm.config.vocab_size, (1, PROMPT + STEPS),
                        generator=torch.Generator().manual_seed(3))
    rt = Runtime(exe, make_backend("model", cfg), vector=vector)
    got = [rt.step(ids[:, :PROMPT])[0]] + [rt.step(ids[:, p:p + 1])[0]
                                          for p in range(PROMPT, PROMPT + STEPS)]
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=vector, attention=True)
    for a, b in zip(got, twin_step_logits(twin, ids, PROMPT), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("logits", ["all", "last"])
def test_argmax_after_the_head_picks_the_greedy_token_on_chip(logits):
    """``CompileOptions(argmax=True)`` on the vector engine: the fused program that ends with
    the head's DEQUANT also finds each logits row's first maximum (ARGMAX); the runtime takes
    the last row's index as the greedy token, the index torch.argmax picks from the logits
    read back, and greedy generation equals the twin's."""
    from hw.isa import Vec, VecFunc, decode_program
    from sw.models.generate import generate

    lm = tiny_lm()
    untie_head(lm)
    ws = compress_llama(lm, lambda name, _: (WeightFormat("dense", 8, 32) if name == HEAD
                                             else WeightFormat("2:4", 4, 32)),
                        "magnitude", skip=(), progress=False)
    cfg = SMALL.replace(**VECTOR_PRESET_SPADS)
    exe = compile_model(lm, cfg, CompileOptions(PROMPT, PROMPT + STEPS, logits=logits,
                                                argmax=True), weights=ws)
    heads = [p for p in exe.programs if p.parts and any(m.argmax for m in p.members)]
    assert "decode" in {p.phase for p in heads}
    for p in heads:
        funcs = [i.func for i in decode_program(p.words.view("u1")) if isinstance(i, Vec)]
        assert funcs[-1] == VecFunc.ARGMAX
    rt = Runtime(exe, make_backend("model", cfg), vector=True)
    ids = torch.randint(0, lm.config.vocab_size, (1, PROMPT),
                        generator=torch.Generator().manual_seed(4))
    logits_, _ = rt.step(ids)
    if "prefill" in {p.phase for p in heads}:
        assert rt.argmax == int(torch.argmax(logits_[0, -1]))
    gen = rt.generate(ids[0].tolist(), STEPS + 1)
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True, attention=True)
    with torch.no_grad():
        want = generate(twin, ids[0], STEPS + 1)[PROMPT:].tolist()
    assert gen.tokens == want
    for token, step_logits in zip(gen.tokens, gen.logits, strict=True):
        assert token == int(torch.argmax(step_logits[0, -1]))


def test_a_head_wider_than_the_vector_scratchpads_runs_on_chip_in_segments():
    """A vocabulary of 1,000 on VSMALL (VIN halves of 256 elements, the channel row 1,000
    words): the head's DEQUANT loads each segment's channel words with it, its ARGMAX runs
    per segment and then over the segments' (index, max) pairs (the PAIRS form,
    :func:`hw.isa.argmax_imm`); greedy decoding takes one program a token, no host work
    (the token id read back alone), and its tokens equal the twin's."""
    from compile_testutil import VSMALL

    from hw.config import MemoryModel
    from hw.isa import Vec, VecFunc, argmax_pairs, decode_program

    vocab = 1000
    lm = tiny_lm(vocab=vocab)
    untie_head(lm)
    ws = compress_llama(lm, lambda name, _: (WeightFormat("dense", 8, 32) if name == HEAD
                                             else WeightFormat("2:4", 4, 32)),
                        "magnitude", skip=(), progress=False)
    cfg = VSMALL.replace(memory=MemoryModel(size_bytes=1 << 22))
    assert vocab > cfg.vin_spad_bytes // cfg.vin_word_bytes // 2
    exe = compile_model(lm, cfg, CompileOptions(PROMPT, PROMPT + STEPS, argmax=True),
                        weights=ws)
    (step,) = [p for p in exe.programs if p.phase == "decode" and p.fused_into is None
               and any(m.argmax for m in p.members)]
    argmaxes = [i for i in decode_program(step.words.view("u1"))
                if isinstance(i, Vec) and i.func == VecFunc.ARGMAX]
    assert [int(argmax_pairs(i.imm)) for i in argmaxes][-1] == 1 and len(argmaxes) > 2
    _greedy_on_chip(lm, ws, cfg, exe)


def test_logits_read_back_keep_every_q15_16_word_apart():
    """The host reads a DEQUANT head's logits as float64 (from_fixed): two words never round
    to one value, even from 256 on where float32 would merge neighbours, so the first maximum
    the host finds (the twin's) is the chip's ARGMAX index."""
    import numpy as np

    from hw.numerics import ACT_FRAC, ACT_MAX, from_fixed, from_fixed_torch, to_fixed

    edge = 256 << ACT_FRAC
    words = np.array([edge, edge + 1, ACT_MAX - 1, ACT_MAX, -ACT_MAX, 1, 0])
    got = from_fixed(words)
    assert got.dtype == np.float64 and np.array_equal(to_fixed(got), words)
    assert got[1] > got[0] and got[3] > got[2]
    assert torch.equal(from_fixed_torch(torch.from_numpy(words)), torch.from_numpy(got))
    tie = from_fixed(np.array([edge, edge + 1, edge + 1]))  # float32: all three one value
    assert int(torch.argmax(torch.from_numpy(tie))) == 1


@pytest.mark.slow
def test_a_head_too_long_unrolled_runs_in_loops_after_the_block_loop():
    """A head of 6,000 logits on a 1,024-word instruction memory: alone, unrolled, its GEMM
    does not fit (its own program rolls), nor does the last block's chain with it, so that
    group is fused for a wider memory with the head in double buffers, the step joins, its
    blocks roll into one loop and the head after it into loops of its own (between its
    DEQUANT segments). Greedy decoding then takes one program a token, which fits the
    instruction memory, with no host work, and its tokens equal the twin's."""
    from compile_testutil import VSMALL

    from hw.config import MemoryModel
    from hw.isa import Opcode, decode_fields

    vocab = 6000
    lm = tiny_lm(layers=4, vocab=vocab)
    untie_head(lm)
    ws = compress_llama(lm, lambda name, _: (WeightFormat("dense", 8, 32) if name == HEAD
                                             else WeightFormat("2:4", 4, 32)),
                        "magnitude", skip=(), progress=False)
    cfg = VSMALL.replace(memory=MemoryModel(size_bytes=1 << 22), imem_depth=1024,
                         vin_spad_bytes=4096, vout_spad_bytes=2048)
    exe = compile_model(lm, cfg, CompileOptions(PROMPT, PROMPT + STEPS, argmax=True),
                        weights=ws)
    assert exe.report["phases"]["decode"]["programs_per_step"] == 1
    (step,) = [p for p in exe.programs if p.phase == "decode" and p.fused_into is None
               and any(m.argmax for m in p.members)]
    assert step.instructions <= cfg.imem_depth
    repeats = int((decode_fields(step.words)["opcode"] == Opcode.REPEAT.value).sum())
    assert repeats > 1  # the blocks' loop, then the head's
    _greedy_on_chip(lm, ws, cfg, exe)
