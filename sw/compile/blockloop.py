"""One hardware loop over a joined decode step's decoder blocks.

A joined decode step (:func:`sw.compile.compiler._join_step`) runs every decoder block's
instructions one block after the other. The blocks are the same instructions but for their
DMAs' DRAM addresses, so the step can be one REPEAT whose body is one block, run once per
layer (:class:`hw.isa.Repeat`) -- if every address in the body advances by its transfer
class's stride from one block to the next (:func:`hw.isa.loop_stride`: LOADs into WGT, other
LOADs, STOREs). A block's KV cache is loaded into WGT and appended by STOREs, its activations
are stored and loaded, so the three strides must be one: the *frame* size ``F``.

:func:`frame_plan` finds the blocks (:func:`block_period`) and lays every DRAM symbol the
blocks address out in frames: frame ``m`` holds what block ``m`` addresses (its layer's
weights, KV cache, constants and buffers) at the same offsets as every other frame, so that
block ``m``'s addresses are block 0's plus ``m * F``. A symbol that a block reads at the same
address in every block (a constant every layer shares: the rotary table, the values' channel
words) gets a copy in every frame (:attr:`FramePlan.copies`); an activation buffer that every
block addresses alike cannot (the epilogues read it after the step) and no plan is made.
What a block writes for the next one (its residual rows) lies in the next frame's slot: the
frames are found by chaining each body DMA's symbol in block ``m`` to its symbol in block
``m + 1`` (a union-find of symbols with frame offsets), not from names.

:func:`roll_blocks` then writes the step as ``[prologue | REPEAT | block 0 | epilogue]`` and
moves the run-time rows (:class:`~sw.compile.executable.Program` ``position_rows``,
``imm_rows``, ``append_rows``) to the body: one word serves every layer, the host patches it
once (the position and context are the same in every layer).

Block 0 reads the token's embedding row from frame 0's slot of its input rows, where block
``m`` reads block ``m - 1``'s output from frame ``m``'s: a LOAD of the embedding table's row
in the body would advance by a frame per block. So the step starts with :func:`copy_row`,
which copies the row from the table into frame 0's slot; its one LOAD is the run-time word
the runtime points at the token's row (``Program.embed_rows``), and nothing after it starts
before the row has landed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hw.isa import (
    End,
    Engine,
    Instr,
    Load,
    Repeat,
    RepeatBody,
    Spad,
    Store,
    Sync,
    Vec,
    VecFunc,
    decode,
    insert_imm,
    program_words,
)
from sw.compile.fusion import VECTOR_EVENTS
from sw.compile.plan import Region
from sw.compile.roll import stride_class
from sw.compile.schedule import EVENTS

__all__ = ["block_period", "block_strides", "FramePlan", "frame_plan", "frame_symbols",
           "roll_blocks", "copy_name", "copy_row"]

_COUNT_MAX = (1 << RepeatBody["count"].width) - 1
_LENGTH_MAX = (1 << RepeatBody["length"].width) - 1
_STRIDE_LIMIT = 1 << RepeatBody["wgt_stride"].width
if {RepeatBody[k].width for k in ("wgt_stride", "load_stride", "store_stride")} != \
        {RepeatBody["wgt_stride"].width}:
    raise ImportError("the REPEAT's stride fields differ in width; a frame needs one stride")


def instructions(words: np.ndarray) -> list[Instr]:
    """The instructions of encoded ``words`` (``uint64 [n, 2]``)."""
    return [decode(int(lo) | (int(hi) << 64)) for lo, hi in np.asarray(words)]


def _key(ins: Instr) -> Instr:
    """What must repeat exactly from block to block: every field but a DMA's address."""
    return dataclasses.replace(ins, dram_addr=0) if stride_class(ins) else ins


def block_period(prog: Sequence[Instr], blocks: int) -> tuple[int, int] | None:
    """``(start, length)`` of ``blocks`` consecutive runs of ``length`` instructions equal
    in every field but DMA addresses that cover at least half of ``prog`` (a step is mostly
    its decoder blocks): the longest such runs, the earliest of those; None if there are
    none or they hold a REPEAT or END (which cannot be in a loop's body).

    Parameters
    ----------
    prog : sequence of Instr
        A program (END included).
    blocks : int
        How many runs (a model's decoder blocks), >= 2.
    """
    if blocks < 2:
        raise ValueError(f"a block loop needs at least 2 blocks, got {blocks}")
    index: dict[Instr, int] = {}
    ids = np.array([index.setdefault(_key(i), len(index)) for i in prog], dtype=np.int64)
    n = len(ids)
    for length in range(n // blocks, max(1, -(-n // (2 * blocks))) - 1, -1):
        span = n - blocks * length + 1  # the starts that leave room for every block
        ok = np.ones(span, bool)
        for k in range(1, blocks):  # block k equals block 0: a window of `length` matches
            eq = ids[k * length:k * length + span + length - 1] == ids[:span + length - 1]
            run = np.concatenate([[0], np.cumsum(eq)])
            ok &= run[length:length + span] - run[:span] == length
            if not ok.any():
                break
        if ok.any():
            start = int(np.argmax(ok))
            if any(isinstance(i, (Repeat, End)) for i in prog[start:start + length]):
                return None
            return start, length
    return None


def block_strides(prog: Sequence[Instr], start: int, length: int, blocks: int,
                  shared: Sequence[tuple[int, int]] = ()) -> dict[str, int] | None:
    """The REPEAT's per-class strides (beats) of the blocks at ``start`` (each ``length``
    instructions, ``blocks`` of them): every DMA of a class advances by one stride from each
    block to the next; None where one does not, or a stride is negative or too wide.

    A DMA that every block issues at the same address in one of ``shared`` (beat ranges
    ``[lo, hi)``: constants with a copy in every frame, :attr:`FramePlan.copies`) advances by
    its class's stride in the loop, to the next frame's copy; the other DMAs of its class
    give that stride (None where none does)."""
    out: dict[str, int] = {}
    copied: set[str] = set()
    for j in range(start, start + length):
        c = stride_class(prog[j])
        if c is None:
            continue
        addrs = [prog[j + m * length].dram_addr for m in range(blocks)]
        if len(set(addrs)) == 1 and any(lo <= addrs[0] < hi for lo, hi in shared):
            copied.add(c)
            continue
        for m in range(1, blocks):
            d = addrs[m] - addrs[m - 1]
            if out.setdefault(c, d) != d or not 0 <= d < _STRIDE_LIMIT:
                return None
    if not copied <= set(out):
        return None
    return {k: out.get(k, 0) for k in ("wgt_stride", "load_stride", "store_stride")}


@dataclass(frozen=True)
class FramePlan:
    """Where the symbols a joined step's blocks address go: ``slots`` maps a symbol to
    ``(frame, offset)`` (bytes in the frame), ``frame_bytes`` is ``F`` (beat-aligned),
    ``frames`` how many; ``copies`` maps each copy's symbol (:func:`copy_name`) to the
    symbol it copies (a constant every block reads alike); ``sizes`` the ``(bytes, kind)``
    of every symbol in a frame but the copies."""

    slots: dict[str, tuple[int, int]]
    frame_bytes: int
    frames: int
    copies: dict[str, str]
    sizes: dict[str, tuple[int, str]]

    @property
    def total_bytes(self) -> int:
        """Bytes from frame 0's start to the end of the last symbol (the last frame holds
        only what the last block writes for after the loop)."""
        return max(m * self.frame_bytes + off + self.sizes[self.copies.get(s, s)][0]
                   for s, (m, off) in self.slots.items())


def copy_name(symbol: str, frame: int) -> str:
    """The symbol of frame ``frame``'s copy of constant ``symbol`` (frame 0 holds ``symbol``
    itself)."""
    return f"{symbol}@{frame}"


class _Chains:
    """Union-find of symbols with frame offsets: ``frame(b) = frame(a) + d`` per union."""

    def __init__(self) -> None:
        self.parent: dict[str, tuple[str, int]] = {}

    def find(self, a: str) -> tuple[str, int]:
        p, d = self.parent.setdefault(a, (a, 0))
        if p == a:
            return a, 0
        root, dr = self.find(p)
        self.parent[a] = (root, d + dr)
        return root, d + dr

    def union(self, a: str, b: str, d: int) -> bool:
        """``frame(b) = frame(a) + d``; False where that contradicts what is known."""
        ra, da = self.find(a)
        rb, db = self.find(b)
        if ra == rb:
            return db == da + d
        self.parent[rb] = (ra, da + d - db)
        return True


def _owners(symbols: Mapping[str, Region], beat: int):
    """A function from a DRAM beat to ``(symbol, byte offset)`` of the one region holding
    it (None where none or two that do not nest do)."""
    regs = sorted(((r.addr, r.addr + max(r.nbytes, 1), n) for n, r in symbols.items()),
                  key=lambda t: (t[0], -t[1]))
    starts = np.array([a for a, _, _ in regs], dtype=np.int64)

    def owner(addr_beats: int) -> tuple[str, int] | None:
        byte = addr_beats * beat
        hit = [(a, e, n) for a, e, n in regs[:int(np.searchsorted(starts, byte, "right"))]
               if a <= byte < e]
        if not hit:
            return None
        hit.sort(key=lambda t: t[1] - t[0])  # innermost first; the rest must hold it whole
        a, e, n = hit[0]
        if any(not (a2 <= a and e <= e2) for a2, e2, _ in hit[1:]):
            return None
        return n, byte - a
    return owner


def frame_plan(words: np.ndarray, symbols: Mapping[str, Region], blocks: int, beat: int,
               constant: Mapping[str, bool]) -> FramePlan | None:
    """The frames of a joined decode step whose blocks are periodic (:func:`block_period`).

    Parameters
    ----------
    words : ndarray
        The joined program's words (``uint64 [n, 2]``).
    symbols : mapping
        Every DRAM symbol the program may address (no two overlapping but nested ones:
        a phase's arena buffers, the constants, weights and KV cache), by name.
    blocks : int
        The model's decoder blocks.
    beat : int
        Bytes per DRAM beat.
    constant : mapping
        Per symbol, whether it is a constant the compiler writes (may be copied per frame).

    Returns
    -------
    FramePlan or None
        None where there are no periodic blocks, a body DMA's address is outside every
        symbol or at different offsets in its symbols from block to block, a buffer is
        addressed alike by every block, or the chains of symbols contradict one another.
    """
    prog = instructions(words)
    period = block_period(prog, blocks)
    if period is None:
        return None
    start, length = period
    owner = _owners(symbols, beat)
    chains = _Chains()
    copies: dict[str, str] = {}
    for j in range(start, start + length):
        if stride_class(prog[j]) is None:
            continue
        hits = [owner(prog[j + m * length].dram_addr) for m in range(blocks)]
        if any(h is None for h in hits) or len({off for _, off in hits}) != 1:
            return None
        names = [n for n, _ in hits]
        if len(set(names)) == 1:  # the same symbol in every block: a copy per frame
            if not constant.get(names[0], False):
                return None
            names = [names[0]] + [copy_name(names[0], m) for m in range(1, blocks)]
            copies.update({c: names[0] for c in names[1:]})
        elif len(set(names)) != blocks:
            return None
        for m in range(1, blocks):
            if not chains.union(names[m - 1], names[m], 1):
                return None
    where: dict[str, tuple[str, int]] = {s: chains.find(s) for s in chains.parent}
    roots: dict[str, dict[int, str]] = {}
    for s, (root, d) in where.items():
        if roots.setdefault(root, {}).setdefault(d, s) != s:
            return None  # two symbols claim one frame's slot
    size = {s: symbols[copies.get(s, s)].nbytes for s in where}
    low = {root: min(ds) for root, ds in roots.items()}
    offset, slot_at = 0, {}  # the chains that reach the last frame first: it ends early
    for root in sorted(roots, key=lambda r: (low[r] - max(roots[r]), r)):
        slot_at[root] = offset
        need = max(size[s] for s in roots[root].values())
        offset += -(-max(need, 1) // beat) * beat
    frame = offset
    frames = max(max(ds) - low[root] + 1 for root, ds in roots.items())
    if frame // beat >= _STRIDE_LIMIT:
        return None
    slots = {s: (d - low[root], slot_at[root]) for s, (root, d) in where.items()}
    sizes = {s: (symbols[s].nbytes, symbols[s].kind) for s in where if s not in copies}
    return FramePlan(slots, frame, frames, copies, sizes)


def frame_symbols(symbols: Mapping[str, Region], plan: FramePlan, base: int
                  ) -> dict[str, Region]:
    """``symbols`` (those not in ``plan``) and those of ``plan`` in frames from byte ``base``
    (beat-aligned) on, every copy included (a region of its original's size and kind)."""
    out = {n: r for n, r in symbols.items() if n not in plan.slots}
    for s, (m, off) in plan.slots.items():
        nbytes, kind = plan.sizes[plan.copies.get(s, s)]
        out[s] = Region(base + m * plan.frame_bytes + off, nbytes, kind)
    return out


def copy_row(src: int, dst: int, beats: int, beat_bytes: int) -> list[Instr]:
    """The instructions that copy ``beats`` DRAM beats from beat ``src`` to beat ``dst``
    through the vector engine, and hold back every later LOAD until the copy has landed:
    a LOAD into VIN from 0, an INSERT of the row's own first word over itself (its result
    is the row: one pass, no constant operand) into VOUT from 0, a STORE of it and a SYNC
    of the LOAD engine on the STORE.

    Its events are the ones a fused program's vector parts use for these pairs of engines
    (LOAD -> VECTOR, VECTOR -> STORE, STORE -> LOAD: :data:`sw.compile.fusion.VECTOR_EVENTS`,
    :data:`sw.compile.schedule.EVENTS`), each waited on as often as signalled: placed first
    in a program, it leaves every counter at 0, and its VIN and VOUT words are free again
    before the next LOAD (every later VEC reads what a later LOAD brings). Its LOAD is
    element 0 of the list (the word a runtime points at a run-time source).

    Parameters
    ----------
    src, dst : int
        DRAM beats of the row and of where it goes.
    beats : int
        The row's beats (>= 1), whole words of ``beat_bytes`` each.
    beat_bytes : int
        Bytes per DRAM beat.
    """
    if beats < 1:
        raise ValueError(f"a row copy needs at least 1 beat, got {beats}")
    full, out_full = VECTOR_EVENTS[EVENTS["FULL0"]], VECTOR_EVENTS[EVENTS["OUT_FULL0"]]
    stored = EVENTS["STORED0"]
    words = beats * beat_bytes // 4
    return [Load(spad=Spad.VIN, dram_addr=src, rows=1, row_beats=beats, dram_stride=beats,
                 signal=full),
            Vec(func=VecFunc.INSERT, length=words, imm=insert_imm(0, 4), wait=full,
                signal=out_full),
            Store(spad=Spad.VOUT, dram_addr=dst, rows=1, row_beats=beats, dram_stride=beats,
                  wait=out_full, signal=stored),
            Sync(engine=Engine.LOAD, wait=stored)]


def roll_blocks(words: np.ndarray, blocks: int, *, shared: Sequence[tuple[int, int]] = (),
                position_rows: Sequence[int] = (),
                imm_rows: Sequence[int] = (),
                append_rows: Sequence[tuple[int, str, str, int]] = (),
                first: Sequence[Instr] = ()) -> dict | None:
    """A joined step's ``words`` with its blocks as one REPEAT, and its run-time rows moved.

    The body is block 0 (``shared``: as :func:`block_strides`); a run-time row in block
    ``m`` names block 0's word (the host patches
    it once, for every layer: ``position_rows`` and ``imm_rows`` once each, ``append_rows``
    one per layer naming the same word, which the runtime moves once). ``first`` goes
    before everything (:func:`copy_row`: at rows ``0 .. len(first) - 1``).

    Returns
    -------
    dict or None
        ``words``, ``position_rows``, ``imm_rows``, ``append_rows`` of the rolled program
        and ``repeat`` (the :class:`hw.isa.Repeat`); None where the blocks are not periodic
        with one stride per class (:func:`block_strides`) or too many or too long.
    """
    prog = instructions(words)
    period = block_period(prog, blocks)
    if period is None:
        return None
    start, length = period
    strides = block_strides(prog, start, length, blocks, shared)
    if strides is None or blocks > _COUNT_MAX or length > _LENGTH_MAX:
        return None
    rep = Repeat(length=length, count=blocks, **strides)
    end = start + blocks * length
    words = np.asarray(words)
    out = np.concatenate([program_words(list(first)), words[:start], program_words([rep]),
                          words[start:start + length], words[end:]])

    def moved(i: int) -> int:
        if i < start:
            return len(first) + i
        if i < end:
            return len(first) + start + 1 + (i - start) % length
        return len(first) + i - (blocks - 1) * length + 1

    def once(rows):
        return tuple(dict.fromkeys(rows))
    return {"words": out, "repeat": rep,
            "position_rows": once(moved(i) for i in position_rows),
            "imm_rows": once(moved(i) for i in imm_rows),
            "append_rows": tuple((moved(i), *rest) for i, *rest in append_rows)}
