"""Where a model comes from: a built-in name or a path, with its tokenizer and its text.

:func:`open_model` is the one entry point the command-line tools use for ``--model``:

* ``reference`` -- the shipped reference model (byte-level tokens, :mod:`sw.models.corpus`);
* a Hugging Face directory (``config.json`` + safetensors + ``tokenizer.json``), LLaMA
  architecture (:mod:`sw.models.hf`).

Each kind is one loader in :data:`LOADERS`; a new kind (a GGUF file, another built-in) is one
more entry. Calibration and evaluation text is the CPython standard library (train and test
splits, disjoint), tokenised with the model's own tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from sw.models import corpus
from sw.models.llama import LlamaLM

__all__ = ["ModelSource", "ModelSourceError", "open_model", "LOADERS", "BUILTINS"]


class ModelSourceError(ValueError):
    """A ``--model`` that names nothing loadable (the message says what was expected)."""


@dataclass
class ModelSource:
    """A loaded model and how to turn text into its tokens and back."""

    name: str
    model: LlamaLM
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    eos_token_id: int | None
    tokens: Callable[[str], np.ndarray]   # a corpus split's token stream
    note: str = ""

    def windows(self, split: str, seq_len: int, max_tokens: int) -> torch.Tensor:
        """Non-overlapping windows ``[n, seq_len + 1]`` of a split (as in
        :func:`sw.models.eval.eval_windows`)."""
        stream = self.tokens(split)
        n = min(max_tokens, stream.size - 1) // seq_len
        if n < 1:
            raise ModelSourceError(f"split {split!r} has too few tokens for a window of "
                                   f"{seq_len}")
        idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
        return torch.from_numpy(stream[idx].astype(np.int64))

    def calibration(self, samples: int, seq_len: int, seed: int = 0) -> torch.Tensor:
        """Random windows ``[samples, seq_len]`` of the train split (seeded)."""
        stream = self.tokens("train")
        gen = torch.Generator().manual_seed(seed)
        starts = torch.randint(0, stream.size - seq_len + 1, (samples,), generator=gen).numpy()
        return torch.from_numpy(stream[starts[:, None] + np.arange(seq_len)].astype(np.int64))


def _reference(spec: str) -> ModelSource:
    from sw.models.reference_model import load_reference
    from sw.models.tokenizer import EOS_ID, decode, encode

    return ModelSource(
        "reference", load_reference(), lambda s: encode(s).astype(int).tolist(), decode,
        EOS_ID, lambda split: corpus.load_split(split),
        "3.0 M-parameter LLaMA-style model trained here on the CPython standard library")


def _hf_directory(spec: str) -> ModelSource:
    from sw.models.hf import CheckpointError, load_checkpoint, load_tokenizer

    try:
        model = load_checkpoint(spec)
        tok = load_tokenizer(spec)
    except (CheckpointError, OSError, ValueError) as e:
        raise ModelSourceError(f"--model {spec}: {e}") from None
    if tok is None:
        raise ModelSourceError(f"--model {spec}: no tokenizer.json in the directory (needed to "
                               "encode prompts and text)")
    cache: dict[str, np.ndarray] = {}

    def tokens(split: str) -> np.ndarray:
        if split not in cache:
            base = corpus.stdlib_root()
            text = "\n".join((base / rel).read_text(errors="replace")
                             for rel in corpus.split_files(split)[:64])
            cache[split] = np.asarray(tok.encode(text).ids, dtype=np.int64)
        return cache[split]

    eos = model.config.eos_token_id
    return ModelSource(str(spec), model, lambda s: tok.encode(s).ids,
                       lambda ids: tok.decode(list(ids)), eos, tokens)


#: Built-in model names.
BUILTINS = {"reference": _reference}


def _kind(spec: str) -> Callable[[str], ModelSource]:
    if spec in BUILTINS:
        return BUILTINS[spec]
    path = Path(spec)
    if path.suffix == ".gguf":
        raise ModelSourceError(f"--model {spec}: GGUF files are not supported yet; give a "
                               "Hugging Face directory or one of " + ", ".join(BUILTINS))
    if path.is_dir():
        return _hf_directory
    raise ModelSourceError(f"--model {spec!r}: not a built-in ({', '.join(BUILTINS)}) and not "
                           "a directory")


#: How each kind of ``--model`` loads: built-ins, Hugging Face directories.
LOADERS = {"builtin": BUILTINS, "hf-directory": _hf_directory}


def open_model(spec: str) -> ModelSource:
    """Load the model ``spec`` names (see the module docstring).

    Raises
    ------
    ModelSourceError
        Unknown name, missing path, unsupported file, or a checkpoint that cannot be loaded.
    """
    return _kind(spec)(spec)
