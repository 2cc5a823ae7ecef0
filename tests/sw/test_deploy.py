"""``python -m sw.deploy``: the whole pipeline on the reference model, its report, and bad
input (one line, exit status 2, nothing written)."""

import json

import pytest

from sw.deploy import main

FAST = ["--method", "magnitude", "--calib", "1", "--eval-tokens", "512", "--max-new-tokens",
        "3", "--quiet"]
REPORT_FIELDS = {"model", "pattern", "bits", "group", "method", "backend", "prompt_tokens",
                 "new_tokens", "tokens_match_twin", "cycles_per_token", "tokens_per_s_sim",
                 "speedup_vs_dense", "host_transitions_per_token",
                 "dram_read_bytes_per_token", "roofline_fraction", "ppl_fp32",
                 "ppl_compressed", "compile_s"}


def test_deploy_reference_model(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # an existing --out keeps what it held
    assert main(FAST + ["--out", str(out)]) == 0
    assert (out / "notes.txt").read_text() == "mine"
    report = json.loads((out / "report.json").read_text())
    assert REPORT_FIELDS <= set(report)
    assert report["tokens_match_twin"] is True and report["new_tokens"] == 3
    assert report["model"] == "reference" and report["pattern"] == "2:4"
    # 2:4 INT4 streams fewer weight bytes than dense INT4 on the memory-bound decode
    assert report["speedup_vs_dense"] > 1.1
    assert 0 < report["roofline_fraction"] <= 1.0
    assert report["host_transitions_per_token"] == 2 * 6 * 4   # 6 programs per block, 4 blocks
    for name in ("report.md", "roofline.png", "decode_trace.json", "executable.safetensors"):
        assert (out / name).stat().st_size > 100, name
    trace = json.loads((out / "decode_trace.json").read_text())
    assert {e["name"] for e in trace["traceEvents"] if e.get("tid") == 4} >= {
        "layers.0.self_attn.scores"}
    text = capsys.readouterr().out
    assert "tokens equal the model-level twin's: yes" in text


def test_help_documents_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for opt in ("--model", "--sparsity", "--bits", "--group", "--method", "--config",
                "--backend", "--prompt", "--max-new-tokens", "--temperature", "--top-k",
                "--seed", "--calib", "--eval-tokens",
                "--out"):
        assert opt in text
    assert text.count("(default:") >= 15


@pytest.mark.parametrize("args, message", [
    (["--sparsity", "3:5"], "--sparsity '3:5'"),
    (["--sparsity", "2:4", "--bits", "8"], "INT8 weights dense only"),
    (["--group", "50"], "group (50) must be a multiple"),
    (["--method", "foo"], "--method 'foo': choose one of"),
    (["--model", "nowhere"], "--model 'nowhere': not a built-in"),
    (["--model", "m.gguf"], "--model m.gguf: no such file"),
    (["--model", "m.safetensors"], "--model m.safetensors: no such file"),
    (["--config", "missing.json"], "--config missing.json: cannot read it"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--max-new-tokens", "400"], "exceeds the model's context of 256 positions"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    assert main(FAST + ["--out", str(out)] + args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sw.deploy: ") and message in err and "\n" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.write_text("mine")
    assert main(FAST + ["--out", str(out)]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert out.read_text() == "mine" and list(tmp_path.iterdir()) == [out]


def test_invalid_configuration_and_a_model_too_large(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": 3}')
    assert main(FAST + ["--config", str(bad), "--out", str(tmp_path / "o1")]) == 2
    assert "rows must be a power of two" in capsys.readouterr().err
    small = tmp_path / "small.json"
    small.write_text('{"memory": {"size_bytes": 65536}}')
    assert main(FAST + ["--config", str(small), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "accelerator DRAM" in err and "memory.size_bytes=65,536" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "small.json"]


def test_format_summary_names_group_sizes():
    from types import SimpleNamespace

    from hw.format import WeightFormat
    from sw.deploy import _formats
    one = {"a": SimpleNamespace(fmt=WeightFormat("2:4", 4, 64))}
    assert _formats(one) == ("2:4", 4, 64, "2:4 INT4 g64")
    mixed = {"a": SimpleNamespace(fmt=WeightFormat("2:4", 4, 0)),
             "b": SimpleNamespace(fmt=WeightFormat("2:4", 4, 128)),
             "c": SimpleNamespace(fmt=WeightFormat("dense", 4, 0))}
    assert _formats(mixed)[3] == "mixed (2:4-int4, 2:4-int4-row, dense-int4-row)"
