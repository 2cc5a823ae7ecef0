"""A LLaMA-style decoder-only transformer in plain torch.

Module and parameter names mirror Hugging Face ``LlamaForCausalLM`` so a ``state_dict``
maps one to one onto a ``model.safetensors`` file, and every projection is a plain
``nn.Linear`` (weight ``[out, in]``; biases only where the family has them: Qwen2's q/k/v)
that a compressor can swap or rewrite. Mistral's sliding window is part of the causal mask.

Every operation the accelerator or its host knows is a *leaf module*: ``nn.Embedding``,
:class:`RMSNorm`, ``nn.Linear``, :class:`StepPositions` (rotary tables and causal mask of a
step), :class:`Rotary`, :class:`~sw.models.cache.KVCache` (called to write and read the
cache), :class:`AttentionProducts` (scores, softmax, values) and :class:`SiLUGate`. Only
layout operations (view, transpose, reshape) and the residual additions run outside them, so
the graph compiler (:mod:`sw.compile.capture`) maps a ``torch.export`` graph onto its IR by
module, and a model-level twin swaps a leaf for one computing with the hardware's numerics
(:func:`sw.compress.model.use_hardware_numerics`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from sw.models.cache import KVCache
from sw.models.config import LlamaConfig

__all__ = [
    "AttentionProducts",
    "LlamaConfig",
    "LlamaLM",
    "RMSNorm",
    "Rotary",
    "SiLUGate",
    "StepPositions",
    "apply_rotary",
    "attention_probs",
    "causal_mask",
    "rms_norm",
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
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the last dimension of ``x`` (fp32 statistics, as in HF), scaled by ``weight``."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


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


class Rotary(nn.Module):
    """Rotary position embedding of queries or keys (no parameters)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x`` is ``[batch, heads, T, head_dim]``; ``cos``/``sin`` ``[T, head_dim]``."""
        return apply_rotary(x, cos, sin)


def attention_probs(scores: torch.Tensor, scale: float, mask: torch.Tensor) -> torch.Tensor:
    """Softmax of ``scores * scale + mask`` over the key positions, in fp32."""
    return F.softmax(scores * scale + mask, dim=-1, dtype=torch.float32)


class AttentionProducts(nn.Module):
    """The two attention products and the softmax between them (no parameters).

    ``forward(q, k, v, mask)``: queries ``[batch, heads, T, head_dim]`` against keys and
    values ``[batch, kv_heads, S, head_dim]`` (grouped-query: query head ``h`` reads kv head
    ``h // (heads // kv_heads)``, HF ``repeat_kv`` order), additive ``mask [T, S]``; returns
    ``[batch, heads, T, head_dim]``.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = 1.0 / math.sqrt(head_dim)

    @property
    def groups(self) -> int:
        """Query heads per key/value head."""
        return self.num_heads // self.num_kv_heads

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """Scaled dot-product attention of ``q`` over ``k``/``v`` (see the class docstring)."""
        if self.groups > 1:
            k = k.repeat_interleave(self.groups, dim=1)
            v = v.repeat_interleave(self.groups, dim=1)
        probs = attention_probs(torch.matmul(q, k.transpose(-2, -1)), self.scale, mask)
        return torch.matmul(probs.to(q.dtype), v)

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}"


class SiLUGate(nn.Module):
    """SwiGLU's gate: ``silu(gate) * up`` (no parameters)."""

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """Elementwise ``silu(gate) * up``."""
        return F.silu(gate) * up


class StepPositions(nn.Module):
    """Rotary tables and causal mask of one forward step (no parameters).

    Holds the cosine and sine tables (derived from the config, not saved in checkpoints) and
    returns, for the ``t`` positions ``start_pos .. start_pos + t - 1``, their table rows and
    the additive causal mask ``[t, past + t]`` over ``past`` cached positions.
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)

    def init_tables(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the tables, e.g. after ``to_empty`` from the meta device."""
        cfg = self.config
        cos, sin = rotary_tables(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta)
        self.cos = cos.to(device)
        self.sin = sin.to(device)

    def forward(self, start_pos: int, t: int, past: int, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(cos, sin, mask)`` of the step in ``dtype``."""
        end = start_pos + t
        return (self.cos[start_pos:end].to(dtype), self.sin[start_pos:end].to(dtype),
                causal_mask(t, past, dtype, self.cos.device, self.config.sliding_window))


class Attention(nn.Module):
    """Grouped-query self-attention with rotary embeddings and an optional KV cache."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden, kv_width = config.hidden_size, self.num_kv_heads * self.head_dim
        qkv = config.qkv_bias
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=qkv)
        self.k_proj = nn.Linear(hidden, kv_width, bias=qkv)
        self.v_proj = nn.Linear(hidden, kv_width, bias=qkv)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=config.o_bias)
        self.rotary = Rotary()
        self.products = AttentionProducts(self.num_heads, self.num_kv_heads, self.head_dim)

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
        q = self.rotary(q, cos, sin)
        k = self.rotary(k, cos, sin)
        if cache is not None:
            k, v = cache(layer_idx, k, v, start_pos)
        out = self.products(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    """SwiGLU feed-forward block: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act = SiLUGate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the gated MLP."""
        return self.down_proj(self.act(self.gate_proj(x), self.up_proj(x)))


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

    Attributes
    ----------
    cache_dtype : torch.dtype or None
        The dtype of the caches :meth:`new_cache` makes (None: the weights'; the vector
        unit's twin holds its exact float64 keys and values: :mod:`sw.compress.vector`).
    """

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.cache_dtype: torch.dtype | None = None
        self.model = LlamaBackbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.positions = StepPositions(config)
        self.init_buffers()
        self.reset_parameters()

    def init_buffers(self) -> None:
        """(Re)compute the rotary tables, e.g. after ``to_empty`` from the meta device."""
        self.positions.init_tables(self.model.embed_tokens.weight.device)

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
        past = start_pos if cache is not None else 0
        cos, sin, mask = self.positions(start_pos, t, past, x.dtype)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, mask, cache, i, start_pos)
        return self.lm_head(self.model.norm(x)).float()

    def new_cache(
        self, batch_size: int, max_len: int | None = None, dtype: torch.dtype | None = None
    ) -> KVCache:
        """Allocate an empty :class:`KVCache` on this model's device, in ``dtype`` (default:
        :attr:`cache_dtype`, else the weights')."""
        weight = self.model.embed_tokens.weight  # the head may be a hardware linear
        return KVCache(
            self.config, batch_size, max_len, dtype=dtype or self.cache_dtype or weight.dtype,
            device=weight.device
        )

    def num_parameters(self) -> int:
        """Number of distinct parameters (a tied embedding counts once)."""
        return sum(p.numel() for p in self.parameters())


def causal_mask(t: int, past: int, dtype: torch.dtype, device: torch.device,
                window: int | None = None) -> torch.Tensor:
    """Additive mask ``[T, past + T]``: 0 where key position <= query position (and, with a
    sliding ``window``, query - key < window, as in HF Mistral), else -inf."""
    q_pos = torch.arange(t, device=device).unsqueeze(1) + past
    k_pos = torch.arange(past + t, device=device).unsqueeze(0)
    seen = k_pos <= q_pos
    if window is not None:
        seen = seen & (k_pos > q_pos - window)
    # no 0-dim tensors: torch.export may lift a small factory result as a (fake) constant
    return torch.full((t, past + t), float("-inf"), dtype=dtype, device=device
                      ).masked_fill(seen, 0.0)
