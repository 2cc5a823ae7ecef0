"""Tiny models shared by the compiler, runtime and deploy tests (``tests/sw/conftest.py`` puts
this directory on the import path)."""

import pytest
import torch

from hw.config import AcceleratorConfig, MemoryModel
from hw.format import WeightFormat
from sw.compress.model import compress_llama
from sw.models import LlamaConfig, LlamaLM

#: A small accelerator: 16 lanes, room for the tiny models below.
SMALL = AcceleratorConfig(rows=2, cols=8, memory=MemoryModel(size_bytes=1 << 20))
#: SMALL with a vector engine: 512 int32 elements of VIN, 256 of VOUT.
VSMALL = SMALL.replace(vin_spad_bytes=2048, vout_spad_bytes=1024)
#: VSMALL with 64 KiB of DRAM (the hand-built vector parts of the fusion and move tests).
VTINY = VSMALL.replace(memory=MemoryModel(size_bytes=1 << 16))


def vin_row_bytes(length: int, cfg: AcceleratorConfig = VTINY) -> int:
    """Bytes of a row of ``length`` int32 elements in whole beats of ``cfg``."""
    return -(-4 * length // cfg.beat_bytes) * cfg.beat_bytes


def tiny_lm(layers: int = 2, heads: int = 4, kv_heads: int = 2, hidden: int = 64,
            seed: int = 0, vocab: int = 64, **family) -> LlamaLM:
    """A random LLaMA-style model (grouped-query attention when ``kv_heads < heads``;
    ``family``: e.g. ``model_type="qwen2", qkv_bias=True`` or a ``sliding_window``)."""
    torch.manual_seed(seed)
    return LlamaLM(LlamaConfig(vocab_size=vocab, hidden_size=hidden,
                               intermediate_size=hidden * 3 // 2, num_hidden_layers=layers,
                               num_attention_heads=heads, num_key_value_heads=kv_heads,
                               max_position_embeddings=64, **family))


def compressed(lm: LlamaLM, pattern: str = "2:4", group: int = 32) -> dict:
    """Magnitude N:M + INT4 RTN of every linear but the head (in place)."""
    return compress_llama(lm, WeightFormat(pattern, 4, group), "magnitude", progress=False)



def twin_step_logits(twin: LlamaLM, ids: torch.Tensor, prompt: int) -> list[torch.Tensor]:
    """The logits of a model-level twin run as the runtime runs: the first ``prompt`` tokens in
    one step, then one token per step on its KV cache."""
    cache = twin.new_cache(1, ids.shape[1])
    with torch.no_grad():
        out = [twin(ids[:, :prompt], cache=cache, start_pos=0)]
        for p in range(prompt, ids.shape[1]):
            out.append(twin(ids[:, p:p + 1], cache=cache, start_pos=p))
    return out


def runtime_steps(rt, ids: torch.Tensor, prompt: int) -> list:
    """``rt.step`` over the prompt ``ids[:, :prompt]``, then token by token: each step's
    ``(logits, stats)``."""
    out = [rt.step(ids[:, :prompt])]
    return out + [rt.step(ids[:, p:p + 1]) for p in range(prompt, ids.shape[1])]


def backends_agree(exe, cfg: AcceleratorConfig, ids: torch.Tensor, prompt: int,
                   backends: tuple[str, ...] = ("model", "rtl")) -> list[list]:
    """Run ``exe`` (vector numerics) on each of ``backends`` step by step and assert that
    every step's logits are equal and its programs take the same cycles; returns the runs
    (:func:`runtime_steps` each)."""
    from sim.backends import make_backend
    from sw.runtime import Runtime
    runs = [runtime_steps(Runtime(exe, make_backend(name, cfg), vector=True), ids, prompt)
            for name in backends]
    for steps in zip(*runs, strict=True):
        (a, sa), *rest = steps
        for b, sb in rest:
            assert torch.equal(a, b)
            assert [p.cycles for p in sa.programs] == [p.cycles for p in sb.programs]
    return runs


def reference_decode_steps(mp: pytest.MonkeyPatch, target, name: str, replacement) -> tuple:
    """The reference model's decode step (context 8; real weights: the recipe's format,
    magnitude-compressed, so the logits are not zeros), compiled as it is and then with
    ``target.name`` replaced by ``replacement`` (through ``mp``), each run for one step on the
    fast model. Returns the configuration, the model and ``[(executable, logits, stats)]``
    for the two builds."""
    from hw.config import preset
    from sim.backends import make_backend
    from sw.compile import CompileOptions, compile_model
    from sw.models.recipes import recipe_for
    from sw.models.source import open_model
    from sw.runtime import Runtime

    cfg = preset("vector")
    lm = open_model("reference").model
    weights = compress_llama(lm, recipe_for("reference").uniform_format(), "magnitude",
                             progress=False)
    opts = CompileOptions(prompt_tokens=7, max_context=8, decode_contexts=(8,),
                          phases=("decode",))
    steps = []
    for patched in (False, True):
        if patched:
            mp.setattr(target, name, replacement)
        exe = compile_model(lm, cfg, opts, weights=weights)
        rt = Runtime(exe, make_backend("model", cfg), vector=True)
        rt.seek(7)
        logits, stats = rt.step(torch.tensor([[3]]))
        steps.append((exe, logits, stats))
    return cfg, lm, steps
