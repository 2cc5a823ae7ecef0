"""cocotb: the PE's Verilog on a random MAC schedule against a numpy accumulator model."""

import random

import cocotb
import pytest
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge
from runner_util import config_from_env, mask, pack, run_cocotb, unpack

from hw.config import AcceleratorConfig, MemoryModel
from hw.numerics import wrap
from hw.pe import PE

CFG = AcceleratorConfig(rows=2, cols=4, max_tokens=4, acc_bits=24,
                        memory=MemoryModel(size_bytes=1 << 16))


def schedule(cfg, rng, steps):
    """Per-cycle inputs: a weight load, then T MACs on random tokens (back to back)."""
    wlim = 1 << (cfg.weight_operand_bits - 1)
    cycles = []
    for s in range(steps):
        cycles.append({"load": 1, "w_in": rng.randrange(-wlim, wlim),
                       "idx_in": rng.randrange(cfg.max_block)})
        for _ in range(rng.randint(1, cfg.max_tokens)):
            cycles.append({"valid": 1, "tok": rng.randrange(cfg.max_tokens),
                           "first": int(s == 0 or rng.random() < 0.1),
                           "act": [rng.randrange(-128, 128) for _ in range(cfg.max_block)]})
    return cycles


@cocotb.test()
async def pe_random_schedule(dut):
    cfg = config_from_env()
    rng = random.Random(5)
    Clock(dut.clk, 10, unit="ns").start()
    dut.rst.value = 1
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0
    cycles = schedule(cfg, rng, 80)
    acc = [0] * cfg.max_tokens
    w = idx = 0
    for c in cycles:
        await FallingEdge(dut.clk)
        dut.load.value = c.get("load", 0)
        dut.valid.value = c.get("valid", 0)
        if c.get("load"):
            dut.w_in.value = mask(c["w_in"], cfg.weight_operand_bits)
            dut.idx_in.value = c["idx_in"]
        if c.get("valid"):
            dut.tok.value = c["tok"]
            dut.first.value = c["first"]
            dut.act.value = pack(c["act"], cfg.act_bits)
            t = c["tok"]
            acc[t] = int(wrap(c["act"][idx] * w + (0 if c["first"] else acc[t]), cfg.acc_bits))
        if c.get("load"):
            w, idx = c["w_in"], c["idx_in"]
    await FallingEdge(dut.clk)
    dut.load.value = 0
    dut.valid.value = 0
    await ClockCycles(dut.clk, PE.LATENCY)
    written = {c["tok"] for c in cycles if c.get("valid")}
    for t in sorted(written):
        await FallingEdge(dut.clk)
        dut.rd_addr.value = t
        await FallingEdge(dut.clk)
        (got,) = unpack(dut.rd_data.value.to_unsigned(), cfg.acc_bits, 1, signed=True)
        assert got == acc[t], (t, got, acc[t])


@pytest.mark.cocotb
@pytest.mark.slow
def test_pe_cocotb(tmp_path):
    run_cocotb(PE(CFG), toplevel="pe", test_module="test_pe_cocotb", build_dir=tmp_path / "pe",
               cfg=CFG)
