"""The model-level twin of compiled attention: INT8 KV-cache attention products in torch.

:class:`HardwareAttentionProducts` computes the attention products of a float model with the
numerics of the accelerator and its host, composing the golden INT8 KV-cache attention
functions of :mod:`hw.numerics` (quantised keys, values, queries and probabilities, exact
integer products, fp32 softmax), so the model-level twin and the compiled program agree bit
for bit. :func:`sw.compress.model.use_hardware_numerics` installs it.
"""

from __future__ import annotations

import torch

from hw.numerics import (
    gemm_acc_torch,
    kv_rows,
    scores_epilogue,
    scores_prologue,
    values_epilogue,
    values_prologue,
)
from sw.models.llama import AttentionProducts, attention_probs

__all__ = ["HardwareAttentionProducts"]


class HardwareAttentionProducts(AttentionProducts):
    """Drop-in :class:`~sw.models.llama.AttentionProducts` computing with the INT8 KV numerics
    of the accelerator (:mod:`hw.numerics`); the model-level twin of compiled attention.

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

