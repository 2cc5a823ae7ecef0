"""What the command-line tools of sw share: the error for bad input.

``sw.deploy`` and ``sw.compress`` raise :class:`UsageError` for an option value or input that
the user must change, and their ``main`` reports it in one line with exit status 2.
"""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(ValueError):
    """A bad option value or input of a command (reported in one line, exit status 2)."""
