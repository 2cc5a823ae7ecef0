"""LLaMA-style models in torch: the model, KV cache, generation, HF checkpoint I/O,
the stdlib reference corpus, evaluation and the shipped reference model."""

from sw.models.cache import KVCache
from sw.models.config import LlamaConfig, ModelConfigError
from sw.models.generate import generate, sample_next
from sw.models.hf import CheckpointError, load_checkpoint, load_tokenizer, save_checkpoint
from sw.models.llama import LlamaLM
from sw.models.reference_model import REFERENCE_DIR, load_reference

__all__ = [
    "REFERENCE_DIR",
    "CheckpointError",
    "ModelConfigError",
    "KVCache",
    "LlamaConfig",
    "LlamaLM",
    "generate",
    "load_checkpoint",
    "load_reference",
    "load_tokenizer",
    "sample_next",
    "save_checkpoint",
]
