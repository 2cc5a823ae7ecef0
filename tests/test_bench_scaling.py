"""bench.scaling's records: the host work, programs per token, the KV width and the roofline
fraction end to end (the host's work at its estimated on-chip cycles counted); the one-program
decode step on the vector engine (a small model standing in for LLaMA-7B), the merge of a run
into the record and the targets."""

import itertools
import json
import logging
import random

import pytest
import torch

from bench.common import ROOT
from bench.scaling import (
    SYSTEMS,
    VECTOR_SYSTEMS,
    main,
    merged,
    persistent_lines,
    record_key,
    run_step,
    step_options,
    summarise,
    vector_spads,
)
from hw.config import VECTOR_WORD_BYTES, AcceleratorConfig
from hw.format import WeightFormat
from hw.isa import INSERT_FIELDS
from sw.compile import compile_model
from sw.compile.compiler import capture_model
from sw.compile.kvappend import KVAppendOp
from sw.compile.lower import KVLayout
from sw.models import LlamaConfig, LlamaLM
from sw.runtime.runtime import HostRun, ProgramRun, StepStats


def test_a_record_has_the_host_work_and_the_roofline_end_to_end():
    cfg = AcceleratorConfig()
    st = StepStats("decode", 127, 1)
    st.programs = [ProgramRun("lm_head", 0, None, 1000, {"vector_exec": 300, "mac_cycles": 48},
                              4096, 64, 512, 400.0)]
    st.host = [HostRun("embed_tokens", "embed", 2e-4, 100),
               HostRun("lm_head", "linear:io", 0.0, 1, 3e-5)]
    st.ops = {"lm_head": "linear"}
    r = summarise(st, cfg, "decode", 1, kv_bits=4)
    assert r["host_ms"] == 2e-4 * 1e3 and r["host_io_ms"] == 3e-5 * 1e3
    assert r["programs_per_token"] == 1 and r["host_transitions"] == 2
    assert r["kv_bits"] == 4
    # the bound over the programs' cycles plus the host's estimated on-chip cycles
    assert r["roofline_fraction"] == 400.0 / 1101
    assert r["roofline_fraction_accelerator"] == 400.0 / 1000
    # what bounds it: the memory's cycles, the array's (at its peak, and computing) and the
    # vector engine's
    assert r["memory_bound_cycles"] == 4096 / cfg.beat_bytes
    assert r["array_bound_cycles"] == 512 / cfg.lanes and r["vector_cycles"] == 300
    assert r["array_cycles"] == 48


def tiny_meta_lm(layers: int = 2) -> LlamaLM:
    """A LLaMA-style model of LLaMA-7B's kind (multi-head, no GQA) small enough for a test,
    shapes only."""
    with torch.device("meta"):
        return LlamaLM(LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=352,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=4, max_position_embeddings=256))


@pytest.mark.parametrize("kv_bits", [8, 4])
def test_with_the_vector_engine_a_decode_step_is_one_program(kv_bits):
    lm = tiny_meta_lm()
    c = lm.config
    cfg = AcceleratorConfig(rows=4, cols=8).replace(
        **vector_spads(c.hidden_size, c.intermediate_size, c.vocab_size)).timing_only()
    fmt = WeightFormat.parse("2:4-int4")
    stats = run_step(cfg, fmt, "decode", 1, 64, kv_bits, model=lm)
    r = summarise(stats, cfg, "decode", 1, kv_bits)
    assert r["programs_per_token"] == 1 and r["host_transitions"] == 2
    assert r["kv_bits"] == kv_bits and r["host_ms"] > 0
    assert r["linear_cycles"] is None     # the linear layers are inside the one program
    # everything on chip but the program's input and output: the end-to-end fraction is the
    # accelerator's but for those few estimated cycles (at most 1% of the step's here)
    assert 0.99 * r["roofline_fraction_accelerator"] <= r["roofline_fraction"] \
        <= r["roofline_fraction_accelerator"]
    # without the engine the same step is programs per layer with the host between them
    plain = summarise(run_step(cfg.replace(vin_spad_bytes=0, vout_spad_bytes=0), fmt, "decode",
                               1, 64, kv_bits, model=lm), cfg, "decode", 1, kv_bits)
    assert plain["programs_per_token"] > c.num_hidden_layers
    assert 0 < plain["linear_cycles"] < plain["cycles"]


def test_the_vector_engine_is_sized_from_the_rows_it_reads_whole():
    rng = random.Random(28)
    for _ in range(50):
        hidden, inter, vocab = (rng.randrange(64, 1 << 15) for _ in range(3))
        s = vector_spads(hidden, inter, vocab)
        vin, vout = s["vin_spad_bytes"], s["vout_spad_bytes"]
        for n in (vin, vout):
            assert n & (n - 1) == 0
        longest = VECTOR_WORD_BYTES * max(vocab, inter, 2 * hidden)
        assert longest <= vin // 2 < 2 * longest
        assert VECTOR_WORD_BYTES * hidden <= vout // 2 < 2 * VECTOR_WORD_BYTES * hidden
    assert all(cfg.has_vector for _, cfg in VECTOR_SYSTEMS)
    assert [s for s, _ in VECTOR_SYSTEMS] == list(dict.fromkeys(s for s, _ in SYSTEMS))


def test_the_wide_memories_have_an_engine_a_beat_or_a_head_wide():
    """DDR4- and HBM-class engines take a beat's int32 elements a cycle, at most a head's
    128 channels (32 and 128 lanes: ``wide_lanes``), SILU_GATE among them and, where the
    lanes hold a head (HBM-class), the ROPEs over heads; the default keeps one lane, its
    recorded rows unchanged."""
    lanes = {label: (cfg.vector_lanes, cfg.beat_bytes // VECTOR_WORD_BYTES,
                     cfg.vector_laned_silu, cfg.vector_laned_rope_heads)
             for label, cfg in VECTOR_SYSTEMS}
    assert lanes == {"default": (1, 4, False, False), "DDR4-class": (32, 32, True, False),
                     "HBM-class": (128, 512, True, True)}
    for _, cfg in VECTOR_SYSTEMS:
        assert cfg.timing_only().vector_lanes == cfg.vector_lanes


def _rec(configuration=None, fmt="dense-int4", kv=8, ctx=128, system="default", commit="a1",
         **more):
    r = {"system": system, "array": "4x8", "phase": "decode", "context": ctx, "kv_bits": kv,
         "format": fmt, "provenance": {"commit": commit}, **more}
    if configuration:
        r["configuration"] = configuration
    return r


def test_a_run_replaces_its_records_and_keeps_the_others_labelled():
    old = [_rec(), _rec(fmt="2:4-int4"), _rec("vector"), _rec("vector", kv=4)]
    new = [_rec("vector", commit="b2"), _rec("default", fmt="2:4-int4", commit="b2")]
    out = merged(old, new)
    assert [record_key(r) for r in out] == [
        ("default", "default", "4x8", "decode", 128, 8, "dense-int4"),
        ("vector", "default", "4x8", "decode", 128, 4, "dense-int4"),
        ("vector", "default", "4x8", "decode", 128, 8, "dense-int4"),
        ("default", "default", "4x8", "decode", 128, 8, "2:4-int4")]
    assert [r["provenance"]["commit"] for r in out] == ["a1", "a1", "b2", "b2"]
    assert all("configuration" in r for r in out)


def test_the_targets_name_the_worst_row_and_the_speedup_at_2048():
    def rec(fmt, kv, ctx, fraction, speedup, system="default"):
        return _rec("vector", fmt, kv, ctx, system, roofline_fraction=fraction,
                    speedup_vs_dense_int4=speedup, bandwidth_gbps=1.6, step_ms=1.0,
                    tokens_per_s=1.0, programs_per_token=1, host_ms=0.5)
    records = [rec("dense-int4", 4, 2048, 0.95, 1.0), rec("2:4-int4", 4, 2048, 0.91, 1.30),
               rec("2:4-int4", 8, 2048, 0.89, 1.20),
               rec("dense-int4", 8, 128, 0.85, 1.0, "HBM-class")]
    text = "\n".join(persistent_lines(records))
    assert "Not one program" not in text
    assert "| 95.0% | - | 1.00x |" in text      # a record without the bounds
    records[0].update(cycles=1000, memory_bound_cycles=904.0, array_bound_cycles=125.0,
                      vector_cycles=333)
    assert "| 95.0% | 90% / 12% / 33% | 1.00x |" in "\n".join(persistent_lines(records))
    records[0]["array_cycles"] = 500   # the array computes longer than its MACs at peak
    assert "| 95.0% | 90% / 12% (50%) / 33% | 1.00x |" in "\n".join(persistent_lines(records))
    records[-1]["programs_per_token"] = 65
    text = "\n".join(persistent_lines(records))
    assert "Not one program per token: HBM-class 4x8, 65 programs." in text
    assert "| default 4x8, decode context 2048: roofline, end to end (worst of 3: formats x " \
        "KV widths) | >= 90% | 89.0% (2:4-int4, INT8 KV) | **not met** |" in text
    assert "| >= 80% | 85.0% (dense-int4, INT8 KV) | met |" in text
    assert "INT4 KV: tokens/s, 2:4 INT4 vs dense INT4 | >= 1.28x | 1.30x | met |" in text
    assert "INT8 KV: tokens/s, 2:4 INT4 vs dense INT4 | (reported) | 1.20x | reported |" in text


def test_the_one_program_configuration_runs_decode_steps_only():
    with pytest.raises(SystemExit) as e:
        main(["--config", "vector", "--steps", "prefill-256"])
    assert e.value.code == 2


def test_a_quick_run_records_one_program_per_token(monkeypatch, tmp_path):
    """The whole command on a small model in LLaMA-7B's place: its records join the kept
    per-layer one in the JSON and the page."""
    import bench.scaling as scaling
    lm = tiny_meta_lm()
    monkeypatch.setattr(scaling, "llama7b", lambda: lm)
    monkeypatch.setattr(scaling, "_captured", lambda *step: capture_model(
        lm, scaling.step_options(*step)))
    out = tmp_path / "scaling.json"
    kept = next(r for r in json.loads((ROOT / "bench" / "results" / "scaling.json").read_text())
                if r.get("configuration", "default") == "default")
    kept = {**kept, "provenance": {**kept["provenance"], "commit": "0123abc"}}
    out.write_text(json.dumps([kept]))
    assert main(["--quick", "--kv-bits", "8", "--out", str(out), "--docs",
                 str(tmp_path)]) == 0
    records = json.loads(out.read_text())
    assert [(r["configuration"], r["format"]) for r in records] == [
        ("default", kept["format"])] + [("vector", f) for f in scaling.FORMATS]
    new = records[1:]
    assert all(r["programs_per_token"] == 1 and r["gemm_speedup_vs_dense_int4"] is None
               for r in new)
    assert new[0]["speedup_vs_dense_int4"] == 1.0
    assert new[1]["speedup_vs_dense_int4"] > 1.0      # 2:4 streams fewer weight bytes
    command = f"python -m bench.scaling --quick --kv-bits 8 --out {out} --docs {tmp_path}"
    assert "run" not in records[0] and all(r["run"]["command"] == command for r in new)
    page = (tmp_path / "scaling.md").read_text()
    assert "## One program per decode step" in page and "0123abc" in page
    # the header names each run behind the rows: this one and the kept, unstamped one
    assert f"- `{command}` ({new[0]['run']['wall_s']} s, {len(new)} rows at " in page
    assert "- earlier runs (unstamped, 1 row at 0123abc)" in page


def test_a_per_layer_run_keeps_the_one_program_rows(monkeypatch, tmp_path):
    """``--config default`` on a small model: per-layer rows with their linear layers' cycles
    apart, the one-program rows already recorded kept, the host-ops record written."""
    import bench.scaling as scaling
    lm = tiny_meta_lm()
    monkeypatch.setattr(scaling, "llama7b", lambda: lm)
    monkeypatch.setattr(scaling, "_captured", lambda *step: capture_model(
        lm, scaling.step_options(*step)))
    out = tmp_path / "scaling.json"
    out.write_text(json.dumps([_rec("vector", commit="0123abc", bandwidth_gbps=1.6,
                                    step_ms=1.0, tokens_per_s=1.0, roofline_fraction=0.95,
                                    speedup_vs_dense_int4=1.0, programs_per_token=1,
                                    host_ms=0.5)]))
    assert main(["--config", "default", "--quick", "--steps", "decode-128", "--kv-bits", "8",
                 "--out", str(out), "--docs", str(tmp_path)]) == 0
    records = json.loads(out.read_text())
    assert [r["configuration"] for r in records] == ["vector"] + ["default"] * 3
    assert all(r["programs_per_token"] > 1 and r["gemm_speedup_vs_dense_int4"] > 0
               for r in records[1:])
    assert (tmp_path / "scaling_host_ops.json").is_file()
    page = (tmp_path / "scaling.md").read_text()
    assert "## One program per layer" in page and "0123abc" in page


def test_the_hbm_class_kv_append_stays_on_the_host_and_the_compiler_says_why(caplog):
    """HBM-class's 2048-byte beat has more bytes (nibbles at INT4) than an INSERT's ``base``
    names: LLaMA-7B's append cannot be on chip there, and compiling a decode step warns why;
    the default's and DDR4-class's append lowers."""
    width = dict(INSERT_FIELDS)["base"]

    def why(kv_bits):
        unit = "nibble" if kv_bits == 4 else "byte"
        return (f"an INSERT's {width}-bit base cannot name every {unit} of a 2048-byte beat "
                f"({2048 * (1 + (kv_bits == 4))} of them)")
    for (label, design), kv_bits in itertools.product(VECTOR_SYSTEMS, (8, 4)):
        cfg = design.timing_only()
        layout = KVLayout(head_dim=128, max_context=2048, lanes=cfg.lanes,
                          beat=cfg.beat_bytes, bits=kv_bits)
        op = KVAppendOp(0, 32, layout, "k", "v", "kv", *(
            tuple(f"{s}{h}" for h in range(32)) for s in ("key", "val", "code", "chan")),
            scale_word=1)
        assert op.refusal(cfg) == (why(kv_bits) if label == "HBM-class" else None), label
    lm = tiny_meta_lm(layers=1)
    hbm = dict(VECTOR_SYSTEMS)["HBM-class"].timing_only()
    with caplog.at_level(logging.WARNING, logger="sw.compile.compiler"):
        compile_model(lm, hbm, step_options("decode", 1, 64, 4, argmax=True),
                      formats={n: WeightFormat.parse("2:4-int4") for n, m in lm.named_modules()
                               if isinstance(m, torch.nn.Linear)})
    assert [r.getMessage() for r in caplog.records if "KV append" in r.getMessage()] == [
        "decode: the KV append runs on the host, so a decode step splits before each layer's "
        f"attention: {why(4)}"]
