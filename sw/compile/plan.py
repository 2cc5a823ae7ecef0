"""Memory planning: where every tensor of a compiled model lives in the accelerator's DRAM.

DRAM holds three kinds of data, laid out one after the other (beat-aligned)::

    [ packed weights | KV cache | activation arena ]

* **weights**: the packed stream of every linear layer the accelerator runs (static);
* **KV cache**: per layer and kv head, the INT8 keys and values of ``max_context`` positions
  in the stream layout the attention products read (static, written by the host step by step);
* **arena**: the INT8 inputs and INT32 outputs of each program. A buffer is live from the
  host stage that writes it to the host stage that reads it (:class:`Buffer`); buffers whose
  lifetimes do not overlap share bytes. :func:`plan_arena` places them greedily by size, each
  at the best-fitting gap (the lowest offset among those that waste least), and
  :func:`lower_bound` is the most bytes live at once, which no placement can beat.

Prefill and decode are never live at once, so their arenas overlap (the arena is the larger).
A model that does not fit raises :class:`~sw.compile.errors.PlanError` with every size.
:func:`layout_dram` is the one DRAM allocator: a model's and a few layers compiled alone
(:mod:`sw.compile.layers`) are laid out by it alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from hw.config import AcceleratorConfig
from sw.compile.errors import PlanError

__all__ = ["Buffer", "ArenaPlan", "plan_arena", "lower_bound", "Region", "DramLayout",
           "layout_dram", "buffer_regions"]


@dataclass(frozen=True)
class Buffer:
    """A tensor that lives in time steps ``[start, end]`` (inclusive) and needs ``size`` bytes."""

    name: str
    size: int
    start: int
    end: int

    def overlaps_in_time(self, other: Buffer) -> bool:
        return self.start <= other.end and other.start <= self.end


@dataclass(frozen=True)
class ArenaPlan:
    """Offsets (bytes from the arena's start) and the arena's size."""

    offsets: dict[str, int]
    size: int
    lower_bound: int

    @property
    def ratio(self) -> float:
        """Arena size over the lower bound (1.0 is optimal)."""
        return self.size / self.lower_bound if self.lower_bound else 1.0


def lower_bound(buffers: Iterable[Buffer]) -> int:
    """The most bytes live in any one time step."""
    events: dict[int, int] = {}
    for b in buffers:
        events[b.start] = events.get(b.start, 0) + b.size
        events[b.end + 1] = events.get(b.end + 1, 0) - b.size
    live = peak = 0
    for t in sorted(events):
        live += events[t]
        peak = max(peak, live)
    return peak


def plan_arena(buffers: Sequence[Buffer], align: int) -> ArenaPlan:
    """Place ``buffers`` (each size rounded up to ``align``) so that no two that are live at
    the same time share a byte: largest first, each into the gap between already placed,
    time-overlapping buffers that leaves the least slack (lowest offset on ties), or on top.
    """
    names = [b.name for b in buffers]
    if len(set(names)) != len(names):
        raise PlanError("buffer names must be unique")

    def rounded(n: int) -> int:
        return -(-n // align) * align

    order = sorted(buffers, key=lambda b: (-rounded(b.size), b.start, b.name))
    # the placed buffers' lifetimes and byte ranges, in placement order
    start, end, lo, hi = (np.zeros(len(order), dtype=np.int64) for _ in range(4))
    offsets: dict[str, int] = {}
    for n, b in enumerate(order):
        size = rounded(b.size)
        live = (start[:n] <= b.end) & (b.start <= end[:n])
        best = _best_gap(lo[:n][live], hi[:n][live], size)
        offsets[b.name] = best
        start[n], end[n], lo[n], hi[n] = b.start, b.end, best, best + size
    size = int(hi.max(initial=0))
    return ArenaPlan(offsets, size, lower_bound(
        Buffer(b.name, rounded(b.size), b.start, b.end) for b in buffers))


def _best_gap(lo: np.ndarray, hi: np.ndarray, size: int) -> int:
    """The offset for ``size`` bytes beside the byte ranges ``[lo, hi)``: the gap between
    them (in order of ``lo``, then ``hi``) that leaves the least slack, the lowest on ties,
    else the top of the highest."""
    order = np.lexsort((hi, lo))
    lo, hi = lo[order], hi[order]
    cursor = np.maximum.accumulate(np.concatenate(([0], hi)))  # the top before each range
    slack = lo - cursor[:-1] - size
    fits = np.flatnonzero(slack >= 0)
    if not fits.size:
        return int(cursor[-1])
    return int(cursor[fits[np.argmin(slack[fits])]])


@dataclass(frozen=True)
class Region:
    """A named DRAM range: ``[addr, addr + nbytes)`` in bytes (``addr`` beat-aligned)."""

    addr: int
    nbytes: int
    kind: str  # "weight", "kv", "arena"

    @property
    def end(self) -> int:
        return self.addr + self.nbytes


@dataclass(frozen=True)
class DramLayout:
    """Every region of a compiled model, and the totals per kind."""

    regions: dict[str, Region]
    weight_bytes: int
    kv_bytes: int
    arena_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.arena_bytes


def layout_dram(cfg: AcceleratorConfig, weights: Sequence[tuple[str, int]],
                kv: Sequence[tuple[str, int]], arenas: Sequence[ArenaPlan]) -> DramLayout:
    """Weights, then KV cache, then one arena as large as the largest phase's; beat-aligned.

    Raises
    ------
    PlanError
        The total exceeds ``cfg.memory.size_bytes``.
    """
    beat = cfg.beat_bytes
    regions: dict[str, Region] = {}
    cursor = 0

    def put(name: str, nbytes: int, kind: str) -> None:
        nonlocal cursor
        if name in regions:
            raise PlanError(f"DRAM region {name!r} placed twice")
        regions[name] = Region(cursor, nbytes, kind)
        cursor += -(-max(nbytes, 1) // beat) * beat

    for name, nbytes in weights:
        put(name, nbytes, "weight")
    w_end = cursor
    for name, nbytes in kv:
        put(name, nbytes, "kv")
    kv_end = cursor
    arena = max((a.size for a in arenas), default=0)
    put("arena", arena, "arena")
    layout = DramLayout(regions, w_end, kv_end - w_end, cursor - kv_end)
    if cursor > cfg.memory.size_bytes:
        raise PlanError(
            f"the model needs {cursor:,} bytes of accelerator DRAM (packed weights "
            f"{layout.weight_bytes:,}, KV cache {layout.kv_bytes:,}, activations "
            f"{layout.arena_bytes:,}) but the configuration has memory.size_bytes="
            f"{cfg.memory.size_bytes:,}; use a configuration with more memory, a shorter "
            f"context, or a sparser format")
    return layout


def buffer_regions(layout: DramLayout, arena: ArenaPlan, buffers: Iterable[Buffer]
                   ) -> dict[str, Region]:
    """The DRAM region of each of ``buffers``: its offset in ``arena`` from the start of
    ``layout``'s arena region."""
    base = layout.regions["arena"].addr
    return {b.name: Region(base + arena.offsets[b.name], b.size, "arena") for b in buffers}
