"""The per-engine sequencer: pop an entry, wait on its event, execute it, signal.

Every engine (LOAD, COMPUTE, STORE) runs the same three-state machine in front of its executor
(:mod:`hw.dma` or :class:`hw.compute.ComputeCore`); it is where the engine rules of
hw/timing.py are implemented:

========  =====================================================================================
IDLE      pops the queue head when there is one (cycle ``p``)
WAIT      from ``p + 1``: requests the wait event; the grant cycle ``g`` is the first in which
          the event unit grants it (``p + 1`` without a wait event). In ``g`` the body is handed
          to the executor (``cmd.valid``), whose transfer cycle is therefore ``g``
EXEC      ``g + 1 .. g + D``: ends in the cycle the executor pulses ``done`` (a SYNC ends after
          :data:`hw.timing.SYNC_CYCLES`); the signal event is raised in that cycle
========  =====================================================================================

and the engine is IDLE again in ``e + 1 = free``.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.isa import NO_EVENT
from hw.queues import EVENT_ID_BITS, entry_layout
from hw.timing import SYNC_CYCLES

__all__ = ["EngineSequencer"]


class EngineSequencer(wiring.Component):
    """IDLE / WAIT / EXEC control of one engine.

    Parameters
    ----------
    body:
        Layout of the instruction body the executor takes.

    Members
    -------
    queue: In(stream.Signature(entry_layout(body)))
        The engine's instruction queue; popped (``ready``) in IDLE.
    wait: Out(stream.Signature(EVENT_ID_BITS))
        Wait request to the event unit; ``ready`` is the grant.
    signal: Out(stream.Signature(EVENT_ID_BITS, always_ready=True))
        Signal event, raised in the last execution cycle.
    cmd: Out(stream.Signature(body))
        The body, valid in the grant cycle of a non-SYNC instruction. The executor must be
        ready then (it is idle: the previous instruction has ended).
    done: In(1)
        The executor's end-of-execution pulse.
    idle, waiting, executing: Out(1)
        The state; ``waiting`` is high only while the wait is *not* granted (a wait cycle).
    """

    def __init__(self, body: data.Layout):
        self._body = body
        super().__init__({
            "queue": In(stream.Signature(entry_layout(body))),
            "wait": Out(stream.Signature(EVENT_ID_BITS)),
            "signal": Out(stream.Signature(EVENT_ID_BITS, always_ready=True)),
            "cmd": Out(stream.Signature(body)),
            "done": In(1),
            "idle": Out(1),
            "waiting": Out(1),
            "executing": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        entry = Signal(entry_layout(self._body))
        sync_left = Signal(range(max(SYNC_CYCLES, 1)))
        has_wait = entry.wait != NO_EVENT
        m.d.comb += [
            self.wait.payload.eq(entry.wait),
            self.signal.payload.eq(entry.signal),
            self.cmd.payload.eq(entry.body),
        ]
        with m.FSM(name="state"):
            with m.State("IDLE"):
                m.d.comb += [self.idle.eq(1), self.queue.ready.eq(1)]
                with m.If(self.queue.valid):
                    m.d.sync += entry.eq(self.queue.payload)
                    m.next = "WAIT"
            with m.State("WAIT"):
                m.d.comb += self.wait.valid.eq(has_wait)
                granted = ~has_wait | self.wait.ready
                m.d.comb += self.waiting.eq(~granted)
                with m.If(granted):
                    m.d.comb += self.cmd.valid.eq(~entry.sync)
                    m.d.sync += sync_left.eq(SYNC_CYCLES - 1)
                    m.next = "EXEC"
            with m.State("EXEC"):
                m.d.comb += self.executing.eq(1)
                m.d.sync += sync_left.eq(sync_left - 1)
                finish = Mux(entry.sync, sync_left == 0, self.done)
                with m.If(finish):
                    m.d.comb += self.signal.valid.eq(entry.signal != NO_EVENT)
                    m.next = "IDLE"
        return m
