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

from collections.abc import Callable

from amaranth import Cat, Module, Mux, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.isa import NO_EVENT
from hw.queues import entry_layout
from hw.timing import SYNC_CYCLES

__all__ = ["EngineSequencer"]


class EngineSequencer(wiring.Component):
    """IDLE / WAIT / EXEC control of one engine.

    Parameters
    ----------
    body:
        Layout of the instruction body the executor takes.
    num_events:
        Number of event counters; events travel to the event unit as one-hot masks of this
        width, decoded when the entry is popped (so the grant logic starts from flip-flops).
    derive:
        Optional: a function of a body (an Amaranth view of ``body``) whose value is registered
        at each pop and given beside the body (``derived``); None (the default) adds nothing.

    Members
    -------
    queue: In(stream.Signature(entry_layout(body)))
        The engine's instruction queue; popped (``ready``) in IDLE.
    wait: Out(stream.Signature(num_events))
        Wait request to the event unit (one-hot event mask); ``ready`` is the grant.
    signal: Out(stream.Signature(num_events, always_ready=True))
        Signal event (one-hot mask), raised in the last execution cycle.
    cmd: Out(stream.Signature(body))
        The body, valid in the grant cycle of a non-SYNC instruction. The executor must be
        ready then (it is idle: the previous instruction has ended). ``payload`` holds the body
        from the cycle after the pop, so an executor may copy it while idle.
    derived: Out(width of ``derive``'s value), only with ``derive``
        ``derive(body)`` of the entry popped, registered beside the body at the pop (so, as
        ``payload``, held from the cycle after it): what the executor would compute from the
        body in the transfer cycle, computed here from the queue's entry instead, so that
        only a register's wire lies between the sequencer and the executor's registers.
    done: In(1)
        The executor's end-of-execution pulse.
    idle, waiting, executing: Out(1)
        The state; ``waiting`` is high only while the wait is *not* granted (a wait cycle).
    ending: Out(1)
        The last execution cycle ``e`` (every instruction's, with or without a signal).
    """

    def __init__(self, body: data.Layout, num_events: int,
                 derive: Callable[[data.View], Value] | None = None):
        if not isinstance(num_events, int) or not 1 <= num_events < NO_EVENT:
            raise ValueError(f"num_events must be in [1, {NO_EVENT - 1}], got {num_events!r}")
        self._body = body
        self._num_events = num_events
        self._derive = derive
        extra = {}
        if derive is not None:
            extra["derived"] = Out(Value.cast(derive(Signal(body))).shape())
        super().__init__({
            "queue": In(stream.Signature(entry_layout(body))),
            "wait": Out(stream.Signature(num_events)),
            "signal": Out(stream.Signature(num_events, always_ready=True)),
            "cmd": Out(stream.Signature(body)),
            "done": In(1),
            "idle": Out(1),
            "waiting": Out(1),
            "executing": Out(1),
            "ending": Out(1),
            **extra,
        })

    def elaborate(self, platform):
        m = Module()
        n = self._num_events
        body = Signal(self._body)
        is_sync = Signal()
        has_wait = Signal()
        has_signal = Signal()
        wait_mask = Signal(n)
        signal_mask = Signal(n)
        sync_left = Signal(range(max(SYNC_CYCLES, 1)))
        m.d.comb += [
            self.wait.payload.eq(wait_mask),
            self.signal.payload.eq(signal_mask),
            self.cmd.payload.eq(body),
        ]
        with m.FSM(name="state"):
            with m.State("IDLE"):
                m.d.comb += [self.idle.eq(1), self.queue.ready.eq(1)]
                with m.If(self.queue.valid):
                    e = self.queue.payload
                    m.d.sync += [
                        body.eq(e.body), is_sync.eq(e.sync),
                        has_wait.eq(e.wait != NO_EVENT), has_signal.eq(e.signal != NO_EVENT),
                        wait_mask.eq(Cat(e.wait == v for v in range(n))),
                        signal_mask.eq(Cat(e.signal == v for v in range(n))),
                    ]
                    if self._derive is not None:
                        m.d.sync += self.derived.eq(self._derive(e.body))
                    m.next = "WAIT"
            with m.State("WAIT"):
                m.d.comb += self.wait.valid.eq(has_wait)
                granted = ~has_wait | self.wait.ready
                m.d.comb += self.waiting.eq(~granted)
                with m.If(granted):
                    m.d.comb += self.cmd.valid.eq(~is_sync)
                    m.d.sync += sync_left.eq(SYNC_CYCLES - 1)
                    m.next = "EXEC"
            with m.State("EXEC"):
                m.d.comb += self.executing.eq(1)
                m.d.sync += sync_left.eq(sync_left - 1)
                finish = Mux(is_sync, sync_left == 0, self.done)
                with m.If(finish):
                    m.d.comb += [self.ending.eq(1), self.signal.valid.eq(has_signal)]
                    m.next = "IDLE"
        return m
