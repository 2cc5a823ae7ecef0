"""Co-design search: the N:M pattern and precision of each linear layer, chosen to minimise
perplexity under a budget of simulated decode latency (or of weight bytes).

The accelerator runs any N:M pattern of its configuration, chosen per instruction, so every
layer can have its own format. The search measures what each choice costs and loses, then
solves for the best mix:

1. **Candidates**: each format (dense INT4, 4:8, 2:4, 2:8, 1:4 INT4 by default; any other
   pattern of the configuration, group size, asymmetric or INT8 by name, see
   :meth:`hw.format.WeightFormat.parse`) compresses the whole model once with the chosen method
   (``compress_llama``, layer-wise calibration). The group size is part of a layer's
   precision: groups of 128 pad K = 576 to 640, so on SmolLM2 ``-g64`` is both cheaper and
   finer.
2. **Costs** (measured on the fast model, timing-only): the decode cycles of every layer in
   every format -- the layer's own single-token program on the accelerator configuration --
   and its packed stream bytes. Decode is memory-bound, so a step's cycles are close to the
   sum of its layers' (the assignment's real cycles are measured afterwards, from the
   compiled model).
3. **Sensitivities** (measured, not guessed): starting from the model with every layer in
   the *base* format -- the uniform format whose latency is the budget, so the first-order
   model is taken where the search operates --, each *unit* of layers (one layer, or one
   layer type in one depth range of the network) is switched to each other candidate's
   weights, and the held-out negative log-likelihood is measured; the change is the unit's
   loss for that candidate (negative when the candidate is better than the base).
4. **Search**: a multiple-choice knapsack -- one candidate per unit, minimise the summed loss,
   total cost within the budget -- solved exactly by dynamic programming over the cost
   discretised into ``bins`` steps (each unit's cost rounded up, so a solution never exceeds
   the budget). The budget is then held by measurement: the compiled decode step of the
   answer is simulated, and while it takes more cycles than the uniform format it is held
   to, the budget is lowered by the excess and the knapsack solved again (a budget no answer
   meets after a few rounds gives no point). Both sides are the exact cycles of compiled
   decode steps on the configuration the search runs on, so they hold there only: another
   array (rows x cols) changes every layer's cycles, and a point is searched again on it.

5. **Refinement** (at the main budget): the first-order model is optimistic where formats
   interact (a few 2:8 layers cost more together than apart), so a measured local search
   starts from the better of the knapsack's answer and the uniform base, evaluates the moves
   the losses rank best (one unit changed, or one made cheaper to pay for another made
   better) on the validation split, and keeps a move only if it really lowers the NLL.

Every reported point is then measured for real: perplexity on the test split, cycles of the
compiled decode step (a searched point above its budget's would be an error, never a
result). A searched assignment has two packings with the same formats and cycles:
**assembled** from the candidates' uniform compressions, or **recompressed** -- the method runs
again over the whole model with the assignment's per-layer formats, so that each layer is
calibrated on the inputs the mixed model really gives it. Neither is always better
(docs/accuracy.md has measured examples), so the validation split chooses, and the test split
measures the choice.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from hw.cli import OneLineParser, command
from hw.config import AcceleratorConfig
from hw.format import QuantizedWeight, WeightFormat, stream_layout
from sim.backends import make_backend
from sim.model import FastModel
from sw.artifact import publish
from sw.cli import add_tokenizer_option
from sw.compile import CompileOptions, Executable, compile_model
from sw.compile.layers import build_linear
from sw.compress.model import COMPRESS_METHODS, compress_llama, selected_linears
from sw.models import corpus
from sw.models.compressed import from_llama, save
from sw.models.eval import EvalProtocol, perplexity
from sw.models.llama import LlamaLM
from sw.models.source import ModelSourceError, open_model
from sw.runtime import Runtime, StepStats

__all__ = ["CANDIDATES", "Unit", "units", "layer_costs",
           "compress_candidates", "sensitivities", "search", "refine", "assemble",
           "with_weights", "decode_step", "decode_cycles", "run", "Point", "pareto_front",
           "pareto"]

T = TypeVar("T")

#: Formats the search chooses from by default (group 128, symmetric INT4). Any other name
#: :meth:`WeightFormat.parse` reads can be a candidate too: group sizes (``-g64``: no padding at
#: K = 576), whole-row groups, asymmetric, ``dense-int8``.
CANDIDATES: dict[str, WeightFormat] = {
    n: WeightFormat.parse(n)
    for n in ("dense-int4", "4:8-int4", "2:4-int4", "2:8-int4", "1:4-int4")}


@dataclass(frozen=True)
class Unit:
    """Layers that take one format together."""

    name: str
    layers: tuple[str, ...]


def units(model: LlamaLM, granularity: str = "layer", skip: Iterable[str] = ("lm_head",)
          ) -> list[Unit]:
    """Group the compressed linear layers: ``"layer"`` (each on its own), ``"type"`` (q_proj
    of every block together, ...) or ``"type:K"`` (each type in K depth ranges of blocks)."""
    layers = list(selected_linears(model, skip))
    if granularity == "layer":
        return [Unit(name.removeprefix("model."), (name,)) for name in layers]
    m = re.fullmatch(r"type(?::(\d+))?", granularity)
    if not m:
        raise ValueError(f"granularity must be 'layer', 'type' or 'type:K', got "
                         f"{granularity!r}")
    ranges = int(m.group(1) or 1)
    blocks = model.config.num_hidden_layers
    if not 1 <= ranges <= blocks:
        raise ValueError(f"type:{ranges}: between 1 and the {blocks} blocks")
    groups: dict[str, list[str]] = {}
    for name in layers:
        found = re.match(r"model\.layers\.(\d+)\.(.+)", name)
        if not found:
            groups.setdefault(name, []).append(name)
            continue
        block, kind = int(found.group(1)), found.group(2)
        r = block * ranges // blocks
        lo, hi = r * blocks // ranges, (r + 1) * blocks // ranges - 1
        key = kind if ranges == 1 else f"{kind}[{lo}-{hi}]"
        groups.setdefault(key, []).append(name)
    return [Unit(k, tuple(v)) for k, v in groups.items()]


def layer_costs(model: LlamaLM, cfg: AcceleratorConfig, candidates: Mapping[str, WeightFormat],
                layers: Iterable[str]) -> dict[str, dict[str, dict[str, int]]]:
    """``{layer: {candidate: {"cycles": decode cycles, "bytes": stream bytes}}}``: each layer
    alone as a one-token program on the fast model (timing-only), memoised per shape."""
    timing = cfg.timing_only()
    model_run = FastModel(timing)
    memo: dict[tuple, dict[str, int]] = {}
    out: dict[str, dict[str, dict[str, int]]] = {}
    for layer in layers:
        w = model.get_parameter(f"{layer}.weight")
        n, k = int(w.shape[0]), int(w.shape[1])
        out[layer] = {}
        for name, fmt in candidates.items():
            key = (fmt, n, k)
            if key not in memo:
                lp = build_linear(timing, fmt, n, k, 1)
                r = model_run.run(lp.words, timing_only=True)
                memo[key] = {"cycles": r.cycles,
                             "bytes": stream_layout(fmt, n, k, cfg.lanes).total_bytes}
            out[layer][name] = memo[key]
    return out


def compress_candidates(model: LlamaLM, candidates: Mapping[str, WeightFormat], method: str,
                        calibration: torch.Tensor, *, progress: bool = True,
                        **options) -> dict[str, dict[str, QuantizedWeight]]:
    """Every candidate format applied to the whole model (a copy each) with ``method``."""
    out = {}
    for name, fmt in candidates.items():
        out[name] = compress_llama(copy.deepcopy(model), fmt, method, calibration,
                                   progress=progress, **options)
    return out


def with_weights(model: LlamaLM, weights: Mapping[str, QuantizedWeight]) -> LlamaLM:
    """``model`` (in place) computing with the dequantised ``weights`` of these layers."""
    with torch.no_grad():
        for name, qw in weights.items():
            lin: nn.Linear = model.get_submodule(name)
            lin.weight.copy_(torch.from_numpy(qw.dequantize()[:, : qw.k]).to(lin.weight.dtype))
    return model


def _nll(model: LlamaLM, windows: torch.Tensor, batch_size: int) -> float:
    proto = EvalProtocol(seq_len=windows.shape[1] - 1, batch_size=batch_size)
    return perplexity(model, proto, windows=windows).nll


def sensitivities(model: LlamaLM, weights: Mapping[str, Mapping[str, QuantizedWeight]],
                  base: str, unit_list: Sequence[Unit], windows: torch.Tensor, *,
                  batch_size: int = 8, progress: bool = True
                  ) -> tuple[float, dict[str, dict[str, float]]]:
    """The base model's held-out NLL (nats per token) and, per unit and candidate, the NLL
    increase when only that unit takes that candidate's weights (base: 0)."""
    work = with_weights(copy.deepcopy(model), weights[base])
    nll0 = _nll(work, windows, batch_size)
    out: dict[str, dict[str, float]] = {u.name: {base: 0.0} for u in unit_list}
    others = [c for c in weights if c != base]
    bar = tqdm(total=len(unit_list) * len(others), desc="sensitivities", disable=not progress,
               leave=False)
    for u in unit_list:
        for c in others:
            with_weights(work, {k: weights[c][k] for k in u.layers})
            out[u.name][c] = _nll(work, windows, batch_size) - nll0
            bar.update()
        with_weights(work, {k: weights[base][k] for k in u.layers})
    bar.close()
    return nll0, out


def search(unit_list: Sequence[Unit], loss: Mapping[str, Mapping[str, float]],
           cost: Callable[[Unit, str], float], budget: float, bins: int = 4000
           ) -> dict[str, str] | None:
    """Minimise the summed loss with the summed cost within ``budget``: one candidate per
    unit (multiple-choice knapsack, exact over costs rounded up to ``budget / bins`` steps).
    Returns ``{unit: candidate}``, or None when even the cheapest choice exceeds the budget."""
    step = budget / bins
    inf = np.inf
    best = np.full(bins + 1, inf)
    best[0] = 0.0
    choices: list[np.ndarray] = []
    for u in unit_list:
        names = list(loss[u.name])
        new = np.full(bins + 1, inf)
        pick = np.full(bins + 1, -1, dtype=np.int64)
        for i, c in enumerate(names):
            w = int(np.ceil(cost(u, c) / step - 1e-9))
            if w > bins:
                continue
            cand = np.full(bins + 1, inf)
            cand[w:] = best[: bins + 1 - w] + loss[u.name][c]
            better = cand < new
            new[better] = cand[better]
            pick[better] = i
        choices.append(pick)
        best = new
    if not np.isfinite(best).any():
        return None
    j = int(np.argmin(best))
    out: dict[str, str] = {}
    for u, pick in zip(reversed(unit_list), reversed(choices), strict=True):
        names = list(loss[u.name])
        c = names[int(pick[j])]
        out[u.name] = c
        j -= int(np.ceil(cost(u, c) / step - 1e-9))
    return {u.name: out[u.name] for u in unit_list}


def _key(assignment: Mapping[str, str]) -> tuple:
    return tuple(sorted(assignment.items()))


def refine(unit_list: Sequence[Unit], loss: Mapping[str, Mapping[str, float]],
           cost: Callable[[Unit, str], float], budget: float, start: dict[str, str],
           evaluate: Callable[[dict[str, str]], float], *, max_evals: int = 40,
           per_round: int = 4, fits: Callable[[dict[str, str]], bool] | None = None,
           log=None) -> tuple[dict[str, str], float, int]:
    """Measured local search from ``start``: each round evaluates (``evaluate`` gives the
    held-out NLL of an assignment) the ``per_round`` moves the first-order losses rank best --
    one unit changed, or one made cheaper to pay for another made better -- within the
    budget (and, given ``fits``, that it accepts: the measured latency), and keeps the best
    only if it really lowers the NLL. Stops when a round finds nothing or after ``max_evals``
    evaluations (a move ``fits`` rejects counts as one). Returns (assignment, its NLL,
    evaluations)."""
    current, nll, evals = dict(start), evaluate(start), 1
    tried: set[tuple] = set()
    spent = sum(cost(u, current[u.name]) for u in unit_list)
    while evals < max_evals:
        singles = []
        for u in unit_list:
            for c in loss[u.name]:
                if c != current[u.name]:
                    singles.append((loss[u.name][c] - loss[u.name][current[u.name]],
                                    cost(u, c) - cost(u, current[u.name]), ((u.name, c),)))
        moves = [m for m in singles if spent + m[1] <= budget]
        up = sorted((m for m in singles if m[0] < 0), key=lambda m: m[0])[:40]
        down = sorted((m for m in singles if m[1] < 0), key=lambda m: m[0])[:40]
        for a in up:
            for b in down:
                if a[2][0][0] != b[2][0][0] and spent + a[1] + b[1] <= budget:
                    moves.append((a[0] + b[0], a[1] + b[1], a[2] + b[2]))
        moves = sorted((m for m in moves if _key({**current, **dict(m[2])}) not in tried
                        and m[0] < 0), key=lambda m: m[0])[:per_round]
        if not moves:
            break
        best = None
        for m in moves:
            cand = {**current, **dict(m[2])}
            tried.add(_key(cand))
            if fits is not None and not fits(cand):
                evals += 1  # a measurement too: bounds the time spent
                continue
            value = evaluate(cand)
            evals += 1
            if best is None or value < best[0]:
                best = (value, cand, m)
            if evals >= max_evals:
                break
        if best is None or best[0] >= nll:
            continue
        nll, current = best[0], best[1]
        spent = sum(cost(u, current[u.name]) for u in unit_list)
        if log:
            log(f"    refine: {', '.join(f'{u} -> {c}' for u, c in best[2][2])}: "
                f"NLL {nll:.5f} ({evals} evaluations)")
    return current, nll, evals


def assemble(weights: Mapping[str, Mapping[str, QuantizedWeight]], unit_list: Sequence[Unit],
             assignment: Mapping[str, str]) -> dict[str, QuantizedWeight]:
    """The compressed layers of an assignment: each unit's layers from its candidate."""
    return {layer: weights[assignment[u.name]][layer] for u in unit_list for layer in u.layers}


# ---------------------------------------------------------------------- the whole flow
BUDGETS = {"uniform-2:4-latency": "2:4-int4", "uniform-4:8-latency": "4:8-int4",
           "uniform-2:8-latency": "2:8-int4"}


def decode_step(model: LlamaLM, cfg: AcceleratorConfig, formats: Mapping[str, WeightFormat],
                context: int) -> tuple[Executable, StepStats]:
    """One decode step at ``context`` positions compiled from the model's graph with these
    formats, and what it cost on the fast model (timing-only): the executable (its
    ``report`` says the DRAM it lays out) and the step's :class:`~sw.runtime.StepStats`. On a
    configuration with the vector engine the host ops run there (the compiler's defaults:
    fused programs, joined into one per step where they fit)."""
    opts = CompileOptions(prompt_tokens=context - 1, max_context=context,
                          decode_contexts=(context,), phases=("decode",))
    exe = compile_model(model, cfg, opts, formats=formats)
    rt = Runtime(exe, make_backend("model-timing", cfg), memo_timing=True,
                 vector=cfg.has_vector)
    rt.seek(context - 1)
    return exe, rt.step(torch.zeros((1, 1), dtype=torch.long))[1]


def decode_cycles(model: LlamaLM, cfg: AcceleratorConfig, formats: Mapping[str, WeightFormat],
                  context: int) -> int:
    """Simulated accelerator cycles of one decode step at ``context`` positions, compiled from
    the model's graph with these formats (timing-only; :func:`decode_step`)."""
    return decode_step(model, cfg, formats, context)[1].cycles


def bits_per_weight(weights: Mapping[str, QuantizedWeight], lanes: int) -> float:
    """Stream bits per dense weight over all compressed layers."""
    bits = sum(stream_layout(w.fmt, *w.shape, lanes).total_bytes * 8 for w in weights.values())
    return bits / sum(w.shape[0] * w.shape[1] for w in weights.values())


@dataclass
class Point:
    """A measured assignment."""

    label: str
    assignment: dict[str, str]
    weights: dict[str, QuantizedWeight]
    perplexity: float
    cycles_per_token: int
    bits_per_weight: float
    estimated_cycles: float
    packing: str = ""  # of a mixed assignment: "assembled" or "recompressed" (module docstring)
    #: The compiled decode step's cycles of the uniform format whose latency is the point's
    #: budget, on the same configuration (None: no uniform budget); ``cycles_per_token`` is
    #: never above it.
    budget_cycles: int | None = None


def run(src, cfg: AcceleratorConfig, *, method: str = "sparsegpt+gptq",
        candidates: Mapping[str, WeightFormat] = CANDIDATES, base: str = "2:4-int4",
        granularity: str = "layer", calib: int = 32, seq_len: int = 256,
        search_tokens: int = 8192, eval_tokens: int = 16384, context: int = 128,
        budgets: Mapping[str, str] = BUDGETS, extra_points: int = 4, seed: int = 0,
        refine_evals: int = 40, recompress: bool = True, progress: bool = True,
        domain: str = corpus.CODE, calib_domain: str = corpus.CODE, log=print) -> dict:
    """Compress, measure, search and measure again (see the module docstring).

    Sensitivities use the validation split, the reported perplexities the test split of the
    text ``domain`` (both held out from the train split that calibrates, of the calibration set
    ``calib_domain``: :mod:`sw.models.corpus`). ``budgets`` names the uniform formats whose
    latency is a budget (its format must be among ``candidates``); ``extra_points`` more
    budgets spread between the cheapest and the dearest uniform latency fill the Pareto plot;
    ``recompress`` also packs searched points recompressed and keeps the packing the
    validation split prefers (module docstring). Returns
    ``{"uniform": [Point], "searched": [Point], "units": [...], "nll_base": ...,
    "test_windows": tensor, "seconds": {...}}``.
    """
    import time
    model = src.model
    for fmt in candidates.values():
        fmt.check_supported(cfg)
    seq = min(seq_len, model.config.max_position_embeddings)
    t0 = time.perf_counter()
    log(f"compressing with {len(candidates)} formats ({method}, {calib} x {seq} tokens of "
        f"{calib_domain})")
    calibration = src.calibration(calib, seq, seed, calib_domain)
    weights = compress_candidates(model, candidates, method, calibration, progress=progress)
    t_compress = time.perf_counter() - t0
    unit_list = units(model, granularity)
    per_layer = layer_costs(model, cfg, candidates, [x for u in unit_list for x in u.layers])

    def cost(u: Unit, c: str) -> float:
        return float(sum(per_layer[x][c]["cycles"] for x in u.layers))

    t0 = time.perf_counter()
    valid = src.windows("validation", seq, search_tokens, domain)
    nll0, loss = sensitivities(model, weights, base, unit_list, valid, progress=progress)
    t_sens = time.perf_counter() - t0
    test = src.windows("test", seq, eval_tokens, domain)

    def measure(label: str, assignment: dict[str, str], limit: int | None = None) -> Point:
        cycles = step_cycles(assignment)
        if limit is not None and cycles > limit:  # the search held it: a broken invariant
            raise RuntimeError(f"{label}: the compiled decode step takes {cycles:,} cycles, "
                               f"over its budget of {limit:,}")
        w, packing = assemble(weights, unit_list, assignment), ""
        if recompress and len(set(assignment.values())) > 1:
            formats = {x: q.fmt for x, q in w.items()}
            again = compress_llama(copy.deepcopy(model), lambda name, _: formats.get(name),
                                   method, calibration, progress=False)
            if set(again) != set(w):
                raise RuntimeError(f"recompression gave layers {sorted(set(again) ^ set(w))} "
                                   "apart from the assignment's")
            # two packings of the same formats (same cycles): the validation split chooses
            nll = [_nll(with_weights(copy.deepcopy(model), x), valid, 8) for x in (w, again)]
            w, packing = (again, "recompressed") if nll[1] <= nll[0] else (w, "assembled")
        m = with_weights(copy.deepcopy(model), w)
        ppl = float(np.exp(_nll(m, test, 8)))
        est = sum(cost(u, assignment[u.name]) for u in unit_list)
        log(f"  {label:<28} perplexity {ppl:8.3f}  {cycles:>12,} cycles/token (estimated "
            f"{est:,.0f} + attention)  "
            f"{bits_per_weight(w, cfg.lanes):.2f} bits/weight  {packing}")
        return Point(label, assignment, w, ppl, cycles, bits_per_weight(w, cfg.lanes), est,
                     packing, limit)

    memo: dict[tuple, int] = {}

    def step_cycles(assignment: Mapping[str, str]) -> int:
        """The compiled decode step's simulated cycles (formats only; memoised)."""
        key = tuple(assignment[u.name] for u in unit_list)
        if key not in memo:
            memo[key] = decode_cycles(model, cfg, {x: candidates[assignment[u.name]]
                                                   for u in unit_list for x in u.layers}, context)
        return memo[key]

    def within(budget: float, limit: int | None) -> tuple[dict[str, str] | None, float]:
        """The knapsack's answer at ``budget`` (summed per-layer cycles), the budget lowered
        by the excess until the compiled step's measured cycles are within ``limit``: the
        per-layer sum misses how layers overlap in the step, by a fraction of a percent."""
        for _ in range(8):
            a = search(unit_list, loss, cost, budget)
            if a is None or limit is None:
                return a, budget
            over = step_cycles(a) - limit
            if over <= 0:
                return a, budget
            budget -= max(over, budget / 1000)  # at least a few bins: a new answer
        return None, budget

    t0 = time.perf_counter()
    uniform = [measure(f"uniform {c}", {u.name: c for u in unit_list}) for c in candidates]
    measured = dict(zip(candidates, (p.cycles_per_token for p in uniform), strict=True))
    searched = []
    totals = {c: sum(cost(u, c) for u in unit_list) for c in candidates}
    targets = {label: totals[c] for label, c in budgets.items() if c in totals}
    lo, hi = min(totals.values()), max(totals.values())
    for i in range(1, extra_points + 1):
        targets.setdefault(f"budget-{i}", lo + (hi - lo) * i / (extra_points + 1))
    limits = {label: measured.get(budgets.get(label)) for label in targets}
    for label, budget in sorted(targets.items(), key=lambda kv: kv[1]):
        a, targets[label] = within(budget, limits[label])
        if a is not None:
            searched.append(measure(f"searched {label}", a, limits[label]))
    # The first-order model is optimistic where formats interact: refine the main budget's
    # assignment by measurement, from the better of the knapsack's answer and uniform base.
    t_refine = time.perf_counter()
    work = with_weights(copy.deepcopy(model), weights[base])
    state = {u.name: base for u in unit_list}

    def evaluate(assignment: dict[str, str]) -> float:
        changed = [u for u in unit_list if assignment[u.name] != state[u.name]]
        with_weights(work, {x: weights[assignment[u.name]][x] for u in changed for x in u.layers})
        state.update({u.name: assignment[u.name] for u in changed})
        return _nll(work, valid, 8)

    main = next(label for label, c in budgets.items() if c == base)
    knap = next((p.assignment for p in searched if p.label == f"searched {main}"), None)
    start = {u.name: base for u in unit_list}
    if knap is not None and evaluate(knap) < nll0:
        start = knap
    refined, _, evals = refine(unit_list, loss, cost, targets[main], start, evaluate,
                               max_evals=refine_evals, log=log,
                               fits=lambda a: step_cycles(a) <= limits[main])
    searched.append(measure(f"refined {main}", refined, limits[main]))
    t_refine = time.perf_counter() - t_refine
    return {"uniform": uniform, "searched": searched, "units": unit_list, "nll_base": nll0,
            "loss": loss, "costs": {u.name: {c: cost(u, c) for c in candidates}
                                    for u in unit_list},
            "refine_evals": evals, "test_windows": test,
            "seconds": {"compress": t_compress, "sensitivities": t_sens,
                        "refine": t_refine, "measure": time.perf_counter() - t0 - t_refine}}


def pareto_front(items: Sequence[T], objectives: Callable[[T], tuple]) -> list[T]:
    """The items no other item dominates, in their order.

    Parameters
    ----------
    items:
        The candidates.
    objectives:
        ``item -> tuple`` of the values to minimise (negate one to maximise it). ``q``
        dominates ``p`` when each of ``q``'s values is ``<=`` ``p``'s and the tuples differ.

    Returns
    -------
    list
        The undominated items (items with equal objectives are all kept).

    Examples
    --------
    >>> pareto_front([(1, 5), (2, 2), (3, 3), (2, 2)], lambda p: p)
    [(1, 5), (2, 2), (2, 2)]
    """
    keys = [objectives(x) for x in items]
    return [x for x, k in zip(items, keys, strict=True)
            if not any(o != k and all(a <= b for a, b in zip(o, k, strict=True))
                       for o in keys)]


def pareto(points: Sequence[Point]) -> set[str]:
    """Labels of the points no other point beats in both perplexity and cycles."""
    return {p.label for p in pareto_front(points, lambda p: (p.perplexity, p.cycles_per_token))}


def plot(result: dict, cfg: AcceleratorConfig, path, title: str, focus: float | None = None):
    """Perplexity against simulated tokens/s: uniform formats and searched assignments.

    With ``focus`` (a perplexity) and points above it, a second panel zooms on the points at
    or below it, where the budgets' formats sit close together."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    points = result["uniform"] + result["searched"]
    zoom = focus is not None and any(p.perplexity > focus for p in points)
    fig, axes = plt.subplots(1, 2 if zoom else 1, figsize=(12 if zoom else 7, 4.5),
                             squeeze=False)
    _draw(axes[0, 0], result, cfg, None)
    if zoom:
        _draw(axes[0, 1], result, cfg, focus)
        axes[0, 1].set_title(f"zoom: perplexity <= {focus:.3f}", fontsize=10)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def zoom_bound(result: dict, base: str, margin: float = 1.05) -> float | None:
    """The perplexity bound of :func:`plot`'s zoom: ``margin`` over uniform ``base``'s (None
    without that point)."""
    ppl = [p.perplexity for p in result["uniform"] if p.label == f"uniform {base}"]
    return margin * ppl[0] if ppl else None


def _draw(ax, result: dict, cfg: AcceleratorConfig, focus: float | None):
    hz = cfg.clock_mhz * 1e6

    def shown(pts):
        return [p for p in pts if focus is None or p.perplexity <= focus]
    refined = shown(p for p in result["searched"] if p.label.startswith("refined"))
    if refined:
        ax.plot([hz / p.cycles_per_token for p in refined], [p.perplexity for p in refined],
                "*", ms=14, label="searched + measured refinement")
    for kind, marker in (("uniform", "s"), ("searched", "o")):
        pts = sorted(shown(p for p in result[kind] if not p.label.startswith("refined")),
                     key=lambda p: p.cycles_per_token)
        xs = [hz / p.cycles_per_token for p in pts]
        ys = [p.perplexity for p in pts]
        ax.plot(xs, ys, marker + ("--" if kind == "searched" else ""), ms=7,
                label=f"{kind} ({'per-layer formats' if kind == 'searched' else 'one format'})")
        if kind == "uniform":  # labels alternate above and below: neighbours sit close
            for i, (p, x, y) in enumerate(zip(pts, xs, ys, strict=True)):
                ax.annotate(p.label.removeprefix("uniform "), (x, y), textcoords="offset points",
                            xytext=(5, 6 if i % 2 == 0 else -12), fontsize=8)
    ax.set_xlabel(f"simulated decode tokens/s at {cfg.clock_mhz:g} MHz")
    ppl = [p.perplexity for p in shown(result["uniform"] + result["searched"])]
    if max(ppl) > 4 * min(ppl):  # a catastrophic format would flatten the rest
        ax.set_yscale("log")
    ax.set_ylabel("held-out perplexity")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


@command("sw.codesign")
def main(argv: list[str] | None = None) -> int:
    """``python -m sw.codesign``: search one model, write the assignment, the packed model of
    the main budget, the records and the Pareto plot into ``--out``."""
    ap = OneLineParser(
        prog="python -m sw.codesign", name="sw.codesign", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default="reference", help="a --model spec (sw.deploy's)")
    add_tokenizer_option(ap)
    ap.add_argument("--budget", default="uniform-2:4-latency", choices=sorted(BUDGETS),
                    help="the decode latency of a uniform format; its assignment is packed")
    ap.add_argument("--method", default="sparsegpt+gptq", help="compression method")
    ap.add_argument("--candidates", default=",".join(CANDIDATES),
                    help="formats to choose from, comma-separated: <pattern>-int<bits>"
                         "[-g<group>|-row][-asym]; must include the budget's format")
    ap.add_argument("--granularity", default="layer",
                    help="'layer', 'type' or 'type:K' (K depth ranges per layer type)")
    ap.add_argument("--calib", type=int, default=32, help="calibration sequences")
    ap.add_argument("--search-tokens", type=int, default=8192,
                    help="validation tokens for the sensitivities")
    ap.add_argument("--eval-tokens", type=int, default=16384,
                    help="test tokens for the reported perplexities")
    ap.add_argument("--domain", default=corpus.CODE, choices=corpus.DOMAINS,
                    help="text domain of the sensitivities and the reported perplexities")
    ap.add_argument("--calib-domain", default=corpus.CODE, choices=corpus.CALIBRATION_SETS,
                    help="calibration set (train splits)")
    ap.add_argument("--dram-mb", type=int, default=None,
                    help="simulated DRAM in MiB; none: the configuration's")
    ap.add_argument("--out", default="build/codesign", help="output directory")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    args = ap.parse_args(argv)
    if args.method not in COMPRESS_METHODS:
        print(f"sw.codesign: --method {args.method!r}: choose one of "
              f"{', '.join(sorted(COMPRESS_METHODS))}", file=sys.stderr)
        return 2
    try:
        for opt in ("calib", "search_tokens", "eval_tokens"):
            if getattr(args, opt) < 1:
                raise ValueError(f"--{opt.replace('_', '-')} must be >= 1, got "
                                 f"{getattr(args, opt)}")
        if Path(args.out).exists() and not Path(args.out).is_dir():
            raise ValueError(f"--out {args.out}: exists and is not a directory")
        if not re.fullmatch(r"layer|type(:\d+)?", args.granularity):
            raise ValueError(f"--granularity {args.granularity!r}: 'layer', 'type' or 'type:K'")
        candidates = {c: WeightFormat.parse(c) for c in args.candidates.split(",")}
        if BUDGETS[args.budget] not in candidates:
            raise ValueError(f"--candidates {args.candidates!r}: the budget {args.budget} needs "
                             f"{BUDGETS[args.budget]} among them")
        cfg = AcceleratorConfig()
        for fmt in candidates.values():
            fmt.check_supported(cfg)
        src = open_model(args.model, tokenizer=args.tokenizer)
    except (ModelSourceError, ValueError) as e:
        print(f"sw.codesign: {e}", file=sys.stderr)
        return 2
    if args.dram_mb is not None:
        if args.dram_mb < 1:
            print(f"sw.codesign: --dram-mb must be >= 1, got {args.dram_mb}", file=sys.stderr)
            return 2
        cfg = cfg.with_dram(args.dram_mb << 20)
    result = run(src, cfg, method=args.method, candidates=candidates,
                 granularity=args.granularity,
                 base=BUDGETS[args.budget], calib=args.calib,
                 search_tokens=args.search_tokens, eval_tokens=args.eval_tokens,
                 domain=args.domain, calib_domain=args.calib_domain, progress=not args.quiet)
    main_point = next(p for p in result["searched"] if p.label == f"refined {args.budget}")
    out = Path(args.out)
    out.resolve().parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.resolve().parent))
    try:
        (tmp / "assignment.json").write_text(json.dumps(main_point.assignment, indent=1))
        save(from_llama(src.model, main_point.weights, tokenizer=src.tokenizer_record(),
                        recipe={"method": args.method, "codesign": args.budget},
                        meta={"source": src.name}), tmp / "model.safetensors")
        plot(result, cfg, tmp / "pareto.png", f"{src.name}: per-layer formats vs uniform",
             zoom_bound(result, BUDGETS[args.budget]))
        publish(tmp, out, ("assignment.json", "model.safetensors", "pareto.png"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {out}/assignment.json, model.safetensors (sw.deploy --model accepts it), "
          "pareto.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
