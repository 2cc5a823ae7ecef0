"""The simulators' one error base: :class:`SimulationError` (a program a backend cannot run
faithfully, an RTL build that failed, a run that did not finish)."""

from __future__ import annotations

__all__ = ["SimulationError"]


class SimulationError(Exception):
    """A backend could not simulate a program; the subclass says why."""
