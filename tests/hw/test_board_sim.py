"""The board simulation (sim/board_sim.py): the board's RTL under Verilator, driven by the host
driver over the host protocol, against the fast model.

A random program (:func:`sim.random_programs.random_program`) is loaded, started and read back
through :class:`sim.board.BoardLink` exactly as on the board; the simulated LiteDRAM (the C++
harness) stalls the accelerator with random ready, latencies and refreshes. The accelerator's
cycles, error, counters and the DRAM image must equal :class:`sim.model.FastModel`'s, and the
stall cycles are reported apart. One run goes through :class:`sim.board.FaultyTransport`: frames
corrupted or cut in both directions are recovered, nothing is lost or done twice.
"""

from __future__ import annotations

import dataclasses
import random
import time

import numpy as np
import pytest

from hw.board import protocol
from hw.board.ecpix5 import ECPIX5
from hw.isa import ErrorCode
from sim.board import BoardLink, FaultyTransport
from sim.board_backend import BoardBackend
from sim.board_sim import BoardSim
from sim.model import FastModel
from sim.random_programs import EQUIVALENCE_CONFIGS, random_program
from sim.rtl import encode_any

pytestmark = pytest.mark.rtl

#: The ECPIX-5 with 32 KiB of DRAM and a 100 kHz clock: the link's frame gap
#: (hw.board.protocol.FRAME_GAP_S) is 1000 cycles, so an abandoned frame costs the simulation
#: little time.
BOARD = dataclasses.replace(ECPIX5, name="ecpix5-sim", dram_bytes=1 << 15, sys_clk_hz=1e5)
CFG = BOARD.accelerator_config(EQUIVALENCE_CONFIGS["2x4"])


@pytest.fixture(scope="module")
def board_sim():
    sim = BoardSim(CFG, BOARD)
    sim.build()
    return sim


def run_on_board(link: BoardLink, program, dram: np.ndarray, timeout_s: float = 60.0):
    """Load ``dram`` and ``program``, start, wait for the end; returns the status and the DRAM
    read back."""
    link.require_build(CFG, BOARD)
    link.write_mem(0, dram)
    link.write_imem(0, encode_any(program, CFG) + bytes(protocol.INSTR_BYTES))
    link.start()
    deadline = time.monotonic() + timeout_s
    while True:
        status = link.status()
        if status.done and not status.busy:
            break
        assert time.monotonic() < deadline, f"still running after {timeout_s} s: {status}"
    out = np.frombuffer(link.read_mem(0, CFG.memory.size_bytes // protocol.WORD_BYTES),
                        dtype=np.uint8)
    return status, out


def _check(status, out, ref):
    assert (status.cycles, status.error, status.error_pc) == (ref.cycles, ref.error,
                                                              ref.error_pc)
    assert status.counters == ref.counters
    diff = np.flatnonzero(out != ref.dram)
    assert diff.size == 0, f"{diff.size} DRAM bytes differ, first at {diff[:8]}"


@pytest.mark.parametrize("seed", [0, 1])
def test_random_program_through_the_link(board_sim, seed):
    """Cycles, error, counters and DRAM equal the fast model's; the memory stalled the
    accelerator (stall cycles reported apart)."""
    rp = random_program(CFG, np.random.default_rng(seed), chains=2, tasks=2)
    ref = FastModel(CFG).run(rp.program, rp.dram)
    assert ref.error == ErrorCode.NONE
    with board_sim.open(seed=seed) as transport:
        status, out = run_on_board(BoardLink(transport), rp.program, rp.dram)
    _check(status, out, ref)
    assert status.stall_cycles > 0
    # Every beat the accelerator read and wrote went through the bridge's native port.
    assert (transport.stats["accel_reads"], transport.stats["accel_writes"]) == \
        (ref.counters["dram_read_beats"], ref.counters["dram_write_beats"])


def test_board_backend_on_the_simulated_board(board_sim):
    """sim.board_backend drives the simulated board like the real one.

    One program per fresh board: the scratchpads keep their contents from one run to the next
    on the board, and a random program may read scratchpad words it did not load (the fast
    model starts from zeros)."""
    rp = random_program(CFG, np.random.default_rng(3), chains=1, tasks=2)
    ref = FastModel(CFG).run(rp.program, rp.dram)
    with board_sim.open(seed=3) as transport:
        res = BoardBackend(CFG, BoardLink(transport), BOARD).run(rp.program, rp.dram)
    assert (res.cycles, res.error, res.counters) == (ref.cycles, ref.error, ref.counters)
    assert np.array_equal(res.dram, ref.dram)
    assert res.stall_cycles > 0


def test_faulty_link_loses_nothing(board_sim):
    """Corrupted and cut frames both ways: retried until the same results come back."""
    rp = random_program(CFG, np.random.default_rng(5), chains=1, tasks=2)
    ref = FastModel(CFG).run(rp.program, rp.dram)
    with board_sim.open(seed=5, max_latency=40) as inner:
        faulty = FaultyTransport(inner, random.Random(5), corrupt=0.08, drop=0.08)
        link = BoardLink(faulty, timeout=0.3, retries=12)
        status, out = run_on_board(link, rp.program, rp.dram)
    _check(status, out, ref)
    assert faulty.frames_injected > 0
    assert link.frames_recovered > 0


def test_runner_rejects_bad_options(board_sim):
    import subprocess

    proc = subprocess.run([str(board_sim.build()), "--seed", "x"], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2
    assert "--seed" in proc.stderr and "x" in proc.stderr
