"""GGUF files: tiny files written as llama.cpp writes them load back exactly (config, tensors
of every supported type, the q/k rotary permutation undone, tokenizer, chat template);
transformers' GGUF loader agrees; clear errors; and (``-m smollm2``) the real SmolLM2."""

from __future__ import annotations

import dataclasses
import importlib.util
import time

import numpy as np
import pytest
import torch
from gguf_testutil import CHAT_TEMPLATE, TOKENS, hf_tokenizer, stored_model, write_gguf
from models_testutil import tiny_model

from sw.models.generate import generate
from sw.models.gguf import GGUFError, load_gguf, unpermute_qk
from sw.models.source import ModelSourceError, open_model
from sw.models.tokenizer import encode

IDS = torch.tensor([[5, 17, 260, 3, 99, 42, 256, 7, 11, 200, 13, 1]])


def _tiny(tie: bool = False):
    # intermediate 64: llama.cpp's 32-wide quantisation blocks need rows of whole blocks
    return tiny_model(vocab_size=len(TOKENS), intermediate_size=64, tie_word_embeddings=tie)


@pytest.mark.parametrize("qtype", ["F32", "F16", "Q8_0", "Q4_0", "Q4_1"])
@pytest.mark.parametrize("tie", [False, True])
def test_tiny_gguf_loads_exactly(tmp_path, qtype, tie):
    path = write_gguf(_tiny(tie), tmp_path / "m.gguf", qtype=qtype)
    expected = stored_model(_tiny(tie), qtype)
    model = load_gguf(path)
    # GGUF stores the epsilon as float32
    assert model.config == dataclasses.replace(
        expected.config, bos_token_id=256, eos_token_id=257, pad_token_id=258,
        rms_norm_eps=float(np.float32(expected.config.rms_norm_eps)))
    assert model.config.tie_word_embeddings is tie
    got, want = model.state_dict(), expected.state_dict()
    assert set(got) == set(want)
    for name in want:
        # the same bytes dequantised by the same function: equal bit for bit
        assert torch.equal(got[name], want[name]), name
    with torch.no_grad():
        # identical weights through identical code: identical logits
        assert torch.equal(model(IDS), expected(IDS))


def test_unpermute_inverts_llamacpp_permutation():
    from gguf_testutil import llamacpp_permute

    w = np.arange(4 * 8 * 3, dtype=np.float32).reshape(32, 3)
    for heads, kv in ((4, 4), (4, 2)):
        n = kv
        assert np.array_equal(unpermute_qk(llamacpp_permute(w, heads, kv), n), w)
    with pytest.raises(GGUFError, match="cannot unpermute 30 rows into 4 heads"):
        unpermute_qk(np.zeros((30, 2), np.float32), 4)


def test_logits_match_transformers_gguf_loader(tmp_path):
    pytest.importorskip("accelerate")   # transformers' GGUF model loading needs it
    transformers = pytest.importorskip("transformers")
    path = write_gguf(_tiny(True), tmp_path / "m.gguf", qtype="Q8_0")
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="m.gguf", dtype=torch.float32).eval()
    with torch.no_grad():
        # same weights, different kernels (transformers' SDPA attention): float32 rounding
        torch.testing.assert_close(load_gguf(path)(IDS), ref(IDS).logits, atol=1e-5, rtol=0)


def test_tokenizer_and_chat_template(tmp_path):
    path = write_gguf(_tiny(), tmp_path / "m.gguf")
    src = open_model(str(path))
    text = "def f(x): return x # ünïcode\n"
    # ids 0-255 are bytes, as in the reference tokenizer
    assert src.encode(text) == encode(text).astype(int).tolist()
    indented = "if x:\n    pass  # two spaces\n"
    assert 260 in src.encode(indented)          # the one merge, "two spaces"
    assert src.decode(src.encode(indented)) == indented
    assert src.encode("<|eos|>") == [257] and src.eos_token_id == 257
    assert src.chat_template == CHAT_TEMPLATE
    ids = src.chat([{"role": "user", "content": "hi"}])
    assert ids == [256, *encode("user: hi").tolist(), 257, 256, *encode("assistant: ").tolist()]
    assert "float baseline is the dequantised Q8_0 weights" in src.note
    assert src.tokens("test").size > 1000 and src.weights is None


# ---------------------------------------------------------------------- tokenizers
EVAL = ["--seq-len", "64", "--max-tokens", "512", "--threads", "1"]


def _eval(argv, capsys) -> tuple[int, str, str]:
    from sw.models.eval import main
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A Hugging Face directory and the F32 GGUF files exported from it, with and without
    the tokenizer metadata."""
    from sw.models.hf import save_checkpoint
    d = tmp_path_factory.mktemp("exported")
    model = _tiny()
    save_checkpoint(model, d / "hf", tokenizer=hf_tokenizer())
    return {"hf": d / "hf", "gguf": write_gguf(model, d / "m.gguf", qtype="F32"),
            "bare": write_gguf(model, d / "bare.gguf", qtype="F32", tokenizer=False), "dir": d}


def test_eval_compares_a_gguf_with_the_hf_model_it_came_from(exported, capsys):
    # the tokenizers are written down differently (transformers rebuilds the GGUF one from
    # its metadata) but give the same ids: comparable
    a, b = open_model(str(exported["gguf"])), open_model(str(exported["hf"]))
    assert a.tokenizer.to_str() != b.tokenizer.to_str()
    rc, out, err = _eval(["--checkpoint", str(exported["gguf"]), "--reference",
                          str(exported["hf"]), "--json", *EVAL], capsys)
    assert rc == 0, err
    import json
    vs = json.loads(out)["vs_reference"]
    # F32 GGUF: the same weights through the same code, the same logits
    assert vs["top1_agreement"] == 1.0 and vs["mean_kl"] == 0.0


def test_eval_refuses_a_reference_that_gives_other_ids(exported, tmp_path, capsys):
    other = tmp_path / "tokenizer.json"
    hf_tokenizer(regex=False).save(str(other))      # same vocabulary, other split rule
    rc, _, err = _eval(["--checkpoint", str(exported["gguf"]), "--reference",
                        str(exported["hf"]), "--reference-tokenizer", str(other), *EVAL], capsys)
    assert rc == 2
    assert err.count("\n") == 1 and "other ids than --checkpoint" in err
    assert "first difference at token" in err and "cannot be compared" in err
    rc, _, err = _eval(["--checkpoint", str(exported["gguf"]), "--reference", "reference",
                        *EVAL], capsys)
    assert rc == 2 and "its vocabulary has 260 ids, --checkpoint" in err and "261" in err


def test_gguf_without_tokenizer_is_one_line_and_takes_one(exported, capsys):
    bare = str(exported["bare"])
    for argv in (["--checkpoint", bare], ["--checkpoint", str(exported["gguf"]), "--reference",
                                          bare]):
        rc, _, err = _eval([*argv, *EVAL], capsys)
        assert rc == 2 and err.count("\n") == 1, err
        assert f"{bare}: holds no tokenizer" in err and "transformers" not in err
        option = "--tokenizer" if argv[-1] == bare and len(argv) == 2 else \
            "--reference-tokenizer"
        assert f"give one with {option} PATH" in err
    for given in (exported["hf"], exported["hf"] / "tokenizer.json"):
        src = open_model(bare, tokenizer=given)
        assert src.encode("if x:\n    pass") == open_model(str(exported["gguf"])).encode(
            "if x:\n    pass") and f"tokenizer from {given}" in src.note


def test_a_bad_tokenizer_option_names_it(exported, tmp_path):
    bare = str(exported["bare"])
    with pytest.raises(ModelSourceError, match="--tokenizer .*nothing: no such file"):
        open_model(bare, tokenizer=tmp_path / "nothing")
    with pytest.raises(ModelSourceError, match="no tokenizer.json in the directory"):
        open_model(bare, tokenizer=tmp_path)
    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    with pytest.raises(ModelSourceError, match="junk.json: not a tokenizers file"):
        open_model(bare, tokenizer=junk)
    big = tmp_path / "big.json"
    tok = hf_tokenizer()
    tok.add_tokens(["<|extra|>"])                     # id 261: beyond the model's 261 ids
    tok.save(str(big))
    with pytest.raises(ModelSourceError, match="has token ids up to 261, beyond the vocabulary "
                       "of --model .* \\(261 ids\\)"):
        open_model(bare, tokenizer=big)


def test_the_commands_share_the_tokenizer_option(exported, tmp_path, capsys):
    from sw.compress.__main__ import main as compress
    from sw.deploy import DeployOptions, _parser
    args = vars(_parser().parse_args(["--model", "m.gguf", "--tokenizer", "t"]))
    assert DeployOptions(**args).tokenizer == "t"
    out = tmp_path / "c.safetensors"
    assert compress([str(exported["bare"]), "--tokenizer", str(exported["hf"]), "--method",
                     "magnitude", "--pattern", "dense", "--group", "0", "--out", str(out),
                     "--quiet"]) == 0
    assert open_model(str(out)).encode("a  b") == open_model(str(exported["gguf"])).encode("a  b")
    capsys.readouterr()
    assert compress(["--tokenizer", str(exported["hf"]), "--quiet"]) == 2
    assert "--tokenizer" in capsys.readouterr().err


def test_not_llama_architecture(tmp_path):
    path = write_gguf(_tiny(), tmp_path / "m.gguf", arch="gpt2", tokenizer=False)
    with pytest.raises(GGUFError, match="unsupported architecture 'gpt2' \\(only 'llama'\\)"):
        load_gguf(path)


def test_unsupported_tensor_type_and_name(tmp_path):
    path = write_gguf(_tiny(), tmp_path / "a.gguf", tokenizer=False,
                      types={"blk.1.ffn_norm.weight": "F64"})
    with pytest.raises(GGUFError, match="tensor 'blk.1.ffn_norm.weight' has type F64"):
        load_gguf(path)
    path = write_gguf(_tiny(), tmp_path / "b.gguf", tokenizer=False,
                      extra={"blk.0.attn_q.bias": np.zeros(32, np.float32)})
    with pytest.raises(GGUFError, match="unsupported tensor 'blk.0.attn_q.bias'"):
        load_gguf(path)


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(ModelSourceError, match="--model .*nothing.gguf: no such file"):
        open_model(str(tmp_path / "nothing.gguf"))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelSourceError, match="bad.gguf: not a readable GGUF file"):
        open_model(str(bad))


# ---------------------------------------------------------------------- the real file
@pytest.mark.smollm2
def test_smollm2_answers_and_matches_transformers():
    from sw.models.source import smollm2_path

    try:
        path = smollm2_path()
    except ModelSourceError as e:
        pytest.skip(str(e))
    t0 = time.perf_counter()
    src = open_model("smollm2")
    print(f"\nSmolLM2 loaded in {time.perf_counter() - t0:.1f} s")
    cfg = src.model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.intermediate_size, cfg.vocab_size) == (
                30, 576, 9, 3, 1536, 49152)
    assert cfg.tie_word_embeddings and "float baseline is the dequantised Q4_1" in src.note
    prompt = src.chat([{"role": "user", "content": "What is the capital of France?"}])
    out = generate(src.model, prompt, 12, eos_token_id=cfg.eos_token_id)
    answer = src.decode(out[len(prompt):].tolist())
    print(f"answer: {answer!r}")
    assert "Paris" in answer
    if importlib.util.find_spec("accelerate") is None:  # transformers' GGUF loading needs it
        return
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    got, want = src.model.state_dict(), ref.state_dict()
    for name in got:
        assert torch.equal(got[name], want[name]), name   # the same dequantised values
    ids = torch.tensor([prompt])
    with torch.no_grad():
        # identical weights; 30 layers of float32 through other attention kernels: rounding
        # differences (7e-5 measured) on logits of magnitude ~40
        torch.testing.assert_close(src.model(ids), ref(ids).logits, atol=2e-3, rtol=0)
