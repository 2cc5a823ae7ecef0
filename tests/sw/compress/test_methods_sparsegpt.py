"""SparseGPT: exact N:M, OBS reconstruction beats magnitude, joint quantisation, round trips."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from compress_testutil import layer, out_err, round_trips
from hypothesis import given, settings
from hypothesis import strategies as st

from hw.format import WeightFormat
from sw.compress.core import PaddingWarning, compress_matrix
from sw.compress.gptq import HessianError
from sw.compress.prune import check_nm_mask
from sw.compress.sparsegpt import sparsegpt_compress, sparsegpt_prune


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("pat", ["2:4", "4:8", "1:4"])
def test_pruning_beats_magnitude(pat, seed):
    x, w, h = layer(seed)
    pruned, mask = sparsegpt_prune(w, h, pat)
    fmt = WeightFormat(pat, 8, 0)
    check_nm_mask(mask, fmt.pattern)
    assert (mask.reshape(48, -1, fmt.pattern.m).sum(axis=2) == fmt.pattern.n).all()
    assert not pruned[~mask].any()
    magnitude = np.where(compress_matrix(w, fmt).dequantize() != 0, w, 0)  # float, same N:M
    assert out_err(x, w, pruned) < out_err(x, w, magnitude)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("fmt", [WeightFormat("2:4", 4, 32), WeightFormat("2:4", 4, 128),
                                 WeightFormat("2:4", 4, 32, symmetric=False),
                                 WeightFormat("4:8", 4, 64)],
                         ids=lambda f: f"{f.pattern}-g{f.group}-{'sym' if f.symmetric else 'asym'}")
def test_compressed_beats_magnitude_and_joint_beats_magnitude_rtn(fmt, seed):
    x, w, h = layer(seed)
    base = out_err(x, w, compress_matrix(w, fmt).dequantize())  # magnitude mask + RTN
    for joint in (False, True):
        qw = sparsegpt_compress(w, h, fmt, joint=joint)
        deq = qw.dequantize()
        check_nm_mask(deq != 0, fmt.pattern)
        assert round_trips(qw)
        assert out_err(x, w, deq) < base


@settings(max_examples=10)
@given(st.sampled_from(["2:4", "1:4", "4:8", "2:8", "4:16"]), st.sampled_from([4, 8]),
       st.sampled_from([0, 16, 32]), st.booleans(), st.booleans(), st.integers(1, 12),
       st.integers(1, 60), st.integers(0, 2**32 - 1))
def test_exact_pattern_and_round_trip(pat, bits, group, sym, joint, n, k, seed):
    x = np.random.default_rng(seed).standard_normal((3 * k, k))
    w = np.random.default_rng(seed + 1).standard_normal((n, k)).astype(np.float32)
    fmt = WeightFormat(pat, bits, group if group % WeightFormat(pat).block == 0 else 0,
                       symmetric=sym)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PaddingWarning)
        qw = sparsegpt_compress(w, x.T @ x / len(x), fmt, joint=joint)
    deq = np.zeros((n, qw.k_padded), np.float32)
    deq[:, :k] = qw.dequantize()
    check_nm_mask(deq != 0, fmt.pattern)
    assert round_trips(qw, 8)


def test_identity_hessian_is_magnitude_rtn():
    # With H = I the OBS saliency is the magnitude and nothing propagates: the joint mode must
    # give the core's magnitude + RTN result bit for bit.
    w = np.random.default_rng(3).standard_normal((20, 96)).astype(np.float32)
    for fmt in (WeightFormat("2:4", 4, 32), WeightFormat("4:16", 4, 32, symmetric=False)):
        assert sparsegpt_compress(w, np.eye(96), fmt, headroom=1.0).equals(
            compress_matrix(w, fmt))


def test_errors():
    _, w, h = layer(4, k=32)
    with pytest.raises(ValueError, match="needs a sparse N:M pattern"):
        sparsegpt_compress(w, h, WeightFormat("dense", 4, 32))
    with pytest.raises(HessianError, match=r"attn\.v: Hessian has 2 non-finite"):
        hn = h.copy()
        hn[0, 1] = hn[1, 0] = np.inf
        sparsegpt_compress(w, hn, WeightFormat("2:4", 4, 32), name="attn.v")
    with pytest.raises(HessianError, match=r"attn\.v: Cholesky"):
        sparsegpt_compress(w, -np.eye(32), WeightFormat("2:4", 4, 32), name="attn.v")


def test_dead_features_are_pruned_first():
    # An input feature that never fires costs nothing to prune, so it goes first.
    x, w, _ = layer(5, k=32)
    x[:, 4:8:2] = 0
    h = 2 * x.T @ x / len(x)
    _, mask = sparsegpt_prune(w, h, "2:4")
    assert not mask[:, [4, 6]].any()


@pytest.mark.slow
def test_layer_of_realistic_size():
    # 1024 x 1024 with 1024 calibration tokens: the blocked, lazily updated sweep at scale.
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(1024, 64, generator=g) @ torch.randn(64, 1024, generator=g)
         + 0.3 * torch.randn(1024, 1024, generator=g)).double().numpy()
    w = (0.02 * torch.randn(1024, 1024, generator=g)).numpy()
    h = 2 * x.T @ x / len(x)
    fmt = WeightFormat("2:4", 4, 128)
    qw = sparsegpt_compress(w, h, fmt)
    check_nm_mask(qw.dequantize() != 0, fmt.pattern)
    assert round_trips(qw, 64)
    assert out_err(x, w, qw.dequantize()) < out_err(x, w, compress_matrix(w, fmt).dequantize())
