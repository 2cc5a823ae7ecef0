"""The compressor's one error base: :class:`CompressError` (calibration or second-order
statistics that cannot be used)."""

from __future__ import annotations

__all__ = ["CompressError"]


class CompressError(ValueError):
    """A layer the compressor cannot compress as asked; the message names the layer."""
