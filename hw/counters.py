"""The performance counters: names, order and width, defined once.

Every backend (the RTL top level :class:`hw.top.Accelerator`, the fast model, the Verilator and
netlist runners) reports these counters under these names, and the equivalence harness compares
them one by one. Their cycle-level meaning is part of the timing contract (:mod:`hw.timing`):
all reset at ``start`` and cover cycles ``0 .. cycles - 1``; the DMA beat and MAC counters add
an instruction's total when it ends.
"""

from __future__ import annotations

from amaranth.lib import data

from hw.engines import ENGINES, WORK_COUNTERS

__all__ = ["COUNTERS", "COUNTER_BITS", "CounterLayout"]

#: Hardware counters, in port order, from the engine table (:mod:`hw.engines`):
#:
#: - ``<engine>_exec``, ``<engine>_wait`` of every engine (``load``, ``compute``, ``store``):
#:   the cycles it executes (the sum of ``D``) and the cycles it waits on an event whose counter
#:   is 0 (``g - (p + 1)``);
#: - ``fetch_stall``: the cycles an available instruction waits for queue space (``d - a``);
#: - the opcodes' work counters (:data:`hw.engines.WORK_COUNTERS`): ``dram_read_beats`` (beats
#:   read from DRAM), ``dram_write_beats`` (beats written to DRAM), ``mac_cycles`` (cycles row 0
#:   of the array multiplies: the sum of ``k_steps * tokens``);
#: - ``instructions``: the instructions dispatched, END included.
COUNTERS: tuple[str, ...] = (
    *(name for e in ENGINES for name in (e.exec_counter, e.wait_counter)),
    "fetch_stall",
    *WORK_COUNTERS,
    "instructions",
)

#: Width of the cycle counter and of every performance counter.
COUNTER_BITS = 48

#: The counters as the top level's output port, in the order of :data:`COUNTERS`.
CounterLayout = data.StructLayout({name: COUNTER_BITS for name in COUNTERS})
