"""The vector engine's executor: VEC instructions over the VIN and VOUT scratchpads.

With the command transferred in cycle ``g`` (the grant; :class:`hw.engine.EngineSequencer`), a
VEC over a row of ``L = length`` elements runs as one pass through its sub-op's function unit
(:mod:`hw.vector`), one element per cycle:

read
    ``g + 1 .. g + L``: element ``i`` of the row is read from VIN at ``a_addr + i`` (ADD: and
    of the second operand at ``b_addr + i``, through VIN's second read port);
unit
    each element enters the unit :data:`hw.timing.VEC_READ_LATENCY` cycles after its read
    (the scratchpad's read register), with ``last`` on the row's final element; the unit's
    output is never stalled;
write
    ADD writes each result to VOUT at ``dst_addr + i`` in the cycle the unit gives it; ARGMAX
    writes its result's two words (the first index of the maximum, then the maximum) in the
    cycle the unit gives it and the next.

REQUANT makes two passes over its row (:func:`hw.numerics.vec_requant`): pass 1 streams it
into ``AbsMax``; in the cycle ``amax`` comes out, the scalar step ``s = bitlen(amax) - 31``
(0, or 1 for ``amax = 2**31``: bit 31 of ``amax``) is taken and ``amax >> s`` enters
``Recip``; pass 2 reads the row again from the cycle after ``(r, sh)`` comes out, into
``Requant(33)`` with ``r, sh, s``; its codes are packed four to a VOUT word (code ``i`` in
byte ``i % 4``), a word written with its fourth code or the row's last (zeros above it), and
``amax`` is written as the last word in the next cycle.

``done`` pulses with the last VOUT write, in ``g + hw.timing.vec_cycles(ins, cfg)``, and the
engine takes the next command from the cycle after. Elements are int32 (VIN and VOUT words
are :data:`hw.config.VECTOR_WORD_BYTES` bytes); addresses count elements.
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal, signed, unsigned
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw import timing
from hw.config import VECTOR_WORD_BYTES, AcceleratorConfig
from hw.isa import VecBody, VecFunc, vec_out_words
from hw.numerics import ACT_BITS
from hw.vector.elementwise import Add, Requant
from hw.vector.reduce import AbsMax, ArgMax
from hw.vector.tables import Recip

__all__ = ["VectorEngine"]

#: Longest row a VEC names (its ``length`` field).
_MAX_LENGTH = 1 << VecBody["length"].width


def _word_port(elements: int, direction: str):
    """An element port of a vector scratchpad, as the engine sees it (it drives the
    address)."""
    cls = memory.ReadPort if direction == "read" else memory.WritePort
    return In(cls.Signature(addr_width=ceil_log2(elements),
                            shape=unsigned(8 * VECTOR_WORD_BYTES)))


class VectorEngine(wiring.Component):
    """VIN rows -> function unit -> VOUT, one VEC instruction at a time.

    Parameters
    ----------
    cfg:
        The accelerator configuration; it must have a vector engine
        (:attr:`hw.config.AcceleratorConfig.has_vector`).

    Members
    -------
    cmd: In(stream.Signature(VecBody))
        VEC bodies (already checked by fetch); ``ready`` while no instruction is in progress.
        Transfer cycle ``g``.
    done: Out(1)
        Pulse in ``g + hw.timing.vec_cycles(ins, cfg)``, with the last VOUT write.
    elements: Out(16)
        The current instruction's ``length`` (what it adds to ``vector_elements`` when
        ``done`` pulses).
    vin_a, vin_b: In(ReadPort.Signature(...))
        Element read ports of VIN (the row; ADD's second operand).
    vout_wr: In(WritePort.Signature(...))
        Element write port of VOUT.
    """

    #: Registers between a VIN read and its element entering a unit (the memory's).
    READ_LATENCY = 1
    #: VOUT words ARGMAX writes: the index, then the maximum.
    ARGMAX_WORDS = 2

    def __init__(self, cfg: AcceleratorConfig):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        if not cfg.has_vector:
            raise ValueError("this configuration has no vector engine (vin_spad_bytes = 0)")
        if timing.VEC_READ_LATENCY != self.READ_LATENCY:
            raise ValueError(f"hw.timing.VEC_READ_LATENCY={timing.VEC_READ_LATENCY} does not "
                             f"match the vector engine's {self.READ_LATENCY}-cycle VIN read")
        words = int(vec_out_words(VecFunc.ARGMAX.value, 1))
        if words != self.ARGMAX_WORDS:
            raise ValueError(f"hw.isa.vec_out_words(ARGMAX)={words} is not the vector "
                             f"engine's {self.ARGMAX_WORDS} result words")
        self._cfg = cfg
        self._add = Add()
        self._argmax = ArgMax(signed(ACT_BITS), max_len=_MAX_LENGTH)
        self._absmax = AbsMax(signed(ACT_BITS))
        self._recip = Recip()
        self._requant = Requant(ACT_BITS + 1)   # x >> s with s in {0, 1}: 33-bit x
        vin = cfg.vin_spad_bytes // cfg.vin_word_bytes
        vout = cfg.vout_spad_bytes // cfg.vout_word_bytes
        super().__init__({
            "cmd": In(stream.Signature(VecBody)),
            "done": Out(1),
            "elements": Out(VecBody["length"].width),
            "vin_a": _word_port(vin, "read"),
            "vin_b": _word_port(vin, "read"),
            "vout_wr": _word_port(vout, "write"),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.add = add = self._add
        m.submodules.argmax = argmax = self._argmax
        m.submodules.absmax = absmax = self._absmax
        m.submodules.recip = recip = self._recip
        m.submodules.requant = requant = self._requant
        body = self.cmd.payload
        width = VecBody["a_addr"].width

        active = Signal()     # from the command to the last write
        issuing = Signal()    # reading the row
        func = Signal(VecFunc)
        a_ptr = Signal(width)
        b_ptr = Signal(width)
        dst = Signal(VecBody["dst_addr"].width)
        left = Signal(VecBody["length"].width)   # elements still to read after this one
        a_base = Signal(width)
        pass2 = Signal()      # REQUANT's second pass

        m.d.comb += self.cmd.ready.eq(~active)
        with m.If(~active):
            # The payload is stable from the cycle after the pop (hw.engine): copied while idle.
            m.d.sync += [func.eq(body.func), a_ptr.eq(body.a_addr), b_ptr.eq(body.b_addr),
                         a_base.eq(body.a_addr), dst.eq(body.dst_addr),
                         left.eq(body.length - 1), self.elements.eq(body.length),
                         pass2.eq(0)]
            with m.If(self.cmd.valid):
                m.d.sync += [active.eq(1), issuing.eq(1)]

        # ---- read: one element (of each operand row) per cycle
        last_read = issuing & (left == 0)
        m.d.comb += [self.vin_a.addr.eq(a_ptr), self.vin_a.en.eq(issuing),
                     self.vin_b.addr.eq(b_ptr), self.vin_b.en.eq(issuing)]
        with m.If(issuing):
            m.d.sync += [a_ptr.eq(a_ptr + 1), b_ptr.eq(b_ptr + 1), left.eq(left - 1)]
            with m.If(left == 0):
                m.d.sync += issuing.eq(0)

        # ---- the element enters its unit with the read data (READ_LATENCY = 1 register)
        valid = Signal()
        last = Signal()
        m.d.sync += [valid.eq(issuing), last.eq(last_read)]
        is_add = func == VecFunc.ADD
        is_argmax = func == VecFunc.ARGMAX
        is_requant = func == VecFunc.REQUANT
        a = self.vin_a.data.as_signed()
        m.d.comb += [
            add.i.valid.eq(valid & is_add), add.i.payload.a.eq(a),
            add.i.payload.b.eq(self.vin_b.data.as_signed()), add.o.ready.eq(1),
            argmax.i.valid.eq(valid & is_argmax), argmax.i.payload.x.eq(a),
            argmax.i.payload.last.eq(last), argmax.o.ready.eq(1),
            absmax.i.valid.eq(valid & is_requant & ~pass2), absmax.i.payload.x.eq(a),
            absmax.i.payload.last.eq(last), absmax.o.ready.eq(1),
        ]
        # REQUANT's scalars: s from amax as it comes out, (r, sh) from Recip; pass 2 starts
        # the cycle after (r, sh).
        amax = Signal(ACT_BITS, reset_less=True)
        shift = Signal(reset_less=True)
        r = Signal.like(recip.o.payload.r, reset_less=True)
        sh = Signal.like(recip.o.payload.sh, reset_less=True)
        big = absmax.o.payload.y[ACT_BITS - 1]   # bitlen(amax) = 32: s = 1
        m.d.comb += [recip.i.valid.eq(absmax.o.valid),
                     recip.i.payload.x.eq(absmax.o.payload.y >> big), recip.o.ready.eq(1)]
        with m.If(absmax.o.valid):
            m.d.sync += [amax.eq(absmax.o.payload.y), shift.eq(big)]
        with m.If(recip.o.valid):
            m.d.sync += [r.eq(recip.o.payload.r), sh.eq(recip.o.payload.sh),
                         issuing.eq(1), pass2.eq(1), a_ptr.eq(a_base),
                         left.eq(self.elements - 1)]
        m.d.comb += [requant.i.valid.eq(valid & is_requant & pass2),
                     requant.i.payload.x.eq(a), requant.i.payload.r.eq(r),
                     requant.i.payload.sh.eq(sh), requant.i.payload.s.eq(shift),
                     requant.o.ready.eq(1)]
        # ADD: the row's last element through the unit's pipeline (never stalled).
        add_last = last & is_add
        for k in range(add.latency):
            nxt = Signal(name=f"add_last{k + 1}")
            m.d.sync += nxt.eq(add_last)
            add_last = nxt
        code_last = last & is_requant & pass2
        for k in range(requant.latency):
            nxt = Signal(name=f"code_last{k + 1}")
            m.d.sync += nxt.eq(code_last)
            code_last = nxt

        # ---- write
        second = Signal()            # ARGMAX's second word (the maximum) is written now
        top = Signal(signed(ACT_BITS), reset_less=True)
        m.d.sync += second.eq(argmax.o.valid)
        with m.If(argmax.o.valid):
            m.d.sync += top.eq(argmax.o.payload.y)
        # REQUANT: codes packed four to a word; amax the cycle after the last code.
        nbytes = VECTOR_WORD_BYTES
        packed = Signal(8 * nbytes, reset_less=True)   # this word's codes so far
        byte = Signal(range(nbytes))                   # the next code's byte
        code = requant.o.payload.a.as_unsigned()
        word = packed | (code << (byte * 8))[:8 * nbytes]
        word_full = requant.o.valid & ((byte == nbytes - 1) | code_last)
        amax_write = Signal()
        m.d.sync += amax_write.eq(requant.o.valid & code_last)
        with m.If(requant.o.valid):
            m.d.sync += [packed.eq(Mux(word_full, 0, word)),
                         byte.eq(Mux(word_full, 0, byte + 1))]
        with m.If(~active):
            m.d.sync += [packed.eq(0), byte.eq(0)]

        write = add.o.valid | argmax.o.valid | second | word_full | amax_write
        m.d.comb += [
            self.vout_wr.addr.eq(dst),
            self.vout_wr.en.eq(write),
            self.vout_wr.data.eq(Mux(add.o.valid, add.o.payload.y,
                                 Mux(second, top,
                                 Mux(argmax.o.valid, argmax.o.payload.index,
                                 Mux(amax_write, amax, word))))),
        ]
        with m.If(write):
            m.d.sync += dst.eq(dst + 1)
        done = (add.o.valid & add_last) | second | amax_write
        m.d.comb += self.done.eq(done)
        with m.If(done):
            m.d.sync += active.eq(0)
        return m
