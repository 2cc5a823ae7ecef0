"""SparseGPT: one-shot N:M pruning with OBS weight reconstruction (Frantar & Alistarh, 2023).

The columns of ``W[n_out, K]`` are swept left to right as in GPTQ (:func:`sw.compress.gptq.
obs_sweep`). Every M columns the N:M mask of the next M-block is chosen per output row by the
OBS saliency ``w^2 / U_jj^2`` of the *current* (already updated) weights, ``U`` being the upper
Cholesky factor of the inverse dampened Hessian; pruned weights are set to zero and their error
is compensated by the columns still to come. Updates are applied lazily, ``blocksize`` columns at
a time, as in the reference code (github.com/IST-DASLab/sparsegpt).

Quantisation:

* ``joint=True`` (default, SparseGPT's ``--wbits``): kept weights are quantised column by column
  to the format's two-level grid inside the same sweep, so their rounding error is compensated
  too. As in :mod:`sw.compress.gptq` the row scale is fixed up front (from the original weights
  under the mask predicted from the initial saliencies, with headroom) and a group's code is set
  when the sweep reaches it, from the current weights under the mask predicted for the group's
  blocks. The result dequantises bit for bit to the weights the sweep settled on.
* ``joint=False``: the sweep prunes and reconstructs in float, then the pruned weights are
  rounded to the grid (:func:`sw.compress.core.compress_matrix`).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from hw.config import NMPattern
from hw.format import QuantizedWeight, WeightFormat
from sw.compress.core import PaddingWarning, compress_matrix
from sw.compress.gptq import (
    HEADROOM,
    MAX_PERCDAMP,
    PERCDAMP,
    dead_features,
    finish,
    inverse_hessian_factor,
    make_grid,
    obs_sweep,
    prepare,
)
from sw.compress.prune import nm_mask

__all__ = ["sparsegpt_prune", "sparsegpt_compress"]


def _sweep(weight, hessian, fmt: WeightFormat, *, quantize: bool, blocksize: int,
           percdamp: float, max_percdamp: float, headroom: float, name: str):
    p = fmt.pattern
    if p.dense:
        raise ValueError(f"{name}: SparseGPT needs a sparse N:M pattern, got {p} (use GPTQ for "
                         f"dense quantisation)")
    w, h, k = prepare(weight, hessian, fmt, name, blocksize)
    dead = dead_features(h)
    u, _ = inverse_hessian_factor(h, percdamp=percdamp, max_percdamp=max_percdamp, name=name)
    u = u.to(torch.float32)
    grid = None
    if quantize:
        # Predict the mask from the initial saliencies to fix the row scale before the sweep.
        sal = (1.0 / torch.diagonal(u).double() ** 2).numpy()
        sal[dead.numpy()] = 0.0
        keep0 = nm_mask(w.astype(np.float64) ** 2 * sal[None, :], p)
        grid = make_grid(np.where(keep0, w, np.float32(0)), keep0, fmt, w.shape[1], headroom,
                         None)
    wt = torch.from_numpy(np.ascontiguousarray(w.T))
    q, ints, keep = obs_sweep(wt, u, select=p, grid=grid, dead=dead, blocksize=blocksize)
    return finish(q, ints, keep, grid, fmt, k, None), k


def sparsegpt_prune(weight, hessian, pattern: NMPattern | str, *, blocksize: int = 128,
                    percdamp: float = PERCDAMP, max_percdamp: float = MAX_PERCDAMP,
                    name: str = "weight") -> tuple[np.ndarray, np.ndarray]:
    """Prune ``weight`` to ``pattern`` with SparseGPT, without quantisation.

    Parameters
    ----------
    weight:
        Float ``[n_out, k]`` (numpy or torch).
    hessian:
        ``[k, k]`` layer Hessian ``2 X^T X / tokens``.
    pattern:
        Sparse N:M pattern along K.
    blocksize:
        Columns per lazy update batch (rounded down to a multiple of M).
    percdamp, max_percdamp:
        Dampening of the Hessian diagonal (fraction of its mean) and the largest retry.
    name:
        Layer name for messages.

    Returns
    -------
    weights, mask:
        float32 ``[n_out, k]`` reconstructed weights (exactly zero where pruned) and the bool
        N:M mask of kept positions.
    """
    fmt = WeightFormat(NMPattern.parse(pattern), 8, 0)
    (res, _), k = _sweep(weight, hessian, fmt, quantize=False, blocksize=blocksize,
                         percdamp=percdamp, max_percdamp=max_percdamp, headroom=1.0, name=name)
    return res.weights[:, :k].copy(), res.keep[:, :k].copy()


def sparsegpt_compress(weight, hessian, fmt: WeightFormat, *, joint: bool = True,
                       blocksize: int = 128, percdamp: float = PERCDAMP,
                       max_percdamp: float = MAX_PERCDAMP, headroom: float = HEADROOM,
                       name: str = "weight") -> QuantizedWeight:
    """Prune ``weight`` to ``fmt.pattern`` with SparseGPT and quantise it to ``fmt``.

    Parameters
    ----------
    weight:
        Float ``[n_out, k]`` (numpy or torch).
    hessian:
        ``[k, k]`` layer Hessian ``2 X^T X / tokens``.
    fmt:
        Target format; its pattern must be sparse.
    joint:
        Quantise inside the sweep (error compensated, GPTQ-style); else prune in float and round
        afterwards.
    blocksize:
        Columns per lazy update batch (rounded down to a multiple of M).
    percdamp, max_percdamp:
        Dampening of the Hessian diagonal (fraction of its mean) and the largest retry.
    headroom:
        Joint mode: row scale = headroom x the round-to-nearest row scale, >= 1.
    name:
        Layer name for messages.

    Returns
    -------
    QuantizedWeight
        Exactly N:M; with ``joint`` it dequantises bit for bit to the weights the sweep settled
        on.
    """
    (res, qw), k = _sweep(weight, hessian, fmt, quantize=joint, blocksize=blocksize,
                          percdamp=percdamp, max_percdamp=max_percdamp, headroom=headroom,
                          name=name)
    if joint:
        return qw
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PaddingWarning)  # already reported by prepare()
        return compress_matrix(res.weights[:, :k], fmt, mask=res.keep[:, :k], name=name)
