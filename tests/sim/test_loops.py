"""Hardware loops (REPEAT) in the fast model: a looped program computes what its unrolled
twin computes, in the cycles hw/timing.py gives (a loop-back costs LOOP_BACK_LATENCY - 1
cycles over the straight fetch), and the BAD_REPEAT rules stop it where hw.isa says."""

import numpy as np
import pytest

from hw.isa import (
    DRAM_ADDR_MAX,
    End,
    Engine,
    ErrorCode,
    Load,
    Repeat,
    Spad,
    Store,
    Sync,
    decode_fields,
    dispatch_errors,
    loop_instruction,
    loop_stream,
    program_words,
)
from hw.timing import FETCH_LATENCY, LOOP_BACK_LATENCY
from sim.model import FastModel
from sim.random_programs import EQUIVALENCE_CONFIGS, random_program

CFG = EQUIVALENCE_CONFIGS["4x4"]


def _unrolled(program):
    """The program with every REPEAT written out (what the fetch unit dispatches)."""
    f = decode_fields(program_words(program))
    s = loop_stream(f, dispatch_errors(f, CFG))
    return [loop_instruction(program[p], int(o)) for p, o in zip(s.pcs, s.offsets, strict=True)
            if not isinstance(program[p], Repeat)]


def test_loop_stream_orders_iterations_and_offsets():
    prog = [Sync(), Repeat(length=4, count=3, wgt_stride=10, load_stride=3, store_stride=7),
            Load(spad=Spad.ACT), Load(spad=Spad.WGT), Sync(), Store(), End()]
    f = decode_fields(program_words(prog))
    s = loop_stream(f, dispatch_errors(f, CFG))
    assert s.pcs.tolist() == [0, 1] + [2, 3, 4, 5] * 3 + [6]
    # each transfer class advances by its stride; other opcodes keep theirs
    assert s.offsets.tolist() == [0, 0, 0, 0, 0, 0, 3, 10, 0, 7, 6, 20, 0, 14, 0]
    assert s.loop_back.tolist() == [False] * 6 + [True, False, False, False] * 2 + [False]


@pytest.mark.parametrize("seed", range(8))
def test_loop_program_matches_unrolled(seed):
    rng = np.random.default_rng(seed)
    rp = random_program(CFG, rng, chains=int(rng.integers(1, 3)), tasks=3, loops=1.0)
    looped = [i for i in rp.program if isinstance(i, Repeat)]
    assert looped
    model = FastModel(CFG)
    a = model.run(rp.program, rp.dram)
    b = model.run(_unrolled(rp.program), rp.dram)
    assert a.error == b.error == ErrorCode.NONE
    assert np.array_equal(a.dram, b.dram)
    assert a.counters["dram_read_beats"] == b.counters["dram_read_beats"]
    assert a.counters["instructions"] == b.counters["instructions"] + len(looped)


def test_loop_back_costs_a_refetch():
    body = [Load(spad=Spad.ACT, rows=1, row_beats=1)]
    looped = FastModel(CFG).run([Repeat(length=1, count=3, load_stride=1)] + body + [End()],
                                timing_only=True, trace=True)
    d = [t.dispatch for t in looped.trace]
    # REPEAT, then iterations 0, 1, 2 (each but the first a loop-back), then END
    assert d == [FETCH_LATENCY, FETCH_LATENCY + 1, FETCH_LATENCY + 1 + LOOP_BACK_LATENCY,
                 FETCH_LATENCY + 1 + 2 * LOOP_BACK_LATENCY,
                 FETCH_LATENCY + 2 + 2 * LOOP_BACK_LATENCY]


@pytest.mark.parametrize("program,pc", [
    ([Repeat(length=0, count=1), End()], 0),
    ([Sync(), Repeat(length=1, count=0), End()], 1),
    ([Repeat(length=2, count=2), Repeat(length=1, count=2), Sync(), End()], 1),
    ([Repeat(length=2, count=2), Sync(), End(), End()], 2),
])
def test_bad_repeat(program, pc):
    r = FastModel(CFG).run(program, timing_only=True)
    assert (r.error, r.error_pc) == (ErrorCode.BAD_REPEAT, pc)


def test_effective_address_out_of_dram():
    """Iteration 2 of the body's LOAD starts past DRAM: BAD_ADDRESS at the LOAD's pc, after
    two iterations; a 32-bit overflow of the effective address saturates to DRAM_ADDR_MAX."""
    load = Load(spad=Spad.ACT, rows=1, row_beats=1, dram_addr=CFG.dram_beats - 1)
    for stride in (1, (1 << 27) - 1):
        r = FastModel(CFG).run([Repeat(length=1, count=3, load_stride=stride), load, End()],
                               timing_only=True)
        assert (r.error, r.error_pc, r.counters["instructions"]) == (ErrorCode.BAD_ADDRESS, 1, 2)
    assert loop_instruction(load, DRAM_ADDR_MAX).dram_addr == DRAM_ADDR_MAX


def test_store_in_a_body_advances():
    prog = [Sync(engine=Engine.STORE, signal=0),
            Repeat(length=2, count=2, store_stride=4),
            Sync(engine=Engine.LOAD, wait=0, signal=1),
            Store(spad=Spad.OUT, dram_addr=8, rows=1, row_beats=2, wait=1, signal=0),
            Sync(engine=Engine.LOAD, wait=0), End()]
    assert [i.dram_addr for i in _unrolled(prog) if isinstance(i, Store)] == [8, 12]
    assert FastModel(CFG).run(prog, timing_only=True).error == ErrorCode.NONE
