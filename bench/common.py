"""What every benchmark shares: where results go, median timing, writing the JSON, and the
command line (``--record``, one-line errors, checks of option values before any work).

A benchmark writes under ``build/bench/`` (git-ignored) by default: its JSON under
:data:`RESULTS`, plots and generated pages under :data:`DOCS`. ``--record`` writes the
committed records instead, ``bench/results/`` and ``docs/`` (:func:`recorded`), with the same
file names.

Every record names what it was measured on (:func:`provenance`, added by :func:`stamp`): the
accelerator configuration (:attr:`hw.config.AcceleratorConfig.fingerprint` and its array), whether
that configuration was the default (``AcceleratorConfig()``) when measured, and the commit (with a
``dirty`` flag when tracked files differed from it). A record that is a list carries it per row
(``row["provenance"]``), so rows measured on different configurations or at different times
(merged records, sweeps) each name their own; a record that is one object carries it at its top.
:func:`record_problems` is the check ``make test`` runs on every committed record: a stamp marked
``default`` must name the current default configuration.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hw.cli import OneLineParser, command, write_text_atomic
from hw.config import AcceleratorConfig, ConfigError, NMPattern

__all__ = ["ROOT", "OUTPUT", "RESULTS", "DOCS", "RECORDS", "recorded", "median_wall",
           "write_json", "commit", "provenance", "stamp", "record_problems", "parser",
           "command", "positive_int", "nonnegative_int",
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


# ---------------------------------------------------------------------- provenance
def commit() -> dict[str, Any]:
    """The checkout's commit: ``{"commit": short sha, "dirty": tracked files differ from it}``.

    ``commit`` is ``None`` when ``git`` or the repository cannot be read (and
    :func:`record_problems` then flags the record)."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                                  check=True, timeout=60).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    sha = git("rev-parse", "--short=12", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": sha, "dirty": bool(status) if status is not None else True}


def provenance(cfg: AcceleratorConfig | None) -> dict[str, Any]:
    """What a measurement was made on: the one stamp every benchmark record carries.

    Parameters
    ----------
    cfg : AcceleratorConfig or None
        The accelerator configuration measured, before any enlargement of simulation
        capacity (:meth:`~hw.config.AcceleratorConfig.with_dram`,
        :meth:`~hw.config.AcceleratorConfig.timing_only`: the simulated DRAM and instruction
        memory change no cycle count); ``None`` for a record that measures no accelerator
        configuration (e.g. fuzzing).

    Returns
    -------
    dict
        ``config`` (:attr:`~hw.config.AcceleratorConfig.fingerprint`), ``array``
        (``"ROWSxCOLS"``), ``default`` (``cfg`` is ``AcceleratorConfig()`` now), ``commit``
        and ``dirty`` (:func:`commit`).
    """
    return {"config": cfg.fingerprint if cfg is not None else None,
            "array": cfg.array if cfg is not None else None,
            "default": cfg is not None and cfg == AcceleratorConfig(), **commit()}


def stamp(data: Any, cfg: AcceleratorConfig | None) -> Any:
    """``data`` with :func:`provenance` of ``cfg``: on every dict row of a list that has none
    (rows stamped by the benchmark keep theirs), or at the top of a dict; returns ``data``.

    A benchmark that merges new rows into an old record stamps only its new rows: the old
    ones keep the stamp of the run that measured them."""
    prov = provenance(cfg)
    rows = data if isinstance(data, list) else [data]
    for row in rows:
        if isinstance(row, dict) and "provenance" not in row:
            row["provenance"] = dict(prov)
    return data


_STAMP_KEYS = {"config", "array", "default", "commit", "dirty"}


def _stamp_problems(where: str, prov: Any, default: AcceleratorConfig) -> list[str]:
    if not isinstance(prov, dict) or set(prov) != _STAMP_KEYS:
        return [f"{where}: provenance must be an object with {sorted(_STAMP_KEYS)}, got "
                f"{prov!r}"]
    out = []
    if not (isinstance(prov["commit"], str) and re.fullmatch(r"[0-9a-f]{7,40}", prov["commit"])):
        out.append(f"{where}: no commit (got {prov['commit']!r})")
    if prov["config"] is None:
        if prov["array"] is not None or prov["default"] is not False:
            out.append(f"{where}: no configuration, yet array {prov['array']!r} / default "
                       f"{prov['default']!r}")
    elif not (isinstance(prov["config"], str) and re.fullmatch(r"[0-9a-f]{12}", prov["config"])
              and isinstance(prov["array"], str) and re.fullmatch(r"\d+x\d+", prov["array"])):
        out.append(f"{where}: bad configuration {prov['config']!r} / array {prov['array']!r}")
    if prov["default"] is True and (prov["config"], prov["array"]) != (default.fingerprint,
                                                                      default.array):
        out.append(f"{where}: presented as the default's but measured on configuration "
                   f"{prov['config']} ({prov['array']}), not the default {default.fingerprint} "
                   f"({default.array}): rerun it")
    return out


def record_problems(data: Any, default: AcceleratorConfig | None = None) -> list[str]:
    """What is wrong with the provenance of a benchmark record (empty when nothing is).

    Every row of a list record, or a dict record, must carry a ``provenance`` stamp
    (:func:`stamp`) naming its commit and configuration (``config: null`` only for records
    that measure no configuration); a stamp marked ``"default": true`` must name ``default``
    (``AcceleratorConfig()`` unless given). Stamps nested deeper (sweep points) and
    ``*_provenance`` keys (fields re-measured on their own) are checked the same way.
    """
    default = default if default is not None else AcceleratorConfig()
    out = []
    rows = data if isinstance(data, list) else [data]
    for i, row in enumerate(rows):
        where = f"row {i}" if isinstance(data, list) else "record"
        if not isinstance(row, dict) or "provenance" not in row:
            out.append(f"{where}: no provenance (which configuration and commit measured it?)")

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "provenance" or key.endswith("_provenance"):
                    out.extend(_stamp_problems(f"{where}{key}", value, default))
                else:
                    walk(value, f"{where}{key}.")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{where}[{i}].")
    walk(data, "")
    return out


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
    bad option is one line and exit status 2, and ``--record`` writes the committed records
    (every default output path under :data:`OUTPUT` becomes its :func:`recorded` place)."""
    ap = _Parser(prog=prog, description=doc, formatter_class=_HelpFormatter)
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
