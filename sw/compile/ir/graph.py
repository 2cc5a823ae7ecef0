"""The compiler's intermediate representation: a small typed graph of the ops the accelerator
and its host know.

A :class:`Graph` is one model *step* (a prefill of ``T`` tokens, or one decode token): nodes in
topological order, each reading and writing named values whose :class:`TensorType` has integer
dimensions and the symbol ``"S"`` (the key positions the step attends to: cached ones plus its
own, known only when the step runs). Graphs are immutable; every pass is a pure function
``Graph -> Graph``. Weights are not in the graph: nodes name them (``attrs["weight"]``) and the
compiler looks them up in the model.

The op set is the registry :data:`sw.compile.ir.ops.OPS`; a graph is valid when every node is
a registered op with its arity, its attributes and output types its shape rule accepts
(:meth:`Graph.validate`).

Example
-------
>>> g = Graph(nodes=(Node("n0", "add", ("a", "b"), ("c",)),),
...           values={k: TensorType((1, 4)) for k in "abc"}, inputs=("a", "b"),
...           outputs=("c",))
>>> g.producer("c").op, g.users("a")[0].name
('add', 'n0')
>>> Graph(nodes=(Node("n0", "rmsnorm", ("a",), ("c",)),), values=g.values, inputs=("a",),
...       outputs=("c",))
Traceback (most recent call last):
...
sw.compile.errors.IRError: node 'n0': rmsnorm needs attribute 'weight'
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sw.compile.errors import IRError
from sw.compile.ir.ops import OPS
from sw.compile.ir.types import TensorType

__all__ = ["Node", "Graph"]


@dataclass(frozen=True)
class Node:
    """One operation: reads ``inputs``, writes ``outputs`` (value names); ``attrs`` are
    JSON-serialisable constants (weight names, epsilons, layer indices...)."""

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def with_(self, **changes) -> Node:
        """A copy with some fields replaced (``attrs`` merged when given as a dict)."""
        if "attrs" in changes:
            changes["attrs"] = {**self.attrs, **changes["attrs"]}
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        attrs = ", ".join(f"{k}={v}" for k, v in self.attrs.items())
        return (f"{', '.join(self.outputs)} = {self.op}({', '.join(self.inputs)})"
                + (f"  [{attrs}]" if attrs else ""))


@dataclass(frozen=True)
class Graph:
    """One model step as a typed dataflow graph (see the module docstring).

    ``meta`` holds the step (``phase``, ``tokens``) and the model's configuration.
    """

    nodes: tuple[Node, ...]
    values: Mapping[str, TensorType]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    meta: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        self.validate()

    # ------------------------------------------------------------------ queries
    def producer(self, value: str) -> Node | None:
        """The node writing ``value`` (None for graph inputs)."""
        return self._index()[0].get(value)

    def users(self, value: str) -> list[Node]:
        """Nodes reading ``value``, in graph order."""
        return self._index()[1].get(value, [])

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise IRError(f"no node named {name!r}")

    def _index(self):
        idx = self.__dict__.get("_idx")
        if idx is None:
            prod, users = {}, {}
            for n in self.nodes:
                for o in n.outputs:
                    prod[o] = n
                for i in n.inputs:
                    users.setdefault(i, []).append(n)
            idx = (prod, users)
            object.__setattr__(self, "_idx", idx)
        return idx

    def dead_after(self, i: int) -> list[str]:
        """Values no node after node ``i`` reads (graph inputs and outputs excluded)."""
        dead = self.__dict__.get("_dead")
        if dead is None:
            last: dict[str, int] = {}
            for k, n in enumerate(self.nodes):
                for v in (*n.inputs, *n.outputs):
                    last[v] = k
            dead = [[] for _ in self.nodes]
            keep = set(self.inputs) | set(self.outputs)
            for v, k in last.items():
                if v not in keep:
                    dead[k].append(v)
            object.__setattr__(self, "_dead", dead)
        return dead[i]

    def count(self, op: str | None = None) -> int:
        """Number of nodes (of ``op``)."""
        return sum(op is None or n.op == op for n in self.nodes)

    # ------------------------------------------------------------------ building
    def replace(self, nodes: Iterable[Node] | None = None, **changes) -> Graph:
        """A new graph with other nodes (unused values are dropped) or other fields."""
        if nodes is not None:
            nodes = tuple(nodes)
            used = set(self.inputs) | set(self.outputs)
            for n in nodes:
                used.update(n.inputs)
                used.update(n.outputs)
            values = changes.pop("values", self.values)
            changes["values"] = {k: v for k, v in values.items() if k in used}
            changes["nodes"] = nodes
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise :class:`~sw.compile.errors.IRError` unless every value is typed, defined once
        before its use, and every node is a registered op whose arity, attributes and shapes
        its definition accepts (:meth:`sw.compile.ir.ops.OpDef.check`)."""
        defined = set(self.inputs)
        for name in self.inputs:
            if name not in self.values:
                raise IRError(f"graph input {name!r} has no type")
        names = set()
        for n in self.nodes:
            if n.op not in OPS:
                raise IRError(f"node {n.name!r}: unknown op {n.op!r}")
            if n.name in names:
                raise IRError(f"two nodes named {n.name!r}")
            names.add(n.name)
            for i in n.inputs:
                if i not in defined:
                    raise IRError(f"node {n.name!r} reads {i!r} before it is written")
            for o in n.outputs:
                if o in defined:
                    raise IRError(f"value {o!r} written twice (node {n.name!r})")
                if o not in self.values:
                    raise IRError(f"node {n.name!r}: output {o!r} has no type")
                defined.add(o)
            problem = OPS[n.op].check(n, [self.values[i] for i in n.inputs],
                                      [self.values[o] for o in n.outputs])
            if problem:
                raise IRError(f"node {n.name!r}: {problem}")
        for o in self.outputs:
            if o not in defined:
                raise IRError(f"graph output {o!r} is never written")

    # ------------------------------------------------------------------ text and JSON
    def __str__(self) -> str:
        lines = [f"graph {self.meta.get('phase', '')}({', '.join(self.inputs)}) "
                 f"-> {', '.join(self.outputs)}"]
        for n in self.nodes:
            types = ", ".join(str(self.values[o]) for o in n.outputs)
            lines.append(f"  {n}    : {types}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"nodes": [{"name": n.name, "op": n.op, "inputs": list(n.inputs),
                           "outputs": list(n.outputs), "attrs": dict(n.attrs)}
                          for n in self.nodes],
                "values": {k: {"shape": list(v.shape), "dtype": v.dtype}
                           for k, v in self.values.items()},
                "inputs": list(self.inputs), "outputs": list(self.outputs),
                "meta": dict(self.meta)}

    @classmethod
    def from_dict(cls, d: dict) -> Graph:
        try:
            return cls(
                nodes=tuple(Node(n["name"], n["op"], tuple(n["inputs"]), tuple(n["outputs"]),
                                 dict(n["attrs"])) for n in d["nodes"]),
                values={k: TensorType(tuple(v["shape"]), v["dtype"])
                        for k, v in d["values"].items()},
                inputs=tuple(d["inputs"]), outputs=tuple(d["outputs"]), meta=dict(d["meta"]))
        except (KeyError, TypeError) as e:
            raise IRError(f"malformed graph document: {e!r}") from None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Graph:
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as e:
            raise IRError(f"graph is not valid JSON: {e}") from None
