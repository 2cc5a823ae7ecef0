"""Relocatable programs: layers scheduled once with every DRAM address 0, placed anywhere.

A *template* is a schedule (:func:`sw.compile.schedule.schedule_layers`) of layers whose
operands are DRAM *symbols* rather than addresses, encoded to instruction words once, with the
rows whose ``dram_addr`` is relative and the operand each is relative to. :func:`relocate`
places it: it adds each operand's base to those fields of a copy of the words. Layers with the
same shapes and formats at other addresses (the blocks of a decoder) share one template, and
one layer compiled alone (:mod:`sw.compile.layers`) is a template placed once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hw.config import AcceleratorConfig
from hw.isa import End, Vec, VecFunc, field_location, program_words
from sw.compile.errors import LoweringError
from sw.compile.roll import roll
from sw.compile.schedule import (
    AmaxPlace,
    PlacedLayer,
    Schedule,
    schedule_argmax,
    schedule_dequant,
    schedule_layers,
    schedule_requant,
    schedule_vector,
)
from sw.compile.tiling import LinearPlan

__all__ = ["OPERANDS", "SymbolicLayer", "Template", "lower_template", "lower_vector_template",
           "lower_requant_template", "lower_dequant_template",
           "lower_argmax_template", "relocate"]

#: The operands of a layer, in the order of a template's relocation keys.
_OPERANDS = {"w": 0, "x": 1, "y": 2, "b": 3}
#: The operands in that order (a relocation key is ``layer * len(OPERANDS) + operand``).
OPERANDS = tuple(_OPERANDS)


class SymbolicLayer(Protocol):
    """A layer of a template: its plan and the DRAM symbols of its operands (weights ``w``,
    int8 inputs ``x``, int32 outputs ``y``, int32 bias rows ``b`` or None), and the weight
    tiles' stride when it is not the plan's (:class:`sw.compile.lower.Member` is one)."""

    @property
    def plan(self) -> LinearPlan: ...
    @property
    def w(self) -> str: ...
    @property
    def x(self) -> str: ...
    @property
    def y(self) -> str: ...
    @property
    def b(self) -> str | None: ...
    @property
    def w_tile_stride(self) -> int | None: ...


@dataclass(frozen=True)
class Template:
    """A program lowered with every address 0, encoded, with its relocations."""

    words: np.ndarray          # uint64 [n, 2], END included
    reloc_rows: np.ndarray     # instruction indices whose dram_addr is relative
    reloc_keys: np.ndarray     # per such instruction: layer * 4 + operand (w, x, y, b)
    instructions: int
    #: The SOFTMAX VECs, one per row in row order, whose ``imm`` (valid positions) is relative
    #: to the run-time register ``pos`` (:func:`hw.isa.relative_fields`) when the rows are
    #: causal (empty for other programs).
    imm_rows: tuple[int, ...] = ()
    #: A ROPE program's LOADs of its rotary table rows, relative to ``pos``: the rows of the
    #: step's positions (empty for other programs).
    position_rows: tuple[int, ...] = ()


def lower_template(cfg: AcceleratorConfig, layers: Sequence[SymbolicLayer], *,
                   loops: bool | None = False, ring: bool | None = None) -> Template:
    """Schedule ``layers`` into one relocatable program (END appended); with ``loops``, its
    periodic runs rolled into hardware loops (:func:`sw.compile.roll.roll`; None: only if the
    unrolled program does not fit the instruction memory). An unrolled program on a
    configuration with a vector engine keeps its weights in a ring
    (:func:`sw.compile.schedule.ring_slots`; ``ring``: True or False to choose); one
    without and a rolled one in the double buffers (a rolled one's instructions then repeat
    every two GEMMs).

    Layers with the same input symbol ``x`` read one resident input (loaded into ACT once).

    Raises
    ------
    LoweringError
        A layer's scratchpad buffers do not fit, or the program is longer than the
        instruction memory (the hardware would stop with PC_OVERFLOW).
    """
    placed = [PlacedLayer(m.plan, w_tile_stride=m.w_tile_stride, x_key=m.x) for m in layers]
    ring = cfg.has_vector if ring is None else ring
    if loops is False:
        return _template(cfg, schedule_layers(cfg, placed, ring=ring), loops)
    # the double buffers' instructions repeat every two GEMMs, which rolls best
    flat = schedule_layers(cfg, placed, ring=ring) if loops is None else None
    if flat is not None and len(flat.instructions) + 1 <= cfg.imem_depth:
        return _template(cfg, flat, False)
    return _template(cfg, schedule_layers(cfg, placed, ring=False), loops)


def lower_vector_template(cfg: AcceleratorConfig, func: VecFunc, rows: int, length: int, *,
                          second: bool = False, const: bool = False, imm: int = 0,
                          table: bool = False, positions: int = 0, halves: bool = False,
                          stride: int = 0, loops: bool | None = False) -> Template:
    """:func:`sw.compile.schedule.schedule_vector` as one relocatable program (END appended;
    its operands are layer 0's ``x``, ``b``, ``w`` and ``y``; a ROPE's table LOADs, those
    relative to ``w``, in :attr:`Template.position_rows`; a SOFTMAX's rows relative to the
    step's first position with ``positions``, the step's tokens; ``halves`` and
    ``stride`` as :func:`~sw.compile.schedule.schedule_vector`'s); ``loops`` as for
    :func:`lower_template`.

    Raises
    ------
    LoweringError
        The rows do not fit the vector scratchpads, or the program the instruction memory.
    """
    t = _template(cfg, schedule_vector(cfg, func, rows, length, second=second, const=const,
                                       imm=imm, table=table, positions=positions,
                                       halves=halves, stride=stride), loops)
    if not table:
        return t
    at = t.reloc_rows[t.reloc_keys == _OPERANDS["w"]]
    return dataclasses.replace(t, position_rows=tuple(int(i) for i in at))


def lower_requant_template(cfg: AcceleratorConfig, rows: int, length: int,
                           act_row_bytes: int, loops: bool | None = False,
                           amax: bool = False, fold: bool = False,
                           x_stride: int = 0) -> Template:
    """:func:`sw.compile.schedule.schedule_requant` as one relocatable program (END appended;
    its operands are layer 0's ``x`` (rows ``x_stride`` beats apart; 0: consecutive), ``y``,
    with ``amax`` where the rows do not hold it ``b``, and with ``fold`` (FOLD: the values
    prologue) the value codes' row ``w``; ``loops``: rolled).

    Raises
    ------
    LoweringError
        A row does not fit the vector scratchpads, or the program the instruction memory.
    """
    return _template(cfg, schedule_requant(cfg, rows, length, act_row_bytes, amax, fold,
                                           x_stride), loops)


def lower_dequant_template(cfg: AcceleratorConfig, rows: int, length: int,
                           acc_row_bytes: int, place: AmaxPlace,
                           loops: bool | None = False, fold: bool = False,
                           y_stride: int = 0) -> Template:
    """:func:`sw.compile.schedule.schedule_dequant` as one relocatable program (END appended;
    its operands are layer 0's ``x``, ``w``, ``b`` and ``y``, rows ``y_stride`` beats apart
    (0: consecutive); ``loops``: rolled; ``fold``: the ``amax`` words are FOLD's).

    Raises
    ------
    LoweringError
        A row does not fit the vector scratchpads, or the program the instruction memory.
    """
    return _template(cfg, schedule_dequant(cfg, rows, length, acc_row_bytes, place, fold,
                                           y_stride), loops)


def lower_argmax_template(cfg: AcceleratorConfig, rows: int, length: int,
                          loops: bool | None = False) -> Template:
    """:func:`sw.compile.schedule.schedule_argmax` as one relocatable program (END appended;
    its operands are layer 0's ``x`` and ``y``; ``loops``: rolled).

    Raises
    ------
    LoweringError
        A row does not fit the vector scratchpads, or the program the instruction memory.
    """
    return _template(cfg, schedule_argmax(cfg, rows, length), loops)


def _template(cfg: AcceleratorConfig, schedule: Schedule, loops: bool | None = False
              ) -> Template:
    """A schedule encoded with END, its relocations and its run-time ``imm`` rows: rolled
    (:func:`sw.compile.roll.roll`) with ``loops``, unrolled without, and with ``loops=None``
    rolled only when the unrolled program does not fit the instruction memory."""
    prog, relocs = roll(*schedule) if loops else schedule
    if loops is None and len(prog) + 1 > cfg.imem_depth:
        prog, relocs = roll(prog, relocs)
    prog = list(prog) + [End()]
    if len(prog) > cfg.imem_depth:
        raise LoweringError(f"the program needs {len(prog)} instructions"
                            f"{' with hardware loops' if loops is not False else ''} and the "
                            f"instruction memory holds {cfg.imem_depth}: lower fewer layers or "
                            "tokens per program, or configure a larger imem_depth")
    rows = np.array([i for i, r in enumerate(relocs) if r is not None], dtype=np.int64)
    keys = np.array([r[0] * len(_OPERANDS) + _OPERANDS[r[1]] for r in relocs if r is not None],
                    dtype=np.int64)
    imm_rows = tuple(i for i, ins in enumerate(prog)
                     if isinstance(ins, Vec) and ins.func == VecFunc.SOFTMAX)
    return Template(program_words(prog), rows, keys, len(prog), imm_rows)


def relocate(t: Template, bases: Mapping[str, int], layers: Sequence[SymbolicLayer],
             beat: int) -> np.ndarray:
    """The template's words with every operand's base (bytes, beat-aligned) added.

    Raises
    ------
    LoweringError
        A relocated address does not fit the instruction's ``dram_addr`` field.
    """
    base = np.array([bases[sym] // beat if (sym := getattr(m, op)) else 0
                     for m in layers for op in _OPERANDS], dtype=np.uint64)
    words = t.words.copy()
    off, width = field_location("dma.dram_addr")
    if off + width > 64:
        raise LoweringError("dram_addr straddles the instruction's 64-bit halves")
    mask = np.uint64((1 << width) - 1) << np.uint64(off)
    lo = words[t.reloc_rows, 0]
    field = (lo & mask) >> np.uint64(off)
    new = field + base[t.reloc_keys]
    if new.size and int(new.max()) >= 1 << width:
        raise LoweringError("a relocated DRAM address does not fit the instruction field")
    words[t.reloc_rows, 0] = (lo & ~mask) | (new << np.uint64(off))
    return words
