"""The co-design search: the knapsack is optimal, the refinement only keeps real gains, the
units group layers as asked, and the whole flow runs on a tiny model."""

import itertools

import numpy as np
import pytest
import torch

from hw.config import AcceleratorConfig, MemoryModel
from hw.format import WeightFormat
from sw.codesign import (
    CANDIDATES,
    Point,
    Unit,
    pareto,
    pareto_front,
    refine,
    run,
    search,
    units,
)


def _brute(unit_list, loss, cost, budget):
    best = None
    for combo in itertools.product(*(list(loss[u.name]) for u in unit_list)):
        if sum(cost(u, c) for u, c in zip(unit_list, combo, strict=True)) <= budget:
            v = sum(loss[u.name][c] for u, c in zip(unit_list, combo, strict=True))
            best = v if best is None else min(best, v)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_knapsack_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    unit_list = [Unit(f"u{i}", (f"l{i}",)) for i in range(int(rng.integers(1, 6)))]
    names = ["a", "b", "c"]
    loss = {u.name: {c: float(rng.random()) for c in names} for u in unit_list}
    costs = {u.name: {c: float(rng.integers(1, 100)) for c in names} for u in unit_list}
    budget = float(rng.integers(1, 300))

    def cost(u, c):
        return costs[u.name][c]

    bins = 4000
    got = search(unit_list, loss, cost, budget, bins)
    # costs are rounded up to budget/bins steps: optimal within the budget less one step
    # per unit, never above the budget
    slack = _brute(unit_list, loss, cost, budget - len(unit_list) * budget / bins)
    if got is None:
        assert slack is None
        return
    assert sum(cost(u, got[u.name]) for u in unit_list) <= budget
    value = sum(loss[u.name][got[u.name]] for u in unit_list)
    assert slack is None or value <= slack + 1e-9  # float sums of the same terms


def test_refine_keeps_only_measured_gains():
    unit_list = [Unit(f"u{i}", (f"l{i}",)) for i in range(4)]
    loss = {u.name: {"base": 0.0, "big": -0.1, "small": 0.01} for u in unit_list}
    costs = {"base": 2.0, "big": 3.0, "small": 1.0}

    def true_nll(a):  # the truth: "big" helps only on u0, "small" hurts more than predicted
        return sum({"base": 0.0, "big": -0.1 if u == "u0" else 0.05, "small": 0.03}[c]
                   for u, c in a.items())

    start = {u.name: "base" for u in unit_list}
    best, nll, evals = refine(unit_list, loss, lambda u, c: costs[c], 8.0, start, true_nll,
                              max_evals=60)
    assert nll == pytest.approx(true_nll(best)) and nll <= true_nll(start)
    assert best["u0"] == "big" and sum(costs[c] for c in best.values()) <= 8.0
    assert evals <= 60


def test_refine_never_keeps_what_does_not_fit():
    """A move the measured latency rejects is never taken, however good its NLL."""
    unit_list = [Unit(f"u{i}", (f"l{i}",)) for i in range(3)]
    loss = {u.name: {"base": 0.0, "big": -0.1} for u in unit_list}

    def nll(a):
        return sum(-0.1 * (c == "big") for c in a.values())

    start = {u.name: "base" for u in unit_list}
    best, _, _ = refine(unit_list, loss, lambda u, c: 1.0, 3.0, start, nll, max_evals=20,
                        fits=lambda a: a["u1"] == "base")
    assert best["u1"] == "base" and best["u0"] == best["u2"] == "big"


def test_candidates_are_named_by_their_formats():
    assert [f.name for f in CANDIDATES.values()] == list(CANDIDATES)


def _tiny_source(read: list | None = None):
    """The tiny model with a random token stream per text domain; ``read`` collects the
    ``(split, domain)`` streams asked for."""
    from compile_testutil import tiny_lm

    from sw.models.source import ModelSource
    lm = tiny_lm(layers=2, hidden=64)
    streams = {d: np.random.default_rng(i).integers(0, 64, 20_000)
               for i, d in enumerate(("code", "prose"))}

    def tokens(split, domain="code"):
        if read is not None:
            read.append((split, domain))
        return streams[domain]
    return ModelSource("tiny", lm, list, list, None, tokens)


#: The tiny search's candidates. K = 64 pads to 128 in groups of 128: groups of 32 are a choice.
TINY_CANDIDATES = ("dense-int4", "2:4-int4", "1:4-int4", "2:4-int4-g32")


def _tiny_run(extra_points: int, read: list | None = None, **text):
    """The search on the tiny model, a 2x8 array, held to uniform 2:4's latency (``text``:
    ``domain`` and ``calib_domain`` of :func:`run`)."""
    torch.manual_seed(0)
    src = _tiny_source(read)
    cfg = AcceleratorConfig(rows=2, cols=8, memory=MemoryModel(size_bytes=1 << 20))
    res = run(src, cfg, method="sparsegpt+gptq",
              candidates={k: WeightFormat.parse(k) for k in TINY_CANDIDATES},
              budgets={"uniform-2:4-latency": "2:4-int4"}, extra_points=extra_points,
              seq_len=32, calib=2, search_tokens=512, eval_tokens=512, context=16,
              refine_evals=6, progress=False, log=lambda *a: None, **text)
    return src, cfg, res


def test_units_group_layers():
    src = _tiny_source()
    assert len(units(src.model, "layer")) == 14
    by_type = units(src.model, "type")
    assert len(by_type) == 7 and all(len(u.layers) == 2 for u in by_type)
    assert [u.name for u in units(src.model, "type:2")][:2] == ["self_attn.q_proj[0-0]",
                                                                "self_attn.k_proj[0-0]"]
    with pytest.raises(ValueError, match="granularity"):
        units(src.model, "blocks")


def test_whole_flow_on_a_tiny_model(tmp_path):
    # on the second text: calibrated on both train splits, searched and measured on prose only
    read: list[tuple[str, str]] = []
    src, cfg, res = _tiny_run(extra_points=1, read=read, domain="prose",
                              calib_domain="code+prose")
    assert set(read) == {("train", "code"), ("train", "prose"), ("validation", "prose"),
                         ("test", "prose")}
    labels = [p.label for p in res["searched"]]
    assert labels[-1] == "refined uniform-2:4-latency" and len(res["uniform"]) == 4
    cycles = {p.label: p.cycles_per_token for p in res["uniform"] + res["searched"]}
    # memory-bound decode: sparser uniform formats take fewer simulated cycles
    assert cycles["uniform 1:4-int4"] < cycles["uniform 2:4-int4"] < cycles["uniform dense-int4"]
    # the budget holds for the compiled step, not only for the per-layer estimate
    assert cycles["searched uniform-2:4-latency"] <= cycles["uniform 2:4-int4"]
    assert cycles["refined uniform-2:4-latency"] <= cycles["uniform 2:4-int4"]
    refined = res["searched"][-1]
    assert set(refined.assignment.values()) <= set(TINY_CANDIDATES)
    assert res["refine_evals"] <= 6
    # searched points are packed (assembled or recompressed) with their per-layer formats,
    # every layer of every unit in its assigned format
    for p in res["searched"]:
        mixed = len(set(p.assignment.values())) > 1
        assert p.packing in (("assembled", "recompressed") if mixed else ("",))
        formats = {x: WeightFormat.parse(p.assignment[u.name]) for u in res["units"]
                   for x in u.layers}
        assert {x: q.fmt for x, q in p.weights.items()} == formats
    # the packed file of a mixed assignment (what sw.codesign writes) reads back layer by layer
    from sw.models.compressed import from_llama, load, save
    save(from_llama(src.model, refined.weights), tmp_path / "m.safetensors")
    back = load(tmp_path / "m.safetensors").weights
    assert {x: q.fmt for x, q in back.items()} == {x: q.fmt for x, q in refined.weights.items()}
    assert all(np.array_equal(back[x].values, q.values) for x, q in refined.weights.items())
    # the bench's records: per-window test NLLs average to the reported perplexities, and the
    # points at a uniform latency carry the gap closed with its standard error
    from bench.codesign import records, window_nlls
    nll = window_nlls(src, res)
    assert set(nll) == {"uniform dense-int4", "uniform 2:4-int4", "searched uniform-2:4-latency",
                        "refined uniform-2:4-latency"}
    for p in res["uniform"] + res["searched"]:
        if p.label in nll:  # the same windows, batched alike: rounding-level agreement
            assert np.exp(nll[p.label].mean()) == pytest.approx(p.perplexity, rel=1e-5)
    recs = records("tiny", res, cfg, "sparsegpt+gptq", nll)
    assert {r["method"] for r in recs} >= {"dense-int4", "uniform-2:4", "uniform-2:4-g32",
                                           "searched", "searched+refined"}
    gaps = [r for r in recs if r.get("gap_closed") is not None]
    assert len(gaps) == 2 and all(np.isfinite(r["gap_closed_se"]) for r in gaps)


def test_budget_held_by_the_compiled_step_when_formats_interact(monkeypatch):
    """When the compiled step costs more than the per-layer sum the knapsack sees (here: any
    mix of formats costs a fixed extra 3% of uniform 2:4's step), every searched point at a
    uniform latency still takes no more cycles than that uniform format, or is not reported."""
    import sw.codesign as codesign
    exact = codesign.decode_cycles
    seen: list[tuple[bool, int]] = []  # (mixed, cycles) of every step simulated
    base: list[int] = []  # uniform 2:4's exact cycles, once

    def interacting(model, cfg, formats, context):
        cycles = exact(model, cfg, formats, context)
        mixed = len(set(formats.values())) > 1
        if mixed:
            if not base:
                base.append(exact(model, cfg, dict.fromkeys(
                    formats, WeightFormat.parse("2:4-int4")), context))
            cycles += base[0] * 3 // 100
        seen.append((mixed, cycles))
        return cycles

    monkeypatch.setattr(codesign, "decode_cycles", interacting)
    _, _, res = _tiny_run(extra_points=0)
    limit = next(p.cycles_per_token for p in res["uniform"] if p.label == "uniform 2:4-int4")
    # the interaction bit: the search met a mixed answer over the budget and turned it down
    assert any(mixed and cycles > limit for mixed, cycles in seen)
    at_budget = [p for p in res["searched"] if p.label.endswith("uniform-2:4-latency")]
    assert at_budget[-1].label == "refined uniform-2:4-latency"
    for p in at_budget:
        assert p.budget_cycles == limit and p.cycles_per_token <= limit, p.label


def test_bench_replot_from_records(tmp_path, monkeypatch):
    """bench.codesign --replot redraws the Pareto plot from the committed records alone."""
    import json

    from bench import codesign as bench
    monkeypatch.setattr(bench, "DOCS", tmp_path)
    (tmp_path / "img").mkdir()
    rec = {"model": "reference", "compression": "sparsegpt+gptq", "budget": "",
           "assignment": {"units": {}}, "bits_per_weight": 3.0}
    recs = [{**rec, "method": "dense-int4", "format": "dense-int4", "perplexity": 3.4,
             "cycles_per_token": 120},
            {**rec, "method": "uniform-1:4", "format": "1:4-int4", "perplexity": 40.0,
             "cycles_per_token": 60},
            {**rec, "method": "uniform-2:4", "format": "2:4-int4", "perplexity": 3.6,
             "cycles_per_token": 90},
            {**rec, "method": "searched+refined", "budget": "uniform-2:4-latency",
             "perplexity": 3.5, "cycles_per_token": 90}]
    out = tmp_path / "codesign.json"
    out.write_text(json.dumps(recs))
    assert bench.main(["--model", "reference", "--out", str(out), "--replot"]) == 0
    from matplotlib.image import imread
    # 1:4 lies far above uniform 2:4: a second panel zooms on the rest (twice as wide)
    wide = imread(tmp_path / "img" / "codesign_reference.png").shape[1]
    out.write_text(json.dumps([r for r in recs if r["method"] != "uniform-1:4"]))
    assert bench.main(["--model", "reference", "--out", str(out), "--replot"]) == 0
    assert imread(tmp_path / "img" / "codesign_reference.png").shape[1] < 0.7 * wide
    assert bench.main(["--model", "smollm2", "--out", str(out), "--replot"]) == 2
    # a run on other corpora is drawn apart, by the corpora it names
    assert bench.main(["--model", "reference", "--out", str(out), "--replot",
                       "--domain", "prose"]) == 2
    out.write_text(json.dumps([{**r, "eval_corpus": "prose"} for r in recs]))
    assert bench.main(["--model", "reference", "--out", str(out), "--replot",
                       "--domain", "prose"]) == 0
    assert (tmp_path / "img" / "codesign_reference_code_on_prose.png").exists()


@pytest.mark.parametrize("args, message", [
    (["--candidates", "dense-int4,2:4-int3"], "'2:4-int3'"),
    (["--candidates", "dense-int4,4:8-int4"], "needs 2:4-int4"),
    (["--candidates", "2:4-int4,3:8-int4"], "pattern 3:8 not supported"),
    (["--granularity", "blocks"], "'blocks'"),
    (["--calib", "0"], "--calib must be >= 1, got 0"),
    (["--eval-tokens", "-5"], "--eval-tokens must be >= 1, got -5"),
])
def test_cli_bad_input_is_one_line(args, message, capsys, tmp_path):
    from sw.codesign import main
    out = tmp_path / "out"
    assert main(args + ["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err
    assert not out.exists()


def test_cli_out_that_is_a_file_is_refused(capsys, tmp_path):
    from sw.codesign import main
    out = tmp_path / "out"
    out.write_text("mine")
    assert main(["--out", str(out)]) == 2
    assert "is not a directory" in capsys.readouterr().err and out.read_text() == "mine"



def test_gap_closed_standard_error():
    from bench.accuracy import gap_closed
    rng = np.random.default_rng(0)
    ref = 3.0 + rng.normal(0, 0.2, 400)
    dense = ref - 0.02 - rng.normal(0, 0.001, 400)
    half = gap_closed(ref, ref - 0.5 * (ref - dense), dense)
    assert half == pytest.approx((0.5, 0.0), abs=1e-12)
    point = ref - 0.01 + rng.normal(0, 0.004, 400)
    g, se = gap_closed(ref, point, dense)
    # the point estimate is the log-perplexity ratio of the three models (equal windows)
    ppl = {k: np.exp(v.mean()) for k, v in (("ref", ref), ("point", point), ("dense", dense))}
    assert g == pytest.approx(np.log(ppl["ref"] / ppl["point"]) /
                              np.log(ppl["ref"] / ppl["dense"]), rel=1e-9)
    # against a bootstrap over the windows (seeded): the ratio estimator's SE within 15%
    idx = rng.integers(0, 400, (2000, 400))
    boot = [(ref[i] - point[i]).mean() / (ref[i] - dense[i]).mean() for i in idx]
    assert se == pytest.approx(np.std(boot), rel=0.15)
    assert gap_closed(ref, point, ref) is None  # no gap


def test_pareto_front_keeps_exactly_the_undominated():
    """Every point kept is beaten by none; every point dropped is beaten (no worse in both
    objectives, different in one); equal points are all kept."""
    rng = np.random.default_rng(3)
    pts = [Point(f"p{i}", {}, {}, float(rng.integers(1, 6)), int(rng.integers(1, 6)), 0.0, 0.0)
           for i in range(40)]
    front = pareto(pts)
    for p in pts:
        beaten = any(q.perplexity <= p.perplexity and q.cycles_per_token <= p.cycles_per_token
                     and (q.perplexity, q.cycles_per_token) != (p.perplexity,
                                                                 p.cycles_per_token)
                     for q in pts)
        assert (p.label in front) == (not beaten), p
    assert 0 < len(front) < len(pts)
    # three objectives, one maximised by negation; order kept
    items = [(1, 1, 5), (1, 1, 4), (0, 2, 4), (1, 1, 5)]
    assert pareto_front(items, lambda t: (t[0], t[1], -t[2])) == [(1, 1, 5), (0, 2, 4),
                                                                  (1, 1, 5)]
