# amaranth: UnusedElaboratable=no
"""The RTL runner API (sim/rtl.py) and the generator CLI (hw/generate.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from control_testutil import small_config

from hw.generate import main as generate_main
from hw.isa import End, Engine, ErrorCode, Load, Spad, Sync, encode, encode_program, program_words
from hw.timing import stop_delay
from sim.rtl import RTLBackend, RTLTimeoutError, encode_any

CFG = small_config()
PROG = [Load(spad=Spad.ACT, rows=3, row_beats=5, dram_stride=9, signal=0),
        Sync(engine=Engine.STORE, wait=0), End()]


# ---------------------------------------------------------------------- generator (no build)
def test_generate_writes_verilog_and_config(tmp_path):
    cfg_path = tmp_path / "small.json"
    CFG.save(cfg_path)
    assert generate_main(["--config", str(cfg_path), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "accel.v").read_text()
    assert "module accel(" in text
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == CFG.to_dict()


@pytest.mark.parametrize("change, needle", [
    ({"rows": 3}, "rows must be a power of two in [1, 256], got 3"),
    ({"queue_depth": 0}, "queue_depth must be in [1, 64], got 0"),
    ({"memory": {"latency": 0}}, "memory.latency must be an int in [1, 4096], got 0"),
    ({"bogus": 1}, "unknown configuration fields: ['bogus']"),
])
def test_generate_rejects_invalid_config(tmp_path, capsys, change, needle):
    d = CFG.to_dict()
    d.update(change)
    if "memory" in change:
        d["memory"] = {**CFG.to_dict()["memory"], **change["memory"]}
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d))
    assert generate_main(["--config", str(path), "--out", str(tmp_path / "out")]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_encode_any_forms():
    raw = encode_program(PROG)
    assert encode_any(PROG, CFG) == raw.tobytes()
    assert encode_any([encode(i) for i in PROG], CFG) == raw.tobytes()
    assert encode_any(raw, CFG) == encode_any(raw.tobytes(), CFG)
    assert encode_any(program_words(PROG), CFG) == raw.tobytes()
    with pytest.raises(ValueError, match="not a whole number"):
        encode_any(b"\0" * 17, CFG)
    with pytest.raises(ValueError, match="exceeds imem_depth"):
        encode_any([End()] * (CFG.imem_depth + 1), CFG)


def test_backend_arguments():
    with pytest.raises(TypeError, match="AcceleratorConfig"):
        RTLBackend({"rows": 2})
    with pytest.raises(ValueError, match="compute_tag"):
        RTLBackend(CFG, compute=lambda cfg: None)


# ---------------------------------------------------------------------- runner (Verilator)
@pytest.fixture(scope="module")
def rtl():
    backend = RTLBackend(CFG)
    backend.build()
    return backend


@pytest.mark.rtl
def test_program_forms_agree(rtl):
    dram = np.arange(CFG.memory.size_bytes, dtype=np.uint32).astype(np.uint8)
    results = [rtl.run(p, dram) for p in (PROG, [encode(i) for i in PROG],
                                           encode_program(PROG).tobytes())]
    for r in results[1:]:
        assert (r.cycles, r.error, r.counters) == (results[0].cycles, results[0].error,
                                                   results[0].counters)
        np.testing.assert_array_equal(r.dram, dram)     # no STORE: DRAM unchanged
    assert results[0].ok


@pytest.mark.rtl
def test_bad_dram_image(rtl):
    with pytest.raises(ValueError, match="DRAM image must be uint8"):
        rtl.run(PROG, np.zeros(16, dtype=np.uint8))
    with pytest.raises(ValueError, match="DRAM image must be uint8"):
        rtl.run(PROG, np.zeros(CFG.memory.size_bytes, dtype=np.int16))


@pytest.mark.rtl
def test_max_cycle_guard(rtl):
    # a run that does not finish is stopped and reported with each engine's state
    with pytest.raises(RTLTimeoutError, match=r"still busy after \d+ cycles; load exec \d+ / "
                       r"wait \d+ cycles, compute exec .* instructions dispatched"):
        rtl.run(PROG, max_cycles=10)


@pytest.mark.rtl
def test_simulation_speed(rtl):
    """A long program: the runner reports its speed (cycles per second of the C++ loop).

    How fast is a benchmark's question (``python -m bench.rtl``, ``bench.simspeed``); this
    checks the report is consistent, whatever else the machine is doing."""
    prog = [Load(spad=Spad.WGT, rows=8, row_beats=16, dram_stride=16) for _ in range(120)]
    res = rtl.run(prog + [End()])
    assert res.error == ErrorCode.NONE and res.cycles > 10_000
    stats = rtl.last_stats
    # until busy falls (hw.timing, "Stop")
    assert stats["simulated_cycles"] == res.cycles + 1 + stop_delay(res.error)
    assert stats["cpu_s"] > 0 and stats["wall_s"] > 0, stats
    assert stats["cycles_per_cpu_s"] == pytest.approx(stats["simulated_cycles"] / stats["cpu_s"])


@pytest.mark.rtl
@pytest.mark.slow
def test_waves(tmp_path):
    """WAVES builds a tracing variant that writes a VCD file."""
    backend = RTLBackend(CFG, waves=True)
    res = backend.run(PROG, waves_path=tmp_path / "run.vcd")
    assert res.ok
    assert (tmp_path / "run.vcd").stat().st_size > 1000
