# amaranth: UnusedElaboratable=no
"""PE array: row skew for activations, control and weights; every lane's accumulators."""

import numpy as np
import pytest
from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st

from hw.array import Array
from hw.config import AcceleratorConfig, MemoryModel
from hw.numerics import wrap
from hw.pe import MULT_BITS, PE, SLICE_BITS

CFG = AcceleratorConfig(rows=2, cols=4, max_tokens=4, memory=MemoryModel(size_bytes=1 << 16))
TALL = AcceleratorConfig(rows=4, cols=2, max_tokens=2, acc_bits=24,
                         memory=MemoryModel(size_bytes=1 << 16))


def random_steps(cfg, rng, steps):
    """Steps of (weights, indices, [(act block, token, first)...]) with idle gaps; tokens are
    0..T-1 in order as the core issues them."""
    wlim = 1 << (cfg.weight_operand_bits - 1)
    out = []
    for s in range(steps):
        T = int(rng.integers(1, cfg.max_tokens + 1))
        w = rng.integers(-wlim, wlim, size=cfg.lanes)
        idx = rng.integers(0, cfg.max_block, size=cfg.lanes)
        macs = [(rng.integers(-128, 128, size=cfg.max_block), t, s == 0) for t in range(T)]
        out.append((w, idx, macs, int(rng.integers(0, 3))))
    return out


def reference(cfg, steps):
    acc = np.zeros((cfg.max_tokens, cfg.lanes), dtype=np.int64)
    for w, idx, macs, _ in steps:
        for act, t, first in macs:
            prod = act[idx].astype(np.int64) * w
            acc[t] = wrap(prod + (0 if first else acc[t]), cfg.acc_bits)
    return acc


def cycles_of(steps):
    """Per-cycle inputs: a load, then the step's MACs; a load shares the cycle of the previous
    step's last MAC when there is no gap (as the core schedules them)."""
    cycles = []
    for w, idx, macs, gap in steps:
        load = {"load": 1, "w": [int(v) for v in w], "idx": [int(v) for v in idx]}
        if cycles and "load" not in cycles[-1] and cycles[-1]:
            cycles[-1].update(load)
        else:
            cycles.append(load)
        cycles += [{"valid": 1, "act": [int(a) for a in act], "tok": t, "first": int(first)}
                   for act, t, first in macs]
        cycles += [{} for _ in range(gap)]
    return cycles


async def drive(ctx, dut, cfg, steps):
    """Apply the steps (row 0 timing), then idle until the last MAC is readable in every row;
    returns the number of cycles ``mac`` was high."""
    macs = 0
    for c in cycles_of(steps):
        ctx.set(dut.load, c.get("load", 0))
        if "load" in c:
            ctx.set(dut.w, c["w"])
            ctx.set(dut.idx, c["idx"])
        ctx.set(dut.valid, c.get("valid", 0))
        if "valid" in c:
            ctx.set(dut.act, c["act"])
            ctx.set(dut.tok, c["tok"])
            ctx.set(dut.first, c["first"])
        macs += ctx.get(dut.mac)
        await ctx.tick()
    ctx.set(dut.valid, 0)
    ctx.set(dut.load, 0)
    # The last MAC entered row 0 at most one cycle ago; it is readable in the last row
    # rows - 1 + LATENCY cycles after it entered, the address given a cycle before.
    await ctx.tick().repeat(cfg.rows - 1 + PE.LATENCY - 2)
    return macs


def run_array(cfg, steps):
    """Drive the steps (row 0 timing); return the accumulators, read in the first cycle in
    which the last MAC is readable in every row, and the number of ``mac`` cycles."""
    dut = Array(cfg)
    res = {}

    async def testbench(ctx):
        macs = await drive(ctx, dut, cfg, steps)
        acc = np.zeros((cfg.max_tokens, cfg.lanes), dtype=np.int64)
        for t in range(cfg.max_tokens):  # the address is registered: data a cycle later
            ctx.set(dut.rd_addr, t)
            await ctx.tick()
            acc[t] = [ctx.get(dut.rd_data[l]) for l in range(cfg.lanes)]
        res["acc"], res["macs"] = acc, macs

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    return res["acc"], res["macs"]


@settings(max_examples=6)
@given(seed=st.integers(0, 2**32 - 1), tall=st.booleans())
def test_random_steps(seed, tall):
    cfg = TALL if tall else CFG
    rng = np.random.default_rng(seed)
    steps = random_steps(cfg, rng, 10)
    acc, macs = run_array(cfg, steps)
    ref = reference(cfg, steps)
    used = max(len(s[2]) for s in steps)
    assert np.array_equal(acc[:used], ref[:used])
    assert macs == sum(len(s[2]) for s in steps)


def test_one_token_every_cycle():
    """T = 1 with no gaps: a new weight per lane and a MAC every cycle (the GEMV case)."""
    rng = np.random.default_rng(2)
    steps = [(w, idx, macs[:1], 0) for w, idx, macs, _ in random_steps(TALL, rng, 30)]
    acc, macs = run_array(TALL, steps)
    assert np.array_equal(acc[:1], reference(TALL, steps)[:1]) and macs == 30


def test_rejects_non_config():
    with pytest.raises(TypeError, match="got 'x'"):
        Array("x")


def test_epilogue_products_of_every_lane():
    """ep reads: every lane's ep_lo is its entry's low slice times its own multiplier."""
    cfg = CFG
    rng = np.random.default_rng(6)
    steps = random_steps(cfg, rng, 5)
    ref = reference(cfg, steps)
    mults = [int(v) for v in rng.integers(0, 1 << MULT_BITS, size=cfg.lanes)]
    dut = Array(cfg)
    got = []

    async def testbench(ctx):
        await drive(ctx, dut, cfg, steps)
        ctx.set(dut.ep_mult, mults)
        for k in range(cfg.max_tokens + 3):  # address and ep_next in k, read and ep in k + 1
            ctx.set(dut.rd_addr, k % cfg.max_tokens)
            ctx.set(dut.ep_next, int(k < cfg.max_tokens))
            if k >= 3:
                got.append([ctx.get(dut.ep_lo[l]) for l in range(cfg.lanes)])
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    lo = ref & ((1 << SLICE_BITS) - 1)
    assert got == [[int(lo[t, l]) * mults[l] for l in range(cfg.lanes)]
                   for t in range(cfg.max_tokens)]
