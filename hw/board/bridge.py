"""The DRAM bridge: the accelerator's fixed-latency DRAM port on a LiteDRAM native port.

The accelerator (:mod:`hw.top`) expects the memory of :mod:`hw.memory_model`: a read request in
cycle ``r`` gets its data in cycle ``r + latency`` exactly, writes are posted, one of each per
cycle, no back-pressure. LiteDRAM's native port (:class:`hw.board.native.NativePortSignature`)
accepts one command per cycle when it can, takes write data when it wants it and returns read
data in order after a variable delay (bank conflicts, refresh). :class:`DramBridge` reconciles
the two by running the accelerator under a clock enable (``EnableInserter({"sync": enable})``):
cycles with ``enable`` low do not exist for the accelerator, so in its own (enabled) cycles the
contract holds exactly and its cycle count and counters are the fast model's; the cycles lost to
memory are counted apart (``stall_cycles``).

How (all in the one ``sync`` domain):

* every enabled cycle with a read request or a write pushes one entry ``{read?, read address,
  write?, write address, write data}`` into a command queue;
* the issuer sends the head entry's read, then its write, as native commands (the read of a
  cycle samples the memory before that cycle's write, as :mod:`hw.memory_model` says); a write's
  data goes into a write-data FIFO the moment its command is accepted, and the ``wdata`` stream
  drains it (LiteDRAM takes the data after the command, as ``LiteDRAMDMAWriter`` feeds it);
* a read is issued only when the response FIFO has a free slot for its data (``rdata.ready`` is
  always high: LiteDRAM's crossbar does not wait for it);
* a shift register of ``latency`` bits, shifted in enabled cycles only, marks the enabled cycle
  in which each response is due; the response FIFO's head is presented then;
* ``enable`` is a register: the next cycle is enabled only if the command queue can take that
  cycle's entry and, when a response is due in it, the response is in the FIFO. It depends on
  the accelerator's outputs (all registers) and on the native port, never on logic the
  accelerator computes from ``enable``, and its fan-out starts at a flip-flop.

Ordering: the native port executes one port's commands in order (LiteDRAM: each bank machine's
command buffer is a FIFO, the crossbar's lock keeps a port on one bank until its transaction
ends, and its up-converter holds a read that follows a write to the same word,
``read_lock`` in ``litedram/frontend/adapter.py``), and the bridge issues commands in the
accelerator's order, so a read sees exactly the writes of earlier enabled cycles, as in the
model. Writes are posted: a LOAD that depends on a STORE is ordered after the STORE's ``done``
by the program's events, and the STORE's writes are in the queue ahead of the LOAD's reads.

The ECPIX-5's native ports have the controller's width (:data:`hw.board.ecpix5.ECPIX5`), so no
converter sits between the bridge and the crossbar. With ``upconverter=True`` the bridge also
serves a port of half the controller's width: LiteDRAM's up-converter
(``LiteDRAMNativePortUpConverter``) gathers consecutive commands of one direction to one
controller word into one controller command, and keeps that command open until the port's
command lines show another word or the other direction, whether or not ``cmd.valid`` is high
(``next_cmd``); the generated core exposes neither ``cmd.last`` nor ``flush``. Two rules follow
(off without ``upconverter``):

* while it has nothing to send, the bridge drives ``cmd.we`` low and ``cmd.addr`` to the
  complement of the last address it sent, so that the last write of a STORE reaches the memory
  and the last read of a LOAD returns;
* a command to the same address and in the same direction as the one before it (a DMA with a
  zero stride) would join that command's group, which serves each address once: one response
  for two reads, and a write's data left behind to corrupt the next write. So a repeated read
  waits until the data of the reads before it is back (the converter has then closed their
  group), and a repeated write waits one cycle with the lines showing another word (the
  converter sees it while it gathers: it gathers from the cycle after it accepted the write).
  With two port words per controller word, a group is full after two different addresses, so
  only a command right after its twin can join it.

Examples
--------
On the ECPIX-5, the bridge drives a 128-bit native port over the board's 512 MB, and takes
the accelerator's 16-byte beats:

>>> from hw.board.ecpix5 import ECPIX5
>>> from hw.config import AcceleratorConfig
>>> NativePortSignature(ECPIX5.port_bits, ECPIX5.port_addr_bits)
NativePortSignature(data_width=128, addr_width=25)
>>> ECPIX5.accelerator_config(AcceleratorConfig()).beat_bytes * 8 == ECPIX5.port_bits
True
"""

from __future__ import annotations

from collections.abc import Callable

from amaranth import Cat, Const, EnableInserter, Module, Mux, Signal
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out, connect, flipped

from hw.board.ecpix5 import Board
from hw.board.native import NativePortSignature
from hw.config import AcceleratorConfig
from hw.counters import COUNTER_BITS
from hw.dma import DramSignature
from hw.top import HOST_STATUS, Accelerator, host_ports

__all__ = ["DramBridge", "BridgedAccelerator"]


def _entry_layout(addr_bits: int, data_bits: int) -> data.StructLayout:
    """One command-queue entry: what the accelerator asked for in one enabled cycle."""
    return data.StructLayout({"rd": 1, "rd_addr": addr_bits, "wr": 1, "wr_addr": addr_bits,
                              "wr_data": data_bits})


class DramBridge(wiring.Component):
    """The memory of the accelerator's DRAM port, on a LiteDRAM native port.

    Parameters
    ----------
    cfg:
        The accelerator configuration (``cfg.beat_bytes``, ``cfg.memory.latency``:
        the contract's read latency in enabled cycles).
    board:
        The board (``board.port_bits`` must be ``8 * cfg.beat_bytes``; ``board.dram_bytes`` at
        least ``cfg.memory.size_bytes``; addresses are taken modulo ``board.dram_bytes``).
    cmd_depth:
        Entries of the command queue (at least 2). The next cycle is enabled only if the queue
        will have room for its entry, counting the current cycle's entry but not the current
        cycle's issue (which would put LiteDRAM's ``cmd.ready`` on the path to ``enable``).
    wdata_depth:
        Write-data FIFO entries: write commands accepted whose data LiteDRAM has not taken.
    upconverter:
        The native port is half the controller's width, behind LiteDRAM's up-converter: keep
        its two rules (module docstring). Default off: the ECPIX-5's ports have the
        controller's width.
    resp_depth:
        Response FIFO entries, the most reads in flight; at least (and by default)
        ``cfg.memory.latency``: the accelerator has at most that many reads it has not consumed,
        so a read is never withheld for want of room. (With fewer, the queue could fill with
        reads that wait for room while the read whose consumption would make room waits for an
        enabled cycle: a deadlock.)

    Members
    -------
    bus: In(DramSignature(cfg))
        The accelerator's DRAM port (the bridge is the memory).
    port: Out(NativePortSignature(board.port_bits, board.port_addr_bits))
        The LiteDRAM native user port.
    enable: Out(1)
        The accelerator's clock enable (a register, high after reset).
    clear: In(1)
        Zeroes ``stall_cycles`` at the end of the cycle (the board top drives it with the
        ``start`` it hands the accelerator).
    stall_cycles: Out(COUNTER_BITS)
        Cycles with ``enable`` low after the last cycle with ``clear`` high (or reset).
    idle: Out(1)
        Nothing in the bridge: no queued command, no write data LiteDRAM has not taken, no read
        in flight. The accelerator's writes have all been handed to LiteDRAM (after ``done``,
        the host waits for this before reading the memory through another port).
    """

    def __init__(self, cfg: AcceleratorConfig, board: Board, *, cmd_depth: int = 4,
                 wdata_depth: int = 16, resp_depth: int | None = None,
                 upconverter: bool = False):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        if not isinstance(board, Board):
            raise TypeError(f"board must be a hw.board.ecpix5.Board, got {board!r}")
        if 8 * cfg.beat_bytes != board.port_bits:
            raise ValueError(f"cfg.beat_bytes={cfg.beat_bytes} is not the native port's "
                             f"board.port_bits={board.port_bits} / 8")
        if cfg.memory.size_bytes > board.dram_bytes:
            raise ValueError(f"cfg.memory.size_bytes={cfg.memory.size_bytes} exceeds "
                             f"board.dram_bytes={board.dram_bytes}")
        resp_depth = cfg.memory.latency if resp_depth is None else resp_depth
        for name, v, low in (("cmd_depth", cmd_depth, 2), ("wdata_depth", wdata_depth, 1),
                             ("resp_depth", resp_depth, cfg.memory.latency)):
            if not isinstance(v, int) or isinstance(v, bool) or v < low:
                raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
        self._cfg = cfg
        self._board = board
        self.cmd_depth = cmd_depth
        self.wdata_depth = wdata_depth
        self.resp_depth = resp_depth
        self.upconverter = bool(upconverter)
        super().__init__({
            "bus": In(DramSignature(cfg)),
            "port": Out(NativePortSignature(board.port_bits, board.port_addr_bits)),
            "enable": Out(1, init=1),
            "clear": In(1),
            "stall_cycles": Out(COUNTER_BITS),
            "idle": Out(1),
        })

    @property
    def latency(self) -> int:
        """The contract's read latency, in enabled cycles."""
        return self._cfg.memory.latency

    def elaborate(self, platform):
        m = Module()
        lat = self.latency
        aw = self._board.port_addr_bits
        dw = self._board.port_bits
        bus, port = self.bus, self.port
        enable = self.enable

        # ---- command queue: one entry per enabled cycle with a request
        layout = _entry_layout(aw, dw)
        m.submodules.cmdq = cmdq = fifo.SyncFIFO(width=layout.size, depth=self.cmd_depth)
        entry = Signal(layout)
        m.d.comb += [
            entry.rd.eq(bus.rd_req.valid), entry.rd_addr.eq(bus.rd_req.payload[:aw]),
            entry.wr.eq(bus.wr.valid), entry.wr_addr.eq(bus.wr.payload.addr[:aw]),
            entry.wr_data.eq(bus.wr.payload.data),
            cmdq.w_data.eq(entry),
            cmdq.w_en.eq(enable & (bus.rd_req.valid | bus.wr.valid)),
        ]

        # ---- issuer: the head's read, then its write
        m.submodules.wdataq = wdataq = fifo.SyncFIFO(width=dw, depth=self.wdata_depth)
        m.submodules.respq = respq = fifo.SyncFIFO(width=dw, depth=self.resp_depth)
        head = layout(cmdq.r_data)
        rd_sent = Signal()                          # the head's read is out, its write is not
        in_flight = Signal(range(self.resp_depth + 1))  # reads sent, data not yet popped
        last_addr = Signal(aw)                      # of the last accepted command
        last_we = Signal()
        rd_waiting = Signal(range(self.resp_depth + 1))  # reads sent, data not yet back
        flushed = Signal()                          # a cycle without a command since then
        # A repeat of the last command (see the module docstring): a read waits for the data of
        # the reads before it, a write for one cycle without a command.
        repeat_rd = ~last_we & (head.rd_addr == last_addr) & (rd_waiting != 0)
        repeat_wr = last_we & (head.wr_addr == last_addr) & ~flushed
        if not self.upconverter:
            repeat_rd = repeat_wr = Const(0)
        want_rd = (cmdq.r_rdy & head.rd & ~rd_sent & (in_flight != self.resp_depth)
                   & ~repeat_rd)
        want_wr = cmdq.r_rdy & head.wr & (~head.rd | rd_sent) & wdataq.w_rdy & ~repeat_wr
        accepted = port.cmd.valid & port.cmd.ready
        with m.If(accepted):
            m.d.sync += [last_we.eq(port.cmd.payload.we), flushed.eq(0)]
        with m.Elif(~port.cmd.valid):
            m.d.sync += flushed.eq(1)
        m.d.sync += rd_waiting.eq(rd_waiting + (accepted & want_rd) - port.rdata.valid)
        m.d.comb += port.cmd.valid.eq(want_rd | want_wr)
        with m.If(want_rd):
            m.d.comb += [port.cmd.payload.we.eq(0), port.cmd.payload.addr.eq(head.rd_addr)]
        with m.Elif(want_wr):
            m.d.comb += [port.cmd.payload.we.eq(1), port.cmd.payload.addr.eq(head.wr_addr)]
        with m.Elif(self.upconverter):  # close the up-converter's group (module docstring)
            m.d.comb += [port.cmd.payload.we.eq(0), port.cmd.payload.addr.eq(~last_addr)]
        with m.If(accepted):
            m.d.sync += last_addr.eq(port.cmd.payload.addr)
            with m.If(want_rd & head.wr):
                m.d.sync += rd_sent.eq(1)
            with m.Else():
                m.d.sync += rd_sent.eq(0)
                m.d.comb += cmdq.r_en.eq(1)
        m.d.comb += [
            wdataq.w_en.eq(accepted & ~want_rd),
            wdataq.w_data.eq(head.wr_data),
            port.wdata.valid.eq(wdataq.r_rdy),
            port.wdata.payload.data.eq(wdataq.r_data),
            port.wdata.payload.we.eq(Const(-1, dw // 8)),
            wdataq.r_en.eq(port.wdata.ready),
        ]

        # ---- responses: FIFO, due in the enabled cycle `latency` after the request
        due = Signal(lat)                 # due[k]: a read was requested k + 1 enabled cycles ago
        with m.If(enable):
            m.d.sync += due.eq(Cat(bus.rd_req.valid, due[:-1]))
        pop = enable & due[-1]
        sent_rd = accepted & want_rd
        m.d.comb += [
            port.rdata.ready.eq(1),
            respq.w_en.eq(port.rdata.valid),
            respq.w_data.eq(port.rdata.payload),
            respq.r_en.eq(pop),
            bus.rd_resp.valid.eq(due[-1]),
            bus.rd_resp.payload.eq(respq.r_data),
        ]
        m.d.sync += in_flight.eq(in_flight + sent_rd - pop)

        # ---- the enable of the next cycle
        due_next = Mux(enable, bus.rd_req.valid if lat == 1 else due[-2], due[-1])
        resp_next = respq.level + port.rdata.valid - pop       # FIFO level in the next cycle
        cmd_next = cmdq.level + cmdq.w_en                     # ignoring this cycle's issue
        m.d.sync += enable.eq((cmd_next < self.cmd_depth) & (~due_next | (resp_next != 0)))

        with m.If(self.clear):
            m.d.sync += self.stall_cycles.eq(0)
        with m.Elif(~enable):
            m.d.sync += self.stall_cycles.eq(self.stall_cycles + 1)
        m.d.comb += self.idle.eq(~cmdq.r_rdy & ~wdataq.r_rdy & (in_flight == 0))
        return m


class BridgedAccelerator(wiring.Component):
    """:class:`hw.top.Accelerator` under the clock enable of a :class:`DramBridge`.

    What the board tops instantiate: the host link drives the host ports, the native port goes
    to LiteDRAM (or to the simulation's memory model).

    The host's ``start`` and ``imem_wr`` are registered and held until an enabled cycle
    delivers them (the accelerator ignores its inputs in cycles that do not exist for it), so a
    write or a start in a stalled cycle is not lost: one of each may wait at a time, and a new
    one replaces a waiting one (the host link issues them hundreds of cycles apart).

    Parameters
    ----------
    cfg, board:
        As :class:`DramBridge`.
    compute:
        Passed to :class:`hw.top.Accelerator`.

    Members
    -------
    start, error, error_pc, cycles, counters, imem_wr:
        As :class:`hw.top.Accelerator` (:func:`hw.top.host_ports`), ``start`` and ``imem_wr``
        one cycle later or more (see above). ``cycles`` and ``counters`` count enabled cycles:
        they equal :class:`sim.model.FastModel`'s.
    busy, done:
        The accelerator's, extended until the bridge is :attr:`DramBridge.idle`: when ``done``
        is high every write of the run has been handed to LiteDRAM.
    port: Out(NativePortSignature(board.port_bits, board.port_addr_bits))
        The bridge's native port.
    stall_cycles: Out(COUNTER_BITS)
        Cycles with the accelerator stalled since the last ``start`` delivered to it.
    """

    def __init__(self, cfg: AcceleratorConfig, board: Board,
                 compute: Callable | None = None, **bridge_args):
        self._bridge = DramBridge(cfg, board, **bridge_args)
        self._accel = Accelerator(cfg, compute=compute)
        super().__init__({
            **host_ports(cfg),
            "port": Out(NativePortSignature(board.port_bits, board.port_addr_bits)),
            "stall_cycles": Out(COUNTER_BITS),
        })

    @property
    def bridge(self) -> DramBridge:
        return self._bridge

    @property
    def accelerator(self) -> Accelerator:
        return self._accel

    def elaborate(self, platform):
        m = Module()
        m.submodules.bridge = bridge = self._bridge
        m.submodules.accel = EnableInserter({"sync": bridge.enable})(self._accel)
        connect(m, self._accel.dram, bridge.bus)
        connect(m, flipped(self.port), bridge.port)

        start = Signal()
        imem = Signal.like(self.imem_wr.en)
        imem_addr = Signal.like(self.imem_wr.addr)
        imem_data = Signal.like(self.imem_wr.data)
        with m.If(bridge.enable):
            m.d.sync += [start.eq(0), imem.eq(0)]
        with m.If(self.start):
            m.d.sync += start.eq(1)
        with m.If(self.imem_wr.en):
            m.d.sync += [imem.eq(1), imem_addr.eq(self.imem_wr.addr),
                         imem_data.eq(self.imem_wr.data)]
        m.d.comb += [
            self._accel.start.eq(start),
            bridge.clear.eq(start & bridge.enable),
            self._accel.imem_wr.en.eq(imem),
            self._accel.imem_wr.addr.eq(imem_addr),
            self._accel.imem_wr.data.eq(imem_data),
            self.stall_cycles.eq(bridge.stall_cycles),
        ]
        for name in HOST_STATUS:
            m.d.comb += getattr(self, name).eq(getattr(self._accel, name))
        m.d.comb += [self.busy.eq(self._accel.busy | ~bridge.idle),
                     self.done.eq(self._accel.done & bridge.idle)]
        return m
