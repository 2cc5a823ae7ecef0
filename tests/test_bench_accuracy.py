"""bench.accuracy on a model that is not the reference model: the ``--model`` code path, run on a
tiny random LLaMA with byte-level tokens, and the records file shared by several models."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bench import accuracy as bench
from sw.models import LlamaConfig, LlamaLM
from sw.models.source import ModelSource
from sw.models.tokenizer import EOS_ID, VOCAB_SIZE, decode, encode


@pytest.fixture(autouse=True)
def _restore_threads():
    previous = torch.get_num_threads()  # main() sets the thread count
    yield
    torch.set_num_threads(previous)


def tiny_source(name: str = "tiny") -> ModelSource:
    """A tiny random LlamaLM (tied head, like SmolLM2) with byte-level tokens; its train and
    test splits of both text domains are disjoint random token streams (the bench only needs
    token ids)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=72,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=32, tie_word_embeddings=True)
    streams = {(split, domain): np.random.default_rng(seed).integers(0, 256, 600)
               for seed, (split, domain) in enumerate((s, d) for s in ("train", "test")
                                                      for d in ("code", "prose"))}
    return ModelSource(name, LlamaLM(cfg).eval(), lambda s: encode(s).astype(int).tolist(),
                       decode, EOS_ID, lambda split, domain="code": streams[split, domain],
                       note="tiny random model")


ARGS = ["--model", "tiny", "--calib-samples", "8", "--calib-seq-len", "16", "--eval-tokens",
        "64", "--eval-seq-len", "16", "--patterns", "2:4", "--group", "32", "--threads", "1"]


def test_non_reference_model_records(tmp_path, monkeypatch, capsys):
    src = tiny_source()
    monkeypatch.setattr(bench, "open_model", lambda spec, **_: src)
    out, png = tmp_path / "accuracy.json", tmp_path / "a.png"
    # a reference-model record from before the model field existed is kept as "reference"
    out.write_text(json.dumps([{"method": "fp32", "perplexity": 3.65}]))
    assert bench.main(ARGS + ["--out", str(out), "--plot", str(png)]) == 0
    text = capsys.readouterr().out
    # the token counts used are stated: 8 x 16 calibration tokens, 4 windows of 16 eval tokens
    assert "calibration 8 x 16 = 128 train-split tokens" in text
    assert "eval 64 test-split tokens in 4 windows of 16" in text
    assert "(tied to the embedding)" in text
    saved = json.loads(out.read_text())
    assert saved[0] == {"method": "fp32", "perplexity": 3.65, "model": "reference"}
    records = saved[1:]
    assert {r["model"] for r in records} == {"tiny"}
    labels = {bench.Config(r["method"], r["pattern"], r["bits"], r["group"], r["numerics"],
                           r["symmetric"]).label for r in records}
    float_rows = {c.label for c in bench.default_configs(32, ("2:4",))}
    assert float_rows <= labels and len(labels) == len(records) == len(float_rows) + 4
    assert {r["numerics"] for r in records} == {"float", "hardware", "hardware+attention",
                                                "hardware+vector"}
    assert {r["symmetric"] for r in records if r["pattern"] == "dense" and r["bits"] == 4} \
        == {True, False}
    keys = {"model", "method", "mask", "quant", "pattern", "bits", "group", "symmetric",
            "numerics", "perplexity", "top1_agreement", "kl", "seconds", "eval_tokens",
            "calib_tokens", "model_note", "tied_embeddings", "benchmark_seconds"}
    for r in records:
        assert keys <= set(r) and np.isfinite(r["perplexity"]) and r["seconds"] >= 0
        assert (r["eval_tokens"], r["calib_tokens"], r["eval_seq_len"]) == (64, 128, 16)
        assert r["tied_embeddings"] is True and r["model_note"] == "tiny random model"
    fp32 = records[0]
    assert (fp32["method"], fp32["top1_agreement"], fp32["kl"]) == ("fp32", 1.0, 0.0)
    best = min((r for r in records if r["pattern"] == "2:4" and r["bits"] == 4
                and r["numerics"] == "float"), key=lambda r: r["perplexity"])
    hw = {r["numerics"] for r in records if r["method"] == best["method"]
          and r["pattern"] == "2:4" and r["bits"] == 4}
    assert hw == {"float", "hardware", "hardware+attention", "hardware+vector"}
    cost = bench.vector_cost(records)
    assert len(cost) == 1 and cost[0]["method"] == best["method"]
    assert f"{cost[0]['relative']:+.3%} relative" in text
    assert png.stat().st_size > 1000
    # --replot redraws from the records alone (no model loaded)
    monkeypatch.setattr(bench, "open_model", None)
    png.unlink()
    assert bench.main(["--model", "tiny", "--replot", "--out", str(out), "--plot",
                       str(png)]) == 0
    assert png.stat().st_size > 1000
    assert bench.main(["--model", "nothing", "--replot", "--out", str(out)]) == 2
    monkeypatch.setattr(bench, "open_model", lambda spec, **_: src)

    # a second run of the same model replaces its records and keeps the others
    assert bench.main(ARGS + ["--out", str(out), "--no-plot", "--only", "^rtn",
                              "--no-hardware"]) == 0
    saved = json.loads(out.read_text())
    assert [(r["model"], r["method"], r.get("symmetric")) for r in saved] == [
        ("reference", "fp32", None), ("tiny", "fp32", True), ("tiny", "rtn", True),
        ("tiny", "rtn", False)]


def test_kv_cache_study_rows_and_costs(tmp_path, monkeypatch, capsys):
    src = tiny_source()
    monkeypatch.setattr(bench, "open_model", lambda spec, **_: src)
    out = tmp_path / "kv.json"
    assert bench.main(ARGS + ["--out", str(out), "--kv-cache", "--only",
                              r"^(gptq dense w4g32|magnitude\+rtn 2:4 w4g32)$"]) == 0
    records = json.loads(out.read_text())
    rows = {(r["method"], r["numerics"]) for r in records}
    kinds = {"float", "hardware", "hardware+attention", "hardware+kv4"}
    assert rows == ({("fp32", k) for k in ("float", "float+attention", "float+kv4")}
                    | {(m, k) for m in ("gptq", "magnitude+rtn") for k in kinds})
    cost = bench.kv_cost(records)
    assert {(c["method"], c["linears"]) for c in cost} == {
        ("fp32", "float"), ("gptq", "W4A8"), ("magnitude+rtn", "W4A8")}
    ppl = {(r["method"], r["numerics"]): r["perplexity"] for r in records}
    for c in cost:
        hw = "float" if c["linears"] == "float" else "hardware"
        assert c["perplexity_int4_kv"] == ppl[(c["method"], f"{hw}+kv4")]
        assert c["int4_vs_int8"] == pytest.approx(
            ppl[(c["method"], f"{hw}+kv4")] / ppl[(c["method"], f"{hw}+attention")] - 1)
        assert c["perplexity_int4_kv"] != c["perplexity_int8_kv"]  # the widths differ
    text = capsys.readouterr().out
    assert text.count("KV cache (") == 3 and "vs INT8" in text


def test_domains_and_tie_rule_are_recorded_and_kept_apart(tmp_path, monkeypatch, capsys):
    src = tiny_source()
    monkeypatch.setattr(bench, "open_model", lambda spec, **_: src)
    out = tmp_path / "accuracy.json"
    quick = ARGS + ["--out", str(out), "--no-hardware", "--only", "^magnitude 2:4 fp16"]
    assert bench.main(quick + ["--no-plot"]) == 0
    assert bench.main(quick + ["--domain", "prose", "--plot", str(tmp_path / "p.png")]) == 0
    assert "calibration 8 x 16 = 128 train-split tokens (seed 0) of code; eval 64 test-split " \
        "tokens in 4 windows of 16 of prose" in capsys.readouterr().out
    # one compression, evaluated on both domains: a record each
    assert bench.main(quick + ["--domain", "code,prose", "--calib-domain", "code+prose",
                               "--plot", str(tmp_path / "q.png")]) == 0
    assert bench.main(quick + ["--ties", "higher", "--no-plot"]) == 0
    saved = json.loads(out.read_text())
    runs = [(r["calib_corpus"], r["eval_corpus"], r["nm_ties"], r["method"]) for r in saved]
    # every run kept beside the others: fp32 and the magnitude row of each
    assert sorted(runs) == sorted((c, e, t, m) for c, e, t in (
        ("code", "code", "lower"), ("code", "prose", "lower"), ("code+prose", "code", "lower"),
        ("code+prose", "prose", "lower"), ("code", "code", "higher"))
        for m in ("fp32", "magnitude"))
    ppl = {(r["calib_corpus"], r["eval_corpus"], r["method"]): r["perplexity"] for r in saved
           if r["nm_ties"] == "lower"}
    # the fp32 model needs no calibration: the same on prose whatever the calibration set
    assert ppl["code", "prose", "fp32"] == ppl["code+prose", "prose", "fp32"]
    assert ppl["code", "code", "fp32"] == ppl["code+prose", "code", "fp32"]
    assert ppl["code", "prose", "fp32"] != ppl["code", "code", "fp32"]
    # --replot picks one run's records
    assert bench.main(["--model", "tiny", "--replot", "--out", str(out), "--domain", "prose",
                       "--plot", str(tmp_path / "r.png")]) == 0
    assert bench.main(["--model", "tiny", "--replot", "--out", str(out), "--domain", "prose",
                       "--calib-domain", "prose"]) == 2
    assert (tmp_path / "q.png").stat().st_size > 1000  # --plot: the first domain's
    with pytest.raises(SystemExit) as e:
        bench.main(quick + ["--domain", "code,poetry"])
    assert e.value.code == 2
    assert bench._plot_path("tiny", calib="prose", domain="prose").name == \
        "accuracy_tiny_prose.png"
    assert bench._plot_path("reference", calib="code+prose", domain="code").name == \
        "accuracy_code-prose_on_code.png"


def test_reference_model_keeps_its_protocol():
    # the reference model's windows and calibration from its ModelSource are the ones the
    # benchmark always used (sw.models.eval's protocol), so its rows compute what they did
    from sw.models.eval import calibration_samples, eval_windows
    from sw.models.source import open_model

    src = open_model("reference")
    assert bench.eval_protocol(src, 256, 32768) == bench.PROTOCOL
    assert torch.equal(src.windows("test", 256, 32768), eval_windows(bench.PROTOCOL))
    assert torch.equal(src.calibration(64, 256, 0), calibration_samples(64, 256, 0))
    assert bench.model_defaults("reference")["patterns"] == bench.PRUNE_PATTERNS
    other = bench.MODEL_DEFAULTS["other"]
    assert bench.model_defaults("some/dir") == other
    assert {k: v for k, v in bench.model_defaults("smollm2").items() if k != "title"} == other


def test_context_and_bad_options(monkeypatch):
    monkeypatch.setattr(bench, "open_model", lambda spec, **_: tiny_source())
    with pytest.raises(SystemExit) as e:
        bench.main(["--model", "tiny", "--eval-seq-len", "64", "--no-plot"])
    assert e.value.code == 2  # 64 > the tiny model's 32 positions
    with pytest.raises(SystemExit):
        bench.main(["--eval-tokens", "lots"])


def test_magnitude_ties_counts_the_blocks_the_tie_rule_decides():
    from sw.compress.model import selected_linears
    model = tiny_source().model
    assert bench.magnitude_ties(model) == 0.0  # random float weights: no exact ties
    layers = list(selected_linears(model).values())
    with torch.no_grad():
        for lin in layers:  # every 4-block |W| = (3, 1, 1, 0): the 2nd and 3rd largest tie
            lin.weight.copy_(torch.tensor([3.0, -1.0, 1.0, 0.0]).repeat(
                lin.weight.shape[0], lin.weight.shape[1] // 4))
    assert bench.magnitude_ties(model) == 1.0
    assert bench.magnitude_ties(model, "1:4") == 0.0  # 3 is alone at the top


def test_lm_head_study_rows(tmp_path, monkeypatch, capsys):
    """``--lm-head``: one row per head choice on the model's default recipe (here a tied head,
    compressed as a copy), the float head's the baseline of ``relative_to_host``."""
    src = tiny_source()
    embed = src.model.model.embed_tokens.weight.detach().clone()
    monkeypatch.setattr(bench, "open_model", lambda spec, **_: src)
    out = tmp_path / "head.json"
    other = {"model": "another", "lm_head": "host", "perplexity": 9.0}
    out.write_text(json.dumps([other]))
    assert bench.main(ARGS + ["--out", str(out), "--lm-head"]) == 0
    records = json.loads(out.read_text())
    assert other in records  # another model's records are kept, its own replaced
    assert bench.main(ARGS + ["--out", str(out), "--lm-head"]) == 0
    again = json.loads(out.read_text())  # a rerun replaces its three rows
    assert len(again) == 4 and other in again
    records = [r for r in records if r["model"] != "another"]
    assert [(r["lm_head"], r["head_format"]) for r in records] == [
        ("host", None), ("int4", "dense-int4"), ("int8", "dense-int8")]
    ppl = {r["lm_head"]: r["perplexity"] for r in records}
    for r in records:
        assert r["relative_to_host"] == pytest.approx(ppl[r["lm_head"]] / ppl["host"] - 1)
        assert r["tied_embeddings"] is True
    assert ppl["int4"] != ppl["host"]  # the head's compression reaches the logits
    assert torch.equal(src.model.model.embed_tokens.weight, embed)
    assert "lm_head int4" in capsys.readouterr().out
