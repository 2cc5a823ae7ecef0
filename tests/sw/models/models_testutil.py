"""Tiny random models shared by the sw.models tests."""

from __future__ import annotations

import torch

from sw.models.config import LlamaConfig
from sw.models.llama import LlamaLM


def tiny_config(**overrides) -> LlamaConfig:
    """A small GQA config (4 query heads, 2 kv heads)."""
    fields = dict(
        vocab_size=61,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=1000.0,
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


def tiny_model(seed: int = 0, **overrides) -> LlamaLM:
    """A randomly initialised tiny model in eval mode; norms are randomised too so that
    a wrong norm weight mapping cannot go unnoticed."""
    torch.manual_seed(seed)
    model = LlamaLM(tiny_config(**overrides)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.uniform_(0.5, 1.5)
    return model
