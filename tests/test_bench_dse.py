"""bench.dse: design points, Pareto fronts, the sparse-vs-dense comparison, the command line,
and the sweep itself on a local Dask cluster (real Yosys, real fast-model simulations)."""

import json
import random

import pytest

from bench import dse
from hw.config import AcceleratorConfig
from hw.format import WeightFormat


def test_point_configs_and_formats():
    base = AcceleratorConfig()
    nm, dense = dse.DesignPoint(2, 8, True, 4, 32), dse.DesignPoint(2, 8, False, 8, 32)
    cfg = nm.config(base)
    assert (cfg.rows, cfg.cols, cfg.beat_bytes, cfg.patterns) == (2, 8, 32, base.patterns)
    assert dense.config(base).patterns == ()
    assert nm.weight_format(cfg) == WeightFormat("2:4", 4, base.group_size)
    # INT8 weights stream dense only: the N:M core runs them dense.
    assert dse.DesignPoint(2, 8, True, 8, 32).weight_format(cfg) == WeightFormat("dense", 8, 128)
    assert dense.weight_format(cfg) == WeightFormat("dense", 8, 128)
    # The default configuration is the N:M point of its own array and beat.
    assert dse.DesignPoint(base.rows, base.cols, True, 4, base.beat_bytes).config(base) == base
    pts = dse.sweep_points([(2, 4), (4, 16)], [4, 8], [16, 64])
    assert len(pts) == len({p.label for p in pts}) == 16


def _rec(label, luts, gain, fits=True):
    return {"label": label, "luts": luts, "decode_tokens_per_s": gain, "fits": fits}


def test_pareto_front_is_exactly_the_undominated_fitting_points():
    rng = random.Random(7)
    recs = [_rec(f"p{i}", rng.randint(1, 20), rng.randint(1, 20), rng.random() < 0.8)
            for i in range(60)]
    front = dse.pareto(recs, "luts", "decode_tokens_per_s")

    def beats(o, r):
        return (o["luts"] <= r["luts"] and o["decode_tokens_per_s"] >= r["decode_tokens_per_s"]
                and (o["luts"], o["decode_tokens_per_s"]) != (r["luts"],
                                                               r["decode_tokens_per_s"]))

    fit = [r for r in recs if r["fits"]]
    for r in recs:
        dominated = any(beats(o, r) for o in fit)
        assert (r["label"] in front) == (r["fits"] and not dominated), r


def test_comparison_ratio():
    def rec(sparse, luts, ffs, gmacs, wb=4):
        return {"sparse": sparse, "weight_bits": wb, "array": "2x4", "bytes_per_cycle": 16,
                "luts": luts, "ffs": ffs, "dsps": 9, "gemm_gmacs": gmacs, "clock_mhz": 50.0}

    (c,) = dse.comparisons([rec(True, 300, 100, 4.0), rec(False, 200, 100, 1.0),
                            rec(True, 1, 1, 1.0, wb=8)])
    assert (c["dense_luts"], c["dense_ffs"], c["dense_dsps"]) == (200, 100, 9)
    # (4 / 400) / (1 / 300), exact in binary floating point up to one rounding per operation
    assert c["throughput_per_lut_ff_vs_dense"] == pytest.approx(3.0, rel=1e-12)
    assert c["lut_ratio"] == pytest.approx(1.5, rel=1e-12)


def test_synth_record_gains_the_comparison_only_for_its_own_configuration(tmp_path):
    base = AcceleratorConfig()
    other = base.replace(rows=2, cols=8)
    path = tmp_path / "synth_records.json"
    path.write_text(json.dumps([{"config": json.loads(other.to_json()), "luts": 2},
                                {"config": json.loads(base.to_json()), "luts": 1}]))
    comp = {"array": "2x4", "bytes_per_cycle": 16, "dense_luts": 5, "dense_ffs": 6,
            "dense_dsps": 7, "throughput_per_lut_ff_vs_dense": 1.5}
    assert not dse.update_synth_record([comp], base, path)
    assert all("dense_luts" not in r for r in json.loads(path.read_text()))
    comp["array"] = f"{base.rows}x{base.cols}"
    assert dse.update_synth_record([comp], base, path)
    recs = {r["luts"]: r for r in json.loads(path.read_text())}
    assert "dense_luts" not in recs[2]
    assert (recs[1]["dense_luts"], recs[1]["throughput_per_lut_ff_vs_dense"]) == (5, 1.5)


@pytest.mark.parametrize("argv, needle", [
    (["--arrays", "4by16"], "'4by16'"),
    (["--weight-bits", "4,6"], "got 6"),
    (["--beats", "x"], "'x'"),
    (["--arrays", "3x16"], "rows must be a power of two"),
    (["--beats", "3"], "bytes_per_cycle"),
    (["--workers", "0"], "got 0"),
    (["--config", "/nonexistent.json"], "nonexistent"),
])
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys, tmp_path):
    out = tmp_path / "dse.json"
    assert dse.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and err.startswith("bench.dse: ")
    assert not out.exists()


@pytest.mark.slow  # Yosys on a 1x8 array inside a Dask worker: about 3 minutes on 2 cores
def test_sweep_on_a_local_dask_cluster_and_resume(tmp_path, monkeypatch, capsys):
    """One N:M point of the 1x8 array through Yosys (no place-and-route: minutes otherwise)
    and the fast model, on a one-worker LocalCluster; the second run comes from the cache."""
    monkeypatch.setattr(dse, "CACHE", tmp_path / "cache")
    base = AcceleratorConfig()
    (point,) = pts = [dse.DesignPoint(1, 8, True, 4, 16)]
    (rec,) = dse.run_sweep(pts, base, pnr=False, workers=1, progress=False)
    cfg = point.config(base)
    assert rec["label"] == point.label and rec["fmax_after"] == "none"
    assert rec["fmax_mhz"] is None and rec["clock_mhz"] == cfg.clock_mhz
    assert rec["luts"] > 0 and rec["ffs"] > 0 and rec["dsps"] > 0 and rec["fits"]
    assert rec["pareto"]  # the only point
    # 8 lanes, 2:4: at most two effective MACs per lane and cycle; the timing contract's
    # pipeline fill keeps it below (checked exactly by the fast-model tests, not here).
    assert 0 < rec["gemm_cycles"] and rec["gemm_macs"] / rec["gemm_cycles"] <= 2 * cfg.lanes
    assert rec["decode_tokens_per_s"] == pytest.approx(
        cfg.clock_mhz * 1e6 / rec["decode_cycles"], rel=1e-12)
    cached = list((tmp_path / "cache").glob("*.json"))
    assert len(cached) == 1

    def no_cluster(*a, **k):
        raise AssertionError("a cached sweep must not start a cluster")

    monkeypatch.setattr(dse, "_client", no_cluster)
    assert dse.run_sweep(pts, base, pnr=False, workers=1, progress=False) == [rec]


def test_unreachable_scheduler_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(dse, "CACHE", tmp_path / "cache")
    out = tmp_path / "dse.json"
    # port 9 (discard) on the loopback: nothing listens there, the connection is refused
    assert dse.main(["--arrays", "2x4", "--weight-bits", "4", "--scheduler",
                     "tcp://127.0.0.1:9", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "tcp://127.0.0.1:9" in err, err
    assert not out.exists()


def test_results_are_written_whole(tmp_path):
    """write_json replaces the file in one step: no temporary file is left, and a failure to
    serialise leaves the previous contents."""
    from bench.common import write_json
    path = tmp_path / "sub" / "r.json"
    write_json(path, {"a": 1})
    with pytest.raises(TypeError):
        write_json(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1}
    assert [p.name for p in path.parent.iterdir()] == ["r.json"]
