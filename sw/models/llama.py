"""A LLaMA-style decoder-only transformer in plain torch.

Module and parameter names mirror Hugging Face ``LlamaForCausalLM`` so a ``state_dict``
maps one to one onto a ``model.safetensors`` file, and every projection is a plain
``nn.Linear`` (weight ``[out, in]``, no bias) that a compressor can swap or rewrite.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sw.models.cache import KVCache
from sw.models.config import LlamaConfig

__all__ = [
    "LlamaConfig",
    "LlamaLM",
    "RMSNorm",
    "apply_rotary",
    "rotary_tables",
    "rotate_half",
]


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale (computed in fp32, as in HF)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension of ``x`` and scale it."""
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rotary_tables(
    head_dim: int, max_positions: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine and sine tables of the rotary embedding, HF LLaMA convention.

    Parameters
    ----------
    head_dim : int
        Width of one head (even).
    max_positions : int
        Number of positions to tabulate.
    theta : float
        Frequency base.

    Returns
    -------
    tuple of torch.Tensor
        ``cos`` and ``sin``, each ``[max_positions, head_dim]`` in fp32; the two halves of
        the last dimension repeat the same frequencies (pairs with :func:`rotate_half`).
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    pos = torch.arange(max_positions, dtype=torch.int64).float()
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """Map the halves ``(a, b)`` of the last dimension to ``(-b, a)``."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (``[batch, heads, T, head_dim]``) by the tables for its ``T`` positions."""
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    """Grouped-query self-attention with rotary embeddings and an optional KV cache."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = 1.0 / math.sqrt(self.head_dim)
        hidden, kv_width = config.hidden_size, self.num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_width, bias=False)
        self.v_proj = nn.Linear(hidden, kv_width, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | None,
        layer_idx: int,
        start_pos: int,
    ) -> torch.Tensor:
        """Attend from the ``T`` new positions of ``x`` to themselves and the cached past."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        if cache is not None:
            k, v = cache.update(layer_idx, k, v, start_pos)
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            # Query head h reads kv head h // groups (HF repeat_kv order).
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out)


class MLP(nn.Module):
    """SwiGLU feed-forward block: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the gated MLP."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm transformer block: attention then MLP, each with a residual connection."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache | None,
        layer_idx: int,
        start_pos: int,
    ) -> torch.Tensor:
        """Run one block over ``x`` (``[batch, T, hidden]``)."""
        h = self.input_layernorm(x)
        x = x + self.self_attn(h, cos, sin, mask, cache, layer_idx, start_pos)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBackbone(nn.Module):
    """Embedding, decoder blocks and final norm (HF ``LlamaModel``)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaLM(nn.Module):
    """LLaMA-style causal language model.

    Parameters
    ----------
    config : LlamaConfig
        Hyperparameters.

    Notes
    -----
    Parameter names equal those of HF ``LlamaForCausalLM`` (``model.layers.0.self_attn.
    q_proj.weight``, ..., ``lm_head.weight``). With ``tie_word_embeddings`` the
    ``lm_head`` weight *is* the embedding parameter.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # Derived from the config, so not saved in checkpoints.
        self.register_buffer("rope_cos", torch.empty(0), persistent=False)
        self.register_buffer("rope_sin", torch.empty(0), persistent=False)
        self.init_buffers()
        self.reset_parameters()

    def init_buffers(self) -> None:
        """(Re)compute the rotary tables, e.g. after ``to_empty`` from the meta device."""
        cfg = self.config
        device = self.model.embed_tokens.weight.device
        cos, sin = rotary_tables(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
        self.rope_cos = cos.to(device)
        self.rope_sin = sin.to(device)

    def reset_parameters(self, std: float = 0.02) -> None:
        """Initialise linear and embedding weights from N(0, std) and norms to one.

        Output projections (``o_proj``, ``down_proj``) are scaled down by
        ``sqrt(2 * num_layers)`` so the residual stream does not grow with depth.
        """
        out_std = std / math.sqrt(2 * self.config.num_hidden_layers)
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                is_out = name.endswith(("o_proj", "down_proj"))
                nn.init.normal_(module.weight, std=out_std if is_out else std)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def forward(
        self,
        input_ids: torch.Tensor,
        cache: KVCache | None = None,
        start_pos: int = 0,
    ) -> torch.Tensor:
        """Compute next-token logits.

        Parameters
        ----------
        input_ids : torch.Tensor
            Token ids, ``[batch, T]`` (int64).
        cache : KVCache, optional
            If given, the new keys/values are written at positions ``start_pos ..
            start_pos + T - 1`` and attention also covers the cached positions before
            ``start_pos``. Without a cache the sequence is processed on its own and
            ``start_pos`` only offsets the rotary positions.
        start_pos : int
            Absolute position of ``input_ids[:, 0]``.

        Returns
        -------
        torch.Tensor
            Logits ``[batch, T, vocab_size]`` in fp32.
        """
        t = input_ids.shape[1]
        end = start_pos + t
        if end > self.config.max_position_embeddings:
            raise ValueError(
                f"positions up to {end} exceed max_position_embeddings="
                f"{self.config.max_position_embeddings}"
            )
        if cache is not None and end > cache.max_len:
            raise ValueError(f"positions up to {end} exceed the cache capacity {cache.max_len}")
        x = self.model.embed_tokens(input_ids)
        cos = self.rope_cos[start_pos:end].to(x.dtype)
        sin = self.rope_sin[start_pos:end].to(x.dtype)
        past = start_pos if cache is not None else 0
        mask = causal_mask(t, past, x.dtype, x.device)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, mask, cache, i, start_pos)
        return self.lm_head(self.model.norm(x)).float()

    def new_cache(
        self, batch_size: int, max_len: int | None = None, dtype: torch.dtype | None = None
    ) -> KVCache:
        """Allocate an empty :class:`KVCache` on this model's device and dtype."""
        weight = self.lm_head.weight
        return KVCache(
            self.config, batch_size, max_len, dtype=dtype or weight.dtype, device=weight.device
        )

    def num_parameters(self) -> int:
        """Number of distinct parameters (a tied embedding counts once)."""
        return sum(p.numel() for p in self.parameters())


def causal_mask(t: int, past: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive mask ``[T, past + T]``: 0 where key position <= query position, else -inf."""
    q_pos = torch.arange(t, device=device).unsqueeze(1) + past
    k_pos = torch.arange(past + t, device=device).unsqueeze(0)
    zero = torch.zeros((), dtype=dtype, device=device)
    neg = torch.full((), float("-inf"), dtype=dtype, device=device)
    return torch.where(k_pos <= q_pos, zero, neg)
