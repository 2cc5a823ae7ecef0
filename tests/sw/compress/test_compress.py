"""Compression core: N:M pruning, group quantisation, validation of bad input."""

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hw.config import ConfigError, NMPattern
from hw.format import WeightFormat, pack, unpack
from sw.compress.core import PaddingWarning, compress_matrix
from sw.compress.prune import check_nm_mask, nm_block_keep, nm_keep_index, nm_mask, tie_rule

SPARSE = ["1:4", "2:4", "3:4", "1:8", "2:8", "4:8", "4:16", "8:16"]


@given(st.sampled_from(SPARSE), st.integers(1, 20), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_mask_keeps_the_n_largest_of_every_block(pat, rows, blocks, seed):
    p = NMPattern.parse(pat)
    rng = np.random.default_rng(seed)
    # Small integers: plenty of ties, which must go to the lower index.
    s = rng.integers(0, 4, size=(rows, blocks * p.m)).astype(np.float32)
    mask = nm_mask(s, p)
    b = mask.reshape(rows, blocks, p.m)
    assert (b.sum(axis=2) == p.n).all()
    sb = s.reshape(rows, blocks, p.m)
    ref = np.argsort(-sb, axis=2, kind="stable")[:, :, :p.n]
    assert np.array_equal(np.sort(ref, axis=2).reshape(rows, -1), nm_keep_index(s, p))


@given(st.sampled_from(SPARSE), st.integers(1, 12), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_tie_rule_is_one_rule_on_every_path(pat, rows, blocks, seed):
    """Equal scores keep the lower in-block index (a stable descending sort), in numpy and in
    the torch selection inside SparseGPT's sweep, whatever the thread count; the opposite rule
    (for sensitivity studies only) is its mirror image."""
    from sw.compress.gptq import _nm_keep_t
    p = NMPattern.parse(pat)
    s = np.random.default_rng(seed).integers(0, 3, size=(rows, blocks * p.m)).astype(np.float32)
    sb = s.reshape(rows, blocks, p.m)
    order = np.argsort(-sb, axis=2, kind="stable")[:, :, :p.n]
    expected = np.zeros(sb.shape, bool)
    np.put_along_axis(expected, order, True, axis=2)
    assert np.array_equal(nm_mask(s, p), expected.reshape(rows, -1))
    threads = torch.get_num_threads()
    try:
        for n_threads in (1, 2):
            torch.set_num_threads(n_threads)
            # the sweep scores columns: [K, n_out], M consecutive rows form a block
            got = _nm_keep_t(torch.from_numpy(np.ascontiguousarray(s.T)), p).numpy().T
            assert np.array_equal(got, expected.reshape(rows, -1))
    finally:
        torch.set_num_threads(threads)
    with tie_rule("higher"):
        mirrored = nm_mask(s.reshape(rows, blocks, p.m)[:, :, ::-1].reshape(rows, -1), p)
        assert np.array_equal(nm_block_keep(torch.from_numpy(sb.copy()), p.n).numpy(),
                              nm_block_keep(sb, p.n))
    assert np.array_equal(mirrored.reshape(rows, blocks, p.m)[:, :, ::-1], expected)
    with pytest.raises(ValueError, match="unknown tie rule 'random'"):
        with tie_rule("random"):
            pass


@given(st.sampled_from(SPARSE + ["dense"]), st.sampled_from([4, 8]), st.sampled_from([0, 32, 128]),
       st.booleans(), st.integers(1, 30), st.integers(1, 200), st.integers(0, 2**32 - 1))
def test_compressed_matrix_respects_pattern_and_round_trips(pat, bits, group, sym, n, k, seed):
    p = NMPattern.parse(pat)
    if group and group % p.block:
        group = 0
    fmt = WeightFormat(p, bits, group, symmetric=sym)
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PaddingWarning)
        qw = compress_matrix(w, fmt)
    deq = qw.dequantize()
    if not p.dense:
        # Every M-block of the pruned matrix has at most N non-zeros.
        dense = np.zeros((n, qw.k_padded), np.float32)
        dense[:, :k] = deq
        check_nm_mask(dense != 0, p)
    assert np.array_equal(unpack(pack(qw, 8), fmt, (n, k), 8, qw.row_scale).dequantize(), deq)
    # Kept values are rounded to their group's grid: error at most half a step (plus the
    # clipping allowed by the 8-bit code's rounding, a few percent of the group range).
    step = qw.row_scale[:, None] * qw.codes.astype(np.float32)
    assert np.isfinite(deq).all() and step.min() > 0


def test_quantisation_error_bounds_on_dense():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    for fmt in (WeightFormat("dense", 4, 64), WeightFormat("dense", 4, 64, symmetric=False),
                WeightFormat("dense", 8, 128)):
        qw = compress_matrix(w, fmt)
        step = np.repeat(qw.row_scale[:, None] * qw.codes.astype(np.float32),
                         fmt.steps_per_group(256), axis=1)
        assert np.all(np.abs(qw.dequantize() - w) <= 0.51 * step + 0.02 * np.abs(w))


def test_magnitude_pruning_keeps_largest():
    w = np.array([[0.1, -0.9, 0.3, 0.2, 5.0, 0.0, -0.1, 4.0]], np.float32)
    qw = compress_matrix(w, WeightFormat("2:4", 8, 8))
    assert list(qw.index[0]) == [1, 2, 0, 3]


def test_scores_and_mask_hooks():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    scores = -np.abs(w)  # keep the smallest: a hook must be obeyed, not magnitude
    qw = compress_matrix(w, WeightFormat("2:4", 8, 16), scores=scores)
    assert np.array_equal(qw.index, nm_keep_index(scores, NMPattern(2, 4)))
    mask = np.zeros_like(w, dtype=bool)
    mask[:, ::4] = True  # one per block: the format fills the second slot with a zero
    qw = compress_matrix(w, WeightFormat("2:4", 8, 16), mask=mask)
    deq = qw.dequantize()
    assert not deq[~mask].any()
    with pytest.raises(ValueError, match="row 0, block 0 keeps 3"):
        m3 = mask.copy()
        m3[0, :3] = True
        compress_matrix(w, WeightFormat("2:4", 8, 16), mask=m3)


@pytest.mark.parametrize("weight, error, needle", [
    (np.array([[1.0, np.nan]] * 4, np.float32), ValueError, r"non-finite .* first at \[0, 1\]"),
    (np.array([[np.inf] * 4], np.float32), ValueError, "non-finite"),
    (np.zeros((0, 4), np.float32), ValueError, "empty"),
    (np.zeros((4,), np.float32), ValueError, "2-D"),
    (np.zeros((4, 4), np.int32), TypeError, "floating point, got int32"),
    (torch.zeros((4, 4), dtype=torch.int64), TypeError, "floating point, got torch.int64"),
    ([[1.0, 2.0]], TypeError, "numpy array or torch tensor"),
])
def test_bad_weights(weight, error, needle):
    with pytest.raises(error, match=needle):
        compress_matrix(weight, WeightFormat("2:4", 4, 32))


def test_bad_patterns_and_bits():
    with pytest.raises(ConfigError, match="N must be < M"):
        NMPattern.parse("4:2")
    with pytest.raises(ConfigError, match="M must be a power of two"):
        NMPattern.parse("2:5")
    with pytest.raises(ValueError, match=r"bits must be one of \(4, 8\)"):
        WeightFormat("2:4", bits=2)


def test_non_divisible_k_is_padded_and_said():
    w = np.random.default_rng(0).standard_normal((4, 30)).astype(np.float32)
    with pytest.warns(PaddingWarning, match="K=30 padded with 2 zero columns to 32"):
        qw = compress_matrix(w, WeightFormat("2:4", 4, 32))
    assert qw.k_padded == 32 and qw.dequantize().shape == (4, 30)


def test_torch_input_and_mismatched_hooks():
    w = torch.randn(8, 16, dtype=torch.bfloat16)
    qw = compress_matrix(w, WeightFormat("2:4", 4, 16))
    assert qw.shape == (8, 16)
    with pytest.raises(ValueError, match="scores shape"):
        compress_matrix(w, WeightFormat("2:4", 4, 16), scores=np.ones((8, 8)))
    with pytest.raises(TypeError, match="mask must be boolean"):
        compress_matrix(w, WeightFormat("2:4", 4, 16), mask=np.ones((8, 16)))
    with pytest.raises(ValueError, match="not both"):
        compress_matrix(w, WeightFormat("2:4", 4, 16), mask=np.ones((8, 16), bool),
                        scores=np.ones((8, 16)))
