"""The vector engine's lanes (``AcceleratorConfig.vector_lanes``): the configuration field, the
one table of laned sub-ops (``hw.isa.LANED_VEC_FUNCS``), the laned timing terms of
``hw.timing.vec_cycles``, the row alignment dispatch rule, the RTL engine's laned units, and the
fast model on random vector programs: the lanes change cycles only, never a result
(``hw/numerics.py`` is unchanged)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hw import timing
from hw.config import VECTOR_PRESET_LANES, AcceleratorConfig, ConfigError, preset
from hw.isa import (
    LANED_VEC_FUNCS,
    ErrorCode,
    Vec,
    VecFunc,
    check,
    decode_fields,
    dispatch_error,
    dispatch_errors,
    insert_imm,
    insert_laned,
    kv4_group,
    kv4_imm,
    kv4_laned,
    laned_vec_funcs,
    program_words,
    rope_geometry,
    rope_heads_laned,
    rope_imm,
    rope_laned,
    vec_lanes,
    vec_reads_b,
    vec_unaligned,
)
from hw.numerics import ACT_BITS, ACT_FRAC, FOLD_BITS, NORM_FRAC
from hw.vector.dequant import DEQUANT_SCALE_FRAC
from hw.vector.elementwise import Mul
from hw.vector.engine import VectorEngine, command_lanes
from sim.model import FastModel
from sim.random_programs import EQUIVALENCE_CONFIGS, random_program

#: The vector preset's engine with one lane (the preset streams VECTOR_PRESET_LANES).
VCFG = preset("vector").replace(vector_lanes=1)
LANES = (1, 2, 4)


def _cfg(lanes: int) -> AcceleratorConfig:
    return VCFG.replace(vector_lanes=lanes)


def _imm(func: VecFunc, length: int) -> int:
    """A valid ``imm`` of ``func`` for a row of ``length`` (ROPE: one head; KV4: a value
    row; INSERT: one code; others 0)."""
    return {VecFunc.ROPE: rope_imm(length, 1) if length % 2 == 0 else 0,
            VecFunc.INSERT: insert_imm(0, 1, 1, 4), VecFunc.INSERT4: insert_imm(0, 1, 1, 8),
            VecFunc.KV4: kv4_imm(None)}.get(func, 0)


# ---------------------------------------------------------------------- configuration
def test_lanes_default_and_fingerprint():
    """One lane is the default and leaves the JSON (every configuration keeps its
    fingerprint); more lanes are in it and round-trip."""
    assert VCFG.vector_lanes == 1 and "vector_lanes" not in VCFG.to_dict()
    assert preset("vector").to_dict()["vector_lanes"] == VECTOR_PRESET_LANES > 1
    c4 = _cfg(4)
    assert c4.to_dict()["vector_lanes"] == 4
    assert AcceleratorConfig.from_json(c4.to_json()) == c4
    assert len({_cfg(n).fingerprint for n in LANES}) == len(LANES)
    assert AcceleratorConfig.from_dict({**VCFG.to_dict(), "vector_lanes": 1}).fingerprint \
        == VCFG.fingerprint


@pytest.mark.parametrize("bad", [0, 3, 8, -4, 2.0, True, "4"])
def test_lanes_validated(bad):
    with pytest.raises(ConfigError, match=f"vector_lanes must be .* got {bad!r}"):
        _cfg(bad)


def test_lanes_bounded_by_the_beat_and_the_engine():
    """At most a beat's elements (LOAD and STORE move whole beats); none without an engine."""
    wide = VCFG.replace(memory=dataclasses.replace(VCFG.memory, bytes_per_cycle=32))
    assert wide.vector_lanes_max == 8 and wide.replace(vector_lanes=8).vector_lanes == 8
    narrow = VCFG.replace(memory=dataclasses.replace(VCFG.memory, bytes_per_cycle=4))
    with pytest.raises(ConfigError, match=r"in \[1, 1\] .* got 2"):
        narrow.replace(vector_lanes=2)
    with pytest.raises(ConfigError, match="vector_lanes=2 needs a vector engine"):
        AcceleratorConfig(vector_lanes=2)


@pytest.mark.parametrize("lanes", LANES)
def test_rtl_engine_builds_lanes(lanes):
    """The RTL engine builds every lane count: its laned reductions (AbsMax, SumSq) take a
    lane tree of ``vec_lane_tree`` levels on top of their one-lane latency, its element units
    have a copy a lane, and the scalar units stay single (the cycles themselves:
    tests/hw/test_vector_engine.py's laned executor tests)."""
    units = VectorEngine(_cfg(lanes))._units
    tree = timing.vec_lane_tree(lanes)
    assert units["absmax"].latency == timing.VECTOR_LATENCY["absmax"] + tree
    assert units["sumsq"].latency == timing.VECTOR_LATENCY["sumsq"] + tree
    assert units["max"].latency == timing.VECTOR_LATENCY["max"] + tree       # SOFTMAX's
    assert units["sum"].latency == timing.VECTOR_LATENCY["sum"] + tree
    for name in ("add", "mul", "scale", "dequant_factor", "exp"):
        assert sum(k == name or k.startswith(f"{name}_l") for k in units) == lanes, name
    # each lane's Requant (REQUANT's, FOLD's and KV4's codes) is its Scale's port
    assert all(list(units[k].ports) == ["requant"] and units[k].ports["requant"].latency
               == timing.VECTOR_LATENCY["requant"] for k in units
               if k == "scale" or k.startswith("scale_l"))
    assert not any(k.startswith("requant") for k in units)
    # MUL's, RMSNORM's weight's, FOLD's (and lane 0's KV4 codes') Mul and ROPE's rotation,
    # and SOFTMAX's, RMSNORM's and DEQUANT's Scale, are one unit a lane, a mode each use
    assert units["mul"].modes == ((ACT_FRAC, ACT_BITS), (NORM_FRAC, ACT_BITS), (0, FOLD_BITS),
                                  Mul.ROPE)
    assert units["scale"].fracs == (ACT_FRAC, NORM_FRAC, DEQUANT_SCALE_FRAC)
    # lane 0's Exp is SOFTMAX's and the SiLU-gate's
    assert units["exp"].fracs == (ACT_FRAC, NORM_FRAC)
    for name in ("mul16", "mul_fold", "mul_code", "rope", "scale16", "scale30", "scale31",
                 "exp30"):
        assert name not in units
    for name in ("recip", "argmax", "absmax"):
        assert name in units and f"{name}_l1" not in units
    # RMSNORM's Rsqrt is lane 0's Recip's port, its multipliers Recip's and two more
    assert "rsqrt" not in units and list(units["recip"].ports) == ["rsqrt"]
    # one AbsMax, KV4's too (its maxima with the signs below them: its groups' |x >> 1|)
    assert units["absmax"].o.payload.y.shape().width == FOLD_BITS + 1


def test_laned_silu_is_a_validated_field():
    """``vector_laned_silu`` (SILU_GATE laned: its chain a lane) is a bool, only with lanes,
    off in the vector preset (the ECP5-85F's multipliers), left out of the JSON when off (the
    fingerprints stay) and in it when on."""
    assert not preset("vector").vector_laned_silu
    assert "vector_laned_silu" not in preset("vector").to_dict()
    on = _cfg(4).replace(vector_laned_silu=True)
    assert on.to_dict()["vector_laned_silu"] is True
    assert AcceleratorConfig.from_json(on.to_json()) == on
    assert on.fingerprint != _cfg(4).fingerprint
    with pytest.raises(ConfigError, match="vector_laned_silu needs vector_lanes > 1"):
        VCFG.replace(vector_laned_silu=True)
    with pytest.raises(ConfigError, match="vector_laned_silu must be a bool, got 1"):
        _cfg(2).replace(vector_laned_silu=1)
    assert laned_vec_funcs(_cfg(2)) == LANED_VEC_FUNCS
    assert laned_vec_funcs(on) == (*LANED_VEC_FUNCS, VecFunc.SILU_GATE)


def test_laned_rope_heads_is_a_validated_field():
    """``vector_laned_rope_heads`` (a ROPE over heads the lanes hold whole) is a bool, only
    with lanes, off in the vector preset (its board key stays), left out of the JSON when off
    and in it when on (the wide systems set it: tests/test_bench_scaling.py)."""
    assert not preset("vector").vector_laned_rope_heads
    assert "vector_laned_rope_heads" not in preset("vector").to_dict()
    on = _cfg(4).replace(vector_laned_rope_heads=True)
    assert on.to_dict()["vector_laned_rope_heads"] is True
    assert AcceleratorConfig.from_json(on.to_json()) == on
    assert on.fingerprint != _cfg(4).fingerprint
    with pytest.raises(ConfigError, match="vector_laned_rope_heads needs vector_lanes > 1"):
        VCFG.replace(vector_laned_rope_heads=True)
    with pytest.raises(ConfigError, match="vector_laned_rope_heads must be a bool, got 1"):
        _cfg(2).replace(vector_laned_rope_heads=1)


@pytest.mark.parametrize("lanes", [2, 4])
def test_rtl_engine_builds_silu_lanes(lanes):
    """With ``vector_laned_silu`` every lane has the SiLU-gate's chain (its own Recip beside
    lane 0's shared one, its SOFTMAX Exp shared with its ``Exp(30)``); without, only lane 0
    has it, and its two ``Mul(30)`` are lanes 1 and 2's shared ``Mul`` where the engine has
    them (their mode ``mul_w`` is ``Mul(30)``'s rounding)."""
    for silu in (False, True):
        engine = VectorEngine(_cfg(lanes).replace(vector_laned_silu=silu))
        units = engine._units
        hosted = {} if silu else {"mul_es": "mul_l1", "mul_gs": "mul_l2"}
        hosted = {name: host for name, host in hosted.items() if host in units}
        assert engine._silu_hosts == hosted and len(hosted) == (0 if silu else min(2, lanes - 1))
        assert units["mul"].modes[1] == (NORM_FRAC, ACT_BITS)   # mul_w: Mul(NORM_FRAC)'s
        for name in ("recip", "scale60", "mul_es", "mul_gs"):
            count = sum(k == name or k.startswith(f"{name}_l") for k in units)
            assert count == (lanes if silu else 0 if name in hosted else 1), (name, silu)
        for k in range(1, lanes):
            assert units[f"exp_l{k}"].fracs == ((ACT_FRAC, NORM_FRAC) if silu else (ACT_FRAC,))


# ---------------------------------------------------------------------- the lane table
def _laned(func: VecFunc, imm: int, lanes: int) -> bool:
    return (func in LANED_VEC_FUNCS or bool(insert_laned(func.value, imm, lanes))
            or bool(rope_laned(func.value, imm, lanes)) or bool(kv4_laned(func.value, imm, lanes)))


@pytest.mark.parametrize("lanes", LANES)
def test_lane_table(lanes):
    """``vec_lanes`` is the lanes for the table's sub-ops and 1 for the others (an INSERT of
    several codes a word apart: one; a ROPE of this ``imm``, heads of 2048 elements, and a
    KV4, a value row: laned), on ints and arrays alike."""
    imm = insert_imm(0, 3, 1, 4)
    assert rope_geometry(imm)[0] == 2048 and kv4_group(imm) is None
    funcs = np.array([f.value for f in VecFunc])
    want = [lanes if f in (*LANED_VEC_FUNCS, VecFunc.ROPE, VecFunc.KV4) else 1 for f in VecFunc]
    assert [int(vec_lanes(f.value, lanes, imm)) for f in VecFunc] == want
    assert vec_lanes(funcs, lanes, np.full(funcs.shape, imm)).tolist() == want


#: INSERT geometries (base, group, groups, stride, skip), the least lanes that no longer
#: stream them laned (codes per word: 4 bytes; INSERT4 the same in nibbles, 8): codes
#: ``stride`` apart in a group, ``stride + skip`` from a group of one to the next.
INSERT_SPANS = [
    ((0, 1, 1, 4, 0), None),           # one code: laned on any lanes
    ((5, 1, 1, 255, 255), None),
    ((0, 4, 1, 1, 0), 2),              # stride 1: whole code words, never laned
    ((0, 16, 1, 1, 8), 2),
    ((0, 128, 1, 128, 0), 64),         # a key's append, 128-byte beats: a code a beat
    ((0, 3, 2, 16, 200), 8),           # stride 16 in a group: 4 words
    ((0, 1, 8, 16, 16), 16),           # groups of one: 32 bytes from code to code
    ((0, 1, 8, 4, 0), 2),
    ((0, 2, 1, 8, 0), 4),
]


@pytest.mark.parametrize(("geometry", "limit"), INSERT_SPANS)
def test_an_insert_is_laned_where_a_group_read_takes_one_code(geometry, limit):
    """:func:`hw.isa.insert_laned` on every lane count: laned below ``limit`` (the codes at
    least a group of lanes apart) and never at one lane; INSERT4 at twice the stride in
    nibbles alike; ints, arrays and ``vec_lanes`` agree."""
    base, group, groups, stride, skip = geometry
    for lanes in (1, 2, 4, 8, 16, 32, 64, 128, 512):
        want = lanes > 1 and (limit is None or lanes < limit)
        imm = insert_imm(*geometry)
        assert bool(insert_laned(VecFunc.INSERT.value, imm, lanes)) == want, (lanes, geometry)
        assert int(vec_lanes(VecFunc.INSERT.value, lanes, imm)) == (lanes if want else 1)
        arr = insert_laned(np.array([VecFunc.INSERT.value, VecFunc.ADD.value]),
                           np.array([imm, imm]), lanes)
        assert arr.tolist() == [want, False]
        if 2 * stride < 256 and 2 * skip < 256:
            imm4 = insert_imm(base, group, groups, 1 if stride == 1 else 2 * stride, 2 * skip)
            assert bool(insert_laned(VecFunc.INSERT4.value, imm4, lanes)) == want


@pytest.mark.parametrize(("head_dim", "limit"), [(2, 2), (4, 4), (6, 2), (64, 64),
                                                 (128, 128), (96, 32), (0, 1)])
def test_a_rope_is_laned_where_its_half_head_is_whole_groups(head_dim, limit):
    """:func:`hw.isa.rope_laned`: a ROPE whose ``head_dim / 2`` is a multiple of the lanes
    (below ``limit``, a power of two), never at one lane nor for another sub-op; ints, arrays
    and ``vec_lanes`` agree."""
    for lanes in (1, 2, 4, 8, 16, 32, 64, 128):
        want = 1 < lanes < limit
        imm = rope_imm(head_dim, 3)
        assert bool(rope_laned(VecFunc.ROPE.value, imm, lanes)) == want, (head_dim, lanes)
        assert int(vec_lanes(VecFunc.ROPE.value, lanes, imm)) == (lanes if want else 1)
        arr = rope_laned(np.array([VecFunc.ROPE.value, VecFunc.ADD.value]),
                         np.array([imm, imm]), lanes)
        assert arr.tolist() == [want, False]
        # disjoint from a ROPE over heads the lanes hold, which adds to it with the flag
        if want:
            assert not rope_heads_laned(VecFunc.ROPE.value, imm, lanes)
        # its row, table and results aligned whatever its imm (the rule reads no imm)
        for a, b, d in ((lanes, 0, 0), (0, lanes, 0), (0, 0, lanes), (1, 0, 0), (0, 1, 0),
                        (0, 0, 1)):
            assert bool(vec_unaligned(VecFunc.ROPE.value, a, b, d, lanes)) == (
                lanes > 1 and 1 in (a, b, d)), (lanes, a, b, d)


@pytest.mark.parametrize("head_dim", [0, 2, 4, 6, 8, 12, 64, 96, 128, 256])
def test_a_rope_over_heads_the_lanes_hold_is_laned_with_the_flag(head_dim):
    """:func:`hw.isa.rope_heads_laned`: a ROPE whose ``head_dim`` is a power of two dividing
    the lanes, never at one lane nor for another sub-op; :func:`hw.isa.rope_laned` and
    ``vec_lanes`` add it to the half heads of whole groups only with ``heads`` (the
    configuration's ``vector_laned_rope_heads``); ints and arrays agree. LLaMA's head of 128
    streams laned on HBM-class's 128 lanes (or a beat's 512) only with the flag, on
    DDR4-class's 32 without
    it (its half head, 64, whole groups) and so with it alike."""
    imm = rope_imm(head_dim, 3)
    for lanes in (1, 2, 4, 8, 16, 32, 64, 128, 512):
        want = lanes > 1 and head_dim > 0 and lanes % head_dim == 0 and \
            head_dim & (head_dim - 1) == 0
        assert bool(rope_heads_laned(VecFunc.ROPE.value, imm, lanes)) == want, (head_dim, lanes)
        arr = rope_heads_laned(np.array([VecFunc.ROPE.value, VecFunc.ADD.value]),
                               np.array([imm, imm]), lanes)
        assert arr.tolist() == [want, False]
        pairs = bool(rope_laned(VecFunc.ROPE.value, imm, lanes))
        assert bool(rope_laned(VecFunc.ROPE.value, imm, lanes, True)) == (pairs or want)
        assert int(vec_lanes(VecFunc.ROPE.value, lanes, imm, False, True)) == (
            lanes if pairs or want else 1)
        assert not rope_heads_laned(VecFunc.ADD.value, imm, lanes)
    llama = rope_imm(128, 32)
    for lanes in (128, 512):
        assert not rope_laned(VecFunc.ROPE.value, llama, lanes)
        assert rope_laned(VecFunc.ROPE.value, llama, lanes, True)
    assert rope_laned(VecFunc.ROPE.value, llama, 32) and \
        not rope_heads_laned(VecFunc.ROPE.value, llama, 32)


@pytest.mark.parametrize(("lanes", "silu", "heads"),
                         [(2, False, False), (4, False, False), (4, True, False),
                          (2, False, True), (4, True, True)])
def test_command_lanes_is_the_lane_table(lanes, silu, heads):
    """:func:`hw.vector.engine.command_lanes` (what the vector sequencer registers beside
    the command): ``laned`` is ``vec_lanes > 1`` and ``writes_n`` that but for REQUANT's and
    FOLD's packed codes and ROPE's pairs (a ROPE over whole heads, ``heads``, writes ``n``),
    for every sub-op over INSERT and ROPE geometries and random imms, on ints and in the RTL
    (its Amaranth expression, simulated)."""
    from amaranth import Module, Signal
    from amaranth.sim import Simulator

    cfg = _cfg(lanes).replace(vector_laned_silu=silu, vector_laned_rope_heads=heads)
    rng = np.random.default_rng(lanes + silu)
    imms = ([insert_imm(*g) for g, _ in INSERT_SPANS]
            + [rope_imm(d, 3) for d in (0, 2, 4, 6, 8, 64, 96, 128)]
            + [kv4_imm(g) for g in (None, 1, 2, 4, 8, 32)]
            + [int(v) for v in rng.integers(0, 2**40, 12, dtype=np.int64)])
    cases = [(f, imm) for f in VecFunc for imm in imms]
    want = []
    for f, imm in cases:
        wide = int(vec_lanes(f.value, lanes, imm, silu, heads)) > 1
        heads_rope = heads and bool(rope_heads_laned(f.value, imm, lanes))
        want.append((wide, heads_rope or wide and f not in (
            VecFunc.REQUANT, VecFunc.FOLD, VecFunc.ROPE, VecFunc.KV4)))
        got = command_lanes(cfg, f.value, imm)
        assert (bool(got[0]), bool(got[1])) == want[-1], (f, hex(imm))
    assert any(w for w, _ in want) and not all(w for w, _ in want)
    func, imm_s = Signal(VecFunc), Signal(40)
    laned, writes_n = command_lanes(cfg, func.as_value(), imm_s)
    seen = []

    async def bench(ctx):
        for f, imm in cases:
            ctx.set(func, f)
            ctx.set(imm_s, imm)
            seen.append((bool(ctx.get(laned)), bool(ctx.get(writes_n))))

    sim = Simulator(Module())
    sim.add_testbench(bench)
    sim.run()
    assert seen == want
    with pytest.raises(ValueError, match="lanes > 1, got 1"):
        command_lanes(VCFG, 0, 0)


# ---------------------------------------------------------------------- timing
def _one_lane(func: VecFunc, length: int, imm: int) -> int:
    return timing.vec_cycles(Vec(func=func, length=length, imm=imm), VCFG)


@pytest.mark.parametrize("lanes", LANES)
def test_laned_cycles(lanes):
    """A laned sub-op takes its one-lane cycles of a row of ``ceil(L / lanes)`` elements, plus
    ``log2(lanes)`` per reduction over the lanes (REQUANT's, FOLD's and KV4's AbsMax,
    RMSNORM's AbsMax and SumSq, SOFTMAX's Max and Sum); every other sub-op its one-lane
    cycles. Random lengths, not multiples of the lanes among them (KV4: a value row)."""
    rng = np.random.default_rng(lanes)
    tree = lanes.bit_length() - 1
    reductions = {VecFunc.REQUANT: 1, VecFunc.FOLD: 1, VecFunc.RMSNORM: 2, VecFunc.SOFTMAX: 2,
                  VecFunc.KV4: 1}
    cfg = _cfg(lanes)
    for length in [1, 2, 3, 4, 5, 7, 8, 9, 255, 256, 257] + rng.integers(1, 4096, 20).tolist():
        for func in VecFunc:
            imm = _imm(func, length)
            got = timing.vec_cycles(Vec(func=func, length=length, imm=imm), cfg)
            if _laned(func, imm, lanes):
                want = _one_lane(func, -(-length // lanes), imm) + reductions.get(func, 0) * tree
            else:
                want = _one_lane(func, length, imm)
            assert got == want, (func, length, lanes)
    # SILU_GATE with its chain a lane (vector_laned_silu): no reduction, its one-lane cycles
    # of ceil(L / lanes) elements
    silu = cfg.replace(vector_laned_silu=True) if lanes > 1 else cfg
    for length in [1, 2, 3, 5, 8, 9, 688, 1536]:
        v = Vec(func=VecFunc.SILU_GATE, length=length)
        assert timing.vec_cycles(v, silu) == _one_lane(VecFunc.SILU_GATE, -(-length // lanes), 0)


@pytest.mark.parametrize("lanes", [2, 4, 128, 512])
def test_laned_rope_over_heads_cycles(lanes):
    """A ROPE over heads the lanes hold whole (``vector_laned_rope_heads``) reads a group a
    cycle, its table's group beside it, and each element enters Rope as it arrives: its
    one-lane cycles of a row of ``ceil(L / lanes)`` elements less the one-lane ROPE's cycle
    between a pair's two elements; without the flag, one element a cycle. LLaMA-7B's query
    row (32 heads of 128) on HBM-class's memory with a beat's 512 lanes: 15 cycles, not the
    one-lane 4,104."""
    from bench.scaling import VECTOR_SYSTEMS

    cfg = _cfg(lanes) if lanes <= VCFG.vector_lanes_max else dict(VECTOR_SYSTEMS)[
        "HBM-class"].replace(vector_lanes=lanes, vector_laned_rope_heads=False)
    assert cfg.vector_lanes == lanes
    on = cfg.replace(vector_laned_rope_heads=True)
    lat = timing.VEC_FEED_LATENCY + timing.VECTOR_LATENCY["rope"]
    for head_dim in (2, 4, 128):
        for heads in (1, 2, 3, 32):
            v = Vec(func=VecFunc.ROPE, length=heads * head_dim, imm=rope_imm(head_dim, heads))
            if head_dim > lanes:
                assert timing.vec_cycles(v, on) == timing.vec_cycles(v, cfg)
                continue
            groups = -(-v.length // lanes)
            assert timing.vec_cycles(v, on) == groups + timing.VEC_READ_LATENCY + lat
            assert timing.vec_cycles(v, on) == _one_lane(v.func, groups, v.imm) - 1
            assert timing.vec_cycles(v, cfg) == _one_lane(v.func, v.length, v.imm)
    if lanes == 512:
        v = Vec(func=VecFunc.ROPE, length=4096, imm=rope_imm(128, 32))
        assert (timing.vec_cycles(v, on), timing.vec_cycles(v, cfg)) == (15, 4104)


@pytest.mark.parametrize("lanes", [2, 4, 32])
def test_laned_kv4_key_row_cycles(lanes):
    """A KV4 key row of groups of ``lanes`` elements or more (:func:`hw.isa.kv4_laned`) reads
    each of its two passes in ``ceil(L / lanes)`` cycles, its groups' codes one a cycle as
    with one lane, and its AbsMax passes the lane tree; one of smaller groups streams one
    element a cycle, through the engine's lane tree still (the one AbsMax), its rows aligned
    all the same (the rule reads no ``imm``)."""
    cfg = _cfg(lanes) if lanes <= 4 else VCFG.replace(
        memory=dataclasses.replace(VCFG.memory, bytes_per_cycle=4 * lanes), vector_lanes=lanes)
    tree = lanes.bit_length() - 1
    for length, group in ((4096, 32), (128, 128), (64, lanes), (64, 2 * lanes), (64, 1),
                          (64, lanes // 2)):
        v = Vec(func=VecFunc.KV4, length=length, imm=kv4_imm(group))
        laned = group >= lanes
        assert bool(kv4_laned(v.func.value, v.imm, lanes)) == laned
        saved = 2 * (length - -(-length // lanes)) if laned else 0
        assert timing.vec_cycles(v, cfg) == _one_lane(v.func, length, v.imm) - saved + tree
        assert bool(vec_unaligned(v.func.value, lanes // 2, 0, 0, lanes)) == (lanes > 1)
    # LLaMA-7B's key row (32 heads of 128, groups of 32) on DDR4-class's 32 lanes: a few
    # hundred cycles, not the one-lane ~8.3k
    if lanes == 32:
        v = Vec(func=VecFunc.KV4, length=4096, imm=kv4_imm(32))
        assert timing.vec_cycles(v, cfg) < 600 < 8000 < _one_lane(v.func, 4096, v.imm)


@pytest.mark.parametrize("lanes", LANES)
def test_laned_cycles_fields(lanes):
    """The formula on decoded arrays equals it on each instruction."""
    rng = np.random.default_rng(10 + lanes)
    cfg = _cfg(lanes)
    vecs = []
    for _ in range(300):
        func = VecFunc(int(rng.choice([f.value for f in VecFunc])))
        length = int(rng.integers(1, 2048))
        vecs.append(Vec(func=func, length=length, imm=_imm(func, length)))
    f = decode_fields(program_words(vecs))
    for c in (cfg, cfg.replace(vector_laned_silu=True, vector_laned_rope_heads=True)
              ) if lanes > 1 else (cfg,):
        assert timing.vec_cycles_fields(f, c).tolist() == [timing.vec_cycles(v, c)
                                                            for v in vecs]


def test_four_lanes_hot_functions():
    """The decode step's hot sub-ops on a row of 256 (the reference model's hidden size), one
    and four lanes: the numbers the vector configuration's step moves by."""
    got = {f: [timing.vec_cycles(Vec(func=f, length=256), _cfg(n)) for n in (1, 4)]
           for f in (VecFunc.REQUANT, VecFunc.DEQUANT, VecFunc.RMSNORM, VecFunc.SOFTMAX)}
    assert got == {VecFunc.REQUANT: [537, 155], VecFunc.DEQUANT: [270, 78],
                   VecFunc.RMSNORM: [801, 229], VecFunc.SOFTMAX: [814, 242]}


# ---------------------------------------------------------------------- alignment
@pytest.mark.parametrize(("lanes", "silu"), [(1, False), (2, False), (4, False), (4, True)])
def test_alignment_rule(lanes, silu):
    """A laned VEC's rows (a_addr, b_addr where it reads one, dst_addr) start on a multiple of
    the lanes, else BAD_ADDRESS (SILU_GATE's with ``vector_laned_silu``); other sub-ops and
    one lane never fail it. dispatch_error, dispatch_errors and check agree, and check names
    the addresses."""
    rng = np.random.default_rng(20 + lanes + silu)
    cfg = _cfg(lanes).replace(vector_laned_silu=silu)
    vecs, want = [], []
    for _ in range(400):
        func = VecFunc(int(rng.choice([f.value for f in VecFunc if f != VecFunc.ROPE])))
        length = int(rng.integers(1, 64))
        a, b, d = (int(x) for x in rng.integers(0, 512, 3))
        v = Vec(func=func, length=length, imm=_imm(func, length), a_addr=a,
                b_addr=b if vec_reads_b(func.value) else int(rng.integers(0, 512)), dst_addr=d)
        n = lanes if func in laned_vec_funcs(cfg) else 1
        # (INSERT's codes, b_addr, any; a KV4's rows whatever its imm)
        rows = lanes if func in (VecFunc.INSERT, VecFunc.INSERT4, VecFunc.KV4) else n
        bad = bool(a % rows or d % rows or (vec_reads_b(func.value) and v.b_addr % n))
        assert bool(vec_unaligned(func.value, a, v.b_addr, d, lanes, silu)) == bad
        vecs.append(v)
        want.append(ErrorCode.BAD_ADDRESS if bad else ErrorCode.NONE)
    got = [dispatch_error(v, cfg) for v in vecs]
    assert got == want
    assert dispatch_errors(decode_fields(program_words(vecs)), cfg).tolist() == \
        [e.value for e in want]
    assert (lanes == 1) == (ErrorCode.BAD_ADDRESS not in want)
    for v, e in zip(vecs, want, strict=True):
        if e != ErrorCode.NONE:
            with pytest.raises(Exception, match=f"vector_lanes={lanes} .*a_addr={v.a_addr}"):
                check(v, cfg)
            break


# ---------------------------------------------------------------------- the fast model
@pytest.mark.parametrize("seed", range(4))
def test_random_programs_results_independent_of_lanes(seed):
    """Random vector programs (rows drawn aligned, lengths any) on 1, 2 and 4 lanes, and 4
    with SILU_GATE and the ROPEs over heads the lanes hold laned: each runs without error,
    every VEC takes its ``vec_cycles`` on that configuration, and the DRAM they leave is the
    same bit for bit (the lanes change when, never what)."""
    base = EQUIVALENCE_CONFIGS["4x4"]
    rng = np.random.default_rng(seed)
    widest = base.replace(vector_lanes=4, vector_laned_silu=True, vector_laned_rope_heads=True)
    rp = random_program(widest, rng, chains=int(rng.integers(1, 3)), tasks=3, vector=0.9)
    results = []
    for cfg in [*(base.replace(vector_lanes=lanes) for lanes in LANES), widest]:
        res = FastModel(cfg).run(rp.program, rp.dram, trace=True, regs=rp.regs)
        assert res.ok, (cfg.vector_lanes, res.error, res.detail)
        for t in res.trace:
            ins = rp.program[t.index]
            if isinstance(ins, Vec):
                assert t.end - t.grant == timing.vec_cycles(ins, cfg)
        results.append(res)
    for res in results[1:]:
        assert np.array_equal(res.dram, results[0].dram)
    # faster but by the cycles a VEC takes more laned (a short row's lane tree; a KV4 of
    # groups below the lanes, one lane through the tree)
    assert base.vector_lanes == 1
    slower = sum(max(0, timing.vec_cycles(i, widest) - timing.vec_cycles(i, base))
                 for i in rp.program if isinstance(i, Vec))
    assert results[-1].cycles <= results[0].cycles + slower
