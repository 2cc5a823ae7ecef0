# amaranth: UnusedElaboratable=no
"""Whole composite ops through the vector unit's RTL units, as the sequences of
hw/vector/__init__.py run them (every pass and every table lookup in simulation; only the
per-row scalar steps between passes in Python), against hw.numerics bit for bit: softmax with
masks, RMSNorm, INT8 requantisation of rows and the SiLU-gate."""

import numpy as np
from amaranth import unsigned
from vector_testutil import rows, run_unit

from hw.numerics import (
    ACT_BITS,
    ACT_FRAC,
    ACT_MAX,
    NORM_FRAC,
    norm_eps,
    norm_weight,
    vec_requant,
    vec_rmsnorm,
    vec_silu_gate,
    vec_softmax,
)
from hw.vector import (
    AbsMax,
    Exp,
    Max,
    Mul,
    Recip,
    Requant,
    Rsqrt,
    Scale,
    Sum,
    SumSq,
)
from hw.vector.reduce import SQ_BITS


def reduce_rows(unit, data: list[np.ndarray], field: str = "y", **extra) -> np.ndarray:
    """One result per row (rows must not be empty)."""
    els = rows([[{"x": int(e), **{k: v[i] for k, v in extra.items()}} for e in row]
                for i, row in enumerate(data)])
    return run_unit(unit, els).field(field)


def table(unit, x) -> tuple[np.ndarray, np.ndarray]:
    run = run_unit(unit, [{"x": int(v)} for v in x])
    return run.field("r"), run.field("sh")


def elementwise(unit, **operands) -> np.ndarray:
    names = list(operands)
    cols = [np.asarray(operands[n]).ravel() for n in names]
    run = run_unit(unit, [{n: int(c[j]) for n, c in zip(names, cols, strict=True)}
                          for j in range(len(cols[0]))])
    field = next(iter(unit.o.payload.shape().members))
    return run.field(field).reshape(np.shape(operands[names[0]]))


def bitlen(v: int) -> int:
    return int(v).bit_length()


def rtl_softmax(x: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Softmax of rows ``x [R, S]`` over their valid positions, on the RTL units."""
    live = [i for i in range(len(x)) if valid[i].any()]
    m = np.zeros(len(x), np.int64)
    m[live] = reduce_rows(Max(), [x[i][valid[i]] for i in live])               # pass 1
    a, b = x[valid], np.broadcast_to(m[:, None], x.shape)[valid]
    e = np.zeros_like(x)
    e[valid] = elementwise(Exp(ACT_FRAC), a=a, b=b)                            # pass 2
    total = np.zeros(len(x), np.int64)
    total[live] = reduce_rows(Sum(unsigned(ACT_FRAC + 1), max_len=x.shape[1]),
                              [e[i][valid[i]] for i in live])
    r, sh = table(Recip(), total)                                              # scalar
    return elementwise(Scale(ACT_FRAC), x=e, r=np.broadcast_to(r[:, None], x.shape),
                       sh=np.broadcast_to(sh[:, None], x.shape))               # pass 3


def test_softmax_of_rows():
    rng = np.random.default_rng(1)
    n, s = 12, 24
    x = rng.integers(-(20 << ACT_FRAC), 20 << ACT_FRAC, (n, s))
    x[0] = rng.integers(-ACT_MAX, ACT_MAX + 1, s)              # differences up to 2**32
    x[1] = 0                                                    # uniform
    x[2, 5] = ACT_MAX                                           # one position takes it all
    valid = np.ones((n, s), bool)
    for i in range(3, 8):                                       # causal prefixes
        valid[i, i:] = False
    valid[8] = rng.random(s) < 0.5
    valid[9] = False                                            # no valid position: zeros
    valid[10] = False
    valid[10, 7] = True                                         # one position
    got = rtl_softmax(x, valid)
    assert np.array_equal(got, vec_softmax(x, valid))
    assert not got[9].any() and got[10].nonzero()[0].tolist() == [7]


def rtl_rmsnorm(x: np.ndarray, w: np.ndarray, eps: int) -> np.ndarray:
    """RMSNorm of rows ``x [R, K]``, on the RTL units."""
    amax = reduce_rows(AbsMax(), list(x))                                      # pass 1
    s = [max(0, bitlen(a) - (SQ_BITS - 1)) for a in amax]                      # scalar
    ss = reduce_rows(SumSq(max_len=x.shape[1]), list(x), shift=s)              # pass 2
    ss = np.array([int(v) + (eps >> (2 * k)) for v, k in zip(ss, s, strict=True)])
    r, sh = table(Rsqrt(), ss)                                                 # scalar
    full = x.shape
    n = elementwise(Scale(NORM_FRAC), x=x, r=np.broadcast_to(r[:, None], full),
                    sh=np.broadcast_to((sh + np.array(s))[:, None], full))    # pass 3
    return elementwise(Mul(NORM_FRAC, b_bits=ACT_BITS + 1), a=n,
                       b=np.broadcast_to(w, full))


def test_rmsnorm_of_rows():
    rng = np.random.default_rng(2)
    k = 48
    x = rng.integers(-(8 << ACT_FRAC), 8 << ACT_FRAC, (10, k))
    x[0] = rng.integers(-ACT_MAX, ACT_MAX + 1, k)               # the largest shift
    x[1] = 0                                                    # zero row: eps alone
    x[2] = rng.integers(-3, 4, k)                               # tiny: rsqrt's left shifts
    x[3, :] = -ACT_MAX
    x[4] = rng.integers(-(1 << 17), 1 << 17, k)
    w = norm_weight(rng.normal(1.0, 0.3, k), k)
    for eps in (norm_eps(1e-5, k), 0):
        assert np.array_equal(rtl_rmsnorm(x, w, eps), vec_rmsnorm(x, w, eps))


def test_requant_of_rows():
    rng = np.random.default_rng(3)
    data = rng.integers(-(30 << ACT_FRAC), 30 << ACT_FRAC, (8, 20))
    data[0] = 0
    data[1, :] = ACT_MAX
    data[2] = rng.integers(-ACT_MAX, ACT_MAX + 1, 20)
    amax = reduce_rows(AbsMax(), list(data))                                   # pass 1
    s = np.array([max(0, bitlen(a) - (ACT_BITS - 1)) for a in amax])           # scalar
    r, sh = table(Recip(), amax >> s)
    full = data.shape
    got = elementwise(Requant(), x=data, r=np.broadcast_to(r[:, None], full),
                      sh=np.broadcast_to(sh[:, None], full),
                      s=np.broadcast_to(s[:, None], full),
                      four=np.zeros(full, int), key=np.zeros(full, int))      # pass 2, INT8
    want, want_amax = vec_requant(data)
    assert np.array_equal(got, want) and np.array_equal(amax, want_amax)


def test_silu_gate():
    rng = np.random.default_rng(4)
    g = np.concatenate([rng.integers(-(12 << ACT_FRAC), 12 << ACT_FRAC, 150),
                        rng.integers(-ACT_MAX, ACT_MAX + 1, 30), [0, ACT_MAX, -ACT_MAX, 1, -1]])
    u = np.concatenate([rng.integers(-(12 << ACT_FRAC), 12 << ACT_FRAC, 150),
                        rng.integers(-ACT_MAX, ACT_MAX + 1, 30), [5, ACT_MAX, ACT_MAX, -1, 1]])
    e = elementwise(Exp(NORM_FRAC), a=np.minimum(g, 0), b=np.maximum(g, 0))
    r, sh = table(Recip(), (1 << NORM_FRAC) + e)                # a 32-bit add
    s = elementwise(Scale(2 * NORM_FRAC), x=np.ones_like(g), r=r, sh=sh)
    sig = np.where(g >= 0, s, elementwise(Mul(NORM_FRAC), a=e, b=s))
    silu = elementwise(Mul(NORM_FRAC), a=g, b=sig)
    got = elementwise(Mul(ACT_FRAC), a=silu, b=u)
    assert np.array_equal(got, vec_silu_gate(g, u))
