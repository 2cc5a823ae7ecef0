"""Coverage-guided fuzzing of every input surface (atheris, libFuzzer for Python).

``python -m bench.fuzz --seconds S`` runs each target of :data:`TARGETS` for ``S`` seconds in
its own process (libFuzzer stops a process at its first crash) and writes
``bench/results/fuzz.json`` (with ``--record``; by default under ``build/bench/``): per target
``target``, ``seconds``, ``executions``, ``findings``
(inputs that raised an exception the surface does not document, or ran past the per-input
timeout; 0 when clean) and ``corpus_size``. Each target starts from seed inputs made here
(valid files and programs, so mutations explore near-valid input) and keeps its corpus under
``build/fuzz/<target>/`` so a later run resumes; findings are written there as
``crash-*``/``timeout-*`` files, and every finding that was fixed is replayed by
``tests/test_fuzz_targets.py`` from ``tests/fuzz_regressions/<target>/``.

A target is a function of the input bytes and the exception types its surface documents;
anything else -- or a hang -- is a finding.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.common import (
    RESULTS,
    command,
    parser,
    positive_float,
    positive_int,
    stamp,
    write_json,
)

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "build" / "fuzz"
REGRESSIONS = ROOT / "tests" / "fuzz_regressions"


@dataclass(frozen=True)
class Target:
    """A fuzz target: ``run(data)`` may raise only ``allowed``; ``seeds()`` gives starting
    inputs; ``max_len`` bounds an input's size."""

    run: Callable[[bytes], None]
    allowed: Callable[[], tuple[type[BaseException], ...]]
    seeds: Callable[[], list[bytes]]
    max_len: int = 4096


# ---------------------------------------------------------------------- targets
# Every project import in this file is deferred on purpose: atheris instruments only the
# modules first imported inside ``instrument_imports`` in the fuzzing process (:func:`_child`),
# so importing hw/sim/sw at module level would leave the targets uninstrumented.
def _small_cfg():
    from sim.random_programs import EQUIVALENCE_CONFIGS
    return EQUIVALENCE_CONFIGS["2x4"]


def _unpack(data: bytes) -> None:
    """hw.format.unpack of a stream for a format and shape chosen from the input."""
    from hw.config import AcceleratorConfig
    from hw.format import WeightFormat, stream_layout, unpack
    if len(data) < 6:
        return
    table = AcceleratorConfig().pattern_table
    pattern = table[data[0] % len(table)]
    bits = 8 if data[1] & 1 and pattern.dense else 4
    group = (0, 16, 32, 64, 128)[(data[1] >> 1) % 5]
    fmt = WeightFormat(pattern, bits, group, symmetric=not data[1] & 64, raw=False)
    n, k, lanes = 1 + data[2] % 70, 1 + (data[3] | data[4] << 8) % 400, (8, 16, 64)[data[5] % 3]
    body = np.frombuffer(data[6:], dtype=np.uint8)
    need = stream_layout(fmt, n, k, lanes).total_bytes
    if data[5] & 128:  # mostly the right length, so the contents get exercised
        body = np.resize(body, need) if body.size else np.zeros(need, np.uint8)
    unpack(body.copy(), fmt, (n, k), lanes, np.ones(n, np.float32))


def _config(data: bytes) -> None:
    from hw.config import AcceleratorConfig
    AcceleratorConfig.from_json(data.decode("utf-8", errors="replace"))


def _decode(data: bytes) -> None:
    """The scalar decoder, and the vectorised one agreeing with it."""
    from hw.isa import (
        ISAError,
        decode,
        decode_fields,
        dispatch_error,
        dispatch_errors,
        program_words,
    )
    cfg = _small_cfg()
    words = [int.from_bytes(data[i:i + 16].ljust(16, b"\0"), "little")
             for i in range(0, max(16, len(data)), 16)][:64]
    vec = dispatch_errors(decode_fields(program_words(words)), cfg)
    for w, e in zip(words, vec.tolist(), strict=True):
        try:
            ins = decode(w)
        except ISAError:
            assert e == 1, f"undecodable word {w:#x} passes the vectorised check ({e})"
            continue
        try:
            scalar = dispatch_error(ins, cfg).value
        except ISAError:
            continue  # fields the dataclass refuses (tokens = 0 cannot be encoded)
        assert scalar == e, f"{ins}: scalar {scalar} vs vectorised {e}"


def _program(data: bytes) -> None:
    """Random instruction words on the fast model, with values, on a small configuration."""
    from sim.model import FastModel
    cfg = _small_cfg()
    raw = data[: 16 * 48]
    raw = raw[: len(raw) // 16 * 16]
    if not raw:
        return
    rng = np.random.default_rng(len(data))
    dram = rng.integers(0, 256, cfg.memory.size_bytes, dtype=np.uint8)
    FastModel(cfg).run(raw, dram)


def _with_file(data: bytes, loader, suffix=".safetensors") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"f{suffix}"
        path.write_bytes(data)
        loader(path)


def _executable(data: bytes) -> None:
    from sw.compile.executable import load
    _with_file(data, load)


def _compressed(data: bytes) -> None:
    from sw.models.compressed import load
    _with_file(data, load)


def _hf(data: bytes) -> None:
    """A checkpoint directory: config.json and model.safetensors split from the input."""
    from sw.models.hf import load_checkpoint
    cut = int.from_bytes(data[:2].ljust(2, b"\0"), "little") % max(1, len(data))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_bytes(data[2:2 + cut])
        (Path(tmp) / "model.safetensors").write_bytes(data[2 + cut:])
        load_checkpoint(tmp)


def _gguf(data: bytes) -> None:
    from sw.models import gguf
    _with_file(data, gguf.load_gguf, ".gguf")


# ---------------------------------------------------------------------- seeds
def _seed_executable() -> list[bytes]:
    import torch

    from hw.config import AcceleratorConfig, MemoryModel
    from hw.format import WeightFormat
    from sw.compile import CompileOptions, compile_model
    from sw.compile.executable import save
    from sw.compress.model import compress_llama
    from sw.models import LlamaConfig, LlamaLM
    torch.manual_seed(0)
    lm = LlamaLM(LlamaConfig(vocab_size=16, hidden_size=16, intermediate_size=16,
                             num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=1, max_position_embeddings=16))
    ws = compress_llama(lm, WeightFormat("2:4", 4, 16), "magnitude", progress=False)
    cfg = AcceleratorConfig(rows=2, cols=4, memory=MemoryModel(size_bytes=1 << 16))
    exe = compile_model(lm, cfg, CompileOptions(2, 4), weights=ws)
    with tempfile.TemporaryDirectory() as tmp:
        return [save(exe, Path(tmp) / "e.safetensors").read_bytes()]


def _seed_compressed() -> list[bytes]:
    from hw.format import WeightFormat, random_quantized
    from sw.models import compressed
    rng = np.random.default_rng(0)
    model = compressed.CompressedModel(
        weights={"a": random_quantized(WeightFormat("2:4", 4, 32), (8, 64), rng)},
        tensors={"norm": np.ones(8, np.float32)})
    with tempfile.TemporaryDirectory() as tmp:
        return [compressed.save(model, Path(tmp) / "m.safetensors").read_bytes()]


def _seed_hf() -> list[bytes]:
    import torch

    from sw.models import LlamaConfig, LlamaLM
    from sw.models.hf import save_checkpoint
    torch.manual_seed(0)
    lm = LlamaLM(LlamaConfig(vocab_size=8, hidden_size=8, intermediate_size=8,
                             num_hidden_layers=1, num_attention_heads=2,
                             num_key_value_heads=1, max_position_embeddings=8))
    with tempfile.TemporaryDirectory() as tmp:
        save_checkpoint(lm, tmp)
        cfg = (Path(tmp) / "config.json").read_bytes()
        weights = (Path(tmp) / "model.safetensors").read_bytes()
    return [len(cfg).to_bytes(2, "little") + cfg + weights]


def _seed_program() -> list[bytes]:
    from hw.isa import encode
    from sim.random_programs import random_program
    cfg = _small_cfg()
    out = []
    for seed in range(4):
        rp = random_program(cfg, np.random.default_rng(seed), chains=1, tasks=2)
        out.append(b"".join((w if isinstance(w, int) else encode(w)).to_bytes(16, "little")
                            for w in rp.program))
    return out


def _seed_gguf() -> list[bytes]:
    """A tiny valid LLaMA GGUF (Q8_0 matrices, F32 norms), written with the ``gguf`` package's
    writer under its own tensor-name map, so mutations start inside the loader."""
    import gguf
    import torch

    from sw.models import LlamaConfig, LlamaLM
    from sw.models.gguf import write_config
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=8, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.gguf"
        w = gguf.GGUFWriter(str(path), "llama")
        write_config(w, cfg)
        for name, t in LlamaLM(cfg).state_dict().items():
            a = t.float().numpy()
            qtype = gguf.GGMLQuantizationType.Q8_0 if a.ndim == 2 else \
                gguf.GGMLQuantizationType.F32
            w.add_tensor(names.get_name(name, try_suffixes=(".weight",)),
                         gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return [path.read_bytes()]


def _seed_config() -> list[bytes]:
    from hw.config import AcceleratorConfig
    return [AcceleratorConfig().to_json().encode(), _small_cfg().to_json().encode()]


def _allowed(*names: str) -> Callable[[], tuple[type[BaseException], ...]]:
    """Exception types by dotted name (imported lazily, inside the instrumented process)."""
    def get():
        import importlib
        out = []
        for name in names:
            mod, _, cls = name.rpartition(".")
            out.append(getattr(importlib.import_module(mod), cls))
        return tuple(out)
    return get


#: Every input surface: the stream decoder, the configuration, the instruction decoder, the
#: backends' program loader, and the files users hand us (executables, compressed models,
#: Hugging Face checkpoints, GGUF).
TARGETS: dict[str, Target] = {
    "format_unpack": Target(_unpack, _allowed("hw.format.FormatError"),
                            lambda: [bytes(range(6)) + bytes(200)], 4096),
    "config_json": Target(_config, _allowed("hw.config.ConfigError"), _seed_config, 2048),
    "isa_decode": Target(_decode, _allowed(), lambda: [bytes(16 * 4)], 1024),
    "program_loader": Target(_program, _allowed("sim.model.ProgramError"), _seed_program,
                             16 * 48),
    "executable_load": Target(_executable, _allowed("sw.compile.executable.ExecutableError"),
                              _seed_executable, 1 << 20),
    "compressed_load": Target(_compressed, _allowed("sw.models.compressed.CompressedFileError"),
                              _seed_compressed, 1 << 16),
    "hf_checkpoint": Target(_hf, _allowed("sw.models.hf.CheckpointError",
                                          "sw.models.config.ModelConfigError"), _seed_hf, 1 << 16),
    "gguf_load": Target(_gguf, _allowed("sw.models.gguf.GGUFError"), _seed_gguf, 1 << 16),
}


def check(name: str, data: bytes) -> None:
    """Run one input through a target; an exception it may not raise propagates."""
    t = TARGETS[name]
    try:
        t.run(data)
    except t.allowed():
        pass


# ---------------------------------------------------------------------- driver
def _child(name: str, seconds: float, timeout_s: int) -> None:
    """Run inside the fuzzing process: instrument the project, then libFuzzer."""
    import atheris
    with atheris.instrument_imports(include=["hw", "sim", "sw", "gguf"]):
        import hw.config  # noqa: F401
        import hw.format  # noqa: F401
        import hw.isa  # noqa: F401
        import sim.model  # noqa: F401
        import sw.compile.executable  # noqa: F401
        import sw.models.compressed  # noqa: F401
        import sw.models.gguf  # noqa: F401
        import sw.models.hf  # noqa: F401
    t = TARGETS[name]
    t.allowed()  # import the exception types
    work = WORK / name
    corpus, seeds = work / "corpus", work / "seeds"
    for d in (corpus, seeds):
        d.mkdir(parents=True, exist_ok=True)
    if not any(seeds.iterdir()):
        for i, s in enumerate(t.seeds()):
            (seeds / f"seed{i}").write_bytes(s)
    max_len = max([t.max_len] + [p.stat().st_size for p in seeds.iterdir()])
    atheris.Setup([sys.argv[0], str(corpus), str(seeds), f"-max_total_time={int(seconds)}",
                   f"-timeout={timeout_s}", f"-max_len={max_len}", "-print_final_stats=1",
                   f"-artifact_prefix={work}/"], lambda data: check(name, data))
    atheris.Fuzz()


def run_target(name: str, seconds: float, timeout_s: int = 10) -> dict:
    """Fuzz one target in a child process; returns its record."""
    work = WORK / name
    work.mkdir(parents=True, exist_ok=True)
    before = {p.name for p in work.glob("crash-*")} | {p.name for p in work.glob("timeout-*")}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench.fuzz", "--child", name, "--seconds",
                           str(seconds), "--timeout", str(timeout_s)], cwd=ROOT,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    log = proc.stderr
    (work / "last.log").write_text(log)
    runs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", log) or \
        re.findall(r"#(\d+)\s", log)
    after = {p.name for p in work.glob("crash-*")} | {p.name for p in work.glob("timeout-*")}
    findings = sorted(after - before)
    corpus = work / "corpus"
    return {"target": name, "seconds": round(wall, 1), "executions": int(runs[-1]) if runs else 0,
            "findings": len(findings), "finding_files": findings,
            "corpus_size": sum(1 for _ in corpus.iterdir()) if corpus.is_dir() else 0,
            "exit_code": proc.returncode}


@command("bench.fuzz")
def main(argv: list[str] | None = None) -> int:
    ap = parser("python -m bench.fuzz", __doc__)
    ap.add_argument("--seconds", type=positive_float, default=60,
                    help="fuzzing time per target")
    ap.add_argument("--target", action="append", choices=sorted(TARGETS),
                    help="fuzz only this target, repeatable; its records in --out are replaced, "
                         "the others kept (all: --out rewritten)")
    ap.add_argument("--timeout", type=positive_int, default=10,
                    help="seconds one input may take before it counts as a hang")
    ap.add_argument("--out", type=Path, default=RESULTS / "fuzz.json", help="results JSON")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.seconds, args.timeout)
        return 0
    if args.seconds <= 0:
        print(f"bench.fuzz: --seconds must be positive, got {args.seconds}", file=sys.stderr)
        return 2
    records = []
    print(f"{'target':<18}{'seconds':>9}{'executions':>12}{'findings':>10}{'corpus':>8}")
    for name in args.target or list(TARGETS):
        r = run_target(name, args.seconds, args.timeout)
        records.append(r)
        print(f"{name:<18}{r['seconds']:>9.0f}{r['executions']:>12,}{r['findings']:>10}"
              f"{r['corpus_size']:>8}", flush=True)
        for f in r["finding_files"]:
            print(f"  finding: {WORK / name / f}")
    ran = {r["target"] for r in records}
    old = json.loads(args.out.read_text()) if args.target and args.out.is_file() else []
    kept = [r for r in old if isinstance(r, dict) and r.get("target") in TARGETS
            and r["target"] not in ran]   # a --target run replaces only its targets' records
    order = list(TARGETS)
    # no accelerator configuration is measured: the targets are the readers of untrusted input
    write_json(args.out, sorted(kept + stamp(records, None),
                                key=lambda r: order.index(r["target"])))
    print(f"wrote {args.out}" + (f" ({', '.join(sorted(ran))} replaced)" if kept else ""))
    return 1 if any(r["findings"] for r in records) else 0


if __name__ == "__main__":
    raise SystemExit(main())
