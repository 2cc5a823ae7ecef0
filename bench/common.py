"""What every benchmark shares: where results go, median timing, writing the JSON, and the
command line (``--record``, one-line errors, checks of option values before any work).

A benchmark writes under ``build/bench/`` (git-ignored) by default: its JSON under
:data:`RESULTS`, plots and generated pages under :data:`DOCS`. ``--record`` writes the
committed records instead, ``bench/results/`` and ``docs/`` (:func:`recorded`), with the same
file names.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hw.cli import OneLineParser, command, write_text_atomic
from hw.config import ConfigError, NMPattern

__all__ = ["ROOT", "OUTPUT", "RESULTS", "DOCS", "RECORDS", "recorded", "median_wall",
           "write_json", "parser", "command", "positive_int", "nonnegative_int",
           "positive_float", "nonnegative_float", "patterns", "existing_file"]

ROOT = Path(__file__).resolve().parents[1]
#: Where benchmarks write by default (git-ignored).
OUTPUT = ROOT / "build" / "bench"
#: Default directory of the result JSON (``build/bench/results/<name>.json``).
RESULTS = OUTPUT / "results"
#: Default directory of plots and generated pages (``build/bench/docs/img/<name>.png``).
DOCS = OUTPUT / "docs"
#: The committed place of each default output directory (what ``--record`` writes).
RECORDS = {RESULTS: ROOT / "bench" / "results", DOCS: ROOT / "docs"}


def recorded(path: str | Path) -> Path:
    """The committed place of a default output path (``path`` itself if it is not one).

    >>> recorded(RESULTS / "rtl.json") == ROOT / "bench" / "results" / "rtl.json"
    True
    """
    path = Path(path)
    for out, committed in RECORDS.items():
        if path.is_relative_to(out):
            return committed / path.relative_to(out)
    return path


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
    return write_text_atomic(path, json.dumps(data, indent=1) + "\n")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written, and every option's default after its help."""


class _Parser(OneLineParser):
    """One-line errors; ``--record`` moves every default output to its committed place."""

    def parse_known_args(self, args=None, namespace=None):
        ns, extra = super().parse_known_args(args, namespace)
        if getattr(ns, "record", False):
            for action in self._actions:
                value = getattr(ns, action.dest, None)
                if (isinstance(value, (str, Path)) and value == action.default
                        and recorded(value) != Path(value)):
                    setattr(ns, action.dest, type(value)(recorded(value)))
        return ns, extra


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """The command line of a benchmark: ``--help`` shows its docstring and every default, a
    bad option is one line (``bench.NAME: MESSAGE``, as the benchmark's own errors) and exit
    status 2, and ``--record`` writes the committed records
    (every default output path under :data:`OUTPUT` becomes its :func:`recorded` place)."""
    ap = _Parser(prog=prog, name=prog.removeprefix("python -m "), description=doc,
                 formatter_class=_HelpFormatter)
    ap.add_argument("--record", action="store_true",
                    help="update the committed records (bench/results/, docs/) instead of "
                         f"writing under {OUTPUT.relative_to(ROOT)}/ (same file names)")
    return ap


# ---------------------------------------------------------------------- option types
# argparse turns the ArgumentTypeError of a ``type=`` into ``PROG: argument --x: MESSAGE``.
def _number(kind: type, low: float, strict: bool) -> Callable[[str], Any]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not (value > low if strict else value >= low):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict else '>='} {low}, got "
                                             f"{text!r}")
        return value
    parse.__name__ = kind.__name__  # argparse names the type in "invalid int value"
    return parse


#: ``type=`` of an option that must be an integer >= 1.
positive_int = _number(int, 1, False)
#: ``type=`` of an option that must be an integer >= 0.
nonnegative_int = _number(int, 0, False)
#: ``type=`` of an option that must be a number > 0.
positive_float = _number(float, 0.0, True)
#: ``type=`` of an option that must be a number >= 0.
nonnegative_float = _number(float, 0.0, False)


def patterns(text: str) -> tuple[str, ...]:
    """``type=`` of a comma-separated list of N:M patterns (``dense`` included), checked.

    >>> patterns("2:4, dense")
    ('2:4', 'dense')
    """
    items = tuple(p.strip() for p in text.split(",") if p.strip())
    if not items:
        raise argparse.ArgumentTypeError(f"no pattern in {text!r}")
    for p in items:
        try:
            NMPattern.parse(p)
        except (ConfigError, ValueError) as e:
            raise argparse.ArgumentTypeError(f"{p!r}: {e}") from None
    return items


def existing_file(text: str) -> Path:
    """``type=`` of an option naming a file that must exist."""
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    return path
