"""The host protocol's codec (hw/board/protocol.py): round trips, CRC, resynchronisation."""

from __future__ import annotations

import binascii

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hw.board import protocol as p
from hw.board.ecpix5 import ECPIX5
from hw.config import AcceleratorConfig

requests = st.builds(
    p.Request, seq=st.integers(0, 255), cmd=st.integers(0, 255),
    addr=st.integers(0, (1 << 32) - 1), arg=st.integers(0, (1 << 32) - 1),
    data=st.binary(max_size=64))
replies = st.builds(p.Reply, seq=st.integers(0, 255), cmd=st.integers(0, 255),
                    status=st.integers(0, 255), data=st.binary(max_size=64))
frames = st.one_of(requests, replies)


@given(st.binary(max_size=300))
def test_crc_bitwise_specification_equals_the_fast_one(data):
    crc = p.CRC_INIT
    for b in data:
        crc = p.crc16_byte(crc, b)
    assert crc == p.crc16(data) == binascii.crc_hqx(data, p.CRC_INIT)


@given(frames)
def test_round_trip(frame):
    dec = p.FrameDecoder(type(frame))
    assert dec.feed(frame.encode()) == [frame]
    assert dec.skipped == 0


@given(frames, st.data())
def test_round_trip_byte_by_byte_needed_is_exact(frame, data):
    """``needed()`` never asks for a byte beyond the frame, so a reader never blocks on one."""
    enc = frame.encode()
    dec = p.FrameDecoder(type(frame))
    pos, out = 0, []
    while pos < len(enc):
        n = dec.needed()
        assert pos + n <= len(enc)
        out += dec.feed(enc[pos:pos + n])
        pos += n
    assert out == [frame]


@given(frames, st.data())
def test_any_single_corrupted_byte_is_detected(frame, data):
    enc = bytearray(frame.encode())
    i = data.draw(st.integers(0, len(enc) - 1), "position")
    enc[i] ^= data.draw(st.integers(1, 255), "xor")
    assert frame not in p.FrameDecoder(type(frame)).feed(bytes(enc))


@given(st.lists(frames, min_size=1, max_size=4), st.data())
def test_resynchronises_after_garbage_and_broken_frames(frame_list, data):
    """Garbage and truncated/corrupted frames between good ones: every good frame comes out."""
    kind = type(frame_list[0])
    good = [f for f in frame_list if type(f) is kind]
    stream = bytearray()
    for f in good:
        stream += data.draw(st.binary(max_size=20), "garbage")
        broken = bytearray(data.draw(frames.filter(lambda g: type(g) is kind)).encode())
        broken[data.draw(st.integers(1, len(broken) - 1))] ^= 0xFF
        # A broken frame cut before its end could swallow the next frame's start: only its
        # whole bytes go in, so it fails its CRC inside the decoder's buffer.
        stream += broken
        stream += f.encode()
    # A corrupted len can make a candidate frame swallow what follows until its announced end:
    # later bytes (here: idle filler) complete it, it fails its CRC and the decoder rescans.
    stream += bytes(1 + p.REQUEST_HEADER_BYTES + p.DATA_BYTES + p.CRC_BYTES)
    dec = p.FrameDecoder(kind)
    got = []
    for i in range(0, len(stream), 97):
        got += dec.feed(stream[i:i + 97])
    # A corrupted frame may decode as another valid frame only with a matching CRC
    # (probability 2^-16 per candidate); the good ones are a subsequence of what came out.
    it = iter(got)
    assert all(any(g == f for g in it) for f in good)


def test_oversized_length_is_skipped_not_waited_for():
    body = p.pack_fields(p.REPLY_HEADER, {"seq": 1, "cmd": 0, "status": 0,
                                          "len": p.DATA_BYTES + 1})
    good = p.Reply(seq=2, cmd=p.Command.STATUS)
    dec = p.FrameDecoder(p.Reply)
    assert dec.feed(bytes([p.SYNC_REPLY]) + body + good.encode()) == [good]
    assert dec.bad_frames == 1


def test_frame_fields_are_validated():
    with pytest.raises(p.ProtocolError, match="seq=256"):
        p.Request(seq=256, cmd=0)
    with pytest.raises(p.ProtocolError, match="2049 data bytes"):
        p.Request(seq=0, cmd=p.Command.WRITE_MEM, data=bytes(p.DATA_BYTES + 1))
    with pytest.raises(p.ProtocolError, match="busy=2"):
        p.pack_fields(p.STATUS_FIELDS, {f.name: 2 if f.name == "busy" else 0
                                        for f in p.STATUS_FIELDS})
    with pytest.raises(p.ProtocolError, match="missing"):
        p.pack_fields(p.CSR_READ_FIELDS, {})


def test_limits_derive_from_the_buffer_and_the_words():
    assert p.MAX_MEM_WORDS * p.WORD_BYTES == p.DATA_BYTES
    assert p.MAX_IMEM_WORDS * p.INSTR_BYTES == p.DATA_BYTES
    assert p.WORD_BYTES * 8 == ECPIX5.port_bits
    assert p.REQUEST_HEADER_BYTES == sum(f.nbytes for f in p.REQUEST_HEADER)


def test_identities():
    assert p.config_id(AcceleratorConfig()) == int(AcceleratorConfig().fingerprint, 16)
    assert p.config_id(AcceleratorConfig(rows=2)) != p.config_id(AcceleratorConfig())
    assert 0 <= p.board_id(ECPIX5) < 1 << 32


@pytest.mark.parametrize(("cmd", "addr", "arg", "length", "state", "want"), [
    (99, 0, 0, 0, {}, p.Status.BAD_COMMAND),
    (p.Command.WRITE_MEM, 0, 0, p.WORD_BYTES + 4, {}, p.Status.BAD_LENGTH),
    (p.Command.WRITE_MEM, 0, 0, 0, {}, p.Status.BAD_LENGTH),
    (p.Command.WRITE_MEM, 1000, 0, p.WORD_BYTES * 25, {}, p.Status.BAD_ADDRESS),
    (p.Command.WRITE_MEM, 1000, 0, p.WORD_BYTES * 24, {}, p.Status.OK),
    (p.Command.READ_MEM, 0, 0, 0, {}, p.Status.BAD_LENGTH),
    (p.Command.READ_MEM, 0, p.MAX_MEM_WORDS + 1, 0, {}, p.Status.BAD_LENGTH),
    (p.Command.READ_MEM, 0, 1, p.WORD_BYTES, {}, p.Status.BAD_LENGTH),
    (p.Command.WRITE_IMEM, 15, 0, 2 * p.INSTR_BYTES, {}, p.Status.BAD_ADDRESS),
    (p.Command.WRITE_IMEM, 14, 0, 2 * p.INSTR_BYTES, {"busy": True}, p.Status.BUSY),
    (p.Command.WRITE_IMEM, 14, 0, 2 * p.INSTR_BYTES, {"dram_ready": False}, p.Status.OK),
    (p.Command.START, 0, 0, 0, {"dram_ready": False, "busy": True}, p.Status.DRAM_NOT_READY),
    (p.Command.CSR_READ, (1 << 30) - 1, 0, 0, {"busy": True, "dram_ready": False},
     p.Status.OK),
    (p.Command.CSR_WRITE, 1 << 30, 5, 0, {}, p.Status.BAD_ADDRESS),
])
def test_request_status(cmd, addr, arg, length, state, want):
    kw = {"imem_depth": 16, "dram_words": 1024, "dram_ready": True, "busy": False} | state
    assert p.request_status(cmd, addr, arg, length, **kw) == want
