"""Registered copies of a signal that drives many loads (fan-out is routing delay on the ECP5).

A control value that is constant while an instruction runs (a field of the instruction
register, a decoded mode) can feed each lane, or each group of lanes, from its own flip-flop one
cycle behind the value: the copies hold the instruction wherever the original would have,
provided the value is stable one cycle before its first use and until one cycle after its last
(every user states why it is). Each copy carries the ``keep`` attribute, and ``hw.synth`` puts
``keep`` on the flip-flop of every register so marked, because Yosys' ``opt_merge`` otherwise
folds identical registers back into one. A copy is not reset (it follows ``value`` within a
cycle), so it adds no load to a reset net either, unless the copy is a strobe registered a
cycle early that must not outlive a reset (``reset=True``).
"""

from __future__ import annotations

from amaranth import Module, Signal, Value

from hw.config import AcceleratorConfig

__all__ = ["LANES_PER_COPY", "lane_groups", "registered_control", "replica"]

#: Lanes served by one copy of a per-lane-group control value (the epilogue's mode and shift
#: mask, the decoder's window control): the fan-out bound of the lane datapaths.
LANES_PER_COPY = 8


def replica(m: Module, value: Value, name: str, *, reset: bool = False) -> Signal:
    """A ``keep`` register in ``m``'s sync domain that follows ``value`` one cycle behind.

    ``reset``: the register is reset (to ``value``'s initial value), for a copy that must read
    as idle in the cycle after a reset whatever ``value`` was in the reset's cycle (a strobe
    computed a cycle early).
    """
    r = Signal.like(value, name=name, reset_less=not reset, attrs={"keep": 1})
    m.d.sync += r.eq(value)
    return r


def lane_groups(lanes: int) -> list[range]:
    """The lanes of each copy: ``range(0, 8)``, ``range(8, 16)``, ... (the last may be short)."""
    return [range(lo, min(lanes, lo + LANES_PER_COPY)) for lo in range(0, lanes, LANES_PER_COPY)]


def registered_control(cfg: AcceleratorConfig) -> bool:
    """The control paths that cross the die start at registers set a cycle early.

    With the vector engine (:attr:`hw.config.AcceleratorConfig.has_vector`), whose design
    fills three quarters of the 85F, wires between blocks limit its clock, and each of these
    paths was the placed design's worst:

    * the COMPUTE core's ``done`` is a flip-flop set a cycle early (the sequencer turns it
      into its signal, which feeds every event counter and the event unit's overflow
      multiplexer), and the epilogue's ``start`` is registered a cycle early with it
      (:class:`hw.compute.ComputeCore`);
    * each queue's ``ready`` is a copy of its "not full" register, read by the fetch unit's
      dispatch decision alone (:class:`hw.queues.InstrQueue`, ``ready_copy``);
    * the event unit reads registered copies of the signals' payloads
      (:class:`hw.events.EventUnit`, ``signal_copies``).

    None of them moves a cycle. The configurations without the engine keep their logic as it
    is: the board's 2x8 design gains no flip-flop, so its bitstream stays valid.
    """
    return cfg.has_vector
