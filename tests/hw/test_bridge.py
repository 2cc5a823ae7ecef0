# amaranth: UnusedElaboratable=no
"""The DRAM bridge (hw/board/bridge.py) in the Amaranth simulator, against unkind memories.

The memory behind the native port is :class:`bridge_testutil.NativePortModel`: random
``cmd.ready``, random read latencies and write-data delays, refresh-like stalls, all seeded.
Two levels:

* the bridge alone, driven like the accelerator drives it (a read and a write in any enabled
  cycle, on a few addresses so that reads meet same-cycle and earlier writes): every response
  arrives exactly ``latency`` enabled cycles after its request with the data of
  hw/memory_model.py's semantics, and ``stall_cycles`` counts the cycles with ``enable`` low;
* the accelerator under the bridge's clock enable (:class:`hw.board.bridge.BridgedAccelerator`)
  runs random programs (:func:`sim.random_programs.random_program`): the DRAM image, cycles,
  error and counters equal :class:`sim.model.FastModel`'s.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from amaranth.sim import Simulator
from bridge_testutil import NativePortModel

from hw.board.bridge import BridgedAccelerator, DramBridge
from hw.board.ecpix5 import ECPIX5
from hw.config import AcceleratorConfig, MemoryModel
from hw.counters import COUNTERS
from hw.isa import INSTR_BYTES, ErrorCode, Load, Store
from sim.model import FastModel
from sim.random_programs import EQUIVALENCE_CONFIGS, random_program
from sim.rtl import encode_any

#: A 2x4 array on the board's port, over 32 KiB of DRAM (the board's facts otherwise).
BOARD = dataclasses.replace(ECPIX5, dram_bytes=1 << 15)
#: The same with a port of half the controller's width, behind LiteDRAM's up-converter.
HALF_BOARD = dataclasses.replace(BOARD, port_bits=BOARD.port_bits // 2)


def _cfg(latency: int, board=BOARD) -> AcceleratorConfig:
    return board.accelerator_config(EQUIVALENCE_CONFIGS["2x4"], latency=latency)


def _run(dut, bench) -> None:
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.run()


# ------------------------------------------------------------------ the bridge alone
@pytest.mark.parametrize("latency,seed,depths", [
    (1, 0, {}), (2, 1, {}), (5, 2, {}), (24, 3, {}),
    # The smallest queues: the accelerator stalls for want of command slots, writes wait for
    # write-data slots.
    (5, 4, {"cmd_depth": 2, "wdata_depth": 1, "resp_depth": 5}),
    # A half-width port: the up-converter's groups (the model fails on a repeated address in
    # one group, and a group that never closes stalls the bench).
    (2, 5, {"upconverter": True}), (5, 6, {"upconverter": True}),
])
def test_bridge_keeps_the_contract(latency, seed, depths):
    """Random reads and writes on 6 words: data and timing as hw/memory_model.py says."""
    board = HALF_BOARD if depths.get("upconverter") else BOARD
    cfg = _cfg(latency, board)
    dut = DramBridge(cfg, board, **depths)
    rng = random.Random(seed)
    mem = np.frombuffer(rng.randbytes(board.dram_bytes), dtype=np.uint8).copy()
    ref = mem.copy()                    # the contract's memory, updated in enabled cycles
    beat = cfg.beat_bytes
    n_cycles = 1500
    seen = {"stalls": 0, "reads": 0, "writes": 0}

    def word(a):
        return int.from_bytes(ref[a * beat:(a + 1) * beat].tobytes(), "little")

    async def bench(ctx):
        native = NativePortModel(dut.port, mem, seed, refresh_every=200, refresh=30,
                                 upconverter=dut.upconverter)
        due = {}                        # enabled cycle -> expected data
        e = 0
        ctx.set(dut.clear, 1)
        while e < n_cycles or due or not ctx.get(dut.idle):
            if ctx.get(dut.enable):
                # One cycle of the accelerator: its response, then its requests.
                valid = ctx.get(dut.bus.rd_resp.valid)
                assert bool(valid) == (e in due), f"enabled cycle {e}: response valid={valid}"
                if e in due:
                    got = ctx.get(dut.bus.rd_resp.payload)
                    assert got == due.pop(e), f"enabled cycle {e}: wrong read data"
                rd = e < n_cycles and rng.random() < 0.6
                wr = e < n_cycles and rng.random() < 0.6
                ra, wa = rng.randrange(6), rng.randrange(6)
                ctx.set(dut.bus.rd_req.valid, rd)
                ctx.set(dut.bus.rd_req.payload, ra)
                ctx.set(dut.bus.wr.valid, wr)
                if rd:
                    due[e + latency] = word(ra)     # sampled before this cycle's write
                    seen["reads"] += 1
                if wr:
                    data = rng.getrandbits(8 * beat)
                    ctx.set(dut.bus.wr.payload, {"addr": wa, "data": data})
                    ref[wa * beat:(wa + 1) * beat] = np.frombuffer(
                        data.to_bytes(beat, "little"), dtype=np.uint8)
                    seen["writes"] += 1
                e += 1
            elif not ctx.get(dut.clear):
                seen["stalls"] += 1
            assert native.now < 100 * n_cycles, f"stuck after {native.now} cycles"
            native.step(ctx)
            await ctx.tick()
            ctx.set(dut.clear, 0)
        assert ctx.get(dut.stall_cycles) == seen["stalls"]
        assert (native.reads, native.writes) == (seen["reads"], seen["writes"])

    _run(dut, bench)
    diff = np.flatnonzero(mem != ref)
    assert diff.size == 0, f"{diff.size} bytes differ, first at {diff[:8]}"
    assert seen["stalls"] > 0          # the memory did stall the accelerator (not vacuous)


def test_idle_lines_flush_the_up_converter():
    """With nothing to send, cmd shows a read of another word than the last command's."""
    dut = DramBridge(_cfg(5, HALF_BOARD), HALF_BOARD, upconverter=True)

    async def bench(ctx):
        ctx.set(dut.port.cmd.ready, 1)
        ctx.set(dut.bus.wr.valid, 1)
        ctx.set(dut.bus.wr.payload, {"addr": 5, "data": 7})
        await ctx.tick()
        ctx.set(dut.bus.wr.valid, 0)
        for _ in range(3):
            if ctx.get(dut.port.cmd.valid):
                assert (ctx.get(dut.port.cmd.payload.we), ctx.get(dut.port.cmd.payload.addr)) \
                    == (1, 5)
            await ctx.tick()
        assert not ctx.get(dut.port.cmd.valid)
        assert ctx.get(dut.port.cmd.payload.we) == 0
        assert ctx.get(dut.port.cmd.payload.addr) == ~5 % (1 << HALF_BOARD.port_addr_bits)

    _run(dut, bench)


@pytest.mark.parametrize("kw,msg", [
    ({"cfg": AcceleratorConfig(memory=MemoryModel(bytes_per_cycle=8))}, "beat_bytes=8"),
    ({"board": dataclasses.replace(BOARD, dram_bytes=1 << 12)}, "size_bytes=32768"),
    ({"cmd_depth": 1}, "cmd_depth"),
    ({"resp_depth": 4}, "resp_depth must be an int >= 5, got 4"),
])
def test_bad_arguments_name_the_value(kw, msg):
    args = {"cfg": _cfg(5), "board": BOARD, **kw}
    with pytest.raises(ValueError, match=msg):
        DramBridge(args.pop("cfg"), args.pop("board"), **args)


# ------------------------------------------------------------------ the accelerator on it
def run_bridged(cfg, program, dram, seed, max_cycles=200_000, **native_kw):
    """Run ``program`` on :class:`BridgedAccelerator` over a :class:`NativePortModel` memory
    (at most ``max_cycles`` cycles).

    Returns ``(cycles, error, error_pc, counters, dram, stall_cycles, stalls_seen)``.
    """
    dut = BridgedAccelerator(cfg, BOARD)
    raw = encode_any(program, cfg)
    words = [int.from_bytes(raw[i:i + INSTR_BYTES], "little")
             for i in range(0, len(raw), INSTR_BYTES)]
    words.append(0)  # a fresh instruction memory past the program (as sim/rtl.py's harness)
    mem = np.array(dram, dtype=np.uint8, copy=True)
    out = {}

    async def bench(ctx):
        native = NativePortModel(dut.port, mem, seed, **native_kw)
        bridge = dut.bridge
        stalls = 0
        for i, w in enumerate(words):   # the bridge is idle: every cycle is enabled
            ctx.set(dut.imem_wr.en, 1)
            ctx.set(dut.imem_wr.addr, i)
            ctx.set(dut.imem_wr.data, w)
            native.step(ctx)
            await ctx.tick()
        ctx.set(dut.imem_wr.en, 0)
        ctx.set(dut.start, 1)
        native.step(ctx)
        await ctx.tick()
        ctx.set(dut.start, 0)
        while True:
            if ctx.get(bridge.clear):
                stalls = 0
            elif not ctx.get(bridge.enable):
                stalls += 1
            if ctx.get(dut.done) and not ctx.get(dut.start):
                break
            assert native.now < max_cycles, f"still busy after {native.now} cycles"
            native.step(ctx)
            await ctx.tick()
        ctrs = ctx.get(dut.counters)
        out.update(cycles=ctx.get(dut.cycles), error=ErrorCode(ctx.get(dut.error)),
                   error_pc=ctx.get(dut.error_pc),
                   counters={k: int(getattr(ctrs, k)) for k in COUNTERS},
                   stall_cycles=ctx.get(dut.stall_cycles), stalls_seen=stalls)

    _run(dut, bench)
    return out, mem


@pytest.mark.parametrize("latency,seed", [(5, 0), (24, 2)])
def test_random_programs_match_the_fast_model(latency, seed):
    """Cycles, error, counters and the DRAM image as FastModel; stalls counted apart."""
    cfg = _cfg(latency)
    rp = random_program(cfg, np.random.default_rng(seed), chains=2, tasks=2)
    ref = FastModel(cfg).run(rp.program, rp.dram)
    res, mem = run_bridged(cfg, rp.program, rp.dram, seed)
    assert (res["cycles"], res["error"], res["error_pc"]) == (ref.cycles, ref.error,
                                                              ref.error_pc)
    assert res["counters"] == ref.counters
    diff = np.flatnonzero(mem != ref.dram)
    assert diff.size == 0, f"{diff.size} DRAM bytes differ, first at {diff[:8]}"
    assert res["stall_cycles"] == res["stalls_seen"]
    assert res["stall_cycles"] > 0


def test_store_then_load_sees_the_store():
    """A LOAD ordered after a STORE by an event reads what the STORE wrote: the first task's
    STORE is moved onto the DRAM rows the second task loads as weights, so the final image
    depends on the read-after-write order (the STORE's posted writes are still in the bridge's
    queue, ahead of the LOAD's reads, while the memory is slow)."""
    cfg = _cfg(3)
    rp = random_program(cfg, np.random.default_rng(7), chains=1, tasks=2, syncs=0.0)
    loads = [i for i in rp.program if isinstance(i, Load)]
    first_store = next(i for i in rp.program if isinstance(i, Store))
    assert loads[3].wait == first_store.signal      # the second task's first LOAD waits on it
    moved = Store(**{**first_store.__dict__, "dram_addr": loads[3].dram_addr})
    program = [moved if i is first_store else i for i in rp.program]
    ref = FastModel(cfg).run(program, rp.dram)
    assert not np.array_equal(ref.dram, FastModel(cfg).run(rp.program, rp.dram).dram)
    res, mem = run_bridged(cfg, program, rp.dram, 7, ready_p=0.5)
    assert (res["cycles"], res["error"]) == (ref.cycles, ref.error)
    assert res["counters"] == ref.counters
    diff = np.flatnonzero(mem != ref.dram)
    assert diff.size == 0, f"{diff.size} DRAM bytes differ, first at {diff[:8]}"
