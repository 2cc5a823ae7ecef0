"""The vector unit's numerics end to end: the model-level twin with ``vector=True``, the IR
interpreter with ``Numerics(vector=True)`` and the runtime with ``vector=True`` agree bit for
bit (logits and tokens), and the mode changes what the host computes."""

import copy

import pytest
import torch
from compile_testutil import SMALL, compressed, tiny_lm, twin_step_logits

from hw.config import AcceleratorConfig
from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model
from sw.compile.capture import capture
from sw.compile.ir import Interpreter, Numerics
from sw.compress.model import use_hardware_numerics
from sw.compress.vector import VectorDecoderLayer, VectorRMSNorm
from sw.models.generate import generate
from sw.runtime import Runtime

PROMPT, STEPS = 6, 4


def _ids(lm, n, seed=7):
    return torch.randint(0, lm.config.vocab_size, (1, n),
                         generator=torch.Generator().manual_seed(seed))


def _twin(lm, weights):
    return use_hardware_numerics(copy.deepcopy(lm), weights, vector=True)


def _runtime_logits(rt, ids, prompt):
    chunks = [ids[:, :prompt]] + [ids[:, p:p + 1] for p in range(prompt, ids.shape[1])]
    return [rt.step(c)[0] for c in chunks]


def test_twin_installs_the_vector_modules_and_keeps_parameter_names():
    lm = tiny_lm(layers=1)
    ws = compressed(lm)
    twin = _twin(lm, ws)
    assert isinstance(twin.model.layers[0], VectorDecoderLayer)
    assert isinstance(twin.model.norm, VectorRMSNorm)
    assert twin.model.layers[0].self_attn.products.vector
    assert set(dict(twin.named_parameters())) <= set(dict(lm.named_parameters()))


def test_interpreter_equals_the_vector_twin_bit_for_bit():
    lm = tiny_lm()
    ws = compressed(lm)
    twin = _twin(lm, ws)
    it = Interpreter.of(lm, Numerics(ws, attention=True, vector=True), max_len=PROMPT + STEPS)
    pre, dec = capture(lm, "prefill", PROMPT).graph, capture(lm, "decode").graph
    ids = _ids(lm, PROMPT + STEPS)
    want = twin_step_logits(twin, ids, PROMPT)
    got = [it.step(pre, ids[:, :PROMPT], 0)] + [
        it.step(dec, ids[:, p:p + 1], p) for p in range(PROMPT, PROMPT + STEPS)]
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    # the mode is not a no-op: float host ops give other logits
    float_twin = use_hardware_numerics(copy.deepcopy(lm), ws, attention=True)
    assert not torch.equal(twin_step_logits(float_twin, ids, PROMPT)[0], want[0])


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
def test_runtime_equals_the_vector_twin_bit_for_bit(fuse):
    lm = tiny_lm()
    ws = compressed(lm)
    exe = compile_model(lm, SMALL, CompileOptions(PROMPT, PROMPT + STEPS, fuse=fuse),
                        weights=ws)
    ids = _ids(lm, PROMPT + STEPS)
    got = _runtime_logits(Runtime(exe, make_backend("model", SMALL), vector=True), ids, PROMPT)
    for a, b in zip(got, twin_step_logits(_twin(lm, ws), ids, PROMPT), strict=True):
        assert torch.equal(a, b)


def test_reference_model_tokens_equal_the_vector_twin():
    from sw.models.reference_model import load_reference
    lm = load_reference()
    ws = compressed(lm, "2:4", 128)
    cfg = AcceleratorConfig()
    prompt, new = 8, 6
    exe = compile_model(lm, cfg, CompileOptions(prompt, prompt + new), weights=ws)
    ids = _ids(lm, prompt)
    rt = Runtime(exe, make_backend("model", cfg), vector=True)
    gen = rt.generate(ids[0].tolist(), new)
    twin_out = generate(_twin(lm, ws), ids[0], new)
    assert gen.tokens == twin_out[prompt:].tolist()


def test_a_fused_chain_equals_the_twin_where_activations_pass_256():
    """The fused chains read the residual stream, the down projection's DEQUANT rows and the
    norms' results on chip as the exact Q15.16 words; the host and the twin carry them as
    float64 (:func:`hw.numerics.from_fixed`), so they agree beyond 256 in magnitude too, where
    float32 would round a word (SmolLM2's residual stream goes far beyond). The down
    projections are scaled up so that the residual stream passes 256 in every step."""
    from hw.config import VECTOR_PRESET_SPADS

    lm = tiny_lm()
    with torch.no_grad():
        for layer in lm.model.layers:
            layer.mlp.down_proj.weight.mul_(2.0e5)
    ws = compressed(lm)
    cfg = SMALL.replace(**VECTOR_PRESET_SPADS)
    exe = compile_model(lm, cfg, CompileOptions(PROMPT, PROMPT + STEPS), weights=ws)
    assert any(len(p.parts) > 2 for p in exe.programs)  # chains, not only pairs
    ids = _ids(lm, PROMPT + STEPS)
    twin = _twin(lm, ws)
    peak = []
    twin.model.layers[0].register_forward_hook(
        lambda m, i, out: peak.append(float(out.abs().max())))
    want = twin_step_logits(twin, ids, PROMPT)
    assert len(peak) == STEPS + 1 and 256 <= min(peak) and max(peak) < 32768, peak
    got = _runtime_logits(Runtime(exe, make_backend("model", cfg), vector=True), ids, PROMPT)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
