"""Proof: the dequantiser equals the golden ``code * (q - zero)`` for every input.

:class:`hw.dequant.Dequant` turns a raw field, a scale code and a zero point into the integer
weight a PE multiplies, two cycles later. The golden rule is that of the weight format
(:meth:`hw.format.QuantizedWeight.int_values`, docs/architecture.md section 3): ``code * q``
(symmetric, ``q`` the two's complement field), ``code * (u - zero)`` (asymmetric) or ``q``
(raw, no group headers), with the field, code and zero widths of the
:class:`~hw.format.WeightFormat` built from the configuration. :func:`golden_weight` evaluates
that rule on ints, numpy arrays or Amaranth values alike; ``tests/prove/test_golden.py`` checks
it against ``QuantizedWeight.int_values`` for every field, code and zero.

One proof per instruction mode (value bits x symmetric/asymmetric x raw): the harness drives the
unit's mode inputs with constants, so the solver works on one datapath at a time, and the
value (extended into the unit's ``q`` by :func:`hw.dequant.field_number`, as the decoder
extends it), code and zero inputs are free in every cycle. Asymmetric raw weights have no golden
value (``WeightFormat`` rejects them and the dispatch rules of hw.isa stop such a GEMM with
BAD_GEMM), so no proof covers that mode.
"""

from __future__ import annotations

from amaranth import Const, Signal
from amaranth.hdl import Assert

from hw.config import AcceleratorConfig
from hw.dequant import Dequant, field_number
from hw.format import WeightFormat

from .flow import Harness, Proof

__all__ = ["golden_weight", "DequantHarness", "proofs"]


def golden_weight(value, code, zero, fmt: WeightFormat):
    """The integer weight of raw field bits ``value`` with ``code`` and ``zero`` in ``fmt``.

    ``value`` holds the field in its low ``fmt.bits`` (higher bits are ignored, as the decoder
    ignores them), ``code`` the scale code in its low ``fmt.code_bits`` and ``zero`` the zero
    point in its low ``fmt.bits``; ints, numpy integer arrays and Amaranth values all work.
    """
    mask = (1 << fmt.bits) - 1
    q = value & mask
    if fmt.qmin < 0:  # two's complement field: flip the sign bit, subtract its weight
        half = 1 << (fmt.bits - 1)
        q = (q ^ half) - half
    if fmt.raw:
        return q
    if not fmt.symmetric:
        q = q - (zero & mask)
    return (code & fmt.code_max) * q


def _formats(cfg: AcceleratorConfig) -> list[WeightFormat]:
    """Every weight format the configuration streams (value bits x sym/asym, raw)."""
    fmts = []
    for bits in sorted(cfg.weight_bits):
        for symmetric in (True, False):
            fmts.append(WeightFormat(bits=bits, symmetric=symmetric,
                                     code_bits=cfg.scale_code_bits))
        fmts.append(WeightFormat(bits=bits, raw=True, code_bits=cfg.scale_code_bits))
    return fmts


def _name(fmt: WeightFormat) -> str:
    kind = "raw" if fmt.raw else ("sym" if fmt.symmetric else "asym")
    return f"int{fmt.bits}_{kind}"


class DequantHarness(Harness):
    """The unit in mode ``fmt``; asserts ``w == golden_weight(inputs two cycles earlier)``."""

    def __init__(self, cfg: AcceleratorConfig, fmt: WeightFormat):
        super().__init__()
        self.cfg, self.fmt = cfg, fmt
        vbits = max(cfg.weight_bits)
        self.value = self.free(vbits, "value")
        self.code = self.free(cfg.scale_code_bits, "code")
        self.zero = self.free(vbits, "zero")

    def elaborate(self, platform):
        m = self.module()
        cfg, fmt = self.cfg, self.fmt
        m.submodules.dut = dut = Dequant(cfg)
        m.d.comb += [
            dut.q.eq(field_number(self.value, fmt.bits, Const(int(not fmt.symmetric)),
                                  len(dut.q))),
            dut.code.eq(self.code), dut.zero.eq(self.zero),
            dut.int8.eq(Const(int(fmt.bits == 8))), dut.asym.eq(Const(int(not fmt.symmetric))),
            dut.raw.eq(Const(int(fmt.raw))), dut.ext.eq(0),
        ]
        # The inputs of Dequant.LATENCY cycles ago, and whether that cycle existed.
        cur = (self.value, self.code, self.zero)
        for k in range(Dequant.LATENCY):
            nxt = tuple(Signal.like(s, name=f"{s.name}_d{k + 1}") for s in cur)
            m.d.sync += [n.eq(c) for n, c in zip(nxt, cur, strict=True)]
            cur = nxt
        age = Signal(range(Dequant.LATENCY + 1))
        with m.If(age != Dequant.LATENCY):
            m.d.sync += age.eq(age + 1)
        with m.If(age == Dequant.LATENCY):
            m.d.comb += Assert(dut.w == golden_weight(*cur, fmt),
                               "Dequant.w != code * (q - zero)")
        return m


def proofs(cfg: AcceleratorConfig) -> list[Proof]:
    """One golden proof per weight format of ``cfg``."""
    depth = Dequant.LATENCY + 1  # the unit's state is its last two cycles of inputs
    out = [Proof(f"dequant_{_name(fmt)}", lambda fmt=fmt: DequantHarness(cfg, fmt), "bmc",
                 depth, f"Dequant w == golden code*(q-zero), {_name(fmt)}, "
                        f"{cfg.scale_code_bits}-bit codes, all inputs")
           for fmt in _formats(cfg)]
    return out
