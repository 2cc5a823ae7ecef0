"""Instruction fetch, hardware checks and dispatch into the engine queues.

The fetch unit owns the instruction memory (``cfg.imem_depth`` x 128 bits, written through
:attr:`FetchUnit.imem_wr` while the machine is idle) and runs a five-stage pipeline:

====  ========================================================================================
F     read ``imem[pc]`` (cycle 0 after start for ``pc = 0``), every bank of 2048 words
S1    the banks' words, registered
S2    bank select; the terms of the opcode / event / GEMM field checks (of the fetched word:
      a loop's offset, picked here for a body's LOAD or STORE, reaches only the DRAM range's
      carry-save sum); the value of the run-time register a LOAD or STORE names, picked
      from the register file (hw.isa.relative_fields), and a VEC's ``imm`` plus its own;
      DMA extent products ``rows * row_beats`` and ``rows * dram_stride`` (in 16-bit halves:
      multipliers between registers); a ROPE's ``heads * head_dim``; a VEC's results as
      the terms of ``vec_out_words`` (hw.isa.vec_out_terms)
S3    the field checks' error code from their terms; extent sums, each less its limit, so that
      the range check is the sum's sign bit (the DRAM range's with the register's value; a
      VEC's VOUT range, ``dst_addr`` and the terms); the
      ROPE product against ``length``; the effective word (``dram_addr`` plus the loop's
      offset and the register; the VEC's sum saturated) and a relative VEC's
      checks of its ``imm``
S4    the error code from the registered checks; this is the *dispatch* stage
====  ========================================================================================

so instruction 0 is available at dispatch in cycle ``FETCH_LATENCY = 5``. The stages advance
together and stall together, so while S4 holds instruction ``i`` the pipeline already holds
``i + 1`` checked: ``a_{i+1} = d_i + 1`` whatever the check latency (hw/timing.py, "Fetch").
The depth is set by 100 MHz on the ECP5: a 16 x 32 product and a 50-bit sum each need a stage of
their own, and a 50-bit comparison on top of the sum would need a third (it was the 2x4 array's
critical path), so S2 folds each limit into an operand of the sum and S3 keeps only its sign.

S4 dispatches its instruction into the queue of its engine (:func:`hw.engines.engine_of`) when
the queue is not full (registered), or ends fetching (END), or reports its error
(:func:`hw.isa.dispatch_error`, implemented here from the ISA layouts and the configuration;
PC_OVERFLOW when the instruction's ``pc`` is ``imem_depth``; ILLEGAL_OPCODE for the words
:func:`hw.isa.legal_words` rejects).
The top level stops the machine on an error.
"""

from __future__ import annotations

from amaranth import Array, Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw import timing
from hw.config import AcceleratorConfig
from hw.ecp5_dsp import DSP_REGISTER
from hw.engines import OPS, engines_of
from hw.isa import (
    DRAM_ADDR_MAX,
    IMM_MAX,
    INSTR_BITS,
    LOAD_SPADS,
    MOVE_SOURCES,
    NO_EVENT,
    NUM_REGS,
    REG_BITS,
    ROPE_HEAD_DIM_BITS,
    STORE_SPADS,
    EpilogueMode,
    ErrorCode,
    InstrLayout,
    Opcode,
    RunRegs,
    Spad,
    VecBody,
    VecFunc,
    argmax_bad,
    dequant_amax_addr,
    dispatch_limits,
    field_location,
    insert_bad,
    is_move,
    kv4_bad,
    legal_words,
    reads_param,
    vec_out_terms,
    vec_reads_amax,
    vec_reads_b,
    vec_unaligned,
)
from hw.queues import entry_layout

__all__ = ["FetchUnit"]

#: Register stages between the instruction memory read and the dispatch stage.
_CHECK_STAGES = 4
#: The S2 registers that hold a multiplier's product: the DSP's own output register can hold
#: them (hw.ecp5_dsp), so no route lies between the multiplier and its register.
_PRODUCTS = ("span_lo", "span_hi", "rope_row")
#: ``spad_len`` too, in configurations with a vector engine only (their DSP sites are nearly
#: all used, so its multiplier is placed away from the fetch unit: docs/synthesis.md); the
#: board's design keeps it in a slice until its bitstream is next rebuilt.
_VECTOR_PRODUCTS = ("spad_len",)
#: Bits of a ROPE's heads that enter the heads * head_dim product: 15, as the row has fewer
#: than 2**16 elements and head_dim is at least 2.
_ROPE_HEADS_BITS = VecBody["length"].width - 1
#: Largest instruction-memory bank (an ECP5 DP16KD is 2048 x 9).
_BANK_DEPTH = 2048


def _extend(value: Value, width: int) -> Value:
    """``value`` as a ``width``-bit two's complement word (sign-extended when signed)."""
    value = Value.cast(value)
    if len(value) > width:
        raise ValueError(f"a {len(value)}-bit value does not fit {width} bits")
    top = value[-1] if value.shape().signed else Const(0, 1)
    return Cat(value, *[top] * (width - len(value)))


def wide_sum(terms: list[Value], const: int, width: int, negated: list[Value] = ()) -> Value:
    """``sum(terms) - sum(negated) + const`` modulo ``2**width``, as a carry-save tree and one
    adder.

    Each 3:2 step is one LUT level per bit (sum ``a ^ b ^ c``, carry the majority, one place
    up), so a sum of many terms costs a LUT level per step and a single carry chain instead of
    a carry chain per term. ``terms`` and ``negated`` are Amaranth values (sign-extended when
    signed, at most ``width`` bits; a negated term is its complement plus one, the one folded
    into ``const``); ``const`` any int. The result is unsigned; its top bit is the sign when
    the true sum fits ``width`` bits as two's complement.
    """
    if width < 1:
        raise ValueError(f"width must be positive, got {width!r}")
    ops = [_extend(t, width) for t in terms] + [~_extend(t, width) for t in negated]
    const += len(negated)
    if const % (1 << width):
        ops.append(Const(const % (1 << width), width))
    while len(ops) > 2:
        a, b, c = ops[:3]
        carry = (a & b) | (a & c) | (b & c)
        ops = ops[3:] + [a ^ b ^ c, Cat(Const(0, 1), carry[:width - 1])]
    if not ops:
        return Const(0, width)
    return (ops[0] + ops[1])[:width] if len(ops) == 2 else ops[0]


class FetchUnit(wiring.Component):
    """Instruction memory, fetch pipeline, checks and dispatch.

    Parameters
    ----------
    cfg:
        The accelerator configuration.

    Members
    -------
    imem_wr: Out(WritePort.Signature(addr_width=ceil_log2(imem_depth), shape=128))
        Host write port of the instruction memory (instruction ``i`` at address ``i``).
    run: In(1)
        The machine is running; fetch starts from ``pc = 0`` after a reset.
    regs: In(hw.isa.RunRegs)
        The run-time registers (1 .. NUM_REGS as elements 0 ..), steady while the machine
        runs: a LOAD's or STORE's ``dram_addr`` and a VEC's ``imm`` that name one have its
        value added in S2 -> S3 (:func:`hw.isa.relative_fields`).
    load, compute, store, vector: Out(stream.Signature(entry_layout(body)))
        Dispatch into the engine queues: one port per engine the configuration has
        (:func:`hw.engines.engines_of`), named after it, whose entries carry its body layout;
        ``ready`` is the queue's registered "not full".
    error: Out(ErrorCode)
        The dispatch stage holds an instruction that fails its checks (while running).
    error_pc: Out(range(imem_depth + 1))
        Its index.
    ended: Out(1)
        END has been dispatched; fetching has stopped.
    stalled: Out(1)
        The dispatch stage holds a valid instruction whose queue is full (a fetch-stall cycle).
    dispatched: Out(1)
        An instruction (END included) is dispatched in this cycle.
    """

    def __init__(self, cfg: AcceleratorConfig):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        if timing.FETCH_LATENCY != 1 + _CHECK_STAGES:
            raise ValueError(f"hw.timing.FETCH_LATENCY={timing.FETCH_LATENCY} does not match the "
                             f"fetch pipeline (read + {_CHECK_STAGES} register stages)")
        self._cfg = cfg
        self._engines = engines_of(cfg)
        if [e.engine.value for e in self._engines] != list(range(len(self._engines))):
            raise ValueError(f"the engines {[e.name for e in self._engines]} are not the first "
                             f"{len(self._engines)} values of hw.isa.Engine (dispatch is one-hot "
                             f"by engine value)")
        super().__init__({
            "imem_wr": Out(memory.WritePort.Signature(addr_width=ceil_log2(cfg.imem_depth),
                                                      shape=unsigned(INSTR_BITS))),
            "run": In(1),
            "regs": In(RunRegs),
            **{e.name: Out(stream.Signature(entry_layout(e.body_layout)))
               for e in self._engines},
            "error": Out(ErrorCode),
            "error_pc": Out(range(cfg.imem_depth + 1)),
            "ended": Out(1),
            "stalled": Out(1),
            "dispatched": Out(1),
        })

    @property
    def cfg(self) -> AcceleratorConfig:
        return self._cfg

    # ------------------------------------------------------------------ checks (S1 -> S2)
    def _field_checks(self, m: Module, ins) -> dict:
        """Combinational checks of one instruction view; returns named flags and products.

        The rules are those of :func:`hw.isa.dispatch_error`, written here as logic split over
        the pipeline stages; every constant comes from :func:`hw.isa.dispatch_limits`.
        """
        lim = dispatch_limits(self._cfg)
        op = ins.header.opcode
        is_ = {o: op == o for o in Opcode}
        legal = legal_words({"opcode": op.as_value(),
                             "sync.engine": ins.body.sync.engine.as_value(),
                             "gemm.epilogue": ins.body.gemm.epilogue.as_value(),
                             "dma.spad": ins.body.dma.spad.as_value(),
                             "vec.func": ins.body.vec.func.as_value(),
                             "vec.reg": ins.body.vec.reg}, lim)
        # Each rule's terms are registered apart (S2) and OR-ed into the error code in S3
        # (:meth:`_pre_error`): the word's bank multiplexer and the comparisons fill S2.
        bad_event = Cat((ev != NO_EVENT) & (ev >= lim.num_events)
                        for ev in (ins.header.wait, ins.header.signal))

        dma = ins.body.dma
        spad = dma.spad.as_value()

        def one_of(spads) -> Value:
            return Cat(spad == s.value for s in spads).any()

        # A move (hw.isa.is_move) reads VOUT or OUT (hw.isa.MOVE_SOURCES) and writes VIN where
        # a STORE writes DRAM; without a vector engine a move from VOUT fails the VIN range as
        # any transfer naming VIN and one from OUT is ILLEGAL_OPCODE: no logic for either.
        far, src = lim.dram_beats + 1, spad
        if self._cfg.has_vector:
            move = is_move(op.as_value(), spad)
            far = Mux(move, lim.move_beats + 1, far)
            for k, v in MOVE_SOURCES.items():   # (hw.isa.dma_source, as a multiplexer)
                src = Mux(move & (spad == k.value), v.value, src)
        stores = STORE_SPADS if self._cfg.has_vector else tuple(
            s for s in STORE_SPADS if s not in MOVE_SOURCES)
        dma_bad = Cat(Mux(is_[Opcode.STORE], ~one_of(stores), ~one_of(LOAD_SPADS)),
                      dma.rows == 0, dma.row_beats == 0)

        # VEC: a row of at least one element, its ranges inside VIN (16-bit sums and
        # comparisons, a stage of their own) and VOUT (its terms here, their sum in S3).
        v = ins.body.vec
        func, length = v.func.as_value(), v.length
        # ROPE: head_dim even and >= 2, its table inside VIN; heads * head_dim == length is
        # checked in S3 on the product registered here. Heads from bit 15 up are refused
        # without the product: with head_dim >= 2 their product is past any length, and the
        # product keeps to 15 x 16 bits (one multiplier). INSERT: its stride and, at stride 1,
        # whole words (a few bits of imm: insert_bad). KV4: its group divides the row
        # (kv4_bad). A laned sub-op: its rows start on a multiple of the lanes (vec_unaligned;
        # no logic with one lane).
        head_dim, heads = v.imm[:ROPE_HEAD_DIM_BITS], v.imm[ROPE_HEAD_DIM_BITS:]
        is_rope = func == VecFunc.ROPE.value
        relative = v.reg != 0  # those imm checks on the sum, in S3 (elaborate)
        bad_vec = Cat(length == 0,
                      v.a_addr + length > lim.vin_elems,
                      vec_reads_b(func) & (v.b_addr + length > lim.vin_elems),
                      (func == VecFunc.SOFTMAX.value) & (v.imm > length) & ~relative,
                      is_rope & (head_dim[0] | (head_dim == 0) | heads[_ROPE_HEADS_BITS:].any()
                                 | (v.b_addr + head_dim[1:] > lim.vin_elems)),
                      vec_reads_amax(func) & (dequant_amax_addr(v.imm) >= lim.vin_elems),
                      insert_bad(func, v.imm) & ~relative, kv4_bad(func, length, v.imm),
                      argmax_bad(func, length, v.imm),
                      vec_unaligned(func, v.a_addr, v.b_addr, v.dst_addr, lim.vec_lanes,
                                    lim.vec_silu))
        rope_row = heads[:_ROPE_HEADS_BITS] * head_dim
        # The results' range in VOUT, dst_addr + vec_out_words > vout_elems, in S3: here the
        # terms of vec_out_words (each a selection of at most one adder of the fields; as one
        # sum behind the KV4 group count's shift they were the deepest logic of the design).
        out_terms = vec_out_terms(func, length, v.imm)
        if not self._cfg.has_vector:   # VEC is ILLEGAL_OPCODE there: no logic for its fields
            bad_vec = Const(0, 1)
            is_rope, rope_row = Const(0, 1), Const(0, 1)
            out_terms = ()

        g = ins.body.gemm
        int8_bad = g.int8 if not lim.int8 else g.int8 & (g.pattern != 0)
        bad_gemm = Cat(g.pattern >= lim.patterns, g.tokens_m1 >= lim.max_tokens,
                       g.k_steps == 0, int8_bad, g.asym & (g.group_steps == 0))

        def misaligned(value, words):
            return value[:ceil_log2(words)] != 0 if words > 1 else Const(0)

        def beats(spad: Spad) -> int:
            return int(lim.spad_beats[spad.value])

        bad_gemm_addr = Cat(g.wgt_addr >= beats(Spad.WGT),
                            misaligned(g.wgt_addr, lim.wgt_words),
                            g.act_addr >= beats(Spad.ACT),
                            g.out_addr >= beats(Spad.OUT),
                            g.param_addr >= beats(Spad.PARAM),
                            misaligned(g.act_addr, lim.act_words),
                            misaligned(g.act_stride, lim.act_words),
                            (g.epilogue != EpilogueMode.NONE)
                            & misaligned(g.out_addr, lim.out_words),
                            reads_param(g.epilogue.as_value())
                            & misaligned(g.param_addr, lim.param_words))
        # The engine of each queued opcode (hw.engines.OPS): fixed, or named by the body's
        # engine field; the last opcode that names one is the default.
        named = [op for op in OPS if op.engine is None]
        target = ins.body[named[-1].body].engine if named else Const(0)
        for op in reversed(OPS):
            if op.engine is not None:
                target = Mux(is_[op.opcode], op.engine, target)
            elif op is not named[-1]:
                target = Mux(is_[op.opcode], ins.body[op.body].engine, target)
        return {
            "illegal": ~legal,
            "bad_event": bad_event,
            "bad_gemm": bad_gemm,
            "bad_gemm_addr": bad_gemm_addr,
            "dma_bad": dma_bad,
            "bad_vec": bad_vec,
            "is_rope": is_rope,
            **{f"vout_t{k}": t for k, t in enumerate(out_terms)},
            "rope_row": rope_row,
            "is_vec": is_[Opcode.VEC],
            "is_gemm": is_[Opcode.GEMM],
            "is_dma": is_[Opcode.LOAD] | is_[Opcode.STORE],
            "is_end": is_[Opcode.END],
            "is_repeat": is_[Opcode.REPEAT],
            "bad_repeat": (ins.body.repeat.length == 0) | (ins.body.repeat.count == 0),
            "is_sync": Cat(is_[op.opcode] for op in OPS if op.sync).any(),
            "target": target,
            "spad_len": dma.rows * dma.row_beats,
            # (rows - 1) * stride as rows * stride - stride, the product in two 16-bit halves
            # (one multiplier each, summed in the next stage): no adder on either side of a
            # multiplier. rows == 0 is rejected on its own.
            "span_lo": dma.rows * dma.dram_stride[:16],
            "span_hi": dma.rows * dma.dram_stride[16:],
            # The DRAM range's last beat less the first beat past DRAM, less the span, is
            # dram_addr + row_beats - dram_stride - (dram_beats + 1): negative while the range
            # fits (a move's VIN rows: move_beats). The limits are folded in here so that S3
            # ends in a sign bit; the caller adds the address (and the loop's offset) in the
            # same carry-save sum.
            "dram_rest": ([dma.row_beats], [dma.dram_stride, far], 0) if isinstance(far, Value)
            else ([dma.row_beats], [dma.dram_stride], -far),
            "spad_limit": Array(Const(-int(n) - 1) for n in lim.spad_beats)[src],
        }

    @staticmethod
    def _pre_error(c: dict) -> Value:
        """The error code of the field checks (:meth:`_field_checks`), from their terms."""
        gemm_err = Mux(c["bad_gemm"].any(), ErrorCode.BAD_GEMM,
                       Mux(c["bad_gemm_addr"].any(), ErrorCode.BAD_ADDRESS, ErrorCode.NONE))
        return Mux(c["illegal"], ErrorCode.ILLEGAL_OPCODE,
                   Mux(c["bad_event"].any(), ErrorCode.BAD_EVENT,
                       Mux(c["is_gemm"], gemm_err,
                           Mux((c["is_dma"] & c["dma_bad"].any())
                               | (c["is_vec"] & c["bad_vec"].any()),
                               ErrorCode.BAD_ADDRESS,
                               Mux(c["is_repeat"] & c["bad_repeat"], ErrorCode.BAD_REPEAT,
                                   ErrorCode.NONE)))))

    def elaborate(self, platform):
        m = Module()
        cfg = self._cfg
        depth = cfg.imem_depth
        aw = ceil_log2(depth)
        # Banks of at most _BANK_DEPTH words: a deeper memory makes Yosys put a multiplexer
        # behind the block RAMs, whose slow clock-to-output then leaves no time for it. Each
        # bank's word goes straight into a flip-flop; the bank is selected in the next stage.
        banks = max(1, depth // _BANK_DEPTH)
        bank_bits = ceil_log2(banks)
        low = aw - bank_bits
        rd_ports = []
        for b in range(banks):
            mem = memory.Memory(shape=unsigned(INSTR_BITS), depth=depth // banks, init=[])
            m.submodules[f"imem{b}" if banks > 1 else "imem"] = mem
            wp, rp = mem.write_port(), mem.read_port()
            m.d.comb += [wp.addr.eq(self.imem_wr.addr[:low]), wp.data.eq(self.imem_wr.data),
                         wp.en.eq(self.imem_wr.en & (self.imem_wr.addr[low:] == b))]
            rd_ports.append(rp)

        pc_shape = range(depth + 2 * _CHECK_STAGES + 2)
        pc = Signal(pc_shape)
        copies: dict[str, list] = {}   # stage name -> its registers' assignments

        def stage(name: str, **values) -> dict:
            """Registers of the next stage, loaded from ``values`` when the pipeline advances.
            Only the valid bit ``v`` is reset by ``start``: the dispatch stage uses nothing of
            an invalid instruction (hw/top.py, "Reset")."""
            regs = {}
            for key, value in values.items():
                in_dsp = key in _PRODUCTS or (key in _VECTOR_PRODUCTS and cfg.has_vector)
                regs[key] = Signal(value.shape(), name=f"{name}_{key}", reset_less=key != "v",
                                   attrs={DSP_REGISTER: 1} if in_dsp else {})
                copies.setdefault(name, []).append(regs[key].eq(value))
            return regs

        # ---- hardware loops (hw.isa.Repeat): the loop registers, loaded when a REPEAT is
        # dispatched; `offset` holds the iteration's DRAM offsets by transfer class (0 outside
        # a loop's iterations 1 ..; hw.isa.loop_stride), picked in S2 for every LOAD and STORE
        # of the body (pc <= last) and added in S3, so that the DRAM range check and the queue
        # see the effective address (hw.isa.LoopStream.fields).
        rep_body = InstrLayout["body"].shape["repeat"].shape
        classes = ("wgt_stride", "load_stride", "store_stride")
        count_w = rep_body["count"].width
        last_shape = unsigned(max(len(pc), rep_body["length"].width) + 1)
        active = Signal(name="loop_active")
        first = Signal(pc_shape, name="loop_first")
        last = Signal(last_shape, name="loop_last")
        left = Signal(count_w, name="loop_left")
        stride = {k: Signal(rep_body[k].width, name=f"loop_{k}") for k in classes}
        offset = {k: Signal(count_w + rep_body[k].width, name=f"loop_offset_{k[:-7]}")
                  for k in classes}
        # F: read imem[pc]; S1: the word; S2: field check terms and products; S3: their error
        # code, extent sums; S4: extent comparisons -> error code (the dispatch stage).
        s0 = stage("s0", v=Const(1), pc=pc)
        # `in_loop`: the instruction lies at or before the loop's last (read in S1). `last`
        # changes only when a REPEAT is dispatched, which clears the offsets until the
        # iteration's end refills the pipeline, so the flag may be taken a stage early.
        s1 = stage("s1", v=s0["v"], pc=s0["pc"], in_loop=s0["pc"] <= last,
                   **{f"word{b}": rp.data for b, rp in enumerate(rd_ports)})
        word = Array(s1[f"word{b}"] for b in range(banks))[s1["pc"][low:aw]] if banks > 1 \
            else s1["word0"]
        loop_back = Signal()
        off_at, off_w = field_location("dma.dram_addr")
        imm_at, imm_w = field_location("vec.imm")
        assert off_at + off_w <= imm_at, (off_at, off_w, imm_at)  # the word's order below
        fetched = InstrLayout(word[:InstrLayout.size])
        op1 = fetched.header.opcode
        is_dma1 = (op1 == Opcode.LOAD) | (op1 == Opcode.STORE)
        # ---- run-time registers (hw.isa.relative_fields): S2 holds the value of the register
        # a LOAD or STORE names (for its dram_addr), 0 for every other word, picked from the
        # register file here, and a VEC's imm plus the value of the register it names (the
        # sum here, so that S3's checks of it do not wait for a carry chain as wide as the
        # register); S3 adds the DMA's, saturates both and holds the effective word, which S4
        # and the queue see. The DRAM range adds the register in its own carry-save sum; a
        # VEC's checks of its imm (REG_VEC_FUNCS: a SOFTMAX's count, an INSERT's geometry)
        # are made on the sum in S3 for a word that names a register, in S2 for every other.
        is_vec1 = op1 == Opcode.VEC
        regfile = Array([Const(0, REG_BITS)] + [self.regs[i] for i in range(NUM_REGS)])
        reg_dma = Mux(is_dma1, regfile[fetched.body.dma.reg], 0)
        # (no vector engine: VEC is ILLEGAL_OPCODE there, no register reaches an imm)
        reg_vec = Mux(is_vec1, regfile[fetched.body.vec.reg], 0) if cfg.has_vector \
            else Const(0, REG_BITS)
        in_body1 = is_dma1 & s1["in_loop"]
        if cfg.has_vector:   # (a move's VIN rows do not advance: hw.isa.loop_stride)
            in_body1 &= ~is_move(op1.as_value(), fetched.body.dma.spad.as_value())
        step = Mux(in_body1, Mux(op1 == Opcode.STORE, offset["store_stride"],
                                 Mux(fetched.body.dma.spad == Spad.WGT, offset["wgt_stride"],
                                     offset["load_stride"])), 0)
        # The checks read the fetched word: the offsets change only a LOAD's or STORE's
        # dram_addr, which only the DRAM range reads, and the DRAM range adds the loop's
        # offset and the register's value in S3, in the same carry-save sum as its other
        # terms (S2's is the address's and the extent's alone, so that no carry chain waits
        # for the offset's selection behind the bank select). S2 holds the fetched word, the
        # offset and the register's value, S3 the effective word (the address plus both,
        # saturated; hw.isa.LoopStream.fields, hw.isa.relative_fields), which S4 and the
        # queue see.
        chk = self._field_checks(m, fetched)
        plus, minus, const = chk.pop("dram_rest")
        tail_terms = [fetched.body.dma.dram_addr, *plus, *minus]
        tail_w = max(max(len(t) for t in tail_terms), const.bit_length()) + len(tail_terms)
        chk["dram_tail"] = wide_sum([fetched.body.dma.dram_addr, *plus], const, tail_w, minus)
        s2 = stage("s2", v=s1["v"], pc=s1["pc"], ins=fetched, step=step, reg_dma=reg_dma,
                   imm_sum=fetched.body.vec.imm + reg_vec, **chk)
        dma = s2["ins"].body.dma
        vec2 = s2["ins"].body.vec
        raw2 = s2["ins"].as_value()
        addr3 = dma.dram_addr + s2["step"] + s2["reg_dma"]
        addr3 = Mux(addr3[off_w:].any(), DRAM_ADDR_MAX, addr3[:off_w])
        imm3 = Mux(s2["imm_sum"][imm_w:].any(), IMM_MAX, s2["imm_sum"][:imm_w])
        ins3 = InstrLayout(Cat(raw2[:off_at], addr3, raw2[off_at + off_w:imm_at], imm3,
                               raw2[imm_at + imm_w:]))
        # An extent is out of range when its end less the limit (folded in by S2) is >= 0.
        # (one carry-save sum and one carry chain, not two adders and a comparison in series;
        # two unsigned terms below 2**b and the negative limit fit b + 2 bits with the sign)
        spad_terms = [dma.spad_addr, s2["spad_len"], s2["spad_limit"]]
        spad_w = max(len(t) for t in spad_terms) + 2
        spad_over = ~wide_sum(spad_terms, 0, spad_w)[spad_w - 1]
        dram_w = max(tail_w, len(s2["step"]), REG_BITS, len(s2["span_lo"]),
                     len(s2["span_hi"]) + 16) + 4
        dram_over = ~wide_sum([s2["dram_tail"].as_signed(), s2["step"], s2["reg_dma"],
                               s2["span_lo"], s2["span_hi"].shift_left(16)], 0,
                              dram_w)[dram_w - 1]
        # A relative VEC's checks of its effective imm: a SOFTMAX's count within its row (the
        # sign of length - imm - register; the saturation does not change it, as IMM_MAX is
        # past every length), an INSERT's geometry.
        imm_sum_w = max(len(s2["imm_sum"]), len(vec2.length)) + 2
        over_count = wide_sum([vec2.length], 0, imm_sum_w, [s2["imm_sum"]])[imm_sum_w - 1]
        func2 = vec2.func.as_value()
        bad_rel_vec = (vec2.reg != 0) & (((func2 == VecFunc.SOFTMAX.value) & over_count)
                                         | insert_bad(func2, imm3)) if cfg.has_vector \
            else Const(0, 1)
        # A VEC's results past VOUT: dst_addr + vec_out_words - (vout_elems + 1) >= 0, one
        # carry-save sum of S2's terms (BAD_ADDRESS as the field checks', which it follows
        # in the error's priority: a VEC's other errors are ILLEGAL_OPCODE and BAD_EVENT).
        out_terms2 = [vec2.dst_addr] + [s2[k] for k in s2 if k.startswith("vout_t")]
        # (n terms below 2**b sum below 2**(b + bitlen(n)); one bit more for the sign)
        out_w = max(len(t) for t in out_terms2) + len(out_terms2).bit_length() + 1
        dst_over = ~wide_sum(out_terms2, -(int(dispatch_limits(cfg).vout_elems) + 1),
                             out_w)[out_w - 1] if cfg.has_vector else Const(0, 1)
        pre = self._pre_error(s2)
        s3 = stage("s3", v=s2["v"], pc=s2["pc"], ins=ins3, pre=pre,
                   pre_ok=pre == ErrorCode.NONE, pc_over=s2["pc"] == depth,
                   is_end=s2["is_end"], is_repeat=s2["is_repeat"], is_sync=s2["is_sync"],
                   target=s2["target"],
                   bad_range=(s2["is_dma"] & (spad_over | dram_over))
                   | (s2["is_vec"] & s2["is_rope"]
                      & (s2["rope_row"] != s2["ins"].body.vec.length))
                   | (s2["is_vec"] & (bad_rel_vec | dst_over)))
        # A REPEAT or END inside a body: that of the loop running, or of the REPEAT in the
        # dispatch stage (its body's first instruction is here when it is dispatched).
        new_body3 = Signal(name="s3_in_new_body")
        in_body3 = (active & (s3["pc"] <= last)) | new_body3
        fetch_only3 = s3["is_end"] | s3["is_repeat"]
        bad_loop = fetch_only3 & in_body3
        err = Mux(s3["pc_over"], ErrorCode.PC_OVERFLOW,
                  Mux(s3["pre_ok"] & s3["bad_range"], ErrorCode.BAD_ADDRESS,
                      Mux(s3["pre_ok"] & bad_loop, ErrorCode.BAD_REPEAT, s3["pre"])))
        # The dispatch stage keeps its decisions one-hot and pre-decoded, because `adv`
        # (below) gates the whole pipeline and must settle early.
        ok3 = ~s3["pc_over"] & s3["pre_ok"] & ~s3["bad_range"] & ~bad_loop
        to3 = Cat(~fetch_only3 & (s3["target"] == e.engine.value) for e in self._engines)
        s4 = stage("s4", v=s3["v"], pc=s3["pc"], ins=s3["ins"], is_end=s3["is_end"],
                   is_repeat=s3["is_repeat"], is_sync=s3["is_sync"], err=err, ok=ok3, to=to3)
        rep4 = s4["ins"].body.repeat
        m.d.comb += new_body3.eq(s4["v"] & s4["is_repeat"]
                                 & (s3["pc"] <= s4["pc"] + rep4.length))
        v4, ins4, to4 = s4["v"], s4["ins"], s4["to"]
        err4 = Signal(ErrorCode)
        m.d.comb += err4.eq(s4["err"])

        # ---- dispatch (S4)
        ended = self.ended
        live = self.run & ~ended & v4
        ok = s4["ok"]
        ports = {e.engine: getattr(self, e.name) for e in self._engines}

        def ready_of(to: Value) -> Value:
            """The queue of one-hot ``to`` is not full."""
            return Cat(to[e.value] & port.ready for e, port in ports.items()).any()

        ready = ready_of(to4)
        go = live & ok & (s4["is_end"] | s4["is_repeat"] | ready)
        end_now = go & s4["is_end"]
        with m.If(end_now):
            m.d.sync += ended.eq(1)
        # Loops: a REPEAT starts one; the dispatch of a body's last instruction ends an
        # iteration, and jumps back to the body's first (refilling the pipeline) unless it
        # was the last iteration.
        at_last = active & (s4["pc"] == last)
        m.d.comb += loop_back.eq(go & at_last & (left != 0))
        with m.If(go & s4["is_repeat"]):
            m.d.sync += [active.eq(1), first.eq(s4["pc"] + 1), last.eq(s4["pc"] + rep4.length),
                         left.eq(rep4.count - 1)]
            m.d.sync += [stride[k].eq(rep4[k]) for k in classes]
            m.d.sync += [offset[k].eq(0) for k in classes]
        with m.Elif(go & at_last):
            with m.If(left == 0):
                m.d.sync += [active.eq(0)] + [offset[k].eq(0) for k in classes]
            with m.Else():
                m.d.sync += [left.eq(left - 1)]
                m.d.sync += [offset[k].eq(offset[k] + stride[k]) for k in classes]

        # The stages advance together unless the dispatch stage holds an instruction:
        # adv = run & ~ended & (~v4 | go). It gates ~1,000 registers and the instruction
        # memory, and the queues' write enables follow the same decisions, so these are
        # computed from registered copies of the dispatch decisions (`keep`: one net for each
        # use: the memory and pc, each stage's registers, the queues): "the stage is empty or
        # holds an END", "it holds a legal instruction for a queue" and its queue, each loaded
        # with S4, and `ended`. Then adv is two LUT levels, a queue's valid one.
        def decisions(name: str, adv_c: Signal) -> tuple[Value, Signal]:
            """Drive ``adv_c`` (= adv) from copies of the decisions loaded under it; return
            "running and a legal instruction for a queue" and the queue, from the copies."""
            idle = Signal(name=f"s4_idle_{name}", init=1, attrs={"keep": 1})  # = ~v4 at reset
            queue = Signal(name=f"s4_queue_{name}", attrs={"keep": 1})
            to_c = Signal(len(self._engines), name=f"s4_to_{name}", reset_less=True,
                          attrs={"keep": 1})
            ended_c = Signal(name=f"ended_{name}", attrs={"keep": 1})
            with m.If(adv_c):
                m.d.sync += [idle.eq(~s3["v"] | (ok3 & fetch_only3)),
                             queue.eq(s3["v"] & ok3 & ~fetch_only3), to_c.eq(to3)]
            with m.If(loop_back):  # the pipeline is emptied
                m.d.sync += [idle.eq(1), queue.eq(0)]
            with m.If(end_now):
                m.d.sync += ended_c.eq(1)
            m.d.comb += adv_c.eq(self.run & ~ended_c & (idle | queue & ready_of(to_c)))
            return self.run & ~ended_c & queue, to_c

        adv_mem = Signal()
        decisions("mem", adv_mem)
        adv = {}
        for name in copies:
            adv[name] = Signal(name=f"adv_{name}")
            decisions(name, adv[name])
        offer, to_q = decisions("queues", Signal())
        for e in self._engines:
            port, body = ports[e.engine], ins4.body[e.body]
            m.d.comb += [
                port.valid.eq(offer & to_q[e.engine.value]),   # = live & ok & to4[eng]
                port.payload.wait.eq(ins4.header.wait),
                port.payload.signal.eq(ins4.header.signal),
                port.payload.sync.eq(s4["is_sync"]),
                port.payload.body.eq(body),
            ]
        m.d.comb += [
            self.error.eq(Mux(live, err4, ErrorCode.NONE)),
            self.error_pc.eq(s4["pc"]),
            self.stalled.eq(live & ok & to4.any() & ~ready),
            self.dispatched.eq(go),
        ]
        for rp in rd_ports:
            m.d.comb += [rp.addr.eq(pc[:low]), rp.en.eq(adv_mem)]
        with m.If(adv_mem):
            m.d.sync += pc.eq(pc + 1)
        for name, assignments in copies.items():
            with m.If(adv[name]):
                m.d.sync += assignments
        with m.If(loop_back):
            m.d.sync += [pc.eq(first)] + [s["v"].eq(0) for s in (s0, s1, s2, s3, s4)]
        return m
