"""The models package's one error base: :class:`ModelError` (a configuration, checkpoint,
GGUF or compressed file, corpus or model source that cannot be used)."""

from __future__ import annotations

__all__ = ["ModelError"]


class ModelError(ValueError):
    """A model input that cannot be used; the subclass says which kind, the message names
    the file, key or value."""
