"""Amaranth-simulator bench of :class:`hw.board.link.HostLink`: Python models of what surrounds it
on the board (LiteDRAM's native port with random ready and latency, LiteDRAM's control bus, the
accelerator's host ports), a byte pump on its streams and a transport that steps the simulation.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter, deque

from amaranth.sim import Simulator

from hw.board.ecpix5 import ECPIX5, Board
from hw.board.link import HostLink
from hw.config import AcceleratorConfig
from hw.counters import COUNTERS
from hw.isa import ErrorCode

__all__ = ["SMALL_BOARD", "NativePortModel", "WishboneModel", "AcceleratorModel", "BytePump",
           "LinkBench", "SimTransport"]

#: The ECPIX-5 with 64 KiB of DRAM (address checks reachable by small tests) and a 100 kHz clock:
#: the simulations' seconds (:class:`SimTransport`, the link's frame gap) in few cycles.
SMALL_BOARD = dataclasses.replace(ECPIX5, name="ecpix5-test", dram_bytes=1 << 16,
                                  sys_clk_hz=1e5)


class _Outputs:
    """Sets a model's outputs only when they change (a ``ctx.set`` per signal per cycle is most
    of the simulation's time)."""

    def __init__(self):
        self._last: dict[int, object] = {}

    def put(self, ctx, signal, value) -> None:
        if self._last.get(id(signal), _Outputs) != value:
            ctx.set(signal, value)
            self._last[id(signal)] = value


class NativePortModel:
    """A LiteDRAM native port: ``cmd`` and ``wdata`` ready at random, reads answered in order
    after a random latency. Counts the writes of every address."""

    def __init__(self, port, rng: random.Random, p_ready: float = 0.6,
                 latency: tuple[int, int] = (1, 12)):
        self.port, self.rng, self.p_ready, self.latency = port, rng, p_ready, latency
        self.mem: dict[int, int] = {}
        self.writes: Counter[int] = Counter()
        self.pending_writes: deque[int] = deque()
        self.reads: deque[tuple[int, int]] = deque()  # (due cycle, data)
        self.cycle = 0
        self.out = _Outputs()
        self.cmd_addr, self.cmd_we = port.cmd.payload.addr, port.cmd.payload.we
        self.wdata_data, self.wdata_we = port.wdata.payload.data, port.wdata.payload.we

    def step(self, ctx) -> None:
        port, rng, put = self.port, self.rng, self.out.put
        cmd_ready = rng.random() < self.p_ready
        wdata_ready = bool(self.pending_writes) and rng.random() < self.p_ready
        put(ctx, port.cmd.ready, cmd_ready)
        put(ctx, port.wdata.ready, wdata_ready)
        rvalid = bool(self.reads) and self.reads[0][0] <= self.cycle
        put(ctx, port.rdata.valid, rvalid)
        if rvalid:
            put(ctx, port.rdata.payload, self.reads[0][1])
        if cmd_ready and ctx.get(port.cmd.valid):
            addr = ctx.get(self.cmd_addr)
            if ctx.get(self.cmd_we):
                self.pending_writes.append(addr)
            else:
                due = self.cycle + rng.randint(*self.latency)
                if self.reads:
                    due = max(due, self.reads[-1][0] + 1)
                self.reads.append((due, self.mem.get(addr, 0)))
        if wdata_ready and ctx.get(port.wdata.valid):
            assert ctx.get(self.wdata_we) == (1 << len(self.wdata_we)) - 1
            addr = self.pending_writes.popleft()
            self.mem[addr] = ctx.get(self.wdata_data)
            self.writes[addr] += 1
        if rvalid:
            assert ctx.get(port.rdata.ready)
            self.reads.popleft()
        self.cycle += 1


class WishboneModel:
    """LiteDRAM's control bus: registers answered after 0-2 cycles; ``dead`` addresses never
    answer."""

    def __init__(self, bus, rng: random.Random, dead: frozenset[int] = frozenset()):
        self.bus, self.rng, self.dead = bus, rng, dead
        self.regs: dict[int, int] = {}
        self.accesses: list[tuple[str, int, int]] = []
        self.delay: int | None = None
        self.out = _Outputs()

    def step(self, ctx) -> None:
        bus = self.bus
        self.out.put(ctx, bus.ack, 0)
        if not (ctx.get(bus.cyc) and ctx.get(bus.stb)):
            return
        adr = ctx.get(bus.adr)
        if adr in self.dead:
            return
        if self.delay is None:
            self.delay = self.rng.randrange(3)
        if self.delay:
            self.delay -= 1
            return
        self.delay = None
        self.out.put(ctx, bus.ack, 1)
        if ctx.get(bus.we):
            assert ctx.get(bus.sel) == 0xF
            self.regs[adr] = ctx.get(bus.dat_w)
            self.accesses.append(("w", adr, self.regs[adr]))
        else:
            self.out.put(ctx, bus.dat_r, self.regs.get(adr, 0))
            self.accesses.append(("r", adr, self.regs.get(adr, 0)))


class AcceleratorModel:
    """The accelerator's host ports: a START makes it busy for ``run_cycles`` cycles, then done
    with the counters :meth:`expected_status` predicts; instruction writes recorded."""

    def __init__(self, link: HostLink, run_cycles: int = 30):
        self.link, self.run_cycles = link, run_cycles
        self.starts = 0
        self.imem: dict[int, int] = {}
        self.imem_writes: Counter[int] = Counter()
        self.left = 0
        self.stall_cycles = 0x0123_4567_89AB_CDEF
        self.ports = {name: link.counters[name] if name in COUNTERS else getattr(link, name)
                      for name in self.status()}
        self.shown: dict[str, int] = {}

    def status(self) -> dict[str, int]:
        """The values the ports show now (STATUS must report them)."""
        done = self.starts > 0 and self.left == 0
        values = {"busy": int(self.left > 0), "done": int(done),
                  "error": ErrorCode.DEADLOCK.value if done else 0,
                  "error_pc": 3 * self.starts, "cycles": self.run_cycles * self.starts,
                  "stall_cycles": self.stall_cycles}
        values |= {name: (i + 1) * 1000 + self.starts for i, name in enumerate(COUNTERS)}
        return values

    def step(self, ctx) -> None:
        link = self.link
        if ctx.get(link.start):
            assert not self.left, "START while busy"
            self.starts += 1
            self.left = self.run_cycles
        elif self.left:
            self.left -= 1
        status = self.status()
        if status != self.shown:
            for name, v in status.items():
                ctx.set(self.ports[name], ErrorCode(v) if name == "error" else v)
            self.shown = status
        if ctx.get(link.imem_wr.en):
            addr = ctx.get(link.imem_wr.addr)
            self.imem[addr] = ctx.get(link.imem_wr.data)
            self.imem_writes[addr] += 1


class BytePump:
    """Bytes from ``to_link`` into ``rx``; bytes of ``tx`` (taken at random) into
    ``from_link``."""

    def __init__(self, link: HostLink, rng: random.Random, p_ready: float = 0.8):
        self.link, self.rng, self.p_ready = link, rng, p_ready
        self.to_link: deque[int] = deque()
        self.from_link = bytearray()
        self.cycle = 0
        self.out = _Outputs()

    def step(self, ctx) -> None:
        rx, tx, put = self.link.rx, self.link.tx, self.out.put
        put(ctx, rx.valid, bool(self.to_link))
        if self.to_link:
            put(ctx, rx.payload, self.to_link[0])
            if ctx.get(rx.ready):
                self.to_link.popleft()
        ready = self.rng.random() < self.p_ready
        put(ctx, tx.ready, ready)
        if ready and ctx.get(tx.valid):
            self.from_link.append(ctx.get(tx.payload))
        self.cycle += 1


class LinkBench:
    """A :class:`HostLink` with its models, simulated one step at a time by the caller.

    Parameters
    ----------
    cfg:
        Accelerator configuration (made the board's by :meth:`Board.accelerator_config`).
    seed:
        Seed of every random choice of the models.
    board, dram_ready, dead_csr, run_cycles:
        The board; LiteDRAM's initialisation state; control-bus addresses that never answer;
        cycles of a run of the accelerator model.
    """

    def __init__(self, cfg: AcceleratorConfig, seed: int = 0, board: Board = SMALL_BOARD,
                 dram_ready: bool = True, dead_csr: frozenset[int] = frozenset(),
                 run_cycles: int = 30):
        rng = random.Random(seed)
        self.board = board
        self.cfg = board.accelerator_config(cfg)
        self.link = link = HostLink(self.cfg, board)
        self.native = NativePortModel(link.mem, rng)
        self.wishbone = WishboneModel(link.ctrl, rng, dead_csr)
        self.accel = AcceleratorModel(link, run_cycles)
        self.pump = BytePump(link, rng)
        self.dram_ready = dram_ready
        models = (self.native, self.wishbone, self.accel, self.pump)

        out = _Outputs()

        async def world(ctx):
            while True:
                out.put(ctx, link.dram_init_done, self.dram_ready)
                for model in models:
                    model.step(ctx)
                await ctx.tick()

        self.sim = Simulator(link)
        self.sim.add_clock(1e-6)
        self.sim.add_testbench(world, background=True)

    @property
    def cycle(self) -> int:
        return self.pump.cycle

    def run(self, cycles: int) -> None:
        """Simulate ``cycles`` more cycles."""
        end = self.cycle + cycles
        while self.cycle < end:
            self.sim.advance()

    def read(self, n: int, cycles: int) -> bytes:
        """Up to ``n`` bytes from the link, waiting at most ``cycles`` cycles."""
        end = self.cycle + cycles
        while len(self.pump.from_link) < n and self.cycle < end:
            self.sim.advance()
        out = bytes(self.pump.from_link[:n])
        del self.pump.from_link[:n]
        return out


class SimTransport:
    """A :class:`sim.board.Transport` into a :class:`LinkBench`: writes queue bytes for ``rx``,
    reads step the simulation until the bytes are there or the timeout passed, in simulated
    seconds of the board's clock (skipping the UART: a byte per cycle at most)."""

    name = "simulated HostLink"

    def __init__(self, bench: LinkBench):
        self.bench, self.clock_hz = bench, bench.board.sys_clk_hz

    def write(self, data: bytes) -> None:
        self.bench.pump.to_link.extend(data)

    def read(self, n: int, timeout: float) -> bytes:
        return self.bench.read(n, max(1, round(timeout * self.clock_hz)))
