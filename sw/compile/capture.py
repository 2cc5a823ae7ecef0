"""Capture: ``torch.export`` of one model step, translated into the IR (:mod:`sw.compile.ir`).

The model (:class:`sw.models.llama.LlamaLM`) is exported together with its KV cache, which is a
registered buffer of the exported module, so cache reads and writes are in the graph (never
baked in as constants, as ``torch.fx.symbolic_trace`` would). Every ATen node carries the stack
of module calls it came from (``nn_module_stack``); the nodes of one call of a *leaf module*
form a region that becomes one IR node (or a few), chosen by the module's type:

=====================  ===========================================================
leaf module            IR
=====================  ===========================================================
``nn.Embedding``       ``embed``
``StepPositions``      ``positions`` (rotary tables and causal mask of the step)
``RMSNorm``            ``rmsnorm``
``nn.Linear``          ``linear`` (no bias)
``Rotary``             ``rope``
``KVCache``            ``kv_update`` (the step's keys/values written, all read back)
``AttentionProducts``  ``repeat_kv`` (grouped-query), ``attn_scores``, ``softmax``,
                       ``attn_values``
``SiLUGate``           ``silu_gate``
=====================  ===========================================================

Outside leaf modules only layout operations (view, reshape, transpose, no-op casts) and
additions may appear (the registry's ``aten`` names); anything else raises
:class:`~sw.compile.errors.CaptureError` naming the ATen op, the node
and the module it came from. A leaf region whose ATen ops differ from what its translation
knows (a modified or subclassed module) is refused the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import fx, nn

from sw.compile.errors import CaptureError
from sw.compile.ir import OPS, SYMBOL, Graph, Node, TensorType
from sw.models.cache import KVCache
from sw.models.llama import (
    AttentionProducts,
    LlamaLM,
    RMSNorm,
    Rotary,
    SiLUGate,
    StepPositions,
)

__all__ = ["capture", "CaptureResult"]

PHASES = ("prefill", "decode")


class _Step(nn.Module):
    """The exported module: the model and its cache, one step at a fixed ``start_pos``."""

    def __init__(self, lm: LlamaLM, cache: KVCache, start_pos: int) -> None:
        super().__init__()
        self.lm = lm
        self.cache = cache
        self.start_pos = start_pos

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(ids, cache=self.cache, start_pos=self.start_pos)


@dataclass
class CaptureResult:
    """The IR of one step and how long ``torch.export`` and the translation took."""

    graph: Graph
    export_s: float
    translate_s: float
    aten_nodes: int

    @property
    def seconds(self) -> float:
        return self.export_s + self.translate_s


#: How torch.export reports a tensor it traced without a proxy and lifted as a fake constant.
#: Seen once, not reproducibly, in a Dask worker exporting the meta-device LLaMA-7B step; the
#: same export succeeds when repeated, so :func:`_export` repeats it once before failing.
_FAKE_CONSTANT = "fake tensor in the exported program constant"


def _export(step: nn.Module, ids: torch.Tensor) -> torch.export.ExportedProgram:
    """``torch.export`` (non-strict) of one step, repeated once after a fake constant."""
    for attempt in (1, 2):
        try:
            with torch.no_grad():
                return torch.export.export(step, (ids,), strict=False)
        except RuntimeError as e:
            if _FAKE_CONSTANT not in str(e) or attempt == 2:
                raise


def capture(model: LlamaLM, phase: str, tokens: int = 1) -> CaptureResult:
    """Export one step of ``model`` and translate it into the IR.

    Parameters
    ----------
    model : LlamaLM
        The model (any device, ``meta`` included: only shapes are traced).
    phase : str
        ``"prefill"`` (``tokens`` positions from position 0) or ``"decode"`` (one token after
        cached positions; the graph is valid for every position, see :data:`ir.SYMBOL`).
    tokens : int
        Prompt length of a prefill step.

    Raises
    ------
    CaptureError
        Unknown phase, bad token count, or an operation the IR has no op for.
    """
    if phase not in PHASES:
        raise CaptureError(f"phase must be one of {PHASES}, got {phase!r}")
    if phase == "decode":
        tokens, past = 1, 1  # any past works: the IR's position-dependent sizes are symbolic
    else:
        past = 0
    cfg = model.config
    if not isinstance(tokens, int) or not 1 <= tokens <= cfg.max_position_embeddings - past:
        raise CaptureError(f"tokens must be in [1, {cfg.max_position_embeddings - past}] for "
                           f"this model, got {tokens!r}")
    embed = model.model.embed_tokens.weight  # the head may be a hardware linear
    device = embed.device
    cache = KVCache(cfg, 1, past + tokens, dtype=embed.dtype, device=device)
    step = _Step(model, cache, past)
    ids = torch.zeros((1, tokens), dtype=torch.long, device=device)
    t0 = time.perf_counter()
    ep = _export(step, ids)
    t1 = time.perf_counter()
    graph = _Translator(ep, step, phase, tokens).run()
    return CaptureResult(graph, t1 - t0, time.perf_counter() - t1,
                         sum(n.op == "call_function" for n in ep.graph.nodes))


# ---------------------------------------------------------------------- translation
def _aten_name(target) -> str:
    """``aten.mul.Tensor`` -> ``mul``."""
    name = str(target)
    return name.split(".")[1] if name.startswith("aten.") else name


#: Identity ops (no-op casts and metadata checks) that the translation skips.
_IDENTITY = {"to", "_to_copy", "alias", "_assert_tensor_metadata", "clone", "contiguous"}
#: ATen ops allowed outside leaf modules, and their IR op (the registry's ``aten`` names).
_DIRECT = {aten: name for name, d in OPS.items() for aten in d.aten}


@dataclass
class _Region:
    """The ATen nodes of one leaf-module call."""

    key: str
    path: str          # module path inside the model ("model.layers.0.input_layernorm")
    module: nn.Module
    nodes: list[fx.Node]


class _Translator:
    def __init__(self, ep, step: _Step, phase: str, tokens: int):
        self.ep, self.step, self.phase, self.tokens = ep, step, phase, tokens
        self.cfg = step.lm.config
        self.env: dict[fx.Node, str] = {}          # ATen node -> IR value
        self.values: dict[str, TensorType] = {}
        self.nodes: list[Node] = []
        self.origin: dict[str, tuple[str, int]] = {}  # IR value -> (producing op, output index)
        sig = ep.graph_signature
        self.params = {**sig.inputs_to_parameters, **sig.inputs_to_buffers}

    # ------------------------------------------------------------------ helpers
    def fail(self, what: str, node: fx.Node, path: str) -> CaptureError:
        return CaptureError(f"unsupported operation {what} at node '{node.name}' "
                            f"(in module '{path or '<model>'}'): the IR has no op for it")

    def value(self, name: str, ttype: TensorType) -> str:
        base, k = name, 1
        while name in self.values:
            k += 1
            name = f"{base}.{k}"
        self.values[name] = ttype
        return name

    def emit(self, op: str, name: str, inputs: list[str], outputs: list[tuple[str, TensorType]],
             **attrs) -> list[str]:
        outs = [self.value(n, t) for n, t in outputs]
        base, k = name, 1
        names = {n.name for n in self.nodes}
        while name in names:
            k += 1
            name = f"{base}.{k}"
        self.nodes.append(Node(name, op, tuple(inputs), tuple(outs), attrs))
        for i, o in enumerate(outs):
            self.origin[o] = (op, i)
        return outs

    @staticmethod
    def ttype(node: fx.Node, shape=None) -> TensorType:
        val = node.meta.get("val")
        dtype = {torch.int64: "i64", torch.float32: "f32"}.get(val.dtype, str(val.dtype))
        return TensorType(tuple(int(d) for d in val.shape) if shape is None else shape, dtype)

    def _module_of(self, node: fx.Node) -> tuple[str, str, nn.Module] | None:
        stack = node.meta.get("nn_module_stack")
        if not stack:
            return None
        key, (path, _) = list(stack.items())[-1]
        return key, path, self.step.get_submodule(path)

    @staticmethod
    def _model_path(path: str) -> str:
        return path.removeprefix("lm.")

    @staticmethod
    def short(path: str) -> str:
        """Display name of a module path (``model.layers.0.mlp`` -> ``layers.0.mlp``)."""
        return path.removeprefix("model.")

    # ------------------------------------------------------------------ main loop
    def run(self) -> Graph:
        graph = self.ep.graph
        regions: dict[str, _Region] = {}
        order: list[tuple[str, object]] = []     # ("region", key) | ("node", fx.Node)
        inputs: list[str] = []
        for node in graph.nodes:
            if node.op == "placeholder":
                if node.name not in self.params:
                    inputs.append(self.value("ids", self.ttype(node)))
                    self.env[node] = "ids"
                continue
            if node.op == "output":
                continue
            mod = self._module_of(node)
            if mod is not None and type(mod[2]) in _LEAVES:
                key, path, module = mod
                if key not in regions:
                    regions[key] = _Region(key, self._model_path(path), module, [])
                    order.append(("region", key))
                regions[key].nodes.append(node)
            else:
                order.append(("node", node))
        for kind, item in order:
            if kind == "region":
                self._region(regions[item])
            else:
                self._inline(item)
        user_outputs = self.ep.graph_signature.user_outputs
        out_nodes = {n.name: n for n in graph.nodes}
        outputs = []
        for name in user_outputs:
            node = out_nodes[name]
            if node not in self.env:
                raise CaptureError(f"graph output '{name}' is not computed by a known op")
            outputs.append(self.env[node])
        if len(outputs) != 1:
            raise CaptureError(f"expected one output (the logits), got {len(outputs)}")
        # the output is the logits
        cfg = self.cfg
        meta = {"phase": self.phase, "tokens": self.tokens, "model": cfg.to_dict()}
        return Graph(nodes=tuple(self.nodes), values=dict(self.values), inputs=tuple(inputs),
                     outputs=tuple(outputs), meta=meta)

    # ------------------------------------------------------------------ inline ops
    def _inline(self, node: fx.Node) -> None:
        mod = self._module_of(node)
        path = self._model_path(mod[1]) if mod else ""
        if node.op != "call_function":
            raise self.fail(f"{node.op} {node.target}", node, path)
        op = _aten_name(node.target)
        tensor_args = [a for a in node.args if isinstance(a, fx.Node)]
        if op in _IDENTITY:
            src = tensor_args[0]
            if op == "_assert_tensor_metadata":
                return
            if self.ttype(src).dtype != self.ttype(node).dtype:
                raise self.fail(f"{node.target} (a dtype change)", node, path)
            self.env[node] = self.env[src]
            return
        if any(a not in self.env for a in tensor_args):
            raise self.fail(str(node.target), node, path)
        ins = [self.env[a] for a in tensor_args]
        ir_op = _DIRECT.get(op)
        if ir_op is not None and OPS[ir_op].layout:
            attrs = ({"dims": [int(d) for d in node.args[1:3]]} if ir_op == "transpose"
                     else {"shape": [int(d) for d in node.args[1]]})
            out = self.emit(ir_op, node.name, ins, [(node.name, self._inline_type(node, ins))],
                            **attrs)
        elif ir_op == "add" and len(tensor_args) == 2 and len(node.args) == 2:
            out = self.emit("add", node.name, ins, [(node.name, self.ttype(node))])
        else:
            raise self.fail(str(node.target), node, path)
        self.env[node] = out[0]

    def _inline_type(self, node: fx.Node, ins: list[str]) -> TensorType:
        """Layout results of position-dependent values keep the symbol."""
        if any(SYMBOL in self.values[i].shape for i in ins):
            raise self.fail(f"{node.target} of a position-dependent value", node, "")
        return self.ttype(node)

    # ------------------------------------------------------------------ leaf regions
    def _region(self, r: _Region) -> None:
        allowed = _LEAVES[type(r.module)][1]
        for n in r.nodes:
            if _aten_name(n.target) not in allowed:
                raise self.fail(f"{n.target} inside {type(r.module).__name__}", n, r.path)
        members = set(r.nodes)
        ext: list[fx.Node] = []
        for n in r.nodes:
            for a in n.all_input_nodes:
                if a not in members and a not in ext and a.name not in self.params:
                    ext.append(a)
        for a in ext:
            if a not in self.env:
                raise self.fail(f"input {a.name} of {type(r.module).__name__}", r.nodes[0],
                                r.path)
        # A no-op cast of an input (``x.float()`` of a float32 x) is the input itself, and the
        # exporter may hand it to later users outside the region: alias it, it is no output.
        for n in r.nodes:
            src = n.all_input_nodes[0] if n.all_input_nodes else None
            if _aten_name(n.target) in _IDENTITY and src in self.env and \
                    n.meta.get("val") is not None and \
                    self.ttype(src).dtype == self.ttype(n).dtype:
                self.env[n] = self.env[src]
        outs = [n for n in r.nodes if n not in self.env and n.meta.get("val") is not None
                and any(u not in members for u in n.users)]
        ins = [self.env[a] for a in ext]
        results = _LEAVES[type(r.module)][0](self, r, ins, outs)
        if len(results) != len(outs):
            raise CaptureError(f"{type(r.module).__name__} at '{r.path}' has {len(outs)} "
                               f"outputs in the graph, its translation {len(results)}")
        for n, v in zip(outs, results, strict=True):
            self.env[n] = v

    def role(self, ins: list[str], op: str, index: int | None = None) -> str:
        """The input produced by ``op`` (output ``index``)."""
        for v in ins:
            o = self.origin.get(v)
            if o and o[0] == op and (index is None or o[1] == index):
                return v
        raise CaptureError(f"expected an input produced by {op}, got {ins}")

    def source_linear(self, v: str) -> str:
        """The linear a value comes from through layout ops (its name), else the value."""
        node = next((n for n in self.nodes if v in n.outputs), None)
        while node is not None and OPS[node.op].layout:
            node = next((n for n in self.nodes if node.inputs[0] in n.outputs), None)
        return node.name if node is not None and node.op == "linear" else v

    def others(self, ins: list[str], *taken: str) -> list[str]:
        return [v for v in ins if v not in taken]

    def _one_input(self, r: _Region, ins: list[str]) -> str:
        if len(ins) != 1:
            raise CaptureError(f"{type(r.module).__name__} at '{r.path}' has {len(ins)} "
                               f"activation inputs, expected 1")
        return ins[0]


def _embed(t: _Translator, r: _Region, ins, outs):
    name = t.short(r.path)
    return t.emit("embed", name, [t._one_input(r, ins)], [(name, t.ttype(outs[0]))],
                  weight=f"{r.path}.weight")


def _positions(t: _Translator, r: _Region, ins, outs):
    if ins or len(outs) != 3:
        raise CaptureError(f"StepPositions at '{r.path}' must return (cos, sin, mask)")
    cos, sin, mask = (t.ttype(o) for o in outs)
    return t.emit("positions", "positions", [],
                  [("cos", cos), ("sin", sin),
                   ("mask", TensorType((mask.shape[0], SYMBOL), mask.dtype))])


def _rmsnorm(t: _Translator, r: _Region, ins, outs):
    name = t.short(r.path)
    return t.emit("rmsnorm", name, [t._one_input(r, ins)], [(name, t.ttype(outs[0]))],
                  weight=f"{r.path}.weight", eps=float(r.module.eps))


def _linear(t: _Translator, r: _Region, ins, outs):
    name = t.short(r.path)
    bias = {} if r.module.bias is None else {"bias": f"{r.path}.bias"}
    return t.emit("linear", name, [t._one_input(r, ins)], [(name, t.ttype(outs[0]))],
                  weight=f"{r.path}.weight", **bias)


def _rope(t: _Translator, r: _Region, ins, outs):
    cos, sin = t.role(ins, "positions", 0), t.role(ins, "positions", 1)
    (x,) = t.others(ins, cos, sin)
    name = f"{t.source_linear(x)}.rope"
    return t.emit("rope", name, [x, cos, sin], [(name, t.ttype(outs[0]))])


def _kv_update(t: _Translator, r: _Region, ins, outs):
    if len(ins) != 2 or len(outs) != 2:
        raise CaptureError(f"KV cache call at '{r.path}' must write and read keys and values")
    layers = {int(n.args[2]) for n in r.nodes if _aten_name(n.target) == "select"}
    if len(layers) != 1:
        raise CaptureError(f"KV cache call at '{r.path}' touches layers {sorted(layers)}")
    layer = layers.pop()
    shapes = [t.ttype(o) for o in outs]
    kv = [TensorType((s.shape[0], s.shape[1], SYMBOL, s.shape[3]), s.dtype) for s in shapes]
    return t.emit("kv_update", f"layers.{layer}.kv_update", ins,
                  [(f"layers.{layer}.k", kv[0]), (f"layers.{layer}.v", kv[1])], layer=layer)


def _attention(t: _Translator, r: _Region, ins, outs):
    m: AttentionProducts = r.module
    k, v = t.role(ins, "kv_update", 0), t.role(ins, "kv_update", 1)
    mask = t.role(ins, "positions", 2)
    (q,) = t.others(ins, k, v, mask)
    layer = next(n.attrs["layer"] for n in t.nodes if k in n.outputs)
    base = t.short(r.path.removesuffix(".products"))
    heads = dict(layer=layer, heads=m.num_heads, kv_heads=m.num_kv_heads, head_dim=m.head_dim)
    qt = t.values[q]
    b, T = qt.shape[0], qt.shape[2]
    if m.groups > 1:
        rep = TensorType((b, m.num_heads, SYMBOL, m.head_dim))
        (k,) = t.emit("repeat_kv", f"{base}.repeat_k", [k], [(f"{base}.k_rep", rep)],
                      groups=m.groups)
        (v,) = t.emit("repeat_kv", f"{base}.repeat_v", [v], [(f"{base}.v_rep", rep)],
                      groups=m.groups)
    scores = TensorType((b, m.num_heads, T, SYMBOL))
    (s,) = t.emit("attn_scores", f"{base}.scores", [q, k], [(f"{base}.scores", scores)],
                  scale=float(m.scale), **heads)
    (p,) = t.emit("softmax", f"{base}.softmax", [s, mask], [(f"{base}.probs", scores)])
    return t.emit("attn_values", f"{base}.values", [p, v], [(f"{base}.out", t.ttype(outs[0]))],
                  **heads)


def _silu_gate(t: _Translator, r: _Region, ins, outs):
    if len(ins) != 2:
        raise CaptureError(f"SiLUGate at '{r.path}' needs (gate, up)")
    name = t.short(r.path)
    return t.emit("silu_gate", name, ins, [(name, t.ttype(outs[0]))])


_TranslateFn = Callable[[_Translator, _Region, list, list], list]

#: Leaf module type -> (translation, ATen ops its region may contain).
_LEAVES: dict[type, tuple[_TranslateFn, frozenset[str]]] = {
    nn.Embedding: (_embed, frozenset({"embedding"})),
    StepPositions: (_positions, frozenset({"slice", "to", "arange", "unsqueeze", "add", "sub",
                                           "full", "le", "gt", "masked_fill",
                                           "bitwise_and", "logical_and", "__and__",
                                           "_assert_tensor_metadata"})),
    RMSNorm: (_rmsnorm, frozenset({"to", "pow", "mean", "add", "rsqrt", "mul",
                                   "_assert_tensor_metadata"})),
    nn.Linear: (_linear, frozenset({"linear"})),
    Rotary: (_rope, frozenset({"mul", "slice", "neg", "cat", "add"})),
    KVCache: (_kv_update, frozenset({"select", "slice", "copy_"})),
    AttentionProducts: (_attention, frozenset({"repeat_interleave", "transpose", "matmul",
                                               "mul", "add", "softmax", "to",
                                               "_assert_tensor_metadata"})),
    SiLUGate: (_silu_gate, frozenset({"silu", "mul"})),
}
