"""One program per decode step (sw.compile.compiler._join_step): with the residual rows and
the KV append on chip, a decode step's fused programs are joined into one per context range;
the runtime runs it once and serves every node's epilogue from DRAM, and the tokens equal
the twin's."""

import copy
import dataclasses

import numpy as np
import pytest
import torch
from compile_testutil import VSMALL, compressed, tiny_lm, twin_step_logits

from hw.config import AcceleratorConfig, MemoryModel
from hw.isa import Load, Spad, Store, decode_program
from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model, compiler
from sw.compile.errors import LoweringError
from sw.compile.executable import load, save
from sw.compress.model import use_hardware_numerics
from sw.runtime import Runtime
from sw.runtime.trace import step_trace

PROMPT, STEPS = 6, 4


@pytest.fixture(scope="module")
def model():
    lm = tiny_lm(layers=2, heads=4, kv_heads=2)
    return lm, compressed(lm)


def _run(exe, lm, seed=3):
    """Logits and stats of a prefill and ``STEPS`` decode steps, and the twin's logits."""
    ids = torch.randint(0, lm.config.vocab_size, (1, PROMPT + STEPS),
                        generator=torch.Generator().manual_seed(seed))
    rt = Runtime(exe, make_backend("model", exe.cfg), vector=True)
    out = [rt.step(ids[:, :PROMPT])] + [rt.step(ids[:, p:p + 1])
                                        for p in range(PROMPT, PROMPT + STEPS)]
    return out, ids


def _twin(lm, ws, ids):
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True, attention=True)
    return twin_step_logits(twin, ids, PROMPT)


@pytest.mark.parametrize(("context", "ranges"), [(PROMPT + STEPS, 1), (40, 3)])
def test_a_decode_step_is_one_program_and_the_tokens_equal_the_twins(model, context, ranges):
    """Every decode step runs one program (one per context range: each bucket's), whose
    parts are every accelerator node of the step, whose run-time words are the fused
    programs' (the rope tables, softmax counts and KV appends of every layer), and the
    logits equal the twin's bit for bit; without one_program a step runs three."""
    lm, ws = model
    opts = CompileOptions(PROMPT, context, block_loop=False)  # every block
    exe = compile_model(lm, VSMALL, opts, weights=ws)
    rep = exe.report["phases"]["decode"]
    assert rep["programs_per_step"] == 1 and rep["host_transitions_per_step"] == 2
    assert rep["joined_programs"] == ranges
    joined = [p for p in exe.programs if p.phase == "decode" and p.parts
              and len(p.parts) == len(exe.table.nodes("decode"))]
    assert len(joined) == ranges
    for p in joined:
        assert p.instructions <= exe.cfg.imem_depth
        assert sorted({r[3] for r in p.append_rows}) == [0, 1]
        layers = lm.config.num_hidden_layers  # a ROPE LOAD per q and k, a VEC per head
        assert len(p.position_rows) == 2 * layers
        assert len(p.imm_rows) == layers * lm.config.num_attention_heads
        assert all(exe.programs[i].fused_into == exe.programs.index(p) for i in p.parts)
    steps, ids = _run(exe, lm)
    for (got, st), want in zip(steps, _twin(lm, ws, ids), strict=True):
        assert torch.equal(got, want)
        if st.phase == "decode":
            assert len(st.programs) == 1 and st.transitions == 2
    alone = compile_model(lm, VSMALL, dataclasses.replace(opts, one_program=False),
                          weights=ws)
    assert alone.report["phases"]["decode"]["programs_per_step"] == 3
    base, _ = _run(alone, lm)
    for (a, _), (b, _) in zip(steps, base, strict=True):
        assert torch.equal(a, b)
    # one program: the fused programs' instructions and the drains between them, no more
    assert steps[-1][1].cycles <= base[-1][1].cycles


@pytest.mark.parametrize("bits", [8, 4])
def test_key_tiles_no_step_appends_to_load_before_the_append_and_the_tokens_equal_the_twins(
        model, bits):
    """At contexts 37 to 40 (bucket 48, positions 32 to 47 appended) the key tiles of the
    positions below (two of 16 lanes) hold nothing a step of the bucket writes: in the
    joined step some of them load before the KV append of their layer has stored
    (sw.compile.compiler._kv_ahead), where the LOAD engine waits on the append, instead of
    after the program that holds it; the logits equal the twin's bit for bit, with an INT8
    or an INT4 cache (KV4 and INSERT4 append keys and their group codes)."""
    lm, ws = model
    prompt = 36
    exe = compile_model(lm, VSMALL, CompileOptions(prompt, prompt + STEPS, kv_bits=bits,
                                                   block_loop=False), weights=ws)
    beat = VSMALL.beat_bytes
    joined = [p for p in exe.programs if p.phase == "decode"
              and len(p.parts) == len(exe.table.nodes("decode"))]
    early = 0
    for p in joined:
        program = decode_program(p.words.astype("<u8").view(np.uint8).reshape(-1))
        for layer in {r[3] for r in p.append_rows}:
            keys = [r for n, r in exe.symbols.items() if n.startswith(f"k:{layer}:")]
            stored = max(i for i, _, _, at in p.append_rows
                         if at == layer and isinstance(program[i], Store))
            early += sum(isinstance(ins, Load) and ins.spad == Spad.WGT and i < stored
                         and any(r.addr <= ins.dram_addr * beat < r.end for r in keys)
                         for i, ins in enumerate(program))
    assert early
    ids = torch.randint(0, lm.config.vocab_size, (1, prompt + STEPS),
                        generator=torch.Generator().manual_seed(5))
    rt = Runtime(exe, make_backend("model", exe.cfg), vector=True)
    got = [rt.step(ids[:, :prompt])[0]] + [rt.step(ids[:, p:p + 1])[0]
                                            for p in range(prompt, prompt + STEPS)]
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True, attention=True,
                                 kv_bits=bits)
    for a, b in zip(got, twin_step_logits(twin, ids, prompt), strict=True):
        assert torch.equal(a, b)


def test_constant_loads_go_ahead_only_where_the_estimate_gains(model, monkeypatch):
    """At contexts 37 to 40 a joined step's constant WGT LOADs (weights and the KV tiles no
    step of the bucket appends to) go where the LOAD engine idles at the placement
    sw.compile.fusion.timeline estimates to end first (sw.compile.compiler._kv_ahead): on the
    fast model each decode step takes no more cycles than with the KV tiles alone
    (AHEAD_FILLS empty) or with nothing moved, and fewer than with nothing moved at some
    step (on this model weights moved too gain nothing over the KV tiles alone: the
    reference model's do, docs/architecture.md); the logits are the same."""
    lm, ws = model
    prompt = 36
    opts = CompileOptions(prompt, prompt + STEPS, block_loop=False)
    ids = torch.randint(0, lm.config.vocab_size, (1, prompt + STEPS),
                        generator=torch.Generator().manual_seed(7))

    def steps():
        exe = compile_model(lm, VSMALL, opts, weights=ws)
        rt = Runtime(exe, make_backend("model", exe.cfg), vector=True)
        rt.step(ids[:, :prompt])
        return [rt.step(ids[:, p:p + 1]) for p in range(prompt, prompt + STEPS)]
    full = steps()
    monkeypatch.setattr(compiler, "AHEAD_FILLS", ())
    kv_only = steps()
    monkeypatch.setattr(compiler, "_kv_ahead", lambda cfg, words, places, *a: (words, places))
    none = steps()
    for (a, sa), (b, sb), (c, sc) in zip(full, kv_only, none, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
        assert sa.cycles <= sb.cycles and sa.cycles <= sc.cycles
    assert sum(s.cycles for _, s in full) < sum(s.cycles for _, s in none)


def test_a_step_that_does_not_fit_runs_its_fused_programs(model, monkeypatch):
    """Where the joined program would not fit the instruction memory the step keeps its
    fused programs (and the same tokens)."""
    lm, ws = model
    real = compiler.fuse_parts

    def small(cfg, parts, *a, **kw):
        if len(parts) == 3 and all(len(p) > 50 for p in parts):
            raise LoweringError("does not fit")
        return real(cfg, parts, *a, **kw)

    monkeypatch.setattr(compiler, "fuse_parts", small)
    exe = compile_model(lm, VSMALL, CompileOptions(PROMPT, PROMPT + STEPS), weights=ws)
    assert exe.report["phases"]["decode"]["programs_per_step"] == 3
    assert "joined_programs" not in exe.report["phases"]["decode"]
    steps, ids = _run(exe, lm)
    for (got, _), want in zip(steps, _twin(lm, ws, ids), strict=True):
        assert torch.equal(got, want)


def test_an_int4_cache_appended_on_chip_joins_its_programs(model):
    """The INT4 cache appended on chip (KV4, INSERT4): a decode step is one program too, two
    host transitions, no host kv_update, and the logits equal the INT4 twin's."""
    lm, ws = model
    exe = compile_model(lm, VSMALL, CompileOptions(PROMPT, PROMPT + STEPS, kv_bits=4,
                                                   block_loop=False), weights=ws)
    rep = exe.report["phases"]["decode"]
    assert rep["programs_per_step"] == 1 and rep["host_transitions_per_step"] == 2
    steps, ids = _run(exe, lm)
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True, attention=True, kv_bits=4)
    for (got, st), want in zip(steps, twin_step_logits(twin, ids, PROMPT), strict=True):
        assert torch.equal(got, want)
        if st.phase == "decode":
            assert len(st.programs) == 1 and st.transitions == 2
            assert not any(h.op == "kv_update" for h in st.host)


def test_the_joined_program_survives_a_file(model, tmp_path):
    lm, ws = model
    exe = compile_model(lm, VSMALL, CompileOptions(PROMPT, PROMPT + 2), weights=ws)
    back = load(save(exe, tmp_path / "exe.safetensors"))
    assert back.table == exe.table
    assert all(a == b for a, b in zip(back.programs, exe.programs, strict=True))
    assert np.array_equal(back.programs[-1].words, exe.programs[-1].words)


def test_the_step_trace_gives_the_vector_engine_a_track_of_its_own(model):
    """The Perfetto trace of a decode step (sw.runtime.trace.step_trace): every track has
    its own id, the VECs lie on the VECTOR track and the GEMMs on COMPUTE, and the step's
    program on the programs track."""
    lm, ws = model
    exe = compile_model(lm, VSMALL, CompileOptions(PROMPT, PROMPT + 2), weights=ws)
    ids = torch.randint(0, lm.config.vocab_size, (1, PROMPT + 1),
                        generator=torch.Generator().manual_seed(0))
    rt = Runtime(exe, make_backend("model", exe.cfg), vector=True, trace=True)
    rt.step(ids[:, :PROMPT])
    _, stats = rt.step(ids[:, PROMPT:])
    events = step_trace(exe, stats)["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert len(names) == sum(e.get("name") == "thread_name" for e in events)
    tracks = {name: [e for e in events if e["ph"] == "X" and e["tid"] == tid]
              for tid, name in names.items()}
    assert any(e["name"] == "Vec" for e in tracks["VECTOR"])
    assert all(e["name"] == "Vec" or e["name"].startswith("wait") or e["name"] == "SYNC"
               for e in tracks["VECTOR"])
    assert any(e["name"].startswith("GEMM") for e in tracks["COMPUTE"])
    assert [e["name"] for e in tracks["programs"]] == [stats.programs[0].node]


#: An array of more lanes than a head has channels, in wide beats (as the scaling study's
#: 16x64 systems): a value record of 512 bytes holds a position's 16 channels in its first
#: beat; an INT4 key record (256 bytes) is four beats, a beat of each appended.
WIDE = AcceleratorConfig(rows=4, cols=128, act_spad_bytes=64 << 10, wgt_spad_bytes=512 << 10,
                         out_spad_bytes=128 << 10, param_spad_bytes=2048, vin_spad_bytes=8192,
                         vout_spad_bytes=4096,
                         memory=MemoryModel(bytes_per_cycle=64, latency=8, size_bytes=1 << 24))


@pytest.mark.parametrize("kv_bits", [8, 4])
def test_a_wide_beat_decode_step_is_one_program(model, kv_bits):
    """On a wide array and beat (records longer than a head's channels, INT4 key records
    wider than a beat) the KV append stays on chip and a decode step is one program, whose
    tokens equal the fused programs' and the twin's bit for bit."""
    lm, ws = model
    opts = CompileOptions(PROMPT, PROMPT + STEPS, kv_bits=kv_bits)
    exe = compile_model(lm, WIDE, opts, weights=ws)
    assert exe.report["phases"]["decode"]["programs_per_step"] == 1
    steps, ids = _run(exe, lm)
    alone = compile_model(lm, WIDE, dataclasses.replace(opts, one_program=False), weights=ws)
    base, _ = _run(alone, lm)
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True, attention=True,
                                 kv_bits=kv_bits)
    for (got, st), (b, _), want in zip(steps, base, twin_step_logits(twin, ids, PROMPT),
                                       strict=True):
        assert torch.equal(got, b) and torch.equal(got, want)
        if st.phase == "decode":
            assert len(st.programs) == 1 and not any(h.op == "kv_update" for h in st.host)
