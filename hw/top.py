"""The synthesizable accelerator: control, DMA, scratchpads and the compute core.

::

    host: imem_wr, start
      |
    FetchUnit (imem, checks) -+-> InstrQueue -> EngineSequencer -> LoadEngine  <- DRAM read
                              +-> InstrQueue -> EngineSequencer -> ComputeCore
                              +-> InstrQueue -> EngineSequencer -> StoreEngine -> DRAM write
                             (+-> InstrQueue -> EngineSequencer -> VectorEngine)
    EventUnit: wait / signal of the sequencers (the LOAD sequencer's signals delayed
               by the LoadEngine to the completion of its scratchpad writes)
    ACT, WGT, PARAM scratchpads: LoadEngine writes beats, ComputeCore reads words
    OUT scratchpad:              ComputeCore writes words, StoreEngine reads beats
    VIN scratchpad:              LoadEngine (and StoreEngine: a move) writes beats,
                                 VectorEngine reads elements (2 ports)
    VOUT scratchpad:             VectorEngine writes elements, StoreEngine reads beats

The vector engine and its scratchpads exist only in configurations that have it
(:attr:`hw.engines.EngineSpec.present`, :attr:`hw.config.AcceleratorConfig.has_vector`).

A queue and a sequencer per engine of :data:`hw.engines.ENGINES`, its fetch port, its event
ports and its counters are generated from that table; each engine's executor is entered in
``executors``, and an engine that completes late (:attr:`hw.engines.EngineSpec.completion`)
has its signals routed through its executor.

Host protocol: write the program into the instruction memory (``imem_wr``) while ``busy`` is
low, set the run-time registers ``regs`` (sampled with ``start``), pulse ``start`` for one
cycle (cycle ``-START_LATENCY`` of hw/timing.py), wait for ``busy`` to fall; then ``done``
is high and ``error``, ``error_pc``, ``cycles`` and ``counters`` hold the outcome until the
next ``start``. ``busy`` rises in the cycle after ``start`` and falls in cycle
``cycles + 1 + hw.timing.stop_delay(error)``: done, a deadlock and an event overflow are decided
a cycle late, so that the deep checks behind them end in one flip-flop each.

Reset: ``start`` resets the control state of every block (sequencers, counters, pointers, the
valid bit of every pipeline stage; not the memories), so a run after an error starts clean. The
datapath registers (operands, products, weight words and headers, results, registered copies of
instruction fields) are ``reset_less``: each is written before a reset valid bit lets it reach
any state or output, and a reset that reached all of them would be a net to nearly every
flip-flop, across the die (docs/synthesis.md). The reset is registered, one copy per block, so
the machine's cycle 0 is the second cycle after ``start``.

The counters of :func:`hw.counters.counters` take each cycle's increments one cycle later, and only
while the machine still runs, so the increments of the stop cycle itself are dropped (counters
cover cycles ``0 .. cycles - 1``); the beat and MAC counters add an instruction's total when it
ends.
"""

from __future__ import annotations

from collections.abc import Callable

from amaranth import Cat, Module, Mux, ResetInserter, Signal, unsigned
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out, connect
from amaranth.utils import ceil_log2

from hw.compute import ComputeCore
from hw.config import AcceleratorConfig
from hw.counters import COUNTER_BITS, counter_layout, counters
from hw.dma import DramSignature, LoadEngine, StoreEngine
from hw.engine import EngineSequencer
from hw.engines import engines_of
from hw.events import EventUnit
from hw.fanout import registered_control, replica
from hw.fetch import FetchUnit
from hw.isa import INSTR_BITS, Engine, ErrorCode, GemmBody, RunRegs
from hw.queues import InstrQueue, entry_layout
from hw.spad import Scratchpad
from hw.timing import START_LATENCY, STOP_DELAY
from hw.vector.engine import VectorEngine, command_lanes

__all__ = ["Accelerator", "host_ports", "HOST_STATUS"]


def _derive(cfg: AcceleratorConfig, engine: Engine):
    """What ``engine``'s sequencer computes from an entry's body at its pop (its ``derive``,
    :class:`hw.engine.EngineSequencer`), or None: a vector engine of several lanes takes
    :func:`hw.vector.engine.command_lanes` of its command from the sequencer's register."""
    if engine != Engine.VECTOR or cfg.vector_lanes < 2:
        return None
    return lambda body: Cat(*command_lanes(cfg, body.func.as_value(), body.imm))


#: The host-side outputs that report a run (:func:`host_ports`), in port order.
HOST_STATUS = ("busy", "done", "error", "error_pc", "cycles", "counters")


def host_ports(cfg: AcceleratorConfig) -> dict[str, wiring.Member]:
    """The host's ports of :class:`Accelerator` (and of every top around it), in port order.

    ``start`` (in), the :data:`HOST_STATUS` outputs and the instruction memory's write port
    ``imem_wr``; :class:`Accelerator` adds the DRAM port, :class:`hw.sim_top.SimTop` its DRAM
    model's host ports.

    Parameters
    ----------
    cfg:
        The accelerator configuration (instruction memory depth).

    Returns
    -------
    dict
        Member name -> :class:`amaranth.lib.wiring.Member`, as ``wiring.Component`` takes them.
    """
    return {
        "start": In(1),
        "busy": Out(1),
        "done": Out(1),
        "error": Out(ErrorCode),
        "error_pc": Out(range(cfg.imem_depth + 1)),
        "cycles": Out(COUNTER_BITS),
        "counters": Out(counter_layout(cfg)),
        "imem_wr": Out(memory.WritePort.Signature(addr_width=ceil_log2(cfg.imem_depth),
                                                  shape=unsigned(INSTR_BITS))),
    }


def _default_compute(cfg: AcceleratorConfig):
    return ComputeCore(cfg)


class Accelerator(wiring.Component):
    """The accelerator for one configuration, with a DRAM-side port.

    Parameters
    ----------
    cfg:
        The accelerator configuration.
    compute:
        Factory ``cfg -> component`` for the COMPUTE engine's datapath; the default is
        :class:`hw.compute.ComputeCore`. (Tests substitute a stand-in with the same interface.)

    Members
    -------
    start: In(1)
        One-cycle pulse that starts the program at instruction 0 (ignored while busy).
    busy: Out(1)
        The machine is running (see the host protocol above for when it falls).
    done: Out(1)
        A run has finished (successfully or not); cleared by ``start``.
    error: Out(ErrorCode)
        Outcome of the last run (``NONE`` on success). Like ``error_pc`` and ``cycles``, valid
        once ``done`` is high; while the machine runs it follows the run.
    error_pc: Out(range(imem_depth + 1))
        Index of the instruction that failed a dispatch check (0 for other errors).
    cycles: Out(COUNTER_BITS)
        Cycle in which the last run stopped (hw/timing.py).
    counters: Out(counter_layout(cfg))
        Performance counters of the last run (:func:`hw.counters.counters`).
    imem_wr: Out(WritePort.Signature(addr_width=ceil_log2(imem_depth), shape=128))
        Host write port of the instruction memory.
    regs: In(hw.isa.RunRegs)
        The run-time registers 1 .. :data:`hw.isa.NUM_REGS` (offsets a word adds to its
        ``dram_addr`` or ``imm``), sampled when ``start`` is accepted and held for the run
        (:func:`hw.isa.relative_fields`); unconnected, 0.
    dram: Out(DramSignature(cfg))
        The DRAM port.
    """

    #: Cycles from ``start`` to cycle 0: ``start`` accepted, then the blocks' registered reset.
    START_CYCLES = 2
    #: Cycles from done, a deadlock or an event overflow to the stop: the decision's register.
    STOP_CYCLES = 1

    def __init__(self, cfg: AcceleratorConfig,
                 compute: Callable[[AcceleratorConfig], wiring.Component] | None = None):
        if START_LATENCY != self.START_CYCLES:
            raise ValueError(f"hw.timing.START_LATENCY={START_LATENCY} is not this top's "
                             f"{self.START_CYCLES} cycles from start to cycle 0")
        if STOP_DELAY != self.STOP_CYCLES:
            raise ValueError(f"hw.timing.STOP_DELAY={STOP_DELAY} is not this top's "
                             f"{self.STOP_CYCLES} cycle from a decided stop to the stop")
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        if compute is not None and not callable(compute):
            raise TypeError(f"compute must be a factory cfg -> component, got {compute!r}")
        self._cfg = cfg
        self._compute = compute or _default_compute
        super().__init__({**host_ports(cfg), "regs": In(RunRegs),
                          "dram": Out(DramSignature(cfg))})

    @property
    def cfg(self) -> AcceleratorConfig:
        return self._cfg

    def elaborate(self, platform):
        m = Module()
        cfg = self._cfg
        running = Signal()
        go = Signal()      # start accepted: cycle -START_LATENCY
        launch = Signal()  # the blocks are being reset: cycle -1
        m.d.comb += go.eq(self.start & ~running & ~launch)
        m.d.sync += launch.eq(go)

        def launch_copy(name: str) -> Signal:
            """A copy of ``launch`` for one group of its users (the outcome, each counter): a
            flip-flop loaded from ``go`` like ``launch`` itself (reset alike), ``keep`` so that
            Yosys does not merge the copies back into a net to every counter bit."""
            c = Signal(name=f"launch_{name}", attrs={"keep": 1})
            m.d.sync += c.eq(go)
            return c

        # Every block below is reset by `start` (memories keep their contents), through its own
        # registered copy of `go` (hw.fanout): a reset that reaches every flip-flop of the
        # machine must start at a register near them, not at the logic that accepts `start`.
        core_m = Module()
        m.submodules.machine = core_m

        def block(name: str, component):
            core_m.submodules[name] = ResetInserter(replica(m, go, f"rst_{name}"))(component)
            return component

        fetch = block("fetch", FetchUnit(cfg))
        # A queue and a sequencer per engine of the table (hw/engines.py) that the
        # configuration has, and its executor.
        engines = engines_of(cfg)
        queues, seqs = {}, {}
        for e in engines:
            queues[e.engine] = block(f"{e.name}_queue",
                                     InstrQueue(entry_layout(e.body_layout), cfg.queue_depth,
                                                ready_copy=registered_control(cfg)))
            seqs[e.engine] = block(f"{e.name}_seq",
                                   EngineSequencer(e.body_layout, cfg.num_events,
                                                   derive=_derive(cfg, e.engine)))
        # The event unit's ports are the engines' values (the optional engines come last).
        if [e.engine.value for e in engines] != list(range(len(engines))):
            raise ValueError(f"the engines {[e.name for e in engines]} are not the first "
                             f"{len(engines)} values of hw.isa.Engine")
        events = block("events", EventUnit(cfg.num_events, cfg.event_bits, ports=len(engines),
                                           signal_copies=registered_control(cfg)))
        load = block("load", LoadEngine(cfg))
        store = block("store", StoreEngine(cfg))
        core = block("core", self._compute(cfg))
        executors = {Engine.LOAD: load, Engine.COMPUTE: core, Engine.STORE: store}
        # (scratchpad, direction of its core-side port, core-side read ports)
        spad_list = [("act", "read", 1), ("wgt", "read", 1), ("param", "read", 1),
                     ("out", "write", 1)]
        if cfg.has_vector:
            vector = executors[Engine.VECTOR] = block("vector", VectorEngine(cfg))
            spad_list += [("vin", "read", 2), ("vout", "write", 1)]
        odd = set(executors) ^ {e.engine for e in engines}
        if odd:
            raise ValueError(f"engines without an executor, or executors without an engine: "
                             f"{sorted(e.name for e in odd)}")
        spads = {}
        for name, core_dir, reads in spad_list:
            spads[name] = block(f"{name}_spad", Scratchpad(
                size_bytes=getattr(cfg, f"{name}_spad_bytes"),
                word_bytes=getattr(cfg, f"{name}_word_bytes"),
                beat_bytes=cfg.beat_bytes, core=core_dir, core_reads=reads,
                # the vector engine's ports move its lanes' elements a cycle
                core_lanes=cfg.vector_lanes if name in ("vin", "vout") else 1))

        # ---- wiring
        connect(m, wiring.flipped(self.imem_wr), fetch.imem_wr)
        m.d.comb += fetch.run.eq(running)
        # The run-time registers: the host's values when `start` is accepted, held for the run.
        regs = Signal(RunRegs, name="run_regs")
        with m.If(go):
            m.d.sync += regs.eq(self.regs)
        m.d.comb += fetch.regs.eq(regs)
        for e in engines:
            eng, seq, ex = e.engine, seqs[e.engine], executors[e.engine]
            connect(m, getattr(fetch, e.name), queues[eng].w)
            connect(m, queues[eng].r, seq.queue)
            connect(m, seq.wait, events.wait[eng.value])
            if e.completion is None:
                connect(m, seq.signal, events.signal[eng.value])
            else:
                # Its signals come with its last effect (hw/dma.py: LoadEngine.signal).
                connect(m, seq.signal, ex.signal_in)
                m.d.comb += ex.end_in.eq(seq.ending)
                connect(m, ex.signal, events.signal[eng.value])
            connect(m, seq.cmd, ex.cmd)
            if _derive(cfg, eng) is not None:
                m.d.comb += ex.cmd_lanes.eq(seq.derived)
            m.d.comb += seq.done.eq(ex.done)
        # Engines that complete late have instructions in flight after they end.
        in_flight = Cat(executors[e.engine].in_flight for e in engines
                        if e.completion is not None).any()
        for name in ("act", "wgt", "param"):
            connect(m, getattr(load, f"{name}_wr"), spads[name].dma_wr)
            connect(m, getattr(core, f"{name}_rd"), spads[name].core_rd)
        connect(m, core.out_wr, spads["out"].core_wr)
        connect(m, store.out_rd, spads["out"].dma_rd)
        if cfg.has_vector:
            # VIN's DMA write port: the LOAD engine's beats, or a move's (hw/dma.py); a
            # race-free program never has both in one cycle.
            vin_wr = spads["vin"].dma_wr
            m.d.comb += [vin_wr.en.eq(load.vin_wr.en | store.vin_wr.en),
                         vin_wr.addr.eq(Mux(load.vin_wr.en, load.vin_wr.addr,
                                            store.vin_wr.addr)),
                         vin_wr.data.eq(Mux(load.vin_wr.en, load.vin_wr.data,
                                            store.vin_wr.data))]
            connect(m, vector.vin_a, spads["vin"].core_rd)
            connect(m, vector.vin_b, spads["vin"].core_rd1)
            connect(m, vector.vout_wr, spads["vout"].core_wr)
            connect(m, store.vout_rd, spads["vout"].dma_rd)
        # ---- stop conditions (hw/timing.py: Done, Deadlock, errors, Stop)
        # Dispatch errors come from registered state and stop the machine in the cycle they
        # arise. Done and a deadlock (states the machine never leaves) are registered in `ended`
        # and an event overflow is decided a cycle later (EventUnit.overflow, so that it does
        # not wait for the grants): each stops the machine in the next cycle (`late`),
        # reporting the cycle before; counters and DRAM traffic are held back in that cycle, so
        # nothing observable happens in it. The deep checks end in `ended` and `dead`, not in
        # the enables of everything the stop reaches.
        # (A LOAD in flight still writes its data and raises its signal: neither done nor
        # deadlocked.)
        idle_empty = {eng: seqs[eng].idle & ~queues[eng].r.valid for eng in seqs}
        done_now = fetch.ended & Cat(idle_empty.values()).all() & ~in_flight
        blocked = (Cat(idle_empty[eng] | events.starved[eng.value] for eng in seqs).all()
                   & ~in_flight)
        deadlock_now = ~done_now & blocked & (fetch.ended | fetch.stalled)
        ended = Signal()   # done or deadlocked in the previous cycle
        dead = Signal()    # deadlocked in the previous cycle
        late = Signal()
        active = Signal()
        m.d.comb += [late.eq(events.overflow | ended), active.eq(running & ~late)]

        # DRAM: nothing leaves the machine once it has stopped.
        m.d.comb += [
            self.dram.rd_req.valid.eq(load.rd_req.valid & active),
            self.dram.rd_req.payload.eq(load.rd_req.payload),
            load.rd_resp.valid.eq(self.dram.rd_resp.valid),
            load.rd_resp.payload.eq(self.dram.rd_resp.payload),
            self.dram.wr.valid.eq(store.wr.valid & active),
            self.dram.wr.payload.eq(store.wr.payload),
        ]

        # The outcome registers follow the run and freeze when it stops, so that a stop drives
        # two enables, not the outcome's sixty: the error follows the fetch unit's (NONE until
        # a dispatch error stops the machine), and in the late cycle the outcome keeps the
        # previous cycle's `cycles` and takes the late error.
        cyc = Signal(COUNTER_BITS)
        stopping = Signal()   # the run's last cycle
        m.d.comb += stopping.eq(late | (fetch.error != ErrorCode.NONE))
        with m.If(launch_copy("outcome")):
            m.d.sync += [running.eq(1), cyc.eq(0), self.done.eq(0), ended.eq(0), dead.eq(0),
                         self.error.eq(ErrorCode.NONE), self.error_pc.eq(0)]
        with m.Elif(running):
            m.d.sync += [cyc.eq(cyc + 1), ended.eq(done_now | deadlock_now),
                         dead.eq(deadlock_now)]
            with m.If(stopping):
                m.d.sync += [running.eq(0), self.done.eq(1)]
            with m.If(events.overflow):
                m.d.sync += self.error.eq(ErrorCode.EVENT_OVERFLOW)
            with m.Elif(ended):
                m.d.sync += self.error.eq(Mux(dead, ErrorCode.DEADLOCK, ErrorCode.NONE))
            with m.Else():
                m.d.sync += [self.cycles.eq(cyc), self.error.eq(fetch.error),
                             self.error_pc.eq(Mux(fetch.error != ErrorCode.NONE,
                                                  fetch.error_pc, 0))]
        m.d.comb += self.busy.eq(running | launch)

        def running_copy(launch_c: Signal, name: str) -> Signal:
            """A copy of ``running`` for one group of its users (each counter): a flip-flop
            with ``running``'s next value, from ``launch_c`` (a copy of ``launch``), itself and
            ``stopping``, so it holds ``running`` in every cycle; ``keep`` so that Yosys does
            not merge the copies back into one net to every counter."""
            c = Signal(name=f"running_{name}", attrs={"keep": 1})
            with m.If(launch_c):
                m.d.sync += c.eq(1)
            with m.Elif(c & stopping):
                m.d.sync += c.eq(0)
            return c

        # ---- counters: this cycle's increments, added next cycle if the machine still runs.
        # MAC cycles of the GEMM in flight: at most k_steps * tokens.
        mac_acc = Signal(GemmBody["k_steps"].width + GemmBody["tokens_m1"].width + 1)
        m.d.sync += mac_acc.eq(Mux(core.done | launch_copy("mac"), 0, mac_acc + core.mac))
        incs = {
            "fetch_stall": fetch.stalled,
            "dram_read_beats": Mux(load.done, load.beats, 0),
            "dram_write_beats": Mux(store.done & ~store.move if cfg.has_vector else store.done,
                                    store.beats, 0),
            "mac_cycles": Mux(core.done, mac_acc + core.mac, 0),
            "instructions": fetch.dispatched,
        }
        if cfg.has_vector:
            incs["vector_elements"] = Mux(vector.done, vector.elements, 0)
        for e in engines:
            incs[e.exec_counter] = seqs[e.engine].executing
            incs[e.wait_counter] = seqs[e.engine].waiting
        assert set(incs) == set(counters(cfg)), set(counters(cfg)) ^ set(incs)
        for name, value in incs.items():
            pend = Signal(value.shape(), name=f"inc_{name}")
            counter = getattr(self.counters, name)
            # The counter adds `pend` while the machine runs and has not stopped (`active`),
            # formed per counter from its own copy of `running`: an enable of the counter's 48
            # flip-flops, a net within the counter, while the adder runs from registers (a
            # net from one `running` to every counter was a critical path). `pend` follows the
            # increments always; in a cycle the machine runs it holds the previous one's (or 0
            # after `launch`).
            launch_c = launch_copy(name)
            active_c = Signal(name=f"active_{name}")
            m.d.comb += active_c.eq(running_copy(launch_c, name) & ~late)
            with m.If(launch_c):
                m.d.sync += [pend.eq(0), counter.eq(0)]
            with m.Else():
                m.d.sync += pend.eq(value)
                with m.If(active_c):
                    m.d.sync += counter.eq(counter + pend)
        return m
