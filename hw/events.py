"""Event counters: the counting semaphores engines wait on and signal (hw/timing.py, "Events").

Each of ``num_events`` counters is ``event_bits`` wide and starts at 0. In one cycle:

* a *wait* request of port ``e`` on event ``v`` is granted (``wait[e].ready``) when the counter
  as registered at the start of the cycle is at least 1 and no lower-numbered port requests the
  same event; the grant decrements the counter at the end of the cycle;
* every *signal* (``signal[e].valid``) increments its counter at the end of the cycle;
* if an update (increments minus the grant) would take a counter above ``2**event_bits - 1``,
  :attr:`EventUnit.overflow` is high in the *next* cycle (the top level stops with
  EVENT_OVERFLOW, reporting the cycle of the update).
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Signal, Value
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.fanout import replica
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
    signal_copies:
        The unit reads a registered copy of each signal's payload (:func:`hw.fanout.replica`),
        placed beside its logic, so that only the valid bits cross from the sequencers in
        the cycle of a signal. A port's payload must then be held from the cycle before its
        ``valid`` (a sequencer's mask is loaded at the pop, at least two cycles before its
        signal: :class:`hw.engine.EngineSequencer`; the LOAD engine's delay line keeps the
        spacing).

    Members
    -------
    wait: In(stream.Signature(num_events)).array(ports)
        Wait requests: ``payload`` is the event as a one-hot mask; the transfer (``ready``) is
        the grant.
    signal: In(stream.Signature(num_events, always_ready=True)).array(ports)
        Increments at the end of the cycle (one-hot mask).
    overflow: Out(1)
        A counter exceeded its maximum at the end of the *previous* cycle (the update of that
        cycle is what hw/timing.py calls the overflow; it is reported one cycle late, from a
        register, so that neither the stop logic nor what it holds back waits for the grants).
    starved: Out(ports)
        Port ``e`` requests an event whose counter is 0 (registered value).
    count: Out(data.ArrayLayout(event_bits, num_events))
        The registered counter values (for debug and tests).
    """

    def __init__(self, num_events: int, event_bits: int, ports: int = 3,
                 signal_copies: bool = False):
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
        self._signal_copies = signal_copies
        super().__init__({
            "wait": In(stream.Signature(num_events)).array(ports),
            "signal": In(stream.Signature(num_events, always_ready=True)).array(ports),
            "overflow": Out(1),
            "starved": Out(ports),
            "count": Out(data.ArrayLayout(event_bits, num_events)),
        })

    def elaborate(self, platform):
        m = Module()
        n, ports, bits = self._num_events, self._ports, self._event_bits
        limit = (1 << bits) - 1

        # A counter is held as `base + pend`: `pend` is the registered number of signals of
        # the previous cycle, folded into `base` a cycle later. A signal arrives late in its
        # cycle (from an executor's `done`), so it only reaches a small register; the grant
        # loop (base -> grant -> base) never waits for it, and reads registered flags only.
        base = [Signal(bits, name=f"base_{v}") for v in range(n)]
        pend = [Signal(range(ports + 1), name=f"pend_{v}") for v in range(n)]
        base_nonzero = Signal(n)
        nonzero = base_nonzero | Cat(p != 0 for p in pend)

        def any_of(values) -> Value:
            return Cat(*values).any() if values else Const(0)

        # Grants: the counter must be non-zero and no lower port may claim the same event. A
        # request's mask is one-hot, so these are two tests side by side (its event is
        # non-zero; a lower port requests the same mask), not a claim per event in series
        # behind every lower port's request.
        wait_hot = [w.payload for w in self.wait]
        sig_hot = [replica(m, s.payload, f"signal_hot_{e}") if self._signal_copies
                   else s.payload for e, s in enumerate(self.signal)]
        for e, w in enumerate(self.wait):
            claimed = any_of([f.valid & (wait_hot[e] & wait_hot[i]).any()
                              for i, f in enumerate(self.wait[:e])])
            m.d.comb += w.ready.eq(w.valid & (wait_hot[e] & nonzero).any() & ~claimed)

        # near[v][k]: counter v is k below its maximum, registered: computed in the previous
        # cycle from that cycle's count and update, so the overflow decision below starts
        # from flip-flops (counters start at 0).
        near_reg = [Signal(ports, name=f"near_{v}", init=sum(1 << k for k in range(ports)
                                                             if k == limit))
                    for v in range(n)]
        near = [list(r) for r in near_reg]
        for v in range(n):
            inc = Signal(range(ports + 1), name=f"inc_{v}")
            dec = Signal(name=f"dec_{v}")
            m.d.comb += [inc.eq(sum(s.valid & sig_hot[e][v] for e, s in enumerate(self.signal))),
                         # Some port requests v and it is non-zero: exactly one is granted.
                         dec.eq(nonzero[v] & Cat(w.valid & wait_hot[e][v]
                                                 for e, w in enumerate(self.wait)).any()),
                         self.count[v].eq(base[v] + pend[v])]

            def base_plus_pend_is(value, v=v):
                """base + pend == value, by cases on the small register pend."""
                return Cat((pend[v] == p) & (base[v] == value - p)
                           for p in range(ports + 1) if 0 <= value - p <= limit).any()

            def after_update_is(value, v=v, inc=inc, dec=dec):
                """base + pend + inc - dec == value, by cases on the small update: a flag per
                number of signals (from registers and the grant), picked by the signals, which
                come last (an executor's `done`)."""
                per_inc = [any_of([(dec == d) & base_plus_pend_is(value - i + d) for d in (0, 1)
                                   if 0 <= value - i + d <= limit]) for i in range(ports + 1)]
                return any_of([(inc == i) & f for i, f in enumerate(per_inc)])

            m.d.sync += [
                near_reg[v].eq(Cat(after_update_is(limit - k) for k in range(ports))),
                pend[v].eq(inc),
                base[v].eq(base[v] + pend[v] - dec),
                # base + pend - dec != 0; the grant implies base + pend >= 1.
                base_nonzero[v].eq(~(base_plus_pend_is(0) | dec & base_plus_pend_is(1))),
            ]

        # Overflow: count + inc - dec above the maximum, decided in the cycle of the update and
        # registered, because it holds back every counter and the DRAM ports at the top. The
        # signals' valid bits come late in the cycle (an executor's `done`); everything else
        # here is early (registers: the near flags, the masks, the waits and the grant, which
        # reads only registers). So the decision is taken for every set of signalling ports
        # from the early terms, and the valid bits only pick one (a multiplexer of
        # 2**ports flags). With port e's counter k below the maximum, j signals on its event
        # overflow it if j > k + 1 (`over`), or if j = k + 1 and it is not granted (`edge`).
        terms = []
        for e in range(ports):
            hot = sig_hot[e]
            over = [any_of([hot[v] & any_of(near[v][:j - 1]) for v in range(n)])
                    for j in range(1, ports + 1)]
            edge = [any_of([hot[v] & near[v][j - 1] for v in range(n)])
                    for j in range(1, ports + 1)]
            # e's event is granted: some port waits on it and it is non-zero (decs, per port)
            granted = (hot & nonzero).any() & any_of(
                [w.valid & (hot & wait_hot[f]).any() for f, w in enumerate(self.wait)])
            same = [(hot & sig_hot[f]).any() for f in range(ports)]   # f signals e's event
            terms.append((same, [over[j - 1] | edge[j - 1] & ~granted
                                 for j in range(1, ports + 1)]))

        def overflows(signalling: int) -> Value:
            """The update overflows when the ports of the bit mask ``signalling`` signal."""
            flags = []
            for e, (same, over_at) in enumerate(terms):
                if signalling >> e & 1:
                    # the ports signalling e's event, e included
                    signals = 1 + sum(same[f] for f in range(ports)
                                      if f != e and signalling >> f & 1)
                    flags.append(any_of([(signals >= j) & over_at[j - 1]
                                         for j in range(1, ports + 1)]))
            return any_of(flags)

        by_set = Cat(overflows(p) for p in range(1 << ports))
        valid = Cat(s.valid for s in self.signal)
        m.d.sync += self.overflow.eq(by_set.bit_select(valid, 1))
        for e, w in enumerate(self.wait):
            m.d.comb += self.starved[e].eq(w.valid & ~(w.payload & nonzero).any())
        return m
