"""The demo's end-to-end check on a tiny model: simulator == model-level hardware numerics."""

import numpy as np
import pytest
import torch

from hw.config import AcceleratorConfig, MemoryModel
from hw.format import WeightFormat
from sw.compress.model import compress_llama, use_hardware_numerics
from sw.demo import run_block_on_simulator, storage_table
from sw.models import LlamaConfig, LlamaLM


@pytest.mark.parametrize("pattern, tokens", [("2:4", 5), ("dense", 1), ("1:4", 19)])
def test_block_on_simulator_is_bit_exact(pattern, tokens, tmp_path, monkeypatch):
    monkeypatch.setattr("sw.demo.OUT", tmp_path)
    torch.manual_seed(0)
    model = LlamaLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96,
                                num_hidden_layers=1, num_attention_heads=4,
                                num_key_value_heads=2))
    weights = compress_llama(model, WeightFormat(pattern, 4, 32), "magnitude", progress=False)
    hw = use_hardware_numerics(model, weights)
    cfg = AcceleratorConfig(rows=2, cols=8, memory=MemoryModel(size_bytes=1 << 20))
    prompt = torch.randint(0, 64, (1, tokens))
    sim = run_block_on_simulator(hw, weights, prompt, cfg)
    assert sim["exact"] and sim["result"].ok
    assert sim["trace"].exists()
    table, ratio = storage_table(weights, cfg.lanes)
    assert "all compressed layers" in table and ratio > 1
    assert np.isfinite(ratio)
