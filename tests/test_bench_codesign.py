"""The committed co-design records hold their budgets on the configuration they name.

Each searched point at a uniform format's latency is compiled and simulated again (timing
only, a few seconds) on the configuration its provenance stamp names (rebuilt from the
stamp's array, its fingerprint checked against the stamp's) with the benchmark's settings: it
takes the cycles its record says, and no more than that uniform format, simulated alike. A
record whose cycles were measured elsewhere fails here (its layers' cycles differ), whatever
it claims; ``tests/test_records.py`` checks that a stamp presented as the default's names
``AcceleratorConfig()``.
"""

import json

import pytest

from bench.codesign import SETTINGS, corpora
from bench.common import ROOT
from hw.config import AcceleratorConfig
from hw.format import WeightFormat
from sw.codesign import BUDGETS, decode_cycles, units
from sw.models.source import open_model

RECORDS = ROOT / "bench" / "results" / "codesign.json"
#: The decode context the search measures cycles at (sw.codesign.run's default).
CONTEXT = 128


def _records(model: str) -> list[dict]:
    recs = [r for r in json.loads(RECORDS.read_text()) if r["model"] == model]
    assert recs, f"no {model} records in {RECORDS}"
    return recs


def _measured_on(recs: list[dict]) -> AcceleratorConfig:
    """The one configuration the records' stamps name, rebuilt from its array."""
    stamps = {(r["provenance"]["config"], r["provenance"]["array"]) for r in recs}
    assert len(stamps) == 1, f"records measured on several configurations: {stamps}"
    ((fingerprint, array),) = stamps
    rows, cols = map(int, array.split("x"))
    cfg = AcceleratorConfig(rows=rows, cols=cols)
    assert cfg.fingerprint == fingerprint, (
        f"the stamp's configuration {fingerprint} ({array}) is not AcceleratorConfig(rows={rows}, "
        f"cols={cols}) ({cfg.fingerprint}): cannot rebuild it")
    return cfg


@pytest.mark.parametrize("model", [
    "reference", pytest.param("smollm2", marks=pytest.mark.smollm2)])
def test_searched_points_hold_their_budgets_where_measured(model):
    """Per run (a model on its calibration and evaluation corpora)."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in _records(model):
        runs.setdefault(corpora(r), []).append(r)
    for recs in runs.values():
        _check_budgets(model, recs)


def _check_budgets(model: str, recs: list[dict]) -> None:
    settings = SETTINGS[model]
    cfg = _measured_on(recs)
    if settings.get("dram_mb"):  # capacity only: the simulated DRAM changes no cycle count
        cfg = cfg.with_dram(settings["dram_mb"] << 20)
    src = open_model(model)
    unit_list = units(src.model, settings["granularity"])

    def cycles(assignment: dict[str, str]) -> int:
        return decode_cycles(src.model, cfg, {x: WeightFormat.parse(assignment[u.name])
                                              for u in unit_list for x in u.layers}, CONTEXT)

    uniform = {r["format"]: r for r in recs if not r["budget"]}
    at_budget = [r for r in recs if r["budget"] in BUDGETS]
    assert {r["budget"] for r in at_budget} == set(settings["budgets"])
    for budget in settings["budgets"]:
        fmt = BUDGETS[budget]
        limit = cycles({u.name: fmt for u in unit_list})
        assert uniform[fmt]["cycles_per_token"] == limit, f"uniform {fmt}"
        for r in (r for r in at_budget if r["budget"] == budget):
            where = f"{r['method']} @ {budget}"
            assert r["cycles_per_token"] == cycles(r["assignment"]["units"]), where
            assert r["cycles_per_token"] <= limit, where
            # records older than the field name no budget; the uniform row above holds it
            assert r.get("budget_cycles_per_token", limit) == limit, where
