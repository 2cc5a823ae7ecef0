"""Lowering: the accelerator nodes of a step become the layers of programs.

Every accelerator node is one program of one or more *members*, each a GEMM layer
``y[T, N] = x[T, K] @ W[N, K]^T`` over a weight stream in DRAM:

=================  ================================================================
node               members
=================  ================================================================
``linear``         its layer (packed weights), input rows = tokens
``linears``        each layer, one shared input buffer
``attn_scores``    per kv head: W = that head's key cache ``[S, head_dim]`` (raw INT8),
                   rows = its query heads x tokens (per query head without the GQA pass)
``attn_values``    per kv head: W = the value cache transposed ``[head_dim, S]``, rows the
                   same; the cache region is laid out for the longest context, so its
                   tiles are further apart than a shorter context's (``w_tile_stride``)
=================  ================================================================

The KV cache is a weight stream the host extends one position at a time (:class:`KVLayout`
gives the byte of every element), so the attention programs depend on the context only
through its *bucket*: positions rounded up to whole value-stream groups
(:func:`context_bucket`); decode holds one program per bucket.

A node's members are tiled (:mod:`sw.compile.tiling`) and scheduled into one relocatable
program (:func:`sw.compile.relocation.lower_template`); identical members at other addresses
(the blocks of a decoder) share that template, placed by
:func:`sw.compile.relocation.relocate`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hw.config import DENSE, DENSE_BLOCK, AcceleratorConfig
from hw.format import StreamLayout, WeightFormat, stream_layout
from sw.compile.errors import LoweringError
from sw.compile.ir import Graph, Node
from sw.compile.tiling import LinearPlan, plan_linear, stream_bytes, tile_stride

__all__ = ["KEY_FORMAT", "VALUE_FORMAT", "context_bucket", "KVLayout", "Member",
           "node_members", "FormatOf"]

#: Keys as the weight of ``q . k^T``: raw INT8, one group per head (K = head_dim).
KEY_FORMAT = WeightFormat(DENSE, 8, 0, raw=True)
#: Values as the weight of ``p . v``: raw INT8, K = positions in groups of one dense block.
VALUE_FORMAT = WeightFormat(DENSE, 8, DENSE_BLOCK, raw=True)

#: A layer's format by module name (None: not on the accelerator).
FormatOf = Callable[[str], WeightFormat | None]


def context_bucket(positions: int) -> int:
    """Key positions an attention program covers for ``positions`` real ones."""
    return VALUE_FORMAT.padded_k(positions)


@dataclass(frozen=True)
class KVLayout:
    """Where the INT8 keys and values of one kv head of one layer live in its regions.

    The key region is the stream of ``W = K[max_context, head_dim]`` (tiles of ``lanes``
    positions); the value region that of ``W = V^T[head_dim, max_context]`` (tiles of
    ``lanes`` channels, each ``value_tile_stride`` bytes).
    """

    head_dim: int
    max_context: int
    lanes: int
    beat: int

    @property
    def keys(self) -> StreamLayout:
        return stream_layout(KEY_FORMAT, self.max_context, self.head_dim, self.lanes)

    @property
    def values(self) -> StreamLayout:
        return stream_layout(VALUE_FORMAT, self.head_dim, self.max_context, self.lanes)

    @property
    def key_bytes(self) -> int:
        return stream_bytes(self.keys, self.beat)

    @property
    def key_tile_stride(self) -> int:
        return tile_stride(self.keys, self.beat)

    @property
    def value_tile_stride(self) -> int:
        return tile_stride(self.values, self.beat)

    @property
    def value_bytes(self) -> int:
        return stream_bytes(self.values, self.beat)

    def key_offsets(self, positions) -> np.ndarray:
        """Byte offsets ``[len(positions), head_dim]`` of ``K[positions, :]`` in the key region."""
        pos = np.asarray(positions).reshape(-1, 1)
        return self.keys.byte_offset(pos, np.arange(self.head_dim)[None, :],
                                     self.key_tile_stride)

    def value_offsets(self, positions) -> np.ndarray:
        """Byte offsets ``[len(positions), head_dim]`` of ``V[positions, :]`` in the value
        region."""
        pos = np.asarray(positions).reshape(-1, 1)
        return self.values.byte_offset(np.arange(self.head_dim)[None, :], pos,
                                       self.value_tile_stride)


@dataclass(frozen=True)
class Member:
    """One GEMM layer of a node's program and the DRAM symbols of its operands (``b``: the
    int32 bias rows of a biased layer, laid out as its outputs)."""

    plan: LinearPlan
    w: str
    x: str
    y: str
    w_tile_stride: int | None = None
    b: str | None = None

    @property
    def signature(self) -> tuple:
        """What the instructions depend on, addresses aside."""
        p = self.plan
        return (p.fmt, p.n, p.k_padded, p.tokens, self.w_tile_stride, p.bias)

    @property
    def x_bytes(self) -> int:
        return self.plan.tokens * self.plan.act_row_bytes

    @property
    def y_bytes(self) -> int:
        return self.plan.tokens * self.plan.out_row_bytes

    def buffers(self) -> list[tuple[str, int, bool]]:
        """``(symbol, bytes, written by the host)`` of its arena buffers: the input (and bias
        rows) the host writes before the program, the output it reads after."""
        out = [(self.x, self.x_bytes, True), (self.y, self.y_bytes, False)]
        return out + ([(self.b, self.y_bytes, True)] if self.b else [])


def _rows(shape) -> int:
    n = 1
    for d in shape[:-1]:
        n *= d
    return n


def node_members(node: Node, graph: Graph, cfg: AcceleratorConfig, fmt_of: FormatOf,
                 bucket: int | None = None, kv: KVLayout | None = None) -> list[Member]:
    """The members of an accelerator node's program (``bucket``: key positions covered by
    attention nodes; ``kv``: the cache layout, for the value tiles' stride). Buffer symbols
    are ``x:<phase>:<node>[:i]``, ``y:...`` and, for biased layers, ``b:...``."""
    buf = f"{graph.meta.get('phase', '')}:{node.name}"
    x_type = graph.values[node.inputs[0]]
    if node.op in ("linear", "linears"):
        weights = node.attrs["weights"] if node.op == "linears" else [node.attrs["weight"]]
        biases = (node.attrs.get("biases") or [None] * len(weights) if node.op == "linears"
                  else [node.attrs.get("bias")])
        out = []
        for i, (w, y, bias) in enumerate(zip(weights, node.outputs, biases, strict=True)):
            layer = w.removesuffix(".weight")
            fmt = fmt_of(layer)
            if fmt is None:
                raise LoweringError(f"node {node.name!r}: layer {layer} has no format for the "
                                    "accelerator")
            n, k = graph.values[y].shape[-1], x_type.shape[-1]
            plan = plan_linear(cfg, fmt, n, k, _rows(x_type.shape), bias=bias is not None)
            suffix = f":{i}" if node.op == "linears" else ""
            out.append(Member(plan, f"w:{layer}", f"x:{buf}", f"y:{buf}{suffix}",
                              b=None if bias is None else f"b:{buf}{suffix}"))
        return out
    if node.op in ("attn_scores", "attn_values"):
        if bucket is None or kv is None:
            raise LoweringError(f"node {node.name!r}: attention needs a context bucket")
        a = node.attrs
        b, heads, t, _ = x_type.shape
        kv_type = graph.values[node.inputs[1]]
        operand_heads = kv_type.shape[1]       # kv_heads, or heads when K/V are repeated
        per = heads // operand_heads           # query heads per operand head
        groups = heads // a["kv_heads"]
        out = []
        for j in range(operand_heads):
            cache_head = j // (operand_heads // a["kv_heads"])
            if node.op == "attn_scores":
                plan = plan_linear(cfg, KEY_FORMAT, bucket, a["head_dim"], b * per * t)
                stride = None
                w = f"k:{a['layer']}:{cache_head}"
            else:
                plan = plan_linear(cfg, VALUE_FORMAT, a["head_dim"], bucket, b * per * t)
                stride = kv.value_tile_stride
                w = f"v:{a['layer']}:{cache_head}"
            out.append(Member(plan, w, f"x:{buf}:{j}", f"y:{buf}:{j}", stride))
        assert groups >= 1
        return out
    raise LoweringError(f"node {node.name!r}: op {node.op} does not run on the accelerator")
