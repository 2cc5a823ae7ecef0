"""The compute engine datapath: decoder + PE array + epilogue, sequenced per GEMM instruction.

:class:`ComputeCore` executes one :class:`hw.isa.Gemm` body at a time with the exact bytes of
:func:`sim.functional.exec_gemm` and the exact duration of :func:`hw.timing.gemm_cycles`
(docs/architecture.md, section 7). Its schedule, for a command accepted in cycle ``c``::

    c               start the WGT window fill (decoder) from the command's wgt_addr
    x_0 - hdr ..    header words of step 0's group issued, one per cycle
    x_s             RECORD of step s issued (the decoder registers it, acts in x_s + 1);
                    activation slots (s, j) for tokens j = 0..T-1 in x_s + j
    x_s + L         step s's weights in row 0's PEs; slot (s, j)'s activation block reaches row 0
                    in x_s + j + L (L = LATENCY = 5, the same for both paths)
    x_{s+1} - x_s   T, or max(T, 1 + hdr) when step s+1 starts a group (its header words are
                    issued in the last hdr cycles of the gap)

with ``x_0 = c + GEMM_FILL + 1 - L + max(0, 1 + hdr - T)``, which makes the first MAC enter
row 0 in ``c + GEMM_FILL + 1`` (plus the first group's header excess) and the last one leave
row 0 ``sum of step cycles`` later. After the last row has accumulated, the epilogue runs; the
cycle of the last OUT write (or of the last accumulation, for epilogue NONE) is
``c + gemm_cycles``, which is when ``done`` pulses.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal, Value
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from hw.array import Array
from hw.config import AcceleratorConfig
from hw.decoder import (
    Decoder,
    WeightOp,
    beats_to_words,
    spad_depth,
    spad_read_signature,
    spad_word_bits,
    spad_write_signature,
    wrap_add,
    wrap_inc,
)
from hw.epilogue import Epilogue
from hw.fanout import registered_control, replica
from hw.isa import MAX_HEADER_WORDS, EpilogueMode, GemmBody
from hw.pe import PE, act_block_layout, index_bits
from hw.timing import GEMM_DRAIN, GEMM_FILL

__all__ = ["ComputeCore", "header_words"]


def header_words(body) -> Value:
    """Header words per group of the GEMM ``body`` (a :data:`hw.isa.GemmBody` view), as logic:
    :func:`hw.isa.gemm_header_words` (a test checks the two agree on every input)."""
    return Mux(body.group_steps == 0, 0, 1 + body.asym)


class ComputeCore(wiring.Component):
    """The COMPUTE engine's datapath for one accelerator configuration.

    Parameters
    ----------
    cfg:
        The accelerator configuration.

    Members
    -------
    cmd: In(stream.Signature(GemmBody))
        GEMM instruction bodies; ``ready`` is high whenever the core is idle. The transfer
        cycle is cycle ``c``.
    done: Out(1)
        High for one cycle, in cycle ``c + hw.timing.gemm_cycles(ins, cfg)``. A new command may
        be accepted from the next cycle. A register with :func:`hw.fanout.registered_control`.
    mac: Out(1)
        Row 0 takes a MAC this cycle: ``k_steps * tokens`` cycles per GEMM.
    act_rd, wgt_rd, param_rd: In(ReadPort.Signature(...))
        Synchronous read ports of the ACT, WGT and PARAM scratchpads (word addressed; see
        :func:`hw.decoder.spad_read_signature`).
    out_wr: In(WritePort.Signature(...))
        Full-word write port of the OUT scratchpad.
    """

    #: Cycles from a RECORD (or an activation slot) to row 0 using it.
    LATENCY = Decoder.LATENCY + 1
    #: Activation path: slot register, address sum, wrap, scratchpad read, block register.
    ACT_LATENCY = 5
    #: Register stages of the per-instruction constants after ``ins`` (c + 1).
    CONST_STAGES = 2

    def __init__(self, cfg: AcceleratorConfig):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        if self.ACT_LATENCY != self.LATENCY:
            raise AssertionError("weight and activation paths must have equal latency")
        lead = GEMM_FILL + 1 - self.LATENCY - MAX_HEADER_WORDS
        if lead < Decoder.FIRST_OP:
            raise ValueError(f"hw.timing.GEMM_FILL={GEMM_FILL} leaves {lead} cycles before the "
                             f"first header word; the decoder needs {Decoder.FIRST_OP}")
        if GEMM_FILL - self.LATENCY < self.CONST_STAGES:
            raise ValueError(f"hw.timing.GEMM_FILL={GEMM_FILL} issues the first record before "
                             f"the per-instruction constants ({self.CONST_STAGES} stages) hold")
        if self.LATENCY + cfg.rows + GEMM_DRAIN - 2 < 1:
            raise ValueError("the drain must take a cycle: a registered done is set in it")
        if GEMM_DRAIN < PE.LATENCY - 1:
            raise ValueError(f"hw.timing.GEMM_DRAIN={GEMM_DRAIN} is shorter than the PE "
                             f"accumulate pipeline ({PE.LATENCY - 1} cycles)")
        if spad_word_bits(cfg, "act") != act_block_layout(cfg).size \
                or 1 << index_bits(cfg) != cfg.act_word_bytes:
            raise ValueError("an ACT word must be one activation block of max_block bytes")
        self._cfg = cfg
        super().__init__({
            "cmd": In(stream.Signature(GemmBody)),
            "done": Out(1),
            "mac": Out(1),
            "act_rd": In(spad_read_signature(cfg, "act")),
            "wgt_rd": In(spad_read_signature(cfg, "wgt")),
            "param_rd": In(spad_read_signature(cfg, "param")),
            "out_wr": In(spad_write_signature(cfg, "out")),
        })

    @property
    def cfg(self) -> AcceleratorConfig:
        return self._cfg

    def elaborate(self, platform):
        m = Module()
        cfg = self._cfg
        adepth = spad_depth(cfg, "act")
        m.submodules.decoder = dec = Decoder(cfg)
        m.submodules.array = arr = Array(cfg)
        early = registered_control(cfg)
        m.submodules.epilogue = epi = Epilogue(cfg, ahead=early)
        connect(m, flipped(self.wgt_rd), dec.rd)
        connect(m, flipped(self.param_rd), epi.param_rd)
        connect(m, flipped(self.out_wr), epi.out_wr)

        # The command's transfer (`take`) comes late in its cycle, from the event grant, so it
        # only moves the state machine (the decoder starts when `idle` falls). Everything a run
        # starts from is copied from the payload in every idle cycle instead: nothing reads it
        # while idle, and the copy made in the transfer cycle is the command's.
        ins = Signal(GemmBody)
        cmd = self.cmd.payload
        take = self.cmd.valid & self.cmd.ready
        with m.If(self.cmd.ready):
            m.d.sync += ins.eq(cmd)
        m.d.comb += [dec.idle.eq(self.cmd.ready),
                     dec.wgt_addr.eq(cmd.wgt_addr), dec.ins.eq(ins), epi.ins.eq(ins)]
        m.d.sync += epi.prefetch.eq(take)  # in c + 1, when ins holds the command

        # ---- per-instruction constants (registered: ins is constant while the core runs) -----
        # The sequencer's per-cycle decisions use only these flags and small counters, so the
        # instruction fields' wide comparisons stay off its critical paths.
        # gap_gs takes CONST_STAGES (header words, then the comparison): the first RECORD,
        # which reads it, is issued in c + GEMM_FILL + 1 - LATENCY at the earliest (x_0 above).
        hdr = Signal(range(MAX_HEADER_WORDS + 1))
        has_hdr = Signal()                      # group headers: 1 or 2 words
        hdr2 = Signal()                         # two header words (asymmetric)
        gs_is1 = Signal()                       # one step per group
        t_is1 = Signal()                        # one token
        gap_gs = Signal.like(ins.tokens_m1)     # cycles before a group-start record, minus one
        m.d.sync += [hdr.eq(header_words(ins)),
                     has_hdr.eq(ins.group_steps != 0), hdr2.eq((ins.group_steps != 0) & ins.asym),
                     gs_is1.eq(ins.group_steps == 1), t_is1.eq(ins.tokens_m1 == 0),
                     gap_gs.eq(Mux(hdr > ins.tokens_m1, hdr, ins.tokens_m1))]
        # Activation blocks: n_eff steps per block, m_eff bytes per block (dense: 1 and 1); a
        # step ends its block at nib == n_last and its ACT word at kb_sub == sub_last.
        n_last = Signal(range(cfg.max_block))
        m_eff = Signal(range(cfg.max_block + 1))
        sub_last = Signal(index_bits(cfg))
        with m.Switch(ins.pattern):
            for i, p in enumerate(cfg.pattern_table):
                n, mb = (1, 1) if p.dense else (p.n, p.m)
                with m.Case(i):
                    m.d.sync += [n_last.eq(n - 1), m_eff.eq(mb),
                                 sub_last.eq(cfg.max_block - mb)]
        act_base = Signal(range(adepth))
        stride = Signal(range(adepth))
        m.d.sync += act_base.eq(beats_to_words(ins.act_addr, cfg, "act"))
        sw = beats_to_words(ins.act_stride, cfg, "act")
        m.d.sync += stride.eq(sw if adepth & (adepth - 1) == 0 else sw % adepth)

        # ---- step sequencer ---------------------------------------------------------------------
        rem = Signal(range(GEMM_FILL + MAX_HEADER_WORDS + 2 + cfg.max_tokens))
        steps_left = Signal.like(ins.k_steps)   # RECORDs still to issue ...
        more = Signal()                         # ... is not zero
        last_step = Signal()                    # ... is one
        gpos = Signal.like(ins.group_steps)     # steps left in the current group
        gpos_is1 = Signal()
        next_gs = Signal()                      # the next RECORD starts a group
        step0 = Signal()
        slots_left = Signal.like(ins.tokens_m1)
        j = Signal(range(cfg.max_tokens))
        cur_first = Signal()
        nib = Signal(range(cfg.max_block))      # step inside the activation block
        kb_sub = Signal(index_bits(cfg))        # block offset inside the ACT word
        kb_word = Signal(range(adepth))         # ACT word of the block, from the token base

        rec = Signal()
        slot = Signal()
        slot_tok = Signal.like(j)
        slot_first = Signal()
        last_slot = Signal()                    # last token of a step
        final_slot = Signal()                   # ... of the last step
        drain = Signal(range(cfg.rows + self.LATENCY + GEMM_DRAIN + 1))

        ep_start = Signal()
        ep_ahead = Signal()                     # ep_start in the next cycle
        none_done = Signal()
        none_ahead = Signal()                   # none_done in the next cycle

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                # rem starts at GEMM_FILL - LATENCY + max(0, hdr - tokens_m1) for a grouped
                # stream: the extra is nonzero for a handful of (hdr, tokens_m1) pairs, so it
                # is a table here, not a subtraction and a comparison in the transfer cycle.
                c_hdr = header_words(cmd)
                rem0 = Signal.like(rem)
                m.d.comb += rem0.eq(GEMM_FILL - self.LATENCY)
                for h in range(1, MAX_HEADER_WORDS + 1):
                    for t in range(h):
                        with m.If((c_hdr == h) & (cmd.tokens_m1 == t)):
                            m.d.comb += rem0.eq(GEMM_FILL - self.LATENCY + h - t)
                m.d.sync += [
                    rem.eq(rem0),
                    steps_left.eq(cmd.k_steps), more.eq(cmd.k_steps != 0),
                    last_step.eq(cmd.k_steps == 1), next_gs.eq(cmd.group_steps != 0),
                    step0.eq(1), slots_left.eq(0), nib.eq(0), kb_sub.eq(0), kb_word.eq(0),
                ]
                with m.If(take):
                    m.next = "RUN"
            with m.State("RUN"):
                # Header words in the last hdr cycles before a group's first RECORD.
                m.d.comb += rec.eq((rem == 0) & more)
                with m.If(rec):
                    m.d.comb += dec.op.eq(WeightOp.RECORD)
                with m.Elif(more & next_gs & (rem == 2) & hdr2):
                    m.d.comb += dec.op.eq(WeightOp.CODES)
                with m.Elif(more & next_gs & (rem == 1) & has_hdr):
                    m.d.comb += dec.op.eq(Mux(hdr2, WeightOp.ZEROS, WeightOp.CODES))

                with m.If(rec):
                    ngs = has_hdr & Mux(next_gs, gs_is1, gpos_is1)
                    gpos_n = Mux(next_gs, ins.group_steps, gpos) - 1
                    m.d.sync += [
                        steps_left.eq(steps_left - 1), more.eq(~last_step),
                        last_step.eq(steps_left == 2),
                        gpos.eq(gpos_n), gpos_is1.eq(gpos_n == 1), next_gs.eq(ngs),
                        rem.eq(Mux(ngs, gap_gs, ins.tokens_m1)),
                        slots_left.eq(ins.tokens_m1), j.eq(1),
                        cur_first.eq(step0 & ~ins.accumulate), step0.eq(0),
                    ]
                with m.Else():
                    with m.If(rem != 0):
                        m.d.sync += rem.eq(rem - 1)
                    with m.If(slots_left != 0):
                        m.d.sync += [slots_left.eq(slots_left - 1), j.eq(j + 1)]
                m.d.comb += [
                    slot.eq(rec | (slots_left != 0)),
                    slot_tok.eq(Mux(rec, 0, j)),
                    slot_first.eq(Mux(rec, step0 & ~ins.accumulate, cur_first)),
                    last_slot.eq(Mux(rec, t_is1, slots_left == 1)),
                    final_slot.eq(last_slot & Mux(rec, last_step, ~more)),
                ]
                # Advance the activation block after the last token of each step (equality
                # tests against registered limits: no adder before the enables).
                with m.If(last_slot):
                    with m.If(nib == n_last):
                        m.d.sync += [nib.eq(0), kb_sub.eq(kb_sub + m_eff)]
                        with m.If(kb_sub == sub_last):
                            m.d.sync += kb_word.eq(wrap_inc(kb_word, adepth))
                    with m.Else():
                        m.d.sync += nib.eq(nib + 1)
                # Epilogue start = last slot + activation path + row skew + drain.
                with m.If(final_slot | (~more & (slots_left == 0))):
                    m.d.sync += drain.eq(self.LATENCY + cfg.rows + GEMM_DRAIN - 2)
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                with m.If(drain == 0):
                    m.d.comb += ep_start.eq(1)
                    with m.If(ins.epilogue == EpilogueMode.NONE):
                        m.d.comb += none_done.eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.next = "EPILOGUE"
                with m.Else():
                    m.d.sync += drain.eq(drain - 1)
                    if early:  # DRAIN starts with drain >= 1 (checked above): 0 follows 1
                        m.d.comb += [ep_ahead.eq(drain == 1),
                                     none_ahead.eq((drain == 1)
                                                   & (ins.epilogue == EpilogueMode.NONE))]
            with m.State("EPILOGUE"):
                with m.If(epi.done):
                    m.next = "IDLE"
        # With `early`, flip-flops the placer can put beside the epilogue and beside the
        # sequencer (the event unit's side of the long wire); reset with the core, as the
        # state they are decoded from.
        start = replica(m, ep_ahead, "ep_start_r", reset=True) if early else ep_start
        m.d.comb += [dec.sub.eq(kb_sub), epi.start.eq(start)]
        if early:
            m.d.sync += self.done.eq(none_ahead | epi.done_ahead)
        else:
            m.d.comb += self.done.eq(none_done | epi.done)

        # ---- activation path: slot -> register -> address -> wrap -> ACT read -> block -> row 0
        s_v = Signal()
        s_tok = Signal.like(slot_tok)
        s_kbw = Signal.like(kb_word)
        m.d.sync += [s_v.eq(slot), s_tok.eq(slot_tok), s_kbw.eq(kb_word)]
        tb = Signal(range(adepth))              # token base of the next slot
        base = Mux(s_tok == 0, act_base, tb)
        with m.If(s_v):
            m.d.sync += tb.eq(wrap_add(base, stride, adepth))
        a_sum = Signal(range(2 * adepth))
        a_addr = Signal(range(adepth))
        m.d.sync += [a_sum.eq(base + s_kbw),
                     a_addr.eq(Mux(a_sum >= adepth, a_sum - adepth, a_sum))]
        m.d.comb += self.act_rd.addr.eq(a_addr)
        blk = Signal(act_block_layout(cfg))
        m.d.sync += blk.eq(self.act_rd.data)
        ctl = [slot, slot_tok, slot_first]
        for stage in range(self.ACT_LATENCY):
            nxt = [Signal.like(s, name=f"{s.name}_p{stage}") for s in ctl]
            m.d.sync += [n.eq(s) for n, s in zip(nxt, ctl, strict=True)]
            ctl = nxt
        m.d.comb += [
            arr.act.eq(blk), arr.valid.eq(ctl[0]), arr.tok.eq(ctl[1]), arr.first.eq(ctl[2]),
            arr.w.eq(dec.w), arr.idx.eq(dec.idx), arr.load.eq(dec.valid),
            arr.rd_addr.eq(epi.acc_addr), epi.acc_data.eq(arr.rd_data),
            self.mac.eq(arr.mac),
            # The epilogue's products come from the idle PE and Dequant multipliers.
            arr.ep_next.eq(epi.ep_next), arr.ep_mult.eq(epi.mult), epi.lo_prod.eq(arr.ep_lo),
            dec.ext.eq(epi.hi_en), dec.ext_a.eq(epi.hi), dec.ext_b.eq(epi.mult),
            epi.hi_prod.eq(dec.ext_prod),
        ]
        return m
