"""GPTQ: exact format, agreement with round-to-nearest, error compensation, damping, masks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from compress_testutil import layer, out_err, round_trips
from hypothesis import given, settings
from hypothesis import strategies as st

from hw.format import WeightFormat
from sw.compress import gptq as gptq_mod
from sw.compress.core import PaddingWarning, compress_matrix
from sw.compress.gptq import (
    DampingWarning,
    HessianError,
    gptq_compress,
    inverse_hessian_factor,
)
from sw.compress.prune import check_nm_mask, nm_mask
from sw.compress.wanda import wanda_mask

DENSE_FMTS = [WeightFormat("dense", 4, 32), WeightFormat("dense", 4, 128),
              WeightFormat("dense", 4, 32, symmetric=False),
              WeightFormat("dense", 4, 128, symmetric=False)]


@pytest.mark.parametrize("fmt", DENSE_FMTS,
                         ids=lambda f: f"g{f.group}-{'sym' if f.symmetric else 'asym'}")
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_gptq_beats_rtn(fmt, act_order, seed):
    x, w, h = layer(seed)
    qw = gptq_compress(w, h, fmt, act_order=act_order)
    assert out_err(x, w, qw) < out_err(x, w, compress_matrix(w, fmt))
    assert round_trips(qw)


def test_gptq_int8_and_whole_row_groups():
    x, w, h = layer(2, k=96)
    for fmt in (WeightFormat("dense", 8, 32), WeightFormat("dense", 4, 0),
                WeightFormat("dense", 8, 0, symmetric=False)):
        qw = gptq_compress(w, h, fmt)
        assert out_err(x, w, qw) < out_err(x, w, compress_matrix(w, fmt))
        assert round_trips(qw)


@settings(max_examples=12)
@given(st.sampled_from(["dense", "2:4", "1:4", "4:8", "2:8", "4:16"]), st.sampled_from([4, 8]),
       st.sampled_from([0, 16, 32, 64]), st.booleans(), st.booleans(), st.integers(1, 20),
       st.integers(1, 70), st.integers(0, 2**32 - 1))
def test_identity_hessian_is_round_to_nearest(pat, bits, group, sym, act_order, n, k, seed):
    # With H = I no error propagates, so GPTQ must reproduce the core's RTN bit for bit: the
    # grid (row scale, codes, zeros) and the rounding follow sw.compress.quant exactly.
    fmt = WeightFormat(pat, bits, group if group % WeightFormat(pat).block == 0 else 0,
                       symmetric=sym)
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PaddingWarning)
        qw = gptq_compress(w, np.eye(k), fmt, act_order=act_order, headroom=1.0)
        ref = compress_matrix(w, fmt)
    assert qw.equals(ref)
    assert round_trips(qw, 8)


def test_diagonal_hessian_with_act_order_is_round_to_nearest():
    # A non-trivial permutation (diag(H) descending) but still no coupling between columns.
    rng = np.random.default_rng(4)
    w = rng.standard_normal((16, 64)).astype(np.float32)
    h = np.diag(rng.random(64) + 0.1)
    fmt = WeightFormat("dense", 4, 32, symmetric=False)
    assert gptq_compress(w, h, fmt, act_order=True, headroom=1.0).equals(compress_matrix(w, fmt))


def test_result_is_exactly_what_the_sweep_settled_on(monkeypatch):
    # Every call checks that the packed weight dequantises to the values whose error was
    # propagated; a grid whose real values disagree with its integers must be caught.
    x, w, h = layer(3, k=64)
    gptq_compress(w, h, WeightFormat("dense", 4, 32))  # the check passes silently
    real_quantize = gptq_mod.QuantGrid.quantize

    def off_by_a_bit(self, col, c, keep):
        q, real = real_quantize(self, col, c, keep)
        return q, real * np.float32(1 + 2**-20)

    monkeypatch.setattr(gptq_mod.QuantGrid, "quantize", off_by_a_bit)
    with pytest.raises(RuntimeError, match="does not dequantise"):
        gptq_compress(w, h, WeightFormat("dense", 4, 32))


@pytest.mark.parametrize("sym", [True, False])
def test_gptq_after_a_sparse_mask_keeps_pruned_weights_zero(sym):
    x, w, h = layer(5)
    norms = np.linalg.norm(x, axis=0)
    fmt = WeightFormat("2:4", 4, 32, symmetric=sym)
    mask = wanda_mask(w, norms, "2:4")
    mask[0, :4] = [True, False, False, False]  # a block with fewer than N kept stays so
    qw = gptq_compress(w, h, fmt, mask=mask)
    deq = qw.dequantize()
    assert not deq[~mask].any()
    check_nm_mask(deq != 0, fmt.pattern)
    assert round_trips(qw)
    rtn = compress_matrix(w, fmt, mask=mask)
    assert out_err(x, w, qw) < out_err(x, w, rtn)


def test_gptq_on_a_pruned_matrix_keeps_its_zeros():
    x, w, h = layer(6)
    p = WeightFormat("2:4", 4, 32).pattern
    pruned = np.where(nm_mask(np.abs(w), p), w, np.float32(0))
    deq = gptq_compress(pruned, h, WeightFormat("2:4", 4, 32)).dequantize()
    assert not deq[pruned == 0].any()


def test_bad_masks():
    _, w, h = layer(7, k=32)
    fmt = WeightFormat("2:4", 4, 32)
    with pytest.raises(ValueError, match="violates 2:4"):
        gptq_compress(w, h, fmt, mask=np.ones(w.shape, bool))
    with pytest.raises(TypeError, match="boolean"):
        gptq_compress(w, h, fmt, mask=np.ones(w.shape))
    with pytest.raises(ValueError, match="mask shape"):
        gptq_compress(w, h, fmt, mask=np.ones((3, 3), bool))


def test_padding_keeps_shape_and_pads_nothing_visible():
    x, w, h = layer(8, k=40)
    with pytest.warns(PaddingWarning, match="K=40 padded"):
        qw = gptq_compress(w, h, WeightFormat("2:4", 4, 32))
    assert qw.shape == (48, 40) and qw.k_padded == 64
    assert not qw.int_weight()[:, 40:].any()
    assert round_trips(qw)


# ---------------------------------------------------------------------- damping
def rank_deficient(seed: int = 9):
    """Inputs with duplicated and never-active features: a singular Hessian."""
    x, w, _ = layer(seed, k=64)
    x[:, 10] = x[:, 3]
    x[:, 11] = 2 * x[:, 3]
    x[:, 20:24] = 0
    return x, w, 2.0 * x.T @ x / x.shape[0]


def test_rank_deficient_hessian_works_with_default_damping():
    x, w, h = rank_deficient()
    fmt = WeightFormat("dense", 4, 32)
    qw = gptq_compress(w, h, fmt)
    assert out_err(x, w, qw) < out_err(x, w, compress_matrix(w, fmt))


def test_slightly_indefinite_hessian_succeeds_by_retry():
    # Accumulation rounding can leave a singular Hessian slightly indefinite: 1% dampening
    # is not enough, the retry at 10% is.
    x, w, h = rank_deficient()
    h = h - 0.05 * np.mean(np.diag(h)) * np.eye(64)
    with pytest.warns(DampingWarning, match="succeeded with 0.1"):
        _, used = inverse_hessian_factor(torch.from_numpy(h), name="blk.0.q")
    assert used == pytest.approx(0.1)
    fmt = WeightFormat("dense", 4, 32)
    with pytest.warns(DampingWarning):
        qw = gptq_compress(w, h, fmt)
    assert round_trips(qw)


def test_impossible_hessians_raise_clear_errors():
    _, w, h = rank_deficient()
    h_nan = h.copy()
    h_nan[5, 7] = np.nan
    with pytest.raises(HessianError, match=r"layers\.3\.mlp: Hessian has 1 non-finite"):
        gptq_compress(w, h_nan, WeightFormat("dense", 4, 32), name="layers.3.mlp")
    with pytest.raises(HessianError, match=r"layers\.3\.mlp: Cholesky .* \(0\.01, 0\.1, 1 x"):
        gptq_compress(w, -h, WeightFormat("dense", 4, 32), name="layers.3.mlp")
    with pytest.raises(HessianError, match=r"shape \(64, 64\) does not match .* 32"):
        gptq_compress(w[:, :32], h, WeightFormat("dense", 4, 32))


# ---------------------------------------------------------------------- the blocked sweep
def naive_sweep(w, u, keep, select, grid):
    """The textbook sweep: after every column, update every later column at once."""
    w = w.clone()
    kp, n = w.shape
    q_all, ints = torch.zeros_like(w), torch.zeros((kp, n), dtype=torch.int32)
    sal = 1 / torch.diagonal(u) ** 2

    def top_n(rows):  # keep the N highest saliencies of every M-block of rows [c, c + len)
        c0, c1 = rows.start, rows.stop
        s = (w[rows] ** 2 * sal[rows, None]).reshape(-1, select.m, n)
        order = torch.argsort(s, dim=1, descending=True)
        k = torch.zeros_like(s, dtype=torch.bool).scatter_(1, order[:, :select.n], True)
        return k.reshape(c1 - c0, n)

    for c in range(kp):
        if select is not None and c % select.m == 0:
            keep[c:c + select.m] = top_n(slice(c, c + select.m))
        if grid is not None and c % grid.group == 0:
            rows = slice(c, min(c + grid.group, kp))
            kg = top_n(rows) if select is not None else (
                keep[rows] if keep is not None else torch.ones_like(w[rows], dtype=torch.bool))
            grid.set_group(int(grid.col_group[c]), w[rows], kg)
        kc = None if keep is None else keep[c]
        if grid is not None:
            ints[c], q = grid.quantize(w[c], c, kc)
        else:
            q = w[c] if kc is None else torch.where(kc, w[c], torch.zeros((), dtype=w.dtype))
        q_all[c] = q
        w[c:] -= torch.outer(u[c, c:], (w[c] - q) / u[c, c])
    return q_all, ints, keep


@pytest.mark.parametrize("select, fixed_mask", [(None, False), (None, True), ("2:4", False)])
@pytest.mark.parametrize("group", [None, 16, 32, 0])
@pytest.mark.parametrize("blocksize", [8, 40, 128])
def test_blocked_sweep_matches_a_naive_sweep(select, fixed_mask, group, blocksize):
    # Two-level lazy batches, group codes from pending updates: the same arithmetic as the
    # textbook algorithm (float64 here, so rounding decisions agree exactly).
    from hw.config import NMPattern
    from sw.compress.gptq import inverse_hessian_factor as ihf
    from sw.compress.gptq import make_grid, obs_sweep

    x, w, h = layer(11, n=12, k=96)
    u, _ = ihf(torch.from_numpy(h))
    fmt = WeightFormat(select or "dense", 4, group or 0, symmetric=group != 16)
    p = NMPattern.parse(select) if select else None
    keep = nm_mask(np.abs(w), NMPattern(2, 4)) if fixed_mask else None
    if keep is not None:
        w = np.where(keep, w, np.float32(0))
    grid_keep = keep if p is None else nm_mask(np.abs(w), p)
    grids = [None, None] if group is None else [
        make_grid(w, grid_keep, fmt, 96, 1.05, None) for _ in range(2)]
    wt = torch.from_numpy(w.T.astype(np.float64))
    kt = None if keep is None else torch.from_numpy(np.ascontiguousarray(keep.T))
    got = obs_sweep(wt.clone(), u, keep=kt, select=p, grid=grids[0], blocksize=blocksize)
    naive_keep = torch.zeros_like(wt, dtype=torch.bool) if p is not None else (
        None if kt is None else kt.clone())
    want = naive_sweep(wt, u, naive_keep, p, grids[1])
    assert torch.allclose(got[0], want[0], rtol=1e-9, atol=1e-12)
    if group is not None:
        assert torch.equal(got[1], want[1]) and torch.equal(grids[0].codes, grids[1].codes)
    if p is not None or kt is not None:
        assert torch.equal(got[2], want[2])
