"""Simulation top: the accelerator, its DRAM model and one host port for everything.

Used by the Amaranth-simulator and cocotb tests (small ``memory.size_bytes``). The Verilator
runner (:mod:`sim.rtl`) instead builds :class:`hw.top.Accelerator` alone and models the DRAM in
its C++ harness with the same semantics (:mod:`hw.memory_model`), because a multi-megabyte
``Memory`` does not convert to Verilog in reasonable time.
"""

from __future__ import annotations

from collections.abc import Callable

from amaranth import ClockDomain, Module, Signal, unsigned
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out, connect, flipped
from amaranth.utils import ceil_log2

from hw.config import AcceleratorConfig
from hw.isa import RunRegs
from hw.memory_model import DramModel
from hw.top import HOST_STATUS, Accelerator, host_ports

__all__ = ["SimTop", "RunnerTop"]


class SimTop(wiring.Component):
    """:class:`hw.top.Accelerator` + :class:`hw.memory_model.DramModel`.

    Parameters
    ----------
    cfg:
        The accelerator configuration.
    compute:
        Passed to :class:`hw.top.Accelerator`.

    Members
    -------
    start, busy, done, error, error_pc, cycles, counters, imem_wr, regs:
        As :class:`hw.top.Accelerator` (:func:`hw.top.host_ports`, ``regs``).
    dram_rd: Out(ReadPort.Signature(...))
        Host read port of the DRAM model (beat address, data one cycle later).
    dram_wr: Out(WritePort.Signature(...))
        Host write port of the DRAM model (whole beats).
    """

    def __init__(self, cfg: AcceleratorConfig, compute: Callable | None = None):
        self._accel = Accelerator(cfg, compute=compute)
        self._dram = DramModel(cfg)
        aw = ceil_log2(cfg.dram_beats)
        beat = unsigned(8 * cfg.beat_bytes)
        super().__init__({
            **host_ports(cfg), "regs": In(RunRegs),
            "dram_rd": Out(memory.ReadPort.Signature(addr_width=aw, shape=beat)),
            "dram_wr": Out(memory.WritePort.Signature(addr_width=aw, shape=beat)),
        })

    @property
    def accelerator(self) -> Accelerator:
        return self._accel

    @property
    def dram(self) -> DramModel:
        return self._dram

    def elaborate(self, platform):
        m = Module()
        m.submodules.accel = accel = self._accel
        m.submodules.dram = dram = self._dram
        connect(m, accel.dram, dram.bus)
        connect(m, flipped(self.imem_wr), accel.imem_wr)
        connect(m, flipped(self.dram_rd), dram.host_rd)
        connect(m, flipped(self.dram_wr), dram.host_wr)
        m.d.comb += [accel.start.eq(self.start), accel.regs.eq(self.regs)]
        for name in HOST_STATUS:
            m.d.comb += getattr(self, name).eq(getattr(accel, name))
        return m


class RunnerTop(wiring.Component):
    """The top the Verilator runner builds: :class:`hw.top.Accelerator` in a reset-less clock
    domain, with ``start`` registered.

    Verilator re-evaluates, on every ``eval()``, all logic that depends combinationally on a
    top-level input. In the plain top that is every next-state function of the design (they all
    depend on ``rst``, and on ``start`` through the restart logic), which doubled the cost of a
    cycle. Here the only inputs with combinational fan-out are the DRAM response and the
    instruction-memory write port, both a few registers deep. Registers start from their
    initial values; ``start`` (which resets the machine) is seen one cycle after the host
    raises it.

    Members
    -------
    start, busy, done, error, error_pc, cycles, counters, imem_wr, regs, dram:
        As :class:`hw.top.Accelerator` (``start`` delayed by one register).
    """

    def __init__(self, cfg: AcceleratorConfig, compute: Callable | None = None):
        self._accel = Accelerator(cfg, compute=compute)
        self._domain = ClockDomain("sync", reset_less=True)
        super().__init__(self._accel.signature)

    @property
    def clk(self) -> Signal:
        """The clock, a port of the generated Verilog besides the signature's members."""
        return self._domain.clk

    def elaborate(self, platform):
        m = Module()
        m.domains.sync = self._domain
        m.submodules.accel = accel = self._accel
        start = Signal()
        m.d.sync += start.eq(self.start)
        m.d.comb += [accel.start.eq(start), accel.regs.eq(self.regs)]
        for name in HOST_STATUS:
            m.d.comb += getattr(self, name).eq(getattr(accel, name))
        connect(m, flipped(self.imem_wr), accel.imem_wr)
        connect(m, flipped(self.dram), accel.dram)
        return m
