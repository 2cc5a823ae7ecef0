"""Round trips OUT -> DRAM -> VIN as moves (sw/compile/onchip.py, :func:`out_moves`): GEMM
results a vector part reads back reach VIN on the STORE engine (hw.isa.OUT_MOVE_SPAD), the
step computes the same logits in fewer DRAM beats, and a rewrite the words cannot prove safe
is left alone."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from compile_testutil import reference_decode_steps

from hw.config import preset
from hw.isa import (
    OUT_MOVE_SPAD,
    Load,
    Spad,
    Store,
    Vec,
    VecFunc,
    decode_program,
    program_words,
)
from sw.compile import CompileOptions, compile_model, compiler
from sw.compile.onchip import OUT_MOVE_EVENT, out_moves, out_round_trips


def _program(words):
    return decode_program(words.astype("<u8").view(np.uint8).reshape(-1))


def _out_round_trip_beats(words: np.ndarray) -> int:
    """DRAM beats LOADs into VIN read whose last writer (program order) is a STORE of OUT."""
    writer: dict[int, Spad] = {}
    beats = 0
    for ins in _program(words):
        if not isinstance(ins, (Load, Store)) or isinstance(ins, Store) and \
                ins.spad not in (Spad.OUT, Spad.VOUT):
            continue
        rows = [ins.dram_addr + r * ins.dram_stride + c for r in range(ins.rows)
                for c in range(ins.row_beats)]
        if isinstance(ins, Store):
            writer.update(dict.fromkeys(rows, ins.spad))
        elif ins.spad == Spad.VIN:
            beats += sum(writer.get(b) == Spad.OUT for b in rows)
    return beats


@pytest.fixture(scope="module")
def steps():
    """The reference model's decode step (context 8, real weights) compiled with and without
    the moves from OUT, run on the fast model: ``(executable, logits, stats)`` each."""
    with pytest.MonkeyPatch.context() as mp:
        cfg, _, out = reference_decode_steps(
            mp, compiler, "out_moves",
            lambda cfg, words, keep=(): (words, tuple(range(len(words)))))
    return cfg, out


def test_a_decode_step_moves_gemm_results_and_keeps_the_logits(steps):
    """The step's LOADs of GEMM results (y rows a DEQUANT reads) that the words prove safe
    become moves from OUT: its logits equal the step's without them bit for bit, its DRAM
    reads drop by the beats moved, and fewer of its VIN LOADs read rows a STORE of OUT
    wrote."""
    cfg, ((exe, logits, stats), (plain_exe, plain, plain_stats)) = steps
    assert torch.equal(logits, plain) and logits.abs().max() > 0
    moved = [i for p in exe.programs for i in _program(p.words)
             if isinstance(i, Store) and i.spad == OUT_MOVE_SPAD]
    assert moved
    beats = [sum(r.counters["dram_read_beats"] for r in s.programs)
             for s in (stats, plain_stats)]
    trips = [sum(_out_round_trip_beats(p.words) for p in e.programs)
             for e in (exe, plain_exe)]
    assert trips[0] < trips[1]
    # every beat a move from OUT carries is a beat some LOAD no longer reads from DRAM
    assert beats[1] - beats[0] == trips[1] - trips[0] == sum(m.rows * m.row_beats
                                                              for m in moved)


def test_a_vec_that_may_read_the_moved_beats_keeps_the_load(steps):
    """Rule 3 of :func:`out_round_trips`: a VEC that may still run when the move writes VIN
    (no wait, between the STORE and the LOAD) and reads its VIN beats keeps the round trip
    through DRAM; one reading other beats does not."""
    cfg, (_, (plain_exe, _, _)) = steps
    words = next(p.words for p in plain_exe.programs if out_round_trips(cfg, p.words))
    (t, group), *_ = out_round_trips(cfg, words)
    s, _, mv = group[0]
    per = cfg.beat_bytes // cfg.vin_word_bytes
    ins = list(_program(words))
    last = cfg.spad_beats("vin") - 1   # VIN's last beat, outside the move's
    assert not mv.dram_addr <= last < mv.dram_addr + mv.rows * mv.row_beats
    for beat, kept in ((mv.dram_addr, True), (last, False)):
        vec = Vec(func=VecFunc.ADD, a_addr=beat * per, b_addr=beat * per, dst_addr=0,
                  length=per)
        probe = program_words(ins[:t] + [vec] + ins[t:])
        found = [u for u, _ in out_round_trips(cfg, probe)]
        assert (t + 1 not in found) == kept, (beat, found)


def test_moves_that_wait_follow_their_syncs():
    """A move from OUT that waits on OUT_MOVE_EVENT comes after the SYNC that signals it in
    program order (the fetch unit dispatches in order: a waiting move ahead of its signal
    would hold the STORE queue), and each SYNC signals it once per waiting move."""
    from sw.compress.model import selected_linears
    from sw.models.recipes import recipe_for
    from sw.models.source import open_model

    cfg = preset("vector")
    lm = open_model("reference").model
    formats = recipe_for("reference").formats(selected_linears(lm))
    opts = CompileOptions(prompt_tokens=127, max_context=128, decode_contexts=(128,),
                          phases=("decode",))
    exe = compile_model(lm, cfg, opts, formats=formats)
    total = 0
    for p in exe.programs:
        signalled = waited = 0   # each program starts with its events at zero
        for i in _program(p.words):
            signalled += i.signal == OUT_MOVE_EVENT
            if isinstance(i, Store) and i.spad == OUT_MOVE_SPAD and i.wait == OUT_MOVE_EVENT:
                waited += 1
                assert signalled >= waited
        total += waited
    assert total


def test_out_moves_is_the_identity_without_round_trips(steps):
    """Words with no round trip of OUT rows come back unchanged, with the identity map."""
    cfg, ((exe, _, _), _) = steps
    words = program_words([replace(i, spad=Spad.ACT) if isinstance(i, Load)
                           and i.spad == Spad.VIN else i for i in _program(exe.programs[0].words)])
    got, where = out_moves(cfg, words)
    assert got is words and where == tuple(range(words.shape[0]))


def test_out_ring_is_the_most_multiples_of_the_slots_out_holds():
    """:func:`sw.compile.schedule.out_ring`: a multiple of the WGT slots (a buffer is free
    when its tile's first weights land), as many as OUT holds, never fewer than the slots."""
    from sw.compile.schedule import out_ring

    cfg = preset("vector")
    out = cfg.spad_beats("out")
    for slots, buf in ((8, 8), (4, 8), (2, out // 2), (8, out // 8), (8, out // 12)):
        ring = out_ring(cfg, slots, buf)
        assert ring % slots == 0 and ring * buf <= out and (ring + slots) * buf > out, (
            slots, buf, ring)
    assert out_ring(cfg, 8, out // 8) == 8


@pytest.fixture(scope="module")
def rings():
    """The reference model's decode step (context 8) compiled as it is and with one OUT
    buffer per WGT slot (the ring before :func:`sw.compile.schedule.out_ring`)."""
    from sw.compile import schedule

    with pytest.MonkeyPatch.context() as mp:
        _, _, out = reference_decode_steps(mp, schedule, "out_ring",
                                           lambda cfg, slots, buf: slots)
    return out


def test_the_out_ring_moves_the_gemm_results_of_a_segment_together(rings):
    """With OUT buffers a multiple of the WGT slots, the tiles a DEQUANT segment reads stay
    in OUT until one move after their last STORE reads them all: the decode step's round
    trips of GEMM results through DRAM fall to under a third of the one-buffer-per-slot
    ring's, the logits stay bit for bit, and the step takes fewer cycles."""
    (exe, logits, stats), (slot_exe, slot_logits, slot_stats) = rings
    assert torch.equal(logits, slot_logits) and logits.abs().max() > 0
    trips = [sum(_out_round_trip_beats(p.words) for p in e.programs)
             for e in (exe, slot_exe)]
    assert 3 * trips[0] < trips[1], trips
    assert stats.cycles < slot_stats.cycles
