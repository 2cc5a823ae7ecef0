"""Scratchpads: one memory with a word port for the compute core and a beat port for a DMA engine.

The compute core addresses a scratchpad in *words* (``cfg.<name>_word_bytes``), the DMA engines
in *beats* (``cfg.beat_bytes``). A scratchpad stores rows of ``max(word, beat)`` bytes; the
narrower port selects its part of a row:

* a narrower **writer** writes the whole row with byte enables on its part only (so LOAD beats
  fill a 64-byte WGT word in four writes, and full-word OUT writes of an 8-lane core land in half
  of a 16-byte row);
* a narrower **reader** reads the row and selects its part with the low address bits,
  registered with the read (synchronous reads keep their one-cycle latency).

Byte ``i`` of a port word is byte ``addr * port_bytes + i`` of the scratchpad on both sides, so
beat and word addresses name the same bytes as :mod:`sim.functional`.

A read of a row in the cycle the other port writes it returns **undefined** data: the memory
carries Yosys' ``no_rw_check``, so synthesis maps it onto the block RAMs as they are instead of
adding the comparators, registers and multiplexers that emulate a defined collision (569 LUTs
and 274 flip-flops on a 64 KiB WGT scratchpad, and the 2x8 array's critical path through the
decoder's next WGT address). Race-free programs never use such a read: an instruction's reads
of data another engine writes are ordered by events, at row granularity (scratchpad buffers and
the equivalence harness's slices are word-aligned), and the only reads that can meet a write
are the decoder's reads ahead of its stream's end and of the next stream's first word while it
is idle, which the stream never consumes (:mod:`hw.decoder`). RTL simulation returns the old
row, as :mod:`sim.functional` would.
"""

from __future__ import annotations

from amaranth import Cat, Module, Signal, unsigned
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import Out
from amaranth.utils import ceil_log2

__all__ = ["Scratchpad"]

_DIRS = ("read", "write")
_PORT = {"read": "{}_rd", "write": "{}_wr"}


def _is_pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


class Scratchpad(wiring.Component):
    """One scratchpad with a compute-side word port and a DMA-side beat port.

    Parameters
    ----------
    size_bytes:
        Capacity.
    word_bytes:
        Width of the compute core's port.
    beat_bytes:
        Width of the DMA engine's port.
    core:
        ``"read"`` or ``"write"``: the direction of the compute core's port; the DMA port has
        the other one.
    core_reads:
        Read ports on the core side (``core == "read"``): 1, or 2 for the vector engine's VIN,
        which reads an element of each of two operand rows per cycle (the memory is then
        duplicated in block RAM: each copy has one read and one write port).
    core_lanes:
        Words the core port moves a cycle (a power of two, at most a row's words): the vector
        engine's lanes (:attr:`hw.config.AcceleratorConfig.vector_lanes`). The core port is
        ``core_lanes * word_bytes`` wide and addresses aligned groups of ``core_lanes`` words;
        a core writer then has an enable per word (``granularity = 8 * word_bytes``), so that
        it writes any of a group's words and keeps the others.

    Members
    -------
    core_rd or core_wr: Out(ReadPort.Signature | WritePort.Signature)
        Word port (``addr_width = ceil_log2(size_bytes // (core_lanes * word_bytes))``),
        full-word writes (an enable per word with ``core_lanes > 1``).
    core_rd1: Out(ReadPort.Signature)
        The second core read port, with ``core_reads=2``.
    dma_rd or dma_wr: Out(ReadPort.Signature | WritePort.Signature)
        Beat port (``addr_width = ceil_log2(size_bytes // beat_bytes)``), full-beat writes.
    """

    def __init__(self, *, size_bytes: int, word_bytes: int, beat_bytes: int, core: str,
                 core_reads: int = 1, core_lanes: int = 1):
        for name, v in (("word_bytes", word_bytes), ("beat_bytes", beat_bytes)):
            if not isinstance(v, int) or not _is_pow2(v):
                raise ValueError(f"{name} must be a power of two, got {v!r}")
        row = max(word_bytes, beat_bytes)
        if not isinstance(size_bytes, int) or size_bytes <= 0 or size_bytes % row:
            raise ValueError(f"size_bytes must be a positive multiple of {row}, "
                             f"got {size_bytes!r}")
        if core not in _DIRS:
            raise ValueError(f"core must be one of {_DIRS}, got {core!r}")
        if core_reads not in ((1, 2) if core == "read" else (1,)):
            raise ValueError(f"core_reads must be 1 (or 2 for a core-side reader), got "
                             f"{core_reads!r} with core={core!r}")
        if not isinstance(core_lanes, int) or not _is_pow2(core_lanes) \
                or core_lanes * word_bytes > row:
            raise ValueError(f"core_lanes must be a power of two of at most {row // word_bytes} "
                             f"words (a {row}-byte row), got {core_lanes!r}")
        self._core_reads = core_reads
        self._lanes = core_lanes
        self._lane_bytes = word_bytes
        word_bytes *= core_lanes    # the core port's width
        self._size = size_bytes
        self._word = word_bytes
        self._beat = beat_bytes
        self._core_dir = core
        dma = "write" if core == "read" else "read"
        self._dma_dir = dma
        super().__init__({
            _PORT[core].format("core"): Out(self._port_sig(core, word_bytes)),
            _PORT[dma].format("dma"): Out(self._port_sig(dma, beat_bytes)),
            **{f"core_rd{k}": Out(self._port_sig("read", word_bytes))
               for k in range(1, core_reads)},
        })

    def _port_sig(self, direction: str, port_bytes: int):
        aw = ceil_log2(self._size // port_bytes)
        if direction == "read":
            return memory.ReadPort.Signature(addr_width=aw, shape=unsigned(8 * port_bytes))
        # (only the core port is ever as wide as lanes of words, and only then has lanes > 1)
        lanes = self._lanes if port_bytes == self._word and self._core_dir == "write" else 1
        return memory.WritePort.Signature(
            addr_width=aw, shape=unsigned(8 * port_bytes),
            granularity=8 * self._lane_bytes if lanes > 1 else None)

    @property
    def row_bytes(self) -> int:
        return max(self._word, self._beat)

    @property
    def depth(self) -> int:
        """Rows of the underlying memory."""
        return self._size // self.row_bytes

    def elaborate(self, platform):
        m = Module()
        row = self.row_bytes
        core_port = self.core_rd if self._core_dir == "read" else self.core_wr
        dma_port = self.dma_rd if self._dma_dir == "read" else self.dma_wr
        writer, w_bytes = (core_port, self._word) if self._core_dir == "write" \
            else (dma_port, self._beat)
        reader, r_bytes = (core_port, self._word) if self._core_dir == "read" \
            else (dma_port, self._beat)

        m.submodules.mem = mem = memory.Memory(shape=unsigned(8 * row), depth=self.depth,
                                               init=[], attrs={"no_rw_check": 1})
        # a core writer of lanes: an enable per word
        lanes = self._lanes if self._core_dir == "write" else 1
        narrow_w = w_bytes < row or lanes > 1
        wp = mem.write_port(granularity=8 if narrow_w else None)

        # Writer: full rows, or its part of a row with byte enables.
        if narrow_w:
            parts = row // w_bytes
            sel_bits = ceil_log2(parts)
            sel = writer.addr[:sel_bits]
            word_en = [writer.en[j // (w_bytes // lanes)] for j in range(w_bytes)]
            m.d.comb += [
                wp.addr.eq(writer.addr[sel_bits:]),
                wp.data.eq(Cat(writer.data for _ in range(parts))),
                wp.en.eq(Cat(Cat(e & (sel == i) for e in word_en)
                             for i in range(parts))),
            ]
        else:
            m.d.comb += [wp.addr.eq(writer.addr), wp.data.eq(writer.data), wp.en.eq(writer.en)]

        # Readers: full rows, or their part selected by address bits registered with the read.
        readers = [reader] + [getattr(self, f"core_rd{k}") for k in range(1, self._core_reads)]
        for k, reader in enumerate(readers):
            rp = mem.read_port()
            m.d.comb += rp.en.eq(reader.en)
            if r_bytes < row:
                parts = row // r_bytes
                sel_bits = ceil_log2(parts)
                sel = Signal(sel_bits, name=f"sel{k}" if k else "sel")
                with m.If(reader.en):
                    m.d.sync += sel.eq(reader.addr[:sel_bits])
                m.d.comb += [
                    rp.addr.eq(reader.addr[sel_bits:]),
                    reader.data.eq(rp.data.word_select(sel, 8 * r_bytes)),
                ]
            else:
                m.d.comb += [rp.addr.eq(reader.addr), reader.data.eq(rp.data)]
        return m
