"""Epilogue: accumulator files -> OUT scratchpad, as ``sim.functional._epilogue``.

After the last step has drained, the epilogue reads the accumulators token by token (every lane
at once) and writes one OUT word (``lanes`` bytes) per cycle:

* WIDE: four words per token, word ``q`` holding lanes ``q*lanes/4 ..`` as int32 little-endian
  (the low 32 bits of the accumulator, sign-extended if it is narrower);
* INT8 / INT8_RESIDUAL: one word per token, lane ``l`` in byte ``l``, computed exactly as
  :func:`hw.numerics.requantize_int8` with the per-lane uint16 multipliers of the PARAM word at
  ``param_addr`` and, for INT8_RESIDUAL, the int8 row of token ``t`` at byte
  ``param_addr * beat + 2 * lanes + t * lanes`` (half ``t % 2`` of PARAM word
  ``param_addr_word + 1 + t // 2``);
* NONE: nothing (the core does not start the epilogue).

Pipeline (read ``i`` in cycle ``e``, the ``i``-th word written in cycle ``e + LATENCY``)::

    e     A <- accumulators of token t (combinational read of every PE's file)
    e+1   P <- A * mult, as partial products of <= 18-bit slices of A (one DSP each)
    e+2   S <- sum of the partial products + rounding term 2**(shift-1)
    e+3   Y <- sat8((S >> shift) + residual)        (WIDE: Y <- quarter of A, delayed)
    e+4   OUT[out_addr_word + i] <- Y
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.config import AcceleratorConfig
from hw.decoder import (
    beats_to_words,
    spad_depth,
    spad_read_signature,
    spad_word_bits,
    spad_write_signature,
    wrap_inc,
)
from hw.isa import Epilogue as EpilogueKind
from hw.isa import GemmBody
from hw.timing import EPILOGUE_FILL

__all__ = ["Epilogue", "MULT_BITS", "SLICE_BITS"]

#: Width of the unsigned per-lane requantisation multipliers.
MULT_BITS = 16
#: Accumulator slice width per partial product: an unsigned slice of 17 bits (or a signed top
#: slice of up to 18) times a 17-bit signed multiplier fits one 18x18 DSP multiplier.
SLICE_BITS = 17
#: WIDE writes the accumulators as 32-bit integers.
WIDE_BITS = 32


class Epilogue(wiring.Component):
    """Writes the results of a GEMM from the accumulator files to the OUT scratchpad.

    Protocol: ``ins`` holds the instruction (epilogue, tokens_m1, shift, out_addr, param_addr)
    from the ``start`` pulse (cycle ``y``) until ``done``. The accumulators are read from
    ``y + 1 + (EPILOGUE_FILL - LATENCY)`` on; the words are written in cycles
    ``y + 1 + EPILOGUE_FILL ..``, and ``done`` is high in the cycle of the last write, which is
    ``y + epilogue_cycles``. ``start`` with epilogue NONE writes nothing and never raises
    ``done``.

    Parameters
    ----------
    cfg:
        The accelerator configuration.

    Members
    -------
    start: In(1)
        Begin the epilogue of ``ins``.
    ins: In(GemmBody)
        The instruction.
    acc_addr: Out(range(cfg.max_tokens))
        Token whose accumulators are read.
    acc_data: In(data.ArrayLayout(signed(cfg.acc_bits), cfg.lanes))
        The accumulators of token ``acc_addr`` (combinational).
    param_rd: In(spad_read_signature(cfg, "param"))
        PARAM scratchpad read port (synchronous).
    out_wr: In(spad_write_signature(cfg, "out"))
        OUT scratchpad write port.
    done: Out(1)
        The last word is written this cycle.
    """

    #: Cycles from an accumulator read to the write of its word.
    LATENCY = 4

    def __init__(self, cfg: AcceleratorConfig):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        if EPILOGUE_FILL < self.LATENCY:
            raise ValueError(f"hw.timing.EPILOGUE_FILL={EPILOGUE_FILL} is shorter than the "
                             f"epilogue pipeline ({self.LATENCY} cycles)")
        if cfg.lanes % 4:
            raise ValueError(f"WIDE needs lanes divisible by 4, got {cfg.lanes}")
        self._cfg = cfg
        super().__init__({
            "start": In(1),
            "ins": In(GemmBody),
            "acc_addr": Out(range(cfg.max_tokens)),
            "acc_data": In(data.ArrayLayout(signed(cfg.acc_bits), cfg.lanes)),
            "param_rd": In(spad_read_signature(cfg, "param")),
            "out_wr": In(spad_write_signature(cfg, "out")),
            "done": Out(1),
        })

    @property
    def cfg(self) -> AcceleratorConfig:
        return self._cfg

    def elaborate(self, platform):
        m = Module()
        cfg = self._cfg
        lanes = cfg.lanes
        ins = self.ins
        pdepth = spad_depth(cfg, "param")
        odepth = spad_depth(cfg, "out")
        wide = ins.epilogue == EpilogueKind.WIDE
        resid = ins.epilogue == EpilogueKind.INT8_RESIDUAL
        slack = EPILOGUE_FILL - self.LATENCY

        # ---- sequencing: `slack` idle cycles, then one read per cycle ---------------------------
        wait = Signal(range(slack + 1))
        busy = Signal()
        last = Signal()        # reading the final word
        tok = Signal(range(cfg.max_tokens))
        quarter = Signal(2)
        m.d.comb += last.eq(busy & (tok == ins.tokens_m1) & (~wide | (quarter == 3)))
        with m.If(self.start & (ins.epilogue != EpilogueKind.NONE)):
            m.d.sync += [wait.eq(slack), busy.eq(slack == 0), tok.eq(0), quarter.eq(0)]
        with m.Elif(wait != 0):
            m.d.sync += wait.eq(wait - 1)
            with m.If(wait == 1):
                m.d.sync += busy.eq(1)
        with m.Elif(busy):
            m.d.sync += quarter.eq(Mux(wide, quarter + 1, 0))
            with m.If(~wide | (quarter == 3)):
                m.d.sync += tok.eq(tok + 1)
            with m.If(last):
                m.d.sync += busy.eq(0)
        m.d.comb += self.acc_addr.eq(tok)

        # ---- e: register the accumulators ------------------------------------------------------
        a = Signal.like(self.acc_data)
        a_valid = Signal()
        a_tok = Signal.like(tok)
        a_quarter = Signal(2)
        m.d.sync += [a.eq(self.acc_data), a_valid.eq(busy), a_tok.eq(tok),
                     a_quarter.eq(quarter)]

        # ---- PARAM: the multiplier word is read at start, residual rows one per token ----------
        # Residual row t lives in half t % 2 of word pbase + 1 + t // 2; it is addressed in e+1
        # (while a_tok == t), arrives in e+2 and is registered next to the sum.
        pbase = Signal(range(pdepth))
        m.d.comb += pbase.eq(beats_to_words(ins.param_addr, cfg, "param"))
        rrow = Signal(range(pdepth))
        with m.If(self.start):
            m.d.comb += self.param_rd.addr.eq(pbase)
            m.d.sync += rrow.eq(wrap_inc(pbase, pdepth))
        with m.Else():
            m.d.comb += self.param_rd.addr.eq(rrow)
            with m.If(a_valid & a_tok[0] & ~wide):
                m.d.sync += rrow.eq(wrap_inc(rrow, pdepth))
        mult = Signal(data.ArrayLayout(MULT_BITS, lanes))
        load_mult = Signal()
        m.d.sync += load_mult.eq(self.start)
        with m.If(load_mult):
            m.d.sync += mult.eq(self.param_rd.data)

        # ---- e+1: partial products / WIDE quarter select ---------------------------------------
        nslices = -(-cfg.acc_bits // SLICE_BITS)
        parts = []
        p_valid = Signal()
        p_tok = Signal.like(tok)
        m.d.sync += [p_valid.eq(a_valid), p_tok.eq(a_tok)]
        for l in range(lanes):
            acc = a[l]  # a signed Value; slices of it are unsigned
            for k in range(nslices):
                lo, hi = k * SLICE_BITS, min(cfg.acc_bits, (k + 1) * SLICE_BITS)
                sl = acc[lo:hi].as_signed() if k == nslices - 1 else acc[lo:hi]
                pp = Signal(signed(hi - lo + MULT_BITS + 1), name=f"pp_l{l}_{k}")
                m.d.sync += pp.eq(sl * mult[l])
                parts.append(pp)
        word_bits = spad_word_bits(cfg, "out")
        per_word = word_bits // WIDE_BITS
        as32 = []
        for l in range(lanes):
            x = Signal(signed(WIDE_BITS), name=f"wide_l{l}")
            m.d.comb += x.eq(a[l])  # low 32 bits, or sign-extended when narrower
            as32.append(x)
        wide_q = Signal(word_bits)
        with m.Switch(a_quarter):
            for q in range(4):
                with m.Case(q):
                    m.d.sync += wide_q.eq(Cat(as32[q * per_word:(q + 1) * per_word]))

        # ---- e+2: sum + rounding; residual half select ----------------------------------------
        prod_bits = cfg.acc_bits + MULT_BITS + 2
        s = [Signal(signed(prod_bits), name=f"s_l{l}") for l in range(lanes)]
        shift = ins.shift
        rnd = (Const(1, 1) << shift)[1:]  # 2**(shift-1), 0 for shift 0
        for l in range(lanes):
            terms = [parts[l * nslices + k] << (k * SLICE_BITS) for k in range(nslices)]
            m.d.sync += s[l].eq(sum(terms) + rnd)
        wide_q2 = Signal.like(wide_q)
        m.d.sync += wide_q2.eq(wide_q)
        res = Signal(data.ArrayLayout(signed(8), lanes))
        half = Signal(8 * lanes)
        m.d.comb += half.eq(Mux(p_tok[0], self.param_rd.data[8 * lanes:],
                                self.param_rd.data[:8 * lanes]))
        m.d.sync += res.eq(Mux(resid, half, 0))
        s_valid = Signal()
        m.d.sync += s_valid.eq(p_valid)

        # ---- e+3: shift, residual, saturate ----------------------------------------------------
        y = Signal(word_bits)
        y8 = []
        for l in range(lanes):
            v = Signal(signed(prod_bits + 1), name=f"v_l{l}")
            m.d.comb += v.eq((s[l] >> shift) + res[l])
            y8.append(Mux(v > 127, 127, Mux(v < -128, -128, v))[:8])
        m.d.sync += y.eq(Mux(wide, wide_q2, Cat(y8)))
        y_valid = Signal()
        m.d.sync += y_valid.eq(s_valid)

        # ---- e+4: write ----------------------------------------------------------------------
        waddr = Signal(range(odepth))
        with m.If(self.start):
            m.d.sync += waddr.eq(beats_to_words(ins.out_addr, cfg, "out"))
        with m.Elif(y_valid):
            m.d.sync += waddr.eq(wrap_inc(waddr, odepth))
        m.d.comb += [self.out_wr.addr.eq(waddr), self.out_wr.data.eq(y),
                     self.out_wr.en.eq(y_valid)]
        # done in the cycle of the last write: `last` delayed through the pipeline.
        d = last
        for i in range(self.LATENCY):
            nd = Signal(name=f"last_d{i}")
            m.d.sync += nd.eq(d)
            d = nd
        m.d.comb += self.done.eq(d)
        return m
