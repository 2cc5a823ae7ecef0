"""Per-engine instruction queues and the entry layouts they hold.

Fetch writes one entry per dispatched instruction; the engine's sequencer (:mod:`hw.engine`)
pops it. An entry keeps only what the engine needs: the event ids, whether it is a SYNC, and
the instruction body the engine's executor consumes (the engine's ``body`` in
:data:`hw.engines.ENGINES`: :data:`hw.isa.DmaBody` for LOAD and STORE, :data:`hw.isa.GemmBody`
for COMPUTE).

Timing (hw/timing.py, "Fetch"): an entry written in cycle ``d`` can be popped from ``d + 1``; a
slot freed by a pop in cycle ``p`` can be written from ``p + 1`` (``w.ready`` is a registered
"not full", there is no same-cycle bypass).
"""

from __future__ import annotations

from amaranth import Module, Mux, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.isa import DmaBody, GemmBody, Header

__all__ = ["EVENT_ID_BITS", "entry_layout", "DMA_ENTRY", "GEMM_ENTRY", "InstrQueue"]

#: Width of an event id in an instruction (``hw.isa.NO_EVENT`` = all ones means "none").
EVENT_ID_BITS = Header["wait"].width


def entry_layout(body: data.Layout) -> data.StructLayout:
    """The queue entry of an engine whose executor takes ``body``."""
    return data.StructLayout({
        "wait": EVENT_ID_BITS,
        "signal": EVENT_ID_BITS,
        "sync": 1,        # SYNC: only wait and/or signal, the body is ignored
        "body": body,
    })


DMA_ENTRY = entry_layout(DmaBody)
GEMM_ENTRY = entry_layout(GemmBody)


class InstrQueue(wiring.Component):
    """A first-in first-out queue of ``depth`` entries in distributed RAM.

    Parameters
    ----------
    layout:
        Entry layout (see :func:`entry_layout`).
    depth:
        Number of entries, at least 1 (need not be a power of two).
    ready_copy:
        ``w.ready`` is a copy of the "not full" register (``keep``, :mod:`hw.fanout`) that
        the write side alone reads, the queue's own writes reading the original: the placer
        can put the copy beside the fetch unit, whose dispatch decision reads it, so that the
        wire across the die lies in front of a register, not between it and fetch's logic.

    Members
    -------
    w: In(stream.Signature(layout))
        Write side; ``ready`` is "not full" as registered at the start of the cycle.
    r: Out(stream.Signature(layout))
        Read side (first-word fall-through); ``valid`` is "not empty" as registered.
    level: Out(range(depth + 1))
        Entries held.
    """

    def __init__(self, layout: data.Layout, depth: int, ready_copy: bool = False):
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"queue depth must be a positive integer, got {depth!r}")
        self._layout = layout
        self._depth = depth
        self._ready_copy = ready_copy
        super().__init__({
            "w": In(stream.Signature(layout)),
            "r": Out(stream.Signature(layout)),
            "level": Out(range(depth + 1)),
        })

    @property
    def depth(self) -> int:
        return self._depth

    def elaborate(self, platform):
        m = Module()
        depth = self._depth
        m.submodules.storage = storage = memory.Memory(shape=self._layout, depth=depth, init=[])
        wp = storage.write_port()
        rp = storage.read_port(domain="comb")
        w_ptr = Signal(range(depth))
        r_ptr = Signal(range(depth))

        def inc(ptr):
            return Mux(ptr == depth - 1, 0, ptr + 1)

        not_full = Signal(init=1)
        push = self.w.valid & (not_full if self._ready_copy else self.w.ready)
        pop = self.r.valid & self.r.ready
        # Registered flags: `ready` feeds the fetch unit's stall logic. push and pop arrive
        # late in their cycle, so the flags' next values are tests of `level` that they only
        # pick from, not a comparison behind the level's adder.
        not_empty = Signal()
        level_next = self.level + push - pop
        not_full_next = pop | (self.level < depth - 1) | ((self.level == depth - 1) & ~push)
        m.d.sync += [not_full.eq(not_full_next),
                     not_empty.eq(push | (self.level > 1) | ((self.level == 1) & ~pop))]
        ready = not_full
        if self._ready_copy:   # (reset to "not full", as the original)
            ready = Signal(init=1, name="ready_copy", attrs={"keep": 1})
            m.d.sync += ready.eq(not_full_next)
        m.d.comb += [
            self.w.ready.eq(ready),
            self.r.valid.eq(not_empty),
            wp.addr.eq(w_ptr), wp.data.eq(self.w.payload), wp.en.eq(push),
            rp.addr.eq(r_ptr), self.r.payload.eq(rp.data),
        ]
        with m.If(push):
            m.d.sync += w_ptr.eq(inc(w_ptr))
        with m.If(pop):
            m.d.sync += r_ptr.eq(inc(r_ptr))
        m.d.sync += self.level.eq(level_next)
        return m
