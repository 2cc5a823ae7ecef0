"""The board without its FPGA-specific parts, for the Verilator board simulation.

:class:`BoardSimTop` is the board top (:mod:`hw.board`) minus the UART, the DDR3 PHY and the
LiteDRAM core: the accelerator clock-enabled by its :class:`hw.board.bridge.DramBridge`
(:class:`hw.board.bridge.BridgedAccelerator`) and the host link
(:class:`hw.board.link.HostLink`), with the link's byte streams and both LiteDRAM native ports
(the bridge's, ``accel``, and the link's, ``host``) as top-level ports. The C++ harness
``sim/verilator/board_harness.cpp`` models both native ports over one memory and pumps the
link's bytes; :mod:`sim.board_sim` builds and runs it.

LiteDRAM's control bus is answered by a stand-in (every access acknowledged in the next cycle,
reads return 0) and its initialisation is reported done: the simulated memory needs none.
"""

from __future__ import annotations

from collections.abc import Callable

from amaranth import ClockDomain, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from hw.board.bridge import BridgedAccelerator
from hw.board.ecpix5 import Board
from hw.board.link import HostLink
from hw.board.native import NativePortSignature
from hw.config import AcceleratorConfig
from hw.top import HOST_STATUS

__all__ = ["BoardSimTop", "BOARD_SIM_TOP_NAME"]

#: Verilog module name of the board simulation top.
BOARD_SIM_TOP_NAME = "board"


class BoardSimTop(wiring.Component):
    """The accelerator, its bridge and the host link, in one reset-less clock domain.

    Registers start from their initial values (as in :class:`hw.sim_top.RunnerTop`: no reset
    port, so that Verilator does not re-evaluate every next-state function on a reset input).

    Parameters
    ----------
    cfg:
        The accelerator configuration with the board's memory
        (:meth:`hw.board.ecpix5.Board.accelerator_config`).
    board:
        The board (its native port; its ``dram_bytes`` may be a small simulated memory).
    compute:
        Passed to :class:`hw.top.Accelerator`.
    upconverter:
        Passed to :class:`hw.board.bridge.DramBridge` (a port of half the controller's width).

    Members
    -------
    rx: In(stream.Signature(8))
        Bytes from the host.
    tx: Out(stream.Signature(8))
        Bytes to the host.
    accel: Out(NativePortSignature(board.port_bits, board.port_addr_bits))
        The bridge's native port.
    host: Out(NativePortSignature(board.port_bits, board.port_addr_bits))
        The link's native port.
    busy: Out(1)
        The accelerator runs or its bridge has work (the harness keeps the clock running).
    """

    def __init__(self, cfg: AcceleratorConfig, board: Board, compute: Callable | None = None,
                 upconverter: bool = False):
        self._bridged = BridgedAccelerator(cfg, board, compute=compute, upconverter=upconverter)
        self._link = HostLink(cfg, board)
        self._domain = ClockDomain("sync", reset_less=True)
        native = NativePortSignature(board.port_bits, board.port_addr_bits)
        super().__init__({
            "rx": In(stream.Signature(8)),
            "tx": Out(stream.Signature(8)),
            "accel": Out(native),
            "host": Out(native),
            "busy": Out(1),
        })

    @property
    def clk(self) -> Signal:
        """The clock, a port of the generated Verilog besides the signature's members."""
        return self._domain.clk

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = self._domain
        m.submodules.bridged = bridged = self._bridged
        m.submodules.link = link = self._link
        connect(m, flipped(self.rx), link.rx)
        connect(m, link.tx, flipped(self.tx))
        connect(m, flipped(self.accel), bridged.port)
        connect(m, flipped(self.host), link.mem)
        connect(m, link.imem_wr, bridged.imem_wr)
        m.d.comb += [bridged.start.eq(link.start), link.stall_cycles.eq(bridged.stall_cycles),
                     link.dram_init_done.eq(1), link.dram_init_error.eq(0)]
        for name in HOST_STATUS:
            m.d.comb += getattr(link, name).eq(getattr(bridged, name))
        m.d.comb += self.busy.eq(bridged.busy)
        ack = Signal()
        m.d.sync += ack.eq(link.ctrl.cyc & link.ctrl.stb & ~ack)
        m.d.comb += [link.ctrl.ack.eq(ack), link.ctrl.dat_r.eq(0)]
        return m
