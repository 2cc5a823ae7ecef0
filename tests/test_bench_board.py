"""bench.board: the board performance model and its record, on the reference model.

The memory measurement itself (Migen, minutes) is tests/sim/test_board_memory.py's; here the
memory is a record written by the test, so every figure below follows from it exactly.
"""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from bench import board as bench_board
from bench.board import (
    BUILD_FIELDS,
    SIM_FIELDS,
    ModelSpec,
    board_key,
    build_fields,
    predict,
    stream_bytes,
    variants,
)
from bench.common import write_json
from hw.board.ecpix5 import ECPIX5
from hw.config import AcceleratorConfig, preset
from hw.format import WeightFormat
from sim.board_memory import (
    MemoryMeasureError,
    MemoryTiming,
    board_cycles,
    controller_bits,
    speedgrade_trfc_ns,
    timing_key,
)
from sw.compile import CompileOptions, compile_model
from sw.compress.model import selected_linears
from sw.models.recipes import recipe_for
from sw.models.source import open_model


def timing(port_bits: int, sequential: float, row_miss: float | None = None,
           trfc_ns: float | None = None) -> MemoryTiming:
    """A memory record of the board and the installed LiteDRAM."""
    return MemoryTiming(
        board=ECPIX5.name, port_bits=port_bits, controller_bits=controller_bits(ECPIX5),
        sys_clk_hz=ECPIX5.sys_clk_hz, litedram=importlib.metadata.version("litedram"),
        read_latency=20, row_hit_latency=17, sequential_bytes_per_cycle=sequential,
        row_miss_bytes_per_cycle=sequential / 2 if row_miss is None else row_miss,
        window_cycles=1758, row_miss_cycles=400, refresh_intervals=3, trefi_cycles=586,
        trfc_cycles=104, peak_bytes_per_cycle=ECPIX5.peak_bytes_per_sys_cycle,
        trfc_ns=trfc_ns)


BEAT = ECPIX5.port_bits // 8
#: Two memories of the board's port: one as fast as the beat (never a stall), one at half that.
FULL = timing(ECPIX5.port_bits, BEAT)
HALF = timing(ECPIX5.port_bits, BEAT / 2, trfc_ns=speedgrade_trfc_ns(ECPIX5))


@pytest.fixture(scope="module")
def reference() -> dict:
    """The reference model with a memory at the beat's rate and one at half of it."""
    memory = {FULL.key: FULL, HALF.key: HALF}
    return predict(ModelSpec.parse("reference"), AcceleratorConfig(), ECPIX5, memory, 64)


def test_at_the_beat_rate_only_the_writes_cost(reference):
    """A memory as fast as the beat keeps up with the reads; a write may come beside a read
    (one port for both), so each is charged its beat's time, a cycle."""
    p = reference["ports"][FULL.key]
    assert p["dram_beats"] == p["dram_read_beats"] + p["dram_write_beats"]
    assert p["dram_read_beats"] > 0 and p["dram_write_beats"] > 0
    assert p["cycles_per_beat"] == 1
    assert p["cycles"] == p["fast_model_cycles"] + p["dram_write_beats"]


def test_half_the_rate_costs_a_cycle_per_read_and_two_per_write(reference):
    p = reference["ports"][HALF.key]
    assert p["cycles"] == p["fast_model_cycles"] + p["dram_read_beats"] \
        + 2 * p["dram_write_beats"]
    # row misses at a quarter of the beat's rate: three extra cycles per read, four per write
    assert p["tokens_per_s_all_row_misses"] == pytest.approx(
        ECPIX5.sys_clk_hz / (p["fast_model_cycles"] + 3 * p["dram_read_beats"]
                             + 4 * p["dram_write_beats"]), rel=1e-12)


def test_roofline_is_weight_and_kv_bytes_at_the_peak(reference):
    bytes_per_token = reference["weight_bytes"] + reference["kv_cache_bytes"]
    assert reference["roofline_tokens_per_s"] == ECPIX5.peak_bytes_per_s / bytes_per_token
    p = reference["ports"][HALF.key]
    # the fast model reads at least the weights and the KV cache; at the peak's rate (half the
    # beat) no faster than the roofline
    assert HALF.sequential_bytes_per_cycle == ECPIX5.peak_bytes_per_sys_cycle
    assert p["fraction_of_roofline"] <= 1.0


def test_the_roofline_bytes_are_the_same_on_every_configuration_of_the_lanes():
    """The packed weights and the KV cache: on the per-layer configuration what its layout
    reports; with the vector engine (constants and tables beside them) and with its decoder
    blocks in a loop (the KV cache in frames) the same bytes."""
    src = open_model("reference")
    formats = recipe_for("reference").formats(selected_linears(src.model))
    opts = dict(prompt_tokens=31, max_context=32, decode_contexts=(32,), phases=("decode",))
    got = {}
    for name, base, loop in (("layers", AcceleratorConfig(), False),
                             ("vector", preset("vector"), False),
                             ("loop", preset("vector"), True)):
        exe = compile_model(src.model, ECPIX5.accelerator_config(base),
                            CompileOptions(**opts, block_loop=loop), formats=formats)
        got[name] = (stream_bytes(exe), exe.report["dram"])
    (w, kv), dram = got["layers"]
    assert (w, kv) == (dram["weights"], dram["kv_cache"]) and w > 0 and kv > 0
    assert got["vector"][0] == got["loop"][0] == (w, kv)
    assert got["vector"][1]["weights"] > w                # the vector engine's constants
    assert got["loop"][1]["kv_cache"] == 0 < got["loop"][1]["frames"]


def test_board_cycles_refuses_a_memory_that_moves_nothing():
    with pytest.raises(MemoryMeasureError, match="got 0"):
        board_cycles(100, 10, 0, 8, 0)
    with pytest.raises(MemoryMeasureError, match="read_spacing .* got 0"):
        board_cycles(100, 10, 0, 8, 8, read_spacing=0)
    # a memory faster than the beat does not speed the accelerator up
    assert board_cycles(100, 10, 0, 8, 16) == 100


@pytest.mark.parametrize("spacing", [1, 2, 3])
def test_board_cycles_charges_reads_the_shortfall_below_their_spacing(spacing):
    """The board's sustained rate (16-byte beats at 7.44 bytes a cycle: t = 2.15 cycles a
    beat): a read s cycles after the one before adds max(0, t - s) to the memory's backlog,
    a write its whole t (it may come beside a read); floats summed exactly to 1e-9."""
    t = 16 / 7.44
    assert board_cycles(1000, 300, 20, 16, 7.44, spacing) == pytest.approx(
        1000 + 300 * max(0.0, t - spacing) + 20 * t, abs=1e-9)


@pytest.mark.parametrize("text, model, fmt", [
    ("reference", "reference", None),
    ("smollm2@2:4-int4", "smollm2", "2:4-int4"),
    (" smollm2@dense-int4-g64 ", "smollm2", "dense-int4-g64"),
])
def test_model_spec(text, model, fmt):
    spec = ModelSpec.parse(text)
    assert spec.model == model
    assert spec.fmt == (WeightFormat.parse(fmt) if fmt else None)
    assert str(ModelSpec.parse(str(spec))) == str(spec)


@pytest.mark.parametrize("text, message", [("llama", "'llama'"),
                                           ("reference@2:4", "'reference@2:4'")])
def test_bad_model_spec_is_named(text, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec.parse(text)


def test_build_fields_absent_and_present(tmp_path):
    fields, note = build_fields(tmp_path / "report.json")
    assert fields == dict.fromkeys(BUILD_FIELDS) and "no bitstream build report" in note
    report = {"luts": 1234, "clocks": {"sys": {"fmax_mhz": 80.0, "target_mhz": 75.0,
                                               "met": True}}, "other": 1}
    (tmp_path / "report.json").write_text(json.dumps(report))
    fields, note = build_fields(tmp_path / "report.json")
    assert fields["luts"] == 1234 and fields["clocks"] == report["clocks"]
    assert fields["brams"] is None and "other" not in fields


def test_main_writes_the_record_and_page(tmp_path, capsys):
    # the board's memory at half the beat's rate, the narrow port at a quarter, LiteDRAM's
    # tRFC table at the beat's rate
    (board_mem, board_trfc), (narrow, narrow_trfc), (native, table) = variants(ECPIX5)
    write_json(tmp_path / bench_board.MEMORY_FILE, {"ports": [
        timing(board_mem, BEAT / 2, trfc_ns=board_trfc).to_dict(),
        timing(narrow, BEAT / 4, trfc_ns=narrow_trfc).to_dict(),
        timing(native, BEAT, trfc_ns=table).to_dict()]})
    out = tmp_path / "board.json"
    assert bench_board.main(["--models", "reference", "--context", "64", "--out", str(out),
                             "--docs", str(tmp_path / "docs"), "--vector-config", "none",
                             "--build-report", str(tmp_path / "none.json")]) == 0
    rec = json.loads(out.read_text())
    assert rec["config"] == ECPIX5.accelerator_config(ECPIX5.base_config).fingerprint
    assert rec["persistent"] is None
    for key in ("board", "config", "predicted_tokens_per_s", "roofline_tokens_per_s",
                *BUILD_FIELDS, *SIM_FIELDS):
        assert key in rec, key
    assert rec["board"] == ECPIX5.name
    assert all(rec[k] is None for k in BUILD_FIELDS + SIM_FIELDS)
    assert "none.json" in rec["build_source"]
    (m,) = rec["models"]
    by_memory = rec["predicted_tokens_per_s_by_memory"]
    board, quarter_key, fast = (timing_key(*v) for v in variants(ECPIX5))
    assert rec["board_memory"] == board == board_key(ECPIX5)
    assert set(by_memory) == {board, quarter_key, fast} == set(m["ports"])
    # at the beat's rate only the writes cost (a cycle each); at half of it (the board's port)
    # a read costs a cycle more and a write two, at a quarter of it (the narrow port) three
    # and four
    best = m["ports"][fast]
    assert by_memory[fast]["reference"] == pytest.approx(
        ECPIX5.sys_clk_hz / (best["fast_model_cycles"] + best["dram_write_beats"]), rel=1e-12)
    quarter = m["ports"][quarter_key]
    assert quarter["cycles"] == quarter["fast_model_cycles"] + 3 * quarter["dram_read_beats"] \
        + 4 * quarter["dram_write_beats"]
    p = m["ports"][board]
    assert p["cycles_per_beat"] == 1                    # the board's configuration: unpaced
    assert rec["predicted_tokens_per_s"]["reference"] == pytest.approx(
        ECPIX5.sys_clk_hz / (p["fast_model_cycles"] + p["dram_read_beats"]
                             + 2 * p["dram_write_beats"]), rel=1e-12)
    assert rec["provenance"]["config"] == rec["config"]
    page = (tmp_path / "docs" / "board_performance.md").read_text()
    assert f"{rec['roofline_tokens_per_s']['reference']:.1f}" in page
    assert "memory: the measurement in" in capsys.readouterr().out


def _memory_record(path) -> None:
    """A memory record of each measured variant at the beat's rate (no stall)."""
    write_json(path / bench_board.MEMORY_FILE, {"ports": [
        timing(w, BEAT, trfc_ns=trfc).to_dict() for w, trfc in variants(ECPIX5)]})


def test_a_run_without_sim_keeps_the_recorded_simulation(tmp_path, capsys):
    """Without --sim the board simulation's fields and their stamp are kept from the record of
    the same configuration; from a record of another configuration they are not."""
    _memory_record(tmp_path)
    out = tmp_path / "board.json"
    board_cfg = ECPIX5.accelerator_config(ECPIX5.base_config)
    sim = {"sim_tokens_match": True, "sim_cycles_equal_model": True, "frames_injected": 7,
           "frames_recovered": 5, "sim_programs": 48, "sim_tokens": 2, "sim_faults": 0.02,
           "sim_memory_stall_cycles": 123, "sim_dram_words_written": 4,
           "sim_dram_words_read": 5}
    argv = ["--models", "reference", "--context", "64", "--out", str(out), "--docs",
            str(tmp_path / "docs"), "--vector-config", "none", "--build-report",
            str(tmp_path / "none.json")]
    old_stamp = {"config": board_cfg.fingerprint, "commit": "abc", "dirty": False,
                 "array": board_cfg.array, "default": False}
    write_json(out, {"config": board_cfg.fingerprint, **sim, "provenance": old_stamp})
    assert bench_board.main(argv) == 0
    rec = json.loads(out.read_text())
    assert {k: rec[k] for k in sim} == sim
    assert rec["sim_provenance"] == old_stamp and rec["provenance"] != old_stamp
    assert "kept from the record" in capsys.readouterr().out
    assert bench_board.main(argv) == 0                  # kept again, with the kept stamp
    assert json.loads(out.read_text())["sim_provenance"] == old_stamp
    write_json(out, {"config": "0123456789ab", **sim})  # another configuration's
    assert bench_board.main(argv) == 0
    rec = json.loads(out.read_text())
    assert all(rec[k] is None for k in SIM_FIELDS) and "sim_provenance" not in rec


def test_the_persistent_program_is_predicted_on_the_vector_configuration(tmp_path,
                                                                         monkeypatch):
    """--vector-config's decode step is one program per token (the reference model's joined
    step fits the preset's instruction memory), with its own stamp, page section and the
    build fields of its own bitstream report."""
    _memory_record(tmp_path)
    vector = ECPIX5.accelerator_config(preset("vector"), paced=True)
    monkeypatch.setattr(bench_board, "ROOT", tmp_path)
    clocks = {"sys": {"fmax_mhz": 80.5, "target_mhz": 75.0, "met": True}}
    write_json(bench_board.build_report_path(ECPIX5, vector),
               {"clocks": clocks, "seeds_met": 2, "luts": 4321})
    out = tmp_path / "board.json"
    assert bench_board.main(["--models", "reference", "--vector-models", "reference",
                             "--context", "64", "--out", str(out), "--docs",
                             str(tmp_path / "docs"), "--build-report",
                             str(tmp_path / "none.json")]) == 0
    rec = json.loads(out.read_text())
    per = rec["persistent"]
    # paced at the memory's peak: a 16-byte beat every 2 cycles of a memory of 8 bytes a cycle
    assert vector.memory.cycles_per_beat == 2
    assert per["clocks"] == clocks and per["seeds_met"] == 2 and per["luts"] == 4321
    assert per["brams"] is None and vector.fingerprint in per["build_source"]
    assert per["base"] == "vector" and per["config"] == vector.fingerprint
    assert per["cycles_per_beat"] == 2
    assert per["provenance"]["config"] == vector.fingerprint
    assert per["programs_per_token"] == {"reference": 1}
    (m,) = per["models"]
    p = m["ports"][rec["board_memory"]]
    # the memory at the beat's rate, reads two cycles apart: only the writes cost
    assert p["cycles"] == p["fast_model_cycles"] + p["dram_write_beats"]
    assert p["config"] == vector.fingerprint and p["cycles_per_beat"] == 2
    assert per["predicted_tokens_per_s"]["reference"] == p["tokens_per_s"]
    assert per["fraction_of_roofline"]["reference"] == p["fraction_of_roofline"]
    # the per-layer step of the board's configuration runs more programs
    assert rec["models"][0]["ports"][rec["board_memory"]]["programs"] > 1
    page = (tmp_path / "docs" / "board_performance.md").read_text()
    assert "## One program per decode step" in page and vector.fingerprint in page
    assert "a beat every 2 cycles" in page
    assert f"Build of {vector.fingerprint}: from bitstreams/" in page
    assert "sys 80.5 MHz against 75; met on 2 seeds" in page


@pytest.mark.parametrize("argv, message", [
    (["--vector-config", "default"], "--vector-config default: has no vector engine"),
    (["--vector-config", "/nonexistent.json"], "/nonexistent.json"),
    (["--models", "foo"], "model 'foo'"),
    (["--models", "smollm2@3:4-int4"], "3:4"),
    (["--context", "0"], "--context"),
    (["--config", "/nonexistent.json"], "/nonexistent.json"),
])
def test_bad_options_are_one_line(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        bench_board.main([*argv, "--out", str(tmp_path / "b.json")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench.board: ") and "\n" not in err and message in err
    assert not (tmp_path / "b.json").exists()


@pytest.mark.slow
def test_reference_model_on_the_board_simulation():
    """The reference model's compiled program through the Verilator board over a faulty link:
    the fast model's tokens, cycles and DRAM (minutes: `bench.board --sim` records it)."""
    rec = bench_board.simulate_board(ECPIX5, AcceleratorConfig(), tokens=2, faults=0.02)
    assert rec["sim_tokens_match"] and rec["sim_cycles_equal_model"]
    assert rec["frames_injected"] > 0 and rec["sim_programs"] > 0
