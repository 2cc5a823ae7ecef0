"""The shipped reference checkpoint (sw/models/reference/) loads and still performs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from sw.models import corpus
from sw.models.eval import EvalProtocol, perplexity, unigram_baseline
from sw.models.generate import generate
from sw.models.hf import load_tokenizer, parameter_bytes
from sw.models.reference_model import REFERENCE_DIR, load_reference
from sw.models.tokenizer import EOS_ID, VOCAB_SIZE, decode, encode

# Measured with `python -m sw.models.eval` right after training (Python 3.11.7 stdlib):
# test perplexity 3.654 (1.869 bits/byte) vs unigram 21.389. The margin only absorbs
# floating-point differences between CPUs; a broken model or loader lands far above it.
TEST_PPL_MAX = 3.70

META = json.loads((REFERENCE_DIR / "training_meta.json").read_text())
SAME_CORPUS = corpus.fingerprint_mismatches(META["corpus"]) == []


@pytest.fixture(scope="module")
def reference():
    return load_reference()


def test_reference_files_and_size(reference):
    for name in ("config.json", "model.safetensors", "tokenizer.json", "training_meta.json"):
        assert (REFERENCE_DIR / name).is_file(), name
    assert parameter_bytes(REFERENCE_DIR) < 20 * 2**20
    assert reference.config.vocab_size == VOCAB_SIZE
    assert reference.config.num_key_value_heads < reference.config.num_attention_heads
    assert reference.num_parameters() == META["parameters"]


def test_reference_tokenizer_is_byte_level():
    tok = load_tokenizer(REFERENCE_DIR)
    text = "for i in range(10):\n    print(i)  # é\n"
    assert tok.encode(text).ids == encode(text).tolist()


def test_reference_held_out_perplexity(reference):
    result = perplexity(reference, EvalProtocol())
    unigram = unigram_baseline(EvalProtocol())
    assert result.perplexity < unigram.perplexity / 4
    if not SAME_CORPUS:
        pytest.skip(f"local stdlib differs from the training corpus: {META['corpus']}")
    recorded = META["final"]["test"]["perplexity"]
    assert math.isclose(result.perplexity, recorded, rel_tol=1e-3)
    assert result.perplexity < TEST_PPL_MAX


def test_reference_generates_python(reference):
    prompt = encode("import os\n\n\ndef ").astype("int64").tolist()
    out = generate(reference, prompt, max_new_tokens=48)
    again = generate(reference, prompt, max_new_tokens=48)
    assert torch.equal(out, again)
    text = decode(out[len(prompt) :].tolist())
    assert "(" in text and EOS_ID not in out.tolist()
