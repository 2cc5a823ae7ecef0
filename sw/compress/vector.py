"""The model-level twin of the vector unit: the host ops of a decoder step with its numerics.

Drop-in subclasses of the float model's leaf modules (:mod:`sw.models.llama`) that compute
with the vector unit's exact integer numerics (:mod:`hw.numerics`, "vector unit", through its
float interface :func:`~hw.numerics.rms_norm_vector` and the others), and a decoder block whose
residual additions saturate as the unit's do. The runtime's host nodes and fused residuals
compute with the same functions (``Numerics(vector=True)``, ``Runtime(..., vector=True)``), so
the twin and the compiled model agree bit for bit.
:func:`sw.compress.model.use_hardware_numerics` installs them with ``vector=True``.
"""

from __future__ import annotations

import torch
from torch import nn

from hw.numerics import add_vector, rms_norm_vector, rope_vector, silu_gate_vector
from sw.models.cache import KVCache
from sw.models.llama import DecoderLayer, RMSNorm, Rotary, SiLUGate

__all__ = ["VectorRMSNorm", "VectorRotary", "VectorSiLUGate", "VectorDecoderLayer",
           "HostLinear", "use_vector_numerics"]


class VectorRMSNorm(RMSNorm):
    """:class:`~sw.models.llama.RMSNorm` on the vector unit (:func:`hw.numerics.vec_rmsnorm`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise the last dimension of ``x`` and scale it (float64 out: the exact
        Q15.16 words)."""
        return rms_norm_vector(x, self.weight, self.eps)


class VectorRotary(Rotary):
    """:class:`~sw.models.llama.Rotary` on the vector unit (:func:`hw.numerics.vec_rope`)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``x`` is ``[batch, heads, T, head_dim]``; ``cos``/``sin`` ``[T, head_dim]``."""
        return rope_vector(x, cos, sin)


class VectorSiLUGate(SiLUGate):
    """:class:`~sw.models.llama.SiLUGate` on the vector unit
    (:func:`hw.numerics.vec_silu_gate`)."""

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        """Elementwise ``silu(gate) * up``."""
        return silu_gate_vector(gate, up)


class HostLinear(nn.Linear):
    """A float ``nn.Linear`` of the host beside the vector unit (an uncompressed LM head): it
    reads its input, the vector unit's exact float64 words, in its weight's dtype (float32),
    as the runtime's host does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``F.linear`` of ``x`` in the weight's dtype."""
        return super().forward(x.to(self.weight.dtype))


class VectorDecoderLayer(DecoderLayer):
    """A :class:`~sw.models.llama.DecoderLayer` whose residual additions are the vector unit's
    saturating adds (:func:`hw.numerics.vec_add`); it shares the block's submodules (and so
    its parameter names).

    Parameters
    ----------
    layer : DecoderLayer
        The block to wrap.
    """

    def __init__(self, layer: DecoderLayer) -> None:
        nn.Module.__init__(self)
        self.input_layernorm = layer.input_layernorm
        self.self_attn = layer.self_attn
        self.post_attention_layernorm = layer.post_attention_layernorm
        self.mlp = layer.mlp

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor, cache: KVCache | None, layer_idx: int,
                start_pos: int) -> torch.Tensor:
        """Run one block over ``x`` (``[batch, T, hidden]``)."""
        h = self.input_layernorm(x)
        x = add_vector(x, self.self_attn(h, cos, sin, mask, cache, layer_idx, start_pos))
        return add_vector(x, self.mlp(self.post_attention_layernorm(x)))


def use_vector_numerics(model: nn.Module) -> nn.Module:
    """Replace (in place) every RMSNorm, rotary embedding, SiLU gate and decoder block of
    ``model`` by its vector-unit twin, and every float ``nn.Linear`` left by a
    :class:`HostLinear`; the caches it makes then hold float64 (``LlamaLM.cache_dtype``: the
    keys and values are the vector unit's exact words). Returns ``model``. Parameters are
    shared, not copied.
    """
    for name, mod in list(model.named_modules()):
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        if isinstance(mod, RMSNorm) and not isinstance(mod, VectorRMSNorm):
            new = VectorRMSNorm(mod.weight.shape[0], mod.eps)
            new.weight = mod.weight
        elif isinstance(mod, Rotary) and not isinstance(mod, VectorRotary):
            new = VectorRotary()
        elif isinstance(mod, SiLUGate) and not isinstance(mod, VectorSiLUGate):
            new = VectorSiLUGate()
        elif isinstance(mod, DecoderLayer) and not isinstance(mod, VectorDecoderLayer):
            new = VectorDecoderLayer(mod)
        elif type(mod) is nn.Linear:
            new = HostLinear(mod.in_features, mod.out_features, bias=mod.bias is not None,
                             device="meta")
            new.weight, new.bias = mod.weight, mod.bias
        else:
            continue
        setattr(parent, attr, new)
    if hasattr(model, "cache_dtype"):  # keys and values as the vector unit wrote them
        model.cache_dtype = torch.float64
    return model
