"""Every proof of ``make prove``, for one configuration."""

from __future__ import annotations

from hw.config import AcceleratorConfig

from . import dequant, events, fetch, pe
from .flow import Proof

__all__ = ["all_proofs"]


def all_proofs(cfg: AcceleratorConfig) -> list[Proof]:
    """The proofs of every unit, in the order ``make prove`` runs them."""
    return [*pe.proofs(cfg), *dequant.proofs(cfg), *events.proofs(cfg), *fetch.proofs(cfg)]
