"""One interface to every backend: ``make_backend(name, cfg).run(program, dram)``.

=================  =============================================================
name               backend
=================  =============================================================
``model``          the fast model (:mod:`sim.model`), values and timing
``model-timing``   the fast model, timing only (no DRAM image, no values)
``rtl``            the Verilator build of the Amaranth RTL (:mod:`sim.rtl`)
``netlist``        the Verilator build of the Yosys netlist (:mod:`sim.netlist`)
``board``          the ECPIX-5 board over its UART (:mod:`sim.board_backend`; ``port=``)
``board-sim``      the board's RTL under Verilator, over the same host link
                   (:mod:`sim.board_sim`; ``seed=`` of its memory's random latencies)
=================  =============================================================

The two board backends (:data:`BOARD_BACKENDS`) take a configuration with the board's memory
(:meth:`hw.board.ecpix5.Board.accelerator_config`); ``board-sim`` simulates a board whose DRAM
is ``cfg``'s.

Each returns a :class:`sim.result.RunResult` for a program (instruction words, objects or
bytes) and a DRAM image; ``values`` says whether the result carries the final DRAM. The image
passed in is left as it was, except where the caller asks the ``model`` backend to run
``in_place`` (an optional keyword of its ``run``, the only backend with it): then the program
works on that array and the result's ``dram`` is the same array (:meth:`sim.model.FastModel.run`
says what it holds after an error). The runtime uses it when ``run`` takes it
(:func:`runs_in_place`), saving a copy of the whole memory per program.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

import numpy as np

from hw.board.ecpix5 import ECPIX5, Board
from hw.config import AcceleratorConfig
from sim.board import BoardLink, SerialTransport
from sim.board_backend import BoardBackend
from sim.board_sim import BoardSim
from sim.model import FastModel
from sim.netlist import NetlistBackend
from sim.result import RunResult
from sim.rtl import RTLBackend

__all__ = ["BACKENDS", "BOARD_BACKENDS", "Backend", "make_backend", "runs_in_place"]

#: The simulators, which need nothing but a configuration.
BACKENDS = ("model", "model-timing", "rtl", "netlist")
#: The board and its simulation, which talk over the host link (:mod:`sim.board`).
BOARD_BACKENDS = ("board", "board-sim")


@runtime_checkable
class Backend(Protocol):
    """What the runtime needs of a backend.

    The fast model's backend (``model``, ``model-timing``), :class:`sim.rtl.RTLBackend` and
    :class:`sim.netlist.NetlistBackend` each have these members; ``isinstance(b, Backend)``
    checks that they are present (tests/sim/test_backends.py also checks their signatures).
    """

    name: str
    cfg: AcceleratorConfig
    values: bool
    traces: bool

    def run(self, program, dram: np.ndarray | None, *, trace: bool = False,
            regs: Mapping[int, int] | None = None) -> RunResult:
        """Run ``program`` on ``dram`` (ignored when ``values`` is false) with the run-time
        registers ``regs`` (``{register: value}``, :func:`hw.isa.reg_values`; missing ones 0)."""


class _Model:
    traces = True

    def __init__(self, cfg: AcceleratorConfig, values: bool):
        self.cfg, self.values = cfg, values
        self.name = "model" if values else "model-timing"
        self._model = FastModel(cfg)

    def run(self, program, dram, *, trace=False, regs=None, in_place=False) -> RunResult:
        if self.values:
            return self._model.run(program, dram, trace=trace, regs=regs, in_place=in_place)
        return self._model.run(program, timing_only=True, trace=trace, regs=regs)


def runs_in_place(backend: Backend) -> bool:
    """Whether ``backend.run`` takes ``in_place`` (work on the caller's DRAM array)."""
    try:
        return "in_place" in inspect.signature(backend.run).parameters
    except (TypeError, ValueError):
        return False


def make_backend(name: str, cfg: AcceleratorConfig, *, port: str | None = None,
                 seed: int = 1, board: Board = ECPIX5) -> Backend:
    """The backend called ``name`` (one of :data:`BACKENDS` or :data:`BOARD_BACKENDS`) for
    ``cfg``.

    ``port`` is the board's serial port (``board``); ``seed`` seeds the simulated memory's
    random latencies and refresh stalls (``board-sim``); ``board`` is the board either talks
    to. A board backend holds its link open: call its ``close()`` when done.
    """
    if name in ("model", "model-timing"):
        return _Model(cfg, name == "model")
    if name == "rtl":
        return RTLBackend(cfg)
    if name == "netlist":
        return NetlistBackend(cfg)
    if name == "board":
        if not port:
            raise ValueError("the board backend needs the board's serial port (port=...)")
        return BoardBackend(cfg, BoardLink(SerialTransport(port)), board)
    if name == "board-sim":
        sim = BoardSim(cfg, dataclasses.replace(board, dram_bytes=cfg.memory.size_bytes))
        return BoardBackend(cfg, BoardLink(sim.open(seed)), sim.board)
    raise ValueError(f"unknown backend {name!r}; choose one of "
                     f"{', '.join(BACKENDS + BOARD_BACKENDS)}")
