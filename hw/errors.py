"""The hardware contracts' one error base: every value a contract refuses (a configuration,
a weight format or stream, an instruction) raises a :class:`ContractError`."""

from __future__ import annotations

__all__ = ["ContractError"]


class ContractError(ValueError):
    """A value the hardware's contracts refuse; the subclass says which contract, the
    message names the value."""
