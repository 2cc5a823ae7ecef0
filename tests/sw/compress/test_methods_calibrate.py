"""Calibration hooks (statistics vs a direct computation, clear errors) and compress_model."""

from __future__ import annotations

import copy
import doctest

import numpy as np
import pytest
import torch
from torch import nn

from hw.format import WeightFormat, pack, unpack
from sw.compress import calibrate as calibrate_mod
from sw.compress.calibrate import (
    METHODS,
    CalibrationError,
    CalibrationWarning,
    Calibrator,
    collect_stats,
    compress_model,
    linear_layers,
)
from sw.compress.prune import check_nm_mask


def tiny_net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 10), nn.ReLU(), nn.Linear(10, 3))


def batches(seed: int = 1, n: int = 3, shape=(2, 5, 6)) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(n)]


def test_statistics_match_a_direct_computation():
    net, data = tiny_net(), batches()
    stats = collect_stats(net, data)
    x0 = torch.cat([b.reshape(-1, 6) for b in data]).double()
    with torch.no_grad():
        x2 = torch.cat([torch.relu(net[0](b)).reshape(-1, 10) for b in data]).double()
    for name, x in (("0", x0), ("2", x2)):
        s = stats[name]
        assert s.tokens == 30 and s.in_features == x.shape[1]
        assert torch.allclose(s.sq_norms, (x ** 2).sum(0), rtol=1e-12)
        assert torch.allclose(s.x_norms, x.norm(dim=0), rtol=1e-12)
        assert torch.allclose(s.hessian, 2 * x.T @ x / 30, rtol=1e-12)
        assert s.hessian.dtype == torch.float64


def test_selection_and_no_hessian():
    net = tiny_net()
    stats = collect_stats(net, batches(), ["2"], hessian=False)
    assert list(stats) == ["2"] and stats["2"].xtx is None
    with pytest.raises(CalibrationError, match="not collected"):
        _ = stats["2"].hessian
    assert list(collect_stats(net, batches(), lambda name, m: m.out_features == 10)) == ["0"]
    with pytest.raises(KeyError, match="no module named 'nope'"):
        collect_stats(net, batches(), ["nope"])
    with pytest.raises(TypeError, match="ReLU, not nn.Linear"):
        collect_stats(net, batches(), ["1"])


def test_tied_weights_are_left_out_by_default():
    net = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
    net[2].weight = net[0].weight
    assert list(linear_layers(net)) == ["1"]


def test_clear_errors():
    net = tiny_net()
    with pytest.raises(CalibrationError, match="batch iterable was empty"):
        collect_stats(net, [])
    with pytest.raises(CalibrationError, match=r"too short: 0 saw 10 tokens, at least 16"):
        collect_stats(net, batches(shape=(2, 5, 6), n=1))

    class Unused(nn.Module):  # a layer that the forward pass never reaches
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(6, 6), nn.Linear(6, 6)

        def forward(self, x):
            return self.used(x)

    with pytest.raises(CalibrationError, match="unused: no calibration tokens reached"):
        collect_stats(Unused(), batches())
    bad = batches()
    bad[1][0, 0, 0] = float("nan")
    with pytest.raises(CalibrationError, match=r"0: 1 non-finite"):
        collect_stats(net, bad)
    with pytest.warns(CalibrationWarning, match="16 calibration tokens for 40 input features"):
        collect_stats(nn.Linear(40, 2), [torch.randn(16, 40)])


def test_batch_forms_and_custom_forward():
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 2)

        def forward(self, x, scale=1.0):
            return self.lin(x * scale)

    data = batches()
    ref = collect_stats(Two(), data)["lin"].sq_norms
    as_tuple = collect_stats(Two(), [(b, 2.0) for b in data])["lin"].sq_norms
    as_dict = collect_stats(Two(), [{"x": b, "scale": 2.0} for b in data])["lin"].sq_norms
    custom = collect_stats(Two(), data, forward=lambda m, b: m(b, scale=2.0))["lin"].sq_norms
    for s in (as_tuple, as_dict, custom):
        assert torch.allclose(s, 4 * ref)


def test_hooks_are_removed_and_mode_restored():
    net = tiny_net().train()
    collect_stats(net, batches())
    assert net.training
    assert not net[0]._forward_pre_hooks and not net[2]._forward_pre_hooks
    with Calibrator(net, early_exit=True) as cal:
        assert cal.run(batches()[0]) is None  # cut short after the last watched layer


@pytest.mark.parametrize("method", sorted(METHODS))
@pytest.mark.parametrize("sequential", [True, False])
def test_compress_model_writes_back_exact_weights(method, sequential):
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 16))
    fmt = WeightFormat("2:4", 4, 16)
    data = batches(n=4, shape=(4, 8, 32))
    qws = compress_model(net, data, fmt, method, sequential=sequential, progress=False)
    assert list(qws) == ["0", "2"]
    for name, qw in qws.items():
        w = net.get_submodule(name).weight.detach().numpy()
        assert np.array_equal(w, qw.dequantize())
        check_nm_mask(w != 0, fmt.pattern)
        assert unpack(pack(qw, 16), fmt, qw.shape, 16, qw.row_scale).equals(qw)


def test_sequential_mode_calibrates_on_compressed_earlier_layers(monkeypatch):
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))
    data = batches(n=2, shape=(8, 8, 32))
    fmt = WeightFormat("2:4", 4, 16)
    seen = {}
    original = calibrate_mod._compress_one

    def spy(method, name, weight, st, f, kwargs):
        seen[name] = st.sq_norms.clone()
        return original(method, name, weight, st, f, kwargs)

    monkeypatch.setattr(calibrate_mod, "_compress_one", spy)
    compressed = copy.deepcopy(net)
    compress_model(compressed, data, fmt, "wanda", progress=False)
    plain = collect_stats(net, data, hessian=False)
    assert torch.allclose(seen["0"], plain["0"].sq_norms)  # first layer: same inputs
    assert not torch.allclose(seen["2"], plain["2"].sq_norms)  # sees the compressed layer 0
    with torch.no_grad():
        h = torch.relu(compressed[0](torch.cat(data).reshape(-1, 32))).double()
    assert torch.allclose(seen["2"], (h ** 2).sum(0))


@pytest.mark.filterwarnings("ignore::sw.compress.core.PaddingWarning")
def test_compress_model_options():
    net = tiny_net()
    before = net[2].weight.detach().clone()
    fmts = lambda name, mod: None if name == "0" else WeightFormat("dense", 4, 0)  # noqa: E731
    qws = compress_model(net, batches(), fmts, "gptq", write_back=False, progress=False)
    assert list(qws) == ["2"] and torch.equal(net[2].weight, before)
    qws = compress_model(net, None, WeightFormat("dense", 4, 0), "magnitude", progress=False)
    assert list(qws) == ["0", "2"]
    with pytest.raises(TypeError, match="takes no options"):
        compress_model(net, batches(), WeightFormat("dense", 4, 0), "wanda", act_order=True)
    with pytest.raises(ValueError, match="unknown method 'obs'"):
        compress_model(net, batches(), WeightFormat("dense", 4, 0), "obs")
    with pytest.raises(CalibrationError, match="needs calibration batches"):
        compress_model(net, None, WeightFormat("dense", 4, 0), "wanda")
    with pytest.raises(ValueError, match=r"missing \['2'\]"):
        compress_model(net, batches(), WeightFormat("dense", 4, 0), "gptq", groups=[["0"]])


def test_compress_a_llama_model():
    llama = pytest.importorskip("sw.models.llama")
    config = pytest.importorskip("sw.models.config")
    cfg = config.LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = llama.LlamaLM(cfg).eval()
    g = torch.Generator().manual_seed(0)
    data = [torch.randint(0, 61, (2, 32), generator=g) for _ in range(2)]
    qws = compress_model(model, data, WeightFormat("2:4", 4, 16), "sparsegpt", progress=False)
    assert len(qws) == 7 and "lm_head" not in qws  # tied to the embedding: left alone
    assert torch.isfinite(model(data[0])).all()


def test_docstring_examples():
    assert doctest.testmod(calibrate_mod).failed == 0
