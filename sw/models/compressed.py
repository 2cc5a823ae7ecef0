"""Save and load compressed models: one self-contained safetensors file, every byte checksummed.

A file written by :func:`save` holds

* per compressed matrix ``name``: the packed weight stream ``name.stream`` (uint8, exactly the
  bytes the accelerator streams) and ``name.row_scale`` (float32);
* every other tensor of the model as it is (embeddings, norms, biases, layers left in float
  such as the head), under its state-dict name;
* the tokenizer: ``tokenizer.json``'s text as the uint8 tensor :data:`TOKENIZER_TENSOR`, or
  the marker ``{"kind": "bytes"}`` for the reference model's byte-level tokens
  (:mod:`sw.models.tokenizer`), plus the chat template;
* one JSON document: format version, the lane count the streams are packed for, per matrix its
  shape and format, the model configuration (:class:`~sw.models.config.LlamaConfig` fields),
  the accelerator configuration (optional), the compression recipe (method, pattern, bits,
  group, calibration) and free-form metadata.

It is written with :func:`sw.artifact.save_artifact`: a SHA-256 covers every tensor and the
document, and the file appears under its name only once complete, so corruption, truncation,
version skew and shape mismatches are all refused on load (:class:`CompressedFileError`).

A file with a model configuration loads back as a model (:func:`to_llama`: the float model
computes with the dequantised compressed weights; :func:`sw.models.source.open_model` wraps it
with its tokenizer) and exports to a Hugging Face directory (:func:`export_hf`). A file of loose
layers (``python -m sw.compress`` on a bare safetensors file) has none.

The format lives in :mod:`sw.models` beside the Hugging Face and GGUF formats: reading a
compressed file needs the model and the weight format, not the compressor, so
:func:`~sw.models.source.open_model` loads one without importing :mod:`sw.compress` (which
writes them and imports this module).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from tokenizers import Tokenizer

from hw.config import AcceleratorConfig
from hw.format import FormatError, QuantizedWeight, WeightFormat, pack, stream_layout, unpack
from sw.artifact import ArtifactError, load_artifact, save_artifact
from sw.models import tokenizer as byte_tok
from sw.models.config import LlamaConfig, ModelConfigError
from sw.models.errors import ModelError
from sw.models.hf import CheckpointError, model_from_state_dict, save_checkpoint

__all__ = ["FORMAT_VERSION", "TOKENIZER_KINDS", "TOKENIZER_TENSOR", "CompressedModel",
           "CompressedFileError", "save", "load", "is_compressed", "from_llama", "to_llama",
           "export_hf", "check_export_dir"]

#: Version 2: self-contained (model config, every tensor, tokenizer, recipe), every byte
#: checksummed with :mod:`sw.artifact`. Version 1 held the compressed matrices only.
FORMAT_VERSION = 2
#: Tokenizer kinds: the reference model's byte-level tokens, or a ``tokenizer.json``.
TOKENIZER_KINDS = ("bytes", "tokenizers")
#: Tensor holding the UTF-8 text of ``tokenizer.json``.
TOKENIZER_TENSOR = "tokenizer.json"
#: Files :func:`export_hf` writes (a directory holding only these may be replaced).
EXPORT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

_KEY = "nmfpga-compressed"
_V1_KEY = "nmfpga"


class CompressedFileError(ModelError):
    """A compressed-model file that cannot be trusted or used: missing, corrupt, truncated,
    of another version, inconsistent, or without what the caller needs."""


@dataclass
class CompressedModel:
    """Compressed matrices, the model's other tensors, and what is needed to run it.

    Attributes
    ----------
    weights : dict
        ``{layer name: QuantizedWeight}`` (module names, e.g.
        ``model.layers.0.self_attn.q_proj``).
    tensors : dict
        Every other tensor, by state-dict name (float32 numpy arrays).
    config : AcceleratorConfig or None
        Accelerator the streams target (optional).
    meta : dict
        Free-form metadata (``source``: what was compressed, ``note``).
    model_config : LlamaConfig or None
        The model's configuration; None for loose layers (then no model can be rebuilt).
    tokenizer : dict or None
        ``{"kind": "bytes"}`` or ``{"kind": "tokenizers", "json": text}``, both with an
        optional ``chat_template``.
    recipe : dict or None
        How the weights were compressed (method, pattern, bits, group, calibration).
    """

    weights: dict[str, QuantizedWeight] = field(default_factory=dict)
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    config: AcceleratorConfig | None = None
    meta: dict = field(default_factory=dict)
    model_config: LlamaConfig | None = None
    tokenizer: dict[str, Any] | None = None
    recipe: dict[str, Any] | None = None


def _tensor_names(weights, tensors) -> set[str]:
    return {f"{n}.{s}" for n in weights for s in ("stream", "row_scale")} | set(tensors)


def save(model: CompressedModel, path: str | Path, lanes: int | None = None) -> Path:
    """Write ``model`` to ``path`` (a ``.safetensors`` file), atomically and checksummed.

    Parameters
    ----------
    model : CompressedModel
        What to write.
    path : str or Path
        Output file; nothing appears under this name unless the write completes.
    lanes : int, optional
        Lanes the streams are packed for (default: the accelerator configuration's, else 64).

    Raises
    ------
    ValueError
        A tensor name that collides with a compressed weight's or the tokenizer's, or a
        tokenizer record of an unknown kind.
    """
    lanes = lanes or (model.config.lanes if model.config else 64)
    tensors: dict[str, np.ndarray] = {}
    entries = {}
    for name, qw in model.weights.items():
        stream = pack(qw, lanes)
        tensors[f"{name}.stream"] = stream
        tensors[f"{name}.row_scale"] = qw.row_scale.astype(np.float32)
        entries[name] = {"shape": list(qw.shape), "format": qw.fmt.to_dict(),
                         "stream_bytes": int(stream.size)}
    for name, t in model.tensors.items():
        if name in tensors or name == TOKENIZER_TENSOR:
            raise ValueError(f"tensor name {name!r} collides with a compressed weight or the "
                             "tokenizer")
        tensors[name] = np.ascontiguousarray(t)
    tok = None
    if model.tokenizer is not None:
        tok = {k: v for k, v in model.tokenizer.items() if k != "json"}
        if tok.get("kind") not in TOKENIZER_KINDS:
            raise ValueError(f"tokenizer kind {tok.get('kind')!r}: choose one of "
                             f"{TOKENIZER_KINDS}")
        if tok["kind"] == "tokenizers":
            text = model.tokenizer["json"].encode("utf-8")
            tensors[TOKENIZER_TENSOR] = np.frombuffer(text, dtype=np.uint8)
    doc = {"version": FORMAT_VERSION, "lanes": lanes, "weights": entries,
           "passthrough": sorted(model.tensors),
           "config": model.config.to_dict() if model.config else None,
           "model_config": model.model_config.to_dict() if model.model_config else None,
           "tokenizer": tok, "recipe": model.recipe, "meta": model.meta}
    return save_artifact(path, _KEY, tensors, doc)


def is_compressed(path: str | Path) -> bool:
    """Whether ``path`` is a safetensors file written by :func:`save` (any version); reads
    the header only, checks nothing else."""
    keys = _header_keys(path)
    return keys is not None and bool(keys & {_KEY, _V1_KEY})


def load(path: str | Path) -> CompressedModel:
    """Read a file written by :func:`save`, verifying every checksum, the version and shapes.

    Matrices come back canonical (:class:`QuantizedWeight`): repack them with
    :func:`hw.format.pack` for any lane count.

    Raises
    ------
    CompressedFileError
        If the file is missing, truncated, corrupted (any byte), of another version, or
        inconsistent; the message starts with the path.
    """
    path = Path(path)
    try:
        tensors, doc = load_artifact(path, _KEY)
    except ArtifactError as e:
        keys = _header_keys(path)
        if keys is not None and _KEY not in keys:
            if _V1_KEY in keys:
                raise CompressedFileError(f"{path}: format version 1, this toolkit reads "
                                          f"version {FORMAT_VERSION} (compress the model "
                                          "again)") from None
            raise CompressedFileError(f"{path}: not a compressed model (written by python -m "
                                      "sw.compress)") from None
        raise CompressedFileError(str(e)) from None
    if doc.get("version") != FORMAT_VERSION:
        raise CompressedFileError(f"{path}: format version {doc.get('version')!r}, this "
                                  f"toolkit reads version {FORMAT_VERSION}")
    try:
        return _from_doc(path, tensors, doc)
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, CompressedFileError):
            raise
        raise CompressedFileError(f"{path}: inconsistent contents ({e!r})") from None


def _header_keys(path: str | Path) -> set[str] | None:
    """The header metadata keys of a safetensors file, or None if it cannot be read."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            return set(f.metadata() or {})
    except (SafetensorError, OSError, ValueError):  # the caller reports why
        return None


def _from_doc(path: Path, tensors: dict[str, np.ndarray], doc: dict) -> CompressedModel:
    stored_lanes = doc["lanes"]
    out = CompressedModel(
        config=AcceleratorConfig.from_dict(doc["config"]) if doc.get("config") else None,
        meta=doc.get("meta") or {}, recipe=doc.get("recipe"))
    expected = _tensor_names(doc["weights"], doc["passthrough"])
    tok = doc.get("tokenizer")
    if tok is not None and tok.get("kind") == "tokenizers":
        expected.add(TOKENIZER_TENSOR)
    if expected != set(tensors):
        raise CompressedFileError(f"{path}: tensors {sorted(expected ^ set(tensors))[:8]} are "
                                  "missing or unexpected")
    for name, e in doc["weights"].items():
        stream, row_scale = tensors[f"{name}.stream"], tensors[f"{name}.row_scale"]
        fmt = WeightFormat.from_dict(e["format"])
        shape = tuple(e["shape"])
        expect = stream_layout(fmt, *shape, stored_lanes).total_bytes
        if stream.size != expect or stream.size != e["stream_bytes"]:
            raise CompressedFileError(f"{path}: {name!r} stream is {stream.size} bytes, "
                                      f"shape {shape} in {fmt.pattern} needs {expect}")
        try:
            out.weights[name] = unpack(stream, fmt, shape, stored_lanes, row_scale)
        except FormatError as err:
            raise CompressedFileError(f"{path}: {name!r}: {err}") from None
    out.tensors = {name: tensors[name] for name in doc["passthrough"]}
    if doc.get("model_config") is not None:
        try:
            out.model_config = LlamaConfig.from_dict(doc["model_config"])
        except (ModelConfigError, TypeError) as e:
            raise CompressedFileError(f"{path}: invalid model configuration: {e}") from None
    if tok is not None:
        if tok.get("kind") not in TOKENIZER_KINDS:
            raise CompressedFileError(f"{path}: unknown tokenizer kind {tok.get('kind')!r}")
        out.tokenizer = dict(tok)
        if tok["kind"] == "tokenizers":
            out.tokenizer["json"] = tensors[TOKENIZER_TENSOR].tobytes().decode("utf-8")
    return out


def from_llama(model: torch.nn.Module, weights: dict[str, QuantizedWeight], *,
               config: AcceleratorConfig | None = None, tokenizer: dict | None = None,
               recipe: dict | None = None, meta: dict | None = None) -> CompressedModel:
    """A self-contained :class:`CompressedModel` of a compressed :class:`LlamaLM`.

    Parameters
    ----------
    model : LlamaLM
        The model ``weights`` were compressed from (its other tensors are stored as they are,
        in float32; a tied head is stored once, as the embedding).
    weights : dict
        ``{layer name: QuantizedWeight}`` from :func:`sw.compress.model.compress_llama`.
    config, tokenizer, recipe, meta
        See :class:`CompressedModel`.

    Raises
    ------
    ValueError
        A weight that names no linear layer of ``model`` or has another shape.
    """
    state = model.state_dict()
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for name, qw in weights.items():
        key = f"{name}.weight"
        if key not in state:
            raise ValueError(f"compressed weight {name!r} is not a layer of the model")
        if tuple(state[key].shape) != qw.shape:
            raise ValueError(f"{name}: layer is {tuple(state[key].shape)}, compressed weight "
                             f"is {qw.shape}")
        del state[key]
    tensors = {k: v.detach().to(torch.float32).cpu().numpy() for k, v in state.items()}
    return CompressedModel(weights=dict(weights), tensors=tensors, config=config,
                           meta=dict(meta or {}), model_config=model.config,
                           tokenizer=tokenizer, recipe=recipe)


def to_llama(cm: CompressedModel, dtype: torch.dtype = torch.float32,
             path: str | Path = "compressed model") -> torch.nn.Module:
    """The :class:`LlamaLM` of ``cm``: its float tensors and the dequantised compressed
    weights (exactly the real values the hardware format stands for).

    Raises
    ------
    CompressedFileError
        ``cm`` holds loose layers without a model configuration, or its tensors do not make
        up the model (named); the message starts with ``path``.
    """
    if cm.model_config is None:
        raise CompressedFileError(f"{path}: holds compressed layers only, no model "
                                  "(compress a model: python -m sw.compress MODEL --out FILE)")
    state = {k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in cm.tensors.items()}
    for name, qw in cm.weights.items():
        state[f"{name}.weight"] = torch.from_numpy(qw.dequantize())
    try:
        return model_from_state_dict(cm.model_config, state, dtype)
    except CheckpointError as e:
        raise CompressedFileError(f"{path}: {e}") from None


def _tokenizer_object(cm: CompressedModel):
    if cm.tokenizer is None:
        return None
    if cm.tokenizer["kind"] == "bytes":
        return byte_tok.build_tokenizer()
    return Tokenizer.from_str(cm.tokenizer["json"])


def _tokenizer_config(cm: CompressedModel, tok) -> dict[str, Any]:
    """``tokenizer_config.json``: the special tokens by name and the chat template."""
    cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                           "clean_up_tokenization_spaces": False, "model_max_length":
                           cm.model_config.max_position_embeddings}
    if cm.tokenizer["kind"] == "bytes":
        cfg.update(bos_token=byte_tok.BOS_TOKEN, eos_token=byte_tok.EOS_TOKEN,
                   pad_token=byte_tok.PAD_TOKEN, unk_token=byte_tok.UNK_TOKEN)
    else:
        mc = cm.model_config
        for key, tid in (("bos_token", mc.bos_token_id), ("eos_token", mc.eos_token_id),
                         ("pad_token", mc.pad_token_id)):
            if tid is not None and tok.id_to_token(tid) is not None:
                cfg[key] = tok.id_to_token(tid)
    if cm.tokenizer.get("chat_template"):
        cfg["chat_template"] = cm.tokenizer["chat_template"]
    return cfg


def check_export_dir(out: str | Path) -> None:
    """Refuse an export destination that exists and is not a directory holding only the
    files :func:`export_hf` writes (which it replaces).

    Raises
    ------
    FileExistsError
        Naming ``out``.
    """
    out = Path(out)
    if out.exists() and not (out.is_dir() and all(p.name in EXPORT_FILES
                                                  for p in out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an exported checkpoint directory "
                              "(choose a new directory)")


def export_hf(cm: CompressedModel, out: str | Path, path: str | Path = "compressed model"
              ) -> Path:
    """Write ``cm`` as a Hugging Face checkpoint directory with the dequantised weights.

    ``config.json`` + ``model.safetensors`` (float32) + ``tokenizer.json`` +
    ``tokenizer_config.json`` (special tokens, chat template):
    :func:`sw.models.hf.load_checkpoint` and transformers' ``from_pretrained`` read it. The
    directory is written whole under a temporary name and renamed into place; an existing
    ``out`` is replaced only if it holds nothing but those files.

    Raises
    ------
    CompressedFileError
        ``cm`` has no model configuration or no tokenizer.
    FileExistsError
        ``out`` exists and is not a directory of exported files.
    """
    out = Path(out)
    check_export_dir(out)
    model = to_llama(cm, path=path)
    if cm.tokenizer is None:
        raise CompressedFileError(f"{path}: holds no tokenizer to export")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tok = _tokenizer_object(cm)
        save_checkpoint(model, tmp, tokenizer=tok)
        (tmp / "tokenizer_config.json").write_text(
            json.dumps(_tokenizer_config(cm, tok), indent=2) + "\n")
        mask = _umask()
        for file in tmp.iterdir():
            file.chmod(0o666 & ~mask)
        tmp.chmod(0o777 & ~mask)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask
