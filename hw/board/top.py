"""The ECPIX-5 board top: LiteDRAM, the accelerator, and what connects them to the host.

:class:`Ecpix5Top` defines the ``sync`` domain, clocked by LiteDRAM's ``user_clk``
(:class:`hw.board.litedram.LiteDRAMCore` drives it) and :class:`hw.top.Accelerator` for
``board.accelerator_config(cfg)``, clock-enabled (``EnableInserter``): it advances only in
cycles its ``enable`` is high.

Until the DRAM bridge (:mod:`hw.board.bridge`) and the host link (:mod:`hw.board.link`) are in
this tree, two stand-ins take their places, so that the bitstream build measures the
accelerator beside the controller with none of its logic optimised away:

* the accelerator's DRAM port drives the ``accel`` native port directly (a request or a write
  is a command, a write's data goes to ``wdata``, read data comes back from ``rdata``) and the
  accelerator is enabled in the cycle after one in which initialisation was done and the
  port took both streams;
* the UART's receive pin shifts into a register that drives LiteDRAM's control bus and
  read commands on the ``host`` native port, whose read data drives the accelerator's
  ``start`` and instruction memory writes; every status output (``busy``, ``done``,
  ``error``, ``cycles``, the counters) and the control bus's read data are folded by XOR into
  the UART's transmit pin.

Neither stand-in keeps the accelerator's fixed-latency contract: the bitstream they make is a
resource and timing measurement, not a working board.
"""

from __future__ import annotations

from amaranth import Cat, ClockDomain, Elaboratable, EnableInserter, Module, Signal, Value
from amaranth.lib import io

from hw.board.ecpix5 import ECPIX5, Board
from hw.board.litedram import LiteDRAMCore
from hw.config import AcceleratorConfig
from hw.top import HOST_STATUS, Accelerator

__all__ = ["Ecpix5Top"]


class Ecpix5Top(Elaboratable):
    """The board's top-level design.

    Parameters
    ----------
    cfg:
        The accelerator configuration; its memory is replaced by the board's
        (:meth:`hw.board.ecpix5.Board.accelerator_config`).
    board:
        The board (default :data:`hw.board.ecpix5.ECPIX5`).

    Attributes
    ----------
    cfg:
        The accelerator's configuration on this board.
    """

    def __init__(self, cfg: AcceleratorConfig, board: Board = ECPIX5):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        if not isinstance(board, Board):
            raise TypeError(f"board must be a hw.board.ecpix5.Board, got {board!r}")
        self.board = board
        self.cfg = board.accelerator_config(cfg)

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = ClockDomain()  # clocked by LiteDRAM's user_clk
        m.submodules.dram = dram = LiteDRAMCore(self.board)
        accel = Accelerator(self.cfg)
        enable = Signal()
        m.submodules.accel = EnableInserter(enable)(accel)

        # Stand-in for the DRAM bridge (see the module docstring).
        port, req, wr = dram.accel, accel.dram.rd_req, accel.dram.wr
        m.d.comb += [
            port.cmd.valid.eq(req.valid | wr.valid),
            port.cmd.payload.we.eq(wr.valid),
            port.wdata.valid.eq(wr.valid),
            port.wdata.payload.data.eq(wr.payload.data),
            port.wdata.payload.we.eq(-1),
            port.rdata.ready.eq(1),
            accel.dram.rd_resp.valid.eq(port.rdata.valid),
            accel.dram.rd_resp.payload.eq(port.rdata.payload),
        ]
        # Registered: LiteDRAM's port converter makes cmd.ready from cmd.valid, and the
        # accelerator's requests depend on its enable within the cycle (its memories' read
        # enables), so an enable made from cmd.ready in the same cycle is a loop.
        m.d.sync += enable.eq(dram.init_done & port.cmd.ready & port.wdata.ready)
        with m.If(wr.valid):
            m.d.comb += port.cmd.payload.addr.eq(wr.payload.addr)
        with m.Else():
            m.d.comb += port.cmd.payload.addr.eq(req.payload)

        # Stand-in for the host link: the UART's receive pin shifts into a register that
        # drives the control bus and, through the host port's read data, the accelerator's
        # host inputs; the status outputs fold into the transmit pin.
        uart = platform.request("uart", 0, dir={"rx": "-", "tx": "-"})
        m.submodules.uart_rx = rx = io.Buffer("i", uart.rx)
        m.submodules.uart_tx = tx = io.Buffer("o", uart.tx)
        wb = dram.wb_ctrl
        shift = Signal(len(wb.adr) + 2 * len(wb.dat_w))
        m.d.sync += shift.eq(Cat(rx.i, shift[:-1]))
        m.d.comb += [
            wb.adr.eq(shift[:len(wb.adr)]),
            wb.dat_w.eq(shift[len(wb.adr):len(wb.adr) + len(wb.dat_w)]),
            wb.sel.eq(-1),
            wb.cyc.eq(shift[-1]), wb.stb.eq(shift[-1]), wb.we.eq(shift[-2]),
        ]
        host = dram.host
        word = host.rdata.payload
        m.d.comb += [
            host.cmd.valid.eq(shift[-3]),
            host.cmd.payload.addr.eq(shift),
            host.rdata.ready.eq(1),
            accel.start.eq(host.rdata.valid & word[0]),
            accel.imem_wr.en.eq(host.rdata.valid & word[1]),
            accel.imem_wr.addr.eq(word[2:2 + len(accel.imem_wr.addr)]),
            accel.imem_wr.data.eq(Cat(word, word)[:len(accel.imem_wr.data)]),
        ]
        status = Cat(*(Value.cast(getattr(accel, name)) for name in HOST_STATUS),
                     wb.dat_r, wb.ack, dram.init_error)
        m.d.comb += tx.o.eq(status.xor())
        return m
