"""Save/load of compressed models and the `python -m sw.compress` report."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from hw.config import AcceleratorConfig
from hw.format import WeightFormat, random_quantized
from sw.compress.__main__ import main
from sw.compress.io import CompressedFileError, CompressedModel, load, save


@pytest.fixture
def model():
    rng = np.random.default_rng(0)
    return CompressedModel(
        weights={"a.q_proj": random_quantized(WeightFormat("2:4", 4, 32), (40, 96), rng),
                 "a.down": random_quantized(WeightFormat("dense", 8, 0, False), (16, 24), rng)},
        tensors={"norm.weight": rng.standard_normal(16).astype(np.float32)},
        config=AcceleratorConfig(rows=2, cols=8), meta={"source": "test"})


def test_round_trip(tmp_path, model):
    path = save(model, tmp_path / "m.safetensors")
    back = load(path)
    assert set(back.weights) == set(model.weights)
    for name, qw in model.weights.items():
        assert back.weights[name].equals(qw)
    assert np.array_equal(back.tensors["norm.weight"], model.tensors["norm.weight"])
    assert back.config == model.config and back.meta == {"source": "test"}


def test_truncated_file(tmp_path, model):
    path = save(model, tmp_path / "m.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(CompressedFileError, match="truncated or corrupted"):
        load(path)


def test_corrupted_stream_fails_checksum(tmp_path, model):
    path = save(model, tmp_path / "m.safetensors")
    data = bytearray(path.read_bytes())
    data[-300] ^= 0xFF  # a byte inside the last tensor's data
    path.write_bytes(bytes(data))
    with pytest.raises(CompressedFileError, match="checksum mismatch|missing|corrupted"):
        load(path)


def _rewrite_meta(path, edit):
    from safetensors import safe_open
    from safetensors.numpy import load_file
    with safe_open(str(path), framework="numpy") as f:
        doc = json.loads(f.metadata()["nmfpga"])
    edit(doc)
    save_file(load_file(str(path)), str(path), metadata={"nmfpga": json.dumps(doc)})


def test_wrong_version_and_shape(tmp_path, model):
    path = save(model, tmp_path / "m.safetensors")
    _rewrite_meta(path, lambda d: d.update(version=99))
    with pytest.raises(CompressedFileError, match="format version 99"):
        load(path)
    path = save(model, tmp_path / "n.safetensors")
    _rewrite_meta(path, lambda d: d["weights"]["a.q_proj"].update(shape=[40, 128]))
    with pytest.raises(CompressedFileError, match="needs"):
        load(path)


def test_not_a_compressed_model(tmp_path):
    save_file({"x": np.zeros(3, np.float32)}, str(tmp_path / "x.safetensors"))
    with pytest.raises(CompressedFileError, match="not a compressed model"):
        load(tmp_path / "x.safetensors")
    with pytest.raises(CompressedFileError, match="no such file"):
        load(tmp_path / "missing.safetensors")


def test_cli_reports_and_saves(tmp_path, capsys):
    rng = np.random.default_rng(0)
    weights = {f"layers.0.self_attn.{p}_proj.weight": rng.standard_normal((64, 128)).astype(
        np.float32) for p in "qkvo"}
    weights["embed_tokens.weight"] = rng.standard_normal((10, 128)).astype(np.float32)
    save_file(weights, str(tmp_path / "model.safetensors"))
    rc = main([str(tmp_path), "--pattern", "2:4", "--group", "64",
               "--out", str(tmp_path / "c.safetensors"), "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert rc == 0 and "TOTAL" in out and "q_proj" in out and "embed" not in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert len(report) == 4
    assert all(r["bits_per_weight"] == pytest.approx(3 + 8 / 64 + 32 / 128) for r in report)
    assert len(load(tmp_path / "c.safetensors").weights) == 4


def test_cli_bad_input(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no .safetensors files" in capsys.readouterr().err
    assert main(["--pattern", "3:2"]) == 2
    assert "N must be < M" in capsys.readouterr().err
