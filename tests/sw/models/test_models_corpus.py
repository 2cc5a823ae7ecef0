"""Corpus collection and splits, evaluation protocol, calibration samples."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from models_testutil import tiny_model

from sw.models import corpus
from sw.models.eval import (
    EvalProtocol,
    calibration_samples,
    compare,
    eval_windows,
    perplexity,
    unigram_baseline,
)
from sw.models.tokenizer import EOS_ID, VOCAB_SIZE, build_tokenizer, decode, encode


def test_file_list_is_sorted_and_filtered():
    files = corpus.list_files()
    assert list(files) == sorted(files) and len(files) > 300
    assert "os.py" in files and "argparse.py" in files
    assert not any(f.startswith(("test/", "encodings/", "site-packages/")) for f in files)
    assert not any("/tests/" in f or "__pycache__" in f for f in files)


def test_splits_are_deterministic_disjoint_and_cover_everything():
    parts = {s: set(corpus.split_files(s)) for s in corpus.SPLITS}
    assert set().union(*parts.values()) == set(corpus.list_files())
    assert sum(len(p) for p in parts.values()) == len(corpus.list_files())
    assert all(len(p) > 10 for p in parts.values())
    # A file's split depends only on its path (stable hash), not on the other files.
    assert corpus.split_of("os.py") == corpus.split_of("os.py")
    assert [corpus.split_of(f) for f in sorted(parts["test"])] == ["test"] * len(parts["test"])
    assert corpus.split_of("inspect.py") == "test"  # pinned: changing the hash would show


def test_split_streams_end_files_with_eos():
    tokens = corpus.load_split("test")
    assert tokens.dtype == np.uint16 and not tokens.flags.writeable
    assert int((tokens == EOS_ID).sum()) == len(corpus.split_files("test"))
    assert tokens[-1] == EOS_ID and tokens.max() <= EOS_ID


def test_fingerprint_matches_itself_and_reports_differences():
    fp = corpus.corpus_fingerprint()
    assert corpus.fingerprint_mismatches(fp) == []
    other = {**fp, "content_sha256": "0" * 64}
    assert len(corpus.fingerprint_mismatches(other)) == 1


def test_tokenizer_json_matches_byte_encoding():
    text = "def f(x):\n    return 'héllo' + \"\\t\" \x00\x7f"
    tok = build_tokenizer()
    assert tok.encode(text).ids == encode(text).tolist()
    assert tok.decode(tok.encode(text).ids) == text == decode(encode(text))
    assert tok.get_vocab_size() == VOCAB_SIZE
    assert tok.encode("<|eos|>a").ids == [EOS_ID, 97]


def test_eval_windows_protocol():
    protocol = EvalProtocol(seq_len=64, max_tokens=640)
    windows = eval_windows(protocol)
    tokens = corpus.load_split("test")
    assert windows.shape == (10, 65) and windows.dtype == torch.int64
    # Non-overlapping targets: window i covers tokens [64 i, 64 (i + 1)].
    assert torch.equal(windows[3], torch.from_numpy(tokens[192:257].astype(np.int64)))


def test_perplexity_and_comparison_of_a_model():
    protocol = EvalProtocol(seq_len=32, max_tokens=512, batch_size=4)
    model = tiny_model(vocab_size=VOCAB_SIZE)
    result = perplexity(model, protocol)
    assert result.num_tokens == 512
    assert math.isclose(result.perplexity, math.exp(result.nll))
    # An untrained model is near uniform over the vocabulary.
    assert abs(result.nll - math.log(VOCAB_SIZE)) < 0.5
    same = compare(model, model, protocol)
    assert same.top1_agreement == 1.0 and same.mean_kl == 0.0
    other = compare(tiny_model(seed=5, vocab_size=VOCAB_SIZE), model, protocol)
    assert other.top1_agreement < 1.0 and other.mean_kl > 0.0


def test_unigram_baseline_is_sane():
    result = unigram_baseline(EvalProtocol(max_tokens=4096))
    # Python source bytes: a few bits of entropy per byte, well below log2(260).
    assert 3.0 < result.bits_per_token < 6.0


def test_calibration_samples_are_seeded_and_from_train():
    a = calibration_samples(8, 128, seed=3)
    assert a.shape == (8, 128) and a.dtype == torch.int64
    assert torch.equal(a, calibration_samples(8, 128, seed=3))
    assert not torch.equal(a, calibration_samples(8, 128, seed=4))
    train = corpus.load_split("train")
    row = a[0].numpy().astype(np.uint16)
    # Each row is a contiguous slice of the train stream.
    hits = np.flatnonzero(train[: train.size - 127] == row[0])
    assert any(np.array_equal(train[h : h + 128], row) for h in hits)


def test_calibration_samples_errors_on_short_corpus(tmp_path):
    (tmp_path / "tiny.py").write_text("x = 1\n")
    root = str(tmp_path)
    split = corpus.split_of("tiny.py")
    with pytest.raises(corpus.CorpusError, match="only 7 tokens.*length 128"):
        calibration_samples(4, 128, split=split, root=root)
    with pytest.raises(corpus.CorpusError, match="need at least 257"):
        eval_windows(EvalProtocol(split=split), root=root)
    with pytest.raises(corpus.CorpusError, match="must be positive"):
        calibration_samples(0, 16, root=root)
    with pytest.raises(corpus.CorpusError, match="unknown split"):
        corpus.split_files("dev", root)


# ---------------------------------------------------------------------- the prose domain
def test_prose_split_is_deterministic_disjoint_and_stated():
    articles = corpus.prose_articles()
    texts = [t for _, t in articles]
    assert len(set(texts)) == len(texts)  # duplicates kept once
    parts = {s: set(corpus.split_texts(s, corpus.PROSE)) for s in corpus.SPLITS}
    assert all(not (parts[a] & parts[b]) for a in corpus.SPLITS for b in corpus.SPLITS if a < b)
    assert set().union(*parts.values()) == set(texts)
    # the stated rule: background articles [0, 150) test, [150, 200) validation, the rest and
    # every lee.cor article train
    assert [corpus.prose_split_of(i) for i in (0, 149, 150, 199, 200, 299)] == [
        "test", "test", "validation", "validation", "train", "train"]
    assert corpus.prose_split_of(0, extra=True) == "train"
    assert {s: len(p) for s, p in parts.items()} == {"train": 147, "validation": 49, "test": 147}
    corpus.prose_articles.cache_clear()
    assert corpus.prose_articles() == articles  # read again: the same articles, same order


def test_no_prose_story_straddles_two_splits():
    # near-duplicate articles (the same news item rewritten) share word 3-grams; across splits
    # the most similar pair shares 6% of them (Jaccard), within one split some share over 50%
    def grams(text):
        w = text.lower().split()
        return {tuple(w[i:i + 3]) for i in range(len(w) - 2)}
    split = {s: [grams(t) for t in corpus.split_texts(s, corpus.PROSE)] for s in corpus.SPLITS}
    worst = max(len(a & b) / len(a | b) for x in corpus.SPLITS for y in corpus.SPLITS if x < y
                for a in split[x] for b in split[y])
    assert worst < 0.2


def test_prose_tokens_windows_and_fingerprint():
    tokens = corpus.load_split("test", domain=corpus.PROSE)
    assert int((tokens == EOS_ID).sum()) == len(corpus.split_texts("test", corpus.PROSE))
    assert decode(tokens[:40]).startswith("Hundreds of people have been forced")
    # the reference model's protocol on prose: 128 windows of 256 byte tokens
    windows = eval_windows(EvalProtocol(corpus=corpus.PROSE))
    assert windows.shape == (128, 257)
    assert torch.equal(windows[1], torch.from_numpy(tokens[256:513].astype(np.int64)))
    assert 3.0 < unigram_baseline(EvalProtocol(max_tokens=4096, corpus="prose")).bits_per_token
    fp = corpus.prose_fingerprint()
    assert fp["num_articles"] == 343 and len(fp["content_sha256"]) == 64
    assert fp["split_tokens"]["test"] == tokens.size


def test_calibration_sets_mix_both_domains():
    code = calibration_samples(5, 64, seed=1)
    prose = calibration_samples(5, 64, seed=1, calib="prose")
    mixed = calibration_samples(5, 64, seed=1, calib="code+prose")
    # ceil(5 / 2) code windows, then floor(5 / 2) prose ones, each drawn with the seed
    assert torch.equal(mixed, torch.cat([calibration_samples(3, 64, seed=1),
                                         calibration_samples(2, 64, seed=1, calib="prose")]))
    assert not torch.equal(code, prose)
    with pytest.raises(corpus.CorpusError, match="unknown text domain 'poetry'"):
        calibration_samples(4, 64, calib="poetry")


def test_prose_corpus_missing_says_make_setup(monkeypatch):
    import importlib.util
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(corpus.CorpusError) as e:
        corpus.prose_dir()
    assert "not installed" in str(e.value) and "`make setup` installs it" in str(e.value)
    assert "\n" not in str(e.value)


def test_eval_cli_on_prose(capsys):
    from sw.models.eval import main
    assert main(["--domain", "prose", "--max-tokens", "512", "--json"]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    assert out["protocol"]["corpus"] == "prose" and out["model"]["num_tokens"] == 512
    with pytest.raises(SystemExit) as e:
        main(["--domain", "poetry"])
    assert e.value.code == 2 and "--domain" in capsys.readouterr().err
