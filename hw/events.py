"""Event counters: the counting semaphores engines wait on and signal (hw/timing.py, "Events").

Each of ``num_events`` counters is ``event_bits`` wide and starts at 0. In one cycle:

* a *wait* request of port ``e`` on event ``v`` is granted (``wait[e].ready``) when the counter
  as registered at the start of the cycle is at least 1 and no lower-numbered port requests the
  same event; the grant decrements the counter at the end of the cycle;
* every *signal* (``signal[e].valid``) increments its counter at the end of the cycle;
* if an update (increments minus the grant) would take a counter above ``2**event_bits - 1``,
  :attr:`EventUnit.overflow` is high in that cycle (the top level stops with EVENT_OVERFLOW).
"""

from __future__ import annotations

from amaranth import Cat, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.queues import EVENT_ID_BITS

__all__ = ["EventUnit"]


class EventUnit(wiring.Component):
    """``num_events`` counting semaphores shared by ``ports`` engines.

    Parameters
    ----------
    num_events:
        Number of counters (event ids ``0 .. num_events - 1``).
    event_bits:
        Width of every counter.
    ports:
        Number of engines (wait and signal ports); port 0 wins a contended grant.

    Members
    -------
    wait: In(stream.Signature(EVENT_ID_BITS)).array(ports)
        Wait requests: ``payload`` is the event id; the transfer (``ready``) is the grant.
    signal: In(stream.Signature(EVENT_ID_BITS, always_ready=True)).array(ports)
        Increments at the end of the cycle.
    overflow: Out(1)
        A counter would exceed its maximum at the end of this cycle.
    count: Out(data.ArrayLayout(event_bits, num_events))
        The registered counter values (for debug and tests).
    """

    def __init__(self, num_events: int, event_bits: int, ports: int = 3):
        if not isinstance(num_events, int) or not 1 <= num_events < 1 << EVENT_ID_BITS:
            raise ValueError(f"num_events must be in [1, {(1 << EVENT_ID_BITS) - 1}], "
                             f"got {num_events!r}")
        if not isinstance(event_bits, int) or event_bits < 1:
            raise ValueError(f"event_bits must be a positive integer, got {event_bits!r}")
        if not isinstance(ports, int) or ports < 1:
            raise ValueError(f"ports must be a positive integer, got {ports!r}")
        self._num_events = num_events
        self._event_bits = event_bits
        self._ports = ports
        super().__init__({
            "wait": In(stream.Signature(EVENT_ID_BITS)).array(ports),
            "signal": In(stream.Signature(EVENT_ID_BITS, always_ready=True)).array(ports),
            "overflow": Out(1),
            "count": Out(data.ArrayLayout(event_bits, num_events)),
        })

    def elaborate(self, platform):
        m = Module()
        n, ports = self._num_events, self._ports
        limit = (1 << self._event_bits) - 1
        nonzero = Signal(n)
        m.d.comb += nonzero.eq(Cat(self.count[v] != 0 for v in range(n)))

        # Grants: the counter must be non-zero and no lower port may ask for the same event.
        for e in range(ports):
            req = self.wait[e]
            contended = 0
            for f in range(e):
                contended = contended | (self.wait[f].valid & (self.wait[f].payload == req.payload))
            m.d.comb += req.ready.eq(req.valid & nonzero.bit_select(req.payload, 1) & ~contended)

        overflows = []
        for v in range(n):
            inc = sum((s.valid & (s.payload == v)) for s in self.signal)
            dec = Cat((w.ready & (w.payload == v)) for w in self.wait).any()
            nxt = Signal(range(limit + ports + 1), name=f"next_{v}")
            m.d.comb += nxt.eq(self.count[v] + inc - dec)
            overflows.append(nxt > limit)
            m.d.sync += self.count[v].eq(nxt)
        m.d.comb += self.overflow.eq(Cat(overflows).any())
        return m
