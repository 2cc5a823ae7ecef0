# amaranth: UnusedElaboratable=no
"""The vector unit's reductions (hw/vector/reduce.py) against hw.numerics bit for bit: rows of
random lengths back to back, all-zero rows, the format's extremes and ties for argmax, with the
latency of hw.timing.VECTOR_LATENCY after each row's last element."""

import numpy as np
import pytest
from amaranth import signed, unsigned
from vector_testutil import check_latency, rows, run_unit

from hw import timing
from hw.numerics import ACT_FRAC, ACT_MAX, vec_argmax, vec_max, vec_sum, vec_sumsq
from hw.vector import AbsMax, ArgMax, Max, Sum, SumSq


def act_rows(seed: int, n: int = 40) -> list[np.ndarray]:
    """Rows of activations of 1 to 24 elements: random, all zero, at the format's ends."""
    rng = np.random.default_rng(seed)
    out = [rng.integers(-ACT_MAX, ACT_MAX + 1, int(k)) for k in rng.integers(1, 25, n)]
    out[1] = np.zeros(7, np.int64)
    out[2] = np.full(5, -ACT_MAX)
    out[3] = np.full(6, ACT_MAX)
    out[4] = np.array([-ACT_MAX, ACT_MAX, 0])
    out[5] = np.array([3])
    out[6] = rng.integers(-(1 << 20), 1 << 20, 9)
    return out


def stream(data: list[np.ndarray], **extra) -> tuple[list[dict], list[int]]:
    """The rows as one element stream, and the index of each row's last element."""
    els = rows([[{"x": int(e), **{k: v[i] for k, v in extra.items()}} for e in row]
                for i, row in enumerate(data)])
    return els, list(np.cumsum([len(r) for r in data]) - 1)


@pytest.mark.parametrize("unit, golden", [
    (Sum, vec_sum), (Max, vec_max), (AbsMax, lambda r: np.abs(r).max())],
    ids=["sum", "max", "absmax"])
def test_reduction_matches_numerics(unit, golden):
    data = act_rows(1)
    els, ends = stream(data)
    u = unit()
    run = run_unit(u, els)
    assert np.array_equal(run.field("y"), [golden(r) for r in data])
    check_latency(run, timing.VECTOR_LATENCY[unit.NAME], ends)


def test_sum_of_exponentials():
    """Softmax's sum: unsigned elements up to 2**16, rows up to 4096 (a 29-bit result)."""
    rng = np.random.default_rng(2)
    data = [rng.integers(0, (1 << ACT_FRAC) + 1, 700), np.full(3, 1 << ACT_FRAC)]
    els, ends = stream(data)
    run = run_unit(Sum(unsigned(ACT_FRAC + 1), max_len=4096), els)
    assert np.array_equal(run.field("y"), [vec_sum(r) for r in data])


def test_argmax_ties_go_to_the_lowest_index():
    rng = np.random.default_rng(3)
    data = [rng.integers(-3, 4, int(k)) for k in rng.integers(1, 20, 40)]
    data[0] = np.array([-ACT_MAX, -ACT_MAX])
    data[1] = np.array([ACT_MAX, ACT_MAX, -ACT_MAX, ACT_MAX])
    data[2] = np.zeros(6, np.int64)
    els, ends = stream(data)
    run = run_unit(ArgMax(max_len=32), els)
    assert np.array_equal(run.field("index"), [vec_argmax(r) for r in data])
    assert np.array_equal(run.field("y"), [vec_max(r) for r in data])
    check_latency(run, timing.VECTOR_LATENCY["argmax"], ends)


def test_sumsq_with_rmsnorm_shifts():
    """The shift each row gets from RMSNorm (every |x >> s| <= 2**17), all-zero rows
    included."""
    data = act_rows(4)
    shifts = [max(0, int(np.abs(r).max()).bit_length() - (ACT_FRAC + 1)) for r in data]
    els, ends = stream(data, shift=shifts)
    run = run_unit(SumSq(), els)
    assert np.array_equal(run.field("y"),
                          [vec_sumsq(r, s) for r, s in zip(data, shifts, strict=True)])
    check_latency(run, timing.VECTOR_LATENCY["sumsq"], ends)


def test_stalls_lose_nothing():
    data = act_rows(5, 25)
    els, _ = stream(data)
    run = run_unit(ArgMax(), els, seed=6)
    assert np.array_equal(run.field("index"), [vec_argmax(r) for r in data])


def test_wide_absmax():
    """Requantisation of the folded values: 54-bit elements, magnitudes up to 2**53 - 1."""
    rng = np.random.default_rng(7)
    top = (1 << 53) - 1
    data = [rng.integers(-top, top + 1, 10), np.array([-top, 1]), np.array([0, -5])]
    els, _ = stream(data)
    run = run_unit(AbsMax(signed(54)), els)
    assert np.array_equal(run.field("y"), [np.abs(r).max() for r in data])


@pytest.mark.parametrize("make, message", [
    (lambda: Sum(max_len=0), "max_len must be an integer >= 1, got 0"),
    (lambda: ArgMax(max_len=2.5), "got 2.5"),
    (lambda: AbsMax(unsigned(8)), "abs-max takes signed elements"),
])
def test_rejects_bad_parameters(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def _laned(data: list[np.ndarray], lanes: int, **extra):
    """The rows as a stream of ``lanes`` elements a cycle (``x`` a list; the last group of a
    row padded with 0, as the engine reads lanes past a row's end), and the index of each
    row's last cycle."""
    groups = []
    for i, row in enumerate(data):
        padded = np.concatenate([row, np.zeros(-len(row) % lanes, np.int64)])
        groups.append([{"x": [int(e) for e in padded[j:j + lanes]],
                        **{key: v[i] for key, v in extra.items()}}
                       for j in range(0, len(padded), lanes)])
    return rows(groups), list(np.cumsum([len(g) for g in groups]) - 1)


@pytest.mark.parametrize("lanes", [2, 4, 8])
def test_laned_reductions_match_numerics(lanes):
    """AbsMax (54-bit elements, FOLD's products) and SumSq with ``lanes`` elements a cycle:
    the one-lane results (hw.numerics), ``vec_lane_tree(lanes)`` cycles later than one
    lane's after each row's last group."""
    data = act_rows(7)
    data[0] = np.array([-(1 << 53), 5, (1 << 53) - 1])   # FOLD's product extremes
    els, ends = _laned(data, lanes)
    run = run_unit(AbsMax(signed(54), lanes=lanes), els)
    assert np.array_equal(run.field("y"), [int(np.abs(r).max()) for r in data])
    tree = timing.vec_lane_tree(lanes)
    check_latency(run, timing.VECTOR_LATENCY["absmax"] + tree, ends)
    data = act_rows(8)
    shifts = [max(0, int(np.abs(r).max()).bit_length() - (ACT_FRAC + 1)) for r in data]
    els, ends = _laned(data, lanes, shift=shifts)
    run = run_unit(SumSq(lanes=lanes), els)
    assert np.array_equal(run.field("y"),
                          [vec_sumsq(r, s) for r, s in zip(data, shifts, strict=True)])
    check_latency(run, timing.VECTOR_LATENCY["sumsq"] + tree, ends)


@pytest.mark.parametrize("lanes", [1, 4])
def test_absmax_signs_give_each_cycles_shifted_maximum(lanes):
    """With ``signs`` the result is ``2 max|x| + t`` (``t``: an element of that magnitude is
    negative), and ``partial`` gives each cycle's maximum of its lanes ``latency - 1`` cycles
    after it entered, from which ``max|x|`` is its value over 2 and ``max|x >> 1|`` its
    value plus 1 over 4 (KV4's groups): rows of ties of both signs, the word's ends, random."""
    from amaranth.sim import Simulator

    data = act_rows(9, 12) + [np.array([-5, 5, 3, -5]), np.array([5, -4, 5, 1]),
                              np.array([-2**31, 2**31 - 1, 7, -3])]
    els, ends = _laned(data, lanes) if lanes > 1 else stream(data)
    unit = AbsMax(signed(32), lanes=lanes, signs=True)
    seen, outs = [], []

    async def bench(ctx):
        for k in range(len(els) + unit.latency + 1):
            offer = k < len(els)
            ctx.set(unit.o.ready, 1)
            ctx.set(unit.i.valid, int(offer))
            if offer:
                ctx.set(unit.i.payload.x, els[k]["x"])
                ctx.set(unit.i.payload.last, els[k]["last"])
            if ctx.get(unit.partial.valid):
                seen.append((k, int(ctx.get(unit.partial.x))))
            if ctx.get(unit.o.valid):
                outs.append(int(ctx.get(unit.o.payload.y)))
            await ctx.tick()

    sim = Simulator(unit)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()
    flags = [2 * int(np.abs(r).max()) + int(np.any(r[np.abs(r) == np.abs(r).max()] < 0))
             for r in data]
    assert outs == flags and any(f & 1 for f in flags) and not all(f & 1 for f in flags)
    cycles = [np.array(e["x"] if lanes > 1 else [e["x"]], np.int64) for e in els]
    assert [k for k, _ in seen] == [k + unit.latency - 1 for k in range(len(els))]
    for (_, px), x in zip(seen, cycles, strict=True):
        assert px >> 1 == np.abs(x).max() and (px + 1) >> 2 == np.abs(x >> 1).max()
