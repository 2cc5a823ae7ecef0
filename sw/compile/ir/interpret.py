"""The IR's semantics: an interpreter that runs a graph on the host, in float or in the
accelerator's numerics.

Every op's kernel is part of its definition (:data:`sw.compile.ir.ops.OPS`), written with
the same functions the model's modules call (:mod:`sw.models.llama`), so interpreting a
captured graph in float reproduces the model bit for bit, and with :class:`Numerics` of the
compressed weights and INT8 attention it reproduces the model-level twin
(:func:`sw.compress.model.use_hardware_numerics`). The passes are tested against it (a pass
must not change what the graph computes), and the runtime (:mod:`sw.runtime`) runs the host
nodes of a compiled step with these kernels.

Example
-------
>>> import torch
>>> from sw.models import LlamaConfig, LlamaLM
>>> from sw.compile.capture import capture
>>> from sw.compile.ir import Interpreter
>>> torch.manual_seed(0) and None
>>> lm = LlamaLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
...                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
>>> g = capture(lm, "prefill", 5).graph
>>> ids = torch.randint(0, 32, (1, 5))
>>> torch.equal(Interpreter.of(lm, max_len=5).step(g, ids, past=0), lm(ids))
True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from hw.format import QuantizedWeight
from hw.numerics import KV_BITS
from sw.compile.errors import IRError
from sw.compile.ir.graph import Graph, Node
from sw.compile.ir.ops import OPS, Kernel
from sw.models.cache import KVCache
from sw.models.config import LlamaConfig
from sw.models.llama import LlamaLM, rotary_tables

__all__ = ["Numerics", "Interpreter", "Env", "run_node"]


@dataclass(frozen=True)
class Numerics:
    """How accelerator ops compute.

    Parameters
    ----------
    weights : mapping
        Compressed layers (module name -> :class:`~hw.format.QuantizedWeight`): these linears
        compute W4A8/W8A8 with the datapath's integer numerics; the others in float.
    attention : bool
        INT8 KV-cache attention products (:mod:`hw.numerics`), else float.
    acc_bits : int
        Accumulator width.
    vector : bool
        The host ops (RMSNorm, RoPE, softmax, SiLU-gate, residual additions) and the INT8
        requantisation of activations, keys and values compute with the vector unit's exact
        integer numerics (:mod:`hw.numerics`, "vector unit"), else in float.
    kv_bits : int
        Width of the cached keys and values in the attention products: 8 or 4
        (:func:`hw.numerics.kv_rows`).
    """

    weights: Mapping[str, QuantizedWeight] = field(default_factory=dict)
    attention: bool = False
    acc_bits: int = 32
    vector: bool = False
    kv_bits: int = 8

    def __post_init__(self):
        if self.kv_bits not in KV_BITS:
            raise IRError(f"KV-cache bits must be one of {KV_BITS}, got {self.kv_bits!r}")

    def int_weight(self, layer: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(w_int [N, K] int32, row_scale [N])`` of a compressed layer (memoised)."""
        memo = self.__dict__.setdefault("_int", {})
        if layer not in memo:
            qw = self.weights[layer]
            w = np.ascontiguousarray(qw.int_weight()[:, : qw.k], dtype=np.int32)
            memo[layer] = (torch.from_numpy(w), torch.from_numpy(qw.row_scale.astype(np.float32)))
        return memo[layer]


class Env:
    """What kernels see besides their inputs: parameters, numerics, the cache and the step."""

    def __init__(self, params: Mapping[str, torch.Tensor], numerics: Numerics, cache, past: int,
                 tokens: int, tables: tuple[torch.Tensor, torch.Tensor],
                 window: int | None = None):
        self.params, self.numerics, self.cache = params, numerics, cache
        self.past, self.t, self.tables, self.window = past, tokens, tables, window

    def param(self, name: str) -> torch.Tensor:
        try:
            return self.params[name]
        except KeyError:
            raise IRError(f"parameter {name!r} is missing") from None


class Interpreter:
    """Run IR steps of one model on the host, keeping a KV cache across steps.

    Parameters
    ----------
    params : mapping
        Parameters by name (``model.layers.0.input_layernorm.weight``...).
    config : LlamaConfig
        The model's configuration (rotary tables, cache shape).
    numerics : Numerics
        Float (default) or the accelerator's numerics.
    max_len : int, optional
        KV cache capacity (default: the model's ``max_position_embeddings``).
    """

    def __init__(self, params: Mapping[str, torch.Tensor], config: LlamaConfig,
                 numerics: Numerics = Numerics(), max_len: int | None = None) -> None:
        self.params = params
        self.config = config
        self.numerics = numerics
        # with vector numerics keys and values are the vector unit's exact float64 words
        self.cache = KVCache(config, 1, max_len,
                             dtype=torch.float64 if numerics.vector else torch.float32)
        self.tables = rotary_tables(config.head_dim, config.max_position_embeddings,
                                    config.rope_theta)

    @classmethod
    def of(cls, model: LlamaLM, numerics: Numerics = Numerics(),
           max_len: int | None = None) -> Interpreter:
        """An interpreter reading ``model``'s parameters."""
        params = dict(model.named_parameters(remove_duplicate=False))
        return cls(params, model.config, numerics, max_len)

    def env(self, graph: Graph, past: int) -> Env:
        """The kernels' environment for one step of ``graph`` after ``past`` positions."""
        return Env(self.params, self.numerics, self.cache, past,
                   int(graph.meta.get("tokens", 1)), self.tables, self.config.sliding_window)

    @torch.no_grad()
    def step(self, graph: Graph, ids: torch.Tensor, past: int) -> torch.Tensor:
        """Run ``graph`` on token ids ``[1, T]`` after ``past`` cached positions; returns the
        graph's output (the logits)."""
        env = self.env(graph, past)
        vals: dict[str, torch.Tensor] = {graph.inputs[0]: ids}
        for node in graph.nodes:
            run_node(node, vals, env)
        return vals[graph.outputs[0]]


def run_node(node: Node, vals: dict, env: Env, kernel: Kernel | None = None) -> None:
    """Execute one node with its op's kernel (or ``kernel``): read its inputs from ``vals``,
    write its outputs there."""
    fn = kernel or OPS[node.op].kernel
    outs = fn(node, [vals[i] for i in node.inputs], env)
    for name, t in zip(node.outputs, outs, strict=True):
        vals[name] = t
