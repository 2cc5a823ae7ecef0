"""cocotb: the decoder's Verilog with a behavioural WGT scratchpad, against
sim.functional.decode_gemm_weights on random bytes (every pattern, width and header mode)."""

import random

import cocotb
import numpy as np
import pytest
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, FallingEdge, ReadOnly
from runner_util import config_from_env, run_cocotb, unpack

from hw.config import AcceleratorConfig, MemoryModel
from hw.decoder import Decoder, WeightOp, spad_depth
from hw.isa import Gemm, GemmBody, word_beats
from hw.pe import index_bits
from sim.functional import decode_gemm_weights

CFG = AcceleratorConfig(rows=2, cols=4, wgt_spad_bytes=384, memory=MemoryModel(size_bytes=1 << 16))


def random_ins(cfg, rng):
    pat = rng.randrange(len(cfg.pattern_table))
    int8 = pat == 0 and rng.random() < 0.4
    k = rng.randint(1, 16)
    gs = 0 if rng.random() < 0.3 else rng.randint(1, k + 1)
    words = word_beats(cfg.wgt_word_bytes, cfg)
    return Gemm(wgt_addr=rng.randrange(cfg.spad_beats("wgt") // words) * words, k_steps=k,
                group_steps=gs, pattern=pat, int8=int8, asym=bool(gs) and rng.random() < 0.5)


def ops_of(ins, cfg, rng):
    pat = cfg.pattern_table[ins.pattern]
    n, m = (1, 1) if pat.dense else (pat.n, pat.m)
    ops = []
    for s in range(ins.k_steps):
        if ins.group_steps and s % ins.group_steps == 0:
            ops.append((WeightOp.CODES, 0))
            if ins.asym:
                ops.append((WeightOp.ZEROS, 0))
        ops.append((WeightOp.RECORD, (s // n) * m % cfg.max_block))
        if rng.random() < 0.3:
            ops.append((WeightOp.NONE, 0))
    return ops


@cocotb.test()
async def decoder_random_streams(dut):
    cfg = config_from_env()
    rng = random.Random(3)
    wb = cfg.wgt_word_bytes
    wgt = np.array([rng.randrange(256) for _ in range(cfg.wgt_spad_bytes)], dtype=np.uint8)
    mem = [int.from_bytes(wgt[i * wb:(i + 1) * wb].tobytes(), "little")
           for i in range(spad_depth(cfg, "wgt"))]
    Clock(dut.clk, 10, unit="ns").start()
    dut.rst.value = 1
    dut.start.value = 0
    dut.op.value = 0
    await ClockCycles(dut.clk, 2)
    dut.rst.value = 0
    last_addr = [0]

    async def scratchpad():  # synchronous read: data in the cycle after the address
        while True:
            await FallingEdge(dut.clk)
            dut.rd__data.value = mem[last_addr[0]]
            await ReadOnly()  # the address once this cycle's inputs have settled
            last_addr[0] = dut.rd__addr.value.to_unsigned()

    cocotb.start_soon(scratchpad())
    for _ in range(12):
        ins = random_ins(cfg, rng)
        ops = ops_of(ins, cfg, rng)
        body = sum(int(v) << GemmBody[k].offset for k, v in ins._body_fields().items())
        await FallingEdge(dut.clk)
        dut.start.value = 1
        dut.wgt_addr.value = ins.wgt_addr
        await FallingEdge(dut.clk)
        dut.start.value = 0
        dut.ins.value = body
        await ClockCycles(dut.clk, Decoder.FIRST_OP - 1, rising=False)
        records = []
        for n in range(len(ops) + Decoder.LATENCY):
            if dut.valid.value == 1:
                records.append((
                    unpack(dut.w.value.to_unsigned(), cfg.weight_operand_bits, cfg.lanes,
                           signed=True),
                    unpack(dut.idx.value.to_unsigned(), index_bits(cfg), cfg.lanes,
                           signed=False)))
            op, sub = ops[n] if n < len(ops) else (WeightOp.NONE, 0)
            dut.op.value = op.value
            dut.sub.value = sub
            await FallingEdge(dut.clk)
        w_eff, pos = decode_gemm_weights(ins, cfg, wgt)
        assert len(records) == ins.k_steps, ins
        for s, (w, idx) in enumerate(records):
            assert w == list(w_eff[:, s]), (ins, s)
            assert idx == list(pos[:, s] % cfg.max_block), (ins, s)


@pytest.mark.cocotb
@pytest.mark.slow
def test_decoder_cocotb(tmp_path):
    run_cocotb(Decoder(CFG), toplevel="decoder", test_module="test_decoder_cocotb",
               build_dir=tmp_path / "decoder", cfg=CFG)
