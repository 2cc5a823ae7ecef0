"""Proof: the fetch unit dispatches a word or stops with the error the dispatch rules give it.

The reference is the rule table of :mod:`hw.isa` itself: :func:`rule_error` evaluates every
rule's ``bad(f, lim)`` -- written with operators that work on ints, numpy arrays and, as here,
Amaranth values -- on the fields of a symbolic 128-bit word (offsets from
:func:`hw.isa.field_location`), in the order and with the opcode legality of
:func:`hw.isa.dispatch_errors`; ``tests/prove/test_golden.py`` checks the lifted table against
``dispatch_errors`` on random and rule-targeted words.

The harness writes two free words into the instruction memory (``cfg.imem_depth`` = 2), sets
free run-time registers (every register any value, held for the run), starts the unit and
leaves every queue's ``ready`` free in every cycle. The reference is the rule table on the
word as dispatched with those registers (:func:`relative_word`: the register's value added to
a relative word's ``dram_addr`` or ``imm``, saturated; :func:`hw.isa.relative_fields`), and a
dispatched word's body is that word's. It tracks the program counter
of the instruction at dispatch (instructions dispatch in order) and asserts, in every cycle
from ``FETCH_LATENCY`` after the start until END: the unit reports exactly ``rule_error`` of that
word (PC_OVERFLOW past the last word); a word with an error is never dispatched into any queue;
a legal word is offered to exactly the queue of its engine, with its events and body, and is
dispatched iff that queue is ready (END: at once, and nothing is fetched after it).

A REPEAT (hw.isa.Repeat) is followed by the reference: its body's words once per iteration,
nothing at dispatch (and no error) in the ``LOOP_BACK_LATENCY - 1`` cycles of a loop-back's
refill, BAD_REPEAT for a REPEAT or END inside a body. (The ``"dma"`` words hold no REPEAT, so
the iteration offsets of DMA addresses are covered by the equivalence harness, not here.)

Bounded model checking to the depth where the third instruction (PC_OVERFLOW) reaches dispatch
plus stall cycles and one loop-back. The DMA extent rules multiply 16-bit by 16- and 32-bit
fields and the unit splits the products differently from the rule table (two 16 x 16 products,
the stride subtracted), which a bit-level solver cannot prove equal at full width (with z3,
``rows`` bounded alone or all three factors below 16, one BMC step did not finish in five
minutes). So the proof runs twice:
``fetch_other`` on every word that is not a LOAD or STORE (undefined opcodes, SYNC, END and GEMM
with all fields free), ``fetch_dma`` on LOAD/STORE words whose ``rows``, ``row_beats`` and
``dram_stride`` are below ``2**ROW_BITS`` (spad, addresses, register field and events free).
Both run on yices (:data:`SOLVER`): on ``fetch_dma`` z3 needed minutes per step from the
first dispatch on, doubling each step (11.5 minutes for step 13, the 18 steps far past the
flow's 30-minute limit); yices proves the same 18 steps, nothing assumed beyond the above, in
7.5 minutes on the two cores shared with other jobs (load 7; ``python -m formal -k fetch``,
``fetch_other`` 1.8 minutes).
"""

from __future__ import annotations

import dataclasses
import functools
import operator

from amaranth import Array, Cat, Const, Mux, Signal, Value
from amaranth.hdl import Assert, Assume

from hw import isa, timing
from hw.config import AcceleratorConfig
from hw.engines import ENGINE_OF_OPCODE, engines_of
from hw.fetch import FetchUnit
from hw.isa import (
    INSTR_BITS,
    ErrorCode,
    Opcode,
    dispatch_limits,
    field_location,
)

from .flow import Harness, Proof

__all__ = ["rule_error", "relative_word", "word_fields", "FetchHarness", "proofs", "ROW_BITS",
           "SOLVER"]

#: Bound on one factor of the DMA extent products (see the module docstring).
ROW_BITS = 3
#: The solver of the fetch proofs (:data:`formal.flow.SOLVER_EXECUTABLES`; module docstring).
SOLVER = "yices"


def word_fields(word) -> dict:
    """Every field of :func:`hw.isa.decode_fields`, as slices of the Amaranth value ``word``."""
    names = ["opcode", "wait", "signal"] + [f"{body}.{name}"
                                           for body, layout in isa.InstrLayout["body"].shape
                                           for name, _ in layout.shape]
    out = {}
    for name in names:
        off, width = field_location(name)
        out[name] = word[off:off + width]
    return out


def relative_word(word, regs) -> Value:
    """The symbolic ``word`` as dispatched with the run-time registers ``regs`` (a
    :data:`hw.isa.RunRegs` value), :func:`hw.isa.relative_fields` written on its fields: a
    LOAD's or STORE's ``dram_addr`` plus its register's value, a VEC's ``imm`` (of
    :data:`hw.isa.REG_VEC_FUNCS`) plus its register's, each saturated; the ``reg`` fields
    kept (the legality rules read them; the engines do not)."""
    f = word_fields(word)
    op = f["opcode"]
    file = Array([Const(0, isa.REG_BITS)] + [regs[i] for i in range(isa.NUM_REGS)])
    moves = {"dma": (op == Opcode.LOAD.value) | (op == Opcode.STORE.value),
             "vec": (op == Opcode.VEC.value) & functools.reduce(
                 operator.or_, (f["vec.func"] == v for v in isa.REG_VEC_FUNCS))}
    top = {"dma": isa.DRAM_ADDR_MAX, "vec": isa.IMM_MAX}
    out = Value.cast(word)
    for body, (name,) in isa.RELATIVE.items():
        at, width = field_location(f"{body}.{name}")
        total = f[f"{body}.{name}"] + Mux(moves[body], file[f[f"{body}.reg"]], 0)
        value = Mux(total[width:].any(), top[body], total[:width])
        out = Cat(out[:at], value, out[at + width:])
    return out


def rule_error(word, cfg: AcceleratorConfig):
    """:func:`hw.isa.dispatch_errors` of one symbolic word: an Amaranth value of ErrorCode.

    Words :func:`hw.isa.legal_words` rejects are ILLEGAL_OPCODE; otherwise the code of the
    first rule of the table (hw.isa's ``_DISPATCH_RULES``, in order) that applies to the opcode
    and fails, else NONE. The rules index ``lim.spad_beats`` with the spad field, so it becomes
    an :class:`~amaranth.hdl.Array` of constants here.
    """
    f = word_fields(word)
    lim = dispatch_limits(cfg)
    lim = dataclasses.replace(lim, spad_beats=Array(Const(int(b)) for b in lim.spad_beats))
    op = f["opcode"]
    legal = isa.legal_words(f, lim)
    err = Const(ErrorCode.NONE.value, ErrorCode.as_shape())
    for rule in reversed(isa._DISPATCH_RULES):  # the first failing rule wins
        applies = functools.reduce(operator.or_, (op == o.value for o in rule.ops))
        err = Mux(applies & rule.bad(f, lim), rule.code.value, err)
    return Mux(legal, err, ErrorCode.ILLEGAL_OPCODE.value)


class FetchHarness(Harness):
    """The fetch unit on two free instruction words: every word but LOAD/STORE (``"other"``) or
    LOAD/STORE words with small extent factors (``"dma"``)."""

    def __init__(self, cfg: AcceleratorConfig, bound: str):
        super().__init__()
        if cfg.imem_depth != 2:
            raise ValueError("the fetch proof writes a 2-word instruction memory")
        if bound not in ("other", "dma"):
            raise ValueError(f"bound must be 'other' or 'dma', got {bound!r}")
        self.cfg, self.bound = cfg, bound
        self.data = self.free(INSTR_BITS, "data")
        self.regs = self.free(isa.RunRegs, "regs")
        self.ready = {e.engine: self.free(1, f"{e.name}_ready") for e in engines_of(cfg)}

    def elaborate(self, platform):
        m = self.module()
        cfg = self.cfg
        depth = cfg.imem_depth
        m.submodules.dut = dut = FetchUnit(cfg)
        ports = {e.engine: getattr(dut, e.name) for e in engines_of(cfg)}
        for e, port in ports.items():
            m.d.comb += port.ready.eq(self.ready[e])

        # Cycles 0 .. depth-1: write word c at address c (the host, machine idle); then run.
        first_dispatch = depth + timing.FETCH_LATENCY  # instruction 0 reaches dispatch
        cycle = Signal(range(first_dispatch + 1))
        with m.If(cycle != first_dispatch):
            m.d.sync += cycle.eq(cycle + 1)
        words = [Signal(INSTR_BITS, name=f"word{i}") for i in range(depth)]
        writing = cycle < depth
        with m.If(writing):
            m.d.comb += [dut.imem_wr.en.eq(1), dut.imem_wr.addr.eq(cycle),
                         dut.imem_wr.data.eq(self.data)]
            m.d.sync += Array(words)[cycle[:max(1, (depth - 1).bit_length())]].eq(self.data)
        m.d.comb += dut.run.eq(~writing)
        # The run-time registers: free values, taken in cycle 0 and held for the run.
        regs = Signal(isa.RunRegs, name="run_regs")
        with m.If(cycle == 0):
            m.d.sync += regs.eq(self.regs)
        m.d.comb += dut.regs.eq(regs)
        fl = word_fields(self.data)
        is_dma = (fl["opcode"] == Opcode.LOAD.value) | (fl["opcode"] == Opcode.STORE.value)
        if self.bound == "other":
            m.d.comb += Assume(~is_dma)
        else:
            m.d.comb += Assume(is_dma & (fl["dma.rows"] < (1 << ROW_BITS))
                               & (fl["dma.row_beats"] < (1 << ROW_BITS))
                               & (fl["dma.dram_stride"] < (1 << ROW_BITS)))

        # The instruction at dispatch: pc follows the dispatched instructions (a REPEAT's body
        # once per iteration, hw.isa.loop_stream); END stops fetching.
        pc = Signal(range(depth + 1))
        ended = Signal()
        # The reference loop: the body's last pc, iterations left, and the cycles of a refill
        # after a loop-back, in which nothing is at dispatch (hw/timing.py, "Fetch").
        rep_shape = isa.InstrLayout["body"].shape["repeat"].shape
        active = Signal()
        first = Signal(range(depth + 1))
        last = Signal(range(depth + (1 << rep_shape["length"].width)))
        left = Signal(rep_shape["count"].width)
        refill = Signal(range(timing.LOOP_BACK_LATENCY))
        at_dispatch = (cycle == first_dispatch) & ~ended & (refill == 0)
        word = relative_word(Mux(pc == depth, 0,
                                 Array(words)[pc[:max(1, (depth - 1).bit_length())]]), regs)
        f = word_fields(word)
        op = f["opcode"]
        is_end = op == Opcode.END.value
        is_repeat = op == Opcode.REPEAT.value
        rule = Signal(ErrorCode.as_shape())
        m.d.comb += rule.eq(rule_error(word, cfg))
        in_body = active & (pc <= last) & (is_end | is_repeat) & (rule == ErrorCode.NONE.value)
        want = Signal(ErrorCode.as_shape())
        m.d.comb += want.eq(Mux(pc == depth, ErrorCode.PC_OVERFLOW.value,
                                Mux(in_body, ErrorCode.BAD_REPEAT.value, rule)))
        target = f["sync.engine"]
        for o, e in ENGINE_OF_OPCODE.items():
            target = Mux(op == o.value, e.value, target)
        valid = Cat(p.valid for p in ports.values())
        with m.If(refill != 0):
            m.d.sync += refill.eq(refill - 1)
            m.d.comb += [Assert(valid == 0, "offered during a loop-back refill"),
                         Assert(~dut.dispatched, "dispatched during a loop-back refill"),
                         Assert(dut.error.as_value() == ErrorCode.NONE.value,
                                "error during a loop-back refill")]
        with m.If(dut.dispatched):
            m.d.sync += pc.eq(pc + 1)
            with m.If(is_end):
                m.d.sync += ended.eq(1)
            with m.If(is_repeat):
                m.d.sync += [active.eq(1), first.eq(pc + 1), last.eq(pc + f["repeat.length"]),
                             left.eq(f["repeat.count"] - 1)]
            with m.Elif(active & (pc == last)):
                with m.If(left == 0):
                    m.d.sync += active.eq(0)
                with m.Else():
                    m.d.sync += [left.eq(left - 1), pc.eq(first),
                                 refill.eq(timing.LOOP_BACK_LATENCY - 1)]

        with m.If(at_dispatch):
            m.d.comb += [
                Assert(dut.error.as_value() == want, "error != hw.isa rule table"),
                Assert(dut.error_pc == pc, "error_pc != pc of the instruction"),
            ]
            with m.If(want != ErrorCode.NONE.value):
                m.d.comb += [Assert(valid == 0, "illegal word offered to a queue"),
                             Assert(~dut.dispatched, "illegal word dispatched")]
            with m.Elif(is_end):
                m.d.comb += [Assert(valid == 0, "END offered to a queue"),
                             Assert(dut.dispatched, "END not dispatched")]
            with m.Elif(is_repeat):
                m.d.comb += [Assert(valid == 0, "REPEAT offered to a queue"),
                             Assert(dut.dispatched, "REPEAT not dispatched")]
            with m.Else():
                body_off = isa.InstrLayout["body"].offset
                for e, port in ports.items():
                    body = Value.cast(port.payload.body)
                    with m.If(target == e.value):
                        m.d.comb += [
                            Assert(port.valid, "legal word not offered to its queue"),
                            Assert(dut.dispatched == self.ready[e],
                                   "dispatch != ready of the target queue"),
                            Assert(port.payload.wait == f["wait"], "wait event"),
                            Assert(port.payload.signal == f["signal"], "signal event"),
                            Assert(port.payload.sync == (op == Opcode.SYNC.value), "sync flag"),
                            Assert(body == word[body_off:body_off + len(body)], "body"),
                        ]
                    with m.Else():
                        m.d.comb += Assert(~port.valid, "word offered to another queue")
        with m.If(ended):
            m.d.comb += [Assert(valid == 0, "dispatch after END"),
                         Assert(dut.error.as_value() == ErrorCode.NONE.value, "error after END")]
        return m


def proofs(cfg: AcceleratorConfig) -> list[Proof]:
    """The two fetch proofs (see the module docstring for the DMA bound)."""
    # (a REPEAT, one loop-back of its one-word body and the loop's exit fit; each further
    # loop-back would add LOOP_BACK_LATENCY steps, and the steps past 13 take a minute each)
    depth = (cfg.imem_depth + timing.FETCH_LATENCY + cfg.imem_depth + 3
             + timing.LOOP_BACK_LATENCY)
    what = {"other": "any two non-DMA words",
            "dma": f"any two LOAD/STORE words with rows, row_beats, dram_stride < 2**{ROW_BITS}"}
    return [Proof(f"fetch_{bound}", lambda bound=bound: FetchHarness(cfg, bound), "bmc", depth,
                  f"FetchUnit: {what[bound]} dispatch or stop with hw.isa's error, in order",
                  solver=SOLVER)
            for bound in ("other", "dma")]
