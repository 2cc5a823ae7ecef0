"""GPTQ: group quantisation with Hessian-based error compensation (Frantar et al., 2022).

Columns of ``W[n_out, K]`` are quantised one at a time; the rounding error of column ``j`` is
spread over the not yet quantised columns through the inverse of the layer Hessian
``H = 2 X^T X / tokens``, so the layer output ``X W^T`` on the calibration data moves as little as
possible. Updates to later columns are applied lazily, ``blocksize`` columns at a time, as in the
reference implementation (github.com/IST-DASLab/gptq).

The result is a :class:`hw.format.QuantizedWeight` in the two-level scale scheme of
:mod:`sw.compress.quant`: a float32 row scale ``S[n]`` times a uint8 code per group. Because codes
are relative to ``S``, ``S`` is fixed *before* the sweep, from the initial weights with a little
``headroom`` (GPTQ's updates may grow a group's range; without headroom the largest group's
code would saturate at ``code_max``). Each group's code (and zero point) is computed when the
sweep reaches the group's first column, from the *current*, already updated weights, with the
same rounding rules as :func:`sw.compress.quant.compute_scales` (codes clipped to
``[1, code_max]``). Every column is rounded to its group's effective step ``S * code`` exactly as
:func:`sw.compress.quant.quantize_values` does, and the error that is propagated is the error of
the value the datapath will really see, so the returned weight dequantises bit for bit to the
weights the algorithm settled on (checked on every call).

Activation order (``act_order=True``) quantises columns by descending ``diag(H)``. The hardware
format needs groups of consecutive *original* K positions, so with act order the codes of every
group are computed up front from the original (masked) weights, and each column uses its
original group's code when its turn comes ("static groups"). This loses the refresh of codes
from updated weights but keeps the stream layout unchanged.

Sparse formats: GPTQ quantises only kept weights. A given N:M ``mask`` (e.g. from Wanda) is
respected exactly: a weight outside it is set to zero at its turn and the resulting error
(its original value plus the updates it received) is compensated by the kept weights still to
come, i.e. OBS reconstruction for a fixed mask; pruned positions end exactly zero. Without a
mask a sparse format takes the magnitude N:M mask, so a matrix that is already N:M pruned keeps
its own zeros and only its kept weights change.

Speed (a 4096 x 4096 layer takes a few CPU seconds): ``U`` comes from one Cholesky factor of the
reversed Hessian and one triangular solve (no explicit inverse); the sweep applies updates in
two lazy levels (rank-1 inside 16-column sub-blocks, matrix products per sub-block and per
block); its column loop runs on one thread, where thousands of tiny vector ops would otherwise
pay OpenMP's fork/join each time.

The shared column sweep (:func:`obs_sweep`) and the damped inverse Hessian factor
(:func:`inverse_hessian_factor`) are also what :mod:`sw.compress.sparsegpt` runs on.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from hw.config import NMPattern
from hw.format import QuantizedWeight, WeightFormat
from sw.compress.core import as_weight_array, gather_kept, warn_padding
from sw.compress.errors import CompressError
from sw.compress.prune import check_nm_mask, mask_to_keep_index, nm_block_keep, nm_mask
from sw.compress.quant import compute_scales

__all__ = ["HessianError", "DampingWarning", "as_hessian", "inverse_hessian_factor",
           "QuantGrid", "SweepResult", "obs_sweep", "gptq_compress"]

#: Default dampening: this fraction of the mean Hessian diagonal is added to the diagonal.
PERCDAMP = 0.01
#: Largest dampening fraction tried before giving up (the retries multiply by 10).
MAX_PERCDAMP = 1.0
#: Default row-scale headroom for the quantisation grid (see the module docstring).
HEADROOM = 1.05
#: Columns per inner lazy sub-block of the sweep (a multiple of every M).
SUB = 16


class HessianError(CompressError):
    """A layer Hessian that cannot be used: wrong shape, non-finite, or not positive definite
    even after the largest dampening."""


class DampingWarning(UserWarning):
    """The Hessian needed more dampening than requested to be positive definite."""


# ---------------------------------------------------------------------- Hessian handling
def as_hessian(hessian, k: int, name: str = "weight") -> torch.Tensor:
    """Validate a layer Hessian ``[k, k]`` (numpy or torch) and return it as float64 torch.

    Raises
    ------
    HessianError
        Wrong shape or non-finite entries.
    """
    if isinstance(hessian, np.ndarray):
        hessian = torch.from_numpy(hessian)
    if not isinstance(hessian, torch.Tensor):
        raise TypeError(f"{name}: Hessian must be a torch tensor or numpy array, got "
                        f"{type(hessian).__name__}")
    if tuple(hessian.shape) != (k, k):
        raise HessianError(f"{name}: Hessian shape {tuple(hessian.shape)} does not match the "
                           f"weight's {k} input features (expected ({k}, {k}))")
    h = hessian.detach().to("cpu", torch.float64)
    bad = int((~torch.isfinite(h)).sum())
    if bad:
        raise HessianError(f"{name}: Hessian has {bad} non-finite entries (NaN/Inf); the "
                           f"calibration activations of this layer are not finite")
    return h


def _damping_schedule(percdamp: float, max_percdamp: float) -> list[float]:
    """Relative dampings tried in order: ``percdamp``, then x10 steps up to ``max_percdamp``."""
    out = [percdamp]
    d = max(percdamp, 1e-3)
    while d * 10 <= max_percdamp * (1 + 1e-9):
        d *= 10
        out.append(d)
    return out


def inverse_hessian_factor(hessian: torch.Tensor, *, percdamp: float = PERCDAMP,
                           max_percdamp: float = MAX_PERCDAMP,
                           name: str = "weight") -> tuple[torch.Tensor, float]:
    """Upper Cholesky factor ``U`` of the inverse of the dampened Hessian, ``H^-1 = U^T U``.

    ``percdamp * mean(diag(H))`` is added to the diagonal. If a Cholesky decomposition fails, the
    dampening is multiplied by 10 and the decomposition retried, up to ``max_percdamp`` (a
    :class:`DampingWarning` reports a retry). Input features that never fired (zero diagonal)
    get a unit diagonal so they are decoupled from the others, as in the reference code.

    Parameters
    ----------
    hessian:
        float64 ``[k, k]``, validated (see :func:`as_hessian`).
    percdamp, max_percdamp:
        First and largest dampening, as fractions of the mean diagonal.
    name:
        Layer name for messages.

    Returns
    -------
    U, used:
        float64 ``[k, k]`` upper triangular, and the dampening fraction that succeeded.

    Raises
    ------
    HessianError
        No dampening up to ``max_percdamp`` made the Hessian positive definite.
    """
    if not (percdamp >= 0 and max_percdamp >= percdamp):
        raise ValueError(f"need 0 <= percdamp <= max_percdamp, got {percdamp}, {max_percdamp}")
    h = hessian.clone()
    diag = torch.diagonal(h)
    dead = diag == 0
    h[dead, dead] = 1.0
    mean = float(diag.mean())
    eye = torch.eye(h.shape[0], dtype=h.dtype)
    tried = []
    for pd in _damping_schedule(percdamp, max_percdamp):
        tried.append(pd)
        hd = h.clone()
        torch.diagonal(hd).add_(pd * mean)
        # U without forming H^-1: with J the reversal, J H J = L L^T gives H = R R^T for the
        # upper R = J L J, so H^-1 = R^-T R^-1 and U = R^-1 = J L^-1 J. One Cholesky and one
        # triangular solve instead of the reference's Cholesky, inverse and second Cholesky.
        chol, info = torch.linalg.cholesky_ex(hd.flip(0, 1))
        if int(info) != 0:
            continue
        u = torch.linalg.solve_triangular(chol, eye, upper=False).flip(0, 1)
        if not bool(torch.isfinite(u).all()) or not bool((torch.diagonal(u) > 0).all()):
            continue
        if len(tried) > 1:
            warnings.warn(f"{name}: Hessian not positive definite with dampening "
                          f"{tried[0]:g} x mean diagonal; succeeded with {pd:g}",
                          DampingWarning, stacklevel=2)
        return u, pd
    raise HessianError(
        f"{name}: Cholesky decomposition of the dampened Hessian failed for every dampening "
        f"tried ({', '.join(f'{d:g}' for d in tried)} x mean diagonal {mean:.4g}); the "
        f"Hessian is far from positive semi-definite. Check the calibration data or raise "
        f"max_percdamp")


# ---------------------------------------------------------------------- the quantisation grid
@dataclass
class QuantGrid:
    """The two-level grid a sweep rounds to, in the sweep's transposed layout.

    Attributes
    ----------
    fmt:
        The weight format (bits, symmetry, code width, group size).
    row_scale:
        float32 ``[n]``: ``S``, fixed for the whole sweep.
    col_group:
        int64 ``[kp]``: the group of every column, in processing order.
    codes, zeros:
        int32 ``[groups, n]``: scale codes and zero points (``zeros`` is None if symmetric).
    lazy:
        Compute a group's codes when the sweep reaches its first column (consecutive groups in
        processing order). Otherwise ``codes``/``zeros`` are filled in already.
    group:
        Columns per group (``kp`` for whole-row groups).
    """

    fmt: WeightFormat
    row_scale: torch.Tensor
    col_group: torch.Tensor
    codes: torch.Tensor
    zeros: torch.Tensor | None
    lazy: bool
    group: int

    def set_group(self, g: int, cur: torch.Tensor, keep: torch.Tensor) -> None:
        """Codes (and zeros) of group ``g`` from current weights ``cur [cols, n]``, kept where
        ``keep``: the rules of :func:`sw.compress.quant.compute_scales` with ``S`` fixed."""
        fmt = self.fmt
        v = torch.where(keep, cur, torch.zeros((), dtype=cur.dtype))
        qmax = torch.tensor(fmt.qmax, dtype=torch.float32)
        if fmt.symmetric:
            ideal = v.abs().amax(dim=0) / qmax
        else:
            lo = v.amin(dim=0).clamp(max=0)  # the range always contains 0 (pruned weights)
            hi = v.amax(dim=0).clamp(min=0)
            ideal = (hi - lo) / qmax
        codes = torch.clamp(torch.round(ideal / self.row_scale), 1, fmt.code_max)
        self.codes[g] = codes.to(torch.int32)
        if self.zeros is not None:
            step = self.row_scale * codes
            self.zeros[g] = torch.clamp(torch.round(-lo / step), 0, fmt.qmax).to(torch.int32)

    def quantize(self, w: torch.Tensor, col: int,
                 keep: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Round column ``col`` (values ``w [n]``) to its group grid.

        Returns the integer values (the zero point where not ``keep``, i.e. a stored zero) and
        the real values ``float32(code * (q - zero)) * S`` that :meth:`QuantizedWeight.dequantize`
        will produce, bit for bit.
        """
        g = int(self.col_group[col])
        code = self.codes[g]
        step = self.row_scale * code.to(torch.float32)  # float32, as GroupScales.step()
        q = torch.round(w / step)
        if self.zeros is not None:
            z = self.zeros[g]
            q = q + z
        q = torch.clamp(q, self.fmt.qmin, self.fmt.qmax).to(torch.int32)
        if self.zeros is None:
            z = torch.zeros_like(q)
        if keep is not None:
            q = torch.where(keep, q, z)
        real = ((q - z) * code).to(torch.float32) * self.row_scale
        return q, real


def _initial_grid(w_kept: np.ndarray, keep_idx: np.ndarray | None, fmt: WeightFormat, kp: int,
                  headroom: float) -> tuple[np.ndarray, int, int]:
    """Row scale from the initial kept weights (``[n, kp]``, pruned zeroed), with headroom."""
    if headroom < 1:
        raise ValueError(f"headroom must be >= 1, got {headroom}")
    kept = w_kept if keep_idx is None else gather_kept(w_kept, keep_idx, fmt)
    s = compute_scales(kept, fmt, kp).row_scale
    s = (s * np.float32(headroom)).astype(np.float32)
    group = fmt.group_of(kp)
    return s, group, kp // group


def make_grid(w_masked: np.ndarray, keep: np.ndarray | None, fmt: WeightFormat, kp: int,
              headroom: float, perm: np.ndarray | None) -> QuantGrid:
    """The grid for a sweep over ``w_masked [n, kp]`` (pruned weights zeroed).

    ``S`` comes from the initial weights. Without ``perm`` the group codes are computed lazily
    during the sweep; with a column permutation ``perm`` (act order) they are computed here from
    the initial weights, per original group.
    """
    n = w_masked.shape[0]
    p = fmt.pattern
    keep_idx = None
    if not p.dense:
        if keep is None:
            raise ValueError(f"a {p} grid needs the kept positions")
        keep_idx = mask_to_keep_index(keep, p)
    s, group, groups = _initial_grid(w_masked, keep_idx, fmt, kp, headroom)
    col_group = torch.arange(kp, dtype=torch.int64) // group
    grid = QuantGrid(fmt, torch.from_numpy(s), col_group,
                     torch.ones((groups, n), dtype=torch.int32),
                     None if fmt.symmetric else torch.zeros((groups, n), dtype=torch.int32),
                     lazy=perm is None, group=group)
    if perm is not None:
        wt = torch.from_numpy(np.ascontiguousarray(w_masked.T))
        kt = torch.ones_like(wt, dtype=torch.bool) if keep is None else \
            torch.from_numpy(np.ascontiguousarray(keep.T))
        for g in range(groups):
            sl = slice(g * group, (g + 1) * group)
            grid.set_group(g, wt[sl], kt[sl])
        grid.col_group = col_group[torch.from_numpy(perm)]
    return grid


# ---------------------------------------------------------------------- the column sweep
@dataclass
class SweepResult:
    """Outcome of :func:`obs_sweep`, all ``[n, kp]`` in the original column order."""

    weights: np.ndarray       # float32: the settled weights (pruned ones exactly zero)
    ints: np.ndarray | None   # int32: integer values (the zero point where pruned); with a grid
    keep: np.ndarray          # bool: kept positions


def _nm_keep_t(scores: torch.Tensor, pattern: NMPattern) -> torch.Tensor:
    """Keep the N highest scores of every M consecutive rows of ``scores [cols, n]`` (equal
    scores: the tie rule of :func:`sw.compress.prune.nm_block_keep`)."""
    cols, n = scores.shape
    b = scores.reshape(cols // pattern.m, pattern.m, n).transpose(1, 2)
    return nm_block_keep(b, pattern.n).transpose(1, 2).reshape(cols, n)


def obs_sweep(w: torch.Tensor, u: torch.Tensor, *, keep: torch.Tensor | None = None,
              select: NMPattern | None = None, grid: QuantGrid | None = None,
              dead: torch.Tensor | None = None, blocksize: int = 128) -> tuple[
                  torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """One OBS/GPTQ sweep over the columns of a weight, lazily batched.

    Parameters
    ----------
    w:
        ``[kp, n]``: the weight *transposed* (column ``j`` is row ``j``), in processing order;
        updated in place. float32 in production (as the reference); the arithmetic follows its
        dtype (the tests sweep in float64).
    u:
        ``[kp, kp]``: upper Cholesky factor of the inverse Hessian, same order and dtype.
    keep:
        bool ``[kp, n]``: a fixed mask (pruned positions become zero). Exclusive with ``select``.
    select:
        Choose an N:M mask on the fly, every M columns, by the OBS saliency ``w^2 / U_jj^2``
        of the current weights (SparseGPT).
    grid:
        Quantise kept weights to this grid (GPTQ, or SparseGPT's joint mode); else keep them in
        float.
    dead:
        bool ``[kp]``: input features that never fired; they lose every saliency comparison.
    blocksize:
        Columns per lazy batch.

    Returns
    -------
    q, ints, keep:
        ``[kp, n]`` settled weights, int32 ``[kp, n]`` integer values (with a grid; the zero
        point where pruned) and the bool ``[kp, n]`` mask, in processing order.
    """
    kp, n = w.shape
    if select is not None:
        if keep is not None:
            raise ValueError("give a fixed mask or an on-the-fly pattern, not both")
        blocksize = max(select.m, blocksize - blocksize % select.m)
        keep = torch.zeros((kp, n), dtype=torch.bool)
    d = torch.diagonal(u)
    sal_scale = 1.0 / d ** 2
    if dead is not None:
        sal_scale = torch.where(dead, torch.zeros_like(sal_scale), sal_scale)
    q_all = torch.zeros_like(w)
    ints = torch.zeros((kp, n), dtype=torch.int32) if grid is not None else None
    zero = torch.zeros((), dtype=w.dtype)
    threads = torch.get_num_threads()
    try:
        for i1 in range(0, kp, blocksize):
            i2 = min(i1 + blocksize, kp)
            # The column loop runs thousands of tiny vector ops: on one thread, since OpenMP's
            # fork/join costs far more than the op (1.7 ms vs 2 us for 4096 elements on a
            # busy 2-core machine). The big block update below keeps every thread.
            torch.set_num_threads(1)
            err1 = _sweep_block(w, u, i1, i2, keep, select, grid, sal_scale, q_all, ints, zero)
            torch.set_num_threads(threads)
            if i2 < kp:
                w[i2:].addmm_(u[i1:i2, i2:].T, err1, alpha=-1)
    finally:
        torch.set_num_threads(threads)
    if keep is None:
        keep = torch.ones((kp, n), dtype=torch.bool)
    return q_all, ints, keep


def _sweep_block(w: torch.Tensor, u: torch.Tensor, i1: int, i2: int,
                 keep: torch.Tensor | None, select: NMPattern | None, grid: QuantGrid | None,
                 sal_scale: torch.Tensor, q_all: torch.Tensor, ints: torch.Tensor | None,
                 zero: torch.Tensor) -> torch.Tensor:
    """Sweep columns ``[i1, i2)`` of :func:`obs_sweep`; returns the block's scaled errors
    ``[i2 - i1, n]`` for the lazy update of the columns after it."""
    kp = w.shape[0]
    w1 = w[i1:i2].clone()
    err1 = torch.zeros_like(w1)
    u1 = u[i1:i2, i1:i2]
    # Two levels of lazy updates: rank-1 updates only inside a sub-block of SUB columns, one
    # matrix product per sub-block for the rest of the block, one per block for the rest of
    # the matrix. Same arithmetic as the reference, a fraction of the memory traffic.
    for s1 in range(0, i2 - i1, SUB):
        s2 = min(s1 + SUB, i2 - i1)
        for i in range(s1, s2):
            c = i1 + i
            if select is not None and c % select.m == 0:
                sc = w1[i:i + select.m] ** 2 * sal_scale[c:c + select.m, None]
                keep[c:c + select.m] = _nm_keep_t(sc, select)
            if grid is not None and grid.lazy and c % grid.group == 0:
                cur = _current(c, i, s1, s2, i1, i2, min(c + grid.group, kp), w, w1, err1, u,
                               u1)
                _start_group(grid, c, cur, keep, select, sal_scale)
            col = w1[i]
            kc = keep[c] if keep is not None else None
            if grid is not None:
                qi, qv = grid.quantize(col, c, kc)
                ints[c] = qi
            else:
                qv = col if kc is None else torch.where(kc, col, zero)
            q_all[c] = qv
            e = (col - qv) / u1[i, i]
            w1[i:s2].addr_(u1[i, i:s2], e, alpha=-1)
            err1[i] = e
        if s2 < i2 - i1:
            w1[s2:].addmm_(u1[s1:s2, s2:].T, err1[s1:s2], alpha=-1)
    return err1


def _current(c: int, i: int, s1: int, s2: int, i1: int, i2: int, end: int, w: torch.Tensor,
             w1: torch.Tensor, err1: torch.Tensor, u: torch.Tensor,
             u1: torch.Tensor) -> torch.Tensor:
    """Current values of columns ``c .. end`` at column ``c`` (block-local ``i``, sub-block
    ``[s1, s2)``) with every pending lazy update applied, on a copy.

    Inside the sub-block ``w1`` is current; later rows of the block still owe the sub-block's
    errors so far, rows beyond the block owe all of the block's errors so far.
    """
    parts = [w1[i:min(s2, end - i1)]]
    if end - i1 > s2:
        rows = slice(s2, min(i2, end) - i1)
        parts.append(w1[rows] - u1[s1:i, rows].T @ err1[s1:i])
    if end > i2:
        parts.append(w[i2:end] - u[i1:c, i2:end].T @ err1[:i])
    return torch.cat(parts) if len(parts) > 1 else parts[0]


def _start_group(grid: QuantGrid, c: int, cur: torch.Tensor, keep: torch.Tensor | None,
                 select: NMPattern | None, sal_scale: torch.Tensor) -> None:
    """Set the codes of the group starting at column ``c`` from its current weights ``cur``."""
    end = c + cur.shape[0]
    if select is not None:
        # The mask of the group's later blocks is not chosen yet: predict it from the current
        # saliencies, so the group range covers the weights that will most likely be kept.
        kg = _nm_keep_t(cur ** 2 * sal_scale[c:end, None], select)
    elif keep is not None:
        kg = keep[c:end]
    else:
        kg = torch.ones_like(cur, dtype=torch.bool)
    grid.set_group(int(grid.col_group[c]), cur, kg)


# ---------------------------------------------------------------------- common driver
def prepare(weight, hessian, fmt: WeightFormat, name: str,
            blocksize: int) -> tuple[np.ndarray, torch.Tensor, int]:
    """Validate and pad a weight ``[n, k]`` and its Hessian to ``kp = fmt.padded_k(k)``.

    Padded input features get zero Hessian rows, so they are dead and stay exactly zero.
    Returns the padded float32 weight, the float64 Hessian and the original ``k``.
    """
    if not isinstance(blocksize, int) or blocksize < 1:
        raise ValueError(f"blocksize must be a positive int, got {blocksize!r}")
    if fmt.raw:
        raise ValueError("raw formats hold integer operands, not compressed weights")
    w = as_weight_array(weight, name)
    n, k = w.shape
    h = as_hessian(hessian, k, name)
    kp = fmt.padded_k(k)
    if kp != k:
        warn_padding(name, k, fmt)
        wp = np.zeros((n, kp), np.float32)
        wp[:, :k] = w
        hp = torch.zeros((kp, kp), dtype=torch.float64)
        hp[:k, :k] = h
        w, h = wp, hp
    return w, h, k


def finish(sweep_q: torch.Tensor, ints: torch.Tensor | None, keep: torch.Tensor,
           grid: QuantGrid | None, fmt: WeightFormat, k: int,
           perm: np.ndarray | None) -> tuple[SweepResult, QuantizedWeight | None]:
    """Undo the column permutation and, with a grid, build the exact QuantizedWeight."""
    def back(t):
        if t is None:
            return None
        a = t.T.numpy() if perm is None else t.T.numpy()[:, np.argsort(perm)]
        return np.ascontiguousarray(a)

    res = SweepResult(back(sweep_q), back(ints), back(keep))
    if grid is None:
        return res, None
    n, kp = res.weights.shape
    p = fmt.pattern
    vals = res.ints.astype(np.int16)
    index = None
    if not p.dense:
        check_nm_mask(res.keep, p)
        index = mask_to_keep_index(res.keep, p)
        vals = gather_kept(vals, index, fmt)
    codes = grid.codes.T.numpy().astype(np.uint8)
    zeros = None if grid.zeros is None else grid.zeros.T.numpy().astype(np.uint8)
    qw = QuantizedWeight(fmt, (n, k), np.ascontiguousarray(vals), index,
                         np.ascontiguousarray(codes),
                         None if zeros is None else np.ascontiguousarray(zeros),
                         grid.row_scale.numpy().copy())
    # The error the sweep propagated was computed from these exact values: make sure the stored
    # form really stands for them (a cheap check against a silent numerics mismatch).
    if not np.array_equal(qw.dequantize(), res.weights[:, :k]):
        raise RuntimeError("internal error: the packed weight does not dequantise to the "
                           "weights the sweep settled on")
    return res, qw


def dead_features(h: torch.Tensor) -> torch.Tensor:
    """bool ``[k]``: input features with a zero Hessian diagonal (never non-zero)."""
    return torch.diagonal(h) == 0


# ---------------------------------------------------------------------- GPTQ
def gptq_compress(weight, hessian, fmt: WeightFormat, *, mask=None, act_order: bool = False,
                  blocksize: int = 128, percdamp: float = PERCDAMP,
                  max_percdamp: float = MAX_PERCDAMP, headroom: float = HEADROOM,
                  name: str = "weight") -> QuantizedWeight:
    """Quantise ``weight`` to ``fmt`` with GPTQ.

    Parameters
    ----------
    weight:
        Float ``[n_out, k]`` (numpy or torch).
    hessian:
        ``[k, k]`` layer Hessian ``2 X^T X / tokens`` (see :mod:`sw.compress.calibrate`).
    fmt:
        Target format (INT4 or INT8, any group size, symmetric or asymmetric, any pattern).
    mask:
        Optional boolean ``[n_out, k]`` mask of kept weights (at most N per M-block for a sparse
        format, e.g. from Wanda); weights outside it end exactly zero, their pruning error
        compensated by the kept ones. Default for a sparse format: the magnitude N:M mask.
    act_order:
        Quantise columns by descending ``diag(H)`` (group codes then come from the original
        weights; see the module docstring).
    blocksize:
        Columns per lazy update batch.
    percdamp, max_percdamp:
        Dampening of the Hessian diagonal (fraction of its mean) and the largest retry.
    headroom:
        Row scale = headroom x the row scale of plain round-to-nearest, >= 1.
    name:
        Layer name for messages.

    Returns
    -------
    QuantizedWeight
        Dequantises exactly to the weights GPTQ settled on.
    """
    w, h, k = prepare(weight, hessian, fmt, name, blocksize)
    n, kp = w.shape
    p = fmt.pattern
    keep = None
    if mask is not None:
        m = np.asarray(mask.detach().cpu() if hasattr(mask, "detach") else mask)
        if m.dtype != bool:
            raise TypeError(f"{name}: mask must be boolean, got {m.dtype}")
        if m.shape != (n, k):
            raise ValueError(f"{name}: mask shape {m.shape} != weight shape {(n, k)}")
        keep = np.zeros((n, kp), bool)
        keep[:, :k] = m
        if not p.dense:
            check_nm_mask(keep, p)
    elif not p.dense:
        keep = nm_mask(np.abs(w), p)

    dead = dead_features(h)
    perm = None
    if act_order:
        diag = torch.diagonal(h).clone()
        diag[dead] = 1.0  # as the reference: dead columns sort like unit-energy ones
        perm = torch.argsort(diag, descending=True, stable=True).numpy()
    # The grid comes from the kept weights only; the sweep sees all of them, so weights outside
    # the mask are pruned at their turn with their error compensated (OBS with a fixed mask).
    w_kept = w if keep is None else np.where(keep, w, np.float32(0))
    grid = make_grid(w_kept, keep, fmt, kp, headroom, perm)
    if perm is not None:
        pt = torch.from_numpy(perm)
        h = h[pt][:, pt]
        w = w[:, perm]
        keep = None if keep is None else keep[:, perm]
        dead = dead[pt]
    u, _ = inverse_hessian_factor(h, percdamp=percdamp, max_percdamp=max_percdamp, name=name)
    wt = torch.from_numpy(np.ascontiguousarray(w.T))
    kt = None if keep is None else torch.from_numpy(np.ascontiguousarray(keep.T))
    q, ints, kt = obs_sweep(wt, u.to(torch.float32), keep=kt, grid=grid, dead=dead,
                            blocksize=blocksize)
    _, qw = finish(q, ints, kt, grid, fmt, k, perm)
    return qw

