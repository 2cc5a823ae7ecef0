"""The proof flow's configuration (fast: nothing here runs a solver)."""

from __future__ import annotations

import pytest

from formal import formal_config
from formal.flow import DEFAULT_SOLVER, SOLVER_EXECUTABLES, Proof, sby_text
from formal.registry import all_proofs


def test_every_proof_names_a_known_solver():
    proofs = all_proofs(formal_config())
    assert {p.solver for p in proofs} <= set(SOLVER_EXECUTABLES)
    assert DEFAULT_SOLVER in SOLVER_EXECUTABLES
    assert {p.name: p.solver for p in proofs if p.name.startswith("fetch_")} == \
        {"fetch_other": "yices", "fetch_dma": "yices"}


@pytest.mark.parametrize("solver", sorted(SOLVER_EXECUTABLES))
def test_sby_runs_the_proofs_solver(solver):
    proof = Proof("p", lambda: None, "bmc", 3, "a statement", solver=solver)
    lines = sby_text(proof, "p.il").splitlines()
    assert lines[lines.index("[engines]") + 1] == f"smtbmc {solver}"


def test_unknown_solver_is_refused():
    with pytest.raises(ValueError, match="'cvc5'"):
        Proof("p", lambda: None, "bmc", 3, "a statement", solver="cvc5")
