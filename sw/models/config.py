"""Configuration of the LLaMA-style model (the single source of its hyperparameters)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sw.models.errors import ModelError

#: Model families the implementation reproduces (LLaMA and its close relatives).
MODEL_TYPES = ("llama", "mistral", "qwen2")


class ModelConfigError(ModelError):
    """A model configuration that is invalid or that this implementation does not support.

    Distinct from :class:`hw.config.ConfigError` (an invalid accelerator configuration): both
    are ``ValueError``s, and a handler that means one of them names it.
    """


@dataclass(frozen=True)
class LlamaConfig:
    """Hyperparameters of a LLaMA-style decoder-only transformer.

    Field names follow the Hugging Face ``LlamaConfig`` so the mapping to ``config.json``
    stays obvious.

    Parameters
    ----------
    vocab_size : int
        Number of token ids.
    hidden_size : int
        Model (residual stream) width.
    intermediate_size : int
        Width of the SwiGLU MLP.
    num_hidden_layers : int
        Number of decoder blocks.
    num_attention_heads : int
        Number of query heads.
    num_key_value_heads : int
        Number of key/value heads (grouped-query attention); must divide the query heads.
    rope_theta : float
        Base of the rotary position embedding frequencies.
    rms_norm_eps : float
        Epsilon of RMSNorm.
    tie_word_embeddings : bool
        Whether ``lm_head`` shares its weight with the input embedding.
    max_position_embeddings : int
        Longest sequence the rotary table covers.
    bos_token_id, eos_token_id, pad_token_id : int or None
        Special token ids (metadata only; the model itself does not use them).
    model_type : str
        The family the checkpoint came from: ``llama``, ``mistral`` (LLaMA with a sliding
        window) or ``qwen2`` (LLaMA with q/k/v biases).
    qkv_bias, o_bias : bool
        Biases on the q/k/v projections (Qwen2; LLaMA's ``attention_bias`` sets both) and on
        the output projection.
    sliding_window : int or None
        Each query attends only to the last ``sliding_window`` positions, itself included
        (Mistral); None: to all.
    """

    vocab_size: int = 260
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 256
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    model_type: str = "llama"
    qkv_bias: bool = False
    o_bias: bool = False
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads

    @property
    def num_kv_groups(self) -> int:
        """Query heads per key/value head."""
        return self.num_attention_heads // self.num_key_value_heads

    def validate(self) -> None:
        """Raise :class:`ModelConfigError` naming the first offending field.

        Raises
        ------
        ModelConfigError
            If a size is not a positive integer or the head layout is unsupported.
        """
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ModelConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ModelConfigError(
                f"unsupported head layout: hidden_size={self.hidden_size} is not divisible by "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ModelConfigError(
                f"unsupported head layout: num_attention_heads={self.num_attention_heads} is not "
                f"divisible by num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2:
            raise ModelConfigError(
                f"unsupported head layout: head_dim={self.head_dim} must be even")
        if self.model_type not in MODEL_TYPES:
            raise ModelConfigError(
                f"model_type must be one of {MODEL_TYPES}, got {self.model_type!r}")
        window = self.sliding_window
        if window is not None and (isinstance(window, bool) or not isinstance(window, int)
                                   or window <= 0):
            raise ModelConfigError(f"sliding_window must be a positive integer or None, got "
                                   f"{window!r}")
        if not self.rope_theta > 0:
            raise ModelConfigError(f"rope_theta must be positive, got {self.rope_theta!r}")
        if not self.rms_norm_eps > 0:
            raise ModelConfigError(f"rms_norm_eps must be positive, got {self.rms_norm_eps!r}")

    def to_dict(self) -> dict[str, Any]:
        """Return the fields as a plain JSON-serialisable dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LlamaConfig:
        """Build a config from :meth:`to_dict` output, rejecting unknown keys.

        Raises
        ------
        ModelConfigError
            If ``data`` has keys that are not fields.
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ModelConfigError(f"unknown LlamaConfig fields: {unknown}")
        return cls(**data)

    def save_json(self, path: str | Path) -> None:
        """Write :meth:`to_dict` as JSON to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")
