"""The memory planner: live buffers never share a byte, the arena is close to its lower bound,
and a model that does not fit says how much it needs."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hw.config import AcceleratorConfig, MemoryModel
from sw.compile.errors import PlanError
from sw.compile.plan import Buffer, layout_dram, lower_bound, plan_arena


@st.composite
def buffer_sets(draw):
    n = draw(st.integers(1, 30))
    out = []
    for i in range(n):
        start = draw(st.integers(0, 40))
        out.append(Buffer(f"b{i}", draw(st.integers(1, 5000)), start,
                          start + draw(st.integers(0, 6))))
    return out, draw(st.sampled_from([1, 16, 64]))


@given(buffer_sets())
def test_live_buffers_never_overlap(case):
    buffers, align = case
    plan = plan_arena(buffers, align)
    for b in buffers:
        off = plan.offsets[b.name]
        assert off % align == 0 and off + b.size <= plan.size
    for i, a in enumerate(buffers):
        for b in buffers[i + 1:]:
            if a.overlaps_in_time(b):
                oa, ob = plan.offsets[a.name], plan.offsets[b.name]
                assert oa + a.size <= ob or ob + b.size <= oa, (a, b)
    assert plan.size >= plan.lower_bound


@given(buffer_sets())
def test_a_plan_depends_on_the_order_of_time_steps_not_their_number(case):
    """Time steps only order the buffers: spreading them 10**9 apart plans the same arena (a
    whole decode step's program keeps every buffer live through thousands of steps)."""
    buffers, align = case
    far = [Buffer(b.name, b.size, b.start * 10**9, b.end * 10**9) for b in buffers]
    assert plan_arena(far, align) == plan_arena(buffers, align)


def test_lower_bound_and_reuse():
    bufs = [Buffer("a", 100, 0, 1), Buffer("b", 100, 1, 2), Buffer("c", 100, 2, 3)]
    assert lower_bound(bufs) == 200
    plan = plan_arena(bufs, 1)
    assert plan.size == 200 and plan.offsets["a"] == plan.offsets["c"]   # a and c share


def test_duplicate_names_are_refused():
    with pytest.raises(PlanError, match="unique"):
        plan_arena([Buffer("a", 1, 0, 0), Buffer("a", 1, 1, 1)], 1)


def test_a_model_too_large_for_dram_names_every_size():
    cfg = AcceleratorConfig(memory=MemoryModel(size_bytes=1 << 16))
    arena = plan_arena([Buffer("x", 4096, 0, 1)], 16)
    with pytest.raises(PlanError, match=r"needs 73,728 bytes .*weights 65,536, KV cache 4,096, "
                                        r"activations 4,096.* memory.size_bytes=65,536"):
        layout_dram(cfg, [("w:a", 1 << 16)], [("k:0:0", 4096)], [arena])
    ok = layout_dram(AcceleratorConfig(), [("w:a", 100)], [("k:0:0", 50)], [arena])
    assert ok.regions["k:0:0"].addr == 112 and ok.regions["arena"].addr == 176   # beat-aligned


@given(buffer_sets())
def test_each_buffer_takes_the_tightest_gap(case):
    """The placement rule, replayed in plain Python: largest first, each into the gap among
    the placed, time-overlapping buffers that leaves the least slack (lowest on ties), else on
    top of them all."""
    buffers, align = case
    plan = plan_arena(buffers, align)
    size = {b.name: -(-b.size // align) * align for b in buffers}
    placed: list[Buffer] = []
    for b in sorted(buffers, key=lambda b: (-size[b.name], b.start, b.name)):
        busy = sorted((plan.offsets[o.name], plan.offsets[o.name] + size[o.name])
                      for o in placed if b.overlaps_in_time(o))
        fits, top = [], 0
        for lo, hi in busy:
            if lo - top >= size[b.name]:
                fits.append((lo - top - size[b.name], top))
            top = max(top, hi)
        assert plan.offsets[b.name] == (min(fits)[1] if fits else top), b
        placed.append(b)
