"""cocotb: the PE array's Verilog (row skew of activations, control and weights) on random
steps against a numpy model of every lane's accumulators."""

import random

import cocotb
import numpy as np
import pytest
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge
from runner_util import config_from_env, pack, run_cocotb, unpack

from hw.array import Array
from hw.config import AcceleratorConfig, MemoryModel
from hw.numerics import wrap
from hw.pe import PE, index_bits

CFG = AcceleratorConfig(rows=4, cols=2, max_tokens=4, memory=MemoryModel(size_bytes=1 << 16))


@cocotb.test()
async def array_random_steps(dut):
    cfg = config_from_env()
    rng = random.Random(9)
    Clock(dut.clk, 10, unit="ns").start()
    dut.rst.value = 1
    dut.load.value = 0
    dut.valid.value = 0
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0
    wlim = 1 << (cfg.weight_operand_bits - 1)
    acc = np.zeros((cfg.max_tokens, cfg.lanes), dtype=np.int64)
    macs = slots = 0
    for s in range(40):
        w = np.array([rng.randrange(-wlim, wlim) for _ in range(cfg.lanes)], dtype=np.int64)
        idx = [rng.randrange(cfg.max_block) for _ in range(cfg.lanes)]
        await FallingEdge(dut.clk)
        macs += int(dut.mac.value == 1)
        dut.valid.value = 0
        dut.load.value = 1
        dut.w.value = pack(w, cfg.weight_operand_bits)
        dut.idx.value = pack(idx, index_bits(cfg))
        T = rng.randint(1, cfg.max_tokens)
        slots += T
        for t in range(T):
            await FallingEdge(dut.clk)
            macs += int(dut.mac.value == 1)
            dut.load.value = 0
            act = [rng.randrange(-128, 128) for _ in range(cfg.max_block)]
            dut.act.value = pack(act, cfg.act_bits)
            dut.tok.value = t
            dut.first.value = int(s == 0)
            dut.valid.value = 1
            prod = np.array(act, dtype=np.int64)[idx] * w
            acc[t] = wrap(prod + (0 if s == 0 else acc[t]), cfg.acc_bits)
    await FallingEdge(dut.clk)
    macs += int(dut.mac.value == 1)
    dut.valid.value = 0
    await ClockCycles(dut.clk, cfg.rows - 1 + PE.LATENCY, rising=False)
    assert macs == slots
    for t in range(cfg.max_tokens):
        dut.rd_addr.value = t
        await FallingEdge(dut.clk)
        got = unpack(dut.rd_data.value.to_unsigned(), cfg.acc_bits, cfg.lanes, signed=True)
        assert got == list(acc[t]), (t, got, list(acc[t]))


@pytest.mark.cocotb
@pytest.mark.slow
def test_array_cocotb(tmp_path):
    run_cocotb(Array(CFG), toplevel="array", test_module="test_array_cocotb",
               build_dir=tmp_path / "array", cfg=CFG)
