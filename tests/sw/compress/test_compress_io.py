"""Save/load of compressed models (self-contained, every byte checksummed) and the
`python -m sw.compress` report on loose layers."""

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from hw.config import AcceleratorConfig, NMPattern
from hw.format import WeightFormat, random_quantized
from sw.artifact import load_artifact, save_artifact
from sw.compress.__main__ import main
from sw.models.compressed import (
    FORMAT_VERSION,
    TOKENIZER_TENSOR,
    CompressedFileError,
    CompressedModel,
    is_compressed,
    load,
    save,
)
from sw.models.config import LlamaConfig
from sw.models.tokenizer import build_tokenizer

KEY = "nmfpga-compressed"


@pytest.fixture
def model():
    rng = np.random.default_rng(0)
    return CompressedModel(
        weights={"a.q_proj": random_quantized(WeightFormat("2:4", 4, 32), (40, 96), rng),
                 "a.down": random_quantized(WeightFormat("dense", 8, 0, False), (16, 24), rng)},
        tensors={"norm.weight": rng.standard_normal(16).astype(np.float32)},
        config=AcceleratorConfig(rows=2, cols=8), meta={"source": "test"},
        model_config=LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1),
        tokenizer={"kind": "tokenizers", "json": build_tokenizer().to_str(),
                   "chat_template": "{{ messages }}"},
        recipe={"method": "magnitude", "pattern": "2:4", "bits": 4, "group": 32})


def test_round_trip(tmp_path, model):
    path = save(model, tmp_path / "m.safetensors")
    assert is_compressed(path)
    back = load(path)
    assert set(back.weights) == set(model.weights)
    for name, qw in model.weights.items():
        assert back.weights[name].equals(qw)
    assert np.array_equal(back.tensors["norm.weight"], model.tensors["norm.weight"])
    assert back.config == model.config and back.meta == {"source": "test"}
    assert back.model_config == model.model_config and back.recipe == model.recipe
    assert back.tokenizer == model.tokenizer


def test_byte_tokenizer_marker_and_loose_layers(tmp_path, model):
    model.tokenizer = {"kind": "bytes"}
    back = load(save(model, tmp_path / "m.safetensors"))
    assert back.tokenizer == {"kind": "bytes"}
    loose = CompressedModel(weights=model.weights)
    back = load(save(loose, tmp_path / "l.safetensors"))
    assert back.model_config is None and back.tokenizer is None and back.recipe is None


def test_save_is_atomic_and_refuses_collisions(tmp_path, model):
    model.tensors[TOKENIZER_TENSOR] = np.zeros(3, np.uint8)
    with pytest.raises(ValueError, match="collides"):
        save(model, tmp_path / "m.safetensors")
    assert list(tmp_path.iterdir()) == []          # nothing half-written


def test_truncated_file(tmp_path, model):
    path = save(model, tmp_path / "m.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(CompressedFileError, match="truncated or corrupted"):
        load(path)


def _data_offsets(path):
    """``{tensor name: (start, end)}`` byte ranges of each tensor's data in the file."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    return {k: (8 + n + v["data_offsets"][0], 8 + n + v["data_offsets"][1])
            for k, v in header.items() if k != "__metadata__"}


@pytest.mark.parametrize("part", ["a.q_proj.stream", "a.q_proj.row_scale", "norm.weight",
                                  TOKENIZER_TENSOR])
def test_a_flipped_byte_in_any_tensor_fails_its_checksum(tmp_path, model, part):
    path = save(model, tmp_path / "m.safetensors")
    start, end = _data_offsets(path)[part]
    data = bytearray(path.read_bytes())
    data[(start + end) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CompressedFileError, match=f"checksum mismatch in tensor '{part}'"):
        load(path)


def _resave(path, edit):
    """Rewrite the document with valid checksums (a file from another, consistent writer)."""
    tensors, doc = load_artifact(path, KEY)
    edit(doc)
    save_artifact(path, KEY, tensors, doc)


def test_wrong_version_and_shape(tmp_path, model):
    path = save(model, tmp_path / "m.safetensors")
    _resave(path, lambda d: d.update(version=99))
    with pytest.raises(CompressedFileError, match=f"format version 99, this toolkit reads "
                                                  f"version {FORMAT_VERSION}"):
        load(path)
    path = save(model, tmp_path / "n.safetensors")
    _resave(path, lambda d: d["weights"]["a.q_proj"].update(shape=[40, 128]))
    with pytest.raises(CompressedFileError, match="needs"):
        load(path)
    path = save(model, tmp_path / "o.safetensors")
    _resave(path, lambda d: d["model_config"].update(hidden_size=-1))
    with pytest.raises(CompressedFileError, match="invalid model configuration"):
        load(path)


def test_version_1_file(tmp_path):
    save_file({"x.stream": np.zeros(3, np.uint8)}, str(tmp_path / "v1.safetensors"),
              metadata={"nmfpga": json.dumps({"version": 1})})
    with pytest.raises(CompressedFileError, match="format version 1, this toolkit reads"):
        load(tmp_path / "v1.safetensors")


def test_not_a_compressed_model(tmp_path):
    save_file({"x": np.zeros(3, np.float32)}, str(tmp_path / "x.safetensors"))
    assert not is_compressed(tmp_path / "x.safetensors")
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
    rc = main([str(tmp_path), "--pattern", "2:4", "--group", "64", "--quiet",
               "--out", str(tmp_path / "c.safetensors"), "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert rc == 0 and "TOTAL" in out and "q_proj" in out and "embed" not in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert len(report) == 4
    assert all(r["bits_per_weight"] == pytest.approx(3 + 8 / 64 + 32 / 128) for r in report)
    back = load(tmp_path / "c.safetensors")
    assert len(back.weights) == 4 and back.model_config is None
    assert back.recipe["method"] == "magnitude" and back.recipe["group"] == 64
    # a compressed file given back: summarised, not compressed again
    assert main([str(tmp_path / "c.safetensors")]) == 0
    assert "checksums verified; 4 compressed layers" in capsys.readouterr().out


def test_cli_bad_input(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "no .safetensors files" in capsys.readouterr().err
    assert main(["--pattern", "3:2"]) == 2
    assert "N must be < M" in capsys.readouterr().err


@pytest.mark.parametrize("args, needle", [
    (["--bits", "8", "--pattern", "2:4"], "the decoder streams INT8 weights dense only"),
    (["--pattern", "3:4"], "pattern 3:4 not supported by this accelerator"),
    (["--config", "missing.json"], "--config missing.json"),
])
def test_cli_refuses_formats_the_hardware_cannot_stream(tmp_path, capsys, args, needle):
    out = tmp_path / "x.safetensors"
    assert main(args + ["--blocks", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and not out.exists()


def test_cli_notes_a_pattern_dearer_than_dense(tmp_path, capsys):
    """A configuration may offer 3:4, whose INT4 stream is larger than dense: compressed as
    asked, with a note saying so."""
    cfg = AcceleratorConfig(rows=1, cols=16)
    cfg = cfg.replace(patterns=cfg.patterns + (NMPattern.parse("3:4"),))
    cfg.save(tmp_path / "c.json")
    layers = {"q_proj.weight": np.random.default_rng(0).standard_normal((32, 256))
              .astype(np.float32)}
    save_file(layers, str(tmp_path / "l.safetensors"))
    assert main([str(tmp_path / "l.safetensors"), "--pattern", "3:4", "--config",
                 str(tmp_path / "c.json"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "note: 3:4 INT4 stores" in out and "more than dense INT4's" in out


def test_publish_moves_files_and_keeps_others(tmp_path):
    from sw.artifact import publish
    out, tmp = tmp_path / "out", tmp_path / "tmp"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    (out / "a.json").write_text("old")
    tmp.mkdir()
    (out / "trace.json").write_text("stale")  # an output this run did not write
    (tmp / "a.json").write_text("new")
    publish(tmp, out, ("a.json", "trace.json"))
    assert (out / "mine.txt").read_text() == "keep" and (out / "a.json").read_text() == "new"
    assert not (out / "trace.json").exists()
    assert not tmp.exists()
    tmp.mkdir()
    (tmp / "b.json").write_text("b")
    publish(tmp, tmp_path / "fresh")
    assert (tmp_path / "fresh" / "b.json").read_text() == "b"
