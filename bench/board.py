"""The ECPIX-5 board: predicted decode tokens/s against the memory roofline, and the build.

``python -m bench.board`` predicts, for each model of --models, the accelerator's decode
tokens/s on the ECPIX-5 (:data:`hw.board.ecpix5.ECPIX5`, or another board of
hw.board.ecpix5.BOARDS with --board: ecpix5-85f-sys50 is the same board with its sys clock at
50 MHz, memory and accelerator alike) and compares them with the memory roofline; it gathers
the bitstream build's figures when a build report is there.

The board's memory (sim.board_memory): LiteDRAM's controller for the board's DDR3, with its
PHY's settings and LiteDRAM's behavioural PHY, simulated in Migen through a native port of the
board's width with the chip's tRFC as a time (Board.sdram_trfc_ns, as the generated core has
it), through a port half as wide (LiteDRAM's port converter in between), and through the
board's port with LiteDRAM's table's tRFC instead (memory clocks of DDR3-1600, which the
controller keeps at this board's slower memory clock): idle read latency, sequential read
rate over whole refresh intervals, row-miss rate. Measured once (minutes; --measure-memory),
recorded in board_memory.json and read from there.

The prediction, per model and measured memory:
  1. the fast model (sim.model) runs one decode step at --context positions, compiled from the
     model's graph with its default recipe (sw.models.recipes) or the format after '@', on the
     accelerator with the board's memory (ECPIX5.accelerator_config of --config, by default
     the board's own ECPIX5.base_config, the configuration its bitstream is built for: one
     beat of the port's bytes per sys cycle, the contract's read latency, longer than the
     measured idle latency): C cycles, R DRAM reads and W DRAM writes (beats);
  2. the board's bridge stops the whole accelerator whenever the memory is late
     (hw/board/__init__.py), so every beat the memory delivers slower than the port asks
     costs cycles on top of C: with t = beat / measured sequential bytes per cycle,
     cycles = C + R * max(0, t - s) + W * t (sim.board_memory.board_cycles), s the fewest
     cycles between two read requests (hw.timing.read_request_spacing: 1 on the unpaced
     port); tokens/s = sys clock / cycles. This charges every read at the sustained rate of
     a sequential stream (refresh and a sequential stream's row changes included): exact for
     back-to-back streams, pessimistic where the accelerator computes between beats (the
     memory then keeps up). A write may come in the same cycle as a read (the LOAD and
     STORE engines run side by side, the memory has one port for both), so each is charged
     its whole t. Not modelled: row misses from switching between streams (weights,
     activations, KV cache; the row-miss rate bounds them: 'all row misses' column), host
     work.
The memory roofline is (packed weight bytes + KV-cache bytes read per token) / the board's
peak bytes per second: the linears' packed weight streams and the KV cache of the executable's
layout (stream_bytes), the same on every configuration of the same lanes; what else a
configuration reads (the vector engine's constants and tables, activations) is its own cost.

The figures are the accelerator's alone: on a configuration without the vector engine the host
still runs norms, softmax, rotary embedding and the LM head between programs, over the UART
(sw.runtime). The host's work is reported apart, as its estimated cycles on an on-chip vector
unit (sw.runtime.costs); the UART's traffic is not modelled. The same prediction on
--vector-config (default: the 'vector' preset), for --vector-models, is the persistent
program's: the host ops on the vector engine, the step's programs fused and joined into one
per token, a model whose joined step does not fit the instruction memory (SmolLM2) running its
decoder blocks as one loop, only the LM head on the host; at the board's clock whatever clock
that configuration's own design reaches (docs/board.md says which bitstream could run it).
Its DRAM port is paced at the memory's peak (Board.accelerator_config(..., paced=True): a beat
every port bytes // peak bytes per sys cycle = 2 cycles, hw.config.MemoryModel.cycles_per_beat),
so the accelerator computes while the beats come in and the bridge stops it only for the
memory's shortfall below the peak (s = 2 above). The board's configuration (--config) stays
unpaced: its bitstream is built for it.

Writes board.json (bench/results/ with --record, else build/bench/results/; for another
board than the ECPIX-5 at 75 MHz board_<board>.json, its memory board_memory_<board>.json and
its page board_performance_<board>.md, record_names) with board,
config, predicted_tokens_per_s (the board's port) and roofline_tokens_per_s per model,
predicted_tokens_per_s_by_memory (every measured memory), the details,
and the build's fields (clocks, seeds_met, luts, ffs, dsps, brams, bitstream_bytes, build_s)
from --build-report or bitstreams/<board>/<config fingerprint>/report.json, null when there
is none; and, with --sim, the board simulation's fields: the reference model, compressed with
its recipe's formats (RTN, for speed), generates --sim-tokens tokens on the board's RTL under
Verilator (hw/board/sim_top.py: the bridged accelerator and the host link, LiteDRAM's ports
modelled with random latencies and refresh stalls) through sim.board.BoardLink over a link that
corrupts and drops bytes (--sim-faults), and on the fast model: sim_tokens_match (the same
tokens), sim_cycles_equal_model (every program's accelerator cycles equal, and the final DRAM
images), frames_injected and frames_recovered; without --sim they are kept, with their stamp
(sim_provenance), from the record there of the same board configuration, else null. The
persistent program's prediction is the record's 'persistent' section (its configuration's
stamp, predicted and roofline tokens/s, fraction of the roofline, programs per token, the
details, and the build's fields from bitstreams/<board>/<its fingerprint>/report.json, null
when there is none). Also writes board_performance.md (docs/ with --record).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import (
    DOCS,
    RESULTS,
    ROOT,
    command,
    parser,
    positive_int,
    provenance,
    recorded,
    stamp,
    write_json,
)
from hw.board.ecpix5 import ECPIX5, Board, board_named, boards_help
from hw.cli import write_text_atomic
from hw.config import AcceleratorConfig, ConfigError, named_or_file
from hw.format import FormatError, WeightFormat
from hw.timing import read_request_spacing
from sim.backends import make_backend
from sim.board import BoardLink, FaultyTransport
from sim.board_backend import BoardBackend
from sim.board_memory import (
    MemoryMeasureError,
    MemoryTiming,
    board_cycles,
    controller_bits,
    timing_key,
)
from sim.board_memory import measure as measure_memory
from sim.board_sim import BoardSim
from sw.codesign import decode_step
from sw.compile import CompileOptions, Executable, compile_model, symbols
from sw.compress.model import compress_llama, selected_linears
from sw.models.recipes import recipe_for
from sw.models.source import BUILTINS, ModelSourceError, open_model
from sw.runtime import Runtime

__all__ = ["MODELS", "VECTOR_MODELS", "BUILD_FIELDS", "SIM_FIELDS", "SIM_DETAILS", "ModelSpec",
           "record_names", "variants", "memory_timings", "stream_bytes", "predict",
           "build_report_path", "build_fields", "kept_sim", "simulate_board", "main"]

#: The models predicted by default: each built-in with its recipe, and SmolLM2 in 2:4 INT4.
MODELS = ("reference", "smollm2", "smollm2@2:4-int4")
#: The build's fields of board.json, read from the bitstream build's report.
BUILD_FIELDS = ("clocks", "seeds_met", "luts", "ffs", "dsps", "brams", "bitstream_bytes",
                "build_s")
#: The models whose one program per decode step is predicted by default (--vector-models).
VECTOR_MODELS = ("reference", "smollm2")
#: The board simulation's fields of board.json (:func:`simulate_board`).
SIM_FIELDS = ("sim_tokens_match", "sim_cycles_equal_model", "frames_injected",
              "frames_recovered")
#: What else :func:`simulate_board` records of the run.
SIM_DETAILS = ("sim_programs", "sim_tokens", "sim_faults", "sim_memory_stall_cycles",
               "sim_dram_words_written", "sim_dram_words_read")
#: The prompt of the board simulation (--sim).
SIM_PROMPT = "class Stack:\n    def push(self, item"
#: The record's file name, of :data:`hw.board.ecpix5.ECPIX5` (:func:`record_names`).
RECORD_FILE = "board.json"
#: The memory record's file name (beside board.json).
MEMORY_FILE = "board_memory.json"
#: The generated page's file name.
PAGE_FILE = "board_performance.md"


def record_names(board: Board) -> tuple[str, str, str]:
    """The file names of ``board``'s record, memory measurement and page: :data:`RECORD_FILE`,
    :data:`MEMORY_FILE` and :data:`PAGE_FILE` for :data:`hw.board.ecpix5.ECPIX5`, each with
    ``_<board name>`` before its suffix for another board (a variant never overwrites the
    board's records).

    >>> from hw.board.ecpix5 import ECPIX5_SYS50
    >>> record_names(ECPIX5)
    ('board.json', 'board_memory.json', 'board_performance.md')
    >>> record_names(ECPIX5_SYS50)[0]
    'board_ecpix5-85f-sys50.json'
    """
    names = (RECORD_FILE, MEMORY_FILE, PAGE_FILE)
    if board == ECPIX5:
        return names
    return tuple(f"{Path(n).stem}_{board.name}{Path(n).suffix}" for n in names)


@dataclass(frozen=True)
class ModelSpec:
    """One entry of --models: a built-in model and, after ``@``, one format for every layer
    compression selects (default: the model's recipe)."""

    model: str
    fmt: WeightFormat | None = None

    @classmethod
    def parse(cls, text: str) -> ModelSpec:
        """``NAME`` or ``NAME@FORMAT``; a ValueError names a bad one."""
        name, _, fmt = text.strip().partition("@")
        if name not in BUILTINS:
            raise ValueError(f"model {name!r}: choose one of {', '.join(BUILTINS)}")
        try:
            return cls(name, WeightFormat.parse(fmt) if fmt else None)
        except FormatError as e:
            raise ValueError(f"{text!r}: {e}") from None

    def __str__(self) -> str:
        return self.model + (f"@{self.fmt.name}" if self.fmt else "")


def _models(text: str) -> tuple[ModelSpec, ...]:
    """``type=`` of --models: comma-separated :class:`ModelSpec` entries."""
    try:
        specs = tuple(ModelSpec.parse(t) for t in text.split(",") if t.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    if not specs:
        raise argparse.ArgumentTypeError(f"no model in {text!r}")
    return specs


# ---------------------------------------------------------------------- the memory
def variants(board: Board) -> list[tuple[int, float | None]]:
    """The (port width, tRFC) measured: the board's port with the board's tRFC (its generated
    core's, :attr:`~hw.board.ecpix5.Board.sdram_trfc_ns`) first; a port half as wide, through
    LiteDRAM's port converter (why the board's port has the controller's width); and the
    controller's width with LiteDRAM's table's tRFC (None), what the core would have without
    the board's."""
    native = controller_bits(board)
    trfc = board.sdram_trfc_ns
    return list(dict.fromkeys([(board.port_bits, trfc), (board.port_bits // 2, trfc),
                               (native, None)]))


def board_key(board: Board) -> str:
    """The :attr:`~sim.board_memory.MemoryTiming.key` of the board's own memory (the first of
    :func:`variants`)."""
    return timing_key(*variants(board)[0])


def memory_timings(path: Path, board: Board, remeasure: bool, log=print
                   ) -> dict[str, MemoryTiming]:
    """The board's memory for each of :func:`variants`, by :attr:`MemoryTiming.key`: read
    from ``path`` (or, for the default output path, its recorded copy) when it holds a record
    of each on this board and LiteDRAM, else measured now and written to ``path``."""
    wanted = variants(board)
    if not remeasure:
        for candidate in dict.fromkeys((path, recorded(path))):
            if candidate.is_file():
                rows = json.loads(candidate.read_text()).get("ports", [])
                try:
                    found = [MemoryTiming.from_dict(r) for r in rows]
                except MemoryMeasureError:
                    continue
                out = {}
                for w, trfc in wanted:
                    out.update({t.key: t for t in found if t.matches(board, w, trfc)})
                if len(out) == len(wanted):
                    log(f"memory: the measurement in {_rel(candidate)}")
                    return out
    out = {}
    for w, trfc in wanted:
        what = f"the {w}-bit port" + (f", tRFC {trfc:g} ns," if trfc else "")
        log(f"memory: measuring {what} on LiteDRAM's controller (Migen, minutes)")
        t0 = time.perf_counter()
        t = measure_memory(board, w, trfc_ns=trfc)
        out[t.key] = t
        log(f"  {time.perf_counter() - t0:.0f} s: latency {t.read_latency} cycles, "
            f"sequential {t.sequential_bytes_per_cycle:.3f} B/cycle")
    write_json(path, stamp({"board": board.name, "ports": [t.to_dict() for t in out.values()]},
                           None))
    log(f"wrote {_rel(path)}")
    return out


def _rel(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


# ---------------------------------------------------------------------- the prediction
def stream_bytes(exe: Executable) -> tuple[int, int]:
    """The bytes of ``exe``'s packed weight streams and of its KV cache: what a decode step
    reads at least, whatever runs the host ops. A block loop's frames hold the same regions
    (their copies of constants, ``symbol@frame``, are no weight or cache region)."""
    prefix = symbols.weights("")
    regions = [(name, r) for name, r in exe.symbols.items() if "@" not in name]
    return (sum(r.nbytes for name, r in regions if name.startswith(prefix)),
            sum(r.nbytes for _, r in regions if r.kind == "kv"))


def predict(spec: ModelSpec, base: AcceleratorConfig, board: Board,
            timings: dict[str, MemoryTiming], context: int, paced: bool = False
            ) -> dict[str, Any]:
    """One model's prediction (module docstring) for each memory of ``timings`` (by
    :attr:`~sim.board_memory.MemoryTiming.key`), on ``base`` with the board's memory,
    its DRAM port paced at the memory's peak where ``paced``
    (:meth:`~hw.board.ecpix5.Board.accelerator_config`).

    Raises
    ------
    ModelSourceError
        The model cannot be loaded (SmolLM2 not installed).
    ValueError
        ``context`` beyond the model's positions (named).
    """
    src = open_model(spec.model)
    lm = src.model
    if not 2 <= context <= lm.config.max_position_embeddings:
        raise ValueError(f"--context {context}: {spec.model} has "
                         f"{lm.config.max_position_embeddings} positions")
    layers = selected_linears(lm)
    formats = ({n: spec.fmt for n in layers} if spec.fmt
               else recipe_for(spec.model).formats(layers))
    names = sorted({f.name for f in formats.values()})
    peak_s = board.peak_bytes_per_s
    cfg = board.accelerator_config(base, paced=paced)
    exe, stats = decode_step(lm, cfg, formats, context)
    spacing = read_request_spacing(cfg)
    ports, roofline = {}, None
    for key, t in timings.items():
        if t.read_latency > cfg.memory.latency:
            raise ValueError(f"the contract's read latency ({cfg.memory.latency} cycles) is "
                             f"below the measured idle latency of {key} ({t.read_latency}): "
                             f"every read would stall, which this model does not charge")
        reads, writes = stats.counter("dram_read_beats"), stats.counter("dram_write_beats")
        beats = reads + writes
        cycles = board_cycles(stats.cycles, reads, writes, cfg.beat_bytes,
                              t.sequential_bytes_per_cycle, spacing)
        worst = board_cycles(stats.cycles, reads, writes, cfg.beat_bytes,
                             t.row_miss_bytes_per_cycle, spacing)
        weight_bytes, kv_bytes = stream_bytes(exe)
        roofline = peak_s / (weight_bytes + kv_bytes)
        ports[key] = {
            "contract_latency": cfg.memory.latency, "fast_model_cycles": stats.cycles,
            "dram_beats": beats, "dram_read_beats": reads, "dram_write_beats": writes,
            "cycles_per_beat": cfg.memory.cycles_per_beat, "cycles": cycles,
            "tokens_per_s": board.sys_clk_hz / cycles,
            "fraction_of_roofline": board.sys_clk_hz / cycles / roofline,
            "tokens_per_s_all_row_misses": board.sys_clk_hz / worst,
            "fast_model_tokens_per_s": board.sys_clk_hz / stats.cycles,
            "config": cfg.fingerprint,
            "host_unit_cycles": stats.host_unit_cycles, "programs": len(stats.programs)}
    return {"model": str(spec), "name": src.name, "formats": names, "context": context,
            "weight_bytes": weight_bytes, "kv_cache_bytes": kv_bytes,
            "roofline_tokens_per_s": roofline, "ports": ports}


# ---------------------------------------------------------------------- the build
def build_report_path(board: Board, cfg: AcceleratorConfig) -> Path:
    """Where the bitstream build writes its report for ``cfg`` on ``board``."""
    return ROOT / "bitstreams" / board.name / cfg.fingerprint / "report.json"


def build_fields(path: Path) -> tuple[dict[str, Any], str]:
    """:data:`BUILD_FIELDS` from the build report at ``path`` (each null when absent) and a
    sentence saying where they come from."""
    if not path.is_file():
        return dict.fromkeys(BUILD_FIELDS), f"no bitstream build report at {_rel(path)}"
    report = json.loads(path.read_text())
    return {k: report.get(k) for k in BUILD_FIELDS}, f"from {_rel(path)}"


# ---------------------------------------------------------------------- the page
def _label(t: MemoryTiming, board_port: int, long: bool = False) -> str:
    """How the page names a measured memory."""
    text = f"{t.port_bits}-bit"
    if long:
        text += (": through LiteDRAM's port converter" if t.port_bits < t.controller_bits
                 else ": the controller's own width")
    if t.port_bits == board_port:
        text += " (board)"
    text += f", tRFC {t.trfc_ns:g} ns" if t.trfc_ns else ", LiteDRAM's tRFC table"
    return text


def _page(rec: dict, memory: dict[str, MemoryTiming], wall: float,
          names: tuple[str, str, str] = (RECORD_FILE, MEMORY_FILE, PAGE_FILE)) -> str:
    board = rec["board"]
    port = rec["port_bits"]
    t0 = memory[rec["board_memory"]]
    table = [t for t in memory.values() if not t.trfc_ns]
    lines = [
        f"# The board: predicted decode on the {board}", "",
        f"Generated by `python -m bench.board{'' if board == ECPIX5.name else ' --board ' + board}`"
        f" in {wall:.0f} s; the record is `bench/results/{names[0]}`, the memory measurement "
        f"`bench/results/{names[1]}` (`--measure-memory` repeats it). How the prediction is "
        "made and what it leaves out: `python -m bench.board --help`.", "",
        "## The memory, measured on LiteDRAM's controller", "",
        f"At {t0.sys_clk_hz / 1e6:g} MHz, peak {t0.peak_bytes_per_cycle} bytes per cycle "
        f"({t0.peak_bytes_per_cycle * t0.sys_clk_hz / 1e6:g} MB/s); sequential reads over "
        f"{t0.refresh_intervals} refresh intervals of {t0.trefi_cycles} cycles; LiteDRAM "
        f"{t0.litedram}. The board's core has the chip's tRFC as a time "
        f"({t0.trfc_ns:g} ns, {t0.trfc_cycles} cycles here, `Board.sdram_trfc_ns`)"
        + (f"; LiteDRAM's table would give it as {table[0].trfc_cycles} cycles (memory clocks "
           "of DDR3-1600, kept at this board's slower memory clock; the row with LiteDRAM's "
           "tRFC table)" if table else "") + ".", "",
        "| port | read latency, idle (row closed / open) | sequential reads | of peak "
        "| row misses | tRFC | refresh alone leaves |", "|---|---|---|---|---|---|---|"]
    for t in memory.values():
        lines.append(
            f"| {_label(t, port, long=True)} | {t.read_latency} / {t.row_hit_latency} cycles | "
            f"{t.sequential_bytes_per_cycle:.3f} B/cycle | {t.efficiency:.1%} | "
            f"{t.row_miss_bytes_per_cycle:.3f} B/cycle | {t.trfc_cycles} cycles | "
            f"{t.refresh_bound:.1%} |")
    if any(t.port_bits < t.controller_bits for t in memory.values()):
        lines += [
            "", "A port narrower than the controller's word goes through LiteDRAM's "
            "up-converter (`litedram.frontend.adapter.LiteDRAMNativePortUpConverter`), which "
            "keeps one controller command in flight: it takes the next command only once the "
            "burst's data has gone out to the port, so a stream moves one burst per read "
            "latency. It also holds a word's read until all the word's beats have been asked "
            "for, the address lines move to another word, or `cmd.last` is set; the generated "
            "core's native port has no `last` (`litedram/gen.py`), so a lone read of part of a "
            "word waits while the address stays on that word (the measurement asserts `last` "
            "on a sequence's final read)."]
    lines += [
        "", "## Decode tokens/s against the memory roofline", "",
        f"One decode step at context {rec['context']}, the accelerator alone; the host's work "
        "between programs (norms, softmax, rotary embedding, LM head) is shown apart, at its "
        "estimated cycles on an on-chip vector unit at the same clock, and the UART's traffic "
        f"is not modelled. The board's port is {port} bits; the other rows are what the same "
        "bridge would get from each other measured memory.", "",
        "| model | formats | weight + KV bytes/token | roofline tok/s | memory | fast model "
        "tok/s | predicted tok/s | of roofline | if every burst missed its row | host work, "
        "est. ms/token |", "|---|---|---|---|---|---|---|---|---|---|"]
    for m in rec["models"]:
        if m.get("skipped"):
            lines.append(f"| {m['model']} | not predicted: {m['skipped']} |")
            continue
        for key, p in m["ports"].items():
            lines.append(
                f"| {m['model']} | {', '.join(m['formats'])} | "
                f"{m['weight_bytes'] + m['kv_cache_bytes']:,} | "
                f"{m['roofline_tokens_per_s']:.1f} | {_label(memory[key], port)} | "
                f"{p['fast_model_tokens_per_s']:.1f} | "
                f"{p['tokens_per_s']:.1f} | {p['fraction_of_roofline']:.0%} | "
                f"{p['tokens_per_s_all_row_misses']:.1f} | "
                f"{p['host_unit_cycles'] / t0.sys_clk_hz * 1e3:.2f} |")
    per = rec.get("persistent")
    if per:
        lines += [
            "", "## One program per decode step", "",
            f"The same prediction on `{per['base']}` ({per['array']}, with the vector engine; "
            f"{per['config']} on the board), whose decode step is one program per token: the "
            "norms, softmax, rotary embedding, SiLU-gate and requantisations on the vector "
            "engine, the programs fused and joined (a model whose joined step does not fit the "
            "instruction memory runs its decoder blocks as one loop), only the LM head on the "
            f"host; beside it the board's configuration ({rec['config']}), one program per "
            "layer with the host's work between them. Both at the board's memory and sys clock "
            f"({t0.sys_clk_hz / 1e6:g} MHz); which bitstream could run each: docs/board.md. "
            "The vector configuration's DRAM port is paced at the memory's peak (a beat every "
            f"{per['cycles_per_beat']} cycles), so the bridge stops it only for the memory's "
            "shortfall below the peak; the board's configuration asks for a beat every cycle.",
            "", "| model | configuration | programs/token | weight + KV bytes/token | roofline "
            "tok/s | fast model tok/s | predicted tok/s | of roofline | host work, est. "
            "ms/token |", "|---|---|---|---|---|---|---|---|---|"]
        for m, cfg in sorted([(m, per["config"]) for m in per["models"]]
                             + [(m, rec["config"]) for m in rec["models"]],
                             key=lambda mc: mc[0]["model"]):
            if m.get("skipped"):
                continue
            p = m["ports"][rec["board_memory"]]
            lines.append(
                f"| {m['model']} | {cfg} | {p['programs']} | "
                f"{m['weight_bytes'] + m['kv_cache_bytes']:,} | "
                f"{m['roofline_tokens_per_s']:.1f} | {p['fast_model_tokens_per_s']:.1f} | "
                f"{p['tokens_per_s']:.1f} | {p['fraction_of_roofline']:.0%} | "
                f"{p['host_unit_cycles'] / t0.sys_clk_hz * 1e3:.2f} |")
    lines += ["", f"Build of {rec['config']}: {_build_line(rec)}."]
    if per:
        lines.append(f"Build of {per['config']}: {_build_line(per)}.")
    return "\n".join(lines + [""])


def _build_line(rec: dict) -> str:
    """Where a record's (or its persistent section's) build fields come from and, when there
    is a report, its clocks and seeds."""
    if not rec.get("clocks"):
        return rec["build_source"]
    clocks = ", ".join(f"{name} {c['fmax_mhz']:g} MHz against {c['target_mhz']:g}"
                       f"{'' if c['met'] else ' (not met)'}"
                       for name, c in rec["clocks"].items())
    return f"{rec['build_source']}: {clocks}; met on {rec['seeds_met']} seeds"


def kept_sim(paths: list[Path], config: str) -> dict | None:
    """The board simulation's fields (:data:`SIM_FIELDS`, :data:`SIM_DETAILS`) and their
    ``sim_provenance`` from the first record among ``paths`` whose board configuration is
    ``config`` (a fingerprint) and that holds a simulation's result; None when none does.

    A run without --sim keeps them: they measure the same configuration, whatever the
    prediction's models and memories.
    """
    for path in dict.fromkeys(paths):
        try:
            old = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        if (not isinstance(old, dict) or old.get("config") != config
                or old.get("sim_tokens_match") is None):
            continue
        return {**{k: old.get(k) for k in SIM_FIELDS + SIM_DETAILS},
                "sim_provenance": old.get("sim_provenance", old.get("provenance"))}
    return None


def simulate_board(board: Board, base: AcceleratorConfig, tokens: int, faults: float,
                   seed: int = 1, log=print) -> dict:
    """The reference model on the board simulation over a faulty link, against the fast model.

    Parameters
    ----------
    board:
        The board (simulated with ``base``'s DRAM size).
    base:
        The accelerator configuration before the board's memory.
    tokens:
        Tokens to generate.
    faults:
        Probability that a frame is corrupted, and again that it is dropped, each way
        (:class:`sim.board.FaultyTransport`).
    seed:
        Seed of the faults and of the simulated memory's latencies.

    Returns
    -------
    dict
        :data:`SIM_FIELDS` and what the run moved and waited for.
    """
    # A 100 kHz board: the link abandons a broken frame after FRAME_GAP_S of the board's time,
    # which at this clock is a thousand simulated cycles rather than most of a million (cycle
    # counts do not depend on the clock).
    sim_board = dataclasses.replace(board, dram_bytes=base.memory.size_bytes, sys_clk_hz=1e5)
    cfg = sim_board.accelerator_config(base)
    src = open_model("reference")
    formats = recipe_for("reference").formats(selected_linears(src.model))
    weights = compress_llama(src.model, lambda name, _: formats.get(name), method="rtn",
                             progress=False)
    prompt = src.encode(SIM_PROMPT)
    exe = compile_model(src.model, cfg, CompileOptions(prompt_tokens=len(prompt),
                                                       max_context=len(prompt) + tokens),
                        weights=weights)
    sim = BoardSim(cfg, sim_board)
    t0 = time.perf_counter()
    with sim.open(seed) as transport:
        link = FaultyTransport(transport, random.Random(seed), corrupt=faults, drop=faults)
        backend = BoardBackend(cfg, BoardLink(link), sim_board)
        on_board = Runtime(exe, backend)
        got = on_board.generate(prompt, tokens)
    log(f"board simulation: {tokens} tokens, {backend.runs} programs in "
        f"{time.perf_counter() - t0:.0f} s")
    model = Runtime(exe, make_backend("model", cfg))
    want = model.generate(prompt, tokens)

    def cycles(gen) -> list[int]:
        return [p.cycles for s in gen.steps for p in s.programs]

    return {"sim_tokens_match": got.tokens == want.tokens,
            "sim_cycles_equal_model": cycles(got) == cycles(want)
            and bool(np.array_equal(on_board.dram, model.dram)),
            "frames_injected": link.frames_injected,
            "frames_recovered": backend.link.frames_recovered,
            "sim_programs": backend.runs, "sim_tokens": tokens, "sim_faults": faults,
            "sim_memory_stall_cycles": backend.stall_cycles,
            "sim_dram_words_written": backend.words_written,
            "sim_dram_words_read": backend.words_read}


def _persistent(models: list[dict], name: str, cfg: AcceleratorConfig, port: str,
                board: Board) -> dict:
    """The record's ``persistent`` section: the predictions on the configuration with the
    vector engine (``cfg`` on the board, named ``name`` on the command line), at the board's
    memory ``port``, and the fields of ``cfg``'s bitstream build on ``board``
    (:data:`BUILD_FIELDS`, null when there is none) with their ``build_source``."""
    done = [m for m in models if not m.get("skipped")]
    build, source = build_fields(build_report_path(board, cfg))
    return {"base": name, "config": cfg.fingerprint, "array": cfg.array,
            "cycles_per_beat": cfg.memory.cycles_per_beat,
            "predicted_tokens_per_s": {m["model"]: m["ports"][port]["tokens_per_s"]
                                       for m in done},
            "roofline_tokens_per_s": {m["model"]: m["roofline_tokens_per_s"] for m in done},
            "fraction_of_roofline": {m["model"]: m["ports"][port]["fraction_of_roofline"]
                                     for m in done},
            "programs_per_token": {m["model"]: m["ports"][port]["programs"] for m in done},
            **build, "build_source": source, "models": models, "provenance": provenance(cfg)}


@command("bench.board")
def main(argv: list[str] | None = None) -> int:
    ap = parser("python -m bench.board", __doc__)
    ap.add_argument("--board", default=ECPIX5.name, metavar="B",
                    help=f"the board: {boards_help()}")
    ap.add_argument("--models", type=_models, default=",".join(MODELS),
                    metavar="NAME[@FORMAT],...",
                    help=f"models to predict: built-ins ({', '.join(BUILTINS)}), each with its "
                         "recipe or the format after '@'")
    ap.add_argument("--context", type=positive_int, default=128,
                    help="positions the decode step attends to")
    ap.add_argument("--config", default=None, metavar="NAME|JSON",
                    help="accelerator configuration, a preset or a JSON file, before the "
                         "board's memory (none: the board's, "
                         f"{ECPIX5.base_config.array}: Board.base_config)")
    ap.add_argument("--vector-config", default="vector", metavar="NAME|JSON",
                    help="a configuration with the vector engine (a preset or a JSON file), "
                         "before the board's memory, on which --vector-models' decode step is "
                         "predicted too: one program per token (the host ops on the vector "
                         "engine, fused and joined; a model whose joined step does not fit the "
                         "instruction memory runs its decoder blocks as one loop); 'none': "
                         "not predicted")
    ap.add_argument("--vector-models", type=_models, default=",".join(VECTOR_MODELS),
                    metavar="NAME[@FORMAT],...",
                    help="models predicted on --vector-config")
    ap.add_argument("--build-report", type=Path, default=None,
                    help="the bitstream build's report.json (none: "
                         "bitstreams/<board>/<config fingerprint>/report.json)")
    ap.add_argument("--measure-memory", action="store_true",
                    help="measure the memory on LiteDRAM's controller again (minutes) instead "
                         "of reading the record")
    ap.add_argument("--sim", action="store_true",
                    help="run the reference model on the board simulation (Verilator; minutes "
                         "the first time, while it builds) for the sim_* fields")
    ap.add_argument("--sim-tokens", type=positive_int, default=4,
                    help="tokens the board simulation generates")
    ap.add_argument("--sim-faults", type=float, default=0.02,
                    help="probability of corrupting, and of dropping, each frame of the "
                         "simulated link")
    ap.add_argument("--out", type=Path, default=RESULTS / RECORD_FILE,
                    help="results JSON (for another board than the default the default file is "
                         "board_<board>.json)")
    ap.add_argument("--docs", type=Path, default=DOCS,
                    help="where board_performance.md (another board's: "
                         "board_performance_<board>.md) is written")
    args = ap.parse_args(argv)
    if not 0 <= args.sim_faults < 1:
        ap.error(f"--sim-faults must be in [0, 1), got {args.sim_faults}")
    try:
        board = board_named(args.board)
    except ValueError as e:
        ap.error(f"--board: {e}")
    names = record_names(board)
    if args.out in (RESULTS / RECORD_FILE, recorded(RESULTS / RECORD_FILE)):  # the default
        args.out = args.out.with_name(names[0])
    try:
        base = named_or_file(args.config) if args.config else board.base_config
    except (ConfigError, OSError) as e:
        ap.error(f"--config {args.config}: {e}")
    vector = None
    if args.vector_config != "none":
        try:
            vector = named_or_file(args.vector_config)
        except (ConfigError, OSError) as e:
            ap.error(f"--vector-config {args.vector_config}: {e}")
        if not vector.has_vector:
            ap.error(f"--vector-config {args.vector_config}: has no vector engine "
                     "(vin_spad_bytes and vout_spad_bytes are 0)")
    for option, specs, cfg in (("--models", args.models, base),
                               ("--vector-models", args.vector_models, vector)):
        for spec in specs:
            if spec.fmt is not None and cfg is not None:
                try:
                    spec.fmt.check_supported(board.accelerator_config(cfg))
                except (FormatError, ConfigError) as e:
                    ap.error(f"{option} {spec}: {e}")
    t_start = time.perf_counter()
    memory = memory_timings(args.out.parent / names[1], board, args.measure_memory)
    port = board_key(board)

    def predict_all(specs, cfg: AcceleratorConfig, paced: bool = False) -> list[dict]:
        out = []
        for spec in specs:
            try:
                out.append(predict(spec, cfg, board, memory, args.context, paced))
            except ModelSourceError as e:
                print(f"{spec}: not predicted: {e}")
                out.append({"model": str(spec), "skipped": str(e)})
            except ValueError as e:
                ap.error(str(e))
        return out

    models = predict_all(args.models, base)
    board_cfg = board.accelerator_config(base)
    report = args.build_report or build_report_path(board, board_cfg)
    build, source = build_fields(report)
    done = [m for m in models if not m.get("skipped")]
    if args.sim:
        sim = {**simulate_board(board, base, args.sim_tokens, args.sim_faults),
               "sim_provenance": provenance(board_cfg)}
    else:
        sim = kept_sim([args.out, recorded(args.out)], board_cfg.fingerprint)
        if sim:
            print(f"board simulation: kept from the record ({board_cfg.fingerprint}; --sim "
                  "runs it again)")
        else:
            sim = dict.fromkeys(SIM_FIELDS)
    persistent = (_persistent(predict_all(args.vector_models, vector, paced=True),
                              args.vector_config, board.accelerator_config(vector, paced=True),
                              port, board)
                  if vector is not None else None)
    rec = {
        "board": board.name, "config": board_cfg.fingerprint, "port_bits": board.port_bits,
        "board_memory": port, "context": args.context,
        "predicted_tokens_per_s": {m["model"]: m["ports"][port]["tokens_per_s"] for m in done},
        "roofline_tokens_per_s": {m["model"]: m["roofline_tokens_per_s"] for m in done},
        "predicted_tokens_per_s_by_memory": {key: {m["model"]: m["ports"][key]["tokens_per_s"]
                                                   for m in done} for key in memory},
        **build, "build_source": source, **sim,
        "memory": {key: t.to_dict() for key, t in memory.items()}, "models": models,
        "persistent": persistent}
    wall = time.perf_counter() - t_start
    write_json(args.out, stamp(rec, board_cfg))
    page = _page(rec, memory, wall, names)
    write_text_atomic(args.docs / names[2], page)
    print(page)
    print(f"wrote {_rel(args.out)} and {_rel(args.docs / names[2])} ({wall:.0f} s)")
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
