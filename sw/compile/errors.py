"""The compiler's errors: one hierarchy, each error naming the offending node, layer, value or
size.

::

    CompileError                  anything the compiler refuses (all ``compile_model`` raises)
    +-- IRError                   a malformed graph: unknown op, bad arity, attribute or shape
    +-- CaptureError              a model step the IR cannot express
    +-- PassError                 a pass pipeline that does not reach a fixpoint
    +-- LoweringError             a layer that cannot be lowered for this accelerator
    +-- PlanError                 a model that does not fit the accelerator's memories
    +-- ExecutableError           a saved executable that cannot be loaded
"""

from __future__ import annotations

__all__ = ["CaptureError", "CompileError", "ExecutableError", "IRError", "LoweringError",
           "PassError", "PlanError"]


class CompileError(ValueError):
    """A model or layer the compiler cannot compile for this accelerator."""


class IRError(CompileError):
    """A malformed graph (the message names the node or value)."""


class CaptureError(CompileError):
    """The model cannot be captured (the message names the op, the node and the module)."""


class PassError(CompileError):
    """The passes do not converge (the message names the rounds and the passes)."""


class LoweringError(CompileError):
    """A layer cannot be lowered for this accelerator (the message says why)."""


class PlanError(CompileError):
    """The model does not fit the accelerator's memories (the message gives the sizes)."""


class ExecutableError(CompileError):
    """A saved executable that cannot be loaded (corrupt, other version, inconsistent)."""
