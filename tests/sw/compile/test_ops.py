"""The op registry: complete, its schemas enforced, and adding an op is one entry plus its
lowering."""

import dataclasses

import pytest
import torch
from compile_testutil import SMALL, compressed, tiny_lm

from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model
from sw.compile.capture import capture
from sw.compile.compiler import capture_model
from sw.compile.errors import (
    CaptureError,
    CompileError,
    ExecutableError,
    IRError,
    LoweringError,
    PassError,
    PlanError,
)
from sw.compile.ir import OPS, Graph, Interpreter, Node, OpDef, TensorType
from sw.compile.ir.ops import free, stream_cycles
from sw.compile.lower import LOWERINGS, _linear_members
from sw.compile.passes import dce
from sw.compile.vector import VECTOR_LOWERINGS
from sw.runtime import Runtime


def test_every_compiler_error_is_a_compile_error():
    for e in (CaptureError, IRError, PassError, LoweringError, PlanError, ExecutableError):
        assert issubclass(e, CompileError)


def test_every_accelerator_op_has_a_lowering_and_nothing_else_does():
    assert set(LOWERINGS) == {name for name, d in OPS.items() if d.streams}
    # an op with a VEC sub-op has a vector lowering (and streams no weights)
    assert set(VECTOR_LOWERINGS) == {name for name, d in OPS.items() if d.vector}
    assert not any(d.vector and d.streams for d in OPS.values())


@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_captured_graphs_use_every_attribute_as_declared(phase):
    g = capture(tiny_lm(layers=1, model_type="qwen2", qkv_bias=True), phase, 3).graph
    for n in g.nodes:
        d = OPS[n.op]
        assert {k for k, a in d.attrs.items() if a.required} <= set(n.attrs) <= set(d.attrs)


def _graph(node: Node, values: dict) -> Graph:
    ins = tuple(v for v in values if v not in node.outputs)
    return Graph((node,), values, ins, node.outputs)


@pytest.mark.parametrize("node, values, msg", [
    (Node("n", "rmsnorm", ("a",), ("b",), {"weight": "w"}),
     {"a": TensorType((1, 4)), "b": TensorType((1, 4))}, "rmsnorm needs attribute 'eps'"),
    (Node("n", "rmsnorm", ("a",), ("b",), {"weight": "w", "eps": "small"}),
     {"a": TensorType((1, 4)), "b": TensorType((1, 4))}, "eps='small' of rmsnorm must be float"),
    (Node("n", "add", ("a", "b"), ("c",), {"alpha": 2.0}),
     {k: TensorType((1, 4)) for k in "abc"}, "add has no attribute 'alpha'"),
    (Node("n", "rmsnorm", ("a",), ("b",), {"weight": "w", "eps": 1e-5}),
     {"a": TensorType((1, 4)), "b": TensorType((1, 8))}, "differs from input"),
    (Node("n", "linear", ("a",), ("b",), {"weight": "w"}),
     {"a": TensorType((2, 4)), "b": TensorType((3, 8))}, "does not keep the rows"),
    (Node("n", "linear", ("a", "r"), ("b",), {"weight": "w"}),
     {"a": TensorType((2, 4)), "r": TensorType((2, 8)), "b": TensorType((2, 8))},
     "residual=True"),
    (Node("n", "transpose", ("a",), ("b",), {"dims": [0, 1]}),
     {"a": TensorType((2, 4)), "b": TensorType((2, 4))}, "swapped"),
    (Node("n", "view", ("a",), ("b",), {"shape": [3, 3]}),
     {"a": TensorType((2, 4)), "b": TensorType((3, 3))}, "different sizes"),
    (Node("n", "kv_update", ("k", "v"), ("K", "V"), {"layer": 0}),
     {"k": TensorType((1, 2, 1, 8)), "v": TensorType((1, 2, 1, 8)),
      "K": TensorType((1, 2, 4, 8)), "V": TensorType((1, 2, "S", 8))}, r"\[B, KV, S, d\]"),
    (Node("n", "attn_scores", ("q", "k"), ("s",),
          {"layer": 0, "heads": 4, "kv_heads": 2, "head_dim": 8,
           "scale": 0.25}),
     {"q": TensorType((1, 4, 1, 8)), "k": TensorType((1, 2, "S", 8)),
      "s": TensorType((1, 4, 1, 8))}, r"should be f32\[1, 4, 1, S\]"),
])
def test_validation_names_the_node_and_what_is_wrong(node, values, msg):
    with pytest.raises(IRError, match=f"node 'n': .*{msg}"):
        _graph(node, values)


def _double(node, args, env):
    return (args[0] * 2,)


def test_adding_a_host_op_is_one_entry(monkeypatch):
    """An entry gives the op validation, its semantics, its cost and the passes' view."""
    monkeypatch.setitem(OPS, "double", OpDef(
        "double", (1, 1), _double, lambda n, i, o: None if i[0] == o[0] else "shape",
        stream_cycles, doc="x * 2"))
    lm = tiny_lm(layers=1)
    g = capture(lm, "prefill", 3).graph
    x = g.outputs[0]
    values = {**g.values, "y": g.values[x]}
    g2 = g.replace(nodes=(*g.nodes, Node("double", "double", (x,), ("y",))), values=values,
                   outputs=("y",))
    ids = torch.randint(0, lm.config.vocab_size, (1, 3), generator=torch.Generator()
                        .manual_seed(0))
    ref = Interpreter.of(lm, max_len=3).step(g, ids, 0)
    assert torch.equal(Interpreter.of(lm, max_len=3).step(g2, ids, 0), 2 * ref)
    assert dce(g2)[1] == 0 and not OPS["double"].layout
    with pytest.raises(IRError, match="unknown op"):
        monkeypatch.delitem(OPS, "double")
        Graph.from_dict(g2.to_dict())


def test_adding_an_accelerator_op_is_one_entry_plus_its_lowering(monkeypatch):
    """A new op that streams weights: its entry and its lowering are all the compiler and
    the runtime need to partition, lower, run and account for it (here: the LM head as an op
    of its own, computing what ``linear`` computes)."""
    monkeypatch.setitem(OPS, "head", dataclasses.replace(OPS["linear"], name="head"))
    monkeypatch.setitem(LOWERINGS, "head", _linear_members)
    lm = tiny_lm(layers=1)
    weights = compressed(lm)
    options = CompileOptions(prompt_tokens=4, max_context=6)
    captured = capture_model(lm, options)
    renamed = {}
    for phase, cap in captured.items():
        g = cap.graph
        head = g.producer(g.outputs[0])
        nodes = [n.with_(op="head") if n is head else n for n in g.nodes]
        renamed[phase] = dataclasses.replace(cap, graph=g.replace(nodes=nodes))
    base = compile_model(lm, SMALL, options, weights=weights, captured=captured)
    new = compile_model(lm, SMALL, options, weights=weights, captured=renamed)
    assert [p.node for p in new.programs] == [p.node for p in base.programs]
    assert {n.op for n in new.graphs["decode"].nodes} >= {"head"}
    ids = torch.randint(0, lm.config.vocab_size, (1, 5), generator=torch.Generator()
                        .manual_seed(1))
    runs = []
    for exe in (base, new):
        rt = Runtime(exe, make_backend("model", SMALL))
        steps = [rt.step(ids[:, :4]), rt.step(ids[:, 4:])]
        runs.append(([lg for lg, _ in steps], [st.cycles for _, st in steps]))
    assert all(torch.equal(a, b) for a, b in zip(runs[0][0], runs[1][0], strict=True))
    assert runs[0][1] == runs[1][1]


def test_layout_ops_are_free():
    assert {n for n, d in OPS.items() if d.layout} == \
        {"view", "reshape", "transpose", "last_token"}
    assert all(d.cost in (free, stream_cycles) for d in OPS.values())
