"""LiteDRAM's native user port, as an Amaranth signature.

The generated core (:mod:`hw.board.litedram`) exposes each native user port as flat signals
``user_port_<name>_{cmd,wdata,rdata}_*`` (litedram/gen.py, ``get_native_user_port_ios``). Seen
from the user of the port (the bridge, the host link):

cmd
    a command stream: ``we`` (1: write, 0: read) and ``addr`` (in data words of the port);
    accepted when ``valid`` and ``ready``.
wdata
    one data word (and byte enables ``we``) per accepted write command, in order.
rdata
    one data word per accepted read command, in order (``ready`` is the user's).

Examples
--------
>>> sig = NativePortSignature(data_width=64, addr_width=26)
>>> sig.members["cmd"].signature.members["payload"].shape.size
27
"""

from __future__ import annotations

from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["NativePortSignature", "native_cmd_layout", "native_wdata_layout"]


def native_cmd_layout(addr_width: int) -> data.StructLayout:
    """Payload of the command stream: write flag and word address."""
    return data.StructLayout({"we": 1, "addr": addr_width})


def native_wdata_layout(data_width: int) -> data.StructLayout:
    """Payload of the write-data stream: one word and its byte enables."""
    return data.StructLayout({"data": data_width, "we": data_width // 8})


class NativePortSignature(wiring.Signature):
    """A LiteDRAM native port seen from its user.

    Parameters
    ----------
    data_width:
        Bits per data word (a multiple of 8).
    addr_width:
        Bits of the word address.

    Members
    -------
    cmd: Out(stream.Signature(native_cmd_layout(addr_width)))
    wdata: Out(stream.Signature(native_wdata_layout(data_width)))
    rdata: In(stream.Signature(data_width))
    """

    def __init__(self, data_width: int, addr_width: int):
        for name, v in (("data_width", data_width), ("addr_width", addr_width)):
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise TypeError(f"{name} must be a positive int, got {v!r}")
        if data_width % 8:
            raise ValueError(f"data_width must be a multiple of 8, got {data_width!r}")
        self.data_width = data_width
        self.addr_width = addr_width
        super().__init__({
            "cmd": Out(stream.Signature(native_cmd_layout(addr_width))),
            "wdata": Out(stream.Signature(native_wdata_layout(data_width))),
            "rdata": In(stream.Signature(data_width)),
        })

    def __eq__(self, other):
        return (type(other) is NativePortSignature and other.data_width == self.data_width
                and other.addr_width == self.addr_width)

    def __repr__(self):
        return f"NativePortSignature(data_width={self.data_width}, addr_width={self.addr_width})"
