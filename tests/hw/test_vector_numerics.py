"""The vector unit's exact integer numerics (hw.numerics, "vector unit"): the torch twin equals
numpy bit for bit, the results stay within their stated error bounds of float, edge cases."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hw.numerics import (
    ACT_FRAC,
    ACT_MAX,
    ACT_QMAX,
    FOLD_AMAX_MANT_BITS,
    NORM_FRAC,
    act_scale,
    act_scale_torch,
    add_vector,
    fold_amax,
    fold_amax_word,
    fold_values_vector,
    from_fixed,
    from_fixed_torch,
    gemm_acc_torch,
    insert_offsets,
    kv_rows,
    norm_eps,
    norm_weight,
    norm_weight_torch,
    quantize_activations,
    quantize_activations_vector,
    quantize_activations_vector_torch,
    requant_amax,
    rms_norm_vector,
    rope_pairs,
    rope_table,
    rope_table_torch,
    rope_unpack,
    rope_vector,
    round_shift,
    round_shift_torch,
    silu_gate_vector,
    softmax_vector,
    to_fixed,
    to_fixed_torch,
    value_amax_torch,
    values_epilogue,
    values_prologue,
    vec_add,
    vec_add_torch,
    vec_argmax,
    vec_argmax_torch,
    vec_argmax_words,
    vec_exp,
    vec_exp_torch,
    vec_fold,
    vec_fold_torch,
    vec_insert,
    vec_mul,
    vec_mul_torch,
    vec_recip,
    vec_recip_torch,
    vec_requant,
    vec_requant_torch,
    vec_rmsnorm,
    vec_rmsnorm_torch,
    vec_rope,
    vec_rope_pairs,
    vec_rope_torch,
    vec_rsqrt,
    vec_rsqrt_torch,
    vec_silu_gate,
    vec_silu_gate_torch,
    vec_softmax,
    vec_softmax_torch,
)
from sw.models.llama import apply_rotary, attention_probs, causal_mask, rms_norm, rotary_tables

ONE = 1 << ACT_FRAC
#: Activations from tiny to saturated (the format's whole range, with its edges).
ACTS = st.one_of(st.integers(-ACT_MAX, ACT_MAX), st.integers(-4 * ONE, 4 * ONE),
                 st.sampled_from([0, 1, -1, ACT_MAX, -ACT_MAX, ONE, -ONE]))


def rows(width: tuple[int, int] = (1, 40), n: tuple[int, int] = (1, 4), elems=ACTS):
    """Integer activation matrices ``[n, width]`` as int64 numpy arrays."""
    return st.integers(*n).flatmap(lambda r: st.integers(*width).flatmap(
        lambda c: st.lists(st.lists(elems, min_size=c, max_size=c), min_size=r, max_size=r)
    )).map(lambda v: np.array(v, dtype=np.int64))


def t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def same(a, b) -> bool:
    return np.array_equal(np.asarray(a), b.numpy())


# ---------------------------------------------------------------------- twin == golden
@given(st.lists(st.integers(1, 2**53 - 1), min_size=1, max_size=30))
def test_recip_rsqrt_twin_and_bound(xs):
    x = np.array(xs, dtype=np.int64)
    for f, ft, ref in ((vec_recip, vec_recip_torch, 1 / x.astype(np.float64)),
                       (vec_rsqrt, vec_rsqrt_torch, 1 / np.sqrt(x.astype(np.float64)))):
        r, sh = f(x)
        rt, sht = ft(t(x))
        assert same(r, rt) and same(sh, sht)
        # documented bound 2**-13 (table 2**-7.5 squared by Newton, 16-bit mantissa, floors)
        approx = r.astype(np.float64) * np.exp2(-sh.astype(np.float64))
        assert np.all(np.abs(approx / ref - 1) < 2.0**-13)
        assert r.max() <= 2**16  # Newton converges from below the table's midpoint


@given(st.lists(st.one_of(st.integers(-40 * ONE, 0), st.integers(-(2**32) + 1, 0)),
                min_size=1, max_size=30))
def test_exp_twin_and_bound(ds):
    d = np.array(ds, dtype=np.int64)
    ref = np.exp(d / ONE)
    for frac in (ACT_FRAC, NORM_FRAC):
        e = vec_exp(d, frac)
        assert same(e, vec_exp_torch(t(d), frac))
        # documented: 2**-12 relative (constants, interpolation) + the final rounding
        assert np.all(np.abs(e / 2.0**frac - ref) <= 2.0**-12 * ref + 2.0**-frac)


def test_exp_of_zero_is_one_and_positive_operands_are_refused():
    assert vec_exp(np.array([0]))[0] == ONE
    with pytest.raises(ValueError, match="exp of 5"):
        vec_exp(np.array([5]))


@given(rows(), rows())
def test_add_mul_saturate(a, b):
    b = np.resize(b, a.shape)
    assert same(vec_add(a, b), vec_add_torch(t(a), t(b)))
    assert same(vec_mul(a, b), vec_mul_torch(t(a), t(b)))
    assert np.abs(vec_add(a, b)).max() <= ACT_MAX and np.abs(vec_mul(a, b)).max() <= ACT_MAX
    assert np.array_equal(vec_add(a, b), np.clip(a + b, -ACT_MAX, ACT_MAX))


@given(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=10), st.integers(-8, 70))
def test_round_shift_twin(vs, s):
    v = np.array(vs, dtype=np.int64)
    assert same(round_shift(v, s), round_shift_torch(t(v), s))
    if 0 < s <= 40:  # round half up: floor(v / 2**s + 1/2)
        assert np.array_equal(round_shift(v, s), np.floor(v / 2.0**s + 0.5).astype(np.int64))


@given(rows(width=(2, 16)).map(lambda x: x[:, : x.shape[1] // 2 * 2]),
       st.floats(-1e4, 1e4, allow_nan=False))
def test_rope_twin_and_bound(x, angle):
    h = x.shape[1] // 2
    ang = angle * np.geomspace(1, 1e-3, h)
    ang = np.concatenate([ang, ang]).astype(np.float32)
    c, s = rope_table(np.cos(ang)), rope_table(np.sin(ang))
    assert same(c, rope_table_torch(torch.cos(t(ang))))
    y = vec_rope(x, c, s)
    assert same(y, vec_rope_torch(t(x), t(c), t(s)))
    xf = x.astype(np.float64)
    ref = xf * np.cos(ang) + np.concatenate([-xf[:, h:], xf[:, :h]], 1) * np.sin(ang)
    # tables rounded to 2**-15 each: at most 2**-14 * (|x1| + |x2|) + the output's half unit;
    # saturation clips what exceeds the format
    bound = 2.0**-14 * (np.abs(xf) + np.abs(np.concatenate([xf[:, h:], xf[:, :h]], 1))) + 0.5
    assert np.all(np.abs(y - np.clip(ref, -ACT_MAX, ACT_MAX)) <= bound + 1e-6 * np.abs(ref))


@given(rows(elems=st.integers(-8 * ONE, 8 * ONE)), rows(elems=st.integers(-8 * ONE, 8 * ONE)))
def test_silu_gate_twin_and_bound(g, u):
    u = np.resize(u, g.shape)
    y = vec_silu_gate(g, u)
    assert same(y, vec_silu_gate_torch(t(g), t(u)))
    gf, uf = g / ONE, u / ONE
    ref = gf / (1 + np.exp(-gf)) * uf
    # sigmoid within 2**-12 relatively (+ 2**-30), then two half-unit roundings
    bound = 2.0**-12 * np.abs(ref) + 2.0**-30 * np.abs(gf * uf) + 2.0**-17 * (1 + np.abs(uf))
    assert np.all(np.abs(y / ONE - ref) <= bound)


def test_silu_gate_saturates():
    g = np.array([[ACT_MAX, -ACT_MAX, ACT_MAX]])
    u = np.array([[ACT_MAX, ACT_MAX, -ACT_MAX]])
    assert vec_silu_gate(g, u).tolist() == [[ACT_MAX, 0, -ACT_MAX]]


@given(rows(width=(1, 64)), st.sampled_from([0.0, 1e-6, 1e-5, 1e-2]), st.integers(0, 2**32))
@settings(max_examples=150)
def test_rmsnorm_twin_and_bound(x, eps, seed):
    k = x.shape[1]
    w = np.random.default_rng(seed).normal(1.0, 0.5, k).astype(np.float32)
    wq, e = norm_weight(w, k), norm_eps(eps, k)
    assert same(wq, norm_weight_torch(t(w), k))
    y = vec_rmsnorm(x, wq, e)
    assert same(y, vec_rmsnorm_torch(t(x), t(wq), e))
    xf = x / ONE
    ms = (xf**2).mean(-1, keepdims=True) + eps
    ref = np.where(ms > 0, xf / np.sqrt(np.maximum(ms, 1e-300)), 0) * w
    # rsqrt 2**-13, the normalised row's 2**-30 rounding (times sqrt(K) |w|), the weight's
    # rounding (2**-17 relative to sqrt(K)), the output's half unit; saturation clips
    tol = 2.0**-12 * np.abs(ref) + 2.0**-17 * np.sqrt(k) * (1 + np.abs(w)) + 2.0**-16
    assert np.all(np.abs(y / ONE - np.clip(ref, -ACT_MAX / ONE, ACT_MAX / ONE)) <= tol)


def test_rmsnorm_of_zero_row_is_zero():
    for eps in (0, norm_eps(1e-5, 8)):
        assert not vec_rmsnorm(np.zeros((2, 8), np.int64), norm_weight(np.ones(8), 8), eps).any()


@given(rows(width=(1, 50)), st.integers(0, 2**32))
def test_softmax_twin_and_bound(x, seed):
    valid = np.random.default_rng(seed).random(x.shape) < 0.8
    valid[:, 0] = True
    p = vec_softmax(x, valid)
    assert same(p, vec_softmax_torch(t(x), t(valid)))
    xf = np.where(valid, x / ONE, -np.inf)
    ref = np.exp(xf - xf.max(-1, keepdims=True))
    ref /= ref.sum(-1, keepdims=True)
    # documented: within 2**-11 * p + 2**-15 of the exact softmax
    assert np.all(np.abs(p / ONE - ref) <= 2.0**-11 * ref + 2.0**-15)
    assert not p[~valid].any()


def test_softmax_all_equal_and_empty_rows():
    p = vec_softmax(np.full((1, 7), 12345), np.ones((1, 7), bool))
    assert len(set(p[0].tolist())) == 1 and abs(p[0, 0] - ONE / 7) <= 2
    p = vec_softmax(np.full((1, 8), -ACT_MAX), np.ones((1, 8), bool))
    assert p[0].tolist() == [ONE // 8] * 8  # a power of two: the reciprocal is exact
    assert not vec_softmax(np.zeros((1, 4), np.int64), np.zeros((1, 4), bool)).any()


@given(rows(width=(1, 64)))
def test_requant_twin_and_bound(x):
    a, amax = vec_requant(x)
    at, amaxt = vec_requant_torch(t(x))
    assert same(a, at) and same(amax, amaxt)
    assert same(act_scale(amax), act_scale_torch(amaxt))
    ideal = x * ACT_QMAX / np.maximum(amax, 1)[:, None]
    # reciprocal error 2**-13 of at most 127 codes, plus the half code of rounding
    assert np.all(np.abs(a - ideal) <= 0.5 + ACT_QMAX * 2.0**-13)
    assert np.all(act_scale(amax) == np.where(amax > 0, (amax / ACT_QMAX / ONE), 1
                                              ).astype(np.float32))


def test_requant_zero_row_and_extremes():
    a, amax = vec_requant(np.array([[0, 0], [ACT_MAX, -ACT_MAX], [1, -1]]))
    assert a.tolist() == [[0, 0], [127, -127], [127, -127]] and amax.tolist() == [0, ACT_MAX, 1]
    assert act_scale(amax)[0] == 1.0


@given(rows(width=(1, 30), elems=st.integers(-3, 3)))
def test_argmax_lowest_index_on_ties(x):
    i = vec_argmax(x)
    assert same(i, vec_argmax_torch(t(x)))
    for row, k in zip(x, i, strict=True):
        assert row[k] == row.max() and not (row[:k] == row.max()).any()


@given(st.lists(st.integers(-2, 2), min_size=1, max_size=40), st.integers(1, 9))
def test_argmax_of_segments_then_of_their_pairs_is_the_rows(xs, seg):
    """A row cut into segments of ``seg`` elements (the last shorter): each segment's ARGMAX
    words with its first index as base, their PAIRS ARGMAX is the whole row's (the index of
    its first maximum, ties across segments to the earlier one: a few values, many ties)."""
    x = np.array(xs, dtype=np.int64)
    pairs = np.concatenate([vec_argmax_words(x[s:s + seg], s) for s in range(0, len(x), seg)])
    assert vec_argmax_words(pairs, pairs=True).tolist() == [int(vec_argmax(x)), int(x.max())]


def test_argmax_words_base_and_pairs():
    """The index word: the base plus the first maximum's index, or plus the index word of
    the first pair of maximal value (an odd last word ignored), wrapping to int32."""
    assert vec_argmax_words(np.array([1, 3, 3]), 10).tolist() == [11, 3]
    assert vec_argmax_words(np.array([7, 1, 4, 5, -9, 5, 0]), pairs=True).tolist() == [4, 5]
    assert vec_argmax_words(np.array([2**31 - 1, 0]), 2, pairs=True).tolist() == [-2**31 + 1, 0]


@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=1, max_size=20))
def test_fixed_conversions(xs):
    x = np.array(xs, dtype=np.float32)
    q = to_fixed(x)
    assert same(q, to_fixed_torch(t(x)))
    assert np.array_equal(to_fixed(from_fixed(q)), q)  # float64 holds every word
    want = np.clip(x.astype(np.float64), -ACT_MAX / ONE, ACT_MAX / ONE)
    assert np.all(np.abs(q / ONE - want) <= 0.5 / ONE)
    assert to_fixed(np.array([np.inf, -np.inf])).tolist() == [ACT_MAX, -ACT_MAX]
    with pytest.raises(ValueError, match="NaN"):
        to_fixed(np.array([np.nan]))


# ---------------------------------------------------------------------- the float interface
def test_quantize_activations_vector_twin_and_float():
    x = np.random.default_rng(1).normal(0, 3, (5, 40)).astype(np.float32)
    x[2] = 0
    a, s = quantize_activations_vector(x)
    at, st_ = quantize_activations_vector_torch(t(x))
    assert same(a, at) and same(s, st_)
    a_f, s_f = quantize_activations(x)
    # same codes as the float quantiser but where the reciprocal's 2**-13 error and the
    # input's 2**-17 rounding move a value across a rounding boundary: at most one code
    assert np.abs(a.astype(int) - a_f).max() <= 1
    assert np.allclose(s, s_f, rtol=2.0**-15) and s[2] == 1.0


def test_values_fold_matches_the_float_fold():
    rng = np.random.default_rng(2)
    b, h, kv, tq, s = 1, 4, 2, 3, 9
    probs = torch.softmax(torch.from_numpy(rng.normal(0, 2, (b, h, tq, s))).float(), -1)
    probs = from_fixed_torch(to_fixed_torch(probs))  # on the grid, as the unit's softmax writes
    v = torch.from_numpy(rng.normal(0, 1, (b, kv, s, 8))).float()
    _, s_v = kv_rows(v, vector=True)
    p8, word = fold_values_vector(probs, value_amax_torch(v), kv)
    p8_f, s_pf = values_prologue(probs, s_v, kv)
    # the same folded values to within a code (integer fold, reciprocal error) and their scale
    # (the amax word's scale amax / (127 * 127) * 2**-32: the float fold's within 2**-12)
    assert (p8.int() - p8_f.int()).abs().max() <= 1
    s_p = torch.from_numpy(fold_amax(word.numpy())) / (ACT_QMAX * ACT_QMAX) * 2.0 ** -32
    assert torch.allclose(s_p.float(), s_pf, rtol=2.0**-12)


@pytest.mark.parametrize(("seed", "kv_bits"), [(0, 8), (1, 8), (2, 4), (3, 4)])
def test_the_vector_values_epilogue_is_within_its_bound_of_the_float_one(seed, kv_bits):
    """values_vector (DEQUANT of the P.V accumulators with FOLD's amax words) against the
    exact z = acc * amax_w / (127 * qmax) * 2**-32 and the float epilogue, within the bounds
    its docstring states: (2**-16 + 2**-25)|z| + 2**-17 of z, (2**-16 + 2**-22)|z| + 2**-17 of
    the float epilogue (the bounds are the derivation's, so no slack is added). Rows of
    probabilities from peaked to flat (the amax words' shift 0 and above), an all-zero one,
    values from small to large; the values' scales are the cache's (INT8 or INT4)."""
    rng = np.random.default_rng(seed)
    b, h, kv, tq, n, d = 1, 4, 2, 2, 17, 16
    logits = rng.normal(0, rng.choice([0.1, 3.0, 30.0]), (b, h, tq, n))
    probs = from_fixed_torch(to_fixed_torch(torch.softmax(torch.from_numpy(logits), -1)))
    probs[0, 0, 0] = 0.0
    v = torch.from_numpy(rng.normal(0, 1, (b, kv, n, d)) * np.exp2(rng.uniform(-8, 6, (1, kv, n,
                                                                                      1))))
    v8, s_v = kv_rows(v.float(), vector=True, bits=kv_bits)
    c = value_amax_torch(v.float(), kv_bits)
    p8, word = values_prologue(probs, c, kv, vector=True)
    acc = gemm_acc_torch(p8, v8.transpose(-2, -1))
    y = values_epilogue(acc, word, h, vector=True, kv_bits=kv_bits).numpy()
    qmax = ACT_QMAX if kv_bits == 8 else 7
    # the codes are the scales' integers (these rows' amax lie below 2**23)
    assert np.array_equal(c.numpy(), np.rint(s_v.double().numpy() * qmax * ONE))
    c = c.numpy()
    grid = to_fixed(probs.numpy()).reshape(b, kv, h // kv * tq, n)
    amax = vec_fold(grid, c[:, :, None, :])[1]
    z = acc.numpy() * (amax / (ACT_QMAX * qmax) * 2.0 ** -32)[..., None]
    z = z.reshape(y.shape)
    assert np.all(np.abs(y - z) <= (2.0**-16 + 2.0**-25) * np.abs(z) + 2.0**-17)
    s_float = torch.from_numpy(np.where(amax > 0, amax / (ACT_QMAX * qmax) * 2.0 ** -32, 1.0))
    f = values_epilogue(acc, s_float.float(), h).numpy()
    assert np.all(np.abs(y - f) <= (2.0**-16 + 2.0**-22) * np.abs(z) + 2.0**-17)
    assert np.all(y[0, 0, 0] == 0) and np.abs(z).max() > 1.0


@pytest.mark.parametrize("seed", range(4))
def test_vec_fold_is_requant_of_the_exact_products_and_its_twin(seed):
    """FOLD's numerics: on attention-like rows (``0 <= a <= 2**16``, ``0 <= c < 2**31``) the
    products are exact (no saturation: ``|w| < 2**47``) and the result is vec_requant of the
    int64 products; on any int32 words the products saturate to 54 bits; numpy = torch bit for
    bit; fold_values_vector's codes are vec_fold's of its grid probabilities."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, ONE + 1, (6, 33))
    c = rng.integers(0, 1 << 31, (6, 33)) >> rng.integers(0, 31, (6, 1))
    a[1] = 0
    codes, amax = vec_fold(a, c)
    r_codes, r_amax = vec_requant(a * c)
    assert np.array_equal(codes, r_codes) and np.array_equal(amax, r_amax)
    assert amax[1] == 0 and (amax < 1 << 47).all()
    words = rng.integers(-2**31, 2**31, (6, 33))
    other = words[::-1].copy()
    words[0, 0], other[0, 0] = -2**31, -2**31                       # 2**62 saturates
    codes, amax = vec_fold(words, other)
    assert amax.max() <= (1 << 53) - 1 and amax[0] == (1 << 53) - 1
    for x, y in [(a, c), (words, other)]:
        tc, ta = vec_fold_torch(torch.from_numpy(x), torch.from_numpy(y))
        ref = vec_fold(x, y)
        assert np.array_equal(tc.numpy(), ref[0]) and np.array_equal(ta.numpy(), ref[1])
    b, h, kv, tq, n = 1, 4, 2, 3, 9
    probs = torch.softmax(torch.from_numpy(rng.normal(0, 2, (b, h, tq, n))).float(), -1)
    v = torch.from_numpy(rng.normal(0, 1, (b, kv, n, 8))).float()
    p8, _ = fold_values_vector(probs, value_amax_torch(v), kv)
    cv = requant_amax(v.numpy())
    grid = to_fixed(probs.numpy()).reshape(b, kv, h // kv * tq, n)
    assert np.array_equal(p8.numpy(), vec_fold(grid, cv[:, :, None, :])[0])


def test_the_fold_amax_word_holds_amax_within_2_to_the_minus_26():
    """``fold_amax_word``: amax itself below 2**27 (shift 0), else a 27-bit mantissa and the
    shift in the top five bits; ``fold_amax`` of it floors amax by less than 2**-26 relatively;
    the word is an unsigned 32-bit word for every amax FOLD can find (below 2**53)."""
    rng = np.random.default_rng(5)
    amax = np.concatenate([[0, 1, (1 << 27) - 1, 1 << 27, (1 << 53) - 1],
                           rng.integers(0, 1 << 53, 200) >> rng.integers(0, 53, 200)])
    word = fold_amax_word(amax)
    assert ((word >= 0) & (word < 1 << 32)).all()
    small = amax < 1 << FOLD_AMAX_MANT_BITS
    assert np.array_equal(word[small], amax[small])
    back = fold_amax(word)
    assert (back <= amax).all() and (amax - back < back * 2.0 ** -26 + 1).all()
    assert word[4] >> FOLD_AMAX_MANT_BITS == 53 - FOLD_AMAX_MANT_BITS


@pytest.mark.parametrize("head_dim", [2, 8, 64, 128])
def test_packed_rope_tables_give_vec_rope_on_llama_tables(head_dim):
    """The engine's table (one word per pair: ``rope_pairs``) loses nothing on LLaMA tables:
    ``vec_rope_pairs`` over several heads equals ``vec_rope`` with the full tables at every
    position, and so equals the model-level twin ``rope_vector`` (unchanged) bit for bit."""
    rng = np.random.default_rng(head_dim)
    heads, positions = 3, 40
    cos, sin = rotary_tables(head_dim, positions, 10000.0)
    x = rng.integers(-ACT_MAX, ACT_MAX + 1, (positions, heads, head_dim))
    x[0] = ACT_MAX
    x[1] = -ACT_MAX
    x[2] = 0
    x[3] = rng.integers(-(4 << 16), 4 << 16, (heads, head_dim))
    for p in range(positions):
        c, s = rope_table(cos[p].numpy()), rope_table(sin[p].numpy())
        words = rope_pairs(c, s)
        assert words.shape == (head_dim // 2,)
        assert ((words >= -2**31) & (words < 2**31)).all()         # a VIN element
        assert all(np.array_equal(a, b[:head_dim // 2])
                   for a, b in zip(rope_unpack(words), (c, s), strict=True))
        assert np.array_equal(rope_unpack(words.astype(np.int32).view(np.uint32))[1],
                              s[:head_dim // 2])                    # the bits, not the sign
        y = vec_rope_pairs(x[p].ravel(), words, head_dim)
        assert np.array_equal(y, vec_rope(x[p], c, s).ravel())
    xf = torch.from_numpy(rng.normal(0, 3, (positions, heads, head_dim))).float()
    twin = to_fixed_torch(rope_vector(xf, cos[:, None], sin[:, None])).numpy()
    for p in range(positions):
        words = rope_pairs(rope_table(cos[p].numpy()), rope_table(sin[p].numpy()))
        assert np.array_equal(vec_rope_pairs(to_fixed(xf[p].numpy()).ravel(), words, head_dim),
                              twin[p].ravel())


def test_packed_rope_tables_refuse_what_one_word_per_pair_cannot_hold():
    one = 1 << 14
    with pytest.raises(ValueError, match="halves differ"):
        rope_pairs(np.array([one, 0, 0, 0]), np.zeros(4, np.int64))
    with pytest.raises(ValueError, match="even-length"):
        rope_pairs(np.zeros(3, np.int64), np.zeros(3, np.int64))
    with pytest.raises(ValueError, match="sin table value 32768 does not fit 16"):
        rope_pairs(np.zeros(2, np.int64), np.full(2, 1 << 15))
    with pytest.raises(ValueError, match="head_dim=3"):
        vec_rope_pairs(np.zeros(6, np.int64), np.zeros(1, np.int64), 3)
    with pytest.raises(ValueError, match="head_dim=4 needs 2 words"):
        vec_rope_pairs(np.zeros(8, np.int64), np.zeros(3, np.int64), 4)


def test_float_interface_close_to_the_float_ops():
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.normal(0, 2, (2, 3, 5, 16))).float()
    w = torch.from_numpy(rng.normal(1, 0.2, 16)).float()
    # RMSNorm: 2**-12 relative plus the format's units (see test_rmsnorm_twin_and_bound)
    # the float interface returns float64 (exact words): compared as float32, whose
    # rounding is far inside each tolerance
    assert torch.allclose(rms_norm_vector(x, w, 1e-5).float(), rms_norm(x, w, 1e-5), rtol=2.0**-11,
                          atol=2.0**-12)
    cos, sin = rotary_tables(16, 5, 10000.0)
    assert torch.allclose(rope_vector(x, cos, sin).float(), apply_rotary(x, cos, sin),
                          atol=2.0**-9)
    assert torch.allclose(silu_gate_vector(x, x).float(), torch.nn.functional.silu(x) * x,
                          rtol=2.0**-11, atol=2.0**-13)
    mask = causal_mask(5, 0, torch.float32, torch.device("cpu"))
    p = softmax_vector(x[..., :5], 0.25, mask)
    assert not p[..., mask.isinf()].any()
    assert torch.allclose(p.float(), attention_probs(x[..., :5], 0.25, mask), rtol=2.0**-10,
                          atol=2.0**-14)
    big = torch.tensor([3.0e4, 3.0e4, -3.0e4])
    sat = float(from_fixed(np.array([ACT_MAX]))[0])  # the saturated word, 32768 - 2**-16
    assert add_vector(big, big).tolist() == [sat, sat, -sat]


@given(st.integers(0, 2**32 - 1), st.integers(1, 40))
@settings(max_examples=60, deadline=None)
def test_vec_insert_is_the_byte_scatter_of_its_geometry(seed, length):
    """vec_insert against the byte loop it states (code j to byte base + (j // group) *
    (group * stride + skip) + (j % group) * stride when inside the row), on random rows,
    codes and geometries; the bytes no code names keep the row's."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-2**31, 2**31, length)
    b = rng.integers(-2**31, 2**31, length)
    geom = (int(rng.integers(0, 4 * length + 4)), int(rng.integers(1, 20)),
            int(rng.integers(1, 5)), int(rng.integers(1, 9)), int(rng.integers(0, 9)))
    base, group, groups, stride, skip = geom
    want = bytearray(a.astype("<i4").tobytes())
    codes = b.astype("<i4").tobytes()
    for j in range(group * groups):
        at = base + (j // group) * (group * stride + skip) + (j % group) * stride
        if at < len(want):
            want[at] = codes[j]
    got = vec_insert(a, b, *geom)
    assert got.astype("<i4").tobytes() == bytes(want)
    assert np.all(got >= -2**31) and np.all(got < 2**31)
    assert np.all(np.diff(insert_offsets(*geom)) > 0)
