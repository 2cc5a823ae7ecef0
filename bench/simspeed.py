"""How fast the fast model is, against the Verilator RTL, on identical programs.

``python -m bench.simspeed`` measures, on this machine:

* one transformer block of the shipped reference model (q, k, v, o, gate, up, down, 2:4 INT4
  g128, 64 tokens) lowered for the default accelerator as one persistent program (the headline
  record), and each layer as a program of its own (``block_layers``), run on the RTL
  (Verilator) and on the fast model, full mode (values and timing) and timing-only; both get
  the same encoded program and DRAM image; cycles, counters and DRAM must be identical (the run
  fails otherwise);
* one LLaMA-7B-shape decode token (32 blocks x 7 linear layers, 32 x 32 x 2 attention products,
  LM head; 2:4 INT4) in timing-only mode, every layer program simulated (no memoisation);
* a 4096x4096 2:4 INT4 GEMV in full mode (values);
* one decode token of a compiled model in values mode through the runtime on the fast model
  (every program, host nodes included: ``*_values_token_s``), against its floor, the same
  token's matrix products in plain numpy (float64 BLAS on one thread, as the model computes
  them, operands prepared beforehand: ``*_matmul_floor_token_s``): the reference model
  (2:4 INT4 g128) always, SmolLM2-135M (dense INT4 g128, 128 MiB of DRAM) when ``make
  smollm2`` has installed it (``smollm2_*`` fields; null otherwise), SmolLM2's floor also as
  ``matmul_floor_token_s``, the field the values-speed target (``smollm2_values_token_s``
  <= 0.5 s and within 10x of it) names.

Walls are medians of ``--repeats`` runs. Writes ``simspeed.json`` under
``build/bench/results/`` (``--record``: ``bench/results/``); ``--values-only`` measures only
the values tokens and updates those fields of ``--out``.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits
from torch import nn

from bench.common import (
    RESULTS,
    command,
    median_wall,
    parser,
    positive_int,
    provenance,
    stamp,
    write_json,
)
from bench.scaling import FORMATS, LLAMA7B, _captured, llama7b, step_options
from hw.config import AcceleratorConfig, MemoryModel
from hw.format import WeightFormat, random_quantized
from sim.backends import make_backend
from sim.equivalence import compare_results
from sim.model import FastModel
from sim.rtl import RTLBackend
from sw.compile import CompileOptions, compile_model
from sw.compile.layers import LayerSpec, build_layers, build_linear
from sw.compress.core import compress_matrix
from sw.compress.model import compress_llama
from sw.models.reference_model import load_reference
from sw.models.source import ModelSourceError, open_model
from sw.runtime import Runtime

FMT = WeightFormat("2:4", 4, 128)


def reference_block_specs(tokens: int, seed: int = 0) -> list[tuple[str, LayerSpec]]:
    """The 7 linear layers of block 0 of the reference model, compressed, with random INT8
    activations of ``tokens`` tokens."""
    model = load_reference()
    rng = np.random.default_rng(seed)
    specs = []
    for name, mod in model.named_modules():
        if name.startswith("model.layers.0.") and hasattr(mod, "weight") and \
                mod.weight.ndim == 2:
            w = mod.weight.detach().float().numpy()
            qw = compress_matrix(w, FMT, name=name)
            acts = rng.integers(-127, 128, size=(tokens, w.shape[1])).astype(np.int8)
            specs.append((name.split(".")[-1], LayerSpec(FMT, *w.shape, tokens, qw, acts)))
    return specs


def _race(name: str, lp, rtl, cfg: AcceleratorConfig, repeats: int) -> dict:
    """One program on both backends (the same encoded words and DRAM image); each model run
    on a fresh :class:`FastModel`, so nothing (schedule, decoded weights) comes from a
    previous run."""
    words = lp.words
    t_rtl, r = median_wall(lambda: rtl.run(words, lp.dram), repeats)
    loop_s = rtl.last_stats["wall_s"]
    t_model, m = median_wall(lambda: FastModel(cfg).run(words, lp.dram), repeats)
    t_timing, mt = median_wall(lambda: FastModel(cfg).run(words, timing_only=True), repeats)
    diff = compare_results(m, r)
    if diff is not None or mt.cycles != r.cycles:
        raise SystemExit(f"{name}: model and RTL disagree: {diff}")
    print(f"  {name:<10} {len(words):>4} instr {r.cycles:>8} cycles  RTL {t_rtl * 1e3:8.1f} ms"
          f"  model {t_model * 1e3:7.2f} ms (timing-only {t_timing * 1e3:6.2f} ms)", flush=True)
    return {"program": name, "instructions": len(words), "rtl_cycles": r.cycles,
            "model_cycles": m.cycles, "rtl_wall_s": t_rtl, "rtl_loop_s": loop_s,
            "model_wall_s": t_model, "model_timing_wall_s": t_timing}


def block_speed(cfg: AcceleratorConfig, tokens: int, repeats: int) -> dict:
    """The block as one persistent program (as the accelerator runs a model step), and each
    layer as a program of its own (for the breakdown)."""
    rtl = RTLBackend(cfg)
    rtl.build(verbose=True)
    specs = reference_block_specs(tokens)
    rec = _race("block", build_layers(cfg, [sp for _, sp in specs]), rtl, cfg, repeats)
    rec["layers"] = [_race(name, build_layers(cfg, [sp]), rtl, cfg, repeats)
                     for name, sp in specs]
    rec["rtl_cycles_per_s"] = rec["rtl_cycles"] / rec["rtl_loop_s"]
    rec["speedup"] = rec["rtl_wall_s"] / rec["model_wall_s"]
    rec["speedup_timing_only"] = rec["rtl_wall_s"] / rec["model_timing_wall_s"]
    return rec


def llama7b_decode_token(repeats: int) -> dict:
    """Timing-only simulation of every program of one compiled LLaMA-7B decode token (2:4
    INT4, context 128): all 32 blocks' programs, each simulated (no memo)."""
    cfg = AcceleratorConfig().timing_only()
    lm = llama7b()
    t0 = time.perf_counter()
    exe = compile_model(lm, cfg, step_options("decode", 1, 128),
                        formats={n: FORMATS["2:4-int4"] for n, m in lm.named_modules()
                                 if isinstance(m, nn.Linear)},
                        captured=_captured("decode", 1, 128))
    compile_s = time.perf_counter() - t0
    programs = [p.words for p in exe.programs]

    def simulate():  # a fresh model: no schedule cached from the previous repeat
        model = FastModel(cfg)
        return sum(model.run(p, timing_only=True).cycles for p in programs)

    wall, cycles = median_wall(simulate, repeats)
    return {"llama7b_decode_token_wall_s": wall, "llama7b_decode_token_cycles": cycles,
            "llama7b_decode_programs": len(programs),
            "llama7b_decode_instructions": sum(len(p) for p in programs),
            "llama7b_decode_compile_s": compile_s, "llama7b_layers": LLAMA7B["layers"]}


def gemv_full(repeats: int) -> dict:
    cfg = AcceleratorConfig(memory=MemoryModel(size_bytes=1 << 24))
    rng = np.random.default_rng(0)
    w = random_quantized(FMT, (4096, 4096), rng)
    a = rng.integers(-127, 128, size=(1, 4096)).astype(np.int8)
    lp = build_linear(cfg, FMT, 4096, 4096, 1, w, a)
    wall, r = median_wall(lambda: FastModel(cfg).run(lp.program, lp.dram), repeats)
    return {"gemv_4096_full_wall_s": wall, "gemv_4096_cycles": r.cycles}


def values_token(lm, weights: dict, cfg: AcceleratorConfig, repeats: int,
                 prompt: int = 8) -> dict:
    """Median wall of one decode token in values mode on the fast model (through the runtime,
    after a prefill and one warm-up token: the weight streams are decoded by then, as in any
    generation) and of its floor: the token's matrix products in plain numpy."""
    exe = compile_model(lm, cfg, CompileOptions(prompt, prompt + repeats + 2), weights=weights)
    rt = Runtime(exe, make_backend("model", cfg))
    ids = torch.randint(0, lm.config.vocab_size, (1, prompt + repeats + 2),
                        generator=torch.Generator().manual_seed(0))
    rt.step(ids[:, :prompt])
    rt.step(ids[:, prompt:prompt + 1])
    walls, stats = [], None
    for p in range(prompt + 1, prompt + 1 + repeats):
        t0 = time.perf_counter()
        _, stats = rt.step(ids[:, p:p + 1])
        walls.append(time.perf_counter() - t0)
    # the floor: y[tokens, n] = x[tokens, k] @ w[n, k]^T of every member of the token's
    # programs, float64 (exact for these integers) on one BLAS thread, as the model computes
    rng = np.random.default_rng(0)
    operands = [(rng.integers(-127, 128, (m.tokens, m.k)).astype(np.float64),
                 rng.integers(-8, 8, (m.n, m.k)).astype(np.float64))
                for run in stats.programs for m in exe.programs[run.program].members]

    def products():
        for x, w in operands:
            x @ w.T

    with threadpool_limits(limits=1, user_api="blas"):
        floor, _ = median_wall(products, repeats)
    return {"values_token_s": statistics.median(walls), "matmul_floor_token_s": floor,
            "decode_cycles": stats.cycles, "programs": len(stats.programs),
            "products": len(operands)}


def reference_values_token(repeats: int) -> dict:
    lm = load_reference()
    weights = compress_llama(lm, FMT, "magnitude", progress=False)
    rec = values_token(lm, weights, AcceleratorConfig(), repeats)
    return {f"reference_{k}": v for k, v in rec.items()}


def smollm2_values_token(repeats: int) -> dict:
    """SmolLM2-135M, dense INT4 g128 (round to nearest), 128 MiB of DRAM; nulls when the
    package is not installed."""
    try:
        lm = open_model("smollm2").model
    except ModelSourceError as e:
        print(f"  SmolLM2 not measured: {e}")
        return dict.fromkeys(("smollm2_values_token_s", "smollm2_matmul_floor_token_s",
                              "smollm2_decode_cycles", "smollm2_programs",
                              "smollm2_products"))
    weights = compress_llama(lm, WeightFormat("dense", 4, 128), "magnitude", progress=False)
    rec = values_token(lm, weights, AcceleratorConfig().with_dram(128 << 20), repeats)
    return {f"smollm2_{k}": v for k, v in rec.items()}


def values_tokens(repeats: int) -> dict:
    print("decode token in values mode (runtime + fast model) vs its numpy matmul floor:",
          flush=True)
    rec = {**reference_values_token(repeats), **smollm2_values_token(repeats)}
    rec["matmul_floor_token_s"] = rec["smollm2_matmul_floor_token_s"]  # beside the target
    print(f"  {'model':<10} {'programs':>8} {'token (s)':>10} {'floor (s)':>10} {'ratio':>6}")
    for name in ("reference", "smollm2"):
        tok, floor = rec[f"{name}_values_token_s"], rec[f"{name}_matmul_floor_token_s"]
        if tok is None:
            print(f"  {name:<10} {'-':>8} {'-':>10} {'-':>10} {'-':>6}")
            continue
        print(f"  {name:<10} {rec[f'{name}_programs']:>8} {tok:>10.3f} {floor:>10.4f} "
              f"{tok / floor:>6.1f}")
    return rec


@command("bench.simspeed")
def main(argv: list[str] | None = None) -> int:
    ap = parser("python -m bench.simspeed", __doc__)
    ap.add_argument("--repeats", type=positive_int, default=3,
                    help="runs per measurement (the median is reported)")
    ap.add_argument("--tokens", type=positive_int, default=64, help="tokens of the reference block")
    ap.add_argument("--out", type=Path, default=RESULTS / "simspeed.json",
                    help="results JSON")
    ap.add_argument("--values-only", action="store_true",
                    help="measure only the values-mode decode tokens (no RTL build) and "
                         "update their fields in --out")
    args = ap.parse_args(argv)
    if args.values_only:
        values = values_tokens(args.repeats)
        old = json.loads(args.out.read_text()) if args.out.exists() else {}
        # the other fields keep the stamp of the run that measured them
        values["values_provenance"] = provenance(AcceleratorConfig())
        print(f"wrote {write_json(args.out, {**old, **values})}")
        return 0
    cfg = AcceleratorConfig()
    print(f"reference-model block, {args.tokens} tokens, default {cfg.rows}x{cfg.cols} array:")
    block = block_speed(cfg, args.tokens, args.repeats)
    print("LLaMA-7B decode token, timing-only ...", flush=True)
    token = llama7b_decode_token(args.repeats)
    print("4096x4096 2:4 GEMV, full mode ...", flush=True)
    gemv = gemv_full(args.repeats)
    values = values_tokens(args.repeats)
    rec = {**{k: v for k, v in block.items() if k != "layers"}, **token, **gemv, **values,
           "block_layers": block["layers"], "tokens": args.tokens}
    print(f"\nblock: RTL {block['rtl_wall_s']:.2f} s ({block['rtl_cycles_per_s'] / 1e3:.0f}k "
          f"cycles/s in the Verilator loop), model {block['model_wall_s'] * 1e3:.1f} ms full / "
          f"{block['model_timing_wall_s'] * 1e3:.1f} ms timing-only, identical "
          f"{block['rtl_cycles']} cycles")
    print(f"speedup: {block['speedup']:.0f}x full, {block['speedup_timing_only']:.0f}x "
          f"timing-only")
    print(f"LLaMA-7B decode token (timing-only, {token['llama7b_decode_instructions']} "
          f"instructions in {token['llama7b_decode_programs']} programs): "
          f"{token['llama7b_decode_token_wall_s']:.2f} s")
    print(f"4096x4096 2:4 GEMV with values: {gemv['gemv_4096_full_wall_s']:.2f} s")
    print(f"wrote {write_json(args.out, stamp(rec, cfg))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
