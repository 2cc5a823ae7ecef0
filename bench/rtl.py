"""Linear layers on the Verilator RTL: utilisation, sparse speedup, simulator speed.

``python -m bench.rtl`` lowers a compute-bound linear layer (K = N = 1024, 64 tokens by default)
with :mod:`sw.compile.layers` (double-buffered weight loads ordered by events, so loads overlap
the GEMMs) for several N:M patterns on three array sizes, runs every program on the Verilator
build of the accelerator (:mod:`sim.rtl`), checks the int32 outputs against the golden
numerics (:func:`hw.numerics.gemm_acc_packed`) and the cycles against the fast model, and
writes ``bench/results/rtl.json`` (with ``--record``; by default under ``build/bench/``) (flat
records) and a table.

``python -m bench.rtl --demo`` (``make sim``) is the short version on the default
configuration: one 2:4 INT4 layer (K=512, N=128, 16 tokens) and the same layer dense, with
PASS/FAIL.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from bench.common import RESULTS, command, parser, patterns, positive_int, stamp, write_json
from hw.config import AcceleratorConfig
from hw.format import WeightFormat, random_quantized
from hw.numerics import gemm_acc_packed
from sim.model import FastModel
from sim.rtl import RTLBackend
from sw.compile.layers import build_linear

__all__ = ["ARRAYS", "PATTERNS", "run_layer", "bench", "demo", "main"]

#: Array shapes of the benchmark (rows, cols): the default configuration's first, then two
#: others; the rest of the configuration is the default.
ARRAYS = {AcceleratorConfig().array: (AcceleratorConfig().rows, AcceleratorConfig().cols),
          "4x16": (4, 16), "2x8": (2, 8)}
PATTERNS = ("dense", "2:4", "1:4", "2:8")


def _config(rows: int, cols: int) -> AcceleratorConfig:
    return AcceleratorConfig(rows=rows, cols=cols)


def run_layer(backend: RTLBackend, pattern: str, k: int, n: int, tokens: int, *,
              bits: int = 4, group: int = 128, seed: int = 0) -> dict:
    """Lower, run and check one layer; returns a flat record."""
    cfg = backend.cfg
    fmt = WeightFormat(pattern=pattern, bits=bits, group=group)
    rng = np.random.default_rng(seed)
    w = random_quantized(fmt, (n, k), rng)
    x = rng.integers(-127, 128, (tokens, k), dtype=np.int8)
    lp = build_linear(cfg, fmt, n, k, tokens, weight=w, acts=x)
    t0 = time.perf_counter()
    res = backend.run(lp.program, lp.dram)
    wall = time.perf_counter() - t0
    golden = np.array_equal(lp.read_output(res.dram), gemm_acc_packed(x, w, cfg.acc_bits))
    model = FastModel(cfg).run(lp.program, timing_only=True)
    stats = backend.last_stats
    return stamp({
        "array": cfg.array,
        "pattern": "4:4" if fmt.pattern.dense else str(fmt.pattern),
        "bits": bits, "tokens": tokens, "k": k, "n": n,
        "instructions": len(lp.program),
        "cycles": res.cycles,
        "mac_cycles": res.counters["mac_cycles"],
        "utilization": res.counters["mac_cycles"] / res.cycles,
        "error": res.error.name,
        "matches_golden": bool(golden and res.ok),
        "matches_model": (res.cycles, res.counters) == (model.cycles, model.counters),
        "sim_cycles": stats["simulated_cycles"],
        "sim_cycles_per_s": stats["cycles_per_s"],
        "sim_cycles_per_cpu_s": stats["cycles_per_cpu_s"],
        "run_wall_s": wall,
        "waves": str(backend.last_waves) if backend.waves else None,
    }, cfg)


def _with_speedup(records: list[dict]) -> list[dict]:
    dense = {(r["array"], r["k"], r["n"], r["tokens"]): r["cycles"] for r in records
             if r["pattern"] == "4:4"}
    for r in records:
        base = dense.get((r["array"], r["k"], r["n"], r["tokens"]))
        r["speedup_vs_dense"] = base / r["cycles"] if base else None
        n, m = (int(v) for v in r["pattern"].split(":"))
        r["ideal_speedup"] = m / n
    return records


def _table(records: list[dict]) -> str:
    head = (f"{'array':>6} {'pattern':>7} {'tok':>4} {'K':>5} {'N':>5} {'cycles':>9} "
            f"{'util':>6} {'speedup':>7} {'ideal':>5} {'kcyc/s':>7} {'golden':>6} {'model':>5}")
    lines = [head, "-" * len(head)]
    for r in records:
        sp = f"{r['speedup_vs_dense']:.2f}" if r.get("speedup_vs_dense") else "-"
        lines.append(
            f"{r['array']:>6} {r['pattern']:>7} {r['tokens']:>4} {r['k']:>5} {r['n']:>5} "
            f"{r['cycles']:>9} {r['utilization']:>6.1%} {sp:>7} {r['ideal_speedup']:>5.2f} "
            f"{r['sim_cycles_per_s'] / 1e3:>7.1f} {str(r['matches_golden']):>6} "
            f"{str(r['matches_model']):>5}")
    return "\n".join(lines)


def bench(arrays=ARRAYS, patterns=PATTERNS, k: int = 1024, n: int = 1024, tokens: int = 64,
          out: Path | None = RESULTS / "rtl.json", verbose: bool = True) -> list[dict]:
    """Run every (array, pattern) and write the records."""
    records = []
    for name, (rows, cols) in arrays.items():
        backend = RTLBackend(_config(rows, cols))
        t0 = time.perf_counter()
        backend.build()
        if verbose:
            print(f"[{name}] runner ready in {time.perf_counter() - t0:.0f} s", flush=True)
        for pat in patterns:
            rec = run_layer(backend, pat, k, n, tokens)
            records.append(rec)
            if verbose:
                print(f"[{name}] {rec['pattern']}: {rec['cycles']} cycles, "
                      f"{rec['sim_cycles_per_s'] / 1e3:.0f} kcycles/s", flush=True)
    records = _with_speedup(records)
    if out is not None:
        write_json(out, records)
    if verbose:
        print(_table(records))
    return records


def demo() -> bool:
    """The ``make sim`` demo: one 2:4 INT4 layer and the same layer dense, default config."""
    cfg = AcceleratorConfig()
    backend = RTLBackend(cfg)
    t0 = time.perf_counter()
    runner = backend.build()
    print(f"runner: {runner} (ready in {time.perf_counter() - t0:.0f} s)")
    recs = _with_speedup([run_layer(backend, p, k=512, n=128, tokens=16)
                          for p in ("2:4", "dense")])
    ok = True
    for r in recs:
        good = r["matches_golden"] and r["matches_model"]
        ok &= good
        print(f"{r['pattern']:>5} INT4  K={r['k']} N={r['n']} tokens={r['tokens']}: "
              f"{r['cycles']} cycles, utilisation {r['utilization']:.1%}, "
              f"{r['sim_cycles_per_s'] / 1e3:.0f} kcycles/s simulated -> "
              f"golden {'ok' if r['matches_golden'] else 'MISMATCH'}, "
              f"fast model {'ok' if r['matches_model'] else 'MISMATCH'}")
        if r.get("waves"):
            print(f"      waveform: {r['waves']}")
    sparse = recs[0]
    print(f"2:4 sparse speedup over dense: {sparse['speedup_vs_dense']:.2f}x "
          f"(ideal {sparse['ideal_speedup']:.1f}x)")
    print("PASS" if ok else "FAIL")
    return ok


def _arrays(text: str) -> dict[str, tuple[int, int]]:
    names = [a.strip() for a in text.split(",") if a.strip()]
    if not names or (bad := [a for a in names if a not in ARRAYS]):
        raise argparse.ArgumentTypeError(f"{text!r}: choose among {', '.join(ARRAYS)}"
                                         + (f" (not {bad[0]!r})" if names else ""))
    return {a: ARRAYS[a] for a in names}


@command("bench.rtl")
def main(argv: list[str] | None = None) -> int:
    ap = parser("python -m bench.rtl", __doc__)
    ap.add_argument("--demo", action="store_true", help="the short make-sim demo")
    ap.add_argument("--k", type=positive_int, default=1024, help="layer inputs")
    ap.add_argument("--n", type=positive_int, default=1024, help="layer outputs")
    ap.add_argument("--tokens", type=positive_int, default=64, help="activation rows")
    ap.add_argument("--arrays", type=_arrays, default=",".join(ARRAYS),
                    help=f"comma-separated subset of {list(ARRAYS)}")
    ap.add_argument("--patterns", type=patterns, default=",".join(PATTERNS),
                    help="comma-separated N:M patterns (dense is always measured)")
    ap.add_argument("--out", type=Path, default=RESULTS / "rtl.json", help="results JSON")
    args = ap.parse_args(argv)
    if args.demo:
        return 0 if demo() else 1
    records = bench(args.arrays, args.patterns, args.k, args.n, args.tokens, out=args.out)
    ok = all(r["matches_golden"] and r["matches_model"] for r in records)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
