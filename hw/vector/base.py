"""What the vector unit's function units share: the stream protocol, the pipeline builder, the
latency check against the timing contract, and the integer steps of :mod:`hw.numerics` as
combinational expressions.

Stream protocol
---------------
Every unit has an input stream ``i`` and an output stream ``o``
(:class:`amaranth.lib.stream.Signature` with a ``data.StructLayout`` payload). A unit is one
pipeline that advances as a whole: in a cycle in which its output holds no result or the
result is taken (``en = ~o.valid | o.ready``), every stage moves one step and ``i.ready`` is
high; otherwise every stage holds. An element accepted in cycle ``c`` (``i.valid & i.ready``)
gives its result in cycle ``c + latency`` when the output is never stalled, one element per
cycle; a stall delays everything behind it by the stalled cycles and loses nothing.
``latency`` is the unit's entry of :data:`hw.timing.VECTOR_LATENCY` (the single source); the
constructor checks that the pipeline it builds has exactly that many stages.

A unit may compute a second function on a port of its own (:class:`UnitPort`: its input and
output streams, members ``<name>_i`` and ``<name>_o``, and its latency, the function's entry of
:data:`~hw.timing.VECTOR_LATENCY`), sharing multipliers and logic with its own; it advances as
a whole (``en`` while every output holds no result or has it taken) and takes an element from
one input a cycle, never from both (the unit says what else its sharing asks).
"""

from __future__ import annotations

import abc
import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace

from amaranth import Cat, Const, Module, Mux, Shape, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.ecp5_dsp import DSP_REGISTER
from hw.numerics import ACT_BITS
from hw.timing import VECTOR_LATENCY, vec_lane_tree

__all__ = ["Stage", "PipelineUnit", "ReductionUnit", "UnitPort", "build_pipeline",
           "check_latency", "beside", "valid_delay",
           "round_shift", "round_shift_const", "saturate", "round_saturate",
           "round_shift_saturate_const", "round_saturate_widths", "round_saturate_low",
           "shift_right_low", "normalise_levels",
           "rom", "bits_for", "MAX_ROW", "MULT_CHUNK", "partial_products", "sum_partial_products",
           "dsp_product", "chunks", "grid_products", "grid_halves", "grid_sum", "select_mode"]

#: Default bound on the length of a row a reduction takes (the LM head's vocabulary of the
#: largest supported models: LLaMA-3's 128256 needs 17 bits).
MAX_ROW = 1 << 17

#: A pipeline stage: from the previous stage's values (attributes of ``v``) to the values it
#: registers, ``name -> value``, ``(value, shape)`` or ``(value, shape, attrs)``
#: (:func:`build_pipeline`).
Stage = Callable[[Module, SimpleNamespace], dict]


def bits_for(n: int) -> int:
    """Bits of an unsigned counter that holds ``0 .. n - 1`` (at least 1)."""
    return max(1, (n - 1).bit_length())


def check_latency(name: str, stages: int, cls: str, lanes: int = 1) -> int:
    """The declared latency of unit ``name``, plus :func:`hw.timing.vec_lane_tree` of
    ``lanes`` (a reduction over lanes); raises if its pipeline has another depth."""
    if name not in VECTOR_LATENCY:
        raise ValueError(f"hw.timing.VECTOR_LATENCY has no entry for vector unit {name!r} "
                         f"({cls})")
    tree = vec_lane_tree(lanes)
    if VECTOR_LATENCY[name] + tree != stages:
        plus = f" plus vec_lane_tree({lanes}) = {tree}" if lanes > 1 else ""
        raise ValueError(f"hw.timing.VECTOR_LATENCY[{name!r}] = {VECTOR_LATENCY[name]}{plus}, "
                         f"but the {cls} pipeline has {stages} stages")
    return VECTOR_LATENCY[name] + tree


def build_pipeline(m: Module, en: Value, first, stages: Sequence[Stage]) -> SimpleNamespace:
    """Register each stage's values when ``en``, stage after stage; returns the last stage's.

    ``first`` holds the inputs of the first stage (the input payload: a view); stage ``k``
    (from 1) gets the registers of stage ``k - 1`` as attributes of a namespace, named
    ``s<k>_<name>`` in the netlist. A value is given alone (registered with its own shape),
    as ``(value, shape)``, or as ``(value, shape, attrs)`` (``shape`` None: its own; ``attrs``
    the register's, such as :data:`hw.ecp5_dsp.DSP_REGISTER`).
    """
    v = first
    for k, stage in enumerate(stages, 1):
        regs = {}
        for name, value in stage(m, v).items():
            value, shape, attrs = (*(value if isinstance(value, tuple) else (value,)),
                                   None, None)[:3]
            if shape is None:
                shape = Value.cast(value).shape()
            r = Signal(shape, name=f"s{k}_{name}", reset_less=True, attrs=attrs or {})
            with m.If(en):
                m.d.sync += r.eq(value)
            regs[name] = r
        v = SimpleNamespace(**regs)
    return v


def beside(stage: Stage, *names: str) -> Stage:
    """``stage`` with the values ``names`` of the stage before carried beside its own."""
    def carried(m, v):
        return {**stage(m, v), **{k: getattr(v, k) for k in names}}
    return carried


def valid_delay(m: Module, en: Value, value: Value, n: int, name: str) -> Value:
    """``value`` delayed by ``n`` enabled cycles (reset to 0: used for valid bits)."""
    for k in range(n):
        r = Signal(name=f"{name}{k + 1}")
        with m.If(en):
            m.d.sync += r.eq(value)
        value = r
    return value


@dataclass(frozen=True)
class UnitPort:
    """A second function of a unit, on streams of its own (the module's docstring): what the
    vector engine feeds and reads as a unit of its own."""

    #: The function's key in :data:`hw.timing.VECTOR_LATENCY`.
    NAME: str
    #: Its input stream (the unit's member ``<NAME>_i``).
    i: wiring.PureInterface
    #: Its output stream (``<NAME>_o``).
    o: wiring.PureInterface
    #: Cycles from an element accepted on ``i`` to its result on ``o`` (never stalled).
    latency: int


class _StreamUnit(wiring.Component, metaclass=abc.ABCMeta):
    """An input stream ``i`` into the stages ``_stages()``, an output stream ``o``; the whole
    pipeline advances (``en``) whenever ``o`` holds nothing or is taken. Subclasses set
    ``NAME`` (their key in :data:`hw.timing.VECTOR_LATENCY`); ``_EXTRA_STAGES`` counts the
    stages after ``_stages()`` toward the latency.

    ``ports`` names a second function's ``(input layout, output layout, stages)``: the unit
    has its :class:`UnitPort` in ``self.ports[name]`` (``stages`` checked against the
    function's latency), and advances while every output holds nothing or is taken."""

    NAME = ""
    _EXTRA_STAGES = 0

    def __init__(self, in_layout: data.StructLayout, out_layout: data.StructLayout,
                 ports: dict[str, tuple[data.StructLayout, data.StructLayout, int]]
                 | None = None):
        self._stage_list = list(self._stages())
        self.latency = check_latency(self.NAME, len(self._stage_list) + self._EXTRA_STAGES,
                                     type(self).__name__, getattr(self, "_lanes", 1))
        ports = ports or {}
        members = {"i": In(stream.Signature(in_layout)), "o": Out(stream.Signature(out_layout))}
        for name, (port_in, port_out, _) in ports.items():
            members[f"{name}_i"] = In(stream.Signature(port_in))
            members[f"{name}_o"] = Out(stream.Signature(port_out))
        super().__init__(members)
        self.ports = {name: UnitPort(name, getattr(self, f"{name}_i"), getattr(self, f"{name}_o"),
                                     check_latency(name, stages, type(self).__name__))
                      for name, (_, _, stages) in ports.items()}

    @abc.abstractmethod
    def _stages(self) -> list[Stage]:
        """The unit's stages, in order (:func:`build_pipeline`)."""

    def _enable(self, m: Module) -> Value:
        """The pipeline's enable: every output holds nothing or is taken (every input's
        ``ready``). With ports, an output's ``valid`` is its result's (:meth:`_output`) while
        every other output holds nothing or is taken: a result is taken only in a cycle in
        which the pipeline advances."""
        en = Signal()
        outs = [self.o, *(port.o for port in self.ports.values())]
        if not self.ports:   # (its result is o.valid)
            self._results = {id(self.o): self.o.valid}
        else:
            self._results = {id(o): Signal(name=f"result{k}") for k, o in enumerate(outs)}
        free = [~self._results[id(o)] | o.ready for o in outs]
        m.d.comb += en.eq(functools.reduce(operator.and_, free))
        if self.ports:
            for k, o in enumerate(outs):
                others = functools.reduce(operator.and_, free[:k] + free[k + 1:])
                m.d.comb += o.valid.eq(self._results[id(o)] & others)
        m.d.comb += [i.ready.eq(en) for i in [self.i, *(port.i for port in self.ports.values())]]
        return en

    def _front(self, m: Module) -> tuple[Value, SimpleNamespace]:
        """The enable and the last of ``_stages()``'s registered values."""
        en = self._enable(m)
        return en, build_pipeline(m, en, self.i.payload, self._stage_list)


class PipelineUnit(_StreamUnit):
    """A unit that maps every input element to one output element through ``_stages()``: the
    last stage's value names are the output layout's fields."""

    def elaborate(self, platform):
        m = Module()
        en, v = self._front(m)
        self._output(m, self.o, valid_delay(m, en, self.i.valid, self.latency, "valid"), v)
        return m

    def _output(self, m: Module, o: wiring.PureInterface, valid: Value,
                v: SimpleNamespace) -> None:
        """Output stream ``o``: its result ``valid`` (its input's valid delayed by its
        latency) and the payload's fields, the last stage's values ``v`` of their names."""
        m.d.comb += self._results[id(o)].eq(valid)
        for name in o.payload.shape().members:
            m.d.comb += getattr(o.payload, name).eq(getattr(v, name))


class ReductionUnit(_StreamUnit):
    """A unit that reduces each row (elements up to one with ``last`` set) to one result.

    The element stages ``_stages()`` (they must carry ``last``) feed an accumulation stage:
    ``_state()`` names the state registers and their shapes, ``_combine(m, v, state, first)``
    gives the state after element ``v`` (``first``: ``v`` starts a row), and the output
    payload's fields are taken from it when ``v.last``. The latency is the element stages plus
    the accumulation stage.
    """

    _EXTRA_STAGES = 1

    @abc.abstractmethod
    def _state(self) -> dict[str, Shape]:
        """The accumulation state's registers and their shapes."""

    @abc.abstractmethod
    def _combine(self, m: Module, v: SimpleNamespace, state: SimpleNamespace,
                 first: Value) -> dict:
        """The state after element ``v`` (``first``: it starts a row), by register name."""

    def _elements(self, m: Module, valid: Value, v: SimpleNamespace) -> None:
        """A hook on the element stages' last values ``v`` (``valid``: they hold an
        element), as the accumulation takes them: nothing, or a unit's view of them."""

    def elaborate(self, platform):
        m = Module()
        en, v = self._front(m)
        valid = valid_delay(m, en, self.i.valid, len(self._stage_list), "valid")
        self._elements(m, valid, v)
        state = SimpleNamespace(**{k: Signal(s, name=f"acc_{k}", reset_less=True)
                                   for k, s in self._state().items()})
        first = Signal(init=1)   # the next element starts a row
        nxt = self._combine(m, v, state, first)
        out = Signal.like(self.o.payload, reset_less=True)
        out_valid = Signal()
        with m.If(en):
            m.d.sync += out_valid.eq(valid & v.last)
            with m.If(valid):
                m.d.sync += [getattr(state, k).eq(nxt[k]) for k in self._state()]
                m.d.sync += first.eq(v.last)
                with m.If(v.last):
                    m.d.sync += [getattr(out, k).eq(nxt[k])
                                 for k in self.o.payload.shape().members]
        m.d.comb += [self._results[id(self.o)].eq(out_valid), self.o.payload.eq(out)]
        return m


# ---------------------------------------------------------------------- integer steps
def round_shift_const(v: Value, s: int) -> Value:
    """:func:`hw.numerics.round_shift` by a constant: ``(v + 2**(s-1)) >> s``, ``v``, or
    ``v << -s``."""
    v = Value.cast(v)
    if s > 0:
        return (v + (1 << (s - 1))) >> s
    return v << -s


def round_shift(v: Value, s: Value, left: int = 0) -> Value:
    """:func:`hw.numerics.round_shift` by a variable amount ``s``.

    For ``s >= 0``: ``((2 * v) >> s) + 1) >> 1``, which is ``(v + 2**(s-1)) >> s`` (nested
    floors) and ``v`` for ``s == 0``, with one shifter and no separate rounding constant; an
    ``s`` past the width gives the numerics' 0 (its clamp to 62 leaves 0 for every operand of
    the units, all below 2**61). A signed ``s`` with ``left > 0`` may be negative down to
    ``-left``: then ``v << -s``.
    """
    v = Value.cast(v)
    s = Value.cast(s)
    twice = Cat(Const(0, 1), v)
    twice = twice.as_signed() if v.shape().signed else twice
    if s.shape().signed:
        right = (((twice >> s[:-1].as_unsigned()) + 1) >> 1)
        if not left:
            return right
        amount = (-s)[:left.bit_length()].as_unsigned()
        return Mux(s[-1], v << amount, right)
    return ((twice >> s) + 1) >> 1


def saturate(v: Value, bits: int = ACT_BITS) -> Value:
    """:func:`hw.numerics.saturate`: ``v`` clipped to ``[-(2**(bits-1) - 1), 2**(bits-1) -
    1]``, from the bit pattern (no comparators): it overflows upwards when it is non-negative
    with a bit set from ``bits - 1`` up, downwards when it is negative and those bits are not
    all ones, or they are and the bits below are all zeros (``-2**(bits-1)``)."""
    v = Value.cast(v)
    top = (1 << (bits - 1)) - 1
    width = v.shape().width
    if not v.shape().signed:
        return Mux(v[bits - 1:].any(), top, v) if width >= bits else v
    if width < bits:
        return v
    sign, hi, lo = v[-1], v[bits - 1:], v[:bits - 1]
    up = ~sign & hi.any()
    down = sign & (~hi.all() | (lo == 0))
    return Mux(up, top, Mux(down, -top, v[:bits].as_signed()))


def round_saturate(w: Value, bits: int = ACT_BITS) -> Value:
    """``saturate((w + 1) >> 1, bits)`` of a signed ``w`` (the last step of
    :func:`round_shift`) with the increment on the low ``bits + 1`` bits only: the result
    saturates upwards iff ``w >= 2**bits - 1`` and downwards iff ``w <= -2**bits``, both read
    from the bit pattern beside the increment."""
    w = Value.cast(w)
    if w.shape().width <= bits:
        return saturate((w + 1) >> 1, bits)
    hi = w[bits:]
    return _saturated(w[:bits], (w[:bits + 1].as_signed() + 1) >> 1, w[-1], hi.any(), ~hi.all(),
                      bits)


def round_saturate_low(low: Value, sign: Value, big: Value, bits: int = ACT_BITS) -> Value:
    """:func:`round_saturate` of a ``w`` wider than ``bits``, read from its parts: ``low``
    its low ``bits + 1`` bits, ``sign`` its sign and ``big`` whether its bits from ``bits`` up
    are not all its sign (then it saturates, upwards or downwards by its sign; else it does
    when its low ``bits`` bits are all ones, non-negative, or all zeros, negative)."""
    return _saturated(low[:bits], (low[:bits + 1].as_signed() + 1) >> 1, sign, big, big, bits)


def _saturated(lo: Value, near: Value, sign: Value, hi_any: Value, hi_not_all: Value,
               bits: int) -> Value:
    """The saturation of :func:`round_saturate` from ``lo``, ``w``'s low ``bits`` bits,
    ``near``, at least the low ``bits`` bits of ``(w + 1) >> 1``, and whether ``w``'s bits
    from ``bits`` up are not all zeros (``hi_any``, read when ``w >= 0``) and not all ones
    (``hi_not_all``, read when ``w < 0``)."""
    top = (1 << (bits - 1)) - 1
    up = ~sign & (hi_any | lo.all())
    down = sign & (hi_not_all | (lo == 0))
    return Mux(up, top, Mux(down, -top, near[:bits].as_signed()))


def round_saturate_widths(w: Value, widths: Sequence[int]) -> list[Value]:
    """:func:`round_saturate` of ``w`` to each of ``widths`` (signed, as wide as the widest),
    with one increment for them all: the low ``bits`` bits of ``(w + 1) >> 1`` are those of
    the increment of ``w``'s low ``max(widths) + 1`` bits, and each width's saturation is read
    from ``w``'s bits as :func:`round_saturate` reads it."""
    w = Value.cast(w)
    if any(w.shape().width <= bits for bits in widths):
        return [round_saturate(w, bits) for bits in widths]
    near = (w[:max(widths) + 1].as_signed() + 1) >> 1
    return [_saturated(w[:bits], near, w[-1], w[bits:].any(), ~w[bits:].all(), bits)
            for bits in widths]


def shift_right_low(x: Value, amount: Value, bits: int) -> Value:
    """The low ``bits`` bits of ``x >> amount`` (arithmetic for a signed ``x``): one level a
    bit of ``amount``, the largest shift first, each level only as wide as the bits the
    levels after it read (``bits`` plus their largest shift), not as wide as ``x``."""
    x, amount = Value.cast(x), Value.cast(amount)
    for k in reversed(range(amount.shape().width)):
        x = Mux(amount[k], x >> (1 << k), x)
        keep = bits + (1 << k) - 1
        if x.shape().width > keep:
            x = x[:keep].as_signed() if x.shape().signed else x[:keep]
    return x[:bits]


def round_shift_saturate_const(v: Value, s: int, bits: int = ACT_BITS) -> Value:
    """``saturate(round_shift(v, s), bits)`` for a constant ``s``: :func:`round_saturate` of
    ``v >> (s - 1)`` (wiring) when ``s > 0``."""
    v = Value.cast(v)
    if s > 0:
        return round_saturate(v >> (s - 1), bits)
    return saturate(v << -s, bits)


def normalise_levels(y: Value, levels: Sequence[int]) -> tuple[Value, Value]:
    """Steps of a leading-one normalisation of an unsigned word: for each level ``L`` (distinct
    powers of two, largest first), ``y`` is shifted left by ``L`` when its top ``L`` bits are
    zero. Returns the shifted word (as wide as ``y``) and the sum of the levels taken (over
    all the levels of a word, its leading-zero count)."""
    y = Value.cast(y)
    width = y.shape().width
    count = Const(0, 1)
    for lvl in levels:
        zero = y[width - lvl:] == 0
        y = Mux(zero, (y << lvl)[:width], y)
        count = count + Mux(zero, lvl, 0)
    return y, count


#: Bits of an unsigned operand chunk that one ECP5 MULT18X18D (18x18 signed) multiplies.
MULT_CHUNK = 17


def partial_products(a: Value, b: Value) -> dict[str, Value]:
    """``a * b`` for a ``b`` wider than one multiplier, as one partial product per
    :data:`MULT_CHUNK` bits of ``b``: ``{"pp0": a * b[0:17], "pp1": a * b[17:34], ...}``
    (the chunks unsigned, the top one signed when ``b`` is), each one MULT18X18D when ``a``
    fits one; a pipeline registers them, then :func:`sum_partial_products` adds them in the
    next stage (the multipliers and the adder in two cycles, not one)."""
    b = Value.cast(b)
    n = -(-b.shape().width // MULT_CHUNK)
    chunks = [b[k * MULT_CHUNK:(k + 1) * MULT_CHUNK] for k in range(n)]
    if b.shape().signed:
        chunks[-1] = chunks[-1].as_signed()
    return {f"pp{k}": dsp_product(a * c) for k, c in enumerate(chunks)}


def dsp_product(value: Value, shape=None) -> tuple:
    """A product for :func:`build_pipeline` whose register the synthesis flow may move into
    its multiplier's output register (:data:`hw.ecp5_dsp.DSP_REGISTER`; :mod:`hw.ecp5_dsp`
    does it when the product is one MULT18X18D's)."""
    return (value, shape, {DSP_REGISTER: 1})


def sum_partial_products(v: SimpleNamespace) -> Value:
    """The product whose :func:`partial_products` are the attributes ``pp0, pp1, ...`` of
    ``v``."""
    parts = []
    while hasattr(v, f"pp{len(parts)}"):
        parts.append(getattr(v, f"pp{len(parts)}") << (MULT_CHUNK * len(parts)))
    return sum(parts[1:], parts[0])


def chunks(x: Value) -> list[Value]:
    """``x`` cut into :data:`MULT_CHUNK`-bit pieces from the bottom, each unsigned but the top
    one, signed when ``x`` is: ``x == sum(c << (MULT_CHUNK * k))``."""
    x = Value.cast(x)
    n = -(-x.shape().width // MULT_CHUNK)
    cs = [x[k * MULT_CHUNK:(k + 1) * MULT_CHUNK] for k in range(n)]
    if x.shape().signed:
        cs[-1] = cs[-1].as_signed()
    return cs


def grid_products(a: Value, b: Value) -> dict[str, tuple]:
    """``a * b`` for ``a`` and ``b`` of at most two :data:`MULT_CHUNK`-bit chunks each, as the
    grid of chunk products ``{"pp<i><j>": a_i * b_j}`` (:func:`chunks`), each one MULT18X18D
    whose output register holds it (:func:`dsp_product`): no adder in the stage.
    :func:`grid_halves` then :func:`grid_sum` add them in the next two stages."""
    ca, cb = chunks(a), chunks(b)
    if len(ca) > 2 or len(cb) > 2:
        raise ValueError(f"grid_products takes operands of at most {2 * MULT_CHUNK} bits, got "
                         f"{Value.cast(a).shape()} and {Value.cast(b).shape()}")
    return {f"pp{i}{j}": dsp_product(x * y) for i, x in enumerate(ca) for j, y in enumerate(cb)}


def grid_halves(v: SimpleNamespace) -> dict[str, Value]:
    """The first adder stage of :func:`grid_products`' terms ``v.pp<i><j>``: ``outer`` the
    terms of weights ``2**0`` and ``2**(2 * MULT_CHUNK)`` side by side (``pp00`` is unsigned
    and below ``2**(2 * MULT_CHUNK)``: wiring, no adder) and ``mid`` the sum of the terms of
    weight ``2**MULT_CHUNK`` (one adder). ``outer + (mid << MULT_CHUNK)`` is the product."""
    pp = {k: getattr(v, k) for k in ("pp00", "pp01", "pp10", "pp11") if hasattr(v, k)}
    low = pp["pp00"]
    if "pp11" in pp:
        outer = Cat(low[:2 * MULT_CHUNK], pp["pp11"]).as_signed()
    else:
        outer = low
    mids = [pp[k] for k in ("pp01", "pp10") if k in pp]
    return {"outer": outer, "mid": sum(mids[1:], mids[0]) if mids else Const(0, 1)}


def grid_sum(v: SimpleNamespace) -> Value:
    """The product from :func:`grid_halves`' ``v.outer`` and ``v.mid`` (one adder)."""
    return v.outer + (v.mid << MULT_CHUNK)


def rom(m: Module, name: str, init: Sequence[int], index: Value) -> Value:
    """A constant table read combinationally at ``index`` (``amaranth.lib.memory``; with the
    stage register behind it, Yosys maps it to a synchronous block-RAM read port)."""
    init = [int(x) for x in init]
    mem = Memory(shape=max(1, max(init).bit_length()), depth=len(init), init=init)
    m.submodules[name] = mem
    port = mem.read_port(domain="comb")
    m.d.comb += port.addr.eq(index)
    return port.data


def select_mode(mode: Value, values: Sequence) -> Value:
    """``values[mode]``, a multiplexer chain (the last value for any larger ``mode``): a
    shared unit's per-mode constant or result (its input's ``mode`` field)."""
    out = values[-1]
    for k in reversed(range(len(values) - 1)):
        out = Mux(mode == k, values[k], out)
    return out


def signed_range(lo: int, hi: int) -> Shape:
    """The narrowest signed shape holding ``lo .. hi``."""
    bits = max(lo.bit_length(), hi.bit_length()) + 1
    return signed(bits)
