"""Whole-model compression (sw.compress.model) and the accuracy benchmark's record building."""

from __future__ import annotations

import copy
import doctest
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from hw.format import WeightFormat
from hw.numerics import golden_linear
from sw.compress import model as model_mod
from sw.compress.core import PaddingWarning, compress_matrix
from sw.compress.model import (
    COMPRESS_METHODS,
    HardwareLinear,
    compress_llama,
    prune_llama,
    selected_linears,
    use_hardware_numerics,
)
from sw.compress.prune import check_nm_mask
from sw.models import LlamaConfig, LlamaLM
from sw.models.eval import EvalProtocol


@pytest.fixture(autouse=True)
def _no_padding_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PaddingWarning)
        yield


def tiny_lm(seed: int = 0, layers: int = 2, tied: bool = False) -> LlamaLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=72, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=32, tie_word_embeddings=tied)
    return LlamaLM(cfg).eval()


def calib(n: int = 8, t: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (n, t), generator=torch.Generator().manual_seed(seed))


def test_doctests():
    assert doctest.testmod(model_mod).failed == 0


# ---------------------------------------------------------------------- HardwareLinear
@pytest.mark.parametrize("pattern,bits,group,symmetric,k", [
    ("2:4", 4, 128, True, 256), ("dense", 4, 32, True, 96), ("1:4", 8, 0, True, 64),
    ("4:8", 4, 64, False, 200), ("2:8", 4, 32, True, 72)])
def test_hardware_linear_equals_numpy_golden_bit_for_bit(pattern, bits, group, symmetric, k):
    rng = np.random.default_rng(k)
    w = rng.standard_normal((24, k)).astype(np.float32) * 0.05
    qw = compress_matrix(w, WeightFormat(pattern, bits, group, symmetric))
    lin = HardwareLinear(qw)
    for scale in (1.0, 30.0, 1e-3):
        x = (rng.standard_normal((3, 7, k)) * scale).astype(np.float32)
        x[0, 0] = 0.0  # an all-zero token (scale 1 path)
        x[1, 2, :5] = 1e4  # an outlier token
        got = lin(torch.from_numpy(x)).numpy()
        want = golden_linear(x.reshape(-1, k), qw).reshape(3, 7, -1)
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
    assert (lin.w_int.shape, lin.w_int.dtype) == ((24, k), torch.int32)
    with pytest.raises(ValueError, match="expects"):
        lin(torch.zeros(2, k + 1))


def test_hardware_linear_is_close_to_the_dequantised_float_layer():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((32, 128)).astype(np.float32)
    qw = compress_matrix(w, WeightFormat("2:4", 4, 64))
    x = torch.from_numpy(rng.standard_normal((50, 128)).astype(np.float32))
    ref = x @ torch.from_numpy(qw.dequantize()).T
    err = (HardwareLinear(qw)(x) - ref).norm() / ref.norm()
    # INT8 activations: small but non-zero. Measured 6.7e-3; the floor 1e-3 is far above
    # float32 rounding (~1e-7), so "non-zero" means quantisation error, not rounding noise.
    assert 1e-3 < float(err) < 0.02


# ---------------------------------------------------------------------- compress_llama
@pytest.mark.parametrize("method,pattern", [
    ("magnitude+rtn", "2:4"), ("wanda+rtn", "4:8"), ("sparsegpt+gptq", "2:4"),
    ("sparsegpt+rtn", "1:4"), ("wanda+gptq", "2:8"), ("magnitude+gptq", "2:4"),
    ("gptq", "dense"), ("rtn", "dense"), ("sparsegpt", "dense")])
def test_compress_llama_gives_nm_weights_and_a_running_model(method, pattern):
    lm = tiny_lm()
    fmt = WeightFormat(pattern, 4, 32)
    ids = calib(2, 12, seed=5)
    ws = compress_llama(lm, fmt, method, calib(), progress=False)
    linears = selected_linears(lm)
    assert list(ws) == list(linears) and "lm_head" not in ws and len(ws) == 2 * 7
    for name, qw in ws.items():
        w = linears[name].weight.detach().numpy()
        np.testing.assert_array_equal(w, qw.dequantize())  # written back exactly
        assert qw.fmt == fmt
        if not fmt.pattern.dense:
            kp = fmt.padded_k(w.shape[1])
            check_nm_mask(np.pad(w != 0, ((0, 0), (0, kp - w.shape[1]))), fmt.pattern)
    out = lm(ids)
    assert out.shape == (2, 12, 260) and torch.isfinite(out).all()


@pytest.mark.parametrize("method", ["sparsegpt+gptq", "sparsegpt+rtn"])
def test_per_layer_formats_mix_dense_and_sparse(method):
    """A callable format may give SparseGPT dense layers among sparse ones (the co-design
    search's assignments): dense layers take the joint sweep's dense case (GPTQ) or, for the
    float sweep, plain rounding -- what the uniform dense format gives them."""
    dense, sparse = WeightFormat("dense", 4, 32), WeightFormat("2:4", 4, 32)
    lm = tiny_lm()
    ws = compress_llama(lm, lambda n, m: dense if "mlp" in n else sparse, method, calib(),
                        progress=False)
    assert {qw.fmt for n, qw in ws.items() if "mlp" in n} == {dense}
    assert {qw.fmt for n, qw in ws.items() if "mlp" not in n} == {sparse}
    if method == "sparsegpt+rtn":  # the float sweep leaves dense layers to round to nearest
        first = "model.layers.0.mlp.gate_proj"
        rtn = compress_matrix(tiny_lm().get_submodule(first).weight.detach(), dense)
        assert ws[first].equals(rtn)


def test_sequential_one_shot_and_skip():
    base = tiny_lm()
    fmt = WeightFormat("2:4", 4, 32)
    a, b = copy.deepcopy(base), copy.deepcopy(base)
    wa = compress_llama(a, fmt, "sparsegpt+gptq", calib(), progress=False)
    wb = compress_llama(b, fmt, "sparsegpt+gptq", calib(), sequential=False, progress=False)
    # the first group sees the same (uncompressed) inputs either way
    first = "model.layers.0.self_attn.q_proj"
    assert wa[first].equals(wb[first])
    assert not wa["model.layers.1.mlp.down_proj"].equals(wb["model.layers.1.mlp.down_proj"])
    c = copy.deepcopy(base)
    wc = compress_llama(c, fmt, "wanda+gptq", calib(), skip=("lm_head", "down_proj"),
                        progress=False)
    assert len(wc) == 2 * 6 and not any(n.endswith("down_proj") for n in wc)
    torch.testing.assert_close(c.model.layers[1].mlp.down_proj.weight,
                               base.model.layers[1].mlp.down_proj.weight, rtol=0, atol=0)
    d = copy.deepcopy(base)
    wd = compress_llama(d, lambda n, m: fmt if "mlp" in n else None, "gptq", calib(),
                        skip=(), progress=False)
    assert sorted(wd) == sorted([f"model.layers.{i}.mlp.{p}_proj" for i in range(2)
                                 for p in ("gate", "up", "down")])
    e = copy.deepcopy(base)
    we = compress_llama(e, fmt, "sparsegpt+gptq", calib(), skip=(), progress=False)
    assert "lm_head" in we and we["lm_head"].shape == (260, 32)


def test_compress_llama_errors():
    lm = tiny_lm()
    fmt = WeightFormat("2:4", 4, 32)
    with pytest.raises(ValueError, match="unknown method"):
        compress_llama(lm, fmt, "nope", calib(), progress=False)
    with pytest.raises(Exception, match="needs calibration"):
        compress_llama(lm, fmt, "wanda+gptq", None, progress=False)
    with pytest.raises(ValueError, match="int64"):
        compress_llama(lm, fmt, "gptq", calib().float(), progress=False)
    with pytest.raises(ValueError, match="tied"):
        compress_llama(tiny_lm(tied=True), fmt, "rtn", skip=(), progress=False)
    with pytest.raises(TypeError, match="takes no options"):
        compress_llama(lm, fmt, "wanda", calib(), percdamp=0.1, progress=False)
    assert set(COMPRESS_METHODS) >= {"rtn", "gptq", "magnitude+rtn", "wanda+rtn",
                                     "sparsegpt+rtn", "magnitude+gptq", "wanda+gptq",
                                     "sparsegpt+gptq", "sparsegpt-joint"}


# ---------------------------------------------------------------------- prune_llama
@pytest.mark.parametrize("method", ["magnitude", "wanda", "sparsegpt"])
@pytest.mark.parametrize("pattern", ["2:4", "2:8"])
def test_prune_llama_float_masks(method, pattern):
    lm = tiny_lm()
    before = {n: m.weight.detach().clone() for n, m in selected_linears(lm).items()}
    masks = prune_llama(lm, pattern, method, calib(), weight_dtype=None, progress=False)
    for name, lin in selected_linears(lm).items():
        w = lin.weight.detach().numpy()
        check_nm_mask(masks[name], model_mod.NMPattern.parse(pattern))
        assert not w[~masks[name]].any()
        if method != "sparsegpt":  # no update: kept weights unchanged
            np.testing.assert_array_equal(w[masks[name]],
                                          before[name].numpy()[masks[name]])
    assert torch.isfinite(lm(calib(2, 8))).all()


def test_prune_llama_rounds_to_fp16_and_wanda_differs_from_magnitude():
    a, b = tiny_lm(), tiny_lm()
    ma = prune_llama(a, "2:4", "magnitude", progress=False)
    mb = prune_llama(b, "2:4", "wanda", calib(), progress=False)
    w = a.model.layers[0].mlp.up_proj.weight
    torch.testing.assert_close(w, w.half().float(), rtol=0, atol=0)
    assert any((ma[n] != mb[n]).any() for n in ma)
    with pytest.raises(ValueError, match="sparse"):
        prune_llama(a, "dense", "magnitude", progress=False)


# ---------------------------------------------------------------------- hardware model
def test_hardware_model_is_close_to_the_float_compressed_model():
    lm = tiny_lm()
    ws = compress_llama(lm, WeightFormat("2:4", 4, 32), "wanda+gptq", calib(), progress=False)
    ids = calib(2, 16, seed=9)
    with torch.no_grad():
        ref = lm(ids)
        hw = use_hardware_numerics(copy.deepcopy(lm), ws)
        got = hw(ids)
    n = sum(isinstance(m, HardwareLinear) for m in hw.modules())
    assert n == len(ws) and not any(isinstance(m, nn.Linear) and m is not hw.lm_head
                                    for m in hw.modules())
    # A tiny random model predicts nearly uniform distributions, so the KL between the two
    # models is ~1e-8: float32 rounding level, its sign set by the BLAS build and thread count
    # (issue 9). "They differ" is therefore asserted on the logits, never on the sign of KL.
    diff = float((got - ref).abs().max())
    # INT8 per-token activations move the logits by up to 7.8e-4 here (measured); float32
    # rounding of one forward pass moves them by ~1e-7 (logits ~0.5). 1e-5 is ~80x below the
    # first and ~100x above the second: the hardware numerics are really in use.
    assert diff > 1e-5
    # Close: the move stays far below the logits' spread (std ~0.1, max ~0.5); 1e-2 is 13x
    # the measured move.
    assert diff < 1e-2
    lp, lq = torch.log_softmax(ref.double(), -1), torch.log_softmax(got.double(), -1)
    kl = float((lp.exp() * (lp - lq)).sum(-1).mean())
    # KL(ref || hw) measured ~1e-8; abs() so that a rounding-level negative value cannot fail
    # the bound, which is 1e5x the measured value (as in sw.models.eval.compare: in float64).
    assert abs(kl) < 1e-3
    # Top-1 agrees at 31 of the 32 positions (measured). The one flip is a near-tie (top-2 gap
    # 8e-5, below the hardware's move); the next-closest gap is 1.3e-3, four decades above
    # float rounding, so > 0.95 (at most 1 flip) cannot change with the BLAS or thread count.
    assert float((ref.argmax(-1) == got.argmax(-1)).float().mean()) > 0.95
    # swapping onto a fresh float copy gives the same model (only the linears matter)
    fresh = use_hardware_numerics(copy.deepcopy(tiny_lm()), ws)
    with torch.no_grad():
        torch.testing.assert_close(fresh(ids), got, rtol=0, atol=0)
    with pytest.raises(KeyError):
        use_hardware_numerics(copy.deepcopy(lm), {"model.nope": ws[next(iter(ws))]})
    with pytest.raises(ValueError, match="compressed weight"):
        use_hardware_numerics(copy.deepcopy(lm),
                              {"model.layers.0.mlp.up_proj": ws["model.layers.0.mlp.down_proj"]})


# ---------------------------------------------------------------------- benchmark records
def test_benchmark_records_on_a_tiny_model(tmp_path):
    from bench import accuracy as bench

    configs = [c for c in bench.default_configs(group=32)
               if c.method in ("fp32", "rtn", "gptq", "wanda", "sparsegpt+gptq", "wanda+rtn")
               and c.pattern in ("dense", "2:4")]
    assert {c.label for c in configs} == {
        "fp32 dense fp32", "rtn dense w4g32", "gptq dense w4g32", "rtn dense w4g32 asym",
        "gptq dense w4g32 asym", "wanda 2:4 fp16", "sparsegpt+gptq 2:4 w4g32",
        "wanda+rtn 2:4 w4g32"}
    protocol = EvalProtocol(seq_len=16, max_tokens=64, batch_size=4)
    lm = tiny_lm(layers=1)
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    records = bench.build_records(lm, configs, calib(), protocol, progress=False,
                                  extra={"calib_samples": 8})
    assert all(torch.equal(before[k], v) for k, v in lm.state_dict().items())  # untouched
    # hardware rows: the best 2:4 + W4 row (W4A8 linears, with INT8 attention, and with the
    # vector unit's host ops) and symmetric dense GPTQ (not the asymmetric one)
    assert len(records) == len(configs) + 4
    hw = [r for r in records if r["numerics"] != "float"]
    assert [(r["method"], r["pattern"], r["symmetric"]) for r in hw
            if r["pattern"] == "dense"] == [("gptq", "dense", True)]
    best = min((r for r in records if r["pattern"] == "2:4" and r["bits"] == 4
                and r["numerics"] == "float"), key=lambda r: r["perplexity"])
    assert (best["method"], "2:4") in {(r["method"], r["pattern"]) for r in hw}
    keys = {"method", "mask", "quant", "pattern", "bits", "group", "symmetric", "numerics",
            "perplexity", "top1_agreement", "kl", "seconds", "calib_samples", "sparsegpt_mode"}
    for r in records:
        assert keys <= set(r) and np.isfinite(r["perplexity"])
        assert all(isinstance(v, (str, int, float, bool)) for k, v in r.items()
                   if k != "window_nll")
        # one NLL per window (64 tokens / 16); their mean is the row's NLL. The window means
        # are float64 and stored to 6 decimals; perplexity() sums each batch's 64 token losses
        # in float32, at most 64 * 6e-8 * NLL (~6) = 2.3e-5 off: 1e-4 is 4x that bound
        assert len(r["window_nll"]) == 4
        assert np.mean(r["window_nll"]) == pytest.approx(r["nll"], abs=1e-4)
    fp32 = records[0]
    assert (fp32["method"], fp32["bits"], fp32["top1_agreement"], fp32["kl"]) == \
        ("fp32", 32, 1.0, 0.0)
    wanda = next(r for r in records if r["method"] == "wanda")
    assert (wanda["bits"], wanda["group"], wanda["mask"], wanda["quant"]) == \
        (16, 0, "wanda", "none")
    sg = next(r for r in records if r["method"] == "sparsegpt+gptq" and r["numerics"] == "float")
    assert sg["sparsegpt_mode"] == "joint" and sg["quant"] == "gptq"
    asym = [r for r in records if not r["symmetric"]]
    assert {(r["method"], r["pattern"], r["bits"]) for r in asym} == {
        ("rtn", "dense", 4), ("gptq", "dense", 4)}
    table = bench.format_table(records)
    assert table.count("\n") == len(records) + 1 and "| hardware |" in table
    assert "| hardware+attention |" in table and "| INT4 g32 asym |" in table
    assert bench.plot(records, tmp_path / "a.png").stat().st_size > 1000


def test_benchmark_investigation_on_a_tiny_model():
    from bench import accuracy as bench

    protocol = EvalProtocol(seq_len=16, max_tokens=64, batch_size=4)
    inv = bench.investigate(tiny_lm(layers=1), calib(16, 16), protocol=protocol, progress=False)
    assert set(inv) == {"significance", "feature_norms", "layer_error", "sensitivity_1:4",
                        "calibration", "sparsegpt_quant", "one_shot"}
    for r in inv["significance"]:
        assert r["se"] > 0 and np.isfinite(r["z"])
    for kinds in inv["layer_error"].values():
        assert set(kinds) == set(bench.LAYER_KINDS)
        for v in kinds.values():  # SparseGPT reconstructs: lowest layer error
            assert v["sparsegpt"] <= min(v["magnitude"], v["wanda"]) + 1e-6
    text = bench.format_investigation(inv)
    assert text.count("| wanda |") >= 2
    a = np.array([1.0, 2.0, 3.0, 4.0])
    d = bench.paired_difference(a, a + np.array([0.1, 0.3, 0.1, 0.3]))
    assert d["delta_nll"] == pytest.approx(0.2) and d["se"] == pytest.approx(0.0577, abs=1e-4)
