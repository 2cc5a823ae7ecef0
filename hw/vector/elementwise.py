"""The vector unit's elementwise units: saturating add, multiply with a rounding shift, rotary
rotation, scaling by a table result, and INT8 requantisation, bit-exact with
:func:`hw.numerics.vec_add`, :func:`~hw.numerics.vec_mul`, :func:`~hw.numerics.vec_rope` and
the steps of :func:`~hw.numerics.vec_softmax`, :func:`~hw.numerics.vec_rmsnorm` and
:func:`~hw.numerics.vec_requant`. One element per cycle each.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Const, Module, Mux, signed, unsigned
from amaranth.lib import data

from hw.numerics import (
    ACT_BITS,
    ACT_FRAC,
    ACT_QMAX,
    FOLD_BITS,
    KV4_CODE_MAX,
    KV4_QMAX,
    ROPE_FRAC,
    ROPE_HALF_BITS,
    TABLE_IN_BITS,
)
from hw.vector.base import (
    MULT_CHUNK,
    PipelineUnit,
    Stage,
    beside,
    build_pipeline,
    chunks,
    dsp_product,
    grid_halves,
    grid_products,
    grid_sum,
    partial_products,
    round_saturate,
    round_saturate_low,
    round_saturate_widths,
    round_shift_saturate_const,
    saturate,
    select_mode,
    shift_right_low,
    signed_range,
    sum_partial_products,
    valid_delay,
)
from hw.vector.tables import SH_BITS, SH_MIN, TABLE_RESULT_BITS

__all__ = ["Add", "Mul", "Rope", "Scale", "Requant", "ROPE_BITS", "CODE_BITS"]

#: An INT8 code: ``[-ACT_QMAX, ACT_QMAX]`` and a sign.
CODE_BITS = ACT_QMAX.bit_length() + 1
#: RoPE cos / sin words: Q1.14 in [-1, 1], ``1.0 = 2**14`` (16-bit signed; the halves of a
#: table word, :func:`hw.numerics.rope_pairs`).
ROPE_BITS = ROPE_HALF_BITS


def _bits(name: str, value, lo: int, hi: int) -> int:
    if not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {value!r}")
    return value


class Add(PipelineUnit):
    """``y = sat32(a + b)`` (:func:`hw.numerics.vec_add`: the residual add).

    Pipeline: 1 add and saturate.

    Cost: no multiplier.

    Members
    -------
    i: In(stream.Signature(StructLayout({"a": signed(32), "b": signed(32)})))
    o: Out(stream.Signature(StructLayout({"y": signed(32)})))
    """

    NAME = "add"

    def __init__(self):
        act = signed(ACT_BITS)
        super().__init__(data.StructLayout({"a": act, "b": act}), data.StructLayout({"y": act}))

    def _stages(self):
        def s1(m, v):
            return {"y": (saturate(v.a + v.b), signed(ACT_BITS))}
        return [s1]


class Mul(PipelineUnit):
    """``y = sat32(round_shift(a * b, frac))`` (:func:`hw.numerics.vec_mul`); with ``y_bits``
    54 and ``frac`` 0, FOLD's products ``sat54(a * b)`` (:func:`hw.numerics.vec_fold`).

    Pipeline: 1 the 2 x 2 grid of partial products (:func:`~hw.vector.base.grid_products`,
    each in its multiplier's output register); 2 the middle two summed, the outer two side by
    side; 3 ``a * b`` (exact, one adder); 4 rounding shift and saturation.

    Cost: four 18x18 multipliers, for 32 x 32 bits and for RMSNorm's 32 x 33.

    Parameters
    ----------
    frac:
        Fraction bits of ``a`` (the product is shifted right by them): 16 for two activations,
        30 (:data:`hw.numerics.NORM_FRAC`) for RMSNorm's ``n * w`` and the SiLU-gate.
    a_bits, b_bits:
        Signed widths of the operands, at most 34 (two multiplier chunks; default 32,
        RMSNorm's weight takes 33).
    y_bits:
        Signed width the result saturates to: 32 (activations, the default) up to 54
        (:data:`hw.numerics.FOLD_BITS`, FOLD's products).
    modes:
        ``(frac, y_bits)`` pairs, instead of ``frac`` and ``y_bits``: a unit of several uses
        that share its multipliers, one at a time. The input then has a ``mode`` field, the
        index of its element's pair (the rounding and saturation a multiplexer behind the
        product), and ``y`` is as wide as the widest ``y_bits`` (each mode's result
        sign-extended). One pair is ``Mul(frac, y_bits=y_bits)``. The entry
        :data:`Mul.ROPE` is :class:`Rope`'s rotation, ``x`` in ``a`` and ``rot`` in ``b``
        (``b_bits`` at least 33), with ``cos`` and ``sin`` inputs: its two 32 x 16-bit
        products are the grid's four multipliers, their operands selected by the mode
        (``a_0 * cos``, ``a_1 * cos``, ``b_1 * sin``, ``b_0 * sin`` in place of ``a_0 * b_0``,
        ``a_1 * b_0``, ``a_0 * b_1``, ``a_1 * b_1``, ``_i`` the 17-bit chunks), the outer two
        summed in stage 2 rather than set side by side.

    Members
    -------
    i: In(stream.Signature(StructLayout({"a": signed(a_bits), "b": signed(b_bits)})))
        (and ``"mode": range(len(modes))`` with several modes; ``"cos", "sin": signed(16)``
        with :data:`Mul.ROPE`)
    o: Out(stream.Signature(StructLayout({"y": signed(y_bits)})))
    """

    #: The rotation of :class:`Rope` as a mode of a shared ``Mul`` (``modes``).
    ROPE = "rope"

    NAME = "mul"

    def __init__(self, frac: int = ACT_FRAC, a_bits: int = ACT_BITS, b_bits: int = ACT_BITS,
                 y_bits: int = ACT_BITS, *, modes: tuple[tuple[int, int], ...] | None = None):
        if modes is None:
            modes = ((frac, y_bits),)
        if not modes:
            raise ValueError("mul modes must name at least one (frac, y_bits)")
        self.modes = tuple(
            mode if mode == self.ROPE else
            (_bits("mul frac", mode[0], 0, 62), _bits("mul y_bits", mode[1], ACT_BITS, FOLD_BITS))
            for mode in modes)
        self.a_bits = _bits("mul a_bits", a_bits, 2, 2 * MULT_CHUNK)
        self.b_bits = _bits("mul b_bits", b_bits, 2, 2 * MULT_CHUNK)
        # the rotation: ROPE_FRAC fraction bits, an activation
        self._rounding = [(ROPE_FRAC, ACT_BITS) if mode == self.ROPE else mode
                          for mode in self.modes]
        self.frac, self.y_bits = self._rounding[0][0], max(y for _, y in self._rounding)
        rope = {}
        if self.ROPE in self.modes:
            if len(self.modes) < 2 or self.b_bits < ACT_BITS + 1 or self.a_bits < ACT_BITS:
                raise ValueError("a mul's rope mode takes a second mode, a_bits >= 32 and "
                                 f"b_bits >= 33, got {self.modes}, {a_bits}, {b_bits}")
            rope = {"cos": signed(ROPE_BITS), "sin": signed(ROPE_BITS)}
        mode = {"mode": range(len(self.modes))} if len(self.modes) > 1 else {}
        super().__init__(data.StructLayout({"a": signed(a_bits), "b": signed(b_bits), **mode,
                                            **rope}),
                         data.StructLayout({"y": signed(self.y_bits)}))

    def _stages(self):
        p_shape = signed(self.a_bits + self.b_bits)

        y_shape = signed(self.y_bits)
        several = len(self.modes) > 1
        # (several modes: the mode travels beside the product, its stage's results selected)

        def carry(v):
            return {"mode": v.mode} if several else {}

        rope = self.modes.index(self.ROPE) if self.ROPE in self.modes else None

        def s1(m, v):
            if rope is None:
                return {**grid_products(v.a, v.b), **carry(v)}
            # the rotation's products on the grid's multipliers: x = a, rot = b
            (a0, a1), (b0, b1) = chunks(v.a), chunks(v.b)
            on = v.mode == rope
            by_cos = Mux(on, v.cos, b0)
            by_sin = Mux(on, v.sin, b1)
            return {"pp00": dsp_product(a0 * by_cos), "pp10": dsp_product(a1 * by_cos),
                    "pp01": dsp_product(b1 * Mux(on, v.sin, a0)),
                    "pp11": dsp_product(Mux(on, b0, a1) * by_sin), **carry(v)}

        def s2(m, v):
            halves = grid_halves(v)
            if rope is not None:   # x_0 cos + rot_0 sin; mid is x_1 cos + rot_1 sin
                halves["outer"] = Mux(v.mode == rope, v.pp00 + v.pp11, halves["outer"])
            return {**halves, **carry(v)}

        def s3(m, v):
            return {"p": (grid_sum(v), p_shape), **carry(v)}

        widths = sorted({yb for _, yb in self._rounding})

        def s4(m, v):
            if not several:
                return {"y": (round_shift_saturate_const(v.p, *self._rounding[0]), y_shape)}
            # One rounding for every mode: round_shift(p, frac) is (w + 1) >> 1 of w = p >>
            # (frac - 1), or 2p for frac 0 (round_shift_saturate_const), w selected by the
            # mode; then one increment and each y_bits' saturation (round_saturate_widths).
            w = select_mode(v.mode, [v.p >> (f - 1) if f else Cat(Const(0, 1), v.p).as_signed()
                                     for f, _ in self._rounding])
            y = round_saturate_widths(w, widths)
            width = select_mode(v.mode, [Const(widths.index(yb), range(len(widths)))
                                         for _, yb in self._rounding])
            return {"y": (select_mode(width, y), y_shape)}

        return [s1, s2, s3, s4]


class Rope(PipelineUnit):
    """One element of a rotary rotation (:func:`hw.numerics.vec_rope`):
    ``y = sat32(round_shift(x * cos + rot * sin, 14))``, with ``rot`` the element of
    ``rot(x) = (-x2, x1)`` at the same position (``-x[i + d/2]`` in the first half of a head,
    ``x[i - d/2]`` in the second) and ``cos``, ``sin`` the tables' words
    (:func:`hw.numerics.rope_table`). ``rot`` is 33 bits wide, so that the negation is exact
    for every 32-bit word (``-(-2**31)``), as in the numerics.

    Pipeline: 1 the partial products of ``x * cos`` and ``rot * sin``, one per 17-bit chunk of
    ``x`` and ``rot`` (:func:`~hw.vector.base.grid_products`, each in its multiplier's output
    register); 2 ``x * cos`` and ``rot * sin`` (one adder each); 3 their sum (exact, below
    2**48); 4 rounding and saturation.

    Cost: four 18x18 multipliers (two per 32 x 16-bit and 33 x 16-bit product).

    Members
    -------
    i: In(stream.Signature(StructLayout({"x": signed(32), "rot": signed(33),
                                         "cos", "sin": signed(16)})))
    o: Out(stream.Signature(StructLayout({"y": signed(32)})))
    """

    NAME = "rope"

    def __init__(self):
        act, tab = signed(ACT_BITS), signed(ROPE_BITS)
        super().__init__(data.StructLayout({"x": act, "rot": signed(ACT_BITS + 1), "cos": tab,
                                            "sin": tab}),
                         data.StructLayout({"y": act}))

    def _stages(self):
        def s1(m, v):
            xc, rs = grid_products(v.x, v.cos), grid_products(v.rot, v.sin)
            return {**{f"x{k}": t for k, t in xc.items()}, **{f"r{k}": t for k, t in rs.items()}}

        def s2(m, v):
            return {"xc": v.xpp00 + (v.xpp10 << MULT_CHUNK),
                    "rs": v.rpp00 + (v.rpp10 << MULT_CHUNK)}

        def s3(m, v):
            return {"s": v.xc + v.rs}

        def s4(m, v):
            return {"y": (round_shift_saturate_const(v.s, ROPE_FRAC), signed(ACT_BITS))}

        return [s1, s2, s3, s4]


class Scale(PipelineUnit):
    """Multiply by a table result: ``y = sat32(round_shift(x * r, sh - frac))`` with ``(r,
    sh)`` from :class:`~hw.vector.tables.Recip` or :class:`~hw.vector.tables.Rsqrt`, so ``y ~=
    x / X * 2**frac`` (or ``x / sqrt(X) * 2**frac``). A negative shift is a left shift, as in
    :func:`hw.numerics.round_shift`. ``sh`` must be at least
    :data:`~hw.vector.tables.SH_MIN` (16: what the table units give, plus RMSNorm's row shift);
    the result is unspecified below.

    Softmax's last step is ``Scale(16)`` of ``(e, recip(sum e))``; RMSNorm's normalised row
    is ``Scale(30)`` of ``(x, rsqrt(ss))`` with the row's shift ``s`` added to ``sh``.

    Pipeline: 1 the partial products of ``x * r``, and the shift; 2 ``p``, their sum, and a
    mask of ``p``'s bits that land at ``2**32`` or above in ``w``; 3 ``w = (2 * p) >> (sh -
    frac)`` (a left shift when negative: one shifter, right, of ``2 * p`` shifted left by the
    largest left shift ``frac - 16``), its low 33 bits only, and whether ``p``'s masked bits
    are all its sign; 4 ``(w + 1) >> 1`` and saturation.

    Cost: two 18x18 multipliers (32 x 17 bits).

    Parameters
    ----------
    frac:
        Fraction bits of the result (0 to 62), or a tuple of them: a unit of several uses
        that share its multipliers, one at a time. The input then has a ``mode`` field, the
        index of its element's ``frac``, which selects the constant added to ``sh`` (one
        shifter for every ``frac``: ``2p`` shifted left by the largest left shift of them
        all, then right by ``sh - frac`` plus that).
    requant_bits:
        The unit is ``Requant(requant_bits)`` too, on its port ``requant`` (``ports
        ["requant"]``: members ``requant_i`` and ``requant_o``, Requant's layouts and
        latency): Requant's ``(x >> s) * r`` is the same 32 x 17-bit product, so after its
        first stage a Requant element takes this unit's first two stages' multipliers
        (their operands selected by whether a Requant element is in its first stage) and
        sum, a stage behind a Scale element, then Requant's stages from its third. An
        element is taken from one input a cycle, never from both, and no Scale element in
        the cycle after a Requant element (among the cycles the unit advances in: both would
        need the multipliers in the next); a Requant element may follow a Scale element at
        once. Cost: Scale's two multipliers for both.

    Members
    -------
    i: In(stream.Signature(StructLayout({"x": signed(32), "r": unsigned(17),
                                         "sh": unsigned(7)})))
        (and ``"mode": range(len(frac))`` with several)
    o: Out(stream.Signature(StructLayout({"y": signed(32)})))
    requant_i, requant_o: with ``requant_bits``, ``Requant(requant_bits)``'s ``i`` and ``o``
    """

    NAME = "scale"

    def __init__(self, frac: int | tuple[int, ...] = ACT_FRAC, *,
                 requant_bits: int | None = None):
        fracs = frac if isinstance(frac, tuple) else (frac,)
        if not fracs:
            raise ValueError("scale frac must name at least one fraction")
        self.fracs = tuple(_bits("scale frac", f, 0, 62) for f in fracs)
        self.frac = self.fracs[0]
        mode = {"mode": range(len(self.fracs))} if len(self.fracs) > 1 else {}
        ports = None
        if requant_bits is not None:
            shift, products, tail = _requant_stages()
            ports = {Requant.NAME: (*_requant_layouts(requant_bits),
                                    1 + len(products) + len(tail))}
        super().__init__(data.StructLayout({"x": signed(ACT_BITS),
                                            "r": unsigned(TABLE_RESULT_BITS),
                                            "sh": unsigned(SH_BITS), **mode}),
                         data.StructLayout({"y": signed(ACT_BITS)}), ports)

    def elaborate(self, platform):
        if not self.ports:
            return super().elaborate(platform)
        m = Module()
        en = self._enable(m)
        port = self.ports[Requant.NAME]
        shift, _, tail = _requant_stages()
        rq = build_pipeline(m, en, port.i.payload, [shift])
        # A Requant element in its first stage: the multipliers are its, a stage behind a
        # Scale element's (the same product; Requant's own two stages of it are these).
        rq_valid = valid_delay(m, en, port.i.valid, 1, "requant_valid")
        products, product_sum, *scale_tail = self._stage_list
        carried = ("sh", "four", "key")   # Requant's, beside its product

        def first(m, v):
            ops = {"x": Mux(rq_valid, rq.x, v.x), "r": Mux(rq_valid, rq.r, v.r), "sh": v.sh,
                   **({"mode": v.mode} if len(self.fracs) > 1 else {})}
            return {**products(m, SimpleNamespace(**ops)), **{k: getattr(rq, k) for k in carried}}

        v = build_pipeline(m, en, self.i.payload, [first, beside(product_sum, *carried)])
        self._output(m, self.o, valid_delay(m, en, self.i.valid, self.latency, "valid"),
                     build_pipeline(m, en, v, scale_tail))
        self._output(m, port.o, valid_delay(m, en, rq_valid, port.latency - 1, "rq_valid"),
                     build_pipeline(m, en, v, tail))
        return m

    def _stages(self):
        p_shape = signed(ACT_BITS + TABLE_RESULT_BITS)
        # One right shifter: 2p is first shifted left by the largest left shift, then right by
        # sh - frac + left_max >= 0. Shifts past right_max change nothing (round_shift of p
        # gives 0); a non-zero p shifted left by ACT_BITS - 1 or more saturates. With several
        # fracs, left_max is the largest of theirs: 2p << left_max >> (sh - frac + left_max)
        # is 2p << l >> (sh - frac + l) for each frac's own l <= left_max (the first shift
        # loses no bit), and a shift past right_max still gives p's sign alone.
        left_max = max(min(max(0, f - SH_MIN), ACT_BITS - 1) for f in self.fracs)
        right_max = p_shape.width + 1 + left_max
        amount = unsigned(right_max.bit_length())
        # w = 2 * (p >> s) rounded down, or 2 * (p << -s): the last stage's (w + 1) >> 1 is
        # round_shift(p, s) either way.
        offsets = [left_max - f for f in self.fracs]

        def s1(m, v):
            offset = (offsets[0] if len(offsets) == 1 else
                      select_mode(v.mode, [Const(o, signed_range(o, o)) for o in offsets]))
            shift = (v.sh + offset).as_signed()
            return {**partial_products(v.r, v.x),
                    "amount": (Mux(shift > right_max, right_max, shift), amount)}

        # The last stage reads only w's low ACT_BITS + 1 bits and whether its bits from
        # ACT_BITS up are all its sign: those are p's from amount + c up (w = 2p << left_max
        # >> amount), a flag of p's bits and a mask of amount, not a shifter as wide as w.
        c = ACT_BITS - 1 - left_max
        high = range(c, p_shape.width - 1)   # p's bits that can lie there, but its sign

        def s1b(m, v):
            # (bit i - c of ones << amount is i >= amount + c: a decoder, no comparators)
            ones = Const((1 << len(high)) - 1, len(high))
            return {"p": (sum_partial_products(v), p_shape), "amount": v.amount,
                    "above": ((ones << v.amount)[:len(high)], unsigned(len(high)))}

        def s2(m, v):
            twice = Cat(Const(0, 1 + left_max), v.p).as_signed()
            sign = v.p[-1]
            big = ((v.p[high.start:high.stop] ^ sign.replicate(len(high))) & v.above).any()
            return {"w": (shift_right_low(twice, v.amount, ACT_BITS + 1), signed(ACT_BITS + 1)),
                    "sign": sign, "big": big}

        def s3(m, v):
            return {"y": (round_saturate_low(v.w, v.sign, v.big), signed(ACT_BITS))}

        return [s1, s1b, s2, s3]


def _mersenne_bits(name: str, n: int) -> int:
    """``a`` with ``n == 2**a - 1`` (a factor Requant forms as ``(p << a) - p``)."""
    if n < 1 or (n + 1) & n:
        raise ValueError(f"{name} must be 2**a - 1 for Requant's shifts, got {n}")
    return n.bit_length()


def _at_most(v, hi: int):
    """``min(v, hi)`` (``v`` non-negative wherever it is selected)."""
    return Mux(v > hi, hi, v)


class Requant(PipelineUnit):
    """INT8 requantisation of one element of a row (:func:`hw.numerics.vec_requant`):
    ``a = clip(round_shift((x >> s) * 127 * r, sh), -127, 127)`` with the row's ``s`` and
    ``(r, sh) = recip(amax >> s)``.

    With ``four`` (KV4's nibbles, :func:`hw.numerics.vec_kv4_rows`) the factor is ``7``, or
    ``7 * 255`` with ``key`` too (a key row's group reciprocal), in place of 127, and the
    result is clipped to [-7, 7].

    ``x >> s`` must fit an activation (32-bit signed), as the row's ``s`` ensures; the result
    is unspecified otherwise.

    Pipeline: 1 ``x >> s`` (flooring); 2 the partial products of ``(x >> s) * r``; 3 ``p``,
    their sum; 4 ``hi`` and ``lo``, shifts of ``p`` or one subtraction of two (``128 p`` and
    ``p``; ``8 p`` and ``p``; ``(2048 - 256) p`` and ``7 p``); 5 ``q = hi - lo`` (``127 p``,
    ``7 p``, ``1785 p``); 6 ``w = (2 * q) >> sh``; 7 ``(w + 1) >> 1`` (the rounding) and
    clipping (to 8 or 4 bits, both read from ``w``'s bits).

    Cost: two 18x18 multipliers (32 x 17 bits); the factors are shifts and adders.

    Parameters
    ----------
    x_bits:
        Signed width of the elements: 32 (activations; then ``s`` is 0) up to 54 (the
        attention's values prologue, rows below 2**53).

    Members
    -------
    i: In(stream.Signature(StructLayout({"x": signed(x_bits), "r": unsigned(17),
                                         "sh": unsigned(7), "s": range(x_bits - 31),
                                         "four": 1, "key": 1})))
    o: Out(stream.Signature(StructLayout({"a": signed(8)})))
    """

    NAME = "requant"

    def __init__(self, x_bits: int = ACT_BITS):
        layouts = _requant_layouts(x_bits)
        self.x_bits = x_bits
        super().__init__(*layouts)

    def _stages(self):
        shift, products, tail = _requant_stages()
        return [shift, *products, *tail]


def _requant_layouts(x_bits: int) -> tuple[data.StructLayout, data.StructLayout]:
    """:class:`Requant`'s input and output layouts for elements of ``x_bits``."""
    _bits("requant x_bits", x_bits, ACT_BITS, TABLE_IN_BITS + 1)
    return (data.StructLayout({"x": signed(x_bits), "r": unsigned(TABLE_RESULT_BITS),
                               "sh": unsigned(SH_BITS), "s": range(x_bits - ACT_BITS + 1),
                               "four": 1, "key": 1}),
            data.StructLayout({"a": signed(CODE_BITS)}))


def _requant_stages() -> tuple[Stage, list[Stage], list[Stage]]:
    """:class:`Requant`'s stages: ``x >> s``; its product ``(x >> s) * r`` (the partial
    products, their sum ``p``: :class:`Scale`'s first two stages', ``sh``, ``four`` and
    ``key`` beside); the rest, from ``p``."""
    p_shape = signed(ACT_BITS + TABLE_RESULT_BITS)
    # Every factor is a product of numbers 2**k - 1, so q = hi - lo with hi and lo each a
    # shift of p or one adder of two: (2**a - 1) p = (p << a) - p, and (2**a - 1)(2**b - 1)
    # p = ((p << (a + b)) - (p << b)) - ((p << a) - p).
    a = _mersenne_bits("ACT_QMAX", ACT_QMAX)
    a4 = _mersenne_bits("KV4_QMAX", KV4_QMAX)
    b4 = _mersenne_bits("KV4_CODE_MAX", KV4_CODE_MAX)
    key_factor = KV4_QMAX * KV4_CODE_MAX
    q_bits = p_shape.width + max(ACT_QMAX, key_factor).bit_length()
    flags = ("four", "key")

    def s1(m, v):
        return {"x": (v.x >> v.s, signed(ACT_BITS)), "r": v.r, "sh": v.sh,
                **{k: getattr(v, k) for k in flags}}

    def s2(m, v):
        return {**partial_products(v.r, v.x), "sh": v.sh, **{k: getattr(v, k) for k in flags}}

    def s2b(m, v):
        return {"p": (sum_partial_products(v), p_shape), "sh": v.sh,
                **{k: getattr(v, k) for k in flags}}

    def s3(m, v):
        # No multiplier: a constant product here was a chain of DSPs and adders.
        p = v.p
        hi = Mux(v.four, Mux(v.key, (p << (a4 + b4)) - (p << b4), p << a4), p << a)
        lo = Mux(v.four & v.key, (p << a4) - p, p)
        # A shift past q's bits gives 0, as any larger one does.
        return {"hi": (hi, signed(q_bits)), "lo": (lo, signed(q_bits)),
                "sh": (_at_most(v.sh, q_bits + 1), unsigned((q_bits + 1).bit_length())),
                "four": v.four}

    def s3b(m, v):
        return {"q": (v.hi - v.lo, signed(q_bits)), "sh": v.sh, "four": v.four}

    def s4(m, v):
        # 2q >> sh: round_shift(q, sh) is (w + 1) >> 1 (hw.vector.base.round_shift).
        return {"w": (Cat(Const(0, 1), v.q).as_signed() >> v.sh, signed(q_bits + 1)),
                "four": v.four}

    def s5(m, v):
        # Clipping to [-7, 7] is saturating to a4 + 1 bits, from w's bits beside the
        # 8-bit saturation (not two compares of its result after it).
        a = Mux(v.four, round_saturate(v.w, a4 + 1), round_saturate(v.w, CODE_BITS))
        return {"a": (a, signed(CODE_BITS))}

    return s1, [s2, s2b], [s3, s3b, s4, s5]
