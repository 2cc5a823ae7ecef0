"""The ECPIX-5 board top: LiteDRAM, the bridged accelerator, the host link on the UART.

::

    FTDI UART --UartRx--> HostLink --ctrl (Wishbone)---------> LiteDRAMCore.wb_ctrl
              <-UartTx---    |    --mem (native)-----------> LiteDRAMCore.host
                             |    <-dram_init_done/_error---  LiteDRAMCore.init_done/_error
                             +-- start, imem_wr, status ---> BridgedAccelerator
                                                               (Accelerator under the
                                                                DramBridge's clock enable)
                                                               --port (native)--> .accel
    LiteDRAMCore: DDR3 pins, 100 MHz oscillator, reset button

One clock domain: :class:`Ecpix5Top` defines ``sync`` and
:class:`hw.board.litedram.LiteDRAMCore` drives it with LiteDRAM's ``user_clk``
(:attr:`hw.board.ecpix5.Board.sys_clk_hz`, from the core's PLL) and ``user_rst``. The
accelerator is ``board.accelerator_config(cfg)``, under the clock enable of a
:class:`hw.board.bridge.DramBridge` (:class:`hw.board.bridge.BridgedAccelerator`); the host
link (:class:`hw.board.link.HostLink`) reads and writes the DRAM through its own native port,
loads the instruction memory, starts the accelerator, reads its status and the bridge's stall
cycles, and drives LiteDRAM's control bus (the DRAM initialisation of
:mod:`hw.board.dram_init`).
"""

from __future__ import annotations

from amaranth import ClockDomain, Elaboratable, Module
from amaranth.lib import io
from amaranth.lib.wiring import In, connect

from hw.board.bridge import BridgedAccelerator
from hw.board.ecpix5 import ECPIX5, Board
from hw.board.link import HostLink
from hw.board.litedram import LiteDRAMCore
from hw.board.uart import UartRx, UartTx
from hw.config import AcceleratorConfig
from hw.top import host_ports

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
        m.submodules.accel = accel = BridgedAccelerator(self.cfg, self.board)
        m.submodules.link = link = HostLink(self.cfg, self.board)
        connect(m, accel.port, dram.accel)
        connect(m, link.mem, dram.host)
        connect(m, link.ctrl, dram.wb_ctrl)
        for name, member in host_ports(self.cfg).items():
            ours, theirs = getattr(link, name), getattr(accel, name)
            if member.is_signature:
                connect(m, ours, theirs)
            elif member.flow == In:
                m.d.comb += theirs.eq(ours)
            else:
                m.d.comb += ours.eq(theirs)
        m.d.comb += [
            link.stall_cycles.eq(accel.stall_cycles),
            link.dram_init_done.eq(dram.init_done),
            link.dram_init_error.eq(dram.init_error),
        ]

        uart = platform.request("uart", 0, dir={"rx": "-", "tx": "-"})
        m.submodules.rx_pin = rx_pin = io.Buffer("i", uart.rx)
        m.submodules.tx_pin = tx_pin = io.Buffer("o", uart.tx)
        m.submodules.uart_rx = rx = UartRx(self.board.sys_clk_hz, self.board.uart_baud)
        m.submodules.uart_tx = tx = UartTx(self.board.sys_clk_hz, self.board.uart_baud)
        m.d.comb += [rx.line.eq(rx_pin.i), tx_pin.o.eq(tx.line)]
        connect(m, rx.byte, link.rx)
        connect(m, link.tx, tx.byte)
        return m
