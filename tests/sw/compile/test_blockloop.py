"""One REPEAT over a joined decode step's decoder blocks (sw.compile.blockloop): random
block programs roll into a loop the fetch unit expands back to exactly the unrolled program
(hw.isa.loop_stream), with the run-time rows moved into the body; the frame plan chains each
block's symbols to the next block's and copies constants every block reads alike; a model's
rolled decode step computes the same logits in the same cycles as the unrolled join."""

import dataclasses

import numpy as np
import pytest
import torch
from compile_testutil import VSMALL, backends_agree, compressed, tiny_lm

from hw.config import AcceleratorConfig
from hw.isa import (
    End,
    Engine,
    Load,
    RegTerm,
    Repeat,
    Spad,
    Store,
    Sync,
    Vec,
    VecFunc,
    decode,
    decode_fields,
    dispatch_errors,
    loop_instruction,
    loop_stream,
    program_words,
)
from sim.backends import make_backend
from sim.model import FastModel
from sw.compile import CompileOptions, compile_model
from sw.compile.blockloop import (
    block_period,
    block_strides,
    copy_name,
    copy_row,
    frame_plan,
    frame_symbols,
    instructions,
    roll_blocks,
)
from sw.compile.executable import EMBEDDING_TABLE
from sw.compile.plan import Region
from sw.runtime import Runtime

CFG = AcceleratorConfig()


def _dispatched(words: np.ndarray) -> list:
    """The instructions the fetch unit dispatches from ``words`` (REPEATs expanded, not
    listed)."""
    f = decode_fields(words)
    s = loop_stream(f, dispatch_errors(f, CFG))
    ins = [decode(int(w[0]) | (int(w[1]) << 64)) for w in words.tolist()]
    return [loop_instruction(ins[p], int(o)) for p, o in zip(s.pcs, s.offsets, strict=True)
            if not isinstance(ins[p], Repeat)]


def _random_blocks(rng, blocks: int, stride: int, shared_at: int | None = None):
    """``(program, body length, prologue length)``: a prologue, ``blocks`` blocks of the
    same random instructions whose DMAs advance by ``stride`` beats per block (a LOAD at
    ``shared_at`` the same in every block, if given), an epilogue and END."""
    def filler(n):
        return [Vec(func=VecFunc.ADD, length=int(rng.integers(1, 16))) if rng.random() < 0.5
                else Sync(engine=Engine.LOAD) for _ in range(n)]
    length = int(rng.integers(3, 24))
    body = []
    for _ in range(length):
        r = rng.random()
        addr = int(rng.integers(0, 4 * stride))
        if r < 0.3:
            body.append(Load(spad=Spad.WGT, dram_addr=addr, rows=int(rng.integers(1, 4))))
        elif r < 0.55:
            body.append(Load(spad=Spad.ACT, dram_addr=addr))
        elif r < 0.8:
            body.append(Store(dram_addr=addr))
        else:
            body += filler(1)
    body = body[:length]
    if shared_at is not None:  # and a LOAD that gives its class's stride, mostly
        body[0] = Load(spad=Spad.ACT, dram_addr=1) if rng.random() < 0.75 else body[0]
        body[int(rng.integers(1, length))] = Load(spad=Spad.ACT, dram_addr=shared_at)
    edge = Sync(engine=Engine.STORE)  # no block instruction: the blocks start where they do
    pro, epi = [edge] * int(rng.integers(1, 5)), [edge] * int(rng.integers(0, 5))
    prog = list(pro)
    for m in range(blocks):
        prog += [i.__class__(**{**i.__dict__, "dram_addr": i.dram_addr + m * stride})
                 if isinstance(i, (Load, Store)) and i.dram_addr != shared_at else i
                 for i in body]
    return prog + epi + [End()], length, len(pro)


@pytest.mark.parametrize("seed", range(8))
def test_rolled_blocks_dispatch_the_unrolled_program(seed):
    """The rolled program is the prologue, one REPEAT and block 0, the epilogue (after
    ``first``, where given); the fetch unit dispatches the unrolled program's instructions
    with their addresses; run-time rows of every block name block 0's word, once each
    (append rows: once per block)."""
    rng = np.random.default_rng(seed)
    blocks, stride = int(rng.integers(2, 7)), int(rng.integers(1, 1 << 20))
    prog, length, start = _random_blocks(rng, blocks, stride)
    assert block_period(prog, blocks) == (start, length)
    words = program_words(prog)
    rows = [start + m * length + j for m in range(blocks) for j in range(length)
            if isinstance(prog[start + j], Load)]
    first = copy_row(int(rng.integers(0, 1 << 20)), int(rng.integers(0, 1 << 20)),
                     int(rng.integers(1, 64)), CFG.beat_bytes) if seed % 2 else []
    out = roll_blocks(words, blocks, position_rows=rows, imm_rows=rows,
                      append_rows=[(r, "k", "dram_addr", (r - start) // length) for r in rows],
                      first=first)
    assert out is not None
    rolled = instructions(out["words"])
    assert rolled[:len(first)] == first
    rolled = rolled[len(first):]
    assert len(rolled) == len(prog) - (blocks - 1) * length + 1
    assert rolled[start] == out["repeat"] == Repeat(
        length=length, count=blocks, wgt_stride=stride if any(
            isinstance(i, Load) and i.spad == Spad.WGT for i in prog[start:start + length])
        else 0, load_stride=stride if any(isinstance(i, Load) and i.spad != Spad.WGT
                                          for i in prog[start:start + length]) else 0,
        store_stride=stride if any(isinstance(i, Store) for i in prog[start:start + length])
        else 0)
    assert _dispatched(out["words"]) == first + prog
    body = [len(first) + start + 1 + j for j in range(length)
            if isinstance(prog[start + j], Load)]
    assert list(out["position_rows"]) == list(out["imm_rows"]) == body
    assert [r[0] for r in out["append_rows"]] == body * blocks
    assert [r[3] for r in out["append_rows"]] == [r[3] for r in
                                                  [(0, 0, 0, (x - start) // length)
                                                   for x in rows]]


@pytest.mark.parametrize("seed", range(4))
def test_a_shared_constant_advances_to_its_copies(seed):
    """A LOAD every block issues at one address in a ``shared`` range takes its class's
    stride in the loop (the next frame's copy); outside such a range it has none and the
    blocks do not roll."""
    rng = np.random.default_rng(100 + seed)
    blocks, stride = int(rng.integers(2, 6)), int(rng.integers(16, 1 << 16))
    shared_at = 10 * stride
    prog, length, start = _random_blocks(rng, blocks, stride, shared_at)
    words = program_words(prog)
    assert block_strides(prog, start, length, blocks) is None
    got = block_strides(prog, start, length, blocks, [(shared_at, shared_at + 1)])
    if not any(isinstance(i, Load) and i.spad != Spad.WGT and i.dram_addr != shared_at
               for i in prog[start:start + length]):  # no other LOAD gives the stride
        assert got is None
        return
    assert got["load_stride"] == stride
    out = roll_blocks(words, blocks, shared=[(shared_at, shared_at + 1)])
    want = [Load(spad=Spad.ACT, dram_addr=i.dram_addr + (j // length) * stride)
            if isinstance(i, Load) and i.dram_addr == shared_at else i
            for j, i in enumerate(prog[start:start + blocks * length])]
    assert _dispatched(out["words"])[start:start + blocks * length] == want


@pytest.mark.parametrize("seed", range(4))
def test_copy_row_copies_a_row_before_any_later_load(seed):
    """copy_row's instructions copy a random row bit for bit through VIN and VOUT, and the
    LOADs after them read the copy: a second copy of the copy gives the row again (without
    the SYNC the second LOAD reads the old bytes), nothing else in DRAM changes, and the
    events end at 0 (the run neither deadlocks nor overflows)."""
    rng = np.random.default_rng(200 + seed)
    beat = VSMALL.beat_bytes
    beats = int(rng.integers(1, min(VSMALL.vin_spad_bytes, VSMALL.vout_spad_bytes) // beat + 1))
    src = int(rng.integers(0, 64))
    dst = src + beats + int(rng.integers(0, 64))
    third = dst + beats + int(rng.integers(0, 64))
    dram = np.random.default_rng(seed).integers(0, 256, 1 << 16, dtype=np.uint8)
    cfg = VSMALL.with_dram(dram.size)
    prog = copy_row(src, dst, beats, beat) + copy_row(dst, third, beats, beat)
    assert prog[0] == Load(spad=Spad.VIN, dram_addr=src, rows=1, row_beats=beats,
                           dram_stride=beats, signal=prog[1].wait)
    run = FastModel(cfg).run(program_words(prog + [End()]), dram)
    assert run.ok
    want = dram.copy()
    row = dram[src * beat:(src + beats) * beat]
    want[dst * beat:(dst + beats) * beat] = row
    want[third * beat:(third + beats) * beat] = row
    assert np.array_equal(run.dram, want)
    early = FastModel(cfg).run(program_words(prog[:3] + prog[4:] + [End()]), dram)
    assert not np.array_equal(early.dram[third * beat:(third + beats) * beat], row)
    with pytest.raises(ValueError, match="at least 1 beat, got 0"):
        copy_row(0, 1, 0, beat)


def test_blocks_that_do_not_repeat_do_not_roll():
    """A DMA whose address advances differently from its class's other DMAs, or blocks
    that differ in another field, give no loop."""
    a = [Load(spad=Spad.WGT, dram_addr=8 * m) for m in range(3)]
    b = [Load(spad=Spad.WGT, dram_addr=5 * m) for m in range(3)]
    prog = [x for pair in zip(a, b, strict=True) for x in pair] + [End()]
    assert block_period(prog, 3) == (0, 2)
    assert roll_blocks(program_words(prog), 3) is None
    prog = [Load(dram_addr=0), Load(dram_addr=1, rows=2), End()]
    assert block_period(prog, 2) is None
    with pytest.raises(ValueError, match="at least 2 blocks, got 1"):
        block_period(prog, 1)


def test_frame_plan_chains_block_symbols_and_copies_constants():
    """Each block's symbols lie in its own frame at block 0's offsets; what block m writes
    for block m + 1 (its output rows, read as the next block's input) lies in frame m + 1's
    slot of the input; a constant every block reads gets a copy per frame; an activation
    buffer every block addresses alike gives no plan."""
    beat, blocks = 16, 3
    sizes = {"w": 4096, "in": 64, "k": 512, "rope": 256, "tmp": 32}
    symbols, addr = {}, 0
    for name, size in [("rope", 256), ("tmp", 32), ("in:0", 64)] + [
            (f"{s}:{m}", sizes[s]) for m in range(blocks) for s in ("w", "k")] + [
            (f"in:{m + 1}", 64) for m in range(blocks)]:
        kind = "weight" if name[0] in "wr" else "arena"
        symbols[name] = Region(addr, size := size, kind)
        addr += -(-size // beat) * beat

    def at(name, off=0):
        return (symbols[name].addr + off) // beat
    prog = []
    for m in range(blocks):
        prog += [Load(dram_addr=at(f"in:{m}")), Load(spad=Spad.WGT, dram_addr=at(f"w:{m}", 32)),
                 Load(dram_addr=at("rope")), Load(spad=Spad.WGT, dram_addr=at(f"k:{m}")),
                 Store(dram_addr=at(f"k:{m}", 16)), Store(dram_addr=at(f"in:{m + 1}"))]
    prog.append(End())
    words = program_words(prog)
    const = {n: r.kind == "weight" for n, r in symbols.items()}
    plan = frame_plan(words, symbols, blocks, beat, const)
    assert plan is not None and plan.frames == blocks + 1
    # the last frame ends with its one symbol, the next block's input rows
    assert plan.total_bytes == blocks * plan.frame_bytes + plan.slots["in:0"][1] + 64
    assert plan.copies == {copy_name("rope", m): "rope" for m in (1, 2)}
    framed = frame_symbols(symbols, plan, 1 << 20)
    for m in range(blocks):
        for s in ("w", "k", "in"):
            assert framed[f"{s}:{m}"].addr - framed[f"{s}:0"].addr == m * plan.frame_bytes
        assert framed[copy_name("rope", m) if m else "rope"].addr == \
            framed["rope"].addr + m * plan.frame_bytes
    assert framed[f"in:{blocks}"].addr == framed["in:0"].addr + blocks * plan.frame_bytes
    assert framed["tmp"] == symbols["tmp"]  # no block addresses it: it stays
    # lowered again with the framed symbols, the blocks roll with one stride
    moved = [i.__class__(**{**i.__dict__, "dram_addr": i.dram_addr
                            + (framed[n].addr - symbols[n].addr) // beat})
             if isinstance(i, (Load, Store)) else i
             for i, n in zip(prog, [n for m in range(blocks) for n in (
                 f"in:{m}", f"w:{m}", "rope", f"k:{m}", f"k:{m}", f"in:{m + 1}")] + [None],
                 strict=True)]
    shared = [(framed["rope"].addr // beat, framed["rope"].end // beat)]
    out = roll_blocks(program_words(moved), blocks, shared=shared)
    assert out is not None and out["repeat"].wgt_stride == plan.frame_bytes // beat == \
        out["repeat"].load_stride == out["repeat"].store_stride
    # an arena buffer every block uses alike cannot be copied
    prog[2::6] = [Load(dram_addr=at("tmp"))] * blocks
    assert frame_plan(program_words(prog), symbols, blocks, beat, const) is None


def _steps(exe, lm, prompt=6, steps=4, seed=3):
    ids = torch.randint(0, lm.config.vocab_size, (1, prompt + steps),
                        generator=torch.Generator().manual_seed(seed))
    rt = Runtime(exe, make_backend("model", exe.cfg), vector=True)
    return [rt.step(ids[:, :prompt])] + [rt.step(ids[:, p:p + 1])
                                         for p in range(prompt, prompt + steps)]


@pytest.mark.parametrize("layers", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_a_rolled_decode_step_computes_the_unrolled_joins_logits(layers, monkeypatch):
    """On the fast model, the decode step whose blocks are one REPEAT gives the unrolled
    join's logits bit for bit, from about one block's words (every context range's
    program). With the host writing the token's embedding row into frame 0 it takes as many
    cycles as the unrolled join with the same hoisting (each part's LOADs no further than
    its own boundary, ``fuse_parts(spread=False)``, and the constant LOADs placed alike in
    every block, ``compiler._kv_ahead`` with ``blocks``: the loop's REPEAT and loop-backs
    are fetch work the dispatch of the body hides, hw/timing.py "Fetch"); copying the row
    from the table first (``copy_row``, the host writing nothing) takes more, at most the
    cycles of the copy alone. Those three without their quiet STOREs (a STORE quiet in the
    unrolled join's last block only is not in the loop's body, which every block runs);
    with them the rolled step (REPEATs expanded: ``onchip.quiet_stores``) has some, gives
    the same logits and takes fewer cycles."""
    from sw.compile import compiler
    lm = tiny_lm(layers=layers, heads=4, kv_heads=2)
    ws = compressed(lm)
    opts = CompileOptions(6, 40, block_loop=True)  # the step fits unrolled too
    quiet = compile_model(lm, VSMALL, opts, weights=ws)
    monkeypatch.setattr(compiler, "quiet_stores", lambda *a, **k: [])
    exe = compile_model(lm, VSMALL, opts, weights=ws)
    monkeypatch.setattr(compiler, "_copies_row", lambda *a: False)
    written = compile_model(lm, VSMALL, opts, weights=ws)
    lower, join = compiler._lower, compiler._join_step
    monkeypatch.setattr(compiler, "_lower", lambda *a, **k: lower(*a[:-1], False, **k))
    monkeypatch.setattr(compiler, "_join_step", lambda *a, spread, **k: join(
        *a, spread=False, **{**k, "blocks": layers}))
    flat = compile_model(lm, VSMALL, CompileOptions(6, 40, block_loop=False), weights=ws)
    monkeypatch.undo()
    rep = exe.report["block_loop"]
    assert rep["looped_programs"] == exe.report["phases"]["decode"]["joined_programs"] == 3
    assert rep["frames"] == layers + 1
    # the frames hold what the blocks address in place of where it was
    assert flat.report["dram"]["total"] < exe.report["dram"]["total"] < \
        flat.report["dram"]["total"] + rep["frames"] * rep["frame_bytes"]
    joined = [p for p in exe.programs if p.phase == "decode" and p.fused_into is None]
    flat_joined = [p for p in flat.programs if p.phase == "decode" and p.fused_into is None]
    (served,) = Runtime(exe, make_backend("model", VSMALL), vector=True)._served
    served = exe.symbols[served]
    beat = VSMALL.beat_bytes
    copy = copy_row(served.addr // beat, served.addr // beat, served.nbytes // beat, beat)
    for p, q in zip(joined, flat_joined, strict=True):
        assert p.instructions < q.instructions / layers + q.instructions / 4
        assert len(p.position_rows) == 2 and len(p.imm_rows) == lm.config.num_attention_heads
        assert sorted({r[3] for r in p.append_rows}) == list(range(layers))
        head = instructions(p.words)[:len(copy)]
        assert head[1:] == copy[1:] and p.embed_rows == (0,)
        # the copy's LOAD reads the table's row tok (the run-time register), not the buffer
        tok = exe.registers.index((RegTerm("tok", mul=copy[0].dram_stride),)) + 1
        assert head[0] == dataclasses.replace(copy[0], reg=tok,
                                              dram_addr=exe.symbols[EMBEDDING_TABLE].addr // beat)
    assert not any(p.embed_rows for p in written.programs if p.fused_into is None)
    alone = FastModel(VSMALL).run(program_words(copy + [End()]), timing_only=True).cycles
    assert all(p.quiet_rows for p in quiet.programs if p.phase == "decode"
               and p.fused_into is None)
    for (a, sa), (b, sb), (c, sc), (d, sd) in zip(
            _steps(exe, lm), _steps(written, lm), _steps(flat, lm), _steps(quiet, lm),
            strict=True):
        assert torch.equal(a, c) and torch.equal(b, c) and torch.equal(d, c)
        assert sd.cycles < sa.cycles if sa.phase == "decode" else sd.cycles == sa.cycles
        assert sb.cycles == sc.cycles and len(sa.programs) == len(sb.programs) == \
            len(sc.programs)
        if sa.phase == "decode":
            assert sa.written_bytes == 0 < sb.written_bytes
            assert sb.cycles < sa.cycles <= sb.cycles + alone
        else:
            assert sa.cycles == sb.cycles


def test_a_step_too_long_unrolled_runs_as_one_program_rolled():
    """A joined step longer than the instruction memory but whose rolled blocks fit runs as
    one program per decode step; without the block loop it keeps its fused programs."""
    lm = tiny_lm(layers=2, heads=4, kv_heads=2)
    ws = compressed(lm)
    cfg = VSMALL.replace(imem_depth=512)
    opts = CompileOptions(6, 10)
    exe = compile_model(lm, cfg, opts, weights=ws)
    rep = exe.report["phases"]["decode"]
    assert rep["programs_per_step"] == 1 and exe.report["block_loop"]["looped_programs"] == 1
    flat = compile_model(lm, cfg, CompileOptions(6, 10, block_loop=False), weights=ws)
    assert flat.report["phases"]["decode"]["programs_per_step"] == 3
    assert "block_loop" not in flat.report
    for (a, sa), (b, sb) in zip(_steps(exe, lm), _steps(flat, lm), strict=True):
        assert torch.equal(a, b)
        if sa.phase == "decode":
            assert len(sa.programs) == 1 < len(sb.programs)


@pytest.mark.rtl
@pytest.mark.slow
def test_rtl_runs_the_block_loop_as_the_fast_model():
    """A decode step whose two blocks are one REPEAT (after the copy of the token's
    embedding row) gives the same logits on the RTL as on the fast model (the equivalence
    harness's vector configuration)."""
    from sim.random_programs import EQUIVALENCE_CONFIGS
    cfg = EQUIVALENCE_CONFIGS["4x4"].with_dram(1 << 17)  # room for the frames
    lm = tiny_lm(layers=2, heads=2, kv_heads=1, hidden=32, vocab=32)
    ws = compressed(lm, "2:4", 32)
    exe = compile_model(lm, cfg, CompileOptions(6, 8, block_loop=True), weights=ws)
    assert exe.report["block_loop"]["looped_programs"] >= 1
    assert [p.embed_rows for p in exe.programs if p.embed_rows and p.parts] == [(0,)]
    ids = torch.randint(0, lm.config.vocab_size, (1, 8),
                        generator=torch.Generator().manual_seed(5))
    backends_agree(exe, cfg, ids, 6)
