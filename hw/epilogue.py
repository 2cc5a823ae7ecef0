"""Epilogue: accumulator files -> OUT scratchpad, as ``sim.functional._epilogue``.

After the last step has drained, the epilogue reads the accumulators token by token (every lane
at once) and writes one OUT word (``lanes`` bytes) per cycle:

* WIDE: four words per token, word ``q`` holding lanes ``q*lanes/4 ..`` as int32 little-endian
  (the low 32 bits of the accumulator, sign-extended if it is narrower);
* WIDE_BIAS: as WIDE, plus token ``t``'s int32 bias row, ``4 * lanes`` bytes from PARAM byte
  ``param_addr * beat + t * 4 * lanes``, added modulo 2**32 (:func:`hw.numerics.add_bias_wide`):
  word ``q`` of token ``t`` adds half ``q % 2`` of PARAM word ``param_addr_word + 2t + q // 2``;
* INT8 / INT8_RESIDUAL: one word per token, lane ``l`` in byte ``l``, computed exactly as
  :func:`hw.numerics.requantize_int8` with the per-lane uint16 multipliers of the PARAM word at
  ``param_addr`` and, for INT8_RESIDUAL, the int8 row of token ``t`` at byte
  ``param_addr * beat + 2 * lanes + t * lanes`` (half ``t % 2`` of PARAM word
  ``param_addr_word + 1 + t // 2``);
* NONE: nothing (the core does not start the epilogue).

The ``acc * mult`` products come from multipliers borrowed from the idle array and decoder
(:mod:`hw.pe`, "Multiplier sharing"): the PE multiplies the low ``SLICE_BITS`` of its own
accumulator, the lane's Dequant unit the high slice, so the epilogue itself has no multiplier.
Requantisation then needs only eleven bits of ``acc * mult``, a window at bit ``shift - 1``
(``floor(acc * mult / 2**(shift-1))``; rounding is adding 1 and dropping the low bit), and
whether the bits above the window are all sign bits; if not, the result saturates whatever the
residual. This replaces a full-width barrel shifter and comparators per lane.

Pipeline (read ``i`` in cycle ``e``, the ``i``-th word written in cycle ``e + LATENCY``)::

    e     every PE reads token t; A <- accumulators; PEs latch (low slice, mult), Dequant
          units (high slice, mult)
    e+1   PE: lo <- low slice * mult;  Dequant: hi <- high slice * mult;  PARAM row addressed
    e+2   S <- lo + hi * 2**SLICE_BITS (= acc * mult);  residual row registered;
          (WIDE_BIAS) quarter of A + its bias half
    e+3   W <- window(2 * S, shift); per byte of S, whether a bit above the window differs
          from the sign                                    (WIDE: quarter of A, delayed)
    e+4   Y <- sat8((W + 1 + 2 * residual) >> 1), or saturated by the sign of S if S does not
          fit the window (a byte's flag set)
    e+5   OUT[out_addr_word + i] <- Y

Fan-out: the instruction register drives every lane's window multiplexers and mode selects, which
made it the design's critical path (``python -m hw.synth --report``). Every lane therefore reads
its own registered copy of ``shift``, and every group of :data:`hw.fanout.LANES_PER_COPY` lanes
its own copy of the decoded mode and of the shift mask, one cycle behind ``ins`` (the mask,
computed once, two); the instruction is constant from ``prefetch`` (at least two cycles before
``start``) to ``done``, so the copies hold it whenever a stage reads them and no cycle changes
(:mod:`hw.fanout`). The multiplier's load enable and the WIDE quarter select are copied per
group the same way, and each PE registers its own epilogue read strobe (``ep_next``). Only the
sequencing and the valid bits of the stages are reset by ``start``; the data registers are not
(hw/top.py, "Reset").
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
from hw.dequant import hi_product_shape
from hw.fanout import LANES_PER_COPY, lane_groups, replica
from hw.isa import EpilogueMode, GemmBody, writes_wide
from hw.pe import MULT_BITS, SLICE_BITS, hi_slice_bits, lo_product_shape
from hw.timing import EPILOGUE_FILL

__all__ = ["Epilogue", "WIDE_BITS", "WINDOW_BITS"]

#: WIDE writes the accumulators as 32-bit integers.
WIDE_BITS = 32
#: Bits of ``acc * mult >> (shift - 1)`` kept: with the rounding bit dropped, [-512, 511], beyond
#: which any int8 residual still saturates.
WINDOW_BITS = 11
#: Largest ISA shift.
MAX_SHIFT = (1 << GemmBody["shift"].width) - 1


class Epilogue(wiring.Component):
    """Writes the results of a GEMM from the accumulator files to the OUT scratchpad.

    Protocol: ``ins`` holds the instruction (epilogue, tokens_m1, shift, out_addr, param_addr)
    from a ``prefetch`` pulse (which reads the multipliers; at least two cycles before
    ``start``, and not while the epilogue reads residual or bias rows) until ``done``. The
    epilogue proper starts with a ``start`` pulse in cycle ``y``. The accumulators are read from
    ``y + 1 + (EPILOGUE_FILL - LATENCY)`` on; the words are written in cycles
    ``y + 1 + EPILOGUE_FILL ..``, and ``done`` is high in the cycle of the last write, which is
    ``y + epilogue_cycles``. ``start`` with epilogue NONE writes nothing and never raises
    ``done``.

    Parameters
    ----------
    cfg:
        The accelerator configuration.
    ahead:
        Also give ``done`` a cycle early (``done_ahead``); False (the default) adds nothing.

    Members
    -------
    prefetch: In(1)
        Read the multiplier word of ``ins`` (into ``mult`` two cycles later).
    start: In(1)
        Begin the epilogue of ``ins``.
    ins: In(GemmBody)
        The instruction.
    acc_addr: Out(range(cfg.max_tokens))
        Token whose accumulators are read in the next cycle.
    acc_data: In(data.ArrayLayout(signed(cfg.acc_bits), cfg.lanes))
        The accumulators of the token addressed in the previous cycle.
    param_rd: In(spad_read_signature(cfg, "param"))
        PARAM scratchpad read port (synchronous).
    out_wr: In(spad_write_signature(cfg, "out"))
        OUT scratchpad write port.
    done: Out(1)
        The last word is written this cycle.
    done_ahead: Out(1), only with ``ahead``
        ``done`` of the next cycle (the register ``done`` follows), for a user that registers
        it (:class:`hw.compute.ComputeCore` with :func:`hw.fanout.registered_control`).
    ep_next: Out(1)
        An accumulator read in the next cycle (to the array: multiply the low slices; the
        array registers it per PE).
    mult: Out(data.ArrayLayout(MULT_BITS, cfg.lanes))
        The per-lane multipliers (to the array and the decoder).
    hi_en: Out(len(lane_groups(cfg.lanes)))
        ``hi`` holds the high slices of this cycle's read (to the decoder's ``ext``): equal
        copies, one per group of lanes (:func:`hw.fanout.lane_groups`), because each lane's
        Dequant unit selects its multiplier operands with it.
    hi: Out(data.ArrayLayout(signed(hi_slice_bits(cfg)), cfg.lanes))
        High accumulator slices (to the decoder's ``ext_a``).
    lo_prod: In(data.ArrayLayout(lo_product_shape(cfg), cfg.lanes))
        Low partial products, two cycles after the read (from the array).
    hi_prod: In(data.ArrayLayout(hi_product_shape(cfg), cfg.lanes))
        High partial products, two cycles after ``hi_en`` (from the decoder).
    """

    #: Cycles from an accumulator read to the write of its word.
    LATENCY = 5

    def __init__(self, cfg: AcceleratorConfig, ahead: bool = False):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        if EPILOGUE_FILL < self.LATENCY:
            raise ValueError(f"hw.timing.EPILOGUE_FILL={EPILOGUE_FILL} is shorter than the "
                             f"epilogue pipeline ({self.LATENCY} cycles)")
        if cfg.lanes % 4:
            raise ValueError(f"WIDE needs lanes divisible by 4, got {cfg.lanes}")
        self._cfg = cfg
        extra = {"done_ahead": Out(1)} if ahead else {}
        super().__init__({
            "prefetch": In(1),
            "start": In(1),
            "ins": In(GemmBody),
            "acc_addr": Out(range(cfg.max_tokens)),
            "acc_data": In(data.ArrayLayout(signed(cfg.acc_bits), cfg.lanes)),
            "param_rd": In(spad_read_signature(cfg, "param")),
            "out_wr": In(spad_write_signature(cfg, "out")),
            "done": Out(1),
            "ep_next": Out(1),
            "mult": Out(data.ArrayLayout(MULT_BITS, cfg.lanes)),
            "hi_en": Out(len(lane_groups(cfg.lanes))),
            "hi": Out(data.ArrayLayout(signed(hi_slice_bits(cfg)), cfg.lanes)),
            "lo_prod": In(data.ArrayLayout(lo_product_shape(cfg), cfg.lanes)),
            "hi_prod": In(data.ArrayLayout(hi_product_shape(cfg), cfg.lanes)),
            **extra,
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
        wide = writes_wide(ins.epilogue.as_value())
        slack = EPILOGUE_FILL - self.LATENCY

        # ---- registered copies of the instruction fields (hw.fanout) --------------------------
        groups = range(-(-lanes // LANES_PER_COPY))
        l_shift = [replica(m, ins.shift, f"shift_l{l}") for l in range(lanes)]
        g_wide = [replica(m, wide, f"wide_g{g}") for g in groups]
        g_bias = [replica(m, ins.epilogue == EpilogueMode.WIDE_BIAS, f"bias_g{g}")
                  for g in groups]
        g_resid = [replica(m, ins.epilogue == EpilogueMode.INT8_RESIDUAL, f"resid_g{g}")
                   for g in groups]

        # ---- sequencing: `slack` idle cycles, then one read per cycle ---------------------------
        # The array registers the read address next to its files, so acc_addr is the token of
        # the *next* cycle: the counters' next state.
        wait = Signal(range(slack + 1))
        busy = Signal()
        last = Signal()        # reading the final word
        tok = Signal.like(ins.tokens_m1)  # as wide as tokens_m1: always reaches it
        quarter = Signal(2)
        wait_n = Signal.like(wait)
        busy_n = Signal()
        tok_n = Signal.like(tok)
        quarter_n = Signal.like(quarter)
        m.d.comb += [last.eq(busy & (tok == ins.tokens_m1) & (~wide | (quarter == 3))),
                     wait_n.eq(wait), busy_n.eq(busy), tok_n.eq(tok), quarter_n.eq(quarter)]
        with m.If(self.start & (ins.epilogue != EpilogueMode.NONE)):
            m.d.comb += [wait_n.eq(slack), busy_n.eq(slack == 0), tok_n.eq(0), quarter_n.eq(0)]
        with m.Elif(wait != 0):
            m.d.comb += wait_n.eq(wait - 1)
            with m.If(wait == 1):
                m.d.comb += busy_n.eq(1)
        with m.Elif(busy):
            m.d.comb += quarter_n.eq(Mux(wide, quarter + 1, 0))
            with m.If(~wide | (quarter == 3)):
                m.d.comb += tok_n.eq(tok + 1)
            with m.If(last):
                m.d.comb += busy_n.eq(0)
        m.d.sync += [wait.eq(wait_n), busy.eq(busy_n), tok.eq(tok_n), quarter.eq(quarter_n)]
        m.d.comb += [self.acc_addr.eq(tok_n), self.ep_next.eq(busy_n)]

        # ---- e: register the accumulators ------------------------------------------------------
        a = Signal.like(self.acc_data, reset_less=True)
        a_valid = Signal()
        a_tok = Signal.like(tok, reset_less=True)
        a_quarter = Signal(2, reset_less=True)
        m.d.sync += [a.eq(self.acc_data), a_valid.eq(busy), a_tok.eq(tok),
                     a_quarter.eq(quarter)]

        # ---- PARAM: the multiplier word is read at start, residual rows one per token ----------
        # Residual row t lives in half t % 2 of word pbase + 1 + t // 2; it is addressed in e+1
        # (while a_tok == t), arrives in e+2 and is registered next to the sum. Bias rows (two
        # words per token from pbase, no multiplier word) are read one word per two quarters.
        pbase = Signal(range(pdepth))
        m.d.comb += pbase.eq(beats_to_words(ins.param_addr, cfg, "param"))
        rrow = Signal(range(pdepth))
        with m.If(self.prefetch):
            m.d.comb += self.param_rd.addr.eq(pbase)
        with m.Else():
            m.d.comb += self.param_rd.addr.eq(rrow)
        bias = ins.epilogue == EpilogueMode.WIDE_BIAS
        with m.If(self.start):
            m.d.sync += rrow.eq(Mux(bias, pbase, wrap_inc(pbase, pdepth)))
        with m.Elif(a_valid & Mux(wide, bias & a_quarter[0], a_tok[0])):
            m.d.sync += rrow.eq(wrap_inc(rrow, pdepth))
        # The multipliers must be in place when the first accumulators are read (the PEs latch
        # them with the low slices), hence the separate, earlier prefetch.
        # The load enable is `prefetch` a cycle later, one copy per group of lanes (16 enables
        # a lane). A copy left over from before `start` loads a word no one reads: the real
        # prefetch of every instruction loads again before the first accumulator read.
        mult = Signal.like(self.mult, reset_less=True)
        for g, ls in enumerate(lane_groups(lanes)):
            load_mult = replica(m, self.prefetch, f"load_mult_g{g}")
            for l in ls:
                with m.If(load_mult):
                    m.d.sync += mult[l].eq(self.param_rd.data[MULT_BITS * l:][:MULT_BITS])
        m.d.comb += self.mult.eq(mult)

        # The high slices go straight from the array to the Dequant units, which register them
        # beside their multipliers (as the PEs do with the low slices).
        for g in range(len(lane_groups(lanes))):   # copies of `busy`, reset with it
            hi_en = Signal(name=f"hi_en_g{g}", attrs={"keep": 1})
            m.d.sync += hi_en.eq(busy_n)
            m.d.comb += self.hi_en[g].eq(hi_en)
        for l in range(lanes):
            m.d.comb += self.hi[l].eq(self.acc_data[l][SLICE_BITS:])

        # ---- e+1: WIDE quarter select -------------------------------------------------------
        p_valid = Signal()
        p_tok = Signal.like(tok, reset_less=True)
        p_quarter = Signal(2, reset_less=True)
        m.d.sync += [p_valid.eq(a_valid), p_tok.eq(a_tok), p_quarter.eq(a_quarter)]
        word_bits = spad_word_bits(cfg, "out")
        per_word = word_bits // WIDE_BITS
        as32 = []
        for l in range(lanes):
            x = Signal(signed(WIDE_BITS), name=f"wide_l{l}")
            m.d.comb += x.eq(a[l])  # low 32 bits, or sign-extended when narrower
            as32.append(x)
        # The quarter selects 4:1 multiplexers on every bit of the word: one copy of it per
        # LANES_PER_COPY bytes of the word.
        wide_q = Signal(word_bits, reset_less=True)
        int32_per_copy = max(1, LANES_PER_COPY * 8 // WIDE_BITS)
        for c in range(-(-per_word // int32_per_copy)):
            quarter_c = replica(m, quarter, f"a_quarter_c{c}")   # = a_quarter
            js = range(c * int32_per_copy, min(per_word, (c + 1) * int32_per_copy))
            with m.Switch(quarter_c):
                for q in range(4):
                    with m.Case(q):
                        m.d.sync += [wide_q[j * WIDE_BITS:(j + 1) * WIDE_BITS].eq(
                            as32[q * per_word + j]) for j in js]

        # ---- e+2: sum of the partial products; residual or bias half select -----------------
        # S = acc * mult exactly, sign-extended so that the window below fits at any shift.
        sbits = max(cfg.acc_bits + MULT_BITS + 1, MAX_SHIFT + WINDOW_BITS)
        s = [Signal(signed(sbits), name=f"s_l{l}", reset_less=True) for l in range(lanes)]
        for l in range(lanes):
            m.d.sync += s[l].eq(self.lo_prod[l] + (self.hi_prod[l] << SLICE_BITS))
        # Which half of the PARAM word: selected per group, registered a stage early (at e+1
        # a_quarter / a_tok are what p_quarter / p_tok are at e+2).
        g_upper = [Signal(name=f"upper_g{g}", reset_less=True) for g in groups]
        for g in groups:
            m.d.sync += g_upper[g].eq(Mux(g_wide[g], a_quarter[0], a_tok[0]))
        half = Signal(8 * lanes)
        for l in range(lanes):
            byte = slice(8 * l, 8 * l + 8)
            m.d.comb += half[byte].eq(Mux(g_upper[l // LANES_PER_COPY],
                                          self.param_rd.data[8 * lanes:][byte],
                                          self.param_rd.data[byte]))
        wide_q2 = Signal.like(wide_q, reset_less=True)
        lanes_per_int32 = WIDE_BITS // 8
        m.d.sync += wide_q2.eq(Cat(
            (wide_q[j * WIDE_BITS:(j + 1) * WIDE_BITS]
             + Mux(g_bias[j * lanes_per_int32 // LANES_PER_COPY],
                   half[j * WIDE_BITS:(j + 1) * WIDE_BITS], 0))[:WIDE_BITS]
            for j in range(per_word)))
        res = Signal(data.ArrayLayout(signed(8), lanes), reset_less=True)
        for l in range(lanes):
            m.d.sync += res[l].eq(Mux(g_resid[l // LANES_PER_COPY], half[8 * l:8 * l + 8], 0))
        s_valid = Signal()
        m.d.sync += s_valid.eq(p_valid)
        # C = S * 2 (a zero below bit 0): the window C[shift : shift + WINDOW_BITS] is
        # floor(S / 2**(shift-1)) for any shift, 0 included. It is exact iff every bit of C from
        # shift + WINDOW_BITS - 1 up equals the sign (constant mask, shared by all lanes).
        # The mask is computed once from `ins` and copied per group (both two cycles behind
        # `ins`, as the lanes' shift copies are one).
        cbits = sbits + 1
        above = Signal(cbits, reset_less=True)
        m.d.sync += above.eq(Cat(ins.shift + (WINDOW_BITS - 1) <= i for i in range(cbits)))
        g_above = [replica(m, above, f"above_g{g}") for g in groups]

        # ---- e+3: the window and whether S fits it, per byte --------------------------------
        win = [Signal(signed(WINDOW_BITS), name=f"win_l{l}", reset_less=True)
               for l in range(lanes)]
        # Whether S fits, as the OR of per-byte "a bit above the window differs from the sign"
        # flags: registered per byte here, OR-ed at e+4 (a 50-bit test in one stage was the
        # 2x8 array's critical path: seven LUTs behind a 4 ns net from the mask copy).
        n_parts = -(-cbits // 8)
        outside = [Signal(n_parts, name=f"outside_l{l}", reset_less=True) for l in range(lanes)]
        neg = Signal(lanes, reset_less=True)
        res3 = Signal.like(res, reset_less=True)
        wide_q3 = Signal.like(wide_q, reset_less=True)
        coarse_bits = WINDOW_BITS + 7
        for l in range(lanes):
            shift, above = l_shift[l], g_above[l // LANES_PER_COPY]
            c = Cat(Const(0, 1), s[l])
            sign = s[l][-1]
            coarse = Signal(coarse_bits, name=f"coarse_l{l}")
            with m.Switch(shift[3:]):  # two mux levels: by 8 bits, then by bits
                for k in range(4):
                    with m.Case(k):
                        m.d.comb += coarse.eq(c[8 * k:8 * k + coarse_bits])
            with m.Switch(shift[:3]):
                for k in range(8):
                    with m.Case(k):
                        m.d.sync += win[l].eq(coarse[k:k + WINDOW_BITS])
            differs = (c ^ sign.replicate(cbits)) & above
            m.d.sync += [outside[l].eq(Cat(differs[8 * j:8 * j + 8].any()
                                           for j in range(n_parts))),
                         neg[l].eq(sign)]
        m.d.sync += [res3.eq(res), wide_q3.eq(wide_q2)]
        w_valid = Signal()
        m.d.sync += w_valid.eq(s_valid)

        # ---- e+4: rounding, residual, saturation --------------------------------------------
        # q + r = floor((W + 1) / 2) + r = (W + 1 + 2r) >> 1: one adder; int8 overflow is bits
        # 7 and up not all equal (no comparator chains).
        y = Signal(word_bits, reset_less=True)
        for l in range(lanes):
            t = Signal(signed(WINDOW_BITS + 1), name=f"t_l{l}")
            m.d.comb += t.eq(win[l] + Cat(Const(1, 1), res3[l]).as_signed())
            v = t[1:]  # (W + 1 + 2r) >> 1, 11 bits
            ovf = v[7:].any() & ~v[7:].all()
            sat = Mux(outside[l].any(), Mux(neg[l], -128, 127),
                      Mux(ovf, Mux(v[-1], -128, 127), v[:8]))
            m.d.sync += y[8 * l:8 * l + 8].eq(
                Mux(g_wide[l // LANES_PER_COPY], wide_q3[8 * l:8 * l + 8], sat[:8]))
        y_valid = Signal()
        m.d.sync += y_valid.eq(w_valid)

        # ---- e+5: write ----------------------------------------------------------------------
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
            if i == self.LATENCY - 1 and "done_ahead" in self.signature.members:
                m.d.comb += self.done_ahead.eq(d)
            d = nd
        m.d.comb += self.done.eq(d)
        return m
