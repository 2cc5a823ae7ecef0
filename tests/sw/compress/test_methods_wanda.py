"""Wanda: scores, per-row N:M masks, better than magnitude on uneven activations."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
import torch
from compress_testutil import layer, out_err

from hw.format import WeightFormat, pack, unpack
from sw.compress import wanda as wanda_mod
from sw.compress.core import compress_matrix
from sw.compress.prune import check_nm_mask, nm_keep_index
from sw.compress.wanda import wanda_compress, wanda_mask, wanda_scores


def test_scores_are_weight_times_feature_norm():
    x, w, _ = layer(0, k=32)
    norms = np.linalg.norm(x, axis=0)
    s = wanda_scores(torch.from_numpy(w), torch.from_numpy(norms))
    assert np.allclose(s, np.abs(w) * norms[None, :], rtol=1e-12)
    # Compared per output row inside each block: the mask is nm_keep_index of the scores.
    fmt = WeightFormat("2:4", 4, 32)
    assert np.array_equal(wanda_compress(w, norms, fmt).index,
                          nm_keep_index(s.astype(np.float32), fmt.pattern))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("fmt", [WeightFormat("2:4", 4, 32), WeightFormat("4:8", 4, 128),
                                 WeightFormat("2:4", 4, 64, symmetric=False),
                                 WeightFormat("1:4", 8, 32)],
                         ids=lambda f: f"{f.pattern}-int{f.bits}-g{f.group}")
def test_wanda_beats_magnitude(fmt, seed):
    x, w, _ = layer(seed)
    qw = wanda_compress(w, np.linalg.norm(x, axis=0), fmt)
    check_nm_mask(qw.dequantize() != 0, fmt.pattern)
    assert unpack(pack(qw, 16), fmt, qw.shape, 16, qw.row_scale).equals(qw)
    assert out_err(x, w, qw) < out_err(x, w, compress_matrix(w, fmt))


def test_scale_of_norms_does_not_matter_and_dense_is_rtn():
    x, w, _ = layer(3, k=64)
    norms = np.linalg.norm(x, axis=0)
    fmt = WeightFormat("2:4", 4, 32)
    assert wanda_compress(w, norms, fmt).equals(wanda_compress(w, norms / 7.0, fmt))
    dense = WeightFormat("dense", 4, 32)
    assert wanda_compress(w, norms, dense).equals(compress_matrix(w, dense))
    assert wanda_mask(w, norms, "dense").all()


def test_bad_norms():
    _, w, _ = layer(4, k=16)
    with pytest.raises(ValueError, match=r"x_norms shape \(8,\) does not match .* 16"):
        wanda_scores(w, np.ones(8))
    with pytest.raises(ValueError, match="finite and non-negative"):
        wanda_scores(w, -np.ones(16))
    with pytest.raises(ValueError, match="finite and non-negative"):
        wanda_mask(w, np.full(16, np.nan), "2:4")
    with pytest.raises(ValueError, match="not a multiple of M=4"):
        wanda_mask(w[:, :14], np.ones(14), "2:4")


def test_docstring_example():
    assert doctest.testmod(wanda_mod).failed == 0
