"""The vector unit's function units: small pipelined components that compute the primitives of
the "vector unit" section of :mod:`hw.numerics` bit for bit, one element per cycle.

Every unit is a :class:`amaranth.lib.wiring.Component` with an input stream ``i`` and an
output stream ``o`` (``amaranth.lib.stream``, ``data.StructLayout`` payloads) and a fixed
latency, its entry of :data:`hw.timing.VECTOR_LATENCY` (protocol: :mod:`hw.vector.base`).
Widths derive from the numerics' constants; the tables are the numerics' own arrays.

========================  ======================================================  =========
unit                      computes                                                 numerics
========================  ======================================================  =========
``tables.Recip``          ``(r, sh)``, ``1/x ~= r / 2**sh``                       vec_recip
``tables.Rsqrt``          ``(r, sh)``, ``1/sqrt(x) ~= r / 2**sh``                 vec_rsqrt
``tables.Exp(frac)``      ``exp(a - b)``, ``frac`` fraction bits (16 or 30)       vec_exp
``reduce.Sum``            sum of a row                                            vec_sum
``reduce.Max``            max of a row                                            vec_max
``reduce.AbsMax``         ``max |x|`` of a row                                    (amax)
``reduce.ArgMax``         first index of the max of a row, and the max            vec_argmax
``reduce.SumSq``          ``sum (x >> s)**2`` of a row                            vec_sumsq
``elementwise.Add``       ``sat32(a + b)``                                        vec_add
``elementwise.Mul(frac)`` ``sat32(round_shift(a * b, frac))``                     vec_mul
``Mul(0, y_bits=54)``     ``sat54(a * b)``                                        vec_fold
``elementwise.Rope``      ``sat32(round_shift(x * cos + rot * sin, 14))``         vec_rope
``elementwise.Scale(f)``  ``sat32(round_shift(x * r, sh - f))``                   (steps)
``elementwise.Requant``   ``clip(round_shift((x >> s) * 127 * r, sh), +-127)``    vec_requant
``dequant.DequantFactor`` ``(q, sh)`` of a channel word and a row's amax          vec_dequant_factor
                          (and that factor as a channel word)                     vec_channel
========================  ======================================================  =========

Composites
----------
The composite ops are sequences of these over the passes of a row. Between passes, a few
per-row scalars (a bit length, a shift, an add) are the sequencer's; they are written out
below as the numerics define them. ``tests/hw/test_vector_composite.py`` runs each sequence
through the units and compares with :mod:`hw.numerics` bit for bit.

Softmax of a row ``x`` over its valid positions (:func:`hw.numerics.vec_softmax`)::

    pass 1   m = Max(x[valid])
    pass 2   e = Exp(16)(x, m) at the valid positions (0 at the others); S = Sum(e)
    scalar   (r, sh) = Recip(S)                       (S = 0, no valid position: any result)
    pass 3   p = Scale(16)(e, r, sh)                  (over e, not x)

RMSNorm of ``x`` with weight ``w`` and epsilon ``eps`` (:func:`hw.numerics.vec_rmsnorm`)::

    pass 1   amax = AbsMax(x)       (or beside the op that wrote x)
    scalar   s = max(0, bitlen(amax) - 17)
    pass 2   ss = SumSq(x, s)
    scalar   ss += eps >> 2s;  (r, sh) = Rsqrt(ss)   (ss = 0 only for a zero row: any result)
    pass 3   n = Scale(30)(x, r, sh + s);  y = Mul(30, b_bits=33)(n, w)

INT8 requantisation of a row (:func:`hw.numerics.vec_requant`)::

    pass 1   amax = AbsMax(x)
    scalar   s = max(0, bitlen(amax) - 31);  (r, sh) = Recip(amax >> s)
    pass 2   a = Requant(x, r, sh, s)                 (scale: hw.numerics.act_scale(amax))

The values prologue of probabilities ``a`` and value codes ``c`` (:func:`hw.numerics.vec_fold`),
INT8 requantisation of the products, computed again in the second pass::

    pass 1   w = Mul(0, y54)(a, c);  amax = AbsMax(w)
    scalar   s = max(0, bitlen(amax) - 31);  (r, sh) = Recip(amax >> s)
    pass 2   w = Mul(0, y54)(a, c);  a = Requant(54)(w, r, sh, s)

Dequantisation of a GEMM's accumulators ``acc`` with channel words ``c`` and the ``amax`` of
the GEMM's input row (:func:`hw.numerics.vec_dequant`), elementwise::

    scalar   A = amax or 127 * 2**16;  b = bitlen(A)   (once per row, as amax is read)
    (r, sh) = DequantFactor(c, A, b)
    y = Scale(31)(acc, r, sh)

The scores' channel words of a constant channel word ``c`` and a row of amax words ``a``
(:func:`hw.numerics.vec_channel`), elementwise::

    A = a or 127 * 2**16;  b = bitlen(A)              (per element, as it is read)
    word = DequantFactor(c, A, b, 0).word             (q | (E - k) << 17)

SiLU-gate of ``g`` and ``u`` (:func:`hw.numerics.vec_silu_gate`), elementwise::

    e = Exp(30)(min(g, 0), max(g, 0))                 (exp(-|g|))
    (r, sh) = Recip(2**30 + e)                        (a 32-bit add)
    s = Scale(60)(1, r, sh)                           (1 / (1 + e), 30 fraction bits)
    sig = s if g >= 0 else Mul(30)(e, s)
    y = Mul(16)(Mul(30)(g, sig), u)

The vector engine (:mod:`hw.vector.engine`) runs these sequences as VEC instructions
(:class:`hw.isa.VecFunc`), with the scalar steps in its sequencer.

RoPE is one :class:`~hw.vector.elementwise.Rope` pass over a row of heads, each element with
its partner from the other half of its head and the pair's (cos, sin) table word
(:func:`hw.numerics.vec_rope_pairs`); the residual add one
:class:`~hw.vector.elementwise.Add` pass; greedy sampling one
:class:`~hw.vector.reduce.ArgMax` pass over the logits.
"""

from functools import partial

from amaranth import unsigned
from amaranth.lib import wiring

from hw.numerics import ACT_BITS, ACT_FRAC, FOLD_BITS, NORM_FRAC
from hw.vector.dequant import DEQUANT_SCALE_FRAC, DequantFactor
from hw.vector.elementwise import Add, Mul, Requant, Rope, Scale
from hw.vector.reduce import AbsMax, ArgMax, Max, Sum, SumSq
from hw.vector.tables import Exp, Recip, Rsqrt

__all__ = ["Recip", "Rsqrt", "Exp", "Sum", "Max", "AbsMax", "ArgMax", "SumSq", "Add", "Mul",
           "Rope", "Scale", "Requant", "DequantFactor", "UNITS"]

#: One lane of every unit in the configurations the composites use, by a name for reports
#: (``python -m hw.synth --vector`` synthesises each): reductions over rows up to
#: :data:`hw.vector.base.MAX_ROW` elements. Each entry constructs its unit; its ``func`` is the
#: unit's class.
UNITS: dict[str, partial[wiring.Component]] = {
    "recip": partial(Recip),
    "rsqrt": partial(Rsqrt),
    "exp(16)": partial(Exp, ACT_FRAC),
    "exp(30)": partial(Exp, NORM_FRAC),
    "sum": partial(Sum),
    "sum(exp)": partial(Sum, unsigned(ACT_FRAC + 1)),
    "max": partial(Max),
    "absmax": partial(AbsMax),
    "argmax": partial(ArgMax),
    "sumsq": partial(SumSq),
    "add": partial(Add),
    "mul(16)": partial(Mul, ACT_FRAC),
    "mul(30, w33)": partial(Mul, NORM_FRAC, b_bits=ACT_BITS + 1),
    "rope": partial(Rope),
    "scale(16)": partial(Scale, ACT_FRAC),
    "scale(30)": partial(Scale, NORM_FRAC),
    "requant": partial(Requant),
    "requant(x54)": partial(Requant, FOLD_BITS),
    "mul(0, y54)": partial(Mul, 0, y_bits=FOLD_BITS),
    "dequant_factor": partial(DequantFactor),
    "scale(31)": partial(Scale, DEQUANT_SCALE_FRAC),
}
