"""Round trips VOUT -> DRAM -> VIN as moves (sw/compile/onchip.py): the rewritten programs
compute what the fused ones do, and a compiled decode step keeps its norm rows on chip; the
STOREs of rows only a move carries on and nobody reads go (quiet_stores), and the DRAM rows
anything reads stay what they were."""

import numpy as np
import pytest
import torch
from compile_testutil import (
    VSMALL,
    VTINY,
    compressed,
    reference_decode_steps,
    tiny_lm,
    vin_row_bytes,
)

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
from sw.compile.onchip import MOVE_EVENT, onchip_moves, quiet_stores, quieten, round_trips
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


def _dram(rng, base: dict, rows: int, length: int, buffers: int = 4) -> np.ndarray:
    dram = np.zeros(CFG.memory.size_bytes, np.uint8)
    values = to_fixed(rng.standard_normal((buffers * rows, _row_bytes(length) // 4)))
    dram[:values.size * 4] = values.astype("<i4").view(np.uint8).reshape(-1)
    w = norm_weight(rng.standard_normal(length), length)
    dram[base["w"]:base["w"] + 4 * length] = w.astype("<i4").view(np.uint8)
    return dram


def _random_chain(rng, buffers: int, parts_max: int) -> tuple[list[np.ndarray], np.ndarray]:
    """A random chain of RMSNorm and ADD parts (1 to 12 rows, 2 to ``parts_max`` parts) over
    ``buffers`` row buffers, each part reading and writing random ones, and the DRAM holding
    its operands."""
    length = int(rng.integers(8, 64))
    rows_max = 12
    bufs = [f"r{i}" for i in range(buffers)]
    base = {name: i * rows_max * _row_bytes(length) for i, name in enumerate(bufs)}
    base["w"] = len(bufs) * rows_max * _row_bytes(length)
    parts = []
    for _ in range(int(rng.integers(2, parts_max + 1))):
        x, b, y = (str(v) for v in rng.permutation(bufs)[:3])
        func = VecFunc.ADD if rng.integers(2) else VecFunc.RMSNORM
        parts.append(_part(func, int(rng.integers(1, rows_max + 1)), length, x, y, b, base))
    return parts, _dram(rng, base, rows_max, length, buffers)


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
    parts, dram = _random_chain(np.random.default_rng(seed), 4, 5)
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
    its logits (real weights: the recipe's format, magnitude-compressed, so they are not
    zeros) equal those of the same step compiled without moves (bit for bit), in fewer
    DRAM beats."""
    cfg, _, steps = reference_decode_steps(
        monkeypatch, compiler, "onchip_moves",
        lambda cfg, words, keep=(): (words, tuple(range(len(words)))))
    (exe, logits, stats), (plain_exe, plain, plain_stats) = steps
    assert torch.equal(logits, plain) and logits.abs().max() > 0
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


def _beats(ins) -> set[int]:
    return {ins.dram_addr + r * ins.dram_stride + k for r in range(ins.rows)
            for k in range(ins.row_beats)}


def test_a_norm_only_the_move_reads_goes_quiet_and_the_rest_stays():
    """RMSNorm of r0 into r1, then an ADD of r1 and r2 into r3: the norm's STORE of r1
    (before its move) is the one quiet STORE; as a SYNC of the STORE engine with its events,
    the program writes r3 as before, r1 not at all, and as many fewer beats. Where the host
    reads r1 (``live``), a later part LOADs r1, or an earlier one reads r1 before the norm
    writes it (the next step's run would read the rows this one left), it stays."""
    length = 24
    row = _row_bytes(length)
    beat = CFG.beat_bytes
    base = {f"r{i}": i * row for i in range(4)} | {"w": 4 * row}
    norm = _part(VecFunc.RMSNORM, 1, length, "r0", "r1", None, base)
    add = _part(VecFunc.ADD, 1, length, "r1", "r3", "r2", base)
    moved = onchip_moves(CFG, fuse_parts(CFG, [norm, add])[0])[0]
    (q,) = quiet_stores(moved)
    ins = _program(moved)
    st = ins[q]
    assert isinstance(st, Store) and st.spad == Spad.VOUT and ins[q + 1].spad == MOVE_SPAD
    assert st.dram_addr == base["r1"] // beat
    quiet = quieten(moved, [q])
    assert _program(quiet)[q] == Sync(engine=Engine.STORE, wait=st.wait, signal=st.signal)
    dram = _dram(np.random.default_rng(1), base, 1, length)
    runs = [make_backend("model", CFG).run(w, dram.copy()) for w in (moved, quiet)]
    assert all(r.ok for r in runs), [r.error for r in runs]
    r1 = slice(base["r1"], base["r1"] + row)
    assert not np.array_equal(runs[0].dram[r1], dram[r1])  # the norm wrote r1 ...
    assert np.array_equal(runs[1].dram[r1], dram[r1])      # ... and, quiet, does not
    rest = np.ones(dram.size, bool)
    rest[r1] = False
    assert np.array_equal(runs[0].dram[rest], runs[1].dram[rest])
    assert runs[1].counters["dram_write_beats"] == (runs[0].counters["dram_write_beats"]
                                                    - st.rows * st.row_beats)
    lo = base["r1"] // beat
    assert quiet_stores(moved, live=[(lo, lo + 1)]) == []
    assert quiet_stores(moved, keep=[q]) == []
    later = _part(VecFunc.ADD, 1, length, "r1", "r2", "r0", base)   # reads r1 again
    assert all(_program(w)[i].dram_addr != lo
               for w in [onchip_moves(CFG, fuse_parts(CFG, [norm, add, later])[0])[0]]
               for i in quiet_stores(w))
    earlier = _part(VecFunc.ADD, 1, length, "r1", "r3", "r2", base)  # reads r1 first
    w = onchip_moves(CFG, fuse_parts(CFG, [earlier, norm, add])[0])[0]
    assert all(_program(w)[i].dram_addr != lo for i in quiet_stores(w))


@pytest.mark.parametrize("seed", range(8))
def test_random_vector_chains_without_their_quiet_stores_write_the_same_rows(seed):
    """Random chains of RMSNorm and ADD parts with moves (as above), their quiet STOREs as
    SYNCs: on the fast model every DRAM byte no quiet STORE addresses is what the chain with
    every STORE leaves (a LOAD that read a quiet STORE's rows would read other values), in
    as many fewer written beats as the quiet STOREs write."""
    parts, dram = _random_chain(np.random.default_rng(seed), 5, 6)
    moved = onchip_moves(CFG, fuse_words(CFG, parts))[0]
    rows = quiet_stores(moved)
    ins = _program(moved)
    runs = [make_backend("model", CFG).run(w, dram.copy()) for w in (moved, quieten(moved, rows))]
    assert all(r.ok for r in runs), [r.error for r in runs]
    rest = np.ones(dram.size, bool)
    for i in rows:
        for b in _beats(ins[i]):
            rest[b * CFG.beat_bytes:(b + 1) * CFG.beat_bytes] = False
    assert np.array_equal(runs[0].dram[rest], runs[1].dram[rest])
    assert runs[0].counters["dram_write_beats"] - runs[1].counters["dram_write_beats"] == sum(
        ins[i].rows * ins[i].row_beats for i in rows)


def test_random_chains_have_quiet_stores():
    """The random chains above do exercise quiet STOREs (some seed has one)."""
    found = sum(len(quiet_stores(onchip_moves(CFG, fuse_words(
        CFG, _random_chain(np.random.default_rng(seed), 5, 6)[0]))[0])) for seed in range(8))
    assert found


def test_a_decode_step_without_its_quiet_stores_keeps_logits_and_every_node(monkeypatch):
    """A tiny model's decode step (one program), compiled with and without its quiet STOREs
    (rows only a move carries on: the norms', the SiLU-gate's, GEMM results'): the same
    logits bit for bit at every step, fewer DRAM beats written (as many as the quiet STOREs
    write) and fewer cycles; with ``read_back_all`` (the STOREs put back) every node's value
    the host reads equals the one without (and they are not all zeros)."""
    from sw.runtime import Runtime

    lm = tiny_lm()
    ws = compressed(lm)
    opts = CompileOptions(4, 8)
    exes = [compile_model(lm, VSMALL, opts, weights=ws)]
    monkeypatch.setattr(compiler, "quiet_stores", lambda *a, **k: [])
    exes.append(compile_model(lm, VSMALL, opts, weights=ws))
    (joined,) = [p for p in exes[0].programs if p.quiet_rows]
    assert not any(p.quiet_rows for p in exes[1].programs)
    quiet = [_program(np.array([[lo, hi]], np.uint64))[0] for _, lo, hi in joined.quiet_rows]
    names = {exes[0].symbols[n].addr // VSMALL.beat_bytes: n for n in exes[0].symbols
             if exes[0].symbols[n].kind == "arena"}
    quieted = {names.get(q.dram_addr, "?") for q in quiet}
    assert any(n.endswith("input_layernorm") for n in quieted), quieted
    assert any(n.endswith("mlp.act") for n in quieted), quieted
    assert any(q.spad == Spad.OUT for q in quiet)   # GEMM results moves from OUT carry on
    seen = _recorded_node_values(monkeypatch)
    prompt = torch.arange(4).reshape(1, 4) % 64
    runs = []
    for exe in exes:
        rt = Runtime(exe, make_backend("model", VSMALL), vector=True)
        full = Runtime(exe, make_backend("model", VSMALL), vector=True, read_back_all=True)
        steps = [rt.step(prompt)]
        full.step(prompt)
        for tok in (5, 9, 17):
            steps.append(rt.step(torch.tensor([[tok]])))
            seen.clear()
            full.step(torch.tensor([[tok]]))
            steps.append(dict(seen))
        runs.append(steps)
    beats = len(quiet) and sum(q.rows * q.row_beats for q in quiet)
    for got, want in zip(runs[0], runs[1], strict=True):
        if isinstance(got, dict):  # read_back_all: every node's values
            assert got.keys() == want.keys() and len(got) > 50
            assert all(torch.equal(got[k], want[k]) for k in got
                       if isinstance(want[k], torch.Tensor))
            assert any(got[k].abs().max() > 0 for k in got if k.endswith("mlp.act"))
            continue
        (logits, stats), (plain, plain_stats) = got, want
        assert torch.equal(logits, plain)
        if stats.phase == "decode":
            written = [sum(r.counters["dram_write_beats"] for r in s.programs)
                       for s in (stats, plain_stats)]
            assert written[1] - written[0] == beats > 0
            assert stats.cycles < plain_stats.cycles


def test_the_segment_stores_behind_their_moves_go_quiet(monkeypatch):
    """The reference model's decode step (real weights), compiled with and without the
    quiet STOREs whose move sits behind other STORE-engine words (:func:`onchip.
    _beside_late_moves`: the gate/up DEQUANT segments', whose moves wait behind the GEMM's
    STOREs of OUT): those STOREs are SYNCs (none right before its move), the logits equal
    bit for bit, fewer DRAM beats written (as many as they write) in fewer cycles, and with
    ``read_back_all`` (the STOREs put back) every node's value the host reads equals the
    one without (the gate and up rows not all zeros)."""
    from sw.compile import onchip
    from sw.runtime import Runtime

    cfg, lm, steps = reference_decode_steps(monkeypatch, onchip, "_beside_late_moves",
                                            lambda *a, **k: [])
    (exe, logits, stats), (plain_exe, plain, plain_stats) = steps
    assert torch.equal(logits, plain) and logits.abs().max() > 0
    (joined,) = [p for p in exe.programs if p.quiet_rows]
    (plain_joined,) = [p for p in plain_exe.programs if p.quiet_rows]
    had = {i for i, *_ in plain_joined.quiet_rows}
    assert had < {i for i, *_ in joined.quiet_rows}
    late = [(i, _program(np.array([[lo, hi]], np.uint64))[0]) for i, lo, hi
            in joined.quiet_rows if i not in had]
    words = _program(joined.words)
    assert all(q.spad == Spad.VOUT and not (isinstance(words[i + 1], Store)
                                            and words[i + 1].spad == MOVE_SPAD)
               for i, q in late)
    arena = [(r.addr // cfg.beat_bytes, r.end // cfg.beat_bytes, n)
             for n, r in exe.symbols.items() if r.kind == "arena"]
    owners = {min((hi - lo, n) for lo, hi, n in arena if lo <= q.dram_addr < hi)[1]
              for _, q in late}   # the innermost region (the arena holds them all)
    assert any("mlp.gate_proj" in n for n in owners), owners   # gate/up's segments
    written = [sum(r.counters["dram_write_beats"] for r in s.programs)
               for s in (stats, plain_stats)]
    assert written[1] - written[0] == sum(q.rows * q.row_beats for _, q in late) > 0
    assert stats.cycles < plain_stats.cycles
    seen = _recorded_node_values(monkeypatch)
    values = []
    for e in (exe, plain_exe):
        full = Runtime(e, make_backend("model", cfg), vector=True, read_back_all=True)
        full.seek(7)
        seen.clear()
        full.step(torch.tensor([[3]]))
        values.append(dict(seen))
    got, want = values
    assert got.keys() == want.keys() and len(got) > 50
    assert all(torch.equal(got[k], want[k]) for k in got if isinstance(want[k], torch.Tensor))
    assert any(got[k].abs().max() > 0 for k in got if "gate_proj" in k), sorted(got)


def test_a_decode_step_loads_the_query_while_the_kv_append_drains(monkeypatch):
    """The reference model's decode step (real weights): in every block after the first, the
    LOAD of the rotated query rows into VIN (the scores' REQUANT) follows the KV append's
    STOREs with no LOAD-engine word that waits between them (:func:`fusion.drained_loads`:
    the append has settled those VIN beats), where without it a SYNC on the append's last
    STORE comes first; the logits equal those without it bit for bit, in fewer cycles."""
    from sw.compile import fusion

    cfg, lm, steps = reference_decode_steps(monkeypatch, fusion, "drained_loads",
                                            lambda *a, **k: [])
    (exe, logits, stats), (plain_exe, plain, plain_stats) = steps
    assert torch.equal(logits, plain) and logits.abs().max() > 0
    assert stats.cycles < plain_stats.cycles

    def waits_before_query(e) -> list[bool]:
        """Per block after the first: a LOAD-engine word that waits lies between the last
        STORE before the query rows' LOAD and that LOAD."""
        out = []
        for layer in range(1, lm.config.num_hidden_layers):
            rows = e.symbols[f"y:decode:layers.{layer}.self_attn.q_proj.rope"].addr
            (ins, j), = [(ins, i) for ins in (_program(p.words) for p in e.programs)
                         for i, x in enumerate(ins) if isinstance(x, Load)
                         and x.spad == Spad.VIN and x.dram_addr == rows // cfg.beat_bytes]
            s = max(i for i in range(j) if isinstance(ins[i], Store))
            out.append(any(isinstance(x, (Load, Sync)) and x.wait is not None
                           and (not isinstance(x, Sync) or x.engine == Engine.LOAD)
                           for x in ins[s + 1:j]))
        return out
    assert all(waits_before_query(plain_exe)) and not any(waits_before_query(exe))


def _recorded_node_values(monkeypatch) -> dict:
    """A dict that fills with every node's values as the host reads them back (the runtime's
    ``run_node`` spied on for the test's duration)."""
    from sw.runtime import runtime as runtime_module

    seen: dict = {}
    run_node = runtime_module.run_node

    def spy(node, vals, *args, **kw):
        out = run_node(node, vals, *args, **kw)
        seen.update({o: vals[o] for o in node.outputs})
        return out
    monkeypatch.setattr(runtime_module, "run_node", spy)
    return seen
