"""Round trips through DRAM that become on-chip moves (VOUT -> VIN, :data:`hw.isa.MOVE_SPAD`).

A fused program's parts meet in DRAM (:mod:`sw.compile.fusion`): a vector part STOREs its
VOUT rows and the vector part after it LOADs them back into VIN (RMSNorm -> REQUANT, the
scores' DEQUANT -> SOFTMAX -> FOLD, the residual ADD -> the next norm). The STORE engine can
write those beats into VIN itself, a beat a cycle (a *move*, :func:`hw.isa.is_move`), so
the LOAD's DRAM read goes. :func:`onchip_moves` rewrites each such pair that it can prove
safe from the program's words alone:

* the STORE ``S`` (VOUT) stays, so DRAM holds what the host reads back;
* a move ``M`` of the same rows goes right after ``S`` (the STORE engine is in order, so it
  reads the VOUT beats ``S`` read) and takes over ``S``'s signal, so whatever waited on
  ``S``'s completion now waits on ``M``'s;
* the LOAD ``L`` becomes a SYNC on the LOAD engine with ``L``'s wait and signal: the LOAD
  engine still raises ``L``'s signal in order, after every LOAD before it has landed.

``M`` writes VIN when ``S`` is done, earlier than ``L`` did: a LOAD into VIN still in flight
then (hoisted above the boundary, :func:`sw.compile.fusion.hoistable`) would write VIN in
the same cycles (VIN has one DMA write port), so where one may be, a SYNC on the LOAD engine
right after the last such LOAD ``X`` signals :data:`MOVE_EVENT` (LOAD -> STORE), which ``M``
waits on: the LOAD engine raises it once every LOAD up to ``X`` has landed (it is in order).

A pair qualifies (:func:`_safe`) where

1. ``S`` and ``L`` name the same DRAM rows (address, register, rows, row beats, stride; rows
   that do not overlap), ``S`` waits on a VEC's signal and signals an event, and no LOAD
   into VIN between the boundary (rule 3) and ``L`` writes ``L``'s VIN beats (it runs after
   ``M``, where it ran before ``L``);
2. no STORE-engine word and no VEC lies between them in program order, nor a VEC between
   the one ``S`` waits on and ``S`` (``S`` is the last writer of the rows; ``M`` follows
   ``S`` at once on the STORE engine; the vector engine is in order, so when ``S`` starts
   every VEC before it is done and none reads VIN or writes VOUT until ``L``'s consumer);
3. a LOAD-engine word between them waits on the signal of ``S`` (the boundary between two
   parts, :func:`sw.compile.fusion.fuse_parts`), so every LOAD-engine word after it runs
   after ``M`` has written VIN; the LOAD-engine words landed when ``S`` starts are those up
   to the latest one a VEC up to ``S``'s waits on, and ``X`` is the last LOAD into VIN
   after those and before the boundary; no LOAD-engine word from ``S`` to ``X`` waits on a
   word after ``S`` (``M`` holds the STORE engine until the LOAD engine passes ``X``), and
   the ``X`` of each pair lies after the one before's (the SYNCs signal in the order the
   moves wait);
4. the event ``L`` waits on (a VEC's ``FREE``: the beats it overwrites are read by then),
   if any, is signalled by a word already complete when ``M`` starts.

Events are counting semaphores with one producer and one consumer engine each
(:mod:`hw.events`), so the ``k``-th wait on an event is granted by its ``k``-th signal, in
program order (:func:`_matches`): the proof needs no timing. A move goes in after each rewritten
STORE, its SYNC after ``X``; the returned index map says where every input
word lies in the output (for the runtime's per-step words).

The STORE ``S`` stays for the host; where nobody reads its rows -- no later LOAD, no LOAD
of the next step's run before the step writes them, not the host (the caller's ``live``
beats) -- :func:`quiet_stores` finds it and :func:`quieten` makes it a SYNC of the STORE
engine with ``S``'s wait and signal: the move then starts as soon as the VEC is done, and
no event count or word index changes.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

import numpy as np

from hw.config import AcceleratorConfig
from hw.engines import engines_fields
from hw.isa import (
    MOVE_SPAD,
    NO_EVENT,
    Engine,
    Load,
    Spad,
    Store,
    Sync,
    decode,
    decode_fields,
    loop_stream,
    program_words,
)
from sw.compile.fusion import BESIDE_EVENTS

#: The event a move (LOAD -> STORE) waits on: raised by a SYNC of the LOAD engine right
#: before the boundary the move's signal ends, once every LOAD before has landed. The one
#: after the fused programs' (:data:`sw.compile.fusion.BESIDE_EVENTS`).
MOVE_EVENT = max(BESIDE_EVENTS.values()) + 1

__all__ = ["MOVE_EVENT", "onchip_moves", "quiet_stores", "quieten", "round_trips"]


def _matches(f) -> np.ndarray:
    """Per word of fields ``f``, the index of the word whose signal grants its wait (the
    ``k``-th signal of the event for its ``k``-th wait, program order), -1 where it waits on
    nothing or on a signal no word raises (a count seeded otherwise)."""
    out = np.full(f["opcode"].shape[0], -1, dtype=np.int64)
    signals: dict[int, list[int]] = {}
    for i, e in enumerate(f["signal"].tolist()):
        if e != NO_EVENT:
            signals.setdefault(e, []).append(i)
    seen: dict[int, int] = {}
    for i, e in enumerate(f["wait"].tolist()):
        if e == NO_EVENT:
            continue
        k = seen.get(e, 0)
        seen[e] = k + 1
        if k < len(signals.get(e, ())):
            out[i] = signals[e][k]
    return out


def round_trips(words: np.ndarray) -> list[tuple[int, int | None, int]]:
    """The ``(S, X, L)`` index triples of ``words`` (``uint64 [n, 2]``) that
    :func:`onchip_moves` rewrites: a STORE of VOUT rows, the last LOAD into VIN that may
    still be in flight when ``S`` starts (None: none) and the LOAD of the same rows into
    VIN, each safe by the module's rules, in order."""
    f = decode_fields(words)
    eng = engines_fields(f)
    ins = [decode(int(lo) | int(hi) << 64) for lo, hi in words]
    match = _matches(f)
    out: list[tuple[int, int | None, int]] = []
    last = -1  # the last X: the SYNCs after them signal in the order the moves wait
    for s, st in enumerate(ins):
        if not (isinstance(st, Store) and st.spad == Spad.VOUT) or st.signal is None:
            continue
        for t in range(s + 1, len(ins)):
            if eng[t] in (Engine.STORE.value, Engine.VECTOR.value):
                break
            ld = ins[t]
            if isinstance(ld, Load) and ld.spad == Spad.VIN and _same_rows(st, ld):
                x = _safe(ins, eng, match, s, t)
                if x is not False and (x is None or x > last):
                    out.append((s, x, t))
                    last = last if x is None else x
                break
    return out


def _same_rows(st: Store, ld: Load) -> bool:
    return ((st.dram_addr, st.reg, st.rows, st.row_beats, st.dram_stride)
            == (ld.dram_addr, ld.reg, ld.rows, ld.row_beats, ld.dram_stride)
            and (ld.rows == 1 or ld.dram_stride >= ld.row_beats))


def _vin_load(x) -> bool:
    return isinstance(x, Load) and x.spad == Spad.VIN


def _safe(ins: Sequence, eng: np.ndarray, match: np.ndarray, s: int, t: int
          ) -> int | None | bool:
    """Where the STORE ``s`` and the LOAD ``t`` of ``ins`` meet the module's rules 1-4
    (rule 2's first half is the caller's): the last LOAD into VIN that may be in flight
    when ``s`` starts (None where none is), else False."""
    st, ld = ins[s], ins[t]
    if not _same_rows(st, ld) or st.wait is None:
        return False
    v = int(match[s])  # the VEC S waits on
    if v < 0 or eng[v] != Engine.VECTOR.value or any(
            eng[j] == Engine.VECTOR.value for j in range(v + 1, s)):
        return False
    b = next((j for j in range(s + 1, t) if eng[j] == Engine.LOAD.value and match[j] == s),
             None)
    if b is None:
        return False
    lo, hi = ld.spad_addr, ld.spad_addr + ld.rows * ld.row_beats
    if any(_vin_load(x) and x.spad_addr < hi and lo < x.spad_addr + x.rows * x.row_beats
           for x in ins[b:t]):
        return False  # (a LOAD after the move overwrites the beats it wrote)
    # landed when S starts: every LOAD-engine word up to the latest one a VEC up to v waits on
    u = max((int(match[j]) for j in range(v + 1) if eng[j] == Engine.VECTOR.value
             and match[j] >= 0 and eng[match[j]] == Engine.LOAD.value), default=-1)
    x = next((j for j in range(b - 1, u, -1) if _vin_load(ins[j])), None)
    if x is not None and any(eng[j] == Engine.LOAD.value and match[j] > s
                             for j in range(s, x + 1)):
        return False  # (the LOAD engine would wait on the STORE engine the move holds)
    if ld.wait is not None:  # granted by a word complete when M starts
        w = int(match[t])
        if w < 0 or not (eng[w] == Engine.VECTOR.value and w <= v
                         or eng[w] == Engine.STORE.value and w < s
                         or eng[w] == Engine.LOAD.value and w <= max(u, x or -1)):
            return False
    return x


def onchip_moves(cfg: AcceleratorConfig, words: np.ndarray, keep: Collection[int] = ()
                 ) -> tuple[np.ndarray, tuple[int, ...]]:
    """``words`` (``uint64 [n, 2]``) with every :func:`round_trips` triple whose STORE and
    LOAD are not in ``keep`` (words the runtime rewrites per step) rewritten as the module
    says: a move after the STORE, carrying its signal (and, where a LOAD into VIN may be in
    flight, waiting on :data:`MOVE_EVENT`, which a SYNC of the LOAD engine right after that
    LOAD signals), and the LOAD as a SYNC with its wait and signal (unchanged where ``cfg``
    has no :data:`MOVE_EVENT`). Returns the words and, per input word, its index in them."""
    found = [(s, x, t) for s, x, t in round_trips(words) if s not in keep and t not in keep]
    if not found or cfg.num_events <= MOVE_EVENT:
        return words, tuple(range(words.shape[0]))
    stores = {s: (x, t) for s, x, t in found}
    flights = {x for _, x, _ in found if x is not None}
    loads = {t for _, _, t in found}
    out, where = [], []
    for i, w in enumerate(words):
        ins = decode(int(w[0]) | int(w[1]) << 64)
        where.append(len(out))
        if i in loads:
            out.append(Sync(engine=Engine.LOAD, wait=ins.wait, signal=ins.signal))
        elif i in stores:
            x, t = stores[i]
            ld = decode(int(words[t, 0]) | int(words[t, 1]) << 64)
            out += [replace(ins, signal=None),
                    Store(spad=MOVE_SPAD, spad_addr=ins.spad_addr, dram_addr=ld.spad_addr,
                          rows=ld.rows, row_beats=ld.row_beats, dram_stride=ld.row_beats,
                          wait=None if x is None else MOVE_EVENT, signal=ins.signal)]
        else:
            out.append(ins)
        if i in flights:
            out.append(Sync(engine=Engine.LOAD, signal=MOVE_EVENT))
    return program_words(out), tuple(where)


def _ranges(ins: Load | Store, offset: int = 0) -> list[tuple[int, int]]:
    """The DRAM beats a LOAD or STORE of ``ins`` addresses (``offset`` beats on, a loop's
    iteration), one ``[lo, hi)`` per row."""
    a = ins.dram_addr + offset
    return [(a + r * ins.dram_stride, a + r * ins.dram_stride + ins.row_beats)
            for r in range(ins.rows)]


def quiet_stores(words: np.ndarray, keep: Collection[int] = (),
                 live: Sequence[tuple[int, int]] = ()) -> list[int]:
    """The STOREs of ``words`` (``uint64 [n, 2]``, REPEATs allowed) whose DRAM rows nobody
    needs: each a STORE of VOUT rows right before a move of the same VOUT beats (the rows go
    on chip, :func:`onchip_moves`), not in ``keep`` (words the runtime rewrites per step),
    and such that in every iteration it runs (:func:`hw.isa.loop_stream`)

    * no later LOAD of the program reads one of its beats before a STORE writes it again;
    * no LOAD reads one of its beats before any STORE of the program writes it (the next
      step's run of the same words would read what this one left: rows written across
      steps, such as the KV cache's, stay);
    * none of its beats lies in ``live`` (``[lo, hi)`` DRAM beat ranges the host reads
      back or a run-time word may address: the caller's).

    The STORE engine is in order and the move reads the VOUT beats the STORE would, so the
    STORE can go (:func:`quieten`) without changing what any word reads."""
    f = decode_fields(words)
    n = f["opcode"].shape[0]
    ins = [decode(int(lo) | int(hi) << 64) for lo, hi in words]
    cand = [i for i in range(n - 1) if i not in keep
            and isinstance(ins[i], Store) and ins[i].spad == Spad.VOUT
            and isinstance(ins[i + 1], Store) and ins[i + 1].spad == MOVE_SPAD
            and ins[i + 1].spad_addr == ins[i].spad_addr]
    if not cand:
        return []
    candset = set(cand)
    stream = loop_stream(f, np.zeros(n, dtype=np.int64))
    # the beats the candidates write, in any iteration: the only ones tracked
    pcs, offs = stream.pcs.tolist(), stream.offsets.tolist()
    tracked = np.unique(np.concatenate([
        np.arange(lo, hi) for e, pc in enumerate(pcs) if pc in candset
        for lo, hi in _ranges(ins[pc], offs[e])]))

    def hits(x, offset: int) -> np.ndarray:
        return np.concatenate([tracked[np.searchsorted(tracked, lo):np.searchsorted(tracked, hi)]
                               for lo, hi in _ranges(x, offset)])
    writer: dict[int, int] = {}  # tracked beat -> the stream entry of its last STORE
    read, exposed = set(), set()
    for e, pc in enumerate(pcs):
        x = ins[pc]
        if isinstance(x, Load):
            for b in hits(x, offs[e]).tolist():
                w = writer.get(b)
                if w is None:
                    exposed.add(b)
                else:
                    read.add(w)
        elif isinstance(x, Store) and x.spad != MOVE_SPAD:
            for b in hits(x, offs[e]).tolist():
                writer[b] = e
    lo_hi = np.asarray(live, dtype=np.int64).reshape(-1, 2)
    bad = set()
    for e, pc in enumerate(pcs):
        if pc not in candset or pc in bad:
            continue
        beats = hits(ins[pc], offs[e])
        if e in read or exposed.intersection(beats.tolist()) or (
                (beats[:, None] >= lo_hi[:, 0]) & (beats[:, None] < lo_hi[:, 1])).any():
            bad.add(pc)
    return [i for i in cand if i not in bad]


def quieten(words: np.ndarray, rows: Collection[int]) -> np.ndarray:
    """``words`` with each STORE at ``rows`` (:func:`quiet_stores`) a SYNC of the STORE
    engine with its wait and signal: its events run as before, its DRAM write goes (and its
    index stays, so the run-time rows do not move)."""
    out = words.copy()
    for i in rows:
        st = decode(int(words[i, 0]) | int(words[i, 1]) << 64)
        out[i] = program_words([Sync(engine=Engine.STORE, wait=st.wait, signal=st.signal)])[0]
    return out
