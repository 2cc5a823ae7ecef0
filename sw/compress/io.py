"""Save and load compressed models: one safetensors file, self-describing.

The file holds, per compressed matrix ``name``, the packed weight stream ``name.stream`` (uint8,
exactly the bytes the accelerator streams) and ``name.row_scale`` (float32); uncompressed tensors
(embeddings, norms) are stored as they are. The safetensors header metadata carries one JSON
document (key ``nmfpga``) with the format version, the lane count the streams are packed for,
the accelerator configuration (optional), and per matrix its shape, format and a SHA-256 of its
stream, so corruption, truncation, version skew and shape mismatches are caught on load.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from hw.config import AcceleratorConfig
from hw.format import FormatError, QuantizedWeight, WeightFormat, pack, stream_layout, unpack
from sw.artifact import ArtifactError, read_safetensors

__all__ = ["FORMAT_VERSION", "CompressedModel", "CompressedFileError", "save", "load"]

FORMAT_VERSION = 1
_META_KEY = "nmfpga"


class CompressedFileError(ValueError):
    """A compressed-model file that cannot be trusted: corrupt, truncated, wrong version..."""


@dataclass
class CompressedModel:
    """Compressed matrices plus passthrough tensors and free-form metadata."""

    weights: dict[str, QuantizedWeight] = field(default_factory=dict)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    config: AcceleratorConfig | None = None
    meta: dict = field(default_factory=dict)


def _sha256(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def save(model: CompressedModel, path: str | Path, lanes: int | None = None) -> Path:
    """Write ``model`` to ``path`` (a ``.safetensors`` file); streams packed for ``lanes``
    (default: the model's config, else 64)."""
    path = Path(path)
    lanes = lanes or (model.config.lanes if model.config else 64)
    tensors: dict[str, np.ndarray] = {}
    entries = {}
    for name, qw in model.weights.items():
        stream = pack(qw, lanes)
        tensors[f"{name}.stream"] = stream
        tensors[f"{name}.row_scale"] = qw.row_scale.astype(np.float32)
        entries[name] = {"shape": list(qw.shape), "format": qw.fmt.to_dict(),
                         "stream_bytes": int(stream.size), "sha256": _sha256(stream)}
    for name, t in model.tensors.items():
        if name in tensors or f"{name}.stream" in tensors:
            raise ValueError(f"tensor name {name!r} collides with a compressed weight")
        tensors[name] = np.ascontiguousarray(t)
    doc = {"version": FORMAT_VERSION, "lanes": lanes, "weights": entries,
           "passthrough": sorted(model.tensors),
           "config": model.config.to_dict() if model.config else None, "meta": model.meta}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={_META_KEY: json.dumps(doc)})
    return path


def load(path: str | Path) -> CompressedModel:
    """Read a file written by :func:`save`, verifying version, shapes and checksums.

    Matrices come back canonical (:class:`QuantizedWeight`): repack them with
    :func:`hw.format.pack` for any lane count.

    Raises
    ------
    CompressedFileError
        If the file is missing, truncated, corrupted, of another version, or inconsistent.
    """
    path = Path(path)
    try:
        tensors, header = read_safetensors(path)
    except ArtifactError as e:
        raise CompressedFileError(str(e)) from None
    if _META_KEY not in header:
        raise CompressedFileError(f"{path}: not a compressed model (no '{_META_KEY}' metadata)")
    try:
        doc = json.loads(header[_META_KEY])
    except json.JSONDecodeError as e:
        raise CompressedFileError(f"{path}: corrupted metadata ({e})") from None
    if doc.get("version") != FORMAT_VERSION:
        raise CompressedFileError(f"{path}: format version {doc.get('version')!r}, this "
                                  f"toolkit reads version {FORMAT_VERSION}")
    stored_lanes = doc["lanes"]
    out = CompressedModel(
        config=AcceleratorConfig.from_dict(doc["config"]) if doc.get("config") else None,
        meta=doc.get("meta", {}))
    for name, e in doc["weights"].items():
        try:
            stream = tensors[f"{name}.stream"]
            row_scale = tensors[f"{name}.row_scale"]
        except KeyError as k:
            raise CompressedFileError(f"{path}: missing tensor {k}") from None
        if stream.size != e["stream_bytes"] or _sha256(stream) != e["sha256"]:
            raise CompressedFileError(f"{path}: checksum mismatch in {name!r}: the stream is "
                                      f"corrupted")
        fmt = WeightFormat.from_dict(e["format"])
        shape = tuple(e["shape"])
        expect = stream_layout(fmt, *shape, stored_lanes).total_bytes
        if stream.size != expect:
            raise CompressedFileError(f"{path}: {name!r} stream is {stream.size} bytes, "
                                      f"shape {shape} in {fmt.pattern} needs {expect}")
        try:
            qw = unpack(stream, fmt, shape, stored_lanes, row_scale)
        except FormatError as err:
            raise CompressedFileError(f"{path}: {name!r}: {err}") from None
        out.weights[name] = qw
    for name in doc["passthrough"]:
        if name not in tensors:
            raise CompressedFileError(f"{path}: missing tensor {name!r}")
        out.tensors[name] = tensors[name]
    return out
