# amaranth: UnusedElaboratable=no
"""The host driver (sim/board.py) against the HostLink RTL in Amaranth's simulator, through a
transport that steps the simulation (no UART), with corrupted and dropped frames; and its
errors."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest
from board_testutil import SMALL_BOARD, LinkBench, SimTransport

from hw.board import protocol as p
from hw.isa import ErrorCode
from sim.board import (
    BoardLink,
    BoardLinkError,
    BoardRefused,
    FaultyTransport,
    LinkTimeout,
    SerialTransport,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hw"))
from control_testutil import small_config  # noqa: E402

CFG = small_config()
#: Reply timeout in simulated seconds of SMALL_BOARD's 100 kHz clock: 6000 cycles, over the
#: longest exchange here (a full frame in, MAX_MEM_WORDS native-port writes or reads, a full
#: frame out at the pump's random ready) and over the link's frame gap (FRAME_GAP_S, 1000
#: cycles).
TIMEOUT = 0.06


def _image(rng: random.Random, words: int) -> bytes:
    return rng.randbytes(words * p.WORD_BYTES)


def _run_session(link: BoardLink, bench: LinkBench, rng: random.Random) -> None:
    """Writes, reads, a program, START once, STATUS until done: every result checked."""
    regions = [(0, 300), (1000, 7), (SMALL_BOARD.dram_bytes // p.WORD_BYTES - 40, 40)]
    images = {}
    for addr, words in regions:
        images[addr] = _image(rng, words)
        link.write_mem(addr, images[addr])
    for addr, words in regions:
        assert link.read_mem(addr, words) == images[addr]
    program = np.frombuffer(rng.randbytes(3 * p.INSTR_BYTES), dtype=np.uint8)
    link.write_imem(4, program)
    link.csr_write(0x21, 0xCAFE_F00D)
    assert link.csr_read(0x21) == 0xCAFE_F00D
    link.start()
    while link.status().busy:
        pass
    status = link.status()
    want = bench.accel.status()
    assert status.done and status.error == ErrorCode(want["error"])
    assert (status.cycles, status.error_pc, status.stall_cycles) == (
        want["cycles"], want["error_pc"], want["stall_cycles"])
    assert status.counters == {name: want[name] for name in status.counters}
    assert status.dram_init_done and not status.dram_init_error
    # Every write landed exactly once, the program too, and START ran once.
    written = {a + i for a, n in regions for i in range(n)}
    assert set(bench.native.writes) == written and set(bench.native.writes.values()) == {1}
    for addr, image in images.items():
        got = b"".join(bench.native.mem[addr + i].to_bytes(p.WORD_BYTES, "little")
                       for i in range(len(image) // p.WORD_BYTES))
        assert got == image
    assert [bench.accel.imem[4 + i].to_bytes(p.INSTR_BYTES, "little") for i in range(3)] == [
        program[i * p.INSTR_BYTES:(i + 1) * p.INSTR_BYTES].tobytes() for i in range(3)]
    assert set(bench.accel.imem_writes.values()) == {1}
    assert bench.accel.starts == 1


def test_driver_against_the_rtl():
    bench = LinkBench(CFG, seed=11)
    link = BoardLink(SimTransport(bench), timeout=TIMEOUT)
    assert link.info["config_id"] == p.config_id(bench.cfg)
    assert link.info["board_id"] == p.board_id(SMALL_BOARD)
    link.require_build(bench.cfg, SMALL_BOARD)
    _run_session(link, bench, random.Random(11))
    assert link.frames_recovered == 0


@pytest.mark.parametrize("seed", [1])
def test_corrupted_and_dropped_frames_are_recovered(seed):
    """A quarter of the frames in each direction damaged: nothing is lost, nothing runs
    twice."""
    bench = LinkBench(CFG, seed=seed)
    faulty = FaultyTransport(SimTransport(bench), random.Random(seed), corrupt=0.15,
                             drop=0.1)
    link = BoardLink(faulty, timeout=TIMEOUT, retries=12)
    _run_session(link, bench, random.Random(seed))
    # Each damaged write or read loses at most one attempt; a loss has no other cause here.
    assert 1 <= link.frames_recovered <= faulty.frames_injected


def test_refusals_name_the_command_and_status():
    bench = LinkBench(CFG, seed=3, run_cycles=3000)
    link = BoardLink(SimTransport(bench), timeout=TIMEOUT)
    words = SMALL_BOARD.dram_bytes // p.WORD_BYTES
    with pytest.raises(BoardRefused, match="refused READ_MEM.*: BAD_ADDRESS") as e:
        link.read_mem(words - 1, 2)
    assert e.value.status == p.Status.BAD_ADDRESS
    link.start()
    with pytest.raises(BoardRefused, match="refused START.*: BUSY"):
        link.start()
    assert bench.accel.starts == 1


class _Board:
    """A board in Python answering HELLO with ``info``; silent for other commands."""

    name = "fake board"

    def __init__(self, **info):
        self.info = {"version": p.PROTOCOL_VERSION, "board_id": 0, "config_id": 0,
                     "imem_depth": 1, "dram_words": 1, "data_bytes": p.DATA_BYTES} | info
        self.out = bytearray()
        self.dec = p.FrameDecoder(p.Request)

    def write(self, data: bytes) -> None:
        for req in self.dec.feed(data):
            if req.cmd == p.Command.HELLO:
                self.out += p.Reply(seq=req.seq, cmd=req.cmd,
                                    data=p.pack_fields(p.HELLO_FIELDS, self.info)).encode()

    def read(self, n: int, timeout: float) -> bytes:
        out = bytes(self.out[:n])
        del self.out[:n]
        return out


def test_a_bitstream_for_another_build_is_refused():
    cfg = SMALL_BOARD.accelerator_config(CFG)
    link = BoardLink(_Board(board_id=p.board_id(SMALL_BOARD), config_id=p.config_id(cfg)),
                     timeout=TIMEOUT)
    link.require_build(cfg, SMALL_BOARD)
    other = SMALL_BOARD.accelerator_config(small_config(rows=4))
    with pytest.raises(BoardLinkError, match=f"this program is for board ecpix5-test .*config "
                                             f"{other.fingerprint}"):
        link.require_build(other, SMALL_BOARD)


def test_another_protocol_is_refused():
    with pytest.raises(BoardLinkError, match="protocol version 9 .* rebuild the bitstream"):
        BoardLink(_Board(version=9), timeout=TIMEOUT)


def test_a_board_that_stops_answering_raises_naming_the_transport():
    link = BoardLink(_Board(), timeout=TIMEOUT, retries=2)
    with pytest.raises(LinkTimeout, match=r"no reply from the board on fake board to STATUS "
                                          r"\(seq 1\) after 3 tries"):
        link.status()


def test_a_port_that_does_not_open_is_named():
    with pytest.raises(BoardLinkError, match="cannot open serial port /dev/nonexistent-tty"):
        SerialTransport("/dev/nonexistent-tty")


@pytest.mark.parametrize(("kw", "match"), [
    ({"timeout": p.FRAME_GAP_S}, "timeout must be a number of seconds > FRAME_GAP_S"),
    ({"retries": -1}, "retries must be an int >= 0"),
])
def test_arguments_are_validated(kw, match):
    with pytest.raises(ValueError, match=match):
        BoardLink(_Board(), **kw)


def test_data_that_is_not_whole_words_is_refused_before_sending():
    link = BoardLink(_Board(), timeout=TIMEOUT)
    with pytest.raises(BoardLinkError, match=f"write_mem data of {p.WORD_BYTES + 4} bytes"):
        link.write_mem(0, bytes(p.WORD_BYTES + 4))
    with pytest.raises(BoardLinkError, match=f"write_imem program of {p.INSTR_BYTES // 2} "):
        link.write_imem(0, bytes(p.INSTR_BYTES // 2))
    with pytest.raises(BoardLinkError, match="read_mem words must be a positive int, got 0"):
        link.read_mem(0, 0)
