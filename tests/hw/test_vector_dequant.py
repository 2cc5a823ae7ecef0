# amaranth: UnusedElaboratable=no
"""DEQUANT's numerics (hw.numerics.dequant_channels / vec_dequant and their torch twins)
against a float64 reference within the stated bound, and its factor unit
(hw/vector/dequant.py) with the Scale behind it against the numerics bit for bit."""

import numpy as np
import pytest
import torch
from vector_testutil import check_latency, run_unit

from hw import timing
from hw.numerics import (
    ACT_FRAC,
    ACT_MAX,
    ACT_QMAX,
    DEQUANT_EXP_MAX,
    DEQUANT_MANT_BITS,
    DEQUANT_ZERO_AMAX,
    act_scale,
    dequant_channels,
    dequant_channels_torch,
    dequant_output,
    dequant_output_vector,
    dequant_output_vector_torch,
    round_shift,
    saturate,
    scores_channels,
    scores_channels_torch,
    scores_epilogue,
    scores_prologue,
    scores_prologue_vector,
    scores_vector,
    vec_dequant,
    vec_dequant_factor,
    vec_dequant_factor_torch,
    vec_dequant_torch,
)
from hw.vector import Scale
from hw.vector.dequant import DEQUANT_SCALE_FRAC, DequantFactor

INT32 = np.iinfo(np.int32)


def operands(seed: int, tokens: int = 16, n: int = 64):
    """Accumulators (uniform int32, small, the ends), float32 row scales over 2**-40 .. 2**20
    (and the values a real weight has, and 0), and amax words (0, 1, activations' and the
    word's ends)."""
    rng = np.random.default_rng(seed)
    acc = rng.integers(INT32.min, INT32.max, (tokens, n), endpoint=True)
    small = rng.random((tokens, n)) < 0.5
    acc[small] = rng.integers(-2**16, 2**16, int(small.sum()))
    acc[0, :4] = [INT32.max, INT32.min, 0, -1]
    scale = np.exp2(rng.uniform(-40, 20, n)).astype(np.float32)
    scale[:4] = [0, 2**-12, 1e-3, 1.0]
    amax = np.concatenate([[0, 1, 2**31, 2**32 - 1, ACT_QMAX << ACT_FRAC],
                           rng.integers(1, 2**32, tokens - 5)])
    amax[-3:] = rng.integers(2**15, 2**24, 3)   # activations of magnitude 0.5 .. 256
    return acc, scale, amax


def reference(acc, scale, amax) -> np.ndarray:
    """``acc * row_scale * act_scale * 2**16`` in float64 (act_scale exact: amax / 127 * 2**-16,
    1 for amax 0)."""
    a = np.where(amax > 0, amax.astype(np.float64) / ACT_QMAX * 2.0 ** -ACT_FRAC, 1.0)
    return acc * scale.astype(np.float64)[None] * a[:, None] * 2.0 ** ACT_FRAC


@pytest.mark.parametrize("seed", range(4))
def test_dequant_is_within_its_error_bound_of_the_float64_reference(seed):
    """``|y - Y| <= 2**-16 * (1 + 2**-16) * |Y| + 1/2`` where ``Y`` is unsaturated; the
    saturated ones are exactly +-ACT_MAX where ``|Y|`` is past it (by more than the bound)."""
    acc, scale, amax = operands(seed)
    y = vec_dequant(acc, dequant_channels(scale), amax)
    ref = reference(acc, scale, amax)
    bound = 2.0 ** -16 * (1 + 2.0 ** -16) * np.abs(ref) + 0.5
    inside = np.abs(ref) + bound < ACT_MAX
    assert np.all(np.abs(y - ref)[inside] <= bound[inside])
    outside = np.abs(ref) - bound > ACT_MAX
    assert np.array_equal(y[outside], np.sign(ref[outside]).astype(np.int64) * ACT_MAX)
    assert inside.sum() > 200 and outside.sum() > 50   # both regimes exercised
    # the bound is tight to a factor of 2: the worst relative error of large outputs
    big = inside & (np.abs(ref) > 2**20)
    assert (np.abs(y - ref)[big] / np.abs(ref[big])).max() > 2.0 ** -18


def test_the_vector_epilogue_is_near_the_float_one():
    """``dequant_output_vector`` against the float32 WIDE epilogue: within 2**-16 relatively
    plus 2**-16 absolutely (the bound above and the float32 epilogue's own 2**-23)."""
    acc, scale, amax = operands(9)
    acc = acc >> 8
    y = dequant_output_vector(acc, dequant_channels(scale), amax).astype(np.float64)
    want = dequant_output(acc, scale, act_scale(amax)).astype(np.float64)
    ok = np.abs(want) < 2**14
    assert np.all(np.abs(y - want)[ok] <= 2.0 ** -16 * np.abs(want[ok]) * 1.01 + 2.0 ** -16)


def test_channel_words_hold_their_scale_within_2_pow_minus_17():
    rng = np.random.default_rng(3)
    scale = np.exp2(rng.uniform(-100, 23, 4000)).astype(np.float32)
    scale[:3] = [127 * (2**17 - 1), 2**-104, np.nextafter(np.float32(1), 2)]  # the ends
    w = dequant_channels(scale)
    m, e = w & ((1 << DEQUANT_MANT_BITS) - 1), w >> DEQUANT_MANT_BITS
    assert ((m >= 2**16) & (m < 2**17) & (e >= 0) & (e <= DEQUANT_EXP_MAX)).all()
    c = scale.astype(np.float64) / ACT_QMAX
    assert np.all(np.abs(m * np.exp2(-e.astype(np.float64)) - c) <= 2.0 ** -17 * c)
    assert (w >> 31 == 0).all()
    # 0 and scales below the exponent's range give the zero word; below, outputs are 0
    assert dequant_channels(np.array([0, 2**-120], np.float32)).tolist() == [0, 0]
    assert vec_dequant(np.array([INT32.max]), dequant_channels(np.array([2**-104],
                       np.float32)), np.array(2**32 - 1)).tolist() == [0]


@pytest.mark.parametrize("bad", [-1e-3, np.inf, np.nan, 127 * 2.0**17 - 1])
def test_a_scale_no_word_holds_is_refused_by_name(bad):
    scale = np.array([1e-3, bad], np.float32)
    with pytest.raises(ValueError, match=r"row_scale\[1\]"):
        dequant_channels(scale)
    with pytest.raises(ValueError, match=r"row_scale\[1\]"):
        dequant_channels_torch(torch.from_numpy(scale))


def test_amax_must_be_a_32_bit_word():
    with pytest.raises(ValueError, match="unsigned 32-bit"):
        vec_dequant(np.array([1]), np.array([1 << 16]), np.array([2**32]))


@pytest.mark.parametrize("seed", range(2))
def test_torch_twin_is_bit_identical(seed):
    acc, scale, amax = operands(20 + seed)
    chan = dequant_channels(scale)
    tchan = dequant_channels_torch(torch.from_numpy(scale))
    assert np.array_equal(tchan.numpy(), chan)
    # arbitrary words too: unnormalised mantissas, any exponent, bits above ignored
    rng = np.random.default_rng(seed)
    words = rng.integers(0, 2**31, 64)
    for w in (chan, words):
        t = (torch.from_numpy(acc), torch.from_numpy(w), torch.from_numpy(amax))
        assert np.array_equal(vec_dequant_torch(*t).numpy(), vec_dequant(acc, w, amax))
        q, sh = vec_dequant_factor_torch(t[1], t[2])
        assert np.array_equal(q.numpy(), vec_dequant_factor(w, amax)[0])
        assert np.array_equal(sh.numpy(), vec_dequant_factor(w, amax)[1])
        x = rng.integers(0, 32, amax.shape)     # a FOLD word's shift per row
        assert np.array_equal(vec_dequant_torch(*t, torch.from_numpy(x)).numpy(),
                              vec_dequant(acc, w, amax, x))
        y = dequant_output_vector_torch(*t).numpy()
        assert np.array_equal(y.view(np.uint32), dequant_output_vector(acc, w, amax)
                              .view(np.uint32))


def factor_elements(chan, amax, shift=None):
    """Each element's unit payload: the word, and the row's ``a``, ``b`` and ``x`` (the
    sequencer's scalars; ``shift`` 0 unless given per row)."""
    els = []
    shift = np.zeros(len(amax), np.int64) if shift is None else shift
    for row_amax, x in zip(amax, shift, strict=True):
        a = int(row_amax) or DEQUANT_ZERO_AMAX
        els += [{"chan": int(w), "a": a, "b": a.bit_length(), "x": int(x)} for w in chan]
    return els


@pytest.mark.parametrize("seed", range(2))
def test_the_factor_unit_and_scale_compute_vec_dequant(seed):
    """DequantFactor gives ``vec_dequant_factor``'s ``(q, sh + 31)`` (normalised and arbitrary
    words, every amax regime, and for seed 1 a FOLD word's shift of 0..31 per row) and
    Scale(31) of it is ``vec_dequant``; both stall-safe."""
    acc, scale, amax = operands(30 + seed, tokens=8, n=24)
    rng = np.random.default_rng(seed)
    chan = np.concatenate([dequant_channels(scale), rng.integers(0, 2**32, 8)])
    acc = np.concatenate([acc, rng.integers(INT32.min, INT32.max, (8, 8))], axis=1)
    shift = rng.integers(0, 32, len(amax)) * seed
    shift[:2] = [0, 31] if seed else 0
    run = run_unit(DequantFactor(), factor_elements(chan, amax, shift), seed=seed)
    q, sh = vec_dequant_factor(chan, amax, shift)
    assert np.array_equal(run.field("r"), q.reshape(-1))
    assert np.array_equal(run.field("sh"), (sh + DEQUANT_SCALE_FRAC).reshape(-1))
    run2 = run_unit(Scale(DEQUANT_SCALE_FRAC),
                    [{"x": int(x), "r": int(r), "sh": int(s)}
                     for x, r, s in zip(acc.reshape(-1), run.field("r"), run.field("sh"),
                                        strict=True)])
    assert np.array_equal(run2.field("y"), vec_dequant(acc, chan, amax, shift).reshape(-1))
    assert np.array_equal(run2.field("y"), saturate(round_shift(acc * q, sh)).reshape(-1))


def test_the_factor_unit_latency():
    run = run_unit(DequantFactor(), factor_elements(np.array([1 << 16]), np.array([5])))
    check_latency(run, timing.VECTOR_LATENCY["dequant_factor"])


# ---------------------------------------------------------------------- attention's scores
@pytest.mark.parametrize("scale", [0.125, 0.0883883476, 1.0])
def test_score_channels_fold_the_softmax_scale_into_the_key_scales(scale):
    """``scores_channels(s_k, scale)`` is ``dequant_channels`` of the float64 product (no
    float32 rounding between), within 2**-17 of it; the torch twin is bit-equal; scale 1
    gives the plain channel words."""
    rng = np.random.default_rng(11)
    s_k = np.exp2(rng.uniform(-30, 4, (2, 300))).astype(np.float32)
    s_k[0, :2] = [0, 1]
    w = scores_channels(s_k, scale)
    assert np.array_equal(w, scores_channels_torch(torch.from_numpy(s_k), scale).numpy())
    m, e = w & ((1 << DEQUANT_MANT_BITS) - 1), w >> DEQUANT_MANT_BITS
    c = s_k.astype(np.float64) * scale / ACT_QMAX
    assert np.all(np.abs(m * np.exp2(-e.astype(np.float64)) - c) <= 2.0 ** -17 * c)
    if scale == 1.0:
        assert np.array_equal(w, dequant_channels(s_k))


@pytest.mark.parametrize("seed", range(3))
def test_scores_on_chip_are_within_their_bound_of_the_scaled_float_scores(seed):
    """:func:`scores_vector` (grouped-query: 4 heads on 2 kv heads, 3 tokens) within
    ``2**-16 * (1 + 2**-16) * |z| + 2**-17`` of the exact ``z = acc * s_q * s_k * scale``
    (``s_q = amax / 127 * 2**-16``, in float64), and within ``2**-16 * |z| + 2**-16`` of the
    float path's ``scores_epilogue * scale`` (float32, its own 2**-23 relative error); the
    query codes are the float prologue's with the vector unit's requantisation."""
    g = torch.Generator().manual_seed(seed)
    b, h, kv, t, s, d = 1, 4, 2, 3, 40, 16
    q = torch.randn((b, h, t, d), generator=g) * 3
    k8 = torch.randint(-127, 128, (b, kv, s, d), generator=g, dtype=torch.int32)
    s_k = torch.exp2(torch.empty((b, kv, s)).uniform_(-10, -4, generator=g))
    scale = d ** -0.5
    q8, amax = scores_prologue_vector(q, kv)
    assert torch.equal(q8, scores_prologue(q, kv, vector=True)[0])
    acc = torch.einsum("bkrd,bksd->bkrs", q8.to(torch.int64), k8.to(torch.int64))
    z = scores_vector(acc, amax, s_k, scale, h).double()
    exact = (acc.double() * (amax.double() / ACT_QMAX * 2.0 ** -ACT_FRAC)[..., None]
             * s_k.double()[..., None, :] * scale).reshape(b, h, t, s)
    assert exact.abs().max() < 2 ** 8 and exact.abs().max() > 1   # float32-exact, not tiny
    assert torch.all((z - exact).abs() <= 2.0 ** -16 * (1 + 2.0 ** -16) * exact.abs()
                     + 2.0 ** -17)
    flt = (scores_epilogue(acc, act_scale_t(amax), s_k, h) * scale).double()
    assert torch.all((z - flt).abs() <= 2.0 ** -16 * flt.abs() + 2.0 ** -16)
    assert not torch.equal(z, flt)   # the on-chip path is its own rounding


def act_scale_t(amax: torch.Tensor) -> torch.Tensor:
    """:func:`act_scale` of torch ``amax`` words."""
    return torch.from_numpy(act_scale(amax.numpy()))
