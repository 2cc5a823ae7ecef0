# amaranth: UnusedElaboratable=no
"""The vector unit's elementwise units (hw/vector/elementwise.py) against hw.numerics bit for
bit: random operands, saturation at both ends, the RoPE tables' +-1, negative shifts of Scale,
and requantisation of activation rows and of wide (folded-value) rows."""

import numpy as np
import pytest
from vector_testutil import check_latency, run_ports, run_unit

from hw import timing
from hw.numerics import (
    ACT_FRAC,
    ACT_MAX,
    FOLD_BITS,
    NORM_FRAC,
    ROPE_FRAC,
    round_shift,
    saturate,
    vec_add,
    vec_kv4_rows,
    vec_mul,
    vec_recip,
    vec_requant,
    vec_rope,
    vec_rsqrt,
)
from hw.vector import Add, Mul, Requant, Rope, Scale
from hw.vector.elementwise import ROPE_BITS


def operands(seed: int, n: int = 240) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of activations: uniform, small, and the format's ends (saturating sums and
    products)."""
    rng = np.random.default_rng(seed)
    a = np.concatenate([rng.integers(-ACT_MAX, ACT_MAX + 1, n // 2),
                        rng.integers(-(4 << ACT_FRAC), 4 << ACT_FRAC, n // 2),
                        [ACT_MAX, -ACT_MAX, ACT_MAX, 0, -1]])
    b = np.concatenate([rng.integers(-ACT_MAX, ACT_MAX + 1, n // 2),
                        rng.integers(-(4 << ACT_FRAC), 4 << ACT_FRAC, n // 2),
                        [ACT_MAX, -ACT_MAX, -ACT_MAX, 0, 1]])
    return a, b


def pairs(a, b, names=("a", "b")) -> list[dict]:
    return [{names[0]: int(p), names[1]: int(q)} for p, q in zip(a, b, strict=True)]


def test_add_saturates():
    a, b = operands(1)
    u = Add()
    run = run_unit(u, pairs(a, b))
    assert np.array_equal(run.field("y"), vec_add(a, b))
    assert run.field("y")[-5] == ACT_MAX and run.field("y")[-4] == -ACT_MAX
    check_latency(run, timing.VECTOR_LATENCY["add"])


@pytest.mark.parametrize("frac", [ACT_FRAC, NORM_FRAC])
def test_mul_matches_numerics(frac):
    a, b = operands(2 + frac)
    run = run_unit(Mul(frac), pairs(a, b))
    assert np.array_equal(run.field("y"), vec_mul(a, b, frac))
    check_latency(run, timing.VECTOR_LATENCY["mul"])


def test_mul_of_rmsnorm_weights():
    """RMSNorm's ``n * w``: ``|n| <= 2**30``, weights of 33 bits."""
    rng = np.random.default_rng(3)
    n = rng.integers(-(1 << NORM_FRAC), (1 << NORM_FRAC) + 1, 200)
    w = rng.integers(-(1 << 32) + 1, 1 << 32, 200)
    n[:2], w[:2] = [1 << NORM_FRAC, -(1 << NORM_FRAC)], [(1 << 32) - 1, (1 << 32) - 1]
    run = run_unit(Mul(NORM_FRAC, b_bits=33), pairs(n, w))
    assert np.array_equal(run.field("y"), vec_mul(n, w, NORM_FRAC))


def test_mul_of_fold_saturates_at_54_bits():
    """FOLD's products ``sat54(a * c)`` (frac 0, y_bits 54): attention's (probabilities in
    [0, 2**16] times codes below 2**31, exact) and any int32 pair, whose products up to 2**62
    saturate to +-(2**53 - 1), as ``saturate(a * c, FOLD_BITS)``."""
    rng = np.random.default_rng(6)
    p = rng.integers(0, (1 << 16) + 1, 100)
    c = rng.integers(0, 1 << 31, 100)
    a, b = operands(7)
    a = np.concatenate([p, a, [-2**31, -2**31, 2**31 - 1]])
    b = np.concatenate([c, b, [-2**31, 2**31 - 1, 2**31 - 1]])
    run = run_unit(Mul(0, y_bits=FOLD_BITS), pairs(a, b))
    assert np.array_equal(run.field("y"), saturate(a * b, FOLD_BITS))
    assert np.array_equal(run.field("y")[:100], p * c)
    assert run.field("y")[-3] == (1 << 53) - 1 and run.field("y")[-2] == -(1 << 53) + 1
    check_latency(run, timing.VECTOR_LATENCY["mul"])


def test_a_mul_of_several_modes_is_each_of_them():
    """A ``Mul`` shared by uses of different ``(frac, y_bits)`` (the vector engine's lanes:
    MUL's, RMSNORM's weight, FOLD's products), the mode chosen per element, mixed in one
    stream and with stalls: each element's result is its mode's own unit's, bit for bit, at
    the same latency."""
    modes = ((ACT_FRAC, 32), (NORM_FRAC, 32), (0, FOLD_BITS))
    rng = np.random.default_rng(8)
    a, b = operands(9)
    b = np.concatenate([b, [(1 << 32) - 1, -(1 << 32) + 1]])   # RMSNorm's 33-bit weights
    a = np.concatenate([a, [ACT_MAX, -ACT_MAX]])
    mode = rng.integers(0, len(modes), len(a))
    unit = Mul(modes=modes, b_bits=33)
    els = [{"a": int(p), "b": int(q), "mode": int(k)} for p, q, k in zip(a, b, mode, strict=True)]
    want = np.array([saturate(round_shift(np.int64(0) + int(p) * int(q), modes[k][0]),
                              modes[k][1]) if modes[k][1] == FOLD_BITS else
                     vec_mul(np.array([p]), np.array([q]), modes[k][0])[0]
                     for p, q, k in zip(a, b, mode, strict=True)], dtype=np.int64)
    for seed in (None, 10):
        run = run_unit(unit, els, seed=seed)
        assert np.array_equal(run.field("y"), want)
    assert set(mode) == {0, 1, 2}
    check_latency(run_unit(unit, els), timing.VECTOR_LATENCY["mul"])


def rope_elements() -> tuple[list[dict], np.ndarray]:
    """Rotary elements ``(x, rot, cos, sin)`` (random, saturating, the word and table
    extremes) and their results."""
    rng = np.random.default_rng(4)
    d, heads = 16, 12
    one = 1 << ROPE_FRAC
    x = rng.integers(-ACT_MAX, ACT_MAX + 1, (heads, d))
    x[0] = ACT_MAX
    x[1] = -ACT_MAX
    x[2] = rng.integers(-(8 << ACT_FRAC), 8 << ACT_FRAC, d)
    cos = rng.integers(-one, one + 1, (heads, d))
    sin = rng.integers(-one, one + 1, (heads, d))
    cos[:2], sin[:2] = one, one          # saturating: x * 1 + x * 1
    x[3] = -2**31                        # a VIN word past -ACT_MAX: rot = 2**31 (33 bits)
    x[4, ::2] = -2**31
    cos[3:5] = -(1 << (ROPE_BITS - 1))   # the table halves' extremes
    sin[3:5] = (1 << (ROPE_BITS - 1)) - 1
    h = d // 2
    rot = np.concatenate((-x[:, h:], x[:, :h]), axis=-1)
    els = [{"x": int(p), "rot": int(q), "cos": int(c), "sin": int(s)}
           for p, q, c, s in zip(x.ravel(), rot.ravel(), cos.ravel(), sin.ravel(), strict=True)]
    return els, vec_rope(x, cos, sin).ravel()


def test_a_mul_with_the_rope_mode_is_rope_and_mul():
    """A ``Mul`` with :data:`Mul.ROPE` among its modes (the vector engine's lanes: ROPE's
    rotation on MUL's multipliers, its operands selected by the mode), the rotation's
    elements mixed with products in one stream and with stalls: each result is ``Rope``'s or
    its mode's ``Mul``'s, bit for bit, at both units' latency."""
    modes = ((ACT_FRAC, 32), (0, FOLD_BITS), Mul.ROPE)
    rope_els, rope_want = rope_elements()
    a, b = operands(13)
    rng = np.random.default_rng(14)
    mul_mode = rng.integers(0, 2, len(a))
    els = [{"a": e["x"], "b": e["rot"], "cos": e["cos"], "sin": e["sin"], "mode": 2}
           for e in rope_els]
    want = list(rope_want)
    for p, q, k in zip(a, b, mul_mode, strict=True):
        els.append({"a": int(p), "b": int(q), "mode": int(k),
                    "cos": int(rng.integers(-2**15, 2**15)),
                    "sin": int(rng.integers(-2**15, 2**15))})
        want.append(saturate(round_shift(np.int64(p) * np.int64(q), modes[k][0]), modes[k][1]))
    order = rng.permutation(len(els))
    els, want = [els[i] for i in order], np.array(want, dtype=np.int64)[order]
    unit = Mul(modes=modes, b_bits=33)
    for seed in (None, 15):
        run = run_unit(unit, els, seed=seed)
        assert np.array_equal(run.field("y"), want)
    assert timing.VECTOR_LATENCY["rope"] == timing.VECTOR_LATENCY["mul"]
    check_latency(run_unit(unit, els), timing.VECTOR_LATENCY["mul"])

def test_rope_matches_numerics():
    els, want = rope_elements()
    u = Rope()
    run = run_unit(u, els)
    assert np.array_equal(run.field("y"), want)
    check_latency(run, timing.VECTOR_LATENCY["rope"])


def _scale_operands(rng: np.random.Generator, n: int) -> tuple[np.ndarray, ...]:
    """``n`` random ``(x, r, sh)`` of a ``Scale``: activations (the extremes and 0 first) and
    the table units' outputs, half ``vec_recip``'s, half ``vec_rsqrt``'s, of operands of
    every bit length."""
    x = rng.integers(-ACT_MAX, ACT_MAX + 1, n)
    x[:3] = [ACT_MAX, -ACT_MAX, 0]
    ops = np.int64(1) << rng.integers(0, 53, n) | rng.integers(0, 1 << 20, n)
    r1, sh1 = vec_recip(ops[:n // 2])
    r2, sh2 = vec_rsqrt(ops[n // 2:])
    return x, np.concatenate([r1, r2]), np.concatenate([sh1, sh2])


@pytest.mark.parametrize("frac", [ACT_FRAC, NORM_FRAC])
def test_scale_matches_numerics(frac):
    """``(r, sh)`` of both table units over every bit length: right shifts and, for 30
    fraction bits and small operands, left shifts."""
    x, r, sh = _scale_operands(np.random.default_rng(5 + frac), 200)
    run = run_unit(Scale(frac), [{"x": int(a), "r": int(b), "sh": int(c)}
                                 for a, b, c in zip(x, r, sh, strict=True)])
    assert np.array_equal(run.field("y"), saturate(round_shift(x * r, sh - frac)))
    assert (sh < frac).any() == (frac == NORM_FRAC)   # both directions of the shift covered
    check_latency(run, timing.VECTOR_LATENCY["scale"])


def test_a_scale_of_several_fracs_is_each_of_them():
    """A ``Scale`` shared by uses of different ``frac`` (the vector engine's lanes: SOFTMAX's
    16, RMSNORM's 30, DEQUANT's 31), the mode chosen per element, mixed in one stream and
    with stalls: each element's result is ``Scale(frac)``'s, bit for bit (left shifts
    included), at the same latency."""
    from hw.vector.dequant import DEQUANT_SCALE_FRAC
    fracs = (ACT_FRAC, NORM_FRAC, DEQUANT_SCALE_FRAC)
    rng = np.random.default_rng(11)
    x, r, sh = _scale_operands(rng, 300)
    mode = rng.integers(0, len(fracs), len(x))
    f = np.array(fracs)[mode]
    unit = Scale(fracs)
    els = [{"x": int(a), "r": int(b), "sh": int(c), "mode": int(k)}
           for a, b, c, k in zip(x, r, sh, mode, strict=True)]
    want = saturate(round_shift(x * r, sh - f))
    for seed in (None, 12):
        run = run_unit(unit, els, seed=seed)
        assert np.array_equal(run.field("y"), want)
    assert (sh < f).any() and (sh > f).any()   # both directions of the shift covered
    check_latency(run_unit(unit, els), timing.VECTOR_LATENCY["scale"])

def test_a_scale_saturates_exactly_at_the_edges():
    """Products whose rounded shift lands on, beside and past the 32-bit saturation bounds,
    at every shift a table result gives (``sh`` from ``SH_MIN`` up), for each ``frac`` of the
    engine's shared ``Scale``: its last stage reads whether ``p``'s bits that land at
    ``2**32`` and above are all its sign from a mask of the shift, not from a full-width
    ``w``."""
    from hw.vector.dequant import DEQUANT_SCALE_FRAC
    from hw.vector.tables import SH_BITS, SH_MIN
    fracs = (ACT_FRAC, NORM_FRAC, DEQUANT_SCALE_FRAC)
    rng = np.random.default_rng(13)
    els, want = [], []
    for k, frac in enumerate(fracs):
        for sh in range(SH_MIN, 1 << SH_BITS):
            s = sh - frac
            for target in (ACT_MAX - 1, ACT_MAX, ACT_MAX + 1, -ACT_MAX, -ACT_MAX - 1,
                           -ACT_MAX - 2):
                r = int(rng.integers(1 << 15, (1 << 16) + 1))
                x0 = round(target * 2.0 ** s / r)
                for x in {min(max(x0 + d, -ACT_MAX - 1), ACT_MAX) for d in (-1, 0, 1)}:
                    els.append({"x": x, "r": r, "sh": sh, "mode": k})
                    want.append(saturate(round_shift(np.int64(x) * r, s)))
    y = run_unit(Scale(fracs), els).field("y")
    assert np.array_equal(y, np.array(want, dtype=np.int64))
    assert {ACT_MAX, -ACT_MAX, ACT_MAX - 1, -ACT_MAX + 1} <= set(y.tolist())


def requant_elements(rows_, x_bits):
    """Each row's elements with its ``(r, sh, s)`` as the INT8 requantisation sequence
    computes them (hw/vector/__init__.py), and the expected codes."""
    els, want = [], []
    for row in rows_:
        amax = int(np.abs(row).max())
        s = max(0, amax.bit_length() - 31)
        r, sh = vec_recip(np.array([max(amax >> s, 1)]))
        els += [{"x": int(e), "r": int(r[0]), "sh": int(sh[0]), "s": s, "four": 0, "key": 0}
                for e in row]
        want += list(vec_requant(row)[0])
    assert max(e["s"] for e in els) <= x_bits - 32   # the unit's range of s
    return els, np.array(want)


def test_requant_matches_numerics():
    rng = np.random.default_rng(6)
    data = [rng.integers(-ACT_MAX, ACT_MAX + 1, int(k)) for k in rng.integers(1, 20, 20)]
    data += [np.zeros(4, np.int64), np.array([ACT_MAX, -ACT_MAX, 1]), np.array([-1, 0, 1]),
             rng.integers(-300, 300, 16)]
    els, want = requant_elements(data, 32)
    u = Requant()
    run = run_unit(u, els)
    assert np.array_equal(run.field("a"), want)
    check_latency(run, timing.VECTOR_LATENCY["requant"])


def test_requant_of_wide_rows():
    """The values prologue's rows: up to 2**53 - 1, shifted right by up to 22 first."""
    rng = np.random.default_rng(7)
    top = (1 << 53) - 1
    data = [rng.integers(-(1 << int(b)), 1 << int(b), 12) for b in rng.integers(20, 54, 16)]
    data += [np.array([top, -top, 0, 1]), np.array([-top, (1 << 31) - 1])]
    els, want = requant_elements(data, 54)
    run = run_unit(Requant(54), els, seed=8)
    assert np.array_equal(run.field("a"), want)


def kv4_elements(rng: np.random.Generator, n: int):
    """Requant's elements of ``n`` random KV4 rows and three special ones (the int32 extremes,
    zeros), value rows and key rows of groups 1, 2 and 8, with vec_kv4_rows' codes."""
    els, want = [], []
    rows = [rng.integers(-ACT_MAX - 1, ACT_MAX + 1, 8 * int(k)) for k in rng.integers(1, 5, n)]
    rows += [np.zeros(8, np.int64), np.array([-ACT_MAX - 1, ACT_MAX, 3, -3] * 2),
             rng.integers(-50, 50, 16)]
    for k, row in enumerate(rows):
        group = None if k % 3 == 0 else int(rng.choice([1, 2, 8]))
        q, c, a, s = vec_kv4_rows(row, group)
        if group is None:
            r, sh = (np.repeat(v, row.size) for v in vec_recip(np.array([max(int(a), 1)])))
        else:
            r2, sh2 = vec_recip(max(int(a), 1) * c.astype(np.int64))
            r, sh = np.repeat(r2, group), np.repeat(sh2, group)
        els += [{"x": int(e), "r": int(r[i]), "sh": int(sh[i]), "s": int(s), "four": 1,
                 "key": int(group is not None)} for i, e in enumerate(row)]
        want += list(q)
    return els, np.array(want)


def test_requant_in_four_bits_matches_kv4_rows():
    """``four`` (KV4's nibbles): a value row's factor 7 with the row's reciprocal, a key
    row's (``key``) 7 * 255 with its group's reciprocal of ``a * c``, each clipped to
    [-7, 7]: vec_kv4_rows' q element for element (random rows, the int32 extremes, zeros)."""
    els, want = kv4_elements(np.random.default_rng(9), 12)
    run = run_unit(Requant(FOLD_BITS), els, seed=10)
    assert np.array_equal(run.field("a"), want)


def test_a_scale_with_requant_is_both():
    """``Scale(fracs, requant_bits=54)`` (a lane's shared Scale of the vector engine, its
    Requant on the port ``requant``, a stage behind on Scale's multipliers): Scale's elements
    of every mode and Requant's of wide rows and of KV4's nibbles, in a random order, each
    function right after the other but no Scale element in the cycle after a Requant element
    (there an advancing cycle with none), and with random gaps and stalls: each port's
    results are its function's bit for bit, at its own latency."""
    from hw.vector.dequant import DEQUANT_SCALE_FRAC
    fracs = (ACT_FRAC, NORM_FRAC, DEQUANT_SCALE_FRAC)
    rng = np.random.default_rng(14)
    x, r, sh = _scale_operands(rng, 160)
    mode = rng.integers(0, len(fracs), len(x))
    scale = [{"x": int(a), "r": int(b), "sh": int(c), "mode": int(k)}
             for a, b, c, k in zip(x, r, sh, mode, strict=True)]
    wide = [rng.integers(-(1 << int(b)), 1 << int(b), 6) for b in rng.integers(20, 54, 8)]
    rq, rq_want = requant_elements(wide + [np.array([(1 << 53) - 1, 0, 1])], FOLD_BITS)
    rq4, rq4_want = kv4_elements(rng, 4)
    rq += rq4
    els, queue = [], {None: iter(scale), "requant": iter(rq)}
    for port in rng.permutation([None] * len(scale) + ["requant"] * len(rq)):
        port = None if port is None else str(port)
        if port is None and els and els[-1][0] == "requant":
            els.append(None)
        els.append((port, next(queue[port])))
    unit = Scale(fracs, requant_bits=FOLD_BITS)
    assert unit.ports["requant"].latency == timing.VECTOR_LATENCY["requant"]
    for seed in (None, 15):
        runs = run_ports(unit, els, seed=seed)
        assert np.array_equal(runs[None].field("y"),
                              saturate(round_shift(x * r, sh - np.array(fracs)[mode])))
        assert np.array_equal(runs["requant"].field("a"), np.concatenate([rq_want, rq4_want]))
    runs = run_ports(unit, els)
    check_latency(runs[None], timing.VECTOR_LATENCY["scale"])
    check_latency(runs["requant"], timing.VECTOR_LATENCY["requant"])
    assert set(runs["requant"].accepted) & {c + 1 for c in runs[None].accepted}


@pytest.mark.parametrize("make, message", [
    (lambda: Mul(frac=63), r"mul frac must be an integer in \[0, 62\], got 63"),
    (lambda: Mul(a_bits=1), "got 1"),
    (lambda: Mul(b_bits=35), r"mul b_bits must be an integer in \[2, 34\], got 35"),
    (lambda: Mul(y_bits=55), r"mul y_bits must be an integer in \[32, 54\], got 55"),
    (lambda: Scale(-1), "got -1"),
    (lambda: Scale((16, 63)), "got 63"),
    (lambda: Mul(modes=()), "at least one"),
    (lambda: Mul(modes=((16, 32), (0, 55))), r"mul y_bits .* got 55"),
    (lambda: Mul(modes=((16, 32), Mul.ROPE)), "b_bits >= 33"),
    (lambda: Requant(55), r"requant x_bits must be an integer in \[32, 54\], got 55"),
])
def test_rejects_bad_parameters(make, message):
    with pytest.raises(ValueError, match=message):
        make()
