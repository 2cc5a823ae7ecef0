"""Every pass keeps what the graph computes bit for bit, in float and in the accelerator's
numerics, and the pipeline reaches a fixpoint."""

import pytest
import torch
from compile_testutil import compressed, tiny_lm

from sw.compile.capture import capture
from sw.compile.ir import Interpreter, Numerics
from sw.compile.passes import (
    dce,
    default_passes,
    fuse_residual,
    gqa,
    group_linears,
    run_passes,
)

PROMPT, STEPS = 5, 3


def _outputs(lm, numerics, graphs, seed=3):
    """Logits of a prefill and decode steps interpreted with ``graphs`` (prefill, decode)."""
    it = Interpreter.of(lm, numerics, max_len=PROMPT + STEPS)
    ids = torch.randint(0, lm.config.vocab_size, (1, PROMPT + STEPS),
                        generator=torch.Generator().manual_seed(seed))
    out = [it.step(graphs[0], ids[:, :PROMPT], 0)]
    for p in range(PROMPT, PROMPT + STEPS):
        out.append(it.step(graphs[1], ids[:, p:p + 1], p))
    return out


@pytest.fixture(scope="module", params=[(2, 4, 2), (1, 4, 1), (2, 2, 2)],
                ids=["gqa2", "mqa", "mha"])
def model(request):
    layers, heads, kv = request.param
    lm = tiny_lm(layers=layers, heads=heads, kv_heads=kv, seed=layers + heads + kv)
    weights = compressed(lm)
    graphs = (capture(lm, "prefill", PROMPT).graph, capture(lm, "decode").graph)
    return lm, weights, graphs


PASSES = {"dce": dce, "gqa": gqa, "fuse_residual": fuse_residual}


@pytest.mark.parametrize("name", ["dce", "gqa", "group_linears", "fuse_residual", "pipeline"])
@pytest.mark.parametrize("hardware", [False, True], ids=["float", "hardware"])
def test_pass_preserves_outputs(model, name, hardware):
    lm, weights, graphs = model
    numerics = Numerics(weights, attention=True) if hardware else Numerics()
    if name == "pipeline":
        after = tuple(run_passes(g, default_passes(weights))[0] for g in graphs)
    elif name == "group_linears":
        after = tuple(group_linears(g, weights)[0] for g in graphs)
    else:
        after = tuple(PASSES[name](g)[0] for g in graphs)
    for a, b in zip(_outputs(lm, numerics, graphs), _outputs(lm, numerics, after), strict=True):
        assert torch.equal(a, b)


def test_passes_do_what_they_say(model):
    lm, weights, (_, g) = model
    layers, groups = lm.config.num_hidden_layers, lm.config.num_kv_groups
    g2, n = gqa(g)
    assert n == (2 * layers if groups > 1 else 0) and g2.count("repeat_kv") == 0
    g3, n = group_linears(g2, weights)
    assert n == 2 * layers                          # q/k/v and gate/up of every block
    assert g3.count("linears") == 2 * layers and g3.count("linear") == 2 * layers + 1
    g4, n = fuse_residual(g3)
    assert n == 2 * layers and g4.count("add") == 0  # o_proj and down_proj take the residual
    assert all(len(x.inputs) == 2 for x in g4.nodes if x.attrs.get("residual"))
    # only accelerated layers are grouped
    assert group_linears(g2, set())[1] == 0


def test_pipeline_reaches_a_fixpoint_and_reports(model):
    _, weights, (_, g) = model
    out, reports = run_passes(g, default_passes(weights))
    last_round = reports[-4:]
    assert [r.name for r in last_round] == ["dce", "gqa", "group_linears", "fuse_residual"]
    assert all(r.matches == 0 and r.nodes_before == r.nodes_after for r in last_round)
    assert all(r.seconds >= 0 for r in reports)
    assert run_passes(out, default_passes(weights))[0] == out
    unfused, _ = run_passes(g, default_passes(weights, fuse=False))
    assert unfused.count("linears") == 0 and len(unfused.nodes) > len(out.nodes)


def test_dce_keeps_cache_writes_and_removes_dead_nodes(model):
    _, _, (_, g) = model
    from sw.compile.ir import Node, TensorType
    extra = Node("dead", "add", (g.outputs[0], g.outputs[0]), ("dead.out",))
    dirty = g.replace(nodes=(*g.nodes, extra),
                      values={**g.values, "dead.out": g.values[g.outputs[0]]})
    clean, n = dce(dirty)
    assert n == 1 and clean.count("kv_update") == g.count("kv_update")
    assert isinstance(clean.values[g.outputs[0]], TensorType)
