"""Compiled models on the backends: outputs bit-exact with the model-level twin for a prefill
and several decode steps, the same cycles on the fast model, the RTL and the netlist, and
clear errors for everything that can go wrong."""

import copy
import dataclasses

import numpy as np
import pytest
import torch
from compile_testutil import SMALL, compressed, tiny_lm, twin_step_logits

from hw.config import AcceleratorConfig, MemoryModel
from hw.format import WeightFormat
from hw.isa import EpilogueMode, Gemm, decode_program, field_location
from sim.backends import make_backend
from sim.random_programs import EQUIVALENCE_CONFIGS
from sw.compile import CompileOptions, PlanError, compile_model
from sw.compress.model import use_hardware_numerics
from sw.runtime import Runtime, RuntimeFault

PROMPT, STEPS = 6, 5


def _ids(lm, n, seed=7):
    return torch.randint(0, lm.config.vocab_size, (1, n),
                         generator=torch.Generator().manual_seed(seed))


def _twin_logits(lm, weights, ids, prompt):
    return twin_step_logits(use_hardware_numerics(copy.deepcopy(lm), weights, attention=True),
                            ids, prompt)


def _run(exe, backend, ids, prompt, vector=False):
    rt = Runtime(exe, backend, vector=vector)
    out, steps = [], []
    for chunk in [ids[:, :prompt]] + [ids[:, p:p + 1] for p in range(prompt, ids.shape[1])]:
        logits, st = rt.step(chunk)
        out.append(logits)
        steps.append(st)
    return out, steps


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize("shape", [(2, 4, 2), (1, 4, 1), (1, 2, 2)], ids=["gqa", "mqa", "mha"])
def test_compiled_model_equals_the_twin_bit_for_bit(shape, fuse):
    layers, heads, kv = shape
    lm = tiny_lm(layers=layers, heads=heads, kv_heads=kv)
    weights = compressed(lm, "2:4" if kv > 1 else "1:4")
    exe = compile_model(lm, SMALL, CompileOptions(PROMPT, PROMPT + STEPS, fuse=fuse),
                        weights=weights)
    ids = _ids(lm, PROMPT + STEPS)
    got, steps = _run(exe, make_backend("model", SMALL), ids, PROMPT)
    for a, b in zip(got, _twin_logits(lm, weights, ids, PROMPT), strict=True):
        assert torch.equal(a, b)
    # per block: q/k/v, scores, values, o, gate/up, down (fused); q, k, v, gate, up apart
    assert all(len(s.programs) == (6 if fuse else 9) * layers for s in steps)
    assert all(s.transitions == 2 * len(s.programs) for s in steps)


def test_reference_model_equals_its_twin():
    from sw.models.reference_model import load_reference
    lm = load_reference()
    weights = compressed(lm, "2:4", 128)
    cfg = AcceleratorConfig()
    exe = compile_model(lm, cfg, CompileOptions(8, 12), weights=weights)
    ids = _ids(lm, 12)
    got, steps = _run(exe, make_backend("model", cfg), ids, 8)
    for a, b in zip(got, _twin_logits(lm, weights, ids, 8), strict=True):
        assert torch.equal(a, b)
    # decode is memory-bound: the programs read every packed weight once per token
    weight_bytes = exe.report["dram"]["weights"]
    read = steps[-1].counter("dram_read_beats") * cfg.beat_bytes
    assert weight_bytes <= read <= 1.1 * weight_bytes


def test_timing_only_gives_the_same_cycles():
    lm = tiny_lm()
    weights = compressed(lm)
    opts = CompileOptions(PROMPT, PROMPT + STEPS)
    exe = compile_model(lm, SMALL, opts, weights=weights)
    ids = _ids(lm, PROMPT + STEPS)
    _, full = _run(exe, make_backend("model", SMALL), ids, PROMPT)
    _, timing = _run(exe, make_backend("model-timing", SMALL), ids, PROMPT)
    fmts = compile_model(lm, SMALL, opts, formats={k: w.fmt for k, w in weights.items()})
    _, meta = _run(fmts, make_backend("model", SMALL), ids, PROMPT)
    for a, b, c in zip(full, timing, meta, strict=True):
        assert a.cycles == b.cycles == c.cycles
        assert [p.counters for p in a.programs] == [p.counters for p in b.programs]


def test_fused_program_takes_fewer_cycles_than_unfused():
    lm = tiny_lm()
    weights = compressed(lm)
    ids = _ids(lm, PROMPT + 2)
    cycles = {}
    for fuse in (True, False):
        exe = compile_model(lm, SMALL, CompileOptions(PROMPT, PROMPT + 2, fuse=fuse),
                            weights=weights)
        _, steps = _run(exe, make_backend("model-timing", SMALL), ids, PROMPT)
        cycles[fuse] = steps[-1].cycles, steps[-1].transitions
    assert cycles[True][0] < cycles[False][0] and cycles[True][1] < cycles[False][1]


# ---------------------------------------------------------------------- RTL and netlist
RTL_CFG = EQUIVALENCE_CONFIGS["2x4"]   # shares the equivalence harness's Verilator build


def _rtl_case():
    # Qwen2: the q/k/v biases climb the ladder in the WIDE_BIAS epilogue with the rest.
    lm = tiny_lm(layers=1, heads=2, kv_heads=1, hidden=32, vocab=32, model_type="qwen2",
                 qkv_bias=True)
    weights = compressed(lm, "2:4", 32)
    exe = compile_model(lm, RTL_CFG, CompileOptions(PROMPT, PROMPT + 2), weights=weights)
    return lm, exe, _ids(lm, PROMPT + 2)


def _agree(name):
    lm, exe, ids = _rtl_case()
    assert any(ins.epilogue == EpilogueMode.WIDE_BIAS for p in exe.programs
               for ins in decode_program(p.words.view(np.uint8)) if isinstance(ins, Gemm))
    model, m_steps = _run(exe, make_backend("model", RTL_CFG), ids, PROMPT)
    other, o_steps = _run(exe, make_backend(name, RTL_CFG), ids, PROMPT)
    for a, b in zip(model, other, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(m_steps, o_steps, strict=True):
        assert [p.cycles for p in a.programs] == [p.cycles for p in b.programs]
        assert [p.counters for p in a.programs] == [p.counters for p in b.programs]


@pytest.mark.rtl
def test_rtl_backend_runs_the_same_executable():
    _agree("rtl")


@pytest.mark.netlist
def test_netlist_backend_runs_the_same_executable():
    _agree("netlist")


# ---------------------------------------------------------------------- faults
def test_bad_inputs_are_refused():
    lm = tiny_lm(layers=1)
    exe = compile_model(lm, SMALL, CompileOptions(4, 6), weights=compressed(lm))
    rt = Runtime(exe, make_backend("model", SMALL))
    with pytest.raises(RuntimeFault, match="compiled for prompts of 4 tokens, got 3"):
        rt.step(torch.zeros((1, 3), dtype=torch.long))
    with pytest.raises(RuntimeFault, match=r"token ids must be in \[0, 64\)"):
        rt.step(torch.full((1, 4), 64))
    rt.step(torch.zeros((1, 4), dtype=torch.long))
    with pytest.raises(RuntimeFault, match="one token"):
        rt.step(torch.zeros((1, 2), dtype=torch.long))
    rt.step(torch.zeros((1, 1), dtype=torch.long))
    rt.step(torch.zeros((1, 1), dtype=torch.long))
    with pytest.raises(RuntimeFault, match="exceeds the executable's max_context=6"):
        rt.step(torch.zeros((1, 1), dtype=torch.long))
    with pytest.raises(RuntimeFault, match="configuration differs"):
        Runtime(exe, make_backend("model", AcceleratorConfig()))


def test_a_model_larger_than_dram_is_refused_with_sizes():
    lm = tiny_lm()
    cfg = AcceleratorConfig(rows=2, cols=8, memory=MemoryModel(size_bytes=1 << 13))
    with pytest.raises(PlanError, match=r"needs [\d,]+ bytes .*packed weights [\d,]+"):
        compile_model(lm, cfg, CompileOptions(4, 8), weights=compressed(lm))


def test_a_stalled_program_reports_the_engine_states():
    lm = tiny_lm(layers=1)
    exe = compile_model(lm, SMALL, CompileOptions(4, 6), weights=compressed(lm))
    pid = exe.program_index("prefill", exe.programs[0].node, 4)
    off, width = field_location("wait")
    words = exe.programs[pid].words.copy()
    gemm = int(np.flatnonzero((words[:, 0] & np.uint64(7)) == 3)[0])   # first GEMM
    mask = np.uint64(((1 << width) - 1) << off)
    words[gemm, 0] = (words[gemm, 0] & ~mask) | np.uint64(12 << off)   # never signalled
    exe.programs[pid] = dataclasses.replace(exe.programs[pid], words=words)
    rt = Runtime(exe, make_backend("model", SMALL))
    with pytest.raises(RuntimeFault, match=r"stopped with DEADLOCK .*COMPUTE waits on event 12"):
        rt.step(torch.zeros((1, 4), dtype=torch.long))
    # the program ran on the runtime's memory in place: what it completed is there; reset()
    # gives the image of a new sequence
    assert not np.array_equal(rt.dram, exe.dram_image())
    rt.reset()
    assert np.array_equal(rt.dram, exe.dram_image())


def test_programs_run_in_place_on_the_runtimes_memory():
    """The fast model works on the runtime's DRAM array (no copy of the memory per program);
    the KV cache the host rewrites every step is a weight stream too, and the logits stay
    those of the twin (the decoded streams follow the bytes: tests/sim/test_model_reuse.py)."""
    lm = tiny_lm(layers=1)
    weights = compressed(lm)
    exe = compile_model(lm, SMALL, CompileOptions(PROMPT, PROMPT + 3), weights=weights)
    ids = _ids(lm, PROMPT + 3)
    rt = Runtime(exe, make_backend("model", SMALL))
    dram = rt.dram
    got = [rt.step(ids[:, :PROMPT])[0]] + [rt.step(ids[:, p:p + 1])[0]
                                           for p in range(PROMPT, PROMPT + 3)]
    assert rt.dram is dram
    for a, b in zip(got, _twin_logits(lm, weights, ids, PROMPT), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("vector", [False, True], ids=["default", "vector"])
def test_timing_memo_gives_the_same_costs(vector):
    """Relocated copies of a program (and repeated host ops) are simulated once with
    ``memo_timing``; the step's cycles and counters are those of simulating every copy --
    also where a node's program is a part of chained programs that differ (the last
    block's chain ends with the final norm, the others with the next block's q/k/v)."""
    lm = tiny_lm(layers=3)
    cfg = SMALL.replace(vin_spad_bytes=2048, vout_spad_bytes=1024) if vector else SMALL
    exe = compile_model(lm, cfg, CompileOptions(PROMPT, PROMPT + 2),
                        formats={k: w.fmt for k, w in compressed(lm).items()})
    assert any(len(p.parts) > 2 for p in exe.programs) == vector
    ids = _ids(lm, PROMPT + 2)
    full = _run(exe, make_backend("model-timing", cfg), ids, PROMPT, vector=vector)[1]
    rt = Runtime(exe, make_backend("model-timing", cfg), memo_timing=True, vector=vector)
    memo = [rt.step(ids[:, :PROMPT])[1]] + [rt.step(ids[:, p:p + 1])[1]
                                            for p in range(PROMPT, PROMPT + 2)]
    for a, b in zip(full, memo, strict=True):
        assert [(p.node, p.cycles, p.counters) for p in a.programs] == \
            [(p.node, p.cycles, p.counters) for p in b.programs]
        assert [h.node for h in a.host] == [h.node for h in b.host]
    assert len(rt.memo) < sum(len(st.programs) + len(st.host) for st in full)


def test_hf_checkpoint_with_gqa_equals_its_twin(tmp_path):
    """A tiny random model saved as a Hugging Face directory and loaded back."""
    from sw.models.hf import load_checkpoint, save_checkpoint
    save_checkpoint(tiny_lm(layers=2, heads=6, kv_heads=2, hidden=48, seed=5), tmp_path)
    lm = load_checkpoint(tmp_path)
    weights = compressed(lm, "2:4", 16)
    exe = compile_model(lm, SMALL, CompileOptions(PROMPT, PROMPT + 3), weights=weights)
    ids = _ids(lm, PROMPT + 3, seed=11)
    got, _ = _run(exe, make_backend("model", SMALL), ids, PROMPT)
    for a, b in zip(got, _twin_logits(lm, weights, ids, PROMPT), strict=True):
        assert torch.equal(a, b)


def test_generation_greedy_and_sampled():
    lm = tiny_lm(layers=1)
    weights = compressed(lm)
    exe = compile_model(lm, SMALL, CompileOptions(4, 10), weights=weights)
    rt = Runtime(exe, make_backend("model", SMALL))
    prompt = [1, 2, 3, 4]
    greedy = rt.generate(prompt, 6)
    twin = use_hardware_numerics(copy.deepcopy(lm), weights, attention=True)
    from sw.models.generate import generate
    assert greedy.tokens == generate(twin, torch.tensor(prompt), 6)[4:].tolist()
    a = rt.generate(prompt, 6, temperature=1.0, top_k=8, seed=3).tokens
    b = rt.generate(prompt, 6, temperature=1.0, top_k=8, seed=3).tokens
    assert a == b and len(a) == 6                         # seeded: reproducible
    assert len(greedy.steps) == 6 and greedy.steps[0].phase == "prefill"


@pytest.mark.parametrize("family", [dict(model_type="qwen2", qkv_bias=True),
                                    dict(model_type="mistral", sliding_window=3)],
                         ids=["qwen2-bias", "mistral-window"])
def test_families_equal_their_twin(family):
    """Qwen2's q/k/v biases are added in the epilogue; Mistral's window (3 positions, shorter
    than the context) is in the mask."""
    lm = tiny_lm(layers=2, **family)
    weights = compressed(lm)
    exe = compile_model(lm, SMALL, CompileOptions(PROMPT, PROMPT + STEPS), weights=weights)
    ids = _ids(lm, PROMPT + STEPS)
    got, _ = _run(exe, make_backend("model", SMALL), ids, PROMPT)
    for a, b in zip(got, _twin_logits(lm, weights, ids, PROMPT), strict=True):
        assert torch.equal(a, b)


def test_timing_memo_tells_formats_apart():
    """Two grouped linears of one shape but different formats are different programs: the
    memo must not replay one's cycles for the other (mixed per-layer formats)."""
    lm = tiny_lm(layers=2)
    names = [n for n, _ in compressed(lm).items()]
    formats = {n: WeightFormat("1:4" if ".0." in n else "dense", 4, 32) for n in names}
    exe = compile_model(lm, SMALL, CompileOptions(PROMPT, PROMPT + 1), formats=formats)
    ids = _ids(lm, PROMPT + 1)
    full = _run(exe, make_backend("model-timing", SMALL), ids, PROMPT)[1]
    rt = Runtime(exe, make_backend("model-timing", SMALL), memo_timing=True)
    memo = [rt.step(ids[:, :PROMPT])[1], rt.step(ids[:, PROMPT:])[1]]
    for a, b in zip(full, memo, strict=True):
        assert [(p.node, p.cycles) for p in a.programs] == [(p.node, p.cycles) for p in b.programs]


def test_step_roofline_fractions_count_the_programs_then_the_host_work():
    """The accelerator's fraction divides the programs' bounds by their cycles; the end-to-end
    fraction adds the host work's estimated on-chip cycles to the denominator."""
    from sw.runtime.runtime import HostRun, ProgramRun, StepStats

    def program(cycles: int, bound: float) -> ProgramRun:
        return ProgramRun("n", 0, None, cycles, {}, 0, 0, 0, bound)

    stats = StepStats("decode", 0, 1, [program(1000, 900.0), program(3000, 2700.0)],
                      [HostRun("norm", "rmsnorm", 0.0, 400), HostRun("n", "gemm:io", 0.0, 600)])
    assert stats.roofline_fraction == 3600 / 4000
    assert stats.roofline_fraction_end_to_end == 3600 / 5000
    assert StepStats("decode", 0, 1).roofline_fraction_end_to_end == 0.0
