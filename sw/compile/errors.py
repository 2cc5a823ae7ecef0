"""The compiler's errors: each names the offending node, layer, value or size."""

from __future__ import annotations

__all__ = ["CompileError", "LoweringError", "PlanError"]


class CompileError(ValueError):
    """A model or layer the compiler cannot compile for this accelerator."""


class LoweringError(CompileError):
    """A layer cannot be lowered for this accelerator (the message says why)."""


class PlanError(CompileError):
    """The model does not fit the accelerator's memories (the message gives the sizes)."""
