"""Storage and speed of the compressor on LLaMA-7B-shaped layers.

``python -m bench.compress`` prints a table and writes ``bench/results/compress.json`` (with
``--record``; by default under ``build/bench/``): one flat
record per (layer, format) with bits/weight, ratio vs FP16, compress/pack/unpack throughput
(median of 5 on this machine), peak memory relative to the FP16 layer, the weight
reconstruction error and the error of the golden W4A8 GEMM against fp32.
"""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import numpy as np

from bench.common import (
    RESULTS,
    command,
    median_wall,
    nonnegative_int,
    parser,
    positive_int,
    stamp,
    write_json,
)
from hw.config import AcceleratorConfig
from hw.format import WeightFormat, pack, stream_layout, unpack
from hw.numerics import golden_linear
from sw.compress.core import compress_matrix

LAYERS = {"4096x4096": (4096, 4096), "11008x4096": (11008, 4096)}
FORMATS = [("dense", 4), ("2:4", 4), ("1:4", 4), ("2:8", 4), ("4:8", 4), ("dense", 8)]


def _median_rate(fn, weights: int, repeats: int) -> float:
    return weights / median_wall(fn, repeats)[0]


def measure(shape: tuple[int, int], pattern: str, bits: int, group: int, lanes: int,
            repeats: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(shape, dtype=np.float32) * 0.02
    fmt = WeightFormat(pattern, bits, group)
    tracemalloc.start()
    t0 = time.perf_counter()
    qw = compress_matrix(w, fmt)
    stream = pack(qw, lanes)
    compress_s = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    pack_rate = _median_rate(lambda: pack(qw, lanes), w.size, repeats)
    unpack_rate = _median_rate(lambda: unpack(stream, fmt, shape, lanes, qw.row_scale),
                               w.size, repeats)
    bpw = stream_layout(fmt, *shape, lanes).bits_per_weight
    deq = qw.dequantize()
    x = rng.standard_normal((16, shape[1]), dtype=np.float32)
    ref = x @ w.T
    return {
        "layer": f"{shape[0]}x{shape[1]}", "pattern": "dense" if fmt.pattern.dense else pattern,
        "bits": bits, "group": group, "lanes": lanes,
        "bits_per_weight": bpw["total"], "bits_values": bpw["values"],
        "bits_indices": bpw["indices"], "bits_scales": bpw["scales"],
        "ratio_vs_fp16": 16.0 / bpw["total"],
        "compress_weights_per_s": w.size / compress_s,
        "pack_weights_per_s": pack_rate, "unpack_weights_per_s": unpack_rate,
        "peak_mem_ratio": peak / (w.size * 2),
        "rel_error": float(np.linalg.norm(deq - w) / np.linalg.norm(w)),
        "gemm_rel_error_vs_fp32": float(np.linalg.norm(golden_linear(x, qw) - ref)
                                        / np.linalg.norm(ref)),
    }


@command("bench.compress")
def main(argv: list[str] | None = None) -> int:
    ap = parser("python -m bench.compress", __doc__)
    ap.add_argument("--repeats", type=positive_int, default=5,
                    help="timed runs per measurement (the median is reported)")
    ap.add_argument("--group", type=nonnegative_int, default=128,
                    help="quantisation group along K, 0 = whole row")
    ap.add_argument("--lanes", type=positive_int, default=AcceleratorConfig().lanes,
                    help="lanes the streams are packed for (the default configuration's)")
    ap.add_argument("--quick", action="store_true", help="4096x4096 only, 2 formats")
    ap.add_argument("--out", type=Path, default=RESULTS / "compress.json",
                    help="results JSON")
    args = ap.parse_args(argv)
    for pattern, bits in FORMATS:  # the group must suit every format before any work
        try:
            WeightFormat(pattern, bits, args.group)
        except ValueError as e:
            ap.error(f"argument --group: {e}")
    layers = {"4096x4096": LAYERS["4096x4096"]} if args.quick else LAYERS
    formats = FORMATS[:2] if args.quick else FORMATS
    records = []
    head = (f"{'layer':<12}{'format':<11}{'bits/w':>8}{'vs fp16':>9}{'compress':>10}"
            f"{'pack':>9}{'unpack':>9}{'peak mem':>9}{'w err':>8}{'gemm err':>9}")
    print(head + "\n" + "-" * len(head))
    for name, shape in layers.items():
        for pattern, bits in formats:
            r = measure(shape, pattern, bits, args.group, args.lanes, args.repeats)
            records.append(r)
            print(f"{name:<12}{r['pattern'] + f' int{bits}':<11}{r['bits_per_weight']:>8.3f}"
                  f"{r['ratio_vs_fp16']:>8.2f}x{r['compress_weights_per_s'] / 1e6:>8.1f}M/s"
                  f"{r['pack_weights_per_s'] / 1e6:>7.0f}M/s"
                  f"{r['unpack_weights_per_s'] / 1e6:>7.0f}M/s{r['peak_mem_ratio']:>8.2f}x"
                  f"{r['rel_error']:>8.3f}{r['gemm_rel_error_vs_fp32']:>9.3f}", flush=True)
    print("throughput in dense weights per second (median of "
          f"{args.repeats}); peak memory of compress+pack relative to the FP16 layer")
    # the default configuration's numbers when packed for its lanes; else no configuration's
    default = AcceleratorConfig()
    stamped = stamp(records, default if args.lanes == default.lanes else None)
    print(f"wrote {write_json(args.out, stamped)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
