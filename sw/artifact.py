"""Checksummed artefacts: a safetensors file whose every byte is covered by a SHA-256.

An artefact is a set of named numpy arrays plus one JSON document. The document is stored in
the safetensors header under ``key`` together with the SHA-256 of every tensor and of the
document itself, so a flipped byte anywhere -- tensor data, a tensor's name or shape, the
document -- is caught on load. Files are written to a temporary name in the same directory and
renamed into place, so an interrupted save never leaves a partial file under the real name.

>>> import tempfile, numpy as np
>>> p = tempfile.mkdtemp() + "/a.safetensors"
>>> _ = save_artifact(p, "demo", {"x": np.arange(3, dtype=np.int32)}, {"answer": 42})
>>> t, doc = load_artifact(p, "demo")
>>> int(t["x"].sum()), doc["answer"]
(3, 42)
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

__all__ = ["ArtifactError", "save_artifact", "load_artifact", "read_safetensors", "atomic_write",
           "sha256"]


class ArtifactError(ValueError):
    """A file that cannot be trusted: missing, truncated, corrupted or of another kind."""


def sha256(a: np.ndarray) -> str:
    """SHA-256 of an array's bytes, its dtype and shape."""
    a = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{a.dtype.str}{list(a.shape)}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def _doc_digest(doc: dict) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def atomic_write(path: str | Path, write) -> Path:
    """Call ``write(tmp_path)`` and rename the result to ``path`` (nothing half-written)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give it a normal file's mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def publish(tmp: str | Path, out: str | Path, outputs: Iterable[str] = ()) -> Path:
    """Move the files a command wrote into the directory ``tmp`` to the directory ``out``.

    A new ``out`` is ``tmp`` renamed; into an existing one each file moves by an atomic
    rename, replacing a file of the same name, and of the other files only those named in
    ``outputs`` (what the command can write) are removed, as stale outputs of an earlier run:
    everything else stays (a command's ``--out .`` must not empty the current directory).
    Both get the modes the umask gives new files and directories (``mkdtemp`` makes them
    private)."""
    tmp, out = Path(tmp), Path(out)
    umask = os.umask(0)
    os.umask(umask)
    for file in tmp.iterdir():
        file.chmod(0o666 & ~umask)
    if not out.exists():
        tmp.chmod(0o777 & ~umask)
        tmp.rename(out)
        return out
    if not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory")
    written = {file.name for file in tmp.iterdir()}
    for file in tmp.iterdir():
        os.replace(file, out / file.name)
    for name in set(outputs) - written:
        (out / name).unlink(missing_ok=True)
    tmp.rmdir()
    return out


def read_safetensors(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every tensor and the header metadata of a safetensors file.

    Raises
    ------
    ArtifactError
        Missing, truncated or not a safetensors file.
    """
    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: no such file")
    try:
        tensors = load_file(str(path))
        with safe_open(str(path), framework="numpy") as f:
            header = f.metadata() or {}
    except (SafetensorError, OSError, ValueError) as e:
        raise ArtifactError(f"{path}: truncated or corrupted safetensors file ({e})") from None
    return tensors, header


def save_artifact(path: str | Path, key: str, tensors: dict[str, np.ndarray], doc: dict
                  ) -> Path:
    """Write ``tensors`` and the JSON-serialisable ``doc`` to ``path``, checksummed."""
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    body = {"doc": doc, "sha256": {k: sha256(v) for k, v in tensors.items()}}
    body["digest"] = _doc_digest({"doc": doc, "sha256": body["sha256"]})
    meta = {key: json.dumps(body, sort_keys=True)}
    return atomic_write(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))


def load_artifact(path: str | Path, key: str) -> tuple[dict[str, np.ndarray], dict]:
    """Read a file written by :func:`save_artifact` with the same ``key``; verify every
    checksum. Returns ``(tensors, doc)``.

    Raises
    ------
    ArtifactError
        Missing file, not a safetensors file of this kind, or any checksum mismatch.
    """
    tensors, header = read_safetensors(path)
    if key not in header:
        raise ArtifactError(f"{path}: not a {key} file (no '{key}' metadata)")
    try:
        body = json.loads(header[key])
        doc, sums, digest = body["doc"], body["sha256"], body["digest"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ArtifactError(f"{path}: corrupted metadata ({e!r})") from None
    if _doc_digest({"doc": doc, "sha256": sums}) != digest:
        raise ArtifactError(f"{path}: checksum mismatch in the metadata")
    if set(sums) != set(tensors):
        raise ArtifactError(f"{path}: tensors {sorted(set(sums) ^ set(tensors))} are missing or "
                            "unexpected")
    for name, t in tensors.items():
        if sha256(t) != sums[name]:
            raise ArtifactError(f"{path}: checksum mismatch in tensor {name!r}: the file is "
                                "corrupted")
    return tensors, doc
