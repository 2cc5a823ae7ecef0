"""Co-design sweep: each accelerator's resources and clock against its simulated throughput.

``python -m bench.dse`` sweeps array sizes x {dense-only core, N:M core} x weight widths {4, 8}
x memory bytes/cycle. Every design is synthesised, placed and (unless ``--no-route``) routed for
the ECP5-85F by :func:`hw.synth.synthesize` (out of context, the configuration's own directory
under ``build/synth/``, cached by the generated Verilog), then simulated on the fast model
(timing-only) at the clock it reached:

* a LLaMA-7B-shape decode token (context 128, every linear layer in the point's format, the
  attention products INT8 on the array), as :mod:`bench.scaling` compiles it:
  ``decode_tokens_per_s``;
* a compute-bound layer, the 4096 x 4096 projection on 64 tokens: ``gemm_gmacs``, effective
  (dense-equivalent) multiply-accumulates per second.

A point's ``weight_bits`` is the width of the model's linear weights. Every design supports
INT4 and INT8 (the attention products stream the INT8 KV cache as weights); the N:M core runs
INT4 weights 2:4 sparse, and INT8 weights dense, because the decoder streams INT8 dense only.
The dense-only core is the same accelerator with no sparse pattern (``patterns: []``): no index
fields, no activation selection.

Points run as tasks of Dask distributed: on a ``LocalCluster`` of ``--workers`` processes on this
machine by default, or on the cluster at ``--scheduler ADDRESS``. Each design is one task (the
two weight widths share it) and each point's simulation a task that depends on it, so the
engine runs independent syntheses side by side. Finished points are cached in
``build/dse/<point>.json`` (keyed by the point, the options and the sources), so an interrupted
sweep resumes.

Writes ``bench/results/dse.json`` (with ``--record``; by default under ``build/bench/``)
(``points``, one record per point, and ``comparisons``, N:M
against dense-only per array), ``docs/img/dse_pareto.png``, and, when the sweep covers the
configuration of a committed synthesis record (:data:`hw.synth.RECORDS`), adds that record's
dense-only comparison (``dense_luts``, ``dense_ffs``, ``dense_dsps``,
``throughput_per_lut_ff_vs_dense``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import DOCS as OUTPUT_DOCS
from bench.common import RESULTS, command, parser, stamp, write_json
from hw.config import WEIGHT_BITS, AcceleratorConfig, ConfigError
from hw.format import WeightFormat
from hw.synth import ECP5_85F, RECORDS, keep_record, recorded, synthesize

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "build" / "dse"
#: The compute-bound layer: LLaMA-7B's attention projection on a 64-token prompt chunk.
GEMM = {"n": 4096, "k": 4096, "tokens": 64}
#: Context of the simulated decode token.
DECODE_CONTEXT = 128


class SweepError(RuntimeError):
    """Points of a sweep failed (``failures``: label -> error); the others are cached."""

    def __init__(self, failures: dict[str, str]):
        self.failures = failures
        super().__init__("; ".join(f"{k}: {v}" for k, v in failures.items()))


class SchedulerError(RuntimeError):
    """The Dask scheduler given with ``--scheduler`` cannot be reached."""


@dataclass(frozen=True)
class DesignPoint:
    """One design point: the array, the core, the model's weight width and the memory.

    (Not :class:`sw.codesign.Point`, which is a measured per-layer format assignment.)
    """

    rows: int
    cols: int
    sparse: bool
    weight_bits: int
    bytes_per_cycle: int

    @property
    def array(self) -> str:
        return f"{self.rows}x{self.cols}"

    @property
    def label(self) -> str:
        core = "nm" if self.sparse else "dense"
        return f"{self.array}-{core}-w{self.weight_bits}-b{self.bytes_per_cycle}"

    def config(self, base: AcceleratorConfig) -> AcceleratorConfig:
        """``base`` with this point's array, core and memory beat."""
        return base.replace(
            rows=self.rows, cols=self.cols, patterns=base.patterns if self.sparse else (),
            weight_bits=WEIGHT_BITS,
            memory=dataclasses.replace(base.memory, bytes_per_cycle=self.bytes_per_cycle))

    def weight_format(self, cfg: AcceleratorConfig) -> WeightFormat:
        """The format of the model's linear layers on this point."""
        pattern = "2:4" if self.sparse and self.weight_bits == 4 else "dense"
        return WeightFormat(pattern, self.weight_bits, cfg.group_size)


def sweep_points(arrays: list[tuple[int, int]], weight_bits: list[int],
                 beats: list[int]) -> list[DesignPoint]:
    """Every combination, N:M and dense-only."""
    return [DesignPoint(r, c, sparse, wb, beat) for (r, c) in arrays for beat in beats
            for sparse in (True, False) for wb in weight_bits]


def source_hash() -> str:
    """Hash of the Python sources a point's result depends on (hardware, compiler, models)."""
    h = hashlib.sha256()
    for pkg in ("hw", "sw", "sim"):
        for f in sorted((ROOT / pkg).rglob("*.py")):
            h.update(f.relative_to(ROOT).as_posix().encode() + f.read_bytes())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------- tasks
def synth_design(cfg_json: str, flow: dict) -> dict:
    """Synthesise (place, route) one design; the record of :func:`hw.synth.synthesize`
    (``flow``: its ``route``, ``pnr``, ``seed`` and ``time_limit_min``)."""
    return synthesize(AcceleratorConfig.from_json(cfg_json), verbose=False, **flow)


def simulate(point: DesignPoint, cfg_json: str) -> dict:
    """Cycles of the decode token and of the compute-bound layer on the fast model."""
    # Imported here, in the worker: torch and the compiler load only in the processes that
    # simulate, not in the client or in workers that only run synthesis.
    from bench.scaling import run_step
    from sim.model import FastModel
    from sw.compile.layers import build_linear
    cfg = AcceleratorConfig.from_json(cfg_json)
    fmt = point.weight_format(cfg)
    timing = cfg.timing_only()
    t0 = time.perf_counter()
    decode = run_step(timing, fmt, "decode", 1, DECODE_CONTEXT).cycles
    lp = build_linear(timing, fmt, GEMM["n"], GEMM["k"], GEMM["tokens"])
    gemm = FastModel(timing).run(lp.words, timing_only=True).cycles
    return {"weight_format": str(fmt.pattern) + f" INT{fmt.bits}", "decode_cycles": decode,
            "gemm_cycles": gemm, "sim_s": time.perf_counter() - t0}


def point_record(point: DesignPoint, synth: dict, sim: dict, clock_mhz: float) -> dict:
    """The dse.json record of one point (``pareto`` is filled in over the whole sweep)."""
    placed = synth["fmax_after"] != "none"
    clock = synth["fmax_mhz"] if placed else clock_mhz
    macs = GEMM["n"] * GEMM["k"] * GEMM["tokens"]
    return {
        "array": point.array, "sparse": point.sparse, "weight_bits": point.weight_bits,
        "bytes_per_cycle": point.bytes_per_cycle, "label": point.label,
        "luts": synth["luts"], "ffs": synth["ffs"], "dsps": synth["dsps"],
        "brams": synth["brams"], "fits": synth["fits"],
        "fmax_mhz": synth["fmax_mhz"] if placed else None, "fmax_after": synth["fmax_after"],
        "clock_mhz": clock,
        "decode_tokens_per_s": clock * 1e6 / sim["decode_cycles"],
        "gemm_gmacs": macs / sim["gemm_cycles"] * clock / 1e3,
        "pareto": False,
        "weight_format": sim["weight_format"], "decode_cycles": sim["decode_cycles"],
        "gemm_cycles": sim["gemm_cycles"], "gemm_macs": macs,
        "critical_path_from": synth.get("critical_path_from"),
        "critical_path_to": synth.get("critical_path_to"),
        "synth_s": synth.get("total_s"), "sim_s": sim["sim_s"],
    }


def evaluate(point: DesignPoint, cfg_json: str, synth: dict, cache: str) -> dict:
    """Simulate ``point`` on its synthesised design and cache the record in ``cache``."""
    cfg = AcceleratorConfig.from_json(cfg_json)
    rec = stamp(point_record(point, synth, simulate(point, cfg_json), cfg.clock_mhz), cfg)
    write_json(Path(cache), rec)
    return rec


# ---------------------------------------------------------------------------- analysis
def pareto(records: list[dict], cost: str, gain: str) -> set[str]:
    """Labels of the fitting points no other fitting point beats on ``cost`` (lower) and
    ``gain`` (higher) at once (dominance as :func:`sw.codesign.pareto_front`)."""
    from sw.codesign import pareto_front
    fit = [r for r in records if r["fits"]]
    return {r["label"] for r in pareto_front(fit, lambda r: (r[cost], -r[gain]))}


def comparisons(records: list[dict]) -> list[dict]:
    """N:M against dense-only on the same array, memory and INT4 weights (at each design's own
    clock): the cost of the sparse core and its effective throughput per (LUT + FF)."""
    out = []
    for s in records:
        if not s["sparse"] or s["weight_bits"] != 4:
            continue
        d = next((r for r in records if not r["sparse"] and r["weight_bits"] == 4
                  and r["array"] == s["array"] and r["bytes_per_cycle"] == s["bytes_per_cycle"]),
                 None)
        if d is None:
            continue
        per = [r["gemm_gmacs"] / (r["luts"] + r["ffs"]) for r in (s, d)]
        out.append({"array": s["array"], "bytes_per_cycle": s["bytes_per_cycle"],
                    "luts": s["luts"], "ffs": s["ffs"], "dsps": s["dsps"],
                    "dense_luts": d["luts"], "dense_ffs": d["ffs"], "dense_dsps": d["dsps"],
                    "lut_ratio": s["luts"] / d["luts"], "ff_ratio": s["ffs"] / d["ffs"],
                    "gemm_gmacs": s["gemm_gmacs"], "dense_gemm_gmacs": d["gemm_gmacs"],
                    "clock_mhz": s["clock_mhz"], "dense_clock_mhz": d["clock_mhz"],
                    "throughput_per_lut_ff_vs_dense": per[0] / per[1]})
    return out


def plot(records: list[dict], path: Path) -> Path:
    """Decode tokens/s and GEMM GMAC/s against LUTs and against DSPs, Pareto fronts drawn."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 8.5))
    for row, (gain, gname) in enumerate((("decode_tokens_per_s", "LLaMA-7B decode tokens/s"),
                                         ("gemm_gmacs", "4096x4096x64 GEMM, effective GMAC/s"))):
        for col, (cost, cname) in enumerate((("luts", "LUT4 sites"), ("dsps", "MULT18X18D"))):
            ax = axes[row][col]
            for r in records:
                color = "tab:blue" if r["weight_bits"] == 4 else "tab:orange"
                marker = "o" if r["fits"] else "x"
                ax.scatter(r[cost], r[gain], marker=marker, s=50, color=color,
                           facecolors=color if r["sparse"] else "none")
                ax.annotate(f"{r['array']} b{r['bytes_per_cycle']}", (r[cost], r[gain]),
                            fontsize=7, xytext=(4, 3), textcoords="offset points")
            front = sorted((r for r in records if r["label"] in pareto(records, cost, gain)),
                           key=lambda r: r[cost])
            ax.step([r[cost] for r in front], [r[gain] for r in front], where="post",
                    color="gray", lw=1, ls="--", label="Pareto front")
            ax.axvline(ECP5_85F[cost], color="red", lw=0.8, label="ECP5-85F capacity")
            ax.set_xlabel(cname)
            ax.set_ylabel(gname)
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], marker="o", ls="", color="k", label="N:M core (filled)"),
               plt.Line2D([], [], marker="o", ls="", color="k", markerfacecolor="none",
                          label="dense-only core (hollow)"),
               plt.Line2D([], [], marker="o", ls="", color="tab:blue", label="INT4 weights"),
               plt.Line2D([], [], marker="o", ls="", color="tab:orange", label="INT8 weights"),
               plt.Line2D([], [], marker="x", ls="", color="k", label="does not fit the 85F"),
               plt.Line2D([], [], color="gray", ls="--", label="Pareto front"),
               plt.Line2D([], [], color="red", label="ECP5-85F capacity")]
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=8)
    clocks = sorted({r["fmax_after"] for r in records})
    fig.suptitle("Co-design sweep on the ECP5-85F: each point at its own clock "
                 f"(Fmax after {', '.join(clocks)})")
    fig.tight_layout(rect=(0, 0.07, 1, 0.96))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def update_synth_record(comps: list[dict], base: AcceleratorConfig,
                        path: Path | None = None) -> bool:
    """Add the dense-only comparison to the committed synthesis record
    (:data:`hw.synth.RECORDS`) of each of the sweep's N:M designs that has one, with the same
    configuration; returns whether it added any."""
    added = False
    for c in comps:
        rows, cols = (int(x) for x in c["array"].split("x"))
        cfg = DesignPoint(rows, cols, True, 4, c["bytes_per_cycle"]).config(base)
        rec = recorded(cfg, path)
        if rec is not None and rec["config"] == json.loads(cfg.to_json()):
            rec.update({k: c[k] for k in ("dense_luts", "dense_ffs", "dense_dsps",
                                          "throughput_per_lut_ff_vs_dense")})
            keep_record(rec, path)
            added = True
    return added


# ---------------------------------------------------------------------------- command line
def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise ValueError(f"{what} must be a comma-separated list of integers, got {text!r}") \
            from None


def _arrays(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        try:
            r, c = (int(x) for x in part.lower().split("x"))
        except ValueError:
            raise ValueError(f"--arrays: each array must look like 4x16, got {part!r}") from None
        out.append((r, c))
    return out


def _client(scheduler: str | None, workers: int):
    from dask.distributed import Client, LocalCluster
    if scheduler:
        try:
            return Client(scheduler, timeout="10s"), None
        except (OSError, TimeoutError) as e:
            raise SchedulerError(f"cannot reach the Dask scheduler at {scheduler!r}: "
                                 f"{str(e).splitlines()[0]}") from None
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                           dashboard_address=None)
    return Client(cluster), cluster


def run_sweep(points: list[DesignPoint], base: AcceleratorConfig, *, route: bool = True,
              pnr: bool = True, time_limit_min: float = 60, seed: int = 1,
              scheduler: str | None = None, workers: int = 2,
              progress: bool = True) -> list[dict]:
    """Synthesise and simulate ``points`` on Dask; returns their records (``pareto``: on the
    LUT - decode tokens/s front). Cached points are not run again."""
    from dask.distributed import as_completed
    from tqdm.auto import tqdm
    flow = {"route": route, "pnr": pnr, "seed": seed, "time_limit_min": time_limit_min}
    opts = json.dumps({**flow, "src": source_hash(), "base": base.to_json()}, sort_keys=True)
    done, todo = {}, []
    for p in points:
        key = hashlib.sha256((p.label + opts).encode()).hexdigest()[:12]
        cache = CACHE / f"{p.label}-{key}.json"
        if cache.exists():
            done[p] = json.loads(cache.read_text())
        else:
            todo.append((p, cache))
    designs: dict[str, object] = {}
    failed: dict[str, str] = {}
    if todo:
        client, cluster = _client(scheduler, workers)
        try:
            futures = []
            # Largest designs first (they bound the sweep's wall time): workers take tasks as
            # they are submitted, so the order matters as much as the priority.
            todo.sort(key=lambda pc: -pc[0].rows * pc[0].cols)
            for p, cache in todo:
                cfg_json = p.config(base).to_json()
                if cfg_json not in designs:
                    designs[cfg_json] = client.submit(synth_design, cfg_json, flow, pure=False,
                                                      priority=p.rows * p.cols,
                                                      key=f"synth-{p.array}-"
                                                          f"{'nm' if p.sparse else 'dense'}"
                                                          f"-b{p.bytes_per_cycle}")
                futures.append(client.submit(evaluate, p, cfg_json, designs[cfg_json],
                                             str(cache), pure=False, key=f"point-{p.label}",
                                             priority=p.rows * p.cols))
            bar = tqdm(total=len(futures), desc="dse points", disable=not progress)
            for fut in as_completed(futures):
                p = todo[futures.index(fut)][0]
                if fut.status == "error":  # the other points go on (and stay cached)
                    failed[p.label] = f"{type(fut.exception()).__name__}: {fut.exception()}"
                else:
                    done[p] = fut.result()
                bar.set_postfix_str(f"{p.label}: {'failed' if p.label in failed else 'done'}")
                bar.update()
            bar.close()
        finally:
            client.close()
            if cluster is not None:
                cluster.close()
    if failed:
        raise SweepError(failed)
    records = [done[p] for p in points]
    front = pareto(records, "luts", "decode_tokens_per_s")
    for r in records:
        r["pareto"] = r["label"] in front
    return records


@command("bench.dse")
def main(argv: list[str] | None = None) -> int:
    ap = parser("python -m bench.dse", __doc__)
    ap.add_argument("--arrays", default="2x4,2x8,4x8", help="arrays, ROWSxCOLS,...")
    ap.add_argument("--weight-bits", default=",".join(map(str, WEIGHT_BITS)),
                    help=f"weight widths of the model (of {WEIGHT_BITS})")
    ap.add_argument("--beats", default="16", help="memory bytes per cycle, comma-separated")
    ap.add_argument("--config", help="base configuration JSON whose array, core and memory "
                                     "beat the sweep varies; none: AcceleratorConfig()")
    ap.add_argument("--no-route", action="store_true",
                    help="stop each design after placement (nextpnr's timing estimate)")
    ap.add_argument("--no-pnr", action="store_true",
                    help="resources from Yosys only; per-second figures at the configuration's "
                         "clock")
    ap.add_argument("--time-limit", type=float, default=60, metavar="MIN",
                    help="place-and-route limit per design, minutes (0: none)")
    ap.add_argument("--seed", type=int, default=1, help="nextpnr placement seed")
    ap.add_argument("--workers", type=int, default=2,
                    help="worker processes of the local Dask cluster")
    ap.add_argument("--scheduler", metavar="ADDRESS",
                    help="address of a running Dask scheduler; none: a LocalCluster here")
    ap.add_argument("--out", default=str(RESULTS / "dse.json"), help="result JSON")
    ap.add_argument("--plot", default=str(OUTPUT_DOCS / "img" / "dse_pareto.png"),
                    help="Pareto plot")
    args = ap.parse_args(argv)
    try:
        arrays = _arrays(args.arrays)
        wbits = _ints(args.weight_bits, "--weight-bits")
        beats = _ints(args.beats, "--beats")
        if bad := [b for b in wbits if b not in WEIGHT_BITS]:
            raise ValueError(f"--weight-bits must be among {WEIGHT_BITS}, got {bad[0]}")
        if args.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {args.workers}")
        if not args.time_limit >= 0:
            raise ValueError(f"--time-limit must be >= 0, got {args.time_limit:g}")
        base = AcceleratorConfig.load(args.config) if args.config else AcceleratorConfig()
        points = sweep_points(arrays, wbits, beats)
        for p in points:
            p.weight_format(p.config(base)).check_supported(p.config(base))
    except (ValueError, ConfigError, OSError, TypeError) as e:
        print(f"bench.dse: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        records = run_sweep(points, base, route=not args.no_route, pnr=not args.no_pnr,
                            time_limit_min=args.time_limit, seed=args.seed,
                            scheduler=args.scheduler, workers=args.workers)
    except SchedulerError as e:
        print(f"bench.dse: {e}", file=sys.stderr)
        return 2
    except SweepError as e:
        for label, err in e.failures.items():
            print(f"bench.dse: point {label} failed: {err.splitlines()[0]}", file=sys.stderr)
        print(f"bench.dse: {len(e.failures)} of {len(points)} points failed; the others are "
              f"cached in {CACHE} (nothing written)", file=sys.stderr)
        return 1
    wall = time.perf_counter() - t0
    comps = comparisons(records)
    print(f"{'point':<22} {'LUTs':>7} {'FFs':>7} {'DSP':>4} {'BRAM':>4} {'fits':>5} "
          f"{'MHz':>6} {'after':>9} {'decode tok/s':>12} {'GMAC/s':>7} pareto")
    for r in records:
        print(f"{r['label']:<22} {r['luts']:>7} {r['ffs']:>7} {r['dsps']:>4} {r['brams']:>4} "
              f"{r['fits']!s:>5} {r['clock_mhz']:>6.1f} {r['fmax_after']:>9} "
              f"{r['decode_tokens_per_s']:>12.2f} {r['gemm_gmacs']:>7.2f} "
              f"{'*' if r['pareto'] else ''}")
    for c in comps:
        print(f"{c['array']} b{c['bytes_per_cycle']}: N:M core {c['lut_ratio']:.2f}x the LUTs, "
              f"{c['ff_ratio']:.2f}x the FFs of dense-only; effective GMAC/s per (LUT+FF) at "
              f"2:4: {c['throughput_per_lut_ff_vs_dense']:.2f}x")
    # the sweep's base configuration at the top; each point names its own (stamped when
    # measured, kept in the point cache)
    out = write_json(Path(args.out), stamp({"points": records, "comparisons": comps,
                                            "wall_s": wall, "route": not args.no_route,
                                            "pnr": not args.no_pnr}, base))
    print(f"written {out} and {plot(records, Path(args.plot))} ({wall / 60:.1f} min)")
    if args.record and update_synth_record(comps, base):
        print(f"added the dense-only comparison to {RECORDS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
