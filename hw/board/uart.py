"""The host link's UART: 8N1 receiver and transmitter with byte streams.

8N1: the idle line is high; a byte is a start bit (low), 8 data bits LSB first and a stop bit
(high), each ``divisor`` clock cycles long, ``divisor = round(sys_clk_hz / baud)``
(:func:`uart_divisor`; the ECPIX-5's 75 MHz and 3 Mbaud give 25).

The receiver samples each bit in its middle: a start bit is a low line seen again half a bit
after the falling edge (a shorter glitch is ignored); a byte whose stop bit is low (a framing
error) is dropped, and the receiver waits for the idle line before the next start bit. A UART
cannot push back: a byte completed while the previous one still waits on the stream
(``valid`` and not ``ready``) is dropped (an overrun); the host link keeps ``ready`` high
whenever it receives a frame, and the host's stop-and-wait protocol does not send while the
board replies.

Examples
--------
>>> uart_divisor(75e6, 3_000_000)
25
>>> uart_divisor(75e6, 115_200)
651
"""

from __future__ import annotations

from amaranth import Cat, Const, Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.cdc import FFSynchronizer
from amaranth.lib.wiring import In, Out

from hw.board.ecpix5 import ECPIX5
from hw.errors import ContractError

__all__ = ["MIN_DIVISOR", "MAX_RATE_ERROR", "UartError", "uart_divisor", "UartRx", "UartTx"]

#: Fewest clock cycles per bit: the receiver needs a half-bit wait of at least one cycle after
#: its two-register synchroniser, and a whole bit of at least two.
MIN_DIVISOR = 4
#: Largest relative error of the achieved baud rate: mid-bit sampling tolerates half a bit over
#: the 9.5 bits to the stop bit's middle, ~5% between the two ends; each end gets under half.
MAX_RATE_ERROR = 0.02

BITS = 8


class UartError(ContractError):
    """A clock and baud rate the UART cannot run at."""


def uart_divisor(sys_clk_hz: float, baud: float) -> int:
    """Clock cycles per bit: ``round(sys_clk_hz / baud)``, validated.

    Raises
    ------
    UartError
        A rate that is not positive, a divisor below :data:`MIN_DIVISOR`, or an achieved rate
        more than :data:`MAX_RATE_ERROR` off ``baud``.
    """
    for name, v in (("sys_clk_hz", sys_clk_hz), ("baud", baud)):
        if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
            raise UartError(f"{name} must be a positive number, got {v!r}")
    divisor = round(sys_clk_hz / baud)
    if divisor < MIN_DIVISOR:
        raise UartError(f"divisor round({sys_clk_hz} / {baud}) = {divisor} is below "
                        f"{MIN_DIVISOR} clock cycles per bit")
    error = abs(sys_clk_hz / divisor / baud - 1)
    if error > MAX_RATE_ERROR:
        raise UartError(f"baud {baud} from a {sys_clk_hz} Hz clock with divisor {divisor} is "
                        f"{error:.1%} off (at most {MAX_RATE_ERROR:.0%})")
    return divisor


class UartRx(wiring.Component):
    """8N1 receiver.

    Parameters
    ----------
    sys_clk_hz, baud:
        The clock and the line rate (default: the ECPIX-5's, :data:`hw.board.ecpix5.ECPIX5`).

    Members
    -------
    line: In(1, init=1)
        The serial input (asynchronous; synchronised inside).
    byte: Out(stream.Signature(8))
        Received bytes; ``payload`` holds while ``valid`` and not ``ready``.
    framing_error: Out(1)
        One-cycle pulse: a byte with a low stop bit was dropped.
    overrun: Out(1)
        One-cycle pulse: a byte was dropped because the previous one was not taken.
    """

    def __init__(self, sys_clk_hz: float = ECPIX5.sys_clk_hz, baud: float = ECPIX5.uart_baud):
        self.divisor = uart_divisor(sys_clk_hz, baud)
        super().__init__({
            "line": In(1, init=1),
            "byte": Out(stream.Signature(BITS)),
            "framing_error": Out(1),
            "overrun": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        div = self.divisor
        line = Signal(init=1)
        m.submodules.sync = FFSynchronizer(self.line, line, init=1)
        timer = Signal(range(div))
        bit = Signal(range(BITS))
        shift = Signal(BITS)
        tick = timer == 0
        with m.If(~tick):
            m.d.sync += timer.eq(timer - 1)
        with m.If(self.byte.ready):
            m.d.sync += self.byte.valid.eq(0)

        with m.FSM():
            with m.State("IDLE"):
                with m.If(~line):
                    m.d.sync += timer.eq(div // 2 - 1)
                    m.next = "START"
            with m.State("START"):
                with m.If(tick):
                    m.d.sync += [timer.eq(div - 1), bit.eq(0)]
                    m.next = "DATA"
                    with m.If(line):  # a glitch, not a start bit
                        m.next = "IDLE"
            with m.State("DATA"):
                with m.If(tick):
                    m.d.sync += [shift.eq(Cat(shift[1:], line)), timer.eq(div - 1),
                                 bit.eq(bit + 1)]
                    with m.If(bit == BITS - 1):
                        m.next = "STOP"
            with m.State("STOP"):
                with m.If(tick):
                    with m.If(~line):
                        m.d.comb += self.framing_error.eq(1)
                        m.next = "BREAK"
                    with m.Elif(self.byte.valid & ~self.byte.ready):
                        m.d.comb += self.overrun.eq(1)
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += [self.byte.payload.eq(shift), self.byte.valid.eq(1)]
                        m.next = "IDLE"
            with m.State("BREAK"):
                with m.If(line):
                    m.next = "IDLE"
        return m


class UartTx(wiring.Component):
    """8N1 transmitter.

    Parameters
    ----------
    sys_clk_hz, baud:
        As :class:`UartRx`.

    Members
    -------
    byte: In(stream.Signature(8))
        Bytes to send; ``ready`` while the line is idle.
    line: Out(1, init=1)
        The serial output, straight from a register.
    """

    def __init__(self, sys_clk_hz: float = ECPIX5.sys_clk_hz, baud: float = ECPIX5.uart_baud):
        self.divisor = uart_divisor(sys_clk_hz, baud)
        super().__init__({
            "byte": In(stream.Signature(BITS)),
            "line": Out(1, init=1),
        })

    def elaborate(self, platform):
        m = Module()
        div = self.divisor
        frame_bits = 1 + BITS + 1
        shift = Signal(frame_bits, init=(1 << frame_bits) - 1)  # idle: all stop bits
        left = Signal(range(frame_bits + 1))
        timer = Signal(range(div))
        m.d.comb += [self.line.eq(shift[0]), self.byte.ready.eq(left == 0)]
        with m.If(left == 0):
            with m.If(self.byte.valid):
                m.d.sync += [shift.eq(Cat(Const(0, 1), self.byte.payload, Const(1, 1))),
                             left.eq(frame_bits), timer.eq(div - 1)]
        with m.Elif(timer == 0):
            m.d.sync += [shift.eq(Cat(shift[1:], Const(1, 1))), left.eq(left - 1),
                         timer.eq(div - 1)]
        with m.Else():
            m.d.sync += timer.eq(timer - 1)
        return m
