"""EngineSequencer's ``derive``: a function of the body registered beside it at the pop."""

from __future__ import annotations

from amaranth.lib import data
from amaranth.sim import Simulator

from hw.engine import EngineSequencer
from hw.isa import NO_EVENT

BODY = data.StructLayout({"x": 8})


def test_derived_is_registered_at_the_pop_and_held_with_the_payload():
    """``derived`` is ``derive(body)`` of the entry popped from the cycle after the pop (as
    ``cmd.payload``), through the grant and the execution, until the next pop; without
    ``derive`` the sequencer has no such member."""
    assert not hasattr(EngineSequencer(BODY, 4), "derived")
    seq = EngineSequencer(BODY, 4, derive=lambda body: body.x + 1)
    assert len(seq.derived) == 9
    seen = []

    async def bench(ctx):
        for x in (7, 200, 255):
            ctx.set(seq.queue.payload, {"wait": NO_EVENT, "signal": NO_EVENT, "sync": 0,
                                        "body": {"x": x}})
            ctx.set(seq.queue.valid, 1)
            assert ctx.get(seq.queue.ready)              # IDLE: the pop, cycle p
            await ctx.tick()
            ctx.set(seq.queue.valid, 0)
            ctx.set(seq.queue.payload, {"wait": NO_EVENT, "signal": NO_EVENT, "sync": 0,
                                        "body": {"x": x ^ 0x55}})   # the queue moves on
            for _ in range(3):                           # p + 1 (the grant), then EXEC
                seen.append((ctx.get(seq.cmd.payload.x), ctx.get(seq.derived)))
                await ctx.tick()
            ctx.set(seq.done, 1)                         # the execution's last cycle
            seen.append((ctx.get(seq.cmd.payload.x), ctx.get(seq.derived)))
            await ctx.tick()
            ctx.set(seq.done, 0)

    sim = Simulator(seq)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    assert seen == [(x, x + 1) for x in (7, 200, 255) for _ in range(4)]
