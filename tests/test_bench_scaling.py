"""bench.scaling's records: the host work, programs per token, the KV width and the roofline
fraction end to end (the host's work at its estimated on-chip cycles counted)."""

from bench.scaling import summarise
from hw.config import AcceleratorConfig
from sw.runtime.runtime import HostRun, ProgramRun, StepStats


def test_a_record_has_the_host_work_and_the_roofline_end_to_end():
    cfg = AcceleratorConfig()
    st = StepStats("decode", 127, 1)
    st.programs = [ProgramRun("lm_head", 0, None, 1000, {}, 4096, 64, 0, 400.0)]
    st.host = [HostRun("embed_tokens", "embed", 2e-4, 100)]
    st.ops = {"lm_head": "linear"}
    r = summarise(st, cfg, "decode", 1, kv_bits=4)
    assert r["host_ms"] == 2e-4 * 1e3
    assert r["programs_per_token"] == 1 and r["host_transitions"] == 2
    assert r["kv_bits"] == 4
    # the bound over the programs' cycles plus the host's estimated on-chip cycles
    assert r["roofline_fraction"] == 400.0 / 1100
    assert r["roofline_fraction_accelerator"] == 400.0 / 1000
