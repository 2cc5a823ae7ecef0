"""Calibration: per-layer input statistics of ``nn.Linear`` layers, and a model-level driver.

:class:`Calibrator` registers forward pre-hooks on selected ``nn.Linear`` layers of any torch
module. While calibration batches run through the model it accumulates, per layer, over every
token (all leading dimensions of the layer input are tokens):

* ``sq_norms[j] = sum_t x[t, j]^2`` -- Wanda's ``||X_j||_2^2``;
* ``xtx = sum_t x[t] x[t]^T`` -- giving the Hessian ``H = 2 X^T X / tokens`` of the layer-wise
  reconstruction loss, for SparseGPT and GPTQ.

Both are accumulated in float64 whatever the model dtype, so long calibration runs do not lose
the small contributions.

:func:`compress_model` compresses the selected layers of a model with one method
(``magnitude``, ``wanda``, ``sparsegpt``, ``gptq``, ``wanda+gptq``). In its default sequential
mode it calibrates one group of layers at a time on the model whose earlier layers are already
compressed (their dequantised weights written back), so each layer corrects for the error of
those before it, as the reference SparseGPT/GPTQ drivers do block by block. A forward pass stops
as soon as the current group's layers have seen their input, so the cost stays a fraction of
``groups`` full passes.

>>> import torch
>>> from torch import nn
>>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
>>> stats = collect_stats(net, [torch.randn(3, 5, 4)], min_tokens=1)
>>> sorted(stats), stats["2"].tokens, tuple(stats["2"].hessian.shape)
(['0', '2'], 15, (8, 8))
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from hw.format import QuantizedWeight, WeightFormat
from sw.compress.core import compress_matrix
from sw.compress.errors import CompressError
from sw.compress.gptq import gptq_compress
from sw.compress.sparsegpt import sparsegpt_compress
from sw.compress.wanda import wanda_compress, wanda_mask

__all__ = ["CalibrationError", "CalibrationWarning", "LayerStats", "Calibrator",
           "linear_layers", "collect_stats", "METHODS", "compress_model", "eval_mode"]

#: Default least number of calibration tokens every layer must see.
MIN_TOKENS = 16

#: Methods of :func:`compress_model` and whether they need (norms, Hessian).
METHODS: dict[str, tuple[bool, bool]] = {
    "magnitude": (False, False),
    "wanda": (True, False),
    "sparsegpt": (False, True),
    "gptq": (False, True),
    "wanda+gptq": (True, True),
}


class CalibrationError(CompressError):
    """Calibration could not produce usable statistics; the message names the layer."""


class CalibrationWarning(UserWarning):
    """Calibration statistics that work but are weak (fewer tokens than input features)."""


@dataclass
class LayerStats:
    """Input statistics of one ``nn.Linear`` layer.

    Attributes
    ----------
    name:
        Qualified module name.
    in_features:
        Input features ``k``.
    tokens:
        Input rows seen (all leading dimensions flattened).
    sq_norms:
        float64 ``[k]``: sum over tokens of ``x_j^2``.
    xtx:
        float64 ``[k, k]``: sum over tokens of ``x x^T`` (None if not collected).
    nonfinite:
        Non-finite input values seen (a usable layer has none).
    """

    name: str
    in_features: int
    tokens: int = 0
    sq_norms: torch.Tensor | None = None
    xtx: torch.Tensor | None = None
    nonfinite: int = 0

    def __post_init__(self):
        if self.sq_norms is None:
            self.sq_norms = torch.zeros(self.in_features, dtype=torch.float64)

    def update(self, x: torch.Tensor) -> None:
        """Accumulate a layer input ``[..., k]``."""
        x = x.detach().reshape(-1, self.in_features).to("cpu", torch.float64)
        self.nonfinite += int((~torch.isfinite(x)).sum())
        self.tokens += x.shape[0]
        self.sq_norms += (x * x).sum(dim=0)
        if self.xtx is not None:
            self.xtx.addmm_(x.T, x)

    @property
    def x_norms(self) -> torch.Tensor:
        """float64 ``[k]``: L2 norm of every input feature over the tokens (Wanda)."""
        return self.sq_norms.sqrt()

    @property
    def hessian(self) -> torch.Tensor:
        """float64 ``[k, k]``: ``H = 2 X^T X / tokens``."""
        if self.xtx is None:
            raise CalibrationError(f"{self.name}: the Hessian was not collected "
                                   f"(hessian=False)")
        if self.tokens == 0:
            raise CalibrationError(f"{self.name}: no calibration tokens reached this layer")
        return self.xtx * (2.0 / self.tokens)


def linear_layers(model: nn.Module, layers: Iterable[str] | Callable[[str, nn.Linear], bool]
                  | None = None) -> dict[str, nn.Linear]:
    """Select ``nn.Linear`` layers of ``model`` by name.

    Parameters
    ----------
    model:
        Any torch module.
    layers:
        Qualified names, or a predicate ``(name, module) -> bool``, or None: every
        ``nn.Linear`` whose weight is not shared with another module (a tied ``lm_head`` is
        left out, since writing it back would change the embedding too).

    Returns
    -------
    ``{name: module}`` in module order.
    """
    named = dict(model.named_modules())
    if layers is None or callable(layers):
        owners: dict[int, int] = {}
        for mod in named.values():
            for p in mod.parameters(recurse=False):
                owners[id(p)] = owners.get(id(p), 0) + 1
        out = {}
        for name, mod in named.items():
            if not isinstance(mod, nn.Linear):
                continue
            if layers is None and owners.get(id(mod.weight), 0) > 1:
                continue
            if layers is None or layers(name, mod):
                out[name] = mod
        return out
    out = {}
    for name in layers:
        if name not in named:
            raise KeyError(f"no module named {name!r} in {type(model).__name__}")
        if not isinstance(named[name], nn.Linear):
            raise TypeError(f"{name!r} is a {type(named[name]).__name__}, not nn.Linear")
        out[name] = named[name]
    order = list(named)
    return dict(sorted(out.items(), key=lambda kv: order.index(kv[0])))


class _StopForward(Exception):
    """Raised by a hook once every watched layer has its input: the rest of the pass is moot."""


class Calibrator:
    """Context manager collecting :class:`LayerStats` from forward passes.

    Parameters
    ----------
    model:
        Any torch module.
    layers:
        Selection as in :func:`linear_layers`.
    hessian:
        Also accumulate ``X^T X`` (``k^2`` float64 per layer).
    early_exit:
        Stop a forward pass (raise internally; :meth:`run` catches it) once every watched layer
        has seen its input. Only for layers called once per forward pass.

    Examples
    --------
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(4, 4))
    >>> with Calibrator(net, hessian=False) as cal:
    ...     _ = cal.run(torch.ones(2, 4))
    >>> cal.finish(min_tokens=1)["0"].tokens
    2
    """

    def __init__(self, model: nn.Module, layers=None, *, hessian: bool = True,
                 early_exit: bool = False):
        self.model = model
        self.layers = linear_layers(model, layers)
        if not self.layers:
            raise CalibrationError(f"no nn.Linear layers selected in {type(model).__name__}")
        self.stats = {
            name: LayerStats(name, mod.in_features,
                             xtx=torch.zeros((mod.in_features,) * 2, dtype=torch.float64)
                             if hessian else None)
            for name, mod in self.layers.items()}
        self.early_exit = early_exit
        self.batches = 0
        self._seen: set[str] = set()
        self._handles: list = []

    def _hook(self, name: str):
        def pre_hook(module, args):
            if not args:
                raise CalibrationError(f"{name}: called without a positional input")
            self.stats[name].update(args[0])
            self._seen.add(name)
            if self.early_exit and len(self._seen) == len(self.stats):
                raise _StopForward
        return pre_hook

    def __enter__(self) -> Calibrator:
        for name, mod in self.layers.items():
            self._handles.append(mod.register_forward_pre_hook(self._hook(name)))
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def run(self, batch, forward: Callable | None = None):
        """Run one calibration batch through the model (no grad); returns its output or None
        when the pass was cut short."""
        self._seen.clear()
        self.batches += 1
        try:
            with torch.no_grad():
                if forward is not None:
                    return forward(self.model, batch)
                if isinstance(batch, dict):
                    return self.model(**batch)
                if isinstance(batch, (tuple, list)):
                    return self.model(*batch)
                return self.model(batch)
        except _StopForward:
            return None

    def finish(self, min_tokens: int = MIN_TOKENS) -> dict[str, LayerStats]:
        """Check and return the statistics.

        Raises
        ------
        CalibrationError
            No batch ran, a layer saw no (or fewer than ``min_tokens``) tokens, or non-finite
            inputs.
        """
        if self.batches == 0:
            raise CalibrationError("no calibration batches: the batch iterable was empty")
        for name, st in self.stats.items():
            if st.tokens == 0:
                raise CalibrationError(
                    f"{name}: no calibration tokens reached this layer in {self.batches} "
                    f"batches; is it used by the model's forward pass?")
            if st.tokens < min_tokens:
                raise CalibrationError(
                    f"calibration data too short: {name} saw {st.tokens} tokens, at least "
                    f"{min_tokens} needed (min_tokens)")
            if st.nonfinite:
                raise CalibrationError(f"{name}: {st.nonfinite} non-finite (NaN/Inf) input "
                                       f"values during calibration")
            if st.xtx is not None and st.tokens < st.in_features:
                warnings.warn(f"{name}: {st.tokens} calibration tokens for {st.in_features} "
                              f"input features: the Hessian is rank-deficient and rests on "
                              f"dampening", CalibrationWarning, stacklevel=2)
        return self.stats


def collect_stats(model: nn.Module, batches: Iterable, layers=None, *, hessian: bool = True,
                  min_tokens: int = MIN_TOKENS, forward: Callable | None = None,
                  progress: bool = False) -> dict[str, LayerStats]:
    """Run ``batches`` through ``model`` and return the input statistics of its linear layers.

    Parameters
    ----------
    model:
        Any torch module; run in eval mode, without grad (its mode is restored afterwards).
    batches:
        Iterable of inputs: a tensor is passed as ``model(batch)``, a tuple/list as
        ``model(*batch)``, a dict as ``model(**batch)``.
    layers:
        Selection as in :func:`linear_layers` (default: every untied ``nn.Linear``).
    hessian:
        Also accumulate the Hessians.
    min_tokens:
        Least tokens every layer must see.
    forward:
        Optional ``forward(model, batch)`` replacing the call above.
    progress:
        Show a progress bar over batches.

    Returns
    -------
    ``{name: LayerStats}``.
    """
    with eval_mode(model), Calibrator(model, layers, hessian=hessian) as cal:
        for batch in tqdm(batches, desc="calibrate", disable=not progress, leave=False):
            cal.run(batch, forward)
    return cal.finish(min_tokens)


@contextmanager
def eval_mode(model: nn.Module):
    """``model.eval()`` for the block, then the training flag it had before."""
    was = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was)


def _compress_one(method: str, name: str, weight: torch.Tensor, st: LayerStats | None,
                  fmt: WeightFormat, kwargs: dict) -> QuantizedWeight:
    w = weight.detach().to("cpu", torch.float32)
    if method == "magnitude":
        return compress_matrix(w, fmt, name=name)
    if method == "wanda":
        return wanda_compress(w, st.x_norms, fmt, name=name)
    if method == "sparsegpt":
        if fmt.pattern.dense:  # nothing to prune: the joint sweep is GPTQ, the float one RTN
            opts = {k: v for k, v in kwargs.items() if k != "joint"}
            if kwargs.get("joint", True):
                return gptq_compress(w, st.hessian, fmt, name=name, **opts)
            return compress_matrix(w, fmt, name=name)
        return sparsegpt_compress(w, st.hessian, fmt, name=name, **kwargs)
    if method == "gptq":
        return gptq_compress(w, st.hessian, fmt, name=name, **kwargs)
    if method == "wanda+gptq":
        mask = None
        if not fmt.pattern.dense:
            kp = fmt.padded_k(w.shape[1])
            scores_w = torch.nn.functional.pad(w, (0, kp - w.shape[1]))
            norms = torch.nn.functional.pad(st.x_norms, (0, kp - w.shape[1]))
            mask = wanda_mask(scores_w, norms, fmt.pattern, name=name)[:, :w.shape[1]]
        return gptq_compress(w, st.hessian, fmt, mask=mask, name=name, **kwargs)
    raise ValueError(f"unknown method {method!r}; choose one of {sorted(METHODS)}")


def compress_model(model: nn.Module, batches: Iterable | None,
                   fmt: WeightFormat | Callable[[str, nn.Linear], WeightFormat | None],
                   method: str = "sparsegpt", *, layers=None, sequential: bool = True,
                   groups: Sequence[Sequence[str]] | None = None, write_back: bool = True,
                   min_tokens: int = MIN_TOKENS, forward: Callable | None = None,
                   progress: bool = True, **method_kwargs) -> dict[str, QuantizedWeight]:
    """Compress the linear layers of ``model`` with one method.

    Parameters
    ----------
    model:
        Any torch module.
    batches:
        Calibration inputs (see :func:`collect_stats`); materialised once, since sequential
        calibration runs them several times. Unused (may be None) for ``magnitude``.
    fmt:
        A format for every layer, or ``fmt(name, module)`` returning one (None skips the layer).
    method:
        One of :data:`METHODS`. ``gptq`` on a sparse format uses the magnitude mask;
        ``wanda+gptq`` the Wanda mask; ``sparsegpt`` on a dense format is GPTQ.
    layers:
        Selection as in :func:`linear_layers`.
    sequential:
        Calibrate each group on the model with the earlier groups already compressed (weights
        written back); else calibrate every layer once on the original model.
    groups:
        Layer names calibrated together in sequential mode (default: one layer per group).
    write_back:
        Leave the dequantised weights in the model; else restore the original weights at the
        end.
    min_tokens, forward:
        As in :func:`collect_stats`.
    progress:
        Progress bar over layers.
    **method_kwargs:
        Passed to the GPTQ/SparseGPT functions (``blocksize``, ``percdamp``, ``act_order``,
        ``joint``, ...).

    Returns
    -------
    ``{name: QuantizedWeight}`` in module order.
    """
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; choose one of {sorted(METHODS)}")
    need_norms, need_h = METHODS[method]
    if method_kwargs and not need_h:
        raise TypeError(f"method {method!r} takes no options, got {sorted(method_kwargs)}")
    selected = linear_layers(model, layers)
    fmts = {}
    for name, mod in selected.items():
        f = fmt(name, mod) if callable(fmt) else fmt
        if f is not None:
            fmts[name] = f
    if not fmts:
        raise CalibrationError("no layers to compress")
    if need_norms or need_h:
        if batches is None:
            raise CalibrationError(f"method {method!r} needs calibration batches")
        batches = list(batches)
        if not batches:
            raise CalibrationError("no calibration batches: the batch iterable was empty")
    if groups is None:
        groups = [[name] for name in fmts] if sequential else [list(fmts)]
    else:
        groups = [list(g) for g in groups]
        listed = [n for g in groups for n in g]
        missing = set(fmts) - set(listed)
        unknown = set(listed) - set(fmts)
        if missing or unknown or len(listed) != len(set(listed)):
            raise ValueError(f"groups must list every compressed layer once; missing "
                             f"{sorted(missing)}, unknown {sorted(unknown)}")
    originals = {name: selected[name].weight.detach().clone() for name in fmts}
    out: dict[str, QuantizedWeight] = {}
    bar = tqdm(total=len(fmts), desc=f"compress ({method})", disable=not progress)
    try:
        for group in groups:
            stats: dict[str, LayerStats | None] = dict.fromkeys(group)
            if need_norms or need_h:
                with eval_mode(model), Calibrator(model, group, hessian=need_h,
                                                   early_exit=sequential) as cal:
                    for batch in batches:
                        cal.run(batch, forward)
                stats = cal.finish(min_tokens)
            for name in group:
                bar.set_postfix_str(name)
                mod = selected[name]
                qw = _compress_one(method, name, originals[name], stats[name], fmts[name],
                                   method_kwargs)
                out[name] = qw
                if sequential or write_back:
                    with torch.no_grad():
                        mod.weight.copy_(torch.from_numpy(qw.dequantize()).to(mod.weight.dtype))
                stats[name] = None  # free the Hessian early
                bar.update()
    finally:
        bar.close()
        if not write_back:
            with torch.no_grad():
                for name, w in originals.items():
                    selected[name].weight.copy_(w)
    order = list(fmts)
    return dict(sorted(out.items(), key=lambda kv: order.index(kv[0])))

