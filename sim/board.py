"""The host driver of the board link: the protocol of :mod:`hw.board.protocol` over any byte
transport.

:class:`BoardLink` talks to a :class:`hw.board.link.HostLink` through a :class:`Transport`: the
board's UART (:class:`SerialTransport`, pyserial), a simulated board (a transport that steps a
simulation), or either wrapped in :class:`FaultyTransport` to test recovery. Each call sends
one request per frame and waits for its reply (stop and wait); a reply that does not come
within ``timeout`` (lost or corrupted, either way) makes it send the same frame again, same
sequence number, so the board answers a retry from its kept reply without executing the command
twice. After ``retries`` resends it raises :class:`LinkTimeout`, naming the transport.

A session opens with HELLO, which checks the bitstream's protocol version and frame size;
:meth:`BoardLink.require_build` then refuses a bitstream built for another accelerator
configuration or board.

Examples
--------
>>> class Dead:
...     name = "/dev/null"
...     def write(self, data): pass
...     def read(self, n, timeout): return b""
>>> BoardLink(Dead(), timeout=0.02, retries=1)
Traceback (most recent call last):
...
sim.board.LinkTimeout: no reply from the board on /dev/null to HELLO (seq 0) after 2 tries of 0.02 s
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from hw.board import protocol as p
from hw.board.ecpix5 import ECPIX5, Board
from hw.config import AcceleratorConfig
from hw.counters import COUNTERS
from hw.isa import ErrorCode
from sim.errors import SimulationError

__all__ = ["BoardLinkError", "LinkTimeout", "BoardRefused", "Transport", "SerialTransport",
           "FaultyTransport", "BoardStatus", "BoardLink"]


class BoardLinkError(SimulationError):
    """The host link failed: a port that does not open, a board that does not answer or
    refuses, a bitstream that speaks another protocol."""


class LinkTimeout(BoardLinkError):
    """No reply after every retry."""


class BoardRefused(BoardLinkError):
    """The board answered a request with an error status (:class:`hw.board.protocol.Status`).

    Attributes
    ----------
    status:
        The status.
    """

    def __init__(self, message: str, status: p.Status):
        super().__init__(message)
        self.status = status


class Transport(Protocol):
    """A byte pipe to the board."""

    def write(self, data: bytes) -> None:
        """Send ``data``."""

    def read(self, n: int, timeout: float) -> bytes:
        """Up to ``n`` bytes: fewer (possibly none) when ``timeout`` seconds passed first."""


def _name(transport) -> str:
    return str(getattr(transport, "name", type(transport).__name__))


class SerialTransport:
    """The board's UART through pyserial.

    Parameters
    ----------
    port:
        The serial device (``/dev/ttyUSB1``: the ECPIX-5's FTDI exposes the UART on its second
        channel).
    baud:
        Line rate; the bitstream's (:data:`hw.board.ecpix5.ECPIX5` ``.uart_baud``).
    timeout:
        Default read timeout in seconds.

    Raises
    ------
    BoardLinkError
        The port does not open (one line naming it).
    """

    def __init__(self, port: str, baud: int = ECPIX5.uart_baud, timeout: float = 0.5):
        import serial  # imported here: the rest of the driver runs without pyserial

        self.name = port
        try:
            self._serial = serial.Serial(port, baudrate=baud, timeout=timeout)
        except (serial.SerialException, OSError, ValueError) as e:
            raise BoardLinkError(f"cannot open serial port {port} at {baud} baud: {e}") from None

    def write(self, data: bytes) -> None:
        self._serial.write(data)
        self._serial.flush()

    def read(self, n: int, timeout: float) -> bytes:
        self._serial.timeout = timeout
        return bytes(self._serial.read(n))

    def close(self) -> None:
        self._serial.close()

    def __enter__(self) -> SerialTransport:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class FaultyTransport:
    """Wraps a transport and damages frames in both directions, for tests.

    Each ``write`` (one request frame) and each non-empty ``read`` (part of the replies) is,
    with probability ``corrupt``, given one byte flipped (XOR with a random non-zero byte), or
    else with probability ``drop``, loses a random run of its bytes.

    Parameters
    ----------
    inner:
        The transport to the board.
    rng:
        The source of every random choice.
    corrupt, drop:
        Probabilities per write or read, each in [0, 1], their sum at most 1.

    Attributes
    ----------
    frames_injected:
        Writes and reads damaged so far.
    """

    def __init__(self, inner: Transport, rng: random.Random, corrupt: float = 0.0,
                 drop: float = 0.0):
        for name, v in (("corrupt", corrupt), ("drop", drop)):
            if not 0 <= v <= 1:
                raise ValueError(f"{name} must be a probability in [0, 1], got {v!r}")
        if corrupt + drop > 1:
            raise ValueError(f"corrupt + drop must be at most 1, got {corrupt} + {drop}")
        self.inner, self.rng, self.corrupt, self.drop = inner, rng, corrupt, drop
        self.name = _name(inner)
        self.frames_injected = 0

    def _damage(self, data: bytes) -> bytes:
        r = self.rng.random()
        if not data or r >= self.corrupt + self.drop:
            return data
        self.frames_injected += 1
        out = bytearray(data)
        i = self.rng.randrange(len(out))
        if r < self.corrupt:
            out[i] ^= self.rng.randrange(1, 256)
        else:
            del out[i:self.rng.randint(i + 1, len(out))]
        return bytes(out)

    def write(self, data: bytes) -> None:
        self.inner.write(self._damage(data))

    def read(self, n: int, timeout: float) -> bytes:
        return self._damage(self.inner.read(n, timeout))


@dataclass(frozen=True)
class BoardStatus:
    """STATUS's reply (:data:`hw.board.protocol.STATUS_FIELDS`).

    ``error``, ``error_pc``, ``cycles`` and ``counters`` describe the last run once ``done``
    is set and ``busy`` clear (hw/top.py); ``stall_cycles`` are the cycles the bridge froze the
    accelerator for memory.
    """

    busy: bool
    done: bool
    error: ErrorCode
    error_pc: int
    cycles: int
    counters: dict[str, int]
    stall_cycles: int
    dram_init_done: bool
    dram_init_error: bool

    @classmethod
    def from_fields(cls, f: dict[str, int]) -> BoardStatus:
        return cls(busy=bool(f["busy"]), done=bool(f["done"]), error=ErrorCode(f["error"]),
                   error_pc=f["error_pc"], cycles=f["cycles"],
                   counters={name: f[name] for name in COUNTERS},
                   stall_cycles=f["stall_cycles"], dram_init_done=bool(f["dram_init_done"]),
                   dram_init_error=bool(f["dram_init_error"]))


def _as_bytes(name: str, data, unit: int) -> bytes:
    raw = bytes(np.ascontiguousarray(data, dtype=np.uint8)) if isinstance(data, np.ndarray) \
        else bytes(data)
    if not raw or len(raw) % unit:
        raise BoardLinkError(f"{name} of {len(raw)} bytes is not a positive whole number of "
                             f"{unit}-byte words")
    return raw


class BoardLink:
    """The host's end of the board link.

    Parameters
    ----------
    transport:
        The byte pipe (:class:`Transport`).
    timeout:
        Seconds to wait for a reply before resending; longer than
        :data:`hw.board.protocol.FRAME_GAP_S` (the board must have abandoned a broken frame
        before the retry comes) and than a full frame each way at the link's rate.
    retries:
        Resends of one request before :class:`LinkTimeout`.

    Raises
    ------
    LinkTimeout
        The board does not answer the opening HELLO.
    BoardLinkError
        It answers in another protocol version or frame size.

    Attributes
    ----------
    info:
        HELLO's fields (:data:`hw.board.protocol.HELLO_FIELDS`): what the bitstream was built
        for (``board_id``, ``config_id``: :func:`hw.board.protocol.board_id`, ``config_id``).
    frames_recovered:
        Frames lost (a request or its reply: no matching reply in time) and recovered by a
        resend.
    """

    def __init__(self, transport: Transport, timeout: float = 0.5, retries: int = 8):
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or \
                not timeout > p.FRAME_GAP_S:
            raise ValueError(f"timeout must be a number of seconds > FRAME_GAP_S="
                             f"{p.FRAME_GAP_S}, got {timeout!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an int >= 0, got {retries!r}")
        self.transport = transport
        self.timeout = float(timeout)
        self.retries = retries
        self.frames_recovered = 0
        self._seq = 0
        self.info = self.hello()

    # ------------------------------------------------------------ the exchange
    def _exchange(self, cmd: p.Command, addr: int = 0, arg: int = 0,
                  data: bytes = b"") -> bytes:
        """Send one request until its reply comes; its data, or an error for its status."""
        req = p.Request(seq=self._seq, cmd=cmd, addr=addr, arg=arg, data=data)
        self._seq = (self._seq + 1) % (1 << p.SEQ_BITS)
        frame = req.encode()
        for attempt in range(1 + self.retries):
            self.transport.write(frame)
            reply = self._await(req)
            if reply is not None:
                self.frames_recovered += attempt
                break
        else:
            raise LinkTimeout(f"no reply from the board on {_name(self.transport)} to "
                              f"{cmd.name} (seq {req.seq}) after {1 + self.retries} tries of "
                              f"{self.timeout:g} s")
        if reply.status != p.Status.OK:
            try:
                status = p.Status(reply.status)
            except ValueError:
                raise BoardLinkError(f"the board answered {cmd.name} with unknown status "
                                     f"{reply.status}") from None
            raise BoardRefused(f"the board refused {cmd.name} (addr={addr:#x}, arg={arg}, "
                               f"{len(data)} data bytes): {status.name}", status)
        return reply.data

    def _await(self, req: p.Request) -> p.Reply | None:
        """The reply to ``req``, or None when none came within the timeout. Other frames (a
        late reply to an earlier request) and garbage are skipped, within a budget of bytes:
        a stream of noise is no reply either."""
        dec = p.FrameDecoder(p.Reply)
        budget = 2 * (1 + p.REPLY_HEADER_BYTES + p.DATA_BYTES + p.CRC_BYTES)
        while budget > 0:
            chunk = self.transport.read(dec.needed(), self.timeout)
            if not chunk:
                return None
            budget -= len(chunk)
            for reply in dec.feed(chunk):
                if reply.seq == req.seq and reply.cmd == req.cmd:
                    return reply
        return None

    def require_build(self, cfg: AcceleratorConfig, board: Board) -> None:
        """Refuse a board whose bitstream was built for another configuration or board.

        Parameters
        ----------
        cfg:
            The configuration a program was compiled for, with the board's memory
            (:meth:`hw.board.ecpix5.Board.accelerator_config`).
        board:
            The board it was compiled for.

        Raises
        ------
        BoardLinkError
            HELLO's ``board_id`` or ``config_id`` differs (both named).
        """
        want = {"board_id": p.board_id(board), "config_id": p.config_id(cfg)}
        got = {k: self.info[k] for k in want}
        if got != want:
            raise BoardLinkError(
                f"the board on {_name(self.transport)} runs a bitstream for board "
                f"{got['board_id']:#010x}, config {got['config_id']:012x}; this program is "
                f"for board {board.name} ({want['board_id']:#010x}), config "
                f"{cfg.fingerprint}")

    # ------------------------------------------------------------ commands
    def hello(self) -> dict[str, int]:
        """HELLO: what the bitstream was built for; checks its protocol and frame size."""
        info = p.unpack_fields(p.HELLO_FIELDS, self._exchange(p.Command.HELLO))
        if (info["version"], info["data_bytes"]) != (p.PROTOCOL_VERSION, p.DATA_BYTES):
            raise BoardLinkError(
                f"the board on {_name(self.transport)} speaks protocol version "
                f"{info['version']} with {info['data_bytes']}-byte frames; this driver "
                f"{p.PROTOCOL_VERSION} with {p.DATA_BYTES}: rebuild the bitstream")
        return info

    def write_mem(self, addr: int, data: bytes | np.ndarray) -> None:
        """Write ``data`` (whole DRAM words) from DRAM word ``addr`` on."""
        raw = _as_bytes("write_mem data", data, p.WORD_BYTES)
        for off in range(0, len(raw), p.DATA_BYTES):
            self._exchange(p.Command.WRITE_MEM, addr=addr + off // p.WORD_BYTES,
                           data=raw[off:off + p.DATA_BYTES])

    def read_mem(self, addr: int, words: int) -> bytes:
        """``words`` DRAM words from word ``addr`` on."""
        if isinstance(words, bool) or not isinstance(words, int) or words <= 0:
            raise BoardLinkError(f"read_mem words must be a positive int, got {words!r}")
        out = bytearray()
        for off in range(0, words, p.MAX_MEM_WORDS):
            n = min(p.MAX_MEM_WORDS, words - off)
            out += self._exchange(p.Command.READ_MEM, addr=addr + off, arg=n)
        return bytes(out)

    def write_imem(self, index: int, program: bytes | np.ndarray) -> None:
        """Write encoded instructions (:func:`hw.isa.encode_program`) from ``index`` on."""
        raw = _as_bytes("write_imem program", program, p.INSTR_BYTES)
        for off in range(0, len(raw), p.DATA_BYTES):
            self._exchange(p.Command.WRITE_IMEM, addr=index + off // p.INSTR_BYTES,
                           data=raw[off:off + p.DATA_BYTES])

    def start(self) -> None:
        """START the program at instruction 0 (refused while busy or before DRAM is ready)."""
        self._exchange(p.Command.START)

    def status(self) -> BoardStatus:
        """STATUS: the accelerator's state and counters, the stall cycles, the DRAM state."""
        return BoardStatus.from_fields(
            p.unpack_fields(p.STATUS_FIELDS, self._exchange(p.Command.STATUS)))

    def csr_write(self, addr: int, value: int) -> None:
        """Write ``value`` to LiteDRAM's control register at word address ``addr``."""
        self._exchange(p.Command.CSR_WRITE, addr=addr, arg=value)

    def csr_read(self, addr: int) -> int:
        """LiteDRAM's control register at word address ``addr``."""
        return p.unpack_fields(p.CSR_READ_FIELDS,
                               self._exchange(p.Command.CSR_READ, addr=addr))["data"]
