"""A Perfetto timeline of one compiled step: every program's instructions on the engine
tracks, one slice per program, and the host's operations in between at their estimated
on-chip cycles (:mod:`sw.runtime.costs`), all on one clock (open in ui.perfetto.dev)."""

from __future__ import annotations

import json
from pathlib import Path

from hw.isa import decode_program
from sim.trace import instruction_events, track_names
from sw.compile.executable import Executable
from sw.runtime.runtime import StepStats

__all__ = ["step_trace", "write_step_trace"]

#: Track ids of the programs and the host's operations: after the engines' (and fetch's:
#: every track but the process's name in :func:`sim.trace.track_names`).
_PROGRAMS = len(track_names()) - 1
_HOST = _PROGRAMS + 1


def step_trace(exe: Executable, step: StepStats) -> dict:
    """The trace document of ``step`` (run with ``Runtime(..., trace=True)``)."""
    cfg = exe.cfg
    us = 1.0 / cfg.clock_mhz
    events = track_names({"programs": _PROGRAMS, "host (estimated)": _HOST})
    host: dict[str, list] = {}
    for h in step.host:
        host.setdefault(h.node, []).append(h)
    programs = {p.node: p for p in step.programs}
    clock = 0
    for node in exe.graphs[step.phase].nodes:
        # a program's prologue and epilogue are drawn together, before it
        for h in host.get(node.name, []):
            if h.unit_cycles:
                events.append({"ph": "X", "pid": 0, "tid": _HOST, "name": f"{h.op} {node.name}",
                               "ts": clock * us, "dur": h.unit_cycles * us,
                               "args": {"wall_ms": h.wall_s * 1e3, "io_ms": h.io_s * 1e3}})
                clock += h.unit_cycles
        p = programs.get(node.name)
        if p is None:
            continue
        if p.trace is not None:
            words = exe.programs[p.program].words
            program = decode_program(words.astype("<u8").tobytes())
            events += instruction_events(program, p.trace, cfg, start=clock)
        events.append({"ph": "X", "pid": 0, "tid": _PROGRAMS, "name": node.name,
                       "ts": clock * us, "dur": p.cycles * us,
                       "args": {"cycles": p.cycles, "bucket": p.bucket}})
        clock += p.cycles
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"clock_mhz": cfg.clock_mhz, "phase": step.phase,
                          "position": step.past}}


def write_step_trace(path: str | Path, exe: Executable, step: StepStats) -> Path:
    """Write :func:`step_trace` as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(step_trace(exe, step)))
    return path
