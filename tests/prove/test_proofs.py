"""``make prove`` under pytest: every proof of formal.registry, plus a negative control.

The proofs take about 10 minutes on the 2-core machine (the PE's 4:8 and 4:16 blocks dominate),
so they are ``slow`` (out of the default run) and ``prove`` (``pytest -m prove``).
"""

from __future__ import annotations

import pytest
from amaranth import Signal
from amaranth.hdl import Assert

from formal import formal_config
from formal.dequant import DequantHarness, golden_weight
from formal.flow import SOLVER_EXECUTABLES, Proof, run_proof
from formal.registry import all_proofs
from hw.config import AcceleratorConfig
from hw.dequant import Dequant
from hw.format import WeightFormat

pytestmark = [pytest.mark.slow, pytest.mark.prove]

PROOFS = all_proofs(formal_config())


@pytest.mark.parametrize("proof", PROOFS, ids=[p.name for p in PROOFS])
def test_proof(proof, tmp_path):
    result = run_proof(proof, tmp_path)
    assert result.passed, f"{result.status}: {result.detail}"


class _OffByOne(DequantHarness):
    """Asserts a wrong golden value: the flow must report the failure (no vacuous pass)."""

    def elaborate(self, platform):
        m = super().elaborate(platform)
        dut = m.submodules.dut
        v, c, z = (Signal.like(s, name=f"{s.name}_x") for s in (self.value, self.code,
                                                                   self.zero))
        m.d.sync += [v.eq(self.value), c.eq(self.code), z.eq(self.zero)]
        m.d.comb += Assert(dut.w == golden_weight(v, c, z, self.fmt) + 1)
        return m


@pytest.mark.parametrize("solver", sorted(SOLVER_EXECUTABLES))
def test_failing_property_is_reported(solver, tmp_path):
    cfg = AcceleratorConfig(rows=2, cols=4)
    fmt = WeightFormat(bits=4, code_bits=cfg.scale_code_bits)
    proof = Proof("negative_control", lambda: _OffByOne(cfg, fmt), "bmc", Dequant.LATENCY + 1,
                  "a false property", solver=solver)
    result = run_proof(proof, tmp_path)
    assert result.status == "FAIL", result
    assert "Assert failed" in result.detail or "failed assertion" in result.detail
