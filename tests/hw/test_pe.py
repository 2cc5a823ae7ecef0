# amaranth: UnusedElaboratable=no
"""PE: index mux, multiply, wrap-around accumulation per token, epilogue read port."""

import numpy as np
import pytest
from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st

from hw.config import AcceleratorConfig, MemoryModel
from hw.numerics import wrap
from hw.pe import MULT_BITS, PE, SLICE_BITS

CFG = AcceleratorConfig(rows=2, cols=4, max_tokens=4, memory=MemoryModel(size_bytes=1 << 16))
#: 24-bit accumulators wrap quickly with the largest operands.
NARROW_ACC = AcceleratorConfig(rows=2, cols=4, max_tokens=2, acc_bits=24,
                               memory=MemoryModel(size_bytes=1 << 16))


def random_schedule(cfg, rng, steps, *, extreme=False):
    """Cycles of PE inputs: each step loads a weight, then runs T MACs on random tokens (the
    next load may share the cycle of the last MAC, as in the array)."""
    wlim = 1 << (cfg.weight_operand_bits - 1)
    cycles = []
    for s in range(steps):
        T = int(rng.integers(1, cfg.max_tokens + 1))
        w = int(rng.choice([-wlim, wlim - 1])) if extreme else int(rng.integers(-wlim, wlim))
        load = {"load": 1, "w_in": w, "idx_in": int(rng.integers(cfg.max_block))}
        if cycles and not cycles[-1].get("load") and rng.random() < 0.5:
            cycles[-1].update(load)  # load in the cycle of the previous step's last MAC
        else:
            cycles.append(load)
        for _ in range(T):
            act = rng.integers(-128, 128, size=cfg.max_block)
            if extreme:
                act[:] = -128
            cycles.append({"valid": 1, "act": [int(a) for a in act],
                           "tok": int(rng.integers(cfg.max_tokens)),
                           "first": int(rng.random() < 0.2 or s == 0)})
        cycles += [{} for _ in range(int(rng.integers(0, 3)))]
    return cycles


def reference(cfg, cycles):
    """Accumulator file after the schedule (tokens never written read as 0)."""
    acc = np.zeros(cfg.max_tokens, dtype=np.int64)
    w = idx = 0
    for c in cycles:
        if c.get("valid"):
            prod = c["act"][idx] * w
            acc[c["tok"]] = wrap(prod + (0 if c["first"] else acc[c["tok"]]), cfg.acc_bits)
        if c.get("load"):  # takes effect from the next cycle
            w, idx = c["w_in"], c["idx_in"]
    return acc


async def drive(ctx, dut, cycles):
    """Apply one cycle dict per clock, then idle until the last MAC is readable."""
    for c in cycles:
        ctx.set(dut.load, c.get("load", 0))
        if c.get("load"):
            ctx.set(dut.w_in, c["w_in"])
            ctx.set(dut.idx_in, c["idx_in"])
        ctx.set(dut.valid, c.get("valid", 0))
        if c.get("valid"):
            ctx.set(dut.act, c["act"])
            ctx.set(dut.tok, c["tok"])
            ctx.set(dut.first, c["first"])
        await ctx.tick()
    ctx.set(dut.load, 0)
    ctx.set(dut.valid, 0)
    await ctx.tick().repeat(PE.LATENCY - 1)


def run_pe(cfg, cycles):
    """Drive the cycles, drain, and read every accumulator through the epilogue port."""
    dut = PE(cfg)
    got = []

    async def testbench(ctx):
        await drive(ctx, dut, cycles)
        for t in range(cfg.max_tokens):  # the address is registered: data a cycle later
            ctx.set(dut.rd_addr, t)
            await ctx.tick()
            got.append(ctx.get(dut.rd_data))

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    return got


@settings(max_examples=12)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_schedules(seed):
    rng = np.random.default_rng(seed)
    cycles = random_schedule(CFG, rng, 12)
    ref = reference(CFG, cycles)
    written = {c["tok"] for c in cycles if c.get("valid")}
    got = run_pe(CFG, cycles)
    for t in written:
        assert got[t] == ref[t], (t, got, ref)


def test_back_to_back_same_token_and_wrap():
    """T = 1 on one token every cycle (read-after-write in consecutive cycles) with the largest
    products, so a 24-bit accumulator wraps several times."""
    cfg = NARROW_ACC
    rng = np.random.default_rng(1)
    cycles = random_schedule(cfg, rng, 60, extreme=True)
    for c in cycles:
        if c.get("valid"):
            c["tok"] = 0
            c["first"] = int(c is cycles[1])
    ref = reference(cfg, cycles)
    assert abs(sum(c["act"][0] * (1 << cfg.weight_operand_bits - 1) for c in cycles
                   if c.get("valid"))) > 1 << cfg.acc_bits  # it does wrap
    assert run_pe(cfg, cycles)[0] == ref[0]


def test_index_selects_each_activation():
    """With weight 1, the accumulator of token t is the activation the index names."""
    cycles = []
    acts = [[16 * t + i - 64 for i in range(CFG.max_block)] for t in range(CFG.max_tokens)]
    for idx in range(CFG.max_block):
        cycles = [{"load": 1, "w_in": 1, "idx_in": idx}]
        cycles += [{"valid": 1, "act": acts[t], "tok": t, "first": 1}
                   for t in range(CFG.max_tokens)]
        assert run_pe(CFG, cycles) == [acts[t][idx] for t in range(CFG.max_tokens)]


def test_rejects_non_config():
    with pytest.raises(TypeError, match="got 4"):
        PE(4)


def test_epilogue_borrows_the_multiplier():
    """With rd_addr in e - 1 and ep high in e, ep_lo in e + 2 is the entry's low SLICE_BITS times
    ep_mult, one entry per cycle."""
    cfg = CFG
    rng = np.random.default_rng(4)
    cycles = random_schedule(cfg, rng, 6)
    ref = reference(cfg, cycles)
    dut = PE(cfg)
    mults = [int(v) for v in rng.integers(0, 1 << MULT_BITS, size=cfg.max_tokens)]
    got = []

    async def testbench(ctx):
        await drive(ctx, dut, cycles)
        # Address in cycle k, entry and ep in k + 1, product in k + 3.
        for k in range(cfg.max_tokens + 3):
            ctx.set(dut.rd_addr, k % cfg.max_tokens)
            ctx.set(dut.ep, int(1 <= k <= cfg.max_tokens))
            if 1 <= k <= cfg.max_tokens:
                ctx.set(dut.ep_mult, mults[k - 1])
            if k >= 3:
                got.append(ctx.get(dut.ep_lo))
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    lo = [int(v) & ((1 << SLICE_BITS) - 1) for v in ref]
    assert got == [lo[t] * mults[t] for t in range(cfg.max_tokens)]
