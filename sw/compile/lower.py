"""Lowering: the accelerator nodes of a step become the layers of programs.

Every accelerator node is one program of one or more *members*, each a GEMM layer
``y[T, N] = x[T, K] @ W[N, K]^T`` over a weight stream in DRAM:

=================  ================================================================
node               members
=================  ================================================================
``linear``         its layer (packed weights), input rows = tokens
``linears``        each layer, one shared input buffer
``attn_scores``    per kv head: W = that head's key cache ``[S, head_dim]`` (raw INT8, or
                   INT4 in groups along head_dim), rows = its query heads x tokens (per
                   query head without the GQA pass)
``attn_values``    per kv head: W = the value cache transposed ``[head_dim, S]``, rows the
                   same; the cache region is laid out for the longest context, so its
                   tiles are further apart than a shorter context's (``w_tile_stride``).
                   Split by position residue (``R`` = :attr:`KVLayout.residue` > 1): W is
                   ``[R * head_dim, S]``, output ``(c, d)`` summing the positions ``p = c
                   (mod R)``, one nonzero per block of R positions (``1:R``); the R
                   partial rows are then added (:func:`value_residue`)
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

from hw.config import DENSE, DENSE_BLOCK, AcceleratorConfig, NMPattern
from hw.format import FormatError, StreamLayout, WeightFormat, stream_layout
from hw.isa import RegTerm, VecFunc, reg_value
from hw.numerics import ACT_QMAX, KV4_CODE_BITS, KV_BITS, kv4_key_group
from hw.timing import load_completion_delay
from sw.compile import symbols
from sw.compile.errors import LoweringError
from sw.compile.ir import Graph, LinearLayer, Node, linear_layers
from sw.compile.tiling import LinearPlan, plan_linear, stream_bytes, tile_stride

__all__ = ["KEY_FORMAT", "VALUE_FORMAT", "key_format", "value_format", "value_residue",
           "context_bucket", "KVLayout", "Member",
           "node_members", "LOWERINGS", "LoweringRule", "LowerContext", "FormatOf"]

#: Keys as the weight of ``q . k^T``: raw INT8, one group per head (K = head_dim).
KEY_FORMAT = WeightFormat(DENSE, 8, 0, raw=True)
#: Values as the weight of ``p . v``: raw INT8, K = positions in groups of one dense block.
VALUE_FORMAT = WeightFormat(DENSE, 8, DENSE_BLOCK, raw=True)

#: A layer's format by module name (None: not on the accelerator).
FormatOf = Callable[[str], WeightFormat | None]


def key_format(bits: int, head_dim: int) -> WeightFormat:
    """The key cache's stream format: :data:`KEY_FORMAT` (INT8), or INT4 with one 8-bit
    scale code per :func:`hw.numerics.kv4_key_group` elements of a key row (the weights'
    symmetric group format: the codes of :func:`hw.numerics.kv4_rows`)."""
    if bits == 8:
        return KEY_FORMAT
    _check_bits(bits)
    return WeightFormat(DENSE, 4, kv4_key_group(head_dim), code_bits=KV4_CODE_BITS)


def value_format(bits: int, residue: int = 1) -> WeightFormat:
    """The value cache's stream format: :data:`VALUE_FORMAT`, or the same raw at INT4 (a
    value row's one scale is per position, a K position of ``p . v``: it is folded into the
    probabilities, so the stream has no header); split by position ``residue`` R > 1
    (:func:`value_residue`), the same ``1:R`` sparse (a position's value at its residue's
    output rows, its index the residue)."""
    _check_bits(bits)
    return WeightFormat(DENSE if residue == 1 else NMPattern(1, residue), bits, DENSE_BLOCK,
                        raw=True)


def value_residue(cfg: AcceleratorConfig, head_dim: int, bits: int, max_context: int) -> int:
    """The position residue R that attention's values product is split by where the host
    appends the cache (a stream of sparse fields, which no INSERT writes): the largest M of a
    ``1:M`` pattern of ``cfg.patterns`` whose ``M * head_dim`` outputs fit the array's lanes
    (the GEMM then takes S / M k-steps at up to full lanes instead of S at ``head_dim``),
    else 1. Output ``(c, d)`` sums ``P[p] * V[p, d]`` over the positions ``p = c (mod R)``;
    the R partial rows are added after the GEMM (the vector engine's ADDs, each a half of
    the rows left, rows of a multiple of ``head_dim`` elements: so ``head_dim`` must be a
    multiple of ``cfg.vector_lanes`` for them to start on whole lanes, and R a power of two).

    M must also divide :data:`~hw.config.DENSE_BLOCK` (the buckets stay whole blocks), the
    decoder must stream the format (INT8 only dense: an INT8 cache is never split), and
    every sum must be exact: ``|P code| <= ACT_QMAX``, ``|value code| <= -qmin``, so a
    partial and the total are at most ``ACT_QMAX * -qmin * max_context``, which must stay
    below ``2 ** (acc_bits - 1)``; then the wrapping accumulator, the saturating ADDs and
    the unsplit GEMM give the same integers. And, where the vector engine adds the partial
    rows, the split must pay at the longest context: the k-steps it saves a head,
    ``max_context * (M - 1) / M``, must exceed its log2 M hand-offs from one ADD to the
    next, each at least a LOAD's completion delay (:func:`hw.timing.load_completion_delay`:
    the memory's latency). A short cache's attention program is paced by such hand-offs,
    not by its GEMMs (LLaMA-7B on HBM-class, ``vector_lanes`` 64, INT4 cache, measured at
    a84debf, which split at every context: an attention program at context 128 took 21,625
    cycles unsplit and 29,686 split, at 2048 107,160 and 42,802)."""
    best = 1
    for p in cfg.patterns:
        m = p.m
        fmt = value_format(bits, m) if p.n == 1 and not DENSE_BLOCK % m and m & (m - 1) == 0 \
            else None
        if fmt is None or m * head_dim > cfg.lanes or head_dim % cfg.vector_lanes or \
                ACT_QMAX * -fmt.qmin * max_context >= 1 << (cfg.acc_bits - 1):
            continue
        hand_offs = (m.bit_length() - 1) * load_completion_delay(cfg) if cfg.has_vector else 0
        if max_context * (m - 1) <= m * hand_offs:
            continue
        try:
            fmt.check_supported(cfg)
        except FormatError:
            continue
        best = max(best, m)
    return best


def _check_bits(bits: int) -> None:
    if bits not in KV_BITS:
        raise LoweringError(f"KV-cache bits must be one of {KV_BITS}, got {bits!r}")


def context_bucket(positions: int) -> int:
    """Key positions an attention program covers for ``positions`` real ones (the same for
    both cache widths: their value streams have the same groups)."""
    return VALUE_FORMAT.padded_k(positions)


@dataclass(frozen=True)
class KVLayout:
    """Where the keys and values (INT8, or INT4 with ``bits`` 4) of one kv head of one layer
    live in its regions.

    The key region is the stream of ``W = K[max_context, head_dim]`` (tiles of ``lanes``
    positions); the value region that of ``W = V^T[head_dim, max_context]`` (tiles of
    ``lanes`` channels, each ``value_tile_stride`` bytes), or, split by position
    ``residue`` R > 1 (:func:`value_residue`), of ``W[R * head_dim, max_context]``: position
    ``p``'s value of channel ``d`` is row ``(p % R) * head_dim + d``'s, at step ``p // R``
    with index ``p % R``, every other row's field of that block 0. Formats:
    :func:`key_format`, :func:`value_format`.
    """

    head_dim: int
    max_context: int
    lanes: int
    beat: int
    bits: int = 8
    residue: int = 1

    def __post_init__(self):
        _check_bits(self.bits)

    @property
    def key_format(self) -> WeightFormat:
        return key_format(self.bits, self.head_dim)

    @property
    def value_format(self) -> WeightFormat:
        return value_format(self.bits, self.residue)

    @property
    def value_rows(self) -> int:
        """Output rows of the values product: ``residue * head_dim``."""
        return self.residue * self.head_dim

    @property
    def keys(self) -> StreamLayout:
        return stream_layout(self.key_format, self.max_context, self.head_dim, self.lanes)

    @property
    def values(self) -> StreamLayout:
        return stream_layout(self.value_format, self.value_rows, self.max_context, self.lanes)

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
        """Byte offsets ``[len(positions), head_dim]`` of ``K[positions, :]`` in the key region
        (INT8 only: an INT4 element is half a byte, :meth:`fields`)."""
        pos = np.asarray(positions).reshape(-1, 1)
        return self.keys.byte_offset(pos, np.arange(self.head_dim)[None, :],
                                     self.key_tile_stride)

    def value_offsets(self, positions) -> np.ndarray:
        """Byte offsets ``[len(positions), head_dim]`` of ``V[positions, :]`` in the value
        region (INT8 only, as :meth:`key_offsets`)."""
        pos = np.asarray(positions).reshape(-1, 1)
        return self.values.byte_offset(np.arange(self.head_dim)[None, :], pos,
                                       self.value_tile_stride)

    def fields(self, kind: str, positions) -> tuple[np.ndarray, np.ndarray]:
        """Where the elements ``[len(positions), head_dim]`` of the keys (``kind`` "k") or
        values ("v") at ``positions`` live in their region, at either width: byte offsets and
        the bit shift of each field in its byte (0, or 4 for the high nibble of INT4).

        In a dense stream step ``k`` holds K position ``k``; its record holds lane ``row %
        lanes`` of tile ``row // lanes`` (keys: row = position, K = channel; values: row =
        channel, K = position) at bit ``lane * bits`` (:mod:`hw.format`). Values split by
        residue are no such stream (:meth:`write` writes them).

        Raises
        ------
        LoweringError
            Values split by residue (fields of value and index bits, not at K position
            ``k``)."""
        if kind == "v" and self.residue > 1:
            raise LoweringError(f"values split by residue {self.residue} are sparse fields, "
                                "not bytes or nibbles at their positions")
        pos = np.asarray(positions).reshape(-1, 1)
        ch = np.arange(self.head_dim)[None, :]
        if kind == "k":
            lay, stride, row, k = self.keys, self.key_tile_stride, pos, ch
        else:
            lay, stride, row, k = self.values, self.value_tile_stride, ch, pos
        bit = (row % self.lanes) * lay.fmt.field_bits
        offset = (row // self.lanes) * stride + lay.geometry.record_offset(k) + bit // 8
        return np.broadcast_to(offset, (pos.shape[0], self.head_dim)), \
            np.broadcast_to(bit % 8, (pos.shape[0], self.head_dim))

    def code_offsets(self, positions) -> np.ndarray:
        """Byte offsets ``[len(positions), groups]`` of the INT4 keys' scale codes at
        ``positions``: the header word of each group holds one code per lane."""
        lay = self.keys
        if lay.fmt.raw:
            raise LoweringError(f"the {lay.fmt.name} key cache has no scale codes")
        pos = np.asarray(positions).reshape(-1, 1)
        g = np.arange(lay.groups)[None, :]
        return (pos // self.lanes) * self.key_tile_stride + g * lay.group_bytes + \
            pos % self.lanes

    def append_transfer(self, kind: str) -> tuple[int, int, int]:
        """The DMA shape ``(rows, row_beats, dram_stride)`` (beats) of the beats one position
        touches in a kv head's keys (``kind`` "k"), the INT4 keys' group codes ("h"), values
        ("v") or value codes ("c"), which an on-chip append loads, merges its codes into
        (INSERT, INSERT4: :meth:`append_func`) and stores back whole (:meth:`append_origin`
        and :meth:`append_site` give where, :meth:`append_insert` how). INT8 keys: a
        channel's record per position byte (records of ``lanes`` bytes: the tile's records
        as one run when a record is at most a beat, else the record's beat of each channel);
        INT4 keys: each group's records as one run (``groups`` rows, a group apart), their
        codes the beat of each group's header that holds the position's code (a header of
        ``lanes`` bytes); INT4 key records wider than a beat: the record's beat of each
        channel of a group (a piece per group, :meth:`append_pieces`); values, the
        position's record in each of ``head_dim / lanes`` tiles (a record of more lanes than
        ``head_dim``: its beats up to the last channel's); codes, the beat of the position's
        word. Every beat moved holds a code the append writes.

        Raises
        ------
        LoweringError
            INT4 keys whose records, headers or groups of records are not whole beats (the
            append keeps them in beats of their own) and whose records are not within a beat.
        """
        beat = self.beat
        if kind in ("k", "h") and self.bits == 4:
            lay = self.keys
            run = lay.group_bytes - lay.header_bytes
            if (lay.record_bytes > beat and lay.record_bytes % beat) or lay.header_bytes % beat \
                    or run % beat:
                raise LoweringError(
                    f"the INT4 key stream of {self.lanes} lanes (records of "
                    f"{lay.record_bytes} bytes, headers of {lay.header_bytes}) is not in whole "
                    f"{beat}-byte beats of records and headers: no on-chip append")
            rows, stride = lay.groups, lay.group_bytes // beat
            if kind == "h":   # each group's header beat holding the position's code
                return rows, 1, stride
            if self._wide_int4_keys:
                return lay.geometry.group_len, 1, lay.record_bytes // beat
            return rows, run // beat, stride
        if kind == "k":
            rec = self.keys.record_bytes
            if rec <= beat:
                return 1, -(-self.head_dim * rec // beat), 1
            return self.head_dim, 1, rec // beat
        if kind == "v":
            # a record of a beat or more: its beats up to the position's last channel (with
            # more lanes than channels, the record's tail is the padding's)
            rec = self.values.record_bytes
            used = min(self.lanes, self.head_dim) * rec // self.lanes
            return (-(-self.head_dim // self.lanes), max(1, -(-used // beat)),
                    self.value_tile_stride // beat)
        return 1, 1, 1

    @property
    def _wide_int4_keys(self) -> bool:
        """INT4 key records wider than a beat: an append moves one beat of each."""
        return self.bits == 4 and self.keys.record_bytes > self.beat

    def append_pieces(self, kind: str) -> tuple[int, int]:
        """``(pieces, beats)``: an append of ``kind`` moves :meth:`append_transfer`'s shape
        and INSERTs :meth:`append_insert`'s codes ``pieces`` times, each piece ``beats``
        after the one before in the region and taking the codes after the one before's:
        a piece per group of INT4 key records wider than a beat (the records of a group are
        evenly apart, those of two groups not), else one."""
        if kind == "k" and self._wide_int4_keys:
            return self.keys.groups, self.keys.group_bytes // self.beat
        return 1, 0

    def append_origin(self, kind: str) -> int:
        """The beat, from the start of its region, of the first beat :meth:`append_transfer`
        moves at position 0: the first record after the header for INT4 keys, else 0."""
        if kind == "k" and self.bits == 4:
            return self.keys.header_bytes // self.beat
        return 0

    def append_func(self, kind: str) -> VecFunc:
        """The INSERT that merges the codes of ``kind``: INSERT4 (nibbles) for INT4 keys and
        values, INSERT (bytes) else."""
        return VecFunc.INSERT4 if self.bits == 4 and kind in ("k", "v") else VecFunc.INSERT

    def append_terms(self, kind: str) -> tuple[tuple[RegTerm, ...], tuple[RegTerm, ...]]:
        """Where an append of the step's position lies, as run-time register terms of ``pos``
        (:class:`hw.isa.RegTerm`): ``(beats, base)``, the first beat it moves past
        :meth:`append_origin` (keys, the INT4 keys' codes, values of a kv head, or its value
        codes or scores' channel words, ``kind`` "k", "h", "v", "c", "s") and the first
        code's byte in the loaded row (INSERT's ``base``; INSERT4's in nibbles). Both sum to
        0 at position 0, so that the words built for it, relative to registers holding
        these, serve every step (:meth:`append_site` evaluates them).

        Raises
        ------
        LoweringError
            INT8 key records wider than a beat whose lanes are not whole beats.
        """
        beat, lanes = self.beat, self.lanes
        if kind in ("k", "h"):
            tile = RegTerm("pos", div=lanes, scale=self.key_tile_stride // beat)
            if self._wide_int4_keys or (kind == "h" and lanes > beat):
                # the lane's beat and nibble of a record (bytes of a header: ``unit`` 1)
                unit = 2 if kind == "k" else 1
                return (tile, RegTerm("pos", div=unit * beat, mod=lanes // (unit * beat))), \
                    (RegTerm("pos", mod=unit * beat),)
            if self.bits == 4 or self.keys.record_bytes <= beat:
                # INT4: nibble ``lane`` of a record, byte of a header
                return (tile,), (RegTerm("pos", mod=lanes),)
            if lanes % beat:
                raise LoweringError(f"INT8 key records of {lanes} lanes are not whole "
                                    f"{beat}-byte beats: no on-chip append")
            # the lane's beat and byte: (pos % lanes) // beat and pos % beat
            return (tile, RegTerm("pos", div=beat, mod=lanes // beat)), \
                (RegTerm("pos", mod=beat),)
        size = self.values.record_bytes if kind == "v" else 4
        nibbles = 2 if self.bits == 4 and kind == "v" else 1
        return (RegTerm("pos", mul=size, div=beat),), \
            (RegTerm("pos", mul=size, mod=beat, scale=nibbles),)

    def append_site(self, kind: str, position: int) -> tuple[int, int]:
        """Where an append of ``position`` (:meth:`append_transfer`) lies: :meth:`append_terms`
        at ``position``, ``(beats, base)``; ``(0, 0)`` at position 0."""
        beats, base = self.append_terms(kind)
        return int(reg_value(beats, position)), int(reg_value(base, position))

    def append_insert(self, kind: str) -> tuple[int, int, int, int]:
        """INSERT's geometry of an append at position 0 (:class:`hw.isa.InsertGeometry` less
        ``base``, which :meth:`append_site` gives): ``(group, groups, stride, skip)``, in
        nibbles for INSERT4 (:meth:`append_func`)."""
        rows, row_beats, _ = self.append_transfer(kind)
        if kind == "h":    # a code per group, each at its lane of its group's header
            return self.keys.groups, 1, row_beats * self.beat, 0
        if kind == "k":
            rec = self.keys.record_bytes
            if self._wide_int4_keys:  # a piece's codes a loaded beat apart: groups of one
                return 1, rows, self.beat, self.beat
            if self.bits == 4:
                return self.head_dim, 1, 2 * rec, 0
            return self.head_dim, 1, rec if rec <= self.beat else self.beat, 0
        if kind == "v":
            # a group per tile's record; one group (no more channels than lanes) skips none
            group = min(self.lanes, self.head_dim)
            span = row_beats * self.beat * (2 if self.bits == 4 else 1)
            return group, rows, 1, span - group if rows > 1 else 0
        return 4, 1, 1, 0

    def write(self, region: np.ndarray, kind: str, positions, q: np.ndarray,
              codes: np.ndarray | None = None) -> None:
        """Write integer keys or values ``q [len(positions), head_dim]`` (int8, INT4 in
        [-8, 7] at 4 bits) and, for INT4 keys, their scale ``codes [len(positions), groups]``
        into ``region`` (the kv head's uint8 region, in place). A byte shared by two INT4
        fields keeps the other field's bits; values split by residue go to their rows,
        steps and indices (the class docstring) through
        :meth:`hw.format.StreamLayout.write_fields`."""
        q = np.asarray(q)
        if kind == "v" and self.residue > 1:
            pos = np.asarray(positions).reshape(-1, 1)
            c = pos % self.residue
            self.values.write_fields(region, c * self.head_dim + np.arange(self.head_dim),
                                     pos // self.residue, self.value_format.fields(q, c),
                                     self.value_tile_stride)
            return
        offset, shift = self.fields(kind, positions)
        if self.bits == 8:
            region[offset] = q.astype(np.int8).view(np.uint8)
        else:
            nib = (q.astype(np.int16) & 0xF).astype(np.uint8)
            for sh in (0, 4):  # the fields of one shift are in distinct bytes
                sel = shift == sh
                at = offset[sel]
                region[at] = (region[at] & np.uint8(0xF0 >> sh)) | (nib[sel] << np.uint8(sh))
        if kind == "k" and not self.keys.fmt.raw:
            if codes is None:
                raise LoweringError("INT4 keys need their scale codes")
            region[self.code_offsets(positions)] = np.asarray(codes, np.uint8)


@dataclass(frozen=True)
class Member:
    """One GEMM layer of a node's program and the DRAM symbols of its operands (``b``: the
    int32 bias rows of a biased layer, laid out as its outputs); ``source``: the linear layer
    it computes (None for attention members, whose weight is the KV cache)."""

    plan: LinearPlan
    w: str
    x: str
    y: str
    w_tile_stride: int | None = None
    b: str | None = None
    source: LinearLayer | None = None

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


@dataclass(frozen=True)
class LowerContext:
    """What a lowering rule needs besides the node: the accelerator, the layers' formats and,
    for attention, the context bucket and the cache layout."""

    cfg: AcceleratorConfig
    fmt_of: FormatOf
    bucket: int | None = None
    kv: KVLayout | None = None


#: ``rule(node, graph, context) -> members`` of an accelerator op's program.
LoweringRule = Callable[[Node, Graph, LowerContext], list[Member]]


def _rows(shape) -> int:
    n = 1
    for d in shape[:-1]:
        n *= d
    return n


def _linear_members(node: Node, graph: Graph, ctx: LowerContext) -> list[Member]:
    """One member per layer, all reading one input buffer."""
    phase = graph.meta.get("phase", "")
    x_type = graph.values[node.inputs[0]]
    many = "weights" in node.attrs  # one member per output, each with its own buffer
    out = []
    for i, (layer, y) in enumerate(zip(linear_layers(node), node.outputs, strict=True)):
        fmt = ctx.fmt_of(layer.layer)
        if fmt is None:
            raise LoweringError(f"node {node.name!r}: layer {layer.layer} has no format for "
                                "the accelerator")
        n, k = graph.values[y].shape[-1], x_type.shape[-1]
        plan = plan_linear(ctx.cfg, fmt, n, k, _rows(x_type.shape), bias=layer.bias is not None)
        index = i if many else None
        out.append(Member(plan, symbols.weights(layer.layer),
                          symbols.buffer("x", phase, node.name),
                          symbols.buffer("y", phase, node.name, index),
                          b=symbols.buffer("b", phase, node.name, index) if layer.bias else None,
                          source=layer))
    return out


def _attention_members(node: Node, graph: Graph, ctx: LowerContext) -> list[Member]:
    """One member per operand head: its query (or probability) rows against that head's key
    (or value) cache, ``bucket`` positions long."""
    if ctx.bucket is None or ctx.kv is None:
        raise LoweringError(f"node {node.name!r}: attention needs a context bucket")
    phase = graph.meta.get("phase", "")
    a = node.attrs
    b, heads, t, _ = graph.values[node.inputs[0]].shape
    operand_heads = graph.values[node.inputs[1]].shape[1]  # kv_heads, or heads if repeated
    per = heads // operand_heads                           # query heads per operand head
    out = []
    for j in range(operand_heads):
        cache_head = j // (operand_heads // a["kv_heads"])
        if node.op == "attn_scores":
            plan = plan_linear(ctx.cfg, ctx.kv.key_format, ctx.bucket, a["head_dim"],
                               b * per * t)
            stride, kind = None, "k"
        else:  # split by residue: R * head_dim outputs, added after (value_residue)
            plan = plan_linear(ctx.cfg, ctx.kv.value_format, ctx.kv.value_rows, ctx.bucket,
                               b * per * t)
            stride, kind = ctx.kv.value_tile_stride, "v"
        out.append(Member(plan, symbols.cache(kind, a["layer"], cache_head),
                          symbols.buffer("x", phase, node.name, j),
                          symbols.buffer("y", phase, node.name, j), stride))
    return out


#: How each op that may run on the accelerator (``OPS[op].streams``) becomes a program's
#: members: its lowering, beside the op's definition in :data:`sw.compile.ir.ops.OPS`.
LOWERINGS: dict[str, LoweringRule] = {
    "linear": _linear_members,
    "linears": _linear_members,
    "attn_scores": _attention_members,
    "attn_values": _attention_members,
}


def node_members(node: Node, graph: Graph, cfg: AcceleratorConfig, fmt_of: FormatOf,
                 bucket: int | None = None, kv: KVLayout | None = None) -> list[Member]:
    """The members of an accelerator node's program by its op's lowering rule (``bucket``:
    key positions covered by attention nodes; ``kv``: the cache layout, for the value tiles'
    stride). Buffer symbols are :func:`sw.compile.symbols.buffer`'s."""
    rule = LOWERINGS.get(node.op)
    if rule is None:
        raise LoweringError(f"node {node.name!r}: op {node.op} does not run on the "
                            "accelerator")
    return rule(node, graph, LowerContext(cfg, fmt_of, bucket, kv))
