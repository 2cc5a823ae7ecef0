# amaranth: UnusedElaboratable=no
"""The vector unit's table units (hw/vector/tables.py) against hw.numerics bit for bit: the
reciprocal, rsqrt and exp on random operands and the edges their docstrings name, with the
latency of hw.timing.VECTOR_LATENCY and the stall protocol."""

import numpy as np
import pytest
from vector_testutil import check_latency, run_ports, run_unit

from hw import timing
from hw.numerics import (
    ACT_FRAC,
    ACT_MAX,
    CONST_FRAC,
    LOG2E_Q,
    MANT_BITS,
    NORM_FRAC,
    TABLE_IN_BITS,
    vec_exp,
    vec_recip,
    vec_rsqrt,
)
from hw.vector import Exp, Recip, Rsqrt


def table_operands(seed: int) -> np.ndarray:
    """Operands of recip / rsqrt: uniform over the bit lengths, the range's ends, powers of two
    and their neighbours (every normalisation shift, both parities for rsqrt)."""
    rng = np.random.default_rng(seed)
    n = rng.integers(1, TABLE_IN_BITS + 1, 200)
    rand = (rng.integers(0, 1 << 62, 200) >> (62 - n)) | (1 << (n - 1))   # bit length n
    k = np.arange(TABLE_IN_BITS)
    pow2 = np.int64(1) << k
    edges = [1, 2, 3, (1 << TABLE_IN_BITS) - 1, (1 << TABLE_IN_BITS) - 2]
    return np.concatenate([edges, pow2, pow2[1:] - 1, pow2[1:] + 1, rand]).astype(np.int64)


@pytest.mark.parametrize("unit, golden", [(Recip, vec_recip), (Rsqrt, vec_rsqrt)],
                         ids=["recip", "rsqrt"])
def test_table_unit_matches_numerics(unit, golden):
    x = table_operands(1)
    u = unit()
    run = run_unit(u, [{"x": int(a)} for a in x])
    r, sh = golden(x)
    assert np.array_equal(run.field("r"), r)
    assert np.array_equal(run.field("sh"), sh)
    check_latency(run, timing.VECTOR_LATENCY[unit.NAME])


@pytest.mark.parametrize("unit, golden", [(Recip, vec_recip), (Rsqrt, vec_rsqrt)],
                         ids=["recip", "rsqrt"])
def test_table_unit_takes_zero_as_one(unit, golden):
    run = run_unit(unit(), [{"x": 0}])
    r, sh = golden(np.array([1]))
    assert (run.field("r")[0], run.field("sh")[0]) == (r[0], sh[0])


def _recip_rsqrt(x: np.ndarray, rsqrt: np.ndarray) -> list[tuple[str | None, dict]]:
    """Elements of ``Recip(rsqrt=True)``: ``x[k]`` to its ``rsqrt`` port where ``rsqrt[k]``,
    else to its own input."""
    return [("rsqrt" if s else None, {"x": int(a)}) for a, s in zip(x, rsqrt, strict=True)]


def _check_recip_rsqrt(runs, x: np.ndarray, rsqrt: np.ndarray) -> None:
    """Each port's results are its function's of its elements, bit for bit, in order."""
    for port, golden, mine in ((None, vec_recip, ~rsqrt), ("rsqrt", vec_rsqrt, rsqrt)):
        r, sh = golden(np.maximum(x[mine], 1))
        assert np.array_equal(runs[port].field("r"), r), port
        assert np.array_equal(runs[port].field("sh"), sh), port


def test_a_recip_with_rsqrt_is_both():
    """``Recip(rsqrt=True)`` (the vector engine's Recip and RMSNORM's Rsqrt on one normaliser,
    table memory and Rsqrt's multipliers): one element a cycle, each to either port in a
    random order (each function right after the other, and runs of each), and with random
    gaps and stalls: each port's results are its function's bit for bit, at its own latency
    (a reciprocal's result in the same cycle as an rsqrt's fed the cycle before)."""
    x = np.concatenate([[0], table_operands(4)])
    rng = np.random.default_rng(5)
    rsqrt = rng.random(len(x)) < 0.5
    rsqrt[100:140] = True
    rsqrt[140:180] = False
    unit = Recip(rsqrt=True)
    assert unit.latency == timing.VECTOR_LATENCY["recip"]
    assert unit.ports["rsqrt"].latency == timing.VECTOR_LATENCY["rsqrt"]
    els = _recip_rsqrt(x, rsqrt)
    runs = run_ports(unit, els)
    _check_recip_rsqrt(runs, x, rsqrt)
    check_latency(runs[None], timing.VECTOR_LATENCY["recip"])
    check_latency(runs["rsqrt"], timing.VECTOR_LATENCY["rsqrt"])
    assert set(runs[None].accepted) & {c + 1 for c in runs["rsqrt"].accepted}
    _check_recip_rsqrt(run_ports(unit, els, seed=6), x, rsqrt)


def exp_operands(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(a, b)`` with ``a <= b``: ``d = a - b`` over the whole domain (down to -(2**32 - 2)),
    near 0 (where the result has precision), and the edges."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-ACT_MAX, ACT_MAX + 1, 120)
    b = rng.integers(-ACT_MAX, ACT_MAX + 1, 120)
    a, b = np.minimum(a, b), np.maximum(a, b)
    near = -rng.integers(0, 24 << ACT_FRAC, 160)
    base = rng.integers(-ACT_MAX // 2, ACT_MAX // 2, 160)
    ea = np.array([0, -ACT_MAX, 5, -1, 0, ACT_MAX])
    eb = np.array([0, ACT_MAX, 5, 0, 1, ACT_MAX])
    return (np.concatenate([a, base + near, ea]), np.concatenate([b, base, eb]))


@pytest.mark.parametrize("frac", [ACT_FRAC, NORM_FRAC])
def test_exp_matches_numerics(frac):
    a, b = exp_operands(2 + frac)
    u = Exp(frac)
    run = run_unit(u, [{"a": int(p), "b": int(q)} for p, q in zip(a, b, strict=True)])
    want = vec_exp(a - b, frac)
    assert np.array_equal(run.field("y"), want)
    assert run.field("y")[-6] == 1 << frac   # d = 0
    assert run.field("y")[-5] == 0            # d = -(2**32 - 2)
    check_latency(run, timing.VECTOR_LATENCY["exp"])


def test_an_exp_of_several_fracs_is_each_of_them():
    """An ``Exp`` shared by uses of different ``frac`` (the vector engine's lane 0: SOFTMAX's
    16, the SiLU-gate's 30), the mode chosen per element, mixed in one stream and with
    stalls: each element's result is ``Exp(frac)``'s, bit for bit, at the same latency."""
    fracs = (ACT_FRAC, NORM_FRAC)
    a, b = exp_operands(7)
    mode = np.random.default_rng(8).integers(0, len(fracs), len(a))
    unit = Exp(fracs)
    els = [{"a": int(p), "b": int(q), "mode": int(k)} for p, q, k in zip(a, b, mode, strict=True)]
    want = np.where(mode == 0, vec_exp(a - b, ACT_FRAC), vec_exp(a - b, NORM_FRAC))
    for seed in (None, 9):
        run = run_unit(unit, els, seed=seed)
        assert np.array_equal(run.field("y"), want)
    assert set(mode) == {0, 1}
    check_latency(run_unit(unit, els), timing.VECTOR_LATENCY["exp"])

def test_an_exp_is_zero_wherever_its_clamped_operand_is():
    """``Exp`` multiplies ``d`` clamped below at the bound under which every result is 0
    (its low chunk on a multiplier, the bits above it a table of their products): ``d``
    beside each power of two from the smallest results down to ``-2**32 + 1``, for both
    ``frac`` mixed, is ``vec_exp``'s, bit for bit, and nonzero just above the bound."""
    fracs = (ACT_FRAC, NORM_FRAC)
    d = np.array(sorted({-(1 << e) + k for e in range(14, 33) for k in (-3, -1, 0, 1, 3)}
                        - {-(1 << 32) - 3, -(1 << 32) - 1, -(1 << 32)}), dtype=np.int64)
    d = np.repeat(d, len(fracs))
    mode = np.tile(np.arange(len(fracs)), len(d) // len(fracs))
    b = np.full(len(d), ACT_MAX)
    a = b + d
    a = np.where(a < -ACT_MAX - 1, -ACT_MAX - 1, a)   # d down to -2**32 + 1: a then b
    b = a - d
    els = [{"a": int(p), "b": int(q), "mode": int(k)} for p, q, k in zip(a, b, mode, strict=True)]
    want = np.where(mode == 0, vec_exp(a - b, ACT_FRAC), vec_exp(a - b, NORM_FRAC))
    assert np.array_equal(run_unit(Exp(fracs), els).field("y"), want)
    assert (want == 0).any() and (want[d > -(1 << 19)] > 0).all()


def test_stalls_lose_nothing():
    """Random gaps in the input and random output stalls: the same results, in order."""
    x = table_operands(3)[:120]
    run = run_unit(Rsqrt(), [{"x": int(a)} for a in x], seed=4)
    r, sh = vec_rsqrt(x)
    assert np.array_equal(run.field("r"), r) and np.array_equal(run.field("sh"), sh)


@pytest.mark.parametrize("frac", [15, 31, 16.0])
def test_exp_rejects_frac(frac):
    with pytest.raises(ValueError, match=f"got {frac!r}"):
        Exp(frac)


def test_constructor_checks_the_timing_contract(monkeypatch):
    depth = timing.VECTOR_LATENCY["recip"]
    monkeypatch.setitem(timing.VECTOR_LATENCY, "recip", depth - 1)
    with pytest.raises(ValueError, match=rf"VECTOR_LATENCY\['recip'\] = {depth - 1}, but the "
                                         rf"Recip pipeline has {depth} stages"):
        Recip()


@pytest.mark.slow
@pytest.mark.parametrize("unit, golden, lo", [
    (Recip, vec_recip, 1 << (MANT_BITS - 1)), (Rsqrt, vec_rsqrt, 1 << (MANT_BITS - 2))],
    ids=["recip", "rsqrt"])
def test_every_mantissa(unit, golden, lo):
    """Every normalised mantissa (both octaves for rsqrt) with no normalising shift: the table
    and Newton step are exact for all of them, so with the shifts above, for every operand."""
    x = np.arange(lo, 1 << MANT_BITS, dtype=np.int64)
    run = run_unit(unit(), [{"x": int(a)} for a in x])
    r, sh = golden(x)
    assert np.array_equal(run.field("r"), r) and np.array_equal(run.field("sh"), sh)


@pytest.mark.slow
def test_every_mantissa_of_a_recip_with_rsqrt():
    """``Recip(rsqrt=True)``: every mantissa of each function (as above), alternating between
    its ports: both its tables, bit for bit."""
    rs = np.arange(1 << (MANT_BITS - 2), 1 << MANT_BITS, dtype=np.int64)
    rc = np.arange(1 << (MANT_BITS - 1), 1 << MANT_BITS, dtype=np.int64)
    x = np.concatenate([np.stack([rc, rs[:len(rc)]], axis=1).ravel(), rs[len(rc):]])
    rsqrt = np.concatenate([np.tile([False, True], len(rc)), np.ones(len(rs) - len(rc), bool)])
    _check_recip_rsqrt(run_ports(Recip(rsqrt=True), _recip_rsqrt(x, rsqrt)), x, rsqrt)


@pytest.mark.slow
def test_exp_of_every_fraction():
    """Every ``d`` whose ``u = d * log2(e)`` lies in [-1, 0]: every table entry and every
    interpolation step the fraction reaches."""
    d = np.arange(-(1 << (ACT_FRAC + CONST_FRAC)) // LOG2E_Q, 1, dtype=np.int64)
    run = run_unit(Exp(ACT_FRAC), [{"a": int(v), "b": 0} for v in d])
    assert np.array_equal(run.field("y"), vec_exp(d, ACT_FRAC))


def test_every_declared_latency_belongs_to_a_unit():
    """hw.timing.VECTOR_LATENCY names exactly the units of hw.vector (none stale)."""
    from hw.vector import UNITS

    assert {make.func.NAME for make in UNITS.values()} == set(timing.VECTOR_LATENCY)
