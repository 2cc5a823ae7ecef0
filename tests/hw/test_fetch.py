# amaranth: UnusedElaboratable=no
"""Fetch unit: the hardware checks equal hw.isa.dispatch_error, and dispatch follows the
fetch rules of hw/timing.py (a_0 = FETCH_LATENCY, a_i = d_{i-1} + 1, d = first cycle with queue
space)."""

from __future__ import annotations

import random

import pytest
from amaranth import Module, ResetInserter, Signal
from control_testutil import random_dma, random_gemm, run_sim, small_config, wide_config

from hw import timing
from hw.config import AcceleratorConfig
from hw.engines import engine_of, engines_of
from hw.fetch import FetchUnit
from hw.isa import (
    LOAD_SPADS,
    MOVE_SOURCES,
    NO_EVENT,
    NUM_REGS,
    REG_BITS,
    DmaBody,
    End,
    Engine,
    ErrorCode,
    GemmBody,
    Header,
    InstrLayout,
    ISAError,
    Load,
    Spad,
    Store,
    Sync,
    Vec,
    VecBody,
    VecFunc,
    decode,
    dispatch_error,
    encode,
    insert_imm,
    kv4_imm,
    relative_instruction,
    rope_imm,
    vec_out_words,
)
from hw.queues import InstrQueue

_BODY = InstrLayout["body"].offset
_HDR = InstrLayout["header"].offset


def _set(word: int, off: int, width: int, value: int) -> int:
    value &= (1 << width) - 1
    return (word & ~(((1 << width) - 1) << off)) | (value << off)


def _near(rng, limit: int, width: int) -> int:
    """A field value biased towards the boundaries that the checks compare with."""
    return rng.choice([0, 1, max(limit - 1, 0), limit, limit + 1, rng.randrange(1 << width),
                       rng.randrange(max(limit, 1) + 1)]) & ((1 << width) - 1)


def random_word(rng: random.Random, cfg: AcceleratorConfig) -> int:
    """A random 128-bit instruction word with fields near the limits of ``cfg``."""
    word = rng.getrandbits(128)
    word = _set(word, _HDR + Header["opcode"].offset, 3,
                rng.choice([0, 1, 1, 2, 2, 3, 3, 3, 4, 4, 5, 6, 7]))
    for name in ("wait", "signal"):
        word = _set(word, _HDR + Header[name].offset, 5,
                    rng.choice([NO_EVENT, NO_EVENT, 0, cfg.num_events - 1, cfg.num_events,
                                rng.randrange(32)]))
    dma_limits = {"rows": 4, "row_beats": 4, "spad_addr": cfg.spad_beats("param"),
                  "dram_addr": cfg.dram_beats, "dram_stride": cfg.dram_beats // 2,
                  "spad": 5}
    for name, limit in dma_limits.items():
        if rng.random() < 0.7:
            f = DmaBody[name]
            word = _set(word, _BODY + f.offset, f.width, _near(rng, limit, f.width))
    gemm_limits = {"wgt_addr": cfg.spad_beats("wgt"), "act_addr": cfg.spad_beats("act"),
                   "out_addr": cfg.spad_beats("out"), "param_addr": cfg.spad_beats("param"),
                   "act_stride": 4, "k_steps": 2, "group_steps": 2,
                   "tokens_m1": cfg.max_tokens - 1, "pattern": len(cfg.pattern_table)}
    for name, limit in gemm_limits.items():
        if rng.random() < 0.5:
            f = GemmBody[name]
            word = _set(word, _BODY + f.offset, f.width, _near(rng, limit, f.width))
    vin, vout = cfg.vin_spad_bytes // 4, cfg.vout_spad_bytes // 4
    vec_limits = {"func": 4, "a_addr": vin - 8, "b_addr": vin - 8, "dst_addr": vout - 8,
                  "length": 8, "imm": 8}
    for name, limit in vec_limits.items():
        if rng.random() < 0.6:
            f = VecBody[name]
            word = _set(word, _BODY + f.offset, f.width, _near(rng, max(limit, 0), f.width))
    return word


def boundary_words(rng: random.Random, cfg: AcceleratorConfig) -> list[int]:
    """LOADs and STOREs whose scratchpad or DRAM range ends one beat before, at and one beat
    past its limit, in every scratchpad, with DRAM strides wide enough to use both halves of
    the fetch unit's span product."""
    words = []
    # (class, spad, beats on the scratchpad side, beats on the far side): a move (a STORE
    # naming VIN, or OUT_MOVE_SPAD) reads VOUT (OUT) and writes VIN where a STORE writes DRAM.
    kinds = [(Load if spad in LOAD_SPADS else Store, spad, cfg.spad_beats(spad.name.lower()),
              cfg.dram_beats) for spad in Spad]
    kinds += [(Store, k, cfg.spad_beats(v.name.lower()), cfg.spad_beats("vin"))
              for k, v in MOVE_SOURCES.items()]
    for cls, spad, beats, far in kinds:
        for _ in range(3 if beats and far else 0):   # (no VIN, VOUT without a vector engine)
            rows = rng.randint(1, 4)
            row_beats = rng.randint(1, max(1, beats // rows))
            stride = rng.choice([rng.randrange(1 << 17), rng.randrange(row_beats + 1),
                                 cfg.dram_beats // max(rows - 1, 1)])
            span = (rows - 1) * stride + row_beats
            spad_inside = rng.randrange(rows * row_beats, beats + 1)
            dram_inside = rng.randrange(span, max(span, far) + 1)
            for delta in (-1, 0, 1):
                # one range at its limit + delta, the other anywhere inside
                for s_end, d_end in ((beats + delta, dram_inside),
                                     (spad_inside, far + delta)):
                    if s_end < rows * row_beats or d_end < span:
                        continue
                    words.append(encode(cls(spad=spad, rows=rows, row_beats=row_beats,
                                            spad_addr=s_end - rows * row_beats,
                                            dram_addr=d_end - span, dram_stride=stride)))
    return words


def rope_words(rng: random.Random, cfg: AcceleratorConfig) -> list[int]:
    """ROPE VECs on and around each of its rules: whole heads or a row one or two elements
    off, head_dim odd or 0, heads 0 or from 2**15 up (past the fetch unit's product), and the
    table ending one word before, at and one word past VIN's end."""
    vin, vout = cfg.vin_spad_bytes // 4, cfg.vout_spad_bytes // 4
    words = []
    for _ in range(40):
        head_dim = rng.choice([2, 4, 6, 8, 10, 64] * 3 + [1, 3, 0])
        heads = rng.choice([1, 2, 3, 5] * 3 + [0, 1 << 15, (1 << 15) + 1, (1 << 24) - 1])
        length = (heads * head_dim + rng.choice([0] * 6 + [-2, -1, 1, 2])) & 0xFFFF
        if heads >= 1 << 15:
            length = rng.choice([length, rng.randrange(1 << 16)])
        half = head_dim // 2
        b_addr = rng.choice([vin - half - 1, vin - half, vin - half + 1]
                            + [rng.randrange(max(vin - half, 1))] * 3) & 0xFFFF
        a_addr = rng.randrange(max(vin - length, 0) + 1)
        dst_addr = rng.randrange(max(vout - length, 0) + 1)
        words.append(encode(Vec(func=VecFunc.ROPE, a_addr=a_addr, b_addr=b_addr,
                                dst_addr=dst_addr, length=length,
                                imm=rope_imm(head_dim, heads))))
    return words


def insert_words(rng: random.Random, cfg: AcceleratorConfig) -> list[int]:
    """INSERT VECs on and around its rules: every stride from 0 to 5 and large ones, at
    stride 1 base, group and skip on and off multiples of 4 (imm's raw fields, random)."""
    vin, vout = cfg.vin_spad_bytes // 4, cfg.vout_spad_bytes // 4
    words = []
    for _ in range(40):
        length = rng.randrange(1, vout + 1)
        stride = rng.choice([0, 1, 1, 1, 2, 3, 4, 5, 255])
        base = rng.choice([0, 4, 8, 1, 2, 3, rng.randrange(1024)])
        group = rng.choice([4, 8, 32, 1, 2, 3, 6, rng.randrange(1, 513)])
        skip = rng.choice([0, 4, 16, 1, 2, rng.randrange(256)])
        words.append(encode(Vec(func=VecFunc.INSERT, a_addr=rng.randrange(vin - length + 1),
                                b_addr=rng.randrange(vin - length + 1),
                                dst_addr=rng.randrange(vout - length + 1), length=length,
                                imm=insert_imm(base, group, rng.randrange(1, 33), stride,
                                               skip))))
    return words


def kv4_words(rng: random.Random, cfg: AcceleratorConfig) -> list[int]:
    """KV4 VECs on and around their rules (groups dividing the row or not, results at VOUT's
    end) and INSERT4 VECs on and around INSERT's rules counted in nibbles (strides 0 to 9,
    at stride 1 base, group and skip on and off multiples of 8)."""
    vin, vout = cfg.vin_spad_bytes // 4, cfg.vout_spad_bytes // 4
    words = []
    for _ in range(30):
        length = rng.choice([16, 32, 64, 24, 48, rng.randrange(1, 128)])
        imm = rng.choice([0, kv4_imm(16), kv4_imm(32), kv4_imm(8), rng.randrange(64)])
        out = int(vec_out_words(VecFunc.KV4.value, length, imm))
        words.append(encode(Vec(func=VecFunc.KV4, a_addr=rng.randrange(vin - length + 1),
                                dst_addr=rng.choice([0, vout - out, vout - out + 1]),
                                length=length, imm=imm)))
    for _ in range(30):
        length = rng.randrange(1, vout + 1)
        stride = rng.choice([0, 1, 1, 2, 4, 7, 8, 9, 255])
        base = rng.choice([0, 8, 4, 1, rng.randrange(1024)])
        group = rng.choice([8, 16, 4, 7, rng.randrange(1, 513)])
        skip = rng.choice([0, 8, 16, 4, rng.randrange(256)])
        words.append(encode(Vec(func=VecFunc.INSERT4, a_addr=rng.randrange(vin - length + 1),
                                b_addr=rng.randrange(vin - length + 1),
                                dst_addr=rng.randrange(vout - length + 1), length=length,
                                imm=insert_imm(base, group, rng.randrange(1, 33), stride,
                                               skip))))
    return words


def lane_words(rng: random.Random, cfg: AcceleratorConfig) -> list[int]:
    """VECs of every sub-op inside VIN and VOUT, each address aligned to the lanes or off by
    a random amount (hw.isa.vec_unaligned: BAD_ADDRESS for a laned sub-op, only there)."""
    vin, vout = cfg.vin_spad_bytes // 4, cfg.vout_spad_bytes // 4
    lanes = cfg.vector_lanes
    words = []
    for _ in range(60):
        func = rng.choice([f for f in VecFunc if f != VecFunc.ROPE])
        length = rng.randrange(1, 33)

        def addr(size):
            return rng.randrange(0, size - 40, lanes) + rng.choice([0, 0, rng.randrange(lanes)])
        imm = {VecFunc.INSERT: insert_imm(0, 1, 1, 4), VecFunc.INSERT4: insert_imm(0, 1, 1, 8),
               VecFunc.KV4: kv4_imm(None)}.get(func, 0)
        words.append(encode(Vec(func=func, a_addr=addr(vin), b_addr=addr(vin),
                                dst_addr=addr(vout), length=length, imm=imm)))
    return words


def expected_error(word: int, cfg: AcceleratorConfig, regs: dict | None = None) -> ErrorCode:
    try:
        ins = decode(word)
    except (ISAError, ValueError):  # undefined opcode, spad, epilogue, sub-op or register
        return ErrorCode.ILLEGAL_OPCODE
    return dispatch_error(relative_instruction(ins, regs), cfg)


def random_regs(rng: random.Random, cfg: AcceleratorConfig) -> dict[int, int]:
    """Run-time registers, each 0, small, near a DRAM, VIN or count limit, or its largest
    value."""
    top = (1 << REG_BITS) - 1
    return {r: rng.choice([0, 0, 1, rng.randrange(16), rng.randrange(top + 1), top,
                           rng.randrange(1 << 16), cfg.vin_spad_bytes // 4,
                           cfg.dram_beats // 8, cfg.dram_beats - rng.randrange(1, 64)])
            for r in range(1, NUM_REGS + 1)}


def relative_word(rng: random.Random, word: int) -> int:
    """``word`` with its DMA and VEC ``reg`` fields random (every value, 0 naming none)."""
    for f in (DmaBody["reg"], VecBody["reg"]):
        if rng.random() < 0.5:
            word = _set(word, _BODY + f.offset, f.width, rng.randrange(1 << f.width))
    return word


class FetchBench:
    """A fetch unit restartable by the testbench."""

    def __init__(self, cfg):
        self.fetch = FetchUnit(cfg)
        self.restart = Signal()
        self.m = Module()
        self.m.submodules.fetch = ResetInserter(self.restart)(self.fetch)

    async def load(self, ctx, words):
        for i, w in enumerate(words):
            ctx.set(self.fetch.imem_wr.addr, i)
            ctx.set(self.fetch.imem_wr.data, w)
            ctx.set(self.fetch.imem_wr.en, 1)
            await ctx.tick()
        ctx.set(self.fetch.imem_wr.en, 0)

    async def start(self, ctx):
        ctx.set(self.fetch.run, 0)
        ctx.set(self.restart, 1)
        await ctx.tick()          # cycle -1
        ctx.set(self.restart, 0)
        ctx.set(self.fetch.run, 1)

    def streams(self):
        return {e.engine: getattr(self.fetch, e.name) for e in engines_of(self.fetch.cfg)}


_CONFIGS = {"small": small_config(), "wide": wide_config(), "default": AcceleratorConfig(),
            "beat4": small_config(memory={"bytes_per_cycle": 4, "latency": 2,
                                          "size_bytes": 1 << 12}),
            "vector": small_config(vin_spad_bytes=512, vout_spad_bytes=256),
            "vector4": small_config(vin_spad_bytes=512, vout_spad_bytes=256, vector_lanes=4)}


@pytest.mark.parametrize("name", sorted(_CONFIGS))
def test_checks_match_dispatch_error(name):
    """Random words near every limit: the error code at a_0 is dispatch_error's."""
    cfg = _CONFIGS[name]
    rng = random.Random(name)
    words = [random_word(rng, cfg) for _ in range(150)]
    words += [encode(random_gemm(rng, cfg)) for _ in range(15)]
    words += [encode(random_dma(rng, cfg, store=rng.random() < 0.5)) for _ in range(15)]
    words += boundary_words(rng, cfg)
    if cfg.has_vector:
        words += rope_words(rng, cfg) + insert_words(rng, cfg) + kv4_words(rng, cfg)
        words += lane_words(rng, cfg)
    # Words relative to the run-time registers, run with random registers (hw.isa.reg_values).
    words = [(w, None) for w in words] + [
        (relative_word(rng, w), random_regs(rng, cfg)) for w in words[:len(words) // 2]]
    rng.shuffle(words)
    bench = FetchBench(cfg)
    seen = set()

    async def tb(ctx):
        for s in bench.streams().values():
            ctx.set(s.ready, 1)
        for word, regs in words:
            want = expected_error(word, cfg, regs)
            seen.add(want)
            for r in range(1, NUM_REGS + 1):
                ctx.set(bench.fetch.regs[r - 1], (regs or {}).get(r, 0))
            await bench.load(ctx, [word])
            await bench.start(ctx)
            for _ in range(timing.FETCH_LATENCY):
                assert ctx.get(bench.fetch.error) == ErrorCode.NONE
                assert not ctx.get(bench.fetch.dispatched)
                await ctx.tick()
            assert ctx.get(bench.fetch.error) == want, (hex(word), want)
            if want == ErrorCode.NONE:
                assert ctx.get(bench.fetch.dispatched)
                ins = decode(word)
                eng = engine_of(ins)
                for e, s in bench.streams().items():
                    assert ctx.get(s.valid) == (e == eng)
                if eng is not None:
                    p = ctx.get(bench.streams()[eng].payload)
                    assert (p.wait, p.signal, p.sync) == (
                        NO_EVENT if ins.wait is None else ins.wait,
                        NO_EVENT if ins.signal is None else ins.signal, isinstance(ins, Sync))
                    eff = relative_instruction(ins, regs)   # the effective run-time field
                    if isinstance(ins, (Load, Store)):
                        assert p.body.dram_addr == eff.dram_addr, (hex(word), regs)
                    if isinstance(ins, Vec):
                        assert p.body.imm == eff.imm, (hex(word), regs)
            else:
                assert ctx.get(bench.fetch.error_pc) == 0
                assert not ctx.get(bench.fetch.dispatched)

    run_sim(bench.m, tb)
    assert {ErrorCode.NONE, ErrorCode.ILLEGAL_OPCODE, ErrorCode.BAD_EVENT,
            ErrorCode.BAD_ADDRESS, ErrorCode.BAD_GEMM} <= seen


@pytest.mark.parametrize("seed", range(3))
def test_dispatch_timing(seed):
    """Random queue back-pressure: a_0 = FETCH_LATENCY, d_i = first cycle >= a_i with space,
    a_{i+1} = d_i + 1; stalls are flagged; nothing is dispatched after END."""
    cfg = small_config(vin_spad_bytes=256, vout_spad_bytes=256) if seed else small_config()
    rng = random.Random(seed)
    prog = [Sync(engine=rng.choice([e.engine for e in engines_of(cfg)]),
                 signal=rng.choice([None, 1])) for _ in range(25)] + [End()]
    bench = FetchBench(cfg)

    async def tb(ctx):
        await bench.load(ctx, [encode(i) for i in prog])
        await bench.start(ctx)
        a, i, c = timing.FETCH_LATENCY, 0, 0
        streams = bench.streams()
        while c < 200:
            ready = {e: rng.random() < 0.4 for e in Engine}
            for e, s in streams.items():
                ctx.set(s.ready, ready[e])
            f = bench.fetch
            if i < len(prog) and c >= a:
                ins = prog[i]
                eng = engine_of(ins)
                can = eng is None or ready[eng]
                assert ctx.get(f.dispatched) == can, (i, c)
                assert ctx.get(f.stalled) == (not can)
                for e, s in streams.items():
                    assert ctx.get(s.valid) == (e == eng), (i, c)
                if can:
                    i, a = i + 1, c + 1
            else:
                assert not ctx.get(f.dispatched) and not ctx.get(f.stalled)
                assert not any(ctx.get(s.valid) for s in streams.values())
            assert ctx.get(f.ended) == (i == len(prog) and c >= a)
            await ctx.tick()
            c += 1
        assert i == len(prog)

    run_sim(bench.m, tb)


def test_pc_overflow():
    cfg = small_config(imem_depth=16)
    bench = FetchBench(cfg)

    async def tb(ctx):
        await bench.load(ctx, [encode(Sync(engine=Engine(i % 3))) for i in range(16)])
        for s in bench.streams().values():
            ctx.set(s.ready, 1)
        await bench.start(ctx)
        for c in range(timing.FETCH_LATENCY + 16):
            assert ctx.get(bench.fetch.error) == ErrorCode.NONE
            assert ctx.get(bench.fetch.dispatched) == (c >= timing.FETCH_LATENCY)
            await ctx.tick()
        assert ctx.get(bench.fetch.error) == ErrorCode.PC_OVERFLOW
        assert ctx.get(bench.fetch.error_pc) == 16

    run_sim(bench.m, tb)


def test_fetch_latency_checked(monkeypatch):
    monkeypatch.setattr(timing, "FETCH_LATENCY", 1)
    with pytest.raises(ValueError, match="FETCH_LATENCY=1"):
        FetchUnit(small_config())


@pytest.mark.parametrize("ready_copy", [False, True])
def test_queue_order_and_flags(ready_copy):
    """InstrQueue: first in, first out; full/empty registered; any depth. With ``ready_copy``
    the write side's ``ready`` is the copy: a copy a cycle late or early fails its check."""
    from hw.queues import DMA_ENTRY
    for depth in (1, 2, 3, 4):
        dut = InstrQueue(DMA_ENTRY, depth, ready_copy=ready_copy)
        rng = random.Random(depth)

        async def tb(ctx, dut=dut, depth=depth, rng=rng):
            model = []
            for _ in range(120):
                push = rng.random() < 0.6
                pop = rng.random() < 0.5
                v = rng.getrandbits(10)
                ctx.set(dut.w.valid, push)
                ctx.set(dut.w.payload, {"wait": v & 31, "signal": v >> 5, "sync": 0,
                                        "body": {}})
                ctx.set(dut.r.ready, pop)
                assert ctx.get(dut.w.ready) == (len(model) < depth)
                assert ctx.get(dut.r.valid) == (len(model) > 0)
                assert ctx.get(dut.level) == len(model)
                accepted = push and len(model) < depth
                popped = pop and len(model) > 0
                if popped:
                    p = ctx.get(dut.r.payload)
                    assert (p.wait | p.signal << 5) == model[0]
                await ctx.tick()
                if popped:
                    model.pop(0)
                if accepted:
                    model.append(v)

        run_sim(dut, tb)



def test_banked_instruction_memory():
    """Programs longer than one 2048-word bank: every word comes from the right bank."""
    cfg = small_config(imem_depth=4096, num_events=8)
    n = 2048 + 40
    prog = [Sync(engine=Engine(i % 3), signal=i % 8, wait=(i // 8) % 8) for i in range(n)]
    prog.append(End())
    bench = FetchBench(cfg)

    async def tb(ctx):
        await bench.load(ctx, [encode(i) for i in prog])
        for s in bench.streams().values():
            ctx.set(s.ready, 1)
        await bench.start(ctx)
        seen = []
        for _ in range(timing.FETCH_LATENCY + n + 2):
            for e, s in bench.streams().items():
                if ctx.get(s.valid):
                    p = ctx.get(s.payload)
                    seen.append((e, p.signal, p.wait))
            assert ctx.get(bench.fetch.error) == ErrorCode.NONE
            await ctx.tick()
        assert ctx.get(bench.fetch.ended)
        assert seen == [(i.engine, i.signal, i.wait) for i in prog[:-1]]

    run_sim(bench.m, tb)
