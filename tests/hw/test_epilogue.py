# amaranth: UnusedElaboratable=no
"""Epilogue: OUT bytes of sim.functional's epilogue (WIDE, INT8, INT8_RESIDUAL, NONE) and its
exact duration."""

import numpy as np
import pytest
from amaranth import Elaboratable, Module, Signal, signed, unsigned
from amaranth.lib import data
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import connect
from amaranth.sim import Simulator

from hw.config import AcceleratorConfig, MemoryModel
from hw.decoder import spad_depth, spad_word_bits
from hw.epilogue import Epilogue
from hw.isa import EpilogueMode, Gemm, GemmBody, Spad, word_beats
from hw.pe import MULT_BITS, SLICE_BITS
from hw.timing import epilogue_cycles
from sim.functional import MachineState, _epilogue

SMALL = AcceleratorConfig(rows=2, cols=4, max_tokens=8, out_spad_bytes=256,
                          param_spad_bytes=256, memory=MemoryModel(size_bytes=1 << 16))
#: 16 lanes, 24-bit accumulators, 4-byte beats, OUT and PARAM depths not powers of two.
ODD = AcceleratorConfig(rows=2, cols=8, max_tokens=4, acc_bits=24, out_spad_bytes=16 * 7,
                        param_spad_bytes=32 * 5,
                        memory=MemoryModel(bytes_per_cycle=4, size_bytes=1 << 16))
#: 48-bit accumulators: three multiplier slices.
WIDEACC = AcceleratorConfig(rows=1, cols=8, max_tokens=4, acc_bits=48, out_spad_bytes=256,
                            param_spad_bytes=256, memory=MemoryModel(size_bytes=1 << 16))


class Harness(Elaboratable):
    """The epilogue with PARAM/OUT memories, an accumulator memory (synchronous read) and
    behavioural stand-ins for the borrowed PE and Dequant multipliers (same latencies)."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.epi = Epilogue(cfg)
        self.acc = Memory(shape=data.ArrayLayout(signed(cfg.acc_bits), cfg.lanes),
                          depth=cfg.max_tokens, init=[])
        self.param = Memory(shape=unsigned(spad_word_bits(cfg, "param")),
                            depth=spad_depth(cfg, "param"), init=[])
        self.out = Memory(shape=unsigned(spad_word_bits(cfg, "out")),
                          depth=spad_depth(cfg, "out"), init=[])

    def elaborate(self, platform):
        m = Module()
        m.submodules.epi = epi = self.epi
        m.submodules.acc = self.acc
        m.submodules.param = self.param
        m.submodules.out = self.out
        rd = self.acc.read_port()  # the array registers the address: data a cycle later
        m.d.comb += [rd.addr.eq(epi.acc_addr), epi.acc_data.eq(rd.data)]
        cfg = self.cfg
        ep = Signal()  # the array's register of ep_next
        m.d.sync += ep.eq(epi.ep_next)
        for l in range(cfg.lanes):
            # PE: operands latched in the read cycle, product one cycle later.
            lo = Signal(SLICE_BITS)
            mul = Signal(MULT_BITS)
            with m.If(ep):
                m.d.sync += [lo.eq(rd.data[l].as_unsigned()[:SLICE_BITS]), mul.eq(epi.mult[l])]
            m.d.sync += epi.lo_prod[l].eq(lo * mul)
            # Dequant: operands latched with hi_en, product one cycle later.
            hi = Signal.like(epi.hi[l])
            with m.If(epi.hi_en):
                m.d.sync += hi.eq(epi.hi[l])
            m.d.sync += epi.hi_prod[l].eq(hi * epi.mult[l])
        connect(m, self.param.read_port(), epi.param_rd)
        connect(m, self.out.write_port(), epi.out_wr)
        return m


def random_epilogue(cfg, rng, kind):
    def addr(spad, word):
        wb = word_beats(word, cfg)
        return int(rng.integers(0, cfg.spad_beats(spad) // wb)) * wb

    return Gemm(out_addr=addr("out", cfg.out_word_bytes),
                param_addr=addr("param", cfg.param_word_bytes),
                tokens=int(rng.integers(1, cfg.max_tokens + 1)), epilogue=kind,
                shift=int(rng.choice([0, 1, int(rng.integers(32)), 31])))


def run_epilogues(cfg, program, seed):
    """Run each epilogue on random accumulators/PARAM bytes; check bytes and duration."""
    rng = np.random.default_rng(seed)
    h = Harness(cfg)
    epi = h.epi
    st = MachineState(cfg)
    half = 1 << (cfg.acc_bits - 1)

    async def testbench(ctx):
        for n, ins in enumerate(program):
            # Accumulators: random, with some extremes (saturation, int32 wrap for WIDE).
            acc = rng.integers(-half, half, size=(cfg.max_tokens, cfg.lanes), dtype=np.int64)
            acc[0, :2] = [-half, half - 1]
            st.acc[:] = acc
            for t in range(cfg.max_tokens):
                ctx.set(h.acc.data[t], [int(v) for v in acc[t]])
            par = st.spads[Spad.PARAM]
            par[:] = rng.integers(0, 256, size=par.size, dtype=np.uint8)
            wb = cfg.param_word_bytes
            for i in range(par.size // wb):
                ctx.set(h.param.data[i], int.from_bytes(par[i * wb:(i + 1) * wb].tobytes(),
                                                        "little"))
            body = sum(int(v) << GemmBody[k].offset for k, v in ins._body_fields().items())
            ctx.set(epi.ins.as_value(), body)
            ctx.set(epi.prefetch, 1)
            await ctx.tick()
            ctx.set(epi.prefetch, 0)
            await ctx.tick()
            ctx.set(epi.start, 1)
            await ctx.tick()
            ctx.set(epi.start, 0)
            cycles = epilogue_cycles(ins, cfg)
            for c in range(1, max(cycles, 1) + 6):
                assert ctx.get(epi.done) == (c == cycles), (n, c, cycles, ins)
                await ctx.tick()
            _epilogue(st, ins)
            wb = cfg.out_word_bytes
            got = np.frombuffer(b"".join(ctx.get(h.out.data[i]).to_bytes(wb, "little")
                                         for i in range(spad_depth(cfg, "out"))), np.uint8)
            bad = np.flatnonzero(got != st.spads[Spad.OUT])
            assert bad.size == 0, (n, ins, bad[:8], got[bad[:8]], st.spads[Spad.OUT][bad[:8]])

    sim = Simulator(h)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()


@pytest.mark.parametrize("cfg, seed", [(SMALL, 1), (ODD, 2), (WIDEACC, 3)],
                         ids=["small", "odd", "wideacc"])
def test_every_epilogue_matches_functional_model(cfg, seed):
    rng = np.random.default_rng(seed)
    program = [random_epilogue(cfg, rng, EpilogueMode(int(k)))
               for k in rng.integers(0, len(EpilogueMode), size=20)]
    # Every kind, all tokens, ending at the last OUT/PARAM words (addresses wrap).
    for kind in EpilogueMode:
        ins = random_epilogue(cfg, rng, kind)
        last = cfg.spad_beats("out") - word_beats(cfg.out_word_bytes, cfg)
        lastp = cfg.spad_beats("param") - word_beats(cfg.param_word_bytes, cfg)
        program.append(Gemm(out_addr=last, param_addr=lastp, tokens=cfg.max_tokens,
                            epilogue=kind, shift=ins.shift))
    run_epilogues(cfg, program, seed)


def test_rejects_non_config():
    with pytest.raises(TypeError, match="got 1.5"):
        Epilogue(1.5)
