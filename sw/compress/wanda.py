"""Wanda: pruning by weights and activations (Sun, Liu, Bair & Kolter, 2023).

The importance of weight ``W[i, j]`` is ``|W[i, j]| * ||X[:, j]||_2``, the weight magnitude times
the L2 norm of input feature ``j`` over the calibration tokens. Scores are compared per output
row, inside every M-block (N:M), and there is no weight update, so Wanda is one pass of
:func:`sw.compress.core.compress_matrix` with these scores. The norms come from
:mod:`sw.compress.calibrate` (``LayerStats.x_norms``); any constant factor (a mean instead of a
sum over tokens) leaves the mask unchanged.

>>> import numpy as np
>>> from hw.format import WeightFormat
>>> w = np.array([[1.0, 0.9, 0.1, 0.2]], np.float32)
>>> x_norms = np.array([0.1, 1.0, 10.0, 1.0], np.float32)  # feature 2 is loud, 0 is quiet
>>> wanda_mask(w, x_norms, "2:4").astype(int).tolist()
[[0, 1, 1, 0]]
"""

from __future__ import annotations

import numpy as np

from hw.config import NMPattern
from hw.format import QuantizedWeight, WeightFormat
from sw.compress.core import as_weight_array, compress_matrix
from sw.compress.prune import nm_mask

__all__ = ["wanda_scores", "wanda_mask", "wanda_compress"]


def _norms(x_norms, k: int, name: str) -> np.ndarray:
    if hasattr(x_norms, "detach"):
        x_norms = x_norms.detach().to("cpu").double().numpy()
    v = np.asarray(x_norms, dtype=np.float64)
    if v.shape != (k,):
        raise ValueError(f"{name}: x_norms shape {v.shape} does not match the weight's {k} "
                         f"input features")
    if not np.isfinite(v).all() or (v < 0).any():
        raise ValueError(f"{name}: x_norms must be finite and non-negative (NaN/Inf or negative "
                         f"entries found)")
    return v


def wanda_scores(weight, x_norms, *, name: str = "weight") -> np.ndarray:
    """Wanda importance ``|W| * ||X_j||`` (float64 ``[n_out, k]``).

    Parameters
    ----------
    weight:
        Float ``[n_out, k]`` (numpy or torch).
    x_norms:
        ``[k]`` L2 norm of every input feature over the calibration tokens.
    name:
        Layer name for messages.
    """
    w = as_weight_array(weight, name)
    # float64: the product of a tiny weight and a huge norm must not flush to zero or overflow.
    return np.abs(w).astype(np.float64) * _norms(x_norms, w.shape[1], name)[None, :]


def wanda_mask(weight, x_norms, pattern: NMPattern | str, *, name: str = "weight") -> np.ndarray:
    """Boolean N:M mask keeping the N highest Wanda scores of every M-block of every row.

    ``k`` must be a multiple of M (use :func:`wanda_compress` for padding).
    """
    p = NMPattern.parse(pattern)
    s = wanda_scores(weight, x_norms, name=name)
    if p.dense:
        return np.ones(s.shape, bool)
    if s.shape[1] % p.m:
        raise ValueError(f"{name}: K={s.shape[1]} is not a multiple of M={p.m}")
    return nm_mask(s, p)


def wanda_compress(weight, x_norms, fmt: WeightFormat, *, name: str = "weight") -> QuantizedWeight:
    """Prune ``weight`` to ``fmt.pattern`` by Wanda scores and round it to ``fmt``'s grid.

    Parameters
    ----------
    weight:
        Float ``[n_out, k]`` (numpy or torch).
    x_norms:
        ``[k]`` L2 norm of every input feature over the calibration tokens.
    fmt:
        Target format (a dense pattern simply quantises).
    name:
        Layer name for messages.
    """
    return compress_matrix(weight, fmt, scores=wanda_scores(weight, x_norms, name=name),
                           name=name)
