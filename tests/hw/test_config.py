"""Accelerator configuration: validation and JSON round trip."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hw.config import DENSE, AcceleratorConfig, ConfigError, MemoryModel, NMPattern

PATTERNS = ["1:4", "2:4", "3:4", "1:8", "2:8", "4:8", "4:16", "8:16"]


@st.composite
def configs(draw):
    rows = draw(st.sampled_from([1, 2, 4, 8]))
    cols = draw(st.sampled_from([8, 16, 32])) if rows == 1 else draw(st.sampled_from([4, 8, 16]))
    pats = draw(st.lists(st.sampled_from(PATTERNS), min_size=0, max_size=5, unique=True))
    beat = draw(st.sampled_from([8, 16]))
    return AcceleratorConfig(
        rows=rows, cols=cols, patterns=tuple(pats), max_tokens=draw(st.sampled_from([1, 8, 16])),
        weight_bits=draw(st.sampled_from([(4,), (4, 8)])),
        memory=MemoryModel(bytes_per_cycle=beat, latency=draw(st.integers(1, 100)),
                           size_bytes=beat * draw(st.integers(64, 4096))),
        queue_depth=draw(st.integers(1, 16)), num_events=draw(st.integers(1, 31)),
        clock_mhz=draw(st.floats(10, 500)))


@given(configs())
def test_json_round_trip(cfg):
    again = AcceleratorConfig.from_json(cfg.to_json())
    assert again == cfg
    assert json.loads(again.to_json()) == json.loads(cfg.to_json())


def test_default_fits_the_contract():
    cfg = AcceleratorConfig()
    assert cfg.lanes == 32 and cfg.beat_bytes == 16
    assert cfg.pattern_table[0] == DENSE
    assert cfg.pattern_index("2:4") == cfg.pattern_table.index(NMPattern(2, 4))
    # 255 * 255 (INT8 asymmetric) needs 17 signed bits.
    assert cfg.weight_operand_bits == 17


def test_save_load(tmp_path):
    cfg = AcceleratorConfig(rows=2, cols=8, patterns=("2:4",))
    cfg.save(tmp_path / "c.json")
    assert AcceleratorConfig.load(tmp_path / "c.json") == cfg


@pytest.mark.parametrize("kwargs, needle", [
    ({"rows": 3}, "rows must be a power of two"),
    ({"cols": 0}, "cols must be a power of two"),
    ({"rows": 1, "cols": 4}, "rows*cols must be >= 8"),
    ({"max_tokens": 12}, "max_tokens"),
    ({"weight_bits": (4, 2)}, "weight_bits"),
    ({"weight_bits": (8,)}, "must include 4"),
    ({"act_bits": 16}, "act_bits must be 8, got 16"),
    ({"patterns": ("2:4", "2:4")}, "duplicate"),
    ({"patterns": ("dense",)}, "sparse patterns only"),
    ({"patterns": ("5:4",)}, "N must be < M"),
    ({"patterns": ("2:6",)}, "M must be a power of two"),
    ({"patterns": ("2-4",)}, "must look like '2:4'"),
    ({"num_events": 40}, "num_events must be in [1, 31], got 40"),
    ({"wgt_spad_bytes": 1000}, "wgt_spad_bytes must be a positive multiple"),
    ({"clock_mhz": -5}, "clock_mhz"),
    ({"group_size": 100}, "group_size"),
])
def test_bad_values_are_named(kwargs, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")
                       .replace("*", r"\*")):
        AcceleratorConfig(**kwargs)


@pytest.mark.parametrize("mem, needle", [
    ({"bytes_per_cycle": 12}, "bytes_per_cycle must be a power of two"),
    ({"latency": 0}, "latency"),
    ({"size_bytes": 1000}, "multiple of bytes_per_cycle"),
    ({"cycles_per_beat": 0}, r"cycles_per_beat must be an int in \[1, 16\], got 0"),
    ({"cycles_per_beat": 17}, "cycles_per_beat .* got 17"),
    ({"cycles_per_beat": 2.0}, "cycles_per_beat .* got 2.0"),
    ({"cycles_per_beat": True}, "cycles_per_beat .* got True"),
])
def test_bad_memory(mem, needle):
    with pytest.raises(ConfigError, match=needle):
        MemoryModel(**mem)


def test_bad_json():
    with pytest.raises(ConfigError, match="not valid JSON"):
        AcceleratorConfig.from_json("{rows: 4")
    with pytest.raises(ConfigError, match="unknown configuration fields: \\['colums'\\]"):
        AcceleratorConfig.from_json('{"colums": 4}')
    with pytest.raises(ConfigError, match="unknown memory fields"):
        AcceleratorConfig.from_json('{"memory": {"bandwidth": 4}}')


def test_unsupported_pattern_is_named():
    cfg = AcceleratorConfig(patterns=("2:4",))
    with pytest.raises(ConfigError, match="pattern 1:4 is not supported"):
        cfg.pattern_index("1:4")


def test_with_dram_changes_only_the_size():
    cfg = AcceleratorConfig()
    big = cfg.with_dram(128 << 20)
    assert big.memory.size_bytes == 128 << 20
    assert big.replace(memory=cfg.memory) == cfg          # nothing else changed
    with pytest.raises(ConfigError, match="multiple of bytes_per_cycle"):
        cfg.with_dram(3)


def test_timing_only_view_changes_only_dram_and_imem():
    cfg = AcceleratorConfig(imem_depth=64)
    t = cfg.timing_only()
    assert t.memory.size_bytes == 1 << 36 and t.imem_depth == 1 << 20
    assert t.replace(memory=cfg.memory, imem_depth=64) == cfg
    big = AcceleratorConfig(imem_depth=1 << 20, memory=MemoryModel(
        bytes_per_cycle=64, size_bytes=1 << 38))  # 64-byte beats: 2**32 beats
    assert big.timing_only() == big  # never shrinks


def test_an_unpaced_memory_keeps_its_fingerprint():
    """MemoryModel.cycles_per_beat: at 1 (the default) absent from to_dict, so every
    configuration from before the field keeps its fingerprint; paced, present, and the
    fingerprint is another; the port's bandwidth is a beat per pace."""
    cfg = AcceleratorConfig()
    assert "cycles_per_beat" not in cfg.to_dict()["memory"]
    assert AcceleratorConfig.from_dict(
        {**cfg.to_dict(), "memory": {**cfg.to_dict()["memory"], "cycles_per_beat": 1}}
    ).fingerprint == cfg.fingerprint
    paced = cfg.replace(memory=MemoryModel(cycles_per_beat=2))
    assert paced.to_dict()["memory"]["cycles_per_beat"] == 2
    assert paced.fingerprint != cfg.fingerprint
    assert AcceleratorConfig.from_json(paced.to_json()) == paced
    assert (cfg.dram_bytes_per_cycle, paced.dram_bytes_per_cycle) == (16, 8)
    assert paced.with_dram(1 << 20).memory.cycles_per_beat == 2
