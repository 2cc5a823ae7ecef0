"""The DRAM model used in simulation: fixed-latency reads, posted writes, and a host port.

Semantics (the Verilator harness, ``sim/verilator/harness.cpp``, implements the same in C++
because a multi-megabyte ``Memory`` does not convert to Verilog in reasonable time):

* a read request (``rd_req.valid``) in cycle ``r`` samples the memory at the end of ``r`` --
  before any write of cycle ``r`` lands -- and its data is presented on ``rd_resp`` in cycle
  ``r + latency``, exactly;
* a write (``wr.valid``) in cycle ``w`` updates the memory at the end of ``w``;
* one request and one write per cycle, ``beat_bytes`` each; addresses count beats and wrap
  modulo the memory size (the accelerator never issues one outside it: fetch checks extents).

The host port reads and writes whole beats (synchronous reads) while the accelerator is idle;
its writes take priority over the accelerator's in the same cycle.
"""

from __future__ import annotations

from amaranth import Module, Signal, unsigned
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw.config import AcceleratorConfig
from hw.dma import DramSignature

__all__ = ["DramModel"]


class DramModel(wiring.Component):
    """A ``cfg.memory.size_bytes`` DRAM with ``cfg.memory.latency``-cycle reads.

    Parameters
    ----------
    cfg:
        The accelerator configuration (``cfg.memory``).

    Members
    -------
    bus: In(DramSignature(cfg))
        The accelerator side.
    host_rd: Out(ReadPort.Signature(addr_width, beat))
        Host read port (beat address, data one cycle after the address).
    host_wr: Out(WritePort.Signature(addr_width, beat))
        Host write port (whole beats).
    """

    def __init__(self, cfg: AcceleratorConfig):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        self._cfg = cfg
        aw = ceil_log2(cfg.dram_beats)
        beat = unsigned(8 * cfg.beat_bytes)
        super().__init__({
            "bus": In(DramSignature(cfg)),
            "host_rd": Out(memory.ReadPort.Signature(addr_width=aw, shape=beat)),
            "host_wr": Out(memory.WritePort.Signature(addr_width=aw, shape=beat)),
        })

    @property
    def latency(self) -> int:
        return self._cfg.memory.latency

    def elaborate(self, platform):
        m = Module()
        cfg = self._cfg
        aw = ceil_log2(cfg.dram_beats)
        m.submodules.storage = mem = memory.Memory(
            shape=unsigned(8 * cfg.beat_bytes), depth=cfg.dram_beats, init=[])
        rd = mem.read_port()
        wr = mem.write_port()
        host_rd = mem.read_port()

        # Read channel: the memory's one-cycle read, then latency - 1 delay registers.
        m.d.comb += [rd.addr.eq(self.bus.rd_req.payload[:aw]), rd.en.eq(1)]
        valid, payload = Signal(), rd.data
        m.d.sync += valid.eq(self.bus.rd_req.valid)
        for i in range(self.latency - 1):
            v = Signal(name=f"resp_valid_{i}")
            d = Signal(8 * cfg.beat_bytes, name=f"resp_data_{i}")
            m.d.sync += [v.eq(valid), d.eq(payload)]
            valid, payload = v, d
        m.d.comb += [self.bus.rd_resp.valid.eq(valid), self.bus.rd_resp.payload.eq(payload)]

        # Write channel, shared with the host's writes.
        with m.If(self.host_wr.en):
            m.d.comb += [wr.addr.eq(self.host_wr.addr), wr.data.eq(self.host_wr.data),
                         wr.en.eq(1)]
        with m.Else():
            m.d.comb += [wr.addr.eq(self.bus.wr.payload.addr[:aw]),
                         wr.data.eq(self.bus.wr.payload.data), wr.en.eq(self.bus.wr.valid)]

        m.d.comb += [host_rd.addr.eq(self.host_rd.addr), host_rd.en.eq(self.host_rd.en),
                     self.host_rd.data.eq(host_rd.data)]
        return m
