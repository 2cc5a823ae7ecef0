"""python -m sw.deploy -- run a compressed LLM end to end on the simulated accelerator.

Compresses the model (N:M pruning + INT4/INT8 group quantisation) with its default recipe
(below) or the options given, measures its accuracy, compiles prefill and decode into programs
for the accelerator (sw.compile), generates text from a prompt on a backend (the fast
cycle-accurate model by default, or the Verilator RTL, the Yosys netlist, the ECPIX-5 board or
its simulation), checks that every generated token equals the model-level twin's (the torch
model computing with the accelerator's exact integer numerics), and reports cycles, simulated
tokens/s, the speedup over the same model in dense INT4 on the same hardware, utilisation, DRAM
traffic, the roofline fraction and the host <-> accelerator transitions per token.

Writes into --out: report.json, report.md (with roofline.png), decode_trace.json (a Perfetto
timeline of one decode step: open it in ui.perfetto.dev) and executable.safetensors (the
compiled model). The directory is written whole or not at all.

Everything that follows from the options and the model's shapes is checked before the
compression: formats against the configuration, the context, and the DRAM the compiled model
needs (the packed weights and KV cache from the shapes, then the activation arena from the
captured graph). With no --config and no --dram-mb, the simulated DRAM is the default
configuration's, grown to the model's need (rounded up to whole MiB) if that is larger; an
explicit --config file or --dram-mb that is too small is an error (a named configuration's
DRAM is sized like the default's).

On a configuration with the vector engine (--config vector, or a file with vin_spad_bytes and
vout_spad_bytes) RMSNorm, RoPE, softmax and SiLU-gate run on it as programs of their own; the
host's remaining ops then compute with the vector unit's numerics too: --vector-numerics is
implied.

examples:
  python -m sw.deploy
  python -m sw.deploy --sparsity 1:4 --max-new-tokens 64 --prompt "def fib(n):"
  python -m sw.deploy --backend rtl --max-new-tokens 4
  python -m sw.deploy --config vector --max-new-tokens 8
  python -m sw.deploy --backend board --port /dev/ttyUSB1   (docs/board.md)
  python -m sw.deploy --model path/to/hf_llama_dir --method wanda+gptq --calib 32
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import shutil
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from hw.board.ecpix5 import ECPIX5
from hw.cli import OneLineParser, command
from hw.config import (
    DENSE,
    PRESETS,
    VECTOR_PRESET_SPADS,
    WEIGHT_BITS,
    AcceleratorConfig,
    ConfigError,
    NMPattern,
    named_or_file,
)
from hw.format import FormatError, WeightFormat, stream_layout
from hw.isa import INSTR_BYTES
from hw.numerics import KV4_KEY_GROUP, KV_BITS
from hw.synth import synthesised_clock
from sim.backends import BACKENDS, BOARD_BACKENDS, make_backend
from sim.board import BoardLinkError
from sim.roofline import plot_roofline
from sw.artifact import publish
from sw.cli import UsageError, add_tokenizer_option
from sw.compile import CompileError, CompileOptions, PlanError, compile_model, memo
from sw.compile import executable as executable_io
from sw.compile.compiler import capture_model, static_dram_bytes
from sw.compile.errors import LoweringError
from sw.compile.schedule import check_head_row
from sw.compress.model import (
    COMPRESS_METHODS,
    calibrates,
    compress_llama,
    selected_linears,
    untie_head,
    use_hardware_numerics,
)
from sw.models import corpus
from sw.models.eval import EvalProtocol, perplexity
from sw.models.generate import generate
from sw.models.recipes import DEFAULT_RECIPE, HEAD, LM_HEADS, RECIPES, Recipe, recipe_for
from sw.models.source import BUILTINS, ModelSourceError, open_model
from sw.runtime import Runtime, RuntimeFault
from sw.runtime.trace import write_step_trace

__all__ = ["DeployOptions", "deploy", "main"]

DEFAULT_PROMPT = "class Stack:\n    def push(self, item"
CHAT_PROMPT = "What is the capital of France?"


@dataclass
class DeployOptions:
    """Everything ``sw.deploy`` needs (the command-line options, validated)."""

    model: str = "reference"
    tokenizer: str | None = None
    sparsity: str | None = None   # None: the model's recipe (sw.models.recipes)
    bits: int | None = None
    group: int | None = None
    method: str | None = None
    config: str | None = None
    backend: str = "model"
    port: str = "/dev/ttyUSB1"
    prompt: str | None = None
    no_chat_template: bool = False
    dram_mb: int | None = None
    max_new_tokens: int = 32
    temperature: float = 0.0
    top_k: int | None = None
    seed: int = 0
    calib: int = 32
    calib_domain: str = corpus.CODE
    eval_tokens: int = 8192
    vector_numerics: bool = False
    kv_bits: int = 8
    lm_head: str = "host"
    out: str = "build/deploy"
    quiet: bool = False


#: Bytes the simulated DRAM is rounded up to when it is sized to the model (--dram-mb's unit).
MIB = 1 << 20


def _recipes_help() -> str:
    """The table of default recipes (sw.models.recipes), for --help."""
    def wrap(text: str, indent: str) -> str:
        return textwrap.fill(text, 79, initial_indent=indent, subsequent_indent=indent + "  ")
    lines = [wrap("default recipes (sw.models.recipes; --method replaces the method, --sparsity, "
                  "--bits or --group replace the formats by one):", "")]
    for name, r in RECIPES.items():
        lines.append(wrap(f"{name}: {r} -- {r.why}", "  "))
        lines += [wrap(f"{unit}: {fmt}", "      ") for unit, fmt in r.layers.items()]
    lines.append(wrap(f"any other model: {DEFAULT_RECIPE}", "  "))
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    d = DeployOptions()
    r = DEFAULT_RECIPE
    ap = OneLineParser(
        prog="python -m sw.deploy", name="sw.deploy", description=__doc__.split("\n\n", 1)[1],
        epilog=_recipes_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=d.model, help="a built-in model "
                    f"({', '.join(BUILTINS)}), a Hugging Face directory, a .gguf file or a "
                    f"compressed .safetensors written by sw.compress (default: {d.model})")
    add_tokenizer_option(ap)
    ap.add_argument("--sparsity", default=d.sparsity, help="N:M pattern of every linear layer, "
                    f"or 'dense' (default: the model's recipe, below; {r.sparsity} for others)")
    ap.add_argument("--bits", type=int, default=d.bits, choices=WEIGHT_BITS,
                    help=f"weight bits (default: the model's recipe; {r.bits} for others)")
    ap.add_argument("--group", type=int, default=d.group,
                    help="quantisation group along K, 0 = whole row (default: the model's "
                    f"recipe; {r.group} for others)")
    ap.add_argument("--method", default=d.method,
                    help=f"compression method, one of {', '.join(sorted(COMPRESS_METHODS))} "
                    f"(default: the model's recipe; {r.method} for others)")
    ap.add_argument("--config", default=d.config, help="accelerator configuration: a JSON "
                    f"file, or a named one ({', '.join(PRESETS)}; 'vector' is the default "
                    "with the vector engine's "
                    f"{VECTOR_PRESET_SPADS['vin_spad_bytes'] >> 10} KiB VIN and "
                    f"{VECTOR_PRESET_SPADS['vout_spad_bytes'] >> 10} KiB VOUT scratchpads, and "
                    "implies --vector-numerics) (default: the built-in AcceleratorConfig; on "
                    f"the board backends the board's, {ECPIX5.base_config.array})")
    ap.add_argument("--backend", default=d.backend, choices=BACKENDS + BOARD_BACKENDS,
                    help="model: fast model with values; model-timing: cycles only (text from "
                    "the twin); rtl: Verilator RTL; netlist: Yosys netlist; board: the ECPIX-5 "
                    "over its UART (--port; docs/board.md); board-sim: the board's RTL under "
                    "Verilator, over the same host link, the DRAM sized as for the simulators "
                    f"(default: {d.backend})")
    ap.add_argument("--port", default=d.port, help="the board's serial port, with --backend "
                    f"board (default: {d.port})")
    ap.add_argument("--prompt", default=d.prompt, help="prompt text (default: "
                    f"{DEFAULT_PROMPT!r}, or {CHAT_PROMPT!r} for a model with a chat template)")
    ap.add_argument("--no-chat-template", action="store_true",
                    help="feed the prompt as it is, even to a chat model (default: off)")
    ap.add_argument("--dram-mb", type=int, default=d.dram_mb,
                    help="simulated accelerator DRAM in MiB, overriding the configuration's "
                    "(default: the configuration's; with no --config, grown to what the model "
                    "needs if that is more)")
    ap.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens,
                    help=f"tokens to generate (default: {d.max_new_tokens})")
    ap.add_argument("--temperature", type=float, default=d.temperature,
                    help=f"sampling temperature, 0 = greedy (default: {d.temperature})")
    ap.add_argument("--top-k", type=int, default=d.top_k,
                    help=f"sample among the k most likely tokens (default: {d.top_k}: all)")
    ap.add_argument("--seed", type=int, default=d.seed,
                    help=f"seed of the sampler and of calibration (default: {d.seed})")
    ap.add_argument("--calib", type=int, default=d.calib, help="calibration sequences of 256 "
                    f"tokens (default: {d.calib})")
    ap.add_argument("--calib-domain", default=d.calib_domain, choices=corpus.CALIBRATION_SETS,
                    help="calibration text, train splits: CPython source ('code'), English "
                         "news ('prose') or half of each; docs/accuracy.md measures them "
                         f"(default: {d.calib_domain})")
    ap.add_argument("--eval-tokens", type=int, default=d.eval_tokens, help="held-out tokens for "
                    f"perplexity, 0 to skip (default: {d.eval_tokens})")
    ap.add_argument("--vector-numerics", action="store_true",
                    help="the host ops (RMSNorm, RoPE, softmax, SiLU-gate, residual adds, INT8 "
                         "requantisation) in the vector unit's exact fixed point "
                         "(hw/numerics.py), in the runtime and the twin (default: float; "
                         "implied by a configuration with the vector engine)")
    ap.add_argument("--kv-bits", type=int, default=d.kv_bits,
                    help="width of the KV cache's elements: 8 or 4 (INT4: keys in groups of "
                         f"{KV4_KEY_GROUP} head_dim elements with 8-bit scale codes, values "
                         "per position; docs/accuracy.md measures it) (default: "
                         f"{d.kv_bits})")
    ap.add_argument("--lm-head", default=d.lm_head,
                    help=f"the LM head, one of {', '.join(LM_HEADS)}: 'host' keeps it in "
                         "float on the host, 'int8' / 'int4' compress it dense in the "
                         "recipe's groups and run it on the accelerator like the other "
                         f"linears (docs/accuracy.md measures its cost) (default: {d.lm_head})")
    ap.add_argument("--out", default=d.out, help=f"output directory (default: {d.out})")
    ap.add_argument("--quiet", action="store_true", help="no progress bars")
    return ap


# ---------------------------------------------------------------------- validation
def _accelerator(path: str | None, dram_mb: int | None,
                 default: AcceleratorConfig | None = None) -> AcceleratorConfig:
    """The configuration of --config: a named one (:data:`hw.config.PRESETS`), a JSON file,
    or ``default`` (None: ``AcceleratorConfig()``); with --dram-mb's memory."""
    try:
        cfg = default if path is None and default is not None else named_or_file(path)
    except ConfigError as e:
        raise UsageError(f"--config {e}") from None
    if dram_mb is None:
        return cfg
    try:
        return cfg.with_dram(dram_mb << 20)
    except ConfigError as e:
        raise UsageError(f"--dram-mb {dram_mb}: {e}") from None


def _on_board(backend: str, cfg: AcceleratorConfig) -> AcceleratorConfig:
    """``cfg`` on the board a board backend runs: the ECPIX-5's clock and memory (for
    ``board-sim`` a board with ``cfg``'s DRAM size, which the sizing below may still grow)."""
    if backend == "board":
        return ECPIX5.accelerator_config(cfg)
    if backend == "board-sim":
        return dataclasses.replace(ECPIX5, dram_bytes=cfg.memory.size_bytes
                                   ).accelerator_config(cfg)
    return cfg


def _recipe(opts: DeployOptions, cfg: AcceleratorConfig) -> Recipe:
    """The model's default recipe with the options given in its place, its formats checked
    against the configuration."""
    if opts.lm_head not in LM_HEADS:
        raise UsageError(f"--lm-head {opts.lm_head!r}: choose one of {', '.join(LM_HEADS)}")
    recipe = recipe_for(opts.model).override(method=opts.method, sparsity=opts.sparsity,
                                             bits=opts.bits, group=opts.group,
                                             head_bits=LM_HEADS[opts.lm_head])
    if recipe.head_bits:
        try:
            recipe.head_format().check_supported(cfg)
        except (FormatError, ConfigError) as e:
            raise UsageError(f"--lm-head {opts.lm_head} (group {recipe.group}): {e}") from None
    if recipe.method not in COMPRESS_METHODS:
        raise UsageError(f"--method {recipe.method!r}: choose one of "
                         f"{', '.join(sorted(COMPRESS_METHODS))}")
    if recipe.layers:
        for unit, name in recipe.layers.items():
            try:
                WeightFormat.parse(name).check_supported(cfg)
            except (FormatError, ConfigError) as e:
                raise UsageError(f"the recipe of --model {opts.model}, {unit}: {e}") from None
        return recipe
    try:
        pattern = NMPattern.parse(recipe.sparsity)
    except ConfigError as e:
        raise UsageError(f"--sparsity {recipe.sparsity!r}: {e}") from None
    try:
        WeightFormat(pattern, recipe.bits, recipe.group).check_supported(cfg)
    except (FormatError, ConfigError) as e:
        raise UsageError(f"--sparsity {recipe.sparsity} --bits {recipe.bits} --group "
                         f"{recipe.group}: {e}") from None
    return recipe


def _check(opts: DeployOptions) -> None:
    if opts.backend not in BACKENDS + BOARD_BACKENDS:
        raise UsageError(f"--backend {opts.backend!r}: choose one of "
                         f"{', '.join(BACKENDS + BOARD_BACKENDS)}")
    if opts.backend == "board" and opts.dram_mb is not None:
        raise UsageError(f"--dram-mb {opts.dram_mb}: --backend board has the board's "
                         f"{ECPIX5.dram_bytes >> 20} MiB")
    if opts.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, got {opts.max_new_tokens}")
    if opts.calib < 1:
        raise UsageError(f"--calib must be >= 1, got {opts.calib}")
    if opts.eval_tokens < 0:
        raise UsageError(f"--eval-tokens must be >= 0, got {opts.eval_tokens}")
    if opts.prompt is not None and not opts.prompt:
        raise UsageError("--prompt is empty")
    if opts.dram_mb is not None and opts.dram_mb < 1:
        raise UsageError(f"--dram-mb must be >= 1, got {opts.dram_mb}")
    if not 0 <= opts.temperature < float("inf"):
        raise UsageError(f"--temperature must be a finite number >= 0, got {opts.temperature}")
    if opts.top_k is not None and opts.top_k < 1:
        raise UsageError(f"--top-k must be >= 1, got {opts.top_k}")
    if opts.kv_bits not in KV_BITS:
        raise UsageError(f"--kv-bits must be one of {', '.join(map(str, KV_BITS))}, got "
                         f"{opts.kv_bits}")


# ---------------------------------------------------------------------- pipeline
#: The pipeline's phases, in order (``report.json``'s ``phase_s``: the wall seconds of each).
PHASES = ("load", "size DRAM", "compress", "accuracy", "compile", "run", "twin", "dense",
          "report")


class Phases:
    """The wall time of the pipeline's phases (:data:`PHASES`): each logged as it starts,
    with the time since the run began, and as it ends (``log``, stdout flushed: piped output
    too shows which phase runs; the long ones have progress bars of their own, unless
    ``quiet``); :attr:`seconds` per phase run."""

    def __init__(self, log, t0: float) -> None:
        self.log, self.t0 = log, t0
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        """Time the phase ``name`` (one of :data:`PHASES`)."""
        t0 = time.perf_counter()
        self._say(f"[{name}] at {t0 - self.t0:.1f} s")
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
            self._say(f"[{name}] done in {self.seconds[name]:.1f} s")

    def _say(self, text: str) -> None:
        self.log(text)
        sys.stdout.flush()


def deploy(opts: DeployOptions, out: Path, log=print) -> dict:
    """Run the whole pipeline, writing the outputs into ``out``; returns the report."""
    _check(opts)
    cfg = _on_board(opts.backend, _accelerator(
        opts.config, opts.dram_mb, ECPIX5.base_config if opts.backend in BOARD_BACKENDS else None))
    if cfg.has_vector:  # host ops run on the vector engine: the rest with its numerics too
        opts = dataclasses.replace(opts, vector_numerics=True)
    recipe = _recipe(opts, cfg)
    torch.manual_seed(opts.seed)
    t_all = time.perf_counter()
    with memo.enabled():  # the probe's fusions and moves, found again by the compilations
        return _pipeline(opts, cfg, recipe, out, log, Phases(log, t_all), t_all)


def _pipeline(opts: DeployOptions, cfg: AcceleratorConfig, recipe: Recipe, out: Path, log,
              phase: Phases, t_all: float) -> dict:
    """:func:`deploy`'s phases (:data:`PHASES`, timed by ``phase``)."""
    progress = not opts.quiet
    with phase("load"):
        try:
            src = open_model(opts.model, tokenizer=opts.tokenizer)
        except ModelSourceError as e:
            raise UsageError(str(e)) from None
    mcfg = src.model.config
    prompt, prompt_text, eos = _prompt(src, opts)
    total = len(prompt) + opts.max_new_tokens
    if total > mcfg.max_position_embeddings:
        raise UsageError(f"--prompt of {len(prompt)} tokens + --max-new-tokens "
                         f"{opts.max_new_tokens} = {total} exceeds the model's context of "
                         f"{mcfg.max_position_embeddings} positions")
    log(f"model: {src.name} ({src.model.num_parameters():,} parameters, "
        f"{mcfg.num_hidden_layers} layers, hidden {mcfg.hidden_size}, "
        f"{mcfg.num_attention_heads}/{mcfg.num_key_value_heads} heads)")
    seq = min(256, mcfg.max_position_embeddings)
    formats = _layer_formats(src, recipe, opts)
    options = CompileOptions(prompt_tokens=len(prompt), max_context=total, kv_bits=opts.kv_bits,
                             argmax=opts.temperature == 0)
    if recipe.head_bits and cfg.has_vector:  # its DEQUANT (and ARGMAX) on the vector engine
        try:
            check_head_row(cfg, mcfg.vocab_size, options.argmax)
        except LoweringError as e:
            raise UsageError(f"--lm-head {opts.lm_head}: the head's row of "
                             f"{mcfg.vocab_size} logits: {e}") from None
    explicit = _check_static_dram(src.model, cfg, options, formats, opts)
    windows = _eval_windows(src, opts, seq)
    with phase("size DRAM"):
        cfg, captured, dram = _size_dram(src.model, cfg, options, formats, explicit, log,
                                         progress)
    # a board that cannot be reached fails here, before the compression
    backend = _open_backend(opts, cfg)
    try:
        with phase("compress"):
            weights, compressed, compress_s = _compress(src, recipe, formats, opts, seq,
                                                        progress, log)
            bits = sum(stream_layout(w.fmt, *w.shape, cfg.lanes).bits_per_weight["total"]
                       * w.shape[0] * w.shape[1] for w in weights.values()) / sum(
                           w.shape[0] * w.shape[1] for w in weights.values())
            twin = use_hardware_numerics(copy.deepcopy(compressed), weights, cfg.acc_bits,
                                         attention=True, vector=opts.vector_numerics,
                                         kv_bits=opts.kv_bits)

        # ---- accuracy (no fp32 baseline for a compressed file: it holds compressed weights)
        ppl = {}
        if windows is not None:
            with phase("accuracy"):
                proto = EvalProtocol(seq_len=seq, max_tokens=opts.eval_tokens)
                models = ([] if src.weights else [("fp32", src.model)]) + [("compressed", twin)]
                for label, m in models:
                    ppl[label] = perplexity(m, proto, windows=windows).perplexity
                log(f"perplexity on {windows.shape[0] * seq:,} held-out tokens: "
                    + (f"fp32 {ppl['fp32']:.3f} -> " if "fp32" in ppl else "")
                    + f"compressed, accelerator numerics {ppl['compressed']:.3f}")

        # ---- compile (the DRAM-sizing probe's fusions and moves again: sw.compile.memo)
        with phase("compile"):
            exe = compile_model(src.model, cfg, options, weights=weights, captured=captured,
                                progress=progress)
        rep = exe.report
        log(f"compile: {rep['programs']} programs, {rep['instructions']:,} instructions in "
            f"{rep['compile_s']:.2f} s (capture {rep['capture_s']:.1f} s; the DRAM sizing's "
            f"fusions and moves reused); DRAM "
            f"{rep['dram']['total']:,} of {cfg.memory.size_bytes:,} bytes")

        # ---- run on the backend, and the twin
        with phase("run"):
            runtime = Runtime(exe, backend, trace=True, vector=opts.vector_numerics)
            bar = tqdm(total=opts.max_new_tokens, desc=f"generate ({opts.backend})",
                       disable=not progress, leave=False)
            sampling = dict(temperature=opts.temperature, top_k=opts.top_k, eos_token_id=eos)
            # the twin check compares tokens: where the chip picks them, only they are read back
            gen = runtime.generate(prompt, opts.max_new_tokens, seed=opts.seed,
                                   on_token=lambda _: bar.update(), logits=False, **sampling)
            bar.close()
            if len(gen.steps) == 1:  # ended at the first token: measure one decode step anyway
                greedy = opts.temperature == 0 and runtime.argmax_on_chip("decode")
                gen.steps.append(runtime.step(torch.tensor([[gen.tokens[-1]]]),
                                              logits=not greedy)[1])
        with phase("twin"):
            with torch.no_grad():
                twin_out = generate(twin, torch.tensor(prompt), opts.max_new_tokens,
                                    generator=torch.Generator().manual_seed(opts.seed),
                                    **sampling)
        twin_tokens = _until_eos(twin_out[len(prompt):].tolist(), eos)
        values = runtime.values
        tokens = gen.tokens if values else twin_tokens
        match = tokens == twin_tokens if values else None

        # ---- the same model in dense INT4 on the same hardware (timing only: no cycle count
        # depends on the DRAM's size, which the denser weights may outgrow)
        with phase("dense"):
            dense = {k: WeightFormat(DENSE, 4, w.fmt.group or recipe.group)
                     for k, w in weights.items()}
            dense_cfg = cfg.timing_only()
            dense_exe = compile_model(src.model, dense_cfg, options, formats=dense,
                                      captured=captured, progress=progress)
            dense_rt = Runtime(dense_exe, make_backend("model-timing", dense_cfg),
                               vector=opts.vector_numerics)
            dense_steps = [dense_rt.step(torch.tensor([prompt]))[1]]
            for tok in tokens[:max(1, len(gen.steps) - 1)]:  # the same decode steps as the run
                dense_steps.append(dense_rt.step(torch.tensor([[tok]]))[1])

        with phase("report"):
            report = _report(opts, cfg, weights, src, exe, gen, tokens, match, dense_steps, ppl,
                             bits, compress_s, time.perf_counter() - t_all)
            report.update(method="from the file" if src.weights else recipe.method,
                          recipe=None if src.weights else str(recipe),
                          recipe_why=None if src.weights else recipe.why,
                          recipe_layers=None if src.weights else dict(recipe.layers),
                          dram_sizing=dram,
                          calib_corpus=(opts.calib_domain
                                        if not src.weights and calibrates(recipe.method)
                                        else None),
                          board=_board_report(backend, opts), phase_s=phase.seconds)
            _write(out, opts, cfg, exe, gen, report, src, tokens, prompt_text)
        # the report phase's own seconds, and the whole run's, after it is written
        report["wall_s"] = time.perf_counter() - t_all
        (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
        _print_summary(report, src.decode(tokens), prompt_text, log)
        log("wall time by phase: " + ", ".join(f"{k} {v:.1f} s"
                                                for k, v in phase.seconds.items())
            + f"; total {report['wall_s']:.1f} s")
        return report
    finally:
        if opts.backend in BOARD_BACKENDS:
            backend.close()


def _prompt(src, opts: DeployOptions) -> tuple[list[int], str, int | None]:
    """Token ids of the prompt (through the chat template when the model has one), the text
    shown with the answer, and the token that ends generation (chat models)."""
    text = opts.prompt or (CHAT_PROMPT if src.chat_template else DEFAULT_PROMPT)
    if src.chat_template and not opts.no_chat_template:
        return src.chat([{"role": "user", "content": text}]), f"[user] {text}\n[assistant] ", \
            src.eos_token_id
    return src.encode(text), text, None


def _until_eos(tokens: list[int], eos: int | None) -> list[int]:
    if eos is not None and eos in tokens:
        return tokens[:tokens.index(eos) + 1]
    return tokens


def _eval_windows(src, opts: DeployOptions, seq: int) -> torch.Tensor | None:
    """The held-out windows perplexity is measured on (None: --eval-tokens 0)."""
    if not opts.eval_tokens:
        return None
    if opts.eval_tokens < seq:
        raise UsageError(f"--eval-tokens must be 0 or at least one window of {seq} tokens, got "
                         f"{opts.eval_tokens}")
    try:
        return src.windows("test", seq, opts.eval_tokens)
    except ModelSourceError as e:
        raise UsageError(f"--eval-tokens {opts.eval_tokens}: {e}") from None


def _layer_formats(src, recipe: Recipe, opts: DeployOptions) -> dict[str, WeightFormat]:
    """The format of every layer the accelerator runs: a compressed file's, else the
    recipe's for each layer compression selects (known before compressing)."""
    if src.weights:
        return {k: w.fmt for k, w in src.weights.items()}
    layers = list(selected_linears(src.model)) + ([HEAD] if recipe.head_bits else [])
    try:
        return recipe.formats(layers)
    except FormatError as e:
        raise UsageError(f"the recipe of --model {opts.model}: {e}") from None


def _check_static_dram(model, cfg: AcceleratorConfig, options: CompileOptions,
                       formats: dict[str, WeightFormat], opts: DeployOptions) -> str | None:
    """The option that fixes the DRAM (None: sized to the model), after checking that an
    explicit one holds the packed weights and KV cache (from the shapes alone)."""
    explicit = (f"--dram-mb {opts.dram_mb}" if opts.dram_mb is not None
                else "--backend board" if opts.backend == "board"
                else f"--config {opts.config}" if opts.config and opts.config not in PRESETS
                else None)
    size = cfg.memory.size_bytes
    static = static_dram_bytes(model, cfg, options, formats)
    if explicit and static > size:
        raise UsageError(f"{explicit}: the model's packed weights and KV cache alone need "
                         f"{static:,} bytes of accelerator DRAM but the configuration has "
                         f"memory.size_bytes={size:,}; give more memory, a shorter context or "
                         "a sparser format")
    return explicit


def _size_dram(model, cfg: AcceleratorConfig, options: CompileOptions,
               formats: dict[str, WeightFormat], explicit: str | None, log,
               progress: bool = False):
    """Check that the compiled model fits before anything is compressed, sizing the DRAM to
    it when no --config or --dram-mb (``explicit``) says otherwise.

    The packed weights and KV cache follow from the shapes (:func:`_check_static_dram`,
    before this); the activation arena from the captured graph: a timing-only compilation
    with the same formats runs the planner (and the lowering) that the real one will.
    Returns the configuration, the captured graphs (reused by every compilation) and what
    the report says of the DRAM.
    """
    size = cfg.memory.size_bytes
    captured = capture_model(model, options)
    probe = cfg if explicit else cfg.with_dram(cfg.timing_only().memory.size_bytes)
    try:
        needed = compile_model(model, probe, options, formats=formats, captured=captured,
                               progress=progress).report["dram"]["total"]
    except PlanError as e:
        raise UsageError(f"{explicit}: {e}") from None
    if explicit:
        how = explicit
    elif needed <= size:
        how = "the default configuration's"
    else:
        cfg = cfg.with_dram(-(-needed // MIB) * MIB)
        how = (f"sized to the model: the default configuration's {size:,} bytes grown to the "
               "need, rounded up to whole MiB")
    dram = {"needed_bytes": needed, "size_bytes": cfg.memory.size_bytes, "how": how}
    log(f"DRAM: the compiled model needs {needed:,} bytes; simulating "
        f"{cfg.memory.size_bytes:,} ({how})")
    return cfg, captured, dram


def _compress(src, recipe: Recipe, formats: dict[str, WeightFormat], opts: DeployOptions,
              seq: int, progress: bool, log):
    """The compressed weights and the float model computing with them: a compressed file's
    own, else compressed here with ``recipe`` (``formats``: its format of every layer)."""
    if src.weights:
        counts = Counter(w.fmt.name for w in src.weights.values())
        fmts = [f"{n} x{k}" for n, k in sorted(counts.items())]
        log(f"compressed model: {len(src.weights)} layers ({', '.join(fmts)}); "
            "--sparsity, --bits, --group, --method and --lm-head do not apply")
        return dict(src.weights), src.model, 0.0
    log(f"compress: {recipe} ({recipe.why}), {opts.calib} x {seq} calibration tokens of "
        f"{opts.calib_domain}")
    t0 = time.perf_counter()
    compressed = copy.deepcopy(src.model)
    uniform = None if recipe.head_bits else recipe.uniform_format()
    if recipe.head_bits:
        untie_head(compressed)
    weights = compress_llama(compressed, uniform or (lambda name, _: formats.get(name)),
                             recipe.method,
                             src.calibration(opts.calib, seq, opts.seed, opts.calib_domain),
                             skip=() if recipe.head_bits else (HEAD,), progress=progress)
    return weights, compressed, time.perf_counter() - t0


def _open_backend(opts: DeployOptions, cfg: AcceleratorConfig):
    """The backend of ``--backend``; a board that cannot be reached is a usage error (one line
    naming the port)."""
    try:
        return make_backend(opts.backend, cfg, port=opts.port)
    except BoardLinkError as e:
        raise UsageError(f"--backend {opts.backend}: {e}") from None


def _board_report(backend, opts: DeployOptions) -> dict | None:
    """What a board backend moved and waited for over the whole run (None for the others)."""
    if opts.backend not in BOARD_BACKENDS:
        return None
    return {"port": opts.port if opts.backend == "board" else None,
            "programs_run": backend.runs, "memory_stall_cycles": backend.stall_cycles,
            "dram_words_written": backend.words_written, "dram_words_read": backend.words_read,
            "frames_recovered": backend.link.frames_recovered}


def _decode_steps(steps):
    return [s for s in steps if s.phase == "decode"]


def _host_ops(steps) -> dict[str, float]:
    """The host's work per decode token by op (a program's prologue and epilogue:
    ``<op>:io``): how many nodes of each ran, averaged over ``steps``."""
    counts: dict[str, int] = {}
    for s in steps:
        for h in s.host:
            counts[h.op] = counts.get(h.op, 0) + 1
    return {op: n / len(steps) for op, n in sorted(counts.items())}


def _formats(weights: dict) -> tuple[str, int | str, int | str, str]:
    """(pattern, bits, group, method-independent label) of the weights: one format, or the
    mix of a searched assignment."""
    fmts = {w.fmt for w in weights.values()}
    if len(fmts) == 1:
        (f,) = fmts
        return str(f.pattern), f.bits, f.group, f"{f.pattern} INT{f.bits} g{f.group}"
    names = sorted(f.name for f in fmts)
    return "mixed", "mixed", "mixed", "mixed (" + ", ".join(names) + ")"


def _report(opts, cfg, weights, src, exe, gen, tokens, match, dense_steps, ppl, bits,
            compress_s, wall) -> dict:
    dec = _decode_steps(gen.steps)
    dense = _decode_steps(dense_steps)
    cycles = float(np.mean([s.cycles for s in dec]))
    dense_cycles = float(np.mean([s.cycles for s in dense]))
    host_unit = float(np.mean([s.host_unit_cycles for s in dec]))
    bound = float(np.mean([sum(p.bound_cycles for p in s.programs) for s in dec]))
    instr_bytes = float(np.mean([sum(exe.programs[p.program].instructions for p in s.programs)
                                 for s in dec])) * INSTR_BYTES
    # On a board the clock is the board's (LiteDRAM's sys), whatever the accelerator alone reaches.
    synth = None if opts.backend in BOARD_BACKENDS else _synthesised_clock(cfg)
    rep = exe.report
    pattern, wbits, group, label = _formats({k: w for k, w in weights.items() if k != HEAD})
    return {
        "model": src.name, "pattern": pattern, "bits": wbits, "group": group,
        "format": label, "method": "from the file" if src.weights else opts.method,
        "backend": opts.backend, "prompt_tokens": len(gen.prompt),
        "new_tokens": len(tokens), "tokens_match_twin": match,
        "vector_numerics": opts.vector_numerics, "kv_bits": opts.kv_bits,
        "lm_head": weights[HEAD].fmt.name if HEAD in weights else "host",
        "cycles_per_token": cycles,
        "tokens_per_s_sim": cfg.clock_mhz * 1e6 / cycles,
        "clock_mhz": cfg.clock_mhz,
        "synthesised_clock": synth,
        "tokens_per_s_at_synthesised_clock":
            synth["fmax_mhz"] * 1e6 / cycles if synth else None,
        "speedup_vs_dense": dense_cycles / cycles,
        "dense_int4_cycles_per_token": dense_cycles,
        "utilisation": float(np.mean([s.counter("mac_cycles") / s.cycles for s in dec])),
        "programs_per_token": float(np.mean([len(s.programs) for s in dec])),
        "vector_programs_per_token": float(np.mean([sum(
            exe.programs[p.program].vector is not None or bool(exe.programs[p.program].parts)
            for p in s.programs) for s in dec])),
        "fused_programs_per_token": float(np.mean([sum(
            bool(exe.programs[p.program].parts) for p in s.programs) for s in dec])),
        "instruction_bytes_per_token": instr_bytes,
        "host_transitions_per_token": float(np.mean([s.transitions for s in dec])),
        "host_unit_cycles_per_token_estimated": host_unit,
        "host_ms_per_token": 1e3 * float(np.mean([s.host_wall_s for s in dec])),
        "host_io_ms_per_token": 1e3 * float(np.mean([s.host_io_s for s in dec])),
        "host_ops_per_token": _host_ops(dec),
        "host_read_back_bytes_per_token": float(np.mean([s.read_back_bytes for s in dec])),
        "host_written_bytes_per_token": float(np.mean([s.written_bytes for s in dec])),
        "dram_read_bytes_per_token": float(np.mean([s.counter("dram_read_beats")
                                                     for s in dec])) * cfg.beat_bytes,
        "roofline_fraction": bound / cycles,
        "roofline_fraction_end_to_end": bound / (cycles + host_unit),
        "prefill_cycles": gen.steps[0].cycles,
        "ppl_fp32": ppl.get("fp32"), "ppl_compressed": ppl.get("compressed"),
        "bits_per_weight": bits, "compress_s": compress_s,
        "compile_s": rep["compile_s"], "capture_s": rep["capture_s"],
        "programs": rep["programs"], "instructions": rep["instructions"],
        "dram_bytes": rep["dram"], "arena_bytes": rep["arena_bytes"],
        "arena_lower_bound_bytes": rep["arena_lower_bound_bytes"],
        "passes": {ph: d["passes"] for ph, d in rep["phases"].items()},
        "config": cfg.to_dict(), "note": src.note, "wall_s": wall,
    }


def _synthesised_clock(cfg: AcceleratorConfig) -> dict | None:
    """The clock the recorded synthesis of this configuration reached, if there is one
    (:func:`hw.synth.synthesised_clock`)."""
    clock = synthesised_clock(cfg)
    if clock is None:
        return None
    return {"fmax_mhz": clock.mhz, "after": "routing" if clock.routed else "placement"}


def _write(out: Path, opts, cfg, exe, gen, report, src, tokens, prompt_text: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    executable_io.save(exe, out / "executable.safetensors")
    dec = _decode_steps(gen.steps)
    last = dec[-1]
    # MACs against intensity: the vector engine's programs (no MACs) have no point on it
    points = [p for p in last.roofline_points() if p.macs]
    vector = sum(exe.programs[p.program].vector is not None for p in last.programs)
    plot_roofline(points, cfg, out / "roofline.png",
                  f"one decode step at position {last.past}: {len(last.programs)} programs, "
                  "summed per kind over the blocks"
                  + (f" ({vector} vector programs not shown)" if vector else ""))
    if any(p.trace is not None for p in last.programs):
        write_step_trace(out / "decode_trace.json", exe, last)
    (out / "report.md").write_text(_markdown(report, src.decode(tokens), prompt_text))


def _markdown(r: dict, text: str, prompt_text: str) -> str:
    def f(x, spec=".3f"):
        return "n/a" if x is None else format(x, spec)
    synth = r["synthesised_clock"]
    lines = [
        f"# sw.deploy: {r['model']}, {r['format']} ({r['method']}) on the {r['backend']} "
        "backend", "",
        "```", f"{prompt_text}{text}", "```", "",
        "| quantity | value |", "|---|---|",
        f"| generated tokens equal the model-level twin's | {r['tokens_match_twin']} |",
        "| recipe | " + (f"{r['recipe']} ({r['recipe_why']})" if r.get("recipe")
                         else "from the compressed file") + " |",
        f"| simulated DRAM | {r['dram_sizing']['size_bytes']:,} bytes "
        f"({r['dram_sizing']['how']}); the model needs {r['dram_sizing']['needed_bytes']:,} |",
        f"| perplexity fp32 -> compressed (accelerator numerics) | {f(r['ppl_fp32'])} -> "
        f"{f(r['ppl_compressed'])} |",
        f"| storage | {r['bits_per_weight']:.3f} bits/weight ({16 / r['bits_per_weight']:.2f}x "
        "smaller than FP16) |",
        f"| accelerator cycles per decode token | {r['cycles_per_token']:,.0f} |",
        f"| simulated tokens/s at {r['clock_mhz']:g} MHz | {r['tokens_per_s_sim']:,.1f} |",
        "| at the synthesised clock | " + (
            f"{r['tokens_per_s_at_synthesised_clock']:,.1f} ({synth['fmax_mhz']:.1f} MHz, "
            f"after {synth['after']})" if synth else "no synthesis of this configuration on "
            "record") + " |",
        f"| speedup over dense INT4 on the same hardware | {r['speedup_vs_dense']:.2f}x |",
        f"| array utilisation (MAC cycles / cycles) | {r['utilisation']:.1%} |",
        f"| DRAM bytes read per token | {r['dram_read_bytes_per_token']:,.0f} |",
        f"| roofline fraction: accelerator programs / end to end (host work on chip, "
        f"estimated) | {r['roofline_fraction']:.1%} / {r['roofline_fraction_end_to_end']:.1%} |",
        f"| programs / host <-> accelerator transitions / instruction bytes per token | "
        f"{r['programs_per_token']:.0f} / {r['host_transitions_per_token']:.0f} / "
        f"{r['instruction_bytes_per_token']:,.0f} |",
        f"| host work per token: wall on this machine / estimated on-chip cycles | "
        f"{r['host_ms_per_token']:.2f} ms / "
        f"{r['host_unit_cycles_per_token_estimated']:,.0f} |",
        f"| run-time parameters per token (registers, words, token id read back): wall | "
        f"{r['host_io_ms_per_token']:.3f} ms |",
        f"| compile (passes, planning, lowering) / capture | {r['compile_s']:.2f} s / "
        f"{r['capture_s']:.2f} s |", "",
        "## Compiler passes (decode step, run to a fixpoint)", "",
        "| round | pass | matches | nodes before | nodes after | ms |",
        "|---|---|---|---|---|---|"]
    for p in r["passes"].get("decode", []):
        lines.append(f"| {p['round']} | {p['pass']} | {p['matches']} | {p['nodes_before']} | "
                     f"{p['nodes_after']} | {p['seconds'] * 1e3:.2f} |")
    lines += ["", "![roofline of one decode step](roofline.png)", "",
              "`decode_trace.json` is a Perfetto timeline of one decode step "
              "(ui.perfetto.dev); `executable.safetensors` the compiled model.", ""]
    if r.get("recipe_layers"):
        lines += ["## Recipe: the format of each layer group", "",
                  "| layers | format |", "|---|---|"]
        lines += [f"| {unit} | {fmt} |" for unit, fmt in r["recipe_layers"].items()] + [""]
    if r["note"]:
        lines += [f"Model: {r['note']}.", ""]
    return "\n".join(lines)


def _print_summary(r: dict, text: str, prompt_text: str, log) -> None:
    log("")
    log(f"--- generated on the {r['backend']} backend:\n{prompt_text}{text}")
    log("---")
    match = {True: "yes", False: "NO", None: "not checked (timing-only)"}[r["tokens_match_twin"]]
    log(f"tokens equal the model-level twin's: {match}")
    log(f"decode: {r['cycles_per_token']:,.0f} cycles/token = {r['tokens_per_s_sim']:,.1f} "
        f"tokens/s at {r['clock_mhz']:g} MHz"
        + (f" ({r['tokens_per_s_at_synthesised_clock']:,.1f} at the synthesised "
           f"{r['synthesised_clock']['fmax_mhz']:.1f} MHz)" if r["synthesised_clock"] else "")
        + f"; {r['speedup_vs_dense']:.2f}x dense INT4; utilisation {r['utilisation']:.1%}; "
        f"{r['dram_read_bytes_per_token']:,.0f} DRAM bytes/token; roofline "
        f"{r['roofline_fraction']:.1%} ({r['roofline_fraction_end_to_end']:.1%} end to end); "
        f"{r['programs_per_token']:.0f} programs, {r['host_transitions_per_token']:.0f} host "
        f"transitions; host work {r['host_ms_per_token']:.2f} ms/token, run-time parameters "
        f"{r['host_io_ms_per_token']:.3f} ms/token")


# ---------------------------------------------------------------------- command line
#: The files ``--out`` receives (decode_trace.json only from backends that trace).
OUTPUTS = ("report.json", "report.md", "roofline.png", "decode_trace.json",
           "executable.safetensors")


@command("sw.deploy")
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    opts = DeployOptions(**{k: v for k, v in vars(args).items()})
    out = Path(opts.out)
    if out.exists() and not out.is_dir():
        print(f"sw.deploy: --out {out}: exists and is not a directory", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=_parent(out)))
    try:
        deploy(opts, tmp)
        publish(tmp, out, OUTPUTS)
        print(f"wrote {out}/{', '.join(n for n in OUTPUTS if (out / n).exists())}")
        return 0
    except UsageError as e:
        print(f"sw.deploy: {e}", file=sys.stderr)
        return 2
    except (CompileError, RuntimeFault) as e:
        print(f"sw.deploy: {e}", file=sys.stderr)
        return 2 if isinstance(e, CompileError) else 1
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _parent(out: Path) -> Path:
    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    return parent


if __name__ == "__main__":
    sys.exit(main())
