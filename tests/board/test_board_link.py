# amaranth: UnusedElaboratable=no
"""The host link's RTL (hw/board/link.py) in Amaranth's simulator, with raw protocol frames, a
model of LiteDRAM's native port (random ready and latency), of its control bus and of the
accelerator's host ports."""

from __future__ import annotations

import dataclasses
import random
import sys
from pathlib import Path

import pytest
from board_testutil import SMALL_BOARD, LinkBench

from hw.board import protocol as p
from hw.board.ecpix5 import ECPIX5
from hw.board.link import CSR_TIMEOUT_CYCLES, HostLink, LinkError
from hw.config import AcceleratorConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hw"))
from control_testutil import small_config  # noqa: E402

CFG = small_config()
#: Cycles a reply may take in these tests: a full frame each way at a byte per cycle, the pump's
#: random ready (0.8) and memory latency; generous, since waiting is only spent on no reply.
REPLY_CYCLES = 4 * (p.DATA_BYTES + 64)


def transact(bench: LinkBench, req: p.Request, cycles: int = REPLY_CYCLES) -> p.Reply | None:
    """Send ``req``; the reply, or None if none came within ``cycles``."""
    bench.pump.to_link.extend(req.encode())
    dec = p.FrameDecoder(p.Reply)
    end = bench.cycle + cycles
    while bench.cycle < end:
        got = dec.feed(bench.read(dec.needed(), end - bench.cycle))
        if got:
            assert len(got) == 1 and not bench.pump.from_link
            return got[0]
    return None


def words(rng: random.Random, n: int, bits: int) -> list[int]:
    return [rng.getrandbits(bits) for _ in range(n)]


def pack(values: list[int], nbytes: int) -> bytes:
    return b"".join(v.to_bytes(nbytes, "little") for v in values)


def test_hello_reports_the_build():
    bench = LinkBench(CFG)
    reply = transact(bench, p.Request(seq=0, cmd=p.Command.HELLO))
    assert (reply.seq, reply.cmd, reply.status) == (0, p.Command.HELLO, p.Status.OK)
    assert p.unpack_fields(p.HELLO_FIELDS, reply.data) == {
        "version": p.PROTOCOL_VERSION, "board_id": p.board_id(SMALL_BOARD),
        "config_id": p.config_id(bench.cfg), "imem_depth": CFG.imem_depth,
        "dram_words": SMALL_BOARD.dram_bytes // p.WORD_BYTES, "data_bytes": p.DATA_BYTES}


def test_memory_and_imem_round_trip_at_full_frames():
    rng = random.Random(1)
    bench = LinkBench(CFG, seed=1)
    data = words(rng, p.MAX_MEM_WORDS, 8 * p.WORD_BYTES)
    base = SMALL_BOARD.dram_bytes // p.WORD_BYTES - p.MAX_MEM_WORDS  # the last words
    r = transact(bench, p.Request(seq=1, cmd=p.Command.WRITE_MEM, addr=base,
                                  data=pack(data, p.WORD_BYTES)))
    assert r.status == p.Status.OK and r.data == b""
    assert [bench.native.mem[base + i] for i in range(len(data))] == data
    assert set(bench.native.writes.values()) == {1}
    r = transact(bench, p.Request(seq=2, cmd=p.Command.READ_MEM, addr=base,
                                  arg=p.MAX_MEM_WORDS))
    assert r.status == p.Status.OK and r.data == pack(data, p.WORD_BYTES)
    r = transact(bench, p.Request(seq=3, cmd=p.Command.READ_MEM, addr=base + 5, arg=3))
    assert r.data == pack(data[5:8], p.WORD_BYTES)

    instrs = words(rng, 5, 8 * p.INSTR_BYTES)
    first = CFG.imem_depth - len(instrs)
    r = transact(bench, p.Request(seq=4, cmd=p.Command.WRITE_IMEM, addr=first,
                                  data=pack(instrs, p.INSTR_BYTES)))
    assert r.status == p.Status.OK
    assert [bench.accel.imem[first + i] for i in range(len(instrs))] == instrs
    assert set(bench.accel.imem_writes.values()) == {1}


def test_a_retry_is_answered_from_the_kept_reply_not_executed_again():
    bench = LinkBench(CFG, seed=2, run_cycles=5)
    start = p.Request(seq=9, cmd=p.Command.START)
    first = transact(bench, start)
    assert first.status == p.Status.OK and bench.accel.starts == 1
    bench.run(20)  # the run is over: a second execution would start again
    assert transact(bench, start) == first and bench.accel.starts == 1
    write = p.Request(seq=10, cmd=p.Command.WRITE_MEM, addr=7,
                      data=bytes(range(p.WORD_BYTES)))
    assert transact(bench, write) == transact(bench, write)
    assert bench.native.writes[7] == 1
    # HELLO is always executed and forgets the kept seq: the same START now runs.
    transact(bench, p.Request(seq=9, cmd=p.Command.HELLO))
    assert transact(bench, start).status == p.Status.OK and bench.accel.starts == 2


def test_status_reports_the_ports_and_a_busy_accelerator_refuses_memory():
    bench = LinkBench(CFG, seed=3, run_cycles=400)
    assert transact(bench, p.Request(seq=0, cmd=p.Command.START)).status == p.Status.OK
    r = transact(bench, p.Request(seq=1, cmd=p.Command.STATUS))
    status = p.unpack_fields(p.STATUS_FIELDS, r.data)
    assert status["busy"] == 1 and status["dram_init_done"] == 1
    refused = transact(bench, p.Request(seq=2, cmd=p.Command.READ_MEM, addr=0, arg=1))
    assert refused.status == p.Status.BUSY and refused.data == b""
    bench.run(400)
    r = transact(bench, p.Request(seq=3, cmd=p.Command.STATUS))
    want = bench.accel.status() | {"dram_init_done": 1, "dram_init_error": 0}
    assert p.unpack_fields(p.STATUS_FIELDS, r.data) == want and want["done"] == 1


def test_csr_write_read_and_timeout():
    bench = LinkBench(CFG, seed=4, dead_csr=frozenset({0x40}))
    assert transact(bench, p.Request(seq=0, cmd=p.Command.CSR_WRITE, addr=0x12,
                                     arg=0xDEADBEEF)).status == p.Status.OK
    r = transact(bench, p.Request(seq=1, cmd=p.Command.CSR_READ, addr=0x12))
    assert (r.status, p.unpack_fields(p.CSR_READ_FIELDS, r.data)) == (p.Status.OK,
                                                                      {"data": 0xDEADBEEF})
    t0 = bench.cycle
    r = transact(bench, p.Request(seq=2, cmd=p.Command.CSR_READ, addr=0x40))
    assert r.status == p.Status.CSR_TIMEOUT and r.data == b""
    assert bench.cycle - t0 >= CSR_TIMEOUT_CYCLES
    assert bench.wishbone.accesses == [("w", 0x12, 0xDEADBEEF), ("r", 0x12, 0xDEADBEEF)]


def test_dram_not_ready_refuses_memory_and_start():
    bench = LinkBench(CFG, seed=5, dram_ready=False)
    for req in [p.Request(seq=0, cmd=p.Command.START),
                p.Request(seq=1, cmd=p.Command.WRITE_MEM, data=bytes(p.WORD_BYTES))]:
        assert transact(bench, req).status == p.Status.DRAM_NOT_READY
    assert bench.accel.starts == 0 and not bench.native.writes
    # The control bus (LiteDRAM's initialisation) and the instruction memory still work.
    assert transact(bench, p.Request(seq=2, cmd=p.Command.CSR_WRITE, addr=1)).status == 0
    assert transact(bench, p.Request(seq=3, cmd=p.Command.WRITE_IMEM,
                                     data=bytes(p.INSTR_BYTES))).status == 0


def test_checks_match_the_protocol_model():
    """Random requests, many of them bad: the RTL's status is request_status's, a refused one
    changes nothing."""
    rng = random.Random(6)
    bench = LinkBench(CFG, seed=6)
    dram_words = SMALL_BOARD.dram_bytes // p.WORD_BYTES
    seen = set()
    # Per command: its data unit and address limit, to land near the edges of both.
    unit = {p.Command.WRITE_MEM: p.WORD_BYTES, p.Command.WRITE_IMEM: p.INSTR_BYTES}
    limit = {p.Command.WRITE_MEM: dram_words, p.Command.READ_MEM: dram_words,
             p.Command.WRITE_IMEM: CFG.imem_depth, p.Command.CSR_WRITE: 1 << p.CSR_ADDR_BITS,
             p.Command.CSR_READ: 1 << p.CSR_ADDR_BITS}
    for seq in range(80):
        cmd = rng.choice(list(p.Command) + [len(p.Command), 0xFF])
        if cmd == p.Command.START:
            continue  # its BUSY window is covered above
        u = unit.get(cmd, rng.choice([p.WORD_BYTES, p.INSTR_BYTES]))
        length = rng.choice([0, u, 3 * u, u + 1]) if cmd in unit else rng.choice([0, 0, 0, u])
        addr = max(0, limit.get(cmd, 16) - rng.randint(0, 4))
        arg = rng.choice([0, 1, 3, p.MAX_MEM_WORDS, p.MAX_MEM_WORDS + 1])
        req = p.Request(seq=seq, cmd=cmd, addr=addr, arg=arg, data=bytes(length))
        want = p.request_status(cmd, addr, arg, length, imem_depth=CFG.imem_depth,
                                dram_words=dram_words, dram_ready=True, busy=False)
        writes = sum(bench.native.writes.values()) + sum(bench.accel.imem_writes.values())
        r = transact(bench, req)
        assert r.status == want, req
        if want != p.Status.OK:
            assert r.data == b""
            assert writes == sum(bench.native.writes.values()) + sum(
                bench.accel.imem_writes.values())
        seen.add(want)
    assert {p.Status.OK, p.Status.BAD_COMMAND, p.Status.BAD_LENGTH, p.Status.BAD_ADDRESS} <= seen


def test_bad_frames_are_dropped_and_the_link_resynchronises():
    bench = LinkBench(CFG, seed=7)
    good = p.Request(seq=1, cmd=p.Command.CSR_READ, addr=3)
    broken = bytearray(good.encode())
    broken[5] ^= 0x10
    bench.pump.to_link.extend(b"\x00\xa5\x13" + bytes(broken))
    assert bench.read(1, REPLY_CYCLES) == b""  # no reply, no NAK
    # An oversized len is refused at the header; the good frame behind it is answered.
    oversized = bytes([p.SYNC_REQUEST]) + p.pack_fields(p.REQUEST_HEADER, {
        "seq": 0, "cmd": 0, "addr": 0, "arg": 0, "len": p.DATA_BYTES + 1})
    bench.pump.to_link.extend(oversized)
    r = transact(bench, good)
    assert (r.seq, r.status) == (1, p.Status.OK)


def test_a_stalled_frame_is_abandoned_after_the_frame_gap():
    """A header whose corrupted len announces more data than comes: after FRAME_GAP_S without a
    byte the link hunts again, so the host's retry is answered instead of swallowed."""
    bench = LinkBench(CFG, seed=8)
    good = p.Request(seq=1, cmd=p.Command.CSR_READ, addr=3)
    stalled = bytes([p.SYNC_REQUEST]) + p.pack_fields(p.REQUEST_HEADER, {
        "seq": 0, "cmd": p.Command.WRITE_MEM, "addr": 0, "arg": 0, "len": p.DATA_BYTES})
    bench.pump.to_link.extend(stalled + good.encode())
    assert bench.read(1, REPLY_CYCLES) == b""  # the good frame went into the stalled one's data
    gap_cycles = round(SMALL_BOARD.sys_clk_hz * p.FRAME_GAP_S)
    bench.run(gap_cycles)
    assert transact(bench, good).status == p.Status.OK


def test_constructor_validates():
    with pytest.raises(LinkError, match="use board.accelerator_config"):
        HostLink(CFG, ECPIX5)
    with pytest.raises(TypeError, match="cfg must be an AcceleratorConfig"):
        HostLink("cfg", ECPIX5)
    wide = dataclasses.replace(ECPIX5, port_bits=2 * ECPIX5.port_bits)
    with pytest.raises(LinkError, match=f"native port is {2 * ECPIX5.port_bits} bits"):
        HostLink(wide.accelerator_config(AcceleratorConfig()), wide)


def test_through_the_uart():
    """The link behind the board's UART, the host's end a UART too: HELLO and STATUS answered
    (divisor 4 keeps it short; the rate is a parameter of the UART alone)."""
    from amaranth import Module
    from amaranth.lib.wiring import connect
    from amaranth.sim import Simulator

    from hw.board.uart import UartRx, UartTx

    cfg = SMALL_BOARD.accelerator_config(CFG)
    rate = (SMALL_BOARD.sys_clk_hz, SMALL_BOARD.sys_clk_hz / 4)
    m = Module()
    m.submodules.link = link = HostLink(cfg, SMALL_BOARD)
    m.submodules.board_rx, m.submodules.board_tx = board_rx, board_tx = UartRx(*rate), \
        UartTx(*rate)
    m.submodules.host_tx, m.submodules.host_rx = host_tx, host_rx = UartTx(*rate), \
        UartRx(*rate)
    connect(m, board_rx.byte, link.rx)
    connect(m, link.tx, board_tx.byte)
    m.d.comb += [board_rx.line.eq(host_tx.line), host_rx.line.eq(board_tx.line)]
    requests = [p.Request(seq=0, cmd=p.Command.HELLO), p.Request(seq=1, cmd=p.Command.STATUS)]
    dec = p.FrameDecoder(p.Reply)
    replies = []

    async def host(ctx):
        ctx.set(host_rx.byte.ready, 1)
        for req in requests:
            for b in req.encode():
                ctx.set(host_tx.byte.payload, b)
                ctx.set(host_tx.byte.valid, 1)
                await ctx.tick().until(host_tx.byte.ready)
            ctx.set(host_tx.byte.valid, 0)
            while not replies or replies[-1].seq != req.seq:
                if ctx.get(host_rx.byte.valid):
                    replies.extend(dec.feed([ctx.get(host_rx.byte.payload)]))
                await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1 / SMALL_BOARD.sys_clk_hz)
    sim.add_testbench(host)
    sim.run_until(0.2)  # 20000 cycles; the exchange needs 156 bytes x 40 cycles
    assert [(r.seq, r.cmd, r.status) for r in replies] == [
        (0, p.Command.HELLO, p.Status.OK), (1, p.Command.STATUS, p.Status.OK)]
    assert p.unpack_fields(p.HELLO_FIELDS, replies[0].data)["config_id"] == p.config_id(cfg)
