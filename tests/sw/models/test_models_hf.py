"""Hugging Face checkpoint loading/saving: logits equal transformers', clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from models_testutil import tiny_model
from safetensors.torch import load_file, save_file

from sw.models.config import ModelConfigError
from sw.models.hf import CheckpointError, load_checkpoint, read_config, save_checkpoint

transformers = pytest.importorskip("transformers")


def _hf_model(tie: bool, kv_heads: int, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=67,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=kv_heads,
        max_position_embeddings=64,
        rope_theta=500.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tie,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # HF initialises norms to one; randomise to test their mapping
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


IDS = torch.randint(0, 67, (2, 33), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(
    ("tie", "kv_heads", "shard"),
    [(False, 2, False), (True, 3, False), (True, 6, False), (False, 1, True)],
    ids=["gqa", "gqa-tied", "mha-tied", "mqa-sharded"],
)
def test_logits_match_transformers(tmp_path, tie, kv_heads, shard):
    ref = _hf_model(tie, kv_heads)
    kwargs = {"max_shard_size": "40KB"} if shard else {}
    ref.save_pretrained(tmp_path, **kwargs)
    assert (tmp_path / "model.safetensors.index.json").is_file() == shard
    model = load_checkpoint(tmp_path)
    assert model.config.tie_word_embeddings == tie
    assert model.config.num_key_value_heads == kv_heads
    with torch.no_grad():
        torch.testing.assert_close(model(IDS), ref(IDS).logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("tie", [False, True])
def test_saved_checkpoint_reads_back_in_transformers(tmp_path, tie):
    model = tiny_model(tie_word_embeddings=tie)
    save_checkpoint(model, tmp_path)
    ref = transformers.LlamaForCausalLM.from_pretrained(tmp_path).eval()
    ids = IDS % 61
    with torch.no_grad():
        torch.testing.assert_close(ref(ids).logits, model(ids), atol=1e-5, rtol=0)
    again = load_checkpoint(tmp_path)
    with torch.no_grad():
        assert torch.equal(again(ids), model(ids))


def test_load_casts_dtype(tmp_path):
    save_checkpoint(tiny_model(), tmp_path, dtype=torch.float16)
    assert load_file(tmp_path / "model.safetensors")["lm_head.weight"].dtype == torch.float16
    assert load_checkpoint(tmp_path).lm_head.weight.dtype == torch.float32
    assert load_checkpoint(tmp_path, dtype=torch.bfloat16).lm_head.weight.dtype == torch.bfloat16


# --- bad input -------------------------------------------------------------------------


@pytest.fixture
def ckpt(tmp_path):
    """A valid tiny checkpoint directory to corrupt."""
    save_checkpoint(tiny_model(), tmp_path)
    return tmp_path


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def test_missing_directory_says_no_network(tmp_path):
    with pytest.raises(FileNotFoundError, match="no network access"):
        load_checkpoint(tmp_path / "nope")


def test_hub_id_is_not_downloaded():
    with pytest.raises(FileNotFoundError, match="no network access.*Hub id"):
        load_checkpoint("meta-llama/Llama-2-7b-hf")


def test_missing_config(ckpt):
    (ckpt / "config.json").unlink()
    with pytest.raises(CheckpointError, match="missing config.json"):
        load_checkpoint(ckpt)


def test_missing_weights(ckpt):
    (ckpt / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="missing weights.*model.safetensors"):
        load_checkpoint(ckpt)


def test_missing_shard(tmp_path):
    _hf_model(False, 2).save_pretrained(tmp_path, max_shard_size="40KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"missing shard {shard.name}"):
        load_checkpoint(tmp_path)


def test_missing_tensor(ckpt):
    state = load_file(ckpt / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match="missing tensors.*layers.1.mlp.up_proj"):
        load_checkpoint(ckpt)


def test_shape_mismatch_names_tensor_and_shapes(ckpt):
    _edit_config(ckpt, intermediate_size=64)
    expected = (
        r"shape mismatch for model\.layers\.0\.mlp\.gate_proj\.weight: checkpoint has "
        r"\(48, 32\), config\.json implies \(64, 32\)"
    )
    with pytest.raises(CheckpointError, match=expected):
        load_checkpoint(ckpt)


def test_non_finite_weights(ckpt):
    state = load_file(ckpt / "model.safetensors")
    state["model.layers.0.self_attn.v_proj.weight"][3, 1] = float("nan")
    save_file(state, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match="v_proj.weight has 1 non-finite"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_type": "gemma"}, "unsupported: model_type='gemma'"),
        ({"model_type": "mistral"}, r"a mistral checkpoint is \['MistralForCausalLM'\]"),
        (
            {"architectures": ["GPT2LMHeadModel"]},
            r"unsupported: architectures=\['GPT2LMHeadModel'\]",
        ),
        ({"hidden_size": 30, "head_dim": None}, "hidden_size=30 is not divisible by num_attention"),
        ({"num_key_value_heads": 3}, "num_attention_heads=4 is not divisible by num_key_value"),
        ({"head_dim": 16}, "head_dim=16"),
        ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "unsupported: rope_scaling"),
        (
            {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}},
            "unsupported: rope_parameters",
        ),
        ({"hidden_act": "gelu"}, "unsupported: hidden_act='gelu'"),
        ({"mlp_bias": True}, "unsupported: mlp_bias"),
        ({"vocab_size": None}, "vocab_size must be a positive integer"),
    ],
)
def test_bad_config(ckpt, changes, message):
    _edit_config(ckpt, **changes)
    with pytest.raises(ModelConfigError, match=message):
        read_config(ckpt)


def test_missing_config_field(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg["num_hidden_layers"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelConfigError, match="missing required field 'num_hidden_layers'"):
        load_checkpoint(ckpt)


def _family(kind: str, seed: int = 0):
    """A tiny random Mistral (sliding window 5, shorter than the test sequence) or Qwen2
    (q/k/v biases) checkpoint from transformers."""
    torch.manual_seed(seed)
    common = dict(vocab_size=67, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
                  rope_theta=500.0, rms_norm_eps=1e-5)
    if kind == "mistral":
        model = transformers.MistralForCausalLM(
            transformers.MistralConfig(**common, sliding_window=5))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            **common, tie_word_embeddings=True, use_sliding_window=False))
    model = model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("kind", ["mistral", "qwen2"])
def test_mistral_and_qwen2_logits_match_transformers(tmp_path, kind):
    """Logits within 1e-5 (the float32 rounding of two implementations of the same math):
    Mistral's window hides all but the last 5 positions of the 33, Qwen2 adds q/k/v biases."""
    ref = _family(kind)
    ref.save_pretrained(tmp_path)
    model = load_checkpoint(tmp_path)
    assert model.config.model_type == kind
    assert (model.config.sliding_window, model.config.qkv_bias) == \
        ((5, False) if kind == "mistral" else (None, True))
    with torch.no_grad():
        torch.testing.assert_close(model(IDS), ref(IDS).logits, atol=1e-5, rtol=0)
        # the cached decode path applies the window the same way
        cache = model.new_cache(2, IDS.shape[1])
        model(IDS[:, :20], cache=cache, start_pos=0)
        step = model(IDS[:, 20:21], cache=cache, start_pos=20)
        torch.testing.assert_close(step[:, 0], ref(IDS[:, :21]).logits[:, -1], atol=1e-5, rtol=0)
    save_checkpoint(model, tmp_path / "again")
    back = type(ref).from_pretrained(tmp_path / "again").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(IDS).logits, ref(IDS).logits, atol=1e-5, rtol=0)
