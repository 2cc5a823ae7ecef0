"""Imports run one way: hw <- sw models/compress/compile <- sim <- sw runtime/deploy/codesign,
bench; a library never imports an application.

Read from the source with :mod:`ast` (nothing is imported), counting every import: at module
level, inside functions and under ``TYPE_CHECKING`` alike, since a deferred import is still a
dependency. Each failure names the file, the line, the importing module and what it imports.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The project's packages: the libraries, then the applications.
LIBRARIES = ("hw", "sim", "sw")
APPLICATIONS = ("bench", "formal")
#: The children of ``sw`` that sit above the simulator backends: they run programs on them.
SW_ABOVE_SIM = ("sw.runtime", "sw.deploy", "sw.codesign")


@dataclass(frozen=True)
class Import:
    """One import statement's dependency: ``importer`` (a module) imports ``target``."""

    path: Path
    line: int
    importer: str
    target: str

    def __str__(self) -> str:
        return (f"{self.path.relative_to(ROOT)}:{self.line}: {self.importer} imports "
                f"{self.target}")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


@cache
def project_imports() -> tuple[Import, ...]:
    """Every import of a project module by a project module, at any depth of the source."""
    out = set()
    for pkg in LIBRARIES + APPLICATIONS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            module = _module_name(path)
            package = module if path.name == "__init__.py" else module.rpartition(".")[0]
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    targets = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    if node.level:
                        parts = package.split(".")
                        base = ".".join(parts[:len(parts) - node.level + 1])
                        source = f"{base}.{node.module}" if node.module else base
                    else:
                        source = node.module
                    # ``from pkg import mod`` depends on the submodule pkg.mod.
                    targets = [f"{source}.{alias.name}"
                               if _is_module(f"{source}.{alias.name}") else source
                               for alias in node.names]
                else:
                    continue
                out |= {Import(path, node.lineno, module, t) for t in targets
                        if t.split(".")[0] in LIBRARIES + APPLICATIONS}
    return tuple(sorted(out, key=lambda i: (str(i.path), i.line, i.target)))


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _sw_node(module: str) -> str:
    """The direct child of ``sw`` a module belongs to (``sw`` itself for the package)."""
    return ".".join(module.split(".")[:2])


def test_the_scan_sees_the_project():
    """Guard against a vacuous pass: the scan finds the imports these rules are about."""
    found = {(_sw_node(i.importer), _sw_node(i.target)) for i in project_imports()
             if _within(i.importer, "sw")}
    assert {("sw.compress", "sw.models"), ("sw.compile", "sw.models"),
            ("sw.runtime", "sw.compile")} <= found


# ---------------------------------------------------------------------- no cycles in sw
def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_sw_children_import_each_other_without_cycles():
    """Each direct child of ``sw`` (a subpackage or a top-level module) is a node; an import,
    even one deferred into a function, is an edge; the graph has no cycle."""
    edges: dict[tuple[str, str], list[Import]] = {}
    for i in project_imports():
        if _within(i.importer, "sw") and _within(i.target, "sw"):
            a, b = _sw_node(i.importer), _sw_node(i.target)
            if a != b:
                edges.setdefault((a, b), []).append(i)
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    report = []
    for scc in _cycles(graph):
        report.append(f"import cycle between {', '.join(scc)}:")
        for (a, b), sites in sorted(edges.items()):
            if a in scc and b in scc:
                more = f" (and {len(sites) - 3} more)" if len(sites) > 3 else ""
                report.append(f"  {a} -> {b}: {len(sites)} import(s){more}")
                report += [f"    {i}" for i in sites[:3]]
    assert not report, "\n".join(report)


# ---------------------------------------------------------------------- layers
def _sw_below_sim() -> list[str]:
    """The children of ``sw`` below the simulator: every one but :data:`SW_ABOVE_SIM`."""
    children = {f"sw.{p.stem}" for p in (ROOT / "sw").glob("*.py") if p.stem != "__init__"}
    children |= {f"sw.{p.parent.name}" for p in (ROOT / "sw").glob("*/__init__.py")}
    return sorted(children - set(SW_ABOVE_SIM))


#: (importer, what it may not import, why). A prefix names a package and everything in it.
RULES = [
    ("hw", ("sw", "sim") + APPLICATIONS,
     "hw (contracts, golden numerics, components) is the bottom layer"),
    ("sw", APPLICATIONS, "a library module never imports an application"),
    ("sim", APPLICATIONS, "a library module never imports an application"),
    ("sim", SW_ABOVE_SIM, "the simulator backends sit below the runtime and the applications"),
    ("sw.compile", ("sw.compress",),
     "the compiler takes compressed weights (hw.format), never the compressor"),
    ("sw.runtime", ("sw.compress",),
     "the runtime runs executables; the numerics it needs are in hw.numerics"),
    ("sw.models", ("sw.compress", "sw.compile"),
     "the models sit below the compressor and the compiler that consume them"),
] + [(child, ("sim",) + SW_ABOVE_SIM,
      "sw's models, compressor and compiler sit below the simulator backends and the "
      "applications that run on them") for child in _sw_below_sim()]


@pytest.mark.parametrize(("importer", "forbidden", "why"), RULES,
                         ids=[f"{r[0]}-{'-'.join(r[1])}" for r in RULES])
def test_imports_run_one_way(importer, forbidden, why):
    """No module within ``importer`` imports anything within ``forbidden``."""
    bad = [i for i in project_imports() if _within(i.importer, importer)
           and any(_within(i.target, f) for f in forbidden)]
    assert not bad, (f"{importer} may not import {', '.join(forbidden)} ({why}):\n"
                     + "\n".join(f"  {i}" for i in bad))


#: What the runtime may import of the compiler: the artifact it runs and the IR it interprets.
RUNTIME_SEES = ("sw.compile.executable", "sw.compile.ir", "sw.compile.errors")


def test_the_runtime_reads_the_executable_not_the_compiler():
    """Every decision the compiler made reaches the runtime through the Executable; of the
    compiler it imports only those types and the IR (the registry and its interpreter)."""
    bad = [i for i in project_imports() if _within(i.importer, "sw.runtime")
           and _within(i.target, "sw.compile")
           and not any(_within(i.target, a) for a in RUNTIME_SEES)]
    assert not bad, ("sw.runtime may import of sw.compile only " + ", ".join(RUNTIME_SEES)
                     + ":\n" + "\n".join(f"  {i}" for i in bad))
