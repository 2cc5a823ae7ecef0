"""ECP5 netlist pass: registers beside a multiplier become the MULT18X18D's own registers.

``synth_ecp5`` maps a multiplication to a MULT18X18D with its registers unused (``REG_* =
"NONE"``) and leaves the flip-flops around it in logic slices; nextpnr does not move them into
the DSP either, but it places and times the DSP's registers when the netlist sets them. A PE's
multiplier sits between two registers (hw/pe.py: ``a1``, ``w1`` -> ``p2``), so with both in
slices one cycle holds a route from a slice to the DSP, the multiplier and a route back
(docs/synthesis.md has what that path measured on the 4x8 array).

:func:`absorb_registers` rewrites the mapped netlist (Yosys JSON) between Yosys and nextpnr.
The RTL marks the registers it may move with the :data:`DSP_REGISTER` attribute: which side of
a multiplier gains is a property of the design, not of the netlist (an operand register in the
DSP puts the route to the DSP on the operand's logic path, after the PEs' operand selection:
on the 4x8 array that lost clock, docs/synthesis.md). A marked flip-flop
with no set/reset, reset value 0 and no GSR is exactly a DSP register with ``RST = 0`` and
``GSR = "DISABLED"``, clocked by its clock and enabled by its enable (or ``1``). For each
MULT18X18D with no register in use:

- an operand (A or B) whose bits are constants or the outputs of such flip-flops, all with one
  clock and one enable and feeding nothing but this operand, becomes the input register
  (``REG_INPUTA_CLK = "CLK0"``): the flip-flops go, their inputs drive the operand;
- a product whose every used bit feeds exactly one such flip-flop (one clock, one enable)
  becomes the output register (``REG_OUTPUT_CLK = "CLK0"``): the flip-flops go, the product
  drives their outputs.

The registers of one DSP share its clock (``CLK0``); each enable gets a CE input (``CE0``..).
Each register keeps its cycle, so the design is the same bit for bit and cycle for cycle: the
tests prove it with Yosys' SAT solver on a registered multiplier and on a PE, netlist against
netlist. Yosys' ECP5 cell library has no simulation model of the MULT18X18D, so the netlist
rung of the verification ladder (:mod:`sim.netlist`, generic gates) does not run this pass.
"""

from __future__ import annotations

__all__ = ["DSP_REGISTER", "absorb_registers", "dsp_register"]

#: Attribute with which the RTL marks a register that may become a DSP register (hw/pe.py);
#: ``hw.synth`` puts it on the register's flip-flops, as it does ``keep``.
DSP_REGISTER = "dsp_register"

#: MULT18X18D register parameters; the pass only touches DSPs with all of them "NONE".
_REGS = ("REG_INPUTA_CLK", "REG_INPUTB_CLK", "REG_INPUTC_CLK", "REG_PIPELINE_CLK",
         "REG_OUTPUT_CLK")
#: The DSP's register controls; the pass only touches DSPs with none of them connected.
_CONTROLS = tuple(f"{c}{i}" for c in ("CLK", "CE", "RST") for i in range(4))


def dsp_register(cell: dict) -> tuple | None:
    """``(clock, enable)`` of a TRELLIS_FF that a DSP register can replace, else None.

    The flip-flop must be marked :data:`DSP_REGISTER`, have no set/reset, reset value 0 and no
    GSR; ``enable`` is its clock-enable net, or ``"1"`` when it has none.
    """
    p, c = cell["parameters"], cell["connections"]
    cemux = p.get("CEMUX", "CE").strip()
    if not (cell["type"] == "TRELLIS_FF" and DSP_REGISTER in cell.get("attributes", {})
            and p.get("CLKMUX", "CLK") == "CLK" and cemux in ("1", "CE")
            and p.get("REGSET", "RESET") == "RESET" and p.get("GSR", "ENABLED") == "DISABLED"
            and p.get("LSRMUX", "LSR") == "LSR" and c.get("LSR", ["0"]) == ["0"]):
        return None
    return c["CLK"][0], "1" if cemux == "1" else c.get("CE", ["1"])[0]


def _port_bits(mult: dict, prefix: str, n: int) -> list[tuple[str, object]]:
    return [(f"{prefix}{i}", mult["connections"][f"{prefix}{i}"][0]) for i in range(n)
            if f"{prefix}{i}" in mult["connections"]]


def _group(cells: dict, ffs) -> tuple | None:
    """The one ``(clock, enable)`` of flip-flops ``ffs``, None if any is not a DSP register or
    they differ (a DSP register group has one clock and one enable)."""
    keys = {dsp_register(cells[f]) if f in cells else None for f in ffs}
    return keys.pop() if len(keys) == 1 and None not in keys else None


def absorb_registers(netlist: dict, top: str) -> dict[str, int]:
    """Move the marked flip-flops around each MULT18X18D of module ``top`` into its registers,
    in place. Returns ``{"dsps": DSPs changed, "ffs": flip-flops removed}``.
    """
    mod = netlist["modules"][top]
    cells = mod["cells"]
    drivers: dict[object, str] = {}
    loads: dict[object, list[tuple[str, str]]] = {}
    for port in mod["ports"].values():  # a top-level port is a driver or a load of its bits
        for b in port["bits"]:
            if port["direction"] == "input":
                drivers[b] = "<port>"
            else:
                loads.setdefault(b, []).append(("<port>", ""))
    for name, cell in cells.items():
        for pname, bits in cell["connections"].items():
            out = cell["port_directions"].get(pname) == "output"
            for b in bits:
                if out:
                    drivers[b] = name
                else:
                    loads.setdefault(b, []).append((name, pname))

    dsps = ffs = 0
    for name in [n for n, c in cells.items() if c["type"] == "MULT18X18D"]:
        mult = cells[name]
        if any(mult["parameters"].get(r, "NONE") != "NONE" for r in _REGS) or any(
                p in mult["connections"] for p in _CONTROLS):
            continue
        rewired: dict[str, list] = {}       # DSP port -> its new bit
        groups: dict[str, tuple] = {}       # register -> (clock, enable)
        absorbed: set[str] = set()          # flip-flops that become DSP registers
        for operand in ("A", "B"):
            bits = _port_bits(mult, operand, 18)
            ff_of = {b: drivers.get(b) for _, b in bits if not isinstance(b, str)}
            key = _group(cells, set(ff_of.values())) if ff_of else None
            if key and all(ld == name and p.startswith(operand)
                           for b in ff_of for ld, p in loads[b]):
                rewired.update({p: cells[ff_of[b]]["connections"]["DI"] for p, b in bits
                                if b in ff_of})
                absorbed.update(ff_of.values())
                groups[f"REG_INPUT{operand}"] = key
        used = [(p, b) for p, b in _port_bits(mult, "P", 36) if loads.get(b)]
        if used and all(len(loads[b]) == 1 and loads[b][0][1] == "DI" for _, b in used):
            out_ffs = {loads[b][0][0] for _, b in used}
            key = _group(cells, out_ffs)
            if key:
                rewired.update({p: cells[loads[b][0][0]]["connections"]["Q"] for p, b in used})
                absorbed.update(out_ffs)
                groups["REG_OUTPUT"] = key
        clocks = {clk for clk, _ in groups.values()}
        enables = sorted({ce for _, ce in groups.values()}, key=str)
        if len(clocks) != 1 or len(enables) > 4:
            continue  # nothing to absorb, or (never seen) registers on different clocks
        for f in absorbed:
            del cells[f]
        ce_port = {ce: f"CE{i}" for i, ce in enumerate(enables)}
        for reg, (_, ce) in groups.items():
            mult["parameters"].update({f"{reg}_CLK": "CLK0", f"{reg}_CE": ce_port[ce],
                                       f"{reg}_RST": "RST0"})
        mult["parameters"]["GSR"] = "DISABLED"
        mult["connections"].update(rewired, CLK0=list(clocks), RST0=["0"],
                                   **{port: [ce] for ce, port in ce_port.items()})
        mult["port_directions"].update({p: "input" for p in ["CLK0", "RST0", *ce_port.values()]})
        dsps += 1
        ffs += len(absorbed)
    return {"dsps": dsps, "ffs": ffs}
