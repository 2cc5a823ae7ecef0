"""The op registry: one definition per IR operation.

Every op of the IR is one :class:`OpDef` in :data:`OPS`, in the manner of MLIR's ODS or TVM's
op registry. The entry is the single source of what the rest of the toolkit knows about the
op:

=================  ==================================================================
field              read by
=================  ==================================================================
``arity``          :meth:`~sw.compile.ir.Graph.validate`
``attrs``          :meth:`~sw.compile.ir.Graph.validate` (names, types, required)
``shape``          :meth:`~sw.compile.ir.Graph.validate` (output types from input types)
``kernel``         the interpreter and the runtime's host nodes (what the op computes)
``streams``        the partition (where it may run: on the accelerator, streaming
                   ``"weights"`` or the ``"kv"`` cache as a program's weight operand) and
                   the runtime (which prologue/epilogue an accelerator node needs)
``vector``         the partition and the runtime: the vector engine's sub-op
                   (:class:`hw.isa.VecFunc`) the op lowers to -- one VEC per row -- on a
                   configuration with the engine (:attr:`~hw.config.AcceleratorConfig.has_vector`)
``kv_state``       the runtime (ops that touch the KV cache kept in accelerator memory)
``side_effect``    dead-code elimination (never removed)
``aten``           capture (ATen ops translated one to one outside leaf modules)
``cost``           the runtime's cost model (on-chip cycles of the op as host work)
=================  ==================================================================

How an accelerator op becomes a program is its *lowering* (:data:`sw.compile.lower.LOWERINGS`;
a ``vector`` op's: :data:`sw.compile.vector.VECTOR_LOWERINGS`), kept beside the other
lowering rules; adding an op is one entry here plus, if it may run on the accelerator, its
lowering (docs/architecture.md walks through an example).

Example
-------
>>> OPS["rmsnorm"].arity, sorted(OPS["rmsnorm"].attrs)
((1, 1), ['eps', 'weight'])
>>> [name for name, d in OPS.items() if d.streams]
['linear', 'linears', 'attn_scores', 'attn_values']
>>> {name: d.vector.name for name, d in OPS.items() if d.vector}
{'rmsnorm': 'RMSNORM', 'rope': 'ROPE', 'softmax': 'SOFTMAX', 'silu_gate': 'SILU_GATE', 'add': 'ADD'}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import torch
import torch.nn.functional as F

from hw.config import AcceleratorConfig
from hw.isa import VecFunc
from hw.numerics import (
    add_vector,
    gemm_acc_torch,
    golden_linear_torch,
    kv4_key_group,
    kv_rows,
    requant_amax_torch,
    rms_norm_vector,
    rope_vector,
    scores_epilogue,
    scores_prologue,
    scores_prologue_vector,
    scores_vector,
    silu_gate_vector,
    softmax_vector,
    value_amax_torch,
    values_epilogue,
    values_prologue,
)
from sw.compile.ir.types import SYMBOL, TensorType
from sw.models.llama import apply_rotary, attention_probs, causal_mask, rms_norm

if TYPE_CHECKING:
    from sw.compile.ir.graph import Node
    from sw.compile.ir.interpret import Env

__all__ = ["OPS", "OpDef", "Attr", "Kernel", "ShapeRule", "Cost", "LinearLayer",
           "linear_layers", "stream_cycles", "free", "describe", "rope_rows"]

#: ``kernel(node, input tensors, env) -> output tensors``.
Kernel = Callable[["Node", list, "Env"], tuple]
#: ``rule(node, input types, output types) -> None`` or what is wrong.
ShapeRule = Callable[["Node", Sequence[TensorType], Sequence[TensorType]], "str | None"]
#: ``cost(bytes read, bytes written, cfg) -> cycles`` of the op as on-chip work.
Cost = Callable[[int, int, AcceleratorConfig], int]


@dataclass(frozen=True)
class Attr:
    """One attribute of an op: its Python type(s) and whether a node must have it."""

    type: type | tuple[type, ...]
    required: bool = True


@dataclass(frozen=True)
class OpDef:
    """The definition of one IR op (see the module docstring for who reads which field)."""

    name: str
    arity: tuple[int, int]                  # (inputs, outputs); -1: any number
    kernel: Kernel
    shape: ShapeRule
    cost: Cost
    attrs: Mapping[str, Attr] = field(default_factory=dict)
    streams: Literal["weights", "kv"] | None = None
    vector: VecFunc | None = None
    kv_state: Literal["append", "alias"] | None = None
    side_effect: bool = False
    aten: tuple[str, ...] = ()
    doc: str = ""

    @property
    def layout(self) -> bool:
        """Only changes how a tensor is indexed: no arithmetic, no cost."""
        return self.cost is free

    def check(self, node: Node, ins: Sequence[TensorType], outs: Sequence[TensorType]
              ) -> str | None:
        """What is wrong with ``node`` as an instance of this op (None: nothing)."""
        n_in, n_out = self.arity
        if (n_in >= 0 and len(ins) != n_in) or (n_out >= 0 and len(outs) != n_out):
            return (f"{self.name} takes {n_in} inputs and {n_out} outputs, got {len(ins)} "
                    f"and {len(outs)}")
        for key, spec in self.attrs.items():
            if key not in node.attrs:
                if spec.required:
                    return f"{self.name} needs attribute {key!r}"
            elif not isinstance(node.attrs[key], spec.type) and not (
                    node.attrs[key] is None and not spec.required):
                return (f"attribute {key}={node.attrs[key]!r} of {self.name} must be "
                        f"{_type_name(spec.type)}")
        unknown = sorted(set(node.attrs) - set(self.attrs))
        if unknown:
            return f"{self.name} has no attribute {unknown[0]!r}"
        return self.shape(node, ins, outs)


def _type_name(t) -> str:
    return " or ".join(x.__name__ for x in t) if isinstance(t, tuple) else t.__name__


# ---------------------------------------------------------------------- costs
def stream_cycles(read_bytes: int, write_bytes: int, cfg: AcceleratorConfig) -> int:
    """Cycles of one streaming pass through DRAM that reads and writes these many bytes, at
    ``cfg.beat_bytes`` per cycle in each direction (separate read and write channels)."""
    return -(-max(read_bytes, write_bytes) // cfg.beat_bytes)


def free(read_bytes: int, write_bytes: int, cfg: AcceleratorConfig) -> int:
    """Layout operations cost nothing."""
    return 0


# ---------------------------------------------------------------------- linear members
@dataclass(frozen=True)
class LinearLayer:
    """One layer of a ``linear`` or ``linears`` node: its weight (and bias) parameter."""

    weight: str
    bias: str | None = None

    @property
    def layer(self) -> str:
        """The module name (``model.layers.0.mlp.up_proj``)."""
        return self.weight.removesuffix(".weight")


def linear_layers(node: Node) -> list[LinearLayer]:
    """The layers a node that streams weights computes: one (``weight``, ``bias``
    attributes: ``linear``) or one per output (``weights``, ``biases``: ``linears``)."""
    a = node.attrs
    if "weights" not in a:
        return [LinearLayer(a["weight"], a.get("bias"))]
    biases = a.get("biases") or [None] * len(a["weights"])
    return [LinearLayer(w, b) for w, b in zip(a["weights"], biases, strict=True)]


# ---------------------------------------------------------------------- shape rules
def _shape(t: TensorType) -> tuple:
    return tuple(t.shape)


def _same_as_input(node, ins, outs):
    if _shape(outs[0]) != _shape(ins[0]):
        return f"output {outs[0]} differs from input {ins[0]}"
    return None


def _rows_kept(x: TensorType, y: TensorType) -> str | None:
    if _shape(y)[:-1] != _shape(x)[:-1]:
        return f"output {y} does not keep the rows of input {x}"
    return None


def _embed_shape(node, ins, outs):
    if _shape(outs[0])[:-1] != _shape(ins[0]):
        return f"embedding of {ins[0]} cannot be {outs[0]}"
    return None


def _positions_shape(node, ins, outs):
    cos, sin, mask = (_shape(o) for o in outs)
    if cos != sin or len(cos) != 2 or mask != (cos[0], SYMBOL):
        return f"positions must give cos, sin [T, d] and a mask [T, {SYMBOL}], got " \
            f"{', '.join(str(o) for o in outs)}"
    return None


def _linear_shape(node, ins, outs):
    if (len(ins) == 2) != bool(node.attrs.get("residual")):
        return "a second input (the residual) goes with residual=True"
    if len(ins) == 2 and _shape(ins[1]) != _shape(outs[0]):
        return f"residual {ins[1]} does not match the output {outs[0]}"
    return _rows_kept(ins[0], outs[0])


def _linears_shape(node, ins, outs):
    weights, biases = node.attrs["weights"], node.attrs.get("biases")
    if len(weights) != len(outs) or (biases is not None and len(biases) != len(outs)):
        return f"{len(outs)} outputs, {len(weights)} weights" + (
            f" and {len(biases)} biases" if biases is not None else "")
    return next((e for o in outs if (e := _rows_kept(ins[0], o))), None)


def _rope_shape(node, ins, outs):
    x, cos, sin = (_shape(t) for t in ins)
    if cos != sin or x[-2:] != cos:
        return f"rotary tables {ins[1]} do not match {ins[0]}"
    return _same_as_input(node, ins, outs)


def _kv_update_shape(node, ins, outs):
    for x, y in zip(ins, outs, strict=True):
        s, t = _shape(x), _shape(y)
        if len(s) != 4 or t != (*s[:2], SYMBOL, s[3]):
            return f"cache of {x} must be [B, KV, {SYMBOL}, d], got {y}"
    return None


def _repeat_kv_shape(node, ins, outs):
    (b, kv, s, d), y = _shape(ins[0]), _shape(outs[0])
    if y != (b, kv * node.attrs["groups"], s, d):
        return f"repeating {ins[0]} {node.attrs['groups']} times cannot give {outs[0]}"
    return None


def _attention_shape(node, ins, outs):
    a = node.attrs
    x, kv, y = _shape(ins[0]), _shape(ins[1]), _shape(outs[0])
    if len(x) != 4 or len(kv) != 4 or kv[1] not in (a["kv_heads"], a["heads"]) or \
            x[1] != a["heads"] or kv[3] != a["head_dim"]:
        return f"operands {ins[0]}, {ins[1]} do not match heads={a['heads']}, " \
            f"kv_heads={a['kv_heads']}, head_dim={a['head_dim']}"
    want = (*x[:3], kv[2]) if node.op == "attn_scores" else (*x[:3], kv[3])
    if node.op == "attn_values" and x[3] != kv[2]:
        return f"probabilities {ins[0]} do not cover the positions of {ins[1]}"
    if y != want:
        return f"output {outs[0]} should be {TensorType(want)}"
    return None


def _softmax_shape(node, ins, outs):
    if _shape(ins[1]) != _shape(ins[0])[-2:]:
        return f"mask {ins[1]} does not match scores {ins[0]}"
    return _same_as_input(node, ins, outs)


def _elementwise_shape(node, ins, outs):
    if _shape(ins[0]) != _shape(ins[1]):
        return f"operands {ins[0]} and {ins[1]} differ"
    return _same_as_input(node, ins, outs)


def _reshape_shape(node, ins, outs):
    want = tuple(node.attrs["shape"])
    y = _shape(outs[0])
    if len(want) != len(y) or any(w not in (-1, d) for w, d in zip(want, y, strict=True)):
        return f"output {outs[0]} is not the requested shape {list(want)}"
    if SYMBOL not in _shape(ins[0]) and ins[0].numel(0) != outs[0].numel(0):
        return f"{ins[0]} and {outs[0]} have different sizes"
    return None


def _transpose_shape(node, ins, outs):
    x = list(_shape(ins[0]))
    i, j = node.attrs["dims"]
    try:
        x[i], x[j] = x[j], x[i]
    except IndexError:
        return f"dims {[i, j]} out of range for {ins[0]}"
    return None if tuple(x) == _shape(outs[0]) else f"output {outs[0]} is not {ins[0]} " \
        f"with dims {[i, j]} swapped"


def _last_token_shape(node, ins, outs):
    x = _shape(ins[0])
    if _shape(outs[0]) != (*x[:-2], 1, x[-1]):
        return f"the last position of {ins[0]} cannot be {outs[0]}"
    return None


# ---------------------------------------------------------------------- vector rows
def rope_rows(x: torch.Tensor) -> torch.Tensor:
    """q or k ``[B, heads, T, d]`` as ROPE's rows ``[B * T, heads * d]``: a token's heads
    side by side (the rows a ``rope`` node's program reads and writes)."""
    b, h, t, d = x.shape
    return x.transpose(1, 2).reshape(b * t, h * d)


# ---------------------------------------------------------------------- kernels
def _linear_kernel(layer: LinearLayer, x: torch.Tensor, env: Env) -> torch.Tensor:
    """A compressed layer with the accelerator's numerics (with ``vector``: float64 out, the
    exact Q15.16 words of its DEQUANT), else the float layer (in its weight's dtype: a
    vector op's float64 result is read as float32, :func:`hw.numerics.from_fixed`)."""
    bias = env.param(layer.bias) if layer.bias else None
    if layer.layer in env.numerics.weights:
        w_int, row_scale = env.numerics.int_weight(layer.layer)
        # a bias: the WIDE_BIAS epilogue's
        y = golden_linear_torch(x, w_int, row_scale, env.numerics.acc_bits, bias,
                                env.numerics.vector)
        return y if env.numerics.vector else y.to(x.dtype)
    weight = env.param(layer.weight)
    return F.linear(x.to(weight.dtype), weight, bias)


def _linear(node: Node, args: list, env: Env) -> tuple:
    y = _linear_kernel(linear_layers(node)[0], args[0], env)
    if len(args) == 2:  # fused residual epilogue
        y = _add(node, [args[1], y], env)[0]
    return (y,)


def _linears(node: Node, args: list, env: Env) -> tuple:
    return tuple(_linear_kernel(layer, args[0], env) for layer in linear_layers(node))


def _positions(node: Node, args: list, env: Env) -> tuple:
    cos, sin = env.tables
    end = env.past + env.t
    dtype = torch.float32
    return cos[env.past:end].to(dtype), sin[env.past:end].to(dtype), \
        causal_mask(env.t, env.past, dtype, cos.device, env.window)


def _attn_scores(node: Node, args: list, env: Env) -> tuple:
    """``q . k^T * scale``: in float, with the INT8 (INT4) cache's float epilogue, or -- with
    the vector unit -- as its DEQUANT computes the scaled scores
    (:func:`hw.numerics.scores_vector`)."""
    q, k = args
    scale = node.attrs["scale"]
    if not env.numerics.attention:
        if k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        return (torch.matmul(q, k.transpose(-2, -1)) * scale,)
    vector, bits = env.numerics.vector, env.numerics.kv_bits
    k8, s_k = kv_rows(k, vector, bits, kv4_key_group(k.shape[-1]) if bits == 4 else None)
    if vector:
        q8, amax = scores_prologue_vector(q, k.shape[1])
        acc = gemm_acc_torch(q8, k8, env.numerics.acc_bits)
        return (scores_vector(acc, amax, requant_amax_torch(k), scale, q.shape[1], bits),)
    q8, s_q = scores_prologue(q, k.shape[1])
    acc = gemm_acc_torch(q8, k8, env.numerics.acc_bits)
    return (scores_epilogue(acc, s_q, s_k, q.shape[1]) * scale,)


def _attn_values(node: Node, args: list, env: Env) -> tuple:
    p, v = args
    heads = p.shape[1]
    if not env.numerics.attention:
        if v.shape[1] != heads:
            v = v.repeat_interleave(heads // v.shape[1], dim=1)
        return (torch.matmul(p.to(v.dtype), v),)
    vector, bits = env.numerics.vector, env.numerics.kv_bits
    v8, s_v = kv_rows(v, vector, bits)
    if vector:  # FOLD reads the value rows' integer amax
        s_v = value_amax_torch(v, bits)
    p8, s_p = values_prologue(p, s_v, v.shape[1], vector)
    acc = gemm_acc_torch(p8, v8.transpose(-2, -1), env.numerics.acc_bits)
    return (values_epilogue(acc, s_p, heads, env.numerics.vector, env.numerics.kv_bits),)


# The host ops: float, or the vector unit's exact numerics (``env.numerics.vector``).
def _rmsnorm(node: Node, args: list, env: Env) -> tuple:
    f = rms_norm_vector if env.numerics.vector else rms_norm
    return (f(args[0], env.param(node.attrs["weight"]), node.attrs["eps"]),)


def _rope(node: Node, args: list, env: Env) -> tuple:
    return ((rope_vector if env.numerics.vector else apply_rotary)(*args),)


def _softmax(node: Node, args: list, env: Env) -> tuple:
    f = softmax_vector if env.numerics.vector else attention_probs
    return (f(args[0], 1.0, args[1]),)  # the scores are scaled (attn_scores)


def _silu_gate(node: Node, args: list, env: Env) -> tuple:
    if env.numerics.vector:
        return (silu_gate_vector(*args),)
    return (F.silu(args[0]) * args[1],)


def _add(node: Node, args: list, env: Env) -> tuple:
    return ((add_vector if env.numerics.vector else torch.add)(args[0], args[1]),)


# ---------------------------------------------------------------------- the registry
_ATTENTION_ATTRS = {"layer": Attr(int), "heads": Attr(int), "kv_heads": Attr(int),
                    "head_dim": Attr(int)}
_LIST = (list, tuple)

#: Every op of the IR by name, in the order of a decoder step.
OPS: dict[str, OpDef] = {d.name: d for d in (
    OpDef("embed", (1, 1), lambda n, a, e: (F.embedding(a[0], e.param(n.attrs["weight"])),),
          _embed_shape, stream_cycles, {"weight": Attr(str)},
          doc="token embedding: ids [B, T] -> [B, T, hidden]"),
    OpDef("positions", (0, 3), _positions, _positions_shape, stream_cycles,
          doc="the step's rotary tables cos, sin [T, d] and causal mask [T, S]"),
    OpDef("rmsnorm", (1, 1), _rmsnorm, _same_as_input, stream_cycles,
          {"weight": Attr(str), "eps": Attr(float)}, vector=VecFunc.RMSNORM,
          doc="RMSNorm with a weight"),
    OpDef("linear", (-1, 1), _linear, _linear_shape, stream_cycles,
          {"weight": Attr(str), "bias": Attr(str, False), "residual": Attr(bool, False)},
          streams="weights",
          doc="x @ W^T (+ bias) (+ residual, a fused epilogue: the second input)"),
    OpDef("linears", (1, -1), _linears, _linears_shape, stream_cycles,
          {"weights": Attr(_LIST), "biases": Attr(_LIST, False)}, streams="weights",
          doc="several linears of one input: one program"),
    OpDef("rope", (3, 1), _rope, _rope_shape, stream_cycles, vector=VecFunc.ROPE,
          doc="rotary embedding of q or k with the step's tables"),
    OpDef("kv_update", (2, 2), lambda n, a, e: e.cache(n.attrs["layer"], a[0], a[1], e.past),
          _kv_update_shape, stream_cycles, {"layer": Attr(int)}, kv_state="append",
          side_effect=True, doc="write the step's keys and values; -> all cached ones"),
    OpDef("repeat_kv", (1, 1),
          lambda n, a, e: (a[0].repeat_interleave(n.attrs["groups"], dim=1),),
          _repeat_kv_shape, stream_cycles, {"groups": Attr(int)}, kv_state="alias",
          doc="materialised grouped-query repeat of K or V (as captured)"),
    OpDef("attn_scores", (2, 1), _attn_scores, _attention_shape, stream_cycles,
          {**_ATTENTION_ATTRS, "scale": Attr(float)}, streams="kv",
          doc="q . k^T * scale against the INT8 key cache"),
    OpDef("softmax", (2, 1), _softmax, _softmax_shape, stream_cycles,
          vector=VecFunc.SOFTMAX, doc="softmax(scores + mask) (the scores scaled)"),
    OpDef("attn_values", (2, 1), _attn_values, _attention_shape, stream_cycles,
          _ATTENTION_ATTRS, streams="kv", doc="p . v against the INT8 value cache"),
    OpDef("silu_gate", (2, 1), _silu_gate, _elementwise_shape,
          stream_cycles, vector=VecFunc.SILU_GATE, doc="silu(gate) * up"),
    OpDef("add", (2, 1), _add, _elementwise_shape, stream_cycles, vector=VecFunc.ADD,
          aten=("add",), doc="residual addition"),
    OpDef("view", (1, 1), lambda n, a, e: (a[0].view(n.attrs["shape"]),), _reshape_shape,
          free, {"shape": Attr(_LIST)}, aten=("view", "_unsafe_view"), doc="layout only"),
    OpDef("reshape", (1, 1), lambda n, a, e: (a[0].reshape(n.attrs["shape"]),),
          _reshape_shape, free, {"shape": Attr(_LIST)}, aten=("reshape",), doc="layout only"),
    OpDef("transpose", (1, 1), lambda n, a, e: (a[0].transpose(*n.attrs["dims"]),),
          _transpose_shape, free, {"dims": Attr(_LIST)}, aten=("transpose",),
          doc="layout only"),
    OpDef("last_token", (1, 1), lambda n, a, e: (a[0][..., -1:, :],), _last_token_shape, free,
          doc="the last position of x (layout only)"),
)}


def describe() -> str:
    """The op set as a table (name, arity, where it may run, what it does)."""
    rows = []
    for d in OPS.values():
        where = ("accelerator" if d.streams else "host/vector" if d.vector
                 else "host (free)" if d.layout else "host")
        arity = "/".join("*" if n < 0 else str(n) for n in d.arity)
        rows.append(f"{d.name:<12} {arity:<5} {where:<12} {d.doc}")
    return "\n".join(rows)

