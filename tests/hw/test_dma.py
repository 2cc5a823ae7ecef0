# amaranth: UnusedElaboratable=no
"""LOAD and STORE engines with scratchpads and the DRAM model: durations and bytes.

Durations must be ``hw.timing.load_cycles`` / ``store_cycles`` (command in cycle g, ``done`` in
g + D); a LOAD's last scratchpad write and its (delayed) signal come
``hw.engines.completion_delay`` cycles after its ``done``, while the next LOAD's requests go out;
the bytes must be those of ``sim.functional.exec_load`` / ``exec_store``.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib.wiring import connect
from control_testutil import random_dma, run_sim, small_config, wide_config

from hw import timing
from hw.dma import LoadEngine, StoreEngine
from hw.engines import completion_delay
from hw.isa import MOVE_SOURCES, DmaBody, Engine, Load, Spad, Store, dispatch_error
from hw.memory_model import DramModel
from hw.spad import Scratchpad
from sim.functional import MachineState, exec_load, exec_store

CONFIGS = {
    "narrow": small_config(memory={"bytes_per_cycle": 16, "latency": 5, "size_bytes": 4096}),
    "wide": wide_config(memory={"bytes_per_cycle": 16, "latency": 3, "size_bytes": 4096}),
    "beat8": small_config(rows=4, cols=4, memory={"bytes_per_cycle": 8, "latency": 2,
                                                  "size_bytes": 4096}),
    # paced ports (MemoryModel.cycles_per_beat): a beat every 2 and every 3 cycles
    "narrow k=2": small_config(memory={"bytes_per_cycle": 16, "latency": 5, "size_bytes": 4096,
                                       "cycles_per_beat": 2}),
    "beat8 k=3": small_config(rows=4, cols=4, memory={"bytes_per_cycle": 8, "latency": 2,
                                                      "size_bytes": 4096, "cycles_per_beat": 3}),
}
_SPADS = {Spad.ACT: "act", Spad.WGT: "wgt", Spad.PARAM: "param", Spad.OUT: "out"}


class Bench:
    """LOAD + STORE engines wired to four scratchpads and a DRAM model."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.m = m = Module()
        m.submodules.load = self.load = LoadEngine(cfg)
        m.submodules.store = self.store = StoreEngine(cfg)
        m.submodules.dram = self.dram = DramModel(cfg)
        self.spads = {}
        for sp, name in _SPADS.items():
            m.submodules[name] = self.spads[sp] = Scratchpad(
                size_bytes=getattr(cfg, f"{name}_spad_bytes"),
                word_bytes=getattr(cfg, f"{name}_word_bytes"), beat_bytes=cfg.beat_bytes,
                core="write" if sp == Spad.OUT else "read")
        for sp in (Spad.ACT, Spad.WGT, Spad.PARAM):
            connect(m, getattr(self.load, f"{_SPADS[sp]}_wr"), self.spads[sp].dma_wr)
        connect(m, self.store.out_rd, self.spads[Spad.OUT].dma_rd)
        connect(m, self.load.rd_req, self.dram.bus.rd_req)
        connect(m, self.dram.bus.rd_resp, self.load.rd_resp)
        connect(m, self.store.wr, self.dram.bus.wr)

    # -- testbench helpers
    async def dram_fill(self, ctx, image: np.ndarray):
        b = self.cfg.beat_bytes
        port = self.dram.host_wr
        ctx.set(port.en, 1)
        for a in range(image.size // b):
            ctx.set(port.addr, a)
            ctx.set(port.data, int.from_bytes(image[a * b:(a + 1) * b].tobytes(), "little"))
            await ctx.tick()
        ctx.set(port.en, 0)

    async def dram_dump(self, ctx) -> np.ndarray:
        b = self.cfg.beat_bytes
        out = bytearray()
        for a in range(self.cfg.dram_beats):
            ctx.set(self.dram.host_rd.addr, a)
            await ctx.tick()
            out += ctx.get(self.dram.host_rd.data).to_bytes(b, "little")
        return np.frombuffer(bytes(out), dtype=np.uint8)

    async def spad_dump(self, ctx, sp: Spad) -> np.ndarray:
        name = _SPADS[sp]
        word = getattr(self.cfg, f"{name}_word_bytes")
        port = self.spads[sp].core_rd
        out = bytearray()
        for a in range(getattr(self.cfg, f"{name}_spad_bytes") // word):
            ctx.set(port.addr, a)
            await ctx.tick()
            out += ctx.get(port.data).to_bytes(word, "little")
        return np.frombuffer(bytes(out), dtype=np.uint8)

    async def out_fill(self, ctx, data: np.ndarray):
        word = self.cfg.out_word_bytes
        port = self.spads[Spad.OUT].core_wr
        ctx.set(port.en, 1)
        for a in range(data.size // word):
            ctx.set(port.addr, a)
            ctx.set(port.data, int.from_bytes(data[a * word:(a + 1) * word].tobytes(), "little"))
            await ctx.tick()
        ctx.set(port.en, 0)

    async def drain(self, ctx) -> int:
        """Tick until the LOAD engine has nothing in flight; return the ticks."""
        n = 0
        while ctx.get(self.load.in_flight):
            await ctx.tick()
            n += 1
            assert n < 10_000
        return n

    async def execute(self, ctx, engine, ins) -> int:
        """Transfer ``ins`` in cycle g; return D such that ``done`` pulses in g + D."""
        assert ctx.get(engine.cmd.ready)
        body = {f: getattr(ins, f) for f in ("dram_addr", "spad_addr", "rows", "row_beats",
                                             "dram_stride")}
        ctx.set(engine.cmd.payload, {**body, "spad": ins.spad})
        ctx.set(engine.cmd.valid, 1)
        await ctx.tick()
        ctx.set(engine.cmd.valid, 0)
        d = 1
        while not ctx.get(engine.done):
            assert not ctx.get(engine.cmd.ready) or d == 1, "engine idle before done"
            await ctx.tick()
            d += 1
            assert d < 10_000
        assert ctx.get(engine.beats) == timing.dma_beats(ins)
        await ctx.tick()
        assert ctx.get(engine.cmd.ready), "not ready the cycle after done"
        return d


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_load(name):
    cfg = CONFIGS[name]
    bench = Bench(cfg)
    rng = random.Random(1)
    image = np.random.default_rng(1).integers(0, 256, cfg.memory.size_bytes, dtype=np.uint8)
    loads = [random_dma(rng, cfg, max_rows=3, max_row_beats=6) for _ in range(10)]
    loads.append(Load(spad=Spad.WGT, dram_addr=1, spad_addr=cfg.spad_beats("wgt") - 5, rows=5,
                      row_beats=1, dram_stride=7))
    state = MachineState(cfg, dram=image.copy())

    async def tb(ctx):
        await bench.dram_fill(ctx, image)
        for ins in loads:  # back to back: each one's responses overlap the next one's requests
            assert await bench.execute(ctx, bench.load, ins) == timing.load_cycles(ins, cfg), ins
            exec_load(state, ins)
        await bench.drain(ctx)
        for sp in (Spad.ACT, Spad.WGT, Spad.PARAM):
            np.testing.assert_array_equal(await bench.spad_dump(ctx, sp), state.spads[sp],
                                          err_msg=sp.name)

    run_sim(bench.m, tb)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_store(name):
    cfg = CONFIGS[name]
    bench = Bench(cfg)
    rng = random.Random(2)
    out = np.random.default_rng(2).integers(0, 256, cfg.out_spad_bytes, dtype=np.uint8)
    stores = [random_dma(rng, cfg, store=True, max_rows=3, max_row_beats=6) for _ in range(10)]
    stores.append(Store(dram_addr=3, spad_addr=cfg.spad_beats("out") - 4, rows=2, row_beats=2,
                        dram_stride=2))
    state = MachineState(cfg)
    state.spads[Spad.OUT][:] = out

    async def tb(ctx):
        await bench.out_fill(ctx, out)
        for ins in stores:
            assert await bench.execute(ctx, bench.store, ins) == timing.store_cycles(ins, cfg)
            exec_store(state, ins)
        np.testing.assert_array_equal(await bench.dram_dump(ctx), state.dram)

    run_sim(bench.m, tb)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_load_completion_and_signal_delay(name):
    """Back-to-back LOADs into one region: each signal comes exactly
    ``completion_delay(LOAD)`` cycles after its ``done``, with the LOAD's last scratchpad
    write, in order, and the region ends with the last LOAD's bytes."""
    cfg = CONFIGS[name]
    bench = Bench(cfg)
    x = completion_delay(Engine.LOAD, cfg)
    image = np.random.default_rng(3).integers(0, 256, cfg.memory.size_bytes, dtype=np.uint8)
    loads = [Load(spad=Spad.ACT, dram_addr=a, spad_addr=0, rows=1, row_beats=b)
             for a, b in ((0, 1), (40, 3), (7, 2), (90, 1))]
    masks = [1 << (i % cfg.num_events) for i in range(len(loads))]
    state = MachineState(cfg, dram=image.copy())
    done_at, signal_at, written_at = [], [], []
    clock = [0]

    async def tick(ctx):
        if ctx.get(bench.load.signal.valid):
            signal_at.append((clock[0], ctx.get(bench.load.signal.payload)))
            written_at.append(ctx.get(bench.load.act_wr.en))
        await ctx.tick()
        clock[0] += 1

    async def tb(ctx):
        await bench.dram_fill(ctx, image)
        for ins, mask in zip(loads, masks, strict=True):
            assert ctx.get(bench.load.cmd.ready)
            body = {f: getattr(ins, f) for f in ("dram_addr", "spad_addr", "rows",
                                                 "row_beats", "dram_stride")}
            ctx.set(bench.load.cmd.payload, {**body, "spad": ins.spad})
            ctx.set(bench.load.cmd.valid, 1)
            await tick(ctx)
            ctx.set(bench.load.cmd.valid, 0)
            while not ctx.get(bench.load.done):
                await tick(ctx)
            done_at.append(clock[0])
            ctx.set(bench.load.end_in, 1)
            ctx.set(bench.load.signal_in.valid, 1)
            ctx.set(bench.load.signal_in.payload, mask)
            await tick(ctx)
            ctx.set(bench.load.end_in, 0)
            ctx.set(bench.load.signal_in.valid, 0)
            exec_load(state, ins)
        while ctx.get(bench.load.in_flight):
            await tick(ctx)
        assert clock[0] == done_at[-1] + x + 1  # in flight through the last completion
        # An end without beats or a signal (a SYNC's) is in flight as long.
        ctx.set(bench.load.end_in, 1)
        await tick(ctx)
        ctx.set(bench.load.end_in, 0)
        start = clock[0]
        while ctx.get(bench.load.in_flight):
            await tick(ctx)
        assert clock[0] - start == x
        np.testing.assert_array_equal(await bench.spad_dump(ctx, Spad.ACT),
                                      state.spads[Spad.ACT])

    run_sim(bench.m, tb)
    assert signal_at == [(d + x, mk) for d, mk in zip(done_at, masks, strict=True)]
    assert written_at == [1] * len(loads)


@pytest.mark.parametrize("name", ["narrow", "narrow k=2", "beat8 k=3"])
def test_load_requests_are_paced(name):
    """A LOAD requests its beats in ``g + 1``, ``g + 1 + k``, .. (``k`` =
    MemoryModel.cycles_per_beat), at the addresses of its rows in order, nothing between."""
    cfg = CONFIGS[name]
    k = cfg.memory.cycles_per_beat
    bench = Bench(cfg)
    ins = Load(spad=Spad.ACT, dram_addr=9, spad_addr=0, rows=3, row_beats=2, dram_stride=5)
    seen = []

    async def tb(ctx):
        ctx.set(bench.load.cmd.payload, {f: getattr(ins, f) for f in (
            "dram_addr", "spad_addr", "rows", "row_beats", "dram_stride", "spad")})
        ctx.set(bench.load.cmd.valid, 1)
        await ctx.tick()
        ctx.set(bench.load.cmd.valid, 0)
        for _ in range(timing.load_cycles(ins, cfg) + 2):   # cycles g + 1 ..
            seen.append(ctx.get(bench.load.rd_req.payload) if ctx.get(bench.load.rd_req.valid)
                        else None)
            await ctx.tick()

    run_sim(bench.m, tb)
    want = [None] * (timing.load_cycles(ins, cfg) + 2)
    for j, a in enumerate((9, 10, 14, 15, 19, 20)):
        want[j * k] = a
    assert seen == want


def test_overhead_constants_checked(monkeypatch):
    monkeypatch.setattr(timing, "LOAD_OVERHEAD", 2)
    with pytest.raises(ValueError, match="LOAD_OVERHEAD=2"):
        LoadEngine(CONFIGS["narrow"])
    monkeypatch.setattr(timing, "STORE_OVERHEAD", 0)
    with pytest.raises(ValueError, match="STORE_OVERHEAD=0"):
        StoreEngine(CONFIGS["narrow"])


#: A configuration with a vector engine: VOUT is the moves' source, VIN their destination.
VECTOR = small_config(vin_spad_bytes=512, vout_spad_bytes=256,
                      memory={"bytes_per_cycle": 16, "latency": 4, "size_bytes": 4096})


def _random_move(rng: random.Random, cfg, vout: bool = False, source: Spad = Spad.VOUT
                 ) -> Store:
    """A move of random rows of ``source`` (VOUT or OUT) into random VIN rows (``vout``: a
    STORE of them to DRAM instead), inside both ranges; VIN rows may overlap (stride below
    the row)."""
    src, dst = (cfg.spad_beats(source.name.lower()),
                cfg.dram_beats if vout else cfg.spad_beats("vin"))
    move = next(k for k, v in MOVE_SOURCES.items() if v == source)
    rows = rng.randint(1, 3)
    row_beats = rng.randint(1, min(6, src // rows))
    stride = rng.randint(0, 2 * row_beats)
    span = (rows - 1) * stride + row_beats
    ins = Store(spad=source if vout else move, spad_addr=rng.randint(0, src - rows
                                                                            * row_beats),
                dram_addr=rng.randint(0, dst - span), rows=rows, row_beats=row_beats,
                dram_stride=stride)
    assert dispatch_error(ins, cfg).name == "NONE", ins
    return ins


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("source", [Spad.VOUT, Spad.OUT])
def test_move(source, k):
    """Moves (VOUT -> VIN, or OUT -> VIN: hw.isa.MOVE_SOURCES) and STOREs of their source
    back to back on the STORE engine: each takes ``store_cycles``, a move writes VIN one
    beat a cycle (never paced: on chip) and never the DRAM, a STORE writes DRAM a beat every
    ``k`` cycles (MemoryModel.cycles_per_beat), and VIN and DRAM end as ``exec_store``
    leaves them."""
    cfg = VECTOR.replace(memory=dataclasses.replace(VECTOR.memory, cycles_per_beat=k))
    m = Module()
    m.submodules.store = store = StoreEngine(cfg)
    m.submodules.dram = dram = DramModel(cfg)
    m.submodules.vin = vin = Scratchpad(size_bytes=cfg.vin_spad_bytes,
                                        word_bytes=cfg.vin_word_bytes,
                                        beat_bytes=cfg.beat_bytes, core="read")
    name = source.name.lower()
    m.submodules.src = vout = Scratchpad(size_bytes=getattr(cfg, f"{name}_spad_bytes"),
                                         word_bytes=getattr(cfg, f"{name}_word_bytes"),
                                         beat_bytes=cfg.beat_bytes, core="write")
    connect(m, store.vout_rd if source == Spad.VOUT else store.out_rd, vout.dma_rd)
    connect(m, store.vin_wr, vin.dma_wr)
    connect(m, store.wr, dram.bus.wr)
    rng = random.Random(4)
    moves = [_random_move(rng, cfg, vout=rng.random() < 0.3, source=source)
             for _ in range(16)]
    data = np.random.default_rng(4).integers(0, 256, getattr(cfg, f"{name}_spad_bytes"),
                                             dtype=np.uint8)
    state = MachineState(cfg)
    state.spads[source][:] = data
    writes = []   # (cycle, VIN write, DRAM write) while an instruction runs

    async def tb(ctx):
        word = getattr(cfg, f"{name}_word_bytes")
        ctx.set(vout.core_wr.en, 1)
        for a in range(data.size // word):
            ctx.set(vout.core_wr.addr, a)
            ctx.set(vout.core_wr.data, int.from_bytes(data[a * word:(a + 1) * word].tobytes(),
                                                      "little"))
            await ctx.tick()
        ctx.set(vout.core_wr.en, 0)
        for ins in moves:
            # (packed: the field's Spad shape has no member for a move from OUT)
            ctx.set(store.cmd.payload.as_value(), sum(
                v << DmaBody[k].offset for k, v in ins._body_fields().items()))
            ctx.set(store.cmd.valid, 1)
            await ctx.tick()
            ctx.set(store.cmd.valid, 0)
            d, seen = 1, []
            while not ctx.get(store.done):
                seen.append((ctx.get(store.vin_wr.en), ctx.get(store.wr.valid)))
                await ctx.tick()
                d += 1
            seen.append((ctx.get(store.vin_wr.en), ctx.get(store.wr.valid)))
            writes.append((ins, d, seen))
            exec_store(state, ins)
            await ctx.tick()
        out = bytearray()
        for a in range(cfg.vin_spad_bytes // cfg.vin_word_bytes):
            ctx.set(vin.core_rd.addr, a)
            await ctx.tick()
            out += ctx.get(vin.core_rd.data).to_bytes(cfg.vin_word_bytes, "little")
        np.testing.assert_array_equal(np.frombuffer(bytes(out), np.uint8),
                                      state.spads[Spad.VIN])
        b = cfg.beat_bytes
        out = bytearray()
        for a in range(cfg.dram_beats):
            ctx.set(dram.host_rd.addr, a)
            await ctx.tick()
            out += ctx.get(dram.host_rd.data).to_bytes(b, "little")
        np.testing.assert_array_equal(np.frombuffer(bytes(out), np.uint8), state.dram)

    run_sim(m, tb)
    for ins, d, seen in writes:
        assert d == timing.store_cycles(ins, cfg), ins
        beats = timing.dma_beats(ins)
        # the writes in g + 2, g + 2 + p, .. (seen[0] is cycle g + 1; p = 1 for a move, k for
        # a STORE to DRAM), to VIN or to DRAM only
        move = ins.spad in MOVE_SOURCES
        pace = 1 if move else k
        want = [0] + [int(j % pace == 0) for j in range((beats - 1) * pace + 1)]
        assert [v for v, _ in seen] == (want if move else [0] * len(want)), ins
        assert [w for _, w in seen] == ([0] * len(want) if move else want), ins
