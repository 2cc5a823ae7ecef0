"""Graph passes: small pure functions ``Graph -> (Graph, matches)``, run to a fixpoint.

Every pass keeps what the graph computes bit for bit, in float and in the accelerator's
numerics (tests interpret the graph before and after, :mod:`sw.compile.ir.interpret`):

``dce``
    drops nodes whose outputs nothing reads (side effects -- the KV cache writes -- stay).
``gqa``
    grouped-query attention without materialising repeated K/V: attention products read the
    kv heads directly; the query heads that share a kv head become ``groups * T`` rows of one
    product against that head's cache, instead of one product per query head against a
    repeated copy.
``group_linears``
    linears on the accelerator that read the same input (q/k/v, gate/up) become one
    ``linears`` node: one program, whose double-buffered pipeline runs on across the layers.
``fuse_residual``
    the residual addition after a linear becomes the linear's epilogue (``linear(x, r)``):
    the dequantised GEMM output is added as it is read back, never stored on its own.
``last_token_logits`` (on request: it changes the output to the last position only)
    the LM head reads only the last position, all that generation needs.

:func:`run_passes` applies them until none matches and reports each pass's wall time, node
counts and matches (FORGE-UGC's per-pass accounting).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from sw.compile.errors import PassError
from sw.compile.ir import OPS, Graph, Node, TensorType

__all__ = ["PassReport", "Pass", "dce", "gqa", "group_linears", "fuse_residual",
           "last_token_logits", "default_passes", "run_passes"]

Pass = Callable[[Graph], tuple[Graph, int]]

@dataclass(frozen=True)
class PassReport:
    """One application of a pass."""

    name: str
    seconds: float
    nodes_before: int
    nodes_after: int
    matches: int

    def to_dict(self) -> dict:
        return {"pass": self.name, "seconds": self.seconds, "nodes_before": self.nodes_before,
                "nodes_after": self.nodes_after, "matches": self.matches}


def dce(g: Graph) -> tuple[Graph, int]:
    """Remove nodes none of whose outputs is read (ops with side effects are kept)."""
    live = set(g.outputs)
    keep: list[Node] = []
    for n in reversed(g.nodes):
        if OPS[n.op].side_effect or any(o in live for o in n.outputs):
            keep.append(n)
            live.update(n.inputs)
    removed = len(g.nodes) - len(keep)
    return (g.replace(nodes=reversed(keep)) if removed else g), removed


def gqa(g: Graph) -> tuple[Graph, int]:
    """Attention products read kv heads directly instead of ``repeat_kv`` copies."""
    source = {n.outputs[0]: n.inputs[0] for n in g.nodes if n.op == "repeat_kv"}
    matches = 0
    nodes = []
    for n in g.nodes:
        if OPS[n.op].streams == "kv" and n.inputs[1] in source:
            n = n.with_(inputs=(n.inputs[0], source[n.inputs[1]]))
            matches += 1
        nodes.append(n)
    if not matches:
        return g, 0
    return dce(g.replace(nodes=nodes))[0], matches


def group_linears(g: Graph, accelerated: Collection[str]) -> tuple[Graph, int]:
    """Linears of ``accelerated`` weights (module names) that read one input -> ``linears``."""
    by_input: dict[str, list[Node]] = {}
    for n in g.nodes:
        if n.op == "linear" and len(n.inputs) == 1 and \
                n.attrs["weight"].removesuffix(".weight") in accelerated:
            by_input.setdefault(n.inputs[0], []).append(n)
    groups = {members[0].name: members for members in by_input.values() if len(members) > 1}
    if not groups:
        return g, 0
    grouped = {m.name for members in groups.values() for m in members}
    nodes = []
    for n in g.nodes:
        if n.name in groups:
            members = groups[n.name]
            attrs = {"weights": [m.attrs["weight"] for m in members]}
            if any("bias" in m.attrs for m in members):
                attrs["biases"] = [m.attrs.get("bias") for m in members]
            nodes.append(Node(f"{n.name}+{len(members) - 1}", "linears", n.inputs,
                              tuple(m.outputs[0] for m in members), attrs))
        elif n.name not in grouped:
            nodes.append(n)
    return g.replace(nodes=nodes), len(groups)


def fuse_residual(g: Graph) -> tuple[Graph, int]:
    """``add(r, linear(x))`` with the linear read only there -> ``linear(x, r)``."""
    fused: dict[str, tuple[Node, str]] = {}   # add name -> (linear, residual value)
    for n in g.nodes:
        if n.op != "add" or n.inputs[0] == n.inputs[1]:
            continue
        for i, v in enumerate(n.inputs):
            p = g.producer(v)
            if p is not None and p.op == "linear" and len(p.inputs) == 1 and \
                    len(g.users(v)) == 1 and v not in g.outputs:
                fused[n.name] = (p, n.inputs[1 - i])
                break
    if not fused:
        return g, 0
    moved = {lin.name for lin, _ in fused.values()}
    nodes = []
    for n in g.nodes:
        if n.name in fused:  # the linear takes the add's place, where the residual is ready
            lin, residual = fused[n.name]
            nodes.append(lin.with_(inputs=(lin.inputs[0], residual), outputs=n.outputs,
                                   attrs={"residual": True}))
        elif n.name not in moved:
            nodes.append(n)
    return g.replace(nodes=nodes), len(fused)


def last_token_logits(g: Graph) -> tuple[Graph, int]:
    """Only the last position's logits: the output linear reads ``last_token(x)`` (what
    generation needs; the graph's output then has one position)."""
    out = g.outputs[0]
    head = g.producer(out)
    if head is None or head.op != "linear" or len(head.inputs) != 1:
        return g, 0
    src = g.producer(head.inputs[0])
    if src is not None and src.op == "last_token":
        return g, 0
    x = g.values[head.inputs[0]]
    if x.shape[-2] == 1:
        return g, 0
    last = f"{head.inputs[0]}.last"
    values = {**g.values, last: TensorType((*x.shape[:-2], 1, x.shape[-1]), x.dtype),
              out: TensorType((*x.shape[:-2], 1, g.values[out].shape[-1]),
                              g.values[out].dtype)}
    nodes = []
    for n in g.nodes:
        if n is head:
            nodes.append(Node(f"{n.name}.last_token", "last_token", n.inputs, (last,)))
            n = n.with_(inputs=(last,))
        nodes.append(n)
    return g.replace(nodes=nodes, values=values), 1


def default_passes(accelerated: Collection[str], *, fuse: bool = True) -> list[tuple[str, Pass]]:
    """The compiler's pipeline: DCE always; GQA, grouping and epilogue fusion unless
    ``fuse`` is off (the unfused baseline the benchmarks compare against)."""
    passes: list[tuple[str, Pass]] = [("dce", dce)]
    if fuse:
        passes += [("gqa", gqa),
                   ("group_linears", lambda g: group_linears(g, accelerated)),
                   ("fuse_residual", fuse_residual)]
    return passes


def run_passes(g: Graph, passes: Sequence[tuple[str, Pass]], max_rounds: int = 10
               ) -> tuple[Graph, list[PassReport]]:
    """Apply ``passes`` in order, repeatedly, until a whole round matches nothing.

    Raises
    ------
    PassError
        Still matching after ``max_rounds`` rounds.
    """
    reports = []
    for _ in range(max_rounds):
        changed = False
        for name, fn in passes:
            t0 = time.perf_counter()
            before = len(g.nodes)
            g, matches = fn(g)
            reports.append(PassReport(name, time.perf_counter() - t0, before, len(g.nodes),
                                      matches))
            changed |= matches > 0
        if not changed:
            return g, reports
    raise PassError(f"passes {[name for name, _ in passes]} did not reach a fixpoint in "
                    f"{max_rounds} rounds")
