"""Capture: torch.export of a step, translated into the IR; the IR's interpreter reproduces the
model bit for bit, and anything the IR does not know is refused by name."""

import copy

import pytest
import torch
from compile_testutil import compressed, tiny_lm
from torch import nn

from sw.compile.capture import capture
from sw.compile.errors import CaptureError
from sw.compile.ir import SYMBOL, Graph, Interpreter, IRError, Node, Numerics, TensorType
from sw.compress.model import use_hardware_numerics


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_captured_graph_has_the_model_ops(kv_heads):
    lm = tiny_lm(layers=2, kv_heads=kv_heads)
    g = capture(lm, "decode").graph
    counts = {op: g.count(op) for op in ("embed", "positions", "rmsnorm", "linear", "rope",
                                         "kv_update", "repeat_kv", "attn_scores", "softmax",
                                         "attn_values", "silu_gate", "add")}
    assert counts == {"embed": 1, "positions": 1, "rmsnorm": 5, "linear": 15, "rope": 4,
                      "kv_update": 2, "repeat_kv": 0 if kv_heads == 4 else 4,
                      "attn_scores": 2, "softmax": 2, "attn_values": 2, "silu_gate": 2,
                      "add": 4}
    assert g.values["mask"].shape == (1, SYMBOL)   # key positions are symbolic
    assert g.values[g.outputs[0]].shape == (1, 1, 64)


def _run_both(lm, twin, numerics, prompt=6, steps=4, seed=1):
    """Interpreted prefill + decode steps against the model (or twin) with its own cache."""
    pre, dec = capture(lm, "prefill", prompt).graph, capture(lm, "decode").graph
    it = Interpreter.of(lm, numerics, max_len=prompt + steps)
    cache = twin.new_cache(1, prompt + steps)
    ids = torch.randint(0, lm.config.vocab_size, (1, prompt + steps),
                        generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        assert torch.equal(twin(ids[:, :prompt], cache=cache, start_pos=0),
                           it.step(pre, ids[:, :prompt], 0))
        for p in range(prompt, prompt + steps):
            assert torch.equal(twin(ids[:, p:p + 1], cache=cache, start_pos=p),
                               it.step(dec, ids[:, p:p + 1], p))


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_interpreted_graph_equals_the_model_bit_for_bit(kv_heads):
    lm = tiny_lm(kv_heads=kv_heads)
    _run_both(lm, lm, Numerics())


def test_interpreted_graph_equals_the_hardware_twin_bit_for_bit():
    lm = tiny_lm()
    ws = compressed(lm)
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, attention=True)
    _run_both(lm, twin, Numerics(ws, attention=True))


def test_capture_on_the_meta_device():
    with torch.device("meta"):
        lm = tiny_lm()
    g = capture(lm, "prefill", 5).graph
    assert g.values[g.outputs[0]].shape == (1, 5, 64)


class _Tanh(nn.Module):
    def forward(self, gate, up):
        return torch.tanh(gate) * up


def test_unsupported_op_names_the_op_the_node_and_the_module():
    lm = tiny_lm(layers=1)
    lm.model.layers[0].mlp.act = _Tanh()
    with pytest.raises(CaptureError, match=r"aten\.tanh.* at node '\w+' \(in module "
                                           r"'model\.layers\.0\.mlp\.act'\)"):
        capture(lm, "decode")


def test_a_modified_leaf_module_is_refused():
    """A leaf is recognised by its exact type: a subclass is not trusted to compute the same,
    and an instance whose forward was replaced is caught by the ops its region contains."""
    lm = tiny_lm(layers=1)
    rotary = lm.model.layers[0].self_attn.rotary

    class Scaled(type(rotary)):
        def forward(self, x, cos, sin):
            return super().forward(x, cos, sin).exp()

    lm.model.layers[0].self_attn.rotary = Scaled()
    with pytest.raises(CaptureError, match=r"aten\.mul.*'model\.layers\.0\.self_attn\.rotary'"):
        capture(lm, "prefill", 3)
    rotary.forward = lambda x, cos, sin: (x * cos + sin).exp()
    lm.model.layers[0].self_attn.rotary = rotary
    with pytest.raises(CaptureError, match=r"aten\.exp.* inside Rotary"):
        capture(lm, "prefill", 3)


def test_a_biased_linear_keeps_its_bias():
    lm = tiny_lm(layers=1, model_type="qwen2", qkv_bias=True)
    g = capture(lm, "decode").graph
    biased = [n for n in g.nodes if "bias" in n.attrs]
    assert [n.name for n in biased] == [f"layers.0.self_attn.{p}_proj" for p in "qkv"]
    assert biased[0].attrs["bias"] == "model.layers.0.self_attn.q_proj.bias"
    _run_both(lm, lm, Numerics())


@pytest.mark.parametrize("phase, tokens, msg", [("train", 1, "phase"), ("prefill", 0, "tokens"),
                                                ("prefill", 65, "tokens")])
def test_bad_capture_arguments(phase, tokens, msg):
    with pytest.raises(CaptureError, match=msg):
        capture(tiny_lm(layers=1), phase, tokens)


def test_graph_json_round_trip_and_validation():
    g = capture(tiny_lm(layers=1), "decode").graph
    assert Graph.from_json(g.to_json()).to_dict() == g.to_dict()
    t = {k: TensorType((1, 4)) for k in "abc"}
    with pytest.raises(IRError, match="reads 'z' before"):
        Graph((Node("n", "add", ("a", "z"), ("c",)),), t, ("a", "b"), ("c",))
    with pytest.raises(IRError, match="unknown op 'mul'"):
        Graph((Node("n", "mul", ("a", "b"), ("c",)),), t, ("a", "b"), ("c",))
    with pytest.raises(IRError, match="takes 2 inputs"):
        Graph((Node("n", "add", ("a",), ("c",)),), t, ("a", "b"), ("c",))
    with pytest.raises(IRError, match="written twice"):
        Graph((Node("n", "add", ("a", "b"), ("a",)),), t, ("a", "b"), ("a",))
    with pytest.raises(IRError, match="malformed"):
        Graph.from_dict({"nodes": [{"name": "x"}]})


def test_a_fake_constant_export_is_repeated_once(monkeypatch):
    """torch.export's fake-constant error (seen once in a Dask worker) is retried once; the
    second capture is the same graph; twice in a row, the error goes through."""
    from sw.compile import capture as cap
    lm = tiny_lm()
    real, calls = torch.export.export, []

    def flaky(*a, failures, **k):
        calls.append(1)
        if len(calls) <= failures:
            raise RuntimeError(f"We found a {cap._FAKE_CONSTANT}'s list. ...")
        return real(*a, **k)

    expected = capture(lm, "decode").graph
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: flaky(*a, failures=1, **k))
    assert capture(lm, "decode").graph == expected and len(calls) == 2
    calls.clear()
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: flaky(*a, failures=2, **k))
    with pytest.raises(RuntimeError, match="fake tensor"):
        capture(lm, "decode")
    assert len(calls) == 2
