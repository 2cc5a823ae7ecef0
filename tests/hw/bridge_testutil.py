"""A Python model of LiteDRAM's native user port for Amaranth-simulator testbenches.

:class:`NativePortModel` plays the memory behind a :class:`hw.board.native.NativePortSignature`
port, one call of :meth:`NativePortModel.step` per clock cycle. It is deliberately unkind, with
seeded randomness so that every run is reproducible:

* ``cmd.ready`` is random (``ready_p``), and low for ``refresh`` cycles every ``refresh_every``
  cycles or so (a refresh: nothing moves, not even the responses of accepted reads);
* accepted commands execute in order (LiteDRAM's guarantee for one port): a write when the
  model takes its data, ``1 .. max_wdata_delay`` cycles after the command (LiteDRAM takes write
  data when it needs it, valid or not: the model checks ``wdata.valid`` then); a read
  ``min_latency .. max_latency`` cycles after the command, sampling the memory then;
* at most ``max_pending`` commands are in flight;
* with ``upconverter`` (off by default: the ECPIX-5's ports have the controller's width),
  LiteDRAM's up-converter of a port of half the controller's
  word (``LiteDRAMNativePortUpConverter``): consecutive commands of one direction to one
  controller word form a group that executes only once it is closed (full, or the command
  lines, valid or not, show another word or direction), and a group must not hold one address
  twice (the converter would answer it once): the model fails the test if it does.
"""

from __future__ import annotations

import random
from collections import deque

import numpy as np

__all__ = ["NativePortModel"]


class NativePortModel:
    """The memory behind a native port (``port`` as seen by its user), over ``mem``.

    Parameters
    ----------
    port:
        The user's side of the port (an interface with ``cmd``, ``wdata``, ``rdata``).
    mem:
        ``uint8`` array, the memory (updated in place); words of ``port_bits // 8`` bytes.
    seed:
        Seed of every random choice.
    """

    def __init__(self, port, mem: np.ndarray, seed: int, *, ready_p: float = 0.7,
                 min_latency: int = 3, max_latency: int = 25, max_wdata_delay: int = 6,
                 refresh_every: int = 300, refresh: int = 40, max_pending: int = 16,
                 upconverter: bool = False):
        self.port = port
        self.mem = mem
        self.rng = random.Random(seed)
        self.word = port.signature.data_width // 8
        self.words = mem.size // self.word
        self.ready_p, self.min_latency, self.max_latency = ready_p, min_latency, max_latency
        self.max_wdata_delay = max_wdata_delay
        self.refresh_every, self.refresh = refresh, refresh
        self.max_pending = max_pending
        self.pending: deque = deque()   # [kind, addr, time it may execute (None: open)]
        self.upconverter = upconverter
        self.group: list | None = None  # the open group's commands (the converter's)
        self.now = 0
        self.refresh_at = self.rng.randint(1, refresh_every)
        self.reads = self.writes = 0

    def _word(self, addr: int) -> slice:
        a = (addr % self.words) * self.word
        return slice(a, a + self.word)

    def step(self, ctx) -> None:
        """Drive this cycle's outputs, then record the transfers of the coming clock edge.
        Call it once per cycle, before ``await ctx.tick()`` (inputs must be settled)."""
        p = self.port
        refreshing = self.refresh_at <= self.now < self.refresh_at + self.refresh
        if self.now == self.refresh_at + self.refresh:
            self.refresh_at = self.now + self.rng.randint(self.refresh_every // 2,
                                                          3 * self.refresh_every // 2)
        cmd_ready = (not refreshing and len(self.pending) < self.max_pending
                     and self.rng.random() < self.ready_p)
        take_wdata = read_out = False
        head = self.pending[0] if self.pending else None
        if head is not None and not refreshing and head[2] is not None and self.now >= head[2]:
            take_wdata, read_out = head[0] == "w", head[0] == "r"
        ctx.set(p.cmd.ready, cmd_ready)
        ctx.set(p.wdata.ready, take_wdata)
        ctx.set(p.rdata.valid, read_out)
        if read_out:
            ctx.set(p.rdata.payload, int.from_bytes(self.mem[self._word(head[1])].tobytes(),
                                                    "little"))
            assert ctx.get(p.rdata.ready), f"cycle {self.now}: rdata.ready low with data"
        if take_wdata:
            assert ctx.get(p.wdata.valid), \
                f"cycle {self.now}: LiteDRAM takes write data the bridge does not have"
            data = ctx.get(p.wdata.payload.data)
            self.mem[self._word(head[1])] = np.frombuffer(
                int(data).to_bytes(self.word, "little"), dtype=np.uint8)
            self.writes += 1
        if read_out:
            self.reads += 1
        if take_wdata or read_out:
            self.pending.popleft()
        we, addr = int(ctx.get(p.cmd.payload.we)), int(ctx.get(p.cmd.payload.addr))
        kind = "w" if we else "r"
        g = self.group
        if g and (g[0][0] != kind or g[0][1] // 2 != addr // 2):
            self._close()
        if cmd_ready and ctx.get(p.cmd.valid):
            op = [kind, addr, None]
            self.pending.append(op)
            if not self.upconverter:
                self.group = [op]
                self._close()
            elif self.group:
                assert addr not in [o[1] for o in self.group], \
                    f"cycle {self.now}: {kind} of word {addr} twice in one up-converter group"
                self.group.append(op)
                self._close()   # full: two port words
            else:
                self.group = [op]
        self.now += 1

    def _close(self) -> None:
        """The open group executes: its commands' times from now."""
        for op in self.group:
            op[2] = self.now + (self.rng.randint(1, self.max_wdata_delay) if op[0] == "w"
                                else self.rng.randint(self.min_latency, self.max_latency))
        self.group = None
