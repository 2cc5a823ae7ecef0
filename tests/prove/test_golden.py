"""The formal references are the project's definitions: checked here on concrete values."""

from __future__ import annotations

import random

import numpy as np
import pytest
from amaranth import Module, Signal
from amaranth.sim import Simulator

from formal import formal_config
from formal.dequant import _formats, golden_weight
from formal.fetch import rule_error
from hw.config import AcceleratorConfig
from hw.format import QuantizedWeight, WeightFormat
from hw.isa import (
    INSTR_BITS,
    NO_EVENT,
    decode_fields,
    dispatch_errors,
    field_location,
    program_words,
)


def _all_weights(fmt: WeightFormat) -> tuple[QuantizedWeight, np.ndarray, np.ndarray,
                                                 np.ndarray]:
    """A dense QuantizedWeight whose rows run every code (and zero) over every value."""
    qs = np.arange(fmt.qmin, fmt.qmax + 1)
    k = -(-qs.size // 16) * 16
    codes = np.ones(1, np.int64) if fmt.raw else np.arange(fmt.code_max + 1)
    zeros = np.zeros(1, np.int64) if fmt.symmetric else np.arange(1 << fmt.bits)
    cc, zz = (a.ravel() for a in np.meshgrid(codes, zeros, indexing="ij"))
    values = np.zeros((cc.size, k), np.int16)
    values[:, :qs.size] = qs
    fmt = WeightFormat(bits=fmt.bits, group=k, symmetric=fmt.symmetric,
                       code_bits=fmt.code_bits, raw=fmt.raw)
    w = QuantizedWeight(fmt=fmt, shape=(cc.size, k), values=values, index=None,
                        codes=cc[:, None].astype(np.uint8),
                        zeros=None if fmt.symmetric else zz[:, None].astype(np.uint8),
                        row_scale=np.ones(cc.size, np.float32))
    return w, values[:, :qs.size], cc, zz


@pytest.mark.parametrize("code_bits", [4, 6, 8])
def test_golden_weight_is_int_values(code_bits):
    """golden_weight of the raw field bits == QuantizedWeight.int_values, every value, code and
    zero point of every format the configuration streams."""
    cfg = AcceleratorConfig(scale_code_bits=code_bits)
    for fmt in _formats(cfg):
        w, q, codes, zeros = _all_weights(fmt)
        want = w.int_values()[:, :q.shape[1]]
        raw_bits = q.astype(np.int64) & ((1 << fmt.bits) - 1)
        got = golden_weight(raw_bits, codes[:, None], zeros[:, None], fmt)
        np.testing.assert_array_equal(got, want, err_msg=str(fmt))


def _field_word(rng: random.Random, cfg: AcceleratorConfig) -> int:
    """A random word whose fields sit near the limits the rules compare them with."""
    word = rng.getrandbits(INSTR_BITS)

    def put(name, value):
        nonlocal word
        off, width = field_location(name)
        word = (word & ~(((1 << width) - 1) << off)) | ((value & ((1 << width) - 1)) << off)

    put("opcode", rng.randrange(8))
    for ev in ("wait", "signal"):
        put(ev, rng.choice([NO_EVENT, 0, cfg.num_events - 1, cfg.num_events, rng.randrange(32)]))
    small = {"dma.rows": 3, "dma.row_beats": 3, "dma.spad": 4, "dma.dram_stride": 3,
             "gemm.pattern": len(cfg.pattern_table) + 1, "gemm.tokens_m1": cfg.max_tokens + 1,
             "gemm.k_steps": 2, "gemm.group_steps": 2, "gemm.int8": 2, "gemm.asym": 2,
             "gemm.epilogue": 4, "gemm.wgt_addr": 8, "gemm.act_addr": 4, "gemm.act_stride": 4,
             "gemm.out_addr": 8, "gemm.param_addr": 16, "sync.engine": 4}
    for name, limit in small.items():
        if rng.random() < 0.6:
            put(name, rng.randrange(limit))
    for name, spad in (("dma.spad_addr", "act"), ("dma.dram_addr", None)):
        if rng.random() < 0.5:
            lim = cfg.dram_beats if spad is None else cfg.spad_beats(spad)
            put(name, lim - rng.randrange(4))
    return word


def test_rule_error_is_dispatch_errors():
    """The rule table lifted onto Amaranth values (the fetch proof's reference) gives
    dispatch_errors' code on random and near-limit words."""
    cfg = formal_config()
    rng = random.Random(14)
    words = [_field_word(rng, cfg) for _ in range(600)] + \
        [rng.getrandbits(INSTR_BITS) for _ in range(100)]
    want = dispatch_errors(decode_fields(program_words(words)), cfg)
    assert len(set(want.tolist())) >= 4  # the words reach several rules
    word = Signal(INSTR_BITS)
    err = Signal(4)
    m = Module()
    m.d.comb += err.eq(rule_error(word, cfg))
    got = []

    async def bench(ctx):
        for w in words:
            ctx.set(word, w)
            got.append(ctx.get(err))

    sim = Simulator(m)
    sim.add_testbench(bench)
    sim.run()
    assert got == want.tolist()
