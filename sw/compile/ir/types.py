"""Value types of the IR: shapes of integers and the step's symbolic key-position count."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SYMBOL", "TensorType"]

#: The symbolic dimension of a step's key positions (cached + new), resolved per step.
SYMBOL = "S"


@dataclass(frozen=True)
class TensorType:
    """Shape (ints and :data:`SYMBOL`) and dtype (``f32``, ``i64``) of a value.

    Example
    -------
    >>> t = TensorType((1, 4, SYMBOL, 8))
    >>> t.resolve(3), t.numel(3), str(t)
    ((1, 4, 3, 8), 96, 'f32[1, 4, S, 8]')
    """

    shape: tuple[int | str, ...]
    dtype: str = "f32"

    def resolve(self, s: int) -> tuple[int, ...]:
        """The concrete shape for ``S = s``."""
        return tuple(s if d == SYMBOL else d for d in self.shape)

    def numel(self, s: int) -> int:
        """Elements for ``S = s``."""
        n = 1
        for d in self.resolve(s):
            n *= d
        return n

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"
