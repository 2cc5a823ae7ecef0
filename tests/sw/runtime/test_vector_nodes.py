"""Host ops on the vector engine: on a configuration with one, RMSNorm, softmax, SiLU-gate and
additions are programs of VECs (sw/compile/vector.py, ``schedule_vector``), and the tokens and
logits stay bit-equal to the model-level twin with the vector unit's numerics; without one
(or with ``CompileOptions(vector=False)``) the compilation is what it was."""

import copy
import dataclasses

import numpy as np
import pytest
import torch
from compile_testutil import (
    SMALL,
    VSMALL,
    backends_agree,
    compressed,
    runtime_steps,
    tiny_lm,
    twin_step_logits,
)

from hw.config import AcceleratorConfig, ConfigError, MemoryModel, preset
from hw.isa import Load, Spad, Store, Vec, VecFunc, check, decode_program, relative_instruction
from hw.numerics import (
    norm_eps,
    norm_weight,
    to_fixed,
    value_codes,
    vec_add,
    vec_rmsnorm,
    vec_silu_gate,
    vec_softmax,
)
from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model, fusion, schedule
from sw.compile.errors import LoweringError
from sw.compile.executable import load, save
from sw.compile.ir import OPS
from sw.compile.relocation import lower_vector_template, relocate
from sw.compile.schedule import ELEMENTWISE, vector_tasks
from sw.compress.model import use_hardware_numerics
from sw.models.generate import generate
from sw.runtime import Runtime, RuntimeFault
from sw.runtime.runtime import _set_imm

PROMPT, STEPS = 6, 4
VECTOR_OPS = {name for name, d in OPS.items() if d.vector is not None}


def _ids(lm, n, seed=7):
    return torch.randint(0, lm.config.vocab_size, (1, n),
                         generator=torch.Generator().manual_seed(seed))


def _vecs(program) -> list[Vec]:
    return [i for i in decode_program(program.words.view(np.uint8)) if isinstance(i, Vec)]


def _steps_equal_the_twin(exe, cfg, lm, ws) -> list:
    """Run ``exe`` on the fast model over a prompt and two decode steps; assert every step's
    logits equal the vector twin's bit for bit and return the steps."""
    ids = _ids(lm, PROMPT + 2)
    steps = runtime_steps(Runtime(exe, make_backend("model", cfg), vector=True), ids, PROMPT)
    want = twin_step_logits(use_hardware_numerics(copy.deepcopy(lm), ws, vector=True), ids,
                            PROMPT)
    for (logits, _), w in zip(steps, want, strict=True):
        assert torch.equal(logits, w)
    return steps


# ---------------------------------------------------------------------- end to end
@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_vector_nodes_equal_the_vector_twin_bit_for_bit(fuse):
    lm = tiny_lm()
    ws = compressed(lm)
    exe = compile_model(lm, VSMALL, CompileOptions(PROMPT, PROMPT + STEPS, fuse=fuse),
                        weights=ws)
    vector = [p for p in exe.programs if p.vector is not None]
    assert {p.vector.func for p in vector} == (
        {VecFunc.RMSNORM, VecFunc.SOFTMAX, VecFunc.SILU_GATE, VecFunc.ROPE}
        | (set() if fuse else {VecFunc.ADD}))
    for p in exe.programs:  # a fused program dequantises its GEMMs' outputs on chip
        if p.parts and p.members:
            funcs = {v.func for v in _vecs(p)}
            # requantised on chip, or attention's scores -> softmax -> values (the host's
            # query rows; the probabilities folded on chip)
            assert VecFunc.DEQUANT in funcs
            assert VecFunc.REQUANT in funcs or funcs == {VecFunc.DEQUANT, VecFunc.SOFTMAX,
                                                          VecFunc.FOLD}
            assert p.members and all(m.dequant for m in p.members)
    for p in vector:  # one VEC per row, all of the node's sub-op (a fused part: in its program)
        if p.fused_into is not None:
            assert p.instructions == 0 and exe.programs.index(p) in \
                exe.programs[p.fused_into].parts
            continue
        assert {v.func for v in _vecs(p)} == {p.vector.func}
        assert len(_vecs(p)) == p.vector.rows
    ids = _ids(lm, PROMPT + STEPS)
    steps = runtime_steps(Runtime(exe, make_backend("model", VSMALL), vector=True), ids, PROMPT)
    want = twin_step_logits(use_hardware_numerics(copy.deepcopy(lm), ws, vector=True), ids,
                            PROMPT)
    for (logits, _), w in zip(steps, want, strict=True):
        assert torch.equal(logits, w)
    for _, st in steps:  # the vector ops ran as programs, their conversions as the host's I/O
        assert not {h.op for h in st.host} & VECTOR_OPS
        ran = {v.func for p in st.programs for v in _vecs(exe.programs[p.program])}
        assert {VecFunc.SOFTMAX, VecFunc.RMSNORM, VecFunc.SILU_GATE} <= ran
        # the prologues and epilogues the step runs (a softmax inside a chain reads nothing
        # back: its probabilities are the next part's input on chip)
        assert any(h.op.endswith(":io") and h.unit_cycles > 0 for h in st.host)
        assert all(p.counters.get("vector_elements", 0) > 0 for p in st.programs
                   if exe.programs[p.program].vector is not None)


@pytest.mark.parametrize("backends", [("model",), pytest.param(
    ("model", "rtl"), marks=[pytest.mark.rtl, pytest.mark.slow])], ids=["model", "rtl"])
def test_silu_gate_segments_beside_the_up_gemm_keep_the_twins_tokens(monkeypatch, backends):
    """Every decode SILU_GATE cut into segments beside the up projection's GEMM
    (sw.compile.fusion.silu_segments with SILU_SEGMENT_MARGIN 0: a tiny model's GEMMs stream
    too few weights per segment for the real margin): each step's logits equal the vector
    twin's bit for bit on the fast model and, on the RTL (the equivalence harness's
    vector configuration), also equal the fast model's, step for step and cycle for
    cycle."""
    monkeypatch.setattr(fusion, "SILU_SEGMENT_MARGIN", 0)
    if "rtl" in backends:
        from sim.random_programs import EQUIVALENCE_CONFIGS
        # what its 32 KiB hold: a 48-wide MLP, cut into three segments of one tile (16
        # lanes) each
        monkeypatch.setattr(fusion, "dequant_segment_beats", lambda cfg, beats: 4)
        cfg, lm, segments = EQUIVALENCE_CONFIGS["4x4"], tiny_lm(
            layers=1, heads=2, kv_heads=1, hidden=32, vocab=32), 3
    else:
        cfg, lm, segments = VSMALL, tiny_lm(hidden=96), 3  # 144 wide: three
    ws = compressed(lm, "2:4", 32)
    exe = compile_model(lm, cfg, CompileOptions(PROMPT, PROMPT + 2), weights=ws)
    silu = [sum(v.func == VecFunc.SILU_GATE for v in _vecs(p)) for p in exe.programs
            if p.parts and p.phase == "decode"]  # a VEC per segment of the one row
    assert max(silu) == segments * lm.config.num_hidden_layers  # the step is one program
    ids = _ids(lm, PROMPT + 2, seed=5)
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True)
    want = twin_step_logits(twin, ids, PROMPT)
    runs = backends_agree(exe, cfg, ids, PROMPT, backends)
    for (a, _), w in zip(runs[0], want, strict=True):
        assert torch.equal(a, w)


@pytest.mark.parametrize("kv_bits", [8, 4])
def test_the_attention_program_reads_the_hosts_value_codes(kv_bits):
    """The values run inside each layer's attention program: its values members name the
    value codes the host writes (one per member), and after a decode step each holds
    the value rows' integer amax the host keeps (value_codes of their scales here), for every
    cached position (INT8 and INT4 caches: qmax 127 and 7); the tokens equal the twin's
    (the step's logits)."""
    lm = tiny_lm(layers=2, heads=4, kv_heads=2)
    ws = compressed(lm)
    opts = CompileOptions(PROMPT, PROMPT + 2, kv_bits=kv_bits, one_program=False)
    exe = compile_model(lm, VSMALL, opts, weights=ws)
    # read_back_all: the host keeps the KV state of positions appended on chip too
    rt = Runtime(exe, make_backend("model", VSMALL), vector=True, read_back_all=True)
    ids = _ids(lm, PROMPT + 1)
    (logits, _), (last, st) = runtime_steps(rt, ids, PROMPT)
    s = PROMPT + 1
    qmax = 127 if kv_bits == 8 else 7
    fused = [exe.programs[r.program] for r in st.programs if r.node.endswith(".scores")]
    # each layer's attention, then (a decode step) the chain from its o_proj on
    assert len(fused) == 2 and all(len(p.parts) > 3 for p in fused)
    assert [exe.programs[p.parts[3]].node for p in fused] == [
        f"layers.{i}.self_attn.o_proj" for i in range(2)]
    for p in fused:
        values = exe.programs[p.parts[2]]
        layer = int(values.node.split(".")[1])
        want = rt.value_amax[layer][0, :, :s].numpy()
        # the values' integer amax: their scales' integers (no row here is zero or wide)
        assert np.array_equal(want, value_codes(rt.scales[(layer, "v")][0, :, :s], qmax))
        assert [m.codes for m in values.members] == [f"vc:{layer}:{h}" for h in range(2)]
        for h, m in enumerate(values.members):
            at = exe.symbols[m.codes].addr
            got = rt.dram[at:at + 4 * s].view("<i4")
            assert np.array_equal(got, want[h]) and got.max() > 0
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, attention=True, kv_bits=kv_bits,
                                 vector=True)
    want = twin_step_logits(twin, ids, PROMPT)
    assert torch.equal(logits, want[0]) and torch.equal(last, want[-1])


def test_a_decode_step_runs_no_vector_op_on_the_host():
    lm = tiny_lm()
    ws = compressed(lm)
    opts = CompileOptions(PROMPT, PROMPT + 2)
    runs, exes = {}, {}
    for cfg, fuse, chain in ((SMALL, None, True), (VSMALL, False, True), (VSMALL, True, False),
                             (VSMALL, True, True)):
        exe = compile_model(lm, cfg, dataclasses.replace(opts, fuse_programs=fuse,
                                                         chain_programs=chain), weights=ws)
        rt = Runtime(exe, make_backend("model", cfg), vector=True)
        runs[cfg.has_vector, fuse, chain] = runtime_steps(rt, _ids(lm, PROMPT + 2), PROMPT)[-1][1]
        exes[cfg.has_vector, fuse, chain] = exe
    host_ops = {h.op for h in runs[False, None, True].host}
    assert {"rmsnorm", "rope", "softmax", "silu_gate"} <= host_ops
    assert not {h.op for h in runs[True, False, True].host} & VECTOR_OPS
    # one more program per vector node: 2 RMSNorms, 2 RoPEs (q, k), softmax, SiLU-gate per
    # block + the final norm
    blocks = lm.config.num_hidden_layers
    unfused = len(runs[True, False, True].programs)
    assert unfused == len(runs[False, None, True].programs) + 6 * blocks + 1
    # fused: each block's RMSNorms and SiLU-gate run in the program of the linear after them,
    # its softmax and values in the scores' program
    assert len(runs[True, True, False].programs) == unfused - 5 * blocks
    report = exes[True, True, False].report["phases"]["decode"]
    assert report["fused_programs_per_step"] == 4 * blocks
    # chained: a block's o_proj (REQUANT of the host's rows -> GEMM -> DEQUANT -> ADD) and
    # MLP (post-attention RMSNorm -> gate/up -> SiLU-gate -> down + ADD) and the next block's
    # RMSNorm -> q/k/v -> RoPE of q and k (the last block's: the final norm) in one program
    # after its scores -> softmax -> values (whose rows are o_proj's input rows on chip): a
    # program per block and the first block's RMSNorm -> q/k/v -> RoPEs (unfused - 11 *
    # blocks == 1 + blocks), joined into one program per step (the KV append on chip)
    assert unfused - 11 * blocks == 1 + blocks
    assert len(runs[True, True, True].programs) == 1
    report = exes[True, True, True].report["phases"]["decode"]
    assert report["fused_programs_per_step"] == 1
    for key, st in runs.items():
        assert st.transitions == 2 * len(st.programs)
        assert exes[key].report["phases"]["decode"]["programs_per_step"] == len(st.programs)


def test_a_chain_too_long_for_the_instruction_memory_falls_back_to_its_pairs(monkeypatch):
    """With an instruction memory that holds every pair's fused program but no chain, the
    decode step runs the pairs, and its tokens still equal the twin's (the step's programs
    not joined: the chains alone). The WGT scratchpad holds two weight chunks (no ring:
    sw.compile.schedule.ring_slots) and a DEQUANT's row is one task (not cut into tiles:
    sw.compile.schedule.dequant_segment_beats), so a power of two lies between the pairs and
    the chains."""
    monkeypatch.setattr(schedule, "DEQUANT_TILES", 1 << 20)
    lm = tiny_lm()
    ws = compressed(lm)
    opts = CompileOptions(PROMPT, PROMPT + 2, one_program=False)
    small = VSMALL.replace(wgt_spad_bytes=1024)
    chained = compile_model(lm, small, opts, weights=ws)
    pairs = compile_model(lm, small, dataclasses.replace(opts, chain_programs=False),
                          weights=ws)
    def linear(exe):  # fused programs of linears (attention's scores -> softmax aside)
        return [p for p in exe.programs if p.parts and p.phase == "decode" and not p.imm_rows]

    longest_pair = max(p.instructions for p in linear(pairs))
    fused = linear(chained)
    assert fused and all(len(p.parts) > 2 for p in fused)   # every pair is in a chain
    depth = 1 << (longest_pair - 1).bit_length()
    assert all(p.instructions > depth for p in fused)
    cfg = small.replace(imem_depth=depth)
    exe = compile_model(lm, cfg, opts, weights=ws)
    decode = linear(exe)
    assert decode and all(len(p.parts) == 2 for p in decode)
    blocks = lm.config.num_hidden_layers
    assert exe.report["phases"]["decode"]["fused_programs_per_step"] == 4 * blocks
    steps = _steps_equal_the_twin(exe, cfg, lm, ws)
    assert len(steps[-1][1].programs) == exe.report["phases"]["decode"]["programs_per_step"]


def test_softmax_valid_counts_are_set_per_step_without_recompiling():
    """Decode contexts of one bucket share a softmax program; each row's VEC counts its valid
    positions (``imm``) from the run-time register ``pos``, which the host sets with the
    start: it writes no word."""
    lm = tiny_lm(layers=1)
    ws = compressed(lm)
    exe = compile_model(lm, VSMALL, CompileOptions(PROMPT, PROMPT + STEPS), weights=ws)
    softmax = [p for p in exe.programs if p.vector and p.vector.func == VecFunc.SOFTMAX]
    decode = [p for p in softmax if p.phase == "decode"]
    assert len(decode) == 1 and decode[0].bucket == 16   # contexts 7..10: one bucket
    heads = lm.config.num_attention_heads
    assert len(decode[0].imm_rows) == heads
    prefill = next(p for p in softmax if p.phase == "prefill")
    assert len(prefill.imm_rows) == heads * PROMPT
    rt = Runtime(exe, make_backend("model", VSMALL), vector=True, trace=True)
    seen = []
    real = rt.backend.run

    def spy(words, dram, **kw):
        seen.append((words, kw.get("regs")))
        return real(words, dram, **kw)
    rt.backend.run = spy
    runtime_steps(rt, _ids(lm, PROMPT + STEPS), PROMPT)
    runs = [([v for v in decode_program(w.view(np.uint8))
              if isinstance(v, Vec) and v.func == VecFunc.SOFTMAX], regs) for w, regs in seen]
    runs = [(v, regs) for v, regs in runs if v]
    imms = [[relative_instruction(v, regs).imm for v in vecs] for vecs, regs in runs]
    assert imms[0] == [t + 1 for _ in range(heads) for t in range(PROMPT)]  # causal prefill
    assert imms[1:] == [[p + 1] * heads for p in range(PROMPT, PROMPT + STEPS)]
    # the words themselves are the same every decode step
    assert all(vecs == runs[1][0] for vecs, _ in runs[1:])


def test_a_sliding_window_keeps_the_softmax_on_the_host():
    """A window shorter than the context masks a row's first positions: SOFTMAX's ``imm``
    cannot say that, so the softmax stays a host op (the rest still runs on the engine)."""
    lm = tiny_lm(model_type="mistral", sliding_window=4)
    ws = compressed(lm)
    exe = compile_model(lm, VSMALL, CompileOptions(PROMPT, PROMPT + STEPS), weights=ws)
    funcs = {p.vector.func for p in exe.programs if p.vector is not None}
    assert VecFunc.RMSNORM in funcs and VecFunc.SOFTMAX not in funcs
    ids = _ids(lm, PROMPT + STEPS)
    steps = runtime_steps(Runtime(exe, make_backend("model", VSMALL), vector=True), ids, PROMPT)
    want = twin_step_logits(use_hardware_numerics(copy.deepcopy(lm), ws, vector=True), ids,
                            PROMPT)
    for (logits, st), w in zip(steps, want, strict=True):
        assert torch.equal(logits, w)
        assert "softmax" in {h.op for h in st.host}


def test_a_part_moved_up_in_vin_keeps_its_codes_inside_it():
    """A 128-wide model on VSMALL: the KV append's part, moved above the VIN of the part
    before it (sw.compile.fusion._vin_moved), would read an INSERT's codes (``length`` words
    from ``b_addr``, as the fetch unit checks them) past the end of VIN and stop with
    BAD_ADDRESS; it stays where it was, and the logits equal the vector twin's."""
    lm = tiny_lm(hidden=128)
    ws = compressed(lm)
    exe = compile_model(lm, VSMALL, CompileOptions(PROMPT, PROMPT + 2), weights=ws)
    _steps_equal_the_twin(exe, VSMALL, lm, ws)


def test_reference_model_tokens_equal_the_vector_twin():
    from sw.models.reference_model import load_reference
    lm = load_reference()
    ws = compressed(lm, "2:4", 128)
    cfg = preset("vector")
    prompt, new = 8, 4
    exe = compile_model(lm, cfg, CompileOptions(prompt, prompt + new), weights=ws)
    assert any(p.vector is not None for p in exe.programs)
    ids = _ids(lm, prompt)
    gen = Runtime(exe, make_backend("model", cfg), vector=True).generate(ids[0].tolist(), new)
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True)
    assert gen.tokens == generate(twin, ids[0], new)[prompt:].tolist()


# ---------------------------------------------------------------------- as before without it
def test_without_the_engine_the_compilation_is_unchanged():
    lm = tiny_lm()
    ws = compressed(lm)
    opts = CompileOptions(PROMPT, PROMPT + STEPS)
    plain = compile_model(lm, SMALL, opts, weights=ws)
    off = compile_model(lm, VSMALL, CompileOptions(PROMPT, PROMPT + STEPS, vector=False),
                        weights=ws)
    assert not any(_vecs(p) for p in plain.programs)
    assert all(OPS[plain.graphs[p.phase].node(p.node).op].streams for p in plain.programs)
    assert len(plain.programs) == len(off.programs)
    for a, b in zip(plain.programs, off.programs, strict=True):
        assert np.array_equal(a.words, b.words) and a.members == b.members
    assert plain.symbols == off.symbols
    # the default configuration keeps its dictionary (and so its fingerprint)
    assert preset("default") == AcceleratorConfig()
    assert "vin_spad_bytes" not in AcceleratorConfig().to_dict()
    assert preset("vector").fingerprint != AcceleratorConfig().fingerprint


def test_a_vector_executable_needs_the_vector_numerics_and_survives_a_file(tmp_path):
    lm = tiny_lm(layers=1)
    exe = compile_model(lm, VSMALL, CompileOptions(4, 6), weights=compressed(lm))
    with pytest.raises(RuntimeFault, match="vector=True"):
        Runtime(exe, make_backend("model", VSMALL))
    again = load(save(exe, tmp_path / "exe.safetensors"))
    assert [(p.vector, p.imm_rows, p.fused_into, p.parts, p.work, p.members, p.position_rows)
            for p in again.programs] \
        == [(p.vector, p.imm_rows, p.fused_into, p.parts, p.work, p.members, p.position_rows)
            for p in exe.programs]
    assert any(p.parts and p.position_rows for p in again.programs)
    assert any(m.dequant for p in again.programs for m in p.members)
    assert any(p.parts for p in again.programs)
    ids = _ids(lm, 6)
    a = runtime_steps(Runtime(exe, make_backend("model", VSMALL), vector=True), ids, 4)
    b = runtime_steps(Runtime(again, make_backend("model", VSMALL), vector=True), ids, 4)
    for (x, _), (y, _) in zip(a, b, strict=True):
        assert torch.equal(x, y)


def test_preset_names_are_checked():
    with pytest.raises(ConfigError, match="vector"):
        preset("vectr")


# ---------------------------------------------------------------------- the programs alone
_FUNCS = {
    VecFunc.ADD: lambda a, b, w, imm: vec_add(a, b),
    VecFunc.SILU_GATE: lambda a, b, w, imm: vec_silu_gate(a, b),
    VecFunc.RMSNORM: lambda a, b, w, imm: vec_rmsnorm(a, w, imm),
    VecFunc.SOFTMAX: lambda a, b, w, imm: vec_softmax(a, np.arange(a.shape[-1]) < imm),
}


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("func", list(_FUNCS), ids=lambda f: f.name)
def test_vector_programs_compute_their_rows(func, seed):
    """Random rows and lengths (some longer than a VIN half: elementwise rows in segments)
    through the fast model, against hw.numerics row by row."""
    rng = np.random.default_rng([seed, func.value])
    cfg = VSMALL.replace(memory=MemoryModel(size_bytes=1 << 16))
    elementwise = func in ELEMENTWISE
    long = elementwise and seed % 2
    length = int(rng.integers(300, 700)) if long else int(rng.integers(1, 100))
    rows = int(rng.integers(1, 4 if long else 20))
    second, const = elementwise, func == VecFunc.RMSNORM
    imm = norm_eps(1e-5, length) if const else length if func == VecFunc.SOFTMAX else 0
    t = lower_vector_template(cfg, func, rows, length, second=second, const=const, imm=imm)
    tasks, _, _ = vector_tasks(cfg, func, rows, length, 2 if second else 1, const)
    assert (len(tasks) > rows) == bool(long)      # long rows: several segments each
    program = decode_program(t.words.view(np.uint8))
    for ins in program:
        check(ins, cfg)
    per = cfg.beat_bytes // 4
    row = -(-length // per) * per
    base = {"x": 0, "b": rows * row, "w": 2 * rows * row, "y": 2 * rows * row + row}
    class _Op:                                    # the operands' symbols, placed at base
        x, b, w, y = "x", "b" if second else None, "w" if const else None, "y"
    words = relocate(t, {k: 4 * v for k, v in base.items()}, [_Op], cfg.beat_bytes)
    scale = float(rng.choice([0.01, 1.0, 100.0]))
    a = to_fixed(rng.standard_normal((rows, length)) * scale)
    b = to_fixed(rng.standard_normal((rows, length)) * scale)
    w = norm_weight(rng.standard_normal(length), length)
    dram = np.zeros(cfg.memory.size_bytes, np.uint8)
    for name, data in (("x", a), ("b", b)):
        padded = np.zeros((rows, row), "<i4")
        padded[:, :length] = data
        dram[4 * base[name]:4 * base[name] + padded.nbytes] = padded.view(np.uint8).reshape(-1)
    dram[4 * base["w"]:4 * base["w"] + 4 * length] = w.astype("<i4").view(np.uint8)
    if func == VecFunc.SOFTMAX:  # each row's valid positions, as the runtime sets them
        counts = rng.integers(0, length + 1, size=rows)

        class _P:
            node, imm_rows = "p", t.imm_rows
        _P.words = words
        words = _set_imm(_P, counts)
    else:
        counts = np.full(rows, imm)
    r = make_backend("model", cfg).run(words, dram)
    assert r.ok, r.error
    got = r.dram[4 * base["y"]:4 * base["y"] + rows * row * 4].view("<i4").reshape(rows, row)
    for i in range(rows):
        want = _FUNCS[func](a[i], b[i], w, int(counts[i]))
        assert np.array_equal(got[i, :length], want), i
    assert sum(isinstance(i, Load) and i.spad == Spad.VIN for i in program) >= 1
    assert sum(isinstance(i, Store) and i.spad == Spad.VOUT for i in program) == len(tasks)


def test_the_segmented_sub_ops_are_the_fast_models_elementwise_ones():
    from sim.functional import _VEC_ELEMENTWISE
    assert ELEMENTWISE == set(_VEC_ELEMENTWISE)


def test_a_reducing_row_too_long_for_the_scratchpads_is_refused():
    with pytest.raises(LoweringError, match="RMSNORM row of 400 elements"):
        lower_vector_template(VSMALL, VecFunc.RMSNORM, 1, 400, const=True)


# ---------------------------------------------------------------------- RTL
@pytest.mark.rtl
@pytest.mark.slow
def test_rtl_runs_the_vector_nodes_as_the_fast_model():
    from sim.random_programs import EQUIVALENCE_CONFIGS
    cfg = EQUIVALENCE_CONFIGS["4x4"]   # the equivalence harness's vector configuration
    lm = tiny_lm(layers=1, heads=2, kv_heads=1, hidden=32, vocab=32)
    ws = compressed(lm, "2:4", 32)
    exe = compile_model(lm, cfg, CompileOptions(PROMPT, PROMPT + 2), weights=ws)
    assert any(p.vector is not None for p in exe.programs)
    # fused programs (vector part, REQUANT, GEMMs, DEQUANTs) run too, per phase: the norm ->
    # q/k/v -> RoPE of q and k (its table LOADs relative to pos); attention's query REQUANT
    # from the RoPE's rows (a prefill: a strided one per head) -> scores -> DEQUANT ->
    # softmax (its valid counts relative to pos) -> FOLD -> values -> DEQUANT into o_proj's
    # input rows (a prefill: a strided DEQUANT per head) and on with the o_proj chain in the
    # same program: its REQUANT, its DEQUANT + the residual rows (the norm's input still on
    # chip: an ADD part), the MLP and the final norm (another ADD between); a decode step's
    # two joined into one program of 4 + 9 parts
    fused = [p for p in exe.programs if p.parts]
    assert sorted((p.phase, len(p.parts)) for p in fused) == [
        ("decode", 13), ("prefill", 4), ("prefill", 9)]
    assert all(VecFunc.ROPE in {v.func for v in _vecs(p)} and p.position_rows
               for p in fused if len(p.parts) in (4, 13))
    for p in (p for p in fused if len(p.parts) in (9, 13)):   # attention, then the chain
        (m,) = exe.programs[p.parts[len(p.parts) - 9 + 3]].members
        assert p.imm_rows and not m.residual and not m.requant
        funcs = [v.func for v in _vecs(p)]
        assert funcs.count(VecFunc.ADD) == 2 * m.tokens
        assert funcs[0] == (VecFunc.REQUANT if len(p.parts) == 9 else VecFunc.RMSNORM)
        assert {VecFunc.DEQUANT, VecFunc.SOFTMAX, VecFunc.FOLD} <= set(funcs)
    assert all(VecFunc.DEQUANT in {v.func for v in _vecs(p)} for p in fused)
    ids = _ids(lm, PROMPT + 2, seed=5)
    runs = backends_agree(exe, cfg, ids, PROMPT)
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True)
    for (a, _), w in zip(runs[1], twin_step_logits(twin, ids, PROMPT), strict=True):
        assert torch.equal(a, w)


@pytest.mark.rtl
@pytest.mark.slow
def test_rtl_runs_woven_attention_as_the_fast_model():
    """With two kv heads each attention program weaves its values GEMMs with the next head's
    DEQUANT and SOFTMAX (sw.compile.fusion._values_woven: a values GEMM part per kv head); the
    RTL gives the fast model's logits and cycles (the equivalence harness's vector
    configuration), which are the vector twin's."""
    from sim.random_programs import EQUIVALENCE_CONFIGS
    cfg = EQUIVALENCE_CONFIGS["4x4"]
    # (a vocabulary of 16: the activations fit the configuration's 32 KiB)
    lm = tiny_lm(layers=1, heads=2, kv_heads=2, hidden=32, vocab=16)
    ws = compressed(lm, "2:4", 32)
    exe = compile_model(lm, cfg, CompileOptions(PROMPT, PROMPT + 2), weights=ws)
    values = [p for p in exe.programs if p.node.endswith(".values") and p.fused_into is not None]
    assert values and all(len(p.members) == 2 for p in values)
    for p in (exe.programs[i] for i in {p.fused_into for p in values}):
        funcs = [v.func for v in _vecs(p)]  # the second head's DEQUANT after the first FOLD
        assert funcs.index(VecFunc.FOLD) < max(
            k for k, f in enumerate(funcs) if f == VecFunc.SOFTMAX)
    ids = _ids(lm, PROMPT + 2, seed=5)
    runs = backends_agree(exe, cfg, ids, PROMPT)
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True)
    for (a, _), w in zip(runs[1], twin_step_logits(twin, ids, PROMPT), strict=True):
        assert torch.equal(a, w)
