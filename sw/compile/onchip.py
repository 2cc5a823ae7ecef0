"""Round trips through DRAM that become on-chip moves (VOUT -> VIN, :data:`hw.isa.MOVE_SPAD`;
OUT -> VIN, :data:`hw.isa.OUT_MOVE_SPAD`: :func:`out_moves`, below; rows several STOREs of
VOUT write: :func:`vout_moves`, after it).

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

import functools
from collections.abc import Collection, Sequence
from dataclasses import replace

import numpy as np

from hw.config import AcceleratorConfig
from hw.engines import engines_fields
from hw.isa import (
    MOVE_SOURCES,
    MOVE_SPAD,
    NO_EVENT,
    OUT_MOVE_SPAD,
    Engine,
    Gemm,
    Load,
    Opcode,
    Spad,
    Store,
    Sync,
    Vec,
    decode,
    decode_fields,
    dequant_amax_addr,
    gemm_extents,
    loop_stream,
    program_words,
    vec_out_words,
    vec_reads_amax,
    vec_reads_b,
)
from sw.compile.fusion import BESIDE_EVENTS, overlapping, overlaps

#: The event a move (LOAD -> STORE) waits on: raised by a SYNC of the LOAD engine right
#: before the boundary the move's signal ends, once every LOAD before has landed. The one
#: after the fused programs' (:data:`sw.compile.fusion.BESIDE_EVENTS`).
MOVE_EVENT = max(BESIDE_EVENTS.values()) + 1

__all__ = ["MOVE_EVENT", "OUT_MOVE_EVENT", "moved_waits", "onchip_moves", "out_moves",
           "out_round_trips", "quiet_stores", "quieten", "round_trips", "vout_moves",
           "vout_round_trips"]


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


def _instrs(words: np.ndarray) -> list:
    """The decoded instructions of ``words`` (``uint64 [n, 2]``: low, high halves)."""
    return [_decode(int(lo) | int(hi) << 64) for lo, hi in words.tolist()]


#: :func:`hw.isa.decode`, remembered: each pass decodes the words of the one before, mostly
#: the same (an instruction is a frozen dataclass, safe to share).
_decode = functools.lru_cache(maxsize=1 << 16)(decode)


def round_trips(words: np.ndarray) -> list[tuple[int, int | None, int]]:
    """The ``(S, X, L)`` index triples of ``words`` (``uint64 [n, 2]``) that
    :func:`onchip_moves` rewrites: a STORE of VOUT rows, the last LOAD into VIN that may
    still be in flight when ``S`` starts (None: none) and the LOAD of the same rows into
    VIN, each safe by the module's rules, in order."""
    f = decode_fields(words)
    eng = engines_fields(f)
    ins = _instrs(words)
    match = _matches(f)
    landed = _landed(eng, match)
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
                x = _safe(ins, eng, match, landed, s, t)
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


def _landed(eng: np.ndarray, match: np.ndarray) -> np.ndarray:
    """Per word of a program (``eng``: its words' engines, ``match``: :func:`_matches`'s),
    the latest LOAD-engine word that a VEC up to it waits on (-1: none)."""
    vec_waits = (eng == Engine.VECTOR.value) & (match >= 0) \
        & (eng[np.maximum(match, 0)] == Engine.LOAD.value)
    return np.maximum.accumulate(np.where(vec_waits, match, -1)) if eng.size else match


def _safe(ins: Sequence, eng: np.ndarray, match: np.ndarray, landed: np.ndarray, s: int,
          t: int) -> int | None | bool:
    """Where the STORE ``s`` and the LOAD ``t`` of ``ins`` meet the module's rules 1-4
    (rule 2's first half is the caller's): the last LOAD into VIN that may be in flight
    when ``s`` starts (None where none is), else False (``eng``, ``match``, ``landed``:
    the words' engines, :func:`_matches`, :func:`_landed`)."""
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
    if any(_vin_load(x) and overlaps(_spad_rows(ld), _spad_rows(x)) for x in ins[b:t]):
        return False  # (a LOAD after the move overwrites the beats it wrote)
    # landed when S starts: every LOAD-engine word up to the latest one a VEC up to v waits on
    u = int(landed[v])
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
    decoded = _instrs(words)
    out, where = [], []
    for i, ins in enumerate(decoded):
        where.append(len(out))
        if i in loads:
            out.append(Sync(engine=Engine.LOAD, wait=ins.wait, signal=ins.signal))
        elif i in stores:
            x, t = stores[i]
            ld = decoded[t]
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
                 live: Sequence[tuple[int, int]] = (),
                 cfg: AcceleratorConfig | None = None) -> list[int]:
    """The STOREs of ``words`` (``uint64 [n, 2]``, REPEATs allowed) whose DRAM rows nobody
    needs: each a STORE of VOUT rows right before a move of the same VOUT beats (the rows go
    on chip, :func:`onchip_moves`), a STORE of OUT rows a later move from OUT reads
    (:func:`out_moves`, :func:`_beside_out_moves`) or, given ``cfg``, a STORE of VOUT rows a
    later move reads behind other STORE-engine words (:func:`vout_moves`,
    :func:`_beside_late_moves`), not in ``keep`` (words the runtime rewrites per step),
    and such that in every iteration it runs (:func:`hw.isa.loop_stream`)

    * no later LOAD of the program reads one of its beats before a STORE writes it again;
    * no LOAD reads one of its beats before any STORE of the program writes it (the next
      step's run of the same words would read what this one left: rows written across
      steps, such as the KV cache's, stay);
    * none of its beats lies in ``live`` (``[lo, hi)`` DRAM beat ranges the host reads
      back or a run-time word may address: the caller's).

    A STORE's only effect is its DRAM write (the move reads the VOUT or OUT beats itself), so
    the STORE can go (:func:`quieten`) without changing what any word reads."""
    keep = set(keep)  # asked of every word
    f = decode_fields(words)
    n = f["opcode"].shape[0]
    ins = _instrs(words)
    cand = [i for i in range(n - 1) if i not in keep
            and isinstance(ins[i], Store) and ins[i].spad == Spad.VOUT
            and isinstance(ins[i + 1], Store) and ins[i + 1].spad == MOVE_SPAD
            and ins[i + 1].spad_addr == ins[i].spad_addr]
    cand += [i for i in _beside_out_moves(ins) if i not in keep]
    if cfg is not None:
        cand += [i for i in _beside_late_moves(cfg, ins) if i not in keep]
    cand = sorted(set(cand))
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
        elif isinstance(x, Store) and x.spad not in MOVE_SOURCES:  # a move writes VIN
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


def _beside_out_moves(ins: Sequence) -> list[int]:
    """The STOREs of OUT in ``ins`` beside a move (:func:`quiet_stores`' candidates): each
    STORE of OUT, no run-time register, whose OUT beats lie inside those of the first move
    from OUT (:data:`OUT_MOVE_SPAD`, :func:`out_moves`) after it that reads any of them, no
    other STORE of OUT of those beats between: the move carries its rows on chip, as a move
    of VOUT carries a STORE's of VOUT. (Whether its DRAM rows may go is
    :func:`quiet_stores`' proof, which holds for any STORE.)"""
    out = []
    for i, st in enumerate(ins):
        if not (isinstance(st, Store) and st.spad == Spad.OUT) or st.reg:
            continue
        lo, hi = _spad_rows(st)
        for x in ins[i + 1:]:
            if not isinstance(x, Store):
                continue
            span = _spad_rows(x)
            if not overlaps((lo, hi), span):
                continue
            if x.spad == OUT_MOVE_SPAD and span[0] <= lo and hi <= span[1]:
                out.append(i)
            if x.spad in (OUT_MOVE_SPAD, Spad.OUT):
                break
    return out


def _beside_late_moves(cfg: AcceleratorConfig, ins: Sequence) -> list[int]:
    """The STOREs of VOUT in ``ins`` whose move sits behind other STORE-engine words
    (:func:`quiet_stores`' candidates; :func:`vout_moves` places a DEQUANT segment's move
    after the next segment's LOADs, behind the GEMM's STOREs of OUT): each STORE ``S`` of
    VOUT, no run-time register, whose VOUT beats lie inside those of ``M``, the first move
    from VOUT (:data:`MOVE_SPAD`) after it whose VOUT beats overlap them, where no STORE of
    VOUT of those beats lies between them and no VEC between them in program order writes
    one of them (:func:`_vout_writes`). ``M`` then reads the VOUT beats ``S`` read before
    anything rewrites them: the STORE engine is in order (``M`` starts after ``S``), a VEC
    before ``S`` in program order is done when ``S`` starts or was a writer ``S`` did not
    wait for (the same for ``M``), none between them writes the beats, and one after ``M``
    that writes them starts after ``M`` (the proof of the pass that placed ``M``: rule 2 of
    :func:`onchip_moves`, rule 5 of :func:`vout_round_trips`). Its DRAM rows being read by
    nobody, in any iteration, is :func:`quiet_stores`' proof, which holds for any STORE."""
    out = []
    for i, st in enumerate(ins):
        if not (isinstance(st, Store) and st.spad == Spad.VOUT) or st.reg:
            continue
        mine = _spad_rows(st)
        for x in ins[i + 1:]:
            if isinstance(x, Vec) and overlaps(mine, _vout_writes(cfg, x)):
                break
            if not (isinstance(x, Store) and x.spad in (Spad.VOUT, MOVE_SPAD)):
                continue
            span = _spad_rows(x)
            if not overlaps(mine, span):
                continue
            if x.spad == MOVE_SPAD and span[0] <= mine[0] and mine[1] <= span[1]:
                out.append(i)
            break
    return out


def quieten(words: np.ndarray, rows: Collection[int]) -> np.ndarray:
    """``words`` with each STORE at ``rows`` (:func:`quiet_stores`) a SYNC of the STORE
    engine with its wait and signal: its events run as before, its DRAM write goes (and its
    index stays, so the run-time rows do not move)."""
    out, decoded = words.copy(), _instrs(words)
    for i in rows:
        st = decoded[i]
        out[i] = program_words([Sync(engine=Engine.STORE, wait=st.wait, signal=st.signal)])[0]
    return out


# ---------------------------------------------------------------------- moves from OUT
#: The event a move from OUT (:data:`hw.isa.OUT_MOVE_SPAD`) waits on where a LOAD into VIN
#: may be in flight (LOAD -> STORE), as :data:`MOVE_EVENT` for the moves from VOUT: the one
#: after it, so that the two rewrites' waits and signals never pair across.
OUT_MOVE_EVENT = MOVE_EVENT + 1


def _known(eng: np.ndarray, match: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per word, per engine value: the last word of that engine known complete when the word
    starts (-1: none), from its engine's order (a word starts after the one before it on its
    engine started) and its wait (granted once the matched word, and every word before that
    on its engine, is complete). The engines are in order, so one index per engine says it
    all; it is also the latest word of each engine the word depends on. A wait granted by a
    later word (a seeded credit) takes that word's row too: the table is the fixpoint of
    passes in program order. And per word: whether that failed (a word that would depend on
    itself: a program that deadlocks), where the table proves nothing."""
    n, engines = eng.shape[0], len(Engine)
    known = np.full((n, engines), -1, dtype=np.int64)
    for _ in range(n + 1):
        before = known.copy()
        last: dict[int, int] = {}
        for i in range(n):
            e = int(eng[i])
            if e < 0:
                continue
            if e in last:
                known[i] = np.maximum(known[i], known[last[e]])
            j = int(match[i])
            if j >= 0:
                known[i] = np.maximum(known[i], known[j])
                known[i, eng[j]] = max(int(known[i, eng[j]]), j)
            last[e] = i
        if (known == before).all():
            break
    idx = np.arange(n)
    ok = eng >= 0
    forward = np.zeros(n, dtype=bool)
    forward[ok] = known[idx[ok], eng[ok]] >= idx[ok]
    if forward.any() or not (known == before).all():
        forward[:] = True
    return known, forward


def _dram_beats(ins) -> np.ndarray:
    """The DRAM beats of a LOAD or STORE, in transfer order (rows of ``row_beats``)."""
    return (ins.dram_addr + np.arange(ins.rows)[:, None] * ins.dram_stride
            + np.arange(ins.row_beats)[None, :]).reshape(-1)


def _spad_rows(ins) -> tuple[int, int]:
    """The scratchpad beats ``[first, last + 1)`` of a LOAD's or STORE's rows."""
    return ins.spad_addr, ins.spad_addr + ins.rows * ins.row_beats


def _move_rows(mv) -> tuple[int, int]:
    """The VIN beats ``[first, last + 1)`` a move (:func:`hw.isa.is_move`) writes: its
    ``dram_addr`` names VIN's rows, ``dram_stride`` apart."""
    return mv.dram_addr, mv.dram_addr + (mv.rows - 1) * mv.dram_stride + mv.row_beats


def _dram_span(ins) -> tuple[int, int]:
    """The first and last of :func:`_dram_beats` ``(ins)`` (a LOAD or STORE of at least one
    beat), from its fields."""
    rows = (ins.rows - 1) * ins.dram_stride
    return ins.dram_addr + min(0, rows), ins.dram_addr + max(0, rows) + ins.row_beats - 1


def _vin_reads(cfg: AcceleratorConfig, v) -> list[tuple[int, int]]:
    """VIN beats ``[first, last + 1)`` a VEC may read: its ``a`` row, its ``b`` row
    (:func:`hw.isa.vec_reads_b`; a ROPE's table is shorter) and its amax word
    (:func:`hw.isa.vec_reads_amax`), each ``length`` elements or one (a superset)."""
    per = cfg.beat_bytes // cfg.vin_word_bytes
    spans = [(v.a_addr, v.a_addr + v.length)]
    if vec_reads_b(v.func.value):
        spans.append((v.b_addr, v.b_addr + v.length))
    if vec_reads_amax(v.func.value):
        a = int(dequant_amax_addr(v.imm))
        spans.append((a, a + 1))
    return [(lo // per, -(-hi // per)) for lo, hi in spans]


def _store_spans(ins: Sequence, stores: Sequence[int]) -> np.ndarray:
    """Per STORE ``ins[j]`` of ``stores`` (in order): ``j``, its :func:`_dram_span` and
    whether a run-time register moves its address (``int64 [len(stores), 4]``), the
    table :func:`_last_writers` scans."""
    return np.array([(j, *_dram_span(ins[j]), bool(ins[j].reg)) for j in stores],
                    np.int64).reshape(-1, 4)


def _last_writers(ins: Sequence, stores: np.ndarray, t: int, spad: Spad = Spad.OUT
                  ) -> list[tuple[int, np.ndarray]] | None:
    """The STOREs of ``spad`` (``stores``: :func:`_store_spans` of some STOREs of ``ins``;
    those before ``t``) that last wrote the DRAM beats the LOAD ``ins[t]`` reads, latest
    first, each with the positions of its beats in the LOAD's; None where a beat's last
    writer is no STORE of this program, a STORE of another scratchpad, a STORE writing only
    some of its rows into the LOAD's beats, or one whose address a run-time register moves
    (its rows are unknown here)."""
    ld = ins[t]
    lb = _dram_beats(ld)
    order = np.argsort(lb, kind="stable")
    need = np.ones(lb.shape[0], dtype=bool)
    lo, hi = int(lb.min()), int(lb.max()) + 1
    out = []
    at, first, last, reg = stores.T
    # the others have no beat in the LOAD's span (their _dram_beats unbuilt)
    for j in at[(at < t) & ((reg != 0) | ((last >= lo) & (first < hi)))][::-1].tolist():
        st = ins[j]
        if st.reg:
            return None
        sb = _dram_beats(st)
        k = np.searchsorted(lb, sb, sorter=order)
        pos = order[np.minimum(k, lb.shape[0] - 1)]
        inside = lb[pos] == sb
        if not inside.any():
            continue
        if st.spad != spad or not inside.all() or not need[pos].all():
            return None
        need[pos] = False
        out.append((j, pos))
        if not need.any():
            return out
    return None


def _out_move(st: Store, ld: Load, pos: np.ndarray) -> Store | None:
    """The move of ``st``'s OUT beats to the VIN beats the LOAD ``ld`` puts them at
    (``pos``: their positions in its transfer), None where those are not rows of
    ``st.row_beats`` beats a fixed stride apart."""
    v = (ld.spad_addr + pos).reshape(st.rows, st.row_beats)
    if not (v == v[:, :1] + np.arange(st.row_beats)[None, :]).all():
        return None
    stride = int(v[1, 0] - v[0, 0]) if st.rows > 1 else st.row_beats
    if stride < 0 or (st.rows > 2 and not (np.diff(v[:, 0]) == stride).all()):
        return None
    return Store(spad=OUT_MOVE_SPAD, spad_addr=st.spad_addr, dram_addr=int(v[0, 0]),
                 rows=st.rows, row_beats=st.row_beats, dram_stride=stride)


def out_round_trips(cfg: AcceleratorConfig, words: np.ndarray, keep: Collection[int] = ()
                    ) -> list[tuple[int, list[tuple[int, int | None, Store]]]]:
    """The round trips of OUT rows through DRAM in ``words`` (``uint64 [n, 2]``) that
    :func:`out_moves` rewrites: per LOAD ``L`` into VIN (not in ``keep``), the STOREs of
    OUT that last wrote its DRAM beats, each ``(S, X, M)`` with the move ``M`` that puts
    its beats where ``L`` does and ``X``, the last LOAD into VIN that may be in flight when
    ``M`` starts (None: none). A STORE of OUT waits on a GEMM, not a VEC, so the proof of
    :func:`round_trips` does not carry over; each triple meets instead (from the words
    alone, with :func:`_known`'s table of what is complete when a word starts):

    1. every beat ``L`` reads was last written by a STORE of OUT of this program before
       ``L``, each of whose beats ``L`` reads (rows that do not overlap, no run-time
       register), none of them in ``keep`` nor feeding another ``L``;
    2. a LOAD-engine word up to ``L`` waits on the last ``S`` or a later STORE-engine word,
       so ``L``'s SYNC raises its signal after every ``M`` is done; ``L`` signals, and the
       first word granted by it is on the vector engine (its consumer ``C``: every VEC
       after ``C`` starts after every ``M``);
    3. no VEC that may run when ``M`` starts (after the last one complete then, before
       ``C``) reads ``M``'s VIN beats (:func:`_vin_reads`), no LOAD into VIN that may not
       have landed then (and lies before ``L``) writes them, nor a move between ``S`` and
       ``L`` (``M`` writes them earlier than ``L`` did);
    4. the LOADs into VIN that may be in flight when ``M`` starts (not landed then, not
       waiting on ``S``'s signal or later) end at ``X``: ``M`` waits on
       :data:`OUT_MOVE_EVENT`, which a SYNC right after ``X`` signals (VIN has one DMA
       write port), placed after that SYNC where ``X`` lies after ``S`` (no STORE-engine
       word between, nor a word waiting on the signal ``M`` takes over); no word up to
       ``X`` depends on itself in the table (a deadlocking program), the ``X`` of the
       moves, in their order, never goes back (the SYNCs signal in the order the moves
       wait), and no other word uses the event;
    5. the event ``L`` waits on, if any, is signalled by a word complete when ``M`` starts.

    ``S`` keeps its DRAM write (the host may read the rows); ``M`` follows it and takes its
    signal, so whatever frees OUT once ``S`` read it waits on ``M``, which reads the same
    beats. Returns ``(L, [(S, X, M), ...])`` in program order of ``L``."""
    f = decode_fields(words)
    if np.any(f["opcode"] == Opcode.REPEAT.value) or cfg.num_events <= MOVE_EVENT:
        return []
    eng = engines_fields(f)
    ins = _instrs(words)
    match = _matches(f)
    known, forward = _known(eng, match)
    store_e, vec_e = Engine.STORE.value, Engine.VECTOR.value
    stores = [j for j, x in enumerate(ins) if isinstance(x, Store)
              and x.spad not in MOVE_SOURCES]
    spans = _store_spans(ins, stores)
    vin_loads = [j for j, x in enumerate(ins) if _vin_load(x)]
    moves = [j for j, x in enumerate(ins) if isinstance(x, Store) and x.spad in MOVE_SOURCES]
    gemms = [j for j, x in enumerate(ins) if isinstance(x, Gemm)]
    # OUT_MOVE_EVENT is this pass's alone (else a move may not wait on it)
    free = cfg.num_events > OUT_MOVE_EVENT and not np.any(
        (f["wait"] == OUT_MOVE_EVENT) | (f["signal"] == OUT_MOVE_EVENT))
    used: set[int] = set()
    chosen: list[tuple[int, int]] = []   # (S, X) of every move that waits, all groups
    out = []
    for t in vin_loads:
        ld = ins[t]
        if t in keep or ld.reg or ld.signal is None or (
                ld.rows > 1 and ld.dram_stride < ld.row_beats):
            continue
        writers = _last_writers(ins, spans, t)
        if not writers or any(s in keep or s in used for s, _ in writers):
            continue
        c = next((j for j in range(t + 1, len(ins)) if match[j] == t), None)
        s_last = max(s for s, _ in writers)
        if c is None or eng[c] != vec_e or known[t, store_e] < s_last:
            continue
        units = _merged([(s, _out_move(ins[s], ld, pos)) for s, pos in sorted(writers)])
        group = []
        for s, parts, mv in units or ():
            signal = s == s_last or ins[s].signal is None
            x = _flight(cfg, ins, eng, match, known, forward, vin_loads, moves, s, t, c, mv,
                        signal)
            if x is False or not all(_out_kept(cfg, ins, known, gemms, p, s, signal)
                                     for p in parts):
                break
            group.append((s, x, mv))
        else:
            if not units:
                continue
            waits = sorted(chosen + [(max(s, x), x) for s, x, _ in group if x is not None])
            if any(a[1] > b[1] for a, b in zip(waits, waits[1:], strict=False)) or (
                    len(waits) > len(chosen) and not free):
                continue
            chosen = waits
            used.update(s for s, _, _ in group)
            out.append((t, group))
    return out


def _merged(moves: Sequence[tuple[int, Store | None]]
            ) -> list[tuple[int, tuple[int, ...], Store]] | None:
    """The moves of ``(S, M)`` pairs (in program order) as few moves as they make: one-row
    moves whose OUT beats and VIN beats both continue the one before's become one, after the
    last of their STOREs. Returns ``(S, STOREs, M)`` per move, None where a move is None.
    Each move takes a slot of the STORE engine's queue, and the fetch unit stalls when it is
    full: the GEMMs it dispatches ahead of their STOREs are what the moves would cost."""
    out: list[tuple[int, tuple[int, ...], Store]] = []
    for s, mv in moves:
        if mv is None:
            return None
        if out:
            s0, parts, m0 = out[-1]
            if m0.rows == mv.rows == 1 and m0.spad_addr + m0.row_beats == mv.spad_addr \
                    and m0.dram_addr + m0.row_beats == mv.dram_addr:
                out[-1] = (s, (*parts, s), replace(m0, row_beats=m0.row_beats + mv.row_beats,
                                                   dram_stride=m0.row_beats + mv.row_beats))
                continue
        out.append((s, (s,), mv))
    return out


def _out_kept(cfg: AcceleratorConfig, ins: Sequence, known: np.ndarray, gemms: Sequence[int],
              p: int, s: int, signal: bool) -> bool:
    """Whether the OUT beats the STORE ``p`` reads stay until a move right after the STORE
    ``s`` (``p`` or a later one) has read them: the first GEMM after ``p`` that writes them
    starts after a STORE-engine word after ``s`` is complete, or after ``s`` is where the
    move takes over ``s``'s signal (``signal``)."""
    st = ins[p]
    mine = _spad_rows(st)
    for g in gemms:
        if g > p:
            end = _out_end(cfg, ins[g])
            if ins[g].out_addr < end and overlaps(mine, (ins[g].out_addr, end)):
                k = int(known[g, Engine.STORE.value])
                return k > s or (signal and k == s)
    return True


@functools.lru_cache(maxsize=1 << 14)
def _out_end(cfg: AcceleratorConfig, g: Gemm) -> int:
    """The OUT beat after the GEMM ``g``'s results (:func:`hw.isa.gemm_extents`), remembered:
    each candidate STORE scans the GEMMs after it."""
    return -(-gemm_extents(g, cfg)[Spad.OUT] // cfg.beat_bytes)


def _flight(cfg, ins, eng, match, known, forward, vin_loads, moves, s, t, c, mv, signal
            ) -> int | None | bool:
    """:func:`out_round_trips`'s rules 3-5 for the move ``mv`` after the STORE ``s``, of the
    LOAD ``t`` whose consumer is ``c``: the last LOAD into VIN that may be in flight when it
    starts (None: none), False where a rule fails. ``signal``: the move takes over the
    STORE's signal (a word granted by it starts after the move), else the STORE keeps it."""
    if mv is None:
        return False
    load_e, store_e, vec_e = Engine.LOAD.value, Engine.STORE.value, Engine.VECTOR.value
    k = known[s].copy()
    k[store_e] = max(int(k[store_e]), s)   # the STORE engine is in order: S is done
    w0, w1 = _move_rows(mv)
    mine = (w0, w1)
    flying = [j for j in vin_loads if k[load_e] < j < t]
    for j in flying:
        x = ins[j]
        if overlaps(mine, _spad_rows(x)):
            return False
    for j in moves:
        if s < j < t and overlaps(mine, _move_rows(ins[j])):
            return False
    early = [j for j in flying if known[j, store_e] < s + (not signal)]
    x = max(early) if early else None
    if x is not None:
        # M goes after X's SYNC in program order where X lies after S (the fetch unit would
        # hold the SYNC behind a waiting M): still next to S on the STORE engine, and no word
        # between waits on the signal M takes over
        if forward[x] or x > s and any(eng[j] == store_e or signal and match[j] == s
                                       for j in range(s + 1, x + 1)):
            return False
        k[load_e] = max(int(k[load_e]), x)
    if any(isinstance(ins[v], Vec) and any(overlaps(mine, r)
                                           for r in _vin_reads(cfg, ins[v]))
           for v in range(int(k[vec_e]) + 1, c)):
        return False
    if ins[t].wait is not None:
        w = int(match[t])
        if w < 0 or w > k[eng[w]]:
            return False
    return x


def out_moves(cfg: AcceleratorConfig, words: np.ndarray, keep: Collection[int] = ()
              ) -> tuple[np.ndarray, tuple[int, ...]]:
    """``words`` (``uint64 [n, 2]``) with every :func:`out_round_trips` group rewritten: a
    move after each STORE of OUT, carrying its signal (and, where a LOAD into VIN may be in
    flight, waiting on :data:`OUT_MOVE_EVENT`, which a SYNC of the LOAD engine right after
    that LOAD signals), and the LOAD as a SYNC with its wait and signal. ``keep``: words the
    runtime rewrites per step. Returns the words and, per input word, its index in them."""
    found = out_round_trips(cfg, words, keep)
    if not found:
        return words, tuple(range(words.shape[0]))
    loads = {t for t, _ in found}
    last = {max(s for s, _, _ in group) for _, group in found}
    stores: dict[int, Store] = {}   # the STOREs whose signal a move takes
    placed: dict[int, list[Store]] = {}   # the moves after each word (S, or X's SYNCs)
    flights: dict[int, int] = {}
    decoded = _instrs(words)
    for _, group in found:
        for s, x, mv in group:
            mv = replace(mv, wait=None if x is None else OUT_MOVE_EVENT)
            if s in last:
                stores[s] = mv = replace(mv, signal=decoded[s].signal)
            placed.setdefault(s if x is None else max(s, x), []).append(mv)
            if x is not None:
                flights[x] = flights.get(x, 0) + 1
    return _rewritten(decoded, loads, stores, flights, placed, OUT_MOVE_EVENT)


def _rewritten(decoded: Sequence, loads: Collection[int], stores: Collection[int],
               flights: dict[int, int], placed: dict[int, list[Store]], event: int
               ) -> tuple[np.ndarray, tuple[int, ...]]:
    """The words of ``decoded`` with each LOAD at ``loads`` a SYNC of the LOAD engine with its
    wait and signal, each STORE at ``stores`` without its signal (a move takes it), and after
    word ``i`` its ``flights[i]`` SYNCs of the LOAD engine signalling ``event``, then the moves
    ``placed[i]``. Returns the words and, per input word, its index in them."""
    out, where = [], []
    for i, ins in enumerate(decoded):
        where.append(len(out))
        if i in loads:
            out.append(Sync(engine=Engine.LOAD, wait=ins.wait, signal=ins.signal))
        elif i in stores:
            out.append(replace(ins, signal=None))
        else:
            out.append(ins)
        out += [Sync(engine=Engine.LOAD, signal=event)] * flights.get(i, 0)
        out += placed.get(i, [])
    return program_words(out), tuple(where)


# ------------------------------------------------------- rows several STOREs of VOUT write
def _vout_writes(cfg: AcceleratorConfig, v: Vec) -> tuple[int, int]:
    """The VOUT beats ``[first, last + 1)`` a VEC writes (:func:`hw.isa.vec_out_words` words
    from its ``dst_addr``)."""
    per = cfg.beat_bytes // cfg.vout_word_bytes
    end = v.dst_addr + _out_words(v.func.value, v.length, v.imm)
    return v.dst_addr // per, -(-end // per)


@functools.lru_cache(maxsize=1 << 12)
def _out_words(func: int, length: int, imm: int) -> int:
    """:func:`hw.isa.vec_out_words`, remembered: each candidate STORE scans the VECs."""
    return int(vec_out_words(func, length, imm))


def _after(eng: np.ndarray, match: np.ndarray, s: int) -> np.ndarray:
    """Per word, whether it starts only after a word granted by the signal of word ``s``
    has been granted (so after whatever raises that signal completes): granted by it, or
    after such a word on its own engine (in order), or granted by such a word. Program
    order; a wait granted by a later word (a seeded credit) proves nothing here."""
    out = np.zeros(eng.shape[0], dtype=bool)
    last: dict[int, int] = {}
    for i in range(eng.shape[0]):
        e, j = int(eng[i]), int(match[i])
        out[i] = j == s or (e in last and out[last[e]]) or (0 <= j < i and out[j])
        last[e] = i
    return out


def _vout_kept(ins: Sequence, eng: np.ndarray, match: np.ndarray, known: np.ndarray,
               vecs: np.ndarray, s: int, p: int) -> bool:
    """Whether the VOUT beats the STORE ``ins[s]`` reads stay until its move, which takes
    over its signal and goes on the STORE engine after every STORE-engine word up to ``p``
    (``s`` or later), has read them: every VEC not known complete when ``s`` starts that
    writes them starts after ``s``'s signal (the move's: :func:`_after`) or after a
    STORE-engine word after ``p`` is complete (``vecs``: per VEC of ``ins``, its index and
    :func:`_vout_writes`, ``int64 [n, 3]``)."""
    st = ins[s]
    mine = _spad_rows(st)
    done = int(known[s, Engine.VECTOR.value])
    at = vecs[:, 0]
    writers = at[(at > done) & overlapping(vecs[:, 1:], mine)].tolist()
    late = [v for v in writers if (k := int(known[v, Engine.STORE.value])) != s
            and not p < k < len(ins)]  # known complete: s, or a word after p
    return not late or bool(_after(eng, match, s)[late].all())


def _vout_flight(cfg, ins, eng, match, known, forward, vin_loads, moves, s, t, c, mv
                 ) -> tuple[int | None, int] | bool:
    """:func:`_flight`'s rules for the move ``mv`` of the STORE ``s`` of VOUT, which takes
    over its signal, of the LOAD ``t`` whose consumer is ``c``: ``(X, p)``, the last LOAD
    into VIN that may be in flight when it starts (None: none) and the word it goes after
    (``s``, or ``X``'s SYNC), else False. Where ``X`` lies after ``s``, the STORE-engine
    words between them (a GEMM's STOREs of OUT beside a DEQUANT's segments) may go before
    the move, unlike :func:`_flight`'s: none of the words between ``s`` and ``X`` depends on
    ``s`` or a later STORE-engine word (the move, after them, holds ``s``'s signal) and none
    signals ``s``'s event (the STORE engine signals it in the order it did)."""
    if mv is None:
        return False
    load_e, store_e, vec_e = Engine.LOAD.value, Engine.STORE.value, Engine.VECTOR.value
    k = known[s].copy()
    k[store_e] = max(int(k[store_e]), s)   # the STORE engine is in order: S is done
    mine = _move_rows(mv)
    flying = [j for j in vin_loads if k[load_e] < j < t]
    if any(overlaps(mine, _spad_rows(ins[j])) for j in flying):
        return False
    if any(s < j < t and overlaps(mine, _move_rows(ins[j])) for j in moves):
        return False
    early = [j for j in flying if known[j, store_e] < s]
    x = max(early) if early else None
    if x is not None:
        if forward[x] or x > s and any(
                known[j, store_e] >= s or ins[j].signal is not None
                and ins[j].signal == ins[s].signal for j in range(s + 1, x + 1)):
            return False
        k[load_e] = max(int(k[load_e]), x)
    if any(isinstance(ins[v], Vec) and any(overlaps(mine, r)
                                           for r in _vin_reads(cfg, ins[v]))
           for v in range(int(k[vec_e]) + 1, c)):
        return False
    if ins[t].wait is not None:
        w = int(match[t])
        if w < 0 or w > k[eng[w]]:
            return False
    return x, s if x is None else max(s, x)


def _move_event_pairs(ins: Sequence, f, match: np.ndarray
                      ) -> dict[int, list[tuple[tuple[int], tuple[int]]]]:
    """Per move event (:data:`OUT_MOVE_EVENT`, :data:`MOVE_EVENT`) that only SYNCs of the
    LOAD engine signal and only moves wait on in the words ``ins`` (fields ``f``), each
    signal granting one wait (:func:`_matches`), its ``((signal,), (wait,))`` word pairs."""
    out = {}
    for e in (OUT_MOVE_EVENT, MOVE_EVENT):
        sig = np.flatnonzero(f["signal"] == e).tolist()
        wait = np.flatnonzero(f["wait"] == e).tolist()
        if len(sig) == len(wait) and all(
                isinstance(ins[j], Sync) and ins[j].engine == Engine.LOAD for j in sig) \
                and all(isinstance(ins[j], Store) and ins[j].spad in MOVE_SOURCES
                        and match[j] >= 0 for j in wait):
            out[e] = [((int(match[j]),), (j,)) for j in wait]
    return out


def _pairs_hold(pairs: Sequence[tuple[tuple, tuple]]) -> bool:
    """Whether the ``k``-th signal in program order grants the ``k``-th wait for every
    ``(signal, wait)`` pair of words (keys that order them: ``(index, ...)``)."""
    sig = sorted(s for s, _ in pairs)
    want = dict((w, s) for s, w in pairs)
    return all(want[w] == sig[k] for k, w in enumerate(sorted(want)))


def vout_round_trips(cfg: AcceleratorConfig, words: np.ndarray, keep: Collection[int] = ()
                     ) -> tuple[int | None, list[tuple[int, list[tuple[int, int | None, Store]]]]]:
    """The round trips through DRAM of rows that STOREs of VOUT write and one LOAD reads back
    into VIN, in ``words`` (``uint64 [n, 2]``, after :func:`onchip_moves` and
    :func:`out_moves`), that :func:`vout_moves` rewrites: a DEQUANT's column segments read by
    the REQUANT before the scores or by the residual ADD. Per LOAD ``L`` into
    VIN (not in ``keep``), each STORE ``S`` of VOUT that last wrote some of its beats with
    ``X``, the last LOAD into VIN that may be in flight when its move ``M`` starts (None:
    none), and ``M`` (:data:`MOVE_SPAD`: ``S``'s VOUT beats to the VIN beats ``L`` puts
    them at). :func:`onchip_moves` wants one STORE whose rows equal the LOAD's, right
    before it; here each ``S`` gets its own move, which takes over its signal, and the
    proof is :func:`out_round_trips`' (the table of what is complete when a word starts,
    :func:`_known`), with what differs:

    1. every beat ``L`` reads was last written by a STORE of VOUT of this program before
       ``L`` (:func:`_last_writers`: each of whose beats ``L`` reads, no run-time
       register), none in ``keep`` nor feeding another ``L``; there are several of them
       (one is :func:`onchip_moves`' case; where it leaves one, measured on the reference
       step, the move cost cycles) and more beats than STOREs (an ``amax`` pair, one beat
       each, read by the scores' DEQUANT: its two moves cost the step 732 cycles on the
       reference model, in STORE-engine words the fetch unit dispatches in order);
    2. a LOAD-engine word up to ``L`` waits on the last ``S`` or a later STORE-engine word,
       so ``L``'s SYNC passes the LOAD engine once every ``M`` is done; ``C``, the first VEC
       after ``L`` known to start after it (its signal need not say so: a LOAD hoisted
       above its boundary leaves it on a SYNC), and every VEC after ``C`` start after
       every ``M``;
    3. and 4. as :func:`out_round_trips` (:func:`_vout_flight`, every move taking over its
       STORE's signal): no VEC that may run when ``M`` starts, before ``C``, reads ``M``'s
       VIN beats, no LOAD into VIN not landed then writes them, nor a move between ``S``
       and ``L``; ``M`` waits for the LOADs into VIN that may be in flight, after the last
       one's SYNC where it lies after ``S`` -- behind the STORE-engine words between them
       (a GEMM's STOREs of OUT beside a DEQUANT's segments), where none of the words between
       depends on ``S`` or signals its event;
    5. every VEC not complete when ``S`` starts that writes ``S``'s VOUT beats waits on
       ``S``'s signal (:func:`_after`: now ``M``'s) or starts after a STORE-engine word after
       ``M`` (:func:`_vout_kept`): ``M`` reads what ``S`` read;
    6. the moves that wait share an event with the earlier passes' (every event is in use):
       :data:`OUT_MOVE_EVENT` or :data:`MOVE_EVENT`, the first whose every signal is a
       LOAD-engine SYNC and every wait a move's, and where, with the new SYNCs and moves in
       their places, the ``k``-th signal still grants the ``k``-th wait of every old and
       new move (:func:`_pairs_hold`); a group that would break it stays.

    Returns the event the waiting moves use (None: none waits) and ``(L, [(S, X, M), ...])``
    in program order of ``L``."""
    f = decode_fields(words)
    if np.any(f["opcode"] == Opcode.REPEAT.value) or cfg.num_events <= OUT_MOVE_EVENT:
        return None, []
    eng = engines_fields(f)
    ins = _instrs(words)
    match = _matches(f)
    known, forward = _known(eng, match)
    load_e, store_e = Engine.LOAD.value, Engine.STORE.value
    stores = [j for j, x in enumerate(ins) if isinstance(x, Store)
              and x.spad not in MOVE_SOURCES]
    spans = _store_spans(ins, stores)
    vin_loads = [j for j, x in enumerate(ins) if _vin_load(x)]
    moves = [j for j, x in enumerate(ins) if isinstance(x, Store) and x.spad in MOVE_SOURCES]
    vecs = [j for j, x in enumerate(ins) if isinstance(x, Vec)]
    vec_writes = np.array([(j, *_vout_writes(cfg, ins[j])) for j in vecs],
                          np.int64).reshape(-1, 3)
    pairs = _move_event_pairs(ins, f, match)
    event = None
    used: set[int] = set()
    out = []
    for t in vin_loads:
        ld = ins[t]
        if t in keep or ld.reg or (ld.rows > 1 and ld.dram_stride < ld.row_beats):
            continue
        writers = _last_writers(ins, spans, t, Spad.VOUT)
        if not writers or len(writers) < 2 or ld.rows * ld.row_beats <= len(writers) or any(
                s in keep or s in used for s, _ in writers):
            continue
        c = next((j for j in vecs if j > t and known[j, load_e] >= t), None)
        if c is None or known[t, store_e] < max(s for s, _ in writers):
            continue
        group = []
        for s, pos in sorted(writers):
            mv = _out_move(ins[s], ld, pos)
            mv = mv and replace(mv, spad=MOVE_SPAD)
            place = _vout_flight(cfg, ins, eng, match, known, forward, vin_loads, moves, s, t,
                                 c, mv)
            if place is False or not _vout_kept(ins, eng, match, known, vec_writes, s,
                                                  place[1]):
                break
            group.append((s, place[0], mv))
        else:
            new = [((x, 1, s), (max(s, x), 2, s)) for s, x, _ in group if x is not None]
            fits = [e for e in ((event,) if event is not None else pairs)
                    if not new or _pairs_hold(pairs[e] + new)]
            if not fits:
                continue
            if new:
                event = fits[0]
                pairs[event] += new
            used.update(s for s, _, _ in group)
            out.append((t, group))
    return event, out


def vout_moves(cfg: AcceleratorConfig, words: np.ndarray, keep: Collection[int] = ()
               ) -> tuple[np.ndarray, tuple[int, ...]]:
    """``words`` (``uint64 [n, 2]``) with every :func:`vout_round_trips` group rewritten: a
    move (:data:`MOVE_SPAD`) after each STORE of VOUT, carrying its signal (and, where a
    LOAD into VIN may be in flight, waiting on the event the groups share, which a SYNC of
    the LOAD engine right after that LOAD signals: the move then goes after that SYNC where
    the LOAD lies after the STORE), and the LOAD as a SYNC with its wait and signal.
    ``keep``: words the runtime rewrites per step. Returns the words and, per input word,
    its index in them."""
    event, found = vout_round_trips(cfg, words, keep)
    if not found:
        return words, tuple(range(words.shape[0]))
    loads = {t for t, _ in found}
    stores: set[int] = set()
    placed: dict[int, list[tuple[int, Store]]] = {}   # (S, M) after each word (S, X)
    flights: dict[int, int] = {}
    decoded = _instrs(words)
    for _, group in found:
        for s, x, mv in group:
            stores.add(s)
            mv = replace(mv, wait=None if x is None else event, signal=decoded[s].signal)
            placed.setdefault(s if x is None else max(s, x), []).append((s, mv))
            if x is not None:
                flights[x] = flights.get(x, 0) + 1
    moves = {i: [mv for _, mv in sorted(p, key=lambda m: m[0])] for i, p in placed.items()}
    return _rewritten(decoded, loads, stores, flights, moves, event)


# ------------------------------------------------------------ VECs waiting on their move
def _free_event(cfg: AcceleratorConfig, f) -> int | None:
    """The lowest event of ``cfg`` that no word of fields ``f`` waits on or signals (None:
    every one is in use)."""
    used = set(f["wait"].tolist()) | set(f["signal"].tolist())
    return next((e for e in range(cfg.num_events) if e not in used), None)


def _moved_candidates(cfg: AcceleratorConfig, ins: Sequence, eng: np.ndarray,
                      match: np.ndarray, keep: Collection[int]) -> list[tuple[int, int, int]]:
    """The ``(M, L, V)`` index triples :func:`moved_waits` tries, in program order: a VEC
    ``V`` whose wait a SYNC ``L`` of the LOAD engine grants (a LOAD a move replaced, not in
    ``keep``), and ``M``, the last move before ``L`` that writes VIN beats ``V`` reads, each
    ``M`` for one ``V`` and the ``M`` in the order of the ``V`` (the ``k``-th signal of the
    new event grants its ``k``-th wait)."""
    out, last = [], -1
    for v, x in enumerate(ins):
        if not isinstance(x, Vec) or x.wait is None:
            continue
        t = int(match[v])
        if t < 0 or t in keep or eng[t] != Engine.LOAD.value or not isinstance(ins[t], Sync):
            continue
        reads = _vin_reads(cfg, x)
        m = next((j for j in range(t - 1, last, -1) if isinstance(ins[j], Store)
                  and ins[j].spad in MOVE_SOURCES
                  and any(overlaps(_move_rows(ins[j]), r) for r in reads)), None)
        if m is not None:
            out.append((m, t, v))
            last = m
    return out


def _with_moved(words: np.ndarray, triples: Sequence[tuple[int, int, int]], event: int
                ) -> tuple[np.ndarray, tuple[int, ...]]:
    """``words`` with, per ``(M, L, V)`` of ``triples``, a SYNC of the STORE engine
    signalling ``event`` right after ``M``, ``L`` without its signal (gone where it then
    neither waits nor signals) and ``V`` waiting on ``event``. Returns the words and, per
    input word, its index in them (a word gone: the next word's)."""
    after = {m for m, _, _ in triples}
    quiet = {t for _, t, _ in triples}
    waits = {v for _, _, v in triples}
    out, where = [], []
    for i, ins in enumerate(_instrs(words)):
        where.append(len(out))
        if i in quiet:
            if ins.wait is not None:
                out.append(replace(ins, signal=None))
        else:
            out.append(replace(ins, wait=event) if i in waits else ins)
        if i in after:
            out.append(Sync(engine=Engine.STORE, signal=event))
    return program_words(out), tuple(where)


def _moved_unsafe(cfg: AcceleratorConfig, words: np.ndarray, vecs: Collection[int]
                  ) -> set[int]:
    """The VECs at ``vecs`` (indices into ``words``) not proven to start after every word
    before them that writes a VIN beat they read (a LOAD into VIN, a move) and every
    STORE-engine word before them that reads a VOUT beat they write (a STORE of VOUT, a move
    from VOUT): :func:`_known` of ``words``. All of them where the table proves nothing."""
    f = decode_fields(words)
    eng = engines_fields(f)
    ins = _instrs(words)
    known, forward = _known(eng, _matches(f))
    if forward.any():
        return set(vecs)
    # (index, engine, VIN beats written, VOUT beats read) of every such writer and reader
    dma = [(j, eng[j], *_spad_rows(x), 0, 0) for j, x in enumerate(ins) if _vin_load(x)]
    dma += [(j, eng[j], *(_move_rows(x) if x.spad in MOVE_SOURCES else (0, 0)),
             *(_spad_rows(x) if x.spad in (Spad.VOUT, MOVE_SPAD) else (0, 0)))
            for j, x in enumerate(ins) if isinstance(x, Store)]
    at, engine, w_lo, w_hi, r_lo, r_hi = np.array(dma, np.int64).reshape(-1, 6).T
    bad = set()
    for v in vecs:
        late = (at < v) & (at > known[v][engine])
        hit = overlapping(np.stack([r_lo, r_hi], 1), _vout_writes(cfg, ins[v]))
        for r in _vin_reads(cfg, ins[v]):
            hit |= overlapping(np.stack([w_lo, w_hi], 1), r)
        if (late & hit).any():
            bad.add(v)
    return bad


def moved_waits(cfg: AcceleratorConfig, words: np.ndarray, keep: Collection[int] = ()
                ) -> tuple[np.ndarray, tuple[int, ...]]:
    """``words`` (``uint64 [n, 2]``, after the moves: :func:`onchip_moves`,
    :func:`out_moves`, :func:`vout_moves`) with a VEC that waited on a LOAD-engine SYNC in a
    moved LOAD's place waiting on its move instead: the SYNC raised its FULL a LOAD
    completion delay (:func:`hw.timing.load_completion_delay`) after the move's signal let
    the LOAD engine pass the boundary; a SYNC of the STORE engine right after the move raises
    an event no word uses (:func:`_free_event`: STORE -> VECTOR) as the move completes.

    Per :func:`_moved_candidates` triple ``(M, L, V)``: that SYNC after ``M``, ``L``
    without its signal and ``V`` waiting on the new event (:func:`_with_moved`); removing a
    matched signal and wait of ``L``'s event keeps every other pairing of it. ``V`` no
    longer waits for the LOAD-engine words up to ``L``, so it is kept only where
    :func:`_known` of the new words proves it starts after every word before it that
    writes a VIN beat it reads or reads a VOUT beat it writes (:func:`_moved_unsafe`;
    what comes after ``V`` waits on ``V``'s signals as before); the others are dropped
    and the rest checked again. Unchanged where no event is free or the words loop
    (REPEAT). Returns the words and, per input word, its index in them."""
    f = decode_fields(words)
    event = _free_event(cfg, f)
    if event is None or np.any(f["opcode"] == Opcode.REPEAT.value):
        return words, tuple(range(words.shape[0]))
    eng = engines_fields(f)
    triples = _moved_candidates(cfg, _instrs(words), eng, _matches(f), keep)
    while triples:
        out, where = _with_moved(words, triples, event)
        bad = _moved_unsafe(cfg, out, [where[v] for _, _, v in triples])
        if not bad:
            late = _lost_unsafe(cfg, words, out, where)
            if late is None:
                return out, where
            # the last rewritten VEC before the word that lost an ordering it needs
            bad = {where[max((v for _, _, v in triples if v <= late),
                             default=triples[0][2])]}
        triples = [tr for tr in triples if where[tr[2]] not in bad]
    return words, tuple(range(words.shape[0]))


def _lost_unsafe(cfg: AcceleratorConfig, words: np.ndarray, out: np.ndarray,
                 where: Sequence[int]) -> int | None:
    """The first word of ``words`` (an index into them) that :func:`_with_moved`'s ``out``
    (``where``: each word's index in ``out``) no longer proves to start after a word it
    needs to, or None. A rewritten VEC no longer waits for the LOAD engine, and neither does
    what waited on it: per word, the words of its engines' queues :func:`_known` proved
    complete in ``words`` and not in ``out`` must all be the LOAD engine's, and none a LOAD
    the word conflicts with -- a VEC reading VIN beats it writes, a move writing them or
    reading the scratchpad it writes, a STORE writing DRAM beats it reads or reading its
    scratchpad, any GEMM after a LOAD of a scratchpad but VIN (a GEMM's operand rows are
    left unchecked: conservative). The rewritten VECs' own reads are
    :func:`_moved_unsafe`'s."""
    ins, new = _instrs(words), _instrs(out)
    eng_o, eng_n = engines_fields(decode_fields(words)), engines_fields(decode_fields(out))
    k_old, fwd_old = _known(eng_o, _matches(decode_fields(words)))
    k_new, fwd_new = _known(eng_n, _matches(decode_fields(out)))
    if fwd_old.any() or fwd_new.any():
        return 0
    # each word of ``out`` as the last word of ``words`` up to it on its engine (a SYNC
    # _with_moved added: its move, the word before it on the STORE engine)
    back = np.full(len(new), -1, np.int64)
    last = {}
    src = {w: i for i, w in enumerate(where)}
    for k in range(len(new)):
        e = int(eng_n[k])
        if k in src and int(eng_o[src[k]]) == e:
            last[e] = src[k]
        back[k] = last.get(e, -1)
    load = Engine.LOAD.value
    for i, x in enumerate(ins):
        w = where[i]
        if eng_o[i] < 0 or w >= len(new) or type(new[w]) is not type(x):
            continue        # a SYNC _with_moved took out
        kn = np.where(k_new[w] >= 0, back[np.maximum(k_new[w], 0)], -1)
        for e in np.flatnonzero(kn < k_old[i]):
            if e != load:
                return i
            lost = [ins[j] for j in range(int(kn[e]) + 1, int(k_old[i, e]) + 1)
                    if eng_o[j] == load and isinstance(ins[j], Load)]
            if any(_load_conflicts(cfg, x, ld) for ld in lost):
                return i
    return None


def _load_conflicts(cfg: AcceleratorConfig, x, ld: Load) -> bool:
    """Whether word ``x`` must start after LOAD ``ld`` completes (see :func:`_lost_unsafe`)."""
    if isinstance(x, Vec):
        return ld.spad == Spad.VIN and any(overlaps(_spad_rows(ld), r)
                                           for r in _vin_reads(cfg, x))
    if isinstance(x, Store):
        source = MOVE_SOURCES.get(x.spad, x.spad)
        if x.spad in MOVE_SOURCES:
            return ld.spad == source or (ld.spad == Spad.VIN
                                         and overlaps(_move_rows(x), _spad_rows(ld)))
        (a, b), (c, d) = _dram_span(x), _dram_span(ld)
        return ld.spad == source or overlaps((a, b + 1), (c, d + 1))
    return isinstance(x, Gemm) and ld.spad != Spad.VIN
