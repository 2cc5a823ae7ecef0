"""The compiler's memos (sw/compile/memo.py): the outcome of fuse_parts and of the moves
passes, looked up by what they read; a changed input misses; a stand-in is never memoised."""

import numpy as np
import pytest
from compile_testutil import VTINY

from hw.isa import VecFunc
from sw.compile import memo
from sw.compile.errors import LoweringError
from sw.compile.fusion import fuse_parts, vector_events
from sw.compile.relocation import lower_vector_template

CFG = VTINY


def _parts(rows: int = 2, length: int = 8) -> list[np.ndarray]:
    """Two vector parts: ADDs of two row lengths."""
    a = lower_vector_template(CFG, VecFunc.ADD, rows, length, second=True)
    b = lower_vector_template(CFG, VecFunc.ADD, rows, length + 4, second=True)
    return [vector_events(a.words), vector_events(b.words)]


@pytest.fixture
def on():
    with memo.enabled():
        yield
    assert memo.stats()["entries"] == 0  # forgotten at the end


def test_outside_enabled_every_call_computes():
    parts = _parts()
    for _ in range(2):
        memo.fuse_parts_cached(CFG, parts)
    assert memo.stats()["entries"] == 0


def test_a_repeat_is_a_hit_and_equals_fuse_parts(on):
    parts = _parts()
    want = fuse_parts(CFG, parts)
    first = memo.fuse_parts_cached(CFG, parts)
    first[0][:] = 0  # a caller changing its copy changes no later answer
    again = memo.fuse_parts_cached(CFG, [p.copy() for p in parts])
    assert np.array_equal(again[0], want[0]) and again[1] == want[1]
    assert memo.stats()["hits"] == 1 and memo.stats()["misses"] == 1


@pytest.mark.parametrize("change", ["word", "spread", "imem", "lanes"])
def test_a_changed_input_misses(on, change):
    parts = _parts()
    memo.fuse_parts_cached(CFG, parts)
    cfg, spread = CFG, True
    if change == "word":
        parts[1] = parts[1].copy()
        parts[1][0, 0] ^= np.uint64(1 << 20)
    elif change == "spread":
        spread = False
    elif change == "imem":
        cfg = CFG.replace(imem_depth=CFG.imem_depth * 2)
    else:
        cfg = CFG.replace(vector_lanes=1 if CFG.vector_lanes != 1 else 2)
    before = memo.content_key("fuse_parts", CFG, _parts(), True)
    assert memo.content_key("fuse_parts", cfg, parts, spread) != before
    memo.fuse_parts_cached(cfg, parts, spread)
    assert memo.stats()["misses"] == 2 and memo.stats()["hits"] == 0


def test_the_drams_size_is_not_in_the_key():
    parts = _parts()
    big = CFG.with_dram(CFG.memory.size_bytes * 4)
    key = memo.content_key("fuse_parts", CFG, parts, True)
    assert memo.content_key("fuse_parts", big, parts, True) == key
    assert memo.content_key("moves", CFG, parts, True) != key


def test_a_program_that_does_not_fit_raises_again(on):
    parts = _parts(rows=4, length=32)
    words, _ = fuse_parts(CFG, parts)
    small = CFG.replace(imem_depth=1 << ((words.shape[0] - 1).bit_length() - 1))
    assert small.imem_depth < words.shape[0]
    for _ in range(2):
        with pytest.raises(LoweringError, match="instruction memory"):
            memo.fuse_parts_cached(small, parts)
    assert memo.stats()["hits"] == 1


def test_a_stand_in_is_called_every_time(on):
    parts, calls = _parts(), []

    def spy(cfg, parts, spread=True):
        calls.append(spread)
        return fuse_parts(cfg, parts, spread=spread)
    for _ in range(2):
        memo.fuse_parts_cached(CFG, parts, False, spy)
    assert calls == [False, False] and memo.stats()["entries"] == 0


def test_the_moves_of_a_fused_program_equal_the_passes(on):
    words, places = fuse_parts(CFG, _parts())
    keep = (places[1][0],)
    want = memo.moves(CFG, words, keep)
    for _ in range(2):
        got = memo.moves_cached(CFG, words, keep)
        assert np.array_equal(got[0], want[0]) and got[1] == want[1]
    assert memo.stats() == {**memo.stats(), "hits": 1, "misses": 1}
    assert memo.content_key("moves", CFG, [words], keep) != memo.content_key(
        "moves", CFG, [words], ())
