"""The board's memory as the accelerator sees it, measured on LiteDRAM's own controller.

A board's DDR3 sits behind a LiteDRAM controller (:mod:`hw.board`); how fast it answers is
measured here rather than guessed: :func:`measure` builds, in Migen, the controller LiteDRAM
generates for the board (:class:`litedram.core.LiteDRAMCore`: refresher, bank machines,
multiplexer, crossbar) for the board's memory chip (``board.sdram_module``, with LiteDRAM's
timings of that chip at ``board.sys_clk_hz``; ``trfc_ns`` gives tRFC as a time, as the generated
core has the board's :attr:`~hw.board.ecpix5.Board.sdram_trfc_ns`), with the PHY settings of the
board's PHY (``board.sdram_phy``: its :class:`litedram.common.PhySettings`, read from the PHY
class itself, constructed on the widths of the board's ``ddr3`` pins) and LiteDRAM's behavioural
PHY (:class:`litedram.phy.model.SDRAMPHYModel`) in place of the pads, and a native user port of
``port_bits`` from the crossbar (through LiteDRAM's port converter when that is not the
controller's own width, as in the generated core), and runs it in Migen's simulator
(:func:`migen.sim.run_simulation`). Three patterns of reads, each on a fresh controller:

``latency``
    One read of an idle controller (no row open, no refresh due): cycles from the cycle in
    which the port accepts the command (``cmd.valid & cmd.ready``) to the cycle of its first
    data beat (``rdata.valid``); the definition of the accelerator's DRAM read latency
    (``hw/dma.py``: a request of cycle ``r`` answered in ``r + latency``). Then, once it has
    answered, a read of the next word of the same row (left open):
    :attr:`MemoryTiming.row_hit_latency`.
``sequential``
    Consecutive addresses, a command offered every cycle, data always taken: bytes per
    ``sys`` cycle over a window of :attr:`MemoryTiming.window_cycles`, a whole number of
    refresh intervals (tREFI) long, that starts one interval after the first beat: the
    refresher's timer runs from reset, so from the first refresh on one refresh
    (precharge-all, tRFC, the rows opened again) falls in every interval and the window
    holds as many refreshes' time as intervals, wherever in the interval it starts; the row
    changes of a sequential stream (a new bank every row's bytes) are in the figure as
    they come.
``row_miss``
    Every controller word (one burst) from another row of the same bank: the worst case of
    interleaved streams, each access a precharge and an activate.

The memory's geometry is reduced to :data:`SIM_ROWS` rows per bank (the simulator holds the
model's memory as one signal per word); banks, columns, and so the address mapping below the
row bits and every timing, are the chip's, so none of the patterns above sees a difference.

The measurement takes minutes in Migen's simulator (about 25 cycles per second):
``python -m bench.board --measure-memory`` runs it and records it
(:meth:`MemoryTiming.to_dict`); the performance model reads the record.

Examples
--------
>>> from hw.board.ecpix5 import ECPIX5
>>> s = phy_settings(ECPIX5)
>>> s.phytype, s.nphases, s.memtype
('ECP5DDRPHY', 2, 'DDR3')
"""

from __future__ import annotations

import importlib
import importlib.metadata
from dataclasses import asdict, dataclass
from typing import Any

from hw.board.ecpix5 import Board
from hw.board.litedram import sdram_module_class
from sim.errors import SimulationError

__all__ = ["SIM_ROWS", "PATTERNS", "MemoryTiming", "timing_key", "phy_settings", "sdram_module",
           "refresh_cycles", "speedgrade_trfc_ns", "controller_bits", "measure", "board_cycles",
           "MemoryMeasureError"]

#: Rows per bank of the simulated memory (the chip's banks and columns are kept): enough for
#: a sequential stream to cross a row of every bank within :func:`measure`'s default window
#: and for :data:`PATTERNS`' ``row_miss`` to alternate rows.
SIM_ROWS = 4
#: The read patterns :func:`measure` runs.
PATTERNS = ("latency", "sequential", "row_miss")
#: LiteDRAM's pad names of the amaranth-boards ``ddr3`` subsignals the PHY needs.
#: Cycle from which the first read is offered (the controller out of reset), and the most cycles
#: a read may take to answer before the measurement gives up.
_START, _TIMEOUT = 16, 80
_PADS = {"clk": "clk_p", "clk_en": "cke", "we": "we_n", "ras": "ras_n", "cas": "cas_n",
         "a": "a", "ba": "ba", "dqs": "dqs_p", "dq": "dq", "dm": "dm", "odt": "odt"}


class MemoryMeasureError(SimulationError):
    """A measurement that cannot be made as asked (the message names the value)."""


@dataclass(frozen=True)
class MemoryTiming:
    """What :func:`measure` measured of a board's memory through one native port.

    Attributes
    ----------
    board, port_bits, controller_bits, sys_clk_hz:
        The board, the port's width, the controller's native word (one burst) and the clock.
    litedram:
        The LiteDRAM version measured.
    read_latency:
        Idle controller, row closed: command accepted -> first data, ``sys`` cycles.
    row_hit_latency:
        The same for a read of the row the previous read left open.
    sequential_bytes_per_cycle:
        Sustained sequential reads over ``window_cycles`` (refreshes and row changes in).
    row_miss_bytes_per_cycle:
        Reads each from another row of one bank, over ``row_miss_cycles``.
    window_cycles, row_miss_cycles:
        The measurement windows (``sys`` cycles); ``window_cycles`` is
        ``refresh_intervals`` x ``trefi_cycles`` (0 intervals: a short window from the first
        beat).
    refresh_intervals:
        Refresh intervals in the sequential window.
    trefi_cycles, trfc_cycles:
        The controller's refresh interval and refresh time (``sys`` cycles): what refresh
        alone takes is at most ``trfc / trefi`` of the time.
    trfc_ns:
        None: the controller's tRFC as LiteDRAM's table of the chip gives it; else the tRFC
        it was given instead, in ns (the board's generated core has
        :attr:`~hw.board.ecpix5.Board.sdram_trfc_ns`).
    peak_bytes_per_cycle:
        The board's peak (:attr:`hw.board.ecpix5.Board.peak_bytes_per_sys_cycle`).
    """

    board: str
    port_bits: int
    controller_bits: int
    sys_clk_hz: float
    litedram: str
    read_latency: int
    row_hit_latency: int
    sequential_bytes_per_cycle: float
    row_miss_bytes_per_cycle: float
    window_cycles: int
    row_miss_cycles: int
    refresh_intervals: int
    trefi_cycles: int
    trfc_cycles: int
    peak_bytes_per_cycle: int
    trfc_ns: float | None = None

    @property
    def key(self) -> str:
        """:func:`timing_key` of this measurement."""
        return timing_key(self.port_bits, self.trfc_ns)

    @property
    def efficiency(self) -> float:
        """Sequential reads' fraction of the board's peak."""
        return self.sequential_bytes_per_cycle / self.peak_bytes_per_cycle

    @property
    def refresh_bound(self) -> float:
        """The fraction of time refresh leaves at best: ``1 - tRFC / tREFI``."""
        return 1 - self.trfc_cycles / self.trefi_cycles

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "efficiency": self.efficiency,
                "refresh_bound": self.refresh_bound}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MemoryTiming:
        """The inverse of :meth:`to_dict` (derived fields ignored).

        Raises
        ------
        MemoryMeasureError
            A field missing (named).
        """
        names = cls.__dataclass_fields__
        missing = [n for n in names if n not in d and n != "trfc_ns"]
        if missing:
            raise MemoryMeasureError(f"memory record without {', '.join(missing)}")
        return cls(**{n: d[n] for n in names if n in d})

    def matches(self, board: Board, port_bits: int, trfc_ns: float | None = None) -> bool:
        """Whether this record measured ``board``'s memory through a ``port_bits`` port (with
        tRFC ``trfc_ns``) with the LiteDRAM installed now."""
        return (self.board == board.name and self.port_bits == port_bits
                and self.trfc_ns == trfc_ns
                and self.sys_clk_hz == board.sys_clk_hz
                and self.peak_bytes_per_cycle == board.peak_bytes_per_sys_cycle
                and self.litedram == _litedram_version())


def timing_key(port_bits: int, trfc_ns: float | None = None) -> str:
    """How records name the memory measured through a ``port_bits`` port with tRFC
    ``trfc_ns`` (None: LiteDRAM's table).

    >>> timing_key(128), timing_key(128, 260.0)
    ('128', '128-trfc260ns')
    """
    return f"{port_bits}" + (f"-trfc{trfc_ns:g}ns" if trfc_ns else "")


def _litedram_version() -> str:
    return importlib.metadata.version("litedram")


def _ddr3_widths(board: Board) -> dict[str, int]:
    """Width of each of the board's ``ddr3`` subsignals (amaranth-boards), LiteDRAM's names."""
    module, _, cls = board.platform.partition(":")
    platform = getattr(importlib.import_module(module), cls)
    (res,) = [r for r in platform.resources if r.name == "ddr3" and r.number == 0]
    widths = {}
    for sub in res.ios:
        io = sub.ios[0]
        names = io.names if hasattr(io, "names") else io.p.names
        if sub.name in _PADS:
            widths[_PADS[sub.name]] = len(names)
    return widths


def phy_settings(board: Board):
    """The :class:`litedram.common.PhySettings` of the board's PHY at its ``sys`` clock.

    The PHY class (``litedram.phy.<board.sdram_phy>``) is constructed on placeholder pads of
    the widths of the board's ``ddr3`` pins, only to read its settings (nothing of it is
    simulated).
    """
    import litedram.phy
    from migen import Record
    widths = _ddr3_widths(board)
    pads = Record([(name, w) for name, w in widths.items()])
    phy = getattr(litedram.phy, board.sdram_phy)(pads, sys_clk_freq=board.sys_clk_hz)
    return phy.settings


def sdram_module(board: Board, rows: int | None = None, trfc_ns: float | None = None):
    """LiteDRAM's module of the board's chip at its ``sys`` clock and the PHY's rate; with
    ``rows`` rows per bank instead of the chip's (the address pins stay the chip's), and a
    tRFC of ``trfc_ns`` instead of LiteDRAM's (rounded up to cycles as LiteDRAM rounds a
    time).

    Raises
    ------
    MemoryMeasureError
        ``rows`` not a power of two >= 2, or more than the chip has.
    """
    try:
        chip = sdram_module_class(board.sdram_module, trfc_ns)
    except ValueError as e:
        raise MemoryMeasureError(str(e)) from None
    rate = f"1:{phy_settings(board).nphases}"
    if rows is None:
        return sdram_module(board, chip.nrows, trfc_ns)
    if not isinstance(rows, int) or rows < 2 or rows & (rows - 1) or rows > chip.nrows:
        raise MemoryMeasureError(f"rows must be a power of two in [2, {chip.nrows}], got "
                                 f"{rows!r}")
    small = type(f"{chip.__name__}_{rows}rows", (chip,), {"nrows": rows})(board.sys_clk_hz,
                                                                          rate)
    small.geom_settings.addressbits = chip(board.sys_clk_hz, rate).geom_settings.addressbits
    return small


def refresh_cycles(board: Board, trfc_ns: float | None = None) -> tuple[int, int]:
    """``(tREFI, tRFC)`` of the board's chip in ``sys`` cycles, as the controller counts them
    (with a tRFC of ``trfc_ns``, if given)."""
    t = sdram_module(board, trfc_ns=trfc_ns).timing_settings
    return t.tREFI, t.tRFC


def speedgrade_trfc_ns(board: Board) -> float:
    """The chip's tRFC as a time: LiteDRAM's table gives it in memory clocks of the chip's
    default speedgrade (DDR3-1600: 208 clocks, 260 ns), and the controller keeps the clock
    count at any clock, so at a slower memory clock it waits longer than the chip needs;
    this is those clocks at the speedgrade's own clock period (two transfers per clock)."""
    from litedram import modules

    chip = getattr(modules, board.sdram_module)
    grades = chip.speedgrade_timings
    (grade,) = [g for g, t in grades.items() if g != "default" and t is grades["default"]]
    clocks = sdram_module(board).get("tRFC").ck
    return clocks * 2e3 / int(grade)


def controller_bits(board: Board) -> int:
    """Width of the controller's native word: one burst of the board's memory."""
    from litedram.common import burst_lengths

    s = phy_settings(board)
    return s.databits * burst_lengths[s.memtype]


def _system(board: Board, port_bits: int, rows: int, trfc_ns: float | None = None):
    """The controller, the model PHY and one native port of ``port_bits`` (Migen)."""
    from litedram.core import LiteDRAMCore
    from litedram.core.controller import ControllerSettings
    from litedram.phy.model import SDRAMPHYModel
    from migen import Module

    module = sdram_module(board, rows, trfc_ns)

    class System(Module):
        def __init__(self):
            self.submodules.phy = SDRAMPHYModel(module, phy_settings(board),
                                                clk_freq=board.sys_clk_hz)
            self.submodules.core = LiteDRAMCore(
                self.phy, module.geom_settings, module.timing_settings, board.sys_clk_hz,
                controller_settings=ControllerSettings())
            self.port = self.core.crossbar.get_port(mode="read", data_width=port_bits)

    return System()


def _run(board: Board, port_bits: int, requests: list[tuple[int, int]], cycles: int,
         trfc_ns: float | None = None) -> tuple[list[int], list[int]]:
    """Offer reads of ``requests`` (``(port word address, first cycle it may be offered)``)
    one after the other for ``cycles`` cycles, data always taken; returns the cycles in which
    each was accepted and the cycles of the data beats (one per port word).

    The last request carries ``cmd.last``: LiteDRAM's up-converter (a port narrower than the
    controller's word) holds a read until a command for another controller word, the end of
    the word, or ``last`` says that no more of the word is coming."""
    from migen import run_simulation

    system = _system(board, port_bits, SIM_ROWS, trfc_ns)
    port = system.port
    accepted: list[int] = []
    beats: list[int] = []

    def drive():
        yield port.rdata.ready.eq(1)
        yield port.cmd.we.eq(0)
        for c in range(cycles):
            if (yield port.cmd.valid) and (yield port.cmd.ready):
                accepted.append(c)
            if (yield port.rdata.valid):
                beats.append(c)
            i = len(accepted)
            offer = i < len(requests) and c + 1 >= requests[i][1]
            yield port.cmd.valid.eq(offer)
            if offer:
                yield port.cmd.addr.eq(requests[i][0])
                yield port.cmd.last.eq(i == len(requests) - 1)
            yield

    run_simulation(system, drive())
    return accepted, beats


def _geometry(board: Board, port_bits: int) -> tuple[int, int, int]:
    """(port words per controller word, controller words per row of a bank, banks)."""
    m = sdram_module(board)
    burst = controller_bits(board) // phy_settings(board).databits
    return controller_bits(board) // port_bits, m.ncols // burst, m.nbanks


def measure(board: Board, port_bits: int | None = None, refresh_intervals: int = 3,
            row_miss_cycles: int = 400, patterns: tuple[str, ...] = PATTERNS,
            window_cycles: int | None = None, trfc_ns: float | None = None) -> MemoryTiming:
    """Measure the board's memory through a native port (module docstring).

    Parameters
    ----------
    board:
        The board.
    port_bits:
        Width of the native port (default: ``board.port_bits``), dividing the controller's
        word (:func:`controller_bits`).
    refresh_intervals:
        Length of the sequential window in refresh intervals (tREFI).
    row_miss_cycles:
        Length of the row-miss run.
    patterns:
        Which of :data:`PATTERNS` to run; the others are recorded as 0.
    window_cycles:
        A sequential window of this many cycles from the first beat instead (a short run:
        refresh then counts only as far as the window reaches; ``refresh_intervals`` is
        recorded as 0).
    trfc_ns:
        Give the controller this tRFC (ns) instead of LiteDRAM's (:func:`speedgrade_trfc_ns`).

    Raises
    ------
    MemoryMeasureError
        A bad argument (named), or a port that returned no data.
    """
    port_bits = board.port_bits if port_bits is None else port_bits
    native = controller_bits(board)
    if not isinstance(port_bits, int) or port_bits < 8 or native % port_bits:
        raise MemoryMeasureError(f"port_bits must divide the controller's {native}-bit word, "
                                 f"got {port_bits!r}")
    if not isinstance(refresh_intervals, int) or refresh_intervals < 1:
        raise MemoryMeasureError(f"refresh_intervals must be an int >= 1, got "
                                 f"{refresh_intervals!r}")
    if not isinstance(row_miss_cycles, int) or row_miss_cycles < 50:
        raise MemoryMeasureError(f"row_miss_cycles must be an int >= 50, got "
                                 f"{row_miss_cycles!r}")
    if window_cycles is not None and (not isinstance(window_cycles, int) or window_cycles < 16):
        raise MemoryMeasureError(f"window_cycles must be an int >= 16, got {window_cycles!r}")
    unknown = [p for p in patterns if p not in PATTERNS]
    if unknown:
        raise MemoryMeasureError(f"patterns {unknown}: choose among {', '.join(PATTERNS)}")
    if trfc_ns is not None and (isinstance(trfc_ns, bool) or not trfc_ns > 0):
        raise MemoryMeasureError(f"trfc_ns must be > 0, got {trfc_ns!r}")
    trefi, trfc = refresh_cycles(board, trfc_ns)
    port_bytes = port_bits // 8
    ratio, row_words, banks = _geometry(board, port_bits)
    start = _START

    latency = hit = 0
    if "latency" in patterns:
        acc, beats = _run(board, port_bits, [(0, start)], start + _TIMEOUT, trfc_ns)
        if not beats:
            raise MemoryMeasureError(f"{port_bits}-bit port: no data within {_TIMEOUT} cycles")
        latency = beats[0] - acc[0]
        # the next controller word of the same row, offered once the first read has answered
        later = beats[-1] + 2
        acc, beats = _run(board, port_bits, [(0, start), (ratio, later)], later + _TIMEOUT,
                           trfc_ns)
        after = [b for b in beats if len(acc) > 1 and b > acc[1]]
        if not after:
            raise MemoryMeasureError(f"{port_bits}-bit port: no data for the row-hit read")
        hit = after[0] - acc[1]

    sequential, window = 0.0, 0
    if "sequential" in patterns:
        window = window_cycles if window_cycles is not None else refresh_intervals * trefi
        warmup = 0 if window_cycles is not None else trefi
        size = row_words * banks * SIM_ROWS * ratio  # the simulated memory, port words
        # at most one port word per cycle: enough addresses for the whole run
        cycles = start + _TIMEOUT + warmup + window
        _, beats = _run(board, port_bits, [(a % size, start) for a in range(cycles)], cycles,
                        trfc_ns)
        if not beats:
            raise MemoryMeasureError(f"{port_bits}-bit port: no data in the sequential run")
        first = beats[0] + warmup
        sequential = sum(first <= b < first + window for b in beats) * port_bytes / window

    row_miss = 0.0
    if "row_miss" in patterns:
        # each controller word from the next row of bank 0 (a row of every bank lies between)
        stride = row_words * banks * ratio
        cycles = start + _TIMEOUT + row_miss_cycles
        addrs = [((k // ratio) % SIM_ROWS * stride + k % ratio, start) for k in range(cycles)]
        _, beats = _run(board, port_bits, addrs, cycles, trfc_ns)
        if not beats:
            raise MemoryMeasureError(f"{port_bits}-bit port: no data in the row-miss run")
        row_miss = (sum(beats[0] <= b < beats[0] + row_miss_cycles for b in beats) * port_bytes
                    / row_miss_cycles)

    return MemoryTiming(
        board=board.name, port_bits=port_bits, controller_bits=native,
        sys_clk_hz=board.sys_clk_hz, litedram=_litedram_version(), read_latency=latency,
        row_hit_latency=hit, sequential_bytes_per_cycle=sequential,
        row_miss_bytes_per_cycle=row_miss, window_cycles=window,
        row_miss_cycles=row_miss_cycles if "row_miss" in patterns else 0,
        refresh_intervals=refresh_intervals if window and window_cycles is None else 0,
        trefi_cycles=trefi, trfc_cycles=trfc,
        peak_bytes_per_cycle=board.peak_bytes_per_sys_cycle, trfc_ns=trfc_ns)


def board_cycles(fast_cycles: float, read_beats: float, write_beats: float, beat_bytes: int,
                 bytes_per_cycle: float, read_spacing: int = 1) -> float:
    """Cycles on the board of work the fast model counts as ``fast_cycles``, when the memory
    moves ``bytes_per_cycle`` and the bridge stops the whole accelerator while it is late
    (:mod:`hw.board`): a bound, exact for back-to-back read streams and pessimistic
    elsewhere, never optimistic.

    The memory spends ``t = beat_bytes / bytes_per_cycle`` cycles on a beat. Consecutive read
    requests are at least ``read_spacing`` cycles apart
    (:func:`hw.timing.read_request_spacing`: 1 on the unpaced port, ``k`` on a port paced a
    beat every ``k`` cycles), so a read adds at most ``max(0, t - read_spacing)`` cycles to
    the memory's backlog, the stop it causes. A write shares the memory with the reads but
    may come in the same cycle as one (the LOAD and STORE engines run side by side): it is
    charged its whole ``t``. The backlog the accelerator waits for never exceeds the sum of
    these charges, whatever the order of the beats.

    >>> board_cycles(1000, 400, 0, 8, 6.4)
    1100.0
    >>> board_cycles(1000, 400, 10, 16, 6.4, read_spacing=2)
    1225.0

    Raises
    ------
    MemoryMeasureError
        ``bytes_per_cycle`` not positive, or ``read_spacing`` not a positive int.
    """
    if not bytes_per_cycle > 0:
        raise MemoryMeasureError(f"bytes_per_cycle must be > 0, got {bytes_per_cycle!r}")
    if not isinstance(read_spacing, int) or read_spacing < 1:
        raise MemoryMeasureError(f"read_spacing must be a positive int, got {read_spacing!r}")
    t = beat_bytes / bytes_per_cycle
    return fast_cycles + read_beats * max(0.0, t - read_spacing) + write_beats * t
