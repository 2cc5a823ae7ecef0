"""Layers, errors and round trips shared by the sw.compress tests."""

from __future__ import annotations

import numpy as np

from hw.format import QuantizedWeight, pack, unpack


def layer(seed: int, n: int = 48, k: int = 128, tokens: int = 384, rank: int = 12):
    """Correlated calibration inputs (low rank + noise, uneven feature scales), a weight and the
    layer Hessian ``2 X^T X / tokens``."""
    g = np.random.default_rng(seed)
    x = g.standard_normal((tokens, rank)) @ g.standard_normal((rank, k))
    x += 0.3 * g.standard_normal((tokens, k))
    x *= np.exp(0.7 * g.standard_normal(k))[None, :]
    w = g.standard_normal((n, k)).astype(np.float32)
    return x, w, 2.0 * x.T @ x / tokens


def out_err(x, w, w_hat) -> float:
    """Layer-wise reconstruction error ``||X W^T - X What^T||_F`` (``w_hat``: an array or a
    :class:`~hw.format.QuantizedWeight`)."""
    if isinstance(w_hat, QuantizedWeight):
        w_hat = w_hat.dequantize()
    return float(np.linalg.norm(x @ (w.astype(np.float64) - w_hat).T))


def round_trips(qw: QuantizedWeight, lanes: int = 16) -> bool:
    """Packing ``qw`` for ``lanes`` lanes and unpacking it gives it back exactly."""
    return unpack(pack(qw, lanes), qw.fmt, qw.shape, lanes, qw.row_scale).equals(qw)
