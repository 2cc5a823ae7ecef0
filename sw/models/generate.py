"""Token generation with a KV cache: greedy or sampled (temperature, top-k, seeded)."""

from __future__ import annotations

import torch

from sw.models.llama import LlamaLM


def sample_next(
    logits: torch.Tensor,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Choose the next token from last-position logits.

    Parameters
    ----------
    logits : torch.Tensor
        ``[batch, vocab]`` logits.
    temperature : float
        ``0`` selects greedily (argmax); otherwise logits are divided by it before sampling.
    top_k : int, optional
        Sample only among the ``top_k`` most likely tokens.
    generator : torch.Generator, optional
        Source of randomness, for reproducible sampling.

    Returns
    -------
    torch.Tensor
        ``[batch]`` int64 token ids.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits.float() / temperature
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        kth = torch.topk(scaled, min(top_k, scaled.shape[-1]), dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def generate(
    model: LlamaLM,
    prompt: torch.Tensor | list[int],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    eos_token_id: int | None = None,
) -> torch.Tensor:
    """Extend ``prompt`` by up to ``max_new_tokens`` tokens.

    The prompt is processed in one forward pass that fills a fresh :class:`KVCache`; each
    new token then costs one single-position forward.

    Parameters
    ----------
    model : LlamaLM
        The language model.
    prompt : torch.Tensor or list of int
        ``[batch, T]`` or ``[T]`` token ids (``T >= 1``).
    max_new_tokens : int
        Number of tokens to add.
    temperature, top_k, generator
        See :func:`sample_next`; ``temperature=0`` (default) is greedy decoding.
    eos_token_id : int, optional
        Once every sequence has produced it, stop early; finished sequences are padded
        with it.

    Returns
    -------
    torch.Tensor
        Prompt followed by the generated tokens, same rank as ``prompt``.
    """
    ids = torch.as_tensor(prompt, dtype=torch.long, device=model.model.embed_tokens.weight.device)
    squeeze = ids.dim() == 1
    if squeeze:
        ids = ids.unsqueeze(0)
    if ids.shape[1] < 1:
        raise ValueError("prompt must hold at least one token")
    total = ids.shape[1] + max_new_tokens
    if total > model.config.max_position_embeddings:
        raise ValueError(
            f"prompt + max_new_tokens = {total} exceeds max_position_embeddings="
            f"{model.config.max_position_embeddings}"
        )
    was_training = model.training
    model.eval()
    cache = model.new_cache(ids.shape[0], max_len=total)
    out = [ids]
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    logits = model(ids, cache=cache, start_pos=0)[:, -1]
    for i in range(max_new_tokens):
        nxt = sample_next(logits, temperature, top_k, generator)
        if eos_token_id is not None:
            nxt = torch.where(done, torch.full_like(nxt, eos_token_id), nxt)
            done |= nxt == eos_token_id
        out.append(nxt.unsqueeze(1))
        if i == max_new_tokens - 1 or (eos_token_id is not None and bool(done.all())):
            break
        logits = model(nxt.unsqueeze(1), cache=cache, start_pos=ids.shape[1] + i)[:, -1]
    model.train(was_training)
    result = torch.cat(out, dim=1)
    return result.squeeze(0) if squeeze else result
