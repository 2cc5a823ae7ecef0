"""What every command of the project shares, from the bottom layer up (hw, sim, sw, bench).

:func:`command` wraps a ``main(argv) -> int``: Ctrl-C ends it with one line, ``PROG:
interrupted``, and exit status 130 instead of a traceback (what a command writes goes through
atomic renames, so nothing is left half-written). :class:`OneLineParser`, the argument parser
of every command, reports a bad option in one line, ``NAME: MESSAGE``, with exit status 2
(argparse's usage block left out), ``NAME`` being the prefix of the command's other errors.
:func:`write_text_atomic` writes a file so that an interrupted run leaves the old one or none,
never half of the new one.

>>> @command("demo")
... def main(argv=None):
...     raise KeyboardInterrupt
>>> main([])
130
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["INTERRUPTED", "OneLineParser", "command", "write_text_atomic"]

#: Exit status of a command ended by Ctrl-C (128 + SIGINT, what a shell reports).
INTERRUPTED = 130


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, ``NAME: MESSAGE``, and exit status 2.

    Parameters
    ----------
    *args, **kwargs
        Those of :class:`argparse.ArgumentParser`.
    name : str, optional
        The prefix of the error line: the name the command's own errors and
        :func:`command` use (``sw.deploy``). Default: ``prog``.

    >>> ap = OneLineParser(prog="python -m demo", name="demo")
    >>> _ = ap.add_argument("--n", type=int)
    >>> import contextlib, io
    >>> err = io.StringIO()
    >>> with contextlib.redirect_stderr(err):
    ...     try:
    ...         ap.parse_args(["--n", "x"])
    ...     except SystemExit as e:
    ...         print(e.code)
    2
    >>> err.getvalue()
    "demo: argument --n: invalid int value: 'x'\\n"
    """

    def __init__(self, *args, name: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.name = name or self.prog

    def error(self, message: str):
        self.exit(2, f"{self.name}: {message}\n")


def command(prog: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Decorate a command's ``main(argv=None) -> int`` to end quietly on Ctrl-C.

    Parameters
    ----------
    prog : str
        The command's name, the prefix of its one line (``python -m sim``).

    Returns
    -------
    Callable
        The decorator: the decorated ``main`` returns :data:`INTERRUPTED` after printing
        ``PROG: interrupted`` to stderr when a :class:`KeyboardInterrupt` reaches it.
    """
    def wrap(main: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(main)
        def run(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except KeyboardInterrupt:
                print(f"{prog}: interrupted", file=sys.stderr, flush=True)
                return INTERRUPTED
        return run
    return wrap


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file beside it that then replaces it
    (creating the directory); returns ``path``. An interruption leaves no partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
