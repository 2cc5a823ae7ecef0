"""One interface to every backend: ``make_backend(name, cfg).run(program, dram)``.

=================  =============================================================
name               backend
=================  =============================================================
``model``          the fast model (:mod:`sim.model`), values and timing
``model-timing``   the fast model, timing only (no DRAM image, no values)
``rtl``            the Verilator build of the Amaranth RTL (:mod:`sim.rtl`)
``netlist``        the Verilator build of the Yosys netlist (:mod:`sim.netlist`)
=================  =============================================================

Each returns a :class:`sim.result.RunResult` for a program (instruction words, objects or
bytes) and a DRAM image; ``values`` says whether the result carries the final DRAM. The image
passed in is left as it was, except where the caller asks the ``model`` backend to run
``in_place`` (an optional keyword of its ``run``, the only backend with it): then the program
works on that array and the result's ``dram`` is the same array (:meth:`sim.model.FastModel.run`
says what it holds after an error). The runtime uses it when ``run`` takes it
(:func:`runs_in_place`), saving a copy of the whole memory per program.
"""

from __future__ import annotations

import inspect
from typing import Protocol, runtime_checkable

import numpy as np

from hw.config import AcceleratorConfig
from sim.model import FastModel
from sim.netlist import NetlistBackend
from sim.result import RunResult
from sim.rtl import RTLBackend

__all__ = ["BACKENDS", "Backend", "make_backend", "runs_in_place"]

BACKENDS = ("model", "model-timing", "rtl", "netlist")


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

    def run(self, program, dram: np.ndarray | None, *, trace: bool = False) -> RunResult:
        """Run ``program`` on ``dram`` (ignored when ``values`` is false)."""


class _Model:
    traces = True

    def __init__(self, cfg: AcceleratorConfig, values: bool):
        self.cfg, self.values = cfg, values
        self.name = "model" if values else "model-timing"
        self._model = FastModel(cfg)

    def run(self, program, dram, *, trace=False, in_place=False) -> RunResult:
        if self.values:
            return self._model.run(program, dram, trace=trace, in_place=in_place)
        return self._model.run(program, timing_only=True, trace=trace)


def runs_in_place(backend: Backend) -> bool:
    """Whether ``backend.run`` takes ``in_place`` (work on the caller's DRAM array)."""
    try:
        return "in_place" in inspect.signature(backend.run).parameters
    except (TypeError, ValueError):
        return False


def make_backend(name: str, cfg: AcceleratorConfig) -> Backend:
    """The backend called ``name`` (one of :data:`BACKENDS`) for ``cfg``."""
    if name in ("model", "model-timing"):
        return _Model(cfg, name == "model")
    if name == "rtl":
        return RTLBackend(cfg)
    if name == "netlist":
        return NetlistBackend(cfg)
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")
