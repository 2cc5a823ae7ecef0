"""Fused programs: consecutive accelerator nodes as one program (one host round trip).

On a configuration with a vector engine a host op lowered to a VEC program (RMSNorm,
SiLU-gate: :mod:`sw.compile.vector`) is often followed directly by the linear node that reads
its result (the pre-norm blocks: ``rmsnorm -> q/k/v``, ``rmsnorm -> gate/up``,
``silu_gate -> down``). Unfused, the host reads the vector program's Q15.16 rows back,
requantises them to INT8 (``quantize_activations_vector``), writes them into the linear
program's input buffer and dequantises its int32 outputs. Fused (:func:`fusion_pairs`,
:func:`fused_parts`), one program does all of it on chip. A fused program is a list of
*parts* (:data:`Part`), each a program as it would run alone:

=====================  ===========================================================
part                   what it does
=====================  ===========================================================
a vector program       a vector node's: its rows from ``x`` (and ``b``) to ``y`` (Q15.16)
REQUANT                ``y`` (a chain's REQUANT head: the host's rows) to the linear's
                       INT8 input rows and each row's ``amax`` word (:class:`RequantOp`,
                       :func:`sw.compile.schedule.schedule_requant`,
                       :func:`hw.numerics.vec_requant`: the host's requantisation)
FOLD                   attention's probabilities times the value codes the host writes, to
                       the values GEMM's INT8 rows and FOLD's ``amax`` words (a
                       :class:`RequantOp` with ``w``, :func:`hw.numerics.vec_fold`)
a linear program       a linear node's: GEMM tiles to its int32 outputs
DEQUANT                one per member of the linear: its int32 rows, the layer's channel
                       words (a constant row, :func:`hw.numerics.dequant_channels`) and the
                       ``amax`` words to Q15.16 rows (:class:`DequantOp`,
                       :func:`sw.compile.schedule.schedule_dequant`,
                       :func:`hw.numerics.vec_dequant`: the vector twin's dequantisation)
ADD                    a residual linear's Q15.16 rows plus the residual rows, where a
                       later part reads the sum (a vector program of ``VecFunc.ADD``)
=====================  ===========================================================

The parts meet in DRAM (the vector engine's results leave through VOUT, the GEMM reads ACT,
and no datapath joins the two). Each part's events are those of its own schedule; between
two parts the LOAD engine waits, with SYNCs, on every event the earlier part signalled and
never waited on (its last ``STORED`` / ``FREE`` signals: :func:`fuse_words`). That consumes
them, so the next part starts from counters at 0 as it would alone, and orders its loads
after the earlier part's stores.

The LOADs that do not need the drain go before those SYNCs (:func:`hoistable`,
:func:`fuse_parts`): of the next part's leading LOAD-engine words without a wait (the first
that waits reuses a scratchpad buffer, so prefetching stays within the double buffering or
the weights' ring, :func:`sw.compile.schedule.ring_slots`), each LOAD whose DRAM source no
STORE of the part before writes, whose scratchpad beats that part does not load (a part
reads only what its own LOADs put there) and whose scratchpad beats no LOAD it overtakes
writes -- a GEMM's first weight chunks after a REQUANT, a DEQUANT's channel words and
``amax`` beats after the GEMM -- and, past that run, each LOAD without a wait into WGT, ACT
or VIN that meets the same and whose beats and DRAM no earlier LOAD, move or STORE of the
part writes (in a joined step, weights an earlier fusion moved inside the next program); and
a leading LOAD into VIN whose beats the part before loads but has settled by its end
(:func:`drained_loads`: no VEC of it that the events do not prove complete reads them,
:func:`settled`) goes right before that boundary alone (the query's rows after the KV
append). Each goes to the first boundary, in order, where the LOAD engine would idle for at
least half as long as the LOAD takes (:func:`_slack`, :data:`HOIST_FILL`: the part after
then starts later by less than the LOAD engine streams instead of idling), up past several
parts when no STORE of the program writes its DRAM source and none of those parts loads its
scratchpad beats (:func:`_boundary`: weights load while the vector parts before their GEMM
run; in a step whose blocks roll into one loop, weights only, past vector parts only and not
past a residual ADD, where a weights LOAD may overtake an earlier one of its part into other
beats (a DEQUANT's channel words that stay at their own boundary)); of those that find no
room, the first goes before its own boundary's SYNCs and the rest stay after them
(:data:`HOIST_UNFIT`), where they do not hold up the activations' LOAD that the GEMM needs
first. The scheduler spreads a ring's slots over the whole WGT scratchpad, so before that a
GEMM part's WGT is packed (its LOADs' beats side by side) and moved above the WGT the parts
before it load, or below it where only that leaves room, past as many of the latest as leave
room (:func:`_wgt_moved`): a GEMM's weights then load past the GEMM parts before it
(o_proj's weights while attention runs). A GEMM part whose weights all load before its
boundary leaves its LOAD engine idle while its array computes: a later part's LOAD may also
go inside it, after its leading LOAD-engine words and before its first GEMM
(:func:`_inside`), where it has room; one whose ring loads weights after its boundary, right
after its last GEMM (:func:`_after_weights`: HBM-class decode's next GEMM's first tiles
while its last GEMM runs), where weights may overtake the part's earlier hoisted LOADs of
other beats. Consecutive vector parts load the same VIN beats (every template starts at 0),
so a vector part's VIN moves above the beats the part before loads, where it fits and lets
more LOADs go: a DEQUANT after another, or a ROPE after a DEQUANT, then loads its rows while
the VEC before it runs. The moved LOADs leave their signals behind; the LOAD engine, in
order, raises each at the moved LOAD's place after the SYNCs (on the LOAD-engine word before
that place, or on a SYNC of its own right after that word, ahead of the other engines' words
up to the place, so the dispatcher reaches it as early as the LOAD engine could raise it),
so a consumer is granted only once every load before that place, the moved ones included,
has landed, and no event is signalled before the boundary: the events run as in the drained
program, and the DRAM results are its (tests/sw/compile/test_fusion.py). The weights then
stream while the part before computes and drains.

A GEMM part and the DEQUANT parts after it that read its stores are one part
(:func:`beside`, where :func:`_may_run_beside`): a DEQUANT's LOADs of accumulator rows go
into the GEMM part's LOAD stream right after the LOAD-engine word that takes the STORED
signal of the last tile they read (a SYNC of its own after the part's last word where none
does), its VECs and STOREs as soon as their events allow, and its STORED events are the two
after the vector parts' (:data:`BESIDE_EVENTS`). A decode step's one-row DEQUANT is cut into
segments of a few GEMM output tiles (:func:`sw.compile.schedule.dequant_segment_beats`), so
the vector engine dequantises the finished tiles while the array computes the next ones.
Attention's SOFTMAX (and, where :func:`_folds_beside`, FOLD) parts join such a run after the
part whose rows they read, a head at a time; such a run is paced by the instructions'
durations (:func:`beside`: its LOAD-engine words and STOREs; a VEC goes as soon as the
vector engine's queue has room) so the in-order engines keep streaming the next heads' keys.
In a chain, a decode step's SILU_GATE after the gate/up linear joins its run likewise, a
column segment at a time (:func:`silu_segments`, where the up GEMM streams enough weights
per segment: :data:`SILU_SEGMENT_MARGIN`): the up member's DEQUANT and the SILU_GATE become
alternating segment parts, each SILU_GATE segment reading the gate rows and the up rows its
DEQUANT segment just wrote while the array computes the next up tiles; the last segment
(no tile left beside it) and the REQUANT stay before ``down_proj``.

The host reads every part's results back after the run
(the graph's values of its nodes: a linear's as the Q15.16 rows its DEQUANT parts wrote),
and adds a residual as unfused.

A node pair fuses when the linear's input is the vector node's output, neither depends on
the context bucket, the linear has no bias (its bias rows are written by the host between
the two) and it reads ``rows`` rows of ``length`` elements as the vector node writes them.

*Chaining* (:func:`fusion_groups`): consecutive *units* -- pairs, lone vector nodes and
REQUANT heads (:func:`linear_group`: a linear node as a REQUANT of Q15.16 rows into its
INT8 input rows, its program and a DEQUANT per member) -- become one program when each unit
after the first reads only rows an earlier part left on chip (a vector node's results, a
linear's DEQUANT rows, or a residual linear's output as the ADD of its DEQUANT rows and
residual rows on chip) with its *head* (its vector part's operands, its REQUANT's input).
The first unit's rows are the host's, written before the start: a vector node's operands,
or a REQUANT head's input rows (``to_fixed`` of the linear's input: REQUANT of them is the
host's :func:`hw.numerics.quantize_activations_vector`). A residual linear's residual rows
(:attr:`FusedGroup.residual`) are read where an earlier chain of the phase left them on
chip (its head's host rows, a vector or DEQUANT part's results or an ADD's, of the same
rows and length), else from a buffer the host writes; the compiler tells the host to write
them only where no program of every context left them (:func:`rows_left`). Later units'
residual rows are on chip when they are the first unit's or an earlier ADD's. A later head
is relocated to read the rows on chip (a REQUANT head then reads them where they are), and
the host needs nothing between the nodes: the runtime
runs the program at the first node and reads the later nodes' results back at their turn.
A REQUANT head alone is no fewer programs: it only heads or joins a chain.
A ``rope`` node reads q or k through layout nodes (``view``, ``transpose``) of the q/k/v
linear's output, whose rows are already ROPE's rows (one token's heads side by side): it
joins a chain that holds those DEQUANT rows (:func:`row_aliases`). Its table LOADs stay
run-time parameters: the fused program lists them (:func:`fuse_parts` gives where each
part's words lie) and the runtime points them at the step's position as for the node alone.
In a decoder this chains a block's ``o_proj (+ ADD)`` (its input the attention's output),
``rmsnorm -> gate/up -> silu_gate -> down (+ ADD)`` and the next block's
``rmsnorm -> q/k/v -> rope(q), rope(k)`` (the last block's: the final norm). A chain that
does not fit the instruction memory falls back to its pairs (:attr:`FusedGroup.fallback`).

*Attention* (:func:`scores_groups`): per context bucket, the scores program (a member per
operand head), a DEQUANT per member, the softmax program and the values program of the same
bucket (between a FOLD and a DEQUANT per member, :func:`values_parts`) are one program. The
softmax is a SOFTMAX part per member, of its rows (:attr:`VectorOp.within`), right after its
DEQUANT, so a head's softmax runs beside the next heads' scores GEMMs (:func:`beside`); each
FOLD goes right after its SOFTMAX too where the keys outlast the vector engine's work on them
(:func:`_folds_beside`), else after the scores. With several kv heads and at most
:data:`WEAVE_POSITIONS` positions the values are woven in a head at a time
(:func:`_values_woven`): each head's values GEMM is a part of its own
(a member alone) right after its FOLD, and the next head's DEQUANT, SOFTMAX and FOLD, then
the head before's values DEQUANT, run beside it (a DEQUANT that reads no STORE of the GEMM
part, an earlier part's drained accumulators, may: :func:`_may_run_beside`), so the array
computes a head's values while the vector engine works on the next head.
The scores' DEQUANTs write the softmax's input rows in place (each member's rows a region
inside that buffer: ``within``); their channel words (the key scales with the
softmax scale folded in: a word per cached position, written as the cache grows, by the
host's append or by the on-chip one, :mod:`sw.compile.kvappend`) and ``amax`` words (the
query rows') are the host's, the latter written with the query's INT8 rows before the run
(``host``); the SOFTMAX's valid counts stay run-time
``imm`` words. In a decode step a REQUANT per member first requantises its query rows from
the q rope's results (still in DRAM after the program that computed them), so the host
writes neither the query rows nor their ``amax``. A values member's FOLD reads its rows of
the softmax's results (``within``) and its kv head's value codes (each cached position's
integer ``amax``: :func:`sw.compile.symbols.value_codes`, written as the channel words
are), its DEQUANT the accumulators, FOLD's ``amax`` words and one constant row of
:func:`hw.numerics.values_channel` words, into the values node's Q15.16 rows, which the host
reads back as the node's output.

*Attention and its chain* (:func:`attention_chains`): each bucket's attention program and
the chain its block's o_proj heads are one program. With one token (a decode step) the
values node's output, through its layout nodes, is o_proj's input row -- the heads' rows
side by side, which are the values members' DEQUANT rows in member order (a member's rows
its kv head's query heads in order: :func:`hw.numerics.group_rows`) -- so each values
DEQUANT writes its rows inside the o_proj REQUANT's input buffer (``within``) and the REQUANT
reads them there. o_proj's residual rows are where the chain before left them (the
block's input: the previous block's last ADD, the first block's norm input). The chain's
nodes then have a program per bucket (the compiler's
``_fuse_attention``); a bucket whose merged program does not fit the instruction memory
falls back to its attention program and the chain alone. In a prefill the values' rows
(a head's tokens) are not o_proj's (a token's heads): a DEQUANT per query head writes its
rows again as its column range of o_proj's input rows (:func:`_values_into`).
"""

from __future__ import annotations

import functools
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
import torch

from hw import timing
from hw.config import AcceleratorConfig
from hw.engines import completion_delay, engines_fields, exec_cycles_fields
from hw.isa import (
    MOVE_SOURCES,
    NO_EVENT,
    End,
    Engine,
    Gemm,
    Instr,
    Load,
    Opcode,
    Spad,
    Store,
    Sync,
    Vec,
    VecFunc,
    decode,
    decode_fields,
    dequant_amax_addr,
    dispatch_errors,
    field_location,
    gemm_weight_bytes,
    is_move,
    program_words,
    vec_reads_amax,
    vec_reads_b,
    word_beats,
)
from hw.numerics import ACT_QMAX, KV4_QMAX
from hw.timing import vec_cycles
from sw.compile import symbols
from sw.compile.errors import LoweringError
from sw.compile.ir import OPS, Graph, rope_rows
from sw.compile.kvappend import KVAppendOp
from sw.compile.lower import Member
from sw.compile.schedule import (
    EVENTS,
    AmaxPlace,
    amax_place,
    argmax_beats,
    dequant_segment_beats,
)
from sw.compile.vector import VectorOp, row_bytes

__all__ = ["RequantOp", "DequantOp", "ArgmaxOp", "Part", "fusion_pairs", "requant_op",
           "dequant_ops", "fused_parts", "FusedGroup", "fusion_groups", "linear_group",
           "part_buffers", "part_constants", "part_aliases", "scores_groups", "fuse_words",
           "fuse_parts", "hoistable", "row_aliases", "rows_left", "attention_chains", "all_groups",
           "query_requants",
           "VECTOR_EVENTS", "vector_events", "BESIDE_EVENTS", "rename_events", "beside",
           "SCORES_AMAX", "kv_appends", "weights_first", "silu_segments", "HOIST_FILL",
           "HOIST_UNFIT", "AHEAD_FILLS", "AHEAD_ROUNDS", "WEAVE_POSITIONS", "Timeline",
           "timeline", "load_idle", "loads_ahead", "dram_extent",
           "overlapping", "overlaps"]

#: The events a vector part of a fused program uses instead of the scheduler's
#: (:data:`sw.compile.schedule.EVENTS`) where the vector engine takes the compute engine's
#: place: each event has one producer and one consumer engine in a whole program (the
#: programming model), so FULL (LOAD -> VECTOR) and OUT_FULL (VECTOR -> STORE) get ids after
#: the scheduler's; STORED (STORE -> LOAD) is the same pair of engines in every part.
VECTOR_EVENTS = {EVENTS[name]: len(EVENTS) + i
                 for i, name in enumerate(("FULL0", "FULL1", "OUT_FULL0", "OUT_FULL1"))}


#: The STORED events (STORE -> LOAD) of vector parts that run beside the GEMM part before
#: them (:func:`beside`), whose STOREs signal the scheduler's: the two after
#: :data:`VECTOR_EVENTS`.
BESIDE_EVENTS = {EVENTS[name]: max(VECTOR_EVENTS.values()) + 1 + i
                 for i, name in enumerate(("STORED0", "STORED1"))}


def vector_events(words: np.ndarray) -> np.ndarray:
    """A copy of a vector program's ``words`` with its events renamed by
    :data:`VECTOR_EVENTS`."""
    return rename_events(words, VECTOR_EVENTS)


def rename_events(words: np.ndarray, mapping: Mapping[int, int]) -> np.ndarray:
    """A copy of ``words`` with every wait and signal on an event of ``mapping``'s keys on
    its value instead."""
    out = words.copy()
    for name in ("wait", "signal"):
        off, width = field_location(name)
        half, off = divmod(off, 64)
        if off + width > 64:
            raise LoweringError(f"the {name} field straddles the instruction's halves")
        mask = np.uint64((1 << width) - 1) << np.uint64(off)
        ev = (out[:, half] & mask) >> np.uint64(off)
        new = ev.copy()
        for old, to in mapping.items():
            new[ev == np.uint64(old)] = np.uint64(to)
        out[:, half] = (out[:, half] & ~mask) | (new << np.uint64(off))
    return out


@dataclass(frozen=True)
class RequantOp:
    """The REQUANT part of a fused program: ``rows`` Q15.16 rows of ``length`` int32 elements
    at symbol ``x`` to INT8 rows ``act_row_bytes`` apart at symbol ``y`` (a
    :class:`sw.compile.relocation.SymbolicLayer` of operands ``x`` and ``y``); with ``amax``,
    each row's ``amax`` word also reaches DRAM for a DEQUANT part
    (:func:`sw.compile.schedule.amax_place`: in the INT8 rows, or in ``b``, a beat per
    row); ``within``: ``x`` is the rows of another buffer from a byte offset on
    (``(symbol, offset)``: :func:`sw.compile.symbols.within`); ``host``: ``x`` is rows the
    host writes before the run (``to_fixed`` of the linear's input: a chain's first part,
    :func:`linear_group`). With ``w`` (``w_bytes`` bytes), a FOLD: the attention's values
    prologue, the rows times the value codes the host writes at ``w``
    (:func:`sw.compile.symbols.value_codes`), the ``amax`` words FOLD's. ``x_row_bytes``:
    bytes from one row of ``x`` to the next (0: ``row_bytes(cfg, length)``, consecutive;
    more: a column range of wider rows, whole beats); ``into``: ``y`` and ``b`` are the rows
    of buffers ``(y buffer, b buffer or None, first row)`` from that row on (a part that
    writes some of another's operand rows)."""

    rows: int
    length: int
    act_row_bytes: int
    x: str
    y: str
    b: str | None = None
    amax: bool = False
    w: str | None = None
    w_tile_stride: None = None
    within: tuple[str, int] | None = None
    host: bool = False
    w_bytes: int = 0
    x_row_bytes: int = 0
    into: tuple[str, str | None, int] | None = None

    @property
    def fold(self) -> bool:
        """A FOLD (the values prologue) rather than a REQUANT."""
        return self.w is not None

    @property
    def signature(self) -> tuple:
        """What the instructions depend on, addresses aside."""
        return ("requant", self.rows, self.length, self.act_row_bytes, self.amax, self.fold,
                self.x_row_bytes)

    @property
    def writes(self) -> str:
        """The buffer of the INT8 rows it writes (``y``'s, or the one it is ``into``)."""
        return self.y if self.into is None else self.into[0]


@dataclass(frozen=True)
class DequantOp:
    """The DEQUANT part of a fused program: a GEMM's ``rows`` rows of ``length`` int32
    accumulators (symbol ``x``, ``acc_row_bytes`` apart) to Q15.16 rows (symbol ``y``,
    ``row_bytes`` apart: a vector program's rows, or more, a column range of wider rows),
    with the layer's channel words (symbol
    ``w``, one constant row: :func:`hw.numerics.dequant_channels` of its row scales) and the
    ``amax`` words its REQUANT part wrote (symbol ``b``, at ``place``); ``layer``: the
    linear layer (module name) whose row scales the channel words hold. ``host``: the
    channel words and ``amax`` words are the host's, written before each run (the scores':
    :func:`scores_groups`); ``within``: ``y`` is the rows of another buffer from a byte
    offset on (``(symbol, offset)``: :func:`sw.compile.symbols.within`); ``fold_qmax``
    (127 or 7, the value cache's): the values epilogue, the ``amax`` words FOLD's and the
    channel words the constant :func:`hw.numerics.values_channel`; ``part_of``: ``x`` and
    ``b`` are the rows of buffers ``(accumulators, amax words, first row)`` from that row
    on (a DEQUANT of some of a member's rows); ``columns``: ``(whole, offset)``, a column
    segment of the one-row DEQUANT ``whole``: ``x``, ``w`` and ``y`` are ``whole``'s from
    byte ``offset`` on, ``b`` its own (:func:`silu_segments`)."""

    rows: int
    length: int
    acc_row_bytes: int
    row_bytes: int
    place: AmaxPlace
    x: str
    w: str
    b: str
    y: str
    layer: str = ""
    w_tile_stride: None = None
    host: bool = False
    within: tuple[str, int] | None = None
    fold_qmax: int = 0
    part_of: tuple[str, str, int] | None = None
    columns: tuple[DequantOp, int] | None = None

    @property
    def signature(self) -> tuple:
        """What the instructions depend on, addresses aside."""
        return ("dequant", self.rows, self.length, self.acc_row_bytes, tuple(self.place),
                bool(self.fold_qmax), self.row_bytes)

    @property
    def data_bytes(self) -> int:
        """Bytes of the results' rows in DRAM."""
        return self.rows * self.row_bytes


@dataclass(frozen=True)
class ArgmaxOp:
    """The ARGMAX part of a fused program: the first maximum of each of ``rows`` Q15.16 rows
    of ``length`` elements (symbol ``x``, ``row_bytes`` apart: a DEQUANT part's results), as
    its index and value in one beat per row at symbol ``y`` (:func:`hw.numerics.vec_argmax`,
    :func:`sw.compile.schedule.schedule_argmax`)."""

    rows: int
    length: int
    row_bytes: int
    x: str
    y: str
    w: None = None
    b: None = None
    w_tile_stride: None = None

    @property
    def signature(self) -> tuple:
        """What the instructions depend on, addresses aside."""
        return ("argmax", self.rows, self.length)


#: A part of a fused program: a vector node's program, a REQUANT, a linear node's program (its
#: members), a DEQUANT of one member's outputs, an ARGMAX of a DEQUANT's rows, or a layer's
#: KV append (:mod:`sw.compile.kvappend`).
Part = VectorOp | RequantOp | tuple[Member, ...] | DequantOp | ArgmaxOp | KVAppendOp


def _fusable(a: tuple, b: tuple) -> bool:
    """Whether work entries ``a`` then ``b`` (``(phase, node, bucket, members)``) fuse."""
    phase_a, node_a, bucket_a, mem_a = a
    phase_b, node_b, bucket_b, mem_b = b
    if phase_a != phase_b or bucket_a is not None or bucket_b is not None:
        return False
    if len(mem_a) != 1 or not isinstance(mem_a[0], VectorOp):
        return False
    if OPS[node_b.op].streams != "weights" or not node_b.inputs:
        return False
    if node_b.inputs[0] != node_a.outputs[0] or any(m.b for m in mem_b):
        return False
    vec = mem_a[0]
    return all(isinstance(m, Member) and m.plan.tokens == vec.rows and m.plan.layout.k == vec.length
               and m.x == mem_b[0].x for m in mem_b)


def fusion_pairs(work: Sequence[tuple]) -> list[int]:
    """The indices ``i`` of ``work`` (the accelerator nodes of every phase, in order, as
    ``(phase, node, bucket, members)``) whose entry fuses with entry ``i + 1`` (the module
    docstring's rule); no entry is in two pairs."""
    out, i = [], 0
    while i + 1 < len(work):
        if _fusable(work[i], work[i + 1]):
            out.append(i)
            i += 2
        else:
            i += 1
    return out


def requant_op(vec: VectorOp, linear: Sequence[Member], amax: str | None = None,
               cfg: AcceleratorConfig | None = None) -> RequantOp:
    """The REQUANT between a vector program and the linear program that reads its rows; with
    ``cfg``, one that leaves the ``amax`` words in DRAM for DEQUANT parts (``amax``: the
    symbol of their buffer where the INT8 rows do not hold them)."""
    m = linear[0]
    if cfg is None:
        return RequantOp(vec.rows, vec.length, m.plan.act_row_bytes, vec.y, m.x)
    place = amax_place(cfg, vec.length, m.plan.act_row_bytes)
    return RequantOp(vec.rows, vec.length, m.plan.act_row_bytes, vec.y, m.x,
                     amax if place.separate else None, True)


def dequant_ops(cfg: AcceleratorConfig, req: RequantOp, linear: Sequence[Member],
                outputs: Sequence[str]) -> list[DequantOp]:
    """One DEQUANT per member of the linear program after ``req`` (``amax=True``): its
    accumulators to Q15.16 rows at ``outputs`` (one symbol per member), with the channel
    words of its layer (:func:`sw.compile.symbols.dequant_channels`)."""
    place = amax_place(cfg, req.length, req.act_row_bytes)
    return [DequantOp(m.plan.tokens, m.plan.n, m.plan.out_row_bytes, row_bytes(cfg, m.plan.n),
                      place, m.y, symbols.dequant_channels(m.source.layer),
                      req.b if place.separate else req.y, y, m.source.layer)
            for m, y in zip(linear, outputs, strict=True)]


def fused_parts(cfg: AcceleratorConfig, vec: VectorOp, linear: Sequence[Member],
                amax: str, outputs: Sequence[str] | None) -> list[Part]:
    """The parts of the fused program of a vector node and the linear node after it: the
    vector program, REQUANT, the linear program and, with ``outputs`` (a Q15.16 symbol per
    member), a DEQUANT per member (``amax``: the symbol of the ``amax`` buffer, where one is
    needed)."""
    if outputs is None:
        return [vec, requant_op(vec, linear), tuple(linear)]
    req = requant_op(vec, linear, amax, cfg)
    return [vec, req, tuple(linear), *dequant_ops(cfg, req, linear, outputs)]


#: How many times a SILU_GATE segment's latency (:func:`_segment_latency`) the up
#: projection's GEMM must stream weights per segment for :func:`silu_segments` to cut: the
#: drains between the segments' parts and the pacing of their LOADs between the weights'
#: (:func:`beside`) stretch a segment to about twice its latency (measured with
#: ``python -m bench.beats``: the reference model's 688-wide MLP streams 1.6x and is slower
#: cut, SmolLM2's 1536-wide streams 4.8x and is faster).
SILU_SEGMENT_MARGIN = 2


def _segment_latency(cfg: AcceleratorConfig, n: int) -> int:
    """Cycles one column segment of ``n`` elements takes through the vector engine alone: a
    DEQUANT part (its channel words, ``amax`` beat and accumulators in, its rows out), then a
    SILU_GATE part (two operands in, its rows out), each drained (its LOADs' and STOREs'
    completion) before the next starts."""
    beats = -(-n // (cfg.beat_bytes // cfg.vin_word_bytes))
    vecs = sum(vec_cycles(Vec(func=f, length=n), cfg)
               for f in (VecFunc.DEQUANT, VecFunc.SILU_GATE))
    drains = 2 * (completion_delay(Engine.LOAD, cfg) + completion_delay(Engine.STORE, cfg))
    return (2 * beats + 1) + beats + 2 * beats + beats + vecs + drains


def silu_segments(cfg: AcceleratorConfig, up: DequantOp, silu: VectorOp,
                  gemm: Member | None = None) -> list[Part] | None:
    """The one-row DEQUANT ``up`` of the up projection and the SILU_GATE ``silu`` that reads
    its rows (``b``, a decode step's) as column segments, alternating: ``up``'s segment
    ``s`` (:attr:`DequantOp.columns`), then ``silu``'s segment ``s`` (``within``: its ``x``,
    ``y`` and ``b`` rows from the segment's first byte), each segment the beats of a
    segment of ``up``'s own schedule (:func:`sw.compile.schedule.dequant_segment_beats`).
    SILU_GATE is elementwise, so the segments compute the whole rows' words. Each
    segment is a part of its own, so a DEQUANT segment runs beside the GEMM tiles it reads
    and the SILU_GATE segment after it beside the next tiles (:func:`_may_run_beside`),
    and only the last segments wait for the last tile. None where ``silu`` does not read
    ``up``'s rows as ``b``, either is not one row of its own buffers, the accelerator has
    no events for a vector part beside a GEMM part (:data:`BESIDE_EVENTS`), the row is
    one segment, or ``gemm`` (the member whose accumulators ``up`` reads) streams fewer
    weight beats per segment than :data:`SILU_SEGMENT_MARGIN` times the segment's latency
    (:func:`_segment_latency`: the segments would lag behind its tiles and end later than
    the whole SILU_GATE after them; with no ``gemm``, cut)."""
    if (silu.func != VecFunc.SILU_GATE or silu.rows != 1 or up.rows != 1
            or silu.b != up.y or silu.within is not None or silu.w is not None
            or up.within is not None or up.part_of is not None or up.columns is not None
            or up.host or up.fold_qmax or silu.length != up.length
            or cfg.num_events <= max(BESIDE_EVENTS.values())):
        return None
    per = cfg.beat_bytes // cfg.vin_word_bytes
    beats = -(-up.length // per)
    seg = dequant_segment_beats(cfg, beats)
    if seg >= beats:
        return None
    if gemm is not None:
        plan = gemm.plan
        tile = sum(plan.chunk_weight_bytes(c) for c in range(plan.k_chunks))
        streamed = seg * per // plan.layout.lanes * tile // cfg.beat_bytes
        if streamed < SILU_SEGMENT_MARGIN * _segment_latency(cfg, seg * per):
            return None
    out: list[Part] = []
    for start in range(0, beats, seg):
        n, offset = min(seg * per, up.length - start * per), start * cfg.beat_bytes
        size = row_bytes(cfg, n)
        out.append(replace(up, length=n, row_bytes=size,
                           x=symbols.within(up.x, offset), w=symbols.within(up.w, offset),
                           y=symbols.within(up.y, offset), columns=(up, offset)))
        out.append(replace(silu, length=n, row_bytes=size, x=symbols.within(silu.x, offset),
                           y=symbols.within(silu.y, offset), b=symbols.within(silu.b, offset),
                           within=(silu.x, silu.y, offset, silu.b)))
    return out


def part_buffers(cfg: AcceleratorConfig, parts: Sequence[Part]) -> list[tuple[str, int]]:
    """``(symbol, bytes)`` of the arena buffers the ``parts`` of a fused program read or
    write besides their nodes' own: the ``amax`` beats, the Q15.16 results of DEQUANT and
    ADD parts, a vector part's rows where it reads an earlier part's results."""
    out = []
    for p in parts:
        if isinstance(p, RequantOp):
            if p.b is not None and p.into is not None:
                out.append((p.into[1], (p.into[2] + p.rows) * cfg.beat_bytes))
            elif p.b is not None:
                out.append((p.b, p.rows * cfg.beat_bytes))
            if p.host:  # the rows the host writes for it
                out.append((p.x, p.rows * row_bytes(cfg, p.length)))
            if p.within is not None:  # the rows it reads live until it has run
                out.append((p.within[0], p.within[1] + _x_bytes(cfg, p)))
        elif isinstance(p, DequantOp) and p.columns is not None:  # the whole row's, once
            out += [(p.columns[0].y, p.columns[0].data_bytes)] if not p.columns[1] else []
        elif isinstance(p, DequantOp):
            out += [(p.y, p.data_bytes)] if p.within is None else []
            out += [(p.b, p.rows * cfg.beat_bytes)] if p.host and p.place == SCORES_AMAX else []
        elif isinstance(p, ArgmaxOp):  # its result beats and any segments' pairs
            out.append((p.y, argmax_beats(cfg, p.rows, p.length) * cfg.beat_bytes))
        elif isinstance(p, VectorOp) and p.within is None:  # a slice's rows are its node's
            out += [(name, size) for name, size, _ in p.buffers()]
        elif isinstance(p, KVAppendOp) and p.scratch_bytes(cfg):  # none where results move
            out.append((p.scratch, p.scratch_bytes(cfg)))
    return out


def part_constants(parts: Sequence[Part]) -> list[tuple[str, int, DequantOp | RequantOp]]:
    """``(symbol, bytes, part)`` of the constant rows the DEQUANT ``parts`` read (their
    channel words; a ``host`` part's: the region the host writes them into) and the value
    codes a FOLD part reads (the region the host writes them into)."""
    return [(p.w, p.row_bytes, p) for p in parts if isinstance(p, DequantOp)
            and p.columns is None] + [  # a column segment's: its whole row's, once
        (p.columns[0].w, p.columns[0].row_bytes, p.columns[0]) for p in parts
        if isinstance(p, DequantOp) and p.columns is not None and not p.columns[1]] + [
        (p.w, p.w_bytes, p) for p in parts if isinstance(p, RequantOp) and p.fold]


def _x_bytes(cfg: AcceleratorConfig, p: RequantOp) -> int:
    """The bytes a REQUANT part's input rows span (their last row's whole beats)."""
    return (p.rows - 1) * (p.x_row_bytes or row_bytes(cfg, p.length)) + row_bytes(cfg, p.length)


def part_aliases(cfg: AcceleratorConfig, parts: Sequence[Part]
                 ) -> list[tuple[str, str, int, int]]:
    """``(symbol, buffer, offset, bytes)`` of every part's operand rows that lie inside
    another buffer (a DEQUANT's results, a REQUANT's input: ``within``; a REQUANT's INT8
    rows and ``amax`` beats: ``into``)."""
    out = [(p.y, *p.within, p.data_bytes) for p in parts
           if isinstance(p, DequantOp) and p.within is not None] + [
        (p.x, *p.within, _x_bytes(cfg, p)) for p in parts
        if isinstance(p, RequantOp) and p.within is not None]
    for p in parts:
        if isinstance(p, VectorOp) and p.within is not None:
            xs, ys, first, *bs = p.within
            out += [(p.x, xs, first, p.data_bytes), (p.y, ys, first, p.data_bytes)]
            out += [(p.b, bs[0], first, p.data_bytes)] if bs else []
        if isinstance(p, DequantOp) and p.columns is not None:
            whole, offset = p.columns
            out += [(p.x, whole.x, offset, p.data_bytes), (p.w, whole.w, offset, p.row_bytes),
                    (p.y, whole.y, offset, p.data_bytes)]
        if isinstance(p, DequantOp) and p.part_of is not None:
            acc, amax, first = p.part_of
            step = p.place.stride * cfg.beat_bytes
            out += [(p.x, acc, first * p.acc_row_bytes, p.rows * p.acc_row_bytes),
                    (p.b, amax, first * step, p.rows * step)]
        if isinstance(p, RequantOp) and p.into is not None:
            y, b, first = p.into
            out.append((p.y, y, first * p.act_row_bytes, p.rows * p.act_row_bytes))
            if p.b is not None:
                out.append((p.b, b, first * cfg.beat_bytes, p.rows * cfg.beat_bytes))
    return out


def _left_over(words: np.ndarray) -> dict[int, int]:
    """Per event, how many more times the program ``words`` signals it than it waits on it."""
    f = decode_fields(words)
    count: dict[int, int] = {}
    for name, sign in (("signal", 1), ("wait", -1)):
        events, n = np.unique(f[name][f[name] != NO_EVENT], return_counts=True)
        for e, c in zip(events.tolist(), n.tolist(), strict=True):
            count[e] = count.get(e, 0) + sign * c
    return {e: n for e, n in sorted(count.items()) if n}


def dram_extent(f: Mapping[str, np.ndarray], i: int) -> tuple[int, int]:
    """The DRAM beats ``[first, last + 1)`` DMA instruction ``i`` of fields ``f`` spans
    (its rows and the gaps between them)."""
    first = int(f["dma.dram_addr"][i])
    return first, first + (int(f["dma.rows"][i]) - 1) * int(f["dma.dram_stride"][i]) \
        + int(f["dma.row_beats"][i])


def _spad_extent(f: Mapping[str, np.ndarray], i: int) -> tuple[int, int, int]:
    """The scratchpad and its beats ``[first, last + 1)`` DMA instruction ``i`` of fields
    ``f`` writes or reads (its rows are contiguous there)."""
    first = int(f["dma.spad_addr"][i])
    return int(f["dma.spad"][i]), first, first + int(f["dma.rows"][i]) * int(f["dma.row_beats"][i])


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Whether half-open spans ``a`` and ``b`` share a position."""
    return a[0] < b[1] and b[0] < a[1]


def overlapping(spans: np.ndarray, span: tuple[int, int]) -> np.ndarray:
    """Per half-open span of ``spans`` (``int64 [n, 2]``): whether it shares a position with
    ``span`` (:func:`overlaps` over arrays)."""
    return (spans[:, 0] < span[1]) & (span[0] < spans[:, 1])


def hoistable(before: np.ndarray, words: np.ndarray, deep: bool = True) -> list[int]:
    """The words of a part (``words``, END dropped) that may run before the part ``before``
    it (END dropped) has drained, ahead of the SYNCs between the two (:func:`fuse_parts`):
    the LOADs without a wait of the part's leading run of LOAD-engine words without a wait
    (up to its first word on the LOAD engine that waits: a LOAD into a buffer half an earlier
    GEMM or VEC of the part may still read, so prefetching never runs deeper than the
    scratchpads' double buffering or the weights' ring) whose

    * DRAM source no STORE of ``before`` writes (the extents of the rows, gaps included),
    * scratchpad beats no LOAD of ``before`` writes (a part reads only what its own LOADs put
      in a scratchpad, so no instruction of ``before`` reads beats it does not load), and
    * scratchpad beats no LOAD of the part before it (which stays after the SYNCs) writes;

    and, after that run (with ``deep``: not in a step whose blocks roll into one loop,
    :func:`fuse_parts` without ``spread``, where every hoisted LOAD goes no further than its
    own boundary), every LOAD without a wait into WGT, ACT or VIN that meets
    the same, whose DRAM source no earlier STORE of the part writes and whose scratchpad
    beats no earlier LOAD or move of the part writes (so no earlier word of the part reads
    them, whatever it waits on): in a fused program, the LOADs an earlier :func:`fuse_parts`
    moved ahead of a later part's boundary (o_proj's weights inside the attention program).

    A LOAD that the runtime points elsewhere per step (a ROPE's table rows) reads the rotary
    table, a constant no part writes. Returns their indices in ``words``, in order.
    """
    f, prev = decode_fields(words), decode_fields(before)
    eng = engines_fields(f)
    busy = _loaded(prev)
    stores = [dram_extent(prev, i) for i in _stores(prev)]
    staying: list[tuple[int, int, int]] = []  # the beats the part's staying LOADs write
    earlier: list[tuple[int, int, int]] = []  # the beats its LOADs and moves wrote so far
    written: list[tuple[int, int]] = []  # the DRAM its STOREs wrote so far
    moves = is_move(f["opcode"], f["dma.spad"])
    past = False  # past the leading run
    out = []
    for i in range(eng.shape[0]):
        op = int(f["opcode"][i])
        if moves[i]:
            earlier.append((Spad.VIN.value, *dram_extent(f, i)))
        elif op == Opcode.STORE.value:
            written.append(dram_extent(f, i))
        if eng[i] != Engine.LOAD.value:
            continue
        if int(f["wait"][i]) != NO_EVENT:
            if not deep:
                break
            past = True
        if op != Opcode.LOAD.value:
            continue  # a SYNC without a wait stays, signalling after the LOADs before it
        spad, lo, hi = _spad_extent(f, i)
        src = dram_extent(f, i)
        if int(f["wait"][i]) != NO_EVENT or any(
                s == spad and overlaps((lo, hi), (a, b)) for s, a, b in busy + staying) or any(
                overlaps(src, s) for s in stores) or past and (
                spad not in (Spad.WGT.value, Spad.ACT.value, Spad.VIN.value)
                or any(s == spad and overlaps((lo, hi), (a, b)) for s, a, b in earlier)
                or any(overlaps(src, w) for w in written)):
            staying.append((spad, lo, hi))
        else:
            out.append(i)
        earlier.append((spad, lo, hi))
    return out


def _loaded(f: Mapping[str, np.ndarray], per_word: bool = False
            ) -> list[tuple[int, int, int]]:
    """The scratchpad extents (:func:`_spad_extent`) of the LOADs of fields ``f``, and the
    VIN beats its moves (:func:`hw.isa.is_move`) write (their rows and the gaps between);
    with ``per_word``, one entry per word of ``f`` instead, None for a word that writes no
    scratchpad."""
    moves = np.flatnonzero(is_move(f["opcode"], f["dma.spad"])).tolist()
    if per_word:
        out: list = [None] * f["opcode"].shape[0]
        for i in np.flatnonzero(f["opcode"] == Opcode.LOAD.value).tolist():
            out[i] = _spad_extent(f, i)
        for i in moves:
            out[i] = (Spad.VIN.value, *dram_extent(f, i))
        return out
    return [_spad_extent(f, i) for i in np.flatnonzero(f["opcode"] == Opcode.LOAD.value).tolist()
            ] + [(Spad.VIN.value, *dram_extent(f, i)) for i in moves]


def _loads(words: np.ndarray) -> tuple[tuple[int, int, int], ...]:
    """:func:`_loaded` of the program ``words``' fields, from a memo by their content (a
    fusion asks it of every part before the one it places, for each of that one's LOADs)."""
    a = np.ascontiguousarray(words, dtype=np.uint64)
    return _loads_of(a.tobytes(), a.shape)


@functools.lru_cache(maxsize=1024)
def _loads_of(data: bytes, shape: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    words = np.frombuffer(data, dtype=np.uint64).reshape(shape)
    return tuple(_loaded(decode_fields(words)))


def _vin_moved(cfg: AcceleratorConfig, before: np.ndarray, words: np.ndarray
               ) -> np.ndarray | None:
    """A vector part's ``words`` (END dropped) with its VIN moved above the VIN beats the part
    ``before`` it loads, where its own LOADs into VIN overlap those and the moved ones fit
    (else None): every LOAD into VIN ``top`` beats higher (``top``: the end of ``before``'s
    highest), and every VEC's operand rows (``a_addr``, ``b_addr``) and ``amax`` word
    (:func:`hw.isa.vec_reads_amax`: DEQUANT's ``imm``) as many elements higher, where every
    moved word still passes the dispatch checks (:func:`hw.isa.dispatch_errors`). The part
    reads only what its LOADs put in VIN, so it computes what it did; its VOUT stays, as its
    VECs start only after the boundary (:func:`fuse_parts`)."""
    vin = Spad.VIN.value
    mine = [(a, b) for s, a, b in _loads(words) if s == vin]
    theirs = [(a, b) for s, a, b in _loads(before) if s == vin]
    if not mine or not theirs or not any(overlaps(m, t) for m in mine for t in theirs):
        return None
    top, end = max(b for _, b in theirs), max(b for _, b in mine)
    if top + end > cfg.spad_beats("vin"):
        return None
    return _vin_shifted(cfg, words, top)


def _vin_shifted(cfg: AcceleratorConfig, words: np.ndarray, top: int) -> np.ndarray | None:
    """:func:`_vin_moved`'s words of a vector part with every LOAD into VIN, move, VEC operand
    row and ``amax`` word ``top`` beats higher, None where a moved word fails the dispatch
    checks."""
    per = cfg.beat_bytes // cfg.vin_word_bytes
    out = []
    for w in words:
        ins = _instr(w)
        if isinstance(ins, Load) and ins.spad == Spad.VIN:
            ins = replace(ins, spad_addr=ins.spad_addr + top)
        elif isinstance(ins, Store) and ins.spad in MOVE_SOURCES:  # a move's VIN rows
            ins = replace(ins, dram_addr=ins.dram_addr + top)
        elif isinstance(ins, Vec):
            ins = replace(ins, a_addr=ins.a_addr + top * per, b_addr=ins.b_addr + top * per,
                          imm=ins.imm + top * per * int(vec_reads_amax(ins.func.value)))
        out.append(ins)
    moved = program_words(out)
    # every range as the fetch unit checks it (an INSERT's codes: ``length`` words from
    # ``b_addr``), not just the LOADs' beats
    return None if dispatch_errors(decode_fields(moved), cfg).any() else moved


def _vin_gap(cfg: AcceleratorConfig, before: np.ndarray, words: np.ndarray
             ) -> np.ndarray | None:
    """A vector part's ``words`` (END dropped) moved, as :func:`_vin_moved` would, into the
    lowest VIN beats clear of every beat the part ``before`` it loads (a gap between them),
    where its LOADs into VIN overlap those, :func:`_vin_moved` finds no room above them, and
    one of those LOADs reads rows a STORE of VOUT of ``before`` writes (else None): with
    its VIN clear of the part before's, those rows may go by moves
    (:func:`sw.compile.onchip.vout_moves`), which write VIN while the part before runs."""
    vin = Spad.VIN.value
    f, g = decode_fields(words), decode_fields(before)
    theirs = [(a, b) for s, a, b in _loaded(g) if s == vin]
    stored = [dram_extent(g, j) for j in np.flatnonzero(
        (g["opcode"] == Opcode.STORE.value) & (g["dma.spad"] == Spad.VOUT.value)).tolist()]
    if not any(overlaps(dram_extent(f, i), d) for i in np.flatnonzero(
            (f["opcode"] == Opcode.LOAD.value) & (f["dma.spad"] == vin)).tolist()
            for d in stored):
        return None
    return _vin_gap_clear(cfg, theirs, words)


def _vin_gap_clear(cfg: AcceleratorConfig, theirs: Sequence[tuple[int, int]],
                   words: np.ndarray) -> np.ndarray | None:
    """A vector part's ``words`` (END dropped) moved (:func:`_vin_shifted`) into the lowest
    VIN beats clear of every span ``[first, last + 1)`` of ``theirs``, where its LOADs into
    VIN overlap one of them and such a gap exists (else None)."""
    mine = [(a, b) for s, a, b in _loads(words) if s == Spad.VIN.value]
    theirs = sorted(theirs)
    if not mine or not any(overlaps(m, t) for m in mine for t in theirs):
        return None
    lo, end = min(a for a, _ in mine), max(b for _, b in mine)
    beats = cfg.spad_beats("vin")
    for top in sorted({0, *(b for _, b in theirs)}):
        span = (top, top + end - lo)
        if span[1] <= beats and not any(overlaps(span, t) for t in theirs):
            return _vin_shifted(cfg, words, top - lo)
    return None


def _vin_writers(placed: Sequence[np.ndarray], words: np.ndarray) -> list[int]:
    """The parts ``placed`` (indices, latest first) holding a STORE of VOUT that last wrote
    (latest part first) one of the DRAM beats a vector part's ``words`` load into VIN."""
    f = decode_fields(words)
    need: set[int] = set()
    for i in np.flatnonzero((f["opcode"] == Opcode.LOAD.value)
                            & (f["dma.spad"] == Spad.VIN.value)).tolist():
        need.update(range(*dram_extent(f, i)))
    out = []
    for k in range(len(placed) - 1, -1, -1):
        if not need:
            break
        a = np.ascontiguousarray(placed[k], dtype=np.uint64)
        stored = _vout_stored(a.tobytes(), a.shape)
        if need & stored:
            out.append(k)
        need -= stored   # an earlier part's writes there are overwritten
    return out


@functools.lru_cache(maxsize=1024)
def _vout_stored(data: bytes, shape: tuple[int, ...]) -> frozenset[int]:
    """The DRAM beats the STOREs of VOUT of the words ``data`` (``uint64`` bytes of
    ``shape``) write, from a memo by their content (:func:`_vin_writers` asks it of every
    part before the one it places)."""
    g = decode_fields(np.frombuffer(data, dtype=np.uint64).reshape(shape))
    return frozenset(b for j in np.flatnonzero((g["opcode"] == Opcode.STORE.value)
                                               & (g["dma.spad"] == Spad.VOUT.value)).tolist()
                     for b in range(*dram_extent(g, j)))


def _vin_clear(cfg: AcceleratorConfig, placed: Sequence[np.ndarray], words: np.ndarray
               ) -> np.ndarray | None:
    """A vector part's ``words`` (END dropped) moved, as :func:`_vin_gap` would, into the
    lowest VIN beats clear of every beat loaded by the parts ``placed`` from the earliest
    whose STOREs of VOUT write rows it loads (:func:`_vin_writers`) to the last, where
    several parts, the last among them, write those rows (the SiLU-gate's column segments,
    each a part, read by the REQUANT before ``down_proj``) and its VIN overlaps theirs (else
    None): each segment's move (:func:`sw.compile.onchip.vout_moves`) then writes VIN beats
    no later segment loads or reads, which its proof needs (a gap clear of the last part
    alone leaves the moved rows under the later segments' LOADs). Where those parts leave
    no such gap, the lowest clear only of the beats their words load or read from the first
    STORE of those rows on (:func:`_vin_used_from`): SmolLM2's gate DEQUANT segments, in
    the part of the first SiLU-gate segments (beside the gate and up GEMMs), read the
    gate's channel words, 384 of VIN's 1,024 beats, before any SiLU-gate segment writes a
    row, and leave no gap for the REQUANT's 384 beats clear of them too."""
    writers = _vin_writers(placed, words)
    if len(writers) < 2 or writers[0] != len(placed) - 1:
        return None
    before = np.concatenate(placed[writers[-1]:])
    out = _vin_gap(cfg, before, words)
    return out if out is not None else _vin_gap_clear(cfg, _vin_used_from(cfg, before, words),
                                                      words)


def _vin_used_from(cfg: AcceleratorConfig, before: np.ndarray, words: np.ndarray
                   ) -> list[tuple[int, int]]:
    """The VIN beats ``[first, last + 1)`` the words ``before`` (END dropped) load (LOADs and
    moves, :func:`_loaded`) or a VEC of them reads (:func:`sw.compile.onchip._vin_reads`),
    from their first STORE of VOUT of a DRAM beat a LOAD into VIN of ``words`` reads on (all
    of them where there is none). A move of rows that STORE or a later one writes
    (:func:`sw.compile.onchip.vout_moves`) starts after it, so only these beats can
    overwrite its VIN beats or read them before the LOAD it replaces; whether any does is
    :func:`sw.compile.onchip.vout_round_trips`' to prove, from the whole program."""
    from sw.compile.onchip import _vin_reads  # onchip imports this module

    f, g = decode_fields(words), decode_fields(before)
    vin = Spad.VIN.value
    need = [dram_extent(f, i) for i in np.flatnonzero(
        (f["opcode"] == Opcode.LOAD.value) & (f["dma.spad"] == vin)).tolist()]
    stores = [j for j in np.flatnonzero((g["opcode"] == Opcode.STORE.value)
                                        & (g["dma.spad"] == Spad.VOUT.value)).tolist()
              if any(overlaps(dram_extent(g, j), d) for d in need)]
    first = stores[0] if stores else 0
    used = [(a, b) for w in _loaded(g, per_word=True)[first:]
            if w is not None and w[0] == vin for _, a, b in (w,)]
    vecs = np.flatnonzero(g["opcode"][first:] == Opcode.VEC.value) + first
    return used + [r for j in vecs.tolist() for r in _vin_reads(cfg, _instr(before[j]))]


def settled(words: np.ndarray) -> dict[int, int]:
    """Per engine (:class:`hw.isa.Engine` value), the last word of the program ``words``
    (``uint64 [n, 2]``, counters from 0, no REPEAT) proven complete once its LOAD engine has
    been granted every one of its words (-1: none), from the words alone: the ``k``-th wait
    on an event is granted by its ``k``-th signal (:func:`sw.compile.onchip._matches`), so a
    granted word's signaller is complete; each engine grants and completes its words in
    program order, so a word complete (or granted) means every word before it on its engine
    is too. The closure of both, from the LOAD engine's last word."""
    from sw.compile.onchip import _matches  # onchip imports this module

    f = decode_fields(words)
    return _settled(engines_fields(f), _matches(f))


def _settled(eng: np.ndarray, match: np.ndarray) -> dict[int, int]:
    """:func:`settled` of the words whose engines are ``eng`` and whose waits' signallers
    are ``match`` (:func:`sw.compile.onchip._matches`'s). The ``k``-th signal of an event
    in a program's first ``p`` words is its ``k``-th in the program where it comes before
    ``p``, so a prefix's are the program's, those at ``p`` or later -1: each prefix of one
    program from one ``match`` (:func:`loads_ahead`)."""
    granted = {e.value: -1 for e in Engine}
    done = dict(granted)
    loads = np.flatnonzero(eng == Engine.LOAD.value)
    granted[Engine.LOAD.value] = int(loads[-1]) if loads.size else -1
    seen = dict(granted)
    seen[Engine.LOAD.value] = -1
    while seen != granted:
        for e in granted:  # the words granted since the last pass: their signallers are done
            lo, hi = seen[e], granted[e]
            seen[e] = hi
            s = match[lo + 1 + np.flatnonzero(eng[lo + 1:hi + 1] == e)]
            s = s[s >= 0]
            signaller = eng[s]
            for d in np.unique(signaller).tolist():
                done[d] = max(done[d], int(s[signaller == d].max()))
        for e in granted:
            granted[e] = max(granted[e], done[e])
    return done


class Timeline(NamedTuple):
    """A program's estimated schedule (:func:`timeline`): per word its engine (-1: END),
    grant, duration and completion cycle (-1: never granted), and the program's cycles."""

    engines: list[int]
    grants: list[int]
    cycles: list[int]
    dones: list[int]
    total: int


def timeline(cfg: AcceleratorConfig, words: np.ndarray) -> Timeline:
    """The schedule of the program ``words`` (``uint64 [n, 2]``, END last, no REPEAT)
    estimated from the words alone by the timing contract's rules (:mod:`hw.timing`,
    "Engines"): fetch dispatches a word a cycle from :data:`hw.timing.FETCH_LATENCY` on, in
    order, once its engine's queue (``cfg.queue_depth``) has room, and stops at END; each
    engine pops its words in order, grants a word the cycle after its pop or after the
    completion of the signal its wait consumes (the ``k``-th signal of the event for its
    ``k``-th wait, :func:`sw.compile.onchip._matches`; at once where none does: a count
    seeded otherwise), executes it for its duration (:func:`hw.engines.exec_cycles_fields`)
    and completes it :func:`hw.engines.completion_delay` cycles later; the program ends the
    cycle after END's dispatch and every completion. LOAD and STORE never wait on each
    other (the DRAM port's read and write channels are separate, :mod:`hw.dma`); the VIN
    port is left out (a program whose move and LOAD write it in one cycle is wrong, not
    slow: :mod:`sim.model` rejects it), and so are errors: on a program that runs, the
    fast model's schedule. A word whose wait never resolves (a deadlock) and every word
    after it on its engine are never granted."""
    from sw.compile.onchip import _matches  # onchip imports this module

    f = decode_fields(words)
    eng = engines_fields(f).tolist()
    cycles = exec_cycles_fields(f, cfg).tolist()
    match = _matches(f).tolist()
    engines = sorted({e for e in eng if e >= 0})
    late = {e: completion_delay(Engine(e), cfg) for e in engines}
    n = len(eng)
    disp, pops, grants, dones = ([-1] * n for _ in range(4))
    queues: dict[int, list[int]] = {e: [] for e in engines}
    pos = dict.fromkeys(engines, 0)
    free = dict.fromkeys(engines, 0)
    fetch, last = 0, timing.FETCH_LATENCY - 1
    progress = True
    while progress:
        progress = False
        while fetch < n and eng[fetch] >= 0:  # END (or an undefined word) stops fetch
            q = queues[eng[fetch]]
            d = last + 1
            if len(q) >= cfg.queue_depth:
                older = pops[q[-cfg.queue_depth]]
                if older < 0:
                    break  # its queue is full until that pop is known
                d = max(d, older + 1)
            disp[fetch] = last = d
            q.append(fetch)
            fetch += 1
            progress = True
        for e, q in queues.items():
            while pos[e] < len(q):
                i = q[pos[e]]
                pops[i] = p = max(disp[i] + 1, free[e])
                s = match[i]
                if s >= 0 and dones[s] < 0:
                    break  # the signal it consumes is not known yet
                grants[i] = g = max(p + 1, dones[s] + 1 if s >= 0 else 0)
                free[e] = g + cycles[i] + 1
                dones[i] = free[e] - 1 + late[e]
                pos[e] += 1
                progress = True
    return Timeline(eng, grants, cycles, dones, max([last + 2, *(d + 1 for d in dones)]))


def load_idle(cfg: AcceleratorConfig, words: np.ndarray) -> dict[int, int]:
    """Per LOAD-engine word of the program ``words`` (END last, no REPEAT) up to the first
    never granted, the cycles the LOAD engine idles before its grant: since the end of the
    LOAD-engine word before it, by :func:`timeline`'s estimate."""
    t = timeline(cfg, words)
    idle, ready = {}, 0
    for i in (i for i, e in enumerate(t.engines) if e == Engine.LOAD.value):
        if t.grants[i] < 0:
            break
        idle[i] = max(0, t.grants[i] - ready)
        ready = t.grants[i] + t.cycles[i] + 1
    return idle


def loads_ahead(cfg: AcceleratorConfig, words: np.ndarray, movable: Sequence[int],
                idle: Mapping[int, int], fill: float | None = None,
                period: tuple[int, int, int] | None = None
                ) -> tuple[np.ndarray, list[int]] | None:
    """``words`` (a program, END last, no REPEAT) with each LOAD ``movable`` (into WGT,
    without a wait, from DRAM no STORE of the program writes: a weights tile, a KV cache
    tile the step does not append to) moved up before the first SYNC of the LOAD engine
    that waits, in order, where the LOAD engine idles (``idle``: its cycles idle before
    each of its words, :func:`load_idle`'s; less what the LOADs moved there before stream)
    for at least ``1 / fill`` of its beats (default :data:`HOIST_FILL`), no
    word between there and its place reads or writes its WGT beats (a GEMM, a LOAD) and
    every GEMM before that reads them is complete once the LOAD engine is there
    (:func:`settled`). Its signal stays at its place, on a SYNC of the LOAD engine that
    completes after it (the engine is in order), so every event is signalled in the same
    order and its consumer starts no earlier than before; only the beats stream earlier.

    With ``period`` (``(start, length, blocks)``: ``words`` repeats ``blocks`` runs of
    ``length`` words from ``start`` alike but for DMA addresses, a step whose blocks roll
    into one loop, ``sw.compile.blockloop.block_period``) the moves keep the runs alike:
    they are chosen in the middle run (``blocks // 2``, past the first's start-up), each to
    a SYNC of its own run, by that run's idle, and each goes in every run at the same
    offsets where it may there (movable and the conditions above), else in none.

    Returns the words and where each word of ``words`` lands (a moved LOAD: its new
    place), or None where none moves."""
    from sw.compile.onchip import _matches  # onchip imports this module

    f = decode_fields(words)
    eng = engines_fields(f)
    ops = f["opcode"]
    wgt = Spad.WGT.value
    touch = np.zeros((eng.shape[0], 2), np.int64)  # WGT beats written or read ([0, 0): none)
    for i in np.flatnonzero((ops == Opcode.LOAD.value) & (f["dma.spad"] == wgt)).tolist():
        touch[i] = _spad_extent(f, i)[1:]
    for i in np.flatnonzero(ops == Opcode.GEMM.value).tolist():
        g = _instr(words[i])
        touch[i] = (g.wgt_addr, g.wgt_addr + -(-gemm_weight_bytes(g, cfg) // cfg.beat_bytes))
    syncs = np.flatnonzero((eng == Engine.LOAD.value) & (ops == Opcode.SYNC.value)
                           & (f["wait"] != NO_EVENT)).tolist()
    waits = set(syncs)
    match = _matches(f)
    done: dict[int, int] = {}  # per place: the last COMPUTE word complete once it is reached
    limits: dict[int, tuple[int, int]] = {}  # per LOAD: the last word, GEMM on its beats

    def may(j: int, p: int) -> bool:
        """Whether LOAD ``j`` may go before SYNC ``p`` (all but the room)."""
        if j not in limits:
            before = np.flatnonzero((touch[:j, 0] < touch[j, 1]) & (touch[j, 0] < touch[:j, 1]))
            gemms = before[ops[before] == Opcode.GEMM.value]
            limits[j] = (int(before[-1]) if before.size else -1,
                         int(gemms[-1]) if gemms.size else -1)
        last, gemm = limits[j]
        if not (last < p < j and p in waits):
            return False
        if gemm >= 0 and p not in done:
            done[p] = _settled(eng[:p], np.where(match[:p] < p, match[:p], -1)
                               )[Engine.COMPUTE.value]
        return gemm < 0 or done[p] >= gemm

    runs = [0]
    lo, hi = 0, eng.shape[0]
    if period is not None:
        start, length, blocks = period
        mid = blocks // 2
        lo, hi = start + mid * length, start + (mid + 1) * length
        runs = [(b - mid) * length for b in range(blocks)]
    room = dict(idle)
    moves = set(movable)
    goes: dict[int, list[int]] = {}
    for j in (j for j in movable if lo <= j < hi):
        beats = int(f["dma.rows"][j]) * int(f["dma.row_beats"][j])
        p = next((p for p in syncs[bisect_left(syncs, lo):bisect_left(syncs, j)]
                  if (fill or HOIST_FILL) * room.get(p, 0) >= beats and may(j, p)), None)
        if p is None or not all(j + d in moves and may(j + d, p + d) for d in runs if d):
            continue
        room[p] -= beats
        for d in runs:
            goes.setdefault(p + d, []).append(j + d)
    if not goes:
        return None
    moved = {j for js in goes.values() for j in js}
    out: list[np.ndarray] = []
    where = [0] * eng.shape[0]
    for i in range(eng.shape[0]):
        for j in goes.get(i, []):
            where[j] = len(out)
            out.append(program_words([replace(_instr(words[j]), signal=None)]))
        if i in moved:
            out.append(program_words([Sync(engine=Engine.LOAD, signal=None if int(
                f["signal"][i]) == NO_EVENT else int(f["signal"][i]))]))
        else:
            where[i] = len(out)
            out.append(words[i:i + 1])
    return np.concatenate(out).astype(np.uint64), where


def _vec_vin_beats(f: Mapping[str, np.ndarray], i: int, per: int) -> list[tuple[int, int]]:
    """The VIN beats VEC ``i`` of fields ``f`` may read (``per`` elements a beat): ``length``
    elements from ``a_addr`` and, where it reads a second operand (or a ROPE its table, half
    a head), from ``b_addr`` (:func:`hw.isa.vec_reads_b`), and a DEQUANT's ``amax`` word
    (:func:`hw.isa.vec_reads_amax`) -- a superset of what it reads, as the dispatch checks
    bound it."""
    func, n = int(f["vec.func"][i]), int(f["vec.length"][i])
    out = [(int(f["vec.a_addr"][i]), int(f["vec.a_addr"][i]) + n)]
    if vec_reads_b(func) or func == VecFunc.ROPE.value:
        out.append((int(f["vec.b_addr"][i]), int(f["vec.b_addr"][i]) + n))
    if vec_reads_amax(func):
        a = dequant_amax_addr(int(f["vec.imm"][i]))
        out.append((a, a + 1))
    return [(a // per, -(-b // per)) for a, b in out]


def drained_loads(cfg: AcceleratorConfig, before: np.ndarray, words: np.ndarray,
                  hoisted: Sequence[int]) -> list[int]:
    """The LOADs into VIN of a part's ``words`` (END dropped) that :func:`hoistable` keeps
    (not in ``hoisted``) but that may go right before the SYNCs draining the part ``before``
    (END dropped) -- after its every word, its boundary -- where its VIN and DRAM are
    settled there: the LOADs without a wait of the part's leading run of LOAD-engine words
    without a wait, whose VIN beats no VEC of ``before`` not proven complete (:func:`settled`)
    may read (:func:`_vec_vin_beats`) and whose DRAM source no STORE of ``before`` not
    proven complete writes, where every move of ``before`` is proven complete (VIN has one
    DMA write port) and no LOAD of the part ahead of it that stays writes its beats. Every
    LOAD of ``before`` lands first (the LOAD engine is in order), so the VIN rows the part
    before loaded and has finished reading -- a query's rows after the KV append that read
    other rows -- take the part's LOAD while ``before`` drains. Returns their indices, in
    order; such a LOAD goes to that boundary alone (:func:`_fuse`), not further up."""
    prev, f = decode_fields(before), decode_fields(words)
    done = settled(before)
    pending = np.arange(prev["opcode"].shape[0]) > done[Engine.STORE.value]
    if (pending & is_move(prev["opcode"], prev["dma.spad"])).any():
        return []
    stores = [dram_extent(prev, i) for i in _stores(prev) if pending[i]]
    peng = engines_fields(prev)
    per = cfg.beat_bytes // cfg.vin_word_bytes
    reads = [r for i in np.flatnonzero(peng == Engine.VECTOR.value).tolist()
             if i > done[Engine.VECTOR.value] for r in _vec_vin_beats(prev, i, per)]
    eng = engines_fields(f)
    skip = set(hoisted)
    staying: list[tuple[int, int, int]] = []
    out = []
    for i in np.flatnonzero(eng == Engine.LOAD.value).tolist():
        if int(f["wait"][i]) != NO_EVENT:
            break
        if int(f["opcode"][i]) != Opcode.LOAD.value or i in skip:
            continue  # a SYNC without a wait, or a LOAD that goes ahead anyway
        spad, lo, hi = _spad_extent(f, i)
        if spad == Spad.VIN.value and not any(overlaps((lo, hi), r) for r in reads) \
                and not any(overlaps(dram_extent(f, i), s) for s in stores) \
                and not any(s == spad and overlaps((lo, hi), (a, b)) for s, a, b in staying):
            out.append(i)
        else:
            staying.append((spad, lo, hi))
    return out


def _wgt_moved(cfg: AcceleratorConfig, placed: Sequence[np.ndarray], words: np.ndarray
               ) -> np.ndarray | None:
    """A part's ``words`` (END dropped) with its WGT packed and moved clear of the WGT beats
    the latest parts ``placed`` before it load -- above them, or at 0 where it fits below
    them, past as many of them as leave room (else at 0) --, or None where that changes
    nothing or a GEMM reads WGT beats no LOAD of the part writes.
    The beats its LOADs write (runs of touching or overlapping extents, in order) go one
    after the other from there, each LOAD's ``spad_addr`` and each GEMM's ``wgt_addr`` moved
    with the run it lies in: a ring's slots, spread over the whole scratchpad by the
    scheduler, then take only the beats its chunks fill. The part reads only what its LOADs
    put in WGT, each GEMM within one run, so it computes what it did; its weight LOADs may
    then go up past those parts (:func:`_boundary`: the next GEMM's weights stream while the
    vector parts before it run). A run keeps its place within a WGT word (a GEMM's
    ``wgt_addr`` is a word's: records of sparse fields are fewer beats than a word)."""
    wgt = Spad.WGT.value
    runs: list[list[int]] = []
    for a, b in sorted((a, b) for s, a, b in _loads(words) if s == wgt):
        if runs and a <= runs[-1][1]:
            runs[-1][1] = max(runs[-1][1], b)
        else:
            runs.append([a, b])
    if not runs:
        return None
    word = word_beats(cfg.wgt_word_bytes, cfg)

    def place(base: int) -> tuple[list[int], int]:
        """Each run's new start from ``base`` on, and the end of the last."""
        starts, at = [], base
        for a, b in runs:
            at += (a - at) % word
            starts.append(at)
            at += b - a
        return starts, at
    cap = cfg.spad_beats("wgt")
    lo, hi, base = cap, 0, 0
    for part in reversed(placed):
        for s, a, b in _loads(part):
            if s == wgt:
                lo, hi = min(lo, a), max(hi, b)
        if place(hi)[1] <= cap:
            base = hi
        elif place(0)[1] <= lo:
            base = 0
        else:
            break
    starts, _ = place(base)

    def moved(addr: int) -> int | None:
        return next((n + addr - a for (a, b), n in zip(runs, starts, strict=True)
                     if a <= addr < b), None)

    out = []
    for w in words:
        ins = _instr(w)
        if isinstance(ins, Load) and ins.spad == Spad.WGT:
            ins = replace(ins, spad_addr=moved(ins.spad_addr))
        elif isinstance(ins, Gemm):
            if (addr := moved(ins.wgt_addr)) is None:
                return None
            ins = replace(ins, wgt_addr=addr)
        out.append(ins)
    shifted = program_words(out)
    return None if np.array_equal(shifted, words) else shifted


def _reach(placed: Sequence[np.ndarray], body: np.ndarray, hoisted: Sequence[int],
           stored: Sequence[tuple[int, int]]) -> int:
    """How many boundaries, summed over the ``hoisted`` LOADs of ``body`` (the part after
    ``placed``), each may go up past its own (:func:`_boundary`)."""
    parts = [*placed, body]
    return sum(len(placed) - _boundary(parts, body, i, stored) for i in hoisted)


def _instr(word: np.ndarray) -> Instr:
    """The instruction of one ``uint64 [2]`` word."""
    return decode(int(word[0]) | int(word[1]) << 64)


def _join(syncs: list[Instr], words: np.ndarray, hoisted: Sequence[int]
          ) -> tuple[list[np.ndarray], list[int]]:
    """A part's ``words`` after the boundary ``syncs``, its ``hoisted`` words before them:
    the hoisted LOADs without their signals, each signal raised instead at the hoisted
    word's place on the LOAD engine (on the LOAD-engine word before it there if that one
    signals nothing, else on a SYNC of its own right after that word, ahead of the other
    engines' words up to the hoisted word's place, so it is dispatched as early as the LOAD
    engine could raise it), so every event is signalled in the same order as the part alone
    signals it, and never before the boundary. Returns the words (the hoisted, the
    boundary and the part's) as ``uint64 [n, 2]`` blocks, and where each word of the part
    lands, counted from the first hoisted word."""
    f = decode_fields(words)
    eng = engines_fields(f)
    moved = set(hoisted)
    head = [replace(_instr(words[i]), signal=None) for i in hoisted]
    tail: list[Instr | np.ndarray] = list(syncs)
    owner: list[int | None] = [None] * len(tail)  # per tail entry: its word of the part
    last = len(tail) - 1 if syncs else None   # the last LOAD-engine word after the boundary
    for i in range(words.shape[0]):
        if i not in moved:
            if eng[i] == Engine.LOAD.value:
                last = len(tail)
            tail.append(words[i:i + 1])
            owner.append(i)
            continue
        signal = int(f["signal"][i])
        if signal == NO_EVENT:
            continue
        target = None if last is None else tail[last]
        word = target if isinstance(target, Instr) else \
            None if target is None else _instr(target[0])
        if word is not None and word.signal is None:
            tail[last] = replace(word, signal=signal)
        else:
            last = 0 if last is None else last + 1
            tail.insert(last, Sync(engine=Engine.LOAD, signal=signal))
            owner.insert(last, None)
    place = [0] * words.shape[0]
    for k, i in enumerate(hoisted):
        place[i] = k
    for k, i in enumerate(owner):
        if i is not None:
            place[i] = len(head) + k
    blocks = [program_words(head)] if head else []
    blocks += [t if isinstance(t, np.ndarray) else program_words([t]) for t in tail]
    return blocks, place


def _events_of(f: Mapping[str, np.ndarray]) -> set[int]:
    """The events the words of fields ``f`` wait on or signal."""
    return {int(e) for name in ("wait", "signal") for e in f[name] if int(e) != NO_EVENT}


def _stores(f: Mapping[str, np.ndarray]) -> list[int]:
    """The indices of the STOREs of fields ``f`` that write DRAM (not moves), in order."""
    return np.flatnonzero((f["opcode"] == Opcode.STORE.value)
                          & ~is_move(f["opcode"], f["dma.spad"])).tolist()


#: The sub-ops of a vector part that runs beside a GEMM part reading the rows the last
#: vector part of the run wrote (:func:`_may_run_beside`): attention's SOFTMAX and FOLD a
#: head at a time, the MLP's SILU_GATE a column segment at a time (:func:`silu_segments`).
_AFTER_RUN = (VecFunc.SOFTMAX, VecFunc.FOLD, VecFunc.SILU_GATE)
#: The sub-ops whose parts pace a run beside a GEMM part (:func:`beside`): they read no
#: STORE of the GEMM part, so only the instructions' durations place their LOADs.
_PACED = (VecFunc.SOFTMAX, VecFunc.SILU_GATE)


def _may_run_beside(cfg: AcceleratorConfig, gemm: np.ndarray, vec: np.ndarray,
                    run: Sequence[np.ndarray] = ()) -> bool:
    """Whether the vector part ``vec`` (END dropped) may run beside the GEMM part ``gemm``
    before it (END dropped; :func:`beside`) after the vector parts ``run`` that do: ``gemm``
    runs GEMMs and no VEC, ``vec`` VECs and no GEMM, the two load no scratchpad in common,
    ``vec`` uses the vector parts' events and the scheduler's STORED ones only
    (:data:`VECTOR_EVENTS`), ``gemm`` none of :data:`BESIDE_EVENTS`, every event ``gemm``
    signals with a STORE is signalled by its STOREs alone, no STORE of ``vec`` writes DRAM
    that ``gemm`` moves, and ``vec`` is a DEQUANT, or an ADD of its rows' halves (a values
    fold, :func:`values_parts`), that reads no STORE of ``gemm`` (an earlier GEMM part's
    accumulators, drained at the boundary before ``gemm``: the next head's scores beside a
    head's values GEMM, :func:`_values_woven`; or the rows the fold before it in the run
    wrote, drained behind it), or some LOAD of ``vec`` reads what a
    STORE of ``gemm`` writes (its accumulators: a DEQUANT) or, for a SOFTMAX, FOLD or
    SILU_GATE, of the last part of
    ``run`` (the rows a DEQUANT of the scores wrote, the probabilities a SOFTMAX wrote:
    attention's softmax and values prologue, a head at a time, beside the next heads' GEMMs;
    the up projection's DEQUANT segment a SILU_GATE segment reads, beside the next
    segment's GEMM tiles: :func:`silu_segments`)."""
    if cfg.num_events <= max(BESIDE_EVENTS.values()):
        return False
    g, v = decode_fields(gemm), decode_fields(vec)
    ops_g, ops_v = set(g["opcode"].tolist()), set(v["opcode"].tolist())
    if (Opcode.GEMM.value not in ops_g or Opcode.VEC.value in ops_g
            or Opcode.VEC.value not in ops_v or Opcode.GEMM.value in ops_v):
        return False
    if {s for s, _, _ in _loaded(g)} & {s for s, _, _ in _loaded(v)}:
        return False
    stored = {EVENTS["STORED0"], EVENTS["STORED1"]}
    if not _events_of(v) <= set(VECTOR_EVENTS.values()) | stored \
            or _events_of(g) & set(BESIDE_EVENTS.values()):
        return False
    by_store = {int(g["signal"][i]) for i in _stores(g)} - {NO_EVENT}
    if any(int(g["signal"][i]) in by_store for i in np.flatnonzero(
            g["opcode"] != Opcode.STORE.value).tolist()):
        return False
    moved = [dram_extent(g, i) for i in np.flatnonzero(
        (g["opcode"] == Opcode.LOAD.value) | (g["opcode"] == Opcode.STORE.value)).tolist()]
    if any(overlaps(dram_extent(v, i), m) for i in _stores(v) for m in moved):
        return False
    stores = _stores(g)
    written = [dram_extent(g, i) for i in stores]
    vecs = v["opcode"] == Opcode.VEC.value
    funcs = v["vec.func"][vecs]
    halves = (funcs == VecFunc.ADD.value) & (v["vec.a_addr"][vecs] == v["vec.b_addr"][vecs]
                                             + v["vec.length"][vecs])  # as folds name them
    if funcs.size and ((funcs == VecFunc.DEQUANT.value) | halves).all() and not any(
            overlaps(dram_extent(v, i), w) for i in np.flatnonzero(
                v["opcode"] == Opcode.LOAD.value).tolist() for w in written):
        return True  # an earlier GEMM part's accumulators (drained): the next head's scores
    if run and funcs.size and np.isin(funcs, [f.value for f in _AFTER_RUN]).all():
        if (funcs == VecFunc.SILU_GATE.value).any() and stores and any(
                overlaps(dram_extent(r, i), dram_extent(g, stores[-1])) for r in map(
                    decode_fields, run) for i in np.flatnonzero(r["opcode"] == Opcode.LOAD.value)):
            return False  # the run has read the last tile: no GEMM left to run beside
        f = decode_fields(run[-1])
        written += [dram_extent(f, i) for i in _stores(f)]
    return any(overlaps(dram_extent(v, i), w) for i in np.flatnonzero(
        v["opcode"] == Opcode.LOAD.value).tolist() for w in written)


def _loads_follow_stores(g: Mapping[str, np.ndarray], eng: np.ndarray, stores: Sequence[int]
                         ) -> bool:
    """Whether every LOAD-engine word of the GEMM part ``g`` (decoded fields, ``eng`` their
    engines, ``stores`` its STOREs' indices) that waits on an event its STOREs signal comes
    right after the STORE whose signal it consumes (the ``k``-th wait on an event, its
    ``k``-th signal): a ring no deeper than the LOAD queue (:mod:`sw.compile.schedule`)."""
    by_event: dict[int, list[int]] = {}
    for i in stores:
        if int(g["signal"][i]) != NO_EVENT:
            by_event.setdefault(int(g["signal"][i]), []).append(i)
    taken: dict[int, int] = {}
    for i in np.flatnonzero(eng == Engine.LOAD.value).tolist():
        e = int(g["wait"][i])
        if e in by_event:
            k = taken.get(e, 0)
            taken[e] = k + 1
            if k >= len(by_event[e]) or by_event[e][k] != i - 1:
                return False
    return True


def _tail_from(g: Mapping[str, np.ndarray], eng: np.ndarray) -> int:
    """The last GEMM or LOAD-engine word of the GEMM part ``g`` (decoded fields, ``eng``
    their engines; -1: none): after it only its tiles' STOREs are left, which wait on
    GEMMs already fetched (:func:`beside`'s tail)."""
    return max(np.flatnonzero((eng == Engine.LOAD.value)
                              | (g["opcode"] == Opcode.GEMM.value)).tolist(), default=-1)


def _tail_room(cfg: AcceleratorConfig, placed: int, left: int) -> bool:
    """Whether one more STORE-engine word of a vector part may come in :func:`beside`'s
    tail ahead of the GEMM part's ``left`` STORE-engine words still to come, after
    ``placed`` of the vector part's there: together they leave half the STORE queue
    (``cfg.queue_depth``) free, so the fetch unit does not stop on the in-order STORE
    engine's queue before the next part's LOADs."""
    return placed + left + 1 <= cfg.queue_depth // 2


def beside(cfg: AcceleratorConfig, gemm: np.ndarray, vec: np.ndarray
           ) -> tuple[np.ndarray, list[int], list[int]]:
    """The GEMM part ``gemm`` and the vector part ``vec`` after it (both END dropped, checked
    by :func:`_may_run_beside`) as one part, the vector engine working on the GEMMs'
    results while the array computes the next ones (a DEQUANT, cut into tiles, beside its
    GEMMs; a SOFTMAX or a SILU_GATE segment of the rows a DEQUANT before it wrote).
    ``vec``'s STORED events are
    renamed by :data:`BESIDE_EVENTS`; each engine keeps each part's order. A LOAD of ``vec``
    comes after the LOAD-engine word of ``gemm`` that consumes the signal of the last STORE
    of ``gemm`` writing DRAM it reads (the STORE engine completes in order, so every STORE
    before it has written too); after ``gemm``'s last word, a SYNC on the LOAD engine
    consumes the next STORE's signal wherever ``vec`` waits for it (a signal the drain after
    the part would consume otherwise). A LOAD-engine word of ``vec`` that waits (on a
    STORE of ``vec``: a buffer half or a part of the run drained) comes only once the LOAD
    engine, by the instructions' durations (:func:`hw.engines.exec_cycles_fields`: the
    LOADs' beats, the VECs' cycles), has streamed for as long as the vector engine takes
    to the STORE it waits on, so the in-order LOAD engine does not stop the GEMMs' weights
    while the vector engine works (a SOFTMAX of one head's scores while the next head's
    keys stream; likewise where ``vec`` holds a SILU_GATE, :data:`_PACED`); one that does
    not wait comes as soon as the words before it. Past ``gemm``'s last GEMM and LOAD-engine
    word (:func:`_tail_from`: only its last tiles' STOREs are left, each waiting on a GEMM
    already fetched) a word of ``vec`` comes as soon as the events let it: the durations'
    clock stands still there (no word of ``gemm`` left adds to it), so it held every word of
    ``vec`` behind ``gemm``'s last STORE, and a SILU_GATE segment that reads the segment
    before, not the last tiles, waited for the last GEMM on the in-order STORE engine (an
    attention head's SOFTMAX and FOLD likewise for the values GEMM's last weights, 1,024
    beats a head on LLaMA-7B's shapes with INT8 keys and values). A run without a SILU_GATE
    (attention's, SOFTMAX and FOLD) does so only where ``gemm``'s last LOAD-engine word
    takes at least as long as the VECs of ``vec`` not placed before the tail (else its STOREs,
    ahead of the last tiles' on the in-order STORE engine, wait on VECs that end after the
    last GEMM: the reference model's deploy step took 188 cycles longer so, 97,578 against
    97,390), and there a STORE-engine word of ``vec`` comes only while it, those of ``vec``
    before it there and those of ``gemm`` still to come leave half the STORE queue free
    (:func:`_tail_room`): a full STORE queue stops the fetch unit, so the next part's
    weights LOAD is not dispatched (unbounded, the reference model's four FOLD STOREs of two
    heads filled its four-deep queue ahead of the last tile's STORE and the next values LOAD
    waited 235 cycles for dispatch; LLaMA-7B's two-layer DDR4-class step, INT8 KV: 1,101,755
    cycles by the clock, 1,094,577 unbounded, 1,092,641 bounded; docs/architecture.md).
    Placed before the last GEMM instead, a STORE of ``vec`` came before a tile's STORE and
    split a round trip from the LOAD that reads it back (:mod:`sw.compile.onchip` moves it
    only where no STORE-engine word comes between), and LOAD-engine words of ``vec`` that
    wait would fill the LOAD queue ahead of the GEMMs' dispatch. The leading LOAD-engine words of a
    ``vec`` that reads no STORE of ``gemm`` (up to the first that waits) come right away,
    so its vector engine work overlaps the GEMMs from their start. A word of
    another engine comes as soon as every signal it waits on has come before it in the
    program (paced: a STORE once, by the durations, what it waits on is done; a VEC as
    soon as the vector engine's queue has room, right after the LOAD that grants it, so a
    drained vector part of the run costs the LOAD stream a GEMM-part word or two, not one
    per word: SILU_GATE segments keep up with the up GEMM's tiles). A DEQUANT of ``gemm``'s
    results (not paced) beside a ring whose LOADs each follow the STORE they wait on
    (:func:`_loads_follow_stores`) comes only right before a LOAD-engine word of ``gemm``
    (or after its last word), behind the GEMM and STORE words before it: the in-order STORE
    engine then runs the tile's STORE, whose signal frees the ring slot the next weights
    LOAD waits for, before the DEQUANT's STORE, which waits for the LOADs after the weights
    LOAD before it, and the GEMM is dispatched before those LOADs fill the LOAD queue (a
    deeper ring's LOADs wait on earlier STOREs: a segment's LOADs would then follow the next
    segment's STOREs, and :func:`sw.compile.onchip.out_round_trips` could not prove that
    segment's moves from OUT). So every wait on an event of ``vec`` follows its signal in
    program order, no word of ``vec`` comes while a LOAD-engine word of ``gemm`` before it
    waits on a STORE after it (``gemm``'s loads run ahead of its stores), so no engine
    waits on one that waits on it, and every event is signalled and consumed as in the two
    parts alone. The durations only place the
    words: the events order them.

    Returns the words and, per word of ``gemm`` and of ``vec``, its index in them.
    """
    vec = rename_events(vec, BESIDE_EVENTS)
    g, v = decode_fields(gemm), decode_fields(vec)
    g_eng, v_eng = engines_fields(g), engines_fields(v)
    g_cycles, v_cycles = exec_cycles_fields(g, cfg), exec_cycles_fields(v, cfg)
    load, vector, store = Engine.LOAD.value, Engine.VECTOR.value, Engine.STORE.value
    delay = completion_delay(Engine.LOAD, cfg)
    stores = _stores(g)
    written = [dram_extent(g, i) for i in stores]
    by_event: dict[int, list[int]] = {}  # event -> its STOREs (their order among the STOREs)
    for k, i in enumerate(stores):
        if int(g["signal"][i]) != NO_EVENT:
            by_event.setdefault(int(g["signal"][i]), []).append(k)
    # per LOAD of vec: the last STORE of gemm it must follow (-1: none)
    need = [-1] * v_eng.shape[0]
    for i in np.flatnonzero(v["opcode"] == Opcode.LOAD.value).tolist():
        src = dram_extent(v, i)
        need[i] = max((k for k, w in enumerate(written) if overlaps(src, w)), default=-1)
    vecs = v["opcode"] == Opcode.VEC.value
    paced = bool(np.isin(v["vec.func"][vecs], [f.value for f in _PACED]).any())
    loads = np.flatnonzero(v_eng == load).tolist()
    # the leading LOAD-engine words (up to the first that waits) of a vector part that reads
    # no STORE of gemm (an earlier GEMM part's DEQUANT: _may_run_beside) go right away
    lead = loads[:next((j for j, i in enumerate(loads) if int(v["wait"][i]) != NO_EVENT),
                       len(loads))]
    now = lead if all(need[i] < 0 for i in lead) else []
    if not paced:  # a LOAD-engine word that reads no STORE's result goes with the next
        for j in range(len(loads) - 2, -1, -1):
            if need[loads[j]] < 0:
                need[loads[j]] = need[loads[j + 1]]
    # a DEQUANT of gemm's results beside a ring whose LOADs follow the STOREs they wait on:
    # its words right before gemm's next LOAD-engine word (the docstring says why)
    late = not paced and any(n >= 0 for n in need) and _loads_follow_stores(g, g_eng, stores)
    for i in now:
        need[i] = -2
    queues = {e: [i for i in range(v_eng.shape[0]) if int(v_eng[i]) == e]
              for e in set(v_eng.tolist())}
    signalled: dict[int, int] = {}
    waited: dict[int, int] = {}
    out: list[np.ndarray] = []
    g_at, v_at = [0] * g_eng.shape[0], [0] * v_eng.shape[0]
    busy = dict.fromkeys(set(g_eng.tolist()) | {load}, 0)  # per engine: its words' durations
    free = 0  # when the vector engine is done with the VECs so far
    running: list[int] = []  # when each VEC so far ends
    times: dict[int, list[int]] = {}  # per event of vec: when each of its signals comes

    def put(word: np.ndarray, f: Mapping[str, np.ndarray], i: int, eng: int,
            cycles: int, mine: bool) -> None:
        nonlocal free
        clock = max(busy.values())
        w, e = int(f["wait"][i]), int(f["signal"][i])
        for ev, count in ((w, waited), (e, signalled)):
            if ev != NO_EVENT:
                count[ev] = count.get(ev, 0) + 1
        if not mine or eng == load:
            busy[eng] = busy.get(eng, 0) + cycles
            done = busy[eng] + (delay if eng == load else 0)
        elif eng == vector:  # after its operands' LOAD and the VECs before
            start = max(free, clock, *times.get(w, [0])[waited.get(w, 1) - 1:][:1])
            free = done = start + cycles
            running.append(free)
        else:
            done = max(clock, *times.get(w, [0])[waited.get(w, 1) - 1:][:1]) + cycles
        if mine and e != NO_EVENT:
            times.setdefault(e, []).append(done)
        out.append(word)

    def ready(i: int) -> bool:
        """Whether word ``i`` of vec would find what it waits on done (by the durations):
        a VEC only room in the vector engine's queue, since it holds up no word of gemm
        (which has none) while it waits for its operands, and its STORE then follows it
        by the VEC's estimated end, not by the next GEMM word's (a drained vector part's
        VIN LOAD, VEC, STORE and the next part's SYNC would each cost a weights LOAD's
        duration: SILU_GATE segments fell behind the up GEMM's tiles)."""
        clock = max(busy.values())
        if int(v_eng[i]) == vector:
            return sum(t > clock for t in running) < cfg.queue_depth - 1
        w = int(v["wait"][i])
        if w == NO_EVENT:
            return True
        at = times.get(w, [])
        n = waited.get(w, 0)
        return n < len(at) and at[n] <= clock

    def flush(done: int, end: bool, tail: bool = False) -> None:
        """Emit what of vec may come now (``done``: the last STORE known written; ``tail``:
        gemm has no GEMM and no LOAD-engine word left, so a paced word need not be
        :func:`ready`; in a bounded tail a STORE-engine word only where :func:`_tail_room`
        says so)."""
        nonlocal placed
        if any(waited.get(e, 0) > signalled.get(e, 0) for e in by_event):
            return  # a word of gemm before waits on a STORE after: gemm's words first
        progress = True
        while progress:
            progress = False
            for e, q in queues.items():
                while q:
                    i = q[0]
                    w = int(v["wait"][i])
                    if w != NO_EVENT and signalled.get(w, 0) <= waited.get(w, 0):
                        break
                    early = tail and not (bounded and e == store
                                          and not _tail_room(cfg, placed, g_left))
                    if e == load and (need[i] > done or need[i] == -1 and not (end or paced)) \
                            or paced and not (end or early or ready(i)):
                        break
                    if tail and not end and e == store:
                        placed += 1
                    v_at[i] = len(out)
                    put(vec[i:i + 1], v, i, e, int(v_cycles[i]), True)
                    q.pop(0)
                    progress = True

    done = -1
    consumed: dict[int, int] = {}
    tail = _tail_from(g, g_eng)
    # attention's runs: a tail only past a long last LOAD, its STOREs bounded (docstring)
    bounded = not (v["vec.func"][vecs] == VecFunc.SILU_GATE.value).any()
    last_load = max(np.flatnonzero(g_eng == load).tolist(), default=-1)
    placed = 0  # STORE-engine words of vec placed in the tail
    # STORE-engine words of gemm after its i-th (g_left: after the last placed)
    stores_after = np.concatenate([np.cumsum((g_eng == store)[::-1])[::-1][1:], [0]])
    g_left = 0
    for i in range(g_eng.shape[0]):
        g_at[i] = len(out)
        put(gemm[i:i + 1], g, i, int(g_eng[i]), int(g_cycles[i]), False)
        g_left = int(stores_after[i])
        if bounded and i == tail and (last_load < 0 or int(g_cycles[last_load]) < sum(
                int(v_cycles[j]) for j in queues.get(vector, []))):
            tail = g_eng.shape[0]  # the VECs left outlast the last LOAD: the clock's
        e = int(g["wait"][i])
        if int(g_eng[i]) == load and e in by_event:
            done = max(done, by_event[e][consumed.get(e, 0)])
            consumed[e] = consumed.get(e, 0) + 1
        if not late or i + 1 == g_eng.shape[0] or int(g_eng[i + 1]) == load:
            flush(done, False, i >= tail)
    while any(queues.values()):
        before = len(out)
        flush(done, True)
        if not any(queues.values()):
            break
        if not (queues.get(load) and need[queues[load][0]] > done):
            if len(out) == before:
                raise LoweringError("a vector part cannot run beside the GEMM part before it")
            continue
        e = int(g["signal"][stores[done + 1]])
        if e == NO_EVENT or consumed.get(e, 0) >= len(by_event[e]):
            raise LoweringError("a vector part waits for a STORE whose signal it cannot take")
        done = max(done, by_event[e][consumed.get(e, 0)])
        consumed[e] = consumed.get(e, 0) + 1
        sync = program_words([Sync(engine=Engine.LOAD, wait=e)])
        put(sync[0:1], decode_fields(sync), 0, load, 0, False)
    return np.concatenate(out).astype(np.uint64), g_at, v_at


def fuse_words(cfg: AcceleratorConfig, parts: Sequence[np.ndarray],
               overlap: bool = True) -> np.ndarray:
    """:func:`fuse_parts`' program."""
    return fuse_parts(cfg, parts, overlap)[0]


def fuse_parts(cfg: AcceleratorConfig, parts: Sequence[np.ndarray], overlap: bool = True,
               spread: bool = True) -> tuple[np.ndarray, tuple[tuple[int, ...], ...]]:
    """One program of the encoded programs ``parts`` (each ``uint64 [n, 2]``, END last), run
    one after the other: each part's END dropped and, before the next part, one SYNC on the
    LOAD engine per signal the part left unconsumed (which drains the counters and orders the
    next part's loads after every completion those signals report); END once at the end.
    With ``overlap``, the next part's :func:`hoistable` LOADs go before those SYNCs, without
    their signals, which the LOAD engine raises at their places after the SYNCs (on the
    LOAD-engine word before, or on a SYNC of their own), so they stream while the part before
    drains and the events run as without them; a vector part whose VIN beats collide with the
    part before's moves its VIN above them first (:func:`_vin_moved`), where that lets more of
    its LOADs go, or, where there is no room above them and it reads rows the part before stores
    from VOUT, into a gap between them (:func:`_vin_gap`), where that lets as many go; a vector
    part whose rows several parts store from VOUT, the last of them among those, goes first into
    a gap clear of every one of those parts' VIN beats (:func:`_vin_clear`: the REQUANT after
    the SiLU-gate's column segments). With ``spread``, a part's WGT is packed above the WGT of
    the parts before it where that lets its LOADs go as far (:func:`_wgt_moved`), and each of
    those LOADs goes up to the first boundary where the LOAD engine idles long enough for it
    (past several parts), or inside a GEMM part before it whose own weights all loaded before
    its boundary (:func:`_inside`: while its array computes); without (a step whose blocks roll
    into one loop), each to its own part's boundary where the LOAD engine idles long enough
    there, but weights up past vector parts to the first such boundary, never past nor before
    the drain of a residual ADD (no body's LOADs may move into the block before, which the last
    block's successor does not mirror: :func:`_boundary`). There a weights LOAD may overtake an
    earlier hoisted LOAD of its part into other beats. Where no slot has room, the first goes to
    its own boundary anyway and the rest stay (:data:`HOIST_FILL`, :data:`HOIST_UNFIT`).
    Returns the program and, per part, where each of its words (END aside) lies in it.

    Raises
    ------
    LoweringError
        The accelerator has fewer events than the parts use, a part does not end with END
        or holds a REPEAT,
        leaves an event waited on more often than signalled,
        or the fused program is longer than the instruction memory.
    """
    used = max(VECTOR_EVENTS.values()) + 1
    if cfg.num_events < used:
        raise LoweringError(f"a fused program uses {used} events, the accelerator has "
                            f"num_events={cfg.num_events}")
    # per part k: the words hoisted to its boundary (before the SYNCs draining part k - 1),
    # as (part, index) in order, its boundary SYNCs and its own blocks with their places
    bodies = []
    for k, words in enumerate(parts):
        ops = decode_fields(words[-1:])["opcode"] if words.shape[0] else np.zeros(0)
        if ops.size == 0 or int(ops[-1]) != Opcode.END.value:
            raise LoweringError(f"fused part {k} does not end with END")
        if (decode_fields(words)["opcode"] == Opcode.REPEAT.value).any():
            # the events a part leaves over are counted word by word, not per iteration
            raise LoweringError(f"fused part {k} holds a hardware loop (REPEAT)")
        bodies.append(words[:-1])
    # with overlap, each part's weights LOAD goes before an activations LOAD that waits
    orders = [weights_first(b) if overlap else (b, list(range(b.shape[0]))) for b in bodies]
    bodies = [b for b, _ in orders]
    merged, within = _beside_runs(cfg, bodies) if overlap else (
        bodies, [(k, list(range(b.shape[0]))) for k, b in enumerate(bodies)])
    words, places = _fuse(cfg, merged, overlap, spread)
    return words, tuple(tuple(places[q][at[i]] for i in order)
                        for (q, at), (_, order) in zip(within, orders, strict=True))


def weights_first(words: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """A part's ``words`` (END dropped) with each GEMM's weights LOAD that comes right
    after the LOAD of a new activation set ahead of it: the scheduler loads a new set
    (:class:`sw.compile.schedule._Scheduler`, resident rows from ACT beat 0) only once the
    GEMM before it is done, and the next weights, which wait only for the GEMM that last
    read their half, would queue behind that wait, the LOAD engine idle while the array
    computes (attention's values GEMM: a member's weights, its kv head's values, after
    the member before's last tile). A pair moves where the activations LOAD (into ACT)
    waits and signals nothing, and the weights LOAD right after it (into WGT) waits on
    another event (its own half's reader: the order of the waits on each event stays, so
    each takes the signal it took) and signals, and no STORE of the part writes the
    weights' DRAM. The weights LOAD goes first, without its signal, and the activations
    LOAD raises that signal: the GEMM it grants waits, as before, for both. A weights LOAD
    that waits on nothing moves too where no earlier LOAD (or move) of the part writes its
    WGT beats: no GEMM before it reads them, so it needs no wait of its own (the ring's
    first slots, :func:`sw.compile.schedule.ring_slots`: the first tiles of the scores' or
    the values' second member stream while the first member's last tiles compute); one
    into beats an earlier GEMM reads stays, since the activations LOAD's wait may be what
    orders it after that GEMM (the scheduler consumes each GEMM's done signal once).
    Returns the words and, per word of ``words``, where it lands."""
    f = decode_fields(words)
    eng = engines_fields(f)
    stores = [dram_extent(f, i) for i in _stores(f)]
    load = Opcode.LOAD.value
    order = list(range(words.shape[0]))
    out = words.copy()
    loaded = _loaded(f, True)  # per word: the scratchpad beats it writes (None: none)
    for i in range(words.shape[0] - 1):
        j = i + 1
        if not (eng[i] == eng[j] == Engine.LOAD.value and f["opcode"][i] == load
                and f["opcode"][j] == load and f["dma.spad"][i] == Spad.ACT.value
                and f["dma.spad"][j] == Spad.WGT.value and f["wait"][i] != NO_EVENT
                and f["signal"][i] == NO_EVENT and f["signal"][j] != NO_EVENT
                and (f["wait"][j] != NO_EVENT and f["wait"][j] != f["wait"][i]
                     or f["wait"][j] == NO_EVENT and not any(
                         b is not None and b[0] == Spad.WGT.value
                         and overlaps(b[1:], loaded[j][1:]) for b in loaded[:i]))
                and not any(overlaps(dram_extent(f, j), s) for s in stores)):
            continue
        acts, weights = _instr(words[i]), _instr(words[j])
        out[i:j + 1] = program_words([replace(weights, signal=None),
                                      replace(acts, signal=weights.signal)])
        order[i], order[j] = j, i
    return out, order


def _beside_runs(cfg: AcceleratorConfig, bodies: Sequence[np.ndarray]
                 ) -> tuple[list[np.ndarray], list[tuple[int, list[int]]]]:
    """``bodies`` (parts, END dropped) with each GEMM part and the vector parts right after
    it that may run beside it (:func:`_may_run_beside`: its DEQUANTs) as one part
    (:func:`beside`, the GEMM part's weights LOADs cut by :func:`cut_loads`; the vector
    parts one after the other, the LOAD engine draining each before the next as between
    parts, a FOLD's value codes going before the drain: :func:`_run_early`). Returns the
    parts and, per part of ``bodies``, the part it is in and where each of its words lies
    there."""
    out: list[np.ndarray] = []
    within: list[tuple[int, list[int]]] = []
    k = 0
    while k < len(bodies):
        gemm, run = bodies[k], []
        while k + 1 + len(run) < len(bodies) and _may_run_beside(
                cfg, gemm, bodies[k + 1 + len(run)], run):
            run.append(bodies[k + 1 + len(run)])
        if not run:
            within.append((len(out), list(range(gemm.shape[0]))))
            out.append(gemm)
            k += 1
            continue
        chain: list[Instr] = []
        at: list[list[int]] = []  # per part of the run: where each of its words lies in chain
        prev = None
        for body in run:
            syncs = [] if prev is None else [
                Sync(engine=Engine.LOAD, wait=e) for e, n in _left_over(prev).items()
                for _ in range(n)]
            body, hoisted = (body, []) if prev is None else _run_early(cfg, prev, body)
            blocks, place = _join(syncs, body, hoisted)
            at.append([len(chain) + p for p in place])
            chain += [_instr(w) for b in blocks for w in b]
            prev = body
        last, (words, g_at, v_at) = cut_loads(cfg, gemm, program_words(chain))
        within.append((len(out), [g_at[j] for j in last]))
        within += [(len(out), [v_at[p] for p in ps]) for ps in at]
        out.append(words)
        k += 1 + len(run)
    return out, within


def piece_beats(cfg: AcceleratorConfig, vec: Mapping[str, np.ndarray]) -> int:
    """The most beats of a piece of a weights LOAD that :func:`cut_loads` cuts beside the
    vector parts ``vec`` (decoded fields): as many as stream (``cfg.memory.cycles_per_beat``
    cycles each) while the vector engine takes one step of the run -- its longest VEC and the
    LOAD completion delay of the operands a drain waits on (:mod:`hw.timing`), so a waiting
    word of ``vec`` comes within about a step of when it can go."""
    vecs = exec_cycles_fields(vec, cfg)[vec["opcode"] == Opcode.VEC.value]
    step = int(vecs.max(initial=0)) + completion_delay(Engine.LOAD, cfg)
    return max(1, step // cfg.memory.cycles_per_beat)


def load_pieces(gemm: np.ndarray, piece: int) -> tuple[np.ndarray, list[int]]:
    """The part ``gemm`` (END dropped) with each one-row weights LOAD longer than ``piece``
    beats cut into consecutive LOADs of at most ``piece`` beats, the first with its wait,
    the last with its signal (the LOAD engine completes in order, so a word that waits on
    the signal finds every piece loaded). Returns the words and, per word of ``gemm``, its
    last word in them."""
    out: list[Instr] = []
    last = []
    for w in gemm:
        ins = _instr(w)
        if isinstance(ins, Load) and ins.spad == Spad.WGT and ins.rows == 1 \
                and ins.row_beats > piece:
            n = -(-ins.row_beats // piece)
            out += [replace(ins, wait=ins.wait if k == 0 else None,
                            signal=ins.signal if k == n - 1 else None,
                            dram_addr=ins.dram_addr + k * piece,
                            spad_addr=ins.spad_addr + k * piece,
                            row_beats=min(piece, ins.row_beats - k * piece)) for k in range(n)]
        else:
            out.append(ins)
        last.append(len(out) - 1)
    return program_words(out), last


def _ends(cfg: AcceleratorConfig, words: np.ndarray) -> int:
    """The cycles of the part ``words`` (END dropped) run alone, by :func:`timeline`."""
    return timeline(cfg, np.concatenate([words, program_words([End()])])).total


def cut_loads(cfg: AcceleratorConfig, gemm: np.ndarray, vec: np.ndarray
              ) -> tuple[list[int], tuple[np.ndarray, list[int], list[int]]]:
    """:func:`beside` of the GEMM part ``gemm`` (END dropped) of an attention run and the
    vector parts ``vec`` (a SOFTMAX and no SILU_GATE: :func:`beside` places their waiting
    words by the instructions' durations), with ``gemm``'s weights LOADs cut into pieces of
    a vector step (:func:`load_pieces`, :func:`piece_beats`) where the timing contract's
    schedule (:func:`timeline`) says the run is memory-bound and the pieces end it earlier:

    - ``gemm`` alone takes longer than ``vec`` alone: the weights stream bounds the run, and
      the vector parts fit inside it unless their drains are held. A waiting word of ``vec``
      goes after the LOAD-engine word whose end the durations say it can go by, so behind a
      whole LOAD it waits for that LOAD's end: a LOAD of LLaMA-7B's values, 512 beats a head
      on the DDR4-class system with an INT4 cache, held the next head's DEQUANT, SOFTMAX and
      FOLD (each a drain on the LOAD engine) until its end, where they could go between its
      beats. Where ``vec`` alone takes longer, its drains bound the run whatever the LOADs,
      and the pieces only put weights behind its VIN LOADs on the in-order LOAD engine,
      later than the part after the run expects them (which the run alone does not show:
      the board's paced reference step took 185,940 cycles with such runs cut, against
      184,916);
    - :func:`beside` of the pieces ends earlier than of ``gemm``: a piece boundary lets a
      waiting word go before the rest of its LOAD, which gains only where the word bounds the
      run, while each piece costs the LOAD engine ``hw.timing.LOAD_TURNAROUND`` cycles between
      read requests where a beat's are closer (the unpaced port) and a word to fetch (the
      reference model's deploy step took 97,429 cycles with every memory-bound run cut,
      against 97,390).

    Returns, per word of ``gemm``, its last word in the part beside ``vec`` (the pieces, or
    ``gemm`` uncut), and :func:`beside` of that part and ``vec``."""
    same = list(range(gemm.shape[0]))
    v = decode_fields(vec)
    funcs = v["vec.func"][v["opcode"] == Opcode.VEC.value]
    if not (funcs == VecFunc.SOFTMAX.value).any() or (funcs == VecFunc.SILU_GATE.value).any() \
            or _ends(cfg, gemm) <= _ends(cfg, vec):
        return same, beside(cfg, gemm, vec)
    cut, last = load_pieces(gemm, piece_beats(cfg, v))
    whole = beside(cfg, gemm, vec)
    if cut.shape[0] == gemm.shape[0]:
        return same, whole
    pieces = beside(cfg, cut, vec)
    return (same, whole) if _ends(cfg, pieces[0]) >= _ends(cfg, whole[0]) else (last, pieces)


def _run_early(cfg: AcceleratorConfig, before: np.ndarray, words: np.ndarray
               ) -> tuple[np.ndarray, list[int]]:
    """A vector part ``words`` (END dropped) of a beside run after the vector part ``before``
    of it, and the LOADs of its leading run that may go before the SYNCs draining ``before``
    (:func:`hoistable`, its own boundary alone): its VIN moved above ``before``'s where
    that lets more go (:func:`_vin_moved`). A FOLD's value codes (a row no part of the run
    writes) then load while the SOFTMAX before it runs, where they waited for its STORE."""
    f = decode_fields(words)
    if not (f["vec.func"][f["opcode"] == Opcode.VEC.value] == VecFunc.FOLD.value).all():
        return words, []
    hoisted = hoistable(before, words, deep=False)
    moved = _vin_moved(cfg, before, words)
    if moved is not None and len(more := hoistable(before, moved, deep=False)) > len(hoisted):
        return moved, more
    return words, hoisted


#: A hoisted LOAD goes to the first boundary (or inside slot) where the LOAD engine would
#: idle (:func:`_slack`, :func:`_inside`) for at least ``1 / HOIST_FILL`` of its beats
#: (:func:`_fuse`). Where it idles less than the whole LOAD, the part after starts later by
#: the rest -- at most as many cycles as the LOAD engine streams instead of idling, so even
#: where that delay reaches the end of the step the step ends no later, and it usually ends
#: earlier: the beats the LOAD engine streamed early are beats a GEMM part's weight stream no
#: longer waits for. Most idle windows between a decode step's vector parts (a VEC and its
#: STORE) are shorter than one weights LOAD (a ring slot's tile), so with the whole LOAD
#: (1) most weights queued behind the parts' SYNCs. It pays where the GEMM's ring has slots
#: left to fill after its activations land (with a ring of two slots, both loaded before them
#: either way, the earlier weights only delay the activations: tests/sw/compile/
#: test_fusion.py). Measured with ``python -m bench.beats`` (reference model, context 128;
#: :data:`HOIST_UNFIT` 1): 1: 120,984 cycles; 1.5: 121,119; 2: 118,445; 3: 120,040; 4:
#: 121,339 -- at 2 a projection's 196-beat ring slot fits the 100-130 cycles a REQUANT or a
#: norm leaves the LOAD engine, and the gain is that fit, not a trend.
HOIST_FILL = 2


#: The fills :func:`loads_ahead` tries (besides :data:`HOIST_FILL` for the KV cache tiles
#: alone) when a joined decode step's constant WGT LOADs, weights included, go where the
#: LOAD engine idles (``sw.compile.compiler._kv_ahead``, which keeps whichever
#: :func:`timeline` estimates to end first). No one fill is best everywhere: ``python -m
#: bench.beats --unpaced`` (reference, context 128, four lanes), every such LOAD at one fill:
#: 0.8: 105,308 cycles; 1: 105,228; 1.25: 105,224; 1.5: 105,948; 2: 106,145 (KV tiles alone
#: at 2: 105,723; none: 105,871).
AHEAD_FILLS = (HOIST_FILL, 1.25, 1)
#: How many times ``sw.compile.compiler._kv_ahead`` places the constant LOADs: each round
#: from the last one's placement and the idle :func:`timeline` estimates for it, while the
#: estimate of the step as it runs (``sw.compile.compiler._as_run``) ends earlier. ``python
#: -m bench.beats --unpaced`` (reference, context 128, at 1bc6aab): one round 105,050 cycles, two
#: 104,891.
AHEAD_ROUNDS = 2
#: How many of a part's hoistable LOADs that find no slot with room (:data:`HOIST_FILL`) go
#: before their own boundary's SYNCs anyway (the rest stay after them): one, so that the
#: LOAD engine has work at every boundary, but no more -- a rolled step's (:func:`_fuse`
#: without ``spread``) ring of weights hoisted whole went before the activations' LOAD and
#: held its GEMMs, which take as long as their weights, a ring's worth of LOADs (SmolLM2,
#: ``python -m bench.beats --model smollm2``: every one, 4,558,278 cycles; 2: 4,468,998; 1:
#: 4,435,158; the reference model: 2: 118,544; 1: 118,445).
HOIST_UNFIT = 1


def _fuse(cfg: AcceleratorConfig, parts: Sequence[np.ndarray], overlap: bool, spread: bool
          ) -> tuple[np.ndarray, tuple[tuple[int, ...], ...]]:
    """:func:`fuse_parts` of ``parts`` (END dropped), each run beside what it may be.

    A hoisted LOAD goes to a *slot*: ``2 * k`` is boundary ``k`` (before the SYNCs draining
    part ``k - 1``), ``2 * k + 1`` inside part ``k`` (:func:`_inside`), in program order."""
    early: list[list[tuple[int, int]]] = [[] for _ in range(2 * len(parts))]
    joined: list[tuple[list[np.ndarray], list[int], list[int]]] = []
    placed: list[np.ndarray] = []
    constant = _constant_sources(parts)
    room: list[int] = []  # per slot: the LOAD engine's idle cycles left there
    cuts: list[int | None] = []  # per part: the word its inside slot goes before
    after: set[int] = set()  # the inside slots after a GEMM part's last weights
    syncs: list[Instr] = []
    for k, body in enumerate(parts):
        hoisted = hoistable(placed[-1], body, spread) if overlap and k else []
        clear = _vin_clear(cfg, placed, body) if overlap and k else None
        moved = _vin_moved(cfg, placed[-1], body) if overlap and k and clear is None else None
        if clear is not None:
            body, hoisted = clear, hoistable(placed[-1], clear, spread)
        elif moved is not None and len(more := hoistable(placed[-1], moved, spread)) > len(
                hoisted):
            body, hoisted = moved, more
        elif moved is None and (gap := _vin_gap(cfg, placed[-1], body) if overlap and k
                                else None) is not None and len(
                more := hoistable(placed[-1], gap, spread)) >= len(hoisted):
            body, hoisted = gap, more
        shifted = _wgt_moved(cfg, placed, body) if overlap and spread and k else None
        if shifted is not None and _reach(placed, shifted, more := hoistable(
                placed[-1], shifted), constant) >= _reach(placed, body, hoisted, constant):
            body, hoisted = shifted, more
        # the LOADs into VIN the part before has settled at its end: to this boundary alone
        drained = set(drained_loads(cfg, placed[-1], body, hoisted)) if overlap and k else set()
        hoisted = sorted([*hoisted, *drained])
        placed.append(body)
        room.append(_slack(cfg, placed[-2]) if k else 0)
        f, goes, extents = decode_fields(body), [], []
        for i in hoisted:  # each at the first slot with room
            beats = int(f["dma.rows"][i]) * int(f["dma.row_beats"][i])
            # inside the part before its earliest boundary (rolled, not spread: no inside
            # slot has room); not before an earlier LOAD of the part, unless rolled it
            # loads weights and that LOAD writes none of its beats (neither waits: the
            # weights may overtake a constant row that goes no further up, SmolLM2's
            # gate/up weights its DEQUANT's channel words; spread, where the weights go
            # inside GEMM parts too, the reference model's step took longer)
            first = 2 * _boundary(placed, body, i, constant, not spread) - 1 \
                if i not in drained else 2 * k
            # (spread, weights may overtake them into a slot after a GEMM part's last
            # weights, :func:`_after_weights`: the MLP's weights its channel words)
            spad, lo, hi = _spad_extent(f, i)
            first = max([first, *(j for j, (s, a, b) in zip(goes, extents, strict=True)
                                  if spad != Spad.WGT.value
                                  or s == spad and overlaps((lo, hi), (a, b)))])
            last = max([first, *goes]) if spread else first
            at = next((j for j in range(first, 2 * k + 1)
                       if (j >= last or j in after) and room[j] > 0
                       and (1 if j in after else HOIST_FILL) * room[j] >= beats),
                      2 * k if len(goes) < HOIST_UNFIT else None)
            if at is None:
                break
            room[at] -= beats
            goes.append(at)
            extents.append((spad, lo, hi))
        hoisted = hoisted[:len(goes)]
        for i, j in zip(hoisted, goes, strict=True):
            early[j].append((k, i))
        cut, idle, late = _inside(cfg, body, hoisted) if spread else (None, 0, False)
        cuts.append(cut)
        if late:
            after.add(len(room))
        room.append(idle)
        blocks, place = _join(syncs, body, hoisted)
        head = len(hoisted)
        joined.append((blocks[1:] if head else blocks, place, list(hoisted)))
        left = _left_over(body)
        if any(n < 0 for n in left.values()):
            raise LoweringError(f"fused part {k} waits on events it never signals: {left}")
        syncs = [Sync(engine=Engine.LOAD, wait=e) for e, n in left.items() for _ in range(n)]
    out: list[np.ndarray] = []
    where: dict[tuple[int, int], int] = {}
    starts, splits = [], []
    at = 0

    def put(slot: int) -> None:
        nonlocal at
        for part, i in early[slot]:
            out.append(program_words([replace(_instr(placed[part][i]), signal=None)]))
            where[part, i] = at
            at += 1
    for k, (blocks, place, hoisted) in enumerate(joined):
        put(2 * k)
        starts.append(at)
        tail = np.concatenate(blocks) if blocks else np.zeros((0, 2), np.uint64)
        split = tail.shape[0] if cuts[k] is None else place[cuts[k]] - len(hoisted)
        splits.append((split, len(early[2 * k + 1])))
        out.append(tail[:split])
        at += split
        put(2 * k + 1)
        out.append(tail[split:])
        at += tail.shape[0] - split
    places = []
    for k, (_, place, hoisted) in enumerate(joined):
        moved = set(hoisted)
        split, extra = splits[k]
        places.append(tuple(
            where[k, i] if i in moved else starts[k] + place[i] - len(hoisted)
            + (extra if place[i] - len(hoisted) >= split else 0) for i in range(len(place))))
    out.append(program_words([End()]))
    words = np.concatenate(out).astype(np.uint64)
    if words.shape[0] > cfg.imem_depth:
        raise LoweringError(f"the fused program needs {words.shape[0]} instructions and the "
                            f"instruction memory holds {cfg.imem_depth}")
    return words, tuple(places)


def _inside(cfg: AcceleratorConfig, words: np.ndarray, hoisted: Sequence[int]
            ) -> tuple[int | None, int, bool]:
    """A GEMM part's inside slot, where every LOAD of the part into WGT goes before its
    boundary (``hoisted``): its first word on another engine than LOAD, before which a later
    part's hoisted LOAD may go -- after the LOAD-engine words that lead the part (its
    activations' LOAD and the signals of its hoisted weights, :func:`_join`), so a LOAD there
    delays none of them -- and the cycles the LOAD engine would idle in the part before its
    drain: what the busiest of its other engines executes, less what its LOAD engine
    executes and what the others execute after its last LOAD (:func:`_tail`: the boundary
    after it has that). None and 0 where the part loads weights after its boundary (its LOAD engine
    streams them while the array runs) or no LOAD-engine word of it waits (the boundary
    after it is as early). The weights of the GEMM part after it then stream while the
    array computes (:func:`_wgt_moved` keeps them apart)."""
    f = decode_fields(words)
    eng = engines_fields(f)
    load = Engine.LOAD.value
    kept = np.ones(eng.shape[0], bool)
    kept[list(hoisted)] = False
    others = np.flatnonzero((eng != load) & kept)
    weights = (f["opcode"] == Opcode.LOAD.value) & (f["dma.spad"] == Spad.WGT.value)
    cycles = exec_cycles_fields(f, cfg)
    if others.size == 0 or not ((eng == load) & kept & (f["wait"] != NO_EVENT)).any() \
            or not weights.any():
        return None, 0, False
    if (weights & kept).any():
        cut, idle = _after_weights(f, eng, weights & kept, cycles)
        return cut, idle, cut is not None
    busiest = max(int(cycles[eng == e].sum()) for e in set(eng[others].tolist()))
    # not past a LOAD-engine word that waits: its signal may come after the slot (a GEMM's
    # STORE), and LOADs queued behind it would hold the dispatch of that GEMM
    waits = np.flatnonzero((eng == load) & kept & (f["wait"] != NO_EVENT))
    return int(min(others[0], waits[0])), max(0, busiest - int(cycles[(eng == load) & kept].sum())
                                              - _tail(cfg, words)), False


def _after_weights(f: Mapping[str, np.ndarray], eng: np.ndarray, weights: np.ndarray,
                   cycles: np.ndarray) -> tuple[int | None, int]:
    """:func:`_inside` of a GEMM part that loads weights after its boundary (a ring's, each
    LOAD waiting for a GEMM ``slots`` before it): the slot right after its last GEMM, and the
    cycles the LOAD engine idles from its last weights LOAD (``weights``) on while the array
    runs its last GEMM (which reads what that LOAD brought) -- that GEMM's cycles, less what
    the LOAD engine executes from that LOAD on (a LOAD there that fits them delays none of
    the part's, a DEQUANT's rows beside: :func:`_fuse` fits it whole, not by
    :data:`HOIST_FILL`). Past every GEMM, LOADs queued there hold the dispatch of no GEMM;
    None and 0 where a word before the slot waits on a signal only a word after it gives
    (:func:`_met_before`: LOADs queued behind that word could then hold the dispatch of its
    signal). The weights of the GEMM part after it then land while its last GEMMs compute
    (HBM-class decode: the MLP's first tiles while o_proj's last ones run, where a ring of
    two slots, :func:`sw.compile.schedule.ahead_slots`, leaves them WGT beats of their
    own)."""
    last = int(np.flatnonzero(weights)[-1])
    cut = int(np.flatnonzero(eng == Engine.COMPUTE.value)[-1]) + 1
    if cut <= last or not _met_before(f, cut):
        return None, 0
    load = np.flatnonzero(eng == Engine.LOAD.value)
    return cut, max(0, int(cycles[cut - 1]) - int(cycles[load[load >= last]].sum()))


def _met_before(f: Mapping[str, np.ndarray], cut: int) -> bool:
    """Whether every wait of the words before ``cut`` (fields of a part, its counters from 0)
    is met by a signal of a word before it: the k-th wait on an event by its k-th signal."""
    count: dict[int, int] = {}
    for i in range(cut):
        if (e := int(f["wait"][i])) != NO_EVENT:
            if not count.get(e):
                return False
            count[e] -= 1
        if (e := int(f["signal"][i])) != NO_EVENT:
            count[e] = count.get(e, 0) + 1
    return True


def _slack(cfg: AcceleratorConfig, words: np.ndarray) -> int:
    """The cycles the LOAD engine would idle at the drain after the part ``words``: while its
    last LOAD's data lands (:func:`hw.engines.completion_delay`) and its other engines then
    execute what comes after that LOAD (:func:`_tail`), which a LOAD hoisted before that
    drain fills for free (0 where nothing comes after it)."""
    tail = _tail(cfg, words)
    return tail + completion_delay(Engine.LOAD, cfg) if tail else 0


def _tail(cfg: AcceleratorConfig, words: np.ndarray) -> int:
    """What the other engines of the part ``words`` execute after its last LOAD-engine word
    (their instructions' durations, :func:`hw.engines.exec_cycles_fields`)."""
    f = decode_fields(words)
    eng = engines_fields(f)
    loads = np.flatnonzero(eng == Engine.LOAD.value)
    after = np.arange(eng.shape[0]) > (int(loads[-1]) if loads.size else -1)
    return int(exec_cycles_fields(f, cfg)[after & (eng != Engine.LOAD.value)].sum())


def _constant_sources(parts: Sequence[np.ndarray]) -> list[tuple[int, int]]:
    """The DRAM extents every STORE of ``parts`` writes (what is not in them is constant
    while the fused program runs)."""
    out = []
    for words in parts:
        f = decode_fields(words)
        out += [dram_extent(f, i) for i in _stores(f)]
    return out


def _boundary(placed: Sequence[np.ndarray], body: np.ndarray, i: int,
              stored: Sequence[tuple[int, int]], rolled: bool = False) -> int:
    """The earliest boundary a hoistable LOAD ``i`` of the last part of ``placed``
    (``body``) may go before: that part's own (its index), or, when no STORE of the whole
    program writes its DRAM source (``stored``: weights, constant rows), further up past
    every part before whose LOADs write none of its scratchpad beats (the part before such a
    boundary then reads none of them: a part reads only what its own LOADs put in a
    scratchpad) and, with ``rolled`` (a step whose blocks roll into one loop), only
    weights (a constant row into VIN keeps its own boundary), only past vector parts (not
    a GEMM part: nothing places a LOAD by its GEMMs' timing, as :func:`_inside` does with
    ``spread``; o_proj's weights went up past attention's values heads and held up the
    next head's values), and neither past nor before the drain of a part that runs an ADD
    (:func:`_adds`: a residual addition; a block's last one ends it, where the loop's body
    may end: no LOAD of one block may move into the block before it, and the first
    block's, after no ADD, must go where the others' do)."""
    k = len(placed) - 1
    f = decode_fields(body[i:i + 1])
    src = dram_extent(f, 0)
    if overlapping(np.array(stored, np.int64).reshape(-1, 2), src).any():
        return k
    spad, lo, hi = _spad_extent(f, 0)
    if rolled and spad != Spad.WGT.value:
        return k
    while k > 1 and not any(s == spad and overlaps((lo, hi), (a, b))
                            for s, a, b in _loads(placed[k - 2])) \
            and not (rolled and (_gemms_or_adds(placed[k - 1]) or _adds(placed[k - 2]))):
        k -= 1
    return k


def _adds(words: np.ndarray) -> bool:
    """Whether the part ``words`` runs a VEC of :attr:`hw.isa.VecFunc.ADD`."""
    f = decode_fields(words)
    return bool((f["vec.func"][f["opcode"] == Opcode.VEC.value] == VecFunc.ADD.value).any())


def _gemms_or_adds(words: np.ndarray) -> bool:
    """Whether the part ``words`` runs a GEMM or an ADD (:func:`_adds`)."""
    return bool((decode_fields(words)["opcode"] == Opcode.GEMM.value).any()) or _adds(words)


@dataclass(frozen=True)
class FusedGroup:
    """A fused program: the work entries it runs (consecutive indices of ``work``), its
    ``parts`` in order and, per part, the entry (offset into ``entries``) whose node's program
    it is (None: a REQUANT, DEQUANT or ADD between them); ``fallback``: the groups to fuse
    instead where this one does not fit the instruction memory; ``residual``: where a part
    reads the residual rows of the first entry (a residual linear after a host REQUANT
    head: :func:`linear_group`) as Q15.16 rows (None: none) -- an earlier chain's ADD
    results, or a buffer of its own the host writes (the compiler tells which);
    ``attention``: per context bucket, this chain after that bucket's attention program as
    one (:func:`attention_chains`), each falling back to the attention program alone and
    this one."""

    entries: tuple[int, ...]
    parts: tuple[Part, ...]
    owners: tuple[int | None, ...]
    fallback: tuple[FusedGroup, ...] = ()
    residual: str | None = None
    attention: tuple[FusedGroup, ...] = ()


def rows_left(group: FusedGroup) -> set[str]:
    """The Q15.16 rows the fused program of ``group`` leaves in DRAM once it has run, which a
    later chain's residual may read there (:func:`fusion_groups`): the rows its head reads
    (the host's, written before the start), its residual rows and every vector and DEQUANT
    part's results."""
    head = group.parts[0]
    out = {group.residual}
    if isinstance(head, VectorOp):
        out |= {head.x, head.b}
    elif isinstance(head, RequantOp) and head.host:
        out.add(head.x)
    out |= {p.y for p in group.parts if isinstance(p, VectorOp | DequantOp)}
    out |= {p.columns[0].y for p in group.parts  # column segments': their whole rows
            if isinstance(p, DequantOp) and p.columns is not None}
    return out - {None}


def _pair_group(cfg: AcceleratorConfig, work: Sequence[tuple], i: int,
                heads: frozenset[str] = frozenset()) -> FusedGroup:
    """The fused program of entries ``i`` (a vector node) and ``i + 1`` (the linear node that
    reads its rows): with a DEQUANT of every member's outputs where each is a compressed
    layer, and an ARGMAX of them where the linear's one output is in ``heads`` (the logits
    greedy decoding picks from)."""
    phase, _, _, (vec,) = work[i]
    _, node, _, members = work[i + 1]
    dequant = all(m.source is not None for m in members)
    outputs = [symbols.buffer("q", phase, node.name, j) for j in range(len(members))]
    parts = fused_parts(cfg, vec, members, symbols.buffer("a", phase, node.name),
                        outputs if dequant else None)
    if dequant and len(members) == 1 and len(node.outputs) == 1 and node.outputs[0] in heads:
        d = parts[-1]
        parts.append(ArgmaxOp(d.rows, d.length, d.row_bytes, d.y,
                              symbols.buffer("m", phase, node.name)))
    return FusedGroup((i, i + 1), tuple(parts), (0, None, 1) + (None,) * (len(parts) - 3))


def linear_group(cfg: AcceleratorConfig, work: Sequence[tuple], i: int) -> FusedGroup | None:
    """The fused program of entry ``i`` alone, where it is a linear node whose input rows
    the host may write as Q15.16 rows (``to_fixed``, as for a vector node): a REQUANT of
    them (``host``; its ``x`` a buffer of its own), the linear program and a DEQUANT of every
    member's outputs -- what the host's requantisation and dequantisation around it compute
    (:func:`hw.numerics.quantize_activations_vector` is :func:`hw.numerics.vec_requant` of
    ``to_fixed``). None where the node depends on the context bucket, has a bias, a member
    that is not a compressed layer (no channel words), or members that read other rows.
    Alone it is no fewer programs; it heads a chain (:func:`fusion_groups`)."""
    phase, node, bucket, members = work[i]
    if bucket is None and OPS[node.op].streams == "weights" and node.inputs:
        m = members[0]
        if all(isinstance(n, Member) and n.source is not None and not n.b and n.x == m.x
               for n in members):
            req = RequantOp(m.plan.tokens, m.plan.layout.k, m.plan.act_row_bytes,
                            symbols.buffer("h", phase, node.name), m.x, host=True)
            place = amax_place(cfg, req.length, req.act_row_bytes)
            req = replace(req, amax=True, b=symbols.buffer("a", phase, node.name)
                          if place.separate else None)
            outputs = [symbols.buffer("q", phase, node.name, j) for j in range(len(members))]
            deq = dequant_ops(cfg, req, members, outputs)
            return FusedGroup((i,), (req, tuple(members), *deq),
                              (None, 0) + (None,) * len(deq))
    return None


def _layout_source(graph: Graph, value: str) -> tuple[str, list]:
    """The value ``value`` is a layout-only view of (following ``view`` / ``reshape`` /
    ``transpose`` nodes back: ``OPS[op].layout`` ops of one input and output that keep
    every element) and those nodes, first applied first."""
    producer = {v: n for n in graph.nodes for v in n.outputs}
    chain = []
    while (n := producer.get(value)) is not None and OPS[n.op].layout and \
            n.op in ("view", "reshape", "transpose") and len(n.inputs) == 1:
        chain.append(n)
        value = n.inputs[0]
    return value, chain[::-1]


def row_aliases(graph: Graph, work: Sequence[tuple]) -> dict[str, str]:
    """Per input value of a ``rope`` node of ``work`` (``(phase, node, bucket, members)``)
    that is a layout-only view of another value whose rows (row-major, ``rows x length``)
    are element for element ROPE's rows of it (:func:`sw.compile.ir.rope_rows`): that
    other value (a chain that holds it on chip feeds the rope node from there). Checked
    on the element indices: the layout nodes' kernels applied to ``arange`` of the
    source's shape, then ROPE's row layout, must give the source's rows in order."""
    out = {}
    for _, node, bucket, members in work:
        if node.op != "rope" or bucket is not None or len(members) != 1 \
                or not isinstance(members[0], VectorOp):
            continue
        vec, value = members[0], node.inputs[0]
        source, chain = _layout_source(graph, value)
        shape = graph.values[source].shape
        if not chain or not all(isinstance(n, int) for n in shape):
            continue
        index = torch.arange(int(np.prod(shape, dtype=np.int64))).reshape(tuple(shape))
        x = index
        for n in chain:
            (x,) = OPS[n.op].kernel(n, [x], None)
        if x.dim() != 4 or x.numel() != vec.rows * vec.length:
            continue
        if torch.equal(rope_rows(x), index.reshape(vec.rows, vec.length)):
            out[value] = source
    return out


def kv_appends(graph: Graph) -> dict[str, tuple[int, str]]:
    """Per key row value a KV append node of ``graph`` reads (``OPS[op].kv_state`` "append":
    the rotated keys), its layer and the value whose rows its values are: the source of its
    value input through layout-only nodes whose elements, in order, are that source's (one
    token's: the kv heads side by side, as the key row), checked on the element indices as
    :func:`row_aliases` does. A chain that holds both rows on chip appends them there
    (:class:`sw.compile.kvappend.KVAppendOp`)."""
    out = {}
    for node in graph.nodes:
        if OPS[node.op].kv_state != "append" or len(node.inputs) != 2:
            continue
        source, chain = _layout_source(graph, node.inputs[1])
        shape = graph.values[source].shape
        if not all(isinstance(n, int) for n in shape):
            continue
        index = torch.arange(int(np.prod(shape, dtype=np.int64))).reshape(tuple(shape))
        x = index
        for n in chain:
            (x,) = OPS[n.op].kernel(n, [x], None)
        if torch.equal(x.reshape(-1), index.reshape(-1)):
            out[node.inputs[0]] = (int(node.attrs["layer"]), source)
    return out


class _Chain:
    """A fused program being grown unit by unit (:func:`fusion_groups`): its entries, parts
    and owners, and where each graph value it computed lies on chip as Q15.16 rows
    (``(symbol, rows, length)``; ``pending``: a residual linear's output, once an ADD of its
    DEQUANT rows and the residual rows, ``(dequant symbol, residual symbol, rows, length)``).
    A unit's first part is its *head*: a vector node's program, or the REQUANT of a
    :func:`linear_group`; the rows the first unit's head reads are the host's, written before
    the start. A residual linear head's residual rows (``residual``) are those an earlier
    chain left on chip where it did (``left``: per graph value, ``(symbol, rows, length)``
    as in ``onchip``; the same rows and length, so the same row layout: every chain's rows
    lie ``row_bytes(cfg, length)`` apart), else a buffer of its own the host writes.
    ``appends``: the KV appends the chain may carry (as :func:`fusion_groups` takes them)."""

    def __init__(self, cfg: AcceleratorConfig, work: Sequence[tuple], unit: FusedGroup,
                 aliases: Mapping[str, str],
                 left: Mapping[str, tuple[str, int, int]] | None = None,
                 appends: Mapping[str, tuple[str, KVAppendOp]] | None = None):
        self.cfg, self.work, self.aliases = cfg, work, aliases
        self.appends = dict(appends or {})
        self.entries: list[int] = []
        self.parts: list[Part] = []
        self.owners: list[int | None] = []
        self.units: list[FusedGroup] = []
        self.onchip: dict[str, tuple[str, int, int]] = {}
        self.pending: dict[str, tuple[str, str, int, int]] = {}
        self.residual: str | None = None
        head = unit.parts[0]
        for value, sym in self._reads(unit):  # the rows the host writes before the start
            self.onchip[value] = (sym, head.rows, head.length)
        phase, node, _, _ = work[unit.entries[0]]
        deq = [p for p in unit.parts if isinstance(p, DequantOp)]
        if isinstance(head, RequantOp) and len(node.inputs) == 2 and len(deq) == 1:
            shape = (deq[0].rows, deq[0].length)
            made = (left or {}).get(node.inputs[1])
            self.residual = made[0] if made is not None and made[1:] == shape \
                else symbols.buffer("s", phase, node.name)
            self.onchip.setdefault(node.inputs[1], (self.residual, *shape))
        self._add(unit, head)

    def _reads(self, unit: FusedGroup) -> list[tuple[str, str]]:
        """``(value, symbol)`` of the rows ``unit``'s head reads: a vector node's operands,
        a REQUANT's linear input."""
        head = unit.parts[0]
        node = self.work[unit.entries[0]][1]
        if isinstance(head, RequantOp):
            return [(node.inputs[0], head.x)]
        return [(v, s) for v, s in zip(node.inputs, (head.x, head.b), strict=False) if s]

    def _add(self, unit: FusedGroup, head: VectorOp | RequantOp) -> None:
        base = len(self.entries)
        self.entries += unit.entries
        last = self.parts[-1] if self.parts else None
        gemm = next((m for p in self.parts if isinstance(p, tuple) for m in p
                     if isinstance(last, DequantOp) and m.y == last.x), None)
        segments = silu_segments(self.cfg, last, head, gemm) if isinstance(last, DequantOp) \
            and isinstance(head, VectorOp) else None
        if segments is not None:  # the up DEQUANT's and SILU_GATE's segments, alternating
            self.parts[-1:] = segments
            self.owners[-1:] = [None] * len(segments)
            self.parts += unit.parts[1:]
            self.owners += [None if o is None else base + o for o in unit.owners[1:]]
        else:
            self.parts += [head, *unit.parts[1:]]
            self.owners += [None if o is None else base + o for o in unit.owners]
        self.units.append(unit)
        if isinstance(head, VectorOp):
            _, vnode, _, _ = self.work[unit.entries[0]]
            self.onchip[vnode.outputs[0]] = (head.y, head.rows, head.length)
        self._add_rows(unit)
        self._append()

    def _append(self) -> None:
        """A KV append part for each of ``appends`` (key row value -> its value row's value
        and the part) whose two rows of one token now lie on chip, as long as the kv heads'
        rows, once."""
        for k, (v, op) in list(self.appends.items()):
            at_k, at_v = self.onchip.get(k), self.onchip.get(v)
            size = (1, op.kv_heads * op.layout.head_dim)
            if at_k is None or at_v is None or at_k[1:] != size or at_v[1:] != size:
                continue
            del self.appends[k]
            self.parts.append(replace(op, k=at_k[0], v=at_v[0]))
            self.owners.append(None)

    def _add_rows(self, unit: FusedGroup) -> None:
        """Where a linear unit's DEQUANT rows (or a residual output, pending) lie on chip."""
        deq = [p for p in unit.parts if isinstance(p, DequantOp)]
        if not deq:
            return
        _, lnode, _, _ = self.work[unit.entries[-1]]
        if len(lnode.inputs) == 1 and len(lnode.outputs) == len(deq):
            for value, d in zip(lnode.outputs, deq, strict=True):
                self.onchip[value] = (d.y, d.rows, d.length)
        elif len(lnode.inputs) == 2 and len(deq) == 1 and lnode.inputs[1] in self.onchip:
            res, rows, length = self.onchip[lnode.inputs[1]]
            if (rows, length) == (deq[0].rows, deq[0].length):
                self.pending[lnode.outputs[0]] = (deq[0].y, res, rows, length)

    def join(self, unit: FusedGroup) -> bool:
        """Append ``unit`` (a pair, a lone vector node or a :func:`linear_group`) when every
        row its head reads lies on chip as it reads it; ADD parts first for residual outputs
        it reads."""
        phase, _, bucket, _ = self.work[unit.entries[0]]
        head = unit.parts[0]
        if bucket is not None or phase != self.work[self.entries[0]][0]:
            return False
        found = []
        for v, _ in self._reads(unit):
            v = self.aliases.get(v, v)
            at = self.onchip.get(v) or self.pending.get(v)
            if at is None or tuple(at[-2:]) != (head.rows, head.length):
                return False
            found.append(v)
        syms = []
        for v in found:
            if v in self.pending:
                q, res, rows, length = self.pending.pop(v)
                y = symbols.buffer("r", phase, v)
                self.parts.append(VectorOp(VecFunc.ADD, rows, length, row_bytes(self.cfg, length),
                                           q, y, res))
                self.owners.append(None)
                self.onchip[v] = (y, rows, length)
            syms.append(self.onchip[v][0])
        if isinstance(head, RequantOp):  # it reads them on chip; the host writes nothing
            head = replace(head, x=syms[0], host=False)
        else:
            head = replace(head, x=syms[0], b=syms[1] if len(syms) > 1 else None)
        self._add(unit, head)
        return True

    def group(self) -> FusedGroup:
        read = {s for p in self.parts[1:] if isinstance(p, VectorOp | RequantOp)
                for s in (p.x, p.b)}
        return FusedGroup(tuple(self.entries), tuple(self.parts), tuple(self.owners),
                          tuple(u for u in self.units if len(u.entries) > 1),
                          self.residual if self.residual in read else None)


def fusion_groups(cfg: AcceleratorConfig, work: Sequence[tuple], chain: bool = True,
                  heads: frozenset[str] = frozenset(),
                  aliases: Mapping[str, str] | None = None,
                  appends: Mapping[str, tuple[str, KVAppendOp]] | None = None
                  ) -> list[FusedGroup]:
    """The fused programs of ``work`` (the accelerator nodes of one phase, in order, as
    ``(phase, node, bucket, members)``): each pair of :func:`fusion_pairs` (an ARGMAX after
    a linear whose output is in ``heads``) and, with ``chain``, runs of consecutive pairs and
    lone vector nodes whose every vector node reads only rows an earlier part left on chip
    (the module docstring's chaining rule) as one; ``aliases``: per vector node input, the
    value whose on-chip rows it reads instead (:func:`row_aliases`); ``appends``: per key
    row value of a KV append, its value row's value and the append's part (its ``k`` and
    ``v`` set where a chain holds both rows: :meth:`_Chain._append`)."""
    pairs = set(fusion_pairs(work))
    units: list[FusedGroup | None] = []
    i = 0
    while i < len(work):
        if i in pairs:
            units.append(_pair_group(cfg, work, i, heads))
            i += 2
            continue
        _, _, bucket, members = work[i]
        lone = bucket is None and len(members) == 1 and isinstance(members[0], VectorOp)
        units.append(FusedGroup((i,), (members[0],), (0,)) if lone
                     else linear_group(cfg, work, i) if chain else None)
        i += 1
    if not chain:
        return [u for u in units if u is not None and len(u.entries) > 1]
    out: list[FusedGroup] = []
    current: _Chain | None = None
    left: dict[str, tuple[str, int, int]] = {}  # the rows the chains so far left on chip
    for unit in units + [None]:
        if current is not None and unit is not None and current.join(unit):
            continue
        if current is not None and len(current.units) == 1:
            out += current.units if len(current.entries) > 1 else []
        elif current is not None:
            out.append(current.group())
            left.update(current.onchip)
        current = _Chain(cfg, work, unit, aliases or {}, left, appends) if unit is not None \
            else None
    return out


#: Where the host writes a scores DEQUANT's ``amax`` words: word 0 of a beat per row.
SCORES_AMAX = AmaxPlace(True, 0, 0, 1)


def _softmax_entry(work: Sequence[tuple], i: int) -> int | None:
    """The entry of ``work`` of the softmax node that reads attention scores entry ``i``'s
    output in the same phase and context bucket (None: none)."""
    phase, node, bucket, _ = work[i]
    for j, (ph, n, b, members) in enumerate(work):
        if (ph, b) == (phase, bucket) and n.op == "softmax" and n.inputs[0] == node.outputs[0] \
                and len(members) == 1 and isinstance(members[0], VectorOp):
            return j
    return None


def _query_rows(cfg: AcceleratorConfig, work: Sequence[tuple], i: int) -> VectorOp | None:
    """The vector program of the rope node whose output is attention scores entry ``i``'s
    query, where its rows are one per token, each every head's ``head_dim`` words in order,
    ``4 * head_dim`` bytes per head (whole beats), and each member's rows are whole heads of
    those tokens -- a REQUANT can read them from its results (None: not so)."""
    phase, node, _, members = work[i]
    d, heads = node.attrs["head_dim"], node.attrs["heads"]
    for ph, n, b, ms in work:
        if ph == phase and b is None and n.op == "rope" and n.outputs[0] == node.inputs[0] \
                and len(ms) == 1 and isinstance(ms[0], VectorOp):
            vec = ms[0]
            whole = row_bytes(cfg, d) == 4 * d
            rows = heads // len(members) * vec.rows  # a member's: its heads' tokens
            return vec if vec.length == heads * d and whole and heads % len(members) == 0 \
                and all(m.plan.tokens == rows for m in members) else None
    return None


def query_requants(cfg: AcceleratorConfig, rope: VectorOp, m: Member, h: int, d: int,
                   amax: str | None) -> list[RequantOp]:
    """The REQUANT parts that requantise scores member ``h``'s (``m``'s) query rows from the
    results of ``rope`` (:func:`_query_rows`: a row per token, every head's ``d`` words side
    by side) into its INT8 rows (and their ``amax`` beats into ``amax``, where they are
    separate). One token (a decode step): its heads' rows are consecutive, one REQUANT of
    them. Several (a prefill): a member's rows are a head's tokens, then the next head's
    (:func:`hw.numerics.group_rows`), each head a column range of the rope's rows, so a
    REQUANT per head reads its ``d`` words of every token's row (``x_row_bytes`` the rope's
    row) into its rows of the member's (``into``)."""
    tokens = rope.rows
    if tokens == 1:
        first = h * m.plan.tokens * 4 * d
        return [RequantOp(m.plan.tokens, d, m.plan.act_row_bytes,
                          symbols.within(rope.y, first), m.x, amax, True,
                          within=(rope.y, first))]
    out = []
    per = m.plan.tokens // tokens  # query heads per member
    for g in range(per):
        first, row = (h * per + g) * 4 * d, g * tokens
        out.append(RequantOp(tokens, d, m.plan.act_row_bytes, symbols.within(rope.y, first),
                             symbols.within(m.x, row * m.plan.act_row_bytes),
                             None if amax is None else
                             symbols.within(amax, row * cfg.beat_bytes), True,
                             within=(rope.y, first), x_row_bytes=rope.row_bytes,
                             into=(m.x, amax, row)))
    return out


def _values_entry(work: Sequence[tuple], j: int) -> int | None:
    """The entry of ``work`` of the ``attn_values`` node that reads softmax entry ``j``'s
    output in the same phase and context bucket, with one member per row range of it whose
    ``K`` is the softmax's row (None: none)."""
    phase, node, bucket, (vec,) = work[j]
    for k, (ph, n, b, members) in enumerate(work):
        if (ph, b) == (phase, bucket) and n.op == "attn_values" \
                and n.inputs[0] == node.outputs[0] \
                and sum(m.plan.tokens for m in members) == vec.rows \
                and all(m.plan.layout.k == vec.length for m in members):
            return k
    return None


def values_parts(cfg: AcceleratorConfig, work: Sequence[tuple], k: int, softmax: VectorOp
                 ) -> tuple[list[RequantOp], list[tuple[Part, ...]]]:
    """The FOLD and DEQUANT parts around the values program of entry ``k``, which reads the
    probabilities ``softmax`` writes: per member, a FOLD of its rows of them (``within``
    the softmax's results, as the scores' DEQUANTs write its input) times the value codes
    of its kv head (:func:`sw.compile.symbols.value_codes`, the host's) into the member's
    INT8 rows, leaving FOLD's ``amax`` words; and its *outputs*: a DEQUANT of its
    accumulators with the constant channel words :func:`hw.numerics.values_channel` and
    those words into Q15.16 rows (:func:`hw.numerics.values_vector`), after, where the
    values are split by position residue (:func:`sw.compile.lower.value_residue`: ``R *
    head_dim`` accumulators a row), an ADD per halving of the partial rows left
    (``halves``: log2 R of them) that leaves their sum in each row's first ``head_dim``
    and the DEQUANT reads there: the first from the accumulators into rows of their own
    (``"r"``, laid out as the accumulators; so it writes nothing the GEMM part moves and
    may run beside it, :func:`_may_run_beside`), the others in place."""
    phase, node, _, members = work[k]
    per = len(members) // node.attrs["kv_heads"]  # operand heads per kv head
    fold, deq, at = [], [], 0
    for h, m in enumerate(members):
        n, length = node.attrs["head_dim"], softmax.length
        acc, adds, half = m.y, [], m.plan.n
        while half > n:
            half //= 2
            folded = symbols.buffer("r", phase, node.name, h)
            adds.append(VectorOp(VecFunc.ADD, m.plan.tokens, half, m.plan.out_row_bytes, acc,
                                 folded, halves=True))
            acc = folded
        qmax = ACT_QMAX if m.plan.fmt.bits == 8 else KV4_QMAX
        place = amax_place(cfg, length, m.plan.act_row_bytes)
        amax = symbols.buffer("a", phase, node.name, h)
        fold.append(RequantOp(m.plan.tokens, length, m.plan.act_row_bytes,
                              symbols.within(softmax.y, at), m.x,
                              amax if place.separate else None, True,
                              symbols.value_codes(node.attrs["layer"], h // per),
                              within=(softmax.y, at), w_bytes=row_bytes(cfg, length)))
        deq.append((*adds, DequantOp(m.plan.tokens, n, m.plan.out_row_bytes, row_bytes(cfg, n),
                                     place, acc, symbols.values_channels(qmax, n),
                                     amax if place.separate else m.x,
                                     symbols.buffer("q", phase, node.name, h),
                                     fold_qmax=qmax)))
        at += m.plan.tokens * softmax.row_bytes
    return fold, deq


def _folds_beside(cfg: AcceleratorConfig, members: Sequence[Member], length: int) -> bool:
    """Whether the vector engine's work on each scores member's rows -- their DEQUANT,
    SOFTMAX and FOLD of ``length`` elements (:func:`hw.timing.vec_cycles`) -- takes no longer
    than its keys take to stream (their bytes over the memory's beat): then the FOLDs too run
    beside the scores GEMMs and the memory stays the bound (an INT8 cache at a long
    context); else they would make the vector engine the bound there, and they run after
    (an INT4 cache, whose keys stream in half the time)."""
    work = sum(vec_cycles(Vec(func=f, length=length), cfg)
               for f in (VecFunc.DEQUANT, VecFunc.SOFTMAX, VecFunc.FOLD))
    return all(m.plan.tokens * work * cfg.beat_bytes * 8
               <= m.plan.n * m.plan.layout.k * m.plan.fmt.bits for m in members)


def _folds_after(parts: Sequence[Part], fold: Sequence[RequantOp]) -> list[Part]:
    """``parts`` (a scores program's, each member's SOFTMAX slice after its DEQUANT) with
    ``fold`` (a FOLD per values member) after them: each FOLD right after the SOFTMAX of the
    same rows where the members' rows match (the FOLD then runs beside the next heads'
    scores GEMMs, :func:`_may_run_beside`), else all of them at the end."""
    soft = [k for k, p in enumerate(parts) if isinstance(p, VectorOp) and p.within is not None]
    if len(soft) != len(fold) or any(parts[k].within[1:] != f.within or parts[k].rows != f.rows
                                     for k, f in zip(soft, fold, strict=True)):
        return [*parts, *fold]
    out = list(parts)
    for k, f in reversed(list(zip(soft, fold, strict=True))):
        out.insert(k + 1, f)
    return out


#: The most positions (the scores' row length) at which attention's values are woven a head at
#: a time (:func:`_values_woven`); at more, every head's values GEMM is one part after the
#: FOLDs, as the vector engine's work then hides beside the longer scores GEMMs and a values
#: part per head only adds its drain. A measured fit: the reference model's step (context
#: 128) 109,440 -> 108,772 cycles woven, and ``python -m bench.beats --context 256`` 136,784
#: -> 134,072; LLaMA-7B's on DDR4-class (2:4 INT4, INT4 KV cache, ``bench.scaling.run_step``)
#: at context 128 unchanged and at 2048 162.81 -> 168.35 ms.
WEAVE_POSITIONS = 256


def _values_woven(parts: Sequence[Part], fold: Sequence[RequantOp], values: Sequence[Member],
                  vdeq: Sequence[tuple[Part, ...]]) -> tuple[Part, ...] | None:
    """``parts`` (a scores program's: its REQUANTs, its GEMM, each member's DEQUANT and
    SOFTMAX slice) and the values program's (``fold``, ``values``, ``vdeq``: a FOLD, a member
    and its outputs' parts per kv head, :func:`values_parts`) woven a head at a time: head
    ``h``'s values GEMM, a part of its own, right after its FOLD, and head ``h + 1``'s
    DEQUANT, SOFTMAX and FOLD after that GEMM, then head ``h``'s values outputs (its fold's
    ADDs, its DEQUANT), so the vector engine works on the next head while the
    array computes this head's values (:func:`_may_run_beside`) instead of the array waiting
    for every head's FOLD. None where the heads do not pair up (a FOLD per SOFTMAX slice of
    the same rows, a values member per FOLD)."""
    soft = [k for k, p in enumerate(parts) if isinstance(p, VectorOp) and p.within is not None]
    if not (len(soft) == len(fold) == len(values) == len(vdeq) > 1) or any(
            parts[k].within[1:] != f.within or parts[k].rows != f.rows
            for k, f in zip(soft, fold, strict=True)):
        return None
    out = list(parts[:soft[0] + 1])
    for h in range(len(fold)):
        if h:  # the next head's DEQUANT and SOFTMAX beside this head's values GEMM
            out += parts[soft[h - 1] + 1:soft[h] + 1]
        out += [fold[h], (values[h],)]
        if h:  # after the next values GEMM's operands: its weights stream right after FOLD's
            out += vdeq[h - 1]
    out += [*vdeq[-1], *parts[soft[-1] + 1:]]
    return tuple(out)


def scores_groups(cfg: AcceleratorConfig, work: Sequence[tuple]) -> list[FusedGroup]:
    """The fused programs of attention's scores and softmax: per ``attn_scores`` entry of
    ``work`` (``(phase, node, bucket, members)``) whose output one softmax entry of the same
    phase and context bucket reads, the scores GEMM (one member per operand head), a DEQUANT
    per member and the SOFTMAX; where an ``attn_values`` entry of that bucket reads the
    softmax's results, its program too, between a FOLD and a DEQUANT per member
    (:func:`values_parts`): attention in one program per layer and bucket.

    A member's DEQUANT turns its integer scores (``G * T`` rows of the bucket's positions)
    into the softmax's input rows on chip (:func:`hw.numerics.scores_vector`): its channel
    words the key scales of its kv head with the softmax scale folded in
    (:func:`sw.compile.symbols.score_channels`, one region per kv head written as the cache
    grows: by the host's append or the on-chip one), its ``amax`` words the query rows'
    (written by the host with the INT8 rows, :data:`SCORES_AMAX`), its results the member's
    rows of the softmax's input (``within``: the members' rows in order are the softmax's,
    query head ``h`` of kv head ``h // G``, as :func:`hw.numerics.group_rows` stacks them).
    The SOFTMAX's valid counts stay run-time ``imm`` words the host sets.

    Where the query is a rope node's results, a token's heads in one row of whole beats per
    head (:func:`_query_rows`), REQUANT parts first requantise each member's rows from there
    on chip (:func:`query_requants`: one per member in a decode step, one per query head in
    a prefill; ``within`` that rope's results, which then live until this program has run)
    and leave the ``amax`` words for the DEQUANT: the host writes neither the INT8 query
    rows nor their ``amax``."""
    out = []
    for i, (phase, node, bucket, members) in enumerate(work):
        if node.op != "attn_scores" or bucket is None:
            continue
        j = _softmax_entry(work, i)
        if j is None:
            continue
        vec = work[j][3][0]
        if sum(m.plan.tokens for m in members) != vec.rows or any(
                m.plan.n != vec.length for m in members):
            continue
        per = len(members) // node.attrs["kv_heads"]  # operand heads per kv head
        rope, d = _query_rows(cfg, work, i), node.attrs["head_dim"]
        req, deq, at = [], [], 0
        for h, m in enumerate(members):
            place, amax = SCORES_AMAX, symbols.buffer("a", phase, node.name, h)
            rows = replace(vec, rows=m.plan.tokens, x=symbols.within(vec.x, at),
                           y=symbols.within(vec.y, at), within=(vec.x, vec.y, at))
            if rope is not None:  # its heads' rows of the rope's results, requantised
                place = amax_place(cfg, d, m.plan.act_row_bytes)
                req += query_requants(cfg, rope, m, h, d, amax if place.separate else None)
                amax = amax if place.separate else m.x
            deq.append(DequantOp(m.plan.tokens, m.plan.n, m.plan.out_row_bytes, vec.row_bytes,
                                 place, m.y,
                                 symbols.score_channels(node.attrs["layer"], h // per),
                                 amax, symbols.within(vec.x, at), host=True,
                                 within=(vec.x, at)))
            deq.append(rows)  # its rows' SOFTMAX: beside the next members' GEMMs
            at += m.plan.tokens * vec.row_bytes
        parts = (*req, tuple(members), *deq)
        owners = (None,) * len(req) + (0,) + (None,) * len(deq)
        k = _values_entry(work, j)
        if k is None:
            out.append(FusedGroup((i, j), parts, owners))
            continue
        fold, outs = values_parts(cfg, work, k, vec)
        vdeq = [p for ps in outs for p in ps]
        woven = _values_woven(parts, fold, work[k][3], outs) \
            if vec.length <= WEAVE_POSITIONS else None
        if woven is not None:
            both = FusedGroup((i, j, k), woven, tuple(  # the scores GEMM, then values GEMMs
                0 if n == len(req) else 2 if isinstance(p, tuple) else None
                for n, p in enumerate(woven)), fallback=(FusedGroup((i, j), parts, owners),))
            out.append(both)
            continue
        scores = _folds_after(parts, fold) if _folds_beside(cfg, members, vec.length) \
            else [*parts, *fold]
        both = FusedGroup((i, j, k), (*scores, tuple(work[k][3]), *vdeq),
                          owners + (None,) * len(fold) + (2,) + (None,) * len(vdeq),
                          fallback=(FusedGroup((i, j), parts, owners),))
        out.append(both)
    return out


def _layout_index(graph: Graph, value: str, source: str) -> torch.Tensor | None:
    """Where ``value``'s elements, row-major, lie in ``source`` (``[B, H, T, d]``:
    attention's output) as flat indices, where ``value`` is a layout-only view of it (the
    layout nodes' kernels applied to ``arange``; None: not so)."""
    src, chain = _layout_source(graph, value)
    shape = graph.values[source].shape
    if src != source or not chain or len(shape) != 4 or \
            not all(isinstance(n, int) for n in shape):
        return None
    x = torch.arange(int(np.prod(shape, dtype=np.int64))).reshape(tuple(shape))
    for n in chain:
        (x,) = OPS[n.op].kernel(n, [x], None)
    return x.reshape(-1)


def _flat_order(graph: Graph, value: str, source: str, kv_heads: int) -> bool:
    """Whether ``value`` is a layout-only view of ``source`` (``[B, H, T, d]``: attention's
    output) whose elements, row-major, are ``source``'s query heads grouped per kv head
    (:func:`hw.numerics.group_rows`), row-major: the values members' rows in order."""
    x = _layout_index(graph, value, source)
    return x is not None and torch.equal(x, torch.arange(x.numel()))


def _token_order(graph: Graph, value: str, source: str) -> bool:
    """Whether ``value`` is a layout-only view of ``source`` (``[B, H, T, d]``) whose
    elements, row-major, are each token's heads side by side (``source.transpose(1, 2)``,
    row-major: o_proj's input rows in a prefill)."""
    x = _layout_index(graph, value, source)
    if x is None:
        return False
    index = torch.arange(x.numel()).reshape(tuple(graph.values[source].shape))
    return torch.equal(x, index.transpose(1, 2).reshape(-1))


def _values_into(cfg: AcceleratorConfig, vdeq: Sequence[DequantOp], req: RequantOp,
                 tokens: int, d: int) -> list[DequantOp] | None:
    """The DEQUANT parts that write the values' rows (``vdeq``: per member, its query heads'
    ``tokens`` rows each of ``d`` words, head after head) as the rows ``req`` reads (a
    row per token, every head's ``d`` words side by side): per query head, a DEQUANT of its
    rows of its member's accumulators and FOLD ``amax`` words (``part_of``) into its column
    range of every token's row (``row_bytes`` the row, ``within`` at the head's column).
    None where a head's column range is not whole beats or the rows are not ``req``'s."""
    heads = sum(v.rows for v in vdeq) // tokens
    pitch = row_bytes(cfg, req.length)
    if row_bytes(cfg, d) != 4 * d or req.rows != tokens or req.length != heads * d \
            or any(v.rows % tokens or v.length != d for v in vdeq):
        return None
    out, head = [], 0
    for v in vdeq:
        step = v.place.stride * cfg.beat_bytes
        for g in range(v.rows // tokens):
            first, col = g * tokens, head * 4 * d
            out.append(replace(v, rows=tokens, row_bytes=pitch,
                               x=symbols.within(v.x, first * v.acc_row_bytes),
                               b=symbols.within(v.b, first * step),
                               y=symbols.within(req.x, col), within=(req.x, col),
                               part_of=(v.x, v.b, first)))
            head += 1
    return out


def attention_chains(cfg: AcceleratorConfig, graph: Graph, work: Sequence[tuple],
                     groups: Sequence[FusedGroup]) -> list[tuple[FusedGroup, FusedGroup]]:
    """Attention programs of ``groups`` (:func:`scores_groups` with a values program) and
    the chain after each (:func:`fusion_groups`, headed by a REQUANT of the host's rows) as
    one program: ``(attention, merged)`` pairs, ``merged`` falling back to ``attention``.

    They merge where the chain's head linear reads the values node's output through layout
    nodes (``graph``'s) and every such row, and the head's rows, are whole beats (``4 *
    length`` bytes apart). Where its elements, in order, are the values members' rows in
    order (a decode step: one token, the heads side by side, :func:`_flat_order`), each
    values member's DEQUANT writes its rows inside the head's input buffer (``within``, in
    member order); where they are each token's heads side by side (a prefill,
    :func:`_token_order`: the members' rows are a head's tokens), the values DEQUANTs keep
    their rows (the host reads them back) and a DEQUANT per query head writes its column
    range of the head's input rows too (:func:`_values_into`). The head's REQUANT reads that
    buffer on chip. The chain's residual rows (:attr:`FusedGroup.residual`) are read as the
    chain alone reads them."""
    heads = {g.entries[0]: g for g in groups
             if isinstance(g.parts[0], RequantOp) and g.parts[0].host}
    out = []
    for a in groups:
        if len(a.entries) != 3 or work[a.entries[0]][1].op != "attn_scores":
            continue
        phase, vnode, _, vmembers = work[a.entries[2]]
        vdeq = [p for p in a.parts if isinstance(p, DequantOp) and p.fold_qmax]
        source = vnode.outputs[0]
        flat = {e: _flat_order(graph, work[e][1].inputs[0], source, vnode.attrs["kv_heads"])
                for e in heads if work[e][0] == phase}
        chain = next((heads[e] for e, f in flat.items() if f or _token_order(
            graph, work[e][1].inputs[0], source)), None)
        if chain is None or len(vdeq) != len(vmembers):
            continue
        req = chain.parts[0]
        if flat[chain.entries[0]]:
            if row_bytes(cfg, req.length) != 4 * req.length or req.rows * req.length != sum(
                    d.rows * d.length for d in vdeq) or any(
                    d.row_bytes != 4 * d.length for d in vdeq):
                continue
            parts, at = [], 0
            for p in a.parts:
                if isinstance(p, DequantOp) and p.fold_qmax:
                    p = replace(p, y=symbols.within(req.x, at), within=(req.x, at))
                    at += p.data_bytes
                parts.append(p)
        else:
            _, _, t, d = graph.values[source].shape
            into = _values_into(cfg, vdeq, req, t, d)
            if into is None:
                continue
            parts = [*a.parts, *into]
        head = replace(req, x=symbols.within(req.x, 0), within=(req.x, 0), host=False)
        n = len(a.entries)
        merged = FusedGroup(a.entries + chain.entries, (*parts, head, *chain.parts[1:]),
                            a.owners + (None,) * (len(parts) - len(a.parts))
                            + tuple(None if o is None else o + n for o in chain.owners),
                            fallback=(a,), residual=chain.residual)
        out.append((a, merged))
    return out


def all_groups(groups: Iterable[FusedGroup]) -> list[FusedGroup]:
    """``groups``, each followed by its :attr:`FusedGroup.attention` groups and their
    fallbacks: every fused program the compiler may build (a chain's own fallbacks are its
    parts' subsets)."""
    out = []
    for g in groups:
        out.append(g)
        for m in g.attention:
            out += [m, *m.fallback]
    return out
