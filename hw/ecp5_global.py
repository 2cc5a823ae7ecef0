"""ECP5 netlist pass: a flip-flop control net with thousands of loads rides a global network.

nextpnr-ecp5 puts only clocks on the ECP5's global networks (its ``promote_globals`` counts
clock pins). A clock enable or a reset that reaches thousands of flip-flops stays on general
routing: one source fanning out over the whole die, thousands of arcs that the router must
untangle from the logic around them. On the board top the accelerator's clock enable
(hw/board/bridge.py: one register, ``EnableInserter`` over the whole accelerator) reaches
13,679 flip-flop CE pins and the reset 4,566 LSR pins (docs/board.md has what nextpnr made of
the board top with them in the fabric and on global networks).

:func:`promote_controls` rewrites the mapped netlist (Yosys JSON) between Yosys and nextpnr: for
each net that drives at least ``min_loads`` TRELLIS_FF ``CE`` or ``LSR`` pins it inserts a
DCCA (the ECP5's global buffer, ``CE`` tied high: always passing) and moves exactly those pins
to its output; every other load (LUT inputs, DSP and block RAM controls, I/O registers) keeps
the original net. nextpnr routes a net driven by a DCCA on a global network into each tile's
CE and LSR multiplexers. The DCCA is a buffer, so the design is the same bit for bit and cycle
for cycle. nextpnr times the path through it: from the driving flip-flop to the DCCA as a
routed net, and the global network from the DCCA as zero delay, as it takes the clock's own
global network (the enable and the clock it qualifies arrive through the same kind of
network).
"""

from __future__ import annotations

__all__ = ["CONTROL_PINS", "MIN_LOADS", "promote_controls"]

#: The TRELLIS_FF control pins a promoted net's loads move from.
CONTROL_PINS = ("CE", "LSR")
#: A control net with at least this many flip-flop loads on one pin kind goes global. The
#: board top's enable and reset have 13,679 and 4,566; its next largest control nets under 300.
MIN_LOADS = 2000


def _net_names(mod: dict) -> dict[object, str]:
    names: dict[object, str] = {}
    for name, net in sorted(mod["netnames"].items(), key=lambda kv: kv[1].get("hide_name", 0)):
        for b in net["bits"]:
            names.setdefault(b, name)
    return names


def promote_controls(netlist: dict, top: str, min_loads: int = MIN_LOADS) -> list[dict]:
    """Put each TRELLIS_FF ``CE``/``LSR`` net of module ``top`` with at least ``min_loads``
    loads on that pin behind a DCCA, in place.

    Parameters
    ----------
    netlist:
        Yosys JSON netlist after ``synth_ecp5``.
    top:
        The module to rewrite.
    min_loads:
        Fewest flip-flop pins of one kind (``CE`` or ``LSR``) that make a net go global.

    Returns
    -------
    One entry per promoted net, by decreasing loads: ``{"net": its name, "pin": "CE" or "LSR",
    "loads": flip-flop pins moved, "dcca": the new cell, "other_loads": loads left on the net
    besides the DCCAs}``.
    """
    if not isinstance(min_loads, int) or min_loads < 1:
        raise ValueError(f"min_loads must be an int >= 1, got {min_loads!r}")
    mod = netlist["modules"][top]
    cells = mod["cells"]
    pins: dict[tuple[object, str], list[str]] = {}   # (bit, pin) -> flip-flops
    loads: dict[object, int] = {}                    # bit -> every input load
    top_bits = [b for net in mod["netnames"].values() for b in net["bits"] if isinstance(b, int)]
    for port in mod["ports"].values():
        top_bits += [b for b in port["bits"] if isinstance(b, int)]
        if port["direction"] != "input":
            for b in port["bits"]:
                loads[b] = loads.get(b, 0) + 1
    for name, cell in cells.items():
        for pname, bits in cell["connections"].items():
            top_bits += [b for b in bits if isinstance(b, int)]
            if cell["port_directions"].get(pname) == "output":
                continue
            for b in bits:
                loads[b] = loads.get(b, 0) + 1
            if cell["type"] == "TRELLIS_FF" and pname in CONTROL_PINS and isinstance(bits[0], int):
                pins.setdefault((bits[0], pname), []).append(name)
    names = _net_names(mod)
    next_bit = max(top_bits, default=1) + 1  # above every bit, named or connected
    promoted = []
    for (bit, pin), ffs in sorted(pins.items(), key=lambda kv: (-len(kv[1]), str(kv[0]))):
        if len(ffs) < min_loads:
            continue
        net = names.get(bit, f"${bit}")
        dcca = f"$glb_{pin.lower()}${net}"
        out = next_bit
        next_bit += 1
        cells[dcca] = {"type": "DCCA", "parameters": {}, "attributes": {}, "hide_name": 1,
                       "port_directions": {"CLKI": "input", "CE": "input", "CLKO": "output"},
                       "connections": {"CLKI": [bit], "CE": ["1"], "CLKO": [out]}}
        mod["netnames"][f"{net}$glb_{pin.lower()}"] = {"hide_name": 0, "bits": [out],
                                                       "attributes": {}}
        for f in ffs:
            cells[f]["connections"][pin] = [out]
        loads[bit] -= len(ffs)
        promoted.append((bit, {"net": net, "pin": pin, "loads": len(ffs), "dcca": dcca}))
    return [{**p, "other_loads": loads[bit]} for bit, p in promoted]
