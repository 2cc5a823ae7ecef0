# amaranth: UnusedElaboratable=no
"""The DRAM model: fixed read latency, read-before-write, posted writes, host port."""

from __future__ import annotations

import random

import pytest
from control_testutil import run_sim, small_config

from hw.memory_model import DramModel


def _cfg(latency: int):
    return small_config(memory={"bytes_per_cycle": 16, "latency": latency,
                                "size_bytes": 1 << 12})


async def _host_write(ctx, dut, addr, value):
    ctx.set(dut.host_wr.addr, addr)
    ctx.set(dut.host_wr.data, value)
    ctx.set(dut.host_wr.en, 1)
    await ctx.tick()
    ctx.set(dut.host_wr.en, 0)


async def _host_read(ctx, dut, addr):
    ctx.set(dut.host_rd.addr, addr)
    await ctx.tick()
    return ctx.get(dut.host_rd.data)


@pytest.mark.parametrize("latency", [1, 2, 7])
def test_random_traffic(latency):
    """Requests every cycle or not, writes interleaved: each response is the memory as it was
    at the end of its request cycle, exactly ``latency`` cycles later."""
    cfg = _cfg(latency)
    dut = DramModel(cfg)
    rng = random.Random(latency)
    beats = 32
    mem = {a: rng.getrandbits(128) for a in range(beats)}
    cycles = 200
    reqs = [(rng.random() < 0.7, rng.randrange(beats)) for _ in range(cycles)]
    wrs = [(rng.random() < 0.4, rng.randrange(beats), rng.getrandbits(128))
           for _ in range(cycles)]

    async def tb(ctx):
        for a, v in mem.items():
            await _host_write(ctx, dut, a, v)
        model = dict(mem)
        expect = {}
        for t in range(cycles + latency):
            valid, addr = reqs[t] if t < cycles else (False, 0)
            wvalid, waddr, wdata = wrs[t] if t < cycles else (False, 0, 0)
            ctx.set(dut.bus.rd_req.valid, valid)
            ctx.set(dut.bus.rd_req.payload, addr)
            ctx.set(dut.bus.wr.valid, wvalid)
            ctx.set(dut.bus.wr.payload, {"addr": waddr, "data": wdata})
            got = ctx.get(dut.bus.rd_resp.valid), ctx.get(dut.bus.rd_resp.payload)
            want = expect.pop(t, None)
            assert got[0] == (want is not None), t
            if want is not None:
                assert got[1] == want, t
            if valid:
                expect[t + latency] = model[addr]   # sampled before this cycle's write
            if wvalid:
                model[waddr] = wdata
            await ctx.tick()
        ctx.set(dut.bus.wr.valid, 0)
        for a in range(beats):
            assert await _host_read(ctx, dut, a) == model[a]

    run_sim(dut, tb)


def test_rejects_non_config():
    with pytest.raises(TypeError, match="AcceleratorConfig"):
        DramModel({"latency": 3})
