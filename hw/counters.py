"""The performance counters: names, order and width, defined once.

Every backend (the RTL top level :class:`hw.top.Accelerator`, the fast model, the Verilator and
netlist runners) reports these counters under these names, and the equivalence harness compares
them one by one. Their cycle-level meaning is part of the timing contract (:mod:`hw.timing`):
all reset at ``start`` and cover cycles ``0 .. cycles - 1``; the DMA beat and MAC counters add
an instruction's total when it ends.
"""

from __future__ import annotations

from amaranth.lib import data

__all__ = ["COUNTERS", "COUNTER_BITS", "CounterLayout"]

#: Hardware counters, in port order. Engine names: load, compute, store.
COUNTERS = (
    "load_exec",        # cycles the LOAD engine spends executing (sum of D)
    "load_wait",        # cycles it waits on an event whose counter is 0: g - (p + 1)
    "compute_exec",
    "compute_wait",
    "store_exec",
    "store_wait",
    "fetch_stall",      # cycles an available instruction waits for queue space: d - a
    "dram_read_beats",  # beats read from DRAM
    "dram_write_beats", # beats written to DRAM
    "mac_cycles",       # cycles row 0 of the array multiplies: sum of k_steps * tokens
    "instructions",     # instructions dispatched, END included
)

#: Width of the cycle counter and of every performance counter.
COUNTER_BITS = 48

#: The counters as the top level's output port, in the order of :data:`COUNTERS`.
CounterLayout = data.StructLayout({name: COUNTER_BITS for name in COUNTERS})
