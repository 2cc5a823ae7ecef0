# amaranth: UnusedElaboratable=no
"""Weight-stream decoder: per-lane weights and indices as decode_gemm_weights / the format."""

import numpy as np
import pytest
from amaranth import Elaboratable, Module, unsigned
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import connect
from amaranth.sim import Simulator
from hypothesis import given, settings
from hypothesis import strategies as st

from hw.config import AcceleratorConfig, MemoryModel
from hw.decoder import Decoder, WeightOp, field_formats, spad_depth, spad_word_bits
from hw.format import WeightFormat, pack, random_quantized
from hw.isa import Gemm, GemmBody, word_beats
from sim.functional import decode_gemm_weights

SMALL = AcceleratorConfig(rows=2, cols=4, wgt_spad_bytes=512,
                          memory=MemoryModel(size_bytes=1 << 16))
#: 16 lanes, an M=2 pattern (5-bit fields), INT4 only, 6-bit codes, 48-word WGT spad (not a
#: power of two), 4-byte beats.
ODD = AcceleratorConfig(rows=2, cols=8, patterns=("1:2", "2:4", "1:8", "4:16"), weight_bits=(4,),
                        scale_code_bits=6, wgt_spad_bytes=768,
                        memory=MemoryModel(bytes_per_cycle=4, size_bytes=1 << 16))


class Harness(Elaboratable):
    def __init__(self, cfg, init=()):
        self.dec = Decoder(cfg)
        self.mem = Memory(shape=unsigned(spad_word_bits(cfg, "wgt")),
                          depth=spad_depth(cfg, "wgt"), init=init)

    def elaborate(self, platform):
        m = Module()
        m.submodules.dec = self.dec
        m.submodules.mem = self.mem
        connect(m, self.mem.read_port(), self.dec.rd)
        return m


def ops_of(ins, cfg, rng):
    """The operation sequence of an instruction, with random idle cycles between operations."""
    pat = cfg.pattern_table[ins.pattern]
    n, mb = (1, 1) if pat.dense else (pat.n, pat.m)
    ops = []
    for s in range(ins.k_steps):
        if ins.group_steps and s % ins.group_steps == 0:
            ops.append((WeightOp.CODES, 0))
            if ins.asym:
                ops.append((WeightOp.ZEROS, 0))
        ops.append((WeightOp.RECORD, (s // n) * mb % cfg.max_block))
        ops += [(WeightOp.NONE, 0)] * int(rng.integers(0, 3) * (rng.random() < 0.4))
    return ops


def run_decoder(cfg, program, wgt, rng):
    """Decode each instruction of ``program`` from the WGT bytes ``wgt``; return per
    instruction the list of (weights, indices) records in output order."""
    wb = cfg.wgt_word_bytes
    init = [int.from_bytes(wgt[i * wb:(i + 1) * wb].tobytes(), "little")
            for i in range(wgt.size // wb)]
    h = Harness(cfg, init)
    dec = h.dec
    results = []

    async def testbench(ctx):
        for ins in program:
            ops = ops_of(ins, cfg, rng)
            body = sum(int(v) << GemmBody[k].offset for k, v in ins._body_fields().items())
            # Idle cycles first, reading from anywhere: the stream must not depend on them.
            ctx.set(dec.idle, 1)
            for _ in range(int(rng.integers(0, 3))):
                ctx.set(dec.wgt_addr, int(rng.integers(cfg.spad_beats("wgt"))))
                await ctx.tick()
            ctx.set(dec.wgt_addr, ins.wgt_addr)   # the stream's first cycle: idle's last
            await ctx.tick()
            ctx.set(dec.idle, 0)
            ctx.set(dec.ins.as_value(), body)
            await ctx.tick().repeat(Decoder.FIRST_OP - 1)
            out = []
            for n in range(len(ops) + Decoder.LATENCY):
                if n < len(ops):
                    ctx.set(dec.op, ops[n][0])
                    ctx.set(dec.sub, ops[n][1])
                else:
                    ctx.set(dec.op, WeightOp.NONE)
                if ctx.get(dec.valid):
                    # A RECORD issued LATENCY cycles ago.
                    assert n >= Decoder.LATENCY and ops[n - Decoder.LATENCY][0] == WeightOp.RECORD
                    out.append(([ctx.get(dec.w[l]) for l in range(cfg.lanes)],
                                [ctx.get(dec.idx[l]) for l in range(cfg.lanes)]))
                await ctx.tick()
            results.append(out)

    sim = Simulator(h)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    return results


def check_against_model(cfg, program, wgt, results):
    for ins, out in zip(program, results, strict=True):
        w_eff, pos = decode_gemm_weights(ins, cfg, wgt)
        assert len(out) == ins.k_steps
        for s, (w, idx) in enumerate(out):
            assert w == list(w_eff[:, s]), (ins, s)
            assert idx == list(pos[:, s] % cfg.max_block), (ins, s)


def random_ins(cfg, rng):
    pat = int(rng.integers(len(cfg.pattern_table)))
    int8 = pat == 0 and 8 in cfg.weight_bits and rng.random() < 0.4
    k = int(rng.integers(1, 20))
    gs = 0 if rng.random() < 0.3 else int(rng.integers(1, k + 2))
    words = word_beats(cfg.wgt_word_bytes, cfg)
    return Gemm(wgt_addr=int(rng.integers(cfg.spad_beats("wgt") // words)) * words,
                k_steps=k, group_steps=gs, pattern=pat, int8=bool(int8),
                asym=bool(gs and rng.random() < 0.5))


@pytest.mark.parametrize("cfg", [SMALL, ODD], ids=["small", "odd"])
def test_random_bytes_all_modes(cfg):
    """Any byte stream, every pattern/width/header mode, starts anywhere (reads wrap)."""
    rng = np.random.default_rng(5)
    wgt = rng.integers(0, 256, size=cfg.wgt_spad_bytes, dtype=np.uint8)
    program = [random_ins(cfg, rng) for _ in range(16)]
    # The last stream starts in the last word, so it wraps to word 0 at once.
    words = word_beats(cfg.wgt_word_bytes, cfg)
    program.append(Gemm(wgt_addr=cfg.spad_beats("wgt") - words, k_steps=9, group_steps=4,
                        asym=True, pattern=1))
    check_against_model(cfg, program, wgt, run_decoder(cfg, program, wgt, rng))


@settings(max_examples=8)
@given(seed=st.integers(0, 2**32 - 1), pattern=st.integers(0, len(SMALL.pattern_table) - 1),
       sym=st.booleans(), group=st.sampled_from([0, 16, 32, 64]))
def test_packed_stream_is_the_quantized_weight(seed, pattern, sym, group):
    """A stream packed by hw.format.pack decodes to QuantizedWeight.int_values()."""
    cfg = SMALL
    p = cfg.pattern_table[pattern]
    if group % p.block:
        group = 0
    rng = np.random.default_rng(seed)
    bits = 8 if p.dense and seed % 3 == 0 else 4
    fmt = WeightFormat(p, bits, group, symmetric=sym or group == 0, raw=group == 0)
    w = random_quantized(fmt, (cfg.lanes, 64), rng)
    stream = pack(w, cfg.lanes)
    wgt = np.zeros(cfg.wgt_spad_bytes, dtype=np.uint8)
    wgt[:stream.size] = stream
    kp = w.k_padded
    ins = Gemm(k_steps=fmt.steps(kp), group_steps=0 if fmt.raw else fmt.steps_per_group(kp),
               pattern=pattern, int8=bits == 8, asym=not fmt.symmetric)
    (out,) = run_decoder(cfg, [ins], wgt, rng)
    ref = w.int_values()
    pos = w.positions()
    for s, (wv, idx) in enumerate(out):
        assert wv == list(ref[:, s])
        assert idx == list(pos[:, s] % cfg.max_block)


def test_field_formats():
    assert field_formats(AcceleratorConfig()) == [(4, 0), (4, 2), (4, 3), (4, 4), (8, 0)]
    assert field_formats(ODD) == [(4, 0), (4, 1), (4, 2), (4, 3), (4, 4)]


def test_rejects_non_config():
    with pytest.raises(TypeError, match="got None"):
        Decoder(None)
