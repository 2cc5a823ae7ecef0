"""The torch LLaMA model: KV-cache decoding, generation, torch.export, structure."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from models_testutil import tiny_model
from torch import nn

from sw.models.config import LlamaConfig, ModelConfigError
from sw.models.generate import generate, sample_next
from sw.models.llama import rotate_half

MODEL = tiny_model(seed=1)
SEQ = torch.randint(0, 61, (2, 24), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    FULL = MODEL(SEQ)


def _cached_logits(prompt_len: int, chunks: list[int]) -> torch.Tensor:
    """Logits from a prefill of ``prompt_len`` tokens then decode chunks of given sizes."""
    cache = MODEL.new_cache(batch_size=2, max_len=32)
    outs, pos = [], 0
    with torch.no_grad():
        for size in [prompt_len, *chunks]:
            outs.append(MODEL(SEQ[:, pos : pos + size], cache=cache, start_pos=pos))
            pos += size
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize(
    ("prompt_len", "chunks"),
    [(1, [1] * 23), (5, [1] * 19), (12, [4, 4, 4]), (23, [1]), (7, [10, 1, 6]), (24, [])],
)
def test_kv_cache_matches_full_forward(prompt_len, chunks):
    got = _cached_logits(prompt_len, chunks)
    torch.testing.assert_close(got, FULL, atol=1e-5, rtol=0)


@settings(derandomize=True, max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=24))
def test_kv_cache_any_split(sizes):
    # Clip the chunk list so it covers exactly the 24 tokens.
    chunks, total = [], 0
    for s in sizes:
        s = min(s, 24 - total)
        if s:
            chunks.append(s)
            total += s
    if total < 24:
        chunks.append(24 - total)
    got = _cached_logits(chunks[0], chunks[1:])
    torch.testing.assert_close(got, FULL, atol=1e-5, rtol=0)


def test_start_pos_without_cache_is_a_pure_rope_shift():
    # RoPE scores depend only on relative positions, so offsetting a cache-less sequence
    # changes nothing but rounding; this checks start_pos indexes the tables consistently.
    with torch.no_grad():
        a = MODEL(SEQ[:, :8], start_pos=0)
        b = MODEL(SEQ[:, :8], start_pos=5)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_position_limits():
    with pytest.raises(ValueError, match="max_position_embeddings"):
        MODEL(torch.zeros(1, 65, dtype=torch.long))
    cache = MODEL.new_cache(1, max_len=8)
    with pytest.raises(ValueError, match="cache capacity"):
        MODEL(torch.zeros(1, 4, dtype=torch.long), cache=cache, start_pos=6)


def test_greedy_generation_is_deterministic_and_matches_argmax():
    prompt = SEQ[:, :5]
    a = generate(MODEL, prompt, max_new_tokens=12)
    b = generate(MODEL, prompt, max_new_tokens=12)
    assert torch.equal(a, b) and a.shape == (2, 17)
    # Greedy with a cache equals recomputing the full sequence each step.
    ids = prompt
    with torch.no_grad():
        for _ in range(12):
            ids = torch.cat([ids, MODEL(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(a, ids)


def test_sampling_is_seeded_and_top1_is_greedy():
    prompt = [3, 1, 4, 1, 5]

    def sample(seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return generate(MODEL, prompt, 16, temperature=1.0, top_k=10, generator=gen)

    assert torch.equal(sample(7), sample(7))
    assert not torch.equal(sample(7), sample(8))
    top1 = generate(MODEL, prompt, 16, temperature=0.7, top_k=1)
    assert torch.equal(top1, generate(MODEL, prompt, 16))


def test_sample_next_top_k_restricts_support():
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0]]).repeat(200, 1)
    gen = torch.Generator().manual_seed(0)
    picks = sample_next(logits, temperature=5.0, top_k=2, generator=gen)
    assert set(picks.tolist()) == {1, 2}
    with pytest.raises(ValueError, match="temperature"):
        sample_next(logits, temperature=-1.0)


def test_eos_stops_generation():
    greedy = generate(MODEL, [1, 2, 3], 10)
    eos = int(greedy[4])  # the second generated token
    out = generate(MODEL, [1, 2, 3], 10, eos_token_id=eos)
    assert out.tolist()[-1] == eos and len(out) <= 5


def test_every_projection_is_a_plain_linear():
    linears = {n: m for n, m in MODEL.named_modules() if isinstance(m, nn.Linear)}
    assert all(type(m) is nn.Linear and m.bias is None for m in linears.values())
    assert len(linears) == 2 * 7 + 1
    q = MODEL.model.layers[0].self_attn.q_proj
    assert q.weight.shape == (32, 32)  # [out, in]
    assert MODEL.model.layers[0].self_attn.k_proj.weight.shape == (16, 32)


def test_tied_embeddings_share_the_parameter():
    model = tiny_model(tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    untied = tiny_model()
    assert model.num_parameters() == untied.num_parameters() - 61 * 32


def test_rotate_half_convention():
    x = torch.arange(4.0)
    assert rotate_half(x).tolist() == [-2.0, -3.0, 0.0, 1.0]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"hidden_size": 30}, "hidden_size=30 is not divisible by num_attention_heads=4"),
        ({"num_key_value_heads": 3}, "num_attention_heads=4 is not divisible"),
        ({"vocab_size": 0}, "vocab_size must be a positive integer"),
    ],
)
def test_config_validation(fields, message):
    base = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4)
    with pytest.raises(ModelConfigError, match=message):
        LlamaConfig(**{**base, **fields})


def test_torch_export_full_sequence():
    ids = SEQ[:, :16].clone()  # contiguous: a strided view would add stride guards
    seq = torch.export.Dim("seq", min=2, max=64)
    exported = torch.export.export(MODEL, (ids,), dynamic_shapes={"input_ids": {1: seq}})
    with torch.no_grad():
        for n in (16, 24):
            torch.testing.assert_close(exported.module()(SEQ[:, :n]), FULL[:, :n])


class _DecodeStep(nn.Module):
    """A module owning model and cache, as a compiler would export one decode step."""

    def __init__(self) -> None:
        super().__init__()
        self.lm = MODEL
        self.cache = MODEL.new_cache(batch_size=2, max_len=32)

    def forward(self, token: torch.Tensor) -> torch.Tensor:
        return self.lm(token, cache=self.cache, start_pos=8)


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch-internal pytree notice
def test_torch_export_decode_step_mutates_cache_buffers():
    step = _DecodeStep()
    with torch.no_grad():
        step.lm(SEQ[:, :8], cache=step.cache, start_pos=0)
    token = SEQ[:, 8:9].clone()
    # The default export keeps in-place copy_ nodes; the functional (ATen) form lists the
    # cache writes as buffer mutations, which is what a compiler consumes.
    exported = torch.export.export(step, (token,)).run_decompositions()
    assert set(exported.graph_signature.buffers_to_mutate.values()) == {"cache.k", "cache.v"}
    module = exported.module()
    with torch.no_grad():
        module.cache.k.copy_(step.cache.k)
        module.cache.v.copy_(step.cache.v)
        got = module(token)
        want = step(token)
    torch.testing.assert_close(got, FULL[:, 8:9], atol=1e-5, rtol=0)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(module.cache.k, step.cache.k, atol=1e-6, rtol=0)
