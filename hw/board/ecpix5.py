"""The ECPIX-5 85F board: the facts every board module reads, defined once.

LambdaConcept's ECPIX-5 (``amaranth_boards.ecpix5.ECPIX585Platform``): an LFE5UM5G-85F
(ECP5-5G, BG554, speed grade 8), a 100 MHz oscillator, one DDR3L MT41K256M16 (x16, 512 MB) and
an FTDI FT2232H whose second channel is the board's UART.

LiteDRAM's ECP5 DDR3 PHY moves 4 beats of 16 bits per controller (``sys``) cycle, 8 bytes:
600 MB/s peak at 75 MHz. The controller's native data word is one BL8 burst (128 bits), and the
accelerator's port has that width: its beat is a burst, so the accelerator, one beat per cycle,
asks for twice what the memory gives, and the bridge stalls it (hw/board/__init__.py); a paced
port (``accelerator_config(..., paced=True)``: a beat every two cycles) asks for the peak, and
the bridge stalls it only for the memory's shortfall below the peak. A 64-bit
port would match the rate on paper, but LiteDRAM's port converter serves sequential 64-bit reads
at 0.7 bytes per cycle against 6.8 for the 128-bit port (``python -m bench.board``, which
measures both on LiteDRAM's controller).

Examples
--------
>>> from hw.config import AcceleratorConfig
>>> cfg = ECPIX5.accelerator_config(AcceleratorConfig())
>>> cfg.beat_bytes, cfg.memory.size_bytes == ECPIX5.dram_bytes, cfg.clock_mhz
(16, True, 75.0)
>>> ECPIX5.peak_bytes_per_s / 1e6
600.0
>>> ECPIX5.accelerator_config(ECPIX5.base_config).fingerprint   # the bitstream's
'f14742cecb0e'
>>> ECPIX5.accelerator_config(AcceleratorConfig(), paced=True).memory.cycles_per_beat
2
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hw.config import AcceleratorConfig, MemoryModel

__all__ = ["Board", "ECPIX5", "ECPIX5_SYS50", "BOARDS", "board_named", "boards_help"]


@dataclass(frozen=True)
class Board:
    """One FPGA board as the board flow sees it.

    Parameters
    ----------
    name:
        Short name, used in paths (``bitstreams/<name>/...``).
    platform:
        ``module:Class`` of the amaranth-boards platform.
    device:
        Full part number, as LiteDRAM's generator takes it.
    input_clk_hz, sys_clk_hz, init_clk_hz:
        The oscillator, the controller and accelerator clock, LiteDRAM's initialisation clock.
    sdram_module, sdram_phy:
        LiteDRAM's names of the memory chip (``litedram.modules``) and of the PHY.
    sdram_trfc_ns:
        The chip's refresh cycle time tRFC (datasheet minimum, ns), given to the controller as a
        time (None: LiteDRAM's table of the chip, which counts it in memory clocks of its
        fastest speed grade and keeps that count at any clock, waiting longer than the chip
        needs at a slower memory clock).
    dram_bytes:
        Memory size.
    port_bits:
        Width of the accelerator's native port (= 8 x its beat bytes).
    peak_bytes_per_sys_cycle:
        What the PHY moves per ``sys`` cycle at best.
    uart_baud:
        Host link rate.
    base_config:
        The accelerator configuration the board's bitstream carries unless another is asked
        for (``make bitstream``, ``bench.board``, ``sw.deploy --backend board``), before the
        board's memory and clock (:meth:`accelerator_config`).
    """

    name: str
    platform: str
    device: str
    input_clk_hz: float
    sys_clk_hz: float
    init_clk_hz: float
    sdram_module: str
    sdram_phy: str
    sdram_trfc_ns: float | None
    dram_bytes: int
    port_bits: int
    peak_bytes_per_sys_cycle: int
    uart_baud: int
    base_config: AcceleratorConfig

    @property
    def peak_bytes_per_s(self) -> float:
        """The memory roofline's bandwidth."""
        return self.peak_bytes_per_sys_cycle * self.sys_clk_hz

    @property
    def port_addr_bits(self) -> int:
        """Word-address width of a native port of :attr:`port_bits`."""
        return (self.dram_bytes // (self.port_bits // 8) - 1).bit_length()

    @property
    def paced_cycles_per_beat(self) -> int:
        """The DRAM port's pace at the memory's peak
        (:attr:`hw.config.MemoryModel.cycles_per_beat`): a beat of the native port every
        ``port bytes // peak_bytes_per_sys_cycle`` cycles (at least 1)."""
        return max(1, (self.port_bits // 8) // self.peak_bytes_per_sys_cycle)

    def accelerator_config(self, base: AcceleratorConfig, latency: int | None = None,
                           paced: bool = False) -> AcceleratorConfig:
        """``base`` on this board: its clock (``sys``), its memory (beats of the native port,
        the whole DRAM).

        ``latency`` (default: ``base``'s) is the contract's read latency; the bridge stalls the
        accelerator whenever the controller takes longer (hw/board/bridge.py). ``paced``: the
        DMA engines issue a beat every :attr:`paced_cycles_per_beat` cycles, the memory's
        peak, so the bridge stops the accelerator only for the memory's shortfall below it
        (default: ``base``'s pace, one beat a cycle unless ``base`` says otherwise).
        """
        memory = MemoryModel(bytes_per_cycle=self.port_bits // 8,
                             latency=base.memory.latency if latency is None else latency,
                             size_bytes=self.dram_bytes,
                             cycles_per_beat=(self.paced_cycles_per_beat if paced
                                              else base.memory.cycles_per_beat))
        return dataclasses.replace(base, memory=memory, clock_mhz=self.sys_clk_hz / 1e6)


ECPIX5 = Board(
    name="ecpix5-85f",
    platform="amaranth_boards.ecpix5:ECPIX585Platform",
    device="LFE5UM5G-85F-8BG554I",
    input_clk_hz=100e6,
    sys_clk_hz=75e6,
    init_clk_hz=25e6,
    sdram_module="MT41K256M16",
    sdram_phy="ECP5DDRPHY",
    # MT41K256M16 (4 Gb) datasheet: tRFC(min) 260 ns; LiteDRAM's 208 clocks of DDR3-1600.
    sdram_trfc_ns=260.0,
    dram_bytes=512 << 20,
    port_bits=128,
    peak_bytes_per_sys_cycle=8,
    uart_baud=3_000_000,
    # The 2x8 array: beside LiteDRAM and the host link it routes and meets every clock on
    # placer seeds 1 and 2 (bitstreams/ecpix5-85f/f14742cecb0e/report.json); the 4x8 array
    # places at 85 MHz but its routing did not finish here (docs/board.md, "Which
    # accelerator"). 16 lanes consume 8 bytes per cycle of dense INT4 weights, what the
    # memory's peak gives.
    base_config=AcceleratorConfig(rows=2),
)


# The same board with ``sys`` at 50 MHz (``sys2x`` 100 MHz), a clock LiteDRAM's ECP5 DDR3 PHY is
# reported to work at: the vector configuration (the 4x8 array and the vector engine) places
# at about 59 MHz, short of the 75 MHz of :data:`ECPIX5` (docs/board.md, "The 50 MHz
# variant"). Only the clock differs: LiteDRAM is generated for it (its PLL, its timings in
# ``sys`` cycles), the UART's divisor and the accelerator's ``clock_mhz`` follow from it, and
# the memory's peak scales with it (400 MB/s).
ECPIX5_SYS50 = dataclasses.replace(ECPIX5, name="ecpix5-85f-sys50", sys_clk_hz=50e6)

#: The boards the board flow builds for, by :attr:`Board.name` (``--board``).
BOARDS: dict[str, Board] = {b.name: b for b in (ECPIX5, ECPIX5_SYS50)}


def board_named(name: str) -> Board:
    """The board of :data:`BOARDS` called ``name``.

    Raises ``ValueError`` (one line naming the choices) for another name.

    Examples
    --------
    >>> board_named("ecpix5-85f-sys50").sys_clk_hz / 1e6, board_named("ecpix5-85f") is ECPIX5
    (50.0, True)
    """
    board = BOARDS.get(name)
    if board is None:
        raise ValueError(f"unknown board {name!r} (choose from {', '.join(BOARDS)})")
    return board


def boards_help() -> str:
    """The boards of :data:`BOARDS` with their clocks, for a ``--board`` option's help.

    >>> boards_help()
    'ecpix5-85f (sys 75 MHz, sys2x 150 MHz); ecpix5-85f-sys50 (sys 50 MHz, sys2x 100 MHz)'
    """
    return "; ".join(f"{b.name} (sys {b.sys_clk_hz / 1e6:g} MHz, sys2x "
                     f"{2 * b.sys_clk_hz / 1e6:g} MHz)" for b in BOARDS.values())
