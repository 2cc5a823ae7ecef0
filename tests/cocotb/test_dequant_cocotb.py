"""cocotb: the Dequant unit's Verilog against hw.dequant.dequant_reference (random vectors)."""

import random

import cocotb
import pytest
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge
from runner_util import config_from_env, run_cocotb, unpack

from hw.config import AcceleratorConfig, MemoryModel
from hw.dequant import Dequant, dequant_reference, field_value

CFG = AcceleratorConfig(rows=2, cols=4, scale_code_bits=6, memory=MemoryModel(size_bytes=1 << 16))


@cocotb.test()
async def dequant_random_vectors(dut):
    cfg = config_from_env()
    rng = random.Random(11)
    Clock(dut.clk, 10, unit="ns").start()
    dut.rst.value = 0
    vmax = (1 << max(cfg.weight_bits)) - 1
    vectors = []
    for n in range(600 + Dequant.LATENCY):
        await FallingEdge(dut.clk)
        if n >= Dequant.LATENCY:
            v = vectors[n - Dequant.LATENCY]
            (got,) = unpack(dut.w.value.to_unsigned(), cfg.weight_operand_bits, 1, signed=True)
            assert got == dequant_reference(**v, cfg=cfg), v
        raw = rng.random() < 0.2
        v = {"value": rng.randint(0, vmax), "code": rng.randint(0, (1 << cfg.scale_code_bits) - 1),
             "zero": rng.randint(0, vmax), "int8": 8 in cfg.weight_bits and rng.random() < 0.5,
             "asym": not raw and rng.random() < 0.5, "raw": raw}
        vectors.append(v)
        for name in ("code", "zero", "int8", "asym", "raw"):
            getattr(dut, name).value = int(v[name])
        bits = 8 if v["int8"] else 4
        q = field_value(v["value"], bits, v["asym"])
        dut.q.value = q & ((1 << len(dut.q)) - 1)   # two's complement bit pattern


@pytest.mark.cocotb
def test_dequant_cocotb(tmp_path):
    run_cocotb(Dequant(CFG), toplevel="dequant", test_module="test_dequant_cocotb",
               build_dir=tmp_path / "dequant", cfg=CFG)
