"""The graph compiler: a LLaMA-style model to one :class:`Executable` for the accelerator.

capture (:mod:`.capture`) -> IR (:mod:`.ir`) -> passes (:mod:`.passes`) -> partition and
memory plan (:mod:`.plan`) -> lowering (:mod:`.lower`: nodes to layers; :mod:`.tiling`,
:mod:`.schedule`, :mod:`.relocation`: layers to relocatable programs) -> :class:`Executable`
(:mod:`.executable`). :mod:`.interpret` defines what every IR op computes; :mod:`.layers`
compiles a few layers alone through the same tiling, scheduling, layout and relocation.
"""

from sw.compile.compiler import CompileOptions, compile_model
from sw.compile.errors import CompileError, LoweringError, PlanError
from sw.compile.executable import Executable, ExecutableError

__all__ = ["CompileError", "CompileOptions", "Executable", "ExecutableError", "LoweringError",
           "PlanError", "compile_model"]
