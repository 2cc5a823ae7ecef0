"""The board simulation: the board's RTL under Verilator, spoken to over the host protocol.

:class:`BoardSim` builds :class:`hw.board.sim_top.BoardSimTop` (the accelerator under its DRAM
bridge and the host link, no UART and no DDR3 PHY) with the C++ harness
``sim/verilator/board_harness.cpp`` (both LiteDRAM native ports over one memory, with random
``cmd.ready``, read latencies and refresh stalls drawn from a seed) into a ``board_runner``
executable, and :meth:`BoardSim.open` starts it: the result is a transport (``write(bytes)``,
``read(n, timeout)``) over the runner's stdin and stdout, for :class:`sim.board.BoardLink` as
for the real board's UART. Builds are cached under ``build/board_sim/<key>/`` with
:mod:`sim.rtl`'s lock and Verilator options (a new build whenever the configuration, the board,
any ``hw/`` module, the harness or this module changes).

Examples
--------
Skipped in the doctest run (the first call builds the runner, minutes;
tests/hw/test_board_sim.py runs it):

>>> import dataclasses
>>> from hw.board.ecpix5 import ECPIX5
>>> from hw.config import AcceleratorConfig
>>> from sim.board import BoardLink
>>> board = dataclasses.replace(ECPIX5, dram_bytes=1 << 15)
>>> sim = BoardSim(board.accelerator_config(AcceleratorConfig(rows=2, cols=4)), board)
>>> with sim.open(seed=1) as transport:  # doctest: +SKIP
...     link = BoardLink(transport)
...     link.status().busy
False
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hw.board import protocol
from hw.board.ecpix5 import Board
from hw.board.sim_top import BOARD_SIM_TOP_NAME, BoardSimTop
from hw.config import AcceleratorConfig
from hw.generate import top_ports
from sim.errors import SimulationError
from sim.rtl import PORT_WORDS, ROOT, locked_build, verilate

__all__ = ["BoardSim", "BoardSimTransport", "BoardSimError"]

HARNESS = ROOT / "sim" / "verilator" / "board_harness.cpp"
DEFAULT_BUILD_ROOT = ROOT / "build" / "board_sim"
#: hw/ modules that do not change the generated Verilog.
_NOT_RTL = {"synth.py"}


class BoardSimError(SimulationError, RuntimeError):
    """The board runner failed (its message names the runner and has its stderr)."""


def _sources_digest() -> str:
    h = hashlib.sha256()
    hw = [p for p in sorted((ROOT / "hw").rglob("*.py")) if p.name not in _NOT_RTL]
    for path in hw + [HARNESS, PORT_WORDS, Path(__file__), ROOT / "sim" / "rtl.py"]:
        h.update(str(path.relative_to(ROOT)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


class BoardSim:
    """Build and start the Verilator board simulation for ``cfg`` on ``board``.

    Parameters
    ----------
    cfg:
        The accelerator configuration with the board's memory
        (:meth:`hw.board.ecpix5.Board.accelerator_config`).
    board:
        The board; its ``dram_bytes`` is the simulated memory (allocated in full: use a small
        one, ``dataclasses.replace(ECPIX5, dram_bytes=...)``).
    build_root:
        Cache directory (default ``build/board_sim`` in the repository).
    jobs:
        Parallel compile jobs (default 2).
    upconverter:
        The native ports are half the controller's width, behind LiteDRAM's up-converter: the
        bridge keeps its rules (:class:`hw.board.bridge.DramBridge`) and the harness models it
        (its gathering of commands; a misuse stops the run with an error). Default off: the
        ECPIX-5's ports have the controller's width.
    """

    def __init__(self, cfg: AcceleratorConfig, board: Board, *,
                 build_root: str | Path | None = None, jobs: int = 2, upconverter: bool = False):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        if not isinstance(board, Board):
            raise TypeError(f"board must be a hw.board.ecpix5.Board, got {board!r}")
        self.cfg = cfg
        self.board = board
        self.build_root = Path(build_root) if build_root else DEFAULT_BUILD_ROOT
        self.jobs = jobs
        self.upconverter = bool(upconverter)
        self._runner: Path | None = None

    @property
    def build_dir(self) -> Path:
        key = hashlib.sha256((self.cfg.to_json() + repr(self.board) + str(self.upconverter)
                              + _sources_digest())
                             .encode()).hexdigest()[:16]
        return self.build_root / key

    def build(self, verbose: bool = False) -> Path:
        """The ``board_runner`` executable, built unless cached (the sources are hashed on the
        first call only)."""
        if self._runner is not None and self._runner.exists():
            return self._runner
        out = self.build_dir

        def make() -> None:
            print(f"sim.board_sim: building the board runner for a {self.cfg.rows}x"
                  f"{self.cfg.cols} array in {out} (minutes; cached afterwards)",
                  file=sys.stderr, flush=True)
            from amaranth.back import verilog

            top = BoardSimTop(self.cfg, self.board, upconverter=self.upconverter)
            text = verilog.convert(top, name=BOARD_SIM_TOP_NAME, ports=top_ports(top),
                                   emit_src=False)
            (out / f"{BOARD_SIM_TOP_NAME}.v").write_text(text)
            (out / "board_config.h").write_text("\n".join([
                "// Generated by sim/board_sim.py for one configuration and board.",
                "#pragma once",
                f"#define BOARD_WORD_BYTES {self.board.port_bits // 8}",
                f"#define BOARD_DRAM_BYTES {self.board.dram_bytes}ull",
                "",
            ]))
            shutil.copy(HARNESS, out / "board_harness.cpp")
            shutil.copy(PORT_WORDS, out / PORT_WORDS.name)
            verilate(out, [f"{BOARD_SIM_TOP_NAME}.v", "board_harness.cpp"], prefix="Vboard",
                     top_module=BOARD_SIM_TOP_NAME, output="board_runner", jobs=self.jobs)

        self._runner = locked_build(out, "board_runner", make, verbose=verbose)
        return self._runner

    def open(self, seed: int = 1, *, ready_percent: int = 70, max_latency: int = 25,
             refresh_every: int = 600, refresh_cycles: int = 40) -> BoardSimTransport:
        """Start the simulated board; returns its transport (close it, or use ``with``).

        Parameters
        ----------
        seed:
            Seed of the simulated memory's random choices.
        ready_percent:
            Percent of cycles a native port accepts a command (outside refreshes).
        max_latency:
            Longest read latency of the simulated LiteDRAM, cycles (the shortest is 3).
        refresh_every, refresh_cycles:
            Both ports stall for ``refresh_cycles`` about every ``refresh_every`` cycles.
        """
        for name, v, low in (("seed", seed, 0), ("ready_percent", ready_percent, 1),
                             ("max_latency", max_latency, 3), ("refresh_every", refresh_every, 2),
                             ("refresh_cycles", refresh_cycles, 0)):
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
        if ready_percent > 100:
            raise ValueError(f"ready_percent must be at most 100, got {ready_percent!r}")
        args = ["--seed", seed, "--idle-cycles",
                protocol.frame_gap_cycles(self.board.sys_clk_hz) + 1000,
                "--ready-percent", ready_percent, "--max-latency", max_latency,
                "--refresh-every", refresh_every, "--refresh-cycles", refresh_cycles,
                "--upconverter", int(self.upconverter)]
        return BoardSimTransport([str(self.build()), *map(str, args)],
                                 name=f"board-sim(seed={seed})")


class BoardSimTransport:
    """A running board simulation as a byte transport (:class:`sim.board.Transport`).

    Attributes
    ----------
    name:
        Names the simulation in the driver's messages.
    stats:
        After :meth:`close`: the runner's summary (cycles simulated, commands per native port).
    """

    def __init__(self, cmd: list[str], name: str):
        self.name = name
        self.stats: dict[str, int] = {}
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._stderr)

    def _dead(self) -> BoardSimError:
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self._stderr.seek(0)
        err = self._stderr.read().decode(errors="replace").strip()
        return BoardSimError(f"{self.name}: the board runner exited (rc={self._proc.poll()}): "
                             f"{err[-2000:]}")

    def write(self, data: bytes) -> None:
        """Send ``data`` to the link's receiver."""
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise self._dead() from None

    def read(self, n: int, timeout: float) -> bytes:
        """Up to ``n`` bytes the link sent; fewer (possibly none) after ``timeout`` seconds."""
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], max(0.0, left))
            if ready:
                data = os.read(fd, n)
                if not data:
                    raise self._dead()
                return data
            if left <= 0:
                return b""

    def close(self) -> None:
        """End the simulation (end of its stdin) and collect its summary."""
        if self._proc.stdin and not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()
            except BrokenPipeError:
                pass
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._stderr.seek(0)
        lines = self._stderr.read().decode(errors="replace").strip().splitlines()
        self._stderr.close()
        if lines:
            try:
                self.stats = json.loads(lines[-1])
            except json.JSONDecodeError:
                self.stats = {}

    def __enter__(self) -> BoardSimTransport:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
