"""Rows several STOREs of VOUT write and one LOAD reads back into VIN, as moves
(sw/compile/onchip.py, :func:`vout_moves`): a DEQUANT's column segments reach the vector
part after it on the STORE engine (hw.isa.MOVE_SPAD), the step computes the
same logits in fewer DRAM beats, and a rewrite the words cannot prove safe is left alone."""

import copy

import numpy as np
import pytest
import torch
from compile_testutil import (
    VSMALL,
    compressed,
    reference_decode_steps,
    runtime_steps,
    tiny_lm,
    twin_step_logits,
)

from hw.isa import MOVE_SPAD, Load, Spad, Store, Vec, VecFunc, decode_program, program_words
from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model, compiler, fusion
from sw.compile.onchip import vout_moves, vout_round_trips
from sw.compress.model import use_hardware_numerics
from sw.runtime import Runtime


def _program(words):
    return decode_program(words.astype("<u8").view(np.uint8).reshape(-1))


def _split_round_trips(words: np.ndarray) -> list[tuple[int, int]]:
    """``(beats, STOREs)`` per LOAD into VIN whose beats several STOREs of VOUT last wrote."""
    writer: dict[int, int] = {}
    out = []
    for i, ins in enumerate(_program(words)):
        if not isinstance(ins, (Load, Store)) or isinstance(ins, Store) and \
                ins.spad not in (Spad.OUT, Spad.VOUT):
            continue
        rows = [ins.dram_addr + r * ins.dram_stride + c for r in range(ins.rows)
                for c in range(ins.row_beats)]
        if isinstance(ins, Store):
            writer.update(dict.fromkeys(rows, i if ins.spad == Spad.VOUT else -1))
        elif ins.spad == Spad.VIN:
            w = {writer.get(b) for b in rows}
            if len(w) > 1 and None not in w and -1 not in w:
                out.append((len(rows), len(w)))
    return out


@pytest.fixture(scope="module")
def steps():
    """The reference model's decode step (context 8, real weights) compiled with and without
    the moves of rows several STOREs of VOUT write, run on the fast model."""
    with pytest.MonkeyPatch.context() as mp:
        cfg, _, out = reference_decode_steps(
            mp, compiler, "vout_moves",
            lambda cfg, words, keep=(): (words, tuple(range(len(words)))))
    return cfg, out


def test_a_decode_step_moves_dequant_segments_and_keeps_the_logits(steps):
    """The step's LOADs of rows a DEQUANT's segments wrote (the query's ROPE, the REQUANT
    before o_proj, the residual ADDs, the SiLU-gate) become moves from VOUT: the logits
    equal the step's without them bit for bit, its DRAM reads drop by the beats moved (and
    so do the round trips of such rows), in fewer cycles, and only the amax pairs stay."""
    cfg, ((exe, logits, stats), (plain_exe, plain, plain_stats)) = steps
    assert torch.equal(logits, plain) and logits.abs().max() > 0
    moved = sum(m.rows * m.row_beats for p in exe.programs for m in _program(p.words)
                if isinstance(m, Store) and m.spad == MOVE_SPAD) - sum(
        m.rows * m.row_beats for p in plain_exe.programs for m in _program(p.words)
        if isinstance(m, Store) and m.spad == MOVE_SPAD)
    reads = [sum(r.counters["dram_read_beats"] for r in s.programs)
             for s in (stats, plain_stats)]
    trips = [[t for p in e.programs for t in _split_round_trips(p.words)]
             for e in (exe, plain_exe)]
    assert moved > 0
    assert reads[1] - reads[0] == sum(b for b, _ in trips[1]) - sum(b for b, _ in trips[0]) \
        == moved
    assert stats.cycles < plain_stats.cycles
    # the gate and up rows (688 wide: 172 beats, the only ones over 100) move: the SiLU-gate
    # part in a gap of the DEQUANT segments' VIN (fusion._vin_gap), each segment's move
    # behind the GEMM's STOREs of OUT before the next segment's LOADs (_vout_flight)
    assert not [b for b, _ in trips[0] if b > 100]
    assert len([b for b, _ in trips[1] if b > 100]) == 2 * 4   # two per block


def test_a_vec_that_may_read_the_moved_beats_keeps_the_load(steps):
    """Rule 3 of :func:`vout_round_trips`: a VEC that may still run when a move writes VIN
    (no wait, between the STORE and the LOAD) and reads its VIN beats keeps the round trip
    through DRAM; one reading other beats does not."""
    cfg, (_, (plain_exe, _, _)) = steps
    words = next(p.words for p in plain_exe.programs
                 if p.words.shape[0] > 500 and vout_round_trips(cfg, p.words)[1])
    (t, group), *_ = vout_round_trips(cfg, words)[1]
    s, _, mv = group[-1]
    per = cfg.beat_bytes // cfg.vin_word_bytes
    ins = list(_program(words))
    last = cfg.spad_beats("vin") - 1   # VIN's last beat, outside the move's
    spare = (cfg.spad_beats("vout") - 1) * (cfg.beat_bytes // cfg.vout_word_bytes)
    assert not mv.dram_addr <= last < mv.dram_addr + mv.rows * mv.row_beats
    for beat, kept in ((mv.dram_addr, True), (last, False)):
        vec = Vec(func=VecFunc.ADD, a_addr=beat * per, b_addr=beat * per, dst_addr=spare,
                  length=per)
        probe = program_words(ins[:t] + [vec] + ins[t:])
        found = [u for u, _ in vout_round_trips(cfg, probe)[1]]
        assert (t + 1 not in found) == kept, (beat, found)


def test_vout_moves_is_the_identity_without_round_trips(steps):
    """Words with no such round trip come back unchanged, with the identity map."""
    cfg, ((exe, _, _), _) = steps
    words = exe.programs[0].words
    assert not vout_round_trips(cfg, words)[1]
    got, where = vout_moves(cfg, words)
    assert got is words and where == tuple(range(words.shape[0]))


@pytest.mark.parametrize("vin", [4096, pytest.param(2048, marks=pytest.mark.slow)])
def test_the_silu_gate_segments_rows_move_into_the_requant_before_down_proj(monkeypatch, vin):
    """The SiLU-gate cut into column segments beside the up GEMM (each a part:
    fusion.silu_segments, SILU_SEGMENT_MARGIN 0 on a tiny model) writes its row with a STORE
    of VOUT per segment, which the REQUANT before down_proj reads back into VIN. Placed clear
    of every segment's VIN beats (fusion._vin_clear), not only the last one's, each
    segment's move is provably safe (onchip.vout_round_trips) and the round trip goes:
    without it the step keeps a LOAD of the row from its segments' STOREs (36 beats, three
    STOREs) per block. The logits equal the vector twin's bit for bit, the DRAM reads drop by
    the beats moved, in fewer cycles. With 4,096 bytes of VIN there is room for the row
    beside every beat the segments' parts load; with 2,048 only beside those loaded from the
    first segment's STORE on (as on SmolLM2: fusion._vin_used_from)."""
    monkeypatch.setattr(fusion, "SILU_SEGMENT_MARGIN", 0)
    cfg = VSMALL.replace(vin_spad_bytes=vin)
    lm = tiny_lm(hidden=96)                     # 144 wide: three segments
    ws = compressed(lm, "2:4", 32)
    ids = torch.randint(0, lm.config.vocab_size, (1, 8),
                        generator=torch.Generator().manual_seed(5))
    twin = twin_step_logits(use_hardware_numerics(copy.deepcopy(lm), ws, vector=True), ids, 6)
    runs = []
    for clear in (True, False):
        if not clear:
            monkeypatch.setattr(fusion, "_vin_clear", lambda cfg, placed, words: None)
        exe = compile_model(lm, cfg, CompileOptions(6, 8), weights=ws)
        steps = runtime_steps(Runtime(exe, make_backend("model", cfg), vector=True), ids, 6)
        for (logits, _), want in zip(steps, twin, strict=True):
            assert torch.equal(logits, want)
        trips = [t for p in exe.programs if p.phase == "decode"
                 for t in _split_round_trips(p.words)]
        runs.append((trips, steps[-1][1]))
    (trips, stats), (plain_trips, plain) = runs
    silu = (36, 3)   # the SiLU-gate's row: 144 words in 36 beats, from three segments
    assert silu not in trips and plain_trips.count(silu) == lm.config.num_hidden_layers
    reads = [sum(r.counters["dram_read_beats"] for r in s.programs) for s in (stats, plain)]
    assert reads[1] - reads[0] == sum(b for b, _ in plain_trips) - sum(b for b, _ in trips)
    assert stats.cycles < plain.cycles


def test_the_consumer_goes_clear_of_the_beats_used_after_its_rows_first_store():
    """fusion._vin_clear: where the parts writing a vector part's rows from VOUT leave no
    VIN gap clear of every beat they load (here 16 beats between a constant loaded before
    any of the rows is stored and the segments' beats), the part goes into the lowest gap
    clear of the beats loaded (or read by a VEC) from the first STORE of its rows on; a
    part already clear of those stays where it is (None, as with no writers)."""
    cfg = VSMALL   # 128 VIN beats
    vin, vout = Spad.VIN, Spad.VOUT

    def seg(k, pre=()):   # a segment: its operand into VIN 80..88, then 8 beats of the row
        return program_words([*pre, Load(spad=vin, spad_addr=80, dram_addr=2000 + 8 * k,
                                          row_beats=8),
                              Vec(func=VecFunc.ADD, a_addr=80 * 4, b_addr=80 * 4, length=32),
                              Store(spad=vout, dram_addr=500 + 8 * k, row_beats=8)])
    # the first part loads 80 + 24 constant beats before its first STORE of the row
    pre = (Load(spad=vin, spad_addr=0, dram_addr=1000, row_beats=80),
           Load(spad=vin, spad_addr=104, dram_addr=1100, row_beats=24))
    placed = [np.concatenate([seg(0, pre), seg(1)]), seg(2)]
    consumer = program_words([Load(spad=vin, spad_addr=80, dram_addr=500, row_beats=24)])
    assert fusion._vin_gap(cfg, np.concatenate(placed), consumer) is None   # no room
    got = fusion._vin_clear(cfg, placed, consumer)
    assert got is not None
    (ld,) = _program(got)
    assert ld == Load(spad=vin, spad_addr=0, dram_addr=500, row_beats=24)
    # a VEC after the first STORE reading beats 0..24 (loaded before it) takes them too
    late = program_words([Vec(func=VecFunc.ADD, a_addr=0, b_addr=0, length=96)])
    got = fusion._vin_clear(cfg, [placed[0], np.concatenate([late, placed[1]])], consumer)
    assert got is not None and _program(got)[0].spad_addr == 24
    stays = program_words([Load(spad=vin, spad_addr=40, dram_addr=500, row_beats=24)])
    assert fusion._vin_clear(cfg, placed, stays) is None
