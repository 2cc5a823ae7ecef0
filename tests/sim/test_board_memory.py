"""The board's memory measured on LiteDRAM's controller (sim.board_memory), on short runs.

Migen's simulator runs about 25 cycles per second, so each run here is a few dozen cycles:
a sequential window that ends before the first refresh is due (tREFI), so the native port must
reach the PHY's peak exactly, and latencies of an idle controller.
"""

from __future__ import annotations

import dataclasses

import pytest

from hw.board.ecpix5 import ECPIX5
from sim.board_memory import (
    MemoryMeasureError,
    MemoryTiming,
    controller_bits,
    measure,
    phy_settings,
    refresh_cycles,
    sdram_module,
    speedgrade_trfc_ns,
)

#: A sequential window that ends long before the first refresh (tREFI is hundreds of cycles).
WINDOW = 48


@pytest.fixture(scope="module")
def native() -> MemoryTiming:
    """The controller's own width: no port converter."""
    return measure(ECPIX5, controller_bits(ECPIX5), window_cycles=WINDOW, row_miss_cycles=50)


@pytest.fixture(scope="module")
def narrow() -> MemoryTiming:
    """A port half the controller's width, through LiteDRAM's up-converter."""
    return measure(ECPIX5, controller_bits(ECPIX5) // 2, window_cycles=WINDOW,
                   patterns=("latency", "sequential"))


def test_the_controller_word_is_one_burst_of_the_chip():
    s = phy_settings(ECPIX5)
    # DDR3 bursts are 8 beats of the chip's data pins
    assert controller_bits(ECPIX5) == 8 * s.databits
    # the PHY moves half a burst per sys cycle: the board's peak
    assert controller_bits(ECPIX5) // 8 == 2 * ECPIX5.peak_bytes_per_sys_cycle


def test_refresh_interval_is_the_chips_at_the_sys_clock():
    trefi, trfc = refresh_cycles(ECPIX5)
    module = sdram_module(ECPIX5)
    ns = module.get("tREFI").ns
    # the controller rounds the interval up to whole cycles (litedram.modules, no margin)
    assert 0 <= trefi - ns * 1e-9 * ECPIX5.sys_clk_hz < 1
    assert 0 < trfc < trefi


def test_trfc_as_a_time_agrees_with_litedram_at_the_speedgrades_clock():
    """LiteDRAM counts the chip's tRFC in memory clocks of its speedgrade; at that speedgrade's
    clock (DDR3-1600: 800 MHz memory, 400 MHz sys at two phases) the time gives the same
    count, up to the one cycle of margin LiteDRAM adds to a time."""
    fast = dataclasses.replace(ECPIX5, sys_clk_hz=400e6)
    trfc_ns = speedgrade_trfc_ns(fast)
    assert speedgrade_trfc_ns(ECPIX5) == trfc_ns  # a property of the chip, not the clock
    # the board's datasheet figure is LiteDRAM's table's clocks at the speedgrade's clock
    assert ECPIX5.sdram_trfc_ns == pytest.approx(trfc_ns, rel=1e-12)  # float division only
    assert 0 <= refresh_cycles(fast, trfc_ns)[1] - refresh_cycles(fast)[1] <= 1
    # at the board's slower clock the time is fewer cycles than LiteDRAM's clock count
    trefi, trfc = refresh_cycles(ECPIX5, trfc_ns)
    assert trefi == refresh_cycles(ECPIX5)[0]
    assert trfc < refresh_cycles(ECPIX5)[1]
    period_ns = 1e9 / ECPIX5.sys_clk_hz
    # the cycles cover the time; rounding up and LiteDRAM's margin add less than two cycles
    assert trfc_ns <= trfc * period_ns < trfc_ns + 2 * period_ns


def test_native_port_streams_at_the_peak_before_refresh(native):
    # deterministic simulation; nothing but refresh and row changes can slow a sequential
    # stream, and neither falls in this window
    assert native.sequential_bytes_per_cycle == ECPIX5.peak_bytes_per_sys_cycle
    assert native.efficiency == 1.0


def test_latencies_of_an_idle_controller(native):
    phy = phy_settings(ECPIX5)
    # at least the PHY's read pipeline; a closed row adds the activate
    assert native.row_hit_latency >= phy.read_latency
    assert native.read_latency > native.row_hit_latency


def test_row_misses_are_slower_than_a_stream(native):
    assert 0 < native.row_miss_bytes_per_cycle < native.sequential_bytes_per_cycle


def test_a_narrower_port_is_slower_which_is_why_the_board_has_none(narrow, native):
    assert ECPIX5.port_bits == controller_bits(ECPIX5)
    board_port = narrow
    assert board_port.read_latency >= native.read_latency
    # LiteDRAM's up-converter issues one burst at a time (it waits for a burst's data before
    # taking the next command): a stream cannot beat one burst per read latency, plus the
    # burst whose data opens the window
    burst = controller_bits(ECPIX5) // 8
    bound = burst * (WINDOW / board_port.row_hit_latency + 1) / WINDOW
    assert board_port.sequential_bytes_per_cycle <= bound < native.sequential_bytes_per_cycle
    assert board_port.row_miss_bytes_per_cycle == 0  # not run


def test_record_round_trip(native):
    d = native.to_dict()
    assert MemoryTiming.from_dict(d) == native
    assert d["efficiency"] == native.efficiency
    assert native.matches(ECPIX5, controller_bits(ECPIX5))
    assert not native.matches(ECPIX5, ECPIX5.port_bits // 2)
    assert not native.matches(ECPIX5, controller_bits(ECPIX5), speedgrade_trfc_ns(ECPIX5))
    assert native.key == str(controller_bits(ECPIX5))
    other = dataclasses.replace(native, trfc_ns=speedgrade_trfc_ns(ECPIX5))
    assert other.key == f"{controller_bits(ECPIX5)}-trfc{speedgrade_trfc_ns(ECPIX5):g}ns"
    assert MemoryTiming.from_dict(other.to_dict()) == other
    del d["read_latency"]
    with pytest.raises(MemoryMeasureError, match="read_latency"):
        MemoryTiming.from_dict(d)


@pytest.mark.parametrize("kwargs, message", [
    (dict(port_bits=48), "port_bits must divide .* got 48"),
    (dict(port_bits=256), "got 256"),
    (dict(refresh_intervals=0), "refresh_intervals .* got 0"),
    (dict(row_miss_cycles=10), "row_miss_cycles .* got 10"),
    (dict(window_cycles=3), "window_cycles .* got 3"),
    (dict(patterns=("latency", "random")), "'random'"),
    (dict(trfc_ns=0), "trfc_ns must be > 0, got 0"),
])
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(MemoryMeasureError, match=message):
        measure(ECPIX5, **kwargs)


@pytest.mark.parametrize("rows", [1, 3, 1 << 20])
def test_bad_rows_are_named(rows):
    with pytest.raises(MemoryMeasureError, match=f"got {rows}"):
        sdram_module(ECPIX5, rows)
