"""Processing element: one lane of the output-stationary array.

A PE holds one dequantised weight and its in-block index for a whole step (``T`` cycles) and,
each cycle, selects the activation its index names from the broadcast block, multiplies, and
accumulates into the entry of its accumulator file for the current token
(docs/architecture.md, section 1)::

    cycle m     inputs: act block, tok, valid, first     a1 <- act[idx], w1 <- w   (mux)
    cycle m+1                                            p2 <- a1 * w1             (multiply)
    cycle m+2   acc[tok] <- (first ? 0 : acc[tok]) + p2  (accumulate, wraps at acc_bits)

The accumulator file is a :class:`~amaranth.lib.memory.Memory` of ``max_tokens`` entries with
one write port and one *asynchronous* read port: on the ECP5 this maps to distributed RAM
(``max_tokens x acc_bits``: eight DPR16X4 for 16 x 32), whereas registers would cost
``max_tokens * acc_bits`` flip-flops plus a ``max_tokens``:1 read multiplexer per bit, per PE.
The read-add-write of one token happens in one cycle, so back-to-back updates of the same token
(``T = 1``) need no forwarding. The same read port serves the epilogue (``rd_addr``, one cycle
ahead) when no accumulation is in flight, so the file is not duplicated for a second read port;
its address is registered beside the file.

**Multiplier sharing.** The INT8 epilogue needs ``acc * mult`` (``acc_bits`` x 16 bits, two
18x18 DSP multipliers per lane at one token per cycle) just when the array and the decoder are
idle. Rather than giving it 2 x lanes multipliers of its own (the default array would need 256
of the ECP5-85F's 156), it borrows this PE's multiplier for the low ``SLICE_BITS`` of the
accumulator and the lane's :class:`hw.dequant.Dequant` multiplier for the rest. With ``ep``
high in cycle ``e`` (an epilogue read: ``rd_addr`` was presented in ``e - 1``), ``ep_lo`` in
``e + 2`` is ``rd_data[:SLICE_BITS] * ep_mult`` (the slice unsigned).
"""

from __future__ import annotations

from amaranth import Module, Mux, Shape, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.config import AcceleratorConfig
from hw.ecp5_dsp import DSP_REGISTER

__all__ = ["PE", "index_bits", "act_block_layout", "MULT_BITS", "SLICE_BITS", "hi_slice_bits",
           "lo_product_shape"]

#: Width of the unsigned per-lane requantisation multipliers of the INT8 epilogue.
MULT_BITS = 16
#: Accumulator bits multiplied by the PE's multiplier in the epilogue: a 17-bit unsigned slice
#: (18 bits signed) times a 16-bit unsigned multiplier (17 bits signed) fits one 18x18 DSP.
SLICE_BITS = 17


def index_bits(cfg: AcceleratorConfig) -> int:
    """Width of a PE's activation index: it selects one of ``cfg.max_block`` activations."""
    return (cfg.max_block - 1).bit_length()


def hi_slice_bits(cfg: AcceleratorConfig) -> int:
    """Width of the signed accumulator slice above :data:`SLICE_BITS` (the Dequant's share)."""
    return cfg.acc_bits - SLICE_BITS


def lo_product_shape(cfg: AcceleratorConfig) -> Shape:
    """Shape of the PE multiplier's output: MAC products and epilogue low partial products."""
    return signed(max(cfg.weight_operand_bits, SLICE_BITS + 1) + MULT_BITS + 1)


def act_block_layout(cfg: AcceleratorConfig) -> data.ArrayLayout:
    """One broadcast activation block: ``cfg.max_block`` signed ``cfg.act_bits`` values."""
    return data.ArrayLayout(signed(cfg.act_bits), cfg.max_block)


class PE(wiring.Component):
    """One multiply-accumulate lane with a ``max_tokens``-entry accumulator file.

    Parameters
    ----------
    cfg:
        The accelerator configuration.

    Members
    -------
    w_in: In(signed(cfg.weight_operand_bits))
        Dequantised weight of the next step.
    idx_in: In(index_bits(cfg))
        Position of the activation the weight multiplies, inside the block.
    load: In(1)
        Latch ``w_in``/``idx_in``; the PE uses them from the next cycle until the next load.
    act: In(act_block_layout(cfg))
        The activation block of the current token.
    tok: In(range(cfg.max_tokens))
        Token (accumulator entry) of the current cycle.
    valid: In(1)
        The current cycle carries a MAC.
    first: In(1)
        First step of a non-accumulating instruction: overwrite the entry instead of adding.
    rd_addr: In(range(cfg.max_tokens))
        Epilogue read address, one cycle ahead: ``rd_data`` shows entry ``rd_addr`` in the next
        cycle (when no accumulation is in flight).
    rd_data: Out(signed(cfg.acc_bits))
        The entry addressed in the previous cycle.
    ep: In(1)
        Epilogue read: multiply the low slice of ``rd_data`` by ``ep_mult``.
    ep_mult: In(MULT_BITS)
        The lane's requantisation multiplier.
    ep_lo: Out(lo_product_shape(cfg))
        The multiplier's output register: ``acc[:SLICE_BITS] * ep_mult`` two cycles after
        ``ep``.
    """

    #: Cycles from an input MAC to its accumulator entry being readable.
    LATENCY = 3

    def __init__(self, cfg: AcceleratorConfig):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        self._cfg = cfg
        super().__init__({
            "w_in": In(signed(cfg.weight_operand_bits)),
            "idx_in": In(index_bits(cfg)),
            "load": In(1),
            "act": In(act_block_layout(cfg)),
            "tok": In(range(cfg.max_tokens)),
            "valid": In(1),
            "first": In(1),
            "rd_addr": In(range(cfg.max_tokens)),
            "rd_data": Out(signed(cfg.acc_bits)),
            "ep": In(1),
            "ep_mult": In(MULT_BITS),
            "ep_lo": Out(lo_product_shape(cfg)),
        })

    @property
    def cfg(self) -> AcceleratorConfig:
        return self._cfg

    def elaborate(self, platform):
        m = Module()
        cfg = self._cfg
        wshape = signed(cfg.weight_operand_bits)

        # Weight and index held for the whole step.
        w_hold = Signal(wshape, reset_less=True)
        i_hold = Signal(index_bits(cfg), reset_less=True)
        with m.If(self.load):
            m.d.sync += [w_hold.eq(self.w_in), i_hold.eq(self.idx_in)]

        # Stage 1: select the multiplier operands (registered: they feed the DSP directly). An
        # epilogue read takes the low accumulator slice and the multiplier instead.
        m.submodules.acc = acc = Memory(shape=signed(cfg.acc_bits), depth=cfg.max_tokens,
                                        init=[])
        rd = acc.read_port(domain="comb")
        wr = acc.write_port()
        # The control registers (t, v, f) are the same in every PE of a row; `keep` stops Yosys
        # from merging them into one register per row that drives every PE of it (hw.fanout).
        # Only the valid bits are reset by `start` (hw/top.py, "Reset").
        a1 = Signal(signed(MULT_BITS + 1), reset_less=True)
        w1 = Signal(signed(max(cfg.weight_operand_bits, SLICE_BITS + 1)), reset_less=True)
        t1 = Signal.like(self.tok, reset_less=True, attrs={"keep": 1})
        v1 = Signal(attrs={"keep": 1})
        f1 = Signal(reset_less=True, attrs={"keep": 1})
        m.d.sync += [
            a1.eq(Mux(self.ep, self.ep_mult, self.act[i_hold])),
            w1.eq(Mux(self.ep, rd.data.as_unsigned()[:SLICE_BITS], w_hold)),
            t1.eq(self.tok), v1.eq(self.valid), f1.eq(self.first),
        ]

        # Stage 2: multiply (register before the accumulator).
        p2 = Signal(lo_product_shape(cfg), reset_less=True, attrs={DSP_REGISTER: 1})
        t2 = Signal.like(self.tok, reset_less=True, attrs={"keep": 1})
        v2 = Signal(attrs={"keep": 1})
        f2 = Signal(reset_less=True, attrs={"keep": 1})
        m.d.sync += [p2.eq(a1 * w1), t2.eq(t1), v2.eq(v1), f2.eq(f1)]
        m.d.comb += self.ep_lo.eq(p2)

        # The file's read address is registered next to the file, so neither the accumulate
        # path nor the epilogue's read starts at a distant, high-fanout register: it is t2 while
        # an accumulation is in stage 3, else the epilogue's rd_addr of the previous cycle.
        raddr = Signal.like(self.tok, reset_less=True)
        m.d.sync += raddr.eq(Mux(v1, t1, self.rd_addr))

        # Stage 3: read-add-write of the token's entry (the sum wraps at acc_bits).
        m.d.comb += [
            rd.addr.eq(raddr),
            self.rd_data.eq(rd.data),
            wr.addr.eq(t2),
            wr.en.eq(v2),
            wr.data.eq(Mux(f2, 0, rd.data) + p2),
        ]
        return m
