"""The co-design search on the reference model and SmolLM2 (``sw.codesign``).

``python -m bench.codesign --model reference`` (or ``smollm2``, after ``make smollm2``)
compresses the model in every candidate format, measures each layer's decode cycles on the
fast model and its sensitivity on held-out text (the validation split of ``--domain``:
``code`` by default, or ``prose``; calibrated on the train splits of ``--calib-domain``, as in
:mod:`bench.accuracy`), searches per-layer formats under the decode latency of each uniform
format, measures every assignment for real (perplexity on the test split, cycles of the
compiled decode step) and writes ``bench/results/codesign.json`` (with ``--record``; by
default under ``build/bench/``) (records of this model and these corpora replace their old
ones) and ``docs/img/codesign_<model>.png`` (``codesign_<model>_<calib>_on_<domain>.png`` for
other corpora than code; perplexity against simulated tokens/s, uniform points and searched
ones).

Record fields: ``model``, ``method`` (``uniform-<format>``, e.g. ``uniform-2:4`` or
``uniform-dense-g64``, with ``format`` the candidate's full name, except ``dense-int4`` for
dense INT4 in groups of 128, the gap's dense end; ``searched`` -- the knapsack
on first-order losses -- or ``searched+refined`` -- then the measured local search),
``budget`` (the latency the search was held to, e.g. ``uniform-2:4-latency``; empty for
uniform points), ``assignment`` (layers per format, and the per-unit choice),
``cycles_per_token``, ``budget_cycles_per_token`` (of a searched point at a uniform latency:
that uniform format's cycles on the same configuration, never below ``cycles_per_token``),
``tokens_per_s_sim``, ``bits_per_weight``, ``perplexity``, ``packing``
(of a mixed assignment: ``assembled`` or ``recompressed``, the one the validation split
chose), and for the searched points at a uniform latency ``gap_closed``: the fraction of the
log-perplexity gap between that uniform format and dense INT4 (group 128) that the search
closes at the same latency (its compiled decode step simulated within the uniform's cycles),
and ``gap_closed_se``, its standard error over the paired test windows: both from
:func:`bench.accuracy.gap_closed`, the one estimator. The
per-window test NLLs behind it (:func:`window_nlls`) go to
``build/bench/codesign_windows_<model>.json`` (named like the plot), never recorded;
``calib_corpus`` and ``eval_corpus`` name the calibration set and the evaluation domain.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from bench.accuracy import gap_closed, window_nll
from bench.common import DOCS as OUTPUT_DOCS
from bench.common import OUTPUT, RESULTS, command, parser, recorded, stamp, write_json
from hw.config import AcceleratorConfig
from hw.format import WeightFormat
from sw.codesign import BUDGETS, Point, pareto, plot, run, with_weights, zoom_bound
from sw.compress.model import COMPRESS_METHODS
from sw.models.corpus import CALIBRATION_SETS, CODE, DOMAINS
from sw.models.eval import EvalProtocol
from sw.models.source import open_model

#: Where the plots go (``img/``); ``--record``: its committed place, docs/.
DOCS = OUTPUT_DOCS

#: Per-model settings: how finely to assign formats and how much text to use.
#: The reference model's whole 2:4-vs-dense gap is a small fraction of its perplexity, so its
#: sensitivities and perplexities use 65,536 validation and 131,072 test tokens (its splits
#: hold 0.76 M and 0.61 M) and one unit per layer (28; units of a layer type in half the
#: blocks closed much less of the 2:4 gap: per layer, sensitivities differ enough to trade);
#: its down_proj (K = 688) pads to 768 in groups of 128, so whole-row groups are candidates.
#: SmolLM2 is sized to finish in under half an hour on 2 cores: 32 x 128 calibration tokens
#: per compression, as in its accuracy table, and sensitivities of 14 units x 5 other formats
#: on 2048 tokens each; only the 2:4 latency is searched. Its K = 576 layers (all but
#: down_proj) pad to 640 in groups of 128, so the candidates besides the two reference formats
#: (uniform 2:4 and dense INT4, group 128) are in groups of 64: dense, 4:8, 2:4, and 4:16 (the
#: 25%-density format with the most freedom; uniform 1:4 is unusable on this model).
#: docs/accuracy.md has the measured gaps, the gap closed per granularity and the wall times.
SETTINGS = {
    "reference": dict(granularity="layer", calib=32, search_tokens=65536, eval_tokens=131072,
                      candidates=("dense-int4", "4:8-int4", "2:4-int4", "dense-int4-row",
                                  "4:8-int4-row", "2:4-int4-row", "2:8-int4-row"),
                      budgets=("uniform-2:4-latency", "uniform-4:8-latency"), extra_points=3,
                      refine_evals=40),
    "smollm2": dict(granularity="type:2", calib=32, seq_len=128, search_tokens=2048,
                    eval_tokens=4096,
                    candidates=("dense-int4", "2:4-int4", "dense-int4-g64", "4:8-int4-g64",
                                "2:4-int4-g64", "4:16-int4-g64"),
                    budgets=("uniform-2:4-latency",), extra_points=0,
                    refine_evals=12, dram_mb=128),
}


def window_nlls(src, result: dict) -> dict[str, np.ndarray]:
    """Per-window test NLL of the points a gap closed compares: dense INT4, the uniform
    formats whose latency is a budget, and the searched points at those budgets."""
    at_uniform = [p for p in result["searched"] if p.label.split(" ", 1)[1] in BUDGETS]
    wanted = {"uniform dense-int4"} | {"uniform " + BUDGETS[p.label.split(" ", 1)[1]]
                                       for p in at_uniform}
    points = [p for p in result["uniform"] if p.label in wanted] + at_uniform
    model = copy.deepcopy(src.model)
    return {p.label: window_nll(with_weights(model, p.weights), EvalProtocol(batch_size=8),
                                result["test_windows"]) for p in points}


def records(model: str, result: dict, cfg: AcceleratorConfig, method: str,
            nll: dict[str, np.ndarray] | None = None) -> list[dict]:
    """Flat records of every measured point (with ``nll``, :func:`window_nlls`, the searched
    points at a uniform latency gain the gap closed and its standard error)."""
    hz = cfg.clock_mhz * 1e6
    uniform = {p.label.removeprefix("uniform "): p for p in result["uniform"]}
    dense = uniform.get("dense-int4")
    front = pareto(result["uniform"] + result["searched"])
    out = []
    for p in result["uniform"] + result["searched"]:
        kind, _, rest = p.label.partition(" ")
        searched = kind in ("searched", "refined")
        budget = rest if searched else ""
        # uniform points: uniform-2:4, uniform-4:8-row, ...; the gap's dense end: dense-int4
        name = rest if rest == "dense-int4" else "uniform-" + rest.replace("-int4", "")
        rec = {"model": model, "method": {"searched": "searched", "refined": "searched+refined"}
               .get(kind, name),
               "compression": method, "budget": budget,
               "format": "" if searched else rest,
               "assignment": {"layers_per_format": dict(Counter(
                   w.fmt.name for w in p.weights.values())),
                   "units": p.assignment if searched else {}},
               "cycles_per_token": p.cycles_per_token,
               "tokens_per_s_sim": hz / p.cycles_per_token,
               "bits_per_weight": p.bits_per_weight, "perplexity": p.perplexity,
               "packing": p.packing,
               "pareto": p.label in front}
        if p.budget_cycles is not None:
            rec["budget_cycles_per_token"] = p.budget_cycles
        ref = BUDGETS.get(budget)  # the uniform format whose latency the budget is
        if searched and ref in uniform and dense is not None and nll:
            gap = gap_closed(nll[f"uniform {ref}"], nll[p.label], nll["uniform dense-int4"])
            rec["gap_closed"], rec["gap_closed_se"] = gap if gap else (None, None)
        out.append(rec)
    return out


def corpora(rec: dict) -> tuple[str, str]:
    """``(calib_corpus, eval_corpus)`` of a record (records before the fields: code, code)."""
    return rec.get("calib_corpus", CODE), rec.get("eval_corpus", CODE)


def run_name(model: str, calib: str = CODE, domain: str = CODE) -> str:
    """``<model>`` for code calibration and evaluation, else ``<model>_<calib>_on_<domain>``
    (``+`` written ``-``): the plot's and the windows file's name."""
    if (calib, domain) == (CODE, CODE):
        return model
    return f"{model}_{calib.replace('+', '-')}_on_{domain}"


def replot(model: str, out: Path, record: bool = False, calib: str = CODE,
           domain: str = CODE) -> int:
    """Redraw ``docs/img/codesign_<run_name>.png`` from the records in ``out`` (no search)."""
    recs = [r for r in (json.loads(out.read_text()) if out.exists() else [])
            if r.get("model") == model and corpora(r) == (calib, domain)]
    if not recs:
        print(f"bench.codesign: no {model} records calibrated on {calib} and evaluated on "
              f"{domain} in {out}", file=sys.stderr)
        return 2
    kinds = {"searched": "searched", "searched+refined": "refined"}

    def point(r: dict) -> Point:
        label = (f"{kinds[r['method']]} {r['budget']}" if r["method"] in kinds else
                 "uniform " + r["format"])
        return Point(label, r["assignment"]["units"], {}, r["perplexity"],
                     r["cycles_per_token"], r["bits_per_weight"], 0.0)
    result = {"uniform": [point(r) for r in recs if r["method"] not in kinds],
              "searched": [point(r) for r in recs if r["method"] in kinds]}
    s = SETTINGS[model]
    img = ((recorded(DOCS) if record else DOCS) / "img"
           / f"codesign_{run_name(model, calib, domain)}.png")
    img.parent.mkdir(parents=True, exist_ok=True)
    plot(result, AcceleratorConfig(), img, title(model, s["granularity"], recs[0]["compression"],
                                                 calib, domain),
         zoom_bound(result, BUDGETS[s["budgets"][0]]))
    print(f"wrote {img}")
    return 0


def title(model: str, granularity: str, method: str, calib: str, domain: str) -> str:
    """The plot's title: what was searched, and on which text when not code."""
    text = "" if (calib, domain) == (CODE, CODE) else f" (calib {calib}, eval {domain})"
    return f"{model}: per-layer formats ({granularity}) vs one format, {method}{text}"


@command("bench.codesign")
def main(argv: list[str] | None = None) -> int:
    ap = parser("python -m bench.codesign", __doc__)
    ap.add_argument("--model", default="reference", choices=sorted(SETTINGS),
                    help="the model to search")
    ap.add_argument("--method", default="sparsegpt+gptq", choices=sorted(COMPRESS_METHODS),
                    help="compression method")
    ap.add_argument("--domain", default=CODE, choices=DOMAINS,
                    help="text domain of the sensitivities (validation split) and the "
                         "reported perplexities (test split)")
    ap.add_argument("--calib-domain", default=CODE, choices=CALIBRATION_SETS,
                    help="calibration set (train splits)")
    ap.add_argument("--out", type=Path, default=RESULTS / "codesign.json", help="results JSON")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    ap.add_argument("--replot", action="store_true",
                    help="only redraw the plot of --model from the records in --out")
    args = ap.parse_args(argv)
    if args.replot:
        return replot(args.model, args.out, args.record, args.calib_domain, args.domain)
    settings = dict(SETTINGS[args.model])
    dram = settings.pop("dram_mb", None)
    if "candidates" in settings:
        settings["candidates"] = {c: WeightFormat.parse(c) for c in settings["candidates"]}
    settings["budgets"] = {b: BUDGETS[b] for b in settings["budgets"]}  # the first: the plot's
    cfg = AcceleratorConfig()
    if dram:
        cfg = cfg.with_dram(dram << 20)
    t0 = time.perf_counter()
    src = open_model(args.model)
    result = run(src, cfg, method=args.method, progress=not args.quiet, domain=args.domain,
                 calib_domain=args.calib_domain, **settings)
    nll = window_nlls(src, result)
    wall = time.perf_counter() - t0
    name = run_name(args.model, args.calib_domain, args.domain)
    windows = write_json(OUTPUT / f"codesign_windows_{name}.json",
                         {label: v.tolist() for label, v in nll.items()})
    recs = records(args.model, result, cfg, args.method, nll)
    run_key = (args.calib_domain, args.domain)
    for r in recs:
        r["wall_s"] = wall
        r["calib_corpus"], r["eval_corpus"] = run_key
    old = json.loads(args.out.read_text()) if args.out.exists() else []
    write_json(args.out, [r for r in old if r.get("model") != args.model or corpora(r) != run_key]
               + stamp(recs, AcceleratorConfig()))
    img = (recorded(DOCS) if args.record else DOCS) / "img" / f"codesign_{name}.png"
    img.parent.mkdir(parents=True, exist_ok=True)
    plot(result, cfg, img, title(args.model, settings["granularity"], args.method, *run_key),
         zoom_bound(result, next(iter(settings["budgets"].values()))))
    print(f"\n{'point':<32}{'perplexity':>11}{'cycles/token':>14}{'bits/w':>8}{'gap closed':>14}")
    for r in recs:
        label = r["method"] + (f" @ {r['budget']}" if r["budget"] else "")
        gap = (f"{r['gap_closed']:.0%} +- {r['gap_closed_se']:.0%}"
               if r.get("gap_closed") is not None else "")
        print(f"{label:<32}{r['perplexity']:>11.3f}{r['cycles_per_token']:>14,}"
              f"{r['bits_per_weight']:>8.2f}{gap:>14}")
    print(f"wrote {args.out}, {img} and {windows} ({wall:.0f} s; "
          f"{json.dumps(result['seconds'])})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
