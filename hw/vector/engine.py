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
from hw.vector.elementwise import Add
from hw.vector.reduce import ArgMax

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
        body = self.cmd.payload
        width = VecBody["a_addr"].width

        active = Signal()     # from the command to the last write
        issuing = Signal()    # reading the row
        func = Signal(VecFunc)
        a_ptr = Signal(width)
        b_ptr = Signal(width)
        dst = Signal(VecBody["dst_addr"].width)
        left = Signal(VecBody["length"].width)   # elements still to read after this one

        m.d.comb += self.cmd.ready.eq(~active)
        with m.If(~active):
            # The payload is stable from the cycle after the pop (hw.engine): copied while idle.
            m.d.sync += [func.eq(body.func), a_ptr.eq(body.a_addr), b_ptr.eq(body.b_addr),
                         dst.eq(body.dst_addr), left.eq(body.length - 1),
                         self.elements.eq(body.length)]
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
        a = self.vin_a.data.as_signed()
        m.d.comb += [
            add.i.valid.eq(valid & is_add), add.i.payload.a.eq(a),
            add.i.payload.b.eq(self.vin_b.data.as_signed()), add.o.ready.eq(1),
            argmax.i.valid.eq(valid & is_argmax), argmax.i.payload.x.eq(a),
            argmax.i.payload.last.eq(last), argmax.o.ready.eq(1),
        ]
        # ADD: the row's last element through the unit's pipeline (never stalled).
        add_last = last & is_add
        for k in range(add.latency):
            nxt = Signal(name=f"add_last{k + 1}")
            m.d.sync += nxt.eq(add_last)
            add_last = nxt

        # ---- write
        second = Signal()            # ARGMAX's second word (the maximum) is written now
        top = Signal(signed(ACT_BITS), reset_less=True)
        m.d.sync += second.eq(argmax.o.valid)
        with m.If(argmax.o.valid):
            m.d.sync += top.eq(argmax.o.payload.y)
        write = add.o.valid | argmax.o.valid | second
        m.d.comb += [
            self.vout_wr.addr.eq(dst),
            self.vout_wr.en.eq(write),
            self.vout_wr.data.eq(Mux(add.o.valid, add.o.payload.y,
                                     Mux(second, top, argmax.o.payload.index))),
        ]
        with m.If(write):
            m.d.sync += dst.eq(dst + 1)
        done = (add.o.valid & add_last) | second
        m.d.comb += self.done.eq(done)
        with m.If(done):
            m.d.sync += active.eq(0)
        return m
