"""What every benchmark shares: where results go, median timing, and writing the JSON."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["RESULTS", "median_wall", "write_json", "parser"]

#: Committed benchmark results (``bench/results/<name>.json``).
RESULTS = Path(__file__).resolve().parent / "results"


def median_wall(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median wall time of ``repeats`` calls of ``fn`` and the last call's result."""
    walls, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls), out


def write_json(path: Path, data: Any) -> Path:
    """Write ``data`` as indented JSON (creating the directory); returns ``path``.

    Atomic: the text goes to a temporary file beside ``path`` that then replaces it, so an
    interrupted run (a sweep's cached point, a result file) never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default after its help."""


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The command line of a benchmark: ``--help`` shows its docstring and every default."""
    return argparse.ArgumentParser(prog=prog, description=doc, formatter_class=_HelpFormatter)
