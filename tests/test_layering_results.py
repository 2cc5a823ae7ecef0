"""The libraries (hw, sim, sw) never read a benchmark's output or import a benchmark.

bench/ prints tables and writes bench/results/*.json from the libraries; a library that read
them back would depend on whichever benchmark ran last (the synthesised clock that sw.deploy
reports comes from hw.synth's own record, hw/synth_records.json). Every module is scanned:
its imports (AST), its string literals (a path built from "bench" or naming bench/...) and its
whole text (comments and docstrings included) for ``bench/results``.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("hw", "sim", "sw")
MODULES = sorted(p for lib in LIBRARIES for p in (ROOT / lib).rglob("*.py"))
#: A string that is, or starts, a path into bench/ ("bench", "bench/results/x.json", "./bench/").
BENCH_PATH = re.compile(r"^(\./)?bench([/\\]|$)")


def violations(source: str) -> list[str]:
    """What in ``source`` reaches into bench/ (an empty list: nothing)."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names
                      if a.name == "bench" or a.name.startswith("bench.")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and (
                node.module == "bench" or node.module.startswith("bench.")):
            found.append(f"from {node.module} import ...")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__" \
                and node.args and isinstance(node.args[0], ast.Constant) \
                and str(node.args[0].value).split(".")[0] == "bench":
            found.append(f"__import__({node.args[0].value!r})")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and BENCH_PATH.match(node.value):
            found.append(f"string {node.value!r}")
    if "bench/results" in source:
        found.append("the text 'bench/results'")
    return found


def test_the_scan_covers_the_libraries():
    names = {p.relative_to(ROOT).as_posix() for p in MODULES}
    assert {"hw/synth.py", "sim/model.py", "sw/deploy.py"} <= names


@pytest.mark.parametrize("source", [
    'SYNTH = ROOT / "bench" / "results" / "synth.json"',
    'open("bench/results/synth.json")',
    "import bench.common",
    "from bench.common import RESULTS",
    "from bench import dse",
    "m = __import__('bench.dse')",
    "# see bench/results/rtl.json\nx = 1",
])
def test_the_scan_finds_a_benchmark_reference(source):
    assert violations(source), source


def test_the_scan_allows_the_libraries_own_words():
    ok = ('"""Run ``python -m bench.fuzz`` to find more; benchmarks time this."""\n'
          'from sw.compress import io\nx = "benchmark"\n')
    assert violations(ok) == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_library_module_does_not_reach_into_bench(path):
    assert violations(path.read_text()) == [], path.relative_to(ROOT).as_posix()
