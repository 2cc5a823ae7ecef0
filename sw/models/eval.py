"""Evaluation of language models on the reference corpus (fixed, documented protocol).

Protocol (``EvalProtocol`` defaults)
------------------------------------
* Text: the held-out ``test`` split of a domain of :mod:`sw.models.corpus` (``corpus``:
  ``code`` by default, the stdlib files whose path hash falls in the test bucket, in sorted
  path order; or ``prose``, the Lee corpus's test articles), each document followed by
  ``EOS_ID``; byte-level tokens.
* Windows: the first ``max_tokens + 1`` tokens are cut into non-overlapping windows of
  ``seq_len + 1`` tokens sharing one boundary token (window ``i`` covers tokens
  ``[i*seq_len, (i+1)*seq_len]``). Each window is an independent sequence starting at
  position 0; its ``seq_len`` next-token targets are scored, so every token after the
  first is predicted exactly once with 0..seq_len-1 tokens of context.
* Defaults: ``seq_len=256``, ``max_tokens=32768`` (128 windows), which takes a few
  seconds for the reference model on 2 CPU cores.
* Perplexity is ``exp`` of the mean negative log-likelihood (nats) over all targets.
* Comparison of a model against a reference (fp32) model uses the same windows: top-1
  agreement is the fraction of positions whose argmax tokens match; the KL divergence is
  ``KL(p_ref || p_model)`` per position, averaged over positions (nats).
* Unigram baseline: token frequencies of the train split with add-one smoothing, scored
  on the same targets.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hw.cli import OneLineParser, command
from sw.cli import add_tokenizer_option
from sw.models import corpus
from sw.models.reference_model import REFERENCE_DIR
from sw.models.source import BUILTINS, ModelSourceError, open_model
from sw.models.tokenizer import VOCAB_SIZE

LogitsFn = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class EvalProtocol:
    """Windows used for perplexity and model comparison (see the module docstring);
    ``corpus`` is the text domain (:data:`sw.models.corpus.DOMAINS`)."""

    split: str = "test"
    seq_len: int = 256
    max_tokens: int = 32768
    batch_size: int = 16
    corpus: str = corpus.CODE


@dataclass(frozen=True)
class PerplexityResult:
    """Mean next-token loss over the protocol's targets."""

    nll: float
    perplexity: float
    bits_per_token: float
    num_tokens: int


@dataclass(frozen=True)
class ComparisonResult:
    """Agreement of a model's next-token distributions with a reference model's."""

    top1_agreement: float
    mean_kl: float
    max_kl: float
    num_tokens: int


def eval_windows(protocol: EvalProtocol = EvalProtocol(), root: str | None = None) -> torch.Tensor:
    """Token windows of the protocol, ``[num_windows, seq_len + 1]`` int64.

    Raises
    ------
    CorpusError
        If the split holds fewer than ``seq_len + 1`` tokens.
    """
    tokens = corpus.load_split(protocol.split, root, protocol.corpus)
    n = min(protocol.max_tokens, tokens.size - 1) // protocol.seq_len
    if n < 1:
        raise corpus.CorpusError(
            f"split {protocol.split!r} of the {protocol.corpus} corpus has {tokens.size} "
            f"tokens; need at least "
            f"{protocol.seq_len + 1} for one window"
        )
    idx = np.arange(n)[:, None] * protocol.seq_len + np.arange(protocol.seq_len + 1)[None, :]
    return torch.from_numpy(tokens[idx].astype(np.int64))


def _batches(windows: torch.Tensor, batch_size: int, desc: str | None = None):
    """Batches of windows; with ``desc``, a progress bar (stderr) of that name over them."""
    from tqdm.auto import tqdm
    starts = range(0, windows.shape[0], batch_size)
    for start in tqdm(starts, desc=desc, unit="batch", disable=desc is None, leave=False):
        yield windows[start : start + batch_size]


@torch.no_grad()
def perplexity(
    model: LogitsFn | torch.nn.Module,
    protocol: EvalProtocol = EvalProtocol(),
    root: str | None = None,
    windows: torch.Tensor | None = None,
    progress: bool = False,
) -> PerplexityResult:
    """Perplexity of ``model`` under the protocol.

    Parameters
    ----------
    model : callable
        Maps ``input_ids [B, T]`` to logits ``[B, T, V]`` (an ``LlamaLM`` or any wrapper,
        e.g. a compressed model).
    protocol : EvalProtocol
        Windows to score.
    root : str, optional
        Corpus root (defaults to the running Python's stdlib).
    windows : torch.Tensor, optional
        Token windows ``[n, L + 1]`` to score instead of the protocol's (e.g. another
        tokenizer's, :meth:`sw.models.source.ModelSource.windows`); batched as the protocol
        says.
    progress : bool
        Show a progress bar over the batches (stderr).

    Returns
    -------
    PerplexityResult
    """
    if windows is None:
        windows = eval_windows(protocol, root)
    total, count = 0.0, 0
    for batch in _batches(windows, protocol.batch_size, "perplexity" if progress else None):
        logits = model(batch[:, :-1]).float()
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1), reduction="sum"
        )
        total += float(loss)
        count += batch[:, 1:].numel()
    nll = total / count
    return PerplexityResult(nll, math.exp(nll), nll / math.log(2), count)


@torch.no_grad()
def compare(
    model: LogitsFn | torch.nn.Module,
    reference: LogitsFn | torch.nn.Module,
    protocol: EvalProtocol = EvalProtocol(),
    root: str | None = None,
    windows: torch.Tensor | None = None,
    progress: bool = False,
) -> ComparisonResult:
    """Top-1 agreement and KL(reference || model) of next-token distributions.

    Parameters
    ----------
    model, reference : callable
        Map ``input_ids [B, T]`` to logits ``[B, T, V]``; ``reference`` is typically the
        fp32 model ``model`` was derived from.
    protocol : EvalProtocol
        Windows to score (targets are not used, only the inputs).
    root : str, optional
        Corpus root.
    windows : torch.Tensor, optional
        Token windows to compare on instead of the protocol's (as in :func:`perplexity`).
    progress : bool
        Show a progress bar over the batches (stderr).

    Returns
    -------
    ComparisonResult
    """
    if windows is None:
        windows = eval_windows(protocol, root)
    agree, kl_sum, kl_max, count = 0, 0.0, 0.0, 0
    for batch in _batches(windows, protocol.batch_size, "compare" if progress else None):
        inputs = batch[:, :-1]
        ref_logp = F.log_softmax(reference(inputs).double(), dim=-1)
        logp = F.log_softmax(model(inputs).double(), dim=-1)
        kl = (ref_logp.exp() * (ref_logp - logp)).sum(-1)
        agree += int((ref_logp.argmax(-1) == logp.argmax(-1)).sum())
        kl_sum += float(kl.sum())
        kl_max = max(kl_max, float(kl.max()))
        count += inputs.numel()
    return ComparisonResult(agree / count, kl_sum / count, kl_max, count)


def unigram_baseline(
    protocol: EvalProtocol = EvalProtocol(), root: str | None = None
) -> PerplexityResult:
    """Perplexity of the add-one-smoothed train-split unigram model on the protocol targets."""
    return unigram(corpus.load_split("train", root, protocol.corpus), VOCAB_SIZE,
                   eval_windows(protocol, root))


def unigram(train: np.ndarray, vocab_size: int, windows: torch.Tensor) -> PerplexityResult:
    """Add-one-smoothed unigram frequencies of the token stream ``train`` scored on the
    targets of ``windows`` (any tokenizer; :func:`unigram_baseline` on the protocol's)."""
    counts = np.bincount(train, minlength=vocab_size) + 1.0
    logp = np.log(counts / counts.sum())
    targets = windows[:, 1:].numpy().reshape(-1)
    nll = float(-logp[targets].mean())
    return PerplexityResult(nll, math.exp(nll), nll / math.log(2), int(targets.size))


def calibration_samples(
    num_samples: int,
    seq_len: int,
    seed: int = 0,
    split: str = "train",
    root: str | None = None,
    calib: str = corpus.CODE,
) -> torch.Tensor:
    """Random token sequences for calibrating pruning/quantisation (Wanda, SparseGPT, GPTQ).

    Start offsets are drawn uniformly (with replacement) from the split's token stream
    with a ``torch.Generator`` seeded by ``seed``, so the same arguments always return the
    same tensor (:func:`sw.models.corpus.calibration_mix`).

    Parameters
    ----------
    num_samples : int
        Number of sequences ``N``.
    seq_len : int
        Length ``L`` of each sequence.
    seed : int
        Generator seed.
    split : str
        Corpus split; ``"train"`` by default so evaluation data stays unseen.
    root : str, optional
        Code corpus root.
    calib : str
        Calibration set (:data:`sw.models.corpus.CALIBRATION_SETS`): ``code`` (default),
        ``prose`` or ``code+prose`` (half the sequences from each).

    Returns
    -------
    torch.Tensor
        ``[N, L]`` int64 token ids.

    Raises
    ------
    CorpusError
        If the split is shorter than ``seq_len`` tokens or the sizes are not positive.
    """
    return torch.from_numpy(corpus.calibration_mix(
        calib, num_samples, seq_len, seed, lambda d: corpus.load_split(split, root, d), split))


@command("sw.models.eval")
def main(argv: list[str] | None = None) -> int:
    """Command line: perplexity of a model (any ``--model`` spec of
    :func:`sw.models.source.open_model`, a compressed file included), the unigram baseline
    and, optionally, the comparison against a reference model that turns the text into the
    same token ids."""
    d = EvalProtocol()
    parser = OneLineParser(prog="python -m sw.models.eval", name="sw.models.eval",
                           description=__doc__.split("\n")[0])
    kinds = (f"a built-in ({', '.join(BUILTINS)}), a Hugging Face directory, a .gguf file or a "
             "compressed .safetensors written by python -m sw.compress")
    parser.add_argument("--checkpoint", default="reference",
                        help=f"model to evaluate: {kinds} (default: %(default)s)")
    parser.add_argument("--reference", default=None,
                        help="model to compare against (top-1 agreement, KL), same kinds; its "
                        "tokenizer must turn the evaluated text into the same ids (default: "
                        "none)")
    add_tokenizer_option(parser, "--checkpoint")
    add_tokenizer_option(parser, "--reference", flag="--reference-tokenizer")
    parser.add_argument("--split", default=d.split, choices=corpus.SPLITS,
                        help=f"corpus split (default: {d.split})")
    parser.add_argument("--domain", default=d.corpus, choices=corpus.DOMAINS,
                        help=f"text domain: code (the CPython standard library) or prose "
                        f"(the Lee corpus of English news articles) (default: {d.corpus})")
    parser.add_argument("--seq-len", type=int, default=d.seq_len,
                        help=f"tokens per window (default: {d.seq_len})")
    parser.add_argument("--max-tokens", type=int, default=d.max_tokens,
                        help=f"tokens scored at most (default: {d.max_tokens})")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch CPU threads (default: %(default)s)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object (default: a table)")
    args = parser.parse_args(argv)
    for opt in ("seq_len", "max_tokens", "threads"):
        if getattr(args, opt) < 1:
            parser.error(f"--{opt.replace('_', '-')} must be >= 1, got {getattr(args, opt)}")
    torch.set_num_threads(args.threads)
    protocol = EvalProtocol(args.split, args.seq_len, args.max_tokens, corpus=args.domain)
    meta_dir = REFERENCE_DIR if args.checkpoint == "reference" else Path(args.checkpoint)
    if meta_dir.is_dir() and args.domain == corpus.CODE:
        for warning in corpus.corpus_warnings(meta_dir):
            print(f"warning: corpus differs from training: {warning}", file=sys.stderr)
    start = time.perf_counter()
    try:
        src = open_model(args.checkpoint, option="--checkpoint", tokenizer=args.tokenizer)
        ref = (open_model(args.reference, option="--reference", tokenizer=args.reference_tokenizer,
                          tokenizer_option="--reference-tokenizer")
               if args.reference else None)
        context = src.model.config.max_position_embeddings
        if args.seq_len > context:
            raise ModelSourceError(f"--seq-len {args.seq_len} exceeds the model's context of "
                                   f"{context} positions")
        windows = src.windows(args.split, args.seq_len, args.max_tokens, args.domain)
        if ref is not None:
            why = _not_comparable(src, ref, windows, args)
            if why:
                raise ModelSourceError(f"--reference {args.reference}: {why}; they cannot be "
                                       "compared")
        train = src.tokens("train", args.domain)
    except (ModelSourceError, corpus.CorpusError) as e:
        print(f"sw.models.eval: {e}", file=sys.stderr)
        return 2
    result: dict[str, object] = {
        "checkpoint": args.checkpoint,
        "note": src.note,
        "protocol": asdict(protocol),
        "model": asdict(perplexity(src.model, protocol, windows=windows, progress=True)),
        "unigram": asdict(unigram(train, src.model.config.vocab_size, windows)),
    }
    if ref is not None:
        result["vs_reference"] = asdict(compare(src.model, ref.model, protocol,
                                                windows=windows, progress=True))
    result["seconds"] = round(time.perf_counter() - start, 2)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        m, u = result["model"], result["unigram"]
        print(f"{args.checkpoint}: {src.note}" if src.note else args.checkpoint)
        print(f"split={args.split} tokens={m['num_tokens']} seq_len={args.seq_len}")
        for label, r in (("model", m), ("unigram", u)):
            print(
                f"{label:8s}: nll={r['nll']:.4f} ppl={r['perplexity']:.3f} "
                f"bits/token={r['bits_per_token']:.3f}"
            )
        if "vs_reference" in result:
            c = result["vs_reference"]
            print(f"vs ref  : top1={c['top1_agreement']:.4f} mean_kl={c['mean_kl']:.3e}")
        print(f"time    : {result['seconds']} s")
    return 0


def _not_comparable(src, ref, windows: torch.Tensor, args) -> str:
    """Why ``ref`` cannot be scored on ``src``'s evaluation windows ('' if it can): another
    vocabulary size, or a tokenizer that turns the evaluated text into other ids. What is
    compared is the ids themselves, not how the tokenizers are written down: a GGUF file's
    tokenizer, rebuilt from its metadata, is serialised differently from the Hugging Face
    tokenizer.json it came from and gives the same ids."""
    a, b = src.model.config.vocab_size, ref.model.config.vocab_size
    if a != b:
        return f"its vocabulary has {b} ids, --checkpoint {args.checkpoint}'s {a}"
    need = windows.shape[0] * args.seq_len + 1      # the windows cover this stream prefix
    mine, other = src.tokens(args.split)[:need], ref.tokens(args.split)[:need]
    n = min(mine.size, other.size)
    diff = np.flatnonzero(mine[:n] != other[:n])
    if diff.size == 0 and mine.size == other.size:
        return ""
    at = int(diff[0]) if diff.size else n
    where = (f"id {int(mine[at])} vs {int(other[at])}" if at < n
             else f"{mine.size:,} vs {other.size:,} tokens")
    return (f"its tokenizer turns the {args.split} split into other ids than --checkpoint "
            f"{args.checkpoint}'s (first difference at token {at:,} of the {need:,} "
            f"evaluated: {where})")


if __name__ == "__main__":
    raise SystemExit(main())
