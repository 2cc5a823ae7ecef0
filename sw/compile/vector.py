"""Host ops on the vector engine: a node whose op names a VEC sub-op (``OPS[op].vector``)
becomes one program of one VEC per row.

=============  ===========  ==========================================================
op             sub-op       operands (int32 rows in DRAM, Q15.16: ``hw.numerics.to_fixed``)
=============  ===========  ==========================================================
``rmsnorm``    RMSNORM      ``x`` the rows; ``w`` the weight as ``norm_weight`` words, a
                            constant row in the DRAM image; ``imm`` = ``norm_eps``
``softmax``    SOFTMAX      ``x`` the rows of ``scores + mask`` (0 where masked; the
                            scores scaled by ``attn_scores``),
                            the context bucket long; ``imm`` = the row's valid positions, a
                            run-time parameter the host writes before each start
``silu_gate``  SILU_GATE    ``x`` the gate rows, ``b`` the up rows
``add``        ADD          ``x`` and ``b`` the two addends
``rope``       ROPE         ``x`` the q or k rows, one per token, its heads side by side
                            (the host transposes ``[B, heads, T, d]``); ``w`` the rotary
                            table of every position as ``rope_pairs`` words (``d / 2`` per
                            row), a constant in the DRAM image shared by every rope node,
                            whose rows of the step's positions the program loads (the
                            LOAD's address a run-time parameter the host sets);
                            ``imm`` = ``rope_imm(d, heads)``
=============  ===========  ==========================================================

The host converts the float inputs into their buffers and the results back
(``sw.runtime``), so a node's outputs equal the host kernel's with the vector unit's numerics
(``rms_norm_vector``, ``softmax_vector``, ``silu_gate_vector``, ``add_vector``,
``rope_vector``) bit for bit.
The program itself is :func:`sw.compile.schedule.schedule_vector`'s.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hw.config import VECTOR_WORD_BYTES, AcceleratorConfig
from hw.isa import VecFunc, field_location, rope_geometry, rope_imm
from hw.numerics import norm_eps
from sw.compile import symbols
from sw.compile.errors import LoweringError
from sw.compile.ir import OPS, Graph, Node

__all__ = ["VectorOp", "VECTOR_LOWERINGS", "vector_op", "row_bytes"]

#: The largest ``imm`` a VEC holds.
_IMM_BITS = field_location("vec.imm")[1]
_IMM_MAX = (1 << _IMM_BITS) - 1


def row_bytes(cfg: AcceleratorConfig, length: int) -> int:
    """DRAM bytes of a row of ``length`` int32 elements: whole beats."""
    return -(-length * VECTOR_WORD_BYTES // cfg.beat_bytes) * cfg.beat_bytes


@dataclass(frozen=True)
class VectorOp:
    """The program of a vector node: ``func`` on ``rows`` rows of ``length`` int32 elements,
    each ``row_bytes`` in DRAM; the DRAM symbols of its rows ``x``, its second operand's rows
    ``b`` (or None), its constant row ``w`` (or None; a ROPE's: the rotary table) and its
    results ``y`` (laid out as ``x``); every VEC's ``imm`` (SOFTMAX's is set per row at run
    time); a ROPE's ``table_rows`` (the positions of a step, one per row: row ``r`` turns by
    the table row of position ``past + r``) and the DRAM bytes of a table row,
    ``table_row_bytes`` (0 for other sub-ops); a SOFTMAX's ``positions``, the step's tokens
    (row ``r``, of token ``r % positions``, has ``past + r % positions + 1`` valid positions
    under a causal mask: its VEC's ``imm`` relative to the run-time register ``pos``);
    ``within``: ``x`` and ``y`` are rows of the buffers ``(x buffer, y buffer, byte offset)``
    from that offset on, and ``b`` of a fourth, ``b buffer``, where one follows (a fused
    program's part that runs some rows of a node's program: a SOFTMAX per scores member,
    :func:`sw.compile.fusion.scores_groups`; or some columns of a one-row program: a
    SILU_GATE segment, :func:`sw.compile.fusion.silu_segments`; None: its own); ``halves``:
    an ADD of the two halves of each row of ``x`` (``2 * length`` elements, ``row_bytes``
    apart: a values GEMM's accumulator rows split by position residue), its results rows of
    ``y`` laid out alike (:func:`sw.compile.fusion.values_parts`)."""

    func: VecFunc
    rows: int
    length: int
    row_bytes: int
    x: str
    y: str
    b: str | None = None
    w: str | None = None
    imm: int = 0
    table_rows: int = 0
    table_row_bytes: int = 0
    positions: int = 0
    within: tuple[str, str, int] | tuple[str, str, int, str] | None = None
    halves: bool = False

    @property
    def w_tile_stride(self) -> None:
        """No weight tiles (:class:`sw.compile.relocation.SymbolicLayer`)."""
        return None

    @property
    def signature(self) -> tuple:
        """What the instructions depend on, addresses aside."""
        return ("vec", self.func, self.rows, self.length, self.b is not None,
                self.w is not None, self.imm, self.table_rows, self.positions) + (
                    ("halves", self.row_bytes) if self.halves else ())

    def const_bytes(self, max_context: int) -> int:
        """DRAM bytes of its constant ``w``: a row (RMSNorm's weight), or a ROPE's table of
        every position of a context of ``max_context``."""
        return max_context * self.table_row_bytes if self.table_rows else self.row_bytes

    @property
    def data_bytes(self) -> int:
        """Bytes of one operand's (or the results') rows in DRAM."""
        return self.rows * self.row_bytes

    def buffers(self) -> list[tuple[str, int, bool]]:
        """``(symbol, bytes, written by the host)`` of its arena buffers."""
        out = [(self.x, self.data_bytes, True), (self.y, self.data_bytes, False)]
        return out + ([(self.b, self.data_bytes, True)] if self.b else [])

    @property
    def read_bytes(self) -> int:
        """Bytes the program must read at least: its operand rows, the constant row (or a
        ROPE's table rows) once."""
        n = self.rows * self.length * VECTOR_WORD_BYTES
        if self.halves:
            return 2 * n
        if self.table_rows:
            return n + self.table_rows * self._table_words * VECTOR_WORD_BYTES
        return n * (2 if self.b else 1) + (self.length * VECTOR_WORD_BYTES if self.w else 0)

    @property
    def _table_words(self) -> int:
        return int(rope_geometry(self.imm)[0]) // 2

    @property
    def write_bytes(self) -> int:
        return self.rows * self.length * VECTOR_WORD_BYTES

    def to_dict(self) -> dict:
        return {"func": self.func.name, "rows": self.rows, "length": self.length,
                "row_bytes": self.row_bytes, "x": self.x, "y": self.y, "b": self.b,
                "w": self.w, "imm": self.imm, "table_rows": self.table_rows,
                "table_row_bytes": self.table_row_bytes, "positions": self.positions,
                **({} if self.within is None else {"within": list(self.within)}),
                **({"halves": True} if self.halves else {})}

    @classmethod
    def from_dict(cls, d: dict) -> VectorOp:
        within = d.get("within")
        return cls(**{**d, "func": VecFunc[d["func"]],
                      "within": None if within is None else tuple(within)})


#: ``rule(node, graph, cfg, bucket) -> VectorOp``.
VectorRule = Callable[[Node, Graph, AcceleratorConfig, "int | None"], VectorOp]


def _rows(shape) -> int:
    return int(np.prod(shape[:-1], dtype=np.int64))


def _op(node: Node, graph: Graph, cfg: AcceleratorConfig, length: int, *,
        second: bool = False, w: str | None = None, imm: int = 0, rows: int | None = None,
        table_rows: int = 0, table_row_bytes: int = 0) -> VectorOp:
    phase = graph.meta.get("phase", "")
    rows = _rows(graph.values[node.inputs[0]].shape) if rows is None else rows
    if not 0 <= imm <= _IMM_MAX:
        raise LoweringError(f"node {node.name!r}: imm={imm} does not fit the VEC's "
                            f"{_IMM_BITS}-bit field")
    return VectorOp(OPS[node.op].vector, rows, length, row_bytes(cfg, length),
                    symbols.buffer("x", phase, node.name), symbols.buffer("y", phase, node.name),
                    symbols.buffer("b", phase, node.name) if second else None, w, imm,
                    table_rows, table_row_bytes)


def _rmsnorm(node: Node, graph: Graph, cfg: AcceleratorConfig, bucket: int | None
             ) -> VectorOp:
    k = graph.values[node.inputs[0]].shape[-1]
    return _op(node, graph, cfg, k, w=symbols.norm_weight(node.attrs["weight"]),
               imm=norm_eps(node.attrs["eps"], k))


def _softmax(node: Node, graph: Graph, cfg: AcceleratorConfig, bucket: int | None
             ) -> VectorOp:
    if bucket is None:
        raise LoweringError(f"node {node.name!r}: softmax needs a context bucket")
    op = _op(node, graph, cfg, bucket, imm=bucket)  # imm: relative to pos per row
    return dataclasses.replace(op, positions=int(graph.values[node.inputs[0]].shape[-2]))


def _elementwise(node: Node, graph: Graph, cfg: AcceleratorConfig, bucket: int | None
                 ) -> VectorOp:
    return _op(node, graph, cfg, graph.values[node.inputs[0]].shape[-1], second=True)


def _rope(node: Node, graph: Graph, cfg: AcceleratorConfig, bucket: int | None
          ) -> VectorOp:
    """q or k ``[1, heads, T, d]``: ``T`` rows of ``heads * d`` elements (one token's heads
    side by side), each with its position's table row."""
    x, cos, sin = (tuple(graph.values[v].shape) for v in node.inputs)
    if len(x) != 4 or not all(isinstance(n, int) for n in x):
        raise LoweringError(f"node {node.name!r}: rope on the vector engine takes q or k as "
                            f"[batch, heads, tokens, head_dim], got {list(x)}")
    b, heads, t, d = x
    if b != 1:
        raise LoweringError(f"node {node.name!r}: rope on the vector engine takes one "
                            f"sequence (batch 1), got {list(x)}")
    if d % 2 or d < 2:
        raise LoweringError(f"node {node.name!r}: head_dim={d} must be even (ROPE pairs "
                            "element k with k + head_dim / 2)")
    if cos != (t, d) or sin != (t, d):
        raise LoweringError(f"node {node.name!r}: the rotary tables {list(cos)}, {list(sin)} "
                            f"do not give one row of {d} per token of {list(x)}")
    try:
        imm = rope_imm(d, heads)
    except ValueError as e:
        raise LoweringError(f"node {node.name!r}: {e}") from None
    return _op(node, graph, cfg, heads * d, w=symbols.rope_table(), imm=imm, rows=t,
               table_rows=t, table_row_bytes=row_bytes(cfg, d // 2))


#: How each op with a VEC sub-op (``OPS[op].vector``) becomes a vector program.
VECTOR_LOWERINGS: dict[str, VectorRule] = {
    "rmsnorm": _rmsnorm,
    "softmax": _softmax,
    "silu_gate": _elementwise,
    "add": _elementwise,
    "rope": _rope,
}


def vector_op(node: Node, graph: Graph, cfg: AcceleratorConfig, bucket: int | None = None
              ) -> VectorOp:
    """The vector program of ``node`` (``bucket``: the key positions a softmax row covers).

    Raises
    ------
    LoweringError
        The op has no vector lowering, or an immediate does not fit.
    """
    rule = VECTOR_LOWERINGS.get(node.op)
    if rule is None or OPS[node.op].vector is None:
        raise LoweringError(f"node {node.name!r}: op {node.op} does not run on the vector "
                            "engine")
    return rule(node, graph, cfg, bucket)
