"""The INT4 KV cache: its golden numerics and torch twin agree bit for bit, its stream layout is
where :func:`hw.format.pack` puts each field, and a compiled model with it equals its
model-level twin bit for bit."""

import copy

import numpy as np
import pytest
import torch
from compile_testutil import SMALL, compressed, tiny_lm, twin_step_logits

from hw.config import DENSE
from hw.format import QuantizedWeight, pack
from hw.numerics import (
    KV4_CODE_MAX,
    KV4_QMAX,
    kv4_key_group,
    kv4_rows,
    kv4_rows_torch,
    kv4_rows_vector,
    kv4_rows_vector_torch,
    kv4_weight,
    kv4_weight_torch,
)
from sim.backends import make_backend
from sw.compile import CompileError, CompileOptions, compile_model
from sw.compile.executable import load, save
from sw.compile.lower import KVLayout, context_bucket
from sw.compress.model import use_hardware_numerics
from sw.runtime import Runtime


def _rows(seed: int, shape) -> np.ndarray:
    """Keys-like rows: normal, a few channels scaled up (outliers), some rows all zero."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    x[..., rng.integers(0, shape[-1], 3)] *= 20
    x[..., 1, :] = 0
    return x


@pytest.mark.parametrize("group", [None, 16, 32, 64])
def test_numpy_and_torch_agree_bit_for_bit_and_bound_the_error(group):
    x = _rows(group or 0, (3, 5, 64))
    q, c, s = kv4_rows(x, group)
    qt, ct, st = kv4_rows_torch(torch.from_numpy(x), group)
    assert np.array_equal(q, qt.numpy()) and np.array_equal(s.view(np.uint32),
                                                            st.numpy().view(np.uint32))
    assert (c is None and ct is None) or np.array_equal(c, ct.numpy())
    w = kv4_weight(q, c)
    assert np.array_equal(w, kv4_weight_torch(qt, ct).numpy())
    assert np.abs(q).max() <= KV4_QMAX
    if c is not None:
        assert 1 <= c.min() and c.max() <= KV4_CODE_MAX
        unit = s[..., None] * np.repeat(c, group, axis=-1)
    else:
        unit = np.broadcast_to(s[..., None], x.shape)
    # rounding to the nearest of each group's levels: half a step, plus float32 slack (the
    # code's ceiling may leave q one short of 7 at the group's max: still within a step)
    err = np.abs(w * s[..., None] - x)
    assert (err <= unit * (0.5 + 1e-5) + 1e-6 * np.abs(x)).all()
    assert (w[:, 1] == 0).all()  # an all-zero row stays zero


def test_key_group_is_32_or_the_head():
    assert [kv4_key_group(d) for d in (16, 32, 64, 128)] == [16, 32, 32, 32]
    with pytest.raises(ValueError, match="head_dim=48"):
        kv4_key_group(48)


def _as_weight(fmt, w_q: np.ndarray, codes: np.ndarray | None) -> QuantizedWeight:
    """``W[n, k]`` of INT4 values (and codes) as the packer takes it, K padded with zeros."""
    n, k = w_q.shape
    kp = fmt.padded_k(k)
    vals = np.zeros((n, kp), np.int16)
    vals[:, :k] = w_q
    groups = kp // fmt.group_of(kp)
    c = np.ones((n, groups), np.uint8) if codes is None else codes
    return QuantizedWeight(fmt, (n, k), vals, None, c, None, np.ones(n, np.float32))


@pytest.mark.parametrize("lanes, head_dim, max_context", [(16, 16, 40), (64, 64, 100),
                                                          (8, 32, 17)])
def test_int4_fields_are_where_pack_puts_them(lanes, head_dim, max_context):
    rng = np.random.default_rng(lanes + head_dim)
    kv = KVLayout(head_dim, context_bucket(max_context), lanes, 16, bits=4)
    assert kv.key_format.pattern == DENSE and not kv.key_format.raw and kv.value_format.raw
    n = kv.max_context
    k = rng.integers(-7, 8, (n, head_dim)).astype(np.int8)
    codes = rng.integers(1, 256, (n, head_dim // kv4_key_group(head_dim))).astype(np.uint8)
    v = rng.integers(-7, 8, (n, head_dim)).astype(np.int8)
    for kind, want_w, c, size, stride, tiles in (
            ("k", k, codes, kv.key_bytes, kv.key_tile_stride, kv.keys.tiles),
            ("v", v.T.copy(), None, kv.value_bytes, kv.value_tile_stride, kv.values.tiles)):
        fmt = kv.key_format if kind == "k" else kv.value_format
        stream = pack(_as_weight(fmt, want_w, c), lanes).reshape(tiles, -1)
        want = np.zeros(size, np.uint8)
        for j in range(tiles):
            want[j * stride:j * stride + stream.shape[1]] = stream[j]
        got = np.full(size, 0, np.uint8)
        # appended in random chunks, as prefill then decode steps write them
        cuts = np.sort(rng.choice(np.arange(1, n), 4, replace=False))
        for pos in np.split(np.arange(n), cuts):
            x = (k if kind == "k" else v)[pos]
            kv.write(got, kind, pos, x, None if c is None else c[pos])
        assert np.array_equal(got, want)


def test_bad_kv_bits_are_refused():
    lm = tiny_lm(layers=1)
    with pytest.raises(CompileError, match="got 3"):
        compile_model(lm, SMALL, CompileOptions(4, 6, kv_bits=3), weights=compressed(lm))


PROMPT, STEPS = 6, 5


def _equals_twin(lm, cfg, weights, prompt, steps, seed=3, vector=False, tmp_path=None):
    """Run the INT4-cache compiled model for a prefill and ``steps`` decode tokens (host ops
    in float, or the vector unit's numerics); assert its logits equal the twin's bit for bit,
    and differ from the INT8-cache twin's."""
    exe = compile_model(lm, cfg, CompileOptions(prompt, prompt + steps, kv_bits=4),
                        weights=weights)
    assert exe.kv.layout.bits == 4 and exe.report["kv_bits"] == 4
    if tmp_path is not None:  # the cache's width survives a save and load
        exe = load(save(exe, tmp_path / "m.safetensors"))
        assert exe.kv.layout.bits == 4
    ids = torch.randint(0, lm.config.vocab_size, (1, prompt + steps),
                        generator=torch.Generator().manual_seed(seed))
    rt = Runtime(exe, make_backend("model", cfg), vector=vector)
    got = [rt.step(ids[:, :prompt])[0]] + [rt.step(ids[:, p:p + 1])[0]
                                            for p in range(prompt, prompt + steps)]
    twin = use_hardware_numerics(copy.deepcopy(lm), weights, attention=True, kv_bits=4,
                                 vector=vector)
    want = twin_step_logits(twin, ids, prompt)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    twin8 = use_hardware_numerics(copy.deepcopy(lm), weights, attention=True, vector=vector)
    assert not torch.equal(twin_step_logits(twin8, ids, prompt)[-1], want[-1])


# head_dim 64: two key groups per row; 32: one; grouped-query and multi-query
@pytest.mark.parametrize("shape", [(2, 2, 1), (1, 4, 2)], ids=["mqa-d64", "gqa-d32"])
def test_int4_cache_compiled_model_equals_the_twin_bit_for_bit(shape, tmp_path):
    layers, heads, kv = shape
    lm = tiny_lm(layers=layers, heads=heads, kv_heads=kv, hidden=128)
    _equals_twin(lm, SMALL, compressed(lm), PROMPT, STEPS, tmp_path=tmp_path)


def test_reference_model_with_int4_cache_equals_its_twin():
    from hw.config import AcceleratorConfig
    from sw.models.reference_model import load_reference
    lm = load_reference()
    _equals_twin(lm, AcceleratorConfig(), compressed(lm, "2:4", 128), 8, 4)


def test_int4_cache_with_vector_numerics_equals_its_twin():
    lm = tiny_lm(layers=1, heads=2, kv_heads=1, hidden=128)
    _equals_twin(lm, SMALL, compressed(lm), PROMPT, 3, vector=True)


@pytest.mark.parametrize("group", [None, 16, 32])
def test_vector_unit_int4_rows_agree_and_bound_the_error(group):
    x = _rows(7 + (group or 0), (3, 5, 64))
    x[0, 0, :] *= 100  # a wide row (the format holds |x| < 2**15)
    q, c, s = kv4_rows_vector(x, group)
    qt, ct, st = kv4_rows_vector_torch(torch.from_numpy(x), group)
    assert np.array_equal(q, qt.numpy()) and np.array_equal(s.view(np.uint32),
                                                            st.numpy().view(np.uint32))
    assert (c is None and ct is None) or np.array_equal(c, ct.numpy())
    assert np.abs(q).max() <= KV4_QMAX
    w = kv4_weight(q, c)
    if c is not None:
        unit = s[..., None] * np.repeat(c, group, axis=-1)
    else:
        unit = np.broadcast_to(s[..., None], x.shape)
    # half a step of the group's levels, plus the reciprocal's 2**-13 relative error (on up
    # to 8 steps) and the fixed-point input's rounding (2**-17) and float32 slack
    err = np.abs(w * s[..., None] - x)
    slack = 2.0 ** -13 * 8 * unit + 2.0 ** -17 + 1e-6 * np.abs(x)
    assert (err <= 0.5 * unit + slack).all()
    assert (w[:, 1] == 0).all()
    # the unit's rows are the float rows' but for rounding: most elements agree
    qf, _, _ = kv4_rows(x, group)
    assert (q == qf).mean() > 0.95


@pytest.mark.rtl
@pytest.mark.slow
def test_rtl_runs_the_int4_cache_as_the_fast_model():
    from sim.random_programs import EQUIVALENCE_CONFIGS
    cfg = EQUIVALENCE_CONFIGS["2x4"]   # shares the equivalence harness's Verilator build
    lm = tiny_lm(layers=1, heads=2, kv_heads=1, hidden=32, vocab=32)
    exe = compile_model(lm, cfg, CompileOptions(PROMPT, PROMPT + 2, kv_bits=4),
                        weights=compressed(lm, "2:4", 32))
    ids = torch.randint(0, 32, (1, PROMPT + 2), generator=torch.Generator().manual_seed(5))
    runs = []
    for name in ("model", "rtl"):
        rt = Runtime(exe, make_backend(name, cfg))
        runs.append([rt.step(ids[:, :PROMPT])] + [rt.step(ids[:, p:p + 1])
                                                   for p in range(PROMPT, PROMPT + 2)])
    for (a, sa), (b, sb) in zip(*runs, strict=True):
        assert torch.equal(a, b)
        assert [p.cycles for p in sa.programs] == [p.cycles for p in sb.programs]
