"""Compress a whole :class:`~sw.models.llama.LlamaLM` and run it with float or hardware numerics.

Three entry points:

* :func:`compress_llama` -- N:M + INT4/INT8 group quantisation of every selected linear layer
  (:data:`COMPRESS_METHODS`: RTN, GPTQ, magnitude / Wanda / SparseGPT masks, their
  combinations). A thin layer over :func:`sw.compress.calibrate.compress_model`: the
  dequantised weights are written back into the float model (so the model then computes with
  exactly the weights the hardware stores) and the :class:`~hw.format.QuantizedWeight` of every
  layer is returned.
* :func:`prune_llama` -- N:M pruning only (magnitude, Wanda, SparseGPT), the kept weights left in
  float (optionally rounded to FP16), for the pruning-only rows of accuracy studies.
* :class:`HardwareLinear` / :func:`use_hardware_numerics` -- replace compressed ``nn.Linear``
  layers by modules that compute exactly what the accelerator computes
  (:func:`hw.numerics.golden_linear_torch`: per-token INT8 activations, integer weights, exact
  integer accumulation, float32 epilogue ``acc * row_scale * act_scale``).

Calibration is layer-wise, as in the reference SparseGPT / GPTQ drivers: the calibration tokens
are embedded once, then decoder block by decoder block the block's linear layers are calibrated
on the block's input hidden states, in the groups that share an input (``q/k/v``, ``o``,
``gate/up``, ``down``), each group on the block with the earlier groups already compressed; the
compressed block's output is the next block's input. Each block therefore runs a few times on the
cached hidden states instead of the whole model once per layer group. ``sequential=False``
instead calibrates every layer once on the original model (one forward pass).

>>> import torch
>>> from hw.format import WeightFormat
>>> from sw.models import LlamaConfig, LlamaLM
>>> torch.manual_seed(0) and None
>>> lm = LlamaLM(LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
...                          num_attention_heads=2, num_key_value_heads=1))
>>> ws = compress_llama(lm, WeightFormat("2:4", bits=4, group=32), "magnitude", progress=False)
>>> sorted(ws)[:2]
['model.layers.0.mlp.down_proj', 'model.layers.0.mlp.gate_proj']
>>> _ = use_hardware_numerics(lm, ws)
>>> type(lm.model.layers[0].mlp.down_proj).__name__
'HardwareLinear'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from hw.config import NMPattern
from hw.format import QuantizedWeight, WeightFormat
from hw.numerics import golden_linear_torch
from sw.compress.attention import HardwareAttentionProducts
from sw.compress.calibrate import (
    MIN_TOKENS,
    CalibrationError,
    Calibrator,
    LayerStats,
    collect_stats,
    compress_model,
    eval_mode,
)
from sw.compress.prune import nm_mask
from sw.compress.sparsegpt import sparsegpt_prune
from sw.compress.vector import use_vector_numerics
from sw.compress.wanda import wanda_mask
from sw.models.llama import AttentionProducts, LlamaLM

__all__ = ["COMPRESS_METHODS", "PRUNE_METHODS", "BLOCK_GROUPS", "compress_llama", "prune_llama",
           "HardwareLinear", "use_hardware_numerics", "selected_linears", "calibrates",
           "untie_head"]

#: Methods of :func:`compress_llama`: name -> (``compress_model`` method, fixed options).
#: ``rtn`` / ``magnitude`` / ``magnitude+rtn`` round to nearest (with the magnitude mask on a
#: sparse format); ``gptq`` / ``magnitude+gptq`` run GPTQ (magnitude mask on a sparse format);
#: ``wanda`` / ``wanda+rtn`` round the Wanda-masked weights; ``wanda+gptq`` runs GPTQ under the
#: Wanda mask; ``sparsegpt+rtn`` prunes with SparseGPT's float reconstruction then rounds;
#: ``sparsegpt`` / ``sparsegpt+gptq`` / ``sparsegpt-joint`` quantise inside the SparseGPT sweep
#: (its joint mode: mask choice, pruning and rounding errors all compensated).
COMPRESS_METHODS: dict[str, tuple[str, dict]] = {
    "rtn": ("magnitude", {}),
    "magnitude": ("magnitude", {}),
    "magnitude+rtn": ("magnitude", {}),
    "wanda": ("wanda", {}),
    "wanda+rtn": ("wanda", {}),
    "gptq": ("gptq", {}),
    "magnitude+gptq": ("gptq", {}),
    "wanda+gptq": ("wanda+gptq", {}),
    "sparsegpt": ("sparsegpt", {"joint": True}),
    "sparsegpt+gptq": ("sparsegpt", {"joint": True}),
    "sparsegpt-joint": ("sparsegpt", {"joint": True}),
    "sparsegpt+rtn": ("sparsegpt", {"joint": False}),
}

def calibrates(method: str) -> bool:
    """Whether the :data:`COMPRESS_METHODS` ``method`` reads calibration data (all but those
    that round the magnitude-masked weights to nearest)."""
    return COMPRESS_METHODS[method][0] != "magnitude"


#: Methods of :func:`prune_llama` and whether they need (norms, Hessian).
PRUNE_METHODS: dict[str, tuple[bool, bool]] = {
    "magnitude": (False, False),
    "wanda": (True, False),
    "sparsegpt": (False, True),
}

#: Linear layers of one decoder block in calibration order, grouped by shared input.
BLOCK_GROUPS: tuple[tuple[str, ...], ...] = (
    ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    ("self_attn.o_proj",),
    ("mlp.gate_proj", "mlp.up_proj"),
    ("mlp.down_proj",),
)

Calibration = torch.Tensor | Sequence[torch.Tensor] | None


# ---------------------------------------------------------------------- selection
def _skipped(name: str, skip: Iterable[str]) -> bool:
    return any(name == s or name.endswith("." + s) for s in skip)


def selected_linears(model: LlamaLM, skip: Iterable[str] = ("lm_head",)) -> dict[str, nn.Linear]:
    """The ``nn.Linear`` layers of ``model`` that compression touches, in module order.

    Parameters
    ----------
    model : LlamaLM
        The model.
    skip : iterable of str
        Layer names, or name suffixes after a dot (``"down_proj"`` skips every block's
        ``mlp.down_proj``), left in float.

    Returns
    -------
    dict
        ``{qualified name: module}``.

    Raises
    ------
    ValueError
        ``lm_head`` is selected but tied to the input embedding (compressing it would change
        the embedding too).
    """
    skip = tuple(skip)
    out = {name: mod for name, mod in model.named_modules()
           if isinstance(mod, nn.Linear) and not _skipped(name, skip)}
    if "lm_head" in out and model.lm_head.weight is model.model.embed_tokens.weight:
        raise ValueError("lm_head is tied to the input embedding: compressing it would change "
                         "the embedding too; keep 'lm_head' in skip")
    return out


def _as_batches(calibration: Calibration, batch_size: int) -> list[torch.Tensor]:
    if calibration is None:
        return []
    if isinstance(calibration, torch.Tensor):
        if calibration.ndim != 2 or calibration.dtype != torch.int64:
            raise ValueError(f"calibration tokens must be int64 [N, L], got "
                             f"{calibration.dtype} {tuple(calibration.shape)}")
        return list(calibration.split(batch_size))
    batches = list(calibration)
    for b in batches:
        if not isinstance(b, torch.Tensor) or b.ndim != 2 or b.dtype != torch.int64:
            raise ValueError("calibration batches must be int64 [B, L] token tensors")
    return batches


# ---------------------------------------------------------------------- layer-wise driver
def _layerwise(model: LlamaLM, batches: list[torch.Tensor], selected: dict[str, nn.Linear],
               compress_block: Callable[[nn.Module, str, list[list[str]], list, Callable], dict],
               desc: str, progress: bool) -> dict:
    """Run ``compress_block(module, prefix, groups, inputs, forward)`` block by block.

    ``inputs`` are the module's cached input tensors (from the already compressed blocks
    before it); ``forward(module, x)`` runs the module on one of them.
    """
    out: dict = {}
    core = model.model
    with torch.no_grad():
        hidden = [core.embed_tokens(b) for b in batches]
    bar = tqdm(total=len(core.layers) + 1, desc=desc, disable=not progress, leave=False)
    try:
        for i, layer in enumerate(core.layers):
            prefix = f"model.layers.{i}."

            def forward(mod, x, i=i):
                t = x.shape[1]
                cos, sin, mask = model.positions(0, t, 0, x.dtype)
                return mod(x, cos, sin, mask, None, i, 0)

            groups = [[n for n in g if prefix + n in selected] for g in BLOCK_GROUPS]
            groups = [g for g in groups if g]
            if groups:
                got = compress_block(layer, prefix, groups, hidden, forward)
                out.update({prefix + n: v for n, v in got.items()})
            if i + 1 < len(core.layers) or "lm_head" in selected:
                with torch.no_grad():
                    hidden = [forward(layer, h) for h in hidden]
            bar.update()
        if "lm_head" in selected:
            head = nn.ModuleDict({"lm_head": model.lm_head})
            with torch.no_grad():
                normed = [core.norm(h) for h in hidden]
            got = compress_block(head, "", [["lm_head"]], normed,
                                 lambda mod, x: mod["lm_head"](x))
            out.update(got)
        bar.update()
    finally:
        bar.close()
    order = list(selected)
    return dict(sorted(out.items(), key=lambda kv: order.index(kv[0])))


def untie_head(model: LlamaLM) -> LlamaLM:
    """Give ``model``'s LM head a weight of its own (a copy of the embedding when they are
    tied, and ``tie_word_embeddings`` off), so compressing the head leaves the embedding
    float; returns ``model``, changed in place.

    >>> from sw.models import LlamaConfig
    >>> m = untie_head(LlamaLM(LlamaConfig(vocab_size=8, hidden_size=4, intermediate_size=8,
    ...     num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
    ...     tie_word_embeddings=True)))
    >>> m.lm_head.weight is m.model.embed_tokens.weight, m.config.tie_word_embeddings
    (False, False)
    """
    if model.lm_head.weight is model.model.embed_tokens.weight:
        model.lm_head.weight = nn.Parameter(model.lm_head.weight.detach().clone())
    model.config = dataclasses.replace(model.config, tie_word_embeddings=False)
    return model


# ---------------------------------------------------------------------- compression
def compress_llama(model: LlamaLM, fmt: WeightFormat | Callable[[str, nn.Linear],
                                                                 WeightFormat | None],
                   method: str = "sparsegpt+gptq", calibration: Calibration = None, *,
                   skip: Iterable[str] = ("lm_head",), sequential: bool = True,
                   batch_size: int = 16, min_tokens: int = MIN_TOKENS, progress: bool = True,
                   **method_kwargs) -> dict[str, QuantizedWeight]:
    """Compress the linear layers of a LLaMA model in place; return their packed form.

    Parameters
    ----------
    model : LlamaLM
        Float model; its selected linear weights are replaced by the dequantised compressed
        weights (the exact real values the hardware format stands for).
    fmt : WeightFormat or callable
        Target format of every layer, or ``fmt(name, module)`` returning one (None: leave the
        layer in float). ``name`` is the qualified module name.
    method : str
        One of :data:`COMPRESS_METHODS`.
    calibration : torch.Tensor or sequence of torch.Tensor, optional
        int64 token ids ``[N, L]`` (cut into batches of ``batch_size``) or a list of
        ``[B, L]`` batches, e.g. :func:`sw.models.eval.calibration_samples`. Needed by every
        method except RTN / magnitude.
    skip : iterable of str
        Layers left in float (see :func:`selected_linears`); the head by default, as in the
        GPTQ / SparseGPT / Wanda papers.
    sequential : bool
        Layer-wise calibration on the partially compressed model (see the module docstring);
        else every layer is calibrated once on the original model.
    batch_size : int
        Sequences per calibration batch when ``calibration`` is a tensor.
    min_tokens : int
        Least calibration tokens every layer must see.
    progress : bool
        Show progress bars.
    **method_kwargs
        Passed to GPTQ / SparseGPT (``percdamp``, ``blocksize``, ``act_order``, ...).

    Returns
    -------
    dict
        ``{qualified layer name: QuantizedWeight}`` in module order.

    Raises
    ------
    ValueError
        Unknown method, bad calibration tokens, a tied head selected.
    CalibrationError
        A method that needs calibration got none (or too little).
    """
    if method not in COMPRESS_METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {sorted(COMPRESS_METHODS)}")
    base, fixed = COMPRESS_METHODS[method]
    if base == "sparsegpt" and isinstance(fmt, WeightFormat) and fmt.pattern.dense:
        # nothing to prune: the joint sweep is GPTQ, the float one plain rounding
        base, fixed = ("gptq", {}) if fixed["joint"] else ("magnitude", {})
    kwargs = {**fixed, **method_kwargs}
    if base in ("magnitude", "wanda") and method_kwargs:
        raise TypeError(f"method {method!r} takes no options, got {sorted(method_kwargs)}")
    if base not in ("sparsegpt",):
        kwargs.pop("joint", None)
    selected = selected_linears(model, skip)
    if not selected:
        raise ValueError("no linear layers selected (check skip)")
    batches = _as_batches(calibration, batch_size)
    needs_data = base != "magnitude"
    if needs_data and not batches:
        raise CalibrationError(f"method {method!r} needs calibration tokens")

    def fmt_of(prefix: str):
        def f(name: str, mod: nn.Linear):
            return fmt(prefix + name, mod) if callable(fmt) else fmt
        return f

    with eval_mode(model):
        if not needs_data:  # no statistics: every layer on its own
            return compress_model(model, None, fmt_of(""), base, layers=list(selected),
                                  progress=progress, **kwargs)
        if not sequential:
            return compress_model(model, batches, fmt_of(""), base, layers=list(selected),
                                  sequential=False, min_tokens=min_tokens, progress=progress,
                                  **kwargs)

        def block(module, prefix, groups, inputs, forward):
            f = fmt_of(prefix)
            # a layer whose format is None is left out of the groups (compress_model skips it)
            groups = [[n for n in g if f(n, module.get_submodule(n)) is not None]
                      for g in groups]
            groups = [g for g in groups if g]
            if not groups:
                return {}
            return compress_model(module, inputs, f, base,
                                  layers=[n for g in groups for n in g], groups=groups,
                                  forward=forward, min_tokens=min_tokens, progress=False,
                                  **kwargs)

        return _layerwise(model, batches, selected, block, f"compress ({method})", progress)


def _prune_weight(method: str, w: torch.Tensor, st: LayerStats | None, pattern: NMPattern,
                  kwargs: dict, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Prune one float weight ``[n, k]``; returns the new weights and the kept mask."""
    wn = w.detach().to("cpu", torch.float32).numpy()
    n, k = wn.shape
    kp = -(-k // pattern.m) * pattern.m
    if method == "sparsegpt":
        return sparsegpt_prune(wn, st.hessian, pattern, name=name, **kwargs)
    padded = np.zeros((n, kp), np.float32)
    padded[:, :k] = wn
    if method == "magnitude":
        mask = nm_mask(np.abs(padded), pattern)[:, :k]
    else:
        norms = np.zeros(kp)
        norms[:k] = st.x_norms.numpy()
        mask = wanda_mask(padded, norms, pattern, name=name)[:, :k]
    return np.where(mask, wn, np.float32(0)), mask


def prune_llama(model: LlamaLM, pattern: NMPattern | str, method: str = "sparsegpt",
                calibration: Calibration = None, *, skip: Iterable[str] = ("lm_head",),
                sequential: bool = True, weight_dtype: torch.dtype | None = torch.float16,
                batch_size: int = 16, min_tokens: int = MIN_TOKENS, progress: bool = True,
                **method_kwargs) -> dict[str, np.ndarray]:
    """N:M-prune the linear layers of a LLaMA model in place, keeping float weights.

    Parameters
    ----------
    model : LlamaLM
        Float model; its selected linear weights are replaced by the pruned ones.
    pattern : NMPattern or str
        Sparse N:M pattern along the input dimension (K is handled in whole M-blocks; a
        ragged tail block is pruned as if padded with zeros).
    method : str
        ``magnitude``, ``wanda`` (``|W| * ||X_j||``, no update) or ``sparsegpt`` (OBS
        reconstruction of the kept weights, :func:`sw.compress.sparsegpt.sparsegpt_prune`).
    calibration : torch.Tensor or sequence of torch.Tensor, optional
        As in :func:`compress_llama`; needed by Wanda and SparseGPT.
    skip, sequential, batch_size, min_tokens, progress
        As in :func:`compress_llama`.
    weight_dtype : torch.dtype or None
        Round the written-back weights through this dtype (default FP16, the storage format
        of an unquantised deployment); None keeps them exactly as computed.
    **method_kwargs
        Passed to :func:`~sw.compress.sparsegpt.sparsegpt_prune` (``percdamp``, ``blocksize``).

    Returns
    -------
    dict
        ``{qualified layer name: bool mask [n_out, k] of kept weights}`` in module order.
    """
    if method not in PRUNE_METHODS:
        raise ValueError(f"unknown pruning method {method!r}; choose one of "
                         f"{sorted(PRUNE_METHODS)}")
    p = NMPattern.parse(pattern)
    if p.dense:
        raise ValueError(f"pruning needs a sparse N:M pattern, got {p}")
    need_norms, need_h = PRUNE_METHODS[method]
    if method_kwargs and not need_h:
        raise TypeError(f"method {method!r} takes no options, got {sorted(method_kwargs)}")
    selected = selected_linears(model, skip)
    if not selected:
        raise ValueError("no linear layers selected (check skip)")
    batches = _as_batches(calibration, batch_size)
    if (need_norms or need_h) and not batches:
        raise CalibrationError(f"method {method!r} needs calibration tokens")

    def apply(module: nn.Module, names: Sequence[str], stats: dict, prefix: str) -> dict:
        masks = {}
        for name in names:
            lin = module.get_submodule(name)
            w, mask = _prune_weight(method, lin.weight, stats.get(name), p, method_kwargs,
                                    prefix + name)
            wt = torch.from_numpy(w)
            if weight_dtype is not None:
                wt = wt.to(weight_dtype)
            with torch.no_grad():
                lin.weight.copy_(wt.to(lin.weight.dtype))
            masks[name] = mask
        return masks

    with eval_mode(model):
        if not (need_norms or need_h):
            return apply(model, list(selected), {}, "")
        if not sequential:
            stats = collect_stats(model, batches, list(selected), hessian=need_h,
                                  min_tokens=min_tokens, progress=progress)
            return apply(model, list(selected), stats, "")

        def block(module, prefix, groups, inputs, forward):
            masks = {}
            for group in groups:
                with Calibrator(module, group, hessian=need_h, early_exit=True) as cal:
                    for x in inputs:
                        cal.run(x, forward)
                masks.update(apply(module, group, cal.finish(min_tokens), prefix))
            return masks

        return _layerwise(model, batches, selected, block, f"prune ({method} {p})", progress)


# ---------------------------------------------------------------------- hardware numerics
class HardwareLinear(nn.Module):
    """Drop-in replacement of a compressed ``nn.Linear`` computing with the datapath's numerics.

    ``y = golden_linear_torch(x, W_int, row_scale)``: per-token symmetric INT8 activations,
    the integer weights ``code * (q - zero)`` of the packed format (cut to the original K; the
    padding columns are zero), exact integer accumulation wrapped to ``acc_bits``, and the
    float32 WIDE epilogue ``float32(acc) * row_scale[n] * act_scale[t]``. Equal bit for bit to
    :func:`hw.numerics.golden_linear` on the same inputs. A bias (Qwen2's q/k/v) enters the
    accumulators as the WIDE_BIAS epilogue adds it (:func:`hw.numerics.bias_to_acc`).

    Parameters
    ----------
    qw : QuantizedWeight
        The compressed weight.
    acc_bits : int
        Accumulator width of the datapath.
    bias : torch.Tensor, optional
        The layer's float bias ``[out_features]``.
    vector : bool
        Requantise the activations as the vector unit does
        (:func:`hw.numerics.quantize_activations_vector_torch`).
    """

    def __init__(self, qw: QuantizedWeight, acc_bits: int = 32,
                 bias: torch.Tensor | None = None, vector: bool = False) -> None:
        super().__init__()
        self.vector = vector
        self.in_features = qw.k
        self.out_features = qw.n_out
        self.fmt = qw.fmt
        self.acc_bits = acc_bits
        w_int = np.ascontiguousarray(qw.int_weight()[:, : qw.k], dtype=np.int32)
        self.register_buffer("w_int", torch.from_numpy(w_int))
        self.register_buffer("row_scale", torch.from_numpy(qw.row_scale.astype(np.float32)))
        self.register_buffer("bias", None if bias is None else
                             bias.detach().to(torch.float32).clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[..., in_features]`` float -> ``[..., out_features]`` in ``x``'s dtype (with
        ``vector``: float64, the exact Q15.16 words of the vector unit's DEQUANT)."""
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input has {x.shape[-1]} features, layer expects "
                             f"{self.in_features}")
        y = golden_linear_torch(x, self.w_int, self.row_scale, self.acc_bits, self.bias,
                                self.vector)
        return y if self.vector else y.to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"pattern={self.fmt.pattern}, bits={self.fmt.bits}, group={self.fmt.group}, "
                f"acc_bits={self.acc_bits}" + (", vector=True" if self.vector else ""))


def use_hardware_numerics(model: nn.Module, weights: dict[str, QuantizedWeight],
                          acc_bits: int = 32, *, attention: bool = False,
                          vector: bool = False, kv_bits: int = 8) -> nn.Module:
    """Replace the named ``nn.Linear`` layers of ``model`` by :class:`HardwareLinear` (in place),
    and with ``attention`` every attention's products by the INT8 KV-cache numerics of
    :class:`sw.compress.attention.HardwareAttentionProducts`.

    With ``attention`` the model is the *model-level twin* of a compiled model: it computes
    exactly what the accelerator and its host compute (:mod:`sw.compile`). With ``vector``
    (which implies ``attention``) the host's work too is the vector unit's exact numerics
    (:mod:`sw.compress.vector`: RMSNorm, RoPE, softmax, SiLU-gate, residual additions, INT8
    requantisation), the twin of ``Runtime(..., vector=True)``.

    Parameters
    ----------
    model : nn.Module
        Model holding the layers (typically the model :func:`compress_llama` compressed, or a
        fresh float copy: only the replaced layers' weights matter).
    weights : dict
        ``{qualified name: QuantizedWeight}`` as returned by :func:`compress_llama`.
    acc_bits : int
        Accumulator width.
    attention : bool
        Also compute the attention products with INT8 keys, values, queries and probabilities.
    vector : bool
        Also compute the host ops with the vector unit's numerics.
    kv_bits : int
        Width of the cached keys and values in the attention products: 8 or 4 (the compiled
        model's ``CompileOptions.kv_bits``).

    Returns
    -------
    nn.Module
        ``model`` itself.

    Raises
    ------
    KeyError, TypeError, ValueError
        A name that is not a module, not an ``nn.Linear`` (or ``HardwareLinear``), or whose
        shape differs from the compressed weight's.
    """
    for name, qw in weights.items():
        parent_name, _, attr = name.rpartition(".")
        try:
            parent = model.get_submodule(parent_name) if parent_name else model
            mod = getattr(parent, attr)
        except AttributeError:
            raise KeyError(f"no module named {name!r} in {type(model).__name__}") from None
        if not isinstance(mod, (nn.Linear, HardwareLinear)):
            raise TypeError(f"{name!r} is a {type(mod).__name__}, not nn.Linear")
        if (mod.out_features, mod.in_features) != qw.shape:
            raise ValueError(f"{name}: layer is {(mod.out_features, mod.in_features)}, "
                             f"compressed weight is {qw.shape}")
        setattr(parent, attr, HardwareLinear(qw, acc_bits, mod.bias, vector))
    if attention or vector:
        for mod in list(model.modules()):
            p = getattr(mod, "products", None)
            if isinstance(p, AttentionProducts) and not isinstance(p, HardwareAttentionProducts):
                mod.products = HardwareAttentionProducts(p.num_heads, p.num_kv_heads,
                                                         p.head_dim, acc_bits, vector, kv_bits)
    if vector:
        use_vector_numerics(model)
    return model
