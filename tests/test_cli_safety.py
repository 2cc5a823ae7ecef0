"""Every command behaves like hw.generate: a bad value is one line naming it and exit status
2, nothing is overwritten unasked, Ctrl-C is one line and exit status 130, benchmarks write
under build/bench/ unless ``--record`` (issue 30, point 6)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from hw.config import AcceleratorConfig

ROOT = Path(__file__).resolve().parents[1]
BENCHES = ("accuracy", "beats", "board", "codesign", "compile", "compress", "dse", "fuzz", "rtl",
           "scaling", "simspeed")


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def _exit(main, argv) -> int:
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


# ---------------------------------------------------------------------- 1. sw.compress --out
def test_compress_refuses_an_existing_out(tmp_path, capsys):
    from sw.compress.__main__ import main
    out = tmp_path / "m.safetensors"
    out.write_bytes(b"precious")
    assert main(["--blocks", "1", "--out", str(out)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert str(out) in line and "--force" in line
    assert out.read_bytes() == b"precious"
    assert main(["--blocks", "1", "--out", str(tmp_path)]) == 2
    assert "is a directory" in _one_line(capsys.readouterr().err)


# ---------------------------------------------------------------------- 2. --config files
@pytest.fixture
def bad_configs(tmp_path):
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00{")
    text = tmp_path / "text.json"
    text.write_text("not json")
    return [binary, text, tmp_path]  # the directory: unreadable as a file


def test_config_loader_names_the_file(bad_configs):
    from hw.config import ConfigError
    for path in bad_configs:
        with pytest.raises(ConfigError, match=str(path).replace("\\", "\\\\")):
            AcceleratorConfig.load(path)


@pytest.mark.parametrize("module, extra", [
    ("sw.deploy", ["--out", "OUT"]), ("sim.__main__", []), ("hw.generate", ["--out", "OUT"]),
    ("sw.compress.__main__", ["--blocks", "1"])])
def test_bad_config_file_is_one_line(module, extra, bad_configs, tmp_path, capsys):
    main = importlib.import_module(module).main
    extra = [str(tmp_path / "o") if a == "OUT" else a for a in extra]
    for path in bad_configs:
        assert _exit(main, ["--config", str(path), *extra]) == 2
        assert str(path) in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "o").exists()


def test_synth_bad_config_file_is_one_line(bad_configs):
    r = subprocess.run([sys.executable, "-m", "hw.synth", "--config", str(bad_configs[0])],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and str(bad_configs[0]) in _one_line(r.stderr)


# ---------------------------------------------------------------------- 3. output paths
def test_sim_trace_directory_and_generate_out_file(tmp_path, capsys):
    from hw.generate import main as generate
    from sim.__main__ import main as sim
    assert sim(["--layer", "64x64", "--trace", str(tmp_path)]) == 2
    assert "is a directory" in _one_line(capsys.readouterr().err)
    out = tmp_path / "file"
    out.write_text("keep")
    assert generate(["--out", str(out)]) == 2
    assert "not a directory" in _one_line(capsys.readouterr().err)
    assert out.read_text() == "keep"


# ---------------------------------------------------------------------- 4. bench arguments
BAD_BENCH = [
    ("accuracy", ["--patterns", "3:2"]), ("accuracy", ["--patterns", "dense"]),
    ("accuracy", ["--group", "7"]), ("accuracy", ["--only", "("]),
    ("accuracy", ["--threads", "0"]), ("accuracy", ["--eval-seq-len", "-1"]),
    ("codesign", ["--method", "bogus"]), ("codesign", ["--model", "nothing"]),
    ("compile", ["--repeats", "0"]), ("compress", ["--group", "7"]),
    ("compress", ["--lanes", "0"]), ("compress", ["--repeats", "x"]),
    ("dse", ["--arrays", "4y8"]), ("dse", ["--workers", "0"]),
    ("dse", ["--weight-bits", "5"]), ("dse", ["--config", "/nonexistent.json"]),
    ("fuzz", ["--seconds", "0"]), ("fuzz", ["--timeout", "-1"]),
    ("fuzz", ["--target", "nothing"]), ("rtl", ["--arrays", "4y8"]),
    ("rtl", ["--patterns", "2:3"]), ("rtl", ["--k", "0"]), ("scaling", ["--quick", "1"]),
    ("scaling", ["--steps", "decode-99"]), ("scaling", ["--kv-bits", "3"]),
    ("scaling", ["--systems", "TPU"]), ("scaling", ["--config", "tpu"]),
    ("scaling", ["--config", "vector", "--steps", "prefill-256"]),
    ("simspeed", ["--tokens", "x"]), ("board", ["--models", "llama"]),
    ("board", ["--context", "0"]), ("board", ["--config", "/nonexistent.json"])]


@pytest.mark.parametrize("name, argv", BAD_BENCH, ids=[f"{n}{' '.join(a)}" for n, a in BAD_BENCH])
def test_bench_bad_value_is_one_line(name, argv, capsys):
    main = importlib.import_module(f"bench.{name}").main
    assert _exit(main, argv) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"python -m bench.{name}:") or line.startswith(f"bench.{name}:")


# ---------------------------------------------------------------------- 5. --record
def test_bench_writes_under_build_unless_record():
    from pathlib import Path as P

    from bench.common import OUTPUT, RESULTS, parser, recorded
    ap = parser("x", None)
    ap.add_argument("--out", type=P, default=RESULTS / "x.json")
    ap.add_argument("--plot", default=str(OUTPUT / "docs" / "img" / "x.png"))
    args = ap.parse_args([])
    assert args.out.is_relative_to(ROOT / "build" / "bench")
    args = ap.parse_args(["--record"])
    assert args.out == ROOT / "bench" / "results" / "x.json"
    assert args.plot == str(ROOT / "docs" / "img" / "x.png")
    assert ap.parse_args(["--record", "--out", "y.json"]).out == P("y.json")
    assert recorded("elsewhere.json") == P("elsewhere.json")


@pytest.mark.parametrize("name", BENCHES)
def test_bench_help_defaults_under_build(name, capsys):
    main = importlib.import_module(f"bench.{name}").main
    assert _exit(main, ["--help"]) == 0
    text = capsys.readouterr().out
    assert "--record" in text
    defaults = [line for line in text.split("(default: ")[1:] if "/" in line.split(")")[0]]
    for d in defaults:  # no default path into the committed records
        path = "".join(d.split(")")[0].split())  # argparse may wrap a path at a hyphen
        for committed, under_build in (("bench/results", "build/bench/results"),
                                       ("/docs/img", "build/bench/docs/img")):
            assert committed not in path.replace(under_build, ""), d


# ---------------------------------------------------------------------- 6. PaddingWarning
def test_padding_warning_is_one_clean_line():
    from hw.format import WeightFormat
    from sw.compress.core import PaddingWarning, compress_matrix
    fmt = WeightFormat.parse("2:4-int4")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compress_matrix(np.ones((4, 30), np.float32), fmt, name="layer.7")
    (w,) = [w for w in caught if issubclass(w.category, PaddingWarning)]
    text = warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line)
    assert text.count("\n") == 1 and "PaddingWarning: layer.7: K=30 padded" in text


# ---------------------------------------------------------------------- 7. Ctrl-C
CLIS = ["sw.deploy", "sw.compress.__main__", "sw.codesign", "sw.models.eval", "sim.__main__",
        "hw.generate", "hw.synth", "hw.board.build", "formal.__main__",
        "sw.models.train_reference"] + [
            f"bench.{n}" for n in BENCHES if n != "simspeed"]


@pytest.mark.parametrize("module", CLIS)
def test_every_cli_ends_quietly_on_ctrl_c(module):
    assert hasattr(importlib.import_module(module).main, "__wrapped__"), "not @command"


def test_ctrl_c_is_one_line_and_130(tmp_path, monkeypatch, capsys):
    import hw.generate
    import sw.compress.__main__ as compress

    def interrupt(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(compress, "run", interrupt)
    assert compress.main([]) == 130
    assert _one_line(capsys.readouterr().err) == "sw.compress: interrupted"
    monkeypatch.setattr(hw.generate, "generate_verilog", interrupt)
    assert hw.generate.main(["--out", str(tmp_path / "o")]) == 130
    assert capsys.readouterr().err.splitlines()[-1] == "hw.generate: interrupted"
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------- 8. help text
def test_help_derives_defaults(capsys):
    from hw.synth import main as synth
    assert _exit(synth, ["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"clock_mhz, {AcceleratorConfig().clock_mhz:g} for the default one" in text
    from bench.compress import main as bench_compress
    assert _exit(bench_compress, ["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"configuration's (default: {AcceleratorConfig().lanes})" in text
    from sw.compress.__main__ import _parser as compress_parser
    from sw.deploy import _parser as deploy_parser
    from sw.models.source import BUILTINS
    text = " ".join(compress_parser().format_help().split())
    assert f"the configuration's, {AcceleratorConfig().lanes} for" in text
    text = " ".join(deploy_parser().format_help().split())
    assert all(name in text for name in BUILTINS) and ".gguf" in text
    from sim.__main__ import main as sim
    assert _exit(sim, ["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "needs --values" not in text and "implies --values" in text


# ---------------------------------------------------------------------- 9. one parser class
#: Every command and the prefix of its one-line errors (the name its own errors use).
COMMANDS = {"sim.__main__": "python -m sim", "hw.generate": "hw.generate",
            "hw.synth": "hw.synth", "hw.board.build": "hw.board.build",
            "sw.deploy": "sw.deploy", "sw.codesign": "sw.codesign",
            "sw.compress.__main__": "sw.compress", "sw.models.eval": "sw.models.eval",
            "sw.models.train_reference": "sw.models.train_reference",
            "formal.__main__": "python -m formal"} | {f"bench.{n}": f"bench.{n}" for n in BENCHES}


def test_every_command_is_listed_and_parses_with_one_line_parser():
    """No ``argparse.ArgumentParser`` is built or subclassed outside hw/cli.py, and every
    module with a ``__main__`` entry point is in :data:`COMMANDS`."""
    import ast
    bad, entry = [], set()
    for pkg in ("hw", "sim", "sw", "bench", "formal"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            text = path.read_text()
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if "__name__ == \"__main__\"" in text or path.name == "__main__.py":
                entry.add(module)
            if path == ROOT / "hw" / "cli.py":
                continue
            for node in ast.walk(ast.parse(text)):
                used = ([node.func] if isinstance(node, ast.Call) else
                        node.bases if isinstance(node, ast.ClassDef) else [])
                if any(getattr(n, "attr", getattr(n, "id", None)) == "ArgumentParser"
                       for n in used):  # built or subclassed, not merely named in a hint
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, f"argparse.ArgumentParser outside hw.cli.OneLineParser: {bad}"
    assert entry == set(COMMANDS), entry ^ set(COMMANDS)


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_a_bad_option_is_one_line_without_usage(module, capsys):
    main = importlib.import_module(module).main
    required = ["--out", "x"] if module == "hw.generate" else []
    assert _exit(main, [*required, "--no-such-option"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line == f"{COMMANDS[module]}: unrecognized arguments: --no-such-option", line


@pytest.mark.parametrize("module", sorted(COMMANDS))
def test_help_shows_the_default_of_every_option_with_a_value(module, capsys):
    import re
    main = importlib.import_module(module).main
    assert _exit(main, ["--help"]) == 0
    text = capsys.readouterr().out
    options = text.split("\noptions:\n", 1)[1]
    options = re.split(r"\n\n(?=\S)", options)[0]      # an epilog follows a blank line
    entries = re.split(r"\n(?=  -)", options)
    missing = []
    for entry in entries:
        head = entry.strip().split("  ")[0]              # "--layer LAYER", "-h, --help"
        takes_value = re.search(r"--?[\w-]+ [\w{]", head)
        flat = " ".join(entry.split())
        if takes_value and "default" not in flat and "(required)" not in flat:
            missing.append(head)
    assert not missing, f"{module} --help shows no default for {missing}"
