"""What every backend (fast model, RTL, netlist) returns for one program run.

The counter names are part of the contract: the equivalence harness compares them one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hw.isa import ErrorCode

__all__ = ["COUNTERS", "RunResult"]

#: Hardware counters, all reset at start. Engine names: load, compute, store.
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


@dataclass
class RunResult:
    """Outcome of running one program.

    Attributes
    ----------
    cycles:
        Cycle in which the machine finished (done or error), see hw/timing.py.
    error:
        :class:`hw.isa.ErrorCode` (NONE on success).
    error_pc:
        Index of the offending instruction (for dispatch errors), else 0.
    counters:
        Values of :data:`COUNTERS`.
    dram:
        Final DRAM image (``uint8``); ``None`` in timing-only runs.
    trace:
        Optional per-instruction timeline (backend specific).
    detail:
        Human-readable explanation of an error (e.g. the engine states of a deadlock), when the
        backend can give one.
    """

    cycles: int
    error: ErrorCode = ErrorCode.NONE
    error_pc: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    dram: np.ndarray | None = None
    trace: list | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.error == ErrorCode.NONE

    @property
    def utilisation(self) -> float:
        """Fraction of cycles in which every lane performed a MAC (``mac_cycles / cycles``)."""
        return self.counters.get("mac_cycles", 0) / self.cycles if self.cycles else 0.0
