# amaranth: UnusedElaboratable=no
"""LOAD and STORE engines with scratchpads and the DRAM model: durations and bytes.

Durations must be ``hw.timing.load_cycles`` / ``store_cycles`` (command in cycle g, ``done`` in
g + D); a LOAD's last scratchpad write and its (delayed) signal come
``hw.engines.completion_delay`` cycles after its ``done``, while the next LOAD's requests go out;
the bytes must be those of ``sim.functional.exec_load`` / ``exec_store``.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from amaranth import Module
from amaranth.lib.wiring import connect
from control_testutil import random_dma, run_sim, small_config, wide_config

from hw import timing
from hw.dma import LoadEngine, StoreEngine
from hw.engines import completion_delay
from hw.isa import Engine, Load, Spad, Store
from hw.memory_model import DramModel
from hw.spad import Scratchpad
from sim.functional import MachineState, exec_load, exec_store

CONFIGS = {
    "narrow": small_config(memory={"bytes_per_cycle": 16, "latency": 5, "size_bytes": 4096}),
    "wide": wide_config(memory={"bytes_per_cycle": 16, "latency": 3, "size_bytes": 4096}),
    "beat8": small_config(rows=4, cols=4, memory={"bytes_per_cycle": 8, "latency": 2,
                                                  "size_bytes": 4096}),
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


def test_overhead_constants_checked(monkeypatch):
    monkeypatch.setattr(timing, "LOAD_OVERHEAD", 2)
    with pytest.raises(ValueError, match="LOAD_OVERHEAD=2"):
        LoadEngine(CONFIGS["narrow"])
    monkeypatch.setattr(timing, "STORE_OVERHEAD", 0)
    with pytest.raises(ValueError, match="STORE_OVERHEAD=0"):
        StoreEngine(CONFIGS["narrow"])
