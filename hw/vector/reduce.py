"""The vector unit's reductions over a streamed row: sum, max, abs-max, argmax and sum of
squares, bit-exact with :func:`hw.numerics.vec_sum`, :func:`~hw.numerics.vec_max`,
:func:`~hw.numerics.vec_argmax` and :func:`~hw.numerics.vec_sumsq`.

A row is the elements up to and including one with ``last`` set; rows follow each other with
no gap. Each unit takes one element per cycle and gives one result per row, ``latency`` cycles
after the row's last element (:data:`hw.timing.VECTOR_LATENCY`).
"""

from __future__ import annotations

from amaranth import Cat, Mux, Shape, Signal, signed, unsigned
from amaranth.lib import data

from hw.numerics import ACT_BITS, ACT_FRAC
from hw.vector.base import MAX_ROW, ReductionUnit, bits_for, dsp_product

__all__ = ["Sum", "Max", "AbsMax", "ArgMax", "SumSq", "SQ_BITS", "SUMSQ_SHIFT_MAX",
           "row_layout"]

#: Shape of an activation, the default element.
ACT = signed(ACT_BITS)
#: Operands of a sum of squares, ``x >> shift``, are within ``[-2**17, 2**17)`` (RMSNorm's
#: shift leaves every ``|x >> s| <= 2**(ACT_FRAC + 1)``): 18-bit signed, one 18x18 multiplier.
SQ_BITS = ACT_FRAC + 2
#: Largest shift RMSNorm chooses: ``bitlen(ACT_MAX) - (ACT_FRAC + 1)``.
SUMSQ_SHIFT_MAX = (ACT_BITS - 1) - (ACT_FRAC + 1)


def _check(shape, max_len: int) -> Shape:
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be an integer >= 1, got {max_len!r}")
    try:
        shape = Shape.cast(shape)
    except TypeError as e:
        raise TypeError(f"element shape must be an Amaranth shape, got {shape!r}") from e
    if shape.width < 1:
        raise ValueError(f"element shape must have at least one bit, got {shape!r}")
    return shape


def row_layout(shape, **extra) -> data.StructLayout:
    """An element of a row: ``x`` of ``shape``, ``last`` (the row's final element), and the
    ``extra`` fields."""
    return data.StructLayout({"x": shape, **extra, "last": 1})


def _input_stage(m, v):
    return {"x": v.x, "last": v.last}


def _lanes(lanes) -> int:
    if not isinstance(lanes, int) or lanes < 1 or lanes & (lanes - 1):
        raise ValueError(f"lanes must be a power of two >= 1, got {lanes!r}")
    return lanes


def _lane_input(shape, lanes: int):
    """A row element's ``x``: one element, or an array of ``lanes`` (a cycle's elements of a
    laned row)."""
    return shape if lanes == 1 else data.ArrayLayout(shape, lanes)


def lane_tree(combine, shape, lanes: int) -> list:
    """The stages of a tree over a cycle's ``lanes`` values, ``x0 .. x{lanes - 1}`` of the
    stage before (:func:`hw.timing.vec_lane_tree`: ``log2(lanes)`` registered levels, none
    for one lane): each level combines its values in pairs (``combine(a, b)``, registered as
    ``shape``), the last leaves one value, ``x``; ``last`` carried beside."""
    stages = []
    w = lanes
    while w > 1:
        w //= 2

        def level(m, v, w=w):
            out = {f"x{k}": (combine(getattr(v, f"x{2 * k}"), getattr(v, f"x{2 * k + 1}")),
                             shape) for k in range(w)}
            return {**({"x": out["x0"]} if w == 1 else out), "last": v.last}
        stages.append(level)
    return stages


def _lane_input_stage(lanes: int):
    """The input register of a row element: :func:`_input_stage` with one lane, else each
    lane's value as ``x0 .. x{lanes - 1}`` (:func:`lane_tree`'s input)."""
    if lanes == 1:
        return _input_stage

    def stage(m, v):
        return {**{f"x{k}": v.x[k] for k in range(lanes)}, "last": v.last}
    return stage


def _lane_names(lanes: int) -> list[str]:
    """The names of a stage's per-lane values: ``x`` alone with one lane (the one-lane
    pipeline as it was), else ``x0 .. x{lanes - 1}`` (:func:`lane_tree`'s input)."""
    return ["x"] if lanes == 1 else [f"x{k}" for k in range(lanes)]


class Sum(ReductionUnit):
    """Sum of a row: ``y = sum(x)``, exact (:func:`hw.numerics.vec_sum`).

    Pipeline: 1 input register; with ``lanes > 1``, :func:`lane_tree`'s ``log2(lanes)``
    levels of sums; then accumulate (``y`` of the row in the output register). The sums are
    exact, so the result is the one-lane unit's.

    Cost: no multiplier.

    Parameters
    ----------
    shape:
        Shape of the elements (default: an activation, ``signed(32)``; softmax sums its
        exponentials, ``unsigned(17)``).
    max_len:
        Longest row: the sum is ``bitlen(max_len - 1)`` bits wider than the elements.
    lanes:
        Elements a cycle (a power of two): ``x`` is an array of them (a laned row's cycle,
        :func:`hw.timing.vec_lane_tree`; a lane past the row's end must hold 0).

    Members
    -------
    i: In(stream.Signature(row_layout(shape or ArrayLayout(shape, lanes))))
    o: Out(stream.Signature(StructLayout({"y": ...})))
    """

    NAME = "sum"

    def __init__(self, shape: Shape = ACT, max_len: int = MAX_ROW, lanes: int = 1):
        shape = _check(shape, max_len)
        self._lanes = _lanes(lanes)
        width = shape.width + bits_for(max_len)
        self._acc = signed(width) if shape.signed else unsigned(width)
        super().__init__(row_layout(_lane_input(shape, lanes)),
                         data.StructLayout({"y": self._acc}))

    def _stages(self):
        n = self._lanes
        return [_lane_input_stage(n), *lane_tree(lambda a, b: a + b, self._acc, n)]

    def _state(self):
        return {"y": self._acc}

    def _combine(self, m, v, state, first):
        return {"y": Mux(first, v.x, state.y + v.x)}


class Max(ReductionUnit):
    """Maximum of a row (:func:`hw.numerics.vec_max`).

    Pipeline: 1 input register; with ``lanes > 1``, :func:`lane_tree`'s ``log2(lanes)``
    levels of maxima; then compare and keep.

    Cost: no multiplier.

    Parameters
    ----------
    shape:
        Shape of the elements (default ``signed(32)``).
    lanes:
        Elements a cycle (a power of two): ``x`` is an array of them (a laned row's cycle,
        :func:`hw.timing.vec_lane_tree`; a lane past the row's end must hold a value no
        greater than the row's maximum: softmax's masked ``-ACT_MAX``).

    Members
    -------
    i: In(stream.Signature(row_layout(shape or ArrayLayout(shape, lanes))))
    o: Out(stream.Signature(StructLayout({"y": shape})))
    """

    NAME = "max"

    def __init__(self, shape: Shape = ACT, lanes: int = 1):
        self._shape = _check(shape, 1)
        self._lanes = _lanes(lanes)
        super().__init__(row_layout(_lane_input(self._shape, lanes)),
                         data.StructLayout({"y": self._shape}))

    def _stages(self):
        n = self._lanes
        return [_lane_input_stage(n),
                *lane_tree(lambda a, b: Mux(a > b, a, b), self._shape, n)]

    def _state(self):
        return {"y": self._shape}

    def _combine(self, m, v, state, first):
        return {"y": Mux(first | (v.x > state.y), v.x, state.y)}


class AbsMax(ReductionUnit):
    """Largest magnitude of a row, ``max |x|`` (the ``amax`` of
    :func:`hw.numerics.vec_requant` and :func:`~hw.numerics.vec_rmsnorm`).

    Pipeline: 1 ``|x|`` registered (of each lane); with ``lanes > 1``, :func:`lane_tree`'s
    ``log2(lanes)`` levels of maxima; then compare and keep.

    Cost: no multiplier.

    Parameters
    ----------
    shape:
        Shape of the elements, signed (default ``signed(32)``; requantisation of the
        attention's folded values takes ``signed(54)``). The result is unsigned, as wide.
    lanes:
        Elements a cycle (a power of two): ``x`` is an array of them (a laned row's cycle,
        :func:`hw.timing.vec_lane_tree`; a lane past the row's end must hold 0).
    signs:
        Every magnitude carries its element's sign below it, ``2 |x| + (x < 0)``, and the
        maxima are of these (a bit wider): the result is ``2 max|x| + t``, ``t`` whether an
        element of the largest magnitude is negative, from which ``max |x >> 1|`` follows
        (``(max|x| + t) >> 1``: KV4's shifted rows, :func:`hw.numerics.vec_kv4_rows`).

    Members
    -------
    i: In(stream.Signature(row_layout(shape or ArrayLayout(shape, lanes))))
    o: Out(stream.Signature(StructLayout({"y": unsigned(shape.width [+ 1 with signs])})))
    partial: Out(StructLayout({"valid": 1, "x": unsigned(...)}))
        Each cycle's maximum of its lanes (past the lane tree: one lane's magnitude with one
        lane) as the row's maximum takes it, ``valid`` with an element; while ``o`` is never
        stalled, ``latency - 1`` cycles after the element was accepted (the maxima of a
        row's parts: KV4's groups).
    """

    NAME = "absmax"

    def __init__(self, shape: Shape = ACT, lanes: int = 1, signs: bool = False):
        shape = _check(shape, 1)
        if not shape.signed:
            raise ValueError(f"abs-max takes signed elements, got {shape!r}")
        self._lanes = _lanes(lanes)
        self._signs = bool(signs)
        self._out = unsigned(shape.width + self._signs)
        super().__init__(row_layout(_lane_input(shape, lanes)),
                         data.StructLayout({"y": self._out}))
        self.partial = Signal(data.StructLayout({"valid": 1, "x": self._out}))

    def _stages(self):
        n = self._lanes

        def magnitude(x):
            a = Mux(x[-1], -x, x)
            return Cat(x[-1], a) if self._signs else a

        def s1(m, v):
            xs = [v.x] if n == 1 else [v.x[k] for k in range(n)]
            return {**{name: (magnitude(x), self._out)
                       for name, x in zip(_lane_names(n), xs, strict=True)}, "last": v.last}
        return [s1, *lane_tree(lambda a, b: Mux(a > b, a, b), self._out, n)]

    def _elements(self, m, valid, v):
        m.d.comb += [self.partial.valid.eq(valid), self.partial.x.eq(v.x)]

    def _state(self):
        return {"y": self._out}

    def _combine(self, m, v, state, first):
        return {"y": Mux(first | (v.x > state.y), v.x, state.y)}


class ArgMax(ReductionUnit):
    """Index of the maximum of a row, ties to the lowest index (:func:`hw.numerics.vec_argmax`),
    and the maximum.

    Pipeline: 1 input register; 2 compare (strictly greater replaces), count and keep.

    Cost: no multiplier.

    Parameters
    ----------
    shape:
        Shape of the elements (default ``signed(32)``).
    max_len:
        Longest row (the index's range).
    tag_bits:
        With ``tag_bits > 0``, each element carries a ``tag`` of as many bits and a ``pair``
        flag: the index given for an element with ``pair`` set is its tag, not its position
        (an ARGMAX over (index, value) pairs: :func:`hw.numerics.vec_argmax_words`).

    Members
    -------
    i: In(stream.Signature(row_layout(shape[, tag=unsigned(tag_bits), pair=1])))
    o: Out(stream.Signature(StructLayout({"index": range(max_len), "y": shape})))
    """

    NAME = "argmax"

    def __init__(self, shape: Shape = ACT, max_len: int = MAX_ROW, tag_bits: int = 0):
        self._shape = _check(shape, max_len)
        self._pos = unsigned(bits_for(max_len))
        self._tagged = tag_bits > 0
        self._index = unsigned(max(bits_for(max_len), tag_bits))
        extra = {"tag": unsigned(tag_bits), "pair": 1} if self._tagged else {}
        super().__init__(row_layout(self._shape, **extra),
                         data.StructLayout({"index": self._index, "y": self._shape}))

    def _stages(self):
        if not self._tagged:
            return [_input_stage]
        return [lambda m, v: {"x": v.x, "tag": v.tag, "pair": v.pair, "last": v.last}]

    def _state(self):
        return {"y": self._shape, "index": self._index, "pos": self._pos}

    def _combine(self, m, v, state, first):
        pos = Mux(first, 0, state.pos + 1)
        take = first | (v.x > state.y)
        at = Mux(v.pair, v.tag, pos) if self._tagged else pos
        return {"y": Mux(take, v.x, state.y), "index": Mux(take, at, state.index),
                "pos": pos}


class SumSq(ReductionUnit):
    """Sum of squares of ``x >> shift`` over a row (:func:`hw.numerics.vec_sumsq`; ``shift``
    is the row's, given with every element).

    Every ``x >> shift`` must be in ``[-2**17, 2**17)`` (:data:`SQ_BITS` bits), as RMSNorm's
    choice of the shift guarantees; the result is unspecified otherwise.

    Pipeline: 1 ``y = x >> shift`` (flooring); 2 ``y * y``; with ``lanes > 1`` (each lane
    shifted and squared), :func:`lane_tree`'s ``log2(lanes)`` levels of sums; then
    accumulate. The sums are exact, so the result is the one-lane unit's.

    Cost: one 18x18 multiplier a lane.

    Parameters
    ----------
    max_len:
        Longest row: the sum has ``2 * SQ_BITS - 1 + bitlen(max_len - 1)`` bits.
    lanes:
        Elements a cycle (a power of two): ``x`` is an array of them (a lane past the row's
        end must hold 0).

    Members
    -------
    i: In(stream.Signature(row_layout(signed(32) or ArrayLayout(signed(32), lanes),
                                      shift=range(SUMSQ_SHIFT_MAX + 1))))
    o: Out(stream.Signature(StructLayout({"y": unsigned(...)})))
    """

    NAME = "sumsq"

    def __init__(self, max_len: int = MAX_ROW, lanes: int = 1):
        _check(signed(ACT_BITS), max_len)
        self._lanes = _lanes(lanes)
        self._sq = unsigned(2 * SQ_BITS - 1)
        self._acc = unsigned(2 * SQ_BITS - 1 + bits_for(max_len))
        super().__init__(row_layout(_lane_input(signed(ACT_BITS), lanes),
                                    shift=range(SUMSQ_SHIFT_MAX + 1)),
                         data.StructLayout({"y": self._acc}))

    def _stages(self):
        n = self._lanes
        names = _lane_names(n)
        ys = ["y"] if n == 1 else [f"y{k}" for k in range(n)]

        def s1(m, v):
            xs = [v.x] if n == 1 else [v.x[k] for k in range(n)]
            return {**{y: (x >> v.shift, signed(SQ_BITS)) for y, x in zip(ys, xs, strict=True)},
                    "last": v.last}

        def s2(m, v):
            return {**{x: dsp_product(getattr(v, y) * getattr(v, y), self._sq)
                       for x, y in zip(names, ys, strict=True)}, "last": v.last}

        return [s1, s2, *lane_tree(lambda a, b: a + b, self._acc, n)]

    def _state(self):
        return {"y": self._acc}

    def _combine(self, m, v, state, first):
        return {"y": Mux(first, v.x, state.y + v.x)}
