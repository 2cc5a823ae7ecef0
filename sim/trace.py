"""Timeline traces of a run in the Chrome / Perfetto JSON format (open in ui.perfetto.dev).

One track per engine (fetch, LOAD, COMPUTE, STORE); every instruction is a slice from its grant
to its last execution cycle, preceded by a "wait" slice while it waits on an event.
"""

from __future__ import annotations

import json
from pathlib import Path

from hw.cli import write_text_atomic
from hw.config import AcceleratorConfig
from hw.engines import ENGINES
from hw.isa import MOVE_SOURCES, Gemm, Instr, Load, Store, Sync
from sim.model import InstrTiming

__all__ = ["chrome_trace", "write_trace", "instruction_events", "track_names"]

#: Track ids: fetch, then every engine of :data:`hw.engines.ENGINES`.
_TRACKS = {"fetch": 0, **{e.engine.name: 1 + i for i, e in enumerate(ENGINES)}}


def _label(ins: Instr) -> str:
    if isinstance(ins, Load):
        return f"LOAD {ins.spad.name} {ins.rows}x{ins.row_beats} beats"
    if isinstance(ins, Store) and ins.spad in MOVE_SOURCES:
        return f"MOVE {ins.rows}x{ins.row_beats} beats -> VIN @{ins.dram_addr}"
    if isinstance(ins, Store):
        return f"STORE {ins.rows}x{ins.row_beats} beats -> @{ins.dram_addr}"
    if isinstance(ins, Gemm):
        return f"GEMM {ins.k_steps} steps x {ins.tokens} tok ({ins.epilogue.name})"
    if isinstance(ins, Sync):
        return "SYNC"
    return type(ins).__name__


def instruction_events(program: list[Instr], timings: list[InstrTiming],
                       cfg: AcceleratorConfig, start: int = 0) -> list[dict]:
    """The slices of one run, shifted to start at cycle ``start`` (one track per engine)."""
    us = 1.0 / cfg.clock_mhz  # microseconds per cycle
    events = []
    for t in timings:
        ins = program[t.index]
        if t.dispatch > t.available:
            events.append({"ph": "X", "pid": 0, "tid": 0, "name": "queue full",
                           "ts": (start + t.available) * us,
                           "dur": (t.dispatch - t.available) * us})
        if t.engine is None or t.grant < 0:
            continue
        tid = _TRACKS[t.engine.name]
        args = {"index": t.index, "wait": ins.wait, "signal": ins.signal,
                "cycles": t.end - t.grant}
        if t.grant > t.pop + 1:
            events.append({"ph": "X", "pid": 0, "tid": tid, "name": f"wait ev{ins.wait}",
                           "ts": (start + t.pop + 1) * us, "dur": (t.grant - t.pop - 1) * us,
                           "args": {"index": t.index}})
        events.append({"ph": "X", "pid": 0, "tid": tid, "name": _label(ins),
                       "ts": (start + t.grant + 1) * us, "dur": (t.end - t.grant) * us,
                       "args": args})
    return events


def track_names(extra: dict[str, int] | None = None) -> list[dict]:
    """Metadata events naming the accelerator process and its tracks (and ``extra`` ones)."""
    events = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": "accelerator"}}]
    for name, tid in {**_TRACKS, **(extra or {})}.items():
        events.append({"ph": "M", "pid": 0, "tid": tid, "name": "thread_name",
                       "args": {"name": name}})
    return events


def chrome_trace(program: list[Instr], timings: list[InstrTiming],
                 cfg: AcceleratorConfig) -> dict:
    """Build the trace document for a run (``timings`` from ``FastModel.run(trace=True)``)."""
    return {"traceEvents": track_names() + instruction_events(program, timings, cfg),
            "displayTimeUnit": "ns",
            "otherData": {"clock_mhz": cfg.clock_mhz, "lanes": cfg.lanes}}


def write_trace(path: str | Path, program: list[Instr], timings: list[InstrTiming],
                cfg: AcceleratorConfig) -> Path:
    """Write :func:`chrome_trace` to ``path`` (JSON)."""
    return write_text_atomic(path, json.dumps(chrome_trace(program, timings, cfg)))
