"""Fused programs (sw/compile/fusion.py): the REQUANT part writes the host's INT8 rows, and
parts joined by :func:`fuse_words` run as they would one after the other."""

import copy
import dataclasses

import numpy as np
import pytest
import torch
from compile_testutil import (
    VSMALL,
    VTINY,
    compressed,
    tiny_lm,
    twin_step_logits,
    vin_row_bytes,
)

from hw import timing
from hw.config import MemoryModel
from hw.engines import engines_fields, exec_cycles_fields
from hw.isa import (
    NO_EVENT,
    End,
    Engine,
    ErrorCode,
    Gemm,
    Load,
    Opcode,
    RegTerm,
    Spad,
    Store,
    Sync,
    Vec,
    VecFunc,
    check,
    decode_fields,
    decode_program,
    dequant_fold,
    gemm_weight_bytes,
    program_words,
)
from hw.numerics import (
    dequant_channels,
    fold_amax_fields,
    fold_amax_word,
    norm_eps,
    norm_weight,
    to_fixed,
    values_channel,
    vec_argmax,
    vec_dequant,
    vec_fold,
    vec_requant,
    vec_rmsnorm,
)
from sim.backends import make_backend
from sim.model import schedule
from sw.compile import CompileOptions, compile_model, compiler, fusion
from sw.compile.blockloop import block_period, instructions, roll_blocks
from sw.compile.errors import LoweringError
from sw.compile.fusion import (
    BESIDE_EVENTS,
    SCORES_AMAX,
    VECTOR_EVENTS,
    DequantOp,
    RequantOp,
    beside,
    cut_loads,
    fuse_parts,
    fuse_words,
    fusion_groups,
    hoistable,
    linear_group,
    load_pieces,
    loads_ahead,
    overlaps,
    part_buffers,
    piece_beats,
    rename_events,
    row_aliases,
    vector_events,
    weights_first,
)
from sw.compile.ir import Graph, Node, TensorType
from sw.compile.relocation import (
    lower_argmax_template,
    lower_dequant_template,
    lower_requant_template,
    lower_vector_template,
    relocate,
)
from sw.compile.schedule import EVENTS, amax_place, argmax_segments
from sw.compile.vector import VectorOp, vector_op
from sw.compress.model import use_hardware_numerics
from sw.runtime import Runtime

CFG = VTINY


class _Op:
    """Operand symbols named as themselves (placed by ``relocate``'s bases)."""

    x, y, b, w, w_tile_stride = "x", "y", None, "w", None


_row_bytes = vin_row_bytes


@pytest.mark.parametrize("seed", range(4))
def test_a_norm_then_requant_fused_writes_the_hosts_int8_rows(seed):
    """RMSNorm then REQUANT of random rows (several tasks, a padded INT8 row), fused, through
    the fast model: the INT8 rows are vec_requant of vec_rmsnorm, row by row."""
    rng = np.random.default_rng(seed)
    length = int(rng.integers(8, 120))
    rows = int(rng.integers(1, 12))
    act_row = -(-(length + int(rng.integers(0, 40))) // CFG.beat_bytes) * CFG.beat_bytes
    row = _row_bytes(length)
    base = {"x": 0, "w": rows * row, "y": rows * row + row, "q": 2 * rows * row + row}
    eps = norm_eps(1e-5, length)
    norm = relocate(lower_vector_template(CFG, VecFunc.RMSNORM, rows, length, const=True,
                                          imm=eps), base, [_Op], CFG.beat_bytes)

    class _Req:
        x, y, b, w, w_tile_stride = "y", "q", None, None, None
    req = relocate(lower_requant_template(CFG, rows, length, act_row), base, [_Req],
                   CFG.beat_bytes)
    words = fuse_words(CFG, [vector_events(norm), vector_events(req)])
    program = decode_program(words.astype("<u8").view(np.uint8).reshape(-1))
    for ins in program:
        check(ins, CFG)
    syncs = [i for i in program if isinstance(i, Sync)]
    assert syncs and all(s.engine == Engine.LOAD for s in syncs)
    assert not {i.wait for i in program} & set(VECTOR_EVENTS)  # renamed
    x = to_fixed(rng.standard_normal((rows, length)) * float(rng.choice([0.1, 10.0])))
    w = norm_weight(rng.standard_normal(length), length)
    dram = np.zeros(CFG.memory.size_bytes, np.uint8)
    padded = np.zeros((rows, row // 4), "<i4")
    padded[:, :length] = x
    dram[:padded.nbytes] = padded.view(np.uint8).reshape(-1)
    dram[base["w"]:base["w"] + 4 * length] = w.astype("<i4").view(np.uint8)
    r = make_backend("model", CFG).run(words, dram)
    assert r.ok, r.error
    got = r.dram[base["q"]:base["q"] + rows * act_row].view(np.int8).reshape(rows, act_row)
    for i in range(rows):
        want, _ = vec_requant(vec_rmsnorm(x[i], w, eps))
        assert np.array_equal(got[i, :length], want), i


def test_a_part_must_end_with_end_and_fit():
    t = lower_requant_template(CFG, 2, 16, 16)
    with pytest.raises(LoweringError, match="does not end with END"):
        fuse_words(CFG, [t.words[:-1], t.words])
    with pytest.raises(LoweringError, match="instruction memory"):
        # the smallest instruction memory holding one part holds less than two
        fuse_words(CFG.replace(imem_depth=1 << (t.instructions - 1).bit_length()),
                   [t.words, t.words])


@pytest.mark.parametrize("seed", range(10))
def test_requant_leaves_amax_for_a_dequant_part(seed):
    """REQUANT (``amax``) then DEQUANT of random accumulator rows, fused, through the fast
    model: the Q15.16 rows are vec_dequant with the amax vec_requant found, whether the INT8
    rows hold the amax words or a buffer of their own does (both placements are drawn), and
    whether the DEQUANT takes whole rows per task or (seeds 6, 7: rows longer than a
    scratchpad half) segments of one row, or (seeds 8, 9: rows longer than VIN, a head's
    vocabulary) segments that load their channel words with them."""
    rng = np.random.default_rng(seed)
    length = int(rng.integers(8, 100))
    rows = int(rng.integers(1, 4 if seed >= 8 else 6))
    n = (int(rng.integers(4, 60)) if seed < 6 else int(rng.integers(300, 480)) if seed < 8
         else int(rng.integers(600, 1000)))
    beat = CFG.beat_bytes
    act_row = -(-(length + int(rng.integers(0, 2 * beat))) // beat) * beat
    if seed % 2:  # whole beats of codes: the rows hold no amax word
        length = act_row = beat * int(rng.integers(1, 7))
    acc_row = -(-(4 * n + int(rng.integers(0, 2)) * beat) // beat) * beat
    place = amax_place(CFG, length, act_row)
    assert place.separate == bool(seed % 2)
    row = _row_bytes(length)
    base = {"x": 0, "q": rows * row, "a": rows * row + rows * act_row}
    base["acc"] = base["a"] + rows * beat
    base["w"] = base["acc"] + rows * acc_row
    base["y"] = base["w"] + _row_bytes(n)

    class _Req:
        x, y, b, w, w_tile_stride = "x", "q", "a", None, None

    class _Deq:
        x, y, b, w, w_tile_stride = "acc", "y", ("a" if place.separate else "q"), "w", None
    req = relocate(lower_requant_template(CFG, rows, length, act_row, amax=True), base,
                   [_Req], CFG.beat_bytes)
    deq = relocate(lower_dequant_template(CFG, rows, n, acc_row, place), base, [_Deq],
                   CFG.beat_bytes)
    words = fuse_words(CFG, [vector_events(req), vector_events(deq)])
    program = decode_program(words.astype("<u8").view(np.uint8).reshape(-1))
    for ins in program:
        check(ins, CFG)
    deqs = [i for i in program if isinstance(i, Vec) and i.func == VecFunc.DEQUANT]
    assert (len(deqs) > rows) == (seed >= 6)  # segments: more VECs than rows
    x = to_fixed(rng.standard_normal((rows, length)) * float(rng.choice([0.01, 1.0, 30.0])))
    if rows > 1:
        x[-1] = 0  # an all-zero row: amax 0
    acc = rng.integers(-(1 << 20), 1 << 20, (rows, n))
    chan = dequant_channels(rng.uniform(1e-4, 1e-1, n).astype(np.float32))
    dram = np.zeros(CFG.memory.size_bytes, np.uint8)
    for i in range(rows):
        dram[i * row:i * row + 4 * length] = x[i].astype("<i4").view(np.uint8)
        at = base["acc"] + i * acc_row
        dram[at:at + 4 * n] = acc[i].astype("<i4").view(np.uint8)
    dram[base["w"]:base["w"] + 4 * n] = chan.astype("<i4").view(np.uint8)
    r = make_backend("model", CFG).run(words, dram)
    assert r.ok, r.error
    out = _row_bytes(n)
    got = r.dram[base["y"]:base["y"] + rows * out].view("<i4").reshape(rows, -1)[:, :n]
    codes = r.dram[base["q"]:base["q"] + rows * act_row].view(np.int8).reshape(rows, act_row)
    for i in range(rows):
        want_codes, amax = vec_requant(x[i])
        assert np.array_equal(codes[i, :length], want_codes), i
        assert np.array_equal(got[i], vec_dequant(acc[i], chan, amax)), i


@pytest.mark.parametrize("seed", range(6))
def test_a_strided_requant_reads_a_column_range_of_wider_rows(seed):
    """REQUANT with ``x_stride`` (a prefill query head: its ``d`` words of every token's
    row of all heads) through the fast model: each INT8 row is vec_requant of that row's
    column range alone (the other columns random), its ``amax`` beat where a separate
    placement puts it (whole beats of codes: drawn)."""
    rng = np.random.default_rng(seed)
    beat = CFG.beat_bytes
    per = beat // 4
    length = per * int(rng.integers(1, 4))            # a head: whole beats
    heads = int(rng.integers(2, 5))
    head = int(rng.integers(0, heads))
    rows = int(rng.integers(1, 9))
    wide = 4 * length * heads                          # a token's row of every head
    act_row = -(-(length + int(rng.integers(0, 2)) * beat) // beat) * beat
    place = amax_place(CFG, length, act_row)
    base = {"x": 0, "q": rows * wide, "a": rows * wide + rows * act_row}
    base["h"] = base["x"] + head * 4 * length

    class _Req:
        x, y, b, w, w_tile_stride = "h", "q", "a", None, None
    req = relocate(lower_requant_template(CFG, rows, length, act_row, amax=True,
                                          x_stride=wide // beat), base, [_Req], beat)
    words = fuse_words(CFG, [vector_events(req)])
    for ins in decode_program(words.astype("<u8").view(np.uint8).reshape(-1)):
        check(ins, CFG)
    x = to_fixed(rng.standard_normal((rows, length * heads)) * float(rng.choice([0.1, 20.0])))
    dram = np.zeros(CFG.memory.size_bytes, np.uint8)
    dram[:x.size * 4] = x.astype("<i4").view(np.uint8).reshape(-1)
    r = make_backend("model", CFG).run(words, dram)
    assert r.ok, r.error
    codes = r.dram[base["q"]:base["q"] + rows * act_row].view(np.int8).reshape(rows, act_row)
    beats = r.dram[base["a"]:base["a"] + rows * beat].view("<i4").reshape(rows, -1)
    for i in range(rows):
        want, amax = vec_requant(x[i, head * length:(head + 1) * length])
        assert np.array_equal(codes[i, :length], want), i
        if place.separate:
            assert int(beats[i * place.stride + place.beat, place.elem]) == int(amax), i
    with pytest.raises(LoweringError, match="cannot hold"):
        lower_requant_template(CFG, rows, 2 * per, act_row, x_stride=1)


@pytest.mark.parametrize("seed", range(4))
def test_fold_leaves_its_amax_words_for_a_values_dequant(seed):
    """The values prologue and epilogue on chip: FOLD (a REQUANT template with ``fold``) of
    probability rows times one row of value codes, then DEQUANT (``fold``) of random
    accumulator rows with the values' channel words, fused, through the fast model: the INT8
    rows are vec_fold's codes and the Q15.16 rows the values epilogue's (vec_dequant of the
    amax word's fields with values_channel), with both amax placements drawn."""
    rng = np.random.default_rng(40 + seed)
    length = int(rng.integers(8, 100))
    rows = int(rng.integers(1, 6))
    n = int(rng.integers(4, 60))
    beat = CFG.beat_bytes
    act_row = -(-(length + int(rng.integers(0, 2 * beat))) // beat) * beat
    if seed % 2:  # whole beats of codes: the amax words in a buffer of their own
        length = act_row = beat * int(rng.integers(1, 7))
    acc_row = -(-4 * n // beat) * beat
    place = amax_place(CFG, length, act_row)
    row = _row_bytes(length)
    base = {"x": 0, "q": rows * row, "a": rows * row + rows * act_row}
    base["c"] = base["a"] + rows * beat
    base["acc"] = base["c"] + row
    base["w"] = base["acc"] + rows * acc_row
    base["y"] = base["w"] + _row_bytes(n)

    class _Fold:
        x, y, b, w, w_tile_stride = "x", "q", "a", "c", None

    class _Deq:
        x, y, b, w, w_tile_stride = "acc", "y", ("a" if place.separate else "q"), "w", None
    fold = relocate(lower_requant_template(CFG, rows, length, act_row, amax=True, fold=True),
                    base, [_Fold], CFG.beat_bytes)
    deq = relocate(lower_dequant_template(CFG, rows, n, acc_row, place, fold=True), base,
                   [_Deq], CFG.beat_bytes)
    words = fuse_words(CFG, [vector_events(fold), vector_events(deq)])
    program = decode_program(words.astype("<u8").view(np.uint8).reshape(-1))
    for ins in program:
        check(ins, CFG)
    assert {i.func for i in program if isinstance(i, Vec)} == {VecFunc.FOLD, VecFunc.DEQUANT}
    p = rng.integers(0, (1 << 16) + 1, (rows, length))
    if rows > 1:
        p[-1] = 0  # an all-zero row: amax 0
    c = rng.integers(0, 1 << 31, length) >> int(rng.integers(0, 24))
    acc = rng.integers(-(1 << 20), 1 << 20, (rows, n))
    chan = np.full(n, values_channel(7 if seed % 2 else 127))
    dram = np.zeros(CFG.memory.size_bytes, np.uint8)
    for i in range(rows):
        dram[i * row:i * row + 4 * length] = p[i].astype("<i4").view(np.uint8)
        at = base["acc"] + i * acc_row
        dram[at:at + 4 * n] = acc[i].astype("<i4").view(np.uint8)
    dram[base["c"]:base["c"] + 4 * length] = c.astype("<i4").view(np.uint8)
    dram[base["w"]:base["w"] + 4 * n] = chan.astype("<i4").view(np.uint8)
    r = make_backend("model", CFG).run(words, dram)
    assert r.ok, r.error
    got = r.dram[base["y"]:base["y"] + rows * _row_bytes(n)].view("<i4").reshape(rows, -1)[:, :n]
    codes = r.dram[base["q"]:base["q"] + rows * act_row].view(np.int8).reshape(rows, act_row)
    for i in range(rows):
        want_codes, amax = vec_fold(p[i], c)
        m, x = fold_amax_fields(fold_amax_word(amax))
        assert np.array_equal(codes[i, :length], want_codes), i
        assert np.array_equal(got[i], vec_dequant(acc[i], chan, m, x)), i


def test_a_dequant_whose_channel_words_leave_no_room_loads_them_per_segment():
    """A DEQUANT keeps its channel row in VIN while each half still holds a row's amax beat
    and one beat of accumulators beside it; past that its segments load their own channel
    words (no constant row LOADed first); a VIN whose half holds no amax beat, one beat of
    accumulators and one of channel words refuses the row."""
    per = CFG.beat_bytes // 4
    vin = CFG.vin_spad_bytes // CFG.beat_bytes
    place = amax_place(CFG, 16, 16)

    def loads(length):
        t = lower_dequant_template(CFG, 2, length, 4 * length, place)
        return [i for i in decode_program(t.words.astype("<u8").view(np.uint8).reshape(-1))
                if isinstance(i, Load)]
    assert loads((vin - 4) * per)[0].row_beats == vin - 4   # the constant row, once
    assert all(i.row_beats < vin // 2 for i in loads((vin - 3) * per))
    tiny = CFG.replace(vin_spad_bytes=4 * CFG.beat_bytes)
    with pytest.raises(LoweringError, match="a DEQUANT row of .* does not fit"):
        lower_dequant_template(tiny, 1, 3 * per, 4 * 3 * per, place)


@pytest.mark.parametrize("seed", range(5))
def test_argmax_part_writes_each_rows_first_maximum(seed):
    """ARGMAX of random rows with ties (several tasks) through the fast model: one beat per
    row holding vec_argmax's index (the lowest of a tie) and the maximum; seeds 3, 4: rows
    longer than a VIN half, in segments whose (index, max) pairs a PAIRS ARGMAX reduces
    (ties across segments too)."""
    rng = np.random.default_rng(seed)
    length = int(rng.integers(2, 200)) if seed < 3 else int(rng.integers(300, 1500))
    rows = int(rng.integers(1, 9 if seed < 3 else 4))
    assert (argmax_segments(CFG, length)[0] > 0) == (seed >= 3)
    row = _row_bytes(length)
    base = {"x": 0, "y": rows * row}

    class _Arg:
        x, y, b, w, w_tile_stride = "x", "y", None, None, None
    words = relocate(lower_argmax_template(CFG, rows, length), base, [_Arg], CFG.beat_bytes)
    for ins in decode_program(words.astype("<u8").view(np.uint8).reshape(-1)):
        check(ins, CFG)
    x = rng.integers(-5, 5, (rows, length)) * (1 << 14)  # few values: ties
    dram = np.zeros(CFG.memory.size_bytes, np.uint8)
    for i in range(rows):
        dram[i * row:i * row + 4 * length] = x[i].astype("<i4").view(np.uint8)
    r = make_backend("model", CFG).run(vector_events(words), dram)
    assert r.ok, r.error
    got = r.dram[base["y"]:base["y"] + rows * CFG.beat_bytes].view("<i4").reshape(rows, -1)
    for i in range(rows):
        assert got[i, 0] == int(vec_argmax(x[i])) == int(np.argmax(x[i])), i
        assert got[i, 1] == x[i].max(), i


def _same_but_signal(a, b) -> bool:
    """Instructions ``a`` and ``b`` are equal but for their signal events and WGT beats (a
    part's WGT moves: :func:`sw.compile.fusion.fuse_parts`)."""
    def plain(ins):
        ins = dataclasses.replace(ins, signal=None)
        if isinstance(ins, Load) and ins.spad == Spad.WGT:
            return dataclasses.replace(ins, spad_addr=0)
        return dataclasses.replace(ins, wgt_addr=0) if isinstance(ins, Gemm) else ins
    return plain(a) == plain(b)


@pytest.mark.parametrize("seed", range(4))
def test_fuse_parts_says_where_each_parts_words_are(seed):
    """Random vector and GEMM-like parts fused: word ``i`` of part ``k`` (END aside) is word
    ``places[k][i]`` of the program, as it was but for its signal, in order but for the
    hoisted words (which lie before the part's other words); the drained program keeps
    every part's words in one block."""
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(int(rng.integers(2, 5))):
        if rng.integers(2):
            rows, length = int(rng.integers(1, 9)), int(rng.integers(1, 40))
            t = lower_vector_template(CFG, VecFunc.ADD, rows, length, second=True)
            parts.append(vector_events(t.words))
        else:
            parts.append(_gemm_like(int(rng.integers(2, 6)), dram=int(rng.integers(0, 64))))
    for overlap in (False, True):
        words, places = fuse_parts(CFG, parts, overlap)
        assert np.array_equal(words, fuse_words(CFG, parts, overlap)) and len(places) == len(parts)
        program = _program(words)
        placed = []  # each part as it lies in the program (its WGT moved), with its signals
        for k, (p, at) in enumerate(zip(parts, places, strict=True)):
            mine = _program(p)[:-1]
            assert len(at) == len(mine) and len(set(at)) == len(at)
            assert all(_same_but_signal(program[j], ins) for j, ins in zip(at, mine, strict=True))
            placed.append(program_words([dataclasses.replace(program[j], signal=ins.signal)
                                         for j, ins in zip(at, mine, strict=True)]))
            hoisted = hoistable(placed[k - 1], placed[k]) if overlap and k else []
            rest = [j for i, j in enumerate(at) if i not in hoisted]
            assert rest == sorted(rest) and all(at[i] < min(rest, default=len(words))
                                                for i in hoisted)
            if not overlap:
                assert list(at) == list(range(at[0], at[0] + len(mine)))


def _program(words):
    return decode_program(words.astype("<u8").view(np.uint8).reshape(-1))


#: Beats of one OUT row of int32 accumulators on CFG.
OUT_ROW = 4 * CFG.lanes // CFG.beat_bytes


def _gemm_like(tiles: int, dram: int = 0, spad: Spad = Spad.WGT, beats: int = 8,
               k_steps: int = 1) -> np.ndarray:
    """A linear program's shape (:func:`sw.compile.schedule.schedule_layers`, one resident
    token): the activations (from DRAM beat ``dram``), then per GEMM (of ``k_steps``) its
    weights (``beats`` beats) into a half of ``spad``, the GEMMs and their stores; a load
    reusing a half waits for the store of the GEMM that read it."""
    ev = EVENTS
    out = [Load(spad=Spad.ACT, dram_addr=dram, rows=1, row_beats=2)]

    def weights(i):
        h = i % 2
        out.append(Load(spad=spad, spad_addr=beats * h, dram_addr=1000 + beats * i, rows=1,
                        row_beats=beats, wait=ev[f"STORED{h}"] if i >= 2 else None,
                        signal=ev[f"FULL{h}"]))
    weights(0)
    for i in range(tiles):
        h = i % 2
        if i + 1 < tiles:
            weights(i + 1)
        out.append(Gemm(wgt_addr=beats * h, k_steps=k_steps, out_addr=OUT_ROW * h,
                        wait=ev[f"FULL{h}"], signal=ev[f"OUT_FULL{h}"]))
        out.append(Store(spad=Spad.OUT, spad_addr=OUT_ROW * h, dram_addr=2000 + OUT_ROW * i,
                         rows=1, row_beats=OUT_ROW, wait=ev[f"OUT_FULL{h}"],
                         signal=ev[f"STORED{h}"]))
    return program_words(out + [End()])


def _vector_part(y: int, func: VecFunc = VecFunc.ADD, vin: int = 0) -> np.ndarray:
    """A one-task vector part (events renamed) of ``func`` on a row it loads into VIN beat
    ``vin``, storing its row at DRAM beat ``y``."""
    ev = EVENTS
    per = CFG.beat_bytes // CFG.vin_word_bytes
    return vector_events(program_words([
        Load(spad=Spad.VIN, spad_addr=vin, dram_addr=0, rows=1, row_beats=2,
             signal=ev["FULL0"]),
        Vec(func=func, length=4, a_addr=vin * per, b_addr=vin * per, wait=ev["FULL0"],
            signal=ev["OUT_FULL0"]),
        Store(spad=Spad.VOUT, dram_addr=y, rows=1, row_beats=2, wait=ev["OUT_FULL0"],
              signal=ev["STORED0"]),
        End()]))


def test_a_gemms_weights_stream_while_the_part_before_drains():
    """A vector part then a GEMM-like part reading its row: the two leading weight LOADs
    (no DRAM the vector part writes, a scratchpad it does not use) go before the SYNC, without
    their signals; the activations' LOAD stays after it and raises the first weights' FULL,
    a SYNC the second's; the third weight LOAD waits, so nothing after it moves."""
    before, gemm = _vector_part(y=40), _gemm_like(4, dram=40)
    assert hoistable(before[:-1], gemm[:-1]) == [1, 2]
    words, places = fuse_parts(CFG, [before, gemm])
    got = _program(words)
    ev = EVENTS
    assert [type(i).__name__ for i in got[:8]] == \
        ["Load", "Vec", "Store", "Load", "Load", "Sync", "Load", "Sync"]
    assert got[3].spad == got[4].spad == Spad.WGT and got[3].signal is got[4].signal is None
    assert got[5] == Sync(engine=Engine.LOAD, wait=ev["STORED0"])
    assert got[6].spad == Spad.ACT and got[6].signal == ev["FULL0"]
    assert got[7] == Sync(engine=Engine.LOAD, signal=ev["FULL1"])
    assert places[1][:3] == (6, 3, 4)
    # activations the vector part does not write move too
    assert hoistable(before[:-1], _gemm_like(4, dram=0)[:-1]) == [0, 1, 2]
    # the vector part writes the first weights: they stay, the activations and the second
    # weights (other DRAM and scratchpad beats) move
    assert hoistable(_vector_part(y=1000)[:-1], gemm[:-1]) == [0, 2]
    # ... and no LOAD into scratchpad beats it loads moves: VIN [0, 2), then ACT and WGT
    assert hoistable(before[:-1], _gemm_like(4, dram=0, spad=Spad.VIN)[:-1]) == [0, 2]
    assert hoistable(gemm[:-1], _gemm_like(4, dram=0)[:-1]) == []
    for overlap in (False, True):  # the program runs, and the counters end at 0
        r = make_backend("model", CFG).run(fuse_words(CFG, [before, gemm], overlap),
                                           np.zeros(CFG.memory.size_bytes, np.uint8))
        assert r.ok, r.error


def test_a_constant_load_goes_up_once_the_gemms_reading_its_beats_are_done():
    """A GEMM-like part, a vector part and a GEMM-like part again, drained: the last part's
    weight LOADs (DRAM no STORE writes) go up to the first SYNC of the LOAD engine that waits
    where the LOAD engine idles and every GEMM reading their beats before is proven done
    (sw.compile.fusion.loads_ahead): the first half's right after the SYNC on the first
    part's STORED0, the second's after its STORED1 (before the vector part's drain); each
    leaves its signal on a SYNC at its place, and the program computes the same DRAM. With
    room only where the first part's GEMMs may still run, nothing moves."""
    words = fuse_words(CFG, [_gemm_like(2), _vector_part(y=40), _gemm_like(2, dram=40)],
                       False)
    before = _program(words)
    ev = EVENTS
    assert before[14].spad == before[15].spad == Spad.WGT
    assert before[8] == Sync(engine=Engine.LOAD, wait=ev["STORED1"])
    assert loads_ahead(CFG, words, [14, 15], {}) is None
    assert loads_ahead(CFG, words, [14, 15], {7: 100}) is None  # GEMMs 3, 5 may run
    moved, where = loads_ahead(CFG, words, [14, 15], dict.fromkeys(range(len(before)), 100))
    got = _program(moved)
    assert len(got) == len(before) + 2
    assert where[14] == 8 and where[15] == 13
    assert got[7] == before[7] and got[9] == before[8] and got[14] == before[12]
    assert got[8] == dataclasses.replace(before[14], signal=None)
    assert got[13] == dataclasses.replace(before[15], signal=None)
    assert got[16:18] == [Sync(engine=Engine.LOAD, signal=ev["FULL0"]),
                          Sync(engine=Engine.LOAD, signal=ev["FULL1"])]
    assert all(got[where[i]] == ins for i, ins in enumerate(before) if i not in (14, 15))
    model = make_backend("model", CFG)
    dram = np.random.default_rng(0).integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    a, b = (model.run(w, dram.copy()) for w in (words, moved))
    assert a.ok and b.ok, (a.error, b.error)
    assert np.array_equal(a.dram, b.dram)


def test_constant_loads_go_up_alike_in_every_block_of_a_loop():
    """Three blocks alike (a GEMM-like part, a vector part, a GEMM-like part) then a vector
    part: with room only in the middle block, its last part's weights go up past the vector
    part's drain (sw.compile.fusion.loads_ahead); with ``period`` the same moves go in every
    block, so the blocks stay alike and roll into one REPEAT (sw.compile.blockloop), which
    computes the same DRAM as the program before; without, only the middle block's move
    and the blocks no longer roll."""
    blocks = 3
    words = fuse_words(CFG, [_gemm_like(2), _vector_part(y=40), _gemm_like(3, dram=40)]
                       * blocks + [_vector_part(y=80)], False)
    start, length = block_period(instructions(words), blocks)
    assert (start, length) == (0, 25)
    f = decode_fields(words)
    movable = np.flatnonzero((f["opcode"] == Opcode.LOAD.value)
                             & (f["dma.spad"] == Spad.WGT.value)
                             & (f["wait"] == NO_EVENT)).tolist()
    assert movable == [b * length + i for b in range(blocks) for i in (1, 2, 14, 15)]
    idle = dict.fromkeys(range(length, 2 * length), 100)  # the middle block's
    plain, _ = loads_ahead(CFG, words, movable, idle)
    assert roll_blocks(plain, blocks) is None
    moved, where = loads_ahead(CFG, words, movable, idle, period=(start, length, blocks))
    # per block its third part's weights go before the SYNCs on the first part's STOREs
    assert [where[j] for j in movable] == [
        b * (length + 2) + i for b in range(blocks) for i in (1, 2, 8, 13)]
    assert block_period(instructions(moved), blocks) == (0, length + 2)
    rolled = roll_blocks(moved, blocks)["words"]
    assert rolled.shape[0] < moved.shape[0] - length
    model = make_backend("model", CFG)
    dram = np.random.default_rng(0).integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    a, b, c = (model.run(w, dram.copy()) for w in (words, moved, rolled))
    assert a.ok and b.ok and c.ok, (a.error, b.error, c.error)
    assert np.array_equal(a.dram, b.dram) and np.array_equal(a.dram, c.dram)
    assert max(b.cycles, c.cycles) < a.cycles  # the rolled one fetches its REPEAT too


def _model_load_idle(cfg, words) -> tuple[dict[int, int], int]:
    """The fast model's cycles of LOAD idle before each LOAD-engine word of ``words``, and
    the program's cycles."""
    sched = schedule(words, cfg)
    assert sched.error == ErrorCode.NONE, sched.detail
    idle, free = {}, 0
    for i in np.flatnonzero(sched.times[:, 0] == Engine.LOAD.value).tolist():
        idle[i] = max(0, int(sched.times[i, 4]) - free)
        free = max(free, int(sched.times[i, 5]) + 1)
    return idle, sched.cycles


@pytest.mark.parametrize("paced", [False, True])
def test_the_load_idle_estimate_is_the_fast_models_on_fused_programs(monkeypatch, paced):
    """sw.compile.fusion.load_idle (durations, completions, queue depth and fetch from hw
    alone, no simulation) gives every LOAD-engine word of every fused program of a tiny model
    (prefill and decode, joined steps included) and of a hand-made GEMM, vector, GEMM
    program the fast model's idle cycles before its grant, and sw.compile.fusion.timeline
    the program's cycles, exactly: both follow the timing contract and none of these
    programs shares its VIN port or deadlocks. On a paced DRAM port too (a LOAD's duration
    per beat changes)."""
    def pace(c):
        return c.replace(memory=dataclasses.replace(c.memory, cycles_per_beat=2)) if paced else c
    hand = fuse_words(CFG, [_gemm_like(4), _vector_part(y=40), _gemm_like(3, dram=40)], False)
    programs = [(pace(CFG), hand)] + [(pace(VSMALL), fuse_parts(pace(VSMALL), parts)[0])
                                      for parts in _fused_parts_of_tiny_model(monkeypatch)]
    waited = 0
    for cfg, words in programs:
        model, cycles = _model_load_idle(cfg, words)
        assert fusion.load_idle(cfg, words) == model
        assert fusion.timeline(cfg, words).total == cycles
        waited += sum(model.values())
    assert waited > 0  # the LOAD engine does idle somewhere: the estimate is not all zeros


@pytest.mark.parametrize("rounds", [1, 2])
def test_constant_loads_ahead_are_placed_by_the_estimate_of_the_step_as_it_runs(
        monkeypatch, rounds):
    """sw.compile.compiler._kv_ahead keeps a placement of a joined step's constant WGT
    LOADs only where sw.compile.fusion.timeline (exact on what it is given) estimates it to
    end earlier with the moves and quiet STOREs the passes after the join give it: the
    words it estimates include the step as compiled, whose fast-model cycles are the
    estimate, whatever the rounds (sw.compile.fusion.AHEAD_ROUNDS). (Estimated before those
    passes, this one-block model's step was 7,431 cycles with two rounds against 7,361 as
    it runs, and the two-block one of tests/sw/runtime/test_one_program.py at contexts 37
    to 40 16,730 against 16,436: a second round that estimated a gain lost 11 cycles.)"""
    monkeypatch.setattr(compiler, "AHEAD_ROUNDS", rounds)
    estimated, calls = [], []
    real_ahead, real_timeline = compiler._kv_ahead, compiler.timeline

    def timeline(cfg, words):
        t = real_timeline(cfg, words)
        estimated.append((words.copy(), t.total))
        return t

    def kv_ahead(*a, **kw):
        calls.append(len(estimated))
        return real_ahead(*a, **kw)
    monkeypatch.setattr(compiler, "timeline", timeline)
    monkeypatch.setattr(compiler, "_kv_ahead", kv_ahead)
    lm = tiny_lm(layers=1)
    exe = compile_model(lm, VSMALL, CompileOptions(6, 10, block_loop=False),
                        weights=compressed(lm))
    joined = [p for p in exe.programs if p.phase == "decode"
              and len(p.parts) == len(exe.table.nodes("decode"))]
    assert len(joined) == len(calls) == 1
    step = _timed(exe.cfg, joined[0].words)  # its addresses and registers set later
    totals = {total for words, total in estimated if np.array_equal(_timed(exe.cfg, words), step)}
    assert totals == {schedule(joined[0].words, exe.cfg).cycles}


def _timed(cfg, words: np.ndarray) -> np.ndarray:
    """What the schedule of ``words`` depends on: per word its opcode, engine, wait, signal
    and duration."""
    f = decode_fields(words)
    return np.stack([f["opcode"], engines_fields(f), f["wait"], f["signal"],
                     exec_cycles_fields(f, cfg)], axis=1)


@pytest.mark.parametrize("seed", range(3))
def test_weights_go_up_past_several_parts_where_the_load_engine_idles(seed):
    """Two vector parts, then a GEMM-like part reading the second's row: its first weights
    (DRAM no part stores to, a scratchpad no part before loads) go before the first part's
    drain, where the LOAD engine idles while that part's VEC and STORE run, without their
    signal; weights a part stores to stay at their own boundary. Both run to the drained
    program's DRAM from a random image, in no more cycles."""
    a, b, gemm = _vector_part(y=40), _vector_part(y=60), _gemm_like(4, dram=60)
    rng = np.random.default_rng(seed)
    dram = rng.integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    for first, moved in ((a, True), (_vector_part(y=1000), False)):
        _check_first_weights(CFG, [first, b, gemm], moved)
        runs = [make_backend("model", CFG).run(fuse_words(CFG, [first, b, gemm], overlap),
                                               dram.copy()) for overlap in (False, True)]
        assert all(r.ok for r in runs), [r.error for r in runs]
        assert np.array_equal(runs[0].dram, runs[1].dram)
        assert runs[1].cycles <= runs[0].cycles


@pytest.mark.parametrize("seed", range(3))
def test_weights_longer_than_the_idle_go_where_they_fill_at_least_half(monkeypatch, seed):
    """Two vector parts, then a GEMM part on a ring of four WGT slots (:func:`_ring_like`)
    reading the second's row, whose weights LOADs each take longer than the LOAD engine
    idles at a vector part's drain (:func:`sw.compile.fusion._slack`) but no more than
    twice as long (:data:`sw.compile.fusion.HOIST_FILL`): its first weights go before the
    first part's drain, not behind the second's SYNCs as where only a LOAD that fits the
    idle goes (``HOIST_FILL = 1``); the LOAD engine streams them instead of idling, the
    ring's later slots fill before the activations land and the step ends earlier, with the
    drained program's DRAM from a random image. (With a ring of two slots, both already
    loaded before the activations either way, the earlier weights only delay them.)"""
    a, b = _vector_part(y=40), _vector_part(y=0)
    ring = _ring_like(1, 12, 48, 1, 4)
    idle = fusion._slack(CFG, a[:-1])
    assert idle < 48 <= fusion.HOIST_FILL * idle
    assert hoistable(b[:-1], ring[:-1]) == [1, 2, 3, 4]
    rng = np.random.default_rng(seed)
    dram = rng.integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    drained = make_backend("model", CFG).run(fuse_words(CFG, [a, b, ring], False), dram.copy())
    cycles = {}
    for fill, moved in ((fusion.HOIST_FILL, True), (1, False)):
        monkeypatch.setattr(fusion, "HOIST_FILL", fill)
        words = _check_first_weights(CFG, [a, b, ring], moved)
        r = make_backend("model", CFG).run(words, dram.copy())
        assert r.ok, r.error
        assert np.array_equal(r.dram, drained.dram)
        cycles[fill] = r.cycles
    assert cycles[2] < cycles[1] < drained.cycles


@pytest.mark.parametrize("seed", range(3))
def test_a_rolled_steps_activations_load_before_weights_that_find_no_room(monkeypatch, seed):
    """Without ``spread`` (a step whose blocks roll into one loop), a vector part then a
    GEMM-like part whose two leading weights LOADs each take more than twice the LOAD
    engine's idle at the vector part's drain: the first goes before the drain's SYNC
    (:data:`sw.compile.fusion.HOIST_UNFIT`), the second stays after the activations' LOAD,
    which then no longer waits behind it; with both hoisted (``HOIST_UNFIT = 2``, as every
    hoistable LOAD went before) the GEMMs start later. Both compute the drained program's
    DRAM from a random image."""
    a, gemm = _vector_part(y=40), _gemm_like(4, dram=40, beats=120, k_steps=32)
    assert 2 * fusion._slack(CFG, a[:-1]) < 120
    assert hoistable(a[:-1], gemm[:-1], False) == [1, 2]
    rng = np.random.default_rng(seed)
    dram = rng.integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    drained = make_backend("model", CFG).run(fuse_words(CFG, [a, gemm], False), dram.copy())
    cycles = {}
    for unfit in (fusion.HOIST_UNFIT, 2):
        monkeypatch.setattr(fusion, "HOIST_UNFIT", unfit)
        words, places = fuse_parts(CFG, [a, gemm], spread=False)
        got = _program(words)
        drain = next(i for i, w in enumerate(got) if isinstance(w, Sync))
        assert [places[1][i] < drain for i in (0, 1, 2)] == [False, True, unfit > 1]
        r = make_backend("model", CFG).run(words, dram.copy())
        assert r.ok, r.error
        assert np.array_equal(r.dram, drained.dram)
        cycles[unfit] = r.cycles
    assert cycles[1] < cycles[2]


def _rolled_first_weights(parts, moved: bool, dram: np.ndarray) -> int:
    """Fuse ``parts`` (vector parts, then a GEMM part) without ``spread``, check that the
    GEMM's first weights LOAD comes before the first drain (SYNC) exactly when ``moved``
    (without its signal), and that the program computes the drained one's DRAM from
    ``dram``, in no more cycles; its cycles."""
    words, places = fuse_parts(CFG, parts, spread=False)
    got = _program(words)
    drain = next(i for i, w in enumerate(got) if isinstance(w, Sync))
    w0 = next(j for j in places[-1] if isinstance(got[j], Load) and got[j].spad == Spad.WGT)
    assert got[w0].signal is None
    assert (w0 < drain) == moved
    runs = [make_backend("model", CFG).run(w, dram.copy())
            for w in (fuse_words(CFG, parts, False), words)]
    assert all(r.ok for r in runs), [r.error for r in runs]
    assert np.array_equal(runs[0].dram, runs[1].dram)
    assert runs[1].cycles <= runs[0].cycles
    return runs[1].cycles


@pytest.mark.parametrize("seed", range(3))
def test_a_rolled_steps_weights_go_up_past_vector_parts_to_a_residual_add(monkeypatch, seed):
    """Without ``spread`` (a step whose blocks roll into one loop), two vector parts (a norm,
    a REQUANT), then a GEMM-like part reading the second's row: its first weights go before
    the first part's drain, where the LOAD engine idles while that part's VEC and STORE run,
    as with ``spread``, and the program ends earlier than with every LOAD at its own
    boundary; not past an ADD (a residual addition, which may end a block: the loop's body
    may end there) nor before its drain, and not past a GEMM part. Each computes the
    drained program's DRAM from a random image, in no more cycles."""
    rng = np.random.default_rng(seed)
    dram = rng.integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    norm, add = _vector_part(y=40, func=VecFunc.MUL), _vector_part(y=40)
    b, gemm = _vector_part(y=60, func=VecFunc.MUL), _gemm_like(4, dram=60)
    _rolled_first_weights([norm, b, gemm], True, dram)
    _rolled_first_weights([add, b, gemm], False, dram)
    _rolled_first_weights([norm, _vector_part(y=60), gemm], False, dram)
    other = _gemm_like(2, dram=0, spad=Spad.ACT)  # its "weights" into ACT: no WGT in common
    _rolled_first_weights([norm, other, b, gemm], False, dram)
    # a ring of four slots whose weights take longer than the idle at a drain (as
    # SmolLM2's): the ring fills before the activations land, and the step ends earlier
    # than with every LOAD at its own boundary
    ring = [norm, _vector_part(y=0, func=VecFunc.MUL), _ring_like(1, 12, 48, 1, 4)]
    moved = _rolled_first_weights(ring, True, dram)
    monkeypatch.setattr(fusion, "_gemms_or_adds", lambda words: True)
    assert moved < _rolled_first_weights(ring, False, dram)


@pytest.mark.parametrize("seed", range(3))
def test_a_rolled_steps_weights_overtake_a_load_that_stays_where_their_beats_differ(seed):
    """A GEMM-like part whose leading LOADs are a constant row into VIN beats the part two
    before loads (so it goes no further up than its own boundary) and then its weights
    (which may go up past both vector parts): the weights overtake the row, going before the
    first part's drain, the row after it; the row and the weights write different beats, and
    neither waits. The program computes the drained one's DRAM from a random image, in no
    more cycles. So in a step whose blocks roll into one loop; spread, the LOADs keep their
    order (the row, then the weights after it)."""
    rng = np.random.default_rng(seed)
    dram = rng.integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    a, b = _vector_part(y=40, func=VecFunc.MUL), _vector_part(y=60, func=VecFunc.MUL, vin=8)
    body = _program(_gemm_like(4, dram=60))[:-1]
    row = Load(spad=Spad.VIN, spad_addr=0, dram_addr=3000, rows=1, row_beats=2)
    gemm = program_words([row, *body, End()])
    assert hoistable(b[:-1], gemm[:-1], False) == [0, 2, 3]
    for spread in (False, True):
        words, places = fuse_parts(CFG, [a, b, gemm], spread=spread)
        got = _program(words)
        drains = [i for i, w in enumerate(got) if isinstance(w, Sync) and w.wait is not None]
        assert drains[0] < places[2][0] < drains[1]
        assert (places[2][2] < drains[0]) == (not spread)
    _rolled_first_weights([a, b, gemm], True, dram)


def _spread_slots(words: np.ndarray, slot: int) -> np.ndarray:
    """``words`` with each WGT half moved to ``slot`` beats per half (a ring's slots spread
    over the scratchpad, as the scheduler places them)."""
    out = []
    for ins in _program(words):
        if isinstance(ins, Load) and ins.spad == Spad.WGT:
            ins = dataclasses.replace(ins, spad_addr=ins.spad_addr // 8 * slot)
        elif isinstance(ins, Gemm):
            ins = dataclasses.replace(ins, wgt_addr=ins.wgt_addr // 8 * slot)
        out.append(ins)
    return program_words(out)


@pytest.mark.parametrize("seed", range(4))
def test_a_gemms_weights_pack_above_the_gemm_before_and_stream_past_it(seed):
    """A GEMM-like part, a vector part, then a GEMM-like part (reading the vector part's row)
    whose WGT halves lie a random slot apart: its WGT is packed (its halves side by side)
    above the first GEMM's beats, so its leading weights go up before the first part's drain,
    past the vector part, where the first GEMM's compute leaves the LOAD engine idle (a
    block loop's parts, hoisted to their own boundary only, keep their slots). Every
    GEMM reads its own weights there, and the program computes the drained one's DRAM from a
    random image, in fewer cycles."""
    rng = np.random.default_rng(seed)
    slot = int(rng.integers(8, CFG.spad_beats("wgt") // 2 - 8))
    first, vec = _gemm_like(int(rng.integers(2, 5)), dram=0), _vector_part(y=60)
    gemm = _spread_slots(_gemm_like(int(rng.integers(2, 6)), dram=60), slot)
    words, places = fuse_parts(CFG, [first, vec, gemm])
    got = _program(words)
    drain = next(i for i, w in enumerate(got) if isinstance(w, Sync))
    mine = [got[j] for j in places[2] if isinstance(got[j], Load) and got[j].spad == Spad.WGT]
    assert sorted({ld.spad_addr for ld in mine}) == [16, 24]  # above the first's [0, 16)
    assert {got[j].wgt_addr for j in places[2] if isinstance(got[j], Gemm)} == {16, 24}
    assert places[2][1] < drain and got[places[2][1]].signal is None
    at, where = fuse_parts(CFG, [first, vec, gemm], spread=False)  # own boundary: in place
    assert {_program(at)[j].spad_addr for j in where[2] if isinstance(_program(at)[j], Load)
            and _program(at)[j].spad == Spad.WGT} == {0, slot}
    dram = rng.integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    runs = [make_backend("model", CFG).run(fuse_words(CFG, [first, vec, gemm], overlap),
                                           dram.copy()) for overlap in (False, True)]
    assert all(r.ok for r in runs), [r.error for r in runs]
    assert np.array_equal(runs[0].dram, runs[1].dram)
    assert runs[1].cycles < runs[0].cycles


def _draining(words: np.ndarray) -> np.ndarray:
    """A part (END last) whose LOAD engine then waits for its first STORE (as a DEQUANT
    beside its GEMMs does)."""
    return program_words(_program(words)[:-1]
                         + [Sync(engine=Engine.LOAD, wait=EVENTS["STORED0"]), End()])


@pytest.mark.parametrize("seed", range(4))
def test_a_load_past_a_wait_moves_where_nothing_before_it_touches_its_beats(seed):
    """A fused program's LOADs that need no wait may lie after words that wait (an earlier
    fusion moved them ahead of a later part's boundary): one into WGT beats no LOAD before
    it writes, of DRAM no STORE writes, moves before the drain of the part before; one into
    beats an earlier LOAD wrote (an earlier GEMM may read them: the wait before it ordered
    that), one of DRAM an earlier STORE of the part writes, and one into PARAM stay; not
    ``deep`` (a block loop's fusion), only the leading run's. Overlapped, the program
    computes the drained one's DRAM from a random image, in no more cycles."""
    rng = np.random.default_rng(seed)
    tiles = int(rng.integers(3, 6))
    body = _program(_gemm_like(tiles, dram=40))[:-1]
    last_wait = max(i for i, ins in enumerate(body) if isinstance(ins, Load) and ins.wait)
    late = [Load(spad=Spad.WGT, spad_addr=64, dram_addr=3000, rows=1, row_beats=8),
            Load(spad=Spad.WGT, spad_addr=8, dram_addr=3008, rows=1, row_beats=8),
            Load(spad=Spad.WGT, spad_addr=80, dram_addr=2000, rows=1, row_beats=2),
            Load(spad=Spad.PARAM, spad_addr=40, dram_addr=3016, rows=1, row_beats=2)]
    order = rng.permutation(len(late))
    words = program_words(body + [late[k] for k in order] + [End()])
    before = _vector_part(y=40)
    at = len(body)
    got = hoistable(before[:-1], words[:-1])
    assert [i for i in got if i >= at] == [at + int(np.flatnonzero(order == 0)[0])]
    assert all(i < last_wait for i in got if i < at)
    assert hoistable(before[:-1], words[:-1], deep=False) == [i for i in got if i < at]
    dram = rng.integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    runs = [make_backend("model", CFG).run(fuse_words(CFG, [before, words], overlap),
                                           dram.copy()) for overlap in (False, True)]
    assert all(r.ok for r in runs), [r.error for r in runs]
    assert np.array_equal(runs[0].dram, runs[1].dram)
    assert runs[1].cycles <= runs[0].cycles


def test_a_hoisted_loads_signal_comes_right_after_the_load_engine_word_before_it():
    """A GEMM-like part whose second weights LOAD (no wait: the other half) comes after the
    first GEMM and its STORE, both weights hoisted before the vector part's drain: the
    second's signal is raised by a SYNC right after the activations' LOAD (which raises the
    first's), ahead of the first GEMM, so the LOAD engine raises it without waiting for the
    GEMM's dispatch; the program runs to the drained one's DRAM."""
    ev = EVENTS
    gemm = program_words([
        Load(spad=Spad.ACT, dram_addr=40, rows=1, row_beats=2),
        Load(spad=Spad.WGT, spad_addr=0, dram_addr=1000, rows=1, row_beats=8,
             signal=ev["FULL0"]),
        Gemm(wgt_addr=0, k_steps=1, out_addr=0, wait=ev["FULL0"], signal=ev["OUT_FULL0"]),
        Store(spad=Spad.OUT, spad_addr=0, dram_addr=2000, rows=1, row_beats=OUT_ROW,
              wait=ev["OUT_FULL0"], signal=ev["STORED0"]),
        Load(spad=Spad.WGT, spad_addr=8, dram_addr=1008, rows=1, row_beats=8,
             signal=ev["FULL1"]),
        Gemm(wgt_addr=8, k_steps=1, out_addr=OUT_ROW, wait=ev["FULL1"],
             signal=ev["OUT_FULL1"]),
        Store(spad=Spad.OUT, spad_addr=OUT_ROW, dram_addr=2000 + OUT_ROW, rows=1,
              row_beats=OUT_ROW, wait=ev["OUT_FULL1"], signal=ev["STORED1"]),
        End()])
    before = _vector_part(y=40)
    assert hoistable(before[:-1], gemm[:-1]) == [1, 4]
    words, places = fuse_parts(CFG, [before, gemm])
    got = _program(words)
    first = places[1][2]
    assert isinstance(got[first], Gemm) and got[places[1][0]].signal == ev["FULL0"]
    assert got[places[1][0] + 1] == Sync(engine=Engine.LOAD, signal=ev["FULL1"])
    assert places[1][0] + 1 < first
    dram = np.random.default_rng(0).integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    runs = [make_backend("model", CFG).run(fuse_words(CFG, [before, gemm], overlap),
                                           dram.copy()) for overlap in (False, True)]
    assert all(r.ok for r in runs) and np.array_equal(runs[0].dram, runs[1].dram)


@pytest.mark.parametrize("seed", range(4))
def test_weights_load_inside_a_gemm_part_whose_own_loaded_before_it(monkeypatch, seed):
    """A vector part (its LOAD engine last, waiting for its STORE: no room before its drain),
    a GEMM-like part (its two weights LOADs hoisted before the vector part's drain, though
    they find no room there: ``HOIST_UNFIT`` 2; its LOAD engine then waiting for its first
    STORE), a vector part, and a GEMM-like part
    of other weights: the second GEMM's leading weights go inside the first GEMM part, after
    its activations' LOAD and before its first GEMM, where its LOAD engine idles while the
    array runs -- at WGT beats above the first's. The program computes the drained one's DRAM
    from a random image, in fewer cycles; with no wait in the first GEMM part the weights
    stay at a boundary."""
    monkeypatch.setattr(fusion, "HOIST_UNFIT", 2)
    rng = np.random.default_rng(seed)
    a, b = _draining(_vector_part(y=40)), _vector_part(y=60)  # a: no room after its LOADs
    second = _gemm_like(int(rng.integers(2, 6)), dram=60)
    for first, inside in ((_draining(_gemm_like(2, dram=40)), True),
                          (_gemm_like(2, dram=40), False)):
        parts = [a, first, b, second]
        words, places = fuse_parts(CFG, parts)
        got = _program(words)
        gemms = [j for j in places[1] if isinstance(got[j], Gemm)]
        act = next(j for j in places[1] if isinstance(got[j], Load) and got[j].spad == Spad.ACT)
        weights = [places[3][1], places[3][2]]
        assert all(got[j].spad == Spad.WGT and got[j].spad_addr >= 16 for j in weights)
        assert all(act < j < min(gemms) for j in weights) == inside
        assert all(act < j < max(places[1]) for j in weights) == inside
        dram = rng.integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
        runs = [make_backend("model", CFG).run(fuse_words(CFG, parts, overlap), dram.copy())
                for overlap in (False, True)]
        assert all(r.ok for r in runs), [r.error for r in runs]
        assert np.array_equal(runs[0].dram, runs[1].dram)
        assert runs[1].cycles < runs[0].cycles


@pytest.mark.parametrize("seed", range(2))
def test_weights_load_after_the_last_gemm_of_a_part_whose_own_wait(seed):
    """A GEMM-like part whose later weights LOADs wait for its GEMMs (a ring's: ahead of
    nothing to spare, its LOAD engine last waiting for its first STORE, so its boundary has
    no room), a vector part, then a GEMM-like part of other weights: the second GEMM's
    leading weights go inside the first part right after its last GEMM (its last weights
    landed, the LOAD engine idles while that GEMM runs), at WGT beats clear of the first's.
    The program computes the drained one's DRAM from a random image, and the LOAD of those
    weights no longer adds to the program's cycles: it takes at most the drained program's
    cycles less that LOAD's (hw.timing.load_cycles)."""
    rng = np.random.default_rng(seed)
    steps = 2 * int(rng.integers(20, 30))  # a GEMM long enough to hide the second's LOAD
    beats = -(-gemm_weight_bytes(Gemm(k_steps=steps), CFG) // CFG.beat_bytes)
    first = _draining(_gemm_like(int(rng.integers(3, 6)), dram=40, beats=beats,
                                 k_steps=steps))
    second = _gemm_like(2, dram=60)
    parts = [first, _vector_part(y=60), second]
    words, places = fuse_parts(CFG, parts)
    got = _program(words)
    last = max(j for j in places[0] if isinstance(got[j], Gemm))
    drain = next(j for j in range(last, len(got))  # the first SYNC of no part's: its drain
                 if isinstance(got[j], Sync) and not any(j in p for p in places))
    lead = places[2][1]
    assert isinstance(got[lead], Load) and got[lead].spad == Spad.WGT
    assert last < lead < drain
    firsts = [(got[j].spad_addr, got[j].spad_addr + got[j].row_beats) for j in places[0]
              if isinstance(got[j], Load) and got[j].spad == Spad.WGT]
    assert not any(overlaps((got[lead].spad_addr, got[lead].spad_addr + got[lead].row_beats),
                            b) for b in firsts)
    dram = rng.integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    runs = [make_backend("model", CFG).run(fuse_words(CFG, parts, overlap), dram.copy())
            for overlap in (False, True)]
    assert all(r.ok for r in runs), [r.error for r in runs]
    assert np.array_equal(runs[0].dram, runs[1].dram)
    assert runs[1].cycles <= runs[0].cycles - timing.load_cycles(got[lead], CFG)


def _sets_like(sets: int, tiles: int, beats: int, k_steps: int) -> np.ndarray:
    """A linear program of ``sets`` activation sets of ``tiles`` GEMMs each (attention's
    values GEMM: a member per kv head, its row resident from ACT beat 0), as
    :class:`sw.compile.schedule._Scheduler` emits it: per GEMM its loads one GEMM ahead, a
    new set's activations waiting for the GEMM before it (which reads ACT), a weights LOAD
    of ``beats`` beats waiting for the GEMM that last read its half (each GEMM's STORED
    consumed once)."""
    ev, out, waited = EVENTS, [], set()

    def done(prev: int) -> int | None:
        if prev < 0 or prev in waited:
            return None
        waited.add(prev)
        return ev[f"STORED{prev % 2}"]

    def loads(i: int) -> None:
        half = done(i - 2)
        if i % tiles == 0:
            out.append(Load(spad=Spad.ACT, dram_addr=2 * (i // tiles), rows=1, row_beats=2,
                            wait=done(i - 1)))
        out.append(Load(spad=Spad.WGT, spad_addr=beats * (i % 2), dram_addr=1000 + beats * i,
                        rows=1, row_beats=beats, wait=half, signal=ev[f"FULL{i % 2}"]))
    loads(0)
    for i in range(sets * tiles):
        h = i % 2
        if i + 1 < sets * tiles:
            loads(i + 1)
        out.append(Gemm(wgt_addr=beats * h, k_steps=k_steps, out_addr=OUT_ROW * h,
                        wait=ev[f"FULL{h}"], signal=ev[f"OUT_FULL{h}"]))
        out.append(Store(spad=Spad.OUT, spad_addr=OUT_ROW * h, dram_addr=2000 + OUT_ROW * i,
                         rows=1, row_beats=OUT_ROW, wait=ev[f"OUT_FULL{h}"],
                         signal=ev[f"STORED{h}"]))
    return program_words(out + [End()])


def _check_first_weights(cfg, parts, moved: bool) -> np.ndarray:
    """Fuse ``parts`` (two vector parts, then a GEMM part) and check that the GEMM's first
    weights LOAD comes before the first drain (SYNC) exactly when ``moved``, into WGT and
    without a signal; the fused words."""
    words, places = fuse_parts(cfg, parts)
    got = _program(words)
    drain = next(i for i, w in enumerate(got) if isinstance(w, Sync))
    w0 = places[2][1]
    assert got[w0].spad == Spad.WGT and got[w0].signal is None
    assert (w0 < drain) == moved
    return words


def _random_attention(monkeypatch, rng, seed: int, kv_choices) -> tuple[int, list]:
    """A tiny model of one of ``kv_choices`` kv heads (grouped or not, at most 4 heads)
    compiled for decode steps up to a random context: its kv heads and the parts of its
    fused attention programs (:func:`_fused_programs_with`)."""
    kv = int(rng.choice(kv_choices))
    heads = kv * int(rng.choice([1, 2])) if kv < 4 else 4
    context = int(rng.integers(8, 40))
    return kv, _fused_programs_with(monkeypatch, tiny_lm(heads=heads, kv_heads=kv, seed=seed),
                                    CompileOptions(4, context, one_program=False),
                                    VecFunc.SOFTMAX)


def _races(words: np.ndarray, trace, cfg=None) -> list[tuple[int, int]]:
    """The (LOAD, GEMM) pairs of a run of ``words`` (its ``trace``) that race on ACT or WGT
    beats: the LOAD writes beats the GEMM reads while the GEMM runs (from the LOAD's grant
    to its landing, from the GEMM's grant to its end). A GEMM reads, without ``cfg``, its
    activations' row of :func:`_sets_like`, 2 beats, and ``8 * k_steps`` weight beats; with
    it, a compiled program's GEMM, ``tokens`` rows ``act_stride`` beats apart and its weight
    stream (:func:`hw.isa.gemm_weight_bytes`)."""
    program = _program(words)
    at = {t.index: t for t in trace}

    def beats(ins) -> list[tuple[Spad, int, int]]:
        if isinstance(ins, Load):
            return [(ins.spad, ins.spad_addr, ins.spad_addr + ins.rows * ins.row_beats)]
        if cfg is None:
            return [(Spad.ACT, ins.act_addr, ins.act_addr + 2),
                    (Spad.WGT, ins.wgt_addr, ins.wgt_addr + 8 * ins.k_steps)]
        return [(Spad.ACT, ins.act_addr, ins.act_addr + ins.tokens * max(ins.act_stride, 1)),
                (Spad.WGT, ins.wgt_addr,
                 ins.wgt_addr + -(-gemm_weight_bytes(ins, cfg) // cfg.beat_bytes))]
    loads = [i for i, ins in enumerate(program) if isinstance(ins, Load)]
    gemms = [i for i, ins in enumerate(program) if isinstance(ins, Gemm)]
    return [(i, j) for i in loads for j in gemms
            if any(s == t and lo < e and u < hi for s, lo, hi in beats(program[i])
                   for t, u, e in beats(program[j]))
            and at[i].grant <= at[j].end and at[j].grant <= at[i].done]


@pytest.mark.parametrize("seed", range(6))
def test_a_new_activation_sets_wait_lets_the_next_weights_load_first(seed):
    """A GEMM part of random activation sets and tiles: each weights LOAD right after a new
    set's activations LOAD (which waits for the GEMM before) goes ahead of it without its
    signal, which the activations LOAD raises, where it waits for a GEMM of its own; nothing
    else moves, and a second pass changes nothing. Alone and fused after a vector part, the
    program runs on the fast model to the DRAM of the unreordered (and the drained) program
    from a random image, in fewer cycles, with no LOAD writing beats a GEMM reads while it
    runs (:func:`_races`, which the fast model's values, applied in completion order, do not
    see); raising the signal at the weights' new place instead lets a GEMM read the
    activations before they land."""
    rng = np.random.default_rng(seed)
    sets, tiles = int(rng.integers(2, 5)), int(rng.integers(2, 4))
    k = int(rng.integers(1, 9))
    part = _sets_like(sets, tiles, 8 * k, k)
    # one tile a set: the weights after a new set's LOAD wait on nothing; the second set's
    # fill the half no LOAD wrote before and go first, the later sets' reuse a half a GEMM
    # read (the one that LOAD waits for), so they stay behind it
    alone = _sets_like(sets, 1, 8 * k, k)[:-1]
    moved, once = weights_first(alone)
    assert np.array_equal(moved[4:], alone[4:]) and once == [0, 1, 3, 2, *range(4, len(once))]
    words, order = weights_first(part[:-1])
    got, was = _program(words), _program(part)[:-1]
    acts = [i for i, ins in enumerate(was) if isinstance(ins, Load) and ins.spad == Spad.ACT
            and ins.wait is not None]
    assert len(acts) == sets - 1
    assert sorted(order) == list(range(len(was)))
    for i, ins in enumerate(was):
        if i in acts:
            assert order[i] == i + 1 and got[i + 1] == dataclasses.replace(
                ins, signal=was[i + 1].signal)
        elif i - 1 in acts:
            assert order[i] == i - 1 and got[i - 1] == dataclasses.replace(ins, signal=None)
        else:
            assert order[i] == i and got[i] == ins
    assert np.array_equal(weights_first(words)[0], words)
    unsafe = words.copy()  # the weights' signal raised before the activations land
    for i in acts:
        unsafe[i:i + 2] = program_words([was[i + 1], dataclasses.replace(was[i])])
    dram = rng.integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    end = part[-1:]
    runs = [make_backend("model", CFG).run(w, dram.copy(), trace=True) for w in (
        part, np.concatenate([words, end]), np.concatenate([unsafe, end]))]
    assert all(r.ok for r in runs), [r.error for r in runs]
    assert np.array_equal(runs[0].dram, runs[1].dram)
    assert runs[1].cycles < runs[0].cycles
    assert [bool(_races(w, r.trace)) for w, r in zip((part, words, unsafe), runs,
                                                      strict=True)] == [False, False, True]
    before = _vector_part(y=40)
    fused, places = fuse_parts(CFG, [before, part])
    program = _program(fused)
    assert all(_same_but_signal(program[places[1][i]], ins) for i, ins in enumerate(was))
    assert all(places[1][i + 1] < places[1][i] for i in acts)
    fused_runs = [make_backend("model", CFG).run(fuse_words(CFG, [before, part], overlap),
                                                 dram.copy()) for overlap in (False, True)]
    assert all(r.ok for r in fused_runs), [r.error for r in fused_runs]
    assert np.array_equal(fused_runs[0].dram, fused_runs[1].dram)
    assert np.array_equal(fused_runs[0].dram[2000 * CFG.beat_bytes:],
                          runs[0].dram[2000 * CFG.beat_bytes:])
    assert fused_runs[1].cycles < fused_runs[0].cycles


def _ring_like(sets: int, tiles: int, beats: int, k_steps: int, slots: int) -> np.ndarray:
    """A linear program of ``sets`` activation sets of ``tiles`` GEMMs each on ``slots`` WGT
    slots, as :class:`sw.compile.schedule._RingScheduler` emits it (the scores' and values'
    members on the vector preset): one counting event each for FULL, OUT_FULL and STORED,
    loads up to ``slots - 1`` GEMMs ahead but never past a new set, whose activations LOAD
    consumes the done signal of every GEMM before it (SYNCs for all but the last), and a
    weights LOAD into slot ``i % slots`` that consumes those up to GEMM ``i - slots`` not yet
    consumed -- none, right after a new set's LOAD: its wait orders the weights too."""
    ev, out, n = EVENTS, [], sets * tiles
    done = 0

    def through(last: int) -> int | None:
        nonlocal done
        waits = [ev["STORED0"]] * max(0, last + 1 - done)
        done = max(done, last + 1)
        out.extend(Sync(engine=Engine.LOAD, wait=e) for e in waits[:-1])
        return waits[-1] if waits else None

    def loads(i: int) -> None:
        if i % tiles == 0:
            out.append(Load(spad=Spad.ACT, dram_addr=2 * (i // tiles), rows=1, row_beats=2,
                            wait=through(i - 1)))
        out.append(Load(spad=Spad.WGT, spad_addr=beats * (i % slots), dram_addr=1000 + beats * i,
                        rows=1, row_beats=beats, wait=through(i - slots), signal=ev["FULL0"]))
    emitted = 0
    for i in range(n):
        while emitted < n and emitted < i + min(slots, CFG.queue_depth) and (
                emitted == i or emitted % tiles):
            loads(emitted)
            emitted += 1
        out.append(Gemm(wgt_addr=beats * (i % slots), k_steps=k_steps,
                        out_addr=OUT_ROW * (i % slots), wait=ev["FULL0"],
                        signal=ev["OUT_FULL0"]))
        out.append(Store(spad=Spad.OUT, spad_addr=OUT_ROW * (i % slots),
                         dram_addr=2000 + OUT_ROW * i, rows=1, row_beats=OUT_ROW,
                         wait=ev["OUT_FULL0"], signal=ev["STORED0"]))
    return program_words(out + [End()])


@pytest.mark.parametrize("seed", range(8))
def test_a_new_sets_weights_into_a_fresh_ring_slot_load_first(seed):
    """A ring-scheduled GEMM part of random activation sets, tiles and slots (attention's
    scores or values members): the weights LOAD right after a new set's activations LOAD
    waits on nothing; it goes ahead of that LOAD (which raises its signal) exactly where no
    earlier LOAD wrote its slot, so the next member's first weights stream while the member
    before computes its last tiles. The program runs on the fast model to the DRAM of the
    unreordered one from a random image, in fewer cycles where a LOAD moved, with no LOAD
    writing beats a GEMM reads while it runs (:func:`_races`); fused after a vector part it
    computes the drained program's DRAM."""
    rng = np.random.default_rng(seed)
    sets, tiles, k = int(rng.integers(2, 5)), int(rng.integers(1, 4)), int(rng.integers(1, 9))
    slots = int(rng.integers(2, 6))
    part = _ring_like(sets, tiles, 8 * k, k, slots)
    words, order = weights_first(part[:-1])
    was, got = _program(part)[:-1], _program(words)
    wgt = [i for i, ins in enumerate(was) if isinstance(ins, Load) and ins.spad == Spad.WGT]
    # the i-th weights LOAD fills slot i % slots: fresh while i < slots
    expect = [j - 1 for n, j in enumerate(wgt) if isinstance(was[j - 1], Load)
              and was[j - 1].spad == Spad.ACT and was[j - 1].wait is not None and n < slots]
    assert expect, "no set starts inside the ring's first slots"
    for i, ins in enumerate(was):
        if i in expect:
            assert order[i] == i + 1 and got[i + 1] == dataclasses.replace(
                ins, signal=was[i + 1].signal)
            assert was[i + 1].wait is None
        elif i - 1 in expect:
            assert order[i] == i - 1 and got[i - 1] == dataclasses.replace(ins, signal=None)
        else:
            assert order[i] == i and got[i] == ins
    dram = rng.integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    runs = [make_backend("model", CFG).run(w, dram.copy(), trace=True)
            for w in (part, np.concatenate([words, part[-1:]]))]
    assert all(r.ok for r in runs), [r.error for r in runs]
    assert np.array_equal(runs[0].dram, runs[1].dram)
    assert runs[1].cycles < runs[0].cycles
    assert not _races(part, runs[0].trace) and not _races(words, runs[1].trace)
    before = _vector_part(y=40)
    fused = [make_backend("model", CFG).run(fuse_words(CFG, [before, part], overlap),
                                            dram.copy()) for overlap in (False, True)]
    assert all(r.ok for r in fused), [r.error for r in fused]
    assert np.array_equal(fused[0].dram, fused[1].dram)
    assert fused[1].cycles < fused[0].cycles


@pytest.mark.parametrize("seed", range(3))
def test_an_independent_vector_part_loads_above_the_one_before(seed):
    """Two RMSNorms of random rows (one task each), the second reading none of the first's
    results: the second's VIN moves above the first's, its LOADs go before the SYNCs, and
    both compute vec_rmsnorm on the fast model, the DRAM as the drained program's; a part
    reading the first's results loads them after the SYNCs."""
    rng = np.random.default_rng(seed)
    length = int(rng.integers(8, 60))
    row = _row_bytes(length)
    eps = norm_eps(1e-5, length)
    base = {"x": 0, "w": row, "y": 2 * row, "x2": 3 * row, "w2": 4 * row, "y2": 5 * row}

    class _Second:
        x, y, b, w, w_tile_stride = "x2", "y2", None, "w2", None

    class _After:
        x, y, b, w, w_tile_stride = "y", "y2", None, "w2", None
    t = lower_vector_template(CFG, VecFunc.RMSNORM, 1, length, const=True, imm=eps)
    first, second, after = (vector_events(relocate(t, base, [op], CFG.beat_bytes))
                            for op in (_Op, _Second, _After))
    words, places = fuse_parts(CFG, [first, second])
    got = _program(words)
    loads = [got[j] for j in places[1] if isinstance(got[j], Load)]
    sync = next(j for j, ins in enumerate(got) if isinstance(ins, Sync))
    assert all(places[1][i] < sync for i in hoistable(first[:-1], second[:-1]))
    assert hoistable(first[:-1], second[:-1]) == []  # in place, the VIN beats collide
    assert len(loads) == 2 and min(ld.spad_addr for ld in loads) >= 2 * -(-length // 4)
    assert all(places[1][i] < sync for i, ins in enumerate(_program(second)[:-1])
               if isinstance(ins, Load))
    words, places = fuse_parts(CFG, [first, after])  # its rows stay after the drain
    sync = next(j for j, ins in enumerate(_program(words)) if isinstance(ins, Sync))
    reads_y = [i for i, ins in enumerate(_program(after)[:-1])
               if isinstance(ins, Load) and ins.dram_addr == base["y"] // CFG.beat_bytes]
    assert reads_y and all(places[1][i] > sync for i in reads_y)
    dram = np.zeros(CFG.memory.size_bytes, np.uint8)
    xs = [to_fixed(rng.standard_normal(length)) for _ in range(2)]
    ws = [norm_weight(rng.standard_normal(length), length) for _ in range(2)]
    for name, v in (("x", xs[0]), ("w", ws[0]), ("x2", xs[1]), ("w2", ws[1])):
        dram[base[name]:base[name] + 4 * length] = v.astype("<i4").view(np.uint8)
    runs = [make_backend("model", CFG).run(fuse_words(CFG, [first, second], o), dram.copy())
            for o in (False, True)]
    assert all(r.ok for r in runs) and np.array_equal(runs[0].dram, runs[1].dram)
    assert runs[1].cycles < runs[0].cycles
    for k, y in enumerate(("y", "y2")):
        out = runs[1].dram[base[y]:base[y] + 4 * length].view("<i4")
        assert np.array_equal(out, vec_rmsnorm(xs[k], ws[k], eps)), y


@pytest.mark.parametrize("seed", range(8))
def test_random_vector_chains_compute_what_drained_ones_do(seed):
    """Random chains of RMSNorm and ADD parts (1 to 12 rows, so one task or several) over a
    few DRAM row buffers, each reading and writing random ones (so a part reads an earlier
    one's results, or not): overlapped and drained, the same DRAM at the end on the fast
    model from random rows."""
    rng = np.random.default_rng(seed)
    length = int(rng.integers(8, 64))
    row = _row_bytes(length)
    rows_max = 12
    bufs = [f"r{i}" for i in range(4)]
    base = {name: i * rows_max * row for i, name in enumerate(bufs)}
    base["w"] = len(bufs) * rows_max * row
    parts = []
    for _ in range(int(rng.integers(2, 6))):
        rows = int(rng.integers(1, rows_max + 1))
        x, b, y = (str(v) for v in rng.permutation(bufs)[:3])
        add = bool(rng.integers(2))

        class _Part:
            w_tile_stride = None
        _Part.x, _Part.y = x, y
        _Part.b, _Part.w = (b, None) if add else (None, "w")
        t = lower_vector_template(CFG, VecFunc.ADD if add else VecFunc.RMSNORM, rows, length,
                                  second=add, const=not add,
                                  imm=0 if add else norm_eps(1e-5, length))
        parts.append(vector_events(relocate(t, base, [_Part], CFG.beat_bytes)))
    dram = np.zeros(CFG.memory.size_bytes, np.uint8)
    values = to_fixed(rng.standard_normal((len(bufs) * rows_max, row // 4)))
    dram[:values.size * 4] = values.astype("<i4").view(np.uint8).reshape(-1)
    w = norm_weight(rng.standard_normal(length), length)
    dram[base["w"]:base["w"] + 4 * length] = w.astype("<i4").view(np.uint8)
    runs = [make_backend("model", CFG).run(fuse_words(CFG, parts, o), dram.copy())
            for o in (False, True)]
    assert all(r.ok for r in runs), [r.error for r in runs]
    assert np.array_equal(runs[0].dram, runs[1].dram)


def _fused_parts_of_tiny_model(monkeypatch) -> list[list[np.ndarray]]:
    """The parts of every fused program of a compiled tiny model (prefill and decode), as
    the compiler hands them to :func:`fuse_parts`."""
    seen = []

    def spy(cfg, parts, *args, **kw):
        seen.append([p.copy() for p in parts])
        return fuse_parts(cfg, parts, *args, **kw)
    monkeypatch.setattr(compiler, "fuse_parts", spy)
    lm = tiny_lm()
    compile_model(lm, VSMALL, CompileOptions(4, 6), weights=compressed(lm))
    return seen


def _overlapped_runs_as_drained(programs: list[list[np.ndarray]], seed: int) -> None:
    """Each fused program's parts, overlapped and drained, on the fast model from one random
    DRAM image: both run, the same DRAM at the end, never more cycles overlapped."""
    rng = np.random.default_rng(seed)
    model = make_backend("model", VSMALL)
    for parts in programs:
        dram = rng.integers(0, 256, VSMALL.memory.size_bytes, dtype=np.uint8)
        runs = [model.run(fuse_words(VSMALL, parts, overlap), dram.copy())
                for overlap in (False, True)]
        assert all(r.ok for r in runs), [r.error for r in runs]
        assert np.array_equal(runs[0].dram, runs[1].dram)
        assert runs[1].cycles <= runs[0].cycles


@pytest.mark.parametrize("seed", range(2))
def test_overlapped_fused_programs_compute_what_drained_ones_do(monkeypatch, seed):
    """Every fused program of a compiled tiny model, with its parts overlapped and drained,
    on the fast model from one random DRAM image: the same DRAM at the end (the model applies
    every effect at its completion, so a hoisted LOAD that read before a STORE it depends on,
    or overwrote a scratchpad still read, would show), never more cycles; and the GEMM parts'
    weights did move."""
    programs = _fused_parts_of_tiny_model(monkeypatch)
    assert programs
    _overlapped_runs_as_drained(programs, seed)
    moved = sum(len(hoistable(a[:-1], b[:-1]))
                for parts in programs for a, b in zip(parts, parts[1:], strict=False))
    assert moved


def test_a_decode_dequant_runs_beside_its_gemms(monkeypatch):
    """In a compiled tiny model's decode step a linear's one-row DEQUANT is cut into tiles
    (sw.compile.schedule.dequant_segment_beats) that run beside the GEMMs before it
    (sw.compile.fusion.beside): on the fast model a DEQUANT VEC executes while a GEMM does,
    the program writes the drained one's DRAM from a random image (the model applies every
    effect at its completion: a tile dequantised before its STORE would show) in fewer
    cycles, and the DEQUANT's STOREs signal the events beside the GEMMs' own."""
    programs = [parts for parts in _fused_parts_of_tiny_model(monkeypatch)
                if any(_is_dequant(b) and _has(a, Gemm) and not _has(a, Vec)
                       for a, b in zip(parts, parts[1:], strict=False))]
    assert programs
    rng = np.random.default_rng(0)
    model = make_backend("model", VSMALL)
    overlapping = 0
    for parts in programs:
        dram = rng.integers(0, 256, VSMALL.memory.size_bytes, dtype=np.uint8)
        drained, overlapped = (model.run(fuse_words(VSMALL, parts, overlap), dram.copy(),
                                         trace=overlap) for overlap in (False, True))
        assert drained.ok and overlapped.ok, (drained.error, overlapped.error)
        assert np.array_equal(drained.dram, overlapped.dram)
        assert overlapped.cycles < drained.cycles
        program = _program(fuse_words(VSMALL, parts))
        spans = {kind: [(t.grant, t.end) for t in overlapped.trace
                        if isinstance(program[t.index], kind)] for kind in (Gemm, Vec)}
        overlapping += any(g0 < v1 and v0 < g1 for g0, g1 in spans[Gemm]
                           for v0, v1 in spans[Vec])
        stores = [i for i in program if isinstance(i, Store) and i.spad == Spad.VOUT]
        assert {i.signal for i in stores} & set(BESIDE_EVENTS.values())
    assert overlapping


def _on_load_engine(ins) -> bool:
    return isinstance(ins, Load) or isinstance(ins, Sync) and ins.engine == Engine.LOAD


def _tiles_part(tiles: int) -> np.ndarray:
    """A vector part (events renamed, END dropped) of one VEC on the rows of GEMM-like tiles
    ``0 .. tiles - 1`` (:func:`_ring_like`'s), loaded into VIN beat 0, storing its row at
    DRAM beat 3000: a DEQUANT segment's shape."""
    per, ev = CFG.beat_bytes // CFG.vin_word_bytes, EVENTS
    return vector_events(program_words([
        Load(spad=Spad.VIN, dram_addr=2000, rows=1, row_beats=OUT_ROW * tiles,
             signal=ev["FULL0"]),
        Vec(func=VecFunc.ADD, length=OUT_ROW * tiles * per, wait=ev["FULL0"],
            signal=ev["OUT_FULL0"]),
        Store(spad=Spad.VOUT, dram_addr=3000, rows=1, row_beats=OUT_ROW * tiles,
              wait=ev["OUT_FULL0"], signal=ev["STORED0"])]))


@pytest.mark.parametrize("seed", range(2))
def test_a_segment_beside_a_ring_goes_behind_the_next_tiles_store(monkeypatch, seed):
    """``beside`` of a ring whose weights LOADs each follow the STORE they wait on (as many
    slots as the LOAD queue holds, as SmolLM2's projections) and a vector part reading its
    first four tiles: the vector part's words come right before the ring's next weights
    LOAD, behind the GEMM and STORE after the LOAD that takes the fourth tile's STORED, so
    the in-order STORE engine stores that tile before the vector part's row and the next
    weights LOAD does not wait on the vector part. On the fast model from a random DRAM
    image the program writes what the words placed right after that LOAD write
    (``_loads_follow_stores`` patched off), in fewer cycles. A ring deeper than the LOAD
    queue (its LOADs wait on earlier STOREs) keeps that placement."""
    rng = np.random.default_rng(seed)
    dram = rng.integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    gemm, vec = _ring_like(1, 12, 64, 8, CFG.queue_depth)[:-1], _tiles_part(4)
    g = decode_fields(gemm)
    assert fusion._loads_follow_stores(g, engines_fields(g), fusion._stores(g))
    deep = decode_fields(_ring_like(1, 12, 64, 8, 2 * CFG.queue_depth)[:-1])
    assert not fusion._loads_follow_stores(deep, engines_fields(deep), fusion._stores(deep))
    runs = []
    for follow in (True, False):
        if not follow:
            monkeypatch.setattr(fusion, "_loads_follow_stores", lambda *_: False)
        words, g_at, v_at = beside(CFG, gemm, vec)
        got = _program(words)
        assert g_at == sorted(g_at) and v_at == sorted(v_at)
        # the weights LOADs that wait take the tiles' STOREDs in order: the fourth, tile 3's
        taker = [i for i, w in enumerate(got) if isinstance(w, Load) and w.spad == Spad.WGT
                 and w.wait is not None][3]
        after = got[taker + 1:v_at[0]]
        assert [type(w) for w in after] == ([Gemm, Store] if follow else [])
        assert isinstance(got[v_at[-1] + 1], Load) and got[v_at[-1] + 1].spad == Spad.WGT \
            or not follow
        r = make_backend("model", CFG).run(program_words(got + [End()]), dram.copy())
        assert r.ok, r.error
        runs.append(r)
    assert np.array_equal(runs[0].dram, runs[1].dram)
    assert runs[0].cycles < runs[1].cycles


def _rows_part(src: int, beats: int, y: int, func: VecFunc = VecFunc.ADD) -> list:
    """A vector task (events not renamed) of ``func`` on ``beats`` beats of DRAM from beat
    ``src``, loaded into VIN beat 0, storing its row at DRAM beat ``y``."""
    per, ev = CFG.beat_bytes // CFG.vin_word_bytes, EVENTS
    return [Load(spad=Spad.VIN, dram_addr=src, rows=1, row_beats=beats, signal=ev["FULL0"]),
            Vec(func=func, length=beats * per, b_addr=0, wait=ev["FULL0"],
                signal=ev["OUT_FULL0"]),
            Store(spad=Spad.VOUT, dram_addr=y, rows=1, row_beats=beats, wait=ev["OUT_FULL0"],
                  signal=ev["STORED0"])]


@pytest.mark.parametrize("seed", range(2))
def test_a_paced_run_past_the_last_gemm_goes_by_its_events(monkeypatch, seed):
    """``beside`` of a ring (as many slots as the LOAD queue holds, as SmolLM2's gate/up
    projection: its weights LOADs about as long as its GEMMs) and a paced run, drained
    between its parts: an ADD of four tiles' rows (a DEQUANT segment), a SILU_GATE of its
    row (a SiLU-gate segment, reading no tile) and an ADD of the last four tiles'. Past
    the ring's last GEMM (``_tail_from``) the run's words
    come by their events: the SILU_GATE's STORE before the last tile's STORE, so it runs
    while the last GEMMs compute, where by the durations' clock (``_tail_from`` patched
    to no tail) it came after that STORE and waited for the last GEMM. On the fast model
    from a random DRAM image both placements write the same DRAM, the new one in fewer
    cycles."""
    rng = np.random.default_rng(seed)
    dram = rng.integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    tiles, ev = 12, EVENTS
    gemm = _ring_like(1, tiles, 140, 128, CFG.queue_depth)[:-1]
    drain = [Sync(engine=Engine.LOAD, wait=ev["STORED0"])]
    vec = vector_events(program_words(
        _rows_part(2000 + OUT_ROW * 4, OUT_ROW * 4, 3000) + drain
        + _rows_part(3000, OUT_ROW * 4, 3100, VecFunc.SILU_GATE) + drain
        + _rows_part(2000 + OUT_ROW * 8, OUT_ROW * 4, 3200)))
    silu_store = 5  # the SILU_GATE part's STORE among vec's words
    runs, places = [], []
    for tail in (True, False):
        if not tail:
            monkeypatch.setattr(fusion, "_tail_from", lambda g, eng: eng.shape[0])
        words, g_at, v_at = beside(CFG, gemm, vec)
        assert g_at == sorted(g_at) and v_at == sorted(v_at)
        places.append(v_at[silu_store] < g_at[-1])
        r = make_backend("model", CFG).run(program_words(_program(words) + [End()]),
                                           dram.copy())
        assert r.ok, r.error
        runs.append(r)
    assert places == [True, False]
    assert np.array_equal(runs[0].dram, runs[1].dram)
    assert runs[0].cycles < runs[1].cycles


@pytest.mark.parametrize("seed", range(2))
def test_an_attention_run_past_the_last_gemm_leaves_half_the_store_queue(monkeypatch, seed):
    """``beside`` of a ring and a paced run without a SILU_GATE (as attention's: a SOFTMAX
    of four tiles' rows, then a part that STOREs its row in four pieces, as a FOLD's
    outputs, drained between), the ring's last weights LOAD longer than the run's VECs:
    past the ring's last GEMM (``_tail_from``) the run's STORE-engine words ahead of the
    ring's last tile STOREs, at least one, leave half the STORE queue free
    (:func:`sw.compile.fusion._tail_room`), where without the bound (``_tail_room``
    patched to always) more of them come there. On the fast model from a random DRAM image
    both placements write the same DRAM."""
    rng = np.random.default_rng(seed)
    dram = rng.integers(0, 256, CFG.memory.size_bytes, dtype=np.uint8)
    tiles, ev, beats = 12, EVENTS, OUT_ROW * 4
    gemm = _ring_like(1, tiles, 140, 128, CFG.queue_depth)[:-1]
    drain = [Sync(engine=Engine.LOAD, wait=ev["STORED0"])]
    load, vec_, store = _rows_part(3000, beats, 3100)
    pieces = [dataclasses.replace(store, dram_addr=3100 + k * OUT_ROW, spad_addr=k * OUT_ROW,
                                  row_beats=OUT_ROW, wait=store.wait if k == 0 else None,
                                  signal=store.signal if k == 3 else None) for k in range(4)]
    vec = vector_events(program_words(
        _rows_part(2000 + OUT_ROW * 4, beats, 3000, VecFunc.SOFTMAX) + drain
        + [load, vec_, *pieces]))
    g_eng = engines_fields(decode_fields(gemm))
    v_store = np.flatnonzero(engines_fields(decode_fields(vec)) == Engine.STORE.value)
    last = fusion._tail_from(decode_fields(gemm), g_eng)
    counts, runs = [], []
    for bound in (True, False):
        if not bound:
            monkeypatch.setattr(fusion, "_tail_room", lambda cfg, placed, left: True)
        words, g_at, v_at = beside(CFG, gemm, vec)
        assert g_at == sorted(g_at) and v_at == sorted(v_at)
        ahead = sum(g_at[last] < v_at[i] < g_at[-1] for i in v_store.tolist())
        behind = int((g_eng[last + 1:] == Engine.STORE.value).sum())
        counts.append((ahead, behind))
        r = make_backend("model", CFG).run(program_words(_program(words) + [End()]),
                                           dram.copy())
        assert r.ok, r.error
        runs.append(r)
    (bounded, left), (unbounded, _) = counts
    assert left >= 1 and 1 <= bounded and bounded + left <= CFG.queue_depth // 2 < unbounded + left
    assert np.array_equal(runs[0].dram, runs[1].dram)


def test_an_attention_run_keeps_the_clock_where_its_vecs_outlast_the_last_load(monkeypatch):
    """``beside`` of the ring of
    :func:`test_an_attention_run_past_the_last_gemm_leaves_half_the_store_queue` (140-beat
    weights LOADs) and a paced run without a SILU_GATE whose VECs take longer than the
    last LOAD (a SOFTMAX of four tiles' rows, then three ADD parts, drained between): the
    same words as with no tail (``_tail_from`` patched to none: the durations' clock
    places the run to the end), and the program runs on the fast model."""
    tiles, ev, beats = 12, EVENTS, OUT_ROW * 4
    gemm = _ring_like(1, tiles, 140, 128, CFG.queue_depth)[:-1]
    drain = [Sync(engine=Engine.LOAD, wait=ev["STORED0"])]
    parts = _rows_part(2000 + OUT_ROW * 4, beats, 3000, VecFunc.SOFTMAX)
    for k in range(3):
        parts += drain + _rows_part(3000 + 100 * k, beats, 3100 + 100 * k)
    vec = vector_events(program_words(parts))
    g, v = decode_fields(gemm), decode_fields(vec)
    g_eng, v_eng = engines_fields(g), engines_fields(v)
    last_load = int(np.flatnonzero(g_eng == Engine.LOAD.value)[-1])
    assert exec_cycles_fields(g, CFG)[last_load] < exec_cycles_fields(v, CFG)[
        v_eng == Engine.VECTOR.value].sum()
    words, g_at, v_at = beside(CFG, gemm, vec)
    monkeypatch.setattr(fusion, "_tail_from", lambda g, eng: eng.shape[0])
    clock = beside(CFG, gemm, vec)
    assert np.array_equal(words, clock[0]) and (g_at, v_at) == clock[1:]
    r = make_backend("model", CFG).run(program_words(_program(words) + [End()]),
                                       np.zeros(CFG.memory.size_bytes, np.uint8))
    assert r.ok, r.error


def test_beside_keeps_each_parts_order_and_follows_the_stores_it_reads():
    """``beside`` of a GEMM-like part (four tiles) and a vector part reading one tile's row:
    each part's words in their order; the vector part's LOAD after the LOAD-engine word
    that takes that tile's STORED (tile 1: the fourth weights' LOAD, then the GEMM and
    STORE words up to the part's next LOAD-engine word, none: its last word; tile 3,
    whose STORED no word of the part takes: SYNCs taking the STOREDs of tiles 2 and 3, in
    order), its STORE signalling the renamed STORED; the program runs."""
    gemm = _gemm_like(4)[:-1]
    for tile, after, syncs in ((1, Load, 0), (3, Sync, 2)):
        load, *rest = _program(_vector_part(y=3000)[:-1])
        vec = program_words([dataclasses.replace(load, dram_addr=2000 + OUT_ROW * tile)]
                            + rest)
        words, g_at, v_at = beside(CFG, gemm, vec)
        got = _program(words)
        assert g_at == sorted(g_at) and v_at == sorted(v_at)
        assert len(got) == len(g_at) + len(v_at) + syncs
        before = [w for w in got[:v_at[0]] if _on_load_engine(w)][-1]
        assert isinstance(before, after) and before.wait == EVENTS[f"STORED{tile % 2}"]
        assert all(_on_load_engine(w) for w in got[got.index(before):v_at[0]]) == (tile == 3)
        assert got[v_at[2]].signal == BESIDE_EVENTS[EVENTS["STORED0"]]
        r = make_backend("model", CFG).run(program_words(got + [End()]),
                                           np.zeros(CFG.memory.size_bytes, np.uint8))
        assert r.ok, r.error


def _drained_part(func: VecFunc, src: int, y: int) -> list:
    """A vector part drained through VOUT: a VIN LOAD of two beats from ``src``, a VEC
    ``func`` of 4 elements reading it, a STORE of its results to ``y``."""
    ev = EVENTS
    return [Load(spad=Spad.VIN, dram_addr=src, rows=1, row_beats=2, signal=ev["FULL0"]),
            Vec(func=func, length=4, b_addr=4, wait=ev["FULL0"], signal=ev["OUT_FULL0"]),
            Store(spad=Spad.VOUT, dram_addr=y, rows=1, row_beats=2,
                  wait=ev["OUT_FULL0"], signal=ev["STORED0"])]


@pytest.mark.parametrize("tiles", [4, 9])
def test_a_paced_vec_follows_the_load_it_waits_on(tiles):
    """``beside`` of a GEMM-like part and a paced vector run (a SOFTMAX part, drained, then
    a SILU_GATE part reading its row: attention's softmax or the MLP's SiLU-gate segments):
    each VEC comes right after the VIN LOAD that grants it, not after the GEMM part's next
    word (the vector engine's queue has room, and a VEC holds up no word of the GEMM part),
    so each drained vector part costs the GEMM part's LOAD stream one step, not one per
    word. The program runs on the fast model to the DRAM of the two parts one after the
    other."""
    ev = EVENTS
    vec = vector_events(program_words(_drained_part(VecFunc.SOFTMAX, 0, 3000)
                                      + [Sync(engine=Engine.LOAD, wait=ev["STORED0"])]
                                      + _drained_part(VecFunc.SILU_GATE, 3000, 3100)))
    gemm = _gemm_like(tiles)[:-1]
    words, g_at, v_at = beside(CFG, gemm, vec)
    got, mine = _program(words), _program(vec)
    assert g_at == sorted(g_at) and v_at == sorted(v_at)
    for k in (1, 5):
        assert isinstance(mine[k], Vec) and v_at[k] == v_at[k - 1] + 1, (k, got)
    dram = np.random.default_rng(tiles).integers(0, 256, CFG.memory.size_bytes, np.uint8)
    runs = [make_backend("model", CFG).run(program_words(p + [End()]), dram.copy())
            for p in (got, _program(gemm) + _program(rename_events(vec, BESIDE_EVENTS)))]
    assert all(r.ok for r in runs), [r.error for r in runs]
    assert np.array_equal(runs[0].dram, runs[1].dram)


def test_a_memory_bound_attention_runs_weights_loads_are_cut_into_steps():
    """``cut_loads`` of a GEMM-like part whose weights LOADs are four vector steps long
    (:func:`piece_beats`) beside a paced run of two drained SOFTMAX parts (the GEMM part
    alone takes longer): each weights LOAD becomes consecutive LOADs of at most a step's
    beats covering its beats, its wait on the first and its signal on the last (where each
    of its words went: its last); ``beside`` of the cut part runs on the fast model to the
    DRAM of the two parts one after the other, in fewer cycles than of the part uncut (the
    drain waited for a whole LOAD there). Left as it is: beside a SILU_GATE, and where the
    vector parts alone take longer than the GEMM part alone."""
    ev = EVENTS

    def run(func: VecFunc) -> np.ndarray:
        return vector_events(program_words(_drained_part(VecFunc.SOFTMAX, 0, 3000)
                                           + [Sync(engine=Engine.LOAD, wait=ev["STORED0"])]
                                           + _drained_part(func, 3000, 3100)))
    vec = run(VecFunc.SOFTMAX)
    piece = piece_beats(CFG, decode_fields(vec))
    gemm = _gemm_like(2, beats=4 * piece)[:-1]
    last, placed = cut_loads(CFG, gemm, vec)
    cut = load_pieces(gemm, piece)[0]
    whole = beside(CFG, gemm, vec)
    assert _same_placement(placed, beside(CFG, cut, vec))
    before, after = _program(gemm), _program(cut)
    assert len(after) > len(before)
    for i, ins in enumerate(before):
        k = last[i]
        first = last[i - 1] + 1 if i else 0
        if not (isinstance(ins, Load) and ins.spad == Spad.WGT):
            assert after[first:k + 1] == [ins]
            continue
        pieces = after[first:k + 1]
        assert [p.dram_addr for p in pieces] == [ins.dram_addr + j * piece
                                                for j in range(len(pieces))]
        assert [p.spad_addr - ins.spad_addr for p in pieces] == \
            [p.dram_addr - ins.dram_addr for p in pieces]
        assert sum(p.row_beats for p in pieces) == ins.row_beats
        assert max(p.row_beats for p in pieces) <= piece < ins.row_beats
        assert [p.wait for p in pieces] == [ins.wait] + [None] * (len(pieces) - 1)
        assert [p.signal for p in pieces] == [None] * (len(pieces) - 1) + [ins.signal]
    dram = np.random.default_rng(0).integers(0, 256, CFG.memory.size_bytes, np.uint8)
    runs = [make_backend("model", CFG).run(program_words(p + [End()]), dram.copy())
            for p in (_program(placed[0]), _program(whole[0]),
                      before + _program(rename_events(vec, BESIDE_EVENTS)))]
    assert all(r.ok for r in runs), [r.error for r in runs]
    assert np.array_equal(runs[0].dram, runs[2].dram)
    assert runs[0].cycles < runs[1].cycles
    silu = run(VecFunc.SILU_GATE)
    assert _same_placement(cut_loads(CFG, gemm, silu)[1], beside(CFG, gemm, silu))
    short = _gemm_like(1, beats=piece + 1)[:-1]  # cuttable, but the vector parts outlast it
    alone = [make_backend("model", CFG).run(program_words(_program(w) + [End()]), dram.copy())
             for w in (short, vec)]
    assert alone[0].cycles < alone[1].cycles
    assert _same_placement(cut_loads(CFG, short, vec)[1], beside(CFG, short, vec))


def _same_placement(a: tuple, b: tuple) -> bool:
    """Whether two :func:`beside` results are the same words and places."""
    return np.array_equal(a[0], b[0]) and list(a[1:]) == list(b[1:])


def _vin_races(words: np.ndarray, trace) -> list[tuple[int, int]]:
    """The (LOAD, VEC) pairs of a run of ``words`` (its ``trace``) that race on VIN beats:
    the LOAD writes beats a REQUANT, DEQUANT, SOFTMAX, FOLD or SILU_GATE reads while that VEC
    runs (from the LOAD's grant to its landing, from the VEC's grant to its end; the VEC
    reads ``length`` elements from ``a_addr``, a DEQUANT, FOLD or SILU_GATE also from
    ``b_addr``, a DEQUANT its ``amax`` word at ``imm``'s low 16 bits)."""
    program = _program(words)
    at = {t.index: t for t in trace}
    per = VSMALL.beat_bytes // VSMALL.vin_word_bytes

    def read(ins) -> list[tuple[int, int]]:
        out = [(ins.a_addr, ins.a_addr + ins.length)]
        if ins.func in (VecFunc.DEQUANT, VecFunc.FOLD, VecFunc.SILU_GATE):
            out.append((ins.b_addr, ins.b_addr + ins.length))
        if ins.func == VecFunc.DEQUANT:
            out.append((ins.imm & 0xFFFF, (ins.imm & 0xFFFF) + 1))
        return [(lo // per, -(-hi // per)) for lo, hi in out]
    funcs = (VecFunc.REQUANT, VecFunc.DEQUANT, VecFunc.SOFTMAX, VecFunc.FOLD,
             VecFunc.SILU_GATE)
    loads = [i for i, ins in enumerate(program) if isinstance(ins, Load) and ins.spad == Spad.VIN]
    vecs = [i for i, ins in enumerate(program) if isinstance(ins, Vec) and ins.func in funcs]
    return [(i, j) for i in loads for j in vecs
            if any(lo < hi2 and lo2 < hi for lo, hi in [
                (program[i].spad_addr, program[i].spad_addr
                 + program[i].rows * program[i].row_beats)] for lo2, hi2 in read(program[j]))
            and at[i].grant <= at[j].end and at[j].grant <= at[i].done]


def _seeds(n: int, default: int = 2) -> list:
    """Seeds ``range(n)`` for a test that compiles and runs whole attention programs, those
    from ``default`` on in the slow set (the default run keeps an even and an odd one)."""
    return [s if s < default else pytest.param(s, marks=pytest.mark.slow) for s in range(n)]


@pytest.mark.parametrize("seed", _seeds(4))
def test_a_heads_softmax_runs_beside_the_next_heads_scores(monkeypatch, seed):
    """A tiny model of random heads (1 to 4 kv heads, grouped or not) compiled for decode
    steps up to a random context: in every attention program each kv head's SOFTMAX follows
    its scores' DEQUANT beside the scores GEMMs (sw.compile.fusion.beside, paced by the
    durations). On the fast model from a random DRAM image, overlapped as drained, it runs
    (no deadlock) to the drained program's DRAM (the model applies every effect at its
    completion: a softmax of rows not yet dequantised would show) in no more cycles, with
    no LOAD writing beats a GEMM or VEC reads while it runs (which the model's values do
    not see); and with four kv heads (scores GEMMs long enough to outlast a head's DEQUANT) a
    SOFTMAX runs while a GEMM does. Odd seeds put each FOLD beside too, right after its
    SOFTMAX (as sw.compile.fusion._folds_beside does where the keys stream longer than the
    vector engine works on them: an INT8 cache at a long context, not a tiny model's) where
    there is one kv head; with several, each FOLD follows its SOFTMAX whatever the cache
    (sw.compile.fusion._values_woven: a head's values GEMM beside the next head's work)."""
    rng = np.random.default_rng(seed)
    folds = bool(seed % 2)
    monkeypatch.setattr(fusion, "_folds_beside", lambda *_: folds)
    kv, programs = _random_attention(monkeypatch, rng, seed, [1, 2, 4])
    model = make_backend("model", VSMALL)
    beside_gemm = 0
    for parts in programs:
        funcs = [i.func for p in parts for i in _program(p) if isinstance(i, Vec)]
        soft = [k for k, f in enumerate(funcs) if f == VecFunc.SOFTMAX]
        assert all(funcs[k - 1] in (VecFunc.DEQUANT, VecFunc.SOFTMAX) for k in soft)
        after = {funcs[k + 1] for k in soft if funcs[k + 1] != VecFunc.SOFTMAX}
        assert after == {VecFunc.FOLD}  # several kv heads: woven with the values GEMMs
        beside_gemm += _runs_as_drained(model, parts, rng, VecFunc.SOFTMAX)
    assert beside_gemm or kv < 4


@pytest.mark.parametrize("seed", _seeds(4))
def test_a_heads_values_gemm_runs_beside_the_next_heads_scores(monkeypatch, seed):
    """A tiny model of 2 or 4 kv heads (grouped or not) compiled for decode steps up to a
    random context: in every attention program each kv head's values GEMM is a part of its
    own right after its FOLD, and the next head's DEQUANT, SOFTMAX and FOLD run beside it
    (sw.compile.fusion._values_woven; the next head's DEQUANT reads an earlier GEMM part's
    accumulators, sw.compile.fusion._may_run_beside). On the fast model from a random DRAM
    image the overlapped program runs (no deadlock) to the drained program's DRAM in no more
    cycles, with no LOAD writing ACT or WGT beats a GEMM reads, or VIN beats a VEC reads,
    while it runs; and in every program the vector engine works on a head's scores (their
    DEQUANT or SOFTMAX) while a values GEMM runs (the values of every head after every head's
    FOLD, as before the weaving, never do)."""
    rng = np.random.default_rng(seed)
    kv, programs = _random_attention(monkeypatch, rng, seed, [2, 4])
    model = make_backend("model", VSMALL)
    beside_values = 0
    for parts in programs:
        gemm = [k for k, p in enumerate(parts) if any(isinstance(i, Gemm) for i in _program(p))]
        values = gemm[1:kv + 1]  # the scores GEMM (one part), then a part per kv head
        assert len(values) == kv
        for k in values:  # right after its FOLD
            assert [i.func for i in _program(parts[k - 1]) if isinstance(i, Vec)][-1] \
                == VecFunc.FOLD
        words, places, overlapped = _overlapped_run(model, parts, rng)
        program = _program(words)
        at = {t.index: (t.grant, t.end) for t in overlapped.trace}
        gemms = [at[places[k][i]] for k in values
                 for i, ins in enumerate(_program(parts[k])) if isinstance(ins, Gemm)]
        scores = [at[i] for i, ins in enumerate(program) if isinstance(ins, Vec) and (
            ins.func == VecFunc.SOFTMAX
            or ins.func == VecFunc.DEQUANT and not dequant_fold(ins.imm))]
        beside_values += any(g0 < v1 and v0 < g1 for g0, g1 in gemms for v0, v1 in scores)
    assert beside_values == len(programs)


@pytest.mark.parametrize("seed", _seeds(3))
def test_a_folds_value_codes_load_while_its_softmax_runs(monkeypatch, seed):
    """A tiny model of 2 or 4 kv heads compiled for decode steps up to a random context: in
    every attention program each FOLD's value codes (its part's first LOAD, a row no part of
    its beside run writes) go before the SYNC that drains the SOFTMAX before it
    (sw.compile.fusion._run_early, its VIN moved above the SOFTMAX's), so on the fast model
    they land while that SOFTMAX's VECs run, where they waited for its STORE; the
    overlapped program computes the drained one's DRAM in no more cycles, with no LOAD
    writing beats a GEMM or VEC reads while it runs."""
    rng = np.random.default_rng(seed)
    _, programs = _random_attention(monkeypatch, rng, seed, [2, 4])
    model = make_backend("model", VSMALL)
    for parts in programs:
        words, places, overlapped = _overlapped_run(model, parts, rng)
        program = _program(words)
        at = {t.index: t for t in overlapped.trace}
        folds = [k for k, p in enumerate(parts)
                 if [i.func for i in _program(p) if isinstance(i, Vec)][:1] == [VecFunc.FOLD]]
        assert folds
        for k in folds:
            softmax = [places[k - 1][i] for i, ins in enumerate(_program(parts[k - 1]))
                       if isinstance(ins, Vec)]
            assert {program[i].func for i in softmax} == {VecFunc.SOFTMAX}
            store = places[k - 1][max(i for i, ins in enumerate(_program(parts[k - 1]))
                                      if isinstance(ins, Store))]
            drain = next(j for j in range(store + 1, len(program))
                         if isinstance(program[j], Sync) and program[j].engine == Engine.LOAD
                         and program[j].wait == program[store].signal)
            codes = places[k][0]
            assert isinstance(program[codes], Load) and program[codes].spad == Spad.VIN
            assert codes < drain
            assert at[codes].done <= at[softmax[-1]].end


def test_beyond_the_weave_positions_the_values_are_one_part(monkeypatch):
    """At more positions than :data:`sw.compile.fusion.WEAVE_POSITIONS` the values of every
    kv head are one GEMM part after every head's FOLD, as before the weaving (the vector work
    hides beside the scores GEMMs there and a part per head only adds drains)."""
    import sw.compile.fusion as fusion
    monkeypatch.setattr(fusion, "WEAVE_POSITIONS", 4)
    programs = _fused_programs_with(monkeypatch, tiny_lm(heads=4, kv_heads=2, seed=0),
                                    CompileOptions(4, 24, one_program=False), VecFunc.SOFTMAX)
    assert programs
    for parts in programs:
        gemm = [k for k, p in enumerate(parts) if any(isinstance(i, Gemm) for i in _program(p))]
        folds = [k for k, p in enumerate(parts)
                 if any(isinstance(i, Vec) and i.func == VecFunc.FOLD for i in _program(p))]
        # woven, head 0's values GEMM would come before head 1's FOLD
        assert len(folds) == 2 and max(folds) < gemm[1]


def _fused_programs_with(monkeypatch, lm, opts: CompileOptions, func: VecFunc
                         ) -> list[list[np.ndarray]]:
    """The parts of every fused program compiling ``lm`` on VSMALL with ``opts`` builds that
    holds a VEC of ``func`` (at least one)."""
    seen = []

    def spy(cfg, parts, *args, **kw):
        seen.append([p.copy() for p in parts])
        return fuse_parts(cfg, parts, *args, **kw)
    monkeypatch.setattr(compiler, "fuse_parts", spy)
    compile_model(lm, VSMALL, opts, weights=compressed(lm))
    programs = [parts for parts in seen if any(
        isinstance(i, Vec) and i.func == func for p in parts for i in _program(p))]
    assert programs
    return programs


def _overlapped_run(model, parts, rng) -> tuple[np.ndarray, tuple, object]:
    """Run ``parts`` fused overlapped and drained from one random DRAM image on the fast
    model: both finish, with the same DRAM, the overlapped in no more cycles and with no LOAD
    writing ACT or WGT beats a GEMM reads, or VIN beats a VEC reads, while it runs. Returns
    the overlapped program's words, each part's places in it and its traced run."""
    dram = rng.integers(0, 256, VSMALL.memory.size_bytes, dtype=np.uint8)
    words, places = fuse_parts(VSMALL, parts)
    drained, overlapped = (model.run(w, dram.copy(), trace=True) for w in (
        fuse_words(VSMALL, parts, False), words))
    assert drained.ok and overlapped.ok, (drained.error, overlapped.error)
    assert np.array_equal(drained.dram, overlapped.dram)
    assert overlapped.cycles <= drained.cycles
    assert not _races(words, overlapped.trace, VSMALL)
    assert not _vin_races(words, overlapped.trace)
    return words, places, overlapped


def _runs_as_drained(model, parts, rng, func: VecFunc) -> bool:
    """:func:`_overlapped_run` of ``parts``; returns whether a VEC of ``func`` ran while a
    GEMM did."""
    words, _, overlapped = _overlapped_run(model, parts, rng)
    program = _program(words)
    gemms = [(t.grant, t.end) for t in overlapped.trace if isinstance(program[t.index], Gemm)]
    vecs = [(t.grant, t.end) for t in overlapped.trace
            if isinstance(program[t.index], Vec) and program[t.index].func == func]
    return any(g0 < v1 and v0 < g1 for g0, g1 in gemms for v0, v1 in vecs)


@pytest.mark.parametrize("seed", range(3))
def test_a_decode_silu_gate_runs_beside_the_up_gemm(monkeypatch, seed):
    """A tiny model of a random width (two or three SILU_GATE segments) compiled for decode
    steps, every SILU_GATE cut (``SILU_SEGMENT_MARGIN`` 0; a tiny GEMM streams too few
    weights per segment to pass the real margin): in its program the up projection's
    DEQUANT and the SILU_GATE alternate a segment at a time (each segment's SILU_GATE right
    after its DEQUANT, one VEC each), the REQUANT after the last. On the fast model from a
    random DRAM image, overlapped as drained, it runs (no deadlock) to the drained
    program's DRAM (the model applies every effect at its completion: a SILU_GATE of rows
    not yet dequantised would show) in no more cycles, with no LOAD writing beats a GEMM or
    VEC reads while it runs; and with three segments (up tiles left beside the first two) a
    SILU_GATE runs while a GEMM does."""
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(fusion, "SILU_SEGMENT_MARGIN", 0)
    hidden = int(rng.choice([64, 128]))
    # attention on the host: a KV append's INSERTs read positions from DRAM, which a random
    # image makes out of range
    programs = _fused_programs_with(monkeypatch, tiny_lm(hidden=hidden, seed=seed),
                                    CompileOptions(4, 8, phases=("decode",), attention=False),
                                    VecFunc.SILU_GATE)
    segments = -(-(hidden * 3 // 2) // 64)  # 16 lanes: 4 tiles of 16 words a segment
    model = make_backend("model", VSMALL)
    beside_gemm = 0
    for parts in programs:
        funcs = [i.func for p in parts for i in _program(p) if isinstance(i, Vec)]
        silu = [k for k, f in enumerate(funcs) if f == VecFunc.SILU_GATE]
        assert len(silu) == segments
        assert all(funcs[k - 1] == VecFunc.DEQUANT for k in silu)
        assert all(VecFunc.DEQUANT in funcs[a:b] for a, b in zip(silu, silu[1:], strict=False))
        assert funcs[silu[-1] + 1] == VecFunc.REQUANT
        beside_gemm += _runs_as_drained(model, parts, rng, VecFunc.SILU_GATE)
    assert beside_gemm or segments < 3  # two: the first's up tiles are all that is left


def _is_dequant(words: np.ndarray) -> bool:
    return any(isinstance(i, Vec) and i.func == VecFunc.DEQUANT for i in _program(words))


def _has(words: np.ndarray, kind: type) -> bool:
    return any(isinstance(i, kind) for i in _program(words))


def _qkv_rope_graph(layout: list[tuple[str, dict, tuple]]) -> tuple[Graph, list]:
    """A q linear's output ``[1, 3, 8]`` (3 tokens, 2 heads of 4) through the ``layout``
    nodes (``(op, attrs, output shape)``) into a rope node; and its work entry."""
    t, d = 3, 4
    values = {"q": TensorType((1, t, 8)), "cos": TensorType((t, d)), "sin": TensorType((t, d))}
    nodes, x = [], "q"
    for k, (op, attrs, shape) in enumerate(layout):
        values[f"l{k}"] = TensorType(shape)
        nodes.append(Node(f"l{k}", op, (x,), (f"l{k}",), attrs))
        x = f"l{k}"
    values["y"] = values[x]
    nodes.append(Node("q.rope", "rope", (x, "cos", "sin"), ("y",)))
    g = Graph(tuple(nodes), values, ("q", "cos", "sin"), ("y",), {"phase": "decode"})
    return g, [("decode", nodes[-1], None, [vector_op(nodes[-1], g, CFG)])]


def test_a_rope_reads_the_rows_of_the_linear_its_layout_nodes_view():
    """q viewed as ``[1, T, heads, d]`` and transposed to ``[1, heads, T, d]``: ROPE's rows
    are the linear's rows, so the rope's input aliases the linear's output; viewed as
    ``[1, heads, T, d]`` at once (the same shape, other elements), it does not."""
    g, work = _qkv_rope_graph([("view", {"shape": [1, 3, 2, 4]}, (1, 3, 2, 4)),
                               ("transpose", {"dims": [1, 2]}, (1, 2, 3, 4))])
    assert row_aliases(g, work) == {"l1": "q"}
    g, work = _qkv_rope_graph([("view", {"shape": [1, 2, 3, 4]}, (1, 2, 3, 4))])
    assert (work[0][3][0].rows, work[0][3][0].length) == (3, 8)
    assert row_aliases(g, work) == {}


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_scores_and_softmax_are_one_program_per_layer_and_bucket(kv_heads):
    """Each attention scores node's program per context bucket, the softmax's and the
    values' of the same bucket are parts of one fused program (its VECs: a REQUANT of each
    query head's rows of the rope's results, a row per token, then per operand head a DEQUANT
    per row and a SOFTMAX per row, whose ``imm`` the host sets, then a FOLD per row
    and a DEQUANT per row of the values); each member's DEQUANT writes its rows of the
    softmax's input, in order, and reads its kv head's channel words and the ``amax`` words
    of REQUANT (the host writes neither them nor the query rows); each values member's FOLD
    reads its kv head's value codes (the host's), its DEQUANT the FOLD's amax words
    (imm's fold bit) and the constant values channel words."""
    lm = tiny_lm(layers=2, heads=4, kv_heads=kv_heads)
    ws = compressed(lm)
    opts = CompileOptions(6, 40, one_program=False)  # (joined: tests/sw/runtime)
    exe = compile_model(lm, CFG.replace(memory=MemoryModel(size_bytes=1 << 22)), opts,
                        weights=ws)
    fused = [p for p in exe.programs if p.parts and p.imm_rows]
    scores = [p for p in exe.programs if p.node.endswith(".scores") and p.fused_into is None
              and not p.parts]
    assert fused and not scores   # every scores program is fused with its softmax
    buckets = {(p.phase, p.bucket) for p in fused}
    assert len(fused) == 2 * len(buckets) and len(buckets) > 2   # 2 layers, every bucket
    for p in fused:
        first, soft, values = (exe.programs[i] for i in p.parts[:3])
        assert first.node.endswith(".scores") and soft.node.endswith(".softmax")
        assert values.node.endswith(".values")
        assert first.bucket == soft.bucket == values.bucket == p.bucket
        op = soft.vector
        vecs = [i for i in decode_program(p.words.view(np.uint8)) if hasattr(i, "func")]
        tokens = 1 if p.phase == "decode" else opts.prompt_tokens
        requant = [VecFunc.REQUANT] * (4 * tokens)  # a row per head and token
        # the chain after it (o_proj's REQUANT on): its own test
        vecs = vecs[:len(requant) + 4 * op.rows]
        # per operand head, its rows' DEQUANT then their SOFTMAX (beside the next heads);
        # with several kv heads woven with the values (sw.compile.fusion._values_woven):
        # each head's FOLD after its SOFTMAX, the head before's values DEQUANT after that
        # (FOLD's amax words: the fold bit)
        heads = [(f, False) for f in requant]
        if len(first.members) == len(values.members) > 1:
            for h, (m, v) in enumerate(zip(first.members, values.members, strict=True)):
                heads += [(VecFunc.DEQUANT, False)] * m.tokens \
                    + [(VecFunc.SOFTMAX, False)] * m.tokens + [(VecFunc.FOLD, False)] * v.tokens
                heads += [(VecFunc.DEQUANT, True)] * values.members[h - 1].tokens if h else []
            heads += [(VecFunc.DEQUANT, True)] * values.members[-1].tokens
        else:
            heads += [(f, False) for m in first.members
                      for f in [VecFunc.DEQUANT] * m.tokens + [VecFunc.SOFTMAX] * m.tokens]
            heads += [(VecFunc.FOLD, False)] * op.rows + [(VecFunc.DEQUANT, True)] * op.rows
        assert [(v.func, v.func == VecFunc.DEQUANT and dequant_fold(v.imm)) for v in vecs] \
            == heads
        layer = int(p.node.split(".")[1])
        for j, m in enumerate(values.members):   # FOLD reads the host's value codes
            assert m.codes == f"vc:{layer}:{j // (len(values.members) // kv_heads)}"
            assert exe.symbols[m.codes].nbytes >= op.row_bytes and m.dequant and not m.amax
        words = p.words[list(p.imm_rows)]
        assert len(p.imm_rows) == op.rows and all(
            i.func == VecFunc.SOFTMAX for i in decode_program(words.view(np.uint8)))
        # causal counts relative to the run-time register pos: row r is token r % tokens's
        assert [(i.reg, i.imm) for i in decode_program(words.view(np.uint8))] == [
            (exe.registers.index((RegTerm("pos"),)) + 1, r % tokens + 1)
            for r in range(op.rows)]
        at = exe.symbols[op.x].addr
        layer = int(p.node.split(".")[1])
        for j, m in enumerate(first.members):   # operand heads in order: the softmax's rows
            r = exe.symbols[m.dequant]
            assert r.addr == at and m.dequant_row_bytes == op.row_bytes
            at += m.tokens * op.row_bytes
            assert m.amax is None   # REQUANT leaves them
            assert m.channels == f"sc:{layer}:{j // (len(first.members) // kv_heads)}"
            assert exe.symbols[m.channels].nbytes >= op.row_bytes
        assert at == exe.symbols[op.x].addr + op.data_bytes
    assert SCORES_AMAX.separate and SCORES_AMAX.stride == 1
    # per step: the first block's norm -> q/k/v -> RoPEs, and per block its
    # scores -> softmax -> values chained with its o_proj, MLP and the next block's q/k/v
    for phase in ("prefill", "decode"):
        assert exe.report["phases"][phase]["fused_programs_per_step"] == 1 + 2


def _decode_work(monkeypatch, lm, cfg=VSMALL) -> list:
    """The decode step's work entries ``(phase, node, bucket, members)`` of ``lm`` compiled
    for ``cfg``, as the compiler hands them to :func:`fusion_groups`."""
    seen = []
    real = compiler._partition

    def spy(*args, **kw):
        out = real(*args, **kw)
        seen.append(out[0])
        return out
    monkeypatch.setattr(compiler, "_partition", spy)
    compile_model(lm, cfg, CompileOptions(4, 6), weights=compressed(lm))
    return [w for w in seen[0] if w[0] == "decode"]


def _vec_funcs(words) -> list[VecFunc]:
    return [i.func for i in decode_program(words.view(np.uint8)) if isinstance(i, Vec)]


def test_a_linear_whose_rows_the_host_writes_heads_a_chain(monkeypatch):
    """Each block's o_proj (its input the host's attention output, its residual the block's
    input) heads the chain of its MLP and the next block's q/k/v: a REQUANT of the Q15.16
    rows the host writes, the GEMM, its DEQUANT and the ADD of the residual rows, before the
    post-attention norm; the member names the input buffer, large enough for the rows, and
    no residual rows: an earlier program left them on chip (the first block's norm input,
    an earlier chain's ADD: test_a_residual_reads_the_rows_an_earlier_chain_left_on_chip).
    (Here the chain runs alone: attention's program is not merged with it, as where the
    merged program does not fit.) Without chaining it stays the host's (alone it would be no
    fewer programs)."""
    lm = tiny_lm()
    opts = CompileOptions(4, 6)
    monkeypatch.setattr(compiler, "attention_chains", lambda *args: [])
    exe = compile_model(lm, VSMALL, opts, weights=compressed(lm))
    heads = [p for p in exe.programs if p.parts
             and exe.programs[p.parts[0]].node.endswith("self_attn.o_proj")]
    assert len(heads) == 2 * lm.config.num_hidden_layers   # every block's, in each phase
    assert {p.phase for p in heads} == {"prefill", "decode"}
    for p in heads:
        (m,) = exe.programs[p.parts[0]].members
        assert m.requant and m.residual is None and m.dequant
        assert exe.symbols[m.requant].nbytes >= m.tokens * m.requant_row_bytes >= 4 * m.k
        funcs = _vec_funcs(p.words)
        rows = [VecFunc.REQUANT] * m.tokens + [VecFunc.DEQUANT] * m.tokens \
            + [VecFunc.ADD] * m.tokens + [VecFunc.RMSNORM] * m.tokens
        assert funcs[:len(rows)] == rows
        others = [q for i in p.parts[1:] for q in exe.programs[i].members]
        assert not any(q.requant or q.residual for q in others)
    plain = compile_model(lm, VSMALL, dataclasses.replace(opts, chain_programs=False),
                          weights=compressed(lm))
    assert not any(m.requant for p in plain.programs for m in p.members)
    assert not any(p.node.endswith("o_proj") for p in plain.programs if p.parts)


def _merged(exe, phase: str = "decode") -> list:
    """The ``phase`` programs of ``exe`` that hold attention and the chain after it."""
    return [p for p in exe.programs if p.parts and p.imm_rows and len(p.parts) > 3
            and p.phase == phase]


def test_attention_and_the_chain_after_it_are_one_decode_program():
    """In a decode step each block's attention program (per context bucket) and the chain
    its o_proj heads are one: the values members' DEQUANTs write their rows, in member
    order, as o_proj's input row, which its REQUANT reads on chip (the member names no
    ``requant``), and its residual rows are on chip too (no ``residual``). Each chain node
    has a program per bucket, a part of that bucket's program. In a prefill too, with a
    DEQUANT per query head writing its column range of o_proj's input rows
    (test_a_prefill_writes_the_values_rows_as_o_projs_input_rows), so each step runs a
    program per block and one more. The tokens, across buckets, equal the twin's."""
    lm = tiny_lm(layers=2, heads=4, kv_heads=2)
    ws = compressed(lm)
    cfg = VSMALL.replace(memory=MemoryModel(size_bytes=1 << 22))
    exe = compile_model(lm, cfg, CompileOptions(6, 40, one_program=False), weights=ws)
    merged = _merged(exe)
    buckets = {p.bucket for p in merged}
    assert len(merged) == 2 * len(buckets) and len(buckets) > 2 and \
        {p.phase for p in merged} == {"decode"}
    for p in merged:
        layer = int(p.node.split(".")[1])
        parts = [exe.programs[i] for i in p.parts]
        assert [q.node for q in parts[:4]] == [f"layers.{layer}.self_attn.{n}" for n in
                                               ("scores", "softmax", "values", "o_proj")]
        (m,) = parts[3].members
        assert m.requant is None and m.residual is None and m.dequant
        at = exe.symbols[f"h:decode:{parts[3].node}"].addr
        for v in parts[2].members:   # the values' rows, in order: o_proj's input row
            assert exe.symbols[v.dequant].addr == at and v.dequant_row_bytes == 4 * v.n
            at += v.tokens * v.dequant_row_bytes
        assert at == exe.symbols[f"h:decode:{parts[3].node}"].addr + 4 * m.k
        for i in p.parts:   # each part is its node's program for the bucket's contexts
            assert exe.program_index("decode", exe.programs[i].node, p.bucket) == i
            assert exe.programs[i].fused_into == exe.programs.index(p)
        funcs = _vec_funcs(p.words)
        assert VecFunc.SOFTMAX in funcs and funcs.index(VecFunc.ADD) > funcs.index(
            VecFunc.SOFTMAX)
    prefill = _merged(exe, "prefill")
    assert len(prefill) == lm.config.num_hidden_layers
    assert exe.report["phases"]["prefill"]["programs_per_step"] == 1 + 2
    ids = torch.randint(0, lm.config.vocab_size, (1, 20),
                        generator=torch.Generator().manual_seed(3))
    rt = Runtime(exe, make_backend("model", cfg), vector=True)
    got = [rt.step(ids[:, :6])] + [rt.step(ids[:, t:t + 1]) for t in range(6, 20)]
    assert len({exe.programs[r.program].bucket for _, st in got[1:] for r in st.programs
                if exe.programs[r.program].imm_rows}) > 1   # crossed a bucket
    assert all(len(st.programs) == 1 + 2 for _, st in got)
    want = twin_step_logits(use_hardware_numerics(copy.deepcopy(lm), ws, vector=True,
                                                  attention=True), ids, 6)
    for (logits, _), w in zip(got, want, strict=True):
        assert torch.equal(logits, w)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_a_prefill_writes_the_values_rows_as_o_projs_input_rows(kv_heads):
    """In a prefill the values members' rows are a head's tokens (their DEQUANTs keep them:
    the host reads them back) and o_proj's input rows a token's heads: a DEQUANT per query
    head writes its rows of the accumulators and FOLD ``amax`` words (``part_of``) into its
    column range of every token's row (``row_bytes`` o_proj's row), which o_proj's REQUANT
    reads on chip. After the step, the last block's o_proj input rows in DRAM are the
    values' rows, word for word, token-major."""
    lm = tiny_lm(layers=2, heads=4, kv_heads=kv_heads)
    cfg = VSMALL.replace(memory=MemoryModel(size_bytes=1 << 22))
    tokens = 6
    exe = compile_model(lm, cfg, CompileOptions(tokens, 8), weights=compressed(lm))
    merged = _merged(exe, "prefill")
    assert len(merged) == lm.config.num_hidden_layers
    heads, d = lm.config.num_attention_heads, lm.config.head_dim
    for p in merged:
        funcs = _vec_funcs(p.words)
        soft = funcs.index(VecFunc.SOFTMAX)
        fold = len(funcs) - funcs[::-1].index(VecFunc.FOLD)   # past the last FOLD
        # the values' DEQUANTs, then one per query head again, then o_proj's REQUANT
        assert funcs[fold:fold + 2 * heads * tokens + tokens] == [VecFunc.DEQUANT] * (
            2 * heads * tokens) + [VecFunc.REQUANT] * tokens and soft < fold
    rt = Runtime(exe, make_backend("model", cfg), vector=True)
    ids = torch.randint(0, lm.config.vocab_size, (1, tokens),
                        generator=torch.Generator().manual_seed(kv_heads))
    rt.step(ids)
    last = merged[-1]
    values, o_proj = (exe.programs[i] for i in last.parts[2:4])
    assert o_proj.node.endswith("o_proj") and values.node.endswith("values")
    rows = np.concatenate([rt._read_rows(m.dequant, m.tokens, m.dequant_row_bytes, d)
                           for m in values.members])           # [H * T, d], head-major
    at = exe.symbols[f"h:prefill:{o_proj.node}"].addr
    pitch = -(-4 * heads * d // cfg.beat_bytes) * cfg.beat_bytes
    got = rt.dram[at:at + tokens * pitch].view("<i4").reshape(tokens, -1)[:, :heads * d]
    want = rows.reshape(heads, tokens, d).transpose(1, 0, 2).reshape(tokens, heads * d)
    assert np.array_equal(got, want)


def test_a_bucket_whose_merged_program_does_not_fit_runs_attention_and_chain_apart(
        monkeypatch):
    """Where a bucket's merged program does not fit the instruction memory (here: any
    longer than the shortest merged one), that bucket runs its attention program and the
    chain's own program, the other buckets the merged one (each chain node's program found
    per context); the tokens, across buckets, equal the twin's."""
    lm = tiny_lm(layers=2, heads=4, kv_heads=2)
    ws = compressed(lm)
    cfg = VSMALL.replace(memory=MemoryModel(size_bytes=1 << 22))
    opts = CompileOptions(6, 40, one_program=False)  # the merges alone
    # the programs as fuse_parts gives them (no moves inserted after: sw/compile/onchip.py)
    monkeypatch.setattr(compiler, "_with_moves", lambda cfg, p: p)
    shortest = min(p.instructions for p in _merged(compile_model(lm, cfg, opts, weights=ws)))
    real = compiler.fuse_parts

    def tight(cfg, parts, *args, **kw):
        words, places = real(cfg, parts, *args, **kw)
        funcs = {f for w in parts for f in _vec_funcs(w)}
        if {VecFunc.SOFTMAX, VecFunc.ADD} <= funcs and words.shape[0] > shortest:
            raise LoweringError("longer than the shortest merged program")
        return words, places
    monkeypatch.setattr(compiler, "fuse_parts", tight)
    exe = compile_model(lm, cfg, opts, weights=ws)
    merged = _merged(exe)
    assert merged and all(p.instructions == shortest for p in merged)
    alone = [p for p in exe.programs if p.parts and p.phase == "decode"
             and exe.programs[p.parts[0]].node.endswith("o_proj")]
    assert len(alone) == 2   # each layer's chain, for the buckets it does not merge in
    ids = torch.randint(0, lm.config.vocab_size, (1, 20),
                        generator=torch.Generator().manual_seed(5))
    rt = Runtime(exe, make_backend("model", cfg), vector=True)
    got = [rt.step(ids[:, :6])] + [rt.step(ids[:, t:t + 1]) for t in range(6, 20)]
    counts = {len(st.programs) for _, st in got[1:]}
    assert max(counts) == 1 + 2 * 2 and min(counts) < max(counts)
    want = twin_step_logits(use_hardware_numerics(copy.deepcopy(lm), ws, vector=True,
                                                  attention=True), ids, 6)
    for (logits, _), w in zip(got, want, strict=True):
        assert torch.equal(logits, w)


def _partitioned(monkeypatch, lm, cfg, opts) -> tuple:
    """``compile_model``'s executable of ``lm`` and what its ``_partition`` returned (work,
    buffers, kv layout, fused groups)."""
    seen = []
    real = compiler._partition

    def spy(*args, **kw):
        out = real(*args, **kw)
        seen.append(out)
        return out
    monkeypatch.setattr(compiler, "_partition", spy)
    return compile_model(lm, cfg, opts, weights=compressed(lm)), seen[0]


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_a_residual_reads_the_rows_an_earlier_chain_left_on_chip(monkeypatch, phase):
    """A residual linear heading a chain (each block's o_proj) reads its residual rows (the
    block's input) where an earlier chain of the step left them: the first block's in the
    first chain's norm input (the embedding's rows, written once), a later block's in the
    ADD results of the chain before (the previous block's down_proj + residual). Same rows,
    length and row layout; the buffer lives until the chain's ADD has read it, no program
    writes it in between, and the member names no rows for the host to write."""
    lm = tiny_lm(layers=3)
    exe, (work, buffers, _, groups) = _partitioned(monkeypatch, lm, VSMALL,
                                                   CompileOptions(4, 6))
    live = {b.name: b for b in buffers[phase]}
    chains = sorted((g for g in groups.values() if work[g.entries[0]][0] == phase
                     and work[g.entries[0]][1].op != "attn_scores"), key=lambda g: g.entries[0])
    heads = [(k, g) for k, g in enumerate(chains)
             if work[g.entries[0]][1].name.endswith("self_attn.o_proj")]
    assert len(heads) == lm.config.num_hidden_layers
    for layer, (k, g) in enumerate(heads):
        node = work[g.entries[0]][1]
        add = next(p for p in g.parts if isinstance(p, VectorOp) and p.func == VecFunc.ADD)
        assert add.b == g.residual
        before = chains[k - 1]
        if layer == 0:   # the embedding's rows, as the first norm reads them
            norm = before.parts[0]
            assert work[before.entries[0]][1].name == "layers.0.input_layernorm"
            assert work[before.entries[0]][1].inputs == (node.inputs[1],)
            assert g.residual == norm.x and norm.row_bytes == add.row_bytes
            assert (norm.rows, norm.length) == (add.rows, add.length)
        else:            # the previous chain's ADD of the residual stream
            (made,) = [p for p in before.parts if isinstance(p, type(add))
                       and p.func == VecFunc.ADD and p.y == g.residual]
            assert (made.rows, made.length, made.row_bytes) == \
                (add.rows, add.length, add.row_bytes)
        assert g.residual in compiler.rows_left(before)
        writers = [p for c in chains[k:] for p in c.parts if getattr(p, "y", None) ==
                   g.residual]
        assert not writers   # no later program writes them
        assert live[g.residual].end >= live[add.y].end   # live through the ADD
    for p in exe.programs:
        assert all(m.residual is None for m in p.members)


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_consecutive_fused_programs_may_share_arena_bytes(monkeypatch, phase):
    """A fused program's own buffers live from the host stage before its first node to the
    one after its last: those no later program reads are dead before the next fused program
    (its attention merges included) starts, so the planner may give their bytes to it (but
    the last node's own results, which live a stage on as every node's do); the ones a later
    program reads (residual rows, the rope's rows) live on."""
    lm = tiny_lm(layers=3)
    _, (work, buffers, _, groups) = _partitioned(monkeypatch, lm, VSMALL,
                                                 CompileOptions(4, 6, one_program=False))
    live = {b.name: b for b in buffers[phase]}
    chains = sorted((g for g in groups.values() if work[g.entries[0]][0] == phase
                     and work[g.entries[0]][1].op != "attn_scores"), key=lambda g: g.entries[0])

    def names(g) -> set[str]:
        return {n for x in (g, *g.attention) for n, _ in part_buffers(VSMALL, x.parts)}
    assert len(chains) == 1 + lm.config.num_hidden_layers
    for k in range(len(chains) - 1):
        mine, later = names(chains[k]), set().union(*map(names, chains[k + 1:]))
        nxt = min(live[n].start for n in names(chains[k + 1]) - mine)
        last = {n for m in work[chains[k].entries[-1]][3] for n, _, _ in m.buffers()}
        dead = mine - later - last
        assert dead and all(live[n].end < nxt for n in dead)
        assert all(live[n].end >= nxt for n in mine & later)


def _written_rows(monkeypatch, rt: Runtime) -> list[str]:
    """The symbols ``rt`` writes rows into, in order (appended as it runs)."""
    out = []
    real = rt._write_rows

    def spy(symbol, rows, row_bytes):
        out.append(symbol)
        return real(symbol, rows, row_bytes)
    monkeypatch.setattr(rt, "_write_rows", spy)
    return out


def test_the_host_writes_a_decode_steps_residual_rows_only_where_no_program_left_them(
        monkeypatch):
    """Per decode step the host writes no Q15.16 rows: not the embedding (the first norm's
    input, read from the embedding table on chip) nor residual rows: each o_proj's ADD reads
    them where a program of the step left them; in neither phase does it write query rows
    (REQUANT parts do). Where no program left them (here: the compiler told that no group's
    rows stay on chip), the host writes every residual but the embedding into the buffer the
    ADD reads, and its I/O costs more cycles. The tokens equal the twin's both ways."""
    lm = tiny_lm(layers=3)
    ws = compressed(lm)
    opts = CompileOptions(4, 10)
    ids = torch.randint(0, lm.config.vocab_size, (1, 10),
                        generator=torch.Generator().manual_seed(7))
    want = twin_step_logits(use_hardware_numerics(copy.deepcopy(lm), ws, vector=True,
                                                  attention=True), ids, 4)

    def run(exe):
        rt = Runtime(exe, make_backend("model", VSMALL), vector=True)
        written = _written_rows(monkeypatch, rt)
        got = [rt.step(ids[:, :4])]
        assert not [s for s in written if ".scores" in s]   # no query rows, no amax words
        steps = []
        for t in range(4, 10):
            del written[:]
            got.append(rt.step(ids[:, t:t + 1]))
            steps.append(list(written))
        for (logits, _), w in zip(got, want, strict=True):
            assert torch.equal(logits, w)
        io = sum(h.unit_cycles for _, st in got[1:] for h in st.host if h.op.endswith(":io"))
        return steps, io

    steps, io = run(compile_model(lm, VSMALL, opts, weights=ws))
    assert all(w == [] for w in steps), steps
    embedding = "x:decode:layers.0.input_layernorm"
    monkeypatch.setattr(compiler, "rows_left", lambda g: set())
    exe = compile_model(lm, VSMALL, opts, weights=ws)
    host = [m.residual for p in exe.programs if p.phase == "decode" and p.fused_into is not None
            for m in p.members if m.residual]
    assert {s.split(":")[0] for s in host} == {"x", "r"}   # the buffers the ADDs read
    steps_all, io_all = run(exe)
    assert all(embedding not in w and set(host) - {embedding} <= set(w) and w
               for w in steps_all)
    assert io_all > io


@pytest.mark.parametrize("seed", range(2))
def test_an_overlapped_attention_chain_computes_what_a_drained_one_does(monkeypatch, seed):
    """The merged decode program's parts (attention, then the chain from o_proj on),
    overlapped and drained, on the fast model from one random DRAM image: the same DRAM at
    the end, never more cycles."""
    seen = []

    def spy(cfg, parts, *args, **kw):
        seen.append([p.copy() for p in parts])
        return fuse_parts(cfg, parts, *args, **kw)
    monkeypatch.setattr(compiler, "fuse_parts", spy)
    lm = tiny_lm(layers=2, heads=4, kv_heads=2)
    exe = compile_model(lm, VSMALL, CompileOptions(4, 6), weights=compressed(lm))
    assert _merged(exe)
    merged = [parts for parts in seen
              if {VecFunc.SOFTMAX, VecFunc.ADD} <= {f for w in parts for f in _vec_funcs(w)}]
    assert merged
    _overlapped_runs_as_drained(merged, seed)


def test_only_an_unbiased_compressed_linear_of_no_bucket_is_a_requant_head(monkeypatch):
    """:func:`linear_group` refuses a linear with a bias (its rows are the host's), a
    member without row scales and a node of a context bucket (attention's); the others get
    a REQUANT of ``host`` rows writing the members' INT8 rows and a DEQUANT per member."""
    lm = tiny_lm(model_type="qwen2", qkv_bias=True)
    work = _decode_work(monkeypatch, lm)
    kinds = {}
    for i, (_, node, _, members) in enumerate(work):
        g = linear_group(VSMALL, work, i)
        kinds[node.name.split(".")[-1]] = g is not None
        if g is None:
            continue
        req, gemm, *deq = g.parts
        assert isinstance(req, RequantOp) and req.host and req.amax and req.y == members[0].x
        assert gemm == tuple(members) and g.owners == (None, 0) + (None,) * len(deq)
        assert [d.x for d in deq] == [m.y for m in members]
        assert all(isinstance(d, DequantOp) for d in deq)
    assert kinds["o_proj"] and kinds["gate_proj+1"] and kinds["down_proj"]
    assert not kinds["q_proj+2"]   # biased
    assert not kinds["scores"] and not kinds["values"] and not kinds["norm"]
    i = next(i for i, w in enumerate(work) if w[1].name.endswith("o_proj"))
    members = work[i][3]
    nosource = [dataclasses.replace(m, source=None) for m in members]
    assert linear_group(VSMALL, [(*work[i][:3], nosource)], 0) is None


def test_a_requant_head_joins_a_chain_that_holds_its_rows(monkeypatch):
    """A linear whose input another vector node's part left on chip (here the q/k/v after a
    norm read by another vector node first, so no pair) joins the chain: its REQUANT reads
    the norm's results there, and the host writes nothing for it."""
    work = _decode_work(monkeypatch, tiny_lm())
    i = next(i for i, w in enumerate(work) if w[1].op == "rmsnorm")
    phase, norm, _, (vec,) = work[i]
    other = norm.with_(name="other", inputs=norm.outputs, outputs=("other",))
    mine = [work[i], (phase, other, None, [dataclasses.replace(vec, x="x:o", y="y:o")]),
            work[i + 1]]
    assert work[i + 1][1].inputs == norm.outputs
    (g,) = fusion_groups(VSMALL, mine)
    assert g.entries == (0, 1, 2) and g.residual is None
    req = g.parts[2]
    assert isinstance(req, RequantOp) and not req.host and req.x == vec.y
    assert g.parts[1].x == vec.y    # the other vector node reads them on chip too


def test_drained_loads_take_only_vin_rows_the_part_before_has_settled():
    """A part that loads, reads and stores rows r1 (VIN beats 0-3), proves them done with a
    SYNC on its LOAD engine (its STORE's signal, which waited on the VEC's), then loads,
    reads and stores rows r2 (beats 8-11) unproven: the next part's LOAD of r1's DRAM into
    beats 0-3 may go before the boundary (:func:`fusion.drained_loads`), its LOAD into beats
    8-11 and its LOAD of r2's DRAM may not; and :func:`fusion.settled` says which words are
    complete once the LOAD engine passed them all."""
    from hw.engines import engines_fields
    from hw.isa import MOVE_SPAD, Engine, Spad, Store, Sync, Vec, VecFunc
    from sw.compile.fusion import _settled, drained_loads, settled
    from sw.compile.onchip import _matches

    full, done, stored = 0, 4, 6
    cfg = VSMALL
    per = cfg.beat_bytes // cfg.vin_word_bytes
    r1, r2, r3 = 1000, 2000, 3000

    def row(vin: int, dram: int, signal: int | None = full) -> Load:
        return Load(spad=Spad.VIN, spad_addr=vin, dram_addr=dram, rows=1, row_beats=4,
                    dram_stride=4, signal=signal)

    def vec(vin: int) -> Vec:
        return Vec(func=VecFunc.REQUANT, a_addr=vin * per, b_addr=0, dst_addr=0,
                   length=4 * per, wait=full, signal=done)

    def store(dram: int) -> Store:
        return Store(spad=Spad.VOUT, spad_addr=0, dram_addr=dram, rows=1, row_beats=4,
                     dram_stride=4, wait=done, signal=stored)
    before = program_words([row(0, r1), vec(0), store(r1), Sync(engine=Engine.LOAD, wait=stored),
                            row(8, r3), vec(8), store(r2)])
    assert settled(before) == {Engine.LOAD.value: 0, Engine.COMPUTE.value: -1,
                               Engine.STORE.value: 2, Engine.VECTOR.value: 1}
    # loads_ahead's settled of each prefix, from the whole program's decode and matches
    f = decode_fields(before)
    eng, match = engines_fields(f), _matches(f)
    assert all(_settled(eng[:p], np.where(match[:p] < p, match[:p], -1)) == settled(before[:p])
               for p in range(before.shape[0] + 1))
    part = program_words([row(0, r1, None), row(8, r3, None), row(16, r2, None),
                          row(24, r3, None), Sync(engine=Engine.LOAD, wait=stored),
                          row(32, r3, None)])
    assert drained_loads(cfg, before, part, []) == [0, 3]
    assert drained_loads(cfg, before, part, [3]) == [0]
    # an unproven move into VIN of the part before: nothing goes (one DMA write port)
    moved = np.concatenate([before, program_words([Store(
        spad=MOVE_SPAD, spad_addr=0, dram_addr=64, rows=1, row_beats=4, dram_stride=4)])])
    assert drained_loads(cfg, moved, part, []) == []
