"""Whole programs on the Verilator build of the accelerator, against the fast model.

Every run is compared with :class:`sim.model.FastModel` (the timing contract of hw/timing.py
and the functional semantics of sim/functional.py): cycles, error, error_pc, every counter,
and the final DRAM image where the program is free of races.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from control_testutil import random_dma, random_gemm, random_program, small_config

from hw.format import WeightFormat
from hw.isa import (
    NO_EVENT,
    End,
    Engine,
    ErrorCode,
    Gemm,
    InstrLayout,
    Load,
    Spad,
    Store,
    Sync,
    encode,
)
from hw.numerics import gemm_acc_packed
from sim.model import FastModel
from sim.rtl import RTLBackend

pytestmark = pytest.mark.rtl

CFG = small_config()
_SYNC_ENGINE = InstrLayout["body"].offset + 0  # SyncBody.engine is the first body field
_OPCODE = InstrLayout["header"].offset


@pytest.fixture(scope="module")
def rtl():
    backend = RTLBackend(CFG)
    backend.build()
    return backend


def _dram(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)


def _check(res, ref, *, dram: bool = True):
    assert (res.cycles, res.error, res.error_pc) == (ref.cycles, ref.error, ref.error_pc), \
        (res, ref.detail)
    assert res.counters == ref.counters
    if dram:
        diff = np.flatnonzero(res.dram != ref.dram)
        assert diff.size == 0, f"{diff.size} DRAM bytes differ, first at {diff[:8]}"


def _model(prog, dram=None, timing_only=False):
    return FastModel(CFG).run(prog, dram, timing_only=timing_only)


# ---------------------------------------------------------------------- timing
@pytest.mark.parametrize("seed", range(12))
def test_random_programs_timing(rtl, seed):
    """Random LOAD/GEMM/STORE/SYNC programs with events: cycles and counters."""
    rng = random.Random(seed)
    prog = random_program(rng, CFG, rng.randint(5, 40))
    res = rtl.run(prog, _dram(seed))
    _check(res, _model(prog, timing_only=True), dram=False)
    assert res.error == ErrorCode.NONE


@pytest.mark.parametrize("seed", range(6))
def test_back_to_back_loads_with_events(rtl, seed):
    """Runs of LOADs issued back to back (the next one's requests go out while the previous
    one's responses are in flight), some signalling SYNCs on COMPUTE and STORE, the first of
    each run waiting on COMPUTE, SYNCs on the LOAD engine in between: cycles and counters are
    the fast model's (every event's counter returns to 0: deadlock- and overflow-free)."""
    rng = random.Random(1000 + seed)
    to_compute, to_store, from_compute, load_sync = 0, 1, 2, 3
    prog = []
    for run in range(rng.randint(3, 8)):
        loads = [random_dma(rng, CFG, max_rows=2, max_row_beats=rng.choice([1, 3, 8]))
                 for _ in range(rng.randint(1, 5))]
        if run:
            loads[0] = Load(**{**loads[0].__dict__, "wait": from_compute})
        for ins in loads[:-1]:
            if rng.random() < 0.4:
                prog += [Load(**{**ins.__dict__, "signal": to_store}),
                         Sync(engine=Engine.STORE, wait=to_store)]
            else:
                prog.append(ins)
            if rng.random() < 0.2:
                prog += [Sync(engine=Engine.LOAD, signal=load_sync),
                         Sync(engine=Engine.STORE, wait=load_sync)]
        prog += [Load(**{**loads[-1].__dict__, "signal": to_compute}),
                 Sync(engine=Engine.COMPUTE, wait=to_compute, signal=from_compute)]
    prog += [Sync(engine=Engine.LOAD, wait=from_compute), End()]
    res = rtl.run(prog, _dram(seed))
    _check(res, _model(prog, timing_only=True), dram=False)
    assert res.error == ErrorCode.NONE


def test_empty_program(rtl):
    res = rtl.run([End()])
    _check(res, _model([End()], timing_only=True), dram=False)


# ---------------------------------------------------------------------- data
def _serial_program(rng, n_gemms: int) -> list:
    """LOADs -> GEMM -> STORE, n times, fully ordered by events (no races)."""
    full, out, stored = 0, 1, 2
    prog = []
    for i in range(n_gemms):
        loads = [random_dma(rng, CFG, max_rows=2, max_row_beats=8) for _ in range(3)]
        loads = [Load(**{**ld.__dict__, "wait": stored if i and j == 0 else None,
                         "signal": full if j == 2 else None}) for j, ld in enumerate(loads)]
        prog += loads
        g = random_gemm(rng, CFG)
        prog.append(Gemm(**{**g.__dict__, "wait": full, "signal": out}))
        st = random_dma(rng, CFG, store=True, max_rows=2, max_row_beats=8)
        prog.append(Store(**{**st.__dict__, "wait": out, "signal": stored}))
    prog.append(End())
    return prog


@pytest.mark.parametrize("seed", range(4))
def test_serial_gemm_programs_data(rtl, seed):
    """Random GEMMs (all patterns, epilogues, int8, asym) between random loads and stores."""
    rng = random.Random(100 + seed)
    prog = _serial_program(rng, 6)
    dram = _dram(seed)
    _check(rtl.run(prog, dram), _model(prog, dram))


def test_linear_layer_double_buffered(rtl):
    """A 2:4 INT4 layer lowered by sw.compile.layers: DRAM output equals the golden int32."""
    from hw.format import random_quantized
    from sw.compile.layers import build_linear

    fmt = WeightFormat(pattern="2:4", bits=4, group=32)
    n, k, tokens = 16, 256, 5
    rng = np.random.default_rng(7)
    w = random_quantized(fmt, (n, k), rng)
    x = rng.integers(-127, 128, (tokens, k), dtype=np.int8)
    lp = build_linear(CFG, fmt, n, k, tokens, weight=w, acts=x)
    res = rtl.run(lp.program, lp.dram)
    assert res.error == ErrorCode.NONE
    _check(res, _model(lp.program, lp.dram))
    np.testing.assert_array_equal(lp.read_output(res.dram), gemm_acc_packed(x, w))


# ---------------------------------------------------------------------- errors
def _raw(ins, **fields) -> int:
    word = encode(ins)
    for (off, width), value in fields.values():
        word = (word & ~(((1 << width) - 1) << off)) | (value << off)
    return word


def _error_case(rtl, prog, model_prog, code, pc=None):
    res = rtl.run(prog)
    ref = _model(model_prog, timing_only=True)
    _check(res, ref, dram=False)
    assert res.error == code
    if pc is not None:
        assert res.error_pc == pc


@pytest.mark.parametrize("opcode, code", [
    (0, ErrorCode.ILLEGAL_OPCODE),
    (6, ErrorCode.ILLEGAL_OPCODE),  # VEC, on a configuration without the vector engine
    (7, ErrorCode.BAD_REPEAT),      # REPEAT, with END's zero fields: a loop of no body
])
def test_illegal_opcode(rtl, opcode, code):
    bad = _raw(End(), op=((_OPCODE, 3), opcode))
    prog = [Sync(engine=Engine.STORE), bad, End()]
    _error_case(rtl, prog, prog, code, 1)


def test_sync_of_no_engine_is_illegal(rtl):
    bad = _raw(Sync(engine=Engine.LOAD), eng=((_SYNC_ENGINE, 2), 3))
    prog = [Load(spad=Spad.ACT, rows=2, row_beats=2), bad, End()]
    _error_case(rtl, prog, prog, ErrorCode.ILLEGAL_OPCODE, 1)


def test_missing_end(rtl):
    """A program without END runs into the zeroed word after it (opcode 0)."""
    prog = [Sync(engine=Engine.LOAD), Sync(engine=Engine.STORE)]
    _error_case(rtl, prog, prog, ErrorCode.ILLEGAL_OPCODE, 2)


def test_pc_overflow(rtl):
    """imem_depth instructions without END: PC_OVERFLOW at pc = imem_depth."""
    prog = [Sync(engine=Engine(i % 3)) for i in range(CFG.imem_depth)]
    _error_case(rtl, prog, prog, ErrorCode.PC_OVERFLOW, CFG.imem_depth)


_BAD = {
    "bad_event": (Sync(engine=Engine.COMPUTE, wait=CFG.num_events), ErrorCode.BAD_EVENT),
    "bad_signal": (Load(spad=Spad.WGT, signal=NO_EVENT - 1), ErrorCode.BAD_EVENT),
    "load_beyond_dram": (Load(spad=Spad.ACT, dram_addr=CFG.dram_beats - 3, rows=1,
                              row_beats=4), ErrorCode.BAD_ADDRESS),
    "stride_beyond_dram": (Load(spad=Spad.ACT, dram_addr=0, rows=3, row_beats=1,
                                dram_stride=CFG.dram_beats // 2), ErrorCode.BAD_ADDRESS),
    "spad_overflow": (Load(spad=Spad.PARAM, spad_addr=CFG.spad_beats("param") - 1, rows=2,
                           row_beats=1), ErrorCode.BAD_ADDRESS),
    "load_into_out": (Load(spad=Spad.OUT, rows=1, row_beats=1), ErrorCode.BAD_ADDRESS),
    "store_from_act": (Store(spad=Spad.ACT, rows=1, row_beats=1), ErrorCode.BAD_ADDRESS),
    "empty_dma": (Store(rows=0, row_beats=1), ErrorCode.BAD_ADDRESS),
    "unsupported_pattern": (Gemm(pattern=len(CFG.pattern_table)), ErrorCode.BAD_GEMM),
    "too_many_tokens": (Gemm(tokens=CFG.max_tokens + 1), ErrorCode.BAD_GEMM),
    "no_steps": (Gemm(k_steps=0), ErrorCode.BAD_GEMM),
    "int8_sparse": (Gemm(pattern=1, int8=True), ErrorCode.BAD_GEMM),
    "asym_without_groups": (Gemm(asym=True, group_steps=0), ErrorCode.BAD_GEMM),
    "gemm_out_of_range": (Gemm(out_addr=CFG.spad_beats("out")), ErrorCode.BAD_ADDRESS),
}


@pytest.mark.parametrize("name", sorted(_BAD))
def test_dispatch_errors(rtl, name):
    bad, code = _BAD[name]
    prog = [Load(spad=Spad.ACT, rows=1, row_beats=3, signal=0),
            Sync(engine=Engine.COMPUTE, wait=0), bad, End()]
    _error_case(rtl, prog, prog, code, 2)


def test_deadlock_waiting(rtl):
    prog = [Load(spad=Spad.ACT, rows=1, row_beats=2), Sync(engine=Engine.STORE, wait=1),
            End()]
    _error_case(rtl, prog, prog, ErrorCode.DEADLOCK, 0)


def test_deadlock_fetch_blocked(rtl):
    """The signal sits behind LOAD instructions that wait for it in a full queue."""
    prog = [Sync(engine=Engine.LOAD, wait=0) for _ in range(CFG.queue_depth + 2)]
    prog += [Sync(engine=Engine.STORE, signal=0), End()]
    _error_case(rtl, prog, prog, ErrorCode.DEADLOCK, 0)


def test_event_overflow(rtl):
    limit = (1 << CFG.event_bits) - 1
    prog = [Sync(engine=Engine.STORE, signal=1) for _ in range(limit + 1)] + [End()]
    _error_case(rtl, prog, prog, ErrorCode.EVENT_OVERFLOW, 0)


def test_host_ports_are_every_tops():
    """The accelerator and both simulation tops expose hw.top.host_ports, member for member;
    the accelerator adds only its DRAM port and the run-time registers (``regs``, which the
    board's host link does not carry: sim.board_backend applies them to the words)."""
    from hw.sim_top import RunnerTop, SimTop
    from hw.top import HOST_STATUS, Accelerator, host_ports

    want = host_ports(CFG)
    assert tuple(want) == ("start", *HOST_STATUS, "imem_wr")
    accel = dict(Accelerator(CFG).signature.members.items())
    assert accel == {**want, "regs": accel["regs"], "dram": accel["dram"]}
    for top in (SimTop(CFG), RunnerTop(CFG)):
        members = dict(top.signature.members.items())
        assert {k: members[k] for k in want} == want, type(top).__name__
    assert set(dict(SimTop(CFG).signature.members.items())) - set(want) == {
        "regs", "dram_rd", "dram_wr"}
