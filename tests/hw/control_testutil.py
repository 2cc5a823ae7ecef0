"""Shared helpers of the control / DMA / top-level tests: small configurations, program
generators and Amaranth-simulator utilities."""

from __future__ import annotations

import random

from amaranth.sim import Simulator

from hw.config import AcceleratorConfig, MemoryModel
from hw.engines import engines_of
from hw.isa import (
    End,
    Engine,
    EpilogueMode,
    Gemm,
    Load,
    Spad,
    Store,
    Sync,
    dispatch_error,
    word_beats,
)

__all__ = ["small_config", "wide_config", "run_sim", "random_program", "random_gemm",
           "random_dma"]


def small_config(**changes) -> AcceleratorConfig:
    """8 lanes (words narrower than a 16-byte beat), small scratchpads, 64 KiB of DRAM."""
    kw = dict(rows=2, cols=4, max_tokens=8, act_spad_bytes=2048, wgt_spad_bytes=2048,
              out_spad_bytes=1024, param_spad_bytes=256, queue_depth=2, num_events=8,
              event_bits=4, imem_depth=256,
              memory=MemoryModel(bytes_per_cycle=16, latency=6, size_bytes=1 << 16))
    kw.update(changes)
    return AcceleratorConfig(**kw)


def wide_config(**changes) -> AcceleratorConfig:
    """32 lanes (WGT / OUT / PARAM words of 2, 2 and 4 beats), otherwise like small_config."""
    return small_config(rows=2, cols=16, **changes)


def run_sim(dut, *testbenches, vcd: str | None = None, background=()) -> None:
    """Run async testbenches on ``dut`` with a 1 MHz clock."""
    sim = Simulator(dut)
    sim.add_clock(1e-6)
    for tb in testbenches:
        sim.add_testbench(tb)
    for tb in background:
        sim.add_testbench(tb, background=True)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


# ---------------------------------------------------------------------- random instructions
def random_dma(rng: random.Random, cfg: AcceleratorConfig, store: bool = False,
               max_rows: int = 3, max_row_beats: int = 4, **ev) -> Load:
    """A LOAD (or STORE) that passes :func:`hw.isa.dispatch_error`."""
    spad = Spad.OUT if store else rng.choice([Spad.ACT, Spad.WGT, Spad.PARAM])
    beats = cfg.spad_beats(spad.name.lower())
    rows = rng.randint(1, max_rows)
    row_beats = rng.randint(1, min(max_row_beats, beats // rows))
    spad_addr = rng.randint(0, beats - rows * row_beats)
    stride = rng.randint(0, 3 * row_beats)
    span = (rows - 1) * stride + row_beats
    dram_addr = rng.randint(0, cfg.dram_beats - span)
    cls = Store if store else Load
    ins = cls(spad=spad, dram_addr=dram_addr, spad_addr=spad_addr, rows=rows,
              row_beats=row_beats, dram_stride=stride, **ev)
    assert dispatch_error(ins, cfg).name == "NONE", ins
    return ins


def _aligned(rng, cfg, spad: str, word_bytes: int, limit: int | None = None) -> int:
    w = word_beats(word_bytes, cfg)
    top = cfg.spad_beats(spad) if limit is None else limit
    return rng.randrange(0, top // w) * w


def random_gemm(rng: random.Random, cfg: AcceleratorConfig, max_k: int = 6, **ev) -> Gemm:
    """A GEMM that passes :func:`hw.isa.dispatch_error` (streams may wrap; timing only)."""
    pattern = rng.randrange(len(cfg.pattern_table))
    int8 = pattern == 0 and 8 in cfg.weight_bits and rng.random() < 0.3
    k_steps = rng.randint(1, max_k)
    group_steps = rng.choice([0, rng.randint(1, k_steps)])
    asym = group_steps > 0 and rng.random() < 0.3
    epilogue = rng.choice(list(EpilogueMode))
    act_w = word_beats(cfg.act_word_bytes, cfg)
    ins = Gemm(wgt_addr=_aligned(rng, cfg, "wgt", cfg.wgt_word_bytes),
               act_addr=_aligned(rng, cfg, "act", cfg.act_word_bytes),
               act_stride=rng.randrange(0, 4) * act_w,
               out_addr=_aligned(rng, cfg, "out", cfg.out_word_bytes),
               param_addr=_aligned(rng, cfg, "param", cfg.param_word_bytes),
               k_steps=k_steps, group_steps=group_steps,
               tokens=rng.randint(1, cfg.max_tokens), pattern=pattern, int8=int8, asym=asym,
               accumulate=rng.random() < 0.5, epilogue=epilogue, shift=rng.randrange(32), **ev)
    assert dispatch_error(ins, cfg).name == "NONE", ins
    return ins


def random_program(rng: random.Random, cfg: AcceleratorConfig, n: int, *,
                   gemm: bool = True, p_wait: float = 0.4, p_signal: float = 0.5) -> list:
    """``n`` random instructions and END, free of deadlock and event overflow.

    Every event has one producer and one consumer engine; a wait is only placed on an event
    that an earlier instruction (in program order) signalled and no earlier wait consumed, so
    the oldest blocked instruction can always proceed.
    """
    n_ev = min(cfg.num_events, 6)
    engines = [e.engine for e in engines_of(cfg)]
    producer = {e: rng.choice(engines) for e in range(n_ev)}
    consumer = {e: rng.choice(engines) for e in range(n_ev)}
    credits = dict.fromkeys(range(n_ev), 0)
    limit = (1 << cfg.event_bits) - 1
    kinds = ["load", "store", "sync"] + (["gemm"] if gemm else [])
    prog = []
    for _ in range(n):
        kind = rng.choice(kinds)
        eng = {"load": Engine.LOAD, "store": Engine.STORE, "gemm": Engine.COMPUTE}.get(kind)
        if eng is None:
            eng = rng.choice(engines)
        waits = [e for e in range(n_ev) if consumer[e] == eng and credits[e] > 0]
        signals = [e for e in range(n_ev) if producer[e] == eng and credits[e] < limit // 2]
        wait = rng.choice(waits) if waits and rng.random() < p_wait else None
        signal = rng.choice(signals) if signals and rng.random() < p_signal else None
        if wait is not None:
            credits[wait] -= 1
        if signal is not None:
            credits[signal] += 1
        ev = {"wait": wait, "signal": signal}
        if kind == "load":
            prog.append(random_dma(rng, cfg, **ev))
        elif kind == "store":
            prog.append(random_dma(rng, cfg, store=True, **ev))
        elif kind == "gemm":
            prog.append(random_gemm(rng, cfg, **ev))
        else:
            prog.append(Sync(engine=eng, **ev))
    prog.append(End())
    return prog
