"""Write tiny GGUF files the way llama.cpp's converter does (independently of sw.models.gguf).

The tensor names and the q/k row permutation below are written out from llama.cpp's
``convert_hf_to_gguf.py`` (``LlamaModel.permute``) and ``gguf-py/gguf/tensor_mapping.py``, not
taken from the loader under test, so a wrong name map or a wrong inverse permutation in the
loader shows up as a mismatch.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch

from sw.models.gguf import write_config
from sw.models.llama import LlamaLM
from sw.models.tokenizer import SPECIAL_TOKENS, build_tokenizer

#: Our (Hugging Face) state-dict names -> llama.cpp's GGUF names.
HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
BLOCK = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}

#: A byte-level vocabulary: ids 0-255 are bytes (as the reference tokenizer), then its four
#: special tokens, then one merge ("two spaces").
TOKENS = [build_tokenizer().id_to_token(i) for i in range(256)] + list(SPECIAL_TOKENS) + ["ĠĠ"]
MERGES = ["Ġ Ġ"]
CHAT_TEMPLATE = ("{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}<|eos|>"
                 "{% endfor %}{% if add_generation_prompt %}<|bos|>assistant: {% endif %}")


def gguf_name(hf_name: str) -> str:
    if hf_name in HF_TO_GGUF:
        return HF_TO_GGUF[hf_name]
    _, _, i, rest = hf_name.split(".", 3)           # model.layers.<i>.<module>.weight
    return f"blk.{i}.{BLOCK[rest.removesuffix('.weight')]}.weight"


def llamacpp_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """``LlamaModel.permute`` of llama.cpp's convert_hf_to_gguf.py, verbatim."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def roundtrip(w: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """What a tensor stored as ``qtype`` reads back as (float32)."""
    return np.asarray(gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype),
                      dtype=np.float32).reshape(w.shape)


def write_gguf(model: LlamaLM, path: Path, qtype: str = "Q8_0", arch: str = "llama",
               tokenizer: bool = True, extra: dict[str, np.ndarray] | None = None,
               types: dict[str, str] | None = None) -> Path:
    """Write ``model`` as llama.cpp would: 2-D tensors as ``qtype``, 1-D as F32, q/k rows
    permuted, no ``output.weight`` when the head is tied. ``extra``: more tensors by GGUF
    name; ``types``: GGUF name -> type overriding the defaults."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test")
    write_config(w, cfg)
    if tokenizer:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(TOKENS)
        w.add_token_types([1] * 256 + [3] * len(SPECIAL_TOKENS) + [1])
        w.add_token_merges(MERGES)
        w.add_bos_token_id(256)
        w.add_eos_token_id(257)
        w.add_pad_token_id(258)
        w.add_add_bos_token(False)
        w.add_chat_template(CHAT_TEMPLATE)
    state = model.state_dict()
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight")
    tensors = {}
    for name, t in state.items():
        a = t.detach().float().numpy()
        g = gguf_name(name)
        if g.endswith("attn_q.weight"):
            a = llamacpp_permute(a, cfg.num_attention_heads, cfg.num_attention_heads)
        elif g.endswith("attn_k.weight"):
            a = llamacpp_permute(a, cfg.num_attention_heads, cfg.num_key_value_heads)
        tensors[g] = a
    tensors.update(extra or {})
    for g, a in tensors.items():
        kind = (types or {}).get(g, qtype if a.ndim == 2 else "F32")
        if kind == "F64":
            w.add_tensor(g, a.astype(np.float64))
            continue
        q = gguf.GGMLQuantizationType[kind]
        w.add_tensor(g, gguf.quants.quantize(a, q), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def stored_model(model: LlamaLM, qtype: str) -> LlamaLM:
    """``model`` with every 2-D weight replaced by what ``qtype`` stores (no permutation:
    llama.cpp's quantisation blocks run along rows, which the permutation only reorders)."""
    q = gguf.GGMLQuantizationType[qtype]
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.copy_(torch.from_numpy(roundtrip(p.detach().numpy(), q)))
    return model


def hf_tokenizer(regex: bool = True):
    """The Hugging Face ``tokenizer.json`` a GGUF file written with :func:`write_gguf` came
    from: BPE over :data:`TOKENS` with :data:`MERGES`, GPT-2's byte-level pre-tokenizer
    (``tokenizer.ggml.model = gpt2``) and the special tokens; built by hand, so serialised
    unlike the tokenizer transformers rebuilds from the GGUF metadata. ``regex=False``: the
    same vocabulary without GPT-2's split rule, which gives other ids on indented text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(TOKENS)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in MERGES]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=regex)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))   # ids 256..259, as in TOKENS
    return tok
