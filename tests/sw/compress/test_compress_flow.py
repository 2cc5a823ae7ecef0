"""One flow on the command line: ``python -m sw.compress reference --out m.safetensors`` ->
``open_model("m.safetensors")`` / ``python -m sw.models.eval --checkpoint m.safetensors`` ->
``--export-hf`` to a Hugging Face directory; bad input is one line and exit status 2."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hw.config import AcceleratorConfig
from hw.format import WeightFormat
from sw.compress.__main__ import main as compress_main
from sw.compress.model import compress_llama
from sw.models.compressed import load
from sw.models.eval import main as eval_main
from sw.models.hf import load_checkpoint
from sw.models.reference_model import load_reference
from sw.models.source import ModelSourceError, open_model
from sw.models.tokenizer import encode

FMT = WeightFormat("2:4", bits=4, group=128)
IDS = torch.from_numpy(encode("def main(argv=None):\n    return 0\n").astype(np.int64))[None]


@pytest.fixture(scope="module")
def flow(tmp_path_factory):
    """The reference model compressed (magnitude: no calibration, fast) and exported."""
    d = tmp_path_factory.mktemp("flow")
    m, hf = d / "m.safetensors", d / "hf"
    torch.set_num_threads(1)
    assert compress_main(["reference", "--method", "magnitude", "--out", str(m),
                          "--export-hf", str(hf), "--quiet"]) == 0
    return m, hf


def _expected():
    model = load_reference(check_corpus=False)
    weights = compress_llama(model, FMT, "magnitude", progress=False)
    return model, weights


def test_compressed_file_is_self_contained_and_loads_as_the_model(flow):
    m, _ = flow
    cm = load(m)
    assert cm.model_config == load_reference(check_corpus=False).config
    assert cm.tokenizer == {"kind": "bytes"} and cm.meta["source"] == "reference"
    assert cm.recipe == {"method": "magnitude", "pattern": "2:4", "bits": 4, "group": 128,
                         "symmetric": True, "lanes": AcceleratorConfig().lanes}
    assert "model.embed_tokens.weight" in cm.tensors and "lm_head.weight" in cm.tensors
    expected, weights = _expected()
    src = open_model(str(m))
    assert set(src.weights) == set(weights)
    assert all(src.weights[n].equals(weights[n]) for n in weights)
    for name, t in expected.state_dict().items():
        # the dequantised stored weights and the float tensors stored as float32: the very
        # values compress_llama wrote into the model
        assert torch.equal(src.model.state_dict()[name], t), name
    with torch.no_grad():
        assert torch.equal(src.model(IDS), expected(IDS))   # same weights, same code
    assert src.encode("ab") == [97, 98] and "compressed (magnitude 2:4 INT4 g128)" in src.note
    assert src.tokens("test").size > 10_000


def test_eval_takes_the_compressed_file(flow, capsys):
    m, _ = flow
    assert eval_main(["--checkpoint", str(m), "--reference", "reference", "--max-tokens", "512",
                      "--seq-len", "128", "--json", "--threads", "1"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["model"]["num_tokens"] == 512
    assert 1.0 < result["model"]["perplexity"] < result["unigram"]["perplexity"]
    assert 0.5 < result["vs_reference"]["top1_agreement"] <= 1.0


def test_export_hf_loads_in_our_loader_and_transformers(flow):
    m, hf = flow
    assert sorted(p.name for p in hf.iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    src = open_model(str(m))
    back = load_checkpoint(hf)
    with torch.no_grad():
        assert torch.equal(back(IDS), src.model(IDS))       # the same float32 weights
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoModelForCausalLM.from_pretrained(hf).eval()
    tok = transformers.AutoTokenizer.from_pretrained(hf)
    assert tok("ab")["input_ids"] == [97, 98] and tok.eos_token == "<|eos|>"
    with torch.no_grad():
        # same weights through transformers' kernels: float32 rounding only, a few ulps
        # (1e-6 relative) of logits up to ~20
        torch.testing.assert_close(ref(IDS).logits, src.model(IDS), atol=1e-4, rtol=0)
    # exporting again replaces an exported directory, never anything else
    assert compress_main([str(m), "--export-hf", str(hf)]) == 0
    other = hf.parent / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    assert compress_main([str(m), "--export-hf", str(other)]) == 2
    assert (other / "notes.txt").read_text() == "keep me"


def _rc(main, args) -> int:
    """Exit status of ``main(args)``: returned, or raised by argparse for a malformed option."""
    try:
        return main(args)
    except SystemExit as e:
        return e.code


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err, err
    return err


@pytest.mark.parametrize("args, message", [
    (["reference", "--method", "foo"], "--method 'foo': choose one of"),
    (["reference", "--pattern", "3:5"], "--pattern '3:5'"),
    (["reference", "--calib", "0"], "--calib must be >= 1"),
    (["reference", "--bits", "5"], "argument --bits: invalid choice: 5"),
    (["nowhere"], "MODEL 'nowhere': not a built-in"),
    (["missing.safetensors", "--out", "x.safetensors"], "missing.safetensors: no such file"),
    (["missing.gguf"], "missing.gguf: no such file"),
    (["--method", "gptq"], "--method gptq: loose layers have no model to calibrate on"),
])
def test_compress_bad_input_is_one_line_exit_2(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    assert _rc(compress_main, args + ["--quiet"]) == 2
    err = _one_line(capsys)
    assert err.startswith("sw.compress: ") and message in err, err
    assert list(tmp_path.iterdir()) == []                    # nothing written


def _flip(path, where: str, tmp_path):
    """A copy of ``path`` with one byte flipped in the header, a stream or a float tensor."""
    raw = bytearray(path.read_bytes())
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    if where == "header":
        i = raw.index(b"magnitude", 8)                  # inside the checksummed document
    else:
        start, end = header[where]["data_offsets"]
        i = 8 + n + (start + end) // 2
    raw[i] ^= 0x01
    out = tmp_path / f"flipped-{where}.safetensors"
    out.write_bytes(bytes(raw))
    return out


@pytest.mark.parametrize("where", ["header", "model.layers.0.self_attn.q_proj.stream",
                                   "model.layers.3.mlp.down_proj.row_scale",
                                   "model.embed_tokens.weight", "model.norm.weight"])
def test_a_flipped_byte_anywhere_is_one_line_exit_2(flow, tmp_path, capsys, where):
    bad = _flip(flow[0], where, tmp_path)
    for run in (lambda: compress_main([str(bad)]),
                lambda: eval_main(["--checkpoint", str(bad), "--max-tokens", "256"]),
                lambda: compress_main([str(bad), "--export-hf", str(tmp_path / "hf")])):
        assert run() == 2
        err = _one_line(capsys)
        assert "checksum mismatch" in err, err
    assert not (tmp_path / "hf").exists()
    with pytest.raises(ModelSourceError, match="checksum mismatch"):
        open_model(str(bad))


def test_eval_bad_input_is_one_line_exit_2(tmp_path, capsys):
    for args, message in (
            (["--checkpoint", str(tmp_path / "nothing.safetensors")], "no such file"),
            (["--checkpoint", "nowhere"], "--checkpoint 'nowhere': not a built-in"),
            (["--seq-len", "4096"], "exceeds the model's context of 256"),
            (["--max-tokens", "0"], "--max-tokens must be >= 1")):
        assert _rc(eval_main, args) == 2, args
        err = _one_line(capsys)
        assert err.startswith("sw.models.eval: ") and message in err, err
    corrupt = tmp_path / "c.safetensors"
    corrupt.write_bytes(b"\x00" * 64)
    assert eval_main(["--checkpoint", str(corrupt)]) == 2
    assert "truncated or corrupted" in _one_line(capsys)


def test_help_documents_every_option_with_its_default(capsys):
    for main, count in ((compress_main, 16), (eval_main, 7)):
        with pytest.raises(SystemExit) as e:
            main(["--help"])
        assert e.value.code == 0
        text = capsys.readouterr().out
        assert text.count("(default:") >= count, text



def test_calibration_text_is_chosen_and_recorded(tmp_path, capsys):
    """--calib-domain picks the calibration set (Wanda's masks follow it) and the file's
    recipe names it; an unknown set is one line and exit status 2, nothing written."""
    weights = {}
    for text in ("code", "prose"):
        m = tmp_path / f"{text}.safetensors"
        assert compress_main(["reference", "--method", "wanda", "--calib", "2", "--seq-len",
                              "64", "--calib-domain", text, "--out", str(m), "--quiet"]) == 0
        assert load(m).recipe["calibration"]["text"] == text
        weights[text] = open_model(str(m)).weights
    assert any(not weights["code"][n].equals(weights["prose"][n]) for n in weights["code"])
    capsys.readouterr()
    bad = tmp_path / "bad.safetensors"
    assert _rc(compress_main, ["reference", "--calib-domain", "poetry", "--out", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "poetry" in err and not bad.exists()
