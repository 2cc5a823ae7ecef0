"""The reference-training script is deterministic and writes a loadable checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from sw.models import train_reference
from sw.models.hf import load_checkpoint

TINY = ["--hidden", "32", "--intermediate", "48", "--layers", "1", "--heads", "2"]
TINY += ["--kv-heads", "1", "--seq-len", "32", "--batch-size", "4", "--eval-every", "3"]
TINY += ["--warmup", "2"]


@pytest.fixture
def restore_torch_globals():
    deterministic = torch.are_deterministic_algorithms_enabled()
    threads = torch.get_num_threads()
    yield
    torch.use_deterministic_algorithms(deterministic)
    torch.set_num_threads(threads)


def test_training_is_deterministic_and_replayable(tmp_path, restore_torch_globals):
    runs = {
        "a": [*TINY, "--plan", "0:5,4:6"],
        "b": [*TINY, "--plan", "0:5,4:6"],
        "c": [*TINY, "--steps", "6"],
    }
    for name, argv in runs.items():
        assert train_reference.main([*argv, "--out", str(tmp_path / name)]) == 0
    weights = {n: (tmp_path / n / "model.safetensors").read_bytes() for n in runs}
    assert weights["a"] == weights["b"]
    assert weights["a"] != weights["c"]  # a different schedule (total 5 then 6) differs
    meta = json.loads((tmp_path / "a" / "training_meta.json").read_text())
    assert meta["steps"] == 6 and meta["plans"] == [
        {"step": 0, "total": 5},
        {"step": 4, "total": 6},
    ]
    assert meta["reproduce"].endswith("--plan 0:5,4:6")
    assert meta["final"]["test"]["num_tokens"] > 0
    model = load_checkpoint(tmp_path / "a")
    assert model.config.num_hidden_layers == 1 and model.config.max_position_embeddings == 32


def test_plan_argument_is_validated():
    with pytest.raises(SystemExit):
        train_reference.parse_args(["--plan", "3-6"])
    with pytest.raises(SystemExit):
        train_reference.parse_args(["--plan", "0:5", "--steps", "5"])
