"""The text corpora: source code (the Python standard library) and English prose (the Lee corpus).

Two domains, each split into disjoint ``train`` (calibration), ``validation`` and ``test``
(evaluation) parts:

* ``code`` (:data:`CODE`, the default everywhere): the Python standard library's ``.py``
  sources, which every machine that runs this project has without network access.
* ``prose`` (:data:`PROSE`): the Lee Background Corpus, 300 ABC news articles of real English
  prose, and the 50 further articles of the Lee corpus, one article per line, shipped inside
  the PyPI wheel of ``gensim`` (``gensim/test/test_data/lee_background.cor`` and ``lee.cor``).
  ``make setup`` installs it (``pip install --no-deps``); the files are found without importing
  gensim (:func:`prose_dir`). Split by position (:func:`prose_split_of`): the first 150
  background articles are the test split, the next 50 the validation split, the last 100 and
  the 50 ``lee.cor`` articles the train split; exact duplicate articles (7 in the background
  file) are kept once, at their first position. The boundaries fall between the corpus's
  near-duplicate stories (the same news item rewritten), so none straddles two splits.

Code corpus files are
collected deterministically (sorted relative POSIX paths under ``sysconfig``'s stdlib
directory, filtered by fixed rules) and split into train / validation / test *by file*
using a hash of the relative path, so a file's split never depends on which other files
exist. Each split is the byte-level token stream of its files, in sorted order, each file
followed by ``EOS_ID``.

The stdlib's contents depend on the Python version; :func:`corpus_fingerprint` records the
version and hashes of the file list and contents so that evaluation can warn when the
corpus differs from the one a checkpoint was trained on; :func:`prose_fingerprint` identifies
the prose corpus.

Calibration sets (:data:`CALIBRATION_SETS`) are a domain's train split or a mix of both
domains' (``code+prose``): :func:`calibration_mix` draws the windows of each part with
:func:`sample_windows`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import platform
import sysconfig
from collections.abc import Callable
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

#: The two text domains: source code (the default) and English prose.
CODE, PROSE = "code", "prose"
DOMAINS = (CODE, PROSE)
#: Calibration sets: one domain's train split, or both mixed (:func:`calibration_mix`).
CALIBRATION_SETS = (CODE, PROSE, f"{CODE}+{PROSE}")
#: The package whose wheel ships the prose corpus, and its files inside the package.
PROSE_PACKAGE = "gensim"
PROSE_REQUIREMENT = "gensim>=4.3,<5"
PROSE_BACKGROUND = "test/test_data/lee_background.cor"
PROSE_EXTRA = "test/test_data/lee.cor"
#: Split of the background articles by position: [0, 150) test, [150, 200) validation,
#: [200, 300) train (with every lee.cor article).
_PROSE_BOUNDS = (150, 200)


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


@functools.lru_cache(maxsize=16)
def load_split(split: str, root: str | None = None, domain: str = CODE) -> np.ndarray:
    """Byte-level token stream of a split: each file's bytes (code) or each article's UTF-8
    bytes (prose) followed by ``EOS_ID``.

    Parameters
    ----------
    split : str
        ``"train"``, ``"validation"`` or ``"test"``.
    root : str, optional
        Code corpus root; defaults to :func:`stdlib_root`.
    domain : str
        ``"code"`` or ``"prose"`` (:data:`DOMAINS`).

    Returns
    -------
    numpy.ndarray
        Read-only ``uint16`` array (cached; do not modify).
    """
    base = Path(root) if root is not None else stdlib_root()
    pieces = []
    eos = np.array([EOS_ID], dtype=np.uint16)
    if check_domain(domain) == PROSE:
        docs = [t.encode("utf-8") for t in split_texts(split, PROSE)]
    else:
        docs = [(base / rel).read_bytes() for rel in split_files(split, root)]
    for data in docs:
        pieces.append(np.frombuffer(data, dtype=np.uint8).astype(np.uint16))
        pieces.append(eos)
    if not pieces:
        raise CorpusError(f"split {split!r} of the {domain} corpus has no documents"
                          + (f" under {base}" if domain == CODE else ""))
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


# ---------------------------------------------------------------------- prose
def prose_dir() -> Path:
    """Directory of the installed ``gensim`` package, found without importing it (its imports
    need scipy and more, which ``pip install --no-deps`` leaves out).

    Raises
    ------
    CorpusError
        The package is not installed, or the corpus files are missing from it.
    """
    hint = f"`make setup` installs it (pip install --no-deps '{PROSE_REQUIREMENT}')"
    spec = importlib.util.find_spec(PROSE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise CorpusError(f"the prose corpus (the Lee corpus of the {PROSE_PACKAGE} package) "
                          f"is not installed; {hint}")
    base = Path(list(spec.submodule_search_locations)[0])
    for rel in (PROSE_BACKGROUND, PROSE_EXTRA):
        if not (base / rel).is_file():
            raise CorpusError(f"the prose corpus file {base / rel} is missing from the "
                              f"installed {PROSE_PACKAGE}; {hint}")
    return base


def prose_split_of(index: int, extra: bool = False) -> str:
    """Split of a prose article: ``index`` in ``lee_background.cor`` (or in ``lee.cor`` when
    ``extra``, always ``"train"``)."""
    if extra:
        return "train"
    if index < _PROSE_BOUNDS[0]:
        return "test"
    return "validation" if index < _PROSE_BOUNDS[1] else "train"


@functools.lru_cache(maxsize=1)
def prose_articles() -> tuple[tuple[str, str], ...]:
    """Every prose article once, with its split: ``(split, text)`` in file order
    (``lee_background.cor``, then ``lee.cor``).

    The files are Latin-1 (``lee.cor`` has pound signs, byte 0xA3); the text is decoded as
    such. An article equal to an earlier one is left out."""
    base = prose_dir()
    out, seen = [], set()
    for rel, extra in ((PROSE_BACKGROUND, False), (PROSE_EXTRA, True)):
        lines = (base / rel).read_bytes().decode("latin-1").splitlines()
        for i, text in enumerate(lines):
            text = text.strip()
            if text and text not in seen:
                seen.add(text)
                out.append((prose_split_of(i, extra), text))
    return tuple(out)


def split_texts(split: str, domain: str = CODE, root: str | None = None,
                limit: int | None = None) -> list[str]:
    """The documents of a split as text: source files (decoded as UTF-8, errors replaced) or
    prose articles, in corpus order; at most ``limit``."""
    check_domain(domain)
    if split not in SPLITS:
        raise CorpusError(f"unknown split {split!r}; expected one of {SPLITS}")
    if domain == PROSE:
        return [t for s, t in prose_articles() if s == split][:limit]
    base = Path(root) if root is not None else stdlib_root()
    return [(base / rel).read_text(errors="replace") for rel in split_files(split, root)[:limit]]


def check_domain(domain: str, allowed: tuple[str, ...] = DOMAINS) -> str:
    """``domain`` if it is one of ``allowed``; else :class:`CorpusError` naming it."""
    if domain not in allowed:
        raise CorpusError(f"unknown text domain {domain!r}; expected one of {allowed}")
    return domain


@functools.lru_cache(maxsize=1)
def prose_fingerprint() -> dict[str, object]:
    """Identity of the prose corpus: the gensim version, SHA-256 of both files, the article
    count and the tokens (bytes) per split."""
    base = prose_dir()
    content = hashlib.sha256()
    for rel in (PROSE_BACKGROUND, PROSE_EXTRA):
        content.update(rel.encode() + b"\0" + hashlib.sha256((base / rel).read_bytes()).digest())
    try:
        version = importlib.metadata.version(PROSE_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"source": f"Lee corpus ({PROSE_PACKAGE} {version}: {PROSE_BACKGROUND}, "
                      f"{PROSE_EXTRA})",
            "num_articles": len(prose_articles()),
            "content_sha256": content.hexdigest(),
            "split_tokens": {s: int(load_split(s, domain=PROSE).size) for s in SPLITS}}


# ---------------------------------------------------------------------- calibration windows
def sample_windows(stream: np.ndarray, num: int, seq_len: int, seed: int = 0,
                   what: str = "the stream") -> np.ndarray:
    """``num`` windows of ``seq_len`` consecutive tokens of ``stream``, int64 ``[num, seq_len]``.

    Start offsets are drawn uniformly (with replacement) by a ``torch.Generator`` seeded by
    ``seed``, so the same arguments always give the same windows; ``what`` names the stream
    in errors."""
    import torch

    if num < 1 or seq_len < 1:
        raise CorpusError(f"num_samples and seq_len must be positive, got {num} and {seq_len}")
    if stream.size < seq_len:
        raise CorpusError(f"{what} has only {stream.size} tokens; cannot cut sequences of "
                          f"length {seq_len}")
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, stream.size - seq_len + 1, (num,), generator=gen).numpy()
    return stream[starts[:, None] + np.arange(seq_len)[None, :]].astype(np.int64)


def calibration_mix(calib: str, num: int, seq_len: int, seed: int,
                    stream: Callable[[str], np.ndarray], split: str = "train") -> np.ndarray:
    """Calibration windows of a calibration set (:data:`CALIBRATION_SETS`).

    A single domain: ``num`` windows of its stream ``stream(domain)`` (its ``split``, named
    in errors). ``code+prose``: ``ceil(num / 2)`` windows of the code stream, then
    ``floor(num / 2)`` of the prose one, each drawn with ``seed`` (:func:`sample_windows`)."""
    check_domain(calib, CALIBRATION_SETS)
    if num < 1:
        raise CorpusError(f"num_samples and seq_len must be positive, got {num} and {seq_len}")
    parts = calib.split("+")
    counts = [num // len(parts) + (i < num % len(parts)) for i in range(len(parts))]
    return np.concatenate([sample_windows(stream(d), c, seq_len, seed,
                                          f"split {split!r} of the {d} corpus")
                           for d, c in zip(parts, counts, strict=True) if c])


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
