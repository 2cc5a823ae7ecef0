"""Compress one weight matrix: validate, pad, prune N:M, quantise per group -> QuantizedWeight.

>>> import numpy as np
>>> from hw.format import WeightFormat
>>> w = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
>>> qw = compress_matrix(w, WeightFormat("2:4", bits=4, group=128))
>>> qw.values.shape, qw.index.shape, qw.codes.shape
((64, 128), (64, 128), (64, 2))
"""

from __future__ import annotations

import warnings

import numpy as np

from hw.format import QuantizedWeight, WeightFormat
from sw.compress.prune import mask_to_keep_index, nm_keep_index
from sw.compress.quant import compute_scales, quantize_values

__all__ = ["PaddingWarning", "warn_padding", "as_weight_array", "compress_matrix",
           "gather_kept"]

#: Rows compressed at once; bounds the temporary memory to a few copies of this many rows.
CHUNK_ROWS = 512


class PaddingWarning(UserWarning):
    """K was padded with zero columns to whole blocks and groups (:func:`warn_padding`)."""


#: Which padding messages were shown (the ``default`` filter shows each message once).
_PADDING_SHOWN: dict = {}


def warn_padding(name: str, k: int, fmt) -> None:
    """Warn that ``name``'s ``k`` columns are padded to ``fmt.padded_k(k)``.

    Shown as one line, ``sw.compress:0: PaddingWarning: <name>: K=... padded ...``: the
    warning is issued at no source line, so it never prints a line of this package's code into
    a progress bar, whichever function of the package reported it. Each message is shown once
    under the default filter; :class:`PaddingWarning` filters and ``pytest.warns`` see it as
    any warning.

    Parameters
    ----------
    name : str
        The layer (or weight) named in the message.
    k : int
        Its input columns.
    fmt : WeightFormat
        The format whose blocks and groups ``k`` is padded to.
    """
    kp = fmt.padded_k(k)
    warnings.warn_explicit(
        f"{name}: K={k} padded with {kp - k} zero columns to {kp} (whole {fmt.pattern} blocks "
        f"and groups of {fmt.group or 'row'})", PaddingWarning, filename="sw.compress",
        lineno=0, module=__name__, registry=_PADDING_SHOWN)


def as_weight_array(weight, name: str = "weight") -> np.ndarray:
    """Validate a 2-D floating weight (numpy or torch) and return it as float32 numpy."""
    try:
        import torch
        if isinstance(weight, torch.Tensor):
            if not weight.dtype.is_floating_point:
                raise TypeError(f"{name} must be floating point, got {weight.dtype}")
            weight = weight.detach().to("cpu", torch.float32).numpy()
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    if not isinstance(weight, np.ndarray):
        raise TypeError(f"{name} must be a numpy array or torch tensor, got "
                        f"{type(weight).__name__}")
    if not np.issubdtype(weight.dtype, np.floating):
        raise TypeError(f"{name} must be floating point, got {weight.dtype}")
    if weight.ndim != 2:
        raise ValueError(f"{name} must be 2-D [out, in], got shape {weight.shape}")
    if weight.size == 0:
        raise ValueError(f"{name} is empty: shape {weight.shape}")
    w = np.ascontiguousarray(weight, dtype=np.float32)
    finite = np.isfinite(w)
    if not finite.all():
        bad = np.argwhere(~finite)
        r, c = bad[0]
        raise ValueError(f"{name} has {len(bad)} non-finite values (NaN/Inf), first at "
                         f"[{r}, {c}] = {w[r, c]}")
    return w


def gather_kept(w: np.ndarray, keep: np.ndarray, fmt: WeightFormat) -> np.ndarray:
    """Values of the kept positions in step order (``[n, steps]``) for in-block indices
    ``keep``."""
    p = fmt.pattern
    if p.dense:
        return w
    rows, k = w.shape
    blocks = w.reshape(rows, k // p.m, p.m)
    idx = keep.reshape(rows, k // p.m, p.n).astype(np.int64)
    return np.take_along_axis(blocks, idx, axis=2).reshape(rows, -1)


def compress_matrix(weight, fmt: WeightFormat, *, scores=None, mask=None,
                    name: str = "weight") -> QuantizedWeight:
    """Prune ``weight [n_out, k]`` to ``fmt.pattern`` and quantise it group-wise.

    Parameters
    ----------
    weight:
        Float weights ``[out, in]`` (numpy or torch).
    fmt:
        Target format.
    scores:
        Optional importance ``[out, in]`` (e.g. Wanda); default magnitude ``|weight|``.
    mask:
        Optional boolean N:M mask ``[out, in]`` from an external method (at most N per block);
        masked-out weights become zero. Mutually exclusive with ``scores``.
    name:
        Used in error messages.

    Notes
    -----
    If ``k`` is not a multiple of the block and group size, K is padded with zero columns (a
    :class:`PaddingWarning` says so); the padding costs storage but never changes results.
    """
    if fmt.raw:
        raise ValueError("raw formats hold integer operands, not compressed weights")
    if scores is not None and mask is not None:
        raise ValueError("give scores or a mask, not both")
    w = as_weight_array(weight, name)
    n, k = w.shape
    kp = fmt.padded_k(k)
    if kp != k:
        warn_padding(name, k, fmt)
    extra = []
    for label, arr in (("scores", scores), ("mask", mask)):
        if arr is None:
            extra.append(None)
            continue
        arr = np.asarray(arr.detach().cpu() if hasattr(arr, "detach") else arr)
        if arr.shape != (n, k):
            raise ValueError(f"{name}: {label} shape {arr.shape} != weight shape {(n, k)}")
        if label == "mask" and arr.dtype != bool:
            raise TypeError(f"{name}: mask must be boolean, got {arr.dtype}")
        if label == "scores" and not np.isfinite(arr).all():
            raise ValueError(f"{name}: scores contain NaN or Inf")
        extra.append(arr)
    scores, mask = extra

    p = fmt.pattern
    steps = fmt.steps(kp)
    groups = kp // fmt.group_of(kp)
    values = np.empty((n, steps), dtype=np.int16)
    index = None if p.dense else np.empty((n, steps), dtype=np.uint8)
    codes = np.empty((n, groups), dtype=np.uint8)
    zeros = None if fmt.symmetric else np.empty((n, groups), dtype=np.uint8)
    row_scale = np.empty(n, dtype=np.float32)

    def padded(a, fill):
        if a is None or kp == k:
            return a
        out = np.full((a.shape[0], kp), fill, dtype=a.dtype)
        out[:, :k] = a
        return out

    for r0 in range(0, n, CHUNK_ROWS):
        rows = slice(r0, min(n, r0 + CHUNK_ROWS))
        wc = padded(w[rows], 0)
        if not p.dense:
            if mask is not None:
                mc = padded(mask[rows], False)
                keep = mask_to_keep_index(mc, p)
                wc = np.where(mc, wc, np.float32(0))
            else:
                sc = np.abs(wc) if scores is None else padded(scores[rows].astype(np.float32),
                                                              -np.inf)
                keep = nm_keep_index(sc, p)
            index[rows] = keep
            kept = gather_kept(wc, keep, fmt)
        else:
            if mask is not None:  # unstructured mask on a dense stream: zeros are stored
                wc = np.where(padded(mask[rows], False), wc, np.float32(0))
            kept = wc
        sc_ = compute_scales(kept, fmt, kp)
        values[rows] = quantize_values(kept, sc_, fmt, kp)
        codes[rows] = sc_.codes
        row_scale[rows] = sc_.row_scale
        if zeros is not None:
            zeros[rows] = sc_.zeros
    return QuantizedWeight(fmt, (n, k), values, index, codes, zeros, row_scale)
