"""Read LLaMA-family GGUF files (llama.cpp's format) into :class:`~sw.models.llama.LlamaLM`.

Everything is read with the ``gguf`` package (llama.cpp's own reader) and, for the tokenizer,
transformers' GGUF support; nothing touches the network.

* **Config**: ``general.architecture`` must be ``llama``; ``llama.block_count``,
  ``embedding_length``, ``feed_forward_length``, ``attention.head_count``,
  ``attention.head_count_kv``, ``rope.freq_base``, ``attention.layer_norm_rms_epsilon``,
  ``context_length`` and ``vocab_size`` (else the token list's length) become a
  :class:`~sw.models.config.LlamaConfig`; the embeddings are tied when the file has no
  ``output.weight``; BOS / EOS / padding ids come from ``tokenizer.ggml.*``. Mixture-of-experts,
  rope scaling and partial rotary dimensions are refused, naming the key.
* **Tensors** are dequantised to float32 with :func:`gguf.quants.dequantize` (F32, F16, BF16,
  Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, the K-quants, ...); a type it cannot dequantise is refused
  naming the tensor and its type. Names map onto the Hugging Face names :class:`LlamaLM` uses
  (:data:`BLOCK_TENSORS`, :data:`GLOBAL_TENSORS`).
* **Rotary layout**: llama.cpp's converter permutes the rows of every head of ``attn_q`` /
  ``attn_k`` from the Hugging Face "rotate half" layout to interleaved pairs;
  :func:`unpermute_qk` undoes it (as transformers' GGUF loader does), so the model's
  rotary embedding sees Hugging Face-ordered heads.
* **Tokenizer**: ``transformers.AutoTokenizer.from_pretrained(dir, gguf_file=name)`` builds a
  ``tokenizers.Tokenizer`` from ``tokenizer.ggml.*``; the chat template is
  ``tokenizer.chat_template``. A file without that metadata raises
  :class:`GGUFNoTokenizerError` (the commands' ``--tokenizer`` supplies one).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer

from sw.models.config import LlamaConfig, ModelConfigError
from sw.models.errors import ModelError
from sw.models.hf import CheckpointError, expected_shapes, model_from_state_dict
from sw.models.llama import LlamaLM

__all__ = ["ARCHITECTURE", "BLOCK_TENSORS", "GLOBAL_TENSORS", "GGUFError", "GGUFFile",
           "GGUFModel", "GGUFNoTokenizerError", "open_gguf", "read_config", "load_state_dict",
           "read_gguf", "load_gguf",
           "load_gguf_tokenizer", "state_dict_name", "unpermute_qk", "write_config"]

#: The only ``general.architecture`` read.
ARCHITECTURE = "llama"

#: Per-block GGUF tensor ``blk.N.<key>.weight`` -> ``model.layers.N.<value>.weight``.
BLOCK_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}

#: Model-level GGUF tensor ``<key>.weight`` -> ``<value>.weight``.
GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

_BLOCK_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")

#: Longest context read (the model precomputes its rotary tables: 1 GB of float32 at 1M
#: positions and head_dim 128); a larger ``context_length`` is refused as corrupt.
MAX_CONTEXT = 1 << 20


class GGUFError(ModelError):
    """A GGUF file that cannot be read as a LLaMA model (the message names the file and the
    offending key, tensor or type)."""


class GGUFNoTokenizerError(GGUFError):
    """A GGUF file whose metadata holds no tokenizer (no ``tokenizer.ggml.model`` or
    ``tokenizer.ggml.tokens``): the model loads, its text needs a tokenizer from elsewhere."""


@dataclass
class GGUFFile:
    """An opened GGUF file: its path and llama.cpp's reader (tensors memory-mapped)."""

    path: Path
    reader: gguf.GGUFReader

    def field(self, key: str, default: Any = ...) -> Any:
        """The value of metadata ``key`` (a scalar, string or list); ``default`` if absent.

        Raises
        ------
        GGUFError
            ``key`` is absent and no default was given.
        """
        f = self.reader.fields.get(key)
        if f is None:
            if default is ...:
                raise GGUFError(f"{self.path}: missing metadata {key!r}")
            return default
        try:
            return f.contents()
        except (ValueError, IndexError, TypeError) as e:   # e.g. a string that is not UTF-8
            raise GGUFError(f"{self.path}: unreadable metadata {key!r} ({e})") from None

    def number(self, key: str, kind: type, default: Any = ...) -> Any:
        """Metadata ``key`` as ``kind`` (``int`` or ``float``); a per-layer array is accepted
        when every layer has the same value.

        Raises
        ------
        GGUFError
            Absent without a default, differing between layers, or not a number (naming the
            key and the value).
        """
        value = self.field(key, default)
        if isinstance(value, list):
            if not value or any(v != value[0] for v in value):
                raise GGUFError(f"{self.path}: unsupported: {key} differs between layers "
                                f"({value!r})")
            value = value[0]
        if value is None:
            return None
        if isinstance(value, (str, bytes, bool)) or not isinstance(value, (int, float)):
            raise GGUFError(f"{self.path}: metadata {key} = {value!r} is not a number")
        return kind(value)

    def tensor_types(self) -> dict[str, int]:
        """Number of tensors of each GGML type, most frequent first (e.g. ``{'Q4_1': 210}``)."""
        return dict(Counter(t.tensor_type.name for t in self.reader.tensors).most_common())


class _BoundedReader(gguf.GGUFReader):
    """``gguf.GGUFReader`` that refuses reads past the end of the file.

    The reader slices its memory map, so a value past the end reads as an empty array of
    size 0; an array field claiming 2**60 scalars at the end of a truncated file then loops
    for ever without moving (found by ``python -m bench.fuzz``, regression in
    ``tests/fuzz_regressions/gguf_load``). Every read here must return what it asked for.
    """

    def _get(self, offset, dtype, count=1, override_order=None):
        arr = super()._get(offset, dtype, count, override_order)
        if arr.size != int(count):
            raise ValueError(f"truncated: {int(count)} x {np.dtype(dtype).name} at byte "
                             f"{offset} of {len(self.data)}")
        return arr


def open_gguf(path: str | Path) -> GGUFFile:
    """Open a GGUF file with the ``gguf`` package's reader.

    Raises
    ------
    GGUFError
        The file is missing or is not a readable GGUF file.
    """
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"{path}: no such file")
    try:
        reader = _BoundedReader(path)
    except (ValueError, OSError, IndexError, KeyError) as e:
        raise GGUFError(f"{path}: not a readable GGUF file ({e})") from None
    return GGUFFile(path, reader)


def state_dict_name(gguf_name: str) -> str | None:
    """Our state-dict name of a GGUF tensor (``blk.3.attn_q.weight`` ->
    ``model.layers.3.self_attn.q_proj.weight``), or ``None`` if it has none."""
    m = _BLOCK_NAME.fullmatch(gguf_name)
    if m:
        inner = BLOCK_TENSORS.get(m.group(2))
        return f"model.layers.{m.group(1)}.{inner}.weight" if inner else None
    base = gguf_name.removesuffix(".weight")
    if base != gguf_name and base in GLOBAL_TENSORS:
        return f"{GLOBAL_TENSORS[base]}.weight"
    return None


def unpermute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rotary row permutation of a q or k weight ``[n_head * head_dim, in]``.

    llama.cpp's converter stores each head's rows as interleaved pairs ``(0, half, 1,
    half + 1, ...)`` of the Hugging Face "rotate half" order (``reshape(n_head, 2, half, in)
    .swapaxes(1, 2)``); this puts them back (``n_head``: query heads for q, kv heads for k).
    """
    rows = weight.shape[0]
    if rows % (2 * n_head):
        raise GGUFError(f"cannot unpermute {rows} rows into {n_head} heads of even width")
    return (weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def write_config(writer: gguf.GGUFWriter, config: LlamaConfig) -> None:
    """Write ``config`` as the ``llama.*`` metadata :func:`read_config` reads back, with the
    ``gguf`` package's own key writers (tied embeddings are said by leaving out
    ``output.weight``; the tokenizer is the caller's)."""
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_rope_dimension_count(config.head_dim)


def read_config(f: GGUFFile) -> LlamaConfig:
    """The :class:`LlamaConfig` of a LLaMA GGUF file (see the module docstring).

    Raises
    ------
    GGUFError
        Another architecture (named), missing sizes, or an unsupported feature (the key).
    """
    arch = f.field("general.architecture")
    if arch != ARCHITECTURE:
        raise GGUFError(f"{f.path}: unsupported architecture {arch!r} (only {ARCHITECTURE!r})")
    a = ARCHITECTURE
    experts = f.number(f"{a}.expert_count", int, 0)
    if experts:
        raise GGUFError(f"{f.path}: unsupported: {a}.expert_count={experts} (mixture of "
                        "experts)")
    scaling = f.field(f"{a}.rope.scaling.type", "none")
    if scaling != "none":
        raise GGUFError(f"{f.path}: unsupported: {a}.rope.scaling.type={scaling!r} (only plain "
                        "RoPE)")
    names = {t.name for t in f.reader.tensors}
    heads = f.number(f"{a}.attention.head_count", int)
    tokens = f.reader.fields.get("tokenizer.ggml.tokens")
    vocab = f.number(f"{a}.vocab_size", int, len(tokens.data) if tokens is not None else None)
    if vocab is None:
        raise GGUFError(f"{f.path}: missing metadata '{a}.vocab_size' and no token list")
    try:
        config = LlamaConfig(
            vocab_size=vocab,
            hidden_size=f.number(f"{a}.embedding_length", int),
            intermediate_size=f.number(f"{a}.feed_forward_length", int),
            num_hidden_layers=f.number(f"{a}.block_count", int),
            num_attention_heads=heads,
            num_key_value_heads=f.number(f"{a}.attention.head_count_kv", int, heads),
            rope_theta=f.number(f"{a}.rope.freq_base", float, 10000.0),
            rms_norm_eps=f.number(f"{a}.attention.layer_norm_rms_epsilon", float, 1e-5),
            tie_word_embeddings="output.weight" not in names,
            max_position_embeddings=f.number(f"{a}.context_length", int),
            bos_token_id=f.number("tokenizer.ggml.bos_token_id", int, None),
            eos_token_id=f.number("tokenizer.ggml.eos_token_id", int, None),
            pad_token_id=f.number("tokenizer.ggml.padding_token_id", int, None),
        )
    except ModelConfigError as e:
        raise GGUFError(f"{f.path}: {e}") from None
    if config.max_position_embeddings > MAX_CONTEXT:
        raise GGUFError(f"{f.path}: {a}.context_length={config.max_position_embeddings} exceeds "
                        f"{MAX_CONTEXT:,} positions (the rotary tables are precomputed)")
    blocks = {int(m.group(1)) for m in map(_BLOCK_NAME.fullmatch, names) if m}
    n = config.num_hidden_layers
    if len(blocks) != n or max(blocks, default=-1) != n - 1:   # blocks 0 .. n-1, no range(n)
        raise GGUFError(f"{f.path}: {a}.block_count={n} but the file has tensors for "
                        f"{len(blocks)} blocks")
    for key in (f"{a}.rope.dimension_count", f"{a}.attention.key_length",
                f"{a}.attention.value_length"):
        value = f.number(key, int, config.head_dim)
        if value != config.head_dim:
            raise GGUFError(f"{f.path}: unsupported: {key}={value} (head_dim is "
                            f"{config.head_dim})")
    return config


def load_state_dict(f: GGUFFile, config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Every tensor of the file, dequantised to float32, under our state-dict names, q and k
    rows back in Hugging Face order (the tied head is omitted, as in HF checkpoints).

    Raises
    ------
    GGUFError
        A tensor with no counterpart in the model, a type the ``gguf`` package cannot
        dequantise, or a shape that disagrees with the metadata (each naming the tensor).
    """
    expected = expected_shapes(config)
    state: dict[str, torch.Tensor] = {}
    for t in f.reader.tensors:
        name = state_dict_name(t.name)
        if name is None or name not in expected:
            raise GGUFError(f"{f.path}: unsupported tensor {t.name!r} (not part of a "
                            f"{ARCHITECTURE} model with this metadata)")
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise GGUFError(f"{f.path}: tensor {t.name!r} has type {t.tensor_type.name}, which "
                            "the gguf package cannot dequantise") from None
        w = np.asarray(w, dtype=np.float32)
        if w.shape != expected[name]:
            raise GGUFError(f"{f.path}: tensor {t.name!r} has shape {w.shape}, the metadata "
                            f"implies {expected[name]} for {name}")
        if t.name.endswith(".attn_q.weight"):
            w = unpermute_qk(w, config.num_attention_heads)
        elif t.name.endswith(".attn_k.weight"):
            w = unpermute_qk(w, config.num_key_value_heads)
        state[name] = torch.from_numpy(np.array(w, dtype=np.float32))  # own, writable copy
    return state


@dataclass
class GGUFModel:
    """A model read from a GGUF file, with what its file says about it."""

    model: LlamaLM
    name: str                      # general.name, else the file name
    tensor_types: dict[str, int]   # GGML type -> number of tensors
    tokenizer: Tokenizer | None = None
    chat_template: str | None = None

    def baseline_note(self) -> str:
        """Where the float weights come from, e.g. ``float baseline is the dequantised Q4_1
        weights (tensor types Q4_1 x210, F32 x61, Q8_0 x1), not the original float model``."""
        quantised = [t for t in self.tensor_types if t not in ("F32", "F16", "BF16")]
        main = quantised[0] if quantised else next(iter(self.tensor_types), "F32")
        types = ", ".join(f"{t} x{n}" for t, n in self.tensor_types.items())
        return (f"float baseline is the dequantised {main} weights (tensor types {types})"
                + (", not the original float model" if quantised else ""))


def read_gguf(path: str | Path, dtype: torch.dtype = torch.float32,
              tokenizer: bool = True) -> GGUFModel:
    """Load a LLaMA-family GGUF file: the model (weights dequantised) and, if ``tokenizer``,
    its tokenizer and chat template.

    Parameters
    ----------
    path : str or Path
        The ``.gguf`` file.
    dtype : torch.dtype
        Parameter dtype of the model.
    tokenizer : bool
        Also build the tokenizer (:func:`load_gguf_tokenizer`); without it the chat template
        is still read (``tokenizer.chat_template``).

    Returns
    -------
    GGUFModel
        The model is in eval mode on the CPU.

    Raises
    ------
    GGUFNoTokenizerError
        ``tokenizer`` asked for and the file holds no tokenizer metadata.
    GGUFError
        Missing or unreadable file, another architecture, an unsupported tensor or type.
    """
    f = open_gguf(path)
    missing = sorted({"tokenizer.ggml.model", "tokenizer.ggml.tokens"} - set(f.reader.fields))
    if tokenizer and missing:
        raise GGUFNoTokenizerError(f"{f.path}: holds no tokenizer (no metadata "
                                   f"{' or '.join(missing)})")
    config = read_config(f)
    try:
        model = model_from_state_dict(config, load_state_dict(f, config), dtype)
    except CheckpointError as e:
        raise GGUFError(f"{f.path}: {e}") from None
    out = GGUFModel(model, str(f.field("general.name", f.path.name)), f.tensor_types())
    if tokenizer:
        out.tokenizer, out.chat_template = load_gguf_tokenizer(f.path)
    else:
        template = f.field("tokenizer.chat_template", None)
        out.chat_template = template if isinstance(template, str) else None
    return out


def load_gguf(path: str | Path, dtype: torch.dtype = torch.float32) -> LlamaLM:
    """The model of a LLaMA-family GGUF file (:func:`read_gguf` without the tokenizer)."""
    return read_gguf(path, dtype, tokenizer=False).model


def load_gguf_tokenizer(path: str | Path) -> tuple[Tokenizer, str | None]:
    """The tokenizer stored in a GGUF file's metadata and its chat template.

    Built by transformers' GGUF support (``AutoTokenizer.from_pretrained(dir,
    gguf_file=name)``, local files only).

    Returns
    -------
    tuple
        ``(tokenizers.Tokenizer, chat template or None)``.

    Raises
    ------
    GGUFError
        No such file.
    GGUFNoTokenizerError
        A tokenizer transformers cannot build (the message says why).
    """
    from transformers import AutoTokenizer

    path = Path(path).resolve()
    if not path.is_file():
        raise GGUFError(f"{path}: no such file")
    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name,
                                            local_files_only=True)
    except (ValueError, KeyError, OSError) as e:
        raise GGUFNoTokenizerError(f"{path}: cannot build its tokenizer ({e})") from None
    template = tok.chat_template if isinstance(tok.chat_template, str) else None
    return tok.backend_tokenizer, template
