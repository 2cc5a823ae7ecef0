"""Loop rolling: periodic runs of a schedule as hardware loops (:class:`hw.isa.Repeat`).

A lowered schedule is fully unrolled: a layer's output tiles, a vector program's rows repeat
the same few instructions (a double-buffer period) with DRAM addresses that advance by a
constant stride per period, one stride per transfer class (:func:`hw.isa.loop_stride`:
weight tiles, other loads, stores). :func:`roll` finds such runs and writes each as a REPEAT
and one period, so that the program the instruction memory holds shrinks by about the
number of periods while the fetch unit dispatches exactly the instructions of the unrolled
schedule (:func:`hw.isa.loop_stream`), each loop-back costing
:data:`hw.timing.LOOP_BACK_LATENCY` cycles of fetch.

Rolled: instructions equal in every field but a LOAD's or STORE's ``dram_addr``, with the same
relocation (the same DRAM symbol, so relocation keeps the differences), whose addresses
advance by one stride per class in ``[0, 2**27)`` (the REPEAT's field). Never rolled: a
SOFTMAX VEC (the host sets its ``imm`` per row in the encoded words, :attr:`Template.imm_rows`).
Greedy from the front: at each position the body length (up to ``max_body``) that removes
the most instructions wins; nothing else changes.

Example
-------
>>> from hw.isa import Load, Spad, Repeat
>>> prog = [Load(spad=Spad.WGT, dram_addr=8 * i) for i in range(4)]
>>> rolled, relocs = roll(prog, [None] * 4)
>>> rolled[0] == Repeat(length=1, count=4, wgt_stride=8), rolled[1] == prog[0]
(True, True)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from hw.isa import (
    MOVE_SOURCES,
    Instr,
    Load,
    Repeat,
    RepeatBody,
    Spad,
    Store,
    Vec,
    VecFunc,
)

__all__ = ["roll", "roll_words", "stride_class", "MAX_BODY"]

#: Longest body :func:`roll` tries (instructions): a layer's period is a few instructions;
#: longer bodies cost search time for little gain.
MAX_BODY = 64
_COUNT_MAX = (1 << RepeatBody["count"].width) - 1
_STRIDES = ("wgt_stride", "load_stride", "store_stride")
_STRIDE_LIMIT = {k: 1 << RepeatBody[k].width for k in _STRIDES}


def stride_class(ins: Instr) -> str | None:
    """The stride class of a transfer (:func:`hw.isa.loop_stride`), None for the rest (a
    move's VIN rows do not advance)."""
    if isinstance(ins, Load):
        return "wgt_stride" if ins.spad == Spad.WGT else "load_stride"
    if isinstance(ins, Store) and ins.spad not in MOVE_SOURCES:
        return "store_stride"
    return None


def _key(j: int, ins: Instr, reloc) -> tuple:
    """What must repeat exactly: every field but a transfer's DRAM address, its relocation.
    A SOFTMAX VEC's key is unique (never rolled)."""
    if isinstance(ins, Vec) and ins.func == VecFunc.SOFTMAX:
        return ("softmax", j)
    if stride_class(ins) is not None:
        return (dataclasses.replace(ins, dram_addr=0), reloc)
    return (ins, reloc)


def _strides(prog: Sequence[Instr], start: int, length: int) -> dict[str, int] | None:
    """The per-class strides from the period at ``start`` to the next, None if a class's
    transfers disagree or a stride is negative or too wide for the REPEAT."""
    out = dict.fromkeys(_STRIDES, 0)
    seen: set[str] = set()
    for j in range(start, start + length):
        c = stride_class(prog[j])
        if c is None:
            continue
        d = prog[j + length].dram_addr - prog[j].dram_addr
        if c in seen and out[c] != d:
            return None
        if not 0 <= d < _STRIDE_LIMIT[c]:
            return None
        out[c], seen = d, seen | {c}
    return out


def _period_matches(prog, keys, start: int, length: int, k: int, strides) -> bool:
    """Period ``k`` of the run at ``start`` is period 0 advanced ``k`` strides."""
    base = start + k * length
    if keys[base:base + length] != keys[start:start + length]:
        return False
    for j in range(length):
        c = stride_class(prog[start + j])
        if c is not None and prog[base + j].dram_addr != prog[start + j].dram_addr \
                + k * strides[c]:
            return False
    return True


def _best_run(prog, keys, i: int, max_body: int) -> tuple[int, int, dict] | None:
    """``(length, count, strides)`` of the run at ``i`` that saves the most instructions."""
    n = len(prog)
    best, best_saved = None, 0
    for length in range(1, min(max_body, (n - i) // 2) + 1):
        if keys[i + length] != keys[i] or keys[i + length:i + 2 * length] != \
                keys[i:i + length]:
            continue
        strides = _strides(prog, i, length)
        if strides is None:
            continue
        count = 2
        while count < _COUNT_MAX and i + (count + 1) * length <= n and \
                _period_matches(prog, keys, i, length, count, strides):
            count += 1
        saved = (count - 1) * length - 1
        if saved > best_saved:
            best, best_saved = (length, count, strides), saved
    return best


def roll(prog: Sequence[Instr], relocs: Sequence, max_body: int = MAX_BODY
         ) -> tuple[list[Instr], list]:
    """The schedule ``(prog, relocs)`` with its periodic runs as REPEATs.

    Parameters
    ----------
    prog : sequence of Instr
        A lowered schedule (no END, no REPEAT).
    relocs : sequence
        Per instruction, its relocation (``(layer, operand)`` or None,
        :mod:`sw.compile.relocation`).
    max_body : int
        Longest body tried.

    Returns
    -------
    (list of Instr, list)
        The rolled program and its relocations (None for each REPEAT); run on the hardware
        it dispatches the instructions of ``prog`` in order, with their addresses.
    """
    if any(isinstance(ins, Repeat) for ins in prog):
        raise ValueError("roll takes a schedule without REPEATs")
    out_prog, out_relocs, _ = _roll(prog, relocs, max_body)
    return out_prog, out_relocs


def _roll(prog: Sequence[Instr], relocs: Sequence, max_body: int
          ) -> tuple[list[Instr], list, list[int]]:
    """:func:`roll`, and per output instruction the index in ``prog`` of the one it is (of
    a body's: the first period's), -1 for a REPEAT."""
    keys = [_key(j, ins, r) for j, (ins, r) in enumerate(zip(prog, relocs, strict=True))]
    out_prog: list[Instr] = []
    out_relocs: list = []
    origin: list[int] = []
    i, n = 0, len(prog)
    while i < n:
        run = _best_run(prog, keys, i, max_body)
        if run is None:
            out_prog.append(prog[i])
            out_relocs.append(relocs[i])
            origin.append(i)
            i += 1
            continue
        length, count, strides = run
        out_prog += [Repeat(length=length, count=count, **strides)] + list(prog[i:i + length])
        out_relocs += [None] + list(relocs[i:i + length])
        origin += [-1, *range(i, i + length)]
        i += length * count
    return out_prog, out_relocs, origin


def roll_words(prog: Sequence[Instr], keep: Collection[int] = (), max_body: int = MAX_BODY
               ) -> tuple[list[Instr], dict[int, int]]:
    """The relocated program ``prog`` (no END, no REPEAT: every address final) with its
    periodic runs as REPEATs (:func:`roll`), but for the instructions ``keep`` (indices:
    words the runtime sets per step), which no run holds.

    Returns
    -------
    (list of Instr, dict)
        The rolled program, and where each of ``keep`` lies in it.
    """
    relocs = [("keep", j) if j in keep else None for j in range(len(prog))]
    out, _, origin = _roll(prog, relocs, max_body)
    where = {j: k for k, j in enumerate(origin) if j in keep}
    if set(where) != set(keep):  # pragma: no cover - a kept word's key is its own
        raise AssertionError("a kept instruction was rolled into a loop")
    return out, where
