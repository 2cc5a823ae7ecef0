"""The board's end of the host link: frames in, commands executed once, replies out.

:class:`HostLink` speaks the protocol of :mod:`hw.board.protocol` over two byte streams (the
UART's, :mod:`hw.board.uart`, on the board; a byte pump in simulation). Three state machines,
one per concern, hand a frame along::

    rx bytes -> RX parser -> request buffer -> EXEC -> reply buffer -> TX -> tx bytes
                (sync, header,                (checks, native port,     (header, data,
                 data, CRC)                    imem, start, status,      CRC)
                                               Wishbone control bus)

RX hunts for the sync byte, shifts the header into a register, writes the data bytes into the
request buffer and checks the CRC; a frame with a bad CRC or an oversized ``len``, or one whose
next byte does not come within :data:`~hw.board.protocol.FRAME_GAP_S` (at the board's
``sys_clk_hz``), is dropped without a reply (the host retries). A good frame waits (``rx.ready``
low) until its reply has been sent. EXEC checks the request
(:func:`hw.board.protocol.request_status`, the model these checks are tested against), executes
it and writes the reply data into the reply buffer; a request with the seq of the last executed
one (HELLO aside) skips EXEC: TX re-sends the kept reply. Both buffers are
:data:`~hw.board.protocol.DATA_BYTES` of native-port words, written a byte at a time (byte
enables) or a word at a time; TX copies each word of the reply buffer into a register before
sending its bytes, since an ECP5 block RAM's unregistered output takes ~5.6 ns of the 13.3 ns
cycle and the CRC logic follows the byte.

Memory access uses the link's own native port: writes one word at a time (command, then its
data, as LiteDRAM's Wishbone bridge does), reads with as many commands in flight as the port
accepts (``rdata.ready`` is always high). The control bus is a Wishbone classic master; an access
not acknowledged within :data:`CSR_TIMEOUT_CYCLES` ends with ``CSR_TIMEOUT``.

``start`` is a one-cycle pulse in the link's clock domain: a top that clock-enables the
accelerator must hold it until the accelerator has seen it (hw/board/bridge.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from amaranth import Cat, Const, Module, Mux, Signal, Value, unsigned
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import exact_log2

from hw.board import protocol as p
from hw.board.ecpix5 import Board
from hw.board.native import NativePortSignature
from hw.config import AcceleratorConfig
from hw.top import HOST_STATUS, host_ports

__all__ = ["CSR_TIMEOUT_CYCLES", "WishboneSignature", "HostLink", "LinkError"]

#: Cycles the link waits for the control bus's ``ack``. LiteDRAM's CSR bus answers within a
#: few cycles; a missing answer (no core, a bad bitstream) must not hang the link.
CSR_TIMEOUT_CYCLES = 256


class LinkError(p.ProtocolError):
    """A configuration or board the host link cannot be built for."""


class WishboneSignature(wiring.Signature):
    """A Wishbone classic master (B4, no pipelining, word addresses), seen from the master.

    Members
    -------
    adr: Out(CSR_ADDR_BITS); dat_w: Out(CSR_DATA_BITS); dat_r: In(CSR_DATA_BITS);
    sel: Out(CSR_DATA_BITS // 8); cyc, stb, we: Out(1); ack: In(1)
    """

    def __init__(self):
        super().__init__({
            "adr": Out(p.CSR_ADDR_BITS),
            "dat_w": Out(p.CSR_DATA_BITS),
            "dat_r": In(p.CSR_DATA_BITS),
            "sel": Out(p.CSR_DATA_BITS // 8),
            "cyc": Out(1),
            "stb": Out(1),
            "we": Out(1),
            "ack": In(1),
        })

    def __eq__(self, other):
        return type(other) is WishboneSignature

    def __repr__(self):
        return "WishboneSignature()"


def _pack(fields: Sequence[p.Field], values: dict[str, Value | int]) -> Value:
    """``values`` laid out as :func:`hw.board.protocol.pack_fields` sends them (byte 0 in bits
    0..7)."""
    parts = []
    for f in fields:
        raw = values[f.name]
        v = Const(raw, f.bits) if isinstance(raw, int) else Value.cast(raw)
        if len(v) > f.bits:
            raise LinkError(f"field {f.name} is {len(v)} bits wide, the protocol carries "
                            f"{f.bits}")
        parts.append(v.as_unsigned())
        parts.append(Const(0, 8 * f.nbytes - len(v)))
    return Cat(*parts)


def _unpack(fields: Sequence[p.Field], flat: Value) -> dict[str, Value]:
    out, pos = {}, 0
    for f in fields:
        out[f.name] = flat[8 * pos:8 * pos + f.bits]
        pos += f.nbytes
    return out


class HostLink(wiring.Component):
    """The host link of one accelerator configuration on one board.

    Parameters
    ----------
    cfg:
        The accelerator's configuration, with the board's memory
        (:meth:`hw.board.ecpix5.Board.accelerator_config`).
    board:
        The board (its native port, its DRAM size).

    Members
    -------
    rx: In(stream.Signature(8))
        Bytes from the host.
    tx: Out(stream.Signature(8))
        Bytes to the host.
    mem: Out(NativePortSignature(board.port_bits, board.port_addr_bits))
        The link's own LiteDRAM native port (host access to the DRAM).
    start, imem_wr, busy, done, error, error_pc, cycles, counters:
        :func:`hw.top.host_ports`, flipped: connect them to the accelerator's.
    stall_cycles: In(STALL_CYCLES_BITS)
        Cycles the bridge froze the accelerator (reported by STATUS).
    ctrl: Out(WishboneSignature())
        LiteDRAM's control bus.
    dram_init_done, dram_init_error: In(1)
        LiteDRAM's initialisation state (memory access and START wait for done without error).
    """

    def __init__(self, cfg: AcceleratorConfig, board: Board):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        if not isinstance(board, Board):
            raise TypeError(f"board must be a Board, got {board!r}")
        if board.port_bits != 8 * p.WORD_BYTES:
            raise LinkError(f"board {board.name}'s native port is {board.port_bits} bits; the "
                            f"protocol's words are {8 * p.WORD_BYTES}")
        if cfg.beat_bytes != p.WORD_BYTES or cfg.memory.size_bytes != board.dram_bytes:
            raise LinkError(f"cfg's memory ({cfg.beat_bytes}-byte beats, "
                            f"{cfg.memory.size_bytes} bytes) is not board {board.name}'s "
                            f"({p.WORD_BYTES}, {board.dram_bytes}): use "
                            f"board.accelerator_config(cfg)")
        if cfg.imem_depth >= 1 << p.ERROR_PC_BITS:
            raise LinkError(f"imem_depth={cfg.imem_depth} does not fit STATUS's "
                            f"{p.ERROR_PC_BITS}-bit error_pc")
        self._cfg = cfg
        self._board = board
        ports = host_ports(cfg)
        super().__init__({
            "rx": In(stream.Signature(8)),
            "tx": Out(stream.Signature(8)),
            "mem": Out(NativePortSignature(board.port_bits, board.port_addr_bits)),
            **{name: member.flip() for name, member in ports.items()},
            "stall_cycles": In(p.STALL_CYCLES_BITS),
            "ctrl": Out(WishboneSignature()),
            "dram_init_done": In(1),
            "dram_init_error": In(1),
        })

    @property
    def dram_words(self) -> int:
        """Words of the DRAM, as HELLO reports them."""
        return self._board.dram_bytes // p.WORD_BYTES

    def elaborate(self, platform):
        m = Module()
        cfg = self._cfg
        word_bits = 8 * p.WORD_BYTES
        word_bytes_log2 = exact_log2(p.WORD_BYTES)
        buf_depth = p.DATA_BYTES // p.WORD_BYTES
        instr_words = p.INSTR_BYTES // p.WORD_BYTES
        m.submodules.req_buf = req_buf = memory.Memory(
            shape=unsigned(word_bits), depth=buf_depth, init=[])
        m.submodules.rep_buf = rep_buf = memory.Memory(
            shape=unsigned(word_bits), depth=buf_depth, init=[])
        req_w = req_buf.write_port(granularity=8)
        req_r = req_buf.read_port()
        rep_w = rep_buf.write_port(granularity=8)
        rep_r = rep_buf.read_port()

        def byte_write(port, index: Value, byte: Value):
            """Write byte ``index`` of a buffer."""
            m.d.comb += [port.addr.eq(index >> word_bytes_log2),
                         port.en.eq(Const(1, len(port.en)) << index[:word_bytes_log2]),
                         port.data.eq(byte.replicate(p.WORD_BYTES))]

        def crc_next(crc: Value, byte: Value) -> Value:
            """The CRC after ``byte``: :func:`hw.board.protocol.crc16_bit` per bit, each step a
            signal (an expression reused by the next step would be copied, not shared)."""
            for bit in reversed(range(8)):
                step = Signal(p.CRC_BITS)
                m.d.comb += step.eq(p.crc16_bit(crc, byte[bit]))
                crc = step
            return crc

        # ------------------------------------------------------------ RX: frames in
        hdr_bytes = p.REQUEST_HEADER_BYTES
        hdr = Signal(8 * hdr_bytes)
        hdr_next = Cat(hdr[8:], self.rx.payload)
        req = _unpack(p.REQUEST_HEADER, hdr)
        rx_crc = Signal(p.CRC_BITS)
        rx_cnt = Signal(range(max(hdr_bytes, p.DATA_BYTES)))
        rx_take = self.rx.valid & self.rx.ready
        gap_cycles = p.frame_gap_cycles(self._board.sys_clk_hz)
        gap = Signal(range(gap_cycles))  # cycles since the frame's last byte
        mid_frame = Signal()
        m.d.sync += gap.eq(Mux(rx_take | ~mid_frame, 0, gap + 1))
        stalled = gap == gap_cycles - 1  # (ready is high mid-frame: no byte is waiting)
        frame = Signal()    # a good frame waits for its reply
        release = Signal()  # its reply has been sent
        rx_crc_next = crc_next(rx_crc, self.rx.payload)
        with m.If(rx_take):
            m.d.sync += rx_crc.eq(rx_crc_next)
        with m.FSM(name="rx"):
            with m.State("HUNT"):
                m.d.comb += self.rx.ready.eq(1)
                with m.If(rx_take & (self.rx.payload == p.SYNC_REQUEST)):
                    m.d.sync += [rx_crc.eq(p.CRC_INIT), rx_cnt.eq(0)]
                    m.next = "HEADER"
            with m.State("HEADER"):
                m.d.comb += [self.rx.ready.eq(1), mid_frame.eq(1)]
                with m.If(stalled & ~self.rx.valid):
                    m.next = "HUNT"
                with m.If(rx_take):
                    m.d.sync += [hdr.eq(hdr_next), rx_cnt.eq(rx_cnt + 1)]
                    with m.If(rx_cnt == hdr_bytes - 1):
                        m.d.sync += rx_cnt.eq(0)
                        length = _unpack(p.REQUEST_HEADER, hdr_next)["len"]
                        with m.If(length > p.DATA_BYTES):
                            m.next = "HUNT"
                        with m.Elif(length == 0):
                            m.next = "CRC"
                        with m.Else():
                            m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += [self.rx.ready.eq(1), mid_frame.eq(1)]
                with m.If(stalled & ~self.rx.valid):
                    m.next = "HUNT"
                with m.If(rx_take):
                    byte_write(req_w, rx_cnt, self.rx.payload)
                    m.d.sync += rx_cnt.eq(rx_cnt + 1)
                    with m.If(rx_cnt == req["len"] - 1):
                        m.d.sync += rx_cnt.eq(0)
                        m.next = "CRC"
            with m.State("CRC"):
                m.d.comb += [self.rx.ready.eq(1), mid_frame.eq(1)]
                with m.If(stalled & ~self.rx.valid):
                    m.next = "HUNT"
                with m.If(rx_take):
                    m.d.sync += rx_cnt.eq(rx_cnt + 1)
                    with m.If(rx_cnt == p.CRC_BYTES - 1):
                        # The CRC of everything after sync, CRC included, is 0.
                        with m.If(rx_crc_next == 0):
                            m.next = "FRAME"
                        with m.Else():
                            m.next = "HUNT"
            with m.State("FRAME"):
                m.d.comb += frame.eq(1)
                with m.If(release):
                    m.next = "HUNT"

        # ------------------------------------------------------------ EXEC: checks
        cmd, addr, arg, length = req["cmd"], req["addr"], req["arg"], req["len"]
        is_cmd = {c: cmd == c for c in p.Command}
        n_words = length >> word_bytes_log2
        n_instr = length >> exact_log2(p.INSTR_BYTES)
        dram_ready = self.dram_init_done & ~self.dram_init_error
        # Two register stages, so that neither the command decode nor the 33-bit range check
        # shares a cycle with EXEC's decisions: the header is complete at least CRC_BYTES
        # cycles before the frame is, and EXEC decides a cycle after that (its CHECK state).
        count = Signal(range(max(p.DATA_BYTES, 1 << p.CSR_ADDR_BITS) + 1))
        limit = Signal(range(max(self.dram_words, cfg.imem_depth, 1 << p.CSR_ADDR_BITS) + 1))
        bad_length, unknown = Signal(), Signal()
        with m.Switch(cmd):
            with m.Case(p.Command.WRITE_MEM):
                m.d.sync += [bad_length.eq((length == 0) | (length[:word_bytes_log2] != 0)),
                             count.eq(n_words), limit.eq(self.dram_words)]
            with m.Case(p.Command.WRITE_IMEM):
                m.d.sync += [bad_length.eq((length == 0) | (length % p.INSTR_BYTES != 0)),
                             count.eq(n_instr), limit.eq(cfg.imem_depth)]
            with m.Case(p.Command.READ_MEM):
                m.d.sync += [bad_length.eq((length != 0) | (arg == 0) | (arg > p.MAX_MEM_WORDS)),
                             count.eq(arg), limit.eq(self.dram_words)]
            with m.Case(p.Command.CSR_WRITE, p.Command.CSR_READ):
                m.d.sync += [bad_length.eq(length != 0), count.eq(1),
                             limit.eq(1 << p.CSR_ADDR_BITS)]
            with m.Default():
                m.d.sync += [bad_length.eq(length != 0), count.eq(0), limit.eq(0)]
        needs_dram, needs_idle = Signal(), Signal()
        m.d.sync += [
            unknown.eq(~Cat(*is_cmd.values()).any()),
            needs_dram.eq(is_cmd[p.Command.WRITE_MEM] | is_cmd[p.Command.READ_MEM]
                          | is_cmd[p.Command.START]),
            needs_idle.eq(is_cmd[p.Command.WRITE_MEM] | is_cmd[p.Command.READ_MEM]
                          | is_cmd[p.Command.START] | is_cmd[p.Command.WRITE_IMEM]),
        ]
        check = Signal(p.Status)
        with m.If(unknown):
            m.d.sync += check.eq(p.Status.BAD_COMMAND)
        with m.Elif(bad_length):
            m.d.sync += check.eq(p.Status.BAD_LENGTH)
        with m.Elif((count != 0) & (addr + count > limit)):
            m.d.sync += check.eq(p.Status.BAD_ADDRESS)
        with m.Elif(needs_dram & ~dram_ready):
            m.d.sync += check.eq(p.Status.DRAM_NOT_READY)
        with m.Elif(needs_idle & self.busy):
            m.d.sync += check.eq(p.Status.BUSY)
        with m.Else():
            m.d.sync += check.eq(p.Status.OK)

        # ------------------------------------------------------------ EXEC: reply sources
        status_values = {name: getattr(self, name) for name in HOST_STATUS if name != "counters"}
        status_values |= {name: self.counters[name] for name in self.counters.shape().members}
        status_values |= {"stall_cycles": self.stall_cycles,
                          "dram_init_done": self.dram_init_done,
                          "dram_init_error": self.dram_init_error}
        csr_data = Signal(p.CSR_DATA_BITS)
        sources = {
            p.Command.HELLO: _pack(p.HELLO_FIELDS, {
                "version": p.PROTOCOL_VERSION, "board_id": p.board_id(self._board),
                "config_id": p.config_id(cfg), "imem_depth": cfg.imem_depth,
                "dram_words": self.dram_words, "data_bytes": p.DATA_BYTES}),
            p.Command.STATUS: _pack(p.STATUS_FIELDS, status_values),
            p.Command.CSR_READ: _pack(p.CSR_READ_FIELDS, {"data": csr_data}),
        }

        # ------------------------------------------------------------ EXEC
        last_seq = Signal(p.SEQ_BITS)
        last_valid = Signal()
        rep_seq, rep_cmd, rep_status = Signal(p.SEQ_BITS), Signal(p.Command), Signal(p.Status)
        rep_len = Signal(range(p.DATA_BYTES + 1))
        i = Signal(range(p.DATA_BYTES + 1))  # words or bytes done
        j = Signal(range(p.DATA_BYTES + 1))  # second counter: instructions, read words back
        k = Signal(range(instr_words))       # words of the instruction being assembled
        instr = Signal(8 * p.INSTR_BYTES)
        timer = Signal(range(CSR_TIMEOUT_CYCLES))
        send = Signal()     # TX: send the reply
        sent = Signal()     # TX: done
        m.d.comb += [req_r.addr.eq(i), self.mem.rdata.ready.eq(1), release.eq(sent)]

        def finish(status: p.Status, nbytes: Value | int = 0):
            m.d.sync += [rep_status.eq(status), rep_len.eq(nbytes)]
            m.next = "SEND"

        with m.FSM(name="exec"):
            with m.State("IDLE"):
                with m.If(frame):
                    m.next = "CHECK"
            with m.State("CHECK"):
                with m.If(~is_cmd[p.Command.HELLO] & last_valid & (req["seq"] == last_seq)):
                    m.next = "SEND"  # a retry: the kept reply again
                with m.Else():
                    m.d.sync += [last_seq.eq(req["seq"]),
                                 last_valid.eq(~is_cmd[p.Command.HELLO]),
                                 rep_seq.eq(req["seq"]), rep_cmd.eq(cmd),
                                 i.eq(0), j.eq(0), k.eq(0), timer.eq(0)]
                    with m.If(check != p.Status.OK):
                        finish(check)
                    with m.Else():
                        with m.Switch(cmd):
                            with m.Case(p.Command.HELLO, p.Command.STATUS):
                                m.next = "COPY"
                            with m.Case(p.Command.WRITE_MEM):
                                m.next = "WMEM_READ"
                            with m.Case(p.Command.READ_MEM):
                                m.next = "RMEM"
                            with m.Case(p.Command.WRITE_IMEM):
                                m.next = "WIMEM_READ"
                            with m.Case(p.Command.START):
                                m.next = "START"
                            with m.Case(p.Command.CSR_WRITE, p.Command.CSR_READ):
                                m.next = "CSR"

            with m.State("COPY"):  # fixed fields into the reply buffer, a byte per cycle
                with m.Switch(cmd):
                    for c, flat in sources.items():
                        nbytes = len(flat) // 8
                        with m.Case(c):
                            byte_write(rep_w, i, flat.word_select(i, 8))
                            m.d.sync += i.eq(i + 1)
                            with m.If(i == nbytes - 1):
                                finish(p.Status.OK, nbytes)

            with m.State("WMEM_READ"):  # req_r.addr = i: the word is there next cycle
                m.next = "WMEM_CMD"
            with m.State("WMEM_CMD"):
                m.d.comb += [self.mem.cmd.valid.eq(1), self.mem.cmd.payload.we.eq(1),
                             self.mem.cmd.payload.addr.eq(addr + i)]
                with m.If(self.mem.cmd.ready):
                    m.next = "WMEM_DATA"
            with m.State("WMEM_DATA"):
                m.d.comb += [self.mem.wdata.valid.eq(1),
                             self.mem.wdata.payload.data.eq(req_r.data),
                             self.mem.wdata.payload.we.eq(-1)]
                with m.If(self.mem.wdata.ready):
                    m.d.sync += i.eq(i + 1)
                    m.next = "WMEM_READ"
                    with m.If(i == n_words - 1):
                        finish(p.Status.OK)

            with m.State("RMEM"):  # i: commands accepted, j: words back
                m.d.comb += [self.mem.cmd.valid.eq(i != arg), self.mem.cmd.payload.we.eq(0),
                             self.mem.cmd.payload.addr.eq(addr + i)]
                with m.If(self.mem.cmd.valid & self.mem.cmd.ready):
                    m.d.sync += i.eq(i + 1)
                with m.If(self.mem.rdata.valid):
                    m.d.comb += [rep_w.addr.eq(j), rep_w.en.eq(-1),
                                 rep_w.data.eq(self.mem.rdata.payload)]
                    m.d.sync += j.eq(j + 1)
                    with m.If(j == arg - 1):
                        finish(p.Status.OK, arg << word_bytes_log2)

            with m.State("WIMEM_READ"):
                m.next = "WIMEM_TAKE"
            with m.State("WIMEM_TAKE"):  # words arrive low first
                m.d.sync += [instr.eq(Cat(instr[word_bits:], req_r.data)), i.eq(i + 1),
                             k.eq(k + 1)]
                m.next = "WIMEM_READ"
                with m.If(k == instr_words - 1):
                    m.d.sync += k.eq(0)
                    m.next = "WIMEM_WRITE"
            with m.State("WIMEM_WRITE"):
                m.d.comb += [self.imem_wr.en.eq(1), self.imem_wr.addr.eq(addr + j),
                             self.imem_wr.data.eq(instr)]
                m.d.sync += j.eq(j + 1)
                m.next = "WIMEM_READ"
                with m.If(j == n_instr - 1):
                    finish(p.Status.OK)

            with m.State("START"):
                m.d.comb += self.start.eq(1)
                finish(p.Status.OK)

            with m.State("CSR"):
                m.d.comb += [self.ctrl.cyc.eq(1), self.ctrl.stb.eq(1),
                             self.ctrl.we.eq(is_cmd[p.Command.CSR_WRITE]),
                             self.ctrl.adr.eq(addr), self.ctrl.dat_w.eq(arg),
                             self.ctrl.sel.eq(-1)]
                m.d.sync += timer.eq(timer + 1)
                with m.If(self.ctrl.ack):
                    m.d.sync += csr_data.eq(self.ctrl.dat_r)
                    with m.If(is_cmd[p.Command.CSR_READ]):
                        m.next = "COPY"
                    with m.Else():
                        finish(p.Status.OK)
                with m.Elif(timer == CSR_TIMEOUT_CYCLES - 1):
                    finish(p.Status.CSR_TIMEOUT)

            with m.State("SEND"):
                m.d.comb += send.eq(1)
                m.next = "WAIT"
            with m.State("WAIT"):
                with m.If(sent):
                    m.next = "IDLE"

        # ------------------------------------------------------------ TX: the reply out
        rhdr_bytes = p.REPLY_HEADER_BYTES
        rhdr = _pack(p.REPLY_HEADER, {"seq": rep_seq, "cmd": rep_cmd, "status": rep_status,
                                      "len": rep_len})
        tx_crc = Signal(p.CRC_BITS)
        tx_word = Signal(word_bits)
        tx_cnt = Signal(range(max(rhdr_bytes, p.DATA_BYTES)))
        tx_take = self.tx.valid & self.tx.ready
        crc_be = Cat(*(tx_crc.word_select(b, 8) for b in reversed(range(p.CRC_BYTES))))
        m.d.comb += rep_r.addr.eq(tx_cnt >> word_bytes_log2)
        tx_covered = Signal()  # the byte being sent is covered by the CRC: header and data
        with m.If(tx_take):
            m.d.sync += tx_cnt.eq(tx_cnt + 1)
        with m.If(tx_take & tx_covered):
            m.d.sync += tx_crc.eq(crc_next(tx_crc, self.tx.payload))
        with m.FSM(name="tx"):
            with m.State("IDLE"):
                with m.If(send):
                    m.next = "SYNC"
            with m.State("SYNC"):
                m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(p.SYNC_REPLY)]
                with m.If(tx_take):
                    m.d.sync += [tx_crc.eq(p.CRC_INIT), tx_cnt.eq(0)]
                    m.next = "HEADER"
            with m.State("HEADER"):
                m.d.comb += [self.tx.valid.eq(1), self.tx.payload.eq(rhdr.word_select(tx_cnt, 8)),
                             tx_covered.eq(1)]
                with m.If(tx_take & (tx_cnt == rhdr_bytes - 1)):
                    m.d.sync += tx_cnt.eq(0)
                    m.next = "CRC"
                    with m.If(rep_len != 0):
                        m.next = "FETCH"
            with m.State("FETCH"):  # rep_r.addr = tx_cnt >> 3: the word is there next cycle
                m.next = "LOAD"
            with m.State("LOAD"):  # a register: the block RAM's output is slow (docstring)
                m.d.sync += tx_word.eq(rep_r.data)
                m.next = "DATA"
            with m.State("DATA"):
                m.d.comb += [self.tx.valid.eq(1),
                             self.tx.payload.eq(tx_word.word_select(tx_cnt[:word_bytes_log2], 8)),
                             tx_covered.eq(1)]
                with m.If(tx_take):
                    with m.If(tx_cnt == rep_len - 1):
                        m.d.sync += tx_cnt.eq(0)
                        m.next = "CRC"
                    with m.Elif(tx_cnt[:word_bytes_log2] == p.WORD_BYTES - 1):
                        m.next = "FETCH"
            with m.State("CRC"):  # big-endian, so that the host's CRC over it all is 0
                m.d.comb += [self.tx.valid.eq(1),
                             self.tx.payload.eq(crc_be.word_select(tx_cnt, 8))]
                with m.If(tx_take):
                    with m.If(tx_cnt == p.CRC_BYTES - 1):
                        m.d.comb += sent.eq(1)
                        m.next = "IDLE"
        return m
