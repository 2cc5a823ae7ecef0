"""The trained reference model shipped in ``sw/models/reference/``."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from sw.models.corpus import corpus_warnings
from sw.models.hf import load_checkpoint
from sw.models.llama import LlamaLM

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"


def load_reference(dtype: torch.dtype = torch.float32, check_corpus: bool = True) -> LlamaLM:
    """Load the shipped reference checkpoint (trained by ``python -m sw.models.train_reference``).

    Parameters
    ----------
    dtype : torch.dtype
        Parameter dtype of the returned model.
    check_corpus : bool
        Warn (``UserWarning``) if the local stdlib corpus differs from the one the model
        was trained on, since perplexities are then not comparable to the recorded ones.

    Returns
    -------
    LlamaLM
        The model in eval mode.
    """
    if check_corpus:
        for message in corpus_warnings(REFERENCE_DIR):
            warnings.warn(f"reference corpus differs: {message}", stacklevel=2)
    return load_checkpoint(REFERENCE_DIR, dtype=dtype)
