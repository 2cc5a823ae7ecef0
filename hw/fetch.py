"""Instruction fetch, hardware checks and dispatch into the engine queues.

The fetch unit owns the instruction memory (``cfg.imem_depth`` x 128 bits, written through
:attr:`FetchUnit.imem_wr` while the machine is idle) and runs a four-stage pipeline:

====  ========================================================================================
F     read ``imem[pc]`` (cycle 0 after start for ``pc = 0``)
S1    the instruction word, registered
S2    opcode / event / GEMM field checks; DMA extent products ``rows * row_beats`` and
      ``(rows - 1) * dram_stride`` (multipliers between registers)
S3    extent sums and comparisons -> the error code; this is the *dispatch* stage
====  ========================================================================================

so instruction 0 is available at dispatch in cycle ``FETCH_LATENCY = 4``. The stages advance
together and stall together, so while S3 holds instruction ``i`` the pipeline already holds
``i + 1`` checked: ``a_{i+1} = d_i + 1`` whatever the check latency (hw/timing.py, "Fetch").

S3 dispatches its instruction into the queue of its engine when the queue is not full
(registered), or ends fetching (END), or reports its error (:func:`hw.isa.dispatch_error`,
implemented here from the ISA layouts and the configuration; PC_OVERFLOW when the instruction's
``pc`` is ``imem_depth``; ILLEGAL_OPCODE for undefined opcodes and for a SYNC whose engine field
names no engine). The top level stops the machine on an error.
"""

from __future__ import annotations

from amaranth import Array, Const, Module, Mux, Signal, unsigned
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out
from amaranth.utils import ceil_log2

from hw import timing
from hw.config import AcceleratorConfig
from hw.isa import (
    INSTR_BITS,
    NO_EVENT,
    Engine,
    Epilogue,
    ErrorCode,
    InstrLayout,
    Opcode,
    Spad,
    word_beats,
)
from hw.queues import DMA_ENTRY, GEMM_ENTRY

__all__ = ["FetchUnit"]

#: Register stages between the instruction memory read and the dispatch stage.
_CHECK_STAGES = 3


class FetchUnit(wiring.Component):
    """Instruction memory, fetch pipeline, checks and dispatch.

    Parameters
    ----------
    cfg:
        The accelerator configuration.

    Members
    -------
    imem_wr: Out(WritePort.Signature(addr_width=ceil_log2(imem_depth), shape=128))
        Host write port of the instruction memory (instruction ``i`` at address ``i``).
    run: In(1)
        The machine is running; fetch starts from ``pc = 0`` after a reset.
    load, compute, store: Out(stream.Signature(DMA_ENTRY | GEMM_ENTRY))
        Dispatch into the engine queues; ``ready`` is the queue's registered "not full".
    error: Out(ErrorCode)
        The dispatch stage holds an instruction that fails its checks (while running).
    error_pc: Out(range(imem_depth + 1))
        Its index.
    ended: Out(1)
        END has been dispatched; fetching has stopped.
    stalled: Out(1)
        The dispatch stage holds a valid instruction whose queue is full (a fetch-stall cycle).
    dispatched: Out(1)
        An instruction (END included) is dispatched in this cycle.
    """

    def __init__(self, cfg: AcceleratorConfig):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        if timing.FETCH_LATENCY != 1 + _CHECK_STAGES:
            raise ValueError(f"hw.timing.FETCH_LATENCY={timing.FETCH_LATENCY} does not match the "
                             f"fetch pipeline (read + {_CHECK_STAGES} register stages)")
        self._cfg = cfg
        super().__init__({
            "imem_wr": Out(memory.WritePort.Signature(addr_width=ceil_log2(cfg.imem_depth),
                                                      shape=unsigned(INSTR_BITS))),
            "run": In(1),
            "load": Out(stream.Signature(DMA_ENTRY)),
            "compute": Out(stream.Signature(GEMM_ENTRY)),
            "store": Out(stream.Signature(DMA_ENTRY)),
            "error": Out(ErrorCode),
            "error_pc": Out(range(cfg.imem_depth + 1)),
            "ended": Out(1),
            "stalled": Out(1),
            "dispatched": Out(1),
        })

    @property
    def cfg(self) -> AcceleratorConfig:
        return self._cfg

    # ------------------------------------------------------------------ checks (S1 -> S2)
    def _field_checks(self, m: Module, ins) -> dict:
        """Combinational checks of one instruction view; returns named flags and products."""
        cfg = self._cfg
        op = ins.header.opcode
        is_ = {o: op == o for o in Opcode}
        engine_ok = Const(0)
        for e in Engine:
            engine_ok = engine_ok | (ins.body.sync.engine == e)
        legal = (is_[Opcode.LOAD] | is_[Opcode.STORE] | is_[Opcode.GEMM] | is_[Opcode.END]
                 | is_[Opcode.SYNC] & engine_ok)
        bad_event = Const(0)
        for ev in (ins.header.wait, ins.header.signal):
            bad_event = bad_event | ((ev != NO_EVENT) & (ev >= cfg.num_events))

        dma = ins.body.dma
        rows_m1 = Signal.like(dma.rows, name="rows_m1")
        m.d.comb += rows_m1.eq(dma.rows - 1)
        dma_bad = ((is_[Opcode.STORE] != (dma.spad == Spad.OUT))
                   | (dma.rows == 0) | (dma.row_beats == 0))

        g = ins.body.gemm
        int8_bad = g.int8 if 8 not in cfg.weight_bits else g.int8 & (g.pattern != 0)
        bad_gemm = ((g.pattern >= len(cfg.pattern_table)) | (g.tokens_m1 >= cfg.max_tokens)
                    | (g.k_steps == 0) | int8_bad | (g.asym & (g.group_steps == 0)))

        def misaligned(value, words):
            return value[:ceil_log2(words)] != 0 if words > 1 else Const(0)

        act_w = word_beats(cfg.act_word_bytes, cfg)
        bad_gemm_addr = ((g.wgt_addr >= cfg.spad_beats("wgt"))
                         | misaligned(g.wgt_addr, word_beats(cfg.wgt_word_bytes, cfg))
                         | (g.act_addr >= cfg.spad_beats("act"))
                         | (g.out_addr >= cfg.spad_beats("out"))
                         | (g.param_addr >= cfg.spad_beats("param"))
                         | misaligned(g.act_addr, act_w) | misaligned(g.act_stride, act_w)
                         | ((g.epilogue != Epilogue.NONE)
                            & misaligned(g.out_addr, word_beats(cfg.out_word_bytes, cfg)))
                         | (((g.epilogue == Epilogue.INT8) | (g.epilogue == Epilogue.INT8_RESIDUAL))
                            & misaligned(g.param_addr, word_beats(cfg.param_word_bytes, cfg))))
        gemm_err = Mux(bad_gemm, ErrorCode.BAD_GEMM,
                       Mux(bad_gemm_addr, ErrorCode.BAD_ADDRESS, ErrorCode.NONE))
        pre = Mux(~legal, ErrorCode.ILLEGAL_OPCODE,
                  Mux(bad_event, ErrorCode.BAD_EVENT,
                      Mux(is_[Opcode.GEMM], gemm_err,
                          Mux((is_[Opcode.LOAD] | is_[Opcode.STORE]) & dma_bad,
                              ErrorCode.BAD_ADDRESS, ErrorCode.NONE))))
        target = Mux(is_[Opcode.LOAD], Engine.LOAD,
                     Mux(is_[Opcode.STORE], Engine.STORE,
                         Mux(is_[Opcode.GEMM], Engine.COMPUTE, ins.body.sync.engine)))
        return {
            "pre": pre,
            "is_dma": is_[Opcode.LOAD] | is_[Opcode.STORE],
            "is_end": is_[Opcode.END],
            "is_sync": is_[Opcode.SYNC],
            "target": target,
            "spad_len": dma.rows * dma.row_beats,
            "dram_span": rows_m1 * dma.dram_stride,
            "dram_tail": dma.dram_addr + dma.row_beats,
        }

    def elaborate(self, platform):
        m = Module()
        cfg = self._cfg
        depth = cfg.imem_depth
        aw = ceil_log2(depth)
        m.submodules.imem = imem = memory.Memory(shape=unsigned(INSTR_BITS), depth=depth,
                                                 init=[])
        wp = imem.write_port()
        rp = imem.read_port()
        m.d.comb += [wp.addr.eq(self.imem_wr.addr), wp.data.eq(self.imem_wr.data),
                     wp.en.eq(self.imem_wr.en)]

        pc_shape = range(depth + 2 * _CHECK_STAGES + 2)
        pc = Signal(pc_shape)
        # F -> S1 -> S2 -> S3 stage registers.
        v0, pc0 = Signal(), Signal(pc_shape)
        v1, pc1, i1 = Signal(), Signal(pc_shape), Signal(InstrLayout)
        v2, pc2, i2 = Signal(), Signal(pc_shape), Signal(InstrLayout)
        v3, pc3, i3 = Signal(), Signal(pc_shape), Signal(InstrLayout)
        chk = self._field_checks(m, i1)
        pre2 = Signal(ErrorCode)
        is_dma2 = Signal()
        spad_len2 = Signal(len(chk["spad_len"]))
        dram_span2 = Signal(len(chk["dram_span"]))
        dram_tail2 = Signal(len(chk["dram_tail"]))
        err3 = Signal(ErrorCode)
        target3 = Signal(Engine)
        is_end3, is_sync3 = Signal(), Signal()
        is_end2, is_sync2, target2 = Signal(), Signal(), Signal(Engine)

        # ---- dispatch (S3)
        ended = self.ended
        live = self.run & ~ended & v3
        ok3 = err3 == ErrorCode.NONE
        ready = Array([self.load.ready, self.compute.ready, self.store.ready])[target3.as_value()]
        go = live & ok3 & (is_end3 | ready)
        for port, eng, body in ((self.load, Engine.LOAD, i3.body.dma),
                                (self.compute, Engine.COMPUTE, i3.body.gemm),
                                (self.store, Engine.STORE, i3.body.dma)):
            m.d.comb += [
                port.valid.eq(live & ok3 & ~is_end3 & (target3 == eng)),
                port.payload.wait.eq(i3.header.wait),
                port.payload.signal.eq(i3.header.signal),
                port.payload.sync.eq(is_sync3),
                port.payload.body.eq(body),
            ]
        m.d.comb += [
            self.error.eq(Mux(live, err3, ErrorCode.NONE)),
            self.error_pc.eq(pc3),
            self.stalled.eq(live & ok3 & ~is_end3 & ~ready),
            self.dispatched.eq(go),
        ]
        with m.If(go & is_end3):
            m.d.sync += ended.eq(1)

        # ---- the pipeline advances as a whole unless S3 holds an instruction that stays
        adv = self.run & ~ended & (~v3 | go)
        m.d.comb += [rp.addr.eq(pc[:aw]), rp.en.eq(adv)]
        with m.If(adv):
            m.d.sync += [
                pc.eq(pc + 1), v0.eq(1), pc0.eq(pc),
                v1.eq(v0), pc1.eq(pc0), i1.eq(rp.data),
                v2.eq(v1), pc2.eq(pc1), i2.eq(i1),
                pre2.eq(chk["pre"]), is_dma2.eq(chk["is_dma"]), is_end2.eq(chk["is_end"]),
                is_sync2.eq(chk["is_sync"]), target2.eq(chk["target"]),
                spad_len2.eq(chk["spad_len"]), dram_span2.eq(chk["dram_span"]),
                dram_tail2.eq(chk["dram_tail"]),
                v3.eq(v2), pc3.eq(pc2), i3.eq(i2), is_end3.eq(is_end2), is_sync3.eq(is_sync2),
                target3.eq(target2),
            ]
            # S2 -> S3: DMA extents against the scratchpad and DRAM sizes.
            dma = i2.body.dma
            spad_beats = Array([Const(cfg.spad_beats(sp.name.lower())) for sp in Spad])
            over = ((dma.spad_addr + spad_len2 > spad_beats[dma.spad.as_value()])
                    | (dram_tail2 + dram_span2 > cfg.dram_beats))
            m.d.sync += err3.eq(
                Mux(pc2 == depth, ErrorCode.PC_OVERFLOW,
                    Mux((pre2 == ErrorCode.NONE) & is_dma2 & over, ErrorCode.BAD_ADDRESS, pre2)))
        return m
