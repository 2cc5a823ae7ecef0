"""The INT8 KV append on chip in decode (sw.compile.kvappend): a decode chain that computes a
layer's rotated keys and its values appends them to the cache itself (REQUANT, INSERT), the
runtime points the append at the step's position and writes no key or value codes, and the
tokens equal the twin's; the cache holds the bytes the host's append writes."""

import copy
import dataclasses

import numpy as np
import pytest
import torch
from compile_testutil import (
    SMALL,
    VSMALL,
    backends_agree,
    compressed,
    runtime_steps,
    tiny_lm,
    twin_step_logits,
)

from hw.isa import MOVE_SPAD, Store, VecFunc, decode_program
from hw.numerics import value_codes
from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model
from sw.compile.executable import load, save
from sw.compile.symbols import buffer
from sw.compress.model import use_hardware_numerics
from sw.runtime import Runtime

PROMPT, STEPS = 6, 4


def _ids(lm, n, seed=7):
    return torch.randint(0, lm.config.vocab_size, (1, n),
                         generator=torch.Generator().manual_seed(seed))


def _cache(rt) -> dict[str, np.ndarray]:
    """The bytes of every kv head's key and value region."""
    kv = rt.exe.kv
    out = {}
    for layer in range(kv.layers):
        for h in range(kv.kv_heads):
            for kind in "kv":
                r = rt.exe.symbols[kv.symbol(kind, layer, h)]
                out[kv.symbol(kind, layer, h)] = rt.dram[r.addr:r.end].copy()
    return out


@pytest.fixture(scope="module")
def model():
    lm = tiny_lm(layers=2, heads=4, kv_heads=2)
    return lm, compressed(lm)


#: Per cache width: the VEC sub-ops an append runs and the regions its words move.
_APPEND = {8: ({VecFunc.REQUANT, VecFunc.INSERT, VecFunc.CHANNEL}, {"k", "v", "c", "s"}),
           4: ({VecFunc.KV4, VecFunc.INSERT4, VecFunc.INSERT, VecFunc.CHANNEL},
               {"k", "h", "v", "c", "s"})}


@pytest.mark.parametrize("bits", [8, 4])
def test_decode_appends_the_cache_on_chip_and_the_tokens_equal_the_twins(model, monkeypatch,
                                                                          bits):
    """Each layer's append is a part of the decode program that computes its keys: its
    quantisations (REQUANT, or KV4 for the INT4 cache), INSERTs (INSERT4 for nibbles) and
    CHANNELs run, the host's kv_update does not run in decode (it writes in the prefill),
    the cache after every step holds the bytes the host's append writes (a compilation
    without chains, whose appends are the host's), and so do the scores' channel words and
    the value codes, and the logits equal the twin's."""
    lm, ws = model
    opts = CompileOptions(PROMPT, PROMPT + STEPS, kv_bits=bits)
    exe = compile_model(lm, VSMALL, opts, weights=ws)
    appends = [p for p in exe.programs if p.append_rows]
    assert sorted({r[3] for p in appends for r in p.append_rows}) == [0, 1]
    assert all(p.phase == "decode" and p.parts for p in appends)
    funcs, kinds = _APPEND[bits]
    for p in appends:
        program = decode_program(p.words.view(np.uint8))
        run = {i.func for i in program if hasattr(i, "func")}
        assert funcs <= run
        assert {r[1] for r in p.append_rows} == kinds
        # the results move through VIN: the arena holds no scratch buffer for them
        assert any(isinstance(i, Store) and i.spad == MOVE_SPAD for i in program)
    assert not [s for s in exe.symbols if s.startswith(buffer("kv", "decode", ""))]
    host = compile_model(lm, VSMALL, dataclasses.replace(opts, chain_programs=False),
                         weights=ws)
    assert not any(p.append_rows for p in host.programs)

    writes = []
    original = Runtime._kv_append

    def spy(self, stats, phase):
        kernel = original(self, stats, phase)

        def run(node, args, env):
            before = self.dram.copy()
            out = kernel(node, args, env)
            if self is rt:
                writes.append((phase, not np.array_equal(before, self.dram)))
            return out
        return run

    monkeypatch.setattr(Runtime, "_kv_append", spy)
    ids = _ids(lm, PROMPT + STEPS)
    rt = Runtime(exe, make_backend("model", VSMALL), vector=True)
    ref = Runtime(host, make_backend("model", VSMALL), vector=True)
    steps = []
    for k in range(STEPS + 1):
        x = ids[:, :PROMPT] if k == 0 else ids[:, PROMPT + k - 1:PROMPT + k]
        steps.append(rt.step(x))
        ref.step(x)
        got, want = _cache(rt), _cache(ref)
        assert got.keys() == want.keys()
        for name in got:
            assert np.array_equal(got[name], want[name]), (k, name)
        # the scores' channel words and the value codes of every cached position: CHANNEL's
        # and REQUANT's on chip, the host's where it appended (the same words)
        s = PROMPT + k
        assert rt._position_words == ref._position_words
        for regions in rt._position_words.values():
            for name in regions.values():
                a, b = rt.exe.symbols[name].addr, ref.exe.symbols[name].addr
                assert np.array_equal(rt.dram[a:a + 4 * s], ref.dram[b:b + 4 * s]), (k, name)
    # the host's append writes the prefill's; in decode it does not run (the program appends
    # and no decode program reads the host's KV state)
    assert writes == [("prefill", True)] * lm.config.num_hidden_layers
    for _, st in steps[1:]:
        assert not any(h.op == "kv_update" for h in st.host)
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True, attention=True,
                                 kv_bits=bits)
    for (logits, _), w in zip(steps, twin_step_logits(twin, ids, PROMPT), strict=True):
        assert torch.equal(logits, w)


def test_the_append_rows_survive_a_file(model, tmp_path):
    lm, ws = model
    exe = compile_model(lm, VSMALL, CompileOptions(PROMPT, PROMPT + 2), weights=ws)
    back = load(save(exe, tmp_path / "exe.safetensors"))
    assert [p.append_rows for p in back.programs] == [p.append_rows for p in exe.programs]
    assert any(p.append_rows for p in back.programs)


def test_an_int4_cache_of_narrow_records_keeps_the_host_append():
    """An INT4 key stream whose headers are not whole beats (8 lanes: 8-byte headers in
    16-byte beats) is appended by the host; the tokens still equal the twin's."""
    cfg = SMALL.replace(rows=2, cols=4, vin_spad_bytes=2048, vout_spad_bytes=1024)
    assert cfg.lanes == 8
    lm = tiny_lm(layers=1, heads=2, kv_heads=1)
    ws = compressed(lm)
    exe = compile_model(lm, cfg, CompileOptions(PROMPT, PROMPT + 2, kv_bits=4), weights=ws)
    assert not any(p.append_rows for p in exe.programs)
    ids = _ids(lm, PROMPT + 2)
    rt = Runtime(exe, make_backend("model", cfg), vector=True)
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True, attention=True, kv_bits=4)
    got = [rt.step(ids[:, :PROMPT])[0]] + [rt.step(ids[:, p:p + 1])[0]
                                            for p in range(PROMPT, PROMPT + 2)]
    for a, b in zip(got, twin_step_logits(twin, ids, PROMPT), strict=True):
        assert torch.equal(a, b)


@pytest.mark.rtl
@pytest.mark.slow
@pytest.mark.parametrize("bits", [8, 4])
def test_rtl_appends_the_cache_as_the_fast_model(bits):
    """The decode programs with their KV append parts (an INT4 cache's with KV4 and INSERT4)
    give the same logits on the RTL as on the fast model (the equivalence harness's vector
    configuration), their LOADs of the token's embedding rows pointed at the embedding table
    on chip."""
    from sim.random_programs import EQUIVALENCE_CONFIGS
    cfg = EQUIVALENCE_CONFIGS["4x4"]
    # (a vocabulary of 16: the embedding table fits the configuration's 32 KiB beside it)
    lm = tiny_lm(layers=1, heads=2, kv_heads=1, hidden=32, vocab=16)
    ws = compressed(lm, "2:4", 32)
    exe = compile_model(lm, cfg, CompileOptions(PROMPT, PROMPT + 2, kv_bits=bits), weights=ws)
    assert any(p.append_rows for p in exe.programs)
    assert any(p.embed_rows for p in exe.programs if p.fused_into is None)
    ids = _ids(lm, PROMPT + 2, seed=5)
    backends_agree(exe, cfg, ids, PROMPT)


def test_the_appends_are_found_where_one_tokens_rows_are_the_values(model):
    """kv_appends: in decode each layer's rotated key row and v_proj's output (one token: the
    kv heads side by side, through view and transpose); in a prefill the transpose orders
    the values by head, then token, and there is none."""
    from sw.compile.fusion import kv_appends
    lm, ws = model
    exe = compile_model(lm, VSMALL, CompileOptions(PROMPT, PROMPT + 2), weights=ws)
    assert kv_appends(exe.graphs["decode"]) == {
        f"layers.{i}.self_attn.k_proj.rope": (i, f"layers.{i}.self_attn.v_proj")
        for i in range(2)}
    assert kv_appends(exe.graphs["prefill"]) == {}


@pytest.mark.parametrize("seed", [0, 1])
def test_wide_and_all_zero_value_rows_give_the_twins_tokens(seed):
    """FOLD's value codes are the value rows' integer amax on chip (REQUANT's, appended in
    decode), on the host (the prefill's append) and in the twin alike (value_amax_torch), so
    rows the float scale does not recover -- amax >= 2**23 (one kv head's values scaled past
    128) and all-zero ones (the other kv head's v_proj zeroed) -- still give the twin's
    logits bit for bit, though their codes differ from the scales' (value_codes)."""
    lm = tiny_lm(layers=2, heads=4, kv_heads=2, seed=seed)
    d = lm.config.head_dim
    with torch.no_grad():
        for layer in lm.model.layers:
            w = layer.self_attn.v_proj.weight
            w[:d] *= 4000.0 / w[:d].abs().max()   # kv head 0: values of hundreds
            w[d:] = 0.0                           # kv head 1: all-zero value rows
    ws = compressed(lm)
    exe = compile_model(lm, VSMALL, CompileOptions(PROMPT, PROMPT + STEPS), weights=ws)
    assert any(p.append_rows for p in exe.programs)
    ids = _ids(lm, PROMPT + STEPS, seed=seed)
    # read_back_all: the host keeps the amax of the positions appended on chip too
    rt = Runtime(exe, make_backend("model", VSMALL), vector=True, read_back_all=True)
    steps = runtime_steps(rt, ids, PROMPT)
    amax = rt.value_amax[0][0, :, :PROMPT + STEPS]
    assert (amax[0] >= 2**23).any() and (amax[1] == 0).all()
    scale_codes = value_codes(rt.scales[(0, "v")][0, :, :PROMPT + STEPS])
    assert not torch.equal(scale_codes, amax)
    for h, r in rt._position_words[(0, "c")].items():  # the codes FOLD reads: the amax
        got = rt.dram[rt.exe.symbols[r].addr:][:4 * (PROMPT + STEPS)].view("<i4")
        assert np.array_equal(got, amax[h].numpy())
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True, attention=True)
    for (logits, _), w in zip(steps, twin_step_logits(twin, ids, PROMPT), strict=True):
        assert torch.equal(logits, w)


def test_an_int4_cache_of_two_beat_headers_appends_the_beat_holding_the_code():
    """32 lanes in 16-byte beats: an INT4 key group's header (a code per lane) is two beats,
    and a step's append loads, INSERTs and stores only the one holding its position's code
    (KVLayout.append_transfer). Decode steps on both sides of the headers' beat boundary
    (positions 14 .. 17) leave the cache bytes the host's append writes, and the tokens equal
    the twin's."""
    cfg = VSMALL.replace(rows=4, cols=8)
    assert cfg.lanes == 2 * cfg.beat_bytes
    lm = tiny_lm(layers=1, heads=2, kv_heads=1)
    ws = compressed(lm)
    prompt, steps = 14, 4
    opts = CompileOptions(prompt, prompt + steps, kv_bits=4)
    exe = compile_model(lm, cfg, opts, weights=ws)
    host = compile_model(lm, cfg, dataclasses.replace(opts, chain_programs=False), weights=ws)
    appends = [p for p in exe.programs if p.append_rows]
    assert appends and not any(p.append_rows for p in host.programs)
    for p in appends:
        program = decode_program(p.words.view(np.uint8))
        headers = [program[i] for i, kind, field, _ in p.append_rows
                   if kind == "h" and field == "dram_addr"]
        assert headers and all(i.row_beats == 1 for i in headers)
    ids = _ids(lm, prompt + steps, seed=3)
    rt = Runtime(exe, make_backend("model", cfg), vector=True)
    ref = Runtime(host, make_backend("model", cfg), vector=True)
    got = []
    for k in range(steps + 1):
        x = ids[:, :prompt] if k == 0 else ids[:, prompt + k - 1:prompt + k]
        got.append(rt.step(x)[0])
        ref.step(x)
        cache, want = _cache(rt), _cache(ref)
        for name in cache:
            assert np.array_equal(cache[name], want[name]), (k, name)
    twin = use_hardware_numerics(copy.deepcopy(lm), ws, vector=True, attention=True, kv_bits=4)
    for a, b in zip(got, twin_step_logits(twin, ids, prompt), strict=True):
        assert torch.equal(a, b)
