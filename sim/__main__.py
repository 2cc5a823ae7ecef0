"""``python -m sim``: run a linear layer on the fast model and report how the machine spent its
cycles.

Examples
--------
``python -m sim --layer 4096x4096 --pattern 2:4 --tokens 1 --trace decode.json``
``python -m sim --layer 512x512 --tokens 64 --values --rtl``   (also on the Verilator RTL)

The trace opens in ui.perfetto.dev (one track per engine).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from hw.cli import OneLineParser, command
from hw.config import WEIGHT_BITS, AcceleratorConfig, ConfigError, NMPattern
from hw.engines import engines_of
from hw.format import (
    FormatError,
    WeightFormat,
    random_quantized,
    storage_warning,
    stream_layout,
)
from hw.numerics import gemm_acc
from sim.equivalence import compare_results
from sim.model import FastModel
from sim.roofline import bound_cycles
from sim.rtl import RTLBackend
from sim.trace import write_trace
from sw.compile.errors import LoweringError
from sw.compile.layers import build_linear
from sw.compile.tiling import stream_bytes


def _shape(text: str) -> tuple[int, int]:
    try:
        n, k = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"layer must look like 4096x4096 (out x in), got "
                                         f"{text!r}") from None
    if n < 1 or k < 1:
        raise argparse.ArgumentTypeError(f"layer dimensions must be positive, got {text!r}")
    return n, k


def report(cfg: AcceleratorConfig, r, lp, fmt: WeightFormat, seconds: float) -> str:
    """Human-readable summary of one run."""
    plan = lp.plan
    c = r.counters
    cyc = r.cycles
    lines = [f"{plan.tokens} tokens x {plan.k_padded} -> {plan.n} ({fmt.pattern} int{fmt.bits} "
             f"g{fmt.group}) on {cfg.rows}x{cfg.cols} = {cfg.lanes} lanes, "
             f"{cfg.dram_bytes_per_cycle:g} B/cycle, {cfg.clock_mhz:g} MHz",
             f"program: {len(lp.program)} instructions, {plan.n_tiles} n-tiles x "
             f"{plan.k_chunks} K-chunks x {plan.token_tiles} token tiles "
             f"({'resident' if plan.resident_acts else 'chunked'} activations)",
             f"cycles: {cyc:,} = {cyc / cfg.clock_mhz:,.1f} us "
             f"({plan.tokens / (cyc / (cfg.clock_mhz * 1e6)):,.1f} tokens/s)   "
             f"[simulated in {seconds * 1e3:.1f} ms]",
             f"{'engine':<10}{'busy':>12}{'waiting':>12}{'idle':>12}"]
    for spec in engines_of(cfg):
        e, busy, wait = spec.name, c[spec.exec_counter], c[spec.wait_counter]
        lines.append(f"{e:<10}{busy / cyc:>11.1%}{wait / cyc:>12.1%}"
                     f"{(cyc - busy - wait) / cyc:>12.1%}")
    read = c["dram_read_beats"] * cfg.beat_bytes
    write = c["dram_write_beats"] * cfg.beat_bytes
    wbytes = stream_layout(fmt, plan.n, plan.k_padded, cfg.lanes).total_bytes
    macs = plan.tokens * plan.n * fmt.steps(plan.k_padded)
    bound = bound_cycles(cfg, wbytes + plan.tokens * plan.k_padded, plan.tokens * plan.n * 4,
                         macs)
    lines += [f"utilisation (array MAC cycles / cycles): {r.utilisation:.1%}",
              f"DRAM: read {read:,} B, written {write:,} B, achieved "
              f"{read / cyc:.2f} B/cycle = {read / cyc * cfg.clock_mhz / 1e3:.2f} GB/s "
              f"({read / cyc / cfg.dram_bytes_per_cycle:.1%} of the read channel)",
              f"roofline bound {bound:,.0f} cycles -> {bound / cyc:.1%} of the bound",
              f"fetch stalls on full queues: {c['fetch_stall']:,} cycles"]
    return "\n".join(lines)


@command("python -m sim")
def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(prog="python -m sim", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    # argparse converts a string default with ``type`` and fills in %(default)s: each
    # default is written once
    ap.add_argument("--layer", type=_shape, default="4096x4096",
                    help="the layer as OUTxIN (default: %(default)s)")
    ap.add_argument("--tokens", type=int, default=1,
                    help="activation rows: 1 is a decode GEMV, more a prefill GEMM "
                    "(default: %(default)s)")
    ap.add_argument("--pattern", default="2:4",
                    help="N:M sparsity of the weights, or 'dense' (default: %(default)s)")
    ap.add_argument("--bits", type=int, default=4, choices=WEIGHT_BITS,
                    help="weight bits (default: %(default)s)")
    ap.add_argument("--group", type=int, default=128,
                    help="quantisation group along K, 0 = whole row (default: %(default)s)")
    ap.add_argument("--config", type=Path,
                    help="accelerator configuration JSON (default: the built-in one)")
    ap.add_argument("--values", action="store_true",
                    help="random weights and activations; check the result against the golden "
                         "numerics (full mode; default: timing only)")
    ap.add_argument("--rtl", action="store_true",
                    help="also run on the Verilator RTL and compare everything (implies "
                    "--values; default: off)")
    ap.add_argument("--trace", type=Path,
                    help="write a Perfetto/Chrome trace JSON (default: none)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the random weights and activations (default: %(default)s)")
    args = ap.parse_args(argv)
    if args.tokens < 1:
        print(f"python -m sim: --tokens must be >= 1, got {args.tokens}", file=sys.stderr)
        return 2
    if args.trace is not None and args.trace.is_dir():
        print(f"python -m sim: --trace {args.trace}: is a directory (give a file name)",
              file=sys.stderr)
        return 2
    try:
        cfg = AcceleratorConfig.load(args.config) if args.config else AcceleratorConfig()
    except ConfigError as e:
        print(f"python -m sim: --config {e}", file=sys.stderr)
        return 2
    try:
        fmt = WeightFormat(NMPattern.parse(args.pattern), args.bits, args.group)
        n, k = args.layer
        note = storage_warning(fmt, n, k, cfg.lanes)
        if note:
            print(f"note: {note}")
        w = a = None
        if args.values or args.rtl:
            lay = stream_layout(fmt, n, k, cfg.lanes)
            need = (stream_bytes(lay, cfg.beat_bytes)
                    + args.tokens * (lay.k_padded + 16 + 4 * n) + (1 << 16))
            if need > cfg.memory.size_bytes:  # grow the simulated DRAM to fit the layer
                size = 1 << (need - 1).bit_length()
                cfg = cfg.with_dram(size)
            rng = np.random.default_rng(args.seed)
            w = random_quantized(fmt, (n, k), rng)
            a = rng.integers(-127, 128, size=(args.tokens, k)).astype(np.int8)
        else:  # timing-only: addresses only need to be legal
            cfg = cfg.timing_only()
        lp = build_linear(cfg, fmt, n, k, args.tokens, w, a)
        if len(lp.program) > cfg.imem_depth:
            cfg = cfg.replace(imem_depth=1 << (len(lp.program) - 1).bit_length())
    except (ConfigError, FormatError, LoweringError, ValueError) as e:
        print(f"python -m sim: {e}", file=sys.stderr)
        return 2
    model = FastModel(cfg)
    t0 = time.perf_counter()
    r = model.run(lp.program, lp.dram, timing_only=not (args.values or args.rtl),
                  trace=args.trace is not None)
    seconds = time.perf_counter() - t0
    if not r.ok:
        print(f"run stopped with {r.error.name} at cycle {r.cycles}: {r.detail}")
        return 1
    print(report(cfg, r, lp, fmt, seconds))
    status = 0
    if w is not None:
        ref = gemm_acc(np.pad(a, ((0, 0), (0, w.k_padded - k))), w.int_weight())
        ok = np.array_equal(lp.read_output(r.dram), ref)
        print(f"values vs golden numerics: {'PASS' if ok else 'FAIL'}")
        status |= 0 if ok else 1
    if args.rtl:
        rtl = RTLBackend(cfg)
        t0 = time.perf_counter()
        rr = rtl.run(lp.program, lp.dram)
        diff = compare_results(r, rr)
        print(f"RTL: {rr.cycles:,} cycles in {time.perf_counter() - t0:.2f} s -> "
              f"{'identical to the model (values, cycles, counters)' if diff is None else diff}")
        status |= 0 if diff is None else 1
    if args.trace:
        write_trace(args.trace, lp.program, r.trace, cfg)
        print(f"wrote {args.trace} (open in ui.perfetto.dev)")
    return status


if __name__ == "__main__":
    sys.exit(main())
