"""N:M pruning along the reduction (input) dimension.

A mask keeps exactly N positions in every block of M consecutive K positions of every output row
(ties go to the lower index). Scores decide which: magnitude ``|W|`` by default, or any
externally computed score of the same shape (Wanda's ``|W| * ||X||``, for example), or a ready
mask from an external method (SparseGPT) checked for the N:M constraint.
"""

from __future__ import annotations

import numpy as np

from hw.config import NMPattern

__all__ = ["nm_keep_index", "nm_mask", "mask_to_keep_index", "check_nm_mask"]


def nm_keep_index(scores: np.ndarray, pattern: NMPattern) -> np.ndarray:
    """In-block indices of the N kept positions of every M-block, ascending.

    Parameters
    ----------
    scores:
        ``[n_out, K]`` importance, K a multiple of M; higher is kept.
    pattern:
        The N:M pattern (sparse).

    Returns
    -------
    ``uint8 [n_out, K // M * N]`` in step order: block-major, ascending index inside a block.
    """
    n, m = pattern.n, pattern.m
    rows, k = scores.shape
    b = scores.reshape(rows, k // m, m)
    # Rank of every position inside its block: how many beat it (a higher score, or an equal
    # score at a lower index). Ranks are a permutation of 0..M-1, so exactly N have rank < N.
    # M*(M-1) vectorised comparisons beat a sort along an axis of length M by far.
    rank = np.zeros(b.shape, dtype=np.uint8)
    for i in range(m):
        for j in range(m):
            if j != i:
                rank[..., i] += b[..., j] > b[..., i] if j > i else b[..., j] >= b[..., i]
    pos = np.broadcast_to(np.arange(m, dtype=np.uint8), b.shape)
    return pos[rank < n].reshape(rows, k // m * n)  # row-major: ascending inside a block


def nm_mask(scores: np.ndarray, pattern: NMPattern) -> np.ndarray:
    """Boolean ``[n_out, K]`` mask keeping the N highest-scoring positions of every M-block."""
    keep = nm_keep_index(scores, pattern)
    rows, k = scores.shape
    mask = np.zeros((rows, k // pattern.m, pattern.m), dtype=bool)
    np.put_along_axis(mask, keep.reshape(rows, k // pattern.m, pattern.n).astype(np.int64),
                      True, axis=2)
    return mask.reshape(rows, k)


def check_nm_mask(mask: np.ndarray, pattern: NMPattern) -> None:
    """Raise ``ValueError`` unless every M-block of every row keeps at most N positions."""
    rows, k = mask.shape
    if k % pattern.m:
        raise ValueError(f"mask K={k} is not a multiple of M={pattern.m}")
    per_block = mask.reshape(rows, k // pattern.m, pattern.m).sum(axis=2)
    worst = int(per_block.max(initial=0))
    if worst > pattern.n:
        r, b = np.argwhere(per_block == worst)[0]
        raise ValueError(f"mask violates {pattern}: row {r}, block {b} keeps {worst} of "
                         f"{pattern.m}")


def mask_to_keep_index(mask: np.ndarray, pattern: NMPattern) -> np.ndarray:
    """Turn an N:M mask (at most N per block) into kept indices, exactly N per block.

    Blocks with fewer than N kept positions are filled with their lowest unused positions; the
    compressor stores zeros there, so the packed weight equals the masked weight exactly.
    """
    check_nm_mask(mask, pattern)
    # Kept positions score 1, the rest 0: the stable top-N takes all kept ones, then the lowest
    # unused indices.
    return nm_keep_index(mask.astype(np.float32), pattern)
