"""The host protocol of the board link, defined once: the RTL (:mod:`hw.board.link`) and the host
driver (:mod:`sim.board`) both read this module.

The host sends one request and waits for its reply (stop and wait). Every frame starts with a
sync byte (:data:`SYNC_REQUEST` or :data:`SYNC_REPLY`), then a fixed header, ``len`` data bytes
and a CRC-16/CCITT-FALSE (:func:`crc16`) of everything after the sync byte, sent big-endian so
that the CRC of header, data and CRC together is 0. Multi-byte header fields and data are
little-endian.

Request frame (host -> board):

====== ======== ========= ==============================================================
offset bytes    field     meaning
====== ======== ========= ==============================================================
0      1        sync      :data:`SYNC_REQUEST`
1      1        seq       sequence number, chosen by the host (the reply echoes it)
2      1        cmd       :class:`Command`
3      4        addr      first address or index (see :class:`Command`); else 0
7      4        arg       word count or CSR data (see :class:`Command`); else 0
11     2        len       data bytes, at most :data:`DATA_BYTES`
13     len      data      the command's data
13+len 2        crc       :func:`crc16` of bytes 1 .. 12+len, big-endian
====== ======== ========= ==============================================================

Reply frame (board -> host):

====== ======== ========= ==============================================================
offset bytes    field     meaning
====== ======== ========= ==============================================================
0      1        sync      :data:`SYNC_REPLY`
1      1        seq       the request's
2      1        cmd       the request's
3      1        status    :class:`Status`; data is empty unless ``OK``
4      2        len       data bytes, at most :data:`DATA_BYTES`
6      len      data      the command's reply data
6+len  2        crc       :func:`crc16` of bytes 1 .. 5+len, big-endian
====== ======== ========= ==============================================================

Commands (``addr``, ``arg``, request data -> reply data; a word is :data:`WORD_BYTES`, an
instruction :data:`INSTR_BYTES`, little-endian):

========== ====================== ======================== =======================
cmd        addr, arg              request data             reply data
========== ====================== ======================== =======================
HELLO      -                      -                        :data:`HELLO_FIELDS`
WRITE_MEM  DRAM word address, -   1 .. MAX_MEM_WORDS words -
READ_MEM   DRAM word address, n   -                        n words
WRITE_IMEM instruction index, -   1 .. MAX_IMEM_WORDS      -
                                  instructions
START      -                      -                        -
STATUS     -                      -                        :data:`STATUS_FIELDS`
CSR_WRITE  CSR word address, data -                        -
CSR_READ   CSR word address, -    -                        :data:`CSR_READ_FIELDS`
========== ====================== ======================== =======================

The board checks a request in the order of :func:`request_status`: a bad command, a bad data
length or word count, an address range outside the DRAM, the instruction memory or the CSR
bus, DRAM that is not initialised (memory access and START), an accelerator that is busy
(memory access, instruction writes and START). A refused request changes nothing and its reply
says why. A frame with a bad CRC, an oversized ``len`` or a pause of more than
:data:`FRAME_GAP_S` between two of its bytes is dropped without a reply: the host's timeout and
retry recover it (a NAK would have to trust the seq of a frame that failed its CRC).

Exactly once: the board keeps the reply of the last request it executed. A request whose seq
equals that request's seq is a retry: the board re-sends the kept reply without executing the
command again (START never runs twice, a write never lands twice). HELLO is always executed
and forgets the kept seq, so that a new host session's first request is never taken for a
retry of an old session's.

Examples
--------
>>> req = Request(seq=7, cmd=Command.READ_MEM, addr=0x100, arg=2)
>>> frame = req.encode()
>>> len(frame) == 1 + REQUEST_HEADER_BYTES + CRC_BYTES
True
>>> dec = FrameDecoder(Request)
>>> dec.feed(b"\\x00garbage" + frame) == [req]
True
>>> hex(crc16(b"123456789"))
'0x29b1'
"""

from __future__ import annotations

import binascii
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from amaranth.lib import enum

from hw.board.ecpix5 import ECPIX5, Board
from hw.config import AcceleratorConfig
from hw.counters import COUNTER_BITS, COUNTERS
from hw.errors import ContractError
from hw.isa import INSTR_BITS, ErrorCode

__all__ = [
    "PROTOCOL_VERSION", "SYNC_REQUEST", "SYNC_REPLY", "CRC_INIT", "CRC_POLY", "CRC_BYTES",
    "FRAME_GAP_S", "frame_gap_cycles", "SEQ_BITS", "WORD_BYTES", "INSTR_BYTES", "DATA_BYTES",
    "MAX_MEM_WORDS", "MAX_IMEM_WORDS",
    "CSR_ADDR_BITS", "CSR_DATA_BITS", "ERROR_PC_BITS", "STALL_CYCLES_BITS",
    "Command", "Status", "Field", "REQUEST_HEADER", "REPLY_HEADER", "REQUEST_HEADER_BYTES",
    "REPLY_HEADER_BYTES", "HELLO_FIELDS", "STATUS_FIELDS", "CSR_READ_FIELDS",
    "ProtocolError", "crc16_bit", "crc16_byte", "crc16", "fields_bytes", "pack_fields",
    "unpack_fields",
    "board_id", "config_id", "request_status", "Frame", "Request", "Reply", "FrameDecoder",
]

#: Incremented whenever a frame, a command or a field changes meaning (HELLO reports it).
PROTOCOL_VERSION = 1
#: First byte of a request frame.
SYNC_REQUEST = 0xA5
#: First byte of a reply frame (differs from SYNC_REQUEST: a looped-back request is no reply).
SYNC_REPLY = 0x5A

#: CRC-16/CCITT-FALSE: polynomial x^16 + x^12 + x^5 + 1, MSB first, initial value 0xFFFF,
#: no final XOR (``binascii.crc_hqx``'s algorithm).
CRC_POLY = 0x1021
CRC_INIT = 0xFFFF
CRC_BITS = 16
CRC_BYTES = CRC_BITS // 8

#: A DRAM word: one word of the board's native port (the accelerator's beat).
WORD_BYTES = ECPIX5.port_bits // 8
#: An instruction word of the accelerator's instruction memory.
INSTR_BYTES = INSTR_BITS // 8
#: Data bytes one frame carries at most: the 16 Kibit of data of one ECP5 block RAM (each of
#: the link's two frame buffers holds that many, in as many block RAMs as its word width
#: needs). A full frame takes ~7 ms at 3 Mbaud, so a retry costs little, while the 13 + 2 bytes
#: of header and CRC cost < 1% of the link's rate.
EBR_DATA_BITS = 16 * 1024
DATA_BYTES = EBR_DATA_BITS // 8
#: DRAM words per WRITE_MEM / READ_MEM.
MAX_MEM_WORDS = DATA_BYTES // WORD_BYTES
#: Instructions per WRITE_IMEM.
MAX_IMEM_WORDS = DATA_BYTES // INSTR_BYTES

#: LiteDRAM's control bus (``wb_ctrl``): Wishbone classic, 32-bit data, word addresses.
CSR_DATA_BITS = 32
CSR_ADDR_BITS = 30
#: A frame whose next byte does not come within this many seconds is abandoned by the board (a
#: corrupted ``len`` would otherwise make it wait for bytes of later frames). The host's reply
#: timeout must be longer, so that its retry starts a fresh frame.
FRAME_GAP_S = 0.01


def frame_gap_cycles(sys_clk_hz: float) -> int:
    """:data:`FRAME_GAP_S` in cycles of a board clocked at ``sys_clk_hz`` (at least one)."""
    return max(1, round(sys_clk_hz * FRAME_GAP_S))

#: Width of STATUS's ``error_pc`` (the link refuses an instruction memory deeper than this).
ERROR_PC_BITS = 32
#: Width of the memory-stall cycle counter the link reports (hw/board/bridge.py counts them).
STALL_CYCLES_BITS = 64

for _name, _size, _unit in (("DATA_BYTES", DATA_BYTES, WORD_BYTES),
                            ("DATA_BYTES", DATA_BYTES, INSTR_BYTES),
                            ("INSTR_BYTES", INSTR_BYTES, WORD_BYTES)):
    if _size % _unit:
        raise ContractError(f"{_name}={_size} is not a multiple of {_unit}")


class Command(enum.IntEnum, shape=8):
    """A request's ``cmd`` (see the table of the module docstring)."""

    HELLO = 0
    WRITE_MEM = 1
    READ_MEM = 2
    WRITE_IMEM = 3
    START = 4
    STATUS = 5
    CSR_WRITE = 6
    CSR_READ = 7


class Status(enum.IntEnum, shape=8):
    """A reply's ``status``, in the order the board checks a request (:func:`request_status`)."""

    OK = 0
    BAD_COMMAND = 1     # cmd is no Command
    BAD_LENGTH = 2      # data length or word count wrong for the command
    BAD_ADDRESS = 3     # the range leaves the DRAM, the instruction memory or the CSR bus
    DRAM_NOT_READY = 4  # memory access or START before LiteDRAM's initialisation succeeded
    BUSY = 5            # memory access, instruction write or START while the accelerator runs
    CSR_TIMEOUT = 6     # the control bus did not acknowledge (hw.board.link.CSR_TIMEOUT_CYCLES)


class ProtocolError(ContractError):
    """A value the host protocol cannot carry (a field too wide, data too long, a bad frame)."""


@dataclass(frozen=True)
class Field:
    """A fixed-size field of a header or of a reply's data: ``bits`` wide, sent in
    ``ceil(bits / 8)`` little-endian bytes."""

    name: str
    bits: int

    @property
    def nbytes(self) -> int:
        return (self.bits + 7) // 8


#: Width of the sequence number (the host counts modulo 2**SEQ_BITS).
SEQ_BITS = 8
REQUEST_HEADER = (Field("seq", SEQ_BITS), Field("cmd", Command.as_shape().width),
                  Field("addr", 32), Field("arg", 32), Field("len", 16))
REPLY_HEADER = (Field("seq", SEQ_BITS), Field("cmd", Command.as_shape().width),
                Field("status", Status.as_shape().width), Field("len", 16))

#: HELLO's reply: what the bitstream was built for.
HELLO_FIELDS = (
    Field("version", 8),            # PROTOCOL_VERSION
    Field("board_id", 32),          # board_id(board)
    Field("config_id", 48),         # config_id(cfg), of the accelerator's AcceleratorConfig
    Field("imem_depth", 32),        # instructions
    Field("dram_words", 32),        # DRAM size in words
    Field("data_bytes", 16),        # DATA_BYTES
)
#: STATUS's reply: the accelerator's host outputs (hw.top.HOST_STATUS), the bridge's stall
#: counter and LiteDRAM's initialisation state. ``busy`` comes first: the board copies the fields
#: in this order, one byte per cycle, so once ``busy`` reads 0 every later field is final.
STATUS_FIELDS = (
    Field("busy", 1),
    Field("done", 1),
    Field("error", ErrorCode.as_shape().width),
    Field("error_pc", ERROR_PC_BITS),
    Field("cycles", COUNTER_BITS),
    *(Field(name, COUNTER_BITS) for name in COUNTERS),
    Field("stall_cycles", STALL_CYCLES_BITS),
    Field("dram_init_done", 1),
    Field("dram_init_error", 1),
)
#: CSR_READ's reply.
CSR_READ_FIELDS = (Field("data", CSR_DATA_BITS),)


def fields_bytes(fields: Sequence[Field]) -> int:
    """Bytes of ``fields`` packed by :func:`pack_fields`."""
    return sum(f.nbytes for f in fields)


REQUEST_HEADER_BYTES = fields_bytes(REQUEST_HEADER)
REPLY_HEADER_BYTES = fields_bytes(REPLY_HEADER)
for _fields in (HELLO_FIELDS, STATUS_FIELDS, CSR_READ_FIELDS):
    if fields_bytes(_fields) > DATA_BYTES:
        raise ContractError(f"a reply of {fields_bytes(_fields)} bytes exceeds DATA_BYTES")
if DATA_BYTES >= 1 << 16:
    raise ContractError(f"DATA_BYTES={DATA_BYTES} does not fit the 16-bit len field")


def pack_fields(fields: Sequence[Field], values: dict[str, int]) -> bytes:
    """``values`` (one int per field, every field present) as bytes.

    Raises
    ------
    ProtocolError
        A value missing, negative or wider than its field.
    """
    out = bytearray()
    for f in fields:
        if f.name not in values:
            raise ProtocolError(f"field {f.name!r} missing from {sorted(values)}")
        v = values[f.name]
        if not isinstance(v, int) or not 0 <= v < 1 << f.bits:
            raise ProtocolError(f"field {f.name}={v!r} does not fit {f.bits} bits")
        out += int(v).to_bytes(f.nbytes, "little")
    return bytes(out)


def unpack_fields(fields: Sequence[Field], data: bytes) -> dict[str, int]:
    """The inverse of :func:`pack_fields`.

    Raises
    ------
    ProtocolError
        ``data`` not exactly :func:`fields_bytes` long, or a value wider than its field.
    """
    if len(data) != fields_bytes(fields):
        raise ProtocolError(f"{len(data)} bytes of fields, expected {fields_bytes(fields)}")
    out, pos = {}, 0
    for f in fields:
        v = int.from_bytes(data[pos:pos + f.nbytes], "little")
        if v >> f.bits:
            raise ProtocolError(f"field {f.name}={v} does not fit {f.bits} bits")
        out[f.name] = v
        pos += f.nbytes
    return out


# ---------------------------------------------------------------------- CRC
def crc16_bit(crc, bit):
    """One message bit of CRC-16/CCITT-FALSE (MSB first): the specification.

    Written with ``^``, ``&``, ``>>``, ``<<`` and ``*`` only, so that ``crc`` and ``bit`` may be
    ints (the driver) or Amaranth values (the RTL builds its CRC logic from this function). The
    result of Amaranth values is wider than 16 bits; its low 16 bits are the CRC.
    """
    feedback = ((crc >> (CRC_BITS - 1)) ^ bit) & 1
    return ((crc << 1) & ((1 << CRC_BITS) - 1)) ^ (feedback * CRC_POLY)


def crc16_byte(crc: int, byte: int) -> int:
    """One byte of CRC-16/CCITT-FALSE: :func:`crc16_bit` over its bits, MSB first (no table)."""
    for i in reversed(range(8)):
        crc = crc16_bit(crc, (byte >> i) & 1)
    return crc


def crc16(data: bytes, crc: int = CRC_INIT) -> int:
    """CRC-16/CCITT-FALSE of ``data``: :func:`crc16_byte` folded over the bytes.

    Computed by ``binascii.crc_hqx`` (the same algorithm in C; tests/board checks they agree).

    >>> crc16(b"123456789") == 0x29B1
    True
    >>> crc16(b"123456789" + (0x29B1).to_bytes(2, "big"))
    0
    """
    return binascii.crc_hqx(data, crc)


# ---------------------------------------------------------------------- identities
def board_id(board: Board) -> int:
    """A 32-bit identity of ``board`` (of its name), for HELLO."""
    return int.from_bytes(hashlib.sha256(board.name.encode()).digest()[:4], "little")


def config_id(cfg: AcceleratorConfig) -> int:
    """:attr:`hw.config.AcceleratorConfig.fingerprint` as the 48-bit int HELLO reports."""
    v = int(cfg.fingerprint, 16)
    bits = next(f.bits for f in HELLO_FIELDS if f.name == "config_id")
    if v >> bits:
        raise ProtocolError(f"config fingerprint {cfg.fingerprint!r} is wider than {bits} bits")
    return v


# ---------------------------------------------------------------------- semantics
def request_status(cmd: int, addr: int, arg: int, length: int, *, imem_depth: int,
                   dram_words: int, dram_ready: bool, busy: bool) -> Status:
    """The status the board answers to a request, before executing it (the model of the RTL's
    checks; CSR_TIMEOUT is only known after the bus access).

    Parameters
    ----------
    cmd, addr, arg, length:
        The request's header (``length``: its data bytes).
    imem_depth, dram_words:
        The instruction memory's depth and the DRAM's words.
    dram_ready:
        LiteDRAM's initialisation done and not failed.
    busy:
        The accelerator's ``busy``.
    """
    try:
        cmd = Command(cmd)
    except ValueError:
        return Status.BAD_COMMAND
    if cmd in (Command.WRITE_MEM, Command.WRITE_IMEM):
        unit = WORD_BYTES if cmd == Command.WRITE_MEM else INSTR_BYTES
        if length == 0 or length % unit:
            return Status.BAD_LENGTH
        count, limit = length // unit, (dram_words if cmd == Command.WRITE_MEM else imem_depth)
    elif length:
        return Status.BAD_LENGTH
    elif cmd == Command.READ_MEM:
        if not 1 <= arg <= MAX_MEM_WORDS:
            return Status.BAD_LENGTH
        count, limit = arg, dram_words
    elif cmd in (Command.CSR_WRITE, Command.CSR_READ):
        count, limit = 1, 1 << CSR_ADDR_BITS
    else:
        count, limit = 0, 0
    if count and addr + count > limit:
        return Status.BAD_ADDRESS
    if cmd in (Command.WRITE_MEM, Command.READ_MEM, Command.START) and not dram_ready:
        return Status.DRAM_NOT_READY
    if cmd in (Command.WRITE_MEM, Command.READ_MEM, Command.WRITE_IMEM, Command.START) and busy:
        return Status.BUSY
    return Status.OK


# ---------------------------------------------------------------------- frames
def _check_u(name: str, value: int, bits: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << bits:
        raise ProtocolError(f"{name}={value!r} does not fit {bits} bits")


class Frame:
    """What :class:`Request` and :class:`Reply` share: a sync byte, a header of fields, data."""

    SYNC: ClassVar[int]
    HEADER: ClassVar[tuple[Field, ...]]
    data: bytes

    def __post_init__(self):
        for f in self.HEADER:
            if f.name != "len":
                _check_u(f.name, getattr(self, f.name), f.bits)
        if len(self.data) > DATA_BYTES:
            raise ProtocolError(f"{len(self.data)} data bytes exceed DATA_BYTES={DATA_BYTES}")
        object.__setattr__(self, "data", bytes(self.data))

    def header(self) -> dict[str, int]:
        """The header's fields."""
        return {f.name: (len(self.data) if f.name == "len" else getattr(self, f.name))
                for f in self.HEADER}

    def encode(self) -> bytes:
        """The frame: sync, header, data, CRC."""
        body = pack_fields(self.HEADER, self.header()) + self.data
        return bytes([self.SYNC]) + body + crc16(body).to_bytes(CRC_BYTES, "big")

    @classmethod
    def from_header(cls, header: dict[str, int], data: bytes):
        """The frame of a decoded header and its data."""
        return cls(**{k: v for k, v in header.items() if k != "len"}, data=data)


@dataclass(frozen=True)
class Request(Frame):
    """A request frame (host -> board). ``cmd`` is an int so that tests can send bad ones."""

    seq: int
    cmd: int
    addr: int = 0
    arg: int = 0
    data: bytes = b""

    SYNC: ClassVar[int] = SYNC_REQUEST
    HEADER: ClassVar[tuple[Field, ...]] = REQUEST_HEADER


@dataclass(frozen=True)
class Reply(Frame):
    """A reply frame (board -> host)."""

    seq: int
    cmd: int
    status: int = Status.OK
    data: bytes = b""

    SYNC: ClassVar[int] = SYNC_REPLY
    HEADER: ClassVar[tuple[Field, ...]] = REPLY_HEADER


class FrameDecoder:
    """A streaming decoder of :class:`Request` or :class:`Reply` frames that resynchronises.

    Bytes before a sync byte are skipped; a candidate frame whose ``len`` exceeds
    :data:`DATA_BYTES` or whose CRC fails is dropped by skipping its sync byte only, so a frame
    that starts inside a broken one is still found.

    Parameters
    ----------
    kind:
        :class:`Request` or :class:`Reply`.

    Attributes
    ----------
    skipped:
        Bytes skipped so far (garbage, broken frames).
    bad_frames:
        Candidate frames dropped (bad ``len`` or CRC).
    """

    def __init__(self, kind: type[Frame]):
        if kind not in (Request, Reply):
            raise TypeError(f"kind must be Request or Reply, got {kind!r}")
        self._kind = kind
        self._header_bytes = fields_bytes(kind.HEADER)
        self._buf = bytearray()
        self.skipped = 0
        self.bad_frames = 0

    def needed(self) -> int:
        """Bytes still missing before the buffered candidate frame can be decided (at least 1)."""
        buf = self._buf
        if not buf:
            return 1 + self._header_bytes + CRC_BYTES
        if len(buf) < 1 + self._header_bytes:
            return 1 + self._header_bytes + CRC_BYTES - len(buf)
        length = self._length()
        return max(1, 1 + self._header_bytes + length + CRC_BYTES - len(buf))

    def _length(self) -> int:
        return unpack_fields(self._kind.HEADER, bytes(self._buf[1:1 + self._header_bytes]))["len"]

    def _skip(self, n: int) -> None:
        del self._buf[:n]
        self.skipped += n

    def feed(self, data: Iterable[int] | bytes) -> list[Frame]:
        """Add received bytes; return the frames they complete, in order."""
        self._buf += bytes(data)
        out = []
        hb = self._header_bytes
        while self._buf:
            start = self._buf.find(self._kind.SYNC)
            if start < 0:
                self._skip(len(self._buf))
                break
            self._skip(start)
            if len(self._buf) < 1 + hb:
                break
            length = self._length()
            if length > DATA_BYTES:
                self.bad_frames += 1
                self._skip(1)
                continue
            total = 1 + hb + length + CRC_BYTES
            if len(self._buf) < total:
                break
            body = bytes(self._buf[1:total])
            if crc16(body):
                self.bad_frames += 1
                self._skip(1)
                continue
            header = unpack_fields(self._kind.HEADER, body[:hb])
            out.append(self._kind.from_header(header, body[hb:hb + length]))
            del self._buf[:total]
        return out
