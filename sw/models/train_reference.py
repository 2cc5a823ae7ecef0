"""Train the small reference LLaMA-style model on the stdlib corpus and save it.

Usage::

    python -m sw.models.train_reference               # time-budgeted -> sw/models/reference/
    python -m sw.models.train_reference --steps 600   # fixed step count, no timing
    python -m sw.models.train_reference --plan 22:630,200:568,400:541  # replay a schedule

Training is deterministic for a given step count, thread count and corpus: fixed seeds,
a seeded ``torch.Generator`` for batch sampling, ``torch.use_deterministic_algorithms``
and an explicit thread count. Without ``--steps`` the step count is chosen from the
measured speed of the first steps so that the run fits ``--time-budget``; the learning
rate during that measurement (linear warmup) does not depend on the final step count,
so rerunning with ``--steps <recorded steps>`` reproduces the run. If other processes
slow the machine down later, the plan is shrunk at validation checkpoints so the run
still fits its budget; ``training_meta.json`` records the plans and a ``reproduce``
command (``--plan STEP:TOTAL,...``) that replays the same schedule without timing.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shlex
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from hw.cli import OneLineParser, command
from sw.models import corpus
from sw.models.config import LlamaConfig
from sw.models.eval import EvalProtocol, perplexity, unigram_baseline
from sw.models.hf import save_checkpoint
from sw.models.llama import LlamaLM
from sw.models.reference_model import REFERENCE_DIR
from sw.models.tokenizer import (
    BOS_ID,
    BOS_TOKEN,
    EOS_ID,
    EOS_TOKEN,
    PAD_ID,
    PAD_TOKEN,
    UNK_TOKEN,
    VOCAB_SIZE,
    build_tokenizer,
)

# Steps whose speed is measured to plan the run (after two warm-up steps).
_TIMED_STEPS = range(2, 22)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (model shape, optimiser, budget, output)."""
    p = OneLineParser(
        prog="python -m sw.models.train_reference", name="sw.models.train_reference",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", default=str(REFERENCE_DIR), help="output checkpoint directory")
    p.add_argument(
        "--time-budget",
        type=float,
        default=840.0,
        help="wall-clock seconds for the whole run (training + evaluation)",
    )
    p.add_argument("--steps", type=int, help="fixed number of optimiser steps (no planning)")
    p.add_argument(
        "--plan",
        type=_parse_plan,
        help="replay a recorded schedule 'STEP:TOTAL,...' (from training_meta.json) exactly",
    )
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (1: robust to shared cores)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of initialisation and batches")
    p.add_argument("--hidden", type=int, default=256, help="hidden size")
    p.add_argument("--intermediate", type=int, default=688, help="MLP intermediate size")
    p.add_argument("--layers", type=int, default=4, help="decoder blocks")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--kv-heads", type=int, default=2, help="key/value heads")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per training sequence")
    p.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--min-lr-ratio", type=float, default=0.1,
                   help="final learning rate as a fraction of --lr (cosine decay)")
    p.add_argument("--warmup", type=int, default=100, help="linear warmup steps")
    p.add_argument("--weight-decay", type=float, default=0.1, help="AdamW weight decay")
    p.add_argument("--grad-clip", type=float, default=1.0, help="gradient norm clip")
    p.add_argument("--eval-every", type=int, default=200, help="steps between validation checks")
    args = p.parse_args(argv)
    if args.steps is not None and args.plan is not None:
        p.error("--steps and --plan are exclusive")
    if args.steps is None and args.plan is None and args.warmup <= _TIMED_STEPS.stop:
        p.error(f"--warmup must exceed {_TIMED_STEPS.stop} when the step count is planned")
    return args


def _parse_plan(text: str) -> dict[int, int]:
    """``"22:630,200:568"`` -> ``{22: 630, 200: 568}`` (step at which a total took effect)."""
    try:
        pairs = [item.split(":") for item in text.split(",")]
        return {int(step): int(total) for step, total in pairs}
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"bad plan {text!r}; expected STEP:TOTAL,...") from exc


def _steps_that_fit(step: int, rate: float, elapsed: float, budget: float) -> int:
    """Total step count that ends within ``budget`` seconds at ``rate`` steps/s.

    45 s are reserved for the periodic and final evaluations and saving, and a 10% margin
    absorbs load from other processes sharing the cores.
    """
    remaining = budget - elapsed - 45.0
    return step + max(1, int(0.9 * remaining * rate))


def _replay_command(args: argparse.Namespace, plans: list[dict], steps: int) -> str:
    """Command that retrains this run exactly: every hyperparameter plus ``--plan``."""
    skip = {"out", "time_budget", "steps", "plan"}
    cmd = ["python", "-m", "sw.models.train_reference"]
    for key, value in vars(args).items():
        if key not in skip:
            cmd += [f"--{key.replace('_', '-')}", str(value)]
    schedule = ",".join(f"{p['step']}:{p['total']}" for p in plans) or f"0:{steps}"
    return shlex.join([*cmd, "--plan", schedule])


def lr_at(step: int, total: int, args: argparse.Namespace) -> float:
    """Linear warmup to ``lr`` then cosine decay to ``lr * min_lr_ratio`` at ``total``."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = min(1.0, (step - args.warmup) / max(1, total - args.warmup))
    floor = args.lr * args.min_lr_ratio
    return floor + 0.5 * (args.lr - floor) * (1.0 + math.cos(math.pi * progress))


def sample_batch(
    tokens: np.ndarray, batch_size: int, seq_len: int, gen: torch.Generator
) -> torch.Tensor:
    """``[batch, seq_len + 1]`` random windows of the token stream."""
    starts = torch.randint(0, tokens.size - seq_len - 1, (batch_size,), generator=gen).numpy()
    idx = starts[:, None] + np.arange(seq_len + 1)[None, :]
    return torch.from_numpy(tokens[idx].astype(np.int64))


def lm_loss(model: LlamaLM, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of a ``[batch, T + 1]`` window batch."""
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def make_optimizer(model: LlamaLM, args: argparse.Namespace) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norm scales)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": args.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8)


def write_tokenizer_files(out: Path) -> None:
    """``tokenizer.json`` plus a ``tokenizer_config.json`` for ``transformers``."""
    build_tokenizer().save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": UNK_TOKEN,
        "model_max_length": None,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


@command("sw.models.train_reference")
def main(argv: list[str] | None = None) -> int:
    """Train, evaluate and save the reference model; print the final metrics."""
    args = parse_args(argv)
    t0 = time.perf_counter()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)

    fingerprint = corpus.corpus_fingerprint()
    train = corpus.load_split("train")
    print(
        f"corpus: {fingerprint['num_files']} files, split tokens {fingerprint['split_tokens']}, "
        f"python {fingerprint['python_version']}"
    )
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.seq_len,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    model = LlamaLM(config)
    print(f"model: {model.num_parameters():,} parameters, {config}")
    opt = make_optimizer(model, args)
    gen = torch.Generator().manual_seed(args.seed)
    # The standard protocol (256-token windows) unless the model's context is shorter.
    protocol = EvalProtocol(seq_len=min(EvalProtocol.seq_len, args.seq_len))
    val_windows = replace(protocol, split="validation", max_tokens=4096)

    total = args.steps
    bar = tqdm(total=total, desc="train", unit="step", dynamic_ncols=True, mininterval=2.0)
    history: list[dict[str, float]] = []
    replans: list[dict[str, float]] = []
    step, stopped_early = 0, False
    mark_step, mark_time = 0, 0.0  # start of the current speed-measurement interval
    while total is None or step < total:
        now = time.perf_counter()
        if step == _TIMED_STEPS.start:
            mark_step, mark_time = step, now
        timed = args.steps is None and args.plan is None
        if args.plan is not None and step in args.plan:
            total = args.plan[step]
            replans.append({"step": step, "total": total})
            bar.total = total
            bar.refresh()
        planning = timed and total is None and step == _TIMED_STEPS.stop
        replanning = timed and total is not None and step % args.eval_every == 0
        if planning or (replanning and step > mark_step):
            rate = (step - mark_step) / (now - mark_time)
            fit = _steps_that_fit(step, rate, now - t0, args.time_budget)
            if planning or fit < total:  # only ever shrink: the schedule stays monotone
                total = fit
                replans.append({"step": step, "steps_per_s": round(rate, 3), "total": total})
                bar.total = total
                bar.refresh()
                tqdm.write(f"step {step}: {rate:.2f} steps/s -> planned {total} steps")
            mark_step, mark_time = step, now
        if timed and now - t0 > args.time_budget * 1.1:
            stopped_early = True  # hard deadline; the schedule did not finish
            break
        lr = lr_at(step, total or 10**9, args)
        for group in opt.param_groups:
            group["lr"] = lr
        model.train()
        loss = lm_loss(model, sample_batch(train, args.batch_size, args.seq_len, gen))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        step += 1
        bar.update(1)
        postfix = {"loss": f"{loss.item():.3f}", "lr": f"{lr:.2e}"}
        if step % args.eval_every == 0 or step == total:
            model.eval()
            val = perplexity(model, val_windows).nll
            history.append({"step": step, "train_loss": loss.item(), "val_loss": val})
            postfix["val"] = f"{val:.3f}"
        bar.set_postfix(postfix)
    bar.close()
    train_seconds = time.perf_counter() - t0

    model.eval()
    val = perplexity(model, replace(protocol, split="validation"))
    test = perplexity(model, protocol)
    unigram = unigram_baseline(protocol)
    out = Path(args.out)
    save_checkpoint(model, out)
    write_tokenizer_files(out)
    wall = time.perf_counter() - t0
    meta = {
        "command": shlex.join(
            ["python", "-m", "sw.models.train_reference", *(argv or sys.argv[1:])]
        ),
        "hyperparameters": {k: v for k, v in vars(args).items() if k != "out"},
        "steps": step,
        "planned_steps": total,
        "stopped_early": stopped_early,
        # Totals in force from each step on; `reproduce` replays them without timing.
        "plans": replans,
        "reproduce": _replay_command(args, replans, step),
        "tokens_seen": step * args.batch_size * args.seq_len,
        "parameters": model.num_parameters(),
        "config": config.to_dict(),
        "corpus": fingerprint,
        "eval_protocol": asdict(protocol),
        "final": {
            "train_loss_last_step": history[-1]["train_loss"] if history else None,
            "validation": asdict(val),
            "test": asdict(test),
            "test_unigram_baseline": asdict(unigram),
        },
        "history": history,
        "train_seconds": round(train_seconds, 1),
        "wall_seconds": round(wall, 1),
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "threads": args.threads,
            "machine": platform.machine(),
        },
    }
    (out / "training_meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(
        f"done in {wall:.0f} s ({step} steps): validation nll {val.nll:.4f} "
        f"(ppl {val.perplexity:.3f}); test ppl {test.perplexity:.3f} vs unigram "
        f"{unigram.perplexity:.3f}; saved to {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
