# amaranth: UnusedElaboratable=no
"""The UART (hw/board/uart.py) in Amaranth's simulator: loopback of random bytes, a framing error
dropped, an overrun dropped, the divisor validated."""

from __future__ import annotations

import random

import pytest
from amaranth import Module
from amaranth.sim import Simulator

from hw.board.ecpix5 import ECPIX5
from hw.board.uart import MAX_RATE_ERROR, UartError, UartRx, UartTx, uart_divisor


def _loopback(tx_rate: tuple[float, float], rx_rate: tuple[float, float], data: bytes,
              ready_gaps: bool = False) -> tuple[list[int], int, int]:
    """Send ``data`` through UartTx -> UartRx; return what came out and the error pulses."""
    m = Module()
    m.submodules.tx = tx = UartTx(*tx_rate)
    m.submodules.rx = rx = UartRx(*rx_rate)
    m.d.comb += rx.line.eq(tx.line)
    got, pulses = [], {"framing": 0, "overrun": 0}
    rng = random.Random(1)

    async def send(ctx):
        for b in data:
            ctx.set(tx.byte.payload, b)
            ctx.set(tx.byte.valid, 1)
            await ctx.tick().until(tx.byte.ready)
            ctx.set(tx.byte.valid, 0)
            if ready_gaps:
                await ctx.tick().repeat(1 + rng.randrange(3))
        # the last byte's 10 bits, plus the receiver's synchroniser and stop-bit wait
        await ctx.tick().repeat(11 * tx.divisor)

    async def receive(ctx):
        while True:
            ready = not ready_gaps or rng.random() < 0.5
            ctx.set(rx.byte.ready, ready)
            if ready and ctx.get(rx.byte.valid):
                got.append(ctx.get(rx.byte.payload))
            pulses["framing"] += ctx.get(rx.framing_error)
            pulses["overrun"] += ctx.get(rx.overrun)
            await ctx.tick()

    sim = Simulator(m)
    sim.add_clock(1 / rx_rate[0])
    sim.add_testbench(send)
    sim.add_testbench(receive, background=True)
    sim.run()
    return got, pulses["framing"], pulses["overrun"]


def test_loopback_random_bytes():
    rng = random.Random(0)
    data = bytes(rng.randrange(256) for _ in range(48))
    got, framing, overrun = _loopback((1e6, 1e5), (1e6, 1e5), data, ready_gaps=True)
    assert (bytes(got), framing, overrun) == (data, 0, 0)


def test_loopback_at_the_board_rate():
    data = bytes([0x00, 0xFF, 0xA5, 0x5A, 0x01, 0x80])
    got, framing, overrun = _loopback((ECPIX5.sys_clk_hz, ECPIX5.uart_baud),
                                      (ECPIX5.sys_clk_hz, ECPIX5.uart_baud), data)
    assert (bytes(got), framing, overrun) == (data, 0, 0)


def test_mid_bit_sampling_tolerates_a_rate_mismatch():
    """The sender's bits 1/20 shorter (divisor 19 vs 20): still in the middle at the stop bit
    (9.5 bits x 5% = 0.475 of a bit)."""
    rng = random.Random(2)
    data = bytes(rng.randrange(256) for _ in range(16))
    got, framing, _ = _loopback((0.95e6, 5e4), (1e6, 5e4), data)
    assert (bytes(got), framing) == (data, 0)


def _drive_line(bits_per_byte: list[list[int]], divisor: int):
    """A testbench coroutine that drives ``rx.line`` with raw bit lists, one per byte."""
    async def drive(ctx, rx):
        for bits in bits_per_byte:
            for b in bits:
                ctx.set(rx.line, b)
                await ctx.tick().repeat(divisor)
            ctx.set(rx.line, 1)
            await ctx.tick().repeat(2 * divisor)
    return drive


def _frame(byte: int, stop: int = 1) -> list[int]:
    return [0] + [(byte >> i) & 1 for i in range(8)] + [stop]


def test_framing_error_is_dropped_and_the_next_byte_received():
    rx = UartRx(1e6, 1e5)
    got, framing = [], []
    drive = _drive_line([_frame(0x3C, stop=0), _frame(0xC3)], rx.divisor)

    async def bench(ctx):
        await drive(ctx, rx)

    async def watch(ctx):
        ctx.set(rx.byte.ready, 1)
        while True:
            if ctx.get(rx.byte.valid):
                got.append(ctx.get(rx.byte.payload))
            if ctx.get(rx.framing_error):
                framing.append(1)
            await ctx.tick()

    sim = Simulator(rx)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.add_testbench(watch, background=True)
    sim.run()
    assert got == [0xC3] and framing == [1]


def test_overrun_drops_the_new_byte_and_keeps_the_old():
    rx = UartRx(1e6, 1e5)
    drive = _drive_line([_frame(0x11), _frame(0x22)], rx.divisor)
    overruns = []

    async def bench(ctx):
        ctx.set(rx.byte.ready, 0)
        await drive(ctx, rx)
        assert ctx.get(rx.byte.valid) and ctx.get(rx.byte.payload) == 0x11

    async def watch(ctx):
        while True:
            if ctx.get(rx.overrun):
                overruns.append(1)
            await ctx.tick()

    sim = Simulator(rx)
    sim.add_clock(1e-6)
    sim.add_testbench(bench)
    sim.add_testbench(watch, background=True)
    sim.run()
    assert overruns == [1]


@pytest.mark.parametrize(("clk", "baud", "match"), [
    (1e6, 4e5, "below 4"),
    (1e6, 1.3e5, r"off \(at most 2%\)"),
    (1e6, 0, "baud must be a positive number"),
    (-1, 1e5, "sys_clk_hz must be a positive number"),
])
def test_divisor_is_validated(clk, baud, match):
    with pytest.raises(UartError, match=match):
        uart_divisor(clk, baud)
    with pytest.raises(UartError, match=match):
        UartTx(clk, baud)


def test_board_divisor():
    assert uart_divisor(ECPIX5.sys_clk_hz, ECPIX5.uart_baud) == round(
        ECPIX5.sys_clk_hz / ECPIX5.uart_baud)
    assert MAX_RATE_ERROR < 0.05  # the 8N1 budget of both ends together
