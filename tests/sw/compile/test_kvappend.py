"""The KV append on chip (sw.compile.kvappend): one token's keys and values written into
a layer's cache regions by the vector engine (REQUANT, INSERT; for the INT4 cache KV4,
INSERT4 and INSERT) equal the host's append
(``kv_rows(x, vector=True)`` through ``KVLayout.write``) byte for byte on the fast model, at
any position, the value code word is REQUANT's ``amax`` and the scores' channel word
CHANNEL's (``scores_channels_vector`` of the key row's ``amax``, what the host writes)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from hw.config import AcceleratorConfig, preset
from hw.isa import (
    MOVE_SPAD,
    End,
    Load,
    Spad,
    Store,
    Vec,
    VecFunc,
    insert_imm,
    program_words,
    reg_table_values,
    reg_value,
)
from hw.numerics import (
    act_scale,
    from_fixed,
    kv4_rows_vector_torch,
    kv_rows,
    scores_channels_vector,
    scores_scale_word,
    value_amax_torch,
    value_codes,
    vec_requant,
)
from sim.model import FastModel, schedule
from sw.compile.errors import LoweringError
from sw.compile.kvappend import KVAppendPlan, append_value_code, schedule_kv_append
from sw.compile.lower import KVLayout
from sw.compile.registers import RegisterFile, allocate_words

#: A record wider than a beat (keys: a beat per channel), one narrower (keys: the tile as one
#: run; values: records inside a beat), a beat wider than a record, and more lanes than
#: channels, records of many beats (values: the record's first beats, one INSERT group).
CONFIGS = {
    "many_lanes": AcceleratorConfig(rows=4, cols=128, vin_spad_bytes=16384,
                                    vout_spad_bytes=8192,
                                    memory={"bytes_per_cycle": 16, "latency": 3,
                                            "size_bytes": 1 << 22}),
    "vector": preset("vector"),
    "narrow": AcceleratorConfig(rows=2, cols=4, vin_spad_bytes=4096, vout_spad_bytes=4096,
                                memory={"bytes_per_cycle": 16, "latency": 3,
                                        "size_bytes": 1 << 20}),
    "wide_beat": AcceleratorConfig(rows=4, cols=8, vin_spad_bytes=16384,
                                   vout_spad_bytes=8192,
                                   memory={"bytes_per_cycle": 64, "latency": 3,
                                           "size_bytes": 1 << 20}),
}


#: The softmax scale of the appended layer (its channel words' constant).
SCALE = 64 ** -0.5


def _up(n: int, beat: int) -> int:
    return -(-n // beat) * beat


def _setup(cfg, layout, kv_heads, rng):
    """A DRAM image (random bytes) and the plan of one layer's append in it."""
    beat, d = cfg.beat_bytes, layout.head_dim
    at = 0

    def take(n):
        nonlocal at
        a, at = at, at + _up(n, beat)
        return a

    k_row, v_row = take(4 * kv_heads * d), take(4 * kv_heads * d)
    scratch = take(KVAppendPlan.scratch_bytes(cfg, layout, kv_heads))
    keys = [take(layout.key_bytes) for _ in range(kv_heads)]
    values = [take(layout.value_bytes) for _ in range(kv_heads)]
    codes = [take(4 * layout.max_context) for _ in range(kv_heads)]
    channels = [take(4 * layout.max_context) for _ in range(kv_heads)]
    dram = rng.integers(0, 256, at, dtype=np.uint8)
    return dram, KVAppendPlan(k_row, v_row, scratch, keys, values, codes, channels,
                              scores_scale_word(SCALE))


def _check_append(model, words, sites, layout, plan, kv_heads, position, dram, want, amax,
                  chan, where):
    """Complete ``want`` (the host append's cache bytes) with each kv head's value code
    (from the value rows' ``amax``) and scores' channel word (``chan``), run the append
    program at ``position`` on ``dram`` and check every byte but the scratch buffer's (the
    REQUANT or KV4 results) equals ``want``."""
    for h in range(kv_heads):
        c = plan.codes[h] + 4 * position
        want[c:c + 4] = np.array([append_value_code(amax[h])], "<i4").view(np.uint8)
        if plan.channels is not None:
            c = plan.channels[h] + 4 * position
            want[c:c + 4] = np.array([chan[h]], "<i4").view(np.uint8)
    regs = RegisterFile()
    words = allocate_words(words, regs, {s.index: layout.append_terms(s.kind)[s.field == "imm"]
                                         for s in sites})
    r = model.run(words, dram, regs=reg_table_values(regs.table, position))
    assert r.ok, r.error
    s0 = plan.scratch
    s1 = s0 + KVAppendPlan.scratch_bytes(model.cfg, layout, kv_heads)
    got = r.dram.copy()
    got[s0:s1] = want[s0:s1]
    assert np.array_equal(got, want), where


def _rows(rng, kv_heads, d):
    """Q15.16 rows of kv heads: small values, large ones (amax up to 2**31 - 1) and zeros."""
    scale = rng.choice([2.0 ** 12, 2.0 ** 20, 2.0 ** 30], size=(kv_heads, 1))
    w = np.clip(np.rint(rng.standard_normal((kv_heads, d)) * scale), -2**31 + 1, 2**31 - 1)
    w[rng.random(kv_heads) < 0.2] = 0
    return w.astype(np.int64)


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", range(3))
def test_the_append_program_writes_the_hosts_bytes(name, seed):
    """At positions on and around a tile's edges and a random one, with random cache bytes
    around: every byte but the scratch buffer's is the host append's; twelve kv heads of 64
    take two phase-1 groups on the narrow configuration."""
    cfg = CONFIGS[name]
    rng = np.random.default_rng(seed)
    kv_heads, d = [(2, 16), (3, 32), (12, 64)][seed]
    layout = KVLayout(head_dim=d, max_context=128, lanes=cfg.lanes, beat=cfg.beat_bytes)
    dram0, plan = _setup(cfg, layout, kv_heads, rng)
    if seed == 1:   # no DEQUANT reads channel words: their regions stay as they were
        plan = replace(plan, channels=None)
    cfg = cfg.with_dram(_up(dram0.size, cfg.beat_bytes))
    dram0 = np.concatenate([dram0, np.zeros(cfg.memory.size_bytes - dram0.size, np.uint8)])
    program, sites = schedule_kv_append(cfg, layout, kv_heads, plan)
    words = program_words([*program, End()])
    model = FastModel(cfg)
    lanes = cfg.lanes
    edges = {0, lanes - 1, lanes, layout.max_context - 1, int(rng.integers(0, layout.max_context))}
    for position in sorted(p for p in edges if p < layout.max_context):
        k, v = _rows(rng, kv_heads, d), _rows(rng, kv_heads, d)
        dram = dram0.copy()
        for addr, rows in ((plan.k_row, k), (plan.v_row, v)):
            dram[addr:addr + rows.size * 4] = rows.astype("<i4").view(np.uint8).reshape(-1)
        want = dram.copy()
        for kind, rows, regions in (("k", k, plan.keys), ("v", v, plan.values)):
            x = torch.from_numpy(from_fixed(rows))[None, :, None, :]
            q, _ = kv_rows(x, vector=True)
            size = layout.key_bytes if kind == "k" else layout.value_bytes
            for h in range(kv_heads):
                layout.write(want[regions[h]:regions[h] + size], kind, [position],
                             q[0, h].numpy())
        _check_append(model, words, sites, layout, plan, kv_heads, position, dram, want,
                      vec_requant(v)[1], scores_channels_vector(vec_requant(k)[1], SCALE),
                      (name, position))


def test_the_value_code_is_the_scale_code_but_for_zero_rows_and_above_2_to_23():
    """REQUANT's amax (the code the chip appends) against the host's code of the row's scale
    (value_codes of act_scale): equal for 0 < amax < 2**23; an all-zero row's scale is 1,
    whose code is 127 * 2**16."""
    rng = np.random.default_rng(3)
    amax = np.concatenate([rng.integers(1, 2**23, 1000), [1, 2**23 - 1]])
    codes = value_codes(torch.from_numpy(act_scale(amax))).numpy()
    assert np.array_equal(codes, append_value_code(amax))
    assert int(value_codes(torch.from_numpy(act_scale(np.array([0]))))[0]) == 127 * 2**16
    big = rng.integers(2**23, 2**31, 1000)
    assert np.abs(value_codes(torch.from_numpy(act_scale(big))).numpy() - big).max() <= \
        big.max() * 2.0 ** -23


def test_what_the_append_cannot_do_is_a_lowering_error():
    cfg = preset("vector")
    layout = KVLayout(head_dim=64, max_context=128, lanes=cfg.lanes, beat=cfg.beat_bytes)
    plan = KVAppendPlan(0, 4096, 8192, [16384], [32768], [49152])
    with pytest.raises(LoweringError, match="vector engine"):
        schedule_kv_append(AcceleratorConfig(), layout, 1, plan)
    with pytest.raises(LoweringError, match="INT4 key stream of 8 lanes .* not in whole"):
        schedule_kv_append(cfg, KVLayout(64, 128, 8, cfg.beat_bytes, bits=4), 1, plan)
    with pytest.raises(LoweringError, match="not on a 16-byte beat"):
        schedule_kv_append(cfg, layout, 1, KVAppendPlan(8, 4096, 8192, [16384], [32768],
                                                        [49152]))
    two = KVAppendPlan(0, 4096, 8192, [16384] * 2, [32768] * 2, [49152] * 2)
    with pytest.raises(LoweringError, match="element 34 .* 4 lanes"):   # the second head's row
        schedule_kv_append(cfg, KVLayout(34, 128, cfg.lanes, cfg.beat_bytes), 2, two)
    tiny = CONFIGS["narrow"].replace(vin_spad_bytes=256, vout_spad_bytes=256)
    narrow = KVLayout(64, 128, tiny.lanes, tiny.beat_bytes)
    with pytest.raises(LoweringError, match="of a kv head .* does not fit"):
        schedule_kv_append(tiny, narrow, 1, plan)
    many = KVAppendPlan(0, 4096, 8192, [16384] * 12, [32768] * 12, [49152] * 12)
    program, _ = schedule_kv_append(CONFIGS["narrow"], narrow, 12, many)
    scratch = [i.dram_addr for i in program if isinstance(i, Store) and i.rows == 1
               and i.dram_addr < 16384 // 16]
    assert scratch == [8192 // 16, 8192 // 16 + 2 * 8 * 5]   # 8 kv heads, then 4


@pytest.mark.parametrize(("head_dim", "lanes", "beat"),
                         [(64, 32, 16), (16, 8, 16), (32, 16, 64), (8, 32, 4), (64, 64, 16),
                          (8, 16, 16), (128, 1024, 128), (16, 512, 16), (64, 1024, 2048)])
def test_the_append_geometry_names_the_positions_bytes(head_dim, lanes, beat):
    """KVLayout.append_transfer / append_site / append_insert: the INSERT's bytes of the loaded
    beats (rows at dram_stride, each row_beats long) are KVLayout.fields' bytes of the
    position, at every position, and every loaded beat holds one of them; its geometry fits
    the INSERT's fields; position 0's site is (0, 0)."""
    layout = KVLayout(head_dim=head_dim, max_context=2 * lanes + 3, lanes=lanes, beat=beat)
    assert all(layout.append_origin(kind) == 0 for kind in "kvc")
    for kind in "kvc":
        rows, row_beats, stride = layout.append_transfer(kind)
        group, groups, step, skip = layout.append_insert(kind)
        if kind != "k" or layout.keys.record_bytes <= 255:  # the stride field: 8 bits
            insert_imm(0, group, groups, step, skip)
        j = np.arange(group * groups)
        assert layout.append_site(kind, 0) == (0, 0)
        for p in range(layout.max_context):
            at, base = layout.append_site(kind, p)
            loaded = np.concatenate([(at + r * stride) * beat + np.arange(row_beats * beat)
                                     for r in range(rows)])
            byte = base + (j // group) * (group * step + skip) + (j % group) * step
            want = np.arange(4 * p, 4 * p + 4) if kind == "c" else layout.fields(kind, [p])[0][0]
            assert np.array_equal(loaded[byte], want), (kind, p)
            assert np.array_equal(np.unique(byte // beat), np.arange(rows * row_beats)), kind


#: INT4 caches the append runs on chip: 32 lanes in 16-byte beats (records of a beat, headers
#: of two), 16 lanes (records of half a beat, headers of one), 64 lanes in 32-byte beats, 512
#: lanes in 16-byte beats (records of 16 beats: a beat of each, a piece per group).
INT4_CONFIGS = {
    "vector": preset("vector"),
    "lanes16": AcceleratorConfig(rows=2, cols=8, vin_spad_bytes=4096, vout_spad_bytes=4096,
                                 memory={"bytes_per_cycle": 16, "latency": 3,
                                         "size_bytes": 1 << 20}),
    "beat32": AcceleratorConfig(rows=2, cols=32, vin_spad_bytes=8192, vout_spad_bytes=8192,
                                memory={"bytes_per_cycle": 32, "latency": 3,
                                        "size_bytes": 1 << 20}),
    "many_lanes": CONFIGS["many_lanes"],
}


@pytest.mark.parametrize("name", sorted(INT4_CONFIGS))
@pytest.mark.parametrize("seed", range(3))
def test_the_int4_append_program_writes_the_hosts_bytes(name, seed):
    """The INT4 cache: at positions on and around a tile's edges and a random one (odd and
    even: a key's nibble shares its byte with the next position's), with random cache bytes
    around, every byte but the scratch buffer's is the host append's (kv4_rows_vector
    through KVLayout.write: nibbles, the keys' group codes), the value code is the row's
    amax and the channel word CHANNEL's of the key row's amax with the INT4 scale word."""
    cfg = INT4_CONFIGS[name]
    rng = np.random.default_rng(100 + seed)
    kv_heads, d = [(2, 16), (3, 32), (2, 64)][seed]
    layout = KVLayout(head_dim=d, max_context=128, lanes=cfg.lanes, beat=cfg.beat_bytes,
                      bits=4)
    dram0, plan = _setup(cfg, layout, kv_heads, rng)
    plan = replace(plan, scale_word=scores_scale_word(SCALE, 4))
    if seed == 1:
        plan = replace(plan, channels=None)
    cfg = cfg.with_dram(_up(dram0.size, cfg.beat_bytes))
    dram0 = np.concatenate([dram0, np.zeros(cfg.memory.size_bytes - dram0.size, np.uint8)])
    program, sites = schedule_kv_append(cfg, layout, kv_heads, plan)
    assert {s.kind for s in sites} == {"k", "h", "v", "c"} | ({"s"} if seed != 1 else set())
    words = program_words([*program, End()])
    model = FastModel(cfg)
    lanes = cfg.lanes
    # a header's beat boundary too: a header of more lanes than a beat's bytes moves the
    # beat holding the position's code alone
    beat = cfg.beat_bytes
    edges = {0, 1, beat - 1, beat, lanes - 1, lanes, layout.max_context - 1,
             int(rng.integers(0, layout.max_context))}
    for position in sorted(p for p in edges if p < layout.max_context):
        k, v = _rows(rng, kv_heads, d), _rows(rng, kv_heads, d)
        dram = dram0.copy()
        for addr, rows in ((plan.k_row, k), (plan.v_row, v)):
            dram[addr:addr + rows.size * 4] = rows.astype("<i4").view(np.uint8).reshape(-1)
        want = dram.copy()
        for kind, rows, regions in (("k", k, plan.keys), ("v", v, plan.values)):
            x = torch.from_numpy(from_fixed(rows))[None, :, None, :]
            group = layout.key_format.group if kind == "k" else None
            q, c, _ = kv4_rows_vector_torch(x, group)
            size = layout.key_bytes if kind == "k" else layout.value_bytes
            for h in range(kv_heads):
                layout.write(want[regions[h]:regions[h] + size], kind, [position],
                             q[0, h].numpy(), None if c is None else c[0, h].numpy())
        _check_append(model, words, sites, layout, plan, kv_heads, position, dram, want,
                      value_amax_torch(torch.from_numpy(from_fixed(v)), bits=4).numpy(),
                      scores_channels_vector(vec_requant(k)[1], SCALE, kv_bits=4),
                      (name, position))


@pytest.mark.parametrize(("head_dim", "lanes", "beat"),
                         [(64, 32, 16), (16, 16, 16), (32, 16, 16), (128, 32, 32),
                          (64, 8, 4), (128, 1024, 128), (32, 512, 16)])
def test_the_int4_append_geometry_names_the_positions_nibbles(head_dim, lanes, beat):
    """The INT4 cache's append geometry: INSERT4's nibbles of the loaded beats (from
    append_origin past the site, each piece's after the one before's) are KVLayout.fields'
    nibbles of the position (keys, values), INSERT's bytes of the headers its key group
    codes' bytes (code_offsets), at every position, and every loaded beat holds one of them
    (a header wider than a beat: only its beat holding the code); the geometry fits the
    INSERT's fields; position 0's site is (0, 0). Records wider than a beat: a piece per
    group of keys."""
    layout = KVLayout(head_dim=head_dim, max_context=2 * lanes + 3, lanes=lanes, beat=beat,
                      bits=4)
    for kind in "khvc":
        half = layout.append_func(kind) == VecFunc.INSERT4
        assert half == (kind in "kv")
        rows, row_beats, stride = layout.append_transfer(kind)
        pieces, apart = layout.append_pieces(kind)
        assert pieces == 1 or (kind == "k" and layout.keys.record_bytes > beat)
        group, groups, step, skip = layout.append_insert(kind)
        insert_imm(0, group, groups, step, skip)
        n, size = group * groups, rows * row_beats * beat * (2 if half else 1)
        j = np.arange(pieces * n)
        assert layout.append_site(kind, 0) == (0, 0)
        for p in range(layout.max_context):
            at, base = layout.append_site(kind, p)
            at += layout.append_origin(kind)
            loaded = np.concatenate([(at + i * apart + r * stride) * beat
                                     + np.arange(row_beats * beat)
                                     for i in range(pieces) for r in range(rows)])
            within = j % n
            unit = (j // n) * size + base + (within // group) * (group * step + skip) \
                + (within % group) * step
            if kind == "c":
                assert np.array_equal(loaded[unit], np.arange(4 * p, 4 * p + 4))
            elif kind == "h":
                assert np.array_equal(loaded[unit], layout.code_offsets([p])[0]), p
            else:
                offset, shift = layout.fields(kind, [p])
                assert np.array_equal(loaded[unit // 2], offset[0]), (kind, p)
                assert np.array_equal(4 * (unit % 2), shift[0]), (kind, p)
            # every beat moved holds a code: the append loads, walks and stores no other
            byte = unit // 2 if half else unit
            assert np.array_equal(np.unique(byte // beat), np.arange(pieces * rows * row_beats)), \
                (kind, p)


def _site_written_out(layout: KVLayout, kind: str, position: int) -> tuple[int, int]:
    """Where an append of ``position`` lies, the arithmetic written out (tile, lane and byte
    of the stream layouts; the reference the register terms must reproduce)."""
    beat, lanes = layout.beat, layout.lanes
    if kind in ("k", "h"):
        tile = position // lanes * (layout.key_tile_stride // beat)
        lane = position % lanes
        if layout.bits == 4 and kind == "h":  # the header's beat holding the lane's code
            return tile + lane // beat, lane % beat
        if layout.bits == 4 and layout.keys.record_bytes > beat:  # a beat of each record
            return tile + lane // (2 * beat), lane % (2 * beat)   # a record's nibbles
        if layout.bits == 4 or layout.keys.record_bytes <= beat:
            return tile, lane
        return tile + lane // beat, lane % beat
    at = position * (layout.values.record_bytes if kind == "v" else 4)
    nibbles = 2 if layout.bits == 4 and kind == "v" else 1
    return at // beat, nibbles * (at % beat)


@pytest.mark.parametrize("seed", range(4))
def test_the_append_registers_hold_the_sites_at_random_positions(seed):
    """KVLayout.append_terms (what the append's run-time registers hold): evaluated at random
    positions of random layouts (INT8 and INT4, lanes and beats of powers of two) they give
    the sites written out; append_site is their value, (0, 0) at position 0; equal terms
    share one register (RegisterFile)."""
    rng = np.random.default_rng(seed)
    for _ in range(25):
        lanes = int(2 ** rng.integers(3, 7))
        beat = int(2 ** rng.integers(2, 7))
        bits = int(rng.choice([8, 4]))
        head_dim = int(rng.choice([32, 64, 128] if bits == 4 else [8, 16, 32, 64, 128]))
        layout = KVLayout(head_dim=head_dim, max_context=int(rng.integers(1, 5000)),
                          lanes=lanes, beat=beat, bits=bits)
        positions = rng.integers(0, 1 << 16, 40)
        regs = RegisterFile()
        for kind in ("k", "h", "v", "c", "s") if bits == 4 else ("k", "v", "c", "s"):
            beats, base = layout.append_terms(kind)
            assert layout.append_site(kind, 0) == (0, 0)
            assert regs.index(beats) == regs.index(tuple(beats))   # one register per sum
            for p in positions:
                want = _site_written_out(layout, kind, int(p))
                assert (reg_value(beats, int(p)), reg_value(base, int(p))) == want, (kind, p)
                assert layout.append_site(kind, int(p)) == want
            vec = np.asarray(positions)  # the evaluator takes arrays too
            assert np.array_equal(reg_value(beats, vec),
                                  [_site_written_out(layout, kind, int(p))[0] for p in vec])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_moves_skip_the_scratch_buffer(name):
    """Where VIN has room, phases 1 and 2 move their results into VIN (hw.isa.MOVE_SPAD):
    the program then reads and writes no scratch buffer byte and takes fewer cycles than
    the round trip through it (the fast model: its LOADs' beats and memory latency)."""
    cfg = CONFIGS[name]
    layout = KVLayout(head_dim=64, max_context=128, lanes=cfg.lanes, beat=cfg.beat_bytes)
    dram, plan = _setup(cfg, layout, 2, np.random.default_rng(0))
    cfg = cfg.with_dram(_up(dram.size, cfg.beat_bytes))
    s0 = plan.scratch // cfg.beat_bytes
    s1 = s0 + KVAppendPlan.scratch_bytes(cfg, layout, 2) // cfg.beat_bytes
    cycles = {}
    for moves in (True, False):
        program, _ = schedule_kv_append(cfg, layout, 2, plan, moves=moves)
        moved = [i for i in program if isinstance(i, Store) and i.spad == MOVE_SPAD]
        scratch = [i for i in program if isinstance(i, (Load, Store))
                   and i.spad != MOVE_SPAD and s0 <= i.dram_addr < s1]
        assert (len(moved), len(scratch) > 0) == ((2, False) if moves else (0, True))
        cycles[moves] = schedule(program_words([*program, End()]), cfg).cycles
    assert cycles[True] < cycles[False], cycles


@pytest.mark.parametrize("name,kv_heads,d", [("vector", 2, 64), ("narrow", 3, 32),
                                             ("wide_beat", 12, 64), ("narrow", 12, 64),
                                             ("narrow", 4, 128)])
def test_an_append_whose_results_move_has_no_scratch_buffer(name, kv_heads, d):
    """KVAppendOp.scratch_bytes is 0 exactly where the program moves its results through
    VIN (a MOVE_SPAD STORE), and then the program without a scratch buffer (None) is the one
    with it, word for word; where they do not move (twelve or four kv heads on the narrow
    configuration) it is KVAppendPlan.scratch_bytes, and a plan without one is refused."""
    from sw.compile.kvappend import KVAppendOp

    cfg = CONFIGS[name]
    layout = KVLayout(head_dim=d, max_context=128, lanes=cfg.lanes, beat=cfg.beat_bytes)
    _, plan = _setup(cfg, layout, kv_heads, np.random.default_rng(1))
    program, sites = schedule_kv_append(cfg, layout, kv_heads, plan)
    moved = any(isinstance(i, Store) and i.spad == MOVE_SPAD for i in program)
    assert moved == ((name, kv_heads) not in (("narrow", 12), ("narrow", 4)))
    heads = tuple(f"h{h}" for h in range(kv_heads))
    op = KVAppendOp(0, kv_heads, layout, "k", "v", "scratch", heads, heads, heads, heads,
                    plan.scale_word)
    if moved:
        assert op.scratch_bytes(cfg) == 0
        again, again_sites = schedule_kv_append(cfg, layout, kv_heads,
                                                replace(plan, scratch=None))
        assert np.array_equal(program_words([*again, End()]),
                              program_words([*program, End()]))
        assert again_sites == sites
    else:
        assert op.scratch_bytes(cfg) == KVAppendPlan.scratch_bytes(cfg, layout, kv_heads) > 0
        with pytest.raises(LoweringError, match="needs a scratch buffer"):
            schedule_kv_append(cfg, layout, kv_heads, replace(plan, scratch=None))


def _race_free_run(cfg, layout, program, sites, dram0, position):
    """The fast model's traced run of the append ``program`` (END appended, its ``sites``
    relative to the run-time registers at ``position``) from ``dram0``, asserted to finish
    with no scratchpad race (:func:`_spad_races`)."""
    regs = RegisterFile()
    words = allocate_words(program_words([*program, End()]), regs, {
        s.index: layout.append_terms(s.kind)[s.field == "imm"] for s in sites})
    run = FastModel(cfg).run(words, dram0, regs=reg_table_values(regs.table, position),
                             trace=True)
    assert run.ok, run.error
    assert not _spad_races(program, run.trace, cfg)
    return run


def _spad_races(program, trace, cfg) -> list[tuple[int, int]]:
    """The (writer, reader) pairs of a run of the append ``program`` (its ``trace``) that
    race on VIN or VOUT beats: a LOAD or move writes VIN beats a VEC reads (``length`` words
    from ``a_addr``, as many from ``b_addr``), or a VEC writes VOUT beats (``length`` words
    from ``dst_addr``) a STORE reads, while the other runs (the writer from its grant to its
    completion, the reader from its grant to its end): what the fast model's values, applied
    in completion order, do not see. The word ranges are generous (a REQUANT writes fewer
    words than it reads), so a pair is a race or nearly one."""
    at = {t.index: t for t in trace}
    per = cfg.beat_bytes // cfg.vin_word_bytes

    def words(lo: int, n: int) -> tuple[int, int]:
        return lo // per, -(-(lo + n) // per)

    def dma(ins) -> tuple[int, int]:
        first = ins.dram_addr if ins.spad == MOVE_SPAD and isinstance(ins, Store) \
            else ins.spad_addr
        return first, first + ins.rows * ins.row_beats
    vin = [(i, [dma(ins)]) for i, ins in enumerate(program)
           if isinstance(ins, Load) and ins.spad == Spad.VIN
           or isinstance(ins, Store) and ins.spad == MOVE_SPAD]
    vecs = [(i, [words(ins.a_addr, ins.length), words(ins.b_addr, ins.length)],
             [words(ins.dst_addr, ins.length)]) for i, ins in enumerate(program)
            if isinstance(ins, Vec)]
    vout = [(i, [(ins.spad_addr, ins.spad_addr + ins.rows * ins.row_beats)])
            for i, ins in enumerate(program) if isinstance(ins, Store) and ins.spad == Spad.VOUT]
    pairs = [(w, r, wb, rb) for w, wb in vin for r, rb, _ in vecs]
    pairs += [(w, r, wb, rb) for w, _, wb in vecs for r, rb in vout]
    return [(w, r) for w, r, wb, rb in pairs
            if any(lo < hi2 and lo2 < hi for lo, hi in wb for lo2, hi2 in rb)
            and at[w].grant <= at[r].end and at[r].grant <= at[w].done]


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("kv_heads,d", [(2, 64), (3, 32)])
def test_the_cache_beats_load_while_phase_1_computes(name, kv_heads, d):
    """Where VIN and VOUT hold a slot per kv head, every kv head's cache LOADs wait for
    nothing and go before the first VEC (right after phase 1's LOADs), no LOAD follows, and
    every INSERT but the first head's waits for nothing (the heads' INSERTs back to back);
    from one random image at a random position it writes the DRAM of the program that loads
    each head's beats in its own task (``early=False``, ``pipeline=False``), with no LOAD or
    move writing VIN beats a VEC reads, and no VEC writing VOUT beats a STORE reads, while
    the other runs (:func:`_spad_races`), in fewer cycles."""
    cfg = CONFIGS[name]
    rng = np.random.default_rng(kv_heads)
    layout = KVLayout(head_dim=d, max_context=128, lanes=cfg.lanes, beat=cfg.beat_bytes)
    dram0, plan = _setup(cfg, layout, kv_heads, rng)
    cfg = cfg.with_dram(_up(dram0.size, cfg.beat_bytes))
    dram0 = np.concatenate([dram0, np.zeros(cfg.memory.size_bytes - dram0.size, np.uint8)])
    position = int(rng.integers(0, layout.max_context))
    runs = {}
    for early in (True, False):
        program, sites = schedule_kv_append(cfg, layout, kv_heads, plan, early=early,
                                            pipeline=False)
        cache = {s.index for s in sites if s.field == "dram_addr"
                 and isinstance(program[s.index], Load)}
        first_vec = next(i for i, ins in enumerate(program) if isinstance(ins, Vec))
        if early:
            assert all(i < first_vec and program[i].wait is None for i in cache)
            assert not any(isinstance(ins, Load) for ins in program[first_vec:])
            inserts = [ins for ins in program if isinstance(ins, Vec)
                       and ins.func in (VecFunc.INSERT, VecFunc.INSERT4)]
            assert sum(ins.wait is not None for ins in inserts) == 1
        else:
            assert all(i > first_vec for i in cache)
        runs[early] = _race_free_run(cfg, layout, program, sites, dram0, position)
    assert np.array_equal(runs[True].dram, runs[False].dram)
    assert runs[True].cycles < runs[False].cycles, {k: r.cycles for k, r in runs.items()}


@pytest.mark.parametrize("name,bits", [("many_lanes", 8), ("vector", 8), ("wide_beat", 8),
                                       ("many_lanes", 4), ("vector", 4)])
def test_phase_3_loads_the_next_heads_beats_while_a_head_inserts(name, bits):
    """Where phase 3 loads a kv head's cache beats at a time (``early=False``), the heads'
    beats go into a ring of VIN slots (``pipeline``): the next head's LOADs go between a
    head's INSERTs and STOREs, which alternate piece by piece, the second head's before the
    first head's last INSERT. From one random
    image at a random position it writes the DRAM of the program that loads a head at a
    time after the head before is stored (``pipeline=False``), with no LOAD or move writing
    VIN beats a VEC reads and no VEC writing VOUT beats a STORE reads while the other runs
    (:func:`_spad_races`), in fewer cycles; five kv heads reuse the slots."""
    cfg = CONFIGS[name]
    kv_heads, d = 5, 32
    rng = np.random.default_rng(bits + kv_heads)
    layout = KVLayout(head_dim=d, max_context=128, lanes=cfg.lanes, beat=cfg.beat_bytes,
                      bits=bits)
    dram0, plan = _setup(cfg, layout, kv_heads, rng)
    plan = replace(plan, scale_word=scores_scale_word(SCALE, bits))
    cfg = cfg.with_dram(_up(dram0.size, cfg.beat_bytes))
    dram0 = np.concatenate([dram0, np.zeros(cfg.memory.size_bytes - dram0.size, np.uint8)])
    position = int(rng.integers(0, layout.max_context))
    runs = {}
    for pipeline in (True, False):
        program, sites = schedule_kv_append(cfg, layout, kv_heads, plan, early=False,
                                            pipeline=pipeline)
        inserts = [i for i, ins in enumerate(program) if isinstance(ins, Vec)
                   and ins.func in (VecFunc.INSERT, VecFunc.INSERT4)]
        cache = [s.index for s in sites if s.field == "dram_addr"
                 and isinstance(program[s.index], Load)]
        last = inserts[len(inserts) // kv_heads - 1]    # the first head's last INSERT
        assert (cache[len(cache) // kv_heads] < last) == pipeline    # the second's LOADs
        runs[pipeline] = _race_free_run(cfg, layout, program, sites, dram0, position)
    assert np.array_equal(runs[True].dram, runs[False].dram)
    assert runs[True].cycles < runs[False].cycles, {k: r.cycles for k, r in runs.items()}
