"""Accuracy of N:M pruning and INT4 quantisation on a real model: the reference model or any
``--model`` that :func:`sw.models.source.open_model` accepts (``smollm2``, a Hugging Face
directory, a LLaMA ``.gguf`` file).

``python -m bench.accuracy [--model SPEC] [--domain code|prose] [--calib-domain SET]``
compresses the model with every configuration of :func:`default_configs`, evaluates each on the
held-out **test** split of a text domain (``--domain``: ``code``, the CPython standard library,
by default; ``prose``, the Lee corpus of English news articles; :mod:`sw.models.corpus`) in the
model's own tokens (perplexity, top-1 agreement and KL against the uncompressed model),
calibrates on random windows of the disjoint **train** split of the calibration set
(``--calib-domain``: ``code`` by default, ``prose`` or ``code+prose``, half of each)
(:meth:`~sw.models.source.ModelSource.windows` / :meth:`~sw.models.source.ModelSource.calibration`),
prints a table, and writes ``bench/results/accuracy.json`` (with ``--record``; by default under
``build/bench/``) (one flat record per configuration; the file holds every model's records, and
a run replaces only those of its own model, corpora and tie rule) and the plot
``docs/img/accuracy.png`` (``accuracy_<model>.png`` for other models, with ``_<corpora>`` for
other corpora than code). See docs/accuracy.md.

Rows: fp32 (the uncompressed model; for ``smollm2`` its float weights are the dequantised Q4_1
GGUF tensors); dense W4 g128 by RTN and GPTQ, symmetric and asymmetric (zero points); N:M
pruning only (weights kept in float, rounded to FP16) by magnitude, Wanda and SparseGPT (2:4, 4:8,
1:4, 2:8 on the reference model; 2:4, 4:8 on other models); 2:4 + W4 g128 with every mask method
combined with RTN and with GPTQ (``sparsegpt+rtn``: SparseGPT's float reconstruction then
rounding; ``sparsegpt+gptq``: SparseGPT's joint mode, rounding inside the sweep); and the
accelerator's exact numerics (:func:`sw.compress.model.use_hardware_numerics`) on the best 2:4 +
W4 row (W4A8 linears, then also the INT8 attention / KV cache of the compiled model, then also
the vector unit's exact integer host ops: :mod:`sw.compress.vector`) and on symmetric dense W4
GPTQ (W4A8 linears). The run prints the perplexity cost of the vector unit's numerics: the
``hardware+vector`` row against the ``hardware+attention`` row (float host ops) of the same
weights (:func:`vector_cost`). The head stays in float (the default skip of
:func:`~sw.compress.model.compress_llama`, as in the GPTQ / SparseGPT / Wanda papers; SmolLM2
ties it to the embedding, which therefore stays float too).

Record fields: ``model`` (``reference``, ``smollm2`` or the spec), ``method``, ``mask`` /
``quant`` (its two halves), ``pattern``, ``bits`` (32 fp32, 16 float pruned weights rounded to
FP16, 4 INT4), ``group`` (0 when not quantised), ``symmetric``, ``numerics`` (``float``: the
model with dequantised weights; ``hardware``: INT8 activations, integer accumulation;
``hardware+attention``: also the INT8 attention products; ``hardware+vector``: also the vector
unit's numerics for every host op), ``perplexity``, ``nll``,
``top1_agreement``, ``kl``, ``max_kl``, ``seconds`` (whole-model compression wall time,
calibration included; hardware rows reuse the weights of the float row and repeat its time),
``eval_seconds``, ``eval_tokens``, ``window_nll`` (mean NLL of each evaluation window, for
paired comparisons: :func:`paired_difference`), ``calib_corpus`` (the calibration set: ``code``,
``prose`` or ``code+prose``, its train splits) and ``eval_corpus`` (the evaluation domain:
``code`` or ``prose``, its test split), ``nm_ties`` (the N:M tie rule, ``lower`` unless
``--ties higher``: :mod:`sw.compress.prune`), ``magnitude_ties_2_4`` (the fraction of 4-blocks
of the compressed layers' ``|W|`` whose 2:4 magnitude mask the tie rule decides:
:func:`magnitude_ties`), ``calib_tokens``, the other calibration / eval
settings, ``model_note`` and ``tied_embeddings``.

``--lm-head`` measures the LM head instead (:func:`head_records`): the model's default recipe
(:mod:`sw.models.recipes`) compresses the blocks once, then the head is left in float
(``host``) or compressed dense INT8 / INT4 in the recipe's groups with the recipe's method
(``sw.deploy --lm-head``); each is evaluated with the accelerator's numerics (W4A8 linears, the
INT8 KV cache) and written to ``accuracy_head.json`` (fields ``lm_head``, ``head_format``,
``perplexity``, ``nll``, ``top1_agreement``, ``kl``, ``relative_to_host``, the recipe and the
evaluation settings; like ``accuracy.json``, a run replaces only its own model's and corpora's
records).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from bench.common import (
    DOCS,
    RESULTS,
    command,
    nonnegative_float,
    nonnegative_int,
    parser,
    patterns,
    positive_int,
    recorded,
    stamp,
    write_json,
)
from hw.config import NMPattern
from hw.format import QuantizedWeight, WeightFormat
from sw.cli import add_tokenizer_option
from sw.compress.calibrate import collect_stats
from sw.compress.core import PaddingWarning
from sw.compress.model import (
    compress_llama,
    prune_llama,
    selected_linears,
    untie_head,
    use_hardware_numerics,
)
from sw.compress.prune import TIE_RULES, nm_mask, tie_rule
from sw.compress.sparsegpt import sparsegpt_prune
from sw.compress.wanda import wanda_mask
from sw.models.corpus import CALIBRATION_SETS, CODE, DOMAINS
from sw.models.eval import (
    EvalProtocol,
    calibration_samples,
    compare,
    eval_windows,
    perplexity,
)
from sw.models.recipes import HEAD, LM_HEADS, recipe_for
from sw.models.source import ModelSource, ModelSourceError, open_model

ROOT = Path(__file__).resolve().parent.parent
#: Default directory of the plots (``--record``: docs/img).
IMG = DOCS / "img"
#: The default evaluation protocol (sw/models/README.md).
PROTOCOL = EvalProtocol()

#: Patterns of the pruning-only rows (the reference model; :data:`MODEL_DEFAULTS` for others).
PRUNE_PATTERNS = ("2:4", "4:8", "1:4", "2:8")
#: Row set and evaluation size per model (``auto`` options); any model not named here gets
#: ``"other"``. The reference model's eval is :data:`PROTOCOL`.
#: The smaller calibration and evaluation of other models keep a SmolLM2-135M table within
#: minutes per row on 2 cores (a GPTQ row's time is about half per-layer solves, the rest
#: scales with the calibration tokens; docs/accuracy.md has the measured times).
MODEL_DEFAULTS: dict[str, dict] = {
    "reference": {"patterns": PRUNE_PATTERNS, "eval_tokens": PROTOCOL.max_tokens,
                  "calib_samples": 64, "calib_seq_len": 256, "zoom": 1.10},
    "other": {"patterns": ("2:4", "4:8"), "eval_tokens": 8192,
              "calib_samples": 32, "calib_seq_len": 128, "zoom": 3.5},
}
MODEL_DEFAULTS["smollm2"] = {**MODEL_DEFAULTS["other"],
                             "title": "SmolLM2-135M-Instruct (fp32 = dequantised Q4_1 GGUF)"}
#: Most logits elements (batch x positions x vocabulary) of one evaluation batch: the KL of
#: :func:`sw.models.eval.compare` holds a few float64 copies of them (16 x 256 x 259 for the
#: reference model; 5 x 256 x 49152, about 0.5 GB each, for SmolLM2).
MAX_BATCH_LOGITS = 1 << 26
#: Mask methods (pruning-only rows and the mask half of the combined rows).
MASKS = ("magnitude", "wanda", "sparsegpt")


@dataclass(frozen=True)
class Config:
    """One row of the study.

    Attributes
    ----------
    method : str
        Record label (``fp32``, ``rtn``, ``gptq``, ``magnitude``, ``wanda``, ``sparsegpt``,
        ``<mask>+rtn``, ``<mask>+gptq``).
    pattern : str
        ``dense`` or ``N:M``.
    bits : int
        32 (fp32), 16 (float pruned weights, rounded to FP16) or the integer weight width.
    group : int
        Quantisation group (0 when not quantised).
    numerics : str
        ``float``, ``hardware`` (W4A8 linears), ``hardware+attention`` (and the INT8
        attention products of the compiled model), ``hardware+kv4`` (the same with the INT4
        KV cache: ``kv_bits`` 4) or ``hardware+vector`` (and the vector unit's exact numerics
        for the host ops: RMSNorm, RoPE, softmax, SiLU-gate, residual additions, INT8
        requantisation); ``float+attention`` / ``float+kv4``: the attention products with the
        INT8 / INT4 KV cache, the linears in float (the cache's cost alone).
    symmetric : bool
        Symmetric INT weights, or asymmetric with per-group zero points.
    """

    method: str
    pattern: str = "dense"
    bits: int = 32
    group: int = 0
    numerics: str = "float"
    symmetric: bool = True

    @property
    def label(self) -> str:
        """Short unique name, e.g. ``wanda+gptq 2:4 w4g128 hw``, ``rtn dense w4g128 asym``."""
        q = "fp32" if self.bits == 32 else "fp16" if self.bits == 16 else \
            f"w{self.bits}g{self.group}"
        asym = "" if self.symmetric or self.bits >= 16 else " asym"
        hw = {"float": "", "hardware": " hw", "hardware+attention": " hw+attn",
              "hardware+kv4": " hw+kv4", "hardware+vector": " hw+vec",
              "float+attention": " attn", "float+kv4": " kv4"}[self.numerics]
        return f"{self.method} {self.pattern} {q}{asym}{hw}"

    @property
    def mask(self) -> str:
        """Mask half of the method (``none`` for dense)."""
        if self.pattern == "dense":
            return "none"
        head = self.method.split("+")[0].split("-")[0]
        return "magnitude" if head in ("rtn", "gptq") else head

    @property
    def quant(self) -> str:
        """Quantisation half (``none`` for float weights)."""
        if self.bits >= 16:
            return "none"
        if self.method.endswith("gptq") or self.method in ("sparsegpt", "sparsegpt-joint"):
            return "gptq"
        return "rtn"


def default_configs(group: int = 128, patterns: Sequence[str] = PRUNE_PATTERNS
                    ) -> list[Config]:
    """The float rows of the study (hardware rows are chosen by :func:`hardware_configs`):
    fp32, dense W4 RTN / GPTQ symmetric then asymmetric, pruning only at each of ``patterns``,
    2:4 + W4 with each mask and RTN, then with GPTQ."""
    rows = [Config("fp32")]
    rows += [Config(q, "dense", 4, group, symmetric=sym) for sym in (True, False)
             for q in ("rtn", "gptq")]
    rows += [Config(m, p, 16, 0) for p in patterns for m in MASKS]
    rows += [Config(f"{m}+{q}", "2:4", 4, group) for q in ("rtn", "gptq") for m in MASKS]
    return rows


#: The rows of the KV-cache study (``kv_cache``): each weight set with float attention, the
#: INT8 KV cache and the INT4 one.
KV_KINDS = ("hardware", "hardware+attention", "hardware+kv4")


def hardware_configs(records: Sequence[dict], attention: bool = True,
                     kv_cache: bool = False) -> list[Config]:
    """Hardware-numerics rows: the best (lowest perplexity) 2:4 + W4 float row with W4A8
    linears and, with ``attention``, also with the INT8 attention products, then also with the
    vector unit's host ops; symmetric dense GPTQ with W4A8 linears.

    With ``kv_cache`` (the KV-cache study, instead): the fp32 model with the INT8 and the
    INT4 KV cache (linears in float), then each of those weight sets with W4A8 linears and
    float attention, the INT8 and the INT4 KV cache (:data:`KV_KINDS`)."""
    out = []
    sparse = [r for r in records if r["numerics"] == "float" and r["pattern"] == "2:4"
              and r["bits"] == 4]
    dense = [r for r in records if r["numerics"] == "float" and r["method"] == "gptq"
             and r["pattern"] == "dense" and r.get("symmetric", True)]
    if kv_cache:
        if any(r["method"] == "fp32" for r in records):
            out += [Config("fp32", numerics=k) for k in ("float+attention", "float+kv4")]
        if sparse:
            best = min(sparse, key=lambda r: r["perplexity"])
            out += [Config(best["method"], "2:4", 4, best["group"], k,
                           best.get("symmetric", True)) for k in KV_KINDS]
        out += [Config("gptq", "dense", 4, r["group"], k) for r in dense for k in KV_KINDS]
        return out
    if sparse:
        best = min(sparse, key=lambda r: r["perplexity"])
        kinds = (("hardware", "hardware+attention", "hardware+vector") if attention
                 else ("hardware",))
        out += [Config(best["method"], "2:4", 4, best["group"], k,
                       best.get("symmetric", True)) for k in kinds]
    out += [Config("gptq", "dense", 4, r["group"], "hardware") for r in dense]
    return out


# ---------------------------------------------------------------------- evaluation
class LogitsMemo:
    """Callable wrapper computing a model's logits once per distinct input batch.

    :func:`~sw.models.eval.perplexity` and :func:`~sw.models.eval.compare` walk the same
    protocol windows; with this wrapper the model runs once per window batch, not twice, and
    the fp32 reference once for the whole study.
    """

    def __init__(self, model: Callable[[torch.Tensor], torch.Tensor]):
        self.model = model
        self.cache: dict[str, torch.Tensor] = {}

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        key = hashlib.sha1(ids.numpy().tobytes() + str(tuple(ids.shape)).encode()).hexdigest()
        if key not in self.cache:
            self.cache[key] = self.model(ids)
        return self.cache[key]


def evaluate(model: torch.nn.Module, reference: LogitsMemo,
             protocol: EvalProtocol = PROTOCOL, windows: torch.Tensor | None = None) -> dict:
    """Perplexity and agreement with the reference of ``model`` on ``windows`` (default: the
    byte-level windows of ``protocol``), batched as ``protocol`` says."""
    t0 = time.perf_counter()
    memo = LogitsMemo(model)
    with torch.no_grad():
        ppl = perplexity(memo, protocol, windows=windows)
        cmp = compare(memo, reference, protocol, windows=windows)
        per_window = window_nll(memo, protocol, windows)  # from the cached logits
    return {"perplexity": ppl.perplexity, "nll": ppl.nll, "top1_agreement": cmp.top1_agreement,
            "kl": cmp.mean_kl, "max_kl": cmp.max_kl, "eval_tokens": ppl.num_tokens,
            "window_nll": [round(float(v), 6) for v in per_window],
            "eval_seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------------- compression
def compress(cfg: Config, reference: torch.nn.Module, calibration: torch.Tensor | None, *,
             sequential: bool = True, progress: bool = False,
             **method_kwargs) -> tuple[torch.nn.Module, dict[str, QuantizedWeight] | None, float]:
    """Apply a float-numerics configuration to a copy of ``reference``.

    Returns
    -------
    model, weights, seconds
        The compressed copy, its packed weights (None when not quantised) and the wall time.
    """
    model = copy.deepcopy(reference)
    t0 = time.perf_counter()
    weights = None
    if cfg.mask == "sparsegpt":  # SparseGPT picks its column order itself
        method_kwargs = {k: v for k, v in method_kwargs.items() if k != "act_order"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PaddingWarning)  # K=688 is padded to whole groups
        if cfg.method == "fp32":
            pass
        elif cfg.bits == 16:
            kw = method_kwargs if cfg.method == "sparsegpt" else {}
            prune_llama(model, cfg.pattern, cfg.method, calibration, sequential=sequential,
                        progress=progress, **kw)
        else:
            fmt = WeightFormat(cfg.pattern, cfg.bits, cfg.group, symmetric=cfg.symmetric)
            needs_h = cfg.quant == "gptq" or cfg.mask == "sparsegpt"
            kw = method_kwargs if needs_h else {}
            weights = compress_llama(model, fmt, cfg.method, calibration,
                                     sequential=sequential, progress=progress, **kw)
    return model, weights, time.perf_counter() - t0


def build_records(reference: torch.nn.Module, configs: Sequence[Config],
                  calibration: torch.Tensor | None, protocol: EvalProtocol = PROTOCOL, *,
                  hardware: bool = True, sequential: bool = True, progress: bool = True,
                  extra: dict | None = None, windows: torch.Tensor | None = None,
                  also: Sequence[tuple[EvalProtocol, torch.Tensor]] = (),
                  kv_cache: bool = False, **method_kwargs) -> list[dict]:
    """Compress and evaluate every configuration; returns the flat records.

    Parameters
    ----------
    reference : torch.nn.Module
        The fp32 ``LlamaLM`` (left unchanged).
    configs : sequence of Config
        Float-numerics rows to run.
    calibration : torch.Tensor or None
        int64 ``[N, L]`` calibration tokens.
    protocol : EvalProtocol
        Evaluation windows (byte-level corpus) and batch size.
    hardware : bool
        Also run the :func:`hardware_configs` rows.
    sequential : bool
        Layer-wise sequential calibration (see :mod:`sw.compress.model`).
    progress : bool
        Progress bar over rows.
    extra : dict, optional
        Fields added to every record (model, calibration settings, threads, ...).
    windows : torch.Tensor, optional
        ``[n, L + 1]`` evaluation windows in the model's tokens
        (:meth:`~sw.models.source.ModelSource.windows`) instead of the protocol's.
    also : sequence of (EvalProtocol, torch.Tensor)
        Further evaluations of every compressed model (e.g. another text domain's windows),
        each giving its own records; the hardware rows follow the first evaluation's ranking.
    kv_cache : bool
        The hardware rows are the KV-cache study's (:func:`hardware_configs`).
    **method_kwargs
        Passed to GPTQ / SparseGPT (``percdamp``, ``act_order``, ...).

    Every record carries its evaluation's ``eval_*`` fields (the protocol's).
    """
    evals = [(protocol, windows), *also]
    refs = [LogitsMemo(reference) for _ in evals]
    extra = dict(extra or {})
    records: list[dict] = []
    weights_of: dict[Config, dict[str, QuantizedWeight]] = {}
    seconds_of: dict[Config, float] = {}
    bar = tqdm(total=(len(configs) + (4 if hardware else 0)) * len(evals), desc="accuracy",
               disable=not progress)

    def record(cfg: Config, model: Callable[[torch.Tensor], torch.Tensor] | None,
               seconds: float) -> None:
        """Records of ``model`` (None: the uncompressed reference) on every evaluation."""
        bar.set_postfix_str(cfg.label)
        for ref, (prot, win) in zip(refs, evals, strict=True):
            records.append({
                "method": cfg.method, "mask": cfg.mask, "quant": cfg.quant,
                "pattern": cfg.pattern, "bits": cfg.bits, "group": cfg.group,
                "symmetric": cfg.symmetric, "numerics": cfg.numerics,
                "sparsegpt_mode": _sparsegpt_mode(cfg),
                **evaluate(ref if model is None else model, ref, prot, win),
                "seconds": seconds, "sequential": sequential, **extra,
                **{f"eval_{k}": v for k, v in asdict(prot).items()}})
            bar.update()

    try:
        for cfg in configs:
            bar.set_postfix_str(cfg.label)
            model, weights, seconds = compress(cfg, reference, calibration,
                                               sequential=sequential, **method_kwargs)
            if weights is not None:
                weights_of[cfg] = weights
                seconds_of[cfg] = seconds
            # the uncompressed row scores the reference itself: its logits are computed once
            record(cfg, None if cfg.method == "fp32" else model, seconds)
            del model
        if hardware:
            first = [r for r in records if r["eval_corpus"] == protocol.corpus]
            for hcfg in hardware_configs(first, kv_cache=kv_cache):
                base = replace(hcfg, numerics="float")
                kv4 = hcfg.numerics.endswith("+kv4")
                model = use_hardware_numerics(
                    copy.deepcopy(reference), weights_of.get(base, {}),
                    attention=hcfg.numerics.endswith(("+attention", "+kv4")),
                    vector=hcfg.numerics == "hardware+vector", kv_bits=4 if kv4 else 8)
                record(hcfg, model, seconds_of.get(base, 0.0))
    finally:
        bar.close()
    return records


def head_records(reference: torch.nn.Module, model: str, calibration: torch.Tensor,
                 protocol: EvalProtocol, windows: torch.Tensor, progress: bool = False
                 ) -> list[dict]:
    """The perplexity cost of compressing the LM head: one record per :data:`LM_HEADS` entry.

    The blocks are compressed once with ``model``'s default recipe (the head skipped); each
    compressed head is then calibrated on that compressed model, as a sequential compression
    of the whole model would calibrate it (the head is its last layer). Every row runs with
    the accelerator's numerics (W4A8 linears, the INT8 KV cache), the float head's too.
    """
    recipe = recipe_for(model)
    body = copy.deepcopy(reference)
    layers = list(selected_linears(body))
    formats = recipe.formats(layers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PaddingWarning)
        weights = compress_llama(body, lambda name, _: formats.get(name), recipe.method,
                                 calibration, progress=progress)
    memo = LogitsMemo(reference)
    out = []
    for head in LM_HEADS:
        m, w = copy.deepcopy(body), dict(weights)
        fmt = _head_format(recipe, head)
        if fmt is not None:
            untie_head(m)  # a tied head is compressed as a copy: the embedding stays float
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PaddingWarning)
                w.update(compress_llama(m, lambda name, _, f=fmt: f if name == HEAD else None,
                                        recipe.method, calibration, skip=(),
                                        progress=progress))
        twin = use_hardware_numerics(m, w, attention=True)
        r = evaluate(twin, memo, protocol, windows)
        r.pop("window_nll")
        out.append({"model": model, "lm_head": head,
                    "head_format": None if fmt is None else fmt.name,
                    "recipe": str(recipe), "numerics": "hardware+attention", **r})
    host = out[0]["perplexity"]
    for r in out:
        r["relative_to_host"] = r["perplexity"] / host - 1
    return out


def _head_format(recipe, head: str) -> WeightFormat | None:
    """The head format ``recipe`` gets with ``--lm-head head``."""
    return recipe.override(head_bits=LM_HEADS[head]).head_format()


def _sparsegpt_mode(cfg: Config) -> str:
    if cfg.mask != "sparsegpt":
        return ""
    if cfg.quant == "none":
        return "prune (float)"
    return "joint" if cfg.quant == "gptq" else "float reconstruction, then RTN"


# ---------------------------------------------------------------------- reporting
def _weights(r: dict) -> str:
    if r["bits"] >= 16:
        return "fp32" if r["bits"] == 32 else "fp16"
    return f"INT{r['bits']} g{r['group']}" + ("" if r.get("symmetric", True) else " asym")


def format_table(records: Sequence[dict]) -> str:
    """Markdown table of the records."""
    head = ("| method | pattern | weights | numerics | perplexity | top-1 agree | KL (nats) "
            "| compress s |\n|---|---|---|---|---:|---:|---:|---:|")
    lines = [head]
    for r in records:
        w = _weights(r)
        lines.append(f"| {r['method']} | {r['pattern']} | {w} | {r['numerics']} | "
                     f"{r['perplexity']:.4f} | {r['top1_agreement']:.4f} | {r['kl']:.4f} | "
                     f"{r['seconds']:.1f} |")
    return "\n".join(lines)


def vector_cost(records: Sequence[dict]) -> list[dict]:
    """The perplexity cost of the vector unit's numerics: for every ``hardware+vector`` record,
    the ``hardware+attention`` record of the same weights and evaluation (float host ops) and
    ``relative = ppl(vector) / ppl(float host ops) - 1``."""
    def key(r: dict) -> tuple:
        return (r["method"], r["pattern"], r["bits"], r["group"], r.get("symmetric", True),
                r.get("eval_corpus"))
    host = {key(r): r for r in records if r["numerics"] == "hardware+attention"}
    out = []
    for r in records:
        base = host.get(key(r)) if r["numerics"] == "hardware+vector" else None
        if base is not None:
            out.append({"method": r["method"], "pattern": r["pattern"],
                        "eval_corpus": r.get("eval_corpus"),
                        "perplexity_float_host": base["perplexity"],
                        "perplexity_vector": r["perplexity"],
                        "relative": r["perplexity"] / base["perplexity"] - 1})
    return out


def kv_cost(records: Sequence[dict]) -> list[dict]:
    """The perplexity cost of the KV cache's width: for every weight set (and evaluation)
    with an INT4-cache record, its perplexity with float attention (``fp32`` or
    ``hardware`` numerics), the INT8 cache and the INT4 cache, and the INT4 cache's cost
    relative to the INT8 one and to float attention."""
    def key(r: dict) -> tuple:
        return (r["method"], r["pattern"], r["bits"], r["group"], r.get("symmetric", True),
                r.get("eval_corpus"))
    by: dict[tuple, dict[str, dict]] = {}
    for r in records:
        by.setdefault(key(r), {})[r["numerics"]] = r
    out = []
    for k, rows in by.items():
        hw = "hardware" if "hardware+kv4" in rows else "float" if "float+kv4" in rows else None
        if hw is None:
            continue
        kv4 = rows[f"{hw}+kv4"]
        base = rows.get(hw)
        int8 = rows.get(f"{hw}+attention")
        out.append({"method": k[0], "pattern": k[1], "bits": k[2], "group": k[3],
                    "eval_corpus": k[5], "linears": "W4A8" if hw == "hardware" else "float",
                    "perplexity_float_attention": base and base["perplexity"],
                    "perplexity_int8_kv": int8 and int8["perplexity"],
                    "perplexity_int4_kv": kv4["perplexity"],
                    "int4_vs_int8": int8 and kv4["perplexity"] / int8["perplexity"] - 1,
                    "int4_vs_float": base and kv4["perplexity"] / base["perplexity"] - 1})
    return out


def activation_ranges(model: torch.nn.Module, windows: torch.Tensor,
                      batch: int = 16) -> dict[str, dict]:
    """Magnitudes of the float model's operands of the vector unit on the first ``batch``
    evaluation windows (the inputs ``windows[:, :-1]``): for each kind, ``max`` and ``median``
    of ``|x|`` and the fraction of values at or beyond the activation format's saturation
    (``ACT_MAX / 2**ACT_FRAC``) -- the ranges the fixed-point format must cover
    (docs/architecture.md, section 3)."""
    from hw.numerics import ACT_FRAC, ACT_MAX
    from sw.models.llama import AttentionProducts, RMSNorm, Rotary, SiLUGate

    seen: dict[str, list[torch.Tensor]] = {}

    def keep(kind: str, t: torch.Tensor) -> None:
        seen.setdefault(kind, []).append(t.detach().abs().flatten().float())

    def hook(mod, args, out):
        if isinstance(mod, RMSNorm):
            keep("residual stream (norm input)", args[0])
            keep("RMSNorm output", out)
        elif isinstance(mod, Rotary):
            keep("q, k after RoPE", out)
        elif isinstance(mod, SiLUGate):
            keep("gate, up (SiLU-gate inputs)", torch.cat([args[0], args[1]]))
            keep("SiLU-gate output", out)
        elif isinstance(mod, AttentionProducts):
            q, k = args[0], args[1]
            if mod.groups > 1:
                k = k.repeat_interleave(mod.groups, dim=1)
            scores = torch.matmul(q, k.transpose(-2, -1)) * mod.scale + args[3]
            keep("scaled scores (softmax input)", scores[torch.isfinite(scores)])
            keep("attention output", out)
        elif mod is getattr(model, "lm_head", None):
            keep("logits (argmax input)", out)

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (RMSNorm, Rotary, SiLUGate, AttentionProducts))
               or m is getattr(model, "lm_head", None)]
    try:
        with torch.no_grad():
            model(windows[:batch, :-1])
    finally:
        for h in handles:
            h.remove()
    limit = ACT_MAX / 2**ACT_FRAC
    out = {}
    for kind, parts in seen.items():
        x = torch.cat(parts)
        out[kind] = {"max": float(x.max()), "median": float(x.median()),
                     "saturated": float((x >= limit).double().mean())}
    return out


def plot(records: Sequence[dict], path: Path, title: str = "Reference model",
         zoom_to: float = 1.10) -> Path:
    """Bar chart of perplexity per configuration, grouped by pattern / weights; fp32 line.

    Colour: mask method (grey for dense); hatching: quantiser (``//`` GPTQ, ``..`` RTN, none
    for float weights); bars of hardware-numerics rows have a thick outline. The lower panel
    zooms on perplexities up to ``zoom_to`` times fp32's.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
    from matplotlib.ticker import FixedLocator, NullLocator

    colors = {"none": "#9e9e9e", "magnitude": "#e57373", "wanda": "#64b5f6",
              "sparsegpt": "#81c784"}
    hatches = {"gptq": "//", "rtn": "..", "none": None}
    fp32 = next((r["perplexity"] for r in records if r["method"] == "fp32"), None)
    groups: dict[str, list[dict]] = {}
    for r in records:
        if r["method"] == "fp32":
            continue
        w = "fp16" if r["bits"] == 16 else f"W{r['bits']} g{r['group']}" + \
            ("" if r.get("symmetric", True) else " asym")
        hw = {"float": "", "hardware": "\nW4A8 hw", "hardware+attention": "\nW4A8 hw\n+INT8 attn",
              "hardware+vector": "\nW4A8 hw\n+vector unit"}
        key = f"{r['pattern']}\n{w}" + hw[r["numerics"]]
        groups.setdefault(key, []).append(r)
    fig, (ax, zoom) = plt.subplots(2, 1, figsize=(13, 8), sharex=True,
                                   gridspec_kw={"height_ratios": [3, 2]})
    top = max(r["perplexity"] for r in records)
    bottom = 0.97 * min(r["perplexity"] for r in records)
    z_lo = bottom
    z_hi = (fp32 or bottom) * zoom_to
    x, ticks, tick_labels = 0.0, [], []
    for key, rows in groups.items():
        start = x
        for r in rows:
            hw = r["numerics"] != "float"
            for a in (ax, zoom):
                a.bar(x, r["perplexity"], color=colors[r["mask"]], hatch=hatches[r["quant"]],
                      edgecolor="black", linewidth=1.8 if hw else 0.5)
            ax.text(x, r["perplexity"] * 1.005, f"{r['method']}  {r['perplexity']:.3f}",
                    ha="center", va="bottom", fontsize=6, rotation=90)
            if r["perplexity"] > z_hi:
                zoom.text(x, z_hi * 0.995, "\u2191", ha="center", va="top", fontsize=8)
            x += 1
        ticks.append((start + x - 1) / 2)
        tick_labels.append(key)
        x += 0.8
    for a in (ax, zoom):
        if fp32 is not None:
            a.axhline(fp32, color="black", linestyle="--", linewidth=1)
    ax.set_yscale("log")
    # room above the tallest bar for its rotated label (a wide range needs more, in log scale)
    headroom = 1.4 if top / bottom < 20 else 8.0
    ax.set_ylim(bottom, top * headroom)
    levels = [v for v in (3.5, 4, 5, 6, 7, 8, 10, 15, 20, 30, 50, 100, 200, 500, 1000, 2000,
                          5000, 10000) if bottom <= v <= top * headroom]
    ax.yaxis.set_major_locator(FixedLocator(levels))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_yticks(levels, [f"{v:g}" for v in levels])
    ax.set_ylabel("perplexity (log scale)")
    zoom.set_ylim(z_lo, z_hi)
    zoom.set_ylabel("perplexity (zoom, linear)")
    zoom.set_xticks(ticks, tick_labels, fontsize=8)
    ax.set_title("{}, test split (fp32 perplexity {:.3f}, dashed): perplexity per "
                 "compression configuration".format(title, fp32 or float("nan")))
    handles = [Patch(facecolor=c, edgecolor="black", label=f"mask: {m}")
               for m, c in colors.items()]
    handles += [Patch(facecolor="white", edgecolor="black", hatch=h, label=f"quant: {q}")
                for q, h in hatches.items()]
    handles.append(Patch(facecolor="white", edgecolor="black", linewidth=1.8,
                         label="W4A8 hardware numerics"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


# ---------------------------------------------------------------------- investigation
#: Linear layers grouped by the activation they read.
LAYER_KINDS: dict[str, tuple[str, ...]] = {
    "q/k/v": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",),
    "gate/up": ("gate_proj", "up_proj"), "down": ("down_proj",)}


def _kind(name: str) -> str:
    leaf = name.rsplit(".", 1)[-1]
    return next(k for k, v in LAYER_KINDS.items() if leaf in v)


def magnitude_ties(model: torch.nn.Module, pattern: str = "2:4") -> float:
    """Fraction of the M-blocks of the compressed layers' ``|W|`` (along K, the whole blocks)
    whose N-th and (N+1)-th largest values are equal: the blocks where the tie rule alone
    decides a magnitude mask (:mod:`sw.compress.prune`)."""
    p = NMPattern.parse(pattern)
    ties = total = 0
    for lin in selected_linears(model).values():
        w = lin.weight.detach().abs().float().numpy()
        b = np.sort(w[:, : w.shape[1] // p.m * p.m].reshape(w.shape[0], -1, p.m), axis=2)
        ties += int((b[:, :, p.m - p.n] == b[:, :, p.m - p.n - 1]).sum())
        total += b.shape[0] * b.shape[1]
    return ties / total if total else 0.0


@torch.no_grad()
def window_nll(model: Callable[[torch.Tensor], torch.Tensor],
               protocol: EvalProtocol = PROTOCOL, windows: torch.Tensor | None = None
               ) -> np.ndarray:
    """Mean NLL (nats) of every window (default: the protocol's); their mean is the NLL."""
    if windows is None:
        windows = eval_windows(protocol)
    out = []
    for batch in windows.split(protocol.batch_size):
        logits = model(batch[:, :-1]).float()
        nll = F.cross_entropy(logits.transpose(1, 2), batch[:, 1:], reduction="none")
        out.append(nll.double().mean(1))
    return torch.cat(out).numpy()


def gap_closed(ref: np.ndarray, point: np.ndarray, dense: np.ndarray
               ) -> tuple[float, float] | None:
    """The fraction of the gap between ``ref`` and ``dense`` that ``point`` closes, and its
    standard error: the one gap-closed estimator (docs/accuracy.md, "Co-design search").

    The arguments are the per-window mean NLLs (:func:`window_nll`) of three models on the same
    windows of equal length. The gap closed is ``G = mean(ref - point) / mean(ref - dense)``,
    the fraction of the log-perplexity gap closed: ``ln(ppl_ref / ppl_point) /
    ln(ppl_ref / ppl_dense)``. Its standard error is the paired ratio estimator's,
    ``std(d_i) / sqrt(n) / |mean(ref - dense)|`` with ``d_i = (ref - point)_i - G (ref -
    dense)_i`` over the ``n`` windows (``ddof=1``). Adjacent windows of one document are
    correlated, so it is somewhat optimistic (as :func:`paired_difference`).

    Returns
    -------
    (G, SE), or None when the gap ``mean(ref - dense)`` is exactly zero.

    >>> g, se = gap_closed(np.array([2.0, 2.2]), np.array([1.9, 2.1]), np.array([1.8, 2.0]))
    >>> round(g, 6), round(se, 6)
    (0.5, 0.0)
    """
    num = np.asarray(ref, np.float64) - np.asarray(point, np.float64)
    den = np.asarray(ref, np.float64) - np.asarray(dense, np.float64)
    if den.mean() == 0:
        return None
    g = float(num.mean() / den.mean())
    return g, float((num - g * den).std(ddof=1) / math.sqrt(num.size) / abs(den.mean()))


def paired_difference(a: np.ndarray, b: np.ndarray) -> dict:
    """Mean per-window NLL difference ``b - a`` with its standard error over the windows."""
    d = np.asarray(b) - np.asarray(a)
    se = float(d.std(ddof=1) / math.sqrt(d.size))
    return {"delta_nll": float(d.mean()), "se": se, "z": float(d.mean()) / se if se else 0.0,
            "windows": int(d.size),
            "ppl_a": math.exp(float(np.mean(a))), "ppl_b": math.exp(float(np.mean(b)))}


def _prune_one_shot(w: torch.Tensor, st, pattern: str, method: str) -> torch.Tensor:
    wn = w.detach().numpy()
    p = NMPattern.parse(pattern)
    if method == "magnitude":
        return torch.from_numpy(np.where(nm_mask(np.abs(wn), p), wn, np.float32(0)))
    if method == "wanda":
        return torch.from_numpy(np.where(wanda_mask(wn, st.x_norms, p), wn, np.float32(0)))
    return torch.from_numpy(sparsegpt_prune(wn, st.hessian, p)[0])


def investigate(reference: torch.nn.Module, calibration: torch.Tensor, *,
                protocol: EvalProtocol = PROTOCOL, progress: bool = True,
                windows: torch.Tensor | None = None,
                sample: Callable[[int, int, int], torch.Tensor] = calibration_samples) -> dict:
    """Evidence for the method ordering on the reference model (see docs/accuracy.md).

    ``windows`` (default: the protocol's) are the evaluation windows and ``sample(n, seq_len,
    seed)`` draws the calibration sets of the calibration sections (default: the reference
    corpus; :meth:`sw.models.source.ModelSource.calibration` for another model).

    Sections: ``significance`` (paired per-window NLL differences of the key comparisons),
    ``feature_norms`` (spread of the input feature norms Wanda weights by), ``layer_error``
    (relative layer output error ``tr(D H D^T) / tr(W H W^T)`` and Wanda/magnitude mask
    agreement, one-shot on the fp32 model), ``sensitivity_1:4`` (perplexity with one layer
    kind, all but one, or all pruned 1:4), ``calibration`` (Wanda / SparseGPT 2:4 across
    calibration sizes, seeds and one-shot calibration), ``sparsegpt_quant`` (joint vs
    float-then-RTN, more calibration and more dampening) and ``one_shot`` (1:4 and 2:8 pruning
    with one-shot calibration, against the sequential rows of the main table).
    """
    out: dict = {}
    steps = tqdm(total=7, desc="investigate", disable=not progress)
    fmt = WeightFormat("2:4", 4, 128)

    def run(cfg: Config, cal=calibration, **kw) -> torch.nn.Module:
        return compress(cfg, reference, cal, **kw)[0]

    # 1. paired significance of the key comparisons
    ref_nll = window_nll(reference, protocol, windows)
    models = {c.label: c for c in (
        Config("magnitude", "2:4", 16), Config("wanda", "2:4", 16), Config("sparsegpt", "2:4", 16),
        Config("magnitude", "1:4", 16), Config("wanda", "1:4", 16),
        Config("rtn", "dense", 4, 128), Config("gptq", "dense", 4, 128),
        Config("sparsegpt+rtn", "2:4", 4, 128), Config("sparsegpt+gptq", "2:4", 4, 128))}
    nll = {label: window_nll(run(c), protocol, windows) for label, c in models.items()}
    pairs = [("magnitude 2:4 fp16", "wanda 2:4 fp16"), ("magnitude 2:4 fp16", "sparsegpt 2:4 fp16"),
             ("wanda 2:4 fp16", "sparsegpt 2:4 fp16"), ("magnitude 1:4 fp16", "wanda 1:4 fp16"),
             ("rtn dense w4g128", "gptq dense w4g128"),
             ("sparsegpt+rtn 2:4 w4g128", "sparsegpt+gptq 2:4 w4g128")]
    out["significance"] = [{"a": a, "b": b, **paired_difference(nll[a], nll[b])}
                           for a, b in pairs]
    out["significance"].append({"a": "fp32", "b": "gptq dense w4g128",
                                **paired_difference(ref_nll, nll["gptq dense w4g128"])})
    steps.update()

    # 2.-3. feature-norm spread and layer errors from one-shot fp32 statistics
    layers = selected_linears(reference)
    stats = collect_stats(reference, list(calibration.split(16)), list(layers))
    spread: dict[str, list] = {}
    for name, st in stats.items():
        n = st.x_norms.numpy()
        spread.setdefault(_kind(name), []).append((n.max() / np.median(n), n.std() / n.mean()))
    out["feature_norms"] = {k: {"max_over_median": float(np.mean([v[0] for v in vals])),
                                "cv": float(np.mean([v[1] for v in vals]))}
                            for k, vals in spread.items()}
    steps.update()
    errs: dict = {}
    for pattern in ("2:4", "1:4"):
        acc: dict[str, dict[str, list]] = {}
        for name, lin in layers.items():
            st, w = stats[name], lin.weight.detach()
            h = st.hessian.float()
            base = float(torch.trace(w @ h @ w.T))
            pruned = {m: _prune_one_shot(w, st, pattern, m) for m in MASKS}
            kind = acc.setdefault(_kind(name), {})
            for m, wp in pruned.items():
                dlt = w - wp
                kind.setdefault(m, []).append(float(torch.trace(dlt @ h @ dlt.T)) / base)
            same = ((pruned["wanda"] != 0) == (pruned["magnitude"] != 0)).float().mean()
            kind.setdefault("mask_agreement", []).append(float(same))
        errs[pattern] = {k: {m: float(np.mean(v)) for m, v in d.items()} for k, d in acc.items()}
    out["layer_error"] = errs
    steps.update()

    # 4. sensitivity: one layer kind pruned 1:4, or all but one (one-shot masks)
    out["sensitivity_1:4"] = sensitivity_rows(reference, stats, protocol=protocol,
                                              windows=windows)
    steps.update()

    # 5. calibration size, seed and one-shot calibration for the 2:4 masks
    cal_rows = []
    for method in ("wanda", "sparsegpt"):
        for n, seed, seq in ((16, 0, True), (128, 0, True), (64, 1, True), (64, 2, True),
                             (64, 0, False)):
            cal = sample(n, calibration.shape[1], seed)
            model = run(Config(method, "2:4", 16), cal, sequential=seq)
            cal_rows.append({"method": method, "calib_samples": n, "seed": seed,
                             "sequential": seq,
                             "perplexity": perplexity(model, protocol,
                                                      windows=windows).perplexity})
    out["calibration"] = cal_rows
    steps.update()

    # 6. SparseGPT + W4: joint vs float-then-RTN with more calibration / dampening
    sq = []
    for n, damp in ((128, 0.01), (64, 0.1)):
        cal = sample(n, calibration.shape[1], 0)
        for method in ("sparsegpt+rtn", "sparsegpt+gptq"):
            model = copy.deepcopy(reference)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", PaddingWarning)
                compress_llama(model, fmt, method, cal, progress=False, percdamp=damp)
            r = evaluate(model, LogitsMemo(reference), protocol, windows)
            sq.append({"method": method, "calib_samples": n, "percdamp": damp,
                       "perplexity": r["perplexity"], "kl": r["kl"],
                       "top1_agreement": r["top1_agreement"]})
    out["sparsegpt_quant"] = sq
    steps.update()
    out["one_shot"] = one_shot_rows(reference, calibration, protocol=protocol,
                                    windows=windows)
    steps.update()
    steps.close()
    return out


def sensitivity_rows(reference: torch.nn.Module, stats: dict, *, pattern: str = "1:4",
                     protocol: EvalProtocol = PROTOCOL, windows: torch.Tensor | None = None
                     ) -> dict:
    """Perplexity with only one layer kind pruned (``only <kind>``), all but one
    (``all but <kind>``) and all (``all``), by one-shot magnitude and Wanda masks."""
    subsets = {f"only {k}": {k} for k in LAYER_KINDS}
    subsets.update({f"all but {k}": set(LAYER_KINDS) - {k} for k in LAYER_KINDS})
    subsets["all"] = set(LAYER_KINDS)
    out: dict = {}
    for label, kinds in subsets.items():
        row = {}
        for m in ("magnitude", "wanda"):
            model = copy.deepcopy(reference)
            with torch.no_grad():
                for name, lin in selected_linears(model).items():
                    if _kind(name) in kinds:
                        lin.weight.copy_(_prune_one_shot(lin.weight, stats[name], pattern, m))
            row[m] = perplexity(model, protocol, windows=windows).perplexity
        out[label] = row
    return out


def one_shot_rows(reference: torch.nn.Module, calibration: torch.Tensor, *,
                  patterns: Sequence[str] = ("1:4", "2:8"),
                  methods: Sequence[str] = ("wanda", "sparsegpt"),
                  protocol: EvalProtocol = PROTOCOL, windows: torch.Tensor | None = None
                  ) -> list[dict]:
    """Pruning-only perplexity with one-shot calibration (every layer on the fp32 model)."""
    rows = []
    for pattern in patterns:
        for method in methods:
            model = compress(Config(method, pattern, 16), reference, calibration,
                             sequential=False)[0]
            rows.append({"method": method, "pattern": pattern, "sequential": False,
                         "perplexity": perplexity(model, protocol,
                                                  windows=windows).perplexity})
    return rows


def format_investigation(inv: dict) -> str:
    """Markdown tables of :func:`investigate`'s sections."""
    n = inv["significance"][0].get("windows", 128) if inv["significance"] else 0
    lines = [f"Paired per-window NLL differences (b - a; {n} windows):", "",
             "| a | b | ppl a | ppl b | delta NLL (b - a) | SE | z |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in inv["significance"]:
        lines.append(f"| {r['a']} | {r['b']} | {r['ppl_a']:.4f} | {r['ppl_b']:.4f} | "
                     f"{r['delta_nll']:+.4f} | {r['se']:.4f} | {r['z']:+.1f} |")
    lines += ["", "Input feature norms ||X_j|| (mean over the blocks):", "",
              "| layer input | max / median | std / mean |", "|---|---:|---:|"]
    for k, v in inv["feature_norms"].items():
        lines.append(f"| {k} | {v['max_over_median']:.2f} | {v['cv']:.2f} |")
    for pattern, kinds in inv["layer_error"].items():
        lines += ["", f"Relative layer output error at {pattern} (one-shot, mean over blocks):",
                  "", "| layers | magnitude | wanda | sparsegpt | wanda/magnitude mask agreement |",
                  "|---|---:|---:|---:|---:|"]
        for k, v in kinds.items():
            lines.append(f"| {k} | {v['magnitude']:.4f} | {v['wanda']:.4f} | "
                         f"{v['sparsegpt']:.4f} | {v['mask_agreement']:.3f} |")
    lines += ["", "Perplexity with some layer kinds pruned 1:4 (one-shot masks):", "",
              "| pruned layers | magnitude | wanda |", "|---|---:|---:|"]
    for k, v in inv["sensitivity_1:4"].items():
        lines.append(f"| {k} | {v['magnitude']:.4f} | {v['wanda']:.4f} |")
    lines += ["", "2:4 pruning (fp16 weights) across calibration settings:", "",
              "| method | calib seqs | seed | sequential | perplexity |",
              "|---|---:|---:|---|---:|"]
    for r in inv["calibration"]:
        lines.append(f"| {r['method']} | {r['calib_samples']} | {r['seed']} | "
                     f"{r['sequential']} | {r['perplexity']:.4f} |")
    lines += ["", "SparseGPT 2:4 + W4 g128, joint vs float-then-RTN:", "",
              "| method | calib seqs | percdamp | perplexity | KL | top-1 |",
              "|---|---:|---:|---:|---:|---:|"]
    for r in inv["sparsegpt_quant"]:
        lines.append(f"| {r['method']} | {r['calib_samples']} | {r['percdamp']} | "
                     f"{r['perplexity']:.4f} | {r['kl']:.4f} | {r['top1_agreement']:.4f} |")
    lines += ["", "Pruning only (fp16 weights), one-shot calibration on the fp32 model:", "",
              "| method | pattern | perplexity |", "|---|---|---:|"]
    for r in inv.get("one_shot", []):
        lines.append(f"| {r['method']} | {r['pattern']} | {r['perplexity']:.4f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------------- CLI
def _auto_int(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def model_defaults(name: str) -> dict:
    """The ``auto`` settings of a model (:data:`MODEL_DEFAULTS`)."""
    return MODEL_DEFAULTS.get(name, MODEL_DEFAULTS["other"])


def eval_protocol(src: ModelSource, seq_len: int, max_tokens: int, domain: str = CODE
                  ) -> EvalProtocol:
    """The evaluation protocol of a model: ``max_tokens`` of the test split of ``domain`` in
    windows of ``seq_len``; batches of at most :data:`MAX_BATCH_LOGITS` logits (16 windows at
    most)."""
    vocab = src.model.config.vocab_size
    batch = max(1, min(PROTOCOL.batch_size, MAX_BATCH_LOGITS // (seq_len * vocab)))
    return EvalProtocol("test", seq_len, max_tokens, batch, domain)


#: What a run replaces in the records file: the records of its model, corpora and tie rule,
#: with the value a record without the field was measured with.
RUN_KEYS = {"model": "reference", "calib_corpus": CODE, "eval_corpus": CODE,
            "nm_ties": TIE_RULES[0]}


def run_key(record: dict) -> tuple:
    """The :data:`RUN_KEYS` of a record (missing fields: their defaults)."""
    return tuple(record.get(k, v) for k, v in RUN_KEYS.items())


def merge_records(path: Path | list, key: tuple, records: Sequence[dict]) -> list[dict]:
    """The records of ``path`` (a file, or the records themselves) with those of run ``key``
    (:func:`run_key`) replaced by ``records`` (records without a ``model`` field are the
    reference model's); the reference model first, then the others in the order they first
    appear."""
    if isinstance(path, list):
        old = path
    else:
        old = json.loads(path.read_text()) if path.is_file() else []
    if not isinstance(old, list):  # e.g. an --investigate dump: nothing to keep
        old = []
    kept = [r for r in old if isinstance(r, dict) and run_key(r) != key]
    for r in kept:
        r.setdefault("model", "reference")
    merged = kept + list(records)
    order = ["reference"] + list(dict.fromkeys(r["model"] for r in merged))
    return sorted(merged, key=lambda r: order.index(r["model"]))  # stable within a model


def _plot_path(model: str, record: bool = False, calib: str = CODE, domain: str = CODE
               ) -> Path:
    """``accuracy[_<model>][_<corpora>].png``: ``_prose`` calibrated and evaluated on prose,
    ``_<calib>_on_<domain>`` for other mixes (``+`` written ``-``), nothing for code."""
    img = recorded(IMG) if record else IMG
    name = "accuracy"
    if model != "reference":
        name += f"_{re.sub(r'[^A-Za-z0-9]+', '_', Path(model).stem).strip('_')}"
    if (calib, domain) != (CODE, CODE):
        name += f"_{domain}" if calib == domain else f"_{calib.replace('+', '-')}_on_{domain}"
    return img / f"{name}.png"


def replot(model: str, out: Path, path: Path | str = "auto", record: bool = False,
           calib: str = CODE, domain: str = CODE) -> int:
    """Redraw the plot of ``model``'s records on these corpora in ``out`` (no model is
    loaded)."""
    key = (model, calib, domain, TIE_RULES[0])
    records = [r for r in (json.loads(out.read_text()) if out.is_file() else [])
               if run_key(r) == key]
    if not records:
        print(f"bench.accuracy: no {model} records calibrated on {calib}, evaluated on "
              f"{domain}, in {out}", file=sys.stderr)
        return 2
    auto = model_defaults(model)
    path = _plot_path(model, record, calib, domain) if str(path) == "auto" else Path(path)
    print(f"wrote {plot(records, path, _title(model, calib, domain), auto['zoom'])}")
    return 0


def _title(model: str, calib: str = CODE, domain: str = CODE) -> str:
    title = model_defaults(model).get("title", "Reference model" if model == "reference"
                                      else model)
    if (calib, domain) != (CODE, CODE):
        title += f", calibrated on {calib}, evaluated on {domain}"
    return title


def _domains(text: str) -> tuple[str, ...]:
    out = tuple(dict.fromkeys(d.strip() for d in text.split(",")))
    bad = [d for d in out if d not in DOMAINS]
    if bad:
        raise argparse.ArgumentTypeError(f"unknown text domain {bad[0]!r}; expected a "
                                         f"comma-separated list of {', '.join(DOMAINS)}")
    return out


def _auto_patterns(text: str) -> tuple[str, ...] | str:
    if text == "auto":
        return text
    if "dense" in (out := patterns(text)):
        raise argparse.ArgumentTypeError("'dense' is not a pruning pattern (the dense rows "
                                         "always run)")
    return out


@command("bench.accuracy")
def main(argv: list[str] | None = None) -> int:
    ap = parser("python -m bench.accuracy", __doc__)
    ap.add_argument("--model", default="reference",
                    help="model to compress: 'reference', 'smollm2', a Hugging Face directory or "
                         "a LLaMA .gguf file (anything sw.models.source.open_model accepts)")
    add_tokenizer_option(ap)
    ap.add_argument("--calib-samples", type=_auto_int, default="auto",
                    help="calibration sequences, random windows of the train split ('auto': "
                         "64 for the reference model, 32 for any other)")
    ap.add_argument("--calib-seq-len", type=_auto_int, default="auto",
                    help="tokens per calibration sequence ('auto': 256 for the reference "
                         "model, 128 for any other)")
    ap.add_argument("--seed", type=int, default=0, help="calibration sample seed")
    ap.add_argument("--domain", type=_domains, default=CODE,
                    help="evaluation text: the test split of 'code' (the CPython standard "
                         "library) or 'prose' (the Lee corpus of English news articles; "
                         "`make setup` installs it); 'code,prose' evaluates every compressed "
                         "model on both (one record each)")
    ap.add_argument("--calib-domain", default=CODE, choices=CALIBRATION_SETS,
                    help="calibration text: the train split of 'code', 'prose' or both "
                         "('code+prose': half the sequences from each)")
    ap.add_argument("--ties", default=TIE_RULES[0], choices=TIE_RULES,
                    help="which of equal N:M scores a block keeps: the 'lower' in-block index "
                         "(the rule of sw.compress.prune) or, to measure the rule's effect, "
                         "the 'higher'")
    ap.add_argument("--eval-tokens", type=_auto_int, default="auto",
                    help="test-split tokens scored ('auto': 32768 for the reference model, "
                         "8192 for any other)")
    ap.add_argument("--eval-seq-len", type=positive_int, default=PROTOCOL.seq_len,
                    help="tokens per evaluation window (at most the model's context)")
    ap.add_argument("--patterns", type=_auto_patterns, default="auto",
                    help="comma-separated N:M patterns of the pruning-only rows ('auto': "
                         "2:4,4:8,1:4,2:8 for the reference model, 2:4,4:8 for any other)")
    ap.add_argument("--group", type=nonnegative_int, default=128,
                    help="quantisation group along K, 0 = whole row")
    ap.add_argument("--threads", type=positive_int, default=2, help="torch CPU threads")
    ap.add_argument("--only", default=None,
                    help="regex over row labels (e.g. '2:4'); fp32 always runs")
    ap.add_argument("--one-shot", action="store_true",
                    help="calibrate every layer on the fp32 model (not sequentially)")
    ap.add_argument("--percdamp", type=nonnegative_float, default=None,
                    help="GPTQ/SparseGPT dampening (None: theirs, 0.01)")
    ap.add_argument("--act-order", action="store_true", help="GPTQ activation order")
    ap.add_argument("--no-hardware", action="store_true",
                    help="skip the rows with the accelerator's exact W4A8 numerics")
    ap.add_argument("--kv-cache", action="store_true",
                    help="the hardware rows are the KV-cache study: the fp32 model and the best "
                         "2:4 and dense GPTQ rows with float attention, the INT8 and the INT4 KV "
                         "cache (no vector-unit rows, no plot); the records go to "
                         "accuracy_kv.json beside the default --out")
    ap.add_argument("--lm-head", action="store_true",
                    help="measure the LM head's compression (host, int8, int4) on the "
                         "model's default recipe instead, into accuracy_head.json beside the "
                         "default --out (default: off)")
    ap.add_argument("--investigate", action="store_true",
                    help="print the evidence tables of docs/accuracy.md (section "
                         "'Investigation') instead of running the rows")
    ap.add_argument("--out", type=Path, default=RESULTS / "accuracy.json",
                    help="results JSON (the other models' records in it are kept)")
    ap.add_argument("--plot", type=Path, default="auto",
                    help=f"the plot ('auto': {IMG.relative_to(ROOT)}/accuracy.png for the "
                         "reference model, accuracy_<model>.png for any other; with --record "
                         "docs/img/)")
    ap.add_argument("--no-plot", action="store_true", help="do not draw the plot")
    ap.add_argument("--replot", action="store_true",
                    help="only redraw the plot of --model from the records in --out")
    args = ap.parse_args(argv)
    try:  # every option checked before the model loads
        WeightFormat(NMPattern.parse("dense"), 4, args.group)
    except ValueError as e:
        ap.error(f"argument --group: {e}")
    if args.only:
        try:
            re.compile(args.only)
        except re.error as e:
            ap.error(f"argument --only: {args.only!r} is not a regular expression ({e})")
    if isinstance(args.domain, str):  # the default
        args.domain = _domains(args.domain)
    if args.lm_head:
        args.no_plot = True
        if args.out in (RESULTS / "accuracy.json", recorded(RESULTS / "accuracy.json")):
            args.out = args.out.with_name("accuracy_head.json")
    if args.kv_cache:
        args.no_plot = True
        if args.out in (RESULTS / "accuracy.json", recorded(RESULTS / "accuracy.json")):
            args.out = args.out.with_name("accuracy_kv.json")
    if args.replot:
        if len(args.domain) > 1:
            ap.error("argument --domain: --replot draws one domain's records")
        return replot(args.model, args.out, args.plot, args.record, args.calib_domain,
                      args.domain[0])

    torch.set_num_threads(args.threads)
    t_load = time.perf_counter()
    try:
        src = open_model(args.model, tokenizer=args.tokenizer)
    except ModelSourceError as e:
        print(f"bench.accuracy: {e}", file=sys.stderr)
        return 2
    t_load = time.perf_counter() - t_load
    auto = model_defaults(src.name)
    args.calib_samples = args.calib_samples or auto["calib_samples"]
    args.calib_seq_len = args.calib_seq_len or auto["calib_seq_len"]
    context = src.model.config.max_position_embeddings
    for opt, value in (("--eval-seq-len", args.eval_seq_len),
                       ("--calib-seq-len", args.calib_seq_len)):
        if value > context:
            ap.error(f"{opt} {value} exceeds the model's context of {context} positions")
    eval_tokens = args.eval_tokens or auto["eval_tokens"]
    patterns = auto["patterns"] if args.patterns == "auto" else args.patterns
    reference = src.model
    tied = reference.lm_head.weight is reference.model.embed_tokens.weight
    configs = default_configs(args.group, patterns)
    if args.only:
        pat = re.compile(args.only)
        configs = [c for c in configs if c.method == "fp32" or pat.search(c.label)]
    kwargs = {}
    if args.percdamp is not None:
        kwargs["percdamp"] = args.percdamp
    if args.act_order:
        kwargs["act_order"] = True
    try:
        calibration = src.calibration(args.calib_samples, args.calib_seq_len, args.seed,
                                      args.calib_domain)
        evals = []
        for domain in args.domain:
            prot = eval_protocol(src, args.eval_seq_len, eval_tokens, domain)
            evals.append((prot, src.windows(prot.split, prot.seq_len, prot.max_tokens,
                                            domain)))
    except ModelSourceError as e:
        print(f"bench.accuracy: {e}", file=sys.stderr)
        return 2
    (protocol, windows), also = evals[0], evals[1:]
    n_eval = windows.shape[0] * protocol.seq_len
    settings = (f"model {src.name}: {src.note}\n"
                f"calibration {args.calib_samples} x {args.calib_seq_len} = {calibration.numel()}"
                f" train-split tokens (seed {args.seed}) of {args.calib_domain}; eval {n_eval} "
                f"test-split tokens in {windows.shape[0]} windows of {protocol.seq_len} of "
                f"{' and of '.join(args.domain)}; N:M ties keep the {args.ties} index "
                f"({magnitude_ties(reference):.1%} of the 4-blocks of |W| tie at the 2:4 "
                "boundary); head "
                "(lm_head) in float" + (" (tied to the embedding)" if tied else ""))
    if args.lm_head:
        t0 = time.perf_counter()
        records = head_records(reference, src.name, calibration, protocol, windows)
        total = time.perf_counter() - t0
        for r in records:
            r.update(eval_corpus=protocol.corpus, calib_corpus=args.calib_domain,
                     calib_tokens=int(calibration.numel()), calib_seed=args.seed,
                     tied_embeddings=tied, benchmark_seconds=total)
            print(f"lm_head {r['lm_head']:<5} ({r['head_format'] or 'float, host'}): "
                  f"perplexity {r['perplexity']:.4f} ({r['relative_to_host']:+.3%} vs host), "
                  f"top-1 agreement {r['top1_agreement']:.2%}")
        print(f"\n{settings.rsplit('; head', 1)[0]}\ntotal {total:.0f} s")
        write_json(args.out, merge_records(args.out, run_key(records[0]),
                                           stamp(records, None)))
        print(f"wrote {args.out} ({src.name} records replaced)")
        return 0
    if args.investigate:
        print(settings)
        t0 = time.perf_counter()
        with tie_rule(args.ties):
            inv = investigate(reference, calibration, protocol=protocol, windows=windows,
                              sample=lambda n, seq, seed: src.calibration(n, seq, seed,
                                                                          args.calib_domain))
        print(format_investigation(inv))
        print(f"\ninvestigation took {time.perf_counter() - t0:.0f} s on {args.threads} threads")
        if args.out not in (RESULTS / "accuracy.json", recorded(RESULTS / "accuracy.json")):
            write_json(args.out, stamp(inv, None))
        return 0
    extra = {"model": src.name, "calib_samples": args.calib_samples,
             "calib_seq_len": args.calib_seq_len, "calib_tokens": int(calibration.numel()),
             "calib_seed": args.seed, "calib_corpus": args.calib_domain,
             "nm_ties": args.ties, "magnitude_ties_2_4": magnitude_ties(reference),
             "threads": args.threads,
             "percdamp": kwargs.get("percdamp", 0.01), "act_order": args.act_order,
             "model_note": src.note, "tied_embeddings": tied}
    t0, cpu0 = time.perf_counter(), time.process_time()
    with tie_rule(args.ties):
        records = build_records(reference, configs, calibration, protocol,
                                hardware=not args.no_hardware, sequential=not args.one_shot,
                                extra=extra, windows=windows, also=also,
                                kv_cache=args.kv_cache, **kwargs)
    total, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    for r in records:
        r.update(benchmark_seconds=total, benchmark_cpu_seconds=cpu, load_seconds=t_load,
                 load_average_end=list(load))
    print(format_table(records))
    if not args.no_hardware and not args.kv_cache:
        print(f"\noperand magnitudes of the vector unit (fp32 model, first "
              f"{protocol.batch_size} evaluation windows of {protocol.corpus}):")
        for kind, r in activation_ranges(reference, windows, protocol.batch_size).items():
            print(f"  {kind:<30} max |x| {r['max']:10.4g}  median {r['median']:10.4g}  "
                  f"saturated {r['saturated']:.2%}")
    for c in vector_cost(records):
        print(f"vector unit numerics ({c['method']} {c['pattern']}, {c['eval_corpus']}): "
              f"perplexity {c['perplexity_vector']:.4f} vs {c['perplexity_float_host']:.4f} "
              f"with float host ops, {c['relative']:+.3%} relative")
    for c in kv_cost(records):
        f = "n/a" if c["perplexity_float_attention"] is None else \
            f"{c['perplexity_float_attention']:.4f}"
        print(f"KV cache ({c['method']} {c['pattern']}, {c['linears']} linears, "
              f"{c['eval_corpus']}): perplexity float attention {f}, INT8 "
              f"{c['perplexity_int8_kv']:.4f}, INT4 {c['perplexity_int4_kv']:.4f}: INT4 "
              f"{c['int4_vs_int8']:+.3%} vs INT8")
    print(f"\n{settings}\ntotal {total:.0f} s on {args.threads} threads (+{t_load:.0f} s "
          f"loading the model); {cpu:.0f} s of CPU time, load average at the end "
          f"{load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f} (1 / 5 / 15 min)")
    # no accelerator configuration is measured: the hardware rows use the fixed W4A8
    # numerics (hw.numerics), the same on every array
    stamp(records, None)
    merged = args.out
    for domain in args.domain:
        mine = [r for r in records if r["eval_corpus"] == domain]
        merged = merge_records(merged, run_key(mine[0]), mine)
    write_json(args.out, merged)
    print(f"wrote {args.out} ({src.name} records calibrated on {args.calib_domain}, evaluated "
          f"on {', '.join(args.domain)}, ties {args.ties}, replaced)")
    # one plot per domain ('auto'), or the first domain's in --plot
    for domain in () if args.no_plot else args.domain if str(args.plot) == "auto" \
            else args.domain[:1]:
        path = (_plot_path(src.name, args.record, args.calib_domain, domain)
                if str(args.plot) == "auto" else args.plot)
        title = _title(src.name, args.calib_domain, domain)
        mine = [r for r in records if r["eval_corpus"] == domain]
        print(f"wrote {plot(mine, path, title, auto['zoom'])}")
    bad = [r["method"] for r in records if not math.isfinite(r["perplexity"])]
    if bad:
        print(f"non-finite perplexity: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
