"""DRAM initialisation and read leveling, run by the host over LiteDRAM's control bus.

The generated core has no CPU (:mod:`hw.board.litedram`), so the host does what LiteX's BIOS
does at boot (``liblitedram/sdram.c``: ``sdram_init``, ``sdram_leveling``) through two
functions of its link (:class:`sim.board.BoardLink`), ``csr_write(addr, value)`` and
``csr_read(addr) -> value``: 32-bit accesses of the core's control bus at Wishbone word
addresses, a register's byte address of ``csr.csv``
(:attr:`hw.board.litedram.GeneratedCore.csr`) divided by 4. Registers wider than 32 bits
span consecutive words, most significant word first (LiteX's CSR ordering).

:func:`initialize` runs, in order:

1. software control of the DFI (``sdram_dfii_control = CKE | ODT | RESET_N``), the
   ``ddrctrl_init_done`` and ``ddrctrl_init_error`` registers cleared;
2. LiteDRAM's initialisation sequence (``litedram.init``'s, kept by the generator in
   ``init.json``): per step, the address and bank of phase 0, then either a DFII control word
   or a command issued on phase 0, then the step's wait (:func:`sequence_ops`);
3. read leveling (the PHY is ``SDRAM_PHY_READ_LEVELING_CAPABLE``; the ECP5 PHY has no write
   leveling), per byte lane ("module") as the BIOS's ``sdram_read_leveling``: for each read
   bitslip, every read delay is scored with three pseudo-random patterns written and read
   back through the DFII (a lane's bytes compared, plus the PHY's burst detector); the best
   bitslip is kept and the delay set to the centre of the longest run of working delays
   (``sdram_leveling_center_module``);
4. hardware control (``sdram_dfii_control = SEL``), then ``ddrctrl_init_error`` (set when a
   lane found no working delay or failed its final check) and ``ddrctrl_init_done``: the
   core's user ports open only when done and not in error.

The BIOS's ``cdelay(n)`` busy-waits ``n`` loop iterations of at least one ``sys`` cycle; the
host waits ``n`` ``sys`` cycles (``wait(seconds)``, default :func:`time.sleep`), its lower
bound. The BIOS's memory test after leveling is not part of this: it needs the memory port
(the host link's job after :func:`initialize`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Protocol

from hw.board.ecpix5 import ECPIX5, Board

__all__ = ["CsrBus", "LaneResult", "InitResult", "TEST_SEEDS", "lfsr32", "pattern_words",
           "sequence_ops", "initialize", "initialize_board"]

#: The seeds of the BIOS's read-leveling test patterns (``_seed_array``).
TEST_SEEDS = (42, 84, 36)
#: Taps of LiteX's 32-bit Galois LFSR (``libbase/lfsr.h``, ``lfsr_taps[32]``).
_LFSR32_TAPS = 0x80200003


class CsrBus(Protocol):
    """What :func:`initialize` needs of the host link."""

    def csr_write(self, addr: int, value: int) -> None:
        """Write a 32-bit word at word address ``addr``."""

    def csr_read(self, addr: int) -> int:
        """Read the 32-bit word at word address ``addr``."""


@dataclasses.dataclass(frozen=True)
class LaneResult:
    """Read leveling of one byte lane.

    Attributes
    ----------
    bitslip:
        The chosen read bitslip.
    delay:
        The read delay set (the centre of the working window), or -1 when none worked.
    window:
        ``(first, last)`` working delays of the chosen bitslip, or None.
    scores:
        Each bitslip's score (higher is better; every delay that worked counts more than any
        number of errors avoided).
    ok:
        The final check at ``delay`` read the patterns back without error.
    """

    bitslip: int
    delay: int
    window: tuple[int, int] | None
    scores: tuple[int, ...]
    ok: bool


@dataclasses.dataclass(frozen=True)
class InitResult:
    """What :func:`initialize` did.

    Attributes
    ----------
    lanes:
        Read leveling per byte lane.
    error:
        The value written to ``ddrctrl_init_error``.
    """

    lanes: tuple[LaneResult, ...]
    error: bool

    @property
    def ok(self) -> bool:
        """Initialised without error."""
        return not self.error


def lfsr32(prev: int) -> int:
    """One step of LiteX's 32-bit Galois LFSR (``lfsr(32, prev)``)."""
    lsb = prev & 1
    prev >>= 1
    return prev ^ (_LFSR32_TAPS if lsb else 0)


def pattern_words(seed: int, phases: int, nbytes: int) -> list[bytes]:
    """The BIOS's pseudo-random test data: ``phases`` words of ``nbytes`` bytes, each bit one
    LFSR step from ``seed`` (least significant bit first)."""
    prv, words = seed, []
    for _ in range(phases):
        word = bytearray()
        for _ in range(nbytes):
            value = 0
            for bit in range(8):
                prv = lfsr32(prv)
                value |= (prv & 1) << bit
            word.append(value)
        words.append(bytes(word))
    return words


class _Dram:
    """The registers and PHY facts of one generated core, and the BIOS's helpers over a bus."""

    def __init__(self, bus: CsrBus, csr: dict[str, int], csr_size: dict[str, int], init: dict,
                 sys_clk_hz: float, wait: Callable[[float], None]):
        self.bus, self.csr, self.size = bus, csr, csr_size
        self.bits = init["dfii"]
        phy = init["phy"]
        if not phy.get("read_leveling") or phy.get("write_leveling"):
            raise ValueError(f"this procedure is the ECP5 PHY's (read leveling only); the "
                             f"core's PHY {phy.get('phytype')!r} has read_leveling="
                             f"{phy.get('read_leveling')}, write_leveling="
                             f"{phy.get('write_leveling')}")
        self.phases, self.modules = phy["nphases"], phy["strobes"]
        self.delays, self.bitslips = phy["delays"], phy["bitslips"]
        self.rdphase, self.wrphase = phy["rdphase"], phy["wrphase"]
        self.pix_bytes = phy["dfi_databits"] // 8
        self.dq_dqs_ratio = phy["databits"] // phy["strobes"]
        if self.dq_dqs_ratio != 8:
            raise ValueError(f"read leveling compares one byte per lane edge; the core has "
                             f"{self.dq_dqs_ratio} DQ per DQS")
        self.sequence = init["sequence"]
        self.sys_clk_hz, self._wait = sys_clk_hz, wait

    # ------------------------------------------------------------------ register access
    def write(self, name: str, value: int) -> None:
        words = self.size.get(name, 1)
        for i in range(words):
            self.bus.csr_write(self.csr[name] // 4 + i,
                               (value >> (32 * (words - 1 - i))) & 0xFFFF_FFFF)

    def read(self, name: str) -> int:
        value = 0
        for i in range(self.size.get(name, 1)):
            value = (value << 32) | (self.bus.csr_read(self.csr[name] // 4 + i) & 0xFFFF_FFFF)
        return value

    def cdelay(self, n: int) -> None:
        if n:
            self._wait(n / self.sys_clk_hz)

    def cmd(self, expr: str) -> int:
        """The value of a C expression of DFII bits (``DFII_COMMAND_RAS|DFII_COMMAND_CS``)."""
        return sum(self.bits[name.strip()] for name in expr.split("|"))

    def command(self, phase: int, value: int) -> None:
        self.write(f"sdram_dfii_pi{phase}_command", value)
        self.write(f"sdram_dfii_pi{phase}_command_issue", 1)

    # ------------------------------------------------------------------ BIOS steps
    def software_control(self, on: bool) -> None:
        want = (self.bits["DFII_CONTROL_CKE"] | self.bits["DFII_CONTROL_ODT"]
                | self.bits["DFII_CONTROL_RESET_N"]) if on else self.bits["DFII_CONTROL_SEL"]
        if self.read("sdram_dfii_control") != want:
            self.write("sdram_dfii_control", want)

    def run_sequence(self) -> None:
        for _comment, a, ba, cmd, delay in self.sequence:
            self.write("sdram_dfii_pi0_address", a)
            self.write("sdram_dfii_pi0_baddress", ba)
            if cmd.startswith("DFII_CONTROL"):
                self.write("sdram_dfii_control", self.cmd(cmd))
            else:
                self.command(0, self.cmd(cmd))
            self.cdelay(delay)

    def action(self, module: int, register: str) -> None:
        """``sdram_leveling_action``: select the lane, pulse ``register``, deselect, then
        toggle every lane's select (the ECP5 PHY's DQSBUFM pause, to resynchronise them)."""
        self.write("ddrphy_dly_sel", 1 << module)
        self.write(register, 1)
        self.write("ddrphy_dly_sel", 0)
        self.write("ddrphy_dly_sel", (1 << self.modules) - 1)
        self.write("ddrphy_dly_sel", 0)

    def check_pattern(self, module: int, seed: int) -> int:
        """``sdram_write_read_check_test_pattern``: bit errors of lane ``module`` (+1 when the
        PHY's burst detector saw no read burst on it)."""
        prs = pattern_words(seed, self.phases, self.pix_bytes)
        rw = self.bits
        self.write("sdram_dfii_pi0_address", 0)  # activate row 0 of bank 0
        self.write("sdram_dfii_pi0_baddress", 0)
        self.command(0, rw["DFII_COMMAND_RAS"] | rw["DFII_COMMAND_CS"])
        self.cdelay(15)
        for p in range(self.phases):
            self.write(f"sdram_dfii_pi{p}_wrdata", int.from_bytes(prs[p], "big"))
        self.write(f"sdram_dfii_pi{self.wrphase}_address", 0)
        self.write(f"sdram_dfii_pi{self.wrphase}_baddress", 0)
        self.command(self.wrphase, rw["DFII_COMMAND_CAS"] | rw["DFII_COMMAND_WE"]
                     | rw["DFII_COMMAND_CS"] | rw["DFII_COMMAND_WRDATA"])
        self.cdelay(15)
        self.write("ddrphy_burstdet_clr", 1)
        self.write(f"sdram_dfii_pi{self.rdphase}_address", 0)
        self.write(f"sdram_dfii_pi{self.rdphase}_baddress", 0)
        self.command(self.rdphase, rw["DFII_COMMAND_CAS"] | rw["DFII_COMMAND_CS"]
                     | rw["DFII_COMMAND_RDDATA"])
        self.cdelay(15)
        self.write("sdram_dfii_pi0_address", 0)  # precharge
        self.write("sdram_dfii_pi0_baddress", 0)
        self.command(0, rw["DFII_COMMAND_RAS"] | rw["DFII_COMMAND_WE"] | rw["DFII_COMMAND_CS"])
        self.cdelay(15)
        # A lane's byte on the negative and the positive edge of each phase's word (its
        # bytes are big-endian in the register).
        nebo = self.pix_bytes // 2 - 1 - module
        pebo = nebo + self.pix_bytes // 2
        errors = 0
        for p in range(self.phases):
            got = self.read(f"sdram_dfii_pi{p}_rddata").to_bytes(self.pix_bytes, "big")
            errors += sum(bin(prs[p][b] ^ got[b]).count("1") for b in (pebo, nebo))
        if not (self.read("ddrphy_burstdet_seen") >> module) & 1:
            errors += 1
        return errors

    def run_patterns(self, module: int) -> int:
        return sum(self.check_pattern(module, seed) for seed in TEST_SEEDS)

    def scan(self, module: int) -> int:
        """``sdram_read_leveling_scan_module``: the score of the current bitslip."""
        max_errors = len(TEST_SEEDS) * 8 * self.phases * self.pix_bytes // self.modules
        score = 0
        self.action(module, "ddrphy_rdly_dq_rst")
        for _ in range(self.delays):
            errors = self.run_patterns(module)
            score += (errors == 0) * max_errors * self.delays + (max_errors - errors)
            self.action(module, "ddrphy_rdly_dq_inc")
        return score

    def center(self, module: int) -> tuple[int, tuple[int, int] | None, bool]:
        """``sdram_leveling_center_module`` of the read delay: ``(delay set, window, the
        final check passed)``."""
        delay, working, delay_min = 0, False, -1
        self.action(module, "ddrphy_rdly_dq_rst")
        while True:  # the smallest working delay (two working in a row: edges are spotty)
            last, working = working, self.run_patterns(module) == 0
            if working and last:
                delay_min = delay - 1
                break
            delay += 1
            if delay >= self.delays:
                break
            self.action(module, "ddrphy_rdly_dq_inc")
        delay_max = cur_min = delay_min
        while True:  # the longest run of working delays from there (as the BIOS: one more
            # test after a fruitless first loop, at the wrapped delay)
            if self.run_patterns(module) == 0:
                if delay - cur_min > delay_max - delay_min:
                    delay_min, delay_max = cur_min, delay
            else:
                cur_min = delay + 1
            delay += 1
            if delay >= self.delays:
                break
            self.action(module, "ddrphy_rdly_dq_inc")
        if delay_min < 0:
            return -1, None, False
        mid = (delay_min + delay_max) // 2 % self.delays
        ok = False
        for _ in range(8):  # set the delay to the middle and check, 8 tries
            self.action(module, "ddrphy_rdly_dq_rst")
            self.cdelay(100)
            for _ in range(mid):
                self.action(module, "ddrphy_rdly_dq_inc")
                self.cdelay(100)
            if self.run_patterns(module) == 0:
                ok = True
                break
        return mid, (delay_min, delay_max), ok

    def read_leveling(self, module: int) -> LaneResult:
        """``sdram_read_leveling`` of one lane."""
        scores = []
        best_score, best_bitslip = 0, 0
        self.action(module, "ddrphy_rdly_dq_bitslip_rst")
        for bitslip in range(self.bitslips):
            score = self.scan(module)
            self.center(module)
            scores.append(score)
            if score > best_score:
                best_score, best_bitslip = score, bitslip
            if bitslip == self.bitslips - 1:
                break
            self.action(module, "ddrphy_rdly_dq_bitslip")
        self.action(module, "ddrphy_rdly_dq_bitslip_rst")
        for _ in range(best_bitslip):
            self.action(module, "ddrphy_rdly_dq_bitslip")
        delay, window, ok = self.center(module)
        return LaneResult(best_bitslip, delay, window, tuple(scores), ok)


def sequence_ops(csr: dict[str, int], csr_size: dict[str, int], init: dict,
                 sys_clk_hz: float) -> list[tuple]:
    """LiteDRAM's initialisation sequence (step 2 of :func:`initialize`) as operations:
    ``("write", word address, value)`` and ``("wait", seconds)``.

    Parameters
    ----------
    csr, csr_size, init:
        The core's :attr:`~hw.board.litedram.GeneratedCore.csr`, ``csr_size`` and ``init``.
    sys_clk_hz:
        The core's ``sys`` clock (a ``cdelay(n)`` is ``n`` of its cycles).
    """
    ops: list[tuple] = []

    class _Record:
        def csr_write(self, addr, value):
            ops.append(("write", addr, value))

        def csr_read(self, addr):
            raise AssertionError("the initialisation sequence reads nothing")

    _Dram(_Record(), csr, csr_size, init, sys_clk_hz,
          lambda s: ops.append(("wait", s))).run_sequence()
    return ops


def initialize(bus: CsrBus, csr: dict[str, int], csr_size: dict[str, int], init: dict,
               sys_clk_hz: float, *, wait: Callable[[float], None] = time.sleep
               ) -> InitResult:
    """Initialise the DRAM through ``bus`` and set ``ddrctrl_init_done`` / ``_error``.

    Parameters
    ----------
    bus:
        The host link (:class:`CsrBus`).
    csr, csr_size, init:
        The generated core's register map and LiteDRAM's sequence and PHY settings
        (:class:`hw.board.litedram.GeneratedCore`).
    sys_clk_hz:
        The core's ``sys`` clock (:attr:`hw.board.ecpix5.Board.sys_clk_hz`).
    wait:
        Called with the seconds of each wait of the sequence (default :func:`time.sleep`).

    Returns
    -------
    InitResult
        The leveling of each lane; ``error`` is what ``ddrctrl_init_error`` was set to.
    """
    missing = sorted({"sdram_dfii_control", "ddrctrl_init_done", "ddrctrl_init_error",
                      "ddrphy_dly_sel", "ddrphy_burstdet_seen"} - set(csr))
    if missing:
        raise ValueError(f"the core's registers lack {missing}")
    dram = _Dram(bus, csr, csr_size, init, sys_clk_hz, wait)
    dram.software_control(True)
    dram.write("ddrctrl_init_done", 0)
    dram.write("ddrctrl_init_error", 0)
    dram.run_sequence()
    dram.software_control(True)  # sdram_leveling: the lanes' delays and bitslips from 0
    for module in range(dram.modules):
        dram.action(module, "ddrphy_rdly_dq_rst")
        dram.action(module, "ddrphy_rdly_dq_bitslip_rst")
    lanes = tuple(dram.read_leveling(module) for module in range(dram.modules))
    dram.software_control(False)  # the end of sdram_leveling, and of sdram_init
    dram.software_control(False)
    error = not all(lane.ok for lane in lanes)
    if error:
        dram.write("ddrctrl_init_error", 1)
    dram.write("ddrctrl_init_done", 1)
    return InitResult(lanes, error)


def initialize_board(bus: CsrBus, board: Board = ECPIX5, *,
                     wait: Callable[[float], None] = time.sleep) -> InitResult:
    """:func:`initialize` with the register map and sequence of ``board``'s generated core
    (:func:`hw.board.litedram.generate`, from its cache) and the board's ``sys`` clock.

    Parameters
    ----------
    bus:
        The host link (:class:`CsrBus`), e.g. :class:`sim.board.BoardLink`.
    board:
        The board (default :data:`hw.board.ecpix5.ECPIX5`).
    wait:
        As :func:`initialize`.
    """
    from hw.board.litedram import generate
    core = generate(board)
    return initialize(bus, core.csr, core.csr_size, core.init, board.sys_clk_hz, wait=wait)
