"""`python -m sim` and the Perfetto trace it writes."""

import json

from hw.config import AcceleratorConfig
from hw.engines import ENGINES
from sim.__main__ import main


def test_cli_values_and_trace(tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert main(["--layer", "200x300", "--tokens", "20", "--pattern", "2:8", "--values",
                 "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "values vs golden numerics: PASS" in out and "roofline bound" in out
    doc = json.loads(trace.read_text())
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert names == {"fetch"} | {e.engine.name for e in ENGINES}
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert any(e["name"].startswith("GEMM") for e in slices)
    # Slices on one engine never overlap: it executes one instruction at a time.
    for tid in (1, 2, 3):
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in slices if e["tid"] == tid)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:], strict=False))


def test_cli_timing_only_llama_layer(capsys):
    assert main(["--layer", "4096x4096", "--tokens", "1"]) == 0
    out = capsys.readouterr().out
    assert f"{4096 // AcceleratorConfig().lanes} n-tiles" in out and "of the bound" in out


def test_cli_bad_input(capsys):
    assert main(["--pattern", "3:5"]) == 2
    assert "M must be a power of two" in capsys.readouterr().err


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": 3}')
    for args, message in ((["--config", str(tmp_path / "missing.json")], "cannot read it"),
                          (["--config", str(bad)], "rows must be a power of two"),
                          (["--tokens", "0"], "--tokens must be >= 1")):
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("python -m sim: ") and message in err and "\n" not in err


def test_cli_help_documents_defaults_and_padding_is_said(capsys):
    import pytest
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    for opt in ("--layer", "--tokens", "--pattern", "--bits", "--group", "--config", "--values",
                "--rtl", "--trace", "--seed"):
        assert opt in text
    assert text.count("default:") >= 10
    assert main(["--layer", "100x100"]) == 0
    assert "K=100 is padded with 28 zero columns to 128" in capsys.readouterr().out
