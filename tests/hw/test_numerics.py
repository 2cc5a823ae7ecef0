"""Golden numerics: packed GEMM == dense reference bit for bit; torch twin == numpy twin."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from hw.format import WeightFormat, random_quantized
from hw.numerics import (
    add_bias_wide,
    bias_to_acc,
    dequant_output,
    gemm_acc,
    gemm_acc_packed,
    gemm_acc_torch,
    golden_linear,
    golden_linear_torch,
    kv_rows,
    quantize_activations,
    quantize_activations_torch,
    requantize_int8,
    scores_epilogue,
    scores_prologue,
    values_epilogue,
    values_prologue,
    wrap,
)
from sw.compress.core import compress_matrix

FORMATS = [WeightFormat(p, b, g, s) for p, b, g, s in [
    ("2:4", 4, 128, True), ("1:4", 4, 64, False), ("dense", 4, 32, True), ("2:8", 4, 32, True),
    ("4:8", 4, 0, False), ("4:16", 4, 128, True), ("dense", 8, 64, True), ("dense", 8, 0, False),
    ("3:4", 4, 32, True), ("8:16", 4, 64, False)]]


@given(st.sampled_from(FORMATS), st.integers(1, 40), st.integers(1, 200), st.integers(1, 7),
       st.integers(0, 2**32 - 1))
def test_packed_gemm_equals_dense_reference(fmt, n, k, t, seed):
    rng = np.random.default_rng(seed)
    w = random_quantized(fmt, (n, k), rng)
    a = rng.integers(-127, 128, size=(t, w.k_padded)).astype(np.int8)
    ref = gemm_acc(a, w.int_weight())
    assert np.array_equal(gemm_acc_packed(a, w), ref)
    # Accumulators are 32-bit two's complement.
    assert ref.min() >= -(2**31) and ref.max() < 2**31


def test_wrap_is_twos_complement():
    x = np.array([2**31, 2**31 - 1, -(2**31) - 1, 2**32 + 5, -1], dtype=np.int64)
    assert list(wrap(x, 32)) == [-(2**31), 2**31 - 1, 2**31 - 1, 5, -1]
    assert list(wrap(np.array([128, -129]), 8)) == [-128, 127]


def test_quantize_activations_per_token():
    x = np.array([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0], [3.0, 1.5, -3.0]], np.float32)
    a, s = quantize_activations(x)
    assert s[1] == 1.0 and not a[1].any()
    assert a[0, 1] == -127 and a[2, 0] == 127 and a[2, 2] == -127
    assert np.all(np.abs(a.astype(np.float32) * s[:, None] - x) <= s[:, None] / 2 + 1e-7)
    with pytest.raises(ValueError, match="NaN or Inf"):
        quantize_activations(np.array([[np.nan]], np.float32))
    with pytest.raises(ValueError, match="2-D"):
        quantize_activations(np.zeros(3, np.float32))


@given(st.integers(1, 6), st.integers(1, 70), st.integers(0, 2**32 - 1))
def test_torch_twin_is_bit_identical(t, k, seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((t, k)) * rng.uniform(0.01, 100)).astype(np.float32)
    a, s = quantize_activations(x)
    at, stt = quantize_activations_torch(torch.from_numpy(x))
    assert np.array_equal(a, at.numpy()) and np.array_equal(s.view(np.uint32),
                                                            stt.numpy().view(np.uint32))
    w = random_quantized(WeightFormat("2:4", 4, 32), (11, k), rng)
    y = golden_linear(x, w)
    yt = golden_linear_torch(torch.from_numpy(x), torch.from_numpy(w.int_weight()[:, :k]),
                             torch.from_numpy(w.row_scale))
    assert np.array_equal(y.view(np.uint32), yt.numpy().view(np.uint32))



def _bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


@given(st.integers(1, 2), st.sampled_from([(1, 1), (2, 1), (4, 2), (3, 3)]), st.integers(1, 5),
       st.integers(1, 9), st.integers(1, 16), st.integers(0, 2**32 - 1))
def test_attention_products_are_golden_gemms_per_head(b, heads, t, s, d, seed):
    """The INT8 KV-cache attention prologues and epilogues (grouped-query rows, key scales as
    row scales, value scales folded into the probabilities) compute, head by head, exactly the
    numpy golden GEMM: quantise the activation rows, integer product, WIDE epilogue."""
    h, kv = heads
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(shape, generator=g) * 3
               for shape in ((b, h, t, d), (b, kv, s, d), (b, kv, s, d)))
    probs = torch.softmax(torch.randn((b, h, t, s), generator=g), dim=-1)
    k8, s_k = kv_rows(k)
    v8, s_v = kv_rows(v)
    q8, s_q = scores_prologue(q, kv)
    scores = scores_epilogue(gemm_acc_torch(q8, k8), s_q, s_k, h)
    p8, s_p = values_prologue(probs, s_v, kv)
    out = values_epilogue(gemm_acc_torch(p8, v8.transpose(-2, -1)), s_p, h)
    assert scores.shape == (b, h, t, s) and out.shape == (b, h, t, d)
    for i in range(b):
        for head in range(h):
            j = head // (h // kv)            # the kv head this query head shares
            k8n, s_kn = quantize_activations(k[i, j].numpy())
            v8n, s_vn = quantize_activations(v[i, j].numpy())
            a, s_a = quantize_activations(q[i, head].numpy())
            ref = dequant_output(gemm_acc(a, k8n), s_kn, s_a)
            assert np.array_equal(_bits(scores[i, head]), _bits(ref))
            a, s_a = quantize_activations(probs[i, head].numpy() * s_vn[None, :])
            ref = dequant_output(gemm_acc(a, v8n.T), np.ones(d, np.float32), s_a)
            assert np.array_equal(_bits(out[i, head]), _bits(ref))


@given(st.integers(1, 6), st.integers(1, 70), st.integers(0, 2**32 - 1))
def test_bias_epilogue_twins_and_error_bound(t, k, seed):
    """The WIDE_BIAS path: numpy and torch twins bit-identical; against the float bias added
    after dequantising, the only difference is rounding the bias to an accumulator unit
    (``row_scale * act_scale``): at most half a unit, plus float32 rounding of the output."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((t, k)) * rng.uniform(0.01, 100)).astype(np.float32)
    w = random_quantized(WeightFormat("2:4", 4, 32), (11, k), rng)
    bias = (rng.standard_normal(11) * rng.uniform(0.01, 100)).astype(np.float32)
    y = golden_linear(x, w, bias=bias)
    yt = golden_linear_torch(torch.from_numpy(x), torch.from_numpy(w.int_weight()[:, :k]),
                             torch.from_numpy(w.row_scale), bias=torch.from_numpy(bias))
    assert np.array_equal(y.view(np.uint32), yt.numpy().view(np.uint32))
    _, s_x = quantize_activations(x)
    unit = w.row_scale[None, :].astype(np.float64) * s_x[:, None]
    host = golden_linear(x, w).astype(np.float64) + bias
    # On top, float32 rounding: three roundings (int -> float32, * row_scale, * act_scale) of
    # 2**-24 each in y and in the host's dequantised output, whose size is at most
    # |host| + |bias|: 6 * 2**-24 * (|host| + 2 |bias|) < 2**-20 * (|host| + |bias|).
    tol = 0.5 * unit + 2.0**-20 * (np.abs(host) + np.abs(bias))
    assert np.all(np.abs(y - host) <= tol)


def test_bias_rows_saturate_and_wrap():
    big = bias_to_acc(np.array([1e30, -1e30, 2.5, 3.5], np.float32), np.ones(4, np.float32),
                      np.ones(1, np.float32))
    assert big.tolist() == [[2**31 - 1, -(2**31), 2, 4]]  # saturated; rint: half to even
    got = add_bias_wide(np.array([[2**31 - 1, -5]]), np.array([[1, 5]], np.int32))
    assert got.tolist() == [[-(2**31), 0]]  # modulo 2**32, as WIDE writes int32


def test_requantize_rounding_and_saturation():
    acc = np.array([[10, -10, 3, 1000, -1000, 6]], np.int64)
    mult = np.array([1, 1, 1, 1, 1, 1], np.uint16)
    # shift 2: (x + 2) >> 2 rounds half up: 10 -> 3, -10 -> -2, 3 -> 1, 6 -> 2.
    assert list(requantize_int8(acc, mult, 2)[0]) == [3, -2, 1, 127, -128, 2]
    assert list(requantize_int8(acc, mult, 0, residual=np.array([[1, 1, 1, 1, 1, -1]]))[0]) == \
        [11, -9, 4, 127, -128, 5]
    with pytest.raises(ValueError, match="shift"):
        requantize_int8(acc, mult, 40)
    with pytest.raises(ValueError, match="unsigned 16-bit"):
        requantize_int8(acc, np.array([70000] * 6), 1)


def test_worked_example_in_docs():
    """The worked example of docs/architecture.md section 3, number for number."""
    W = np.array([[0.50, -0.02, 0.00, -0.91, 0.03, 0.27, -0.40, 0.01]], np.float32)
    qw = compress_matrix(W, WeightFormat("2:4", 4, group=8))
    assert list(qw.index[0]) == [0, 3, 1, 2]
    assert list(qw.values[0]) == [4, -7, 2, -3] and qw.codes[0, 0] == 255
    x = np.array([[1.0, 2.0, -1.0, 0.5, 0.0, 1.5, 3.0, -2.0]], np.float32)
    a, s_x = quantize_activations(x)
    assert list(a[0]) == [42, 85, -42, 21, 0, 64, 127, -85]
    acc = gemm_acc(a, qw.int_weight())
    assert acc[0, 0] == 255 * (4 * 42 - 7 * 21 + 2 * 64 - 3 * 127) == -59160
    y = dequant_output(acc, qw.row_scale, s_x)[0, 0]
    assert round(float(y), 4) == -0.7124
    fp32 = float(((W * (np.abs(W) > 0.2)) @ x[0])[0])  # the kept weights, unquantised
    assert round(fp32, 4) == -0.75


def test_error_against_fp32_is_small_for_dense_int4():
    """Reported quantity: relative error of the hardware numerics against fp32 matmul."""
    rng = np.random.default_rng(0)
    W = rng.standard_normal((256, 512)).astype(np.float32)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    qw = compress_matrix(W, WeightFormat("dense", 4, 128))
    err = np.linalg.norm(golden_linear(x, qw) - x @ W.T) / np.linalg.norm(x @ W.T)
    assert 0.01 < err < 0.2  # INT4 g128 + INT8 activations: a few percent, never zero
