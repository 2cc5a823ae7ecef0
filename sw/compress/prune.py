"""N:M pruning along the reduction (input) dimension.

A mask keeps exactly N positions in every block of M consecutive K positions of every output row.
Scores decide which: magnitude ``|W|`` by default, or any externally computed score of the same
shape (Wanda's ``|W| * ||X||``, for example), or a ready mask from an external method (SparseGPT)
checked for the N:M constraint.

**Tie rule.** Among equal scores in a block the lower in-block index is kept: the N kept
positions are the first N of a stable sort by descending score. :func:`nm_block_keep` is the one
implementation; every mask selection uses it (magnitude, Wanda, mask conversion, and SparseGPT's
selection inside the OBS sweep, :mod:`sw.compress.gptq`). It compares scores only (no
arithmetic), so the choice does not depend on BLAS or the thread count. Ties are common in
weights that come from a 4-bit grid (SmolLM2's Q4_1 GGUF); :func:`tie_rule` selects the
opposite rule (the higher index kept) to measure how much the rule matters
(``python -m bench.accuracy --ties higher``; docs/accuracy.md).

>>> import numpy as np
>>> nm_mask(np.array([[1.0, 1.0, 1.0, 0.5]]), NMPattern.parse("2:4")).astype(int).tolist()
[[1, 1, 0, 0]]
>>> with tie_rule("higher"):
...     nm_mask(np.array([[1.0, 1.0, 1.0, 0.5]]), NMPattern.parse("2:4")).astype(int).tolist()
[[0, 1, 1, 0]]
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import numpy as np

from hw.config import NMPattern

__all__ = ["TIE_RULES", "tie_rule", "nm_block_keep", "nm_keep_index", "nm_mask",
           "mask_to_keep_index", "check_nm_mask"]

#: Which of equal scores a block keeps: ``lower`` (the stated rule) or ``higher`` in-block index.
TIE_RULES = ("lower", "higher")
_TIES: contextvars.ContextVar[str] = contextvars.ContextVar("nm_ties", default=TIE_RULES[0])


@contextlib.contextmanager
def tie_rule(rule: str) -> Iterator[None]:
    """Within the ``with`` block, equal scores keep the ``rule`` in-block index
    (:data:`TIE_RULES`; the default outside is ``lower``). For sensitivity studies only."""
    if rule not in TIE_RULES:
        raise ValueError(f"unknown tie rule {rule!r}; expected one of {TIE_RULES}")
    token = _TIES.set(rule)
    try:
        yield
    finally:
        _TIES.reset(token)


def nm_block_keep(blocks: Any, n: int) -> Any:
    """The N kept positions of every block: bool, the shape of ``blocks``.

    Parameters
    ----------
    blocks:
        numpy array or torch tensor ``[..., M]`` of scores, a block along the last axis;
        higher is kept.
    n:
        Positions kept per block.

    Returns
    -------
    Boolean array of the same kind: exactly ``n`` True per block, the ``n`` highest scores,
    equal scores resolved by the tie rule (module docstring).
    """
    m = blocks.shape[-1]
    lower = _TIES.get() == "lower"
    keep = []
    for i in range(m):
        # rank of position i: the positions that beat it, by a higher score or by an equal
        # score at the position the tie rule prefers. Ranks are a permutation of 0..M-1, so
        # exactly N have rank < N. M*(M-1) vectorised comparisons beat a sort by far.
        rank = 0
        for j in range(m):
            if j != i:
                wins_ties = (j < i) == lower
                rank = rank + 1 * ((blocks[..., j] >= blocks[..., i]) if wins_ties
                                   else (blocks[..., j] > blocks[..., i]))
        keep.append(rank < n)
    if isinstance(blocks, np.ndarray):
        return np.stack(keep, axis=-1)
    import torch

    return torch.stack(keep, dim=-1)


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
    Equal scores: the tie rule of :func:`nm_block_keep`.
    """
    n, m = pattern.n, pattern.m
    rows, k = scores.shape
    b = scores.reshape(rows, k // m, m)
    pos = np.broadcast_to(np.arange(m, dtype=np.uint8), b.shape)
    # row-major: ascending inside a block
    return pos[nm_block_keep(b, n)].reshape(rows, k // m * n)


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
    # Kept positions score 1, the rest 0: the top N take all kept ones, then the lowest unused
    # indices (whatever the tie rule: filled positions hold zeros either way).
    with tie_rule("lower"):
        return nm_keep_index(mask.astype(np.float32), pattern)
