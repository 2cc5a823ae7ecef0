"""The vector unit's table units: reciprocal, reciprocal square root and exp, each a table of
:mod:`hw.numerics` plus one refinement step, one element per cycle, bit-exact with
:func:`hw.numerics.vec_recip`, :func:`~hw.numerics.vec_rsqrt` and :func:`~hw.numerics.vec_exp`.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth import Cat, Const, Module, Mux, signed, unsigned
from amaranth.lib import data

from hw.numerics import (
    ACT_BITS,
    ACT_FRAC,
    CONST_FRAC,
    EXP2_LUT,
    LN2_Q,
    LOG2E_Q,
    LUT_BITS,
    MANT_BITS,
    NORM_FRAC,
    RECIP_FRAC,
    RECIP_LUT,
    RSQRT_FRAC,
    RSQRT_LUT,
    TABLE_IN_BITS,
)
from hw.numerics import (
    round_shift as np_round_shift,
)
from hw.vector.base import (
    MULT_CHUNK,
    PipelineUnit,
    beside,
    build_pipeline,
    dsp_product,
    normalise_levels,
    partial_products,
    rom,
    select_mode,
    signed_range,
    sum_partial_products,
    valid_delay,
)

__all__ = ["Recip", "Rsqrt", "Exp", "TABLE_RESULT_BITS", "RECIP_SH_MAX", "RSQRT_SH_MAX",
           "SH_MIN", "SH_BITS", "table_in_layout", "table_out_layout"]

#: A reciprocal or rsqrt result ``r`` is in (2**15, 2**16]: ``MANT_BITS + 1`` bits.
TABLE_RESULT_BITS = MANT_BITS + 1
#: Largest ``sh`` of a reciprocal (bit length 53) and of an rsqrt.
RECIP_SH_MAX = TABLE_IN_BITS + RECIP_FRAC - MANT_BITS
RSQRT_SH_MAX = RSQRT_FRAC + (TABLE_IN_BITS - MANT_BITS + 1) // 2
#: Smallest ``sh`` of either (the operand 1): a table result never asks for a left shift of
#: more than ``frac - SH_MIN`` in :class:`hw.vector.elementwise.Scale`.
SH_MIN = min(1 + RECIP_FRAC - MANT_BITS, RSQRT_FRAC + (1 - MANT_BITS + 1) // 2)
#: Width of the ``sh`` of a table result (and of the units that take one).
SH_BITS = max(RECIP_SH_MAX, RSQRT_SH_MAX).bit_length()
#: Leading-one normalisation of a table operand: shift levels, two per stage.
_LEVELS = [1 << j for j in reversed(range((TABLE_IN_BITS - 1).bit_length()))]
_LEVELS_PER_STAGE = 2
#: Index bits of the mantissa below its leading one that address the tables.
_IDX_LO = MANT_BITS - 1 - LUT_BITS


def table_in_layout() -> data.StructLayout:
    """Operand of :class:`Recip` / :class:`Rsqrt`: ``x`` below 2**53."""
    return data.StructLayout({"x": unsigned(TABLE_IN_BITS)})


def table_out_layout() -> data.StructLayout:
    """Result of :class:`Recip` / :class:`Rsqrt`: ``(r, sh)``."""
    return data.StructLayout({"r": unsigned(TABLE_RESULT_BITS), "sh": unsigned(SH_BITS)})


def _normalise_stages():
    """The first stages of both table units: ``y = x << lz`` with its leading one at bit 52
    (an operand 0 is taken as 1), and ``lz``, the leading-zero count (``n = 53 - lz``), two
    shift levels per stage (three stages for 53 bits)."""
    groups = [_LEVELS[k:k + _LEVELS_PER_STAGE]
              for k in range(0, len(_LEVELS), _LEVELS_PER_STAGE)]
    lz_shape = unsigned(TABLE_IN_BITS.bit_length())

    def first(m, v):
        y, lz = normalise_levels(v.x | (v.x == 0), groups[0])
        return {"y": (y, unsigned(TABLE_IN_BITS)), "lz": (lz, lz_shape)}

    def step(levels):
        def stage(m, v):
            y, lz = normalise_levels(v.y, levels)
            return {"y": (y, unsigned(TABLE_IN_BITS)), "lz": (v.lz + lz, lz_shape)}
        return stage

    return [first, *(step(levels) for levels in groups[1:])]


def _exp_operand_bits(k_max: int) -> int:
    """The fewest signed bits ``b`` of :class:`Exp`'s ``d`` (at least two multiplier chunks'
    worth, one and a sign) such that ``d = -2**(b - 1)``, and so every smaller ``d``, has
    ``k = ((d * LOG2E_Q) >> 16) >> 16 <= k_max``."""
    bits = MULT_CHUNK + 1
    while (((-(1 << (bits - 1))) * LOG2E_Q) >> CONST_FRAC) >> ACT_FRAC > k_max:
        bits += 1
    return bits


#: The table units' functions, by their names in :data:`hw.timing.VECTOR_LATENCY`.
_RECIP, _RSQRT = "recip", "rsqrt"


def _table_stages(funcs: tuple[str, ...]) -> tuple[list, dict[str, list]]:
    """The stages of a table unit of ``funcs`` (``("recip",)``, ``("rsqrt",)`` or both, an
    element of the second flagged ``rsqrt`` in the first stage's input): the seven the
    functions share (an element's function selects its mantissa, ``sh`` and table words in
    stage 4), and each function's after them, by name (:class:`Recip`, :class:`Rsqrt`)."""
    both = len(funcs) > 1
    r0_bits = max(int((RECIP_LUT if f == _RECIP else RSQRT_LUT).max()).bit_length()
                  for f in funcs)
    p_bits = MANT_BITS + r0_bits
    t_shift = MANT_BITS
    q_const = 3 << (2 * RSQRT_FRAC - MANT_BITS)
    r_shift = 2 * RSQRT_FRAC - MANT_BITS + 1

    def table(m, func, mant):
        """``func``'s table word at mantissa ``mant`` (a reciprocal's by the 6 bits after
        its leading one; an rsqrt's by 7 over its two octaves, the first 32 words unused)."""
        if func == _RECIP:
            return rom(m, "recip_lut", RECIP_LUT, mant[_IDX_LO:MANT_BITS - 1])
        unused = 2 ** (LUT_BITS - 1)   # indices below the table's first octave
        return rom(m, "rsqrt_lut", [0] * unused + [int(x) for x in RSQRT_LUT], mant[_IDX_LO:])

    def fields(v, func):
        """``func``'s mantissa and ``sh`` from the normalised ``y`` and ``lz``."""
        top = TABLE_IN_BITS - MANT_BITS
        if func == _RECIP:
            return v.y[top:], TABLE_IN_BITS + RECIP_FRAC - MANT_BITS - v.lz
        n = (TABLE_IN_BITS - v.lz).as_signed()
        odd = n[0]
        e = n - MANT_BITS + odd
        return Mux(odd, v.y[top + 1:], v.y[top:]), RSQRT_FRAC + (e >> 1)

    def s3(m, v):
        (mant, sh), *other = [fields(v, f) for f in funcs]
        if both:
            ((mant_rs, sh_rs),) = other
            mant, sh = Mux(v.rsqrt, mant_rs, mant), Mux(v.rsqrt, sh_rs, sh)
        # (both: each table at the element's mantissa, the function's word selected before
        # the register: two small tables in logic, not one block RAM before a multiplier)
        r0, *r0_other = [table(m, f, mant) for f in funcs]
        if both:
            r0 = Mux(v.rsqrt, r0_other[0], r0)
        return {"m": (mant, unsigned(MANT_BITS)), "sh": (sh, unsigned(SH_BITS)),
                "r0": (r0, unsigned(r0_bits))}

    def s4(m, v):
        return {"p": dsp_product(v.m * v.r0, unsigned(p_bits)), "r0": v.r0, "sh": v.sh}

    def s5(m, v):
        return {**partial_products(v.r0, v.p), "r0": v.r0, "sh": v.sh}

    def s6(m, v):
        # r0 * p: a reciprocal's r0 * (2**32 - p) is r0 * 2**32 less it; an rsqrt's t its top
        s = sum_partial_products(v)
        out = {"r0": v.r0, "sh": v.sh}
        if _RECIP in funcs:
            out["s"] = (s, unsigned(p_bits + r0_bits))
        if _RSQRT in funcs:
            out["q"] = (q_const - (s >> t_shift), unsigned(q_const.bit_length()))
        return out

    def recip_r(m, v):
        r = ((v.r0 << (RECIP_FRAC + 1)) - v.s) >> RECIP_FRAC
        return {"r": (r, unsigned(TABLE_RESULT_BITS)), "sh": v.sh}

    def rsqrt_q(m, v):
        return {**partial_products(v.r0, v.q), "sh": v.sh}

    def rsqrt_r(m, v):
        return {"r": (sum_partial_products(v) >> r_shift, unsigned(TABLE_RESULT_BITS)),
                "sh": v.sh}

    normalise = _normalise_stages()
    if both:
        normalise = [beside(stage, "rsqrt") for stage in normalise]
    finals = {_RECIP: [recip_r], _RSQRT: [rsqrt_q, rsqrt_r]}
    return [*normalise, s3, s4, s5, s6], {f: finals[f] for f in funcs}


class Recip(PipelineUnit):
    """Reciprocal of ``1 <= x < 2**53``: ``(r, sh)`` with ``1/x ~= r / 2**sh``, exactly
    :func:`hw.numerics.vec_recip` (``x = 0`` gives the result of ``x = 1``).

    Pipeline (``n = 53 - lz`` the bit length)::

        1-3   y = x << lz (leading one at bit 52), two shift levels per stage
        4     m = y[37:53] (= x >> (n - 16), flooring, or x << (16 - n)); sh = n + 15;
              r0 = RECIP_LUT[m[9:15]] (the 6 bits after the leading one)
        5     p = m * r0                         16 x 16 bits
        6     r0 * p[0:17], r0 * p[17:32]        partial products
        7     s = r0 * p                         their sum
        8     r = (r0 * 2**32 - s) >> 31         (r0 * (2**32 - p)) >> 31

    Cost: three 18x18 multipliers (one for ``m * r0``, two for ``r0 * p``), the table (64
    words of 16 bits) and the normalising shifter.

    Parameters
    ----------
    rsqrt:
        The unit is :class:`Rsqrt` too, on its port ``rsqrt`` (``ports["rsqrt"]``: members
        ``rsqrt_i`` and ``rsqrt_o``, Rsqrt's layouts and latency, a stage more): stages 1 to
        6 are both functions' (Rsqrt's ``a = m * r0`` is ``p``, its ``r0 * a`` ``r0 * p``;
        an element's function selects its mantissa, ``sh`` and table word), stage 7 forms
        Recip's ``s`` and Rsqrt's ``q`` from one sum, then Recip's stage 8 lies beside
        Rsqrt's last two. An element is taken from one input a cycle, never from both
        (``rsqrt_i``'s when it is valid); elements of the two may follow each other in any
        order. Cost: Rsqrt's five multipliers, one normaliser, both tables.

    Members
    -------
    i: In(stream.Signature(table_in_layout()))
    o: Out(stream.Signature(table_out_layout()))
    rsqrt_i, rsqrt_o: with ``rsqrt``, Rsqrt's ``i`` and ``o``
    """

    NAME = _RECIP

    def __init__(self, *, rsqrt: bool = False):
        self._funcs = (_RECIP, _RSQRT) if rsqrt else (_RECIP,)
        shared, finals = _table_stages(self._funcs)
        ports = ({_RSQRT: (table_in_layout(), table_out_layout(),
                           len(shared) + len(finals[_RSQRT]))} if rsqrt else None)
        super().__init__(table_in_layout(), table_out_layout(), ports)

    def _stages(self):
        shared, finals = _table_stages(self._funcs)
        return [*shared, *finals[_RECIP]]

    def elaborate(self, platform):
        if not self.ports:
            return super().elaborate(platform)
        m = Module()
        en = self._enable(m)
        port = self.ports[_RSQRT]
        shared, finals = _table_stages(self._funcs)
        first = SimpleNamespace(x=Mux(port.i.valid, port.i.payload.x, self.i.payload.x),
                                rsqrt=port.i.valid)
        v = build_pipeline(m, en, first, shared)
        for func, i, o in ((_RECIP, self.i, self.o), (_RSQRT, port.i, port.o)):
            valid = valid_delay(m, en, i.valid, len(shared) + len(finals[func]),
                                f"{func}_valid")
            self._output(m, o, valid, build_pipeline(m, en, v, finals[func]))
        return m


class Rsqrt(PipelineUnit):
    """Reciprocal square root of ``1 <= x < 2**53``: ``(r, sh)`` with ``1/sqrt(x) ~= r /
    2**sh``, exactly :func:`hw.numerics.vec_rsqrt` (``x = 0`` gives the result of ``x = 1``).

    Pipeline (``n = 53 - lz`` the bit length, ``e = n - 16 + (n & 1)`` the even shift)::

        1-3   y = x << lz (leading one at bit 52), two shift levels per stage
        4     m = x >> e (= y[37:53], or y[38:53] for odd n); sh = 23 + e / 2;
              r0 = RSQRT_LUT[(m >> 9) - 32] (a table of 128 words, the first 32 unused)
        5     p = m * r0                         16 x 16 bits
        6     r0 * p[0:17], r0 * p[17:32]        partial products
        7     t = (p * r0) >> 16 (their sum); q = 3 * 2**30 - t    32 bits, positive
        8     r0 * q[0:17], r0 * q[17:32]        partial products
        9     r = (r0 * q) >> 31                 their sum

    Cost: five 18x18 multipliers (one, two, two), the table and the normalising shifter.
    (``Recip(rsqrt=True)`` is both units on Rsqrt's multipliers.)

    Members
    -------
    i: In(stream.Signature(table_in_layout()))
    o: Out(stream.Signature(table_out_layout()))
    """

    NAME = _RSQRT

    def __init__(self):
        super().__init__(table_in_layout(), table_out_layout())

    def _stages(self):
        shared, finals = _table_stages((_RSQRT,))
        return [*shared, *finals[_RSQRT]]


class Exp(PipelineUnit):
    """``exp(a - b)`` for ``a <= b`` (activations; ``d = a - b`` in ``(-2**32, 0]``, the
    domain of :func:`hw.numerics.vec_exp`), with ``frac`` fraction bits: exactly
    ``vec_exp(a - b, frac)``, a value in ``[0, 2**frac]`` (unspecified for ``a > b``). Softmax
    feeds ``(x, max)``; the SiLU-gate ``(min(g, 0), max(g, 0))``, whose difference is
    ``-|g|``. ``P_BITS`` below is the bit length of the largest ``p`` the table allows.

    Pipeline (``D`` the fewest bits of ``d`` below whose range every result is 0: 21 for
    ``frac`` 16, 22 for 30; ``d`` is clamped to ``-2**(D - 1)``, whose result is 0 too)::

        1  d = max(a - b, -2**(D - 1))                  D bits
        2  d[0:17] * LOG2E_Q, d[17:D] * LOG2E_Q         partial products, the second a
                                                        table of the 2**(D - 17) values
        3  u = (d * LOG2E_Q) >> 16                      their sum, flooring
        4  k = u >> 16, f = u & 0xFFFF; t = EXP2_LUT[f >> 10], tL = t * LN2_Q (a table
           beside it), lo = f & 0x3FF; s = min(16 - frac - k, P_BITS + 1)
                                                        (any larger shift gives 0 as well)
        5  lo * tL[0:17], lo * tL[17:33]                partial products
        6  q >> 31, q = tL * lo = t * lo * LN2_Q        their sum
        7  p = t + round_shift(q, 32)                   in [2**16, 2**P_BITS)
        8  w = (2 * p) >> s, or 2 * (p << -s) when frac > 16 and s < 0
        9  y = (w + 1) >> 1                             round_shift(p, s)

    Cost: three 18x18 multipliers (one for ``d * LOG2E_Q``, two for ``tL * lo``), the
    tables (64 words of 17 and of 33 bits, 16 or 32 of ``d``'s high products) and a
    rounding shifter of ``p``.

    Parameters
    ----------
    frac:
        Fraction bits of the result: :data:`hw.numerics.ACT_FRAC` (16, softmax) or
        :data:`hw.numerics.NORM_FRAC` (30, SiLU-gate); any value from 16 to 30. Or a tuple
        of them: a unit of several uses that share its multipliers and table, one at a
        time. The input then has a ``mode`` field, the index of its element's ``frac``,
        which selects the constants of stage 4's shift ``s``; ``y`` is as wide as the
        largest ``frac``'s.

    Members
    -------
    i: In(stream.Signature(StructLayout({"a": signed(32), "b": signed(32)})))
        (and ``"mode": range(len(frac))`` with several)
    o: Out(stream.Signature(StructLayout({"y": unsigned(frac + 1)})))
    """

    NAME = "exp"

    def __init__(self, frac: int | tuple[int, ...] = ACT_FRAC):
        fracs = frac if isinstance(frac, tuple) else (frac,)
        if not fracs:
            raise ValueError("exp frac must name at least one fraction")
        for f in fracs:
            if not isinstance(f, int) or not ACT_FRAC <= f <= NORM_FRAC:
                raise ValueError(f"exp frac must be an integer in [{ACT_FRAC}, {NORM_FRAC}], "
                                 f"got {f!r}")
        self.fracs = fracs
        self.frac = fracs[0]
        mode = {"mode": range(len(fracs))} if len(fracs) > 1 else {}
        super().__init__(data.StructLayout({"a": signed(ACT_BITS), "b": signed(ACT_BITS),
                                            **mode}),
                         data.StructLayout({"y": unsigned(max(fracs) + 1)}))

    def _stages(self):
        fracs = self.fracs
        several = len(fracs) > 1
        frac = max(fracs)   # the widest result, the largest left shift
        lo_bits = ACT_FRAC - LUT_BITS
        t_max = int(EXP2_LUT.max())
        p_max = t_max + int(np_round_shift(t_max * ((1 << lo_bits) - 1) * LN2_Q,
                                           ACT_FRAC + CONST_FRAC))
        p_bits = p_max.bit_length()
        d_bits = ACT_BITS + 1
        u_bits = d_bits + LOG2E_Q.bit_length() - CONST_FRAC
        s_min, s_max = ACT_FRAC - frac, p_bits + 1
        s_shape = signed_range(s_min, s_max)
        tl_bits = p_bits + lo_bits
        # (several fracs: the mode travels to stage 4, which selects 16 - frac; stages 7 and
        # 8 are the largest frac's, whose left shifts a smaller frac's s >= 0 never takes)
        offsets = [ACT_FRAC - f for f in fracs]

        def carry(v):
            return {"mode": v.mode} if several else {}

        # d * LOG2E_Q: every d below -2**(d_keep - 1) gives 0 (k <= offset - s_max: the
        # shift s_max of p < 2**P_BITS), as -2**(d_keep - 1) does, so d is clamped to it as
        # it is formed (no logic before the multiplier): its low MULT_CHUNK bits on one
        # multiplier, the few above them a table of their products.
        d_keep = _exp_operand_bits(min(offsets) - s_max)
        hi_bits = d_keep - MULT_CHUNK
        hi_signed = [(h - (h >> (hi_bits - 1) << hi_bits)) * LOG2E_Q for h in range(1 << hi_bits)]
        hi_shape = signed_range(min(hi_signed), max(hi_signed))
        hi_products = [x % (1 << hi_shape.width) for x in hi_signed]

        def s1(m, v):
            d = (v.a - v.b).as_signed()
            clamp = d[-1] & ~d[d_keep - 1:].all()
            return {"d": (Mux(clamp, -(1 << (d_keep - 1)), d[:d_keep].as_signed()),
                          signed(d_keep)), **carry(v)}

        def s2(m, v):
            lo, hi = v.d[:MULT_CHUNK], v.d[MULT_CHUNK:]
            hi_product = rom(m, "log2e_hi", hi_products, hi).as_signed()
            return {"pp0": dsp_product(lo * LOG2E_Q), "pp1": (hi_product, hi_shape),
                    **carry(v)}

        def s2b(m, v):
            return {"u": (sum_partial_products(v) >> CONST_FRAC, signed(u_bits)), **carry(v)}

        def s3(m, v):
            k = v.u[ACT_FRAC:].as_signed()
            f = v.u[:ACT_FRAC]
            t = rom(m, "exp2_lut", EXP2_LUT, f[lo_bits:])
            t_ln2 = rom(m, "exp2_ln2_lut", EXP2_LUT * LN2_Q, f[lo_bits:])
            # min(16 - frac - k, s_max): a compare of k with a constant beside a subtraction
            # as narrow as the result (which fits it whenever it is selected).
            big = [k < o - s_max for o in offsets]
            offset = [Const(o, s_shape) for o in offsets]
            if several:
                big, offset = select_mode(v.mode, big), select_mode(v.mode, offset)
            else:
                big, offset = big[0], offsets[0]
            s_narrow = offset - k[:s_shape.width].as_signed()
            return {"t": (t, unsigned(p_bits)), "t_ln2": t_ln2, "lo": f[:lo_bits],
                    "s": (Mux(big, s_max, s_narrow), s_shape)}

        # q = t * lo * LN2_Q as (t * LN2_Q, a table beside t's) * lo: two multipliers for
        # the 10 x 33 bits, not one for t * lo and two for its 27 x 16-bit product
        def s4(m, v):
            return {**partial_products(v.lo, v.t_ln2), "t": v.t, "s": v.s}

        q_shift = ACT_FRAC + CONST_FRAC

        def s5(m, v):
            # only q's bits from 31 up: p's rounding below reads no other
            q = sum_partial_products(v)
            return {"q": (q >> (q_shift - 1), unsigned(tl_bits + CONST_FRAC - q_shift + 1)),
                    "t": v.t, "s": v.s}

        def s6(m, v):
            # t + round_shift(q, 32) is (2t + 1 + (q >> 31)) >> 1 (nested floors; 2t even):
            # the rounding constant is the low bit beside t, two adders in series, not three.
            p = (Cat(Const(1, 1), v.t) + v.q) >> 1
            return {"p": (p, unsigned(p_bits)), "s": v.s}

        left = frac - ACT_FRAC

        def s7(m, v):
            # round_shift(p, s) is (w + 1) >> 1 with w = (2 * p) >> s, or 2 * (p << -s) for
            # s < 0 (even: the increment then changes nothing) (hw.vector.base.round_shift).
            twice = Cat(Const(0, 1), v.p)
            right = twice >> v.s[:-1].as_unsigned()
            if left:
                amount = (-v.s)[:left.bit_length()].as_unsigned()
                w = Mux(v.s[-1], Cat(Const(0, 1), v.p << amount), right)
            else:
                w = right
            return {"w": (w, unsigned(p_bits + 1 + left))}

        def s8(m, v):
            return {"y": ((v.w + 1) >> 1, unsigned(frac + 1))}

        return [s1, s2, s2b, s3, s4, s5, s6, s7, s8]
