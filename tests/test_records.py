"""Every committed benchmark record names what it was measured on, and a record presented as the
default's was measured on the default configuration.

The rule (README, "Results"): a benchmark stamps each record, or each row of a list
record, with :func:`bench.common.provenance` -- configuration fingerprint and array, commit,
``dirty``, and ``default``: whether the configuration was ``AcceleratorConfig()`` when it ran.
README/docs present a number as the default's only from a stamp with ``"default": true``; such a
stamp must name today's ``AcceleratorConfig()``, so changing the default makes every record
measured on the old one fail here until it is rerun (``python -m bench.<name> --record``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.common import provenance, record_problems, stamp
from hw.config import AcceleratorConfig

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
RECORDS = sorted(RESULTS.glob("*.json"))


def test_there_are_records():
    assert len(RECORDS) >= 1, f"no record under {RESULTS}"


@pytest.mark.parametrize("path", RECORDS, ids=[p.name for p in RECORDS])
def test_record_names_configuration_and_commit(path: Path):
    problems = record_problems(json.loads(path.read_text()))
    assert not problems, (f"{path.name} (rerun its benchmark with --record):\n  "
                          + "\n  ".join(problems[:10])
                          + (f"\n  ... {len(problems) - 10} more" if len(problems) > 10 else ""))


def test_stamp_of_the_default():
    prov = provenance(AcceleratorConfig())
    assert prov["default"] is True
    assert (prov["config"], prov["array"]) == (AcceleratorConfig().fingerprint,
                                               AcceleratorConfig().array)
    assert isinstance(prov["dirty"], bool)
    assert record_problems(stamp([{"x": 1}, {"x": 2}], AcceleratorConfig())) == []
    assert record_problems(stamp({"x": 1}, AcceleratorConfig())) == []


def test_stale_default_fails():
    """A record stamped as the default's on another configuration -- what every record
    becomes when the default changes -- is flagged, naming both configurations."""
    old_default = AcceleratorConfig(cols=2 * AcceleratorConfig().cols)
    rows = stamp([{"cycles": 1}], old_default)
    assert rows[0]["provenance"]["default"] is False  # measured on a non-default: fine
    assert record_problems(rows) == []
    rows[0]["provenance"]["default"] = True  # as if measured when it was the default
    (problem,) = record_problems(rows)
    assert "presented as the default" in problem
    assert old_default.fingerprint in problem and AcceleratorConfig().fingerprint in problem
    # ... and the same stamp is correct when that configuration is the default
    assert record_problems(rows, default=old_default) == []


def test_unstamped_and_malformed_records_fail():
    assert record_problems([{"cycles": 1}])  # no provenance
    assert record_problems({"cycles": 1})
    assert record_problems([stamp({"cycles": 1}, None), {"cycles": 2}])  # one row without
    bad_commit = stamp({"x": 1}, AcceleratorConfig())
    bad_commit["provenance"]["commit"] = None
    assert any("no commit" in p for p in record_problems(bad_commit))
    no_cfg_default = stamp({"x": 1}, None)
    no_cfg_default["provenance"]["default"] = True
    assert record_problems(no_cfg_default)


def test_nested_stamps_are_checked():
    """Sweep points and fields re-measured on their own carry stamps of their own."""
    cfg = AcceleratorConfig()
    stale = {**provenance(AcceleratorConfig(rows=2 * cfg.rows)), "default": True}
    sweep = stamp({"points": [{"provenance": stale}]}, cfg)
    assert len(record_problems(sweep)) == 1
    merged = stamp({"x": 1, "values_provenance": stale}, cfg)
    assert len(record_problems(merged)) == 1
