"""Fast model: its per-instruction timing algebra equals a naive cycle-stepping reference."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from reference_scheduler import run_reference

from hw import timing
from hw.config import AcceleratorConfig, MemoryModel
from hw.engines import completion_delay
from hw.isa import (
    End,
    Engine,
    EpilogueMode,
    ErrorCode,
    Gemm,
    Load,
    Spad,
    Store,
    Sync,
    encode_program,
)
from sim.model import FastModel, ProgramError, schedule

CFG = AcceleratorConfig(rows=2, cols=8, queue_depth=2, num_events=8, event_bits=3,
                        imem_depth=64, memory=MemoryModel(latency=3, size_bytes=1 << 14))
ENGINES = [Engine.LOAD, Engine.COMPUTE, Engine.STORE]


@st.composite
def programs(draw, end=True):
    """Random programs obeying one producer and one consumer engine per event."""
    n_events = draw(st.integers(1, 6))
    prod = [draw(st.sampled_from(ENGINES)) for _ in range(n_events)]
    cons = [draw(st.sampled_from(ENGINES)) for _ in range(n_events)]
    prog = []
    for _ in range(draw(st.integers(0, 24))):
        eng = draw(st.sampled_from(ENGINES))
        mine_p = [e for e in range(n_events) if prod[e] == eng]
        mine_c = [e for e in range(n_events) if cons[e] == eng]
        sig = draw(st.sampled_from([None] + mine_p))
        wait = draw(st.sampled_from([None] + mine_c))
        kind = draw(st.sampled_from(["sync", "op"]))
        if kind == "sync":
            prog.append(Sync(engine=eng, wait=wait, signal=sig))
        elif eng == Engine.LOAD:
            prog.append(Load(spad=Spad.ACT, rows=draw(st.integers(1, 3)),
                             row_beats=draw(st.integers(1, 4)), wait=wait, signal=sig))
        elif eng == Engine.STORE:
            prog.append(Store(rows=draw(st.integers(1, 2)), row_beats=draw(st.integers(1, 3)),
                              wait=wait, signal=sig))
        else:
            prog.append(Gemm(k_steps=draw(st.integers(1, 6)), group_steps=draw(
                st.sampled_from([0, 2, 3])), tokens=draw(st.integers(1, 3)),
                epilogue=draw(st.sampled_from(list(EpilogueMode))), wait=wait, signal=sig))
    if end:
        prog.append(End())
    return prog


@given(programs())
def test_model_matches_cycle_stepping_reference(prog):
    s = schedule(prog, CFG)
    cycles, err, pc, ctr = run_reference(prog, CFG)
    assert (s.cycles, s.error, s.error_pc) == (cycles, err, pc)
    for k, v in ctr.items():  # counters agree up to the stop cycle, errors included
        assert s.counters[k] == v, k


@given(programs(end=False))
def test_programs_without_end_stop_at_the_first_unwritten_word(prog):
    s = schedule(prog, CFG)
    assert (s.cycles, s.error, s.error_pc) == run_reference(prog, CFG)[:3]
    assert s.error in (ErrorCode.ILLEGAL_OPCODE, ErrorCode.DEADLOCK, ErrorCode.EVENT_OVERFLOW)


def test_hand_checked_timing():
    F = timing.FETCH_LATENCY
    X = CFG.memory.latency + timing.LOAD_OVERHEAD
    assert completion_delay(Engine.LOAD, CFG) == X
    assert completion_delay(Engine.COMPUTE, CFG) == 0
    assert completion_delay(Engine.STORE, CFG) == 0
    # END alone: available and dispatched at F, done the cycle after.
    assert schedule([End()], CFG).cycles == F + 1
    # LOAD: dispatched F, popped F+1, granted F+2, requests F+3..F+2+D (D = beats), its last
    # beat written and its signal raised X cycles after the last request; done the cycle after.
    ld = Load(spad=Spad.ACT, rows=1, row_beats=5, signal=0)
    D = timing.load_cycles(ld, CFG)
    assert D == 5
    s = schedule([ld, End()], CFG)
    t = s.timings[0]
    assert (t.dispatch, t.pop, t.grant, t.end, t.done) == (F, F + 1, F + 2, F + 2 + D,
                                                          F + 2 + D + X)
    assert s.cycles == F + 3 + D + X
    assert s.counters["load_exec"] == D
    # A SYNC waiting on that event is granted the cycle after the signal.
    s = schedule([ld, Sync(engine=Engine.COMPUTE, wait=0), End()], CFG)
    assert s.timings[1].grant == F + 2 + D + X + 1
    assert s.counters["compute_wait"] == s.timings[1].grant - s.timings[1].pop - 1


def test_back_to_back_loads_overlap_their_latency():
    """The LOAD engine pops the next LOAD the cycle after the previous one's last request; the
    completions (and signals) follow in order, X cycles after each end, and a SYNC on the LOAD
    engine completes as late as a LOAD."""
    F = timing.FETCH_LATENCY
    X = completion_delay(Engine.LOAD, CFG)
    a = Load(spad=Spad.ACT, rows=1, row_beats=2, signal=0)
    b = Load(spad=Spad.WGT, rows=2, row_beats=3, signal=1)
    prog = [a, b, Sync(engine=Engine.LOAD, signal=2), Sync(engine=Engine.COMPUTE, wait=1),
            Sync(engine=Engine.COMPUTE, wait=0), Sync(engine=Engine.STORE, wait=2), End()]
    s = schedule(prog, CFG)
    ta, tb, ts = s.timings[:3]
    assert (ta.grant, ta.end, ta.done) == (F + 2, F + 4, F + 4 + X)
    assert (tb.pop, tb.grant, tb.end, tb.done) == (F + 5, F + 6, F + 12, F + 12 + X)
    assert (ts.pop, ts.grant, ts.end, ts.done) == (F + 13, F + 14, F + 15, F + 15 + X)
    assert s.timings[3].grant == tb.done + 1   # waits for b's data, not just its requests
    assert s.timings[5].grant == ts.done + 1
    assert s.cycles == run_reference(prog, CFG)[0] == s.timings[5].end + 1


def test_deadlock_waits_for_load_completions():
    """A deadlock is not declared while a LOAD's signal is still in flight."""
    prog = [Load(spad=Spad.ACT, rows=1, row_beats=1), Sync(engine=Engine.COMPUTE, wait=1),
            End()]
    s = schedule(prog, CFG)
    assert s.error == ErrorCode.DEADLOCK
    assert s.cycles == s.timings[0].done + 1 == run_reference(prog, CFG)[0]


def test_deadlock_is_reported_with_engine_states():
    prog = [Sync(engine=Engine.COMPUTE, wait=1), End()]
    r = FastModel(CFG).run(prog, timing_only=True)
    assert r.error == ErrorCode.DEADLOCK
    assert "COMPUTE waits on event 1 at instruction 0" in r.detail
    assert r.cycles == run_reference(prog, CFG)[0]


def test_fetch_errors():
    bad = [Sync(engine=Engine.LOAD), Gemm(pattern=7), End()]
    s = schedule(bad, CFG)
    assert (s.error, s.error_pc) == (ErrorCode.BAD_GEMM, 1)
    blob = encode_program([Sync(engine=Engine.LOAD), End()])
    blob[:16] = 0  # opcode 0
    assert schedule(blob, CFG).error == ErrorCode.ILLEGAL_OPCODE
    long = [Sync(engine=Engine.LOAD)] * CFG.imem_depth
    assert schedule(long, CFG).error == ErrorCode.PC_OVERFLOW
    over = [Sync(engine=Engine.LOAD, signal=0)] * 9 + [End()]  # 3-bit counter: max 7
    s = schedule(over, CFG)
    assert s.error == ErrorCode.EVENT_OVERFLOW
    assert s.cycles == run_reference(over, CFG)[0]


def test_two_producers_are_rejected():
    prog = [Sync(engine=Engine.LOAD, signal=0), Sync(engine=Engine.STORE, signal=0), End()]
    with pytest.raises(ProgramError, match="more than one producer"):
        schedule(prog, CFG)


def test_full_mode_applies_values_in_completion_order():
    cfg = CFG
    dram = np.zeros(cfg.memory.size_bytes, np.uint8)
    dram[:64] = np.arange(64)
    prog = [Load(spad=Spad.ACT, rows=1, row_beats=4, signal=0),
            Sync(engine=Engine.COMPUTE, wait=0, signal=1),
            Store(spad=Spad.OUT, rows=1, row_beats=1, dram_addr=10, wait=1), End()]
    r = FastModel(cfg).run(prog, dram)
    assert r.ok and not r.dram[160:176].any()  # OUT was never written: zeros stored
    assert np.array_equal(r.dram[:64], np.arange(64))


def test_move_and_load_share_vins_write_port():
    """A move (VOUT -> VIN) whose VIN writes meet a LOAD's in a cycle is rejected (VIN has
    one DMA write port); ordered by an event it runs, takes a STORE's cycles, writes no DRAM
    and leaves VOUT's bytes in VIN."""
    from sim.random_programs import EQUIVALENCE_CONFIGS
    cfg = EQUIVALENCE_CONFIGS["4x4"]
    load = Load(spad=Spad.VIN, spad_addr=0, dram_addr=0, rows=1, row_beats=8)
    move = Store(spad=Spad.VIN, spad_addr=0, dram_addr=32, rows=2, row_beats=15,
                 dram_stride=15)
    with pytest.raises(ProgramError, match="one DMA write port"):
        schedule([load, move, End()], cfg)
    prog = [Load(**{**load.__dict__, "signal": 0}),
            Store(**{**move.__dict__, "wait": 0, "signal": 1}),
            Load(spad=Spad.VIN, spad_addr=8, dram_addr=64, rows=1, row_beats=4, wait=1), End()]
    sched = schedule(prog, cfg)
    t = sched.times[1]
    assert t[5] - t[4] == timing.store_cycles(move, cfg)
    assert sched.counters["dram_write_beats"] == 0
    assert sched.counters["dram_read_beats"] == 12
    model = FastModel(cfg)
    dram = np.random.default_rng(0).integers(0, 256, cfg.memory.size_bytes, dtype=np.uint8)
    r = model.run(prog, dram)
    np.testing.assert_array_equal(r.dram, dram)   # nothing written
