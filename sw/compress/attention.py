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
    softmax_vector,
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
    vector : bool
        Requantisation (keys, values, queries, folded probabilities) and the softmax with the
        vector unit's exact numerics (:mod:`hw.numerics`, "vector unit"), else the float
        host's.
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int,
                 acc_bits: int = 32, vector: bool = False) -> None:
        super().__init__(num_heads, num_kv_heads, head_dim)
        self.acc_bits = acc_bits
        self.vector = vector

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """INT8 scores, softmax (fp32 or the vector unit's), INT8 values; returns
        ``[B, H, T, d]`` float32."""
        kv, h, vec = self.num_kv_heads, self.num_heads, self.vector
        k8, s_k = kv_rows(k, vec)
        v8, s_v = kv_rows(v, vec)
        q8, s_q = scores_prologue(q, kv, vec)
        scores = scores_epilogue(gemm_acc_torch(q8, k8, self.acc_bits), s_q, s_k, h)
        probs = (softmax_vector if vec else attention_probs)(scores, self.scale, mask)
        p8, s_p = values_prologue(probs, s_v, kv, vec)
        return values_epilogue(gemm_acc_torch(p8, v8.transpose(-2, -1), self.acc_bits), s_p, h)

