"""Proof: the event unit never loses or duplicates a signal (k-induction: every cycle).

:class:`hw.events.EventUnit` as the top level instantiates it (``cfg.num_events`` counters of
``cfg.event_bits`` bits, one wait and one signal port per :class:`hw.isa.Engine`) is driven with
any interleaving of one-hot waits and signals (or none) from every port in every cycle. The
harness keeps reference counters, wide enough never to wrap: each cycle ``ref[v] += signals of
v - grants of v``. Until the unit reports an overflow, in every cycle:

* ``count[v] == ref[v]`` for every event (nothing lost, nothing counted twice);
* a grant (``wait[e].ready``) happens only for a valid request whose event has ``ref >= 1``, and
  only one port is granted an event per cycle (no duplicated grant);
* a valid request is granted when its event has ``ref >= 1`` and no lower-numbered port
  requests the same event (no lost wake-up), and ``starved`` flags exactly the requests whose
  event has ``ref == 0``;
* ``overflow`` is high exactly in the cycle after an update that takes a reference counter above
  ``2**event_bits - 1``. From then on the machine is stopped (hw/top.py) and nothing is checked.
"""

from __future__ import annotations

from amaranth import Cat, Signal, unsigned
from amaranth.hdl import Assert, Assume

from hw.config import AcceleratorConfig
from hw.events import EventUnit
from hw.isa import Engine

from .flow import Harness, Proof

__all__ = ["EventsHarness", "proofs"]


def _one_hot_or_zero(mask):
    """``mask`` has at most one bit set."""
    return (mask & (mask - 1)) == 0


class EventsHarness(Harness):
    """The event unit of ``cfg`` under free, one-hot waits and signals."""

    def __init__(self, cfg: AcceleratorConfig):
        super().__init__()
        self.cfg = cfg
        self.n_ports = len(Engine)
        n = cfg.num_events
        self.wait_valid = [self.free(1, f"wait{e}_valid") for e in range(self.n_ports)]
        self.wait_mask = [self.free(n, f"wait{e}_mask") for e in range(self.n_ports)]
        self.sig_valid = [self.free(1, f"signal{e}_valid") for e in range(self.n_ports)]
        self.sig_mask = [self.free(n, f"signal{e}_mask") for e in range(self.n_ports)]

    def elaborate(self, platform):
        m = self.module()
        cfg, ports = self.cfg, self.n_ports
        n, bits = cfg.num_events, cfg.event_bits
        limit = (1 << bits) - 1
        m.submodules.dut = dut = EventUnit(n, bits, ports=ports)

        # The engines' contract: masks are one-hot (hw.engine turns one event id into a mask).
        for e in range(ports):
            m.d.comb += [
                dut.wait[e].valid.eq(self.wait_valid[e]), dut.wait[e].payload.eq(self.wait_mask[e]),
                dut.signal[e].valid.eq(self.sig_valid[e]),
                dut.signal[e].payload.eq(self.sig_mask[e]),
                Assume(~self.wait_valid[e] | ((self.wait_mask[e] != 0)
                                              & _one_hot_or_zero(self.wait_mask[e]))),
                Assume(~self.sig_valid[e] | ((self.sig_mask[e] != 0)
                                             & _one_hot_or_zero(self.sig_mask[e]))),
            ]

        # Reference counters: at most limit + ports before the overflow stops the checks.
        ref = [Signal(unsigned(bits + 2), name=f"ref{v}") for v in range(n)]
        ovf_due = Signal()   # the previous cycle's update overflowed
        dead = Signal()      # an overflow was reported: the machine has stopped
        m.d.sync += dead.eq(dead | ovf_due)
        live = ~dead & ~ovf_due   # the counters are meaningful (no overflow so far)

        grants = [dut.wait[e].ready for e in range(ports)]
        over_next = []
        for v in range(n):
            want = [self.wait_valid[e] & self.wait_mask[e][v] for e in range(ports)]
            got = [grants[e] & self.wait_mask[e][v] for e in range(ports)]
            inc = sum(self.sig_valid[e] & self.sig_mask[e][v] for e in range(ports))
            dec = sum(got)
            nxt = ref[v] + inc - dec
            over_next.append(nxt > limit)
            m.d.sync += ref[v].eq(nxt)
            with m.If(live):
                m.d.comb += [
                    Assert(dut.count[v] == ref[v], "count != signals - grants"),
                    Assert(ref[v] <= limit, "reference counter above the maximum"),
                    Assert(dec <= 1, "one event granted twice in a cycle"),
                ]
                for e in range(ports):
                    lower = Cat(want[:e]).any() if e else 0
                    m.d.comb += [
                        Assert(~got[e] | (ref[v] >= 1), "grant of an event whose count is 0"),
                        Assert(~want[e] | (got[e] == ((ref[v] >= 1) & ~lower)),
                               "grant rule: count >= 1 and no lower port on the event"),
                        Assert(~want[e] | (dut.starved[e] == (ref[v] == 0)),
                               "starved != (count == 0)"),
                    ]
        for e in range(ports):
            with m.If(live):
                m.d.comb += Assert(~grants[e] | self.wait_valid[e], "grant without a request")
        m.d.sync += ovf_due.eq(Cat(over_next).any())
        with m.If(~dead):
            m.d.comb += Assert(dut.overflow == ovf_due, "overflow not reported in the next cycle")
        return m


def proofs(cfg: AcceleratorConfig) -> list[Proof]:
    """The event-unit proof (k-induction, so it holds in every cycle)."""
    return [Proof("events", lambda: EventsHarness(cfg), "prove", 4,
                  f"EventUnit({cfg.num_events} events x {cfg.event_bits} bits, {len(Engine)} "
                  f"ports): count == signals - grants, grants only when positive, one per "
                  f"event, overflow reported next cycle")]
