"""DMA engines: LOAD (DRAM -> ACT/WGT/PARAM) and STORE (OUT -> DRAM), and the DRAM port.

Both move ``rows`` rows of ``row_beats`` beats; DRAM rows start ``dram_stride`` beats apart, the
scratchpad side is contiguous from ``spad_addr`` (:func:`sim.functional.exec_load`,
:func:`sim.functional.exec_store`). With the command transferred in cycle ``g`` (the grant):

LOAD
    one read request per cycle in ``g + 1 .. g + B`` (``B = rows * row_beats``); the response
    to a request of cycle ``r`` arrives in ``r + latency`` and is registered, then written to
    the scratchpad in ``r + latency + 1``: the last write, and ``done``, are in
    ``g + B + latency + LOAD_OVERHEAD`` with ``LOAD_OVERHEAD = 1``.
STORE
    one scratchpad read per cycle in ``g + 1 .. g + B``; each beat is written to DRAM in the
    next cycle (posted writes): the last write, and ``done``, are in ``g + B + STORE_OVERHEAD``
    with ``STORE_OVERHEAD = 1``.

The DRAM port (:class:`DramSignature`) has a read channel (requests, and responses exactly
``cfg.memory.latency`` cycles later, no back-pressure) and a posted write channel, one beat
each per cycle; addresses count beats.
"""

from __future__ import annotations

from amaranth import Module, Signal, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw import timing
from hw.config import AcceleratorConfig
from hw.isa import DmaBody, Spad

__all__ = ["DRAM_ADDR_BITS", "dram_write_layout", "DramSignature", "LoadEngine", "StoreEngine"]

#: DRAM beat address width, as in the ISA.
DRAM_ADDR_BITS = DmaBody["dram_addr"].width
#: Number of beats one DMA instruction can move (rows x row_beats).
_BEATS_BITS = DmaBody["rows"].width + DmaBody["row_beats"].width


def dram_write_layout(cfg: AcceleratorConfig) -> data.StructLayout:
    """Payload of the DRAM write channel: beat address and data."""
    return data.StructLayout({"addr": DRAM_ADDR_BITS, "data": 8 * cfg.beat_bytes})


class DramSignature(wiring.Signature):
    """The accelerator's DRAM port, seen from the accelerator.

    Members
    -------
    rd_req: Out(stream.Signature(DRAM_ADDR_BITS, always_ready=True))
        Read request: a beat address.
    rd_resp: In(stream.Signature(8 * beat_bytes, always_ready=True))
        Read data, ``latency`` cycles after its request, in request order.
    wr: Out(stream.Signature(dram_write_layout(cfg), always_ready=True))
        Posted write of one beat.
    """

    def __init__(self, cfg: AcceleratorConfig):
        self._cfg = cfg
        super().__init__({
            "rd_req": Out(stream.Signature(DRAM_ADDR_BITS, always_ready=True)),
            "rd_resp": In(stream.Signature(8 * cfg.beat_bytes, always_ready=True)),
            "wr": Out(stream.Signature(dram_write_layout(cfg), always_ready=True)),
        })

    def __eq__(self, other):
        return (type(other) is DramSignature and other._cfg.beat_bytes == self._cfg.beat_bytes)

    def __repr__(self):
        return f"DramSignature(beat_bytes={self._cfg.beat_bytes})"


def _spad_beat_port(cfg: AcceleratorConfig, spad: Spad, direction: str):
    """Beat port of a scratchpad, as the DMA engine sees it (it drives the address)."""
    aw = ceil_log2(cfg.spad_beats(spad.name.lower()))
    cls = memory.ReadPort if direction == "read" else memory.WritePort
    return In(cls.Signature(addr_width=aw, shape=unsigned(8 * cfg.beat_bytes)))


def _check_cfg(cfg):
    if not isinstance(cfg, AcceleratorConfig):
        raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")


class _Walker:
    """DRAM address sequence of a strided transfer: ``rows`` rows of ``row_beats`` beats,
    ``dram_stride`` apart. :meth:`load` while idle, ``active`` set in the command cycle,
    :meth:`step` in every cycle that uses :attr:`addr`; :attr:`last` marks the final beat."""

    def __init__(self):
        self.active = Signal()
        self.addr = Signal(DRAM_ADDR_BITS)
        self.row_base = Signal(DRAM_ADDR_BITS)
        self.stride = Signal(DmaBody["dram_stride"].width)
        # Beats left in the row after this one, counted down to a zero test: the end of a row
        # selects the next address, so it must not wait for a subtraction.
        self.cols_left = Signal(DmaBody["row_beats"].width)
        self.last_col = Signal(DmaBody["row_beats"].width)   # row_beats - 1
        self.rows_left = Signal(DmaBody["rows"].width)
        self.end_of_row = self.cols_left == 0
        self.last = self.end_of_row & (self.rows_left == 1)

    def load(self, m, body):
        """Copy the transfer's parameters (every idle cycle: the command's payload is stable
        before it is valid, so the copy needs no enable from the grant logic)."""
        m.d.sync += [
            self.addr.eq(body.dram_addr), self.row_base.eq(body.dram_addr),
            self.stride.eq(body.dram_stride), self.cols_left.eq(body.row_beats - 1),
            self.last_col.eq(body.row_beats - 1), self.rows_left.eq(body.rows),
        ]

    def step(self, m):
        with m.If(self.end_of_row):
            next_row = self.row_base + self.stride
            m.d.sync += [self.cols_left.eq(self.last_col), self.row_base.eq(next_row),
                         self.addr.eq(next_row), self.rows_left.eq(self.rows_left - 1)]
            with m.If(self.rows_left == 1):
                m.d.sync += self.active.eq(0)
        with m.Else():
            m.d.sync += [self.cols_left.eq(self.cols_left - 1), self.addr.eq(self.addr + 1)]


class LoadEngine(wiring.Component):
    """DRAM -> ACT / WGT / PARAM scratchpad transfers.

    Parameters
    ----------
    cfg:
        The accelerator configuration.

    Members
    -------
    cmd: In(stream.Signature(DmaBody))
        LOAD bodies (already checked by fetch); ``ready`` whenever idle. Transfer cycle ``g``.
        The payload is copied in every idle cycle, so it must be stable in the transfer cycle
        (as :class:`hw.engine.EngineSequencer` keeps it).
    done: Out(1)
        Pulse in ``g + hw.timing.load_cycles(ins, cfg)``.
    beats: Out(32)
        Beats requested by the current instruction (its total when ``done`` pulses).
    rd_req, rd_resp:
        The DRAM read channel (see :class:`DramSignature`).
    act_wr, wgt_wr, param_wr: In(WritePort.Signature(...))
        Beat-wide write ports of the scratchpads (beat addresses).
    """

    #: Registers between a DRAM response and its scratchpad write.
    RESPONSE_REGISTERS = 1

    def __init__(self, cfg: AcceleratorConfig):
        _check_cfg(cfg)
        if timing.LOAD_OVERHEAD != self.RESPONSE_REGISTERS:
            raise ValueError(f"hw.timing.LOAD_OVERHEAD={timing.LOAD_OVERHEAD} does not match "
                             f"the LOAD engine's {self.RESPONSE_REGISTERS} response register")
        self._cfg = cfg
        super().__init__({
            "cmd": In(stream.Signature(DmaBody)),
            "done": Out(1),
            "beats": Out(_BEATS_BITS),
            "rd_req": Out(stream.Signature(DRAM_ADDR_BITS, always_ready=True)),
            "rd_resp": In(stream.Signature(8 * cfg.beat_bytes, always_ready=True)),
            "act_wr": _spad_beat_port(cfg, Spad.ACT, "write"),
            "wgt_wr": _spad_beat_port(cfg, Spad.WGT, "write"),
            "param_wr": _spad_beat_port(cfg, Spad.PARAM, "write"),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._cfg
        walk = _Walker()
        spad = Signal(Spad)
        wr_ptr = Signal(DmaBody["spad_addr"].width)
        # Requests not yet written to the scratchpad (at most latency + 2 in flight).
        pending = Signal(range(cfg.memory.latency + 4))
        resp_valid = Signal()
        resp_data = Signal(8 * cfg.beat_bytes)

        idle = ~walk.active & (pending == 0)
        m.d.comb += self.cmd.ready.eq(idle)
        with m.If(idle):
            walk.load(m, self.cmd.payload)
            m.d.sync += [spad.eq(self.cmd.payload.spad), wr_ptr.eq(self.cmd.payload.spad_addr),
                         self.beats.eq(0)]
            with m.If(self.cmd.valid):
                m.d.sync += walk.active.eq(1)

        issue = walk.active
        m.d.comb += [self.rd_req.valid.eq(issue), self.rd_req.payload.eq(walk.addr)]
        with m.If(issue):
            walk.step(m)
            m.d.sync += self.beats.eq(self.beats + 1)

        # Responses: register, then write the beat; responses nobody waits for are dropped.
        # `done` is registered with the last one (all requests are out by then: latency >= 1),
        # so the end of a LOAD reaches the event counters straight from a flip-flop.
        arrive = self.rd_resp.valid & (pending != 0)
        received = Signal(_BEATS_BITS)
        with m.If(idle):
            m.d.sync += received.eq(0)
        with m.Elif(arrive):
            m.d.sync += received.eq(received + 1)
        m.d.sync += [resp_valid.eq(arrive), resp_data.eq(self.rd_resp.payload),
                     self.done.eq(arrive & ~walk.active & (received + 1 == self.beats))]
        write = resp_valid
        for sp, port in ((Spad.ACT, self.act_wr), (Spad.WGT, self.wgt_wr),
                         (Spad.PARAM, self.param_wr)):
            m.d.comb += [port.addr.eq(wr_ptr), port.data.eq(resp_data),
                         port.en.eq(write & (spad == sp))]
        with m.If(write):
            m.d.sync += wr_ptr.eq(wr_ptr + 1)
        m.d.sync += pending.eq(pending + issue - write)
        return m


class StoreEngine(wiring.Component):
    """OUT scratchpad -> DRAM transfers.

    Parameters
    ----------
    cfg:
        The accelerator configuration.

    Members
    -------
    cmd: In(stream.Signature(DmaBody))
        STORE bodies; ``ready`` whenever idle. Transfer cycle ``g``.
    done: Out(1)
        Pulse in ``g + hw.timing.store_cycles(ins, cfg)``, with the last DRAM write.
    beats: Out(32)
        Beats read by the current instruction (its total when ``done`` pulses).
    out_rd: In(ReadPort.Signature(...))
        Beat-wide synchronous read port of the OUT scratchpad.
    wr:
        The DRAM write channel (see :class:`DramSignature`).
    """

    #: Cycles from a scratchpad read to the DRAM write of its beat.
    READ_LATENCY = 1

    def __init__(self, cfg: AcceleratorConfig):
        _check_cfg(cfg)
        if timing.STORE_OVERHEAD != self.READ_LATENCY:
            raise ValueError(f"hw.timing.STORE_OVERHEAD={timing.STORE_OVERHEAD} does not match "
                             f"the STORE engine's {self.READ_LATENCY}-cycle scratchpad read")
        self._cfg = cfg
        super().__init__({
            "cmd": In(stream.Signature(DmaBody)),
            "done": Out(1),
            "beats": Out(_BEATS_BITS),
            "out_rd": _spad_beat_port(cfg, Spad.OUT, "read"),
            "wr": Out(stream.Signature(dram_write_layout(cfg), always_ready=True)),
        })

    def elaborate(self, platform):
        m = Module()
        walk = _Walker()
        rd_ptr = Signal(DmaBody["spad_addr"].width)
        w_valid = Signal()
        w_last = Signal()
        w_addr = Signal(DRAM_ADDR_BITS)

        idle = ~walk.active & ~w_valid
        m.d.comb += self.cmd.ready.eq(idle)
        with m.If(idle):
            walk.load(m, self.cmd.payload)
            m.d.sync += [rd_ptr.eq(self.cmd.payload.spad_addr), self.beats.eq(0)]
            with m.If(self.cmd.valid):
                m.d.sync += walk.active.eq(1)

        issue = walk.active
        m.d.comb += [self.out_rd.addr.eq(rd_ptr), self.out_rd.en.eq(issue)]
        with m.If(issue):
            walk.step(m)
            m.d.sync += [rd_ptr.eq(rd_ptr + 1), self.beats.eq(self.beats + 1)]
        m.d.sync += [w_valid.eq(issue), w_last.eq(issue & walk.last), w_addr.eq(walk.addr)]
        m.d.comb += [
            self.wr.valid.eq(w_valid),
            self.wr.payload.addr.eq(w_addr),
            self.wr.payload.data.eq(self.out_rd.data),
            self.done.eq(w_valid & w_last),
        ]
        return m
