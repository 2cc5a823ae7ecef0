"""Group quantisation of kept weights into the two-level scale scheme of hw/numerics.py.

Every group of ``group`` dense K positions of a row gets an ideal step (``absmax / qmax``
symmetric, ``(max - min) / (2**bits - 1)`` asymmetric) computed from its *kept* values only. The
row scale ``S`` is the row's largest ideal step divided by the largest code, and each group's
code is its ideal step in units of ``S`` (rounded, at least 1). Values are then rounded to the
nearest multiple of the *effective* step ``S * code``, so the datapath's integers
``code * (q - zero)`` times ``S`` are exactly the dequantised weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hw.format import WeightFormat

__all__ = ["GroupScales", "compute_scales", "quantize_values", "step_groups"]


@dataclass
class GroupScales:
    """Scales of one matrix: float32 row scale, uint8 codes (and zero points) per group."""

    row_scale: np.ndarray        # float32 [n]
    codes: np.ndarray            # uint8 [n, groups]
    zeros: np.ndarray | None     # uint8 [n, groups] (asymmetric)

    def step(self) -> np.ndarray:
        """Effective float32 step ``S * code`` per group: ``[n, groups]``."""
        return self.row_scale[:, None] * self.codes.astype(np.float32)


def step_groups(fmt: WeightFormat, k_padded: int) -> int:
    """Steps (kept values) per quantisation group."""
    return fmt.steps_per_group(k_padded)


def compute_scales(kept: np.ndarray, fmt: WeightFormat, k_padded: int) -> GroupScales:
    """Scales for kept values ``kept[n, steps]`` (float32, in step order)."""
    n, steps = kept.shape
    spg = step_groups(fmt, k_padded)
    g = kept.reshape(n, steps // spg, spg)
    if fmt.symmetric:
        ideal = np.abs(g).max(axis=2) / np.float32(fmt.qmax)
    else:
        lo = np.minimum(g.min(axis=2), 0)   # the range always contains 0: pruned weights are 0
        hi = np.maximum(g.max(axis=2), 0)
        ideal = (hi - lo) / np.float32(fmt.qmax)
    ideal = ideal.astype(np.float32)
    row_scale = (ideal.max(axis=1) / np.float32(fmt.code_max)).astype(np.float32)
    row_scale[row_scale == 0] = 1.0  # an all-zero row: any scale works
    codes = np.clip(np.rint(ideal / row_scale[:, None]), 1, fmt.code_max).astype(np.uint8)
    zeros = None
    if not fmt.symmetric:
        step = row_scale[:, None] * codes.astype(np.float32)
        zeros = np.clip(np.rint(-lo / step), 0, fmt.qmax).astype(np.uint8)
    return GroupScales(row_scale, codes, zeros)


def quantize_values(kept: np.ndarray, scales: GroupScales, fmt: WeightFormat,
                    k_padded: int) -> np.ndarray:
    """Round kept values to the integer grid of their group (int16 ``[n, steps]``)."""
    n, steps = kept.shape
    spg = step_groups(fmt, k_padded)
    step = np.repeat(scales.step(), spg, axis=1)
    q = np.rint(kept / step)
    if not fmt.symmetric:
        q = q + np.repeat(scales.zeros, spg, axis=1)
    return np.clip(q, fmt.qmin, fmt.qmax).astype(np.int16)
