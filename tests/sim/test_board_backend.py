"""sim.board_backend: what moves over the link, checked against a board made of the fast model.

``ModelBoard`` answers the driver's calls (:class:`sim.board.BoardLink`'s methods) with a DRAM
of power-up garbage and the fast model as its accelerator: only the backend's bookkeeping is
under test here (tests/hw/test_board_sim.py runs it on the board's RTL).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from hw.board import protocol as p
from hw.board.dram_init import InitResult, LaneResult
from hw.board.ecpix5 import ECPIX5
from hw.config import AcceleratorConfig
from hw.isa import INSTR_BYTES, End, Opcode, Spad, Store, program_words
from sim import board_backend
from sim.board import BoardLinkError, BoardStatus
from sim.board_backend import BoardBackend, dma_spans
from sim.model import FastModel
from sim.random_programs import EQUIVALENCE_CONFIGS, random_program, relative_program

BOARD = dataclasses.replace(ECPIX5, dram_bytes=1 << 15)
CFG = BOARD.accelerator_config(EQUIVALENCE_CONFIGS["2x4"])


class ModelBoard:
    """The driver's view of a board whose accelerator is the fast model."""

    def __init__(self, cfg: AcceleratorConfig, rng: np.random.Generator, dram_ready=True,
                 dram_error=False):
        self.cfg = cfg
        self.dram = rng.integers(0, 256, cfg.memory.size_bytes, dtype=np.uint8)  # power-up
        self.imem = b""
        self.dram_ready, self.dram_error = dram_ready, dram_error
        self.last = None
        self.transport = None
        self.frames_recovered = 0
        self.words_moved = 0

    def require_build(self, cfg, board):
        if cfg != self.cfg:
            raise BoardLinkError("another build")

    def write_mem(self, addr: int, data: bytes) -> None:
        assert len(data) % p.WORD_BYTES == 0
        self.dram[addr * p.WORD_BYTES:addr * p.WORD_BYTES + len(data)] = np.frombuffer(data,
                                                                                   np.uint8)
        self.words_moved += len(data) // p.WORD_BYTES

    def read_mem(self, addr: int, words: int) -> bytes:
        self.words_moved += words
        return self.dram[addr * p.WORD_BYTES:(addr + words) * p.WORD_BYTES].tobytes()

    def write_imem(self, index: int, program: bytes) -> None:
        assert index == 0
        self.imem = program

    def start(self) -> None:
        words = [int.from_bytes(self.imem[i:i + INSTR_BYTES], "little")
                 for i in range(0, len(self.imem), INSTR_BYTES)]
        self.last = FastModel(self.cfg).run(words, self.dram, in_place=True)

    def status(self) -> BoardStatus:
        r = self.last
        return BoardStatus(busy=False, done=r is not None, error=r.error if r else 0,
                           error_pc=r.error_pc if r else 0, cycles=r.cycles if r else 0,
                           counters=dict(r.counters) if r else {}, stall_cycles=0,
                           dram_init_done=self.dram_ready, dram_init_error=self.dram_error)


def test_random_programs_in_a_row_equal_the_fast_model():
    """Each run's result equals the fast model's on the same image, although the board's DRAM
    started as garbage and only loaded and stored words ever cross the link."""
    rng = np.random.default_rng(0)
    board = ModelBoard(CFG, rng)
    backend = BoardBackend(CFG, board, BOARD)
    for _ in range(4):
        rp = random_program(CFG, rng, chains=2, tasks=2)
        ref = FastModel(CFG).run(rp.program, rp.dram)
        got = backend.run(rp.program, rp.dram)
        assert (got.cycles, got.error, got.counters) == (ref.cycles, ref.error, ref.counters)
        assert np.array_equal(got.dram, ref.dram)


def test_run_time_registers_are_applied_on_the_host():
    """The host link carries no run-time registers: the backend writes the words as the fetch
    unit would dispatch them (hw.isa.relative_words), and the DRAM spans it moves are theirs."""
    rng = np.random.default_rng(5)
    board = ModelBoard(CFG, rng)
    backend = BoardBackend(CFG, board, BOARD)
    for _ in range(3):
        rp = relative_program(random_program(CFG, rng, chains=2, tasks=2), rng)
        assert any(getattr(i, "reg", None) for i in rp.program)
        ref = FastModel(CFG).run(rp.program, rp.dram, regs=rp.regs)
        got = backend.run(rp.program, rp.dram, regs=rp.regs)
        assert (got.cycles, got.error, got.counters) == (ref.cycles, ref.error, ref.counters)
        assert np.array_equal(got.dram, ref.dram)


@pytest.mark.parametrize("seed", range(4))
def test_a_loop_moves_every_iteration(seed):
    """A REPEAT's body reads and writes other DRAM beats each iteration: the backend moves
    the beats of every iteration (the fast model's loop stream), so a board with power-up
    garbage in DRAM computes what the fast model does from the host's image."""
    rng = np.random.default_rng(seed)
    rp = random_program(CFG, rng, chains=2, tasks=3, loops=1.0)
    assert any(i.opcode.name == "REPEAT" for i in rp.program)
    backend = BoardBackend(CFG, ModelBoard(CFG, rng), BOARD)
    ref = FastModel(CFG).run(rp.program, rp.dram)
    got = backend.run(rp.program, rp.dram)
    assert (got.cycles, got.error, got.counters) == (ref.cycles, ref.error, ref.counters)
    assert np.array_equal(got.dram, ref.dram)


def test_only_what_changed_moves():
    rng = np.random.default_rng(1)
    board = ModelBoard(CFG, rng)
    backend = BoardBackend(CFG, board, BOARD)
    rp = random_program(CFG, rng, chains=1, tasks=2)
    first = backend.run(rp.program, rp.dram)
    spans = dma_spans(program_words(rp.words()), Opcode.LOAD) + \
        dma_spans(program_words(rp.words()), Opcode.STORE)
    assert 0 < backend.words_written <= sum(n for _, n in spans)
    assert backend.words_read == sum(n for _, n in dma_spans(program_words(rp.words()),
                                                             Opcode.STORE))
    # the same program on its own result: the board holds that image already
    written = backend.words_written
    again = backend.run(rp.program, first.dram)
    assert backend.words_written == written
    assert np.array_equal(again.dram, FastModel(CFG).run(rp.program, first.dram).dram)


def _lane(ok: bool) -> LaneResult:
    return LaneResult(bitslip=0, delay=4 if ok else -1, window=(2, 6) if ok else None,
                      scores=(1,), ok=ok)


def test_the_dram_is_initialised_once_and_a_failed_calibration_refused(monkeypatch):
    rng = np.random.default_rng(2)
    calls = []

    def init(board_link, board, ok):
        calls.append(board)
        board_link.dram_ready, board_link.dram_error = ok, not ok
        return InitResult(lanes=(_lane(True), _lane(ok)), error=not ok)

    monkeypatch.setattr(board_backend, "initialize_board", lambda b, board: init(b, board, True))
    board = ModelBoard(CFG, rng, dram_ready=False)
    BoardBackend(CFG, board, BOARD)
    BoardBackend(CFG, board, BOARD)             # initialised already: not again
    assert calls == [BOARD]
    monkeypatch.setattr(board_backend, "initialize_board", lambda b, board: init(b, board, False))
    with pytest.raises(BoardLinkError, match=r"read leveling \(byte lanes \[1\]\): nothing"):
        BoardBackend(CFG, ModelBoard(CFG, rng, dram_ready=False), BOARD)


def test_refuses_what_the_board_cannot_run():
    rng = np.random.default_rng(2)
    with pytest.raises(BoardLinkError, match="calibration failed"):
        BoardBackend(CFG, ModelBoard(CFG, rng, dram_ready=False, dram_error=True), BOARD)
    narrow = dataclasses.replace(CFG, memory=dataclasses.replace(CFG.memory, bytes_per_cycle=8))
    with pytest.raises(BoardLinkError, match="8-byte DRAM beats"):
        BoardBackend(narrow, ModelBoard(narrow, rng), BOARD)
    backend = BoardBackend(CFG, ModelBoard(CFG, rng), BOARD)
    with pytest.raises(ValueError, match="uint8 array"):
        backend.run([], np.zeros(16, np.uint8))


def test_a_moves_rows_are_no_dram_span():
    """A move (VOUT -> VIN, hw.isa.MOVE_SPAD) names VIN beats in dram_addr: the backend
    neither writes nor reads those DRAM beats for it."""
    prog = program_words([Store(spad=Spad.VIN, dram_addr=4, spad_addr=0, rows=1, row_beats=2),
                          Store(spad=Spad.VOUT, dram_addr=40, spad_addr=0, rows=1,
                                row_beats=3), End()])
    assert dma_spans(prog, Opcode.STORE) == [(40, 3)]
