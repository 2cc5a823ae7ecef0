"""What every backend (fast model, RTL, netlist) returns for one program run.

The counter names are part of the hardware contract (:data:`hw.counters.COUNTERS`): the
equivalence harness compares them one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hw.isa import ErrorCode

__all__ = ["RunResult"]


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
        Values of :data:`hw.counters.COUNTERS`.
    dram:
        Final DRAM image (``uint8``); ``None`` in timing-only runs.
    trace:
        Optional per-instruction timeline (backend specific).
    detail:
        Human-readable explanation of an error (e.g. the engine states of a deadlock), when the
        backend can give one.
    stall_cycles:
        Cycles the board's memory froze the accelerator (hw/board/bridge.py), on top of
        ``cycles``; 0 on the other backends, whose memory is the timing contract's.
    """

    cycles: int
    error: ErrorCode = ErrorCode.NONE
    error_pc: int = 0
    counters: dict[str, int] = field(default_factory=dict)
    dram: np.ndarray | None = None
    trace: list | None = None
    detail: str = ""
    stall_cycles: int = 0

    @property
    def ok(self) -> bool:
        return self.error == ErrorCode.NONE

    @property
    def utilisation(self) -> float:
        """Fraction of cycles in which every lane performed a MAC (``mac_cycles / cycles``)."""
        return self.counters.get("mac_cycles", 0) / self.cycles if self.cycles else 0.0
