"""The PE array: ``rows`` rows of ``cols`` PEs, lane ``l = r * cols + c``.

Row 0 receives the activation block and the control (token, valid, first) directly; each
further row receives them through one more register (the systolic skew: row ``r`` works ``r``
cycles after row 0), so the broadcast fans out to ``cols`` PEs, not to all lanes. The weights
of row ``r`` (and their load strobe) are delayed by ``r`` registers to match.
"""

from __future__ import annotations

from amaranth import Module, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.config import AcceleratorConfig
from hw.pe import MULT_BITS, PE, act_block_layout, index_bits, lo_product_shape

__all__ = ["Array"]


class Array(wiring.Component):
    """The lane array with its row-to-row pipeline.

    Timing: a MAC presented on ``act``/``tok``/``valid``/``first`` in cycle ``m`` uses, in every
    row ``r``, the weights loaded by the last ``load`` before cycle ``m`` (row ``r`` sees both
    ``r`` cycles later), and is readable on ``rd_data`` from ``m + rows - 1 + PE.LATENCY``
    (with ``rd_addr`` presented a cycle earlier).

    Parameters
    ----------
    cfg:
        The accelerator configuration.

    Members
    -------
    w: In(data.ArrayLayout(signed(cfg.weight_operand_bits), cfg.lanes))
        Weights of the next step, all lanes (row 0 timing).
    idx: In(data.ArrayLayout(index_bits(cfg), cfg.lanes))
        Their activation indices.
    load: In(1)
        Latch ``w``/``idx`` (row ``r`` latches ``r`` cycles later).
    act: In(act_block_layout(cfg))
        Activation block of the current MAC (row 0 timing).
    tok, valid, first: In
        Token, MAC strobe and overwrite flag of the current MAC (row 0 timing).
    rd_addr: In(range(cfg.max_tokens))
        Accumulator entry the epilogue reads in the next cycle.
    rd_data: Out(data.ArrayLayout(signed(cfg.acc_bits), cfg.lanes))
        Every lane's entry addressed in the previous cycle.
    mac: Out(1)
        Row 0 multiplies this cycle.
    ep_next: In(1)
        The PEs' ``ep`` of the next cycle (an epilogue read, :class:`hw.pe.PE`). Each PE takes
        it from a register of its own: ``ep`` selects the operands of every PE's multiplier,
        36 loads per lane, too many for one flip-flop at 64 lanes.
    ep_mult: In(data.ArrayLayout(MULT_BITS, cfg.lanes))
        The lanes' epilogue multipliers.
    ep_lo: Out(data.ArrayLayout(lo_product_shape(cfg), cfg.lanes))
        The PEs' low partial products (:attr:`hw.pe.PE.ep_lo`).
    """

    def __init__(self, cfg: AcceleratorConfig):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        self._cfg = cfg
        super().__init__({
            "w": In(data.ArrayLayout(signed(cfg.weight_operand_bits), cfg.lanes)),
            "idx": In(data.ArrayLayout(index_bits(cfg), cfg.lanes)),
            "load": In(1),
            "act": In(act_block_layout(cfg)),
            "tok": In(range(cfg.max_tokens)),
            "valid": In(1),
            "first": In(1),
            "rd_addr": In(range(cfg.max_tokens)),
            "rd_data": Out(data.ArrayLayout(signed(cfg.acc_bits), cfg.lanes)),
            "mac": Out(1),
            "ep_next": In(1),
            "ep_mult": In(data.ArrayLayout(MULT_BITS, cfg.lanes)),
            "ep_lo": Out(data.ArrayLayout(lo_product_shape(cfg), cfg.lanes)),
        })

    @property
    def cfg(self) -> AcceleratorConfig:
        return self._cfg

    def elaborate(self, platform):
        m = Module()
        cfg = self._cfg
        cols = cfg.cols

        # Per-row copies of the broadcast inputs: row r gets row r-1's through a register.
        act, tok, valid, first = self.act, self.tok, self.valid, self.first
        load = self.load
        w_row = [self.w[r * cols + c] for r in range(cfg.rows) for c in range(cols)]
        i_row = [self.idx[r * cols + c] for r in range(cfg.rows) for c in range(cols)]
        for r in range(cfg.rows):
            if r:
                # Only the strobes are reset by `start` (hw/top.py, "Reset").
                nact = Signal(act_block_layout(cfg), name=f"act_r{r}", reset_less=True)
                ntok = Signal.like(self.tok, name=f"tok_r{r}", reset_less=True)
                nvalid = Signal(name=f"valid_r{r}")
                nfirst = Signal(name=f"first_r{r}", reset_less=True)
                nload = Signal(name=f"load_r{r}")
                m.d.sync += [nact.eq(act), ntok.eq(tok), nvalid.eq(valid), nfirst.eq(first),
                             nload.eq(load)]
                act, tok, valid, first, load = nact, ntok, nvalid, nfirst, nload
            for c in range(cols):
                lane = r * cols + c
                # Row r's weights pass through r registers (the skew of the activations).
                wv, iv = w_row[lane], i_row[lane]
                for d in range(r):
                    nw = Signal(signed(cfg.weight_operand_bits), name=f"w_l{lane}_d{d}",
                                reset_less=True)
                    ni = Signal(index_bits(cfg), name=f"i_l{lane}_d{d}", reset_less=True)
                    m.d.sync += [nw.eq(wv), ni.eq(iv)]
                    wv, iv = nw, ni
                m.submodules[f"pe{lane}"] = pe = PE(cfg)
                # A control register like `valid`: reset by `start` (hw/top.py, "Reset").
                ep = Signal(name=f"ep_l{lane}", attrs={"keep": 1})
                m.d.sync += ep.eq(self.ep_next)
                m.d.comb += [
                    pe.w_in.eq(wv), pe.idx_in.eq(iv), pe.load.eq(load),
                    pe.act.eq(act), pe.tok.eq(tok), pe.valid.eq(valid), pe.first.eq(first),
                    pe.rd_addr.eq(self.rd_addr),
                    self.rd_data[lane].eq(pe.rd_data),
                    pe.ep.eq(ep), pe.ep_mult.eq(self.ep_mult[lane]),
                    self.ep_lo[lane].eq(pe.ep_lo),
                ]
        m.d.comb += self.mac.eq(self.valid)
        return m
