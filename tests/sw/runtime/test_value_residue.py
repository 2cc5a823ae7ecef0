"""Attention's values product split by position residue (sw.compile.lower.value_residue): where
the host appends the cache, the values GEMM's outputs are R partial rows of a head's channels
(``1:R`` sparse values, position ``p`` at residue ``p % R``), added after it; the rule, the
layout the host writes and a compiled model's logits (the twin's, bit for bit)."""

import copy
import dataclasses

import numpy as np
import pytest
import torch
from compile_testutil import compressed, tiny_lm, twin_step_logits

from bench.scaling import VECTOR_SYSTEMS, llama7b, step_options
from hw.config import AcceleratorConfig, MemoryModel
from hw.format import QuantizedWeight, pack
from hw.numerics import ACT_QMAX
from hw.timing import load_completion_delay
from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model
from sw.compile.compiler import _kv_layout
from sw.compile.executable import load, save
from sw.compile.lower import KVLayout, context_bucket, value_format, value_residue
from sw.compress.model import use_hardware_numerics
from sw.runtime import Runtime

#: HBM-class in small: 512 lanes in 2048-byte beats, whose nibbles no INSERT's base names,
#: so the host appends the cache (and a decode step splits before each layer's attention).
WIDE_BEAT = AcceleratorConfig(rows=4, cols=128, act_spad_bytes=64 << 10,
                              wgt_spad_bytes=512 << 10, out_spad_bytes=128 << 10,
                              param_spad_bytes=4096, vin_spad_bytes=32768,
                              vout_spad_bytes=16384, vector_lanes=16,
                              memory=MemoryModel(bytes_per_cycle=2048, latency=8,
                                                 size_bytes=1 << 24))
PROMPT, STEPS, CONTEXT = 6, 4, 40


def test_the_residue_is_the_widest_one_to_m_pattern_that_fits_the_lanes_exactly():
    cfg = WIDE_BEAT
    assert value_residue(cfg, 16, 4, 128) == 8            # 1:8 x 16 channels <= 512 lanes
    assert value_residue(cfg, 128, 4, 128) == 4           # 1:8 x 128 > 512: 1:4
    assert value_residue(cfg, 16, 8, 128) == 1            # INT8 streams dense only
    assert value_residue(cfg.replace(vector_lanes=32), 16, 4, 128) == 1  # fold rows unaligned
    assert value_residue(cfg.replace(patterns=("2:4", "4:8")), 16, 4, 128) == 1
    assert value_residue(cfg.replace(rows=2, cols=4), 16, 4, 128) == 1
    # every partial and sum exact in the accumulator: |P| * |v| * positions < 2**(acc_bits-1)
    acc24 = cfg.replace(acc_bits=24)
    most = ((1 << 23) - 1) // (ACT_QMAX * -value_format(4, 8).qmin)
    assert value_residue(acc24, 16, 4, most) == 8
    assert value_residue(acc24, 16, 4, most + 1) == 1
    # the k-steps saved a head, S * 7 / 8, must exceed the three ADDs' hand-offs on chip
    # (and 1:4's two, S * 3 / 4: with WIDE_BEAT's delay of 9, 1:4 pays from 25 positions)
    least = 8 * 3 * load_completion_delay(cfg) // 7 + 1
    assert load_completion_delay(cfg) == 9 and least == 31
    assert value_residue(cfg, 16, 4, least) == 8
    assert value_residue(cfg, 16, 4, least - 1) == 4
    assert value_residue(cfg, 16, 4, 24) == 1
    host = cfg.replace(vin_spad_bytes=0, vout_spad_bytes=0, vector_lanes=1)
    assert value_residue(host, 16, 4, 16) == 8            # the host adds them: no hand-offs


def test_the_compiler_splits_only_where_the_host_appends():
    """LLaMA-7B at context 2048: HBM-class (host append) splits by 8 where its fold rows
    start on whole vector lanes (64, 128; not 512); the default and DDR4-class append on
    chip: unsplit. At 128 the split would not pay: unsplit."""
    lm, opts = llama7b(), step_options("decode", 1, 2048, 4)
    got = {(label, lanes): _kv_layout(lm, dataclasses.replace(cfg, vector_lanes=lanes),
                                      opts).residue
           for label, cfg in VECTOR_SYSTEMS for lanes in {64, 128, 512, cfg.vector_lanes}
           if lanes <= cfg.vector_lanes_max}
    assert got == {("default", 1): 1, ("DDR4-class", 32): 1, ("HBM-class", 64): 8,
                   ("HBM-class", 128): 8, ("HBM-class", 512): 1}
    hbm = dataclasses.replace(dict(VECTOR_SYSTEMS)["HBM-class"], vector_lanes=128)
    assert _kv_layout(lm, hbm, dataclasses.replace(opts, attention=False)).residue == 1
    assert _kv_layout(lm, hbm, step_options("decode", 1, 128, 4)).residue == 1


@pytest.mark.parametrize("lanes, head_dim, max_context, residue", [
    (128, 16, 40, 8), (64, 16, 100, 4), (512, 64, 33, 8)])
def test_split_values_are_where_pack_puts_them(lanes, head_dim, max_context, residue):
    """The host's writes of positions in chunks give the stream :func:`hw.format.pack`
    makes of ``W[R * head_dim, S]``: row ``c * head_dim + d`` keeps ``V[p, d]`` of each
    block's position ``p = c (mod R)``, at its residue."""
    rng = np.random.default_rng(lanes + max_context)
    kv = KVLayout(head_dim, context_bucket(max_context), lanes, 16, bits=4, residue=residue)
    fmt, s = kv.value_format, kv.max_context
    v = rng.integers(-8, 8, (s, head_dim)).astype(np.int8)
    values = v.reshape(s // residue, residue, head_dim).transpose(1, 2, 0).reshape(
        residue * head_dim, s // residue)
    index = np.repeat(np.arange(residue, dtype=np.uint8), head_dim)[:, None].repeat(
        s // residue, 1)
    n = residue * head_dim
    codes = np.ones((n, s // fmt.group), np.uint8)  # raw: no header, codes of 1
    w = QuantizedWeight(fmt, (n, s), values.astype(np.int16), index, codes, None,
                        np.ones(n, np.float32))
    stream = pack(w, lanes).reshape(kv.values.tiles, -1)
    want = np.zeros(kv.value_bytes, np.uint8)
    for j in range(kv.values.tiles):
        want[j * kv.value_tile_stride:j * kv.value_tile_stride + stream.shape[1]] = stream[j]
    got = np.zeros_like(want)
    for pos in np.split(np.arange(s), np.sort(rng.choice(np.arange(1, s), 4, replace=False))):
        kv.write(got, "v", pos, v[pos])
    assert np.array_equal(got, want)
    with pytest.raises(ValueError, match="sparse fields"):
        kv.fields("v", [0])


def _equals_twin(cfg: AcceleratorConfig, bits: int, residue: int, tmp_path=None,
                 **options) -> None:
    lm = tiny_lm(layers=2, heads=4, kv_heads=2)
    ws = compressed(lm)
    exe = compile_model(lm, cfg, CompileOptions(PROMPT, CONTEXT, kv_bits=bits, **options),
                        weights=ws)
    if tmp_path is not None:  # the split survives a save and load
        exe = load(save(exe, tmp_path / "m.safetensors"))
    assert exe.kv.layout.residue == residue
    ids = torch.randint(0, lm.config.vocab_size, (1, PROMPT + STEPS),
                        generator=torch.Generator().manual_seed(3))
    rt = Runtime(exe, make_backend("model", cfg), vector=cfg.has_vector)
    got = [rt.step(ids[:, :PROMPT])[0]] + [rt.step(ids[:, p:p + 1])[0]
                                            for p in range(PROMPT, PROMPT + STEPS)]
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=cfg.has_vector, attention=True,
                                 kv_bits=bits)
    for a, b in zip(got, twin_step_logits(twin, ids, PROMPT), strict=True):
        assert torch.equal(a, b)


def test_split_values_folded_on_chip_equal_the_twin(tmp_path):
    """INT4 cache on WIDE_BEAT: the attention programs' values GEMMs of 128 outputs, three
    halving ADDs and the DEQUANT on chip; the logits equal the twin's bit for bit."""
    _equals_twin(WIDE_BEAT, 4, 8, tmp_path)


def test_split_values_in_records_narrower_than_a_weights_word_equal_the_twin():
    """128 lanes in 16-byte beats, the host appending (no chains): a 1:8 INT4 record is 7
    beats, a WGT word 8, and a fused program that packs its GEMM's weights above the parts
    before keeps them word-aligned (``fusion._wgt_moved``)."""
    cfg = AcceleratorConfig(rows=8, cols=16, vin_spad_bytes=8192, vout_spad_bytes=4096,
                            vector_lanes=4, memory=MemoryModel(latency=8, size_bytes=1 << 22))
    _equals_twin(cfg, 4, 8, chain_programs=False)


def test_split_values_folded_by_the_host_equal_the_twin():
    """Without a vector engine the host's epilogue adds the partial rows."""
    _equals_twin(WIDE_BEAT.replace(vin_spad_bytes=0, vout_spad_bytes=0, vector_lanes=1), 4, 8)


def test_an_int8_cache_is_not_split_and_equals_the_twin():
    _equals_twin(WIDE_BEAT, 8, 1)
