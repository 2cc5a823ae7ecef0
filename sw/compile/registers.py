"""Run-time register allocation: what each register of a compiled executable holds.

The fetch unit adds a word's run-time register, as is, to a LOAD's or STORE's ``dram_addr``
or a VEC's ``imm`` (:func:`hw.isa.relative_fields`); the executable's register table
(:attr:`sw.compile.executable.Executable.registers`) says what register ``i`` holds in a
step, as a sum of :class:`hw.isa.RegTerm` of the step's position ``pos`` and token ``tok``,
which the host evaluates when it starts the step (:func:`hw.isa.reg_table_values`).

The lowering names a *pending* register (:data:`PENDING`) where a word moves with the
step: a LOAD's or STORE's ``dram_addr`` by the source times its own ``dram_stride`` (row
``pos`` of a rotary table, row ``tok`` of the embedding table), a VEC's ``imm`` by the
source (a causal SOFTMAX's count). :func:`allocate` then gives every distinct sum of terms a
register of its own (all layers' words of one sum share it) and rewrites the words to name
it; a word whose terms the lowering states itself (an on-chip KV append's sites, ``sites``)
is given its register the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from hw.isa import NUM_REGS, Opcode, RegTerm, decode_fields, set_field
from sw.compile.errors import LoweringError

if TYPE_CHECKING:  # the lowering imports this module, the executable the lowering
    from sw.compile.executable import Program

__all__ = ["POS", "TOK", "PENDING", "RegisterFile", "allocate", "allocate_words"]

#: Pending registers of the lowering (:func:`allocate` replaces them) by source.
POS, TOK = 1, 2
PENDING = {POS: "pos", TOK: "tok"}


class RegisterFile:
    """The registers allocated so far: :attr:`table` (register ``i + 1`` holds ``table[i]``)."""

    def __init__(self):
        self.table: list[tuple[RegTerm, ...]] = []

    def index(self, terms: Sequence[RegTerm]) -> int:
        """The register holding ``terms`` (the same one for equal terms).

        Raises
        ------
        LoweringError
            A new sum when all :data:`hw.isa.NUM_REGS` registers hold others.
        """
        terms = tuple(terms)
        if terms in self.table:
            return self.table.index(terms) + 1
        if len(self.table) == NUM_REGS:
            raise LoweringError(f"the program needs more than {NUM_REGS} run-time registers "
                                f"(another: {terms}); they hold {self.table}")
        self.table.append(terms)
        return len(self.table)


def _pending_terms(f: dict, i: int) -> tuple[RegTerm, ...]:
    """The terms of pending word ``i`` (:data:`PENDING`) of fields ``f``."""
    if f["opcode"][i] == Opcode.VEC.value:
        return (RegTerm(PENDING[int(f["vec.reg"][i])]),)
    return (RegTerm(PENDING[int(f["dma.reg"][i])], mul=int(f["dma.dram_stride"][i])),)


def allocate_words(words: np.ndarray, regs: RegisterFile,
                   sites: Mapping[int, tuple[RegTerm, ...]] | None = None, node: str = ""
                   ) -> np.ndarray:
    """Program ``words`` (``uint64 [n, 2]``) with their pending registers (:data:`PENDING`)
    and the words ``sites`` names (``{index: terms}``, naming no register) relative to
    registers of ``regs`` (allocated as needed): a copy, or ``words`` when none moves.

    Raises
    ------
    LoweringError
        A word of ``sites`` already names a register (of program ``node``), or the registers
        run out (:meth:`RegisterFile.index`).
    """
    sites = sites or {}
    if not words.size:
        return words
    f = decode_fields(words)
    op = f["opcode"]
    is_vec = op == Opcode.VEC.value
    dma = (op == Opcode.LOAD.value) | (op == Opcode.STORE.value)
    reg = np.where(is_vec, f["vec.reg"], np.where(dma, f["dma.reg"], 0))
    pending = np.flatnonzero(reg != 0)
    if not pending.size and not sites:
        return words
    out = words.copy()
    moved = [(int(i), _pending_terms(f, int(i))) for i in pending]
    for i, terms in sites.items():
        if reg[i]:
            raise LoweringError(f"node {node!r}: word {i} is relative to a register already")
        moved.append((int(i), tuple(terms)))
    for i, terms in moved:
        set_field(out, np.asarray([i]), "vec.reg" if is_vec[i] else "dma.reg",
                  regs.index(terms))
    return out


def allocate(programs: Sequence[Program], regs: RegisterFile,
             sites: Callable[[Program], Mapping[int, tuple[RegTerm, ...]]] | None = None
             ) -> list[Program]:
    """``programs`` with their words relative to registers of ``regs``
    (:func:`allocate_words`; ``sites(program)``: its words of stated terms)."""
    out = []
    for p in programs:
        words = allocate_words(p.words, regs, sites(p) if sites is not None else None, p.node)
        out.append(p if words is p.words else dataclasses.replace(p, words=words))
    return out
