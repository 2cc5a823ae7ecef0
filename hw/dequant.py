"""Dequantisation unit: one packed weight field to the integer weight a PE multiplies.

The arithmetic is that of :func:`sim.functional.decode_gemm_weights` (docs/architecture.md,
"Numerics")::

    w = code * q            symmetric: q = the low `bits` of the field, two's complement
    w = code * (u - zero)   asymmetric: u and zero unsigned `bits`-bit values
    w = q                   raw (no group headers): code = 1, zero = 0

where ``bits`` is 8 for INT8 instructions and 4 otherwise, ``code`` keeps the low
``cfg.scale_code_bits`` bits of its header byte and ``zero`` the low ``bits`` bits of its byte.
The result always fits ``cfg.weight_operand_bits`` signed bits.

The unit's multiplier is also lent to the INT8 epilogue, which runs while the decoder is idle:
with ``ext`` high, the product register takes ``ext_a * ext_b`` two cycles later (the high
accumulator slice times the lane's multiplier; see :mod:`hw.pe`, "Multiplier sharing").
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Shape, Signal, Value, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.config import AcceleratorConfig
from hw.ecp5_dsp import DSP_REGISTER
from hw.pe import MULT_BITS, hi_slice_bits

__all__ = ["Dequant", "dequant_reference", "field_number", "field_value", "hi_product_shape"]


def hi_product_shape(cfg: AcceleratorConfig) -> Shape:
    """Shape of the Dequant multiplier's output: weights and epilogue high partial products."""
    return signed(max(cfg.weight_operand_bits, hi_slice_bits(cfg) + MULT_BITS + 1))


def field_value(value: int, bits: int, asym: bool) -> int:
    """The low ``bits`` of a field's bit pattern as a number: two's complement, or unsigned
    when ``asym`` (:func:`field_number` in the RTL)."""
    q = value & ((1 << bits) - 1)
    return q - (1 << bits) if not asym and q >= 1 << (bits - 1) else q


def field_number(field: Value, bits: int, asym: Value, width: int) -> Value:
    """:func:`field_value` of the Amaranth value ``field``, as ``width`` signed bits: the
    decoder extends each field format's value for :attr:`Dequant.q`."""
    return Cat(field[:bits], (field[bits - 1] & ~asym).replicate(width - bits)).as_signed()


def dequant_reference(value: int, code: int, zero: int, *, int8: bool, asym: bool, raw: bool,
                      cfg: AcceleratorConfig) -> int:
    """Python model of the decoder's field extraction and :class:`Dequant` (the per-element
    rule of ``decode_gemm_weights``).

    ``value``, ``code`` and ``zero`` are raw unsigned bit patterns: the field (its low 8 or 4
    bits), and the unit's code and zero inputs; the unit's ``q`` is ``field_value(value)``.
    """
    bits = 8 if int8 else 4
    q = field_value(value, bits, asym)
    if raw:
        return q
    code &= (1 << cfg.scale_code_bits) - 1
    return code * (q - (zero & ((1 << bits) - 1) if asym else 0))


class Dequant(wiring.Component):
    """Pipelined dequantiser for one lane: inputs in cycle ``x``, ``w`` valid in ``x + 2``.

    Stage 1 forms the signed difference ``q - zero`` (and the effective code), stage 2 the
    product. Both stages are registered so the unit sits between the decoder's field extraction
    and the PE without lengthening either path.

    Parameters
    ----------
    cfg:
        The accelerator configuration (value, code and operand widths).

    Members
    -------
    q: In(signed(max(cfg.weight_bits) + 1))
        The field's value as a number (:func:`field_number`: two's complement, or unsigned
        when ``asym``), extended by the decoder, whose field multiplexer picks it per format.
    code: In(cfg.scale_code_bits)
        Group scale code (ignored when ``raw``).
    zero: In(max(cfg.weight_bits))
        Group zero point (used when ``asym`` and not ``raw``).
    int8, asym, raw: In(1)
        Instruction mode: 8-bit values (the zero point's width), asymmetric, no group headers.
    w: Out(signed(cfg.weight_operand_bits))
        ``code * (q - zero)``, two cycles after the inputs.
    ext: In(1)
        Lend the multiplier: with ``ext`` high in cycle ``e``, ``prod`` in ``e + 2`` is
        ``ext_a * ext_b`` (both sampled in ``e``).
    ext_a: In(signed(hi_slice_bits(cfg)))
        High accumulator slice.
    ext_b: In(MULT_BITS)
        Requantisation multiplier.
    prod: Out(hi_product_shape(cfg))
        The multiplier's output register (``w`` is its low bits).
    """

    #: Cycles from the inputs to ``w``.
    LATENCY = 2

    def __init__(self, cfg: AcceleratorConfig):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        self._cfg = cfg
        vbits = max(cfg.weight_bits)
        super().__init__({
            "q": In(signed(vbits + 1)),
            "code": In(cfg.scale_code_bits),
            "zero": In(vbits),
            "int8": In(1),
            "asym": In(1),
            "raw": In(1),
            "w": Out(signed(cfg.weight_operand_bits)),
            "ext": In(1),
            "ext_a": In(signed(hi_slice_bits(cfg))),
            "ext_b": In(MULT_BITS),
            "prod": Out(hi_product_shape(cfg)),
        })

    @property
    def cfg(self) -> AcceleratorConfig:
        return self._cfg

    def elaborate(self, platform):
        m = Module()
        cfg = self._cfg
        vbits = max(cfg.weight_bits)
        int8 = self.int8 if vbits == 8 else 0  # INT8 unsupported: dispatch rejects it anyway

        # Stage 1: the multiplier's operands, registered beside it, so that nothing but a
        # route lies between a flip-flop and the DSP: the scale code and the field's number
        # minus the zero point, or (`ext`) the borrowed accumulator slice and the epilogue's
        # multiplier. Datapath only: nothing here is reset by `start` (hw/top.py, "Reset");
        # `ext` comes from a copy per group of lanes (hw.epilogue `hi_en`). The field arrives
        # as a number (the decoder's format multiplexer extends it, no mode multiplexer here:
        # the path from the decoder's registered word to b was the 2x8 array's critical one).
        zero = Mux(self.asym & ~self.raw, Mux(int8, self.zero[:vbits], self.zero[:4]), 0)
        # b is the field minus the zero point, or `ext_b - 0`: `ext` picks the subtraction's
        # operands, not its result, so that no LUT follows the carry chain. Both fit b:
        # |q - zero| < 2**(bits+1).
        code = Mux(self.raw, 1, self.code)
        a_in = Mux(self.ext, self.ext_a, code)
        b_in = Mux(self.ext, self.ext_b, self.q) - Mux(self.ext, 0, zero)
        a = Signal(a_in.shape(), reset_less=True)
        b = Signal(signed(max(MULT_BITS + 1, vbits + 2)), reset_less=True)
        m.d.sync += [a.eq(a_in), b.eq(b_in)]

        # Stage 2: the product; |code * (q - zero)| <= code_max * (2**bits - 1) fits the operand.
        prod = Signal.like(self.prod, reset_less=True, attrs={DSP_REGISTER: 1})
        m.d.sync += prod.eq(a * b)
        m.d.comb += [self.prod.eq(prod), self.w.eq(prod)]
        return m
