"""Compare two backends on one program and shrink any disagreement to a minimal reproducer.

Used by the equivalence harness (``pytest -m equivalence``): the fast model (level 2) against
the Verilator RTL (level 3), and the RTL against the Yosys netlist (level 4). Everything
observable is compared: error code and pc, cycle count, every counter and, for successful runs,
the whole DRAM image.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hw.config import AcceleratorConfig
from hw.isa import encode
from sim.result import RunResult

__all__ = ["Mismatch", "compare_results", "run_both", "minimize", "write_reproducer"]


@dataclass
class Mismatch:
    """What differs between two runs of one program."""

    fields: list[str]

    def __str__(self) -> str:
        return "; ".join(self.fields)


def compare_results(a: RunResult, b: RunResult, names=("model", "rtl")) -> Mismatch | None:
    """Differences between two results (None if identical)."""
    out = []
    for f in ("error", "error_pc", "cycles"):
        if getattr(a, f) != getattr(b, f):
            out.append(f"{f}: {names[0]}={getattr(a, f)} {names[1]}={getattr(b, f)}")
    if a.error == b.error and a.ok:
        for k in sorted(set(a.counters) | set(b.counters), key=str):
            if a.counters.get(k) != b.counters.get(k):
                out.append(f"counter {k}: {names[0]}={a.counters.get(k)} "
                           f"{names[1]}={b.counters.get(k)}")
        if a.dram is not None and b.dram is not None and not np.array_equal(a.dram, b.dram):
            diff = np.flatnonzero(a.dram != b.dram)
            out.append(f"DRAM: {diff.size} bytes differ, first at byte {diff[0]} "
                       f"({names[0]}={a.dram[diff[0]]} {names[1]}={b.dram[diff[0]]})")
    return Mismatch(out) if out else None


def run_both(program, dram, model, rtl, regs=None
             ) -> tuple[RunResult, RunResult, Mismatch | None]:
    """Run ``program`` on both backends with run-time registers ``regs`` and compare."""
    a = model.run(program, dram, regs=regs)
    b = rtl.run(program, dram, regs=regs)
    return a, b, compare_results(a, b)


def minimize(program: list, fails, budget: int = 200) -> list:
    """Delta-debug ``program`` (a list of instructions / raw words): the shortest sub-list for
    which ``fails(sub)`` is still true, within ``budget`` trials."""
    prog = list(program)
    n = 2
    trials = 0
    while len(prog) >= 2 and trials < budget:
        chunk = max(1, len(prog) // n)
        reduced = False
        for i in range(0, len(prog), chunk):
            cand = prog[:i] + prog[i + chunk:]
            trials += 1
            if cand and fails(cand):
                prog, n, reduced = cand, max(2, n - 1), True
                break
            if trials >= budget:
                break
        if not reduced:
            if chunk == 1:
                break
            n = min(len(prog), n * 2)
    return prog


def write_reproducer(directory: str | Path, cfg: AcceleratorConfig, program: list,
                     dram: np.ndarray, mismatch: Mismatch) -> Path:
    """Save config, program words and DRAM image so the mismatch can be replayed."""
    words = [w if isinstance(w, int) else encode(w) for w in program]
    key = hashlib.sha256(json.dumps([cfg.to_json(), words]).encode()).hexdigest()[:12]
    d = Path(directory) / f"mismatch-{key}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(cfg.to_json())
    (d / "program.json").write_text(json.dumps({"words_hex": [f"{w:032x}" for w in words],
                                                "instructions": [repr(p) for p in program],
                                                "mismatch": mismatch.fields}, indent=1))
    np.asarray(dram, dtype=np.uint8).tofile(d / "dram.bin")
    return d
