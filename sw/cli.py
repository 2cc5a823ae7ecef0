"""What the command-line tools of sw share: the error for bad input, and the option that
gives a model a tokenizer.

``sw.deploy`` and ``sw.compress`` raise :class:`UsageError` for an option value or input that
the user must change, and their ``main`` reports it in one line with exit status 2.
:func:`add_tokenizer_option` is the one definition of ``--tokenizer`` for every command that
loads a model (:func:`sw.models.source.open_model`'s ``tokenizer``).
"""

from __future__ import annotations

import argparse

__all__ = ["UsageError", "add_tokenizer_option"]


class UsageError(ValueError):
    """A bad option value or input of a command (reported in one line, exit status 2)."""


def add_tokenizer_option(parser: argparse.ArgumentParser, model_option: str = "--model",
                         flag: str = "--tokenizer") -> None:
    """Add ``flag PATH`` (default none): the tokenizer of the model ``model_option`` names,
    for a model file that holds none (a GGUF file without tokenizer metadata) or to use
    instead of its own.

    >>> ap = argparse.ArgumentParser()
    >>> add_tokenizer_option(ap)
    >>> ap.parse_args(["--tokenizer", "hf_dir"]).tokenizer
    'hf_dir'
    """
    shown = issubclass(parser.formatter_class, argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument(flag, default=None, metavar="PATH",
                        help=f"tokenizer of {model_option}: a Hugging Face directory with "
                        "tokenizer.json, or a tokenizer.json file; for a model file that holds "
                        "none (a GGUF file without tokenizer metadata) or instead of its own"
                        + ("; none: the model's own" if shown
                           else " (default: the model's own)"))
