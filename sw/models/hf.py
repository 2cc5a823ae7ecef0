"""Load and save Hugging Face LLaMA-style checkpoints (local directories only).

A checkpoint directory holds ``config.json``, the weights as ``model.safetensors`` or as
shards listed in ``model.safetensors.index.json``, and optionally ``tokenizer.json``.
Nothing here touches the network: a path that is not a local directory is an error, even
if it looks like a Hub id.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tokenizers import Tokenizer

from sw.models.config import LlamaConfig, ModelConfigError
from sw.models.errors import ModelError
from sw.models.llama import LlamaLM

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"

#: model_type -> architecture class of the families we load.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen2": "Qwen2ForCausalLM"}


class CheckpointError(ModelError):
    """A checkpoint directory that is missing files or holds inconsistent tensors."""


def config_from_hf(data: dict[str, Any]) -> LlamaConfig:
    """Translate a Hugging Face ``config.json`` dict into a :class:`LlamaConfig`.

    Parameters
    ----------
    data : dict
        Parsed ``config.json``. Both the transformers 4 layout (``rope_theta``,
        ``rope_scaling``) and the 5 layout (``rope_parameters``) are accepted.

    Returns
    -------
    LlamaConfig

    Raises
    ------
    ModelConfigError
        ``unsupported: model_type=...`` / ``unsupported: architectures=...`` for other
        model families, a message naming the field for missing sizes, unsupported head
        layouts, rope scaling, biases or activations.
    """
    if not isinstance(data, dict):
        raise ModelConfigError(f"config.json must hold an object, got {type(data).__name__}")
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or model_type not in ARCHITECTURES:
        raise ModelConfigError(f"unsupported: model_type={model_type!r} (only "
                               f"{', '.join(map(repr, ARCHITECTURES))})")
    archs = data.get("architectures")
    if archs is not None and list(archs) != [ARCHITECTURES[model_type]]:
        raise ModelConfigError(f"unsupported: architectures={archs!r} (a {model_type} checkpoint "
                               f"is [{ARCHITECTURES[model_type]!r}])")
    required = (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
    )
    for name in required:
        if name not in data:
            raise ModelConfigError(f"config.json is missing required field {name!r}")
    hidden, heads = data["hidden_size"], data["num_attention_heads"]
    kv_heads = data.get("num_key_value_heads") or heads
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        if hidden % heads:
            raise ModelConfigError(
                f"unsupported head layout: hidden_size={hidden} is not divisible by "
                f"num_attention_heads={heads}"
            )
        head_dim = data.get("head_dim")
        if head_dim is not None and head_dim != hidden // heads:
            raise ModelConfigError(
                f"unsupported head layout: head_dim={head_dim} != hidden_size / "
                f"num_attention_heads = {hidden // heads}"
            )
    if data.get("mlp_bias"):
        raise ModelConfigError(f"unsupported: mlp_bias={data['mlp_bias']!r}")
    if model_type == "qwen2":  # q/k/v biases always; a sliding window only when enabled
        qkv_bias, o_bias = True, False
        # transformers slides the window on layers >= max_window_layers
        window = data.get("sliding_window") if data.get("use_sliding_window") else None
        first = data.get("max_window_layers", 0)
        if window is not None and first == data["num_hidden_layers"]:
            window = None
        elif window is not None and first != 0:
            raise ModelConfigError(f"unsupported: use_sliding_window with max_window_layers="
                                   f"{first!r} (a window on some layers only)")
    else:
        qkv_bias = o_bias = bool(data.get("attention_bias", False))
        window = data.get("sliding_window") if model_type == "mistral" else None
    act = data.get("hidden_act", "silu")
    if act != "silu":
        raise ModelConfigError(f"unsupported: hidden_act={act!r} (only 'silu')")
    return LlamaConfig(
        vocab_size=data["vocab_size"],
        hidden_size=hidden,
        intermediate_size=data["intermediate_size"],
        num_hidden_layers=data["num_hidden_layers"],
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        rope_theta=_rope_theta(data),
        rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
        max_position_embeddings=data.get("max_position_embeddings", 2048),
        bos_token_id=_single_id(data.get("bos_token_id")),
        eos_token_id=_single_id(data.get("eos_token_id")),
        pad_token_id=_single_id(data.get("pad_token_id")),
        model_type=model_type,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        sliding_window=window,
    )


def _rope_theta(data: dict[str, Any]) -> float:
    """Rope base from either config layout; any non-default rope type is unsupported."""
    scaling = data.get("rope_scaling")
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
        if kind != "default":
            raise ModelConfigError(f"unsupported: rope_scaling={scaling!r} (only plain RoPE)")
    params = data.get("rope_parameters") or {}
    kind = params.get("rope_type", "default")
    if kind != "default":
        raise ModelConfigError(
            f"unsupported: rope_parameters={params!r} (only rope_type='default')")
    theta = params.get("rope_theta", data.get("rope_theta", 10000.0))
    return float(theta)


def _single_id(value: Any) -> int | None:
    # HF allows a list of eos ids; keep the first, which is what generation stops on first.
    if isinstance(value, list):
        return value[0] if value else None
    return value


def config_to_hf(config: LlamaConfig, dtype: torch.dtype = torch.float32) -> dict[str, Any]:
    """``config.json`` content for ``config``, readable by transformers' config class of
    its family (LLaMA, Mistral, Qwen2)."""
    if config.model_type == "qwen2" and (not config.qkv_bias or config.o_bias):
        raise ModelConfigError("a qwen2 config.json has q/k/v biases and no o_proj bias")
    if config.qkv_bias != config.o_bias and config.model_type != "qwen2":
        raise ModelConfigError(f"{config.model_type} has biases on all four attention projections "
                               "or on none")
    family = {"sliding_window": config.sliding_window} if config.model_type == "mistral" else {}
    if config.model_type == "qwen2":
        family = {"use_sliding_window": config.sliding_window is not None,
                  "sliding_window": config.sliding_window,
                  "max_window_layers": 0 if config.sliding_window else config.num_hidden_layers}
    return {
        **family,
        "architectures": [ARCHITECTURES[config.model_type]],
        "model_type": config.model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rope_scaling": None,
        "attention_bias": config.o_bias,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "initializer_range": 0.02,
        "use_cache": True,
        "dtype": str(dtype).removeprefix("torch."),
    }


def resolve_dir(path: str | Path) -> Path:
    """Return ``path`` as an existing local directory or raise a clear error.

    Raises
    ------
    FileNotFoundError
        If ``path`` is not a local directory; the message says no network access is used
        (Hub ids such as ``meta-llama/Llama-2-7b`` are not downloaded).
    """
    p = Path(path).expanduser()
    if p.is_dir():
        return p
    hint = ""
    text = str(path)
    if not p.is_absolute() and text.count("/") == 1 and not text.startswith("."):
        hint = f" It looks like a Hugging Face Hub id; download {text!r} yourself first."
    raise FileNotFoundError(
        f"checkpoint {text!r} is not a local directory. Only local paths are loaded; no "
        f"network access is used.{hint}"
    )


def read_config(path: str | Path) -> LlamaConfig:
    """Parse ``config.json`` of a checkpoint directory into a :class:`LlamaConfig`."""
    cfg_path = resolve_dir(path) / CONFIG_FILE
    if not cfg_path.is_file():
        raise CheckpointError(f"missing {CONFIG_FILE} in {cfg_path.parent}")
    try:
        data = json.loads(cfg_path.read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {exc}") from None
    return config_from_hf(data)


@contextlib.contextmanager
def _open(file: Path):
    """``safe_open`` whose failures (truncated, corrupted, not safetensors) are
    :class:`CheckpointError` naming the file."""
    try:
        with safe_open(file, "pt") as f:
            yield f
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file.name} is not a readable safetensors file ({e})") from None


def _weight_files(directory: Path) -> dict[str, Path]:
    """Map every tensor name to the safetensors file that should hold it."""
    single = directory / WEIGHTS_FILE
    index = directory / INDEX_FILE
    if single.is_file():
        with _open(single) as f:
            return {name: single for name in f.keys()}
    if index.is_file():
        try:
            doc = json.loads(index.read_bytes().decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{index} is not valid JSON: {e}") from None
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not all(
                isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index} has no 'weight_map' object of file names")
        files = {name: directory / shard for name, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not shard.is_file():
                raise CheckpointError(f"missing shard {shard.name} listed in {INDEX_FILE}")
        return files
    raise CheckpointError(
        f"missing weights in {directory}: expected {WEIGHTS_FILE} or {INDEX_FILE} "
        "(only safetensors checkpoints are supported)"
    )


def expected_shapes(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint tensor name -> shape implied by ``config`` (no memory is allocated)."""
    with torch.device("meta"):
        return {name: tuple(t.shape) for name, t in LlamaLM(config).state_dict().items()}


def _uninitialised_model(config: LlamaConfig) -> LlamaLM:
    """A CPU model with allocated but unset weights: skips random init, which costs
    seconds for billion-parameter checkpoints that are overwritten anyway."""
    with torch.device("meta"):
        model = LlamaLM(config)
    model = model.to_empty(device="cpu")
    if config.tie_word_embeddings:  # to_empty replaces parameters one module at a time
        model.lm_head.weight = model.model.embed_tokens.weight
    model.init_buffers()
    return model


def load_state_dict(path: str | Path, config: LlamaConfig) -> dict[str, torch.Tensor]:
    """Read and check every tensor of a checkpoint against the shapes ``config`` implies.

    Returns
    -------
    dict
        Tensor name -> tensor (original dtype), without ``lm_head.weight`` when the
        embeddings are tied.

    Raises
    ------
    CheckpointError
        Missing or unexpected tensors, a shape mismatch (naming the tensor and both
        shapes) or non-finite values (naming the tensor).
    """
    directory = resolve_dir(path)
    files = _weight_files(directory)
    expected = expected_shapes(config)
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight")
        # Some exporters write the tied head anyway; it must then equal the embedding.
        files_lm_head = files.pop("lm_head.weight", None)
    else:
        files_lm_head = None
    # Old exporters stored the rotary inverse frequencies; they are derived, so skip them.
    files = {k: v for k, v in files.items() if not k.endswith("rotary_emb.inv_freq")}
    missing = sorted(set(expected) - set(files))
    if missing:
        raise CheckpointError(f"checkpoint is missing tensors: {missing[:8]}")
    unexpected = sorted(set(files) - set(expected))
    if unexpected:
        raise CheckpointError(f"checkpoint has unexpected tensors: {unexpected[:8]}")
    state: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    for file, names in sorted(by_file.items()):
        with _open(file) as f:
            present = set(f.keys())
            for name in names:
                if name not in present:
                    raise CheckpointError(f"tensor {name} is not in {file.name}")
                state[name] = f.get_tensor(name)
    for name, shape in expected.items():  # model order, so the first error is stable
        _check_tensor(name, state[name], shape)
    if files_lm_head is not None:
        with _open(files_lm_head) as f:
            head = f.get_tensor("lm_head.weight")
        if not torch.equal(head, state["model.embed_tokens.weight"]):
            raise CheckpointError(
                "tie_word_embeddings=true but lm_head.weight differs from model.embed_tokens.weight"
            )
    return state


def _check_tensor(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != shape:
        raise CheckpointError(
            f"shape mismatch for {name}: checkpoint has {tuple(tensor.shape)}, "
            f"config.json implies {shape}"
        )
    if not tensor.is_floating_point():
        raise CheckpointError(f"tensor {name} has non-floating dtype {tensor.dtype}")
    if not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise CheckpointError(f"tensor {name} has {bad} non-finite values (NaN or inf)")


def load_checkpoint(path: str | Path, dtype: torch.dtype = torch.float32) -> LlamaLM:
    """Load a local Hugging Face LLaMA-style checkpoint directory into :class:`LlamaLM`.

    Parameters
    ----------
    path : str or Path
        Local directory with ``config.json`` and safetensors weights.
    dtype : torch.dtype
        Parameter dtype of the returned model (weights are cast).

    Returns
    -------
    LlamaLM
        The model in eval mode on the CPU.

    Raises
    ------
    FileNotFoundError
        ``path`` is not a local directory (no network access is used).
    ModelConfigError
        Unsupported or invalid ``config.json``.
    CheckpointError
        Missing files, missing/unexpected tensors, shape mismatches, non-finite weights.
    """
    config = read_config(path)
    state = load_state_dict(path, config)
    return model_from_state_dict(config, state, dtype, check=False)


def model_from_state_dict(config: LlamaConfig, state: dict[str, torch.Tensor],
                          dtype: torch.dtype = torch.float32, check: bool = True) -> LlamaLM:
    """A :class:`LlamaLM` holding ``state`` (every parameter; the tied head may be omitted).

    The one place a model is filled from tensors read elsewhere (a checkpoint directory, a
    GGUF file, a compressed model).

    Parameters
    ----------
    config : LlamaConfig
        The model's configuration.
    state : dict
        Parameter name -> floating tensor of the shape ``config`` implies.
    dtype : torch.dtype
        Parameter dtype of the returned model.
    check : bool
        Check names, shapes and finiteness first (:func:`load_state_dict` already did).

    Returns
    -------
    LlamaLM
        The model in eval mode on the CPU.

    Raises
    ------
    CheckpointError
        Missing or unexpected tensors, a shape mismatch or non-finite values (naming the
        tensor).
    """
    if check:
        expected = expected_shapes(config)
        if config.tie_word_embeddings and "lm_head.weight" not in state:
            expected.pop("lm_head.weight")
        missing = sorted(set(expected) - set(state))
        if missing:
            raise CheckpointError(f"missing tensors: {missing[:8]}")
        unexpected = sorted(set(state) - set(expected))
        if unexpected:
            raise CheckpointError(f"unexpected tensors: {unexpected[:8]}")
        for name, shape in expected.items():
            _check_tensor(name, state[name], shape)
    model = _uninitialised_model(config)
    with torch.no_grad():
        params = dict(model.named_parameters(remove_duplicate=False))
        for name, tensor in state.items():
            params[name].copy_(tensor.to(torch.float32))
    return model.to(dtype).eval()


def load_tokenizer(path: str | Path) -> Tokenizer | None:
    """The checkpoint's ``tokenizer.json`` as a ``tokenizers.Tokenizer``, or ``None``."""
    file = resolve_dir(path) / TOKENIZER_FILE
    return Tokenizer.from_file(str(file)) if file.is_file() else None


def save_checkpoint(
    model: LlamaLM,
    path: str | Path,
    tokenizer: Tokenizer | None = None,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write ``model`` as a Hugging Face checkpoint (``config.json`` + ``model.safetensors``).

    Parameters
    ----------
    model : LlamaLM
        Model to save.
    path : str or Path
        Output directory (created if needed; existing files are overwritten).
    tokenizer : tokenizers.Tokenizer, optional
        Also written as ``tokenizer.json``.
    dtype : torch.dtype, optional
        Storage dtype; defaults to the model's parameter dtype.

    Returns
    -------
    Path
        The output directory. ``transformers.LlamaForCausalLM.from_pretrained`` reads it.
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    dtype = dtype or model.lm_head.weight.dtype
    state = {
        name: t.detach().to(dtype).contiguous().cpu() for name, t in model.state_dict().items()
    }
    if model.config.tie_word_embeddings:
        # safetensors refuses shared storage; HF also omits the tied head.
        state.pop("lm_head.weight")
    for name, tensor in state.items():
        if not bool(torch.isfinite(tensor).all()):
            raise CheckpointError(f"refusing to save non-finite tensor {name}")
    save_file(state, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(config_to_hf(model.config, dtype), indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save(str(out / TOKENIZER_FILE))
    return out


def parameter_bytes(path: str | Path) -> int:
    """Total bytes of the safetensors files of a checkpoint directory."""
    directory = resolve_dir(path)
    return sum(f.stat().st_size for f in set(_weight_files(directory).values()))
