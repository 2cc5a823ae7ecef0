"""The vector unit's dequantisation factor: from a DEQUANT channel word and a row's ``amax`` to
the ``(r, sh)`` operand of a :class:`~hw.vector.elementwise.Scale` (frac
:data:`DEQUANT_SCALE_FRAC`), bit-exact with :func:`hw.numerics.vec_dequant_factor`, and the
same factor as a channel word (:func:`hw.numerics.vec_channel`). One element per cycle.
"""

from __future__ import annotations

from amaranth import Cat, Const, Mux, unsigned
from amaranth.lib import data

from hw.numerics import (
    DEQUANT_EXP_BITS,
    DEQUANT_LEFT_MAX,
    DEQUANT_MANT_BITS,
    DEQUANT_SH_MAX,
    DEQUANT_WORD_BITS,
    FOLD_AMAX_SHIFT_BITS,
    MANT_BITS,
)
from hw.vector.base import PipelineUnit, partial_products, signed_range, sum_partial_products
from hw.vector.tables import SH_BITS, SH_MIN, TABLE_RESULT_BITS

__all__ = ["DequantFactor", "DEQUANT_SCALE_FRAC", "AMAX_BITS"]

#: The ``frac`` of the :class:`~hw.vector.elementwise.Scale` that takes the factor: its
#: smallest ``sh`` (:data:`~hw.vector.tables.SH_MIN`) is the largest left shift,
#: :data:`hw.numerics.DEQUANT_LEFT_MAX`.
DEQUANT_SCALE_FRAC = SH_MIN + DEQUANT_LEFT_MAX
#: An ``amax`` word: unsigned 32 bits (as REQUANT writes it).
AMAX_BITS = 32
_WORD_BITS = DEQUANT_WORD_BITS

if TABLE_RESULT_BITS != DEQUANT_MANT_BITS:
    raise ValueError(f"the factor q has {DEQUANT_MANT_BITS} bits, Scale's r "
                     f"{TABLE_RESULT_BITS}")
if DEQUANT_SCALE_FRAC + DEQUANT_SH_MAX >= 1 << SH_BITS:
    raise ValueError(f"sh = {DEQUANT_SH_MAX} + {DEQUANT_SCALE_FRAC} does not fit Scale's "
                     f"{SH_BITS}-bit sh")


class DequantFactor(PipelineUnit):
    """``(r, sh)`` with ``r = q`` and ``sh = sh_q + DEQUANT_SCALE_FRAC`` for ``(q, sh_q) =
    vec_dequant_factor(chan, amax, shift)`` (:func:`hw.numerics.vec_dequant_factor`): then
    ``Scale(DEQUANT_SCALE_FRAC)(acc, r, sh)`` is :func:`hw.numerics.vec_dequant`.

    The row's scalars are the sequencer's: ``a`` is the row's ``amax`` (or
    :data:`hw.numerics.DEQUANT_ZERO_AMAX` for 0), ``b`` its bit length (1..32) and ``x`` its
    shift (0 but for a FOLD amax word, :func:`hw.numerics.fold_amax_fields`).

    Pipeline: 1 the partial products of ``m * a`` (``m`` the word's 17-bit mantissa),
    ``b - 1`` and ``E + F - x`` (``F`` the Scale's frac); 2 ``p``, their sum (below 2**49); 3
    ``t = (2 * p) >> (b - 1)`` and ``E + F - b + 1``; 4 with ``k = b - 1 + p[b + 16]``
    (``p[b + 16]`` is ``t[18]``), ``w = (2 * p) >> k`` (``t`` or ``t >> 1``) and ``d = E - k +
    F``; 5 ``q = min((w + 1) >> 1, 2**17 - 1)`` and ``sh = clip(d, F - 15, F + 63)`` (``E -
    k`` clipped to [-15, 63], plus ``F``); beside them ``word``, the factor as a channel word:
    ``q | (d - F) << 17``, or for ``d < F`` the largest word ``2**17 - 1`` (0 for ``q = 0``)
    (with ``x = 0``, :func:`hw.numerics.vec_channel`; CHANNEL writes it).

    Cost: two 18x18 multipliers (17 x 32 bits), a 50-bit shifter.

    Members
    -------
    i: In(stream.Signature(StructLayout({"chan": unsigned(32), "a": unsigned(32),
                                         "b": unsigned(6), "x": unsigned(5)})))
    o: Out(stream.Signature(StructLayout({"r": unsigned(17), "sh": unsigned(7),
                                          "word": unsigned(24)})))
    """

    NAME = "dequant_factor"

    def __init__(self):
        super().__init__(data.StructLayout({"chan": unsigned(32), "a": unsigned(AMAX_BITS),
                                            "b": range(AMAX_BITS + 1),
                                            "x": unsigned(FOLD_AMAX_SHIFT_BITS)}),
                         data.StructLayout({"r": unsigned(TABLE_RESULT_BITS),
                                            "sh": unsigned(SH_BITS),
                                            "word": unsigned(_WORD_BITS)}))

    def _stages(self):
        p_bits = DEQUANT_MANT_BITS + AMAX_BITS
        k_bits = AMAX_BITS.bit_length()              # k in [0, 32]
        frac = DEQUANT_SCALE_FRAC
        # d = E - k - x + frac, with E - k - x in [-63, 127]: the Scale's sh before its
        # clipping
        x_max = (1 << FOLD_AMAX_SHIFT_BITS) - 1
        d_shape = signed_range(frac - AMAX_BITS - x_max, (1 << DEQUANT_EXP_BITS) - 1 + frac)
        e_shape = signed_range(frac - x_max, (1 << DEQUANT_EXP_BITS) - 1 + frac)
        q_max = (1 << DEQUANT_MANT_BITS) - 1

        def s1(m, v):
            mant = v.chan[:DEQUANT_MANT_BITS]
            return {**partial_products(mant, v.a),
                    "e": (v.chan[DEQUANT_MANT_BITS:_WORD_BITS] + frac - v.x, e_shape),
                    "b1": ((v.b - 1)[:k_bits], unsigned(k_bits))}

        def s1b(m, v):
            return {"p": (sum_partial_products(v), unsigned(p_bits)), "e": v.e, "b1": v.b1}

        def s2(m, v):
            return {"t": ((Cat(Const(0, 1), v.p) >> v.b1), unsigned(p_bits + 1)),
                    "d": (v.e - v.b1, d_shape)}

        def s3(m, v):
            # p's bit b + MANT_BITS is t's bit MANT_BITS + 2 (t = 2p >> (b - 1)); with it set,
            # k = b and w = t >> 1.
            bit = v.t[MANT_BITS + 2]
            return {"w": (Mux(bit, v.t >> 1, v.t), unsigned(p_bits + 1)),
                    "d": (v.d - bit, d_shape)}

        def s4(m, v):
            q = (v.w + 1) >> 1
            r = Mux(q > q_max, q_max, q)[:TABLE_RESULT_BITS]
            lo, hi = frac - DEQUANT_LEFT_MAX, frac + DEQUANT_SH_MAX
            # The channel word of r * 2**-(d - F), d - F <= 127 (E <= 127, k >= 0, x >= 0);
            # below 0 no word holds it: the largest one (0 for r = 0).
            e = (v.d - frac).as_signed()
            word = Mux(e < 0, Mux(r.any(), q_max, 0), Cat(r, e[:DEQUANT_EXP_BITS]))
            return {"r": (r, unsigned(TABLE_RESULT_BITS)),
                    "sh": (Mux(v.d < lo, lo, Mux(v.d > hi, hi, v.d)), unsigned(SH_BITS)),
                    "word": (word, unsigned(_WORD_BITS))}

        return [s1, s1b, s2, s3, s4]
