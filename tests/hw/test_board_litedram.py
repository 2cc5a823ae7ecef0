# amaranth: UnusedElaboratable=no
"""hw.board.litedram: LiteDRAM's generator configuration, its cache, and the Amaranth wrapper."""

from __future__ import annotations

import dataclasses

import pytest
from amaranth import ClockDomain, Module
from amaranth.lib.wiring import In
from amaranth_boards.ecpix5 import ECPIX585Platform

from hw.board import litedram
from hw.board.ecpix5 import ECPIX5
from hw.board.link import WishboneSignature
from hw.board.litedram import MODULE, USER_PORTS, LiteDRAMCore
from hw.board.native import NativePortSignature
from sim.board_memory import refresh_cycles


@pytest.fixture(scope="module")
def core(tmp_path_factory):
    """A core generated into a fresh cache (LiteDRAM's generator takes a few seconds)."""
    return litedram.generate(ECPIX5, tmp_path_factory.mktemp("litedram"))


def test_config_comes_from_the_board():
    cfg = litedram.core_config(ECPIX5)
    assert cfg["sdram_module"] == ECPIX5.sdram_module and cfg["sdram_phy"] == ECPIX5.sdram_phy
    assert cfg["device"] == ECPIX5.device
    assert (cfg["input_clk_freq"], cfg["sys_clk_freq"], cfg["init_clk_freq"]) == (
        ECPIX5.input_clk_hz, ECPIX5.sys_clk_hz, ECPIX5.init_clk_hz)
    assert cfg["cpu"] == "None" and cfg["memtype"] == "DDR3"
    assert cfg["sdram_trfc_ns"] == ECPIX5.sdram_trfc_ns
    assert cfg["user_ports"] == {name: {"type": "native", "data_width": ECPIX5.port_bits}
                                 for name in USER_PORTS}
    # MT41K256M16: 8 banks x 32768 rows x 1024 columns of 16 bits = the board's 512 MB.
    assert litedram.dram_data_bits(ECPIX5) == 16 and cfg["sdram_module_nb"] == 2


def test_inconsistent_board_facts_are_refused():
    with pytest.raises(ValueError, match="peak_bytes_per_sys_cycle=16"):
        litedram.dram_data_bits(dataclasses.replace(ECPIX5, peak_bytes_per_sys_cycle=16))
    with pytest.raises(ValueError, match="dram_bytes=1000"):
        litedram.dram_data_bits(dataclasses.replace(ECPIX5, dram_bytes=1000))
    with pytest.raises(ValueError, match="'NO_SUCH_CHIP'"):
        litedram.dram_data_bits(dataclasses.replace(ECPIX5, sdram_module="NO_SUCH_CHIP"))
    with pytest.raises(TypeError, match="Board"):
        litedram.core_config("ecpix5")


def test_generated_ports_are_the_wrapper_s(core):
    """The module's header, as generated, is what LiteDRAMCore connects: every user port of
    the board's width and word address, the control bus, the DDR3 pads (dq, dqs inout)."""
    assert core.ports == litedram.expected_ports(ECPIX5)
    assert core.ports["user_port_accel_cmd_addr"] == ("input", ECPIX5.port_addr_bits)
    assert core.ports["user_port_host_rdata_data"] == ("output", ECPIX5.port_bits)
    assert core.ports["ddram_dq"] == ("inout", 16)
    assert core.verilog.read_text().count("inout ") == 2


def test_csr_map_and_init_sequence(core):
    assert {"ddrctrl_init_done", "ddrctrl_init_error", "sdram_dfii_control",
            "sdram_dfii_pi0_command", "ddrphy_rdly_dq_inc",
            "ddrphy_burstdet_seen"} <= set(core.csr)
    assert core.csr_size["sdram_dfii_pi0_wrdata"] == 2   # 64 DFI bits in 32-bit words
    phy = core.init["phy"]
    assert (phy["phytype"], phy["nphases"], phy["delays"], phy["bitslips"]) == (
        "ECP5DDRPHY", 2, 8, 4)
    comments = [step[0] for step in core.init["sequence"]]
    assert comments[0] == "Release reset" and comments[-1] == "ZQ Calibration"


def test_the_core_refreshes_with_the_chip_s_trfc_as_a_time(core):
    """The generated controller waits the board's tRFC (a time), not LiteDRAM's table's clock
    count, which at this board's slower memory clock is about twice as long."""
    assert core.init["timing"]["tRFC"] == refresh_cycles(ECPIX5, ECPIX5.sdram_trfc_ns)[1]
    assert core.init["timing"]["tREFI"] == refresh_cycles(ECPIX5)[0]
    assert core.init["timing"]["tRFC"] < refresh_cycles(ECPIX5)[1]


def test_module_class_with_trfc_as_a_time():
    table = litedram.sdram_module_class(ECPIX5.sdram_module)
    timed = litedram.sdram_module_class(ECPIX5.sdram_module, 260.0)
    assert issubclass(timed, table) and timed.nrows == table.nrows
    assert {g: t.tRFC for g, t in timed.speedgrade_timings.items()} == dict.fromkeys(
        table.speedgrade_timings, (None, 260.0))
    assert timed.speedgrade_timings["default"] is timed.speedgrade_timings["1600"]
    for bad in (0, -1.0, True, "260"):
        with pytest.raises(ValueError, match=f"trfc_ns must be > 0, got {bad!r}"):
            litedram.sdram_module_class(ECPIX5.sdram_module, bad)
    with pytest.raises(ValueError, match="'NO_SUCH_CHIP'"):
        litedram.sdram_module_class("NO_SUCH_CHIP")


def test_cache_is_reused_and_whole(core, tmp_path_factory):
    cache = core.dir.parent
    stamp = core.verilog.stat().st_mtime_ns
    again = litedram.generate(ECPIX5, cache)
    assert again.dir == core.dir and again.verilog.stat().st_mtime_ns == stamp
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".lock")] == [core.dir.name]


def test_a_failed_generation_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(litedram, "_WORKER", "raise SystemExit(3)")
    with pytest.raises(RuntimeError, match="rc=3"):
        litedram.generate(ECPIX5, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [".lock"]


def test_wrapper_signature():
    dram = LiteDRAMCore(ECPIX5)
    port = NativePortSignature(ECPIX5.port_bits, ECPIX5.port_addr_bits)
    for name in USER_PORTS:
        assert dram.signature.members[name].flow == In
        assert dram.signature.members[name].signature.flip() == port
    assert dram.signature.members["wb_ctrl"].signature.flip() == WishboneSignature()
    assert {"init_done", "init_error", "pll_locked"} <= set(dram.signature.members)


def test_wrapper_elaborates_on_the_board(core):
    """On the ECPIX-5 platform: the generated Verilog is among the build's files, the DDR3
    pins are constrained (only the P side of the pseudo-differential pairs), and no default
    clock domain is made from the oscillator (the core's user_clk is the top's ``sync``)."""
    top = Module()
    top.domains.sync = ClockDomain()
    top.submodules.dram = LiteDRAMCore(ECPIX5, core)
    plan = ECPIX585Platform().prepare(top, name="top")
    assert plan.files[f"{MODULE}.v"] == core.verilog.read_text()
    lpf = plan.files["top.lpf"]
    assert 'LOCATE COMP "ddr3_0__dq__io[15]" SITE "W2"' in lpf
    assert 'LOCATE COMP "ddr3_0__clk__p" SITE "H3"' in lpf and "clk__n" not in lpf
    rtlil = plan.files["top.il"]
    assert f"cell \\{MODULE} " in rtlil
    assert "connect \\user_clk " in rtlil
    # The oscillator's pin goes to the core's clk input and nowhere else.
    assert [ln.split()[1] for ln in rtlil.splitlines()
            if "clk100_0__io" in ln and ln.strip().startswith("connect")] == [
        "\\clk100_0__io", "\\clk"]


def test_wrapper_needs_the_platform():
    from amaranth.back import rtlil
    with pytest.raises(TypeError, match="platform"):
        rtlil.convert(LiteDRAMCore(ECPIX5))
