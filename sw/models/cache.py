"""Key/value cache for incremental decoding, held as two explicit buffers."""

from __future__ import annotations

import torch
from torch import nn

from sw.models.config import LlamaConfig


class KVCache(nn.Module):
    """Preallocated key/value cache for every layer.

    The cache is an ``nn.Module`` whose state is two registered buffers, ``k`` and ``v``,
    each of shape ``[num_layers, batch, num_kv_heads, max_len, head_dim]``. Keys are stored
    after the rotary embedding. Writes are in-place slice assignments, which
    ``torch.export`` records as buffer mutations, so a wrapper module that owns both the
    model and a cache exports a decode step without hidden Python state. The model calls the
    cache (``cache(layer, k, v, start_pos)``, i.e. :meth:`update`) so that an exported graph
    shows every cache access inside the cache module.

    Parameters
    ----------
    config : LlamaConfig
        Model configuration (layers, kv heads, head width).
    batch_size : int
        Number of sequences decoded together.
    max_len : int, optional
        Capacity in positions; defaults to ``config.max_position_embeddings``.
    dtype : torch.dtype
        Storage dtype (match the model's activations).
    device : torch.device or str, optional
        Storage device.
    """

    def __init__(
        self,
        config: LlamaConfig,
        batch_size: int,
        max_len: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        max_len = config.max_position_embeddings if max_len is None else max_len
        if max_len > config.max_position_embeddings:
            raise ValueError(
                f"cache max_len={max_len} exceeds max_position_embeddings="
                f"{config.max_position_embeddings}"
            )
        shape = (
            config.num_hidden_layers,
            batch_size,
            config.num_key_value_heads,
            max_len,
            config.head_dim,
        )
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device))
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device))

    @property
    def max_len(self) -> int:
        """Capacity of the cache in positions."""
        return self.k.shape[3]

    @property
    def batch_size(self) -> int:
        """Number of sequences the cache holds."""
        return self.k.shape[1]

    def update(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, start_pos: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new keys/values at ``start_pos`` and return all valid ones for ``layer``.

        Parameters
        ----------
        layer : int
            Decoder layer index.
        k, v : torch.Tensor
            New entries, ``[batch, num_kv_heads, T, head_dim]``.
        start_pos : int
            Absolute position of the first new entry.

        Returns
        -------
        tuple of torch.Tensor
            Keys and values for positions ``0 .. start_pos + T - 1``.
        """
        end = start_pos + k.shape[2]
        self.k[layer, :, :, start_pos:end] = k
        self.v[layer, :, :, start_pos:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def forward(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, start_pos: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`update` (the model calls the cache as a module)."""
        return self.update(layer, k, v, start_pos)

    def reset(self) -> None:
        """Zero the cache (not needed for correctness; positions beyond ``start_pos`` are
        never read)."""
        self.k.zero_()
        self.v.zero_()
