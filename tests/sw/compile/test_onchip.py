"""Round trips VOUT -> DRAM -> VIN as moves (sw/compile/onchip.py): the rewritten programs
compute what the fused ones do, and a compiled decode step keeps its norm rows on chip."""

import numpy as np
import pytest
import torch
from compile_testutil import VSMALL, VTINY, compressed, tiny_lm, vin_row_bytes

from hw.config import preset
from hw.isa import (
    MOVE_SPAD,
    Engine,
    Load,
    Spad,
    Store,
    Sync,
    Vec,
    VecFunc,
    decode_program,
    program_words,
)
from hw.numerics import norm_eps, norm_weight, to_fixed
from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model, compiler
from sw.compile.fusion import fuse_parts, fuse_words, vector_events
from sw.compile.onchip import MOVE_EVENT, onchip_moves, round_trips
from sw.compile.relocation import lower_vector_template, relocate

CFG = VTINY


def _program(words):
    return decode_program(words.astype("<u8").view(np.uint8).reshape(-1))


_row_bytes = vin_row_bytes


def _part(func: VecFunc, rows: int, length: int, x: str, y: str, b: str | None,
          base: dict) -> np.ndarray:
    class _Part:
        w_tile_stride = None
    _Part.x, _Part.y = x, y
    _Part.b, _Part.w = (b, None) if func == VecFunc.ADD else (None, "w")
    t = lower_vector_template(CFG, func, rows, length, second=func == VecFunc.ADD,
                              const=func != VecFunc.ADD,
                              imm=0 if func == VecFunc.ADD else norm_eps(1e-5, length))
    return vector_events(relocate(t, base, [_Part], CFG.beat_bytes))


def _dram(rng, base: dict, rows: int, length: int) -> np.ndarray:
    dram = np.zeros(CFG.memory.size_bytes, np.uint8)
    values = to_fixed(rng.standard_normal((4 * rows, _row_bytes(length) // 4)))
    dram[:values.size * 4] = values.astype("<i4").view(np.uint8).reshape(-1)
    w = norm_weight(rng.standard_normal(length), length)
    dram[base["w"]:base["w"] + 4 * length] = w.astype("<i4").view(np.uint8)
    return dram


@pytest.mark.parametrize("seed", range(4))
def test_a_norm_read_by_the_next_part_moves_and_computes_the_same(seed):
    """RMSNorm of r0 into r1, then an ADD of r1 and r2 (one task): the ADD's LOAD of r1
    becomes a move after the norm's STORE (which stays: DRAM holds the norm's rows) that
    waits for the LOAD of r2 to land, the LOAD a SYNC, and the program computes the same
    DRAM as without, on the fast model, in fewer DRAM beats."""
    rng = np.random.default_rng(seed)
    length = int(rng.integers(8, 60))
    row = _row_bytes(length)
    base = {f"r{i}": i * row for i in range(4)} | {"w": 4 * row}
    parts = [_part(VecFunc.RMSNORM, 1, length, "r0", "r1", None, base),
             _part(VecFunc.ADD, 1, length, "r1", "r3", "r2", base)]
    words, places = fuse_parts(CFG, parts)
    pairs = round_trips(words)
    assert len(pairs) == 1
    moved, where = onchip_moves(CFG, words)
    got, before = _program(moved), _program(words)
    s, x, t = pairs[0]
    assert isinstance(before[s], Store) and before[s].spad == Spad.VOUT
    assert isinstance(before[t], Load) and before[t].dram_addr == base["r1"] // CFG.beat_bytes
    move = got[where[s] + 1]
    assert isinstance(move, Store) and move.spad == MOVE_SPAD and move.wait == MOVE_EVENT
    assert move.signal == before[s].signal and got[where[s]].signal is None
    # the ADD's LOAD of r2, hoisted above the boundary, may still write VIN: a SYNC after
    # it raises the event the move waits on
    assert isinstance(before[x], Load) and before[x].dram_addr == base["r2"] // CFG.beat_bytes
    assert got[where[x] + 1] == Sync(engine=Engine.LOAD, signal=MOVE_EVENT)
    assert got[where[t]] == Sync(engine=Engine.LOAD, wait=before[t].wait,
                                 signal=before[t].signal)
    assert moved.shape[0] == words.shape[0] + 2
    dram = _dram(rng, base, 1, length)
    runs = [make_backend("model", CFG).run(w, dram.copy()) for w in (words, moved)]
    assert all(r.ok for r in runs), [r.error for r in runs]
    assert np.array_equal(runs[0].dram, runs[1].dram)
    assert runs[1].counters["dram_read_beats"] == (runs[0].counters["dram_read_beats"]
                                                   - before[t].rows * before[t].row_beats)


def test_a_load_the_store_does_not_cover_or_a_vec_between_stays():
    """No pair where the next part reads other rows than the STORE wrote, or where a VEC
    lies between the STORE and the LOAD (it may still read the VIN beats a move would
    overwrite)."""
    length, row = 16, _row_bytes(16)
    base = {f"r{i}": i * row for i in range(4)} | {"w": 4 * row}
    norm = _part(VecFunc.RMSNORM, 1, length, "r0", "r1", None, base)
    assert round_trips(fuse_words(CFG, [norm, _part(VecFunc.ADD, 1, length, "r0", "r3", "r2",
                                                    base)])) == []
    words = fuse_words(CFG, [norm, _part(VecFunc.ADD, 1, length, "r1", "r3", "r2", base)])
    ((s, _, _),) = round_trips(words)
    ins = _program(words)
    spliced = program_words([*ins[:s + 1], Vec(func=VecFunc.ADD, length=length),
                             *ins[s + 1:]])
    assert round_trips(spliced) == []


@pytest.mark.parametrize("seed", range(8))
def test_random_vector_chains_with_moves_compute_what_drained_ones_do(seed):
    """Random chains of RMSNorm and ADD parts (1 to 12 rows) over a few row buffers, each
    reading and writing random ones: overlapped with moves, the same DRAM at the end as
    drained on the fast model (which applies every effect at its completion, so a move that
    overwrote VIN beats still read, or read VOUT beats already overwritten, would show)."""
    rng = np.random.default_rng(seed)
    length = int(rng.integers(8, 64))
    row = _row_bytes(length)
    rows_max = 12
    bufs = [f"r{i}" for i in range(4)]
    base = {name: i * rows_max * row for i, name in enumerate(bufs)}
    base["w"] = len(bufs) * rows_max * row
    parts = []
    for _ in range(int(rng.integers(2, 6))):
        x, b, y = (str(v) for v in rng.permutation(bufs)[:3])
        func = VecFunc.ADD if rng.integers(2) else VecFunc.RMSNORM
        parts.append(_part(func, int(rng.integers(1, rows_max + 1)), length, x, y, b, base))
    dram = _dram(rng, base, rows_max, length)
    moved = onchip_moves(CFG, fuse_words(CFG, parts))[0]
    runs = [make_backend("model", CFG).run(w, dram.copy())
            for w in (fuse_words(CFG, parts, False), moved)]
    assert all(r.ok for r in runs), [r.error for r in runs]
    assert np.array_equal(runs[0].dram, runs[1].dram)


def test_every_fused_program_of_a_tiny_model_with_moves_computes_the_same(monkeypatch):
    """Every fused program of a compiled tiny model (prefill and decode), drained and with
    its round trips as moves, on the fast model from one random DRAM image: the same DRAM at
    the end; and some program has a move."""
    seen = []

    def spy(cfg, parts, *args, **kw):
        seen.append([p.copy() for p in parts])
        return fuse_parts(cfg, parts, *args, **kw)
    monkeypatch.setattr(compiler, "fuse_parts", spy)
    lm = tiny_lm()
    compile_model(lm, VSMALL, CompileOptions(4, 6), weights=compressed(lm))
    rng = np.random.default_rng(0)
    model = make_backend("model", VSMALL)
    moves = 0
    for parts in seen:
        words = fuse_words(VSMALL, parts)
        moved = onchip_moves(VSMALL, words)[0]
        moves += moved.shape[0] - words.shape[0]
        dram = rng.integers(0, 256, VSMALL.memory.size_bytes, dtype=np.uint8)
        runs = [model.run(w, dram.copy()) for w in (fuse_words(VSMALL, parts, False), moved)]
        assert all(r.ok for r in runs), [r.error for r in runs]
        assert np.array_equal(runs[0].dram, runs[1].dram)
    assert moves


def test_a_decode_step_moves_its_norm_rows_and_keeps_the_tokens(monkeypatch):
    """The reference model's decode step, compiled as one program: each block's input norm
    rows reach the REQUANT after it by a move (no LOAD into VIN reads the STORE's rows), and
    its logits equal those of the same step compiled without moves (bit for bit), in fewer
    DRAM beats."""
    from sw.compress.model import selected_linears
    from sw.models.recipes import recipe_for
    from sw.models.source import open_model
    from sw.runtime import Runtime

    cfg = preset("vector")
    lm = open_model("reference").model
    formats = recipe_for("reference").formats(selected_linears(lm))
    opts = CompileOptions(prompt_tokens=7, max_context=8, decode_contexts=(8,),
                          phases=("decode",))
    steps = []
    for moves in (True, False):
        if not moves:
            monkeypatch.setattr(compiler, "onchip_moves",
                                lambda cfg, words, keep=(): (words, tuple(range(len(words)))))
        exe = compile_model(lm, cfg, opts, formats=formats)
        rt = Runtime(exe, make_backend("model", cfg), vector=True)
        rt.seek(7)
        logits, stats = rt.step(torch.tensor([[3]]))
        steps.append((exe, logits, stats))
    (exe, logits, stats), (plain_exe, plain, plain_stats) = steps
    assert torch.equal(logits, plain)
    beats = [sum(r.counters["dram_read_beats"] for r in s.programs) for s in (stats,
                                                                               plain_stats)]
    assert beats[0] < beats[1]

    def round_trips_of_norms(e) -> set[int]:
        """The DRAM beats of a block's input norm rows that a program STOREs from VOUT and
        LOADs back into VIN."""
        norms = {e.symbols[n].addr // cfg.beat_bytes for n in e.symbols
                 if n.startswith("y:decode:") and n.endswith("input_layernorm")}
        out = set()
        for p in e.programs:
            ins = _program(p.words)
            read = {i.dram_addr for i in ins if isinstance(i, Load) and i.spad == Spad.VIN}
            out |= read & norms & {i.dram_addr for i in ins
                                   if isinstance(i, Store) and i.spad == Spad.VOUT}
        return out
    assert round_trips_of_norms(plain_exe) and not round_trips_of_norms(exe)
    assert any(isinstance(i, Store) and i.spad == MOVE_SPAD
               for p in exe.programs for i in _program(p.words))
