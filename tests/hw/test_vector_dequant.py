# amaranth: UnusedElaboratable=no
"""DEQUANT's numerics (hw.numerics.dequant_channels / vec_dequant and their torch twins)
against a float64 reference within the stated bound, and its factor unit
(hw/vector/dequant.py) with the Scale behind it against the numerics bit for bit; CHANNEL's
(hw.numerics.vec_channel, the scores' channel words) likewise, and the factor unit's word."""

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
    KV4_CODE_MAX,
    KV4_QMAX,
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
    scores_channels_vector,
    scores_channels_vector_torch,
    scores_epilogue,
    scores_prologue,
    scores_prologue_vector,
    scores_scale_word,
    scores_vector,
    vec_channel,
    vec_channel_torch,
    vec_dequant,
    vec_dequant_factor,
    vec_dequant_factor_torch,
    vec_dequant_torch,
)
from hw.vector import Scale
from hw.vector.dequant import DEQUANT_SCALE_FRAC, DequantFactor
from sim.random_programs import random_channel_word

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


@pytest.mark.parametrize(("seed", "kv_bits"), [(0, 8), (1, 8), (2, 4)])
def test_scores_on_chip_are_within_their_bound_of_the_scaled_float_scores(seed, kv_bits):
    """:func:`scores_vector` (grouped-query: 4 heads on 2 kv heads, 3 tokens) within
    ``(3 * 2**-17 + 2**-32) * |z| + 2**-17`` of the exact ``z = acc * s_q * s_k * scale``
    (``s_q = amax / 127 * 2**-16``, ``s_k = amax_k / kq * 2**-16``, in float64), and within
    ``2**-15 * |z| + 2**-16`` of the float path's ``scores_epilogue * scale`` (float32 key
    scales, its own 2**-23 relative error); the query codes are the float prologue's with
    the vector unit's requantisation."""
    g = torch.Generator().manual_seed(seed)
    b, h, kv, t, s, d = 1, 4, 2, 3, 40, 16
    q = torch.randn((b, h, t, d), generator=g) * 3
    k8 = torch.randint(-127, 128, (b, kv, s, d), generator=g, dtype=torch.int32)
    kq = ACT_QMAX if kv_bits == 8 else KV4_QMAX * KV4_CODE_MAX
    # key rows of magnitude 2**-4 .. 16 (INT8; s_k = amax_k / kq * 2**-16 the same for INT4)
    amax_k = torch.randint(1 << 12, 1 << 20, (b, kv, s), generator=g, dtype=torch.int64)
    amax_k = amax_k * kq // ACT_QMAX
    s_k = amax_k.double() / kq * 2.0 ** -ACT_FRAC
    scale = d ** -0.5
    q8, amax = scores_prologue_vector(q, kv)
    assert torch.equal(q8, scores_prologue(q, kv, vector=True)[0])
    acc = torch.einsum("bkrd,bksd->bkrs", q8.to(torch.int64), k8.to(torch.int64))
    z = scores_vector(acc, amax, amax_k, scale, h, kv_bits).double()
    exact = (acc.double() * (amax.double() / ACT_QMAX * 2.0 ** -ACT_FRAC)[..., None]
             * s_k[..., None, :] * scale).reshape(b, h, t, s)
    assert exact.abs().max() < 2 ** 8 and exact.abs().max() > 1   # float32-exact, not tiny
    err = (z - exact).abs()
    assert torch.all(err <= (3 * 2.0 ** -17 + 2.0 ** -32) * exact.abs() + 2.0 ** -17)
    # the bound is not loose: the worst relative error of the large scores is within a factor
    # of 6 of it (1.4 .. 1.7 * 2**-17 on these seeds; checked at 2**-18, far from that level)
    big = exact.abs() > 2 ** 4
    assert (err[big] / exact.abs()[big]).max() >= 2.0 ** -18
    flt = (scores_epilogue(acc, act_scale_t(amax), s_k.float(), h) * scale).double()
    assert torch.all((z - flt).abs() <= 2.0 ** -15 * flt.abs() + 2.0 ** -16)
    assert not torch.equal(z, flt)   # the on-chip path is its own rounding


def act_scale_t(amax: torch.Tensor) -> torch.Tensor:
    """:func:`act_scale` of torch ``amax`` words."""
    return torch.from_numpy(act_scale(amax.numpy()))


# ---------------------------------------------------------------------- CHANNEL
def amax_words(rng, n: int) -> np.ndarray:
    """Amax words of every regime: 0, 1, the ends of a word, small, activations', any."""
    a = rng.integers(0, 2**32, n)
    a[: n // 4] = rng.integers(0, 1 << 10, n // 4)
    a[n // 4: n // 2] = rng.integers(1 << 12, 1 << 24, n // 2 - n // 4)
    a[:5] = [0, 1, 2**31 - 1, 2**31, 2**32 - 1]
    return a


def word_value(w: np.ndarray) -> np.ndarray:
    """A channel word's value ``m * 2**-E`` (float64, exact)."""
    w = np.asarray(w, np.int64)
    return (w & ((1 << DEQUANT_MANT_BITS) - 1)) * np.exp2(-((w >> DEQUANT_MANT_BITS)
                                                            & DEQUANT_EXP_MAX).astype(float))


@pytest.mark.parametrize("seed", range(3))
def test_channel_words_hold_the_word_times_amax_within_their_bound(seed):
    """``vec_channel(amax, w)`` for normalised words ``w`` with ``E >= 32``: a normalised
    word within ``2**-17`` of ``value(w) * A`` (``A`` 127 * 2**16 for amax 0), so within
    ``2**-16 + 2**-34`` of ``c0 * A`` for the ``c0`` the word holds within 2**-17; the torch
    twin bit-equal."""
    rng = np.random.default_rng(seed)
    amax = amax_words(rng, 4000)
    for c0 in np.exp2(rng.uniform(-90, -16, 6)):
        word = int(dequant_channels(np.array([c0 * ACT_QMAX], np.float32))[0])
        c0 = float(np.float32(c0 * ACT_QMAX)) / ACT_QMAX   # what dequant_channels holds
        assert word >> DEQUANT_MANT_BITS >= 32
        w = vec_channel(amax, word)
        assert np.array_equal(w, vec_channel_torch(torch.from_numpy(amax), word).numpy())
        m, e = w & ((1 << DEQUANT_MANT_BITS) - 1), w >> DEQUANT_MANT_BITS
        assert ((m >= 2**16) & (m < 2**17) & (e >= 0) & (e <= DEQUANT_EXP_MAX)).all()
        a = np.where(amax > 0, amax, DEQUANT_ZERO_AMAX).astype(np.float64)
        exact = word_value(word) * a   # exact in float64: 17 x 32 bits
        assert np.all(np.abs(word_value(w) - exact) <= 2.0 ** -17 * exact)
        assert np.all(np.abs(word_value(w) - c0 * a) <= (2.0 ** -16 + 2.0 ** -33) * c0 * a)
        # CHANNEL's word is the DEQUANT factor: the same (q, E - k) as vec_dequant_factor
        q, sh = vec_dequant_factor(np.array([word]), amax)
        inside = (sh[:, 0] > -15) & (sh[:, 0] < 63)
        assert np.array_equal(m[inside], q[inside, 0]) and np.array_equal(e[inside],
                                                                          sh[inside, 0])


def test_channel_words_saturate_where_no_word_holds_the_product():
    """``E - k < 0``: the largest word (2**17 - 1, exponent 0); a zero mantissa gives 0; bits
    above 23 of the constant are ignored; a word is not an amax above 32 bits."""
    word = (1 << 16) | (20 << DEQUANT_MANT_BITS)      # 2**-4: the product 2**-4 * A
    amax = np.array([1 << 20, (1 << 20) + 1, 1 << 21, 2**32 - 1, 0])
    w = vec_channel(amax, word)
    assert w[0] == 1 << 16 and w[1] == 1 << 16 | 0       # 2**16 exactly, then rounded
    assert w[2:].tolist() == [(1 << 17) - 1] * 2 + [(1 << 17) - 1]
    assert vec_channel(amax, 20 << DEQUANT_MANT_BITS).tolist() == [0] * 5
    assert np.array_equal(vec_channel(amax, word | (0xABCD << 24)), w)
    with pytest.raises(ValueError, match="unsigned 32-bit"):
        vec_channel(np.array([2**32]), word)


@pytest.mark.parametrize("kv_bits", [8, 4])
@pytest.mark.parametrize("scale", [0.125, 0.0883883476, 0.01, 1.0])
def test_channel_score_words_are_near_the_float_ones(scale, kv_bits):
    """:func:`scores_channels_vector` within ``(2**-16 + 2**-34) * c`` of the exact ``c = s_k *
    scale / 127`` and, for INT8 keys, within ``(3 * 2**-17 + 2**-23) * c`` of the float
    :func:`scores_channels` of the float32 ``s_k`` (the two bounds added)."""
    rng = np.random.default_rng(5)
    amax = amax_words(rng, 3000) >> 1                  # below 2**31, as REQUANT's
    w = scores_channels_vector(amax, scale, kv_bits)
    assert np.array_equal(w, scores_channels_vector_torch(torch.from_numpy(amax), scale,
                                                          kv_bits).numpy())
    kq = ACT_QMAX if kv_bits == 8 else KV4_QMAX * KV4_CODE_MAX
    live = amax > 0
    c = amax[live] / kq * 2.0 ** -ACT_FRAC * scale / ACT_QMAX
    assert np.all(np.abs(word_value(w[live]) - c) <= (2.0 ** -16 + 2.0 ** -34) * c * (1 + 1e-12))
    if kv_bits == 8:
        old = scores_channels(act_scale(amax[live]), scale)
        assert np.all(np.abs(word_value(w[live]) - word_value(old))
                      <= (3 * 2.0 ** -17 + 2.0 ** -23) * c)


@pytest.mark.parametrize("bad", [0.0, -0.125, np.inf, np.nan, 2.0 ** 15, 1e-40])
def test_a_softmax_scale_no_constant_word_holds_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="scale="):
        scores_scale_word(bad)


def test_the_factor_unit_writes_channel_words():
    """DequantFactor's ``word`` is :func:`vec_channel` with each element its own amax (every
    regime, saturation included) and normalised and arbitrary constant words."""
    rng = np.random.default_rng(7)
    amax = amax_words(rng, 48)
    words = [random_channel_word(rng) for _ in range(6)] + [(1 << 16) | (3 << 17), 0]
    els = [{"chan": w & ((1 << 32) - 1), "a": int(a) or DEQUANT_ZERO_AMAX,
            "b": (int(a) or DEQUANT_ZERO_AMAX).bit_length(), "x": 0}
           for w in words for a in amax]
    run = run_unit(DequantFactor(), els, seed=1)
    want = np.concatenate([vec_channel(amax, w) for w in words])
    assert np.array_equal(run.field("word"), want)
