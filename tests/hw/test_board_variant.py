# amaranth: UnusedElaboratable=no
"""The ECPIX-5 with ``sys`` at 50 MHz (hw.board.ecpix5.ECPIX5_SYS50): its LiteDRAM core (the
PLL's clocks, the controller's timings at that clock), the UART divisor, the accelerator's
configuration on it, and how the build and the prediction select it."""

from __future__ import annotations

import dataclasses
import re

import pytest
from amaranth_boards.ecpix5 import ECPIX585Platform

from bench import board as bench_board
from hw.board import build as board_build
from hw.board import litedram
from hw.board.ecpix5 import BOARDS, ECPIX5, ECPIX5_SYS50, board_named
from hw.board.uart import MAX_RATE_ERROR, uart_divisor
from hw.config import AcceleratorConfig, preset
from sim.board_memory import refresh_cycles

#: ECP5 PLL feedback path -> the divider of the output it feeds back from.
_FEEDBACK_DIV = {"INT_OP": "CLKOP_DIV", "INT_OS": "CLKOS_DIV", "INT_OS2": "CLKOS2_DIV",
                 "INT_OS3": "CLKOS3_DIV"}


@pytest.fixture(scope="module")
def core():
    """The variant's core, from the flow's cache (generated in seconds when absent)."""
    return litedram.generate(ECPIX5_SYS50)


def _pll(verilog: str) -> dict[str, str]:
    """The parameters of the core's one ``EHXPLLL``."""
    m = re.search(r"EHXPLLL\s*#\((.*?)\)\s*\w+\s*\(", verilog, re.DOTALL)
    assert m, "no EHXPLLL in the generated core"
    return dict(re.findall(r"\.(\w+)\s*\(\s*(?:\d+'d)?\"?([\w.]+)\"?\s*\)", m.group(1)))


def test_the_variant_differs_only_in_its_clock():
    assert ECPIX5_SYS50.sys_clk_hz == 50e6 and ECPIX5_SYS50.name != ECPIX5.name
    same = {f.name for f in dataclasses.fields(ECPIX5)} - {"name", "sys_clk_hz"}
    assert all(getattr(ECPIX5_SYS50, f) == getattr(ECPIX5, f) for f in same)
    assert ECPIX5_SYS50.peak_bytes_per_s == 8 * 50e6   # 4 beats of 16 bits a cycle
    assert BOARDS == {ECPIX5.name: ECPIX5, ECPIX5_SYS50.name: ECPIX5_SYS50}
    assert board_named(ECPIX5_SYS50.name) is ECPIX5_SYS50
    with pytest.raises(ValueError, match="unknown board 'x' \\(choose from ecpix5-85f, "):
        board_named("x")


def test_litedram_config_and_core_at_50_mhz(core):
    cfg = litedram.core_config(ECPIX5_SYS50)
    assert cfg == {**litedram.core_config(ECPIX5), "sys_clk_freq": 50e6}
    assert litedram.cache_key(ECPIX5_SYS50) != litedram.cache_key(ECPIX5)
    # The PLL: 100 MHz in, sys2x (CLKOP, the DDR edge clock) = 2 x sys, init (CLKOS) 25 MHz.
    pll = _pll(core.verilog.read_text())
    vco = (ECPIX5_SYS50.input_clk_hz / int(pll["CLKI_DIV"]) * int(pll["CLKFB_DIV"])
           * int(pll[_FEEDBACK_DIV[pll["FEEDBK_PATH"]]]))
    assert 400e6 <= vco <= 800e6                        # the ECP5 PLL's VCO range
    assert vco / int(pll["CLKOP_DIV"]) == 2 * ECPIX5_SYS50.sys_clk_hz
    assert vco / int(pll["CLKOS_DIV"]) == ECPIX5_SYS50.init_clk_hz
    # The controller counts the chip's times in cycles of the 50 MHz clock.
    timing = core.init["timing"]
    assert (timing["tREFI"], timing["tRFC"]) == (
        refresh_cycles(ECPIX5_SYS50)[0], refresh_cycles(ECPIX5_SYS50, 260.0)[1])
    assert timing["tRFC"] < refresh_cycles(ECPIX5)[1]    # fewer cycles than at 75 MHz


def test_uart_divisor_and_the_top_on_the_variant():
    """3 Mbaud from 50 MHz: 17 cycles a bit, 2.0% slow, inside the receiver's budget."""
    div = uart_divisor(ECPIX5_SYS50.sys_clk_hz, ECPIX5_SYS50.uart_baud)
    assert div == round(50e6 / 3e6)
    assert abs(50e6 / div / 3e6 - 1) <= MAX_RATE_ERROR
    from hw.board.top import Ecpix5Top
    top = Ecpix5Top(AcceleratorConfig(rows=2, cols=4), ECPIX5_SYS50)
    assert top.cfg.clock_mhz == 50.0
    m = top.elaborate(ECPIX585Platform())
    assert m.submodules.uart_rx.divisor == m.submodules.uart_tx.divisor == div
    assert m.submodules.dram.board is ECPIX5_SYS50
    for name in ("dram", "accel", "link", "uart_rx", "uart_tx", "rx_pin", "tx_pin"):
        getattr(m.submodules, name)._MustUse__used = True   # inspected, not built


def test_the_vector_configuration_on_the_variant():
    cfg = ECPIX5_SYS50.accelerator_config(preset("vector"), paced=True)
    on_75 = ECPIX5.accelerator_config(preset("vector"), paced=True)
    assert cfg.clock_mhz == 50.0 and cfg.memory == on_75.memory
    assert cfg.memory.cycles_per_beat == 2 and cfg.has_vector
    assert dataclasses.replace(cfg, clock_mhz=on_75.clock_mhz) == on_75
    assert cfg.fingerprint != on_75.fingerprint


def test_build_selects_the_board_and_pace(monkeypatch):
    got = []
    monkeypatch.setattr(board_build, "build", lambda cfg, name, **kw: got.append(
        (cfg, name, kw["board"])) or {"seeds_met": 2, "seeds": [{}, {}]})
    assert board_build.main(["--board", ECPIX5_SYS50.name, "--config", "vector",
                             "--paced"]) == 0
    paced = ECPIX5_SYS50.accelerator_config(preset("vector"), paced=True)
    assert got == [(paced, paced.fingerprint, ECPIX5_SYS50)]
    assert board_build.main([]) == 0
    assert got[1][2] is ECPIX5 and got[1][1] == \
        ECPIX5.accelerator_config(ECPIX5.base_config).fingerprint


@pytest.mark.parametrize("module", [board_build, bench_board])
def test_a_bad_board_is_one_line_and_exit_2(module, capsys):
    with pytest.raises(SystemExit) as e:
        module.main(["--board", "ecpix5-85f-sys60"])
    assert e.value.code == 2
    prefix = "hw.board.build" if module is board_build else "bench.board"
    assert capsys.readouterr().err == (
        f"{prefix}: --board: unknown board 'ecpix5-85f-sys60' (choose from "
        f"{', '.join(BOARDS)})\n")


def test_the_prediction_s_files_are_the_board_s():
    assert bench_board.record_names(ECPIX5) == (
        bench_board.RECORD_FILE, bench_board.MEMORY_FILE, bench_board.PAGE_FILE)
    names = bench_board.record_names(ECPIX5_SYS50)
    assert names == ("board_ecpix5-85f-sys50.json", "board_memory_ecpix5-85f-sys50.json",
                     "board_performance_ecpix5-85f-sys50.md")


@pytest.mark.parametrize("board, record", [(ECPIX5, False), (ECPIX5_SYS50, False),
                                           (ECPIX5_SYS50, True)])
def test_the_prediction_reads_and_writes_the_board_s_files(board, record, monkeypatch):
    """bench.board --board: the memory record beside the output, both under the board's names
    (--record: the committed folder), measured for that board."""
    class Stop(Exception):
        pass

    seen = []

    def memory_timings(path, b, remeasure, log=print):
        seen.append((path, b))
        raise Stop

    monkeypatch.setattr(bench_board, "memory_timings", memory_timings)
    with pytest.raises(Stop):
        bench_board.main(["--board", board.name, "--vector-config", "none"]
                         + ["--record"] * record)
    folder = bench_board.recorded(bench_board.RESULTS) if record else bench_board.RESULTS
    assert seen == [(folder / bench_board.record_names(board)[1], board)]
