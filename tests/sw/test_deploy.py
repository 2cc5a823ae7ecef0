"""``python -m sw.deploy``: the whole pipeline on the reference model, its report, and bad
input (one line, exit status 2, nothing written)."""

import json

import pytest

import sw.deploy
from hw.config import AcceleratorConfig
from sw.deploy import MIB, main
from sw.models.recipes import RECIPES

FAST = ["--method", "magnitude", "--calib", "1", "--eval-tokens", "512", "--max-new-tokens",
        "3", "--quiet"]
REPORT_FIELDS = {"model", "pattern", "bits", "group", "method", "backend", "prompt_tokens",
                 "new_tokens", "tokens_match_twin", "cycles_per_token", "tokens_per_s_sim",
                 "speedup_vs_dense", "host_transitions_per_token",
                 "dram_read_bytes_per_token", "roofline_fraction", "ppl_fp32",
                 "ppl_compressed", "compile_s", "programs_per_token",
                 "instruction_bytes_per_token", "host_ms_per_token", "host_io_ms_per_token",
                 "host_ops_per_token", "host_read_back_bytes_per_token",
                 "host_written_bytes_per_token", "roofline_fraction_end_to_end"}


def test_deploy_reference_model(tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")  # an existing --out keeps what it held
    assert main(FAST + ["--out", str(out)]) == 0
    assert (out / "notes.txt").read_text() == "mine"
    report = json.loads((out / "report.json").read_text())
    assert REPORT_FIELDS <= set(report)
    assert report["tokens_match_twin"] is True and report["new_tokens"] == 3
    assert report["model"] == "reference" and report["pattern"] == "2:4"
    # the reference model's recipe with --method in its place; it fits the default DRAM
    assert report["recipe"] == str(RECIPES["reference"].override(method="magnitude"))
    assert report["calib_corpus"] is None  # magnitude pruning reads no calibration text
    assert report["dram_sizing"] == {"needed_bytes": report["dram_bytes"]["total"],
                                     "size_bytes": AcceleratorConfig().memory.size_bytes,
                                     "how": "the default configuration's"}
    # 2:4 INT4 streams fewer weight bytes than dense INT4 on the memory-bound decode
    assert report["speedup_vs_dense"] > 1.1
    assert 0 < report["roofline_fraction"] <= 1.0
    assert report["host_transitions_per_token"] == 2 * 6 * 4   # 6 programs per block, 4 blocks
    assert report["programs_per_token"] == 6 * 4
    # every decode program runs once per token; the step's programs hold all decode instructions
    # but one copy per context bucket, so a token runs at most that many bytes
    assert 0 < report["instruction_bytes_per_token"] <= report["instructions"] * 16
    # the end-to-end fraction charges the host's work as time on top of the same bounds
    assert report["roofline_fraction_end_to_end"] == pytest.approx(
        report["roofline_fraction"] * report["cycles_per_token"]
        / (report["cycles_per_token"] + report["host_unit_cycles_per_token_estimated"]),
        rel=1e-12)  # the same float64 sums, regrouped
    for name in ("report.md", "roofline.png", "decode_trace.json", "executable.safetensors"):
        assert (out / name).stat().st_size > 100, name
    trace = json.loads((out / "decode_trace.json").read_text())
    (programs,) = [e["tid"] for e in trace["traceEvents"]
                   if e["ph"] == "M" and e["args"]["name"] == "programs"]
    assert {e["name"] for e in trace["traceEvents"] if e.get("tid") == programs} >= {
        "layers.0.self_attn.scores"}
    text = capsys.readouterr().out
    assert "tokens equal the model-level twin's: yes" in text
    assert f"DRAM: the compiled model needs {report['dram_bytes']['total']:,} bytes" in text
    # every phase timed, in order, each logged as it starts and ends
    assert tuple(report["phase_s"]) == sw.deploy.PHASES
    assert 0 < sum(report["phase_s"].values()) <= report["wall_s"]
    assert all(f"[{p}] at " in text and f"[{p}] done in " in text for p in sw.deploy.PHASES)
    md = (out / "report.md").read_text()
    assert f"| recipe | {report['recipe']} (the options given) |" in md


def test_deploy_on_the_named_vector_configuration(tmp_path, capsys):
    """``--config vector``: the host's norms, RoPE, softmax and SiLU-gate run as vector
    programs, the vector numerics are implied, and the tokens still equal the twin's."""
    out = tmp_path / "run"
    assert main(FAST + ["--out", str(out), "--eval-tokens", "0", "--config", "vector"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["tokens_match_twin"] is True and report["vector_numerics"] is True
    assert report["config"]["vin_spad_bytes"] == 16384
    # per block: q/k/v, scores, values, o, gate/up, down + 2 norms, 2 RoPEs (q, k), softmax,
    # SiLU-gate; then the final norm. Fused: the first block's norm -> q/k/v -> RoPEs; per
    # block its o_proj (REQUANT of the host's rows -> GEMM -> DEQUANT -> ADD) and MLP (norm ->
    # gate/up -> SiLU-gate -> down + ADD) chained with the next block's norm -> q/k/v -> RoPEs
    # (the last block's: the final norm), after the block's scores -> softmax -> values
    # (FOLD, the P.V GEMM, DEQUANT into o_proj's input rows). One program a block, and
    # those 12 * 4 + 1 - (3 + 8 * 3 + 5) - 4 - 4 - 4 == 4 + 1 joined into one per step.
    assert report["vector_programs_per_token"] == 1
    assert report["fused_programs_per_token"] == 1
    assert report["programs_per_token"] == 1 and report["host_transitions_per_token"] == 2
    assert report["dram_sizing"]["how"] == "the default configuration's"
    assert (out / "roofline.png").stat().st_size > 100
    help_text = " ".join(sw.deploy._parser().format_help().split())
    assert "'vector' is the default with the vector engine" in help_text


def test_the_lm_head_on_the_accelerator(tmp_path):
    """``--lm-head int8``: the head is one more accelerator linear per step, and the tokens
    still equal the twin's (whose head computes with the same integer numerics)."""
    out = tmp_path / "run"
    assert main(FAST + ["--out", str(out), "--eval-tokens", "0", "--lm-head", "int8"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["tokens_match_twin"] is True and report["lm_head"] == "dense-int8"
    assert report["programs_per_token"] == 6 * 4 + 1
    assert report["pattern"] == "2:4"  # the format of the blocks' linears, the head apart
    assert report["recipe"].endswith("LM head dense INT8 g128")


def test_the_lm_head_on_the_vector_engine_ends_with_argmax(tmp_path):
    """``--config vector --lm-head int8``, greedy: the last block's MLP, the final norm, the
    head and an ARGMAX of its logits are one program per token, and the tokens the chip's
    ARGMAX picked equal the twin's greedy tokens; per token the host reads back the token
    id and writes nothing (the embedding row is the table's on chip): no host work, only
    the program's run-time parameters (its registers, that read), timed apart."""
    out = tmp_path / "run"
    assert main(FAST + ["--out", str(out), "--eval-tokens", "0", "--lm-head", "int8",
                        "--config", "vector"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["tokens_match_twin"] is True and report["lm_head"] == "dense-int8"
    # the head joins the last chain: one accelerator node more, no program more
    # RoPEs chained, o_proj heads the chain, scores -> softmax -> values before it
    # (12 * 4 + 2 - (3 + 8 * 3 + 6) - 4 - 4 - 4 == 4 + 1 programs), joined into one per step
    assert report["programs_per_token"] == 1 and report["host_transitions_per_token"] == 2
    assert report["fused_programs_per_token"] == 1
    assert report["host_read_back_bytes_per_token"] == 4
    assert report["host_written_bytes_per_token"] == 0
    assert report["host_ops_per_token"] == {"linear:io": 1, "rmsnorm:io": 1}
    # nothing the host computes or moves is left; what it still does is measured apart
    assert report["host_ms_per_token"] == 0 and report["host_io_ms_per_token"] > 0
    from sw.compile.executable import load
    exe = load(out / "executable.safetensors")
    assert any(m.argmax for p in exe.programs if p.phase == "decode" and p.parts
               for m in p.members)


def test_dram_is_sized_to_the_model_without_a_configuration(tmp_path, monkeypatch, capsys):
    """A default configuration whose DRAM is too small grows to what the compiled model needs,
    rounded up to whole MiB, and the report says so."""
    small = AcceleratorConfig().with_dram(1 << 16)
    monkeypatch.setattr(sw.deploy, "named_or_file", lambda name: small)
    out = tmp_path / "run"
    assert main(FAST + ["--out", str(out), "--eval-tokens", "0"]) == 0
    report = json.loads((out / "report.json").read_text())
    sizing = report["dram_sizing"]
    assert sizing["needed_bytes"] == report["dram_bytes"]["total"] > small.memory.size_bytes
    assert sizing["size_bytes"] == -(-sizing["needed_bytes"] // MIB) * MIB
    assert report["config"]["memory"]["size_bytes"] == sizing["size_bytes"]
    assert "sized to the model" in sizing["how"] and report["tokens_match_twin"] is True
    assert "sized to the model" in capsys.readouterr().out
    assert "sized to the model" in (out / "report.md").read_text()


def _no_slow_work(monkeypatch, capture: bool = True):
    """Make compression (and the capture) fail if they are reached."""
    def reached(*a, **k):
        raise AssertionError("slow work reached")
    monkeypatch.setattr(sw.deploy, "compress_llama", reached)
    if capture:
        monkeypatch.setattr(sw.deploy, "capture_model", reached)


def test_too_small_dram_fails_before_capture_and_compression(tmp_path, monkeypatch, capsys):
    _no_slow_work(monkeypatch)
    out = tmp_path / "out"
    assert main(FAST + ["--out", str(out), "--dram-mb", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sw.deploy: --dram-mb 1: the model's packed weights and KV cache "
                          "alone need ") and "\n" not in err, err
    assert "memory.size_bytes=1,048,576" in err
    assert list(tmp_path.iterdir()) == []


def test_dram_without_room_for_activations_fails_before_compression(tmp_path, monkeypatch,
                                                                   capsys):
    """Weights and KV cache fit, the activation arena does not: found by planning the
    captured graph, before anything is compressed."""
    from hw.format import WeightFormat
    from sw.compile import CompileOptions
    from sw.compile.compiler import static_dram_bytes
    from sw.models.reference_model import load_reference
    from sw.models.tokenizer import encode
    model = load_reference()
    cfg = AcceleratorConfig()
    prompt = len(encode(sw.deploy.DEFAULT_PROMPT))
    options = CompileOptions(prompt_tokens=prompt, max_context=prompt + 3)
    fmts = RECIPES["reference"].formats(
        [n for n in sw.deploy.selected_linears(model)])
    assert set(fmts.values()) == {WeightFormat("2:4", 4, 128)}
    static = static_dram_bytes(model, cfg, options, fmts)
    step = cfg.memory.bytes_per_cycle
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"memory": {"size_bytes": -(-static // step) * step}}))
    _no_slow_work(monkeypatch, capture=False)
    assert main(FAST + ["--out", str(tmp_path / "out"), "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"sw.deploy: --config {config}: the model needs ") and "\n" not in err
    assert "activations" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json"]


def test_help_states_every_default_recipe(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name, recipe in RECIPES.items():
        assert f"{name}: {recipe} -- {recipe.why}" in text
        assert all(f"{unit}: {fmt}" in text for unit, fmt in recipe.layers.items())


def test_help_documents_every_option_with_its_default(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for opt in ("--model", "--sparsity", "--bits", "--group", "--method", "--config",
                "--backend", "--prompt", "--max-new-tokens", "--temperature", "--top-k",
                "--seed", "--calib", "--eval-tokens", "--kv-bits",
                "--out"):
        assert opt in text
    assert text.count("(default:") >= 15


@pytest.mark.parametrize("args, message", [
    (["--sparsity", "3:5"], "--sparsity '3:5'"),
    (["--sparsity", "2:4", "--bits", "8"], "INT8 weights dense only"),
    (["--group", "50"], "group (50) must be a multiple"),
    (["--method", "foo"], "--method 'foo': choose one of"),
    (["--model", "nowhere"], "--model 'nowhere': not a built-in"),
    (["--model", "m.gguf"], "--model m.gguf: no such file"),
    (["--model", "m.safetensors"], "--model m.safetensors: no such file"),
    (["--config", "missing.json"], "--config missing.json: cannot read it"),
    (["--config", "vectr"], "(nor a named one: default, vector)"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--max-new-tokens", "400"], "exceeds the model's context of 256 positions"),
    (["--eval-tokens", "100"], "--eval-tokens must be 0 or at least one window of 256"),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0, got nan"),
    (["--kv-bits", "3"], "--kv-bits must be one of 8, 4, got 3"),
    (["--lm-head", "int2"], "--lm-head 'int2': choose one of host, int4, int8"),
    (["--backend", "board", "--dram-mb", "8"], "--dram-mb 8: --backend board has the board's"),
    (["--backend", "board", "--port", "/nonexistent/tty"],
     "cannot open serial port /nonexistent/tty"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, args, message):
    out = tmp_path / "out"
    assert main(FAST + ["--out", str(out)] + args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sw.deploy: ") and message in err and "\n" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    out = tmp_path / "out"
    out.write_text("mine")
    assert main(FAST + ["--out", str(out)]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert out.read_text() == "mine" and list(tmp_path.iterdir()) == [out]


def test_invalid_configuration_and_a_model_too_large(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": 3}')
    assert main(FAST + ["--config", str(bad), "--out", str(tmp_path / "o1")]) == 2
    assert "rows must be a power of two" in capsys.readouterr().err
    small = tmp_path / "small.json"
    small.write_text('{"memory": {"size_bytes": 65536}}')
    _no_slow_work(monkeypatch)
    assert main(FAST + ["--config", str(small), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "accelerator DRAM" in err and "memory.size_bytes=65,536" in err
    assert err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.json", "small.json"]


def test_a_head_row_the_vector_engine_cannot_hold_fails_before_capture(tmp_path, monkeypatch,
                                                                       capsys):
    """``--lm-head int8`` on a vector engine of 64-byte scratchpads: not even a segment of the
    head's DEQUANT fits (its row is the vocabulary), found from the configuration and the
    model's shapes before the DRAM sizing's capture: one line, exit 2."""
    tiny = tmp_path / "tiny.json"
    tiny.write_text('{"vin_spad_bytes": 64, "vout_spad_bytes": 64}')
    _no_slow_work(monkeypatch)
    assert main(FAST + ["--config", str(tiny), "--lm-head", "int8",
                        "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sw.deploy: --lm-head int8: the head's row of ") and \
        "does not fit the vector engine's scratchpad halves" in err and err.count("\n") == 1
    assert [p.name for p in tmp_path.iterdir()] == ["tiny.json"]


def test_format_summary_names_group_sizes():
    from types import SimpleNamespace

    from hw.format import WeightFormat
    from sw.deploy import _formats
    one = {"a": SimpleNamespace(fmt=WeightFormat("2:4", 4, 64))}
    assert _formats(one) == ("2:4", 4, 64, "2:4 INT4 g64")
    mixed = {"a": SimpleNamespace(fmt=WeightFormat("2:4", 4, 0)),
             "b": SimpleNamespace(fmt=WeightFormat("2:4", 4, 128)),
             "c": SimpleNamespace(fmt=WeightFormat("dense", 4, 0))}
    assert _formats(mixed)[3] == "mixed (2:4-int4, 2:4-int4-row, dense-int4-row)"


@pytest.mark.smollm2
def test_smollm2_answers_with_its_default_recipe(tmp_path, capsys):
    """The first command of the README: no option but --model (and the answer's length)."""
    from sw.models.source import ModelSourceError, smollm2_path
    try:
        smollm2_path()
    except ModelSourceError as e:
        pytest.skip(str(e))
    out = tmp_path / "run"
    assert main(["--model", "smollm2", "--prompt", "What is the capital of France?",
                 "--max-new-tokens", "12", "--out", str(out), "--quiet"]) == 0
    report = json.loads((out / "report.json").read_text())
    text = capsys.readouterr().out
    print(text)
    assert report["tokens_match_twin"] is True
    assert report["recipe"] == str(RECIPES["smollm2"])
    assert "sized to the model" in report["dram_sizing"]["how"]
    answer = text.split("[assistant] ", 1)[1].split("\n---", 1)[0]
    assert "Paris" in answer, answer


@pytest.mark.slow
def test_deploy_with_an_int4_kv_cache(tmp_path):
    out = tmp_path / "run"
    assert main(FAST + ["--kv-bits", "4", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["kv_bits"] == 4 and report["tokens_match_twin"] is True


@pytest.mark.parametrize("backend, args, array", [
    ("board", [], "2x8"),
    ("board-sim", [], "2x8"),
    ("board-sim", ["--config", "default"], "4x8"),
    ("model", [], "4x8"),
])
def test_the_board_backends_run_the_boards_configuration(monkeypatch, tmp_path, backend, args,
                                                         array):
    """With no --config the board backends compile for the configuration the board's
    bitstream carries (Board.base_config), the others for the default."""
    from hw.board.ecpix5 import ECPIX5
    from sw.cli import UsageError
    got = []

    def stop(opts, cfg):
        got.append(cfg)
        raise UsageError("stop")
    monkeypatch.setattr(sw.deploy, "_recipe", stop)
    assert main(FAST + ["--backend", backend, "--out", str(tmp_path / "o"), *args]) == 2
    (cfg,) = got
    assert cfg.array == array
    if backend == "board":
        assert cfg == ECPIX5.accelerator_config(ECPIX5.base_config)
