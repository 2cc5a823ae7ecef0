"""The host's work in a decode step: with the whole step one program that picks the greedy
token on chip (the head and ARGMAX on the vector engine), the runtime reads back the token id
and nothing else (a value computed on chip and consumed only on chip stays there), skips the
host nodes whose results nothing reads, keeps no KV state the programs do not read, and the
tokens equal the twin's; ``read_back_all`` reads every node's results back (the same
tokens); ``host_wall_s`` is the wall time of the host work that remains."""

import copy

import numpy as np
import pytest
import torch
from compile_testutil import SMALL, compressed, tiny_lm, twin_step_logits

from hw.config import VECTOR_PRESET_SPADS
from hw.format import WeightFormat
from hw.isa import RegTerm
from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model
from sw.compress.model import compress_llama, untie_head, use_hardware_numerics
from sw.models.generate import generate
from sw.models.recipes import HEAD
from sw.runtime import Runtime, RuntimeFault

PROMPT, STEPS = 6, 4
CFG = SMALL.replace(**VECTOR_PRESET_SPADS)


@pytest.fixture(scope="module")
def model():
    """A tiny model with an INT8 head, compiled with the head and ARGMAX on chip, and its
    vector twin."""
    lm = tiny_lm(layers=2, heads=4, kv_heads=2)
    untie_head(lm)
    ws = compress_llama(lm, lambda name, _: (WeightFormat("dense", 8, 32) if name == HEAD
                                             else WeightFormat("2:4", 4, 32)),
                        "magnitude", skip=(), progress=False)
    exe = compile_model(lm, CFG, CompileOptions(PROMPT, PROMPT + STEPS + 1, argmax=True),
                        weights=ws)
    assert exe.report["phases"]["decode"]["programs_per_step"] == 1
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True, attention=True)
    return lm, exe, twin


def _prompt(lm, seed):
    return torch.randint(0, lm.config.vocab_size, (PROMPT,),
                         generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_decode_step_reads_back_only_the_token_id(model, seed):
    """Greedy generation without logits: every decode step reads back one 4-byte word (the
    token id ARGMAX left), writes nothing (the program reads the token's embedding row from
    the table on chip) and the tokens equal the twin's; the host's work is the nodes the
    step runs (each one a record of its wall time), which are not the embedding lookup, the
    KV append, the rotary positions or any epilogue but the head's token read;
    ``read_back_all`` gives the same tokens and reads every node's results (more bytes,
    every node run, and the STOREs of rows only moves carry on put back: more cycles)."""
    lm, exe, twin = model
    prompt = _prompt(lm, seed)
    with torch.no_grad():
        want = generate(twin, torch.tensor(prompt), STEPS + 1)[PROMPT:].tolist()
    rt = Runtime(exe, make_backend("model", CFG), vector=True)
    gen = rt.generate(prompt, STEPS + 1, logits=False)
    assert gen.tokens == want
    assert all(x is None for x in gen.logits)
    full = Runtime(exe, make_backend("model", CFG), vector=True, read_back_all=True)
    everything = full.generate(prompt, STEPS + 1, logits=False)
    assert everything.tokens == want
    graph = exe.graphs["decode"]
    for st, st_all in zip(gen.steps[1:], everything.steps[1:], strict=True):
        assert st.phase == "decode" and len(st.programs) == 1
        assert st.read_back_bytes == 4 and st.written_bytes == 0
        ran = {h.node for h in st.host}
        assert ran == set(rt._step_plan("decode", st.past + 1, False).runs)
        assert not any(h.op in ("kv_update", "positions", "embed") for h in st.host)
        reads = [h.node for h in st.host if h.op.endswith(":io")]
        assert reads[-1] == HEAD and len(reads) == 2  # the program's start, the token's read
        assert st.host_wall_s == pytest.approx(sum(h.wall_s for h in st.host), rel=1e-12)
        assert {h.node for h in st_all.host} == {n.name for n in graph.nodes}
        assert st_all.read_back_bytes > 100 * st.read_back_bytes
        # read_back_all puts back the STOREs of rows only a move carries on (quiet_rows)
        (joined,) = {p.program for p in st.programs}
        assert exe.programs[joined].quiet_rows
        assert st.cycles < st_all.cycles


def test_a_decode_step_writes_no_words_only_the_registers(model):
    """The decode program (its KV append's sites, rotary rows, softmax counts and embedding
    row relative to run-time registers) runs with its compiled words every step, and the
    registers the host sets are the register table at the step's position and token; the
    KV append's words name registers holding KVLayout.append_terms, one per sum."""
    from hw.isa import decode_program, reg_table_values

    lm, exe, twin = model
    (joined,) = [p for p in exe.programs if p.phase == "decode" and p.fused_into is None]
    layout = exe.kv.layout
    program = decode_program(joined.words.view(np.uint8))
    sites = {(kind, field) for _, kind, field, _ in joined.append_rows}
    assert {"k", "v"} <= {kind for kind, _ in sites}
    for i, kind, field, _ in joined.append_rows:
        held = exe.registers[program[i].reg - 1]
        assert held == layout.append_terms(kind)[field == "imm"], (i, kind, field)
    assert len(exe.registers) == len(set(exe.registers))   # shared where equal
    rt = Runtime(exe, make_backend("model", CFG), vector=True)
    runs, inner = [], rt.backend.run

    def run(words, dram, **kw):
        runs.append((words, kw.get("regs")))
        return inner(words, dram, **kw)

    rt.backend.run = run
    prompt = _prompt(lm, 3)
    gen = rt.generate(prompt, STEPS + 1, logits=False)
    decode = [(w, r) for w, r in runs if w is joined.words]
    assert len(decode) == STEPS
    for k, (_, regs) in enumerate(decode):
        past = PROMPT + k
        assert regs == reg_table_values(exe.registers, past, gen.tokens[k]), k


def test_logits_read_back_only_from_the_head(model):
    """With logits, a decode step reads back the head's rows (and the token), no other node's
    results, and they equal the twin's bit for bit."""
    lm, exe, twin = model
    ids = torch.tensor([_prompt(lm, 5) + _prompt(lm, 6)[:STEPS]])
    rt = Runtime(exe, make_backend("model", CFG), vector=True)
    steps = [rt.step(ids[:, :PROMPT])] + [rt.step(ids[:, p:p + 1])
                                          for p in range(PROMPT, PROMPT + STEPS)]
    head = next(m for p in exe.programs if p.phase == "decode" and p.node == HEAD
                for m in p.members)
    for (logits, st), w in zip(steps, twin_step_logits(twin, ids, PROMPT), strict=True):
        assert torch.equal(logits, w)
        if st.phase == "decode":
            assert st.read_back_bytes == head.dequant_row_bytes + 4


def test_logits_cannot_be_skipped_without_an_argmax_on_chip():
    """Without an ARGMAX after the head (the head on the host here), a step must read its
    logits back: refused with logits=False; generate reads them whatever it is asked."""
    lm = tiny_lm(layers=1)
    exe = compile_model(lm, CFG, CompileOptions(PROMPT, PROMPT + 2, argmax=True),
                        weights=compressed(lm))
    rt = Runtime(exe, make_backend("model", CFG), vector=True)
    assert not rt.argmax_on_chip("prefill") and not rt.argmax_on_chip("decode")
    with pytest.raises(RuntimeFault, match="no greedy token on chip"):
        rt.step(torch.zeros((1, PROMPT), dtype=torch.long), logits=False)
    # sampling, or no ARGMAX: generate reads the logits back
    assert rt.generate(list(range(PROMPT)), 2, logits=False).logits[0] is not None


def test_the_embedding_table_serves_the_decode_steps_rows(model):
    """The decode program's LOADs of the token's embedding rows (``embed_rows``: the first
    norm's input and the first block's residual) read the constant table, every token's row
    as the host's Q15.16 words, relative to the run-time register ``tok`` (one row, the
    table's row stride); the prefill's rows are the host's."""
    from hw.isa import Load, decode_program
    from hw.numerics import to_fixed
    from sw.compile.executable import EMBEDDING_TABLE

    lm, exe, _ = model
    (joined,) = [p for p in exe.programs if p.phase == "decode" and p.embed_rows
                 and p.fused_into is None]
    assert joined.parts and len(joined.embed_rows) >= 1
    rt = Runtime(exe, make_backend("model", CFG), vector=True)
    ((_, row),) = rt._served.items()
    loads = decode_program(joined.words[list(joined.embed_rows)].view(np.uint8))
    table_at = exe.symbols[EMBEDDING_TABLE].addr // CFG.beat_bytes
    assert all(isinstance(ld, Load) and ld.reg and ld.rows == 1
               and exe.registers[ld.reg - 1] == (RegTerm("tok", mul=ld.dram_stride),)
               and ld.dram_stride * CFG.beat_bytes == row
               and table_at <= ld.dram_addr < table_at + row // CFG.beat_bytes for ld in loads)
    table = exe.image[EMBEDDING_TABLE].reshape(lm.config.vocab_size, row)
    w = lm.model.embed_tokens.weight.detach().float().numpy()
    assert np.array_equal(np.ascontiguousarray(table[:, :4 * w.shape[1]]).view("<i4"),
                          to_fixed(w))
    assert not table[:, 4 * w.shape[1]:].any()
    assert exe.symbols[EMBEDDING_TABLE].nbytes >= table.size
    assert not any(p.embed_rows for p in exe.programs if p.phase == "prefill")


def test_the_embed_rows_survive_a_file(model, tmp_path):
    from sw.compile.executable import load, save

    _, exe, _ = model
    back = load(save(exe, tmp_path / "exe.safetensors"))
    assert [p.embed_rows for p in back.programs] == [p.embed_rows for p in exe.programs]


def test_a_dram_too_small_for_the_table_has_the_host_write_the_rows(model):
    """Where the embedding table does not fit the DRAM (the rest does), the compiler places
    none and the host writes each decode token's rows: same tokens, bytes written."""
    from sw.compile.executable import EMBEDDING_TABLE

    lm, exe, twin = model
    table = exe.symbols[EMBEDDING_TABLE].nbytes
    total = exe.report["dram"]["total"]
    small = CFG.with_dram(total - CFG.beat_bytes)
    lm2 = copy.deepcopy(lm)
    fmt = compress_llama(lm2, lambda name, _: (WeightFormat("dense", 8, 32) if name == HEAD
                                               else WeightFormat("2:4", 4, 32)),
                         "magnitude", skip=(), progress=False)
    tight = compile_model(lm2, small, CompileOptions(PROMPT, PROMPT + STEPS + 1, argmax=True),
                          weights=fmt)
    assert EMBEDDING_TABLE not in tight.symbols and table > CFG.beat_bytes
    assert not any(p.embed_rows for p in tight.programs)
    _host_writes_the_rows(lm, twin, tight, small)


def _host_writes_the_rows(lm, twin, exe, cfg):
    """``exe`` (without the embedding table) generates the twin's tokens on ``cfg``, the host
    writing each decode token's embedding rows: its work (the lookup, the program's
    prologue; the token id read back is a run-time parameter)."""
    prompt = _prompt(lm, 3)
    with torch.no_grad():
        want = generate(twin, torch.tensor(prompt), STEPS + 1)[PROMPT:].tolist()
    gen = Runtime(exe, make_backend("model", cfg), vector=True).generate(
        prompt, STEPS + 1, logits=False)
    assert gen.tokens == want
    assert all(st.written_bytes > 0 for st in gen.steps[1:])
    for st in gen.steps[1:]:
        embed, start, head = st.host   # the lookup, the program's start, the token's read
        assert embed.op == "embed" and start.op.endswith(":io") and head.node == HEAD
        assert start.wall_s > 0 and start.io_s > 0   # the rows written; the registers
        assert head.wall_s == 0 and head.io_s > 0


def _format(name: str, _) -> WeightFormat:
    """The model fixture's formats: an INT8 head, 2:4 INT4 elsewhere."""
    return WeightFormat("dense", 8, 32) if name == HEAD else WeightFormat("2:4", 4, 32)


@pytest.fixture(scope="module")
def looped(model):
    """The model of the ``model`` fixture with its decode step's blocks one loop
    (``block_loop=True``; the step fits unrolled too), its weights, and the twin."""
    lm, _, twin = model
    lm = copy.deepcopy(lm)
    ws = compress_llama(lm, _format, "magnitude", skip=(), progress=False)
    exe = compile_model(lm, CFG, CompileOptions(PROMPT, PROMPT + STEPS + 1, argmax=True,
                                                block_loop=True), weights=ws)
    assert exe.report["block_loop"]["looped_programs"] >= 1
    assert exe.report["phases"]["decode"]["programs_per_step"] == 1
    return lm, exe, twin, ws


@pytest.mark.parametrize("seed", [0, 4])
def test_a_looped_decode_step_copies_the_tables_row(looped, seed):
    """A decode step whose blocks are one loop reads the token's embedding row from the
    table too: its program starts with the row's copy into frame 0, whose LOAD is the one
    ``embed_rows`` word; the host writes nothing and reads back the token id, and the
    tokens equal the twin's."""
    from sw.compile.blockloop import instructions
    from sw.compile.executable import EMBEDDING_TABLE

    lm, exe, twin, _ = looped
    (joined,) = [p for p in exe.programs if p.phase == "decode" and p.parts
                 and p.fused_into is None]
    assert joined.embed_rows == (0,)
    load = instructions(joined.words)[0]
    ((served, row),) = Runtime(exe, make_backend("model", CFG), vector=True)._served.items()
    # row tok of the table: the host writes the register, tok times the row's beats
    assert exe.registers[load.reg - 1] == (RegTerm("tok", mul=load.dram_stride),)
    assert load.dram_addr * CFG.beat_bytes == exe.symbols[EMBEDDING_TABLE].addr
    assert load.row_beats * CFG.beat_bytes == load.dram_stride * CFG.beat_bytes == row
    assert served in exe.symbols
    assert exe.symbols[EMBEDDING_TABLE].nbytes == lm.config.vocab_size * row
    prompt = _prompt(lm, seed)
    with torch.no_grad():
        want = generate(twin, torch.tensor(prompt), STEPS + 1)[PROMPT:].tolist()
    gen = Runtime(exe, make_backend("model", CFG), vector=True).generate(
        prompt, STEPS + 1, logits=False)
    assert gen.tokens == want
    for st in gen.steps[1:]:
        assert st.phase == "decode" and len(st.programs) == 1
        assert st.read_back_bytes == 4 and st.written_bytes == 0


def test_a_dram_without_room_for_the_table_beside_the_frames(looped):
    """Where the DRAM holds the frames but not the table beside them, the step still loops
    and the host writes each decode token's row into frame 0: same tokens, bytes written."""
    from sw.compile.executable import EMBEDDING_TABLE

    lm, exe, twin, ws = looped
    small = CFG.with_dram(exe.report["dram"]["total"] - CFG.beat_bytes)
    tight = compile_model(lm, small, CompileOptions(PROMPT, PROMPT + STEPS + 1, argmax=True,
                                                    block_loop=True), weights=ws)
    assert tight.report["block_loop"]["looped_programs"] >= 1
    assert EMBEDDING_TABLE not in tight.symbols
    assert not any(p.embed_rows for p in tight.programs)
    _host_writes_the_rows(lm, twin, tight, small)


def test_a_joined_step_counts_no_host_work_only_its_run_time_parameters(model):
    """A greedy decode step that is one program with the head and ARGMAX on chip: the host
    computes and moves no data (``host_wall_s`` 0, every record's work 0) and its time is
    the run-time parameters' (``host_io_s`` > 0: the registers as the program starts, the
    token id read back); the prefill writes the prompt's rows (work), and a decode step
    that reads its logits back dequantises them (work)."""
    lm, exe, _ = model
    rt = Runtime(exe, make_backend("model", CFG), vector=True)
    gen = rt.generate(_prompt(lm, 7), STEPS + 1, logits=False)
    assert gen.steps[0].host_wall_s > 0
    for st in gen.steps[1:]:
        assert st.host_wall_s == 0 and all(h.wall_s == 0 for h in st.host)
        assert st.host_io_s > 0 and all(h.io_s > 0 for h in st.host)
        assert st.host_io_s == pytest.approx(sum(h.io_s for h in st.host), rel=1e-12)
    _, st = rt.step(torch.tensor([[gen.tokens[-1]]]))   # the logits read back
    (head,) = [h for h in st.host if h.node == HEAD]
    assert head.wall_s > 0 and head.io_s > 0 and st.host_wall_s == head.wall_s


def test_a_step_of_programs_per_layer_counts_its_prologues_as_work():
    """Without the vector engine every linear's prologue quantises its input rows and
    writes them into accelerator memory and its epilogue reads the results back: each
    program's ``:io`` record is work (``wall_s`` > 0), beside the host ops' kernels."""
    lm = tiny_lm(layers=1)
    exe = compile_model(lm, SMALL, CompileOptions(PROMPT, PROMPT + 3), weights=compressed(lm))
    gen = Runtime(exe, make_backend("model", SMALL)).generate(_prompt(lm, 8), 3)
    for st in gen.steps[1:]:
        ios = [h for h in st.host if h.op.endswith(":io")]
        assert len(ios) == len(st.programs) > 1 and st.written_bytes > 0
        assert all(h.wall_s > 0 for h in ios), [(h.node, h.wall_s) for h in ios]
        assert st.host_wall_s > sum(h.wall_s for h in ios) > 0
