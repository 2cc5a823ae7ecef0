"""The reference text corpus: the Python standard library's ``.py`` sources.

Every machine that runs this project has the corpus without network access. Files are
collected deterministically (sorted relative POSIX paths under ``sysconfig``'s stdlib
directory, filtered by fixed rules) and split into train / validation / test *by file*
using a hash of the relative path, so a file's split never depends on which other files
exist. Each split is the byte-level token stream of its files, in sorted order, each file
followed by ``EOS_ID``.

The stdlib's contents depend on the Python version; :func:`corpus_fingerprint` records the
version and hashes of the file list and contents so that evaluation can warn when the
corpus differs from the one a checkpoint was trained on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import sysconfig
from pathlib import Path

import numpy as np

from sw.models.errors import ModelError
from sw.models.tokenizer import EOS_ID

SPLITS = ("train", "validation", "test")
# Out of 100 hash buckets: [0, 90) train, [90, 95) validation, [95, 100) test.
_SPLIT_BOUNDS = (90, 95)
# Directories left out: tests (huge and repetitive), generated codec tables and docs,
# third-party packages, compiled artefacts, machine-specific build config.
_EXCLUDED_DIRS = frozenset(
    {"site-packages", "test", "tests", "idle_test", "__pycache__", "encodings", "pydoc_data"}
)
_MAX_FILE_BYTES = 256 * 1024


class CorpusError(ModelError):
    """The corpus cannot satisfy a request (missing, empty or too short)."""


def stdlib_root() -> Path:
    """Directory of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _included(rel: Path, size: int) -> bool:
    if any(part in _EXCLUDED_DIRS or part.startswith("config-") for part in rel.parts[:-1]):
        return False
    return not rel.name.startswith("_sysconfigdata") and size <= _MAX_FILE_BYTES


@functools.lru_cache(maxsize=4)
def list_files(root: str | None = None) -> tuple[str, ...]:
    """Relative POSIX paths of the corpus files, sorted.

    Parameters
    ----------
    root : str, optional
        Corpus root; defaults to :func:`stdlib_root`.

    Returns
    -------
    tuple of str
        ``.py`` files outside the excluded directories (tests, ``encodings``,
        ``pydoc_data``, ``site-packages``, ...), at most 256 KiB each.
    """
    base = Path(root) if root is not None else stdlib_root()
    if not base.is_dir():
        raise CorpusError(f"corpus root {base} is not a directory")
    rels = []
    for path in base.rglob("*.py"):
        rel = path.relative_to(base)
        if path.is_file() and _included(rel, path.stat().st_size):
            rels.append(rel.as_posix())
    if not rels:
        raise CorpusError(f"no corpus files found under {base}")
    return tuple(sorted(rels))


def split_of(relpath: str) -> str:
    """Split (``"train"``, ``"validation"`` or ``"test"``) of a file, from SHA-256 of its path."""
    bucket = int.from_bytes(hashlib.sha256(relpath.encode("utf-8")).digest()[:8], "big") % 100
    if bucket < _SPLIT_BOUNDS[0]:
        return "train"
    return "validation" if bucket < _SPLIT_BOUNDS[1] else "test"


def split_files(split: str, root: str | None = None) -> tuple[str, ...]:
    """Sorted relative paths of the files in ``split``."""
    if split not in SPLITS:
        raise CorpusError(f"unknown split {split!r}; expected one of {SPLITS}")
    return tuple(p for p in list_files(root) if split_of(p) == split)


@functools.lru_cache(maxsize=8)
def load_split(split: str, root: str | None = None) -> np.ndarray:
    """Token stream of a split: each file's bytes followed by ``EOS_ID``.

    Parameters
    ----------
    split : str
        ``"train"``, ``"validation"`` or ``"test"``.
    root : str, optional
        Corpus root; defaults to :func:`stdlib_root`.

    Returns
    -------
    numpy.ndarray
        Read-only ``uint16`` array (cached; do not modify).
    """
    base = Path(root) if root is not None else stdlib_root()
    pieces = []
    eos = np.array([EOS_ID], dtype=np.uint16)
    for rel in split_files(split, root):
        pieces.append(np.frombuffer((base / rel).read_bytes(), dtype=np.uint8).astype(np.uint16))
        pieces.append(eos)
    if not pieces:
        raise CorpusError(f"split {split!r} has no files under {base}")
    tokens = np.concatenate(pieces)
    tokens.flags.writeable = False
    return tokens


@functools.lru_cache(maxsize=4)
def corpus_fingerprint(root: str | None = None) -> dict[str, object]:
    """Identity of the corpus, stored with checkpoints and compared at evaluation.

    Returns
    -------
    dict
        ``python_version``, ``num_files``, ``file_list_sha256`` (hash of the sorted
        relative paths), ``content_sha256`` (hash of every path and file content) and the
        number of tokens per split.
    """
    base = Path(root) if root is not None else stdlib_root()
    files = list_files(root)
    names = hashlib.sha256("\n".join(files).encode("utf-8")).hexdigest()
    content = hashlib.sha256()
    for rel in files:
        content.update(rel.encode("utf-8") + b"\0")
        content.update(hashlib.sha256((base / rel).read_bytes()).digest())
    return {
        "source": "python stdlib .py sources (sw.models.corpus)",
        "python_version": platform.python_version(),
        "num_files": len(files),
        "file_list_sha256": names,
        "content_sha256": content.hexdigest(),
        "split_tokens": {s: int(load_split(s, root).size) for s in SPLITS},
    }


def fingerprint_mismatches(recorded: dict[str, object], root: str | None = None) -> list[str]:
    """Human-readable differences between a recorded fingerprint and the local corpus.

    An empty list means the local corpus is identical to the recorded one.
    """
    local = corpus_fingerprint(root)
    keys = ("python_version", "file_list_sha256", "content_sha256")
    return [
        f"{k}: recorded {recorded.get(k)!r}, local {local[k]!r}"
        for k in keys
        if recorded.get(k) != local[k]
    ]


def corpus_warnings(checkpoint_dir: str | Path, root: str | None = None) -> list[str]:
    """Differences between the corpus a checkpoint was trained on and the local one.

    Reads ``training_meta.json`` (written by :mod:`sw.models.train_reference`); returns an
    empty list when it matches or when the checkpoint has no such file.
    """
    meta_file = Path(checkpoint_dir) / "training_meta.json"
    if not meta_file.is_file():
        return []
    recorded = json.loads(meta_file.read_text()).get("corpus", {})
    return fingerprint_mismatches(recorded, root)
