"""The model-level twin of compiled attention: INT8 (or INT4) KV-cache attention products.

:class:`HardwareAttentionProducts` computes the attention products of a float model with the
numerics of the accelerator and its host, composing the golden INT8 KV-cache attention
functions of :mod:`hw.numerics` (quantised keys, values, queries and probabilities, exact
integer products, fp32 softmax), so the model-level twin and the compiled program agree bit
for bit. :func:`sw.compress.model.use_hardware_numerics` installs it.
"""

from __future__ import annotations

import torch

from hw.numerics import (
    KV_BITS,
    gemm_acc_torch,
    kv4_key_group,
    kv_rows,
    requant_amax_torch,
    scores_epilogue,
    scores_prologue,
    scores_prologue_vector,
    scores_vector,
    softmax_vector,
    value_amax_torch,
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
    kv_bits : int
        Width of the cached keys and values: 8, or 4 (:func:`hw.numerics.kv4_rows`: keys in
        groups of :func:`hw.numerics.kv4_key_group`, values per position).
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int,
                 acc_bits: int = 32, vector: bool = False, kv_bits: int = 8) -> None:
        super().__init__(num_heads, num_kv_heads, head_dim)
        if kv_bits not in KV_BITS:
            raise ValueError(f"KV-cache bits must be one of {KV_BITS}, got {kv_bits!r}")
        self.acc_bits = acc_bits
        self.vector = vector
        self.kv_bits = kv_bits
        self.key_group = kv4_key_group(head_dim) if kv_bits == 4 else None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """Integer scores, softmax (fp32 or the vector unit's), integer values; returns
        ``[B, H, T, d]`` float32."""
        kv, h, vec = self.num_kv_heads, self.num_heads, self.vector
        k8, s_k = kv_rows(k, vec, self.kv_bits, self.key_group)
        v8, s_v = kv_rows(v, vec, self.kv_bits)
        if vec:  # the scaled scores as the vector unit dequantises them
            q8, amax = scores_prologue_vector(q, kv)
            z = scores_vector(gemm_acc_torch(q8, k8, self.acc_bits), amax,
                              requant_amax_torch(k), self.scale, h, self.kv_bits)
            probs = softmax_vector(z, 1.0, mask)
        else:
            q8, s_q = scores_prologue(q, kv)
            scores = scores_epilogue(gemm_acc_torch(q8, k8, self.acc_bits), s_q, s_k, h)
            probs = attention_probs(scores, self.scale, mask)
        if vec:  # FOLD reads the value rows' integer amax
            s_v = value_amax_torch(v, self.kv_bits)
        p8, s_p = values_prologue(probs, s_v, kv, vec)
        acc = gemm_acc_torch(p8, v8.transpose(-2, -1), self.acc_bits)
        return values_epilogue(acc, s_p, h, vec, self.kv_bits)

