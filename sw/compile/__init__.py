"""The graph compiler: a LLaMA-style model to one :class:`Executable` for the accelerator.

capture (:mod:`.capture`) -> IR (:mod:`.ir`: types, the op registry, graphs, the interpreter)
-> passes (:mod:`.passes`) -> partition and memory plan (:mod:`.plan`) -> lowering
(:mod:`.lower`: nodes to layers; :mod:`.tiling`, :mod:`.schedule`, :mod:`.relocation`: layers
to relocatable programs) -> :class:`Executable` (:mod:`.executable`). :mod:`.layers` compiles a
few layers alone through the same tiling, scheduling, layout and relocation. Every error is a
:class:`CompileError` (:mod:`.errors`).
"""

from sw.compile.compiler import CompileOptions, compile_model
from sw.compile.errors import (
    CaptureError,
    CompileError,
    ExecutableError,
    IRError,
    LoweringError,
    PassError,
    PlanError,
)
from sw.compile.executable import Executable

__all__ = ["CaptureError", "CompileError", "CompileOptions", "Executable", "ExecutableError",
           "IRError", "LoweringError", "PassError", "PlanError", "compile_model"]
