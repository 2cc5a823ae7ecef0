"""DMA engines: LOAD (DRAM -> ACT/WGT/PARAM/VIN) and STORE (OUT/VOUT -> DRAM), and the DRAM
port (VIN and VOUT: configurations with a vector engine,
:attr:`hw.config.AcceleratorConfig.has_vector`).

Both move ``rows`` rows of ``row_beats`` beats; DRAM rows start ``dram_stride`` beats apart, the
scratchpad side is contiguous from ``spad_addr`` (:func:`sim.functional.exec_load`,
:func:`sim.functional.exec_store`). With the command transferred in cycle ``g`` (the grant):

LOAD
    one read request per cycle in ``g + 1 .. g + B`` (``B = rows * row_beats``); ``done`` is in
    the last request's cycle ``g + B``, and the engine takes the next command from the cycle
    after. On a paced port (``k = cfg.memory.cycles_per_beat > 1``) the requests go one every
    ``k`` cycles, in ``g + 1, g + 1 + k, .. , g + 1 + k (B - 1)`` (a phase counter, held at 0
    while idle; none at ``k = 1``), and ``done`` is in the last one's cycle. The response to a
    request of cycle ``r`` arrives in ``r + latency`` and is registered, then written to the
    scratchpad in ``r + latency + 1``: each request carries its scratchpad and address down a
    delay line of ``latency + LOAD_OVERHEAD`` stages (with ``LOAD_OVERHEAD = 1``), so the
    responses of one LOAD are written while the next one's
    requests go out. The LOAD engine's signal events ride the same line: a signal raised in
    cycle ``e`` (a LOAD's ``done``, or a SYNC on that engine) reaches the event unit in
    ``e + latency + LOAD_OVERHEAD`` (:func:`hw.engines.completion_delay`), with the LOAD's
    last scratchpad write.
STORE
    one scratchpad read per cycle in ``g + 1 .. g + B``; each beat is written to DRAM in the
    next cycle (posted writes): the last write, and ``done``, are in ``g + B + STORE_OVERHEAD``
    with ``STORE_OVERHEAD = 1``. On a paced port the reads, and so the writes, go one every
    ``k`` cycles, as a LOAD's requests. A move (:func:`hw.isa.is_move`) is a STORE of VOUT or
    OUT (:data:`hw.isa.MOVE_SOURCES`) whose beats go to VIN's DMA write port instead, at the
    addresses a STORE writes DRAM at, one a cycle whatever the pace (they are no DRAM
    traffic); the DRAM write channel stays idle.

The DRAM port (:class:`DramSignature`) has a read channel (requests, and responses exactly
``cfg.memory.latency`` cycles later, no back-pressure) and a posted write channel, one beat
each per cycle at most (one per ``k`` cycles of a transfer on a paced port); addresses count
beats.
"""

from __future__ import annotations

from amaranth import Cat, Module, Mux, Signal, unsigned
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw import timing
from hw.config import AcceleratorConfig
from hw.engines import completion_delay
from hw.isa import MOVE_SOURCES, DmaBody, Engine, Opcode, Spad, is_move

__all__ = ["DRAM_ADDR_BITS", "dram_write_layout", "DramSignature", "LoadEngine", "StoreEngine"]

#: DRAM beat address width, as in the ISA.
DRAM_ADDR_BITS = DmaBody["dram_addr"].width
#: The STORE ``spad`` values that read VOUT: its own, and a move's from VOUT.
_VOUT_SOURCES = (Spad.VOUT, *(k for k, v in MOVE_SOURCES.items() if v == Spad.VOUT))
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


def _paced(m: Module, active, k: int):
    """The cycles in which a transfer that is ``active`` issues a beat: every cycle at ``k =
    1`` (no logic), else the first active cycle and every ``k``-th after it (a phase counter,
    held at 0 while idle)."""
    if k == 1:
        return active
    phase = Signal(range(k))
    with m.If(~active | (phase == k - 1)):
        m.d.sync += phase.eq(0)
    with m.Else():
        m.d.sync += phase.eq(phase + 1)
    return active & (phase == 0)


class LoadEngine(wiring.Component):
    """DRAM -> ACT / WGT / PARAM scratchpad transfers.

    Parameters
    ----------
    cfg:
        The accelerator configuration.

    Members
    -------
    cmd: In(stream.Signature(DmaBody))
        LOAD bodies (already checked by fetch); ``ready`` whenever no request is left to
        issue (responses may still be in flight). Transfer cycle ``g``. The payload is copied
        in every such cycle, so it must be stable in the transfer cycle (as
        :class:`hw.engine.EngineSequencer` keeps it).
    done: Out(1)
        Pulse in ``g + hw.timing.load_cycles(ins, cfg)``, the last request's cycle (requests
        one every ``cfg.memory.cycles_per_beat`` cycles from ``g + 1``).
    beats: Out(32)
        Beats requested by the current instruction, this cycle's included (its total when
        ``done`` pulses).
    end_in: In(1)
        The LOAD engine sequencer's ``ending``: an instruction (LOAD or SYNC) ends in ``e``.
    signal_in: In(stream.Signature(cfg.num_events, always_ready=True))
        The LOAD engine sequencer's signal (one-hot event mask), raised in ``e``.
    signal: Out(stream.Signature(cfg.num_events, always_ready=True))
        ``signal_in`` delayed to ``e + hw.engines.completion_delay(Engine.LOAD, cfg)``: a LOAD's
        signal comes with its last scratchpad write.
    in_flight: Out(1)
        An instruction that ended has not completed yet (its responses, its signal or, for a
        SYNC, just its turn are on their way): in ``e + 1 .. e + completion_delay``.
    rd_req, rd_resp:
        The DRAM read channel (see :class:`DramSignature`).
    act_wr, wgt_wr, param_wr: In(WritePort.Signature(...))
        Beat-wide write ports of the scratchpads (beat addresses).
    vin_wr: In(WritePort.Signature(...))
        The same for VIN, with a vector engine.
    """

    #: Registers between a DRAM response and its scratchpad write.
    RESPONSE_REGISTERS = 1

    def __init__(self, cfg: AcceleratorConfig):
        _check_cfg(cfg)
        if timing.LOAD_OVERHEAD != self.RESPONSE_REGISTERS:
            raise ValueError(f"hw.timing.LOAD_OVERHEAD={timing.LOAD_OVERHEAD} does not match "
                             f"the LOAD engine's {self.RESPONSE_REGISTERS} response register")
        if completion_delay(Engine.LOAD, cfg) != cfg.memory.latency + \
                self.RESPONSE_REGISTERS:
            raise ValueError(f"hw.engines.completion_delay(LOAD)="
                             f"{completion_delay(Engine.LOAD, cfg)} is not the LOAD "
                             f"engine's {cfg.memory.latency} + {self.RESPONSE_REGISTERS} "
                             "cycles from the last request to its scratchpad write")
        self._cfg = cfg
        super().__init__({
            "cmd": In(stream.Signature(DmaBody)),
            "done": Out(1),
            "beats": Out(_BEATS_BITS),
            "end_in": In(1),
            "signal_in": In(stream.Signature(cfg.num_events, always_ready=True)),
            "signal": Out(stream.Signature(cfg.num_events, always_ready=True)),
            "in_flight": Out(1),
            "rd_req": Out(stream.Signature(DRAM_ADDR_BITS, always_ready=True)),
            "rd_resp": In(stream.Signature(8 * cfg.beat_bytes, always_ready=True)),
            "act_wr": _spad_beat_port(cfg, Spad.ACT, "write"),
            "wgt_wr": _spad_beat_port(cfg, Spad.WGT, "write"),
            "param_wr": _spad_beat_port(cfg, Spad.PARAM, "write"),
            **({"vin_wr": _spad_beat_port(cfg, Spad.VIN, "write")} if cfg.has_vector else {}),
        })

    def elaborate(self, platform):
        m = Module()
        cfg = self._cfg
        walk = _Walker()
        spad = Signal(Spad)
        wr_ptr = Signal(DmaBody["spad_addr"].width)
        count = Signal(_BEATS_BITS)

        idle = ~walk.active
        m.d.comb += self.cmd.ready.eq(idle)
        with m.If(idle):
            walk.load(m, self.cmd.payload)
            m.d.sync += [spad.eq(self.cmd.payload.spad), wr_ptr.eq(self.cmd.payload.spad_addr),
                         count.eq(0)]
            with m.If(self.cmd.valid):
                m.d.sync += walk.active.eq(1)

        issue = _paced(m, walk.active, cfg.memory.cycles_per_beat)
        m.d.comb += [self.rd_req.valid.eq(issue), self.rd_req.payload.eq(walk.addr),
                     self.beats.eq(count + issue), self.done.eq(issue & walk.last)]
        with m.If(issue):
            walk.step(m)
            m.d.sync += [count.eq(count + 1), wr_ptr.eq(wr_ptr + 1)]

        # The delay line, request (or end) cycle -> scratchpad write (or completion) cycle: the
        # valid bits are reset (a response to a request of before the reset is never written),
        # the scratchpad, address and event mask are datapath.
        stages = completion_delay(Engine.LOAD, cfg)
        beat_v = Signal(stages)
        end_v = Signal(stages)
        sig_v = Signal(stages)
        tags = [(Signal(Spad, name=f"tag_spad_{k}", reset_less=True),
                 Signal(DmaBody["spad_addr"].width, name=f"tag_addr_{k}", reset_less=True),
                 Signal(cfg.num_events, name=f"tag_sig_{k}", reset_less=True))
                for k in range(stages)]
        m.d.sync += [beat_v.eq(Cat(issue, beat_v[:-1])),
                     end_v.eq(Cat(self.end_in, end_v[:-1])),
                     sig_v.eq(Cat(self.signal_in.valid, sig_v[:-1]))]
        prev = (spad, wr_ptr, self.signal_in.payload)
        for tag in tags:
            m.d.sync += [t.eq(p) for t, p in zip(tag, prev, strict=True)]
            prev = tag
        out_spad, out_addr, out_sig = prev
        m.d.comb += [self.in_flight.eq((beat_v | end_v).any()),
                     self.signal.valid.eq(sig_v[-1]), self.signal.payload.eq(out_sig)]

        # Responses: registered, then written with their tag (rd_resp.valid is implied by the
        # fixed latency; a response nobody requested since the reset is dropped).
        resp_data = Signal(8 * cfg.beat_bytes, reset_less=True)
        m.d.sync += resp_data.eq(self.rd_resp.payload)
        ports = [(Spad.ACT, self.act_wr), (Spad.WGT, self.wgt_wr), (Spad.PARAM, self.param_wr)]
        if cfg.has_vector:
            ports.append((Spad.VIN, self.vin_wr))
        for sp, port in ports:
            m.d.comb += [port.addr.eq(out_addr), port.data.eq(resp_data),
                         port.en.eq(beat_v[-1] & (out_spad == sp))]
        return m


class StoreEngine(wiring.Component):
    """OUT (and VOUT) scratchpad -> DRAM transfers, and moves of either into VIN.

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
    vout_rd: In(ReadPort.Signature(...))
        The same for VOUT, with a vector engine.
    vin_wr: In(WritePort.Signature(...))
        Beat-wide write port of VIN, with a vector engine: a move's beats.
    move: Out(1)
        With a vector engine: the instruction is a move (valid from ``g + 1`` until the next
        command).
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
            **({"vout_rd": _spad_beat_port(cfg, Spad.VOUT, "read"),
                "vin_wr": _spad_beat_port(cfg, Spad.VIN, "write"), "move": Out(1)}
               if cfg.has_vector else {}),
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

        k = self._cfg.memory.cycles_per_beat
        if k == 1:
            issue = walk.active
        elif self._cfg.has_vector:
            # A move is not paced (on chip, no DRAM traffic): its beats go one a cycle.
            issue = _paced(m, walk.active, k) | (walk.active & self.move)
        else:
            issue = _paced(m, walk.active, k)
        data = self.out_rd.data
        if self._cfg.has_vector:
            # The source (OUT, or VOUT for a STORE of VOUT and a move from VOUT: fetch lets
            # nothing else through, hw.isa.MOVE_SOURCES) and whether the beats go to VIN (a
            # move from either), copied while idle. A move from OUT reads OUT as a STORE of OUT
            # does: OUT's read data reaches VIN's write data through the multiplexer a move
            # from VOUT uses, no new path.
            vout = Signal()
            spad = self.cmd.payload.spad.as_value()
            with m.If(idle):
                m.d.sync += [vout.eq(Cat(spad == s.value for s in _VOUT_SOURCES).any()),
                             self.move.eq(is_move(Opcode.STORE.value, spad))]
            m.d.comb += [self.out_rd.addr.eq(rd_ptr), self.out_rd.en.eq(issue & ~vout),
                         self.vout_rd.addr.eq(rd_ptr), self.vout_rd.en.eq(issue & vout)]
            data = Mux(vout, self.vout_rd.data, self.out_rd.data)
            m.d.comb += [self.vin_wr.addr.eq(w_addr), self.vin_wr.data.eq(data),
                         self.vin_wr.en.eq(w_valid & self.move)]
        else:
            m.d.comb += [self.out_rd.addr.eq(rd_ptr), self.out_rd.en.eq(issue)]
        with m.If(issue):
            walk.step(m)
            m.d.sync += [rd_ptr.eq(rd_ptr + 1), self.beats.eq(self.beats + 1)]
        m.d.sync += [w_valid.eq(issue), w_last.eq(issue & walk.last), w_addr.eq(walk.addr)]
        m.d.comb += [
            self.wr.valid.eq(w_valid & ~self.move if self._cfg.has_vector else w_valid),
            self.wr.payload.addr.eq(w_addr),
            self.wr.payload.data.eq(data),
            self.done.eq(w_valid & w_last),
        ]
        return m
