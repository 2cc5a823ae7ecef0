"""The performance counters: names, order and width, defined once.

Every backend (the RTL top level :class:`hw.top.Accelerator`, the fast model, the Verilator and
netlist runners) reports a configuration's counters (:func:`counters`) under these names, and
the equivalence harness compares them one by one. Their cycle-level meaning is part of the
timing contract (:mod:`hw.timing`): all reset at ``start`` and cover cycles ``0 .. cycles -
1``; the DMA beat, MAC and vector element counters add an instruction's total when it ends.
"""

from __future__ import annotations

from amaranth.lib import data

from hw.config import AcceleratorConfig
from hw.engines import ENGINES, OPS, engines_of

__all__ = ["COUNTERS", "COUNTER_BITS", "CounterLayout", "counters", "counter_layout"]


def counters(cfg: AcceleratorConfig) -> tuple[str, ...]:
    """The hardware counters of a configuration, in port order, from the engine table
    (:mod:`hw.engines`) and the engines ``cfg`` has (:func:`hw.engines.engines_of`):

    - ``<engine>_exec``, ``<engine>_wait`` of every engine (``load``, ``compute``, ``store``,
      ``vector``): the cycles it executes (the sum of ``D``) and the cycles it waits on an
      event whose counter is 0 (``g - (p + 1)``);
    - ``fetch_stall``: the cycles an available instruction waits for queue space (``d - a``);
    - the work counters (:data:`hw.engines.WORK_COUNTERS`) of its engines' opcodes:
      ``dram_read_beats`` (beats read from DRAM), ``dram_write_beats`` (beats written to
      DRAM), ``mac_cycles`` (cycles row 0 of the array multiplies: the sum of ``k_steps *
      tokens``), ``vector_elements`` (elements the vector engine streams: the sum of VEC
      ``length``);
    - ``instructions``: the instructions dispatched, END included.

    >>> "vector_exec" in counters(AcceleratorConfig())
    False
    """
    present = {e.engine for e in engines_of(cfg)}
    return (
        *(name for e in ENGINES if e.engine in present
          for name in (e.exec_counter, e.wait_counter)),
        "fetch_stall",
        *(name for op in OPS if op.engine is None or op.engine in present for name in op.work),
        "instructions",
    )


#: Width of the cycle counter and of every performance counter.
COUNTER_BITS = 48


def counter_layout(cfg: AcceleratorConfig) -> data.StructLayout:
    """The counters of ``cfg`` as the top level's output port, in the order of
    :func:`counters`."""
    return data.StructLayout({name: COUNTER_BITS for name in counters(cfg)})


#: The counters of a configuration with no optional engine (the default's; the board's host
#: link carries these), and their layout.
COUNTERS: tuple[str, ...] = counters(AcceleratorConfig())
CounterLayout = counter_layout(AcceleratorConfig())
