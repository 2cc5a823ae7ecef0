"""The KV append on chip: one token's key and value rows into a layer's cache regions.

A decode step's new position scatters bytes over every kv head's cache (:class:`KVLayout`:
a key per channel record, a value record per ``lanes`` channels) and one value code word;
DMA moves whole beats and the DRAM port has no byte mask, so the append is a
read-modify-write through the vector engine (:data:`hw.isa.VecFunc.INSERT`; INSERT4 for
an INT4 cache's nibbles, :meth:`KVLayout.append_func`):

1. LOAD the token's key row (the rotated keys, Q15.16 words: the kv heads' ``head_dim``
   words side by side) and value row into VIN; one REQUANT per kv head and kind gives its
   int8 codes and ``amax`` (:func:`hw.numerics.quantize_activations_vector`, what the host's
   ``kv_rows(x, vector=True)`` computes); an INT4 cache's one KV4 (:func:`hw.numerics.vec_kv4`:
   the nibbles, a key row's group codes, ``amax``; what the host's ``kv4_rows_vector``
   computes); STORE them to a scratch buffer.
2. With the scores' channel words (a fused program whose scores DEQUANT reads them): LOAD
   each kv head's key ``amax`` word back (the beat holding it, from the scratch buffer), one
   CHANNEL per kv head (:data:`hw.isa.VecFunc.CHANNEL`: the word of the key scale times the
   softmax scale, :func:`hw.numerics.scores_channels_vector`, what the host's
   ``scores_channels_vector`` of the key row's ``amax`` gives), STORE them, a beat per kv
   head, into the scratch buffer after the REQUANT results.
3. Per kv head, LOAD its codes back (and its channel word's beat), the beats the position
   touches in its key and value regions, its value codes' beat and its channel words' beat
   (:meth:`KVLayout.append_transfer`; INT4 key records wider than a beat: a LOAD, INSERT4
   and STORE per group of records, :meth:`KVLayout.append_pieces`); one INSERT per region
   (:meth:`KVLayout.append_insert`): the codes into the loaded beats (an INT4 key's group
   codes into its groups' headers, a region "h" of its own), the ``amax``
   word into the value codes' beat (FOLD's value code of the row: :func:`append_value_code`),
   CHANNEL's word into the channel words' beat (laid out as the value codes: a word per
   position); STORE the beats back.

Where VIN has room above every task's beats for a group's phase-1 results and its channel
words, they do not go through the scratch buffer: phase 1 ends with a *move* of its results
from VOUT into that room (:data:`hw.isa.MOVE_SPAD`: a STORE into VIN, a beat per cycle, no
DRAM), phase 2's CHANNELs read the key ``amax`` words there (a SYNC on the LOAD engine takes
the move's signal in place of its LOAD) and move their words beside them, and phase 3's
INSERTs read the codes and words there: each kv head's task loads only the cache beats it
touches. That saves the scratch buffer's STOREs and LOADs, their DRAM bandwidth and the
memory latency of the LOADs that waited on them, and the buffer itself: an append whose
results move (:meth:`KVAppendOp.scratch_bytes` 0) has none in DRAM.

Phase 1 takes as many kv heads at a time as VIN and VOUT hold, each such group followed by
its heads' phase 2 and phase 3. Every task waits for the one before it (``FULL0``,
``OUT_FULL0``, ``STORED0`` as a vector program's; :data:`sw.compile.schedule.EVENTS`): the
append is a few hundred cycles a head and needs no double buffering. Except *early*: where
the results move and VIN (above the moved results) and VOUT also hold a slot per kv head of
the group, phase 3's cache beats read nothing the append writes, so every head's cache LOADs
go right after phase 1's row LOADs, each head's into its own VIN slot, and land while the
REQUANTs compute (phase 2's SYNC, or phase 3's, is raised once they have: the LOAD engine is
in order); the heads' INSERTs then run back to back, each head's into its own VOUT beats and
its STOREs on its own ``OUT_FULL0`` signal, one ``STORED0`` on the last STORE. A SYNC on the
LOAD engine that waits for nothing follows the last head's INSERTs: a fused program fills
the LOAD engine's idle after a part's last LOAD-engine word with LOADs of later parts
(:func:`sw.compile.fusion._slack`), which come behind every word of the append, and the
heads' INSERTs overlap the STOREs before them, so only the last head's STOREs are that idle.
Where the slots do not fit (LLaMA-7B's 32 kv heads, a head's beats about half of VOUT) but
the results move and VIN holds :data:`PIPELINE_SLOTS` slots, phase 3 is *pipelined*
(:func:`_pipelined`): a head at a time through VOUT, each INSERT followed by the STORE of
its piece, and the heads' cache beats loaded into the VIN slots in turn, a head ahead,
so the LOAD engine brings the next heads' beats while a head inserts and stores, and the
next head's INSERTs wait only for the head before's STOREs (on DDR4-class's 16x64 array,
LLaMA-7B shapes, 8-10k of the 14-15k cycles a layer's phase 3 took one head after the
other).

The program is built for position 0; a step's position moves each LOAD and STORE of the
cache and each INSERT's ``base`` by :meth:`KVLayout.append_site` alone
(:class:`AppendSite`: which words, which region), the one place the per-step rule lives,
which the runtime applies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

from hw.config import AcceleratorConfig
from hw.isa import (
    INSERT_FIELDS,
    MOVE_SPAD,
    End,
    Engine,
    Instr,
    Load,
    Spad,
    Store,
    Sync,
    Vec,
    VecFunc,
    insert_bad,
    insert_imm,
    kv4_imm,
    program_words,
    vec_out_words,
    vec_unaligned,
)
from hw.numerics import KV4_NIBBLES_PER_WORD
from sw.compile.errors import LoweringError
from sw.compile.lower import KVLayout
from sw.compile.schedule import EVENTS

__all__ = ["AppendSite", "KVAppendPlan", "KVAppendOp", "schedule_kv_append",
           "append_value_code", "kv_append_words"]

#: The regions a per-step word points into, as :meth:`KVLayout.append_site` names them: keys,
#: the INT4 keys' group codes (their headers), values, value codes and the scores' channel
#: words (a word per position, as the codes).
APPEND_KINDS = ("k", "h", "v", "c", "s")


@dataclass(frozen=True)
class AppendSite:
    """A word of an append program that a step's position moves: instruction ``index``, a
    LOAD or STORE (``field`` "dram_addr": plus the site's beats) or an INSERT ("imm": its
    ``base`` the site's byte) of region ``kind`` (:data:`APPEND_KINDS`)."""

    index: int
    kind: str
    field: str


@dataclass(frozen=True)
class KVAppendPlan:
    """Where one layer's append reads and writes (DRAM byte addresses, every one on a beat):
    the token's key row ``k_row`` and value row ``v_row`` (Q15.16 words, the kv heads side
    by side), a ``scratch`` buffer of :meth:`scratch_bytes` (None: none, for an append whose
    results move through VIN: :meth:`KVAppendOp.scratch_bytes`), and per kv head its key
    region, value region, value codes and scores' channel words (``keys``, ``values``, ``codes``,
    ``channels``; None: no value codes, no FOLD reads them; no channel words, no DEQUANT
    reads them), and the channel words' constant ``scale_word``
    (:func:`hw.numerics.scores_scale_word`)."""

    k_row: int
    v_row: int
    scratch: int | None
    keys: Sequence[int]
    values: Sequence[int]
    codes: Sequence[int] | None = None
    channels: Sequence[int] | None = None
    scale_word: int = 0

    @staticmethod
    def scratch_bytes(cfg: AcceleratorConfig, layout: KVLayout, kv_heads: int) -> int:
        """Bytes of the scratch buffer: one REQUANT (KV4) result (codes, then ``amax``) per kv
        head and kind, each in the whole beats of the larger, then a beat per kv head for its
        channel word."""
        return (2 * _codes_beats(cfg, layout) + 1) * kv_heads * cfg.beat_bytes


def _quantize(layout: KVLayout, kind: str) -> tuple[VecFunc, int]:
    """The VEC ``(func, imm)`` quantising a key (``kind`` "k") or value ("v") row of
    ``layout``: REQUANT (INT8), or KV4 with the keys' group (:func:`hw.isa.kv4_imm`)."""
    if layout.bits == 8:
        return VecFunc.REQUANT, 0
    group = layout.key_format.group if kind == "k" else None
    try:
        return VecFunc.KV4, kv4_imm(group)
    except ValueError as e:
        raise LoweringError(f"the KV append's INT4 keys of head_dim={layout.head_dim}: "
                            f"{e}") from None


def _out_words(layout: KVLayout, kind: str) -> int:
    """Words of the quantised row of ``kind`` (:func:`_quantize`): codes, then ``amax``."""
    func, imm = _quantize(layout, kind)
    return int(vec_out_words(func.value, layout.head_dim, imm))


def _codes_beats(cfg: AcceleratorConfig, layout: KVLayout) -> int:
    """Beats of one quantised row's result (the larger of a key's and a value's)."""
    per = cfg.beat_bytes // cfg.vin_word_bytes
    return -(-max(_out_words(layout, kind) for kind in "kv") // per)


def append_value_code(amax):
    """FOLD's value code of a value row appended on chip: REQUANT's ``amax`` itself (ints,
    arrays or tensors), :func:`hw.numerics.value_amax_torch` as the host's append and the twin
    compute it. The code of the row's scale (:func:`hw.numerics.value_codes` of
    ``act_scale(amax)``) equals it for ``0 < amax < 2**23`` only (an all-zero row's is
    ``127 * 2**16``)."""
    return amax


def _address(addr: int, beat: int, what: str) -> int:
    if addr % beat:
        raise LoweringError(f"the KV append's {what} at byte {addr} is not on a "
                            f"{beat}-byte beat")
    return addr // beat


class _Geometry(NamedTuple):
    """The shape of an append (:func:`_geometry`): words per beat ``per``, beats of a
    quantised row's result ``cw``, phase 3's region ``kinds`` with their transfers
    (``shapes``: :meth:`KVLayout.append_transfer`) and pieces (``pieces``:
    :meth:`KVLayout.append_pieces`), a piece's ``beats`` and VIN beats ``at``, the
    channel word's beat ``word_at``, kv heads per phase-1 group ``chunk``, the first VIN beat
    above every task's ``keep``, whether results move through VIN (``moved``), and where
    phase 3's cache beats load early (the module docstring) the first VIN beat of the
    group's slots (``early``: a kv head's ``word_at - 2 * cw`` beats of its regions' pieces
    each, its INSERTs' results as many VOUT beats from 0; None: a task at a time) and, where
    they load one kv head at a time, the first VIN beats of :data:`PIPELINE_SLOTS` slots its
    heads' cache beats take in turn (``ring``, :func:`_ring`; None: every head's in one)."""

    per: int
    cw: int
    kinds: list[str]
    shapes: dict[str, tuple[int, int, int]]
    pieces: dict[str, tuple[int, int]]
    beats: dict[str, int]
    at: dict[str, int]
    word_at: int
    chunk: int
    keep: int
    moved: bool
    early: int | None = None
    ring: tuple[int, ...] | None = None


#: VIN slots phase 3 loads one kv head's cache beats into in turn where it loads a head at a
#: time (:func:`_ring`): head ``h + 1``'s LOADs go while head ``h``'s INSERTs run, into the
#: slot of head ``h - 1``, whose INSERTs are done once its STOREs are.
PIPELINE_SLOTS = 2


def _ring(cfg: AcceleratorConfig, g: _Geometry, kv_heads: int) -> tuple[int, ...] | None:
    """The first VIN beats of phase 3's :data:`PIPELINE_SLOTS` slots where its results move
    (``g.moved``) and heads load their cache beats one at a time (``g.early`` None): the one
    above the codes' beats (``2 * g.cw``, where a head's task loads them alone) and the
    others a slot above the moved results and channel words (an INSERT reads its codes
    there, and no VIN beat within its row's length of them is loaded while it may run),
    where they fit VIN (None where not, or for a single kv head)."""
    if not g.moved or g.early is not None or kv_heads < 2:
        return None
    slot = g.word_at - 2 * g.cw
    top = g.keep + 2 * g.chunk * g.cw + g.chunk + slot
    if top + (PIPELINE_SLOTS - 1) * slot > cfg.spad_beats("vin"):
        return None
    return (2 * g.cw, *(top + i * slot for i in range(PIPELINE_SLOTS - 1)))


def _geometry(cfg: AcceleratorConfig, layout: KVLayout, kv_heads: int, codes: bool,
              channels: bool, moves: bool = True, early: bool = True,
              pipeline: bool = True) -> _Geometry:
    """The shape of the append of ``kv_heads`` kv heads of ``layout`` (with value codes,
    with scores' channel words), its results moved through VIN where they fit and ``moves``,
    phase 3's cache beats loaded early where they fit and ``early``, else with ``pipeline``
    a ring of VIN slots where it fits (:func:`_ring`; the module docstring): a function of
    the configuration and layout alone.

    Raises
    ------
    LoweringError
        No vector engine, an INSERT base too narrow for a beat, or a task that does not fit
        VIN or VOUT.
    """
    if not cfg.has_vector:
        raise LoweringError("the KV append on chip needs a vector engine")
    if layout.residue > 1:
        raise LoweringError(f"values split by residue {layout.residue} are sparse fields no "
                            "INSERT writes")
    beat, d = cfg.beat_bytes, layout.head_dim
    width, (unit, per_byte) = dict(INSERT_FIELDS)["base"], \
        ("nibble", 2) if layout.bits == 4 else ("byte", 1)
    if per_byte * beat > 1 << width:
        raise LoweringError(f"an INSERT's {width}-bit base cannot name every {unit} of a "
                            f"{beat}-byte beat ({per_byte * beat} of them)")
    per = beat // cfg.vin_word_bytes
    cw = _codes_beats(cfg, layout)
    vin, vout = cfg.spad_beats("vin"), cfg.spad_beats("vout")
    # -- phase 3's shape, per kv head: its codes and the touched beats in, INSERTs, out
    kinds = [kind for kind, there in zip(APPEND_KINDS, (True, layout.bits == 4, True,
                                                        codes, channels), strict=True)
             if there]
    shapes = {kind: layout.append_transfer(kind) for kind in kinds}
    pieces = {kind: layout.append_pieces(kind) for kind in kinds}
    beats = {kind: rows * rb for kind, (rows, rb, _) in shapes.items()}   # of one piece
    at, end = {}, 2 * cw
    for kind in kinds:
        at[kind], end = end, end + pieces[kind][0] * beats[kind]
    used = end + channels
    if used > vin or end - 2 * cw > vout:
        raise LoweringError(f"the KV append of a kv head ({used} VIN beats) does not fit VIN "
                            f"({vin} beats) and VOUT ({vout} beats)")
    # -- phase 1 takes as many kv heads as VIN and VOUT hold (whole beats of rows apart)
    fit = [m for m in range(1, kv_heads + 1)
           if 2 * -(-m * d // per) <= vin and 2 * m * cw <= vout]
    if not fit or (fit[-1] < kv_heads and (4 * d) % beat):
        raise LoweringError(f"the KV append's rows ({kv_heads} kv heads of head_dim={d}) do "
                            f"not fit VIN ({vin} beats) and VOUT ({vout} beats)")
    chunk = fit[-1]
    # With room in VIN above every task's beats (from `keep`), phase 1's results and phase
    # 2's channel words are moved there (hw.isa.MOVE_SPAD) and read in place: no round trip
    # through the scratch buffer.
    keep = max(used, 2 * -(-chunk * d // per))
    moved = moves and keep + 2 * chunk * cw + chunk <= vin
    # Where a slot per kv head of the group fits above the moved results too, phase 3's
    # cache beats load while phase 1 computes.
    slots, slot = keep + 2 * chunk * cw + chunk, end - 2 * cw
    fits = early and moved and slots + chunk * slot <= vin and chunk * slot <= vout
    g = _Geometry(per, cw, kinds, shapes, pieces, beats, at, end, chunk, keep, moved,
                  slots if fits else None)
    return g._replace(ring=_ring(cfg, g, kv_heads) if pipeline else None)


def schedule_kv_append(cfg: AcceleratorConfig, layout: KVLayout, kv_heads: int,
                       plan: KVAppendPlan, moves: bool = True, early: bool = True,
                       pipeline: bool = True) -> tuple[list[Instr], list[AppendSite]]:
    """The program (without END) appending one token's keys and values (INT8 or INT4) of
    ``kv_heads`` kv heads at position 0 (module docstring), and the words a step's position
    moves. With ``moves``, phases 1 and 2 hand their results on through VIN where they fit
    (the module docstring's moves); without, through the scratch buffer. With ``early`` (and
    the moves), phase 3's cache beats load while phase 1 computes where VIN and VOUT hold a
    slot per kv head of a phase-1 group; without, each head's task loads its own, with
    ``pipeline`` (and the moves) into a ring of VIN slots while the heads before insert
    (:func:`_ring`, the module docstring).

    Raises
    ------
    LoweringError
        No vector engine, an address off a beat, an INT4 key stream not in whole beats of
        records and headers, an INSERT geometry its fields cannot hold or the engine cannot
        walk, or a task that does not fit VIN or VOUT.
    """
    g = _geometry(cfg, layout, kv_heads, plan.codes is not None, plan.channels is not None,
                  moves, early, pipeline)
    beat, d, per, cw = cfg.beat_bytes, layout.head_dim, g.per, g.cw
    kinds, shapes, pieces, beats, at = g.kinds, g.shapes, g.pieces, g.beats, g.at
    chunk, keep, moved = g.chunk, g.keep, g.moved
    ev = {name: EVENTS[f"{name}0"] for name in ("FULL", "OUT_FULL", "STORED")}
    out: list[Instr] = []
    sites: list[AppendSite] = []

    def put(ins, site, wait=None, signal=None) -> None:
        if site is not None:
            sites.append(AppendSite(len(out), *site))
        out.append(replace(ins, wait=wait, signal=signal))

    def task(loads, vecs, stores, first: bool, early=()) -> None:
        """A task's words; ``early`` (LOADs that wait for nothing and signal nothing) go right
        after its loads, so its VECs start on its own loads' FULL signal."""
        for group, wait, signal in ((loads, None if first else ev["STORED"], ev["FULL"]),
                                    (early, None, None),
                                    (vecs, ev["FULL"], ev["OUT_FULL"]),
                                    (stores, ev["OUT_FULL"], ev["STORED"])):
            for k, (ins, site) in enumerate(group):
                put(ins, site, wait if k == 0 else None,
                    signal if k == len(group) - 1 else None)

    word_at = g.word_at                            # the kv head's channel word (its beat)
    amax_at = {kind: _out_words(layout, kind) - 1 for kind in "kv"}   # a result's amax word
    # the codes of the key and value rows (an INT4 key row's group codes after its nibbles);
    # the value row's amax word; the channel word
    code = {"k": 0, "h": -(-d // KV4_NIBBLES_PER_WORD), "v": cw * per,
            "c": cw * per + amax_at["v"], "s": word_at * per}
    imms, funcs = {}, {kind: layout.append_func(kind) for kind in kinds}
    for kind in kinds:
        try:
            imms[kind] = insert_imm(0, *layout.append_insert(kind))
        except ValueError as e:
            raise LoweringError(f"the KV append's {kind} INSERT: {e}") from None
        if insert_bad(funcs[kind].value, imms[kind]):
            raise LoweringError(f"the KV append's {kind} {funcs[kind].name} of geometry "
                                f"{layout.append_insert(kind)} is one the engine cannot walk")
    # the words of a piece's codes (nibbles of an INSERT4, bytes of an INSERT)
    codes_at = {}
    for kind in kinds:
        group, groups, _, _ = layout.append_insert(kind)
        per_word = cfg.vin_word_bytes * (2 if funcs[kind] == VecFunc.INSERT4 else 1)
        if pieces[kind][0] > 1 and (group * groups) % per_word:
            raise LoweringError(f"the KV append's {kind} pieces of {group * groups} codes "
                                f"are not whole words")
        codes_at[kind] = group * groups // per_word
    quantize = {kind: _quantize(layout, kind) for kind in "kv"}
    if not moved and plan.scratch is None:
        raise LoweringError("the KV append's results do not move through VIN "
                            f"({cfg.spad_beats('vin')} beats): it needs a scratch buffer")
    scratch = 0 if moved else _address(plan.scratch, beat, "scratch buffer")
    words = scratch + 2 * kv_heads * cw                          # the channel words' beats
    rows_at = [_address(a, beat, "row") for a in (plan.k_row, plan.v_row)]
    slot = g.word_at - 2 * cw             # a kv head's phase-3 beats (VIN and VOUT)

    def phase3(h: int, h0: int, m: int, vin0: int, vout0: int) -> tuple[list, list, list]:
        """Kv head ``h``'s (of the phase-1 group of ``m`` from ``h0``) phase-3 LOADs,
        INSERTs and STOREs, its cache beats loaded from VIN beat ``vin0`` and its INSERTs'
        results from VOUT beat ``vout0``."""
        region = {"k": plan.keys[h], "h": plan.keys[h], "v": plan.values[h],
                  "c": None if plan.codes is None else plan.codes[h],
                  "s": None if plan.channels is None else plan.channels[h]}
        loads = [(Load(spad=Spad.VIN, spad_addr=0, dram_addr=scratch + 2 * h * cw,
                       rows=1, row_beats=2 * cw), None)]
        if plan.channels is not None:
            loads.append((Load(spad=Spad.VIN, spad_addr=word_at, dram_addr=words + h,
                               rows=1, row_beats=1), None))
        # the INSERTs' codes: where the codes were loaded, or where they were moved
        src = code
        if moved:
            loads, base = [], (keep + 2 * (h - h0) * cw) * per
            src = {kind: base + code[kind] for kind in "khvc"}
            src["s"] = (keep + 2 * m * cw + h - h0) * per
        vecs, stores = [], []
        for kind, j in ((k, j) for k in kinds for j in range(pieces[k][0])):
            rows, row_beats, stride = shapes[kind]
            dram = _address(region[kind], beat, f"{kind} region of kv head {h}") \
                + layout.append_origin(kind) + j * pieces[kind][1]
            piece = at[kind] - 2 * cw + j * beats[kind]
            vin_at, dst = vin0 + piece, vout0 + piece
            loads.append((Load(spad=Spad.VIN, spad_addr=vin_at, dram_addr=dram,
                               rows=rows, row_beats=row_beats, dram_stride=stride),
                          (kind, "dram_addr")))
            vecs.append((Vec(func=funcs[kind], a_addr=vin_at * per,
                             b_addr=src[kind] + j * codes_at[kind],
                             length=beats[kind] * per, dst_addr=dst * per,
                             imm=imms[kind]), (kind, "imm")))
            stores.append((Store(spad=Spad.VOUT, spad_addr=dst, dram_addr=dram,
                                 rows=rows, row_beats=row_beats, dram_stride=stride),
                           (kind, "dram_addr")))
        return loads, vecs, stores

    for h0 in range(0, kv_heads, chunk):
        m = min(chunk, kv_heads - h0)
        rb = -(-m * d // per)
        # phase 1: REQUANT of the heads' key and value rows into the scratch buffer
        loads = [(Load(spad=Spad.VIN, spad_addr=i * rb, dram_addr=a + h0 * d // per, rows=1,
                       row_beats=rb), None) for i, a in enumerate(rows_at)]
        vecs = [(Vec(func=quantize[kind][0], a_addr=i * rb * per + j * d, length=d,
                     dst_addr=(2 * j + i) * cw * per, imm=quantize[kind][1]), None)
                for j in range(m) for i, kind in enumerate("kv")]
        for v, _ in vecs:   # (a head's row, head_dim words after the one before)
            if vec_unaligned(v.func.value, v.a_addr, v.b_addr, v.dst_addr, cfg.vector_lanes,
                             cfg.vector_laned_silu):
                raise LoweringError(f"the KV append's {v.func.name} of a kv head's row at "
                                    f"element {v.a_addr} (head_dim={d}) is not on a group of "
                                    f"the vector engine's {cfg.vector_lanes} lanes")
        stores = [(Store(spad=Spad.VOUT, spad_addr=0, dram_addr=scratch + 2 * h0 * cw,
                         rows=1, row_beats=2 * m * cw), None)]
        if moved:
            stores = [(Store(spad=MOVE_SPAD, spad_addr=0, dram_addr=keep, rows=1,
                             row_beats=2 * m * cw), None)]
        tasks = [] if g.early is None else [
            phase3(h, h0, m, g.early + (h - h0) * slot, (h - h0) * slot)
            for h in range(h0, h0 + m)]
        task(loads, vecs, stores, first=not out, early=[w for t in tasks for w in t[0]])
        # phase 2: the heads' scores channel words of their key rows' amax words, a beat each
        # (moved: read where phase 1's move put them, the words moved beside; a SYNC on the
        # LOAD engine passes the move's signal on to the VECs)
        if plan.channels is not None and moved:
            chan = keep + 2 * m * cw
            vecs = [(Vec(func=VecFunc.CHANNEL, a_addr=(keep + 2 * j * cw) * per + amax_at["k"],
                         length=1, dst_addr=j * per, imm=plan.scale_word), None)
                    for j in range(m)]
            stores = [(Store(spad=MOVE_SPAD, spad_addr=0, dram_addr=chan, rows=1,
                             row_beats=m), None)]
            task([(Sync(engine=Engine.LOAD), None)], vecs, stores, first=False)
        elif plan.channels is not None:
            loads = [(Load(spad=Spad.VIN, spad_addr=0,
                           dram_addr=scratch + 2 * h0 * cw + amax_at["k"] // per, rows=m,
                           row_beats=1, dram_stride=2 * cw), None)]
            vecs = [(Vec(func=VecFunc.CHANNEL, a_addr=j * per + amax_at["k"] % per, length=1,
                         dst_addr=j * per, imm=plan.scale_word), None) for j in range(m)]
            stores = [(Store(spad=Spad.VOUT, spad_addr=0, dram_addr=words + h0, rows=1,
                             row_beats=m), None)]
            task(loads, vecs, stores, first=False)
        if not tasks and (g.ring is None or m < 2):  # phase 3, a kv head at a time
            for h in range(h0, h0 + m):
                task(*phase3(h, h0, m, 2 * cw, 0), first=False)
            continue
        if not tasks:
            _pipelined([phase3(h, h0, m, g.ring[(h - h0) % len(g.ring)], 0)
                        for h in range(h0, h0 + m)], put, ev)
            continue
        # phase 3 early: every kv head's cache beats already in a VIN slot of its own (loaded
        # while phase 1 computes, after its LOADs: the SYNC of phase 2, or this one, is
        # raised once they landed) and its INSERTs' results in VOUT beats of its own, so the
        # heads' INSERTs run back to back, each head's STOREs on its own OUT_FULL signal,
        # one STORED signal on the last STORE (the STORE engine is in order) as a task's.
        # A SYNC on the LOAD engine that waits for nothing goes after the last head's
        # INSERTs: a fused program fills the LOAD engine's idle after its last word with
        # LOADs hoisted to the boundary after this part (sw.compile.fusion._slack: what the
        # other engines execute after that word), but those are dispatched behind every
        # word before them and the heads' INSERTs overlap the STOREs before them, so only
        # the last head's STOREs count
        put(Sync(engine=Engine.LOAD), None, ev["STORED"], ev["FULL"])
        for j, (_, vecs, stores) in enumerate(tasks):
            for k, (ins, site) in enumerate(vecs):
                put(ins, site, ev["FULL"] if j == k == 0 else None,
                    ev["OUT_FULL"] if k == len(vecs) - 1 else None)
            if j and j == m - 1:
                put(Sync(engine=Engine.LOAD), None)
            for k, (ins, site) in enumerate(stores):
                put(ins, site, ev["OUT_FULL"] if k == 0 else None,
                    ev["STORED"] if j == m - 1 and k == len(stores) - 1 else None)
    return out, sites


def _pipelined(tasks: Sequence[tuple[list, list, list]], put, ev: dict[str, int]) -> None:
    """Phase 3 of a group's kv heads, a head at a time, pipelined (the module docstring):
    ``tasks`` their ``(loads, vecs, stores)`` (:func:`schedule_kv_append`'s ``phase3``),
    each head's cache beats in its own slot of the ring (:data:`PIPELINE_SLOTS`), its
    INSERTs' results in the same VOUT beats; ``put(ins, site, wait, signal)`` emits a word.

    Each INSERT signals ``OUT_FULL`` and the STORE of its piece waits on it, so a head's
    STOREs follow its INSERTs piece by piece. The STORE engine reaches the LOAD engine
    alone (``STORED``) and the LOAD engine the vector engine (``FULL``), so a SYNC on the
    LOAD engine passes a head's last STORE on to the next head's first INSERT (VOUT is
    free, and its cache beats, loaded before the SYNC, have landed). The next head's LOADs
    go right after that SYNC, into the slot of the head before, whose INSERTs are done once
    its STOREs are, one after each INSERT and STORE in the program, so that neither waits
    in a full queue of the fetch unit for the other. The first head's LOADs wait for the
    task before (``STORED``), the last head's last STORE signals ``STORED`` as a task's."""
    n = len(tasks)
    for k, (ins, site) in enumerate(tasks[0][0]):
        put(ins, site, ev["STORED"] if k == 0 else None,
            ev["FULL"] if k == len(tasks[0][0]) - 1 else None)
    for h, (_, vecs, stores) in enumerate(tasks):
        if h:  # the head before's STOREs done, this head's beats landed
            put(Sync(engine=Engine.LOAD), None, ev["STORED"], ev["FULL"])
        pairs = list(zip(vecs, stores, strict=True))
        ahead = tasks[h + 1][0] if h + 1 < n else []
        for k in range(max(len(pairs), len(ahead))):
            if k < len(pairs):
                (vec, vsite), (st, ssite) = pairs[k]
                put(vec, vsite, ev["FULL"] if k == 0 else None, ev["OUT_FULL"])
                put(st, ssite, ev["OUT_FULL"],
                    ev["STORED"] if k == len(pairs) - 1 else None)
            if k < len(ahead):
                put(*ahead[k])


@dataclass(frozen=True)
class KVAppendOp:
    """The KV append part of a fused decode program (:func:`sw.compile.fusion.fusion_groups`):
    layer ``layer``'s ``kv_heads`` kv heads of ``layout``, the token's key row at symbol
    ``k`` (a ROPE part's results) and value row at ``v`` (a DEQUANT part's), a ``scratch``
    buffer (where it needs one: :meth:`scratch_bytes`), and per kv head the symbols of its
    keys, values, value codes and scores' channel words (``codes``: None where no FOLD reads
    them; ``channels``: None where no scores DEQUANT reads them), and the channel words'
    constant ``scale_word``
    (:func:`hw.numerics.scores_scale_word` of the layer's softmax scale)."""

    layer: int
    kv_heads: int
    layout: KVLayout
    k: str
    v: str
    scratch: str
    keys: tuple[str, ...]
    values: tuple[str, ...]
    codes: tuple[str, ...] | None = None
    channels: tuple[str, ...] | None = None
    scale_word: int = 0

    @property
    def signature(self) -> tuple:
        """What the instructions depend on, addresses aside."""
        return ("kv_append", self.kv_heads, self.layout, self.codes is not None,
                self.channels is not None, self.scale_word)

    def scratch_bytes(self, cfg: AcceleratorConfig) -> int:
        """Bytes of its scratch buffer in DRAM: :meth:`KVAppendPlan.scratch_bytes`, or 0
        where its results move through VIN and no word reads or writes one (then neither
        does the append of the op without value codes or channel words: fewer beats)."""
        try:
            moved = _geometry(cfg, self.layout, self.kv_heads, self.codes is not None,
                              self.channels is not None).moved
        except LoweringError:  # no program appends it as it is
            moved = False
        return 0 if moved else KVAppendPlan.scratch_bytes(cfg, self.layout, self.kv_heads)

    def refusal(self, cfg: AcceleratorConfig) -> str | None:
        """Why no program appends this op on ``cfg`` (the :class:`LoweringError` of
        :func:`kv_append_words` with every symbol at address 0: its geometry alone), or
        None where one does; with its value codes and channel words as it names them."""
        names = [self.k, self.v, self.scratch, *self.keys, *self.values, *(self.codes or ()),
                 *(self.channels or ())]
        try:
            kv_append_words(cfg, self, dict.fromkeys(names, 0))
        except LoweringError as e:
            return str(e)
        return None


def kv_append_words(cfg: AcceleratorConfig, op: KVAppendOp, addr) -> tuple[np.ndarray,
                                                                            list[AppendSite]]:
    """The encoded program (END last) of ``op`` at the symbols' addresses ``addr`` (symbol ->
    byte address; its scratch buffer's where it has one, :meth:`KVAppendOp.scratch_bytes`), and
    its per-step words (:func:`schedule_kv_append`)."""
    plan = KVAppendPlan(addr[op.k], addr[op.v], addr.get(op.scratch),
                        [addr[s] for s in op.keys], [addr[s] for s in op.values],
                        None if op.codes is None else [addr[s] for s in op.codes],
                        None if op.channels is None else [addr[s] for s in op.channels],
                        op.scale_word)
    program, sites = schedule_kv_append(cfg, op.layout, op.kv_heads, plan)
    return program_words([*program, End()]), sites
