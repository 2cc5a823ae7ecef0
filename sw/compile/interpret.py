"""The IR's semantics: an interpreter that runs a graph on the host, in float or in the
accelerator's numerics.

Every op has one kernel here (:data:`KERNELS`), written with the same functions the model's
modules call (:mod:`sw.models.llama`), so interpreting a captured graph in float reproduces the
model bit for bit, and with :class:`Numerics` of the compressed weights and INT8 attention it
reproduces the model-level twin (:func:`sw.compress.model.use_hardware_numerics`). The passes
are tested against it (a pass must not change what the graph computes), and the runtime
(:mod:`sw.runtime`) runs the host nodes of a compiled step with these kernels.

Example
-------
>>> import torch
>>> from sw.models import LlamaConfig, LlamaLM
>>> from sw.compile.capture import capture
>>> torch.manual_seed(0) and None
>>> lm = LlamaLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
...                          num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
>>> g = capture(lm, "prefill", 5).graph
>>> ids = torch.randint(0, 32, (1, 5))
>>> torch.equal(Interpreter.of(lm, max_len=5).step(g, ids, past=0), lm(ids))
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from hw.format import QuantizedWeight
from hw.numerics import (
    gemm_acc_torch,
    golden_linear_torch,
    kv_rows,
    scores_epilogue,
    scores_prologue,
    values_epilogue,
    values_prologue,
)
from sw.compile.ir import Graph, IRError, Node
from sw.models.cache import KVCache
from sw.models.config import LlamaConfig
from sw.models.llama import (
    LlamaLM,
    apply_rotary,
    attention_probs,
    causal_mask,
    rms_norm,
    rotary_tables,
)

__all__ = ["Numerics", "Interpreter", "Env", "KERNELS", "Kernel", "layer_of", "run_node",
           "linear_members"]


def layer_of(node: Node) -> str:
    """The module name of a linear node's weight (``model.layers.0.mlp.up_proj``)."""
    return node.attrs["weight"].removesuffix(".weight")


@dataclass(frozen=True)
class Numerics:
    """How accelerator ops compute.

    Parameters
    ----------
    weights : mapping
        Compressed layers (module name -> :class:`~hw.format.QuantizedWeight`): these linears
        compute W4A8/W8A8 with the datapath's integer numerics; the others in float.
    attention : bool
        INT8 KV-cache attention products (:mod:`sw.compress.attention`), else float.
    acc_bits : int
        Accumulator width.
    """

    weights: Mapping[str, QuantizedWeight] = field(default_factory=dict)
    attention: bool = False
    acc_bits: int = 32

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


Kernel = Callable[[Node, list, Env], tuple]


def _linear(node: Node, args: list, env: Env) -> tuple:
    x = args[0]
    layer = layer_of(node)
    bias = env.param(node.attrs["bias"]) if "bias" in node.attrs else None
    if layer in env.numerics.weights:
        w_int, row_scale = env.numerics.int_weight(layer)
        y = golden_linear_torch(x, w_int, row_scale, env.numerics.acc_bits,
                                bias).to(x.dtype)  # a bias: the WIDE_BIAS epilogue's
    else:
        y = F.linear(x, env.param(node.attrs["weight"]), bias)
    if len(args) == 2:  # fused residual epilogue
        y = args[1] + y
    return (y,)


def _linears(node: Node, args: list, env: Env) -> tuple:
    return tuple(_linear(member, args, env)[0] for member in linear_members(node))


def linear_members(node: Node) -> list[Node]:
    """The ``linear`` nodes a ``linears`` node groups (a ``linear`` is its own member)."""
    if node.op == "linear":
        return [node]
    biases = node.attrs.get("biases") or [None] * len(node.outputs)
    return [Node(f"{node.name}[{i}]", "linear", node.inputs, (o,),
                 {"weight": w, **({"bias": b} if b else {})})
            for i, (o, w, b) in enumerate(zip(node.outputs, node.attrs["weights"], biases,
                                              strict=True))]


def _positions(node: Node, args: list, env: Env) -> tuple:
    cos, sin = env.tables
    t = env.t
    end = env.past + t
    dtype = torch.float32
    return cos[env.past:end].to(dtype), sin[env.past:end].to(dtype), \
        causal_mask(t, env.past, dtype, cos.device, env.window)


def _kv_update(node: Node, args: list, env: Env) -> tuple:
    return env.cache(node.attrs["layer"], args[0], args[1], env.past)


def _attn_scores(node: Node, args: list, env: Env) -> tuple:
    q, k = args
    if not env.numerics.attention:
        if k.shape[1] != q.shape[1]:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        return (torch.matmul(q, k.transpose(-2, -1)),)
    k8, s_k = kv_rows(k)
    q8, s_q = scores_prologue(q, k.shape[1])
    acc = gemm_acc_torch(q8, k8, env.numerics.acc_bits)
    return (scores_epilogue(acc, s_q, s_k, q.shape[1]),)


def _attn_values(node: Node, args: list, env: Env) -> tuple:
    p, v = args
    heads = p.shape[1]
    if not env.numerics.attention:
        if v.shape[1] != heads:
            v = v.repeat_interleave(heads // v.shape[1], dim=1)
        return (torch.matmul(p.to(v.dtype), v),)
    v8, s_v = kv_rows(v)
    p8, s_p = values_prologue(p, s_v, v.shape[1])
    acc = gemm_acc_torch(p8, v8.transpose(-2, -1), env.numerics.acc_bits)
    return (values_epilogue(acc, s_p, heads),)


#: One kernel per op: ``kernel(node, input tensors, env) -> output tensors``.
KERNELS: dict[str, Kernel] = {
    "embed": lambda n, a, e: (F.embedding(a[0], e.param(n.attrs["weight"])),),
    "positions": _positions,
    "rmsnorm": lambda n, a, e: (rms_norm(a[0], e.param(n.attrs["weight"]), n.attrs["eps"]),),
    "linear": _linear,
    "linears": _linears,
    "view": lambda n, a, e: (a[0].view(n.attrs["shape"]),),
    "reshape": lambda n, a, e: (a[0].reshape(n.attrs["shape"]),),
    "transpose": lambda n, a, e: (a[0].transpose(*n.attrs["dims"]),),
    "last_token": lambda n, a, e: (a[0][..., -1:, :],),
    "rope": lambda n, a, e: (apply_rotary(*a),),
    "kv_update": _kv_update,
    "repeat_kv": lambda n, a, e: (a[0].repeat_interleave(n.attrs["groups"], dim=1),),
    "attn_scores": _attn_scores,
    "softmax": lambda n, a, e: (attention_probs(a[0], n.attrs["scale"], a[1]),),
    "attn_values": _attn_values,
    "silu_gate": lambda n, a, e: (F.silu(a[0]) * a[1],),
    "add": lambda n, a, e: (a[0] + a[1],),
}


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
        self.cache = KVCache(config, 1, max_len)
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
            run_node(node, KERNELS, vals, env)
        return vals[graph.outputs[0]]


def run_node(node: Node, kernels: Mapping[str, Kernel], vals: dict, env: Env) -> None:
    """Execute one node: read its inputs from ``vals``, write its outputs there."""
    fn = kernels.get(node.op)
    if fn is None:
        raise IRError(f"node {node.name!r}: no kernel for op {node.op!r}")
    outs = fn(node, [vals[i] for i in node.inputs], env)
    for name, t in zip(node.outputs, outs, strict=True):
        vals[name] = t
