"""INT8 KV-cache attention: the numerics the accelerator's attention products compute.

The accelerator multiplies INT8 by INT8 in both attention products, with the KV cache as the
weight stream (``raw`` INT8, no scales) and the queries or probabilities as activations. The
scales live on the host:

* keys and values are quantised per position and kv head (symmetric INT8 over ``head_dim``,
  :func:`hw.numerics.quantize_activations_torch`, once when written to the cache);
* scores: queries are quantised per (head, token) row; ``acc = q8 . k8`` exactly, then
  ``scores = (float32(acc) * s_k[j]) * s_q[t]`` -- the WIDE epilogue with the key scales as
  row scales;
* softmax of ``scores * scale + mask`` in fp32 on the host
  (:func:`sw.models.llama.attention_probs`);
* values: the value scales are folded into the probabilities, ``p'[t, j] = p[t, j] * s_v[j]``,
  which are then quantised per (head, token) row; ``acc = p8 . v8`` exactly and
  ``out = (float32(acc) * 1) * s_p[t]``.

Grouped-query attention never repeats K/V: the ``groups`` query heads that share a kv head are
stacked as ``groups * T`` activation rows against that head's cache (row ``i * T + t`` is query
head ``kv * groups + i``, token ``t``: HF ``repeat_kv`` order).

Each product is split into a *prologue* (host: quantise the activation rows), the integer
product (accelerator, or :func:`hw.numerics.gemm_acc_torch` in the model-level twin) and an
*epilogue* (host: dequantise). :class:`HardwareAttentionProducts` composes the same
functions, so the compiled program and the twin agree bit for bit.
"""

from __future__ import annotations

import torch

from hw.numerics import dequant_output_torch, gemm_acc_torch, quantize_activations_torch
from sw.models.llama import AttentionProducts, attention_probs

__all__ = ["kv_rows", "group_rows", "ungroup_rows", "scores_prologue",
           "scores_epilogue", "values_prologue", "values_epilogue", "HardwareAttentionProducts"]


def kv_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise keys or values ``[B, KV, S, d]`` per position: int8 and scales ``[B, KV, S]``."""
    return quantize_activations_torch(x)


def group_rows(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``[B, H, T, n]`` -> ``[B, KV, H // KV * T, n]``: the query heads of each kv head as rows."""
    b, h, t, n = x.shape
    return x.reshape(b, kv_heads, h // kv_heads * t, n)


def ungroup_rows(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Inverse of :func:`group_rows`: ``[B, KV, G * T, n]`` -> ``[B, H, T, n]``."""
    b, kv, rows, n = x.shape
    return x.reshape(b, heads, rows * kv // heads, n)


def scores_prologue(q: torch.Tensor, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries ``[B, H, T, d]`` -> INT8 rows ``[B, KV, G*T, d]`` and scales ``[B, KV, G*T]``."""
    return quantize_activations_torch(group_rows(q, kv_heads))


def scores_epilogue(acc: torch.Tensor, s_q: torch.Tensor, s_k: torch.Tensor,
                    heads: int) -> torch.Tensor:
    """Integer scores ``[B, KV, G*T, S]`` -> float32 ``[B, H, T, S]`` (key scales as row scales)."""
    y = dequant_output_torch(acc, s_k.unsqueeze(-2), s_q)
    return ungroup_rows(y, heads)


def values_prologue(probs: torch.Tensor, s_v: torch.Tensor, kv_heads: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities ``[B, H, T, S]`` times the value scales ``[B, KV, S]`` of their kv head,
    as INT8 rows ``[B, KV, G*T, S]`` and scales ``[B, KV, G*T]``."""
    folded = group_rows(probs, kv_heads) * s_v.unsqueeze(-2)
    return quantize_activations_torch(folded)


def values_epilogue(acc: torch.Tensor, s_p: torch.Tensor, heads: int) -> torch.Tensor:
    """Integer outputs ``[B, KV, G*T, d]`` -> float32 ``[B, H, T, d]``."""
    ones = torch.ones(acc.shape[-1], dtype=torch.float32)
    return ungroup_rows(dequant_output_torch(acc, ones, s_p), heads)


class HardwareAttentionProducts(AttentionProducts):
    """Drop-in :class:`~sw.models.llama.AttentionProducts` computing with the INT8 KV numerics
    of the accelerator (see the module docstring); the model-level twin of compiled attention.

    Parameters
    ----------
    num_heads, num_kv_heads, head_dim : int
        As the float module's.
    acc_bits : int
        Accumulator width of the datapath.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int,
                 acc_bits: int = 32) -> None:
        super().__init__(num_heads, num_kv_heads, head_dim)
        self.acc_bits = acc_bits

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """INT8 scores, fp32 softmax, INT8 values; returns ``[B, H, T, d]`` float32."""
        kv, h = self.num_kv_heads, self.num_heads
        k8, s_k = kv_rows(k)
        v8, s_v = kv_rows(v)
        q8, s_q = scores_prologue(q, kv)
        scores = scores_epilogue(gemm_acc_torch(q8, k8, self.acc_bits), s_q, s_k, h)
        probs = attention_probs(scores, self.scale, mask)
        p8, s_p = values_prologue(probs, s_v, kv)
        return values_epilogue(gemm_acc_torch(p8, v8.transpose(-2, -1), self.acc_bits), s_p, h)

