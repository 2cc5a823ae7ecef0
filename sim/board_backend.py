"""Programs on a board, or its simulation, through the host link (:mod:`sim.board`).

``BoardBackend(cfg, link).run(program, dram)`` returns the same :class:`sim.result.RunResult` as
the fast model, plus the cycles the board's memory froze the accelerator
(:attr:`sim.result.RunResult.stall_cycles`).

The board's DRAM holds the weights, the KV cache and the activations between runs; the link moves
a few hundred kilobytes per second, so a run moves only what it must. The backend keeps a shadow
of what the board's memory holds. Before a run it writes the words the program LOADs or STOREs
that differ from the shadow (or were never written); after it, it reads back the words the
program STOREs (all of them: after an error, those of a STORE that did not run read back as
they were).
Words neither loaded nor stored are the same in the caller's image and in the result, and on the
board they do not matter to this program. (A program reads DRAM only through LOAD and writes it
only through STORE: hw/dma.py.)

Before the first run the backend checks that the bitstream was built for ``cfg`` and for the
board (HELLO's ``config_id`` and ``board_id``), and initialises the DRAM when it is not yet
(LiteDRAM's sequence and read leveling over the control bus, :mod:`hw.board.dram_init`);
a failed calibration is an error and nothing is started.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from hw.board import protocol as p
from hw.board.dram_init import initialize_board
from hw.board.ecpix5 import ECPIX5, Board
from hw.config import AcceleratorConfig
from hw.isa import (
    INSTR_BYTES,
    Opcode,
    decode_fields,
    is_move,
    loop_stream,
    program_words,
    relative_words,
)
from sim.board import BoardLink, BoardLinkError
from sim.result import RunResult
from sim.rtl import encode_any

__all__ = ["BoardBackend", "dma_spans"]

#: Unchanged words between two changed ones that are sent anyway, rather than start a new frame.
_GAP_WORDS = 8


def dma_spans(words: np.ndarray, opcode: Opcode) -> list[tuple[int, int]]:
    """The DRAM beats the LOADs (or STOREs, moves aside) of a program touch: sorted, merged
    ``(first beat, beats)`` runs, every iteration of a REPEAT's body at its own offsets
    (:func:`hw.isa.loop_stream`).

    Parameters
    ----------
    words:
        The program (:func:`hw.isa.program_words`).
    opcode:
        ``Opcode.LOAD`` or ``Opcode.STORE``.

    Examples
    --------
    >>> from hw.isa import Load, Spad, Store, End, program_words
    >>> prog = program_words([Load(spad=Spad.ACT, dram_addr=10, spad_addr=0, rows=2, row_beats=3,
    ...                            dram_stride=4), Store(dram_addr=0, spad_addr=0, rows=1,
    ...                            row_beats=1), End()])
    >>> dma_spans(prog, Opcode.LOAD)
    [(10, 3), (14, 3)]
    """
    raw = decode_fields(words)
    f = loop_stream(raw, np.zeros(len(raw["opcode"]), bool)).fields(raw)
    spans = []
    # (a move's rows are VIN's, not DRAM's: hw.isa.is_move)
    for i in np.flatnonzero((f["opcode"] == opcode.value)
                            & ~is_move(f["opcode"], f["dma.spad"])):
        base, rows = int(f["dma.dram_addr"][i]), int(f["dma.rows"][i])
        beats, stride = int(f["dma.row_beats"][i]), int(f["dma.dram_stride"][i])
        if beats == 0 or rows == 0:
            continue
        if stride == beats or rows == 1:
            spans.append((base, rows * beats))
        else:
            spans.extend((base + r * stride, beats) for r in range(rows))
    merged: list[list[int]] = []
    for start, n in sorted(spans):
        if merged and start <= merged[-1][0] + merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], start + n - merged[-1][0])
        else:
            merged.append([start, n])
    return [(s, n) for s, n in merged]


def _runs(mask: np.ndarray, gap: int) -> list[tuple[int, int]]:
    """``(start, length)`` runs of true entries, runs closer than ``gap`` joined."""
    idx = np.flatnonzero(mask)
    if not len(idx):
        return []
    breaks = np.flatnonzero(np.diff(idx) > gap)
    starts = np.concatenate([idx[:1], idx[breaks + 1]])
    ends = np.concatenate([idx[breaks], idx[-1:]]) + 1
    return list(zip(starts.tolist(), (ends - starts).tolist(), strict=True))


class BoardBackend:
    """The accelerator on a board (or its simulation), driven through :class:`sim.board.BoardLink`.

    Parameters
    ----------
    cfg:
        The configuration the programs were compiled for: the bitstream's
        (``board.accelerator_config(...)``); checked against the board's HELLO.
    link:
        The host link to the board.
    board:
        The board (its ``board_id`` is checked).
    timeout_s:
        Wall seconds a run may take before :class:`sim.board.BoardLinkError`.
    poll_s:
        Pause between two STATUS requests while the accelerator runs.

    Attributes
    ----------
    words_written, words_read:
        DRAM words moved over the link so far (both directions), for the report.
    runs, stall_cycles:
        Programs run so far, and the cycles the memory froze the accelerator in them.
    """

    name = "board"
    values = True
    traces = False

    def __init__(self, cfg: AcceleratorConfig, link: BoardLink, board: Board = ECPIX5, *,
                 timeout_s: float = 600.0, poll_s: float = 0.0):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        if cfg.beat_bytes != p.WORD_BYTES:
            raise BoardLinkError(f"cfg has {cfg.beat_bytes}-byte DRAM beats; the board's words "
                                 f"are {p.WORD_BYTES} bytes: compile for "
                                 f"board.accelerator_config(cfg)")
        self.cfg, self.link, self.board = cfg, link, board
        self.timeout_s, self.poll_s = float(timeout_s), float(poll_s)
        self._check_bitstream()
        # Pages of the shadow are touched only when written.
        self._shadow = self._words(np.zeros(cfg.memory.size_bytes, np.uint8))
        self._known = np.zeros(len(self._shadow), bool)
        self.words_written = self.words_read = 0
        self.runs = self.stall_cycles = 0

    def close(self) -> None:
        """Close the link's transport (the serial port, the simulation's process)."""
        close = getattr(self.link.transport, "close", None)
        if close is not None:
            close()

    def _check_bitstream(self) -> None:
        """The bitstream's build, and its DRAM: initialised and read-levelled by the host when
        it is not yet (the first run after power-up), refused when that fails."""
        self.link.require_build(self.cfg, self.board)
        status = self.link.status()
        if not status.dram_init_done and not status.dram_init_error:
            result = initialize_board(self.link, self.board)
            status = self.link.status()
            if not result.ok:
                failed = [i for i, lane in enumerate(result.lanes) if not lane.ok]
                raise BoardLinkError(f"the board's DRAM failed its read leveling (byte lanes "
                                     f"{failed}): nothing was started")
        if status.dram_init_error or not status.dram_init_done:
            raise BoardLinkError("the board's DRAM is not initialised"
                                 + (" (its calibration failed)" if status.dram_init_error
                                    else "") + ": nothing was started")

    @staticmethod
    def _words(dram: np.ndarray) -> np.ndarray:
        """``dram`` viewed as one row of uint64s per board word."""
        return dram.view(np.uint64).reshape(-1, p.WORD_BYTES // 8)

    def _sync(self, words: np.ndarray, start: int, n: int) -> None:
        """Make the board's words ``start .. start + n`` equal ``words[start: start + n]``."""
        cur, sh = words[start:start + n], self._shadow[start:start + n]
        stale = ~self._known[start:start + n] | (cur != sh).any(axis=1)
        for s, m in _runs(stale, _GAP_WORDS):
            self.link.write_mem(start + s, cur[s:s + m].tobytes())
            self.words_written += m
        sh[:] = cur
        self._known[start:start + n] = True

    def run(self, program, dram: np.ndarray | None, *, trace: bool = False,
            regs: Mapping[int, int] | None = None, in_place: bool = False) -> RunResult:
        """Run ``program`` with ``dram`` as the memory; see the module docstring for what moves.

        ``in_place`` updates ``dram`` itself with what the program stored (the result's
        ``dram`` is that array), as :meth:`sim.model.FastModel.run` does. The host link has
        no run-time registers: ``regs`` are applied to the words on the host
        (:func:`hw.isa.relative_words`) before they are written.
        """
        raw = encode_any(program, self.cfg)
        if regs is not None:
            raw = relative_words(program_words(raw), regs).astype("<u8").tobytes()
        prog = program_words(raw)
        if dram is None or dram.dtype != np.uint8 or dram.size != self.cfg.memory.size_bytes:
            raise ValueError(f"dram must be a uint8 array of {self.cfg.memory.size_bytes} bytes")
        out = dram if in_place else dram.copy()
        words = self._words(out)
        # The stored words too: a STORE an error stops before it runs leaves them as they were.
        for opcode in (Opcode.LOAD, Opcode.STORE):
            for start, n in dma_spans(prog, opcode):
                self._sync(words, start, n)
        # One zero word after the program, as on a fresh instruction memory: a program without
        # END meets an illegal instruction rather than the last run's leftovers.
        end = len(raw) // INSTR_BYTES
        tail = bytes(INSTR_BYTES) if end < self.cfg.imem_depth else b""
        self.link.write_imem(0, raw + tail)
        self.link.start()
        status, t0 = self.link.status(), time.monotonic()
        while status.busy:
            if time.monotonic() - t0 > self.timeout_s:
                raise BoardLinkError(f"the accelerator is still busy after {self.timeout_s:g} s "
                                     f"({status.cycles:,} cycles)")
            time.sleep(self.poll_s)
            status = self.link.status()
        for start, n in dma_spans(prog, Opcode.STORE):
            got = self._words(np.frombuffer(self.link.read_mem(start, n), np.uint8))
            words[start:start + n] = got
            self._shadow[start:start + n] = got
            self._known[start:start + n] = True
            self.words_read += n
        self.runs += 1
        self.stall_cycles += status.stall_cycles
        return RunResult(cycles=status.cycles, error=status.error, error_pc=status.error_pc,
                         counters=dict(status.counters), dram=out,
                         stall_cycles=status.stall_cycles)
