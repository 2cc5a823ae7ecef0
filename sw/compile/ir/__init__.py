"""The IR: value types (:mod:`.types`), the op registry (:mod:`.ops`: one definition per op,
its kernel included), graphs (:mod:`.graph`) and their interpreter (:mod:`.interpret`).

The compiler builds and transforms graphs; the runtime runs the host nodes of a compiled step
with the registry's kernels. Both read the op set from here and nowhere else.
"""

from sw.compile.errors import IRError
from sw.compile.ir.graph import Graph, Node
from sw.compile.ir.interpret import Env, Interpreter, Numerics, run_node
from sw.compile.ir.ops import (
    OPS,
    Kernel,
    LinearLayer,
    OpDef,
    linear_layers,
    rope_rows,
    stream_cycles,
)
from sw.compile.ir.types import SYMBOL, TensorType

__all__ = ["OPS", "SYMBOL", "Env", "Graph", "IRError", "Interpreter", "Kernel", "LinearLayer",
           "Node", "Numerics", "OpDef", "TensorType", "linear_layers", "rope_rows", "run_node",
           "stream_cycles"]
