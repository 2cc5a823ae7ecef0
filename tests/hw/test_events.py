# amaranth: UnusedElaboratable=no
"""Event counters and the per-engine sequencer (pop / wait / execute / signal)."""

from __future__ import annotations

import random

import pytest
from amaranth import Module, ResetInserter, Signal
from control_testutil import run_sim

from hw import timing
from hw.engine import EngineSequencer
from hw.events import EventUnit
from hw.isa import NO_EVENT, DmaBody


@pytest.mark.parametrize("seed,signal_copies", [(0, False), (1, False), (2, False),
                                                 (0, True), (1, True)])
def test_event_unit_random(seed, signal_copies):
    """Random waits and signals on three ports against a Python model of the rules.

    With ``signal_copies`` a port's payload changes only in a cycle without a signal, as a
    sequencer's does, and often signals in the next cycle: a copy of the payload registered a
    cycle late (or read a cycle early) counts the wrong event there."""
    rng = random.Random(seed)
    n, bits = 5, 3
    limit = (1 << bits) - 1
    dut = EventUnit(n, bits, ports=3, signal_copies=signal_copies)
    held = [0] * 3   # each port's payload (event) with signal_copies
    restart = Signal()
    top = Module()
    top.submodules.events = ResetInserter(restart)(dut)
    overflows = 0

    async def tb(ctx):
        nonlocal overflows
        count = [0] * n
        for t in range(600):
            waits = [(rng.random() < 0.5, rng.randrange(n)) for _ in range(3)]
            sigs = [(rng.random() < 0.4, rng.randrange(n)) for _ in range(3)]
            if signal_copies:
                for e in range(3):
                    if t == 0 or rng.random() < 0.3:   # a new payload, no signal with it
                        held[e] = rng.randrange(n)
                        sigs[e] = (False, held[e])
                    else:
                        sigs[e] = (rng.random() < 0.5, held[e])
            for e in range(3):
                ctx.set(dut.wait[e].valid, waits[e][0])
                ctx.set(dut.wait[e].payload, 1 << waits[e][1])
                ctx.set(dut.signal[e].valid, sigs[e][0])
                ctx.set(dut.signal[e].payload, 1 << sigs[e][1])
            assert not ctx.get(dut.overflow), t
            assert [ctx.get(dut.count[v]) for v in range(n)] == count
            granted = []
            for e, (valid, ev) in enumerate(waits):
                first = all(not (waits[f][0] and waits[f][1] == ev) for f in range(e))
                want = valid and count[ev] >= 1 and first
                assert ctx.get(dut.wait[e].ready) == want, (t, e)
                assert ctx.get(dut.starved[e]) == (valid and count[ev] == 0), (t, e)
                if want:
                    granted.append(ev)
            for ev in granted:
                count[ev] -= 1
            for valid, ev in sigs:
                count[ev] += valid
            await ctx.tick()
            if any(v > limit for v in count):
                # Reported in the next cycle; then start over, as the machine would.
                assert ctx.get(dut.overflow), t
                overflows += 1
                ctx.set(restart, 1)
                await ctx.tick()
                ctx.set(restart, 0)
                count = [0] * n

    run_sim(top, tb)
    assert overflows >= 3


def test_event_unit_args():
    with pytest.raises(ValueError, match="num_events must be in"):
        EventUnit(32, 4)
    with pytest.raises(ValueError, match="event_bits"):
        EventUnit(4, 0)


# ---------------------------------------------------------------------- sequencer
def _entry(wait=None, signal=None, sync=False, rows=1):
    return {"wait": NO_EVENT if wait is None else wait,
            "signal": NO_EVENT if signal is None else signal, "sync": int(sync),
            "body": {"rows": rows}}


@pytest.mark.parametrize("seed", range(3))
def test_sequencer_timing(seed):
    """Pop p = max(d + 1, free), grant g >= p + 1 when the event allows, execution g+1 .. g+D,
    signal in g + D, free = g + D + 1; SYNC executes SYNC_CYCLES cycles."""
    rng = random.Random(seed)
    dut = EngineSequencer(DmaBody, num_events=6)
    jobs = []
    for _ in range(12):
        sync = rng.random() < 0.3
        jobs.append(dict(wait=rng.choice([None, 3]), signal=rng.choice([None, 4]), sync=sync,
                         dur=timing.SYNC_CYCLES if sync else rng.randint(1, 5),
                         gap=rng.randint(0, 3), hold=rng.randint(0, 3)))

    async def tb(ctx):
        t = 0
        for job in jobs:
            for _ in range(job["gap"]):       # queue empty: idle
                assert ctx.get(dut.idle) and ctx.get(dut.queue.ready)
                await ctx.tick()
                t += 1
            ctx.set(dut.queue.valid, 1)
            ctx.set(dut.queue.payload, _entry(job["wait"], job["signal"], job["sync"],
                                              rows=t & 0xFFFF))
            assert ctx.get(dut.queue.ready)   # pop in p = t
            await ctx.tick()
            ctx.set(dut.queue.valid, 0)
            p, t = t, t + 1
            # WAIT from p + 1: the event is held back `hold` cycles when there is one.
            held = job["hold"] if job["wait"] is not None else 0
            for _ in range(held):
                assert ctx.get(dut.wait.valid) and ctx.get(dut.wait.payload) == 1 << job["wait"]
                assert ctx.get(dut.waiting) and not ctx.get(dut.cmd.valid)
                await ctx.tick()
                t += 1
            ctx.set(dut.wait.ready, 1)
            assert not ctx.get(dut.waiting)
            assert ctx.get(dut.wait.valid) == (job["wait"] is not None)
            assert ctx.get(dut.cmd.valid) == (not job["sync"])
            if not job["sync"]:
                assert ctx.get(dut.cmd.payload).rows == p & 0xFFFF
            g = t
            assert g == p + 1 + held
            await ctx.tick()
            ctx.set(dut.wait.ready, 0)
            t += 1
            for i in range(job["dur"]):       # EXEC g+1 .. g+D
                assert ctx.get(dut.executing) and not ctx.get(dut.idle)
                last = i == job["dur"] - 1
                ctx.set(dut.done, last and not job["sync"])
                assert ctx.get(dut.signal.valid) == (last and job["signal"] is not None)
                if last and job["signal"] is not None:
                    assert ctx.get(dut.signal.payload) == 1 << job["signal"]
                await ctx.tick()
                t += 1
            ctx.set(dut.done, 0)
            assert t == g + job["dur"] + 1        # free

    run_sim(dut, tb)
