"""python -m sw.compress -- compress a model (or loose layers) and report storage and error.

MODEL is one of
  a model: 'reference', 'smollm2', a Hugging Face directory, a .gguf file. Every linear layer
      but the head is compressed with --method (calibrated on --calib windows of the standard
      library's train split) and --out writes a self-contained compressed model: compressed
      matrices, every other tensor, the configuration, the tokenizer and the recipe, all
      checksummed. It loads back with `--model FILE` / `--checkpoint FILE` in sw.deploy and
      sw.models.eval;
  a compressed model (.safetensors written by --out): checked and summarised; --export-hf DIR
      writes it as a Hugging Face directory with the dequantised weights;
  loose layers: a safetensors file, or a directory of them without config.json (the tensors
      matching --select, compressed one by one; rtn/magnitude only);
  nothing: one block of random LLaMA-7B-shaped layers (--blocks).

examples:
  python -m sw.compress reference --method sparsegpt+gptq --out m.safetensors
  python -m sw.compress m.safetensors --export-hf m_hf
  python -m sw.compress smollm2 --method wanda+gptq --pattern 2:4 --calib 64 --out s.safetensors
  python -m sw.compress --blocks 2 --pattern dense --json report.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

from hw.cli import OneLineParser, command
from hw.config import WEIGHT_BITS, AcceleratorConfig, ConfigError, NMPattern
from hw.format import (
    FormatError,
    QuantizedWeight,
    WeightFormat,
    storage_warning,
    stream_layout,
)
from sw.artifact import atomic_write
from sw.cli import UsageError, add_tokenizer_option
from sw.compress.calibrate import CalibrationError
from sw.compress.model import COMPRESS_METHODS, calibrates, compress_llama, selected_linears
from sw.compress.report import (
    LayerReport,
    compress_layers,
    format_table,
    llama_layer_shapes,
    random_llama_layers,
)
from sw.models import corpus
from sw.models.compressed import (
    CompressedFileError,
    CompressedModel,
    check_export_dir,
    export_hf,
    from_llama,
    is_compressed,
    load,
    save,
)
from sw.models.source import ModelSourceError, open_model

DEFAULT_SELECT = r"(q|k|v|o|gate|up|down)_proj\.weight$"
#: Methods that need no calibration data: the only ones for loose layers.
NO_CALIBRATION = tuple(m for m, (base, _) in COMPRESS_METHODS.items() if base == "magnitude")


def _parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog="python -m sw.compress", name="sw.compress",
                       description=__doc__.split("\n\n", 1)[1],
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", metavar="MODEL",
                    help="model, compressed model or loose layers (see above; default: "
                    "random LLaMA-7B-shaped layers)")
    ap.add_argument("--method", default="magnitude",
                    help=f"compression method, one of {', '.join(sorted(COMPRESS_METHODS))}; "
                    f"loose layers take {', '.join(NO_CALIBRATION)} (default: %(default)s)")
    ap.add_argument("--pattern", default="2:4",
                    help="N:M pattern or 'dense' (default: %(default)s)")
    ap.add_argument("--bits", type=int, default=4, choices=WEIGHT_BITS,
                    help="weight bits (default: %(default)s)")
    ap.add_argument("--group", type=int, default=128,
                    help="quantisation group along K, 0 = whole row (default: %(default)s)")
    ap.add_argument("--asym", action="store_true",
                    help="asymmetric quantisation with zero points (default: symmetric)")
    ap.add_argument("--calib", type=int, default=32,
                    help="calibration sequences (default: %(default)s)")
    ap.add_argument("--seq-len", type=int, default=256,
                    help="tokens per calibration sequence, at most the model's context "
                    "(default: %(default)s)")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the calibration windows (default: %(default)s)")
    ap.add_argument("--calib-domain", default=corpus.CODE, choices=corpus.CALIBRATION_SETS,
                    help="calibration text, train splits: CPython source ('code'), English "
                         "news ('prose') or half of each (default: %(default)s)")
    add_tokenizer_option(ap, "MODEL")
    ap.add_argument("--config", type=Path, default=None,
                    help="accelerator configuration JSON the format must stream on (default: "
                    "the default configuration, AcceleratorConfig())")
    ap.add_argument("--lanes", type=int, default=None,
                    help="array lanes the streams are packed for (default: the "
                    f"configuration's, {AcceleratorConfig().lanes} for the default one)")
    ap.add_argument("--select", default=DEFAULT_SELECT,
                    help=f"regex of loose-layer tensor names to compress (default: "
                    f"{DEFAULT_SELECT})")
    ap.add_argument("--demo", action="store_true",
                    help="compress random LLaMA-7B-shaped layers even if MODEL is given "
                    "(default: off)")
    ap.add_argument("--blocks", type=int, default=1,
                    help="random LLaMA-7B-shaped blocks (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=None,
                    help="write the compressed model or layers (.safetensors); an existing "
                    "file is refused unless --force (default: none)")
    ap.add_argument("--force", action="store_true",
                    help="let --out replace an existing file (default: off)")
    ap.add_argument("--json", type=Path, default=None,
                    help="write the per-layer report as JSON (default: none)")
    ap.add_argument("--export-hf", type=Path, default=None, metavar="DIR",
                    help="write the compressed model as a Hugging Face directory with "
                    "dequantised weights (default: none)")
    ap.add_argument("--quiet", action="store_true", help="no progress bars (default: off)")
    return ap


# ---------------------------------------------------------------------- what MODEL is
def _kind(args) -> str:
    """``random``, ``layers``, ``compressed`` or ``model``."""
    if args.model is None or args.demo:
        return "random"
    path = Path(args.model)
    if path.is_dir() and not (path / "config.json").is_file():
        return "layers"
    if path.suffix == ".safetensors" and path.is_file():
        return "compressed" if is_compressed(path) else "layers"
    return "model"


def _accelerator(args) -> AcceleratorConfig:
    if args.config is None:
        return AcceleratorConfig()
    try:
        return AcceleratorConfig.load(args.config)
    except ConfigError as e:
        raise UsageError(f"--config {e}") from None


def _format(args) -> WeightFormat:
    """The weight format of the options, refused unless the accelerator can stream it."""
    try:
        pattern = NMPattern.parse(args.pattern)
    except ConfigError as e:
        raise UsageError(f"--pattern {args.pattern!r}: {e}") from None
    try:
        fmt = WeightFormat(pattern, args.bits, args.group, symmetric=not args.asym)
        fmt.check_supported(_accelerator(args))
    except (FormatError, ConfigError, ValueError) as e:
        raise UsageError(f"--pattern {args.pattern} --bits {args.bits} --group {args.group}: "
                         f"{e}") from None
    return fmt


def _check(args, kind: str) -> None:
    if args.method not in COMPRESS_METHODS:
        raise UsageError(f"--method {args.method!r}: choose one of "
                         f"{', '.join(sorted(COMPRESS_METHODS))}")
    if args.lanes is None:
        args.lanes = _accelerator(args).lanes
    for opt in ("calib", "seq_len", "lanes", "blocks"):
        if getattr(args, opt) < 1:
            raise UsageError(f"--{opt.replace('_', '-')} must be >= 1, got {getattr(args, opt)}")
    if kind in ("random", "layers"):
        if args.method not in NO_CALIBRATION:
            raise UsageError(f"--method {args.method}: loose layers have no model to calibrate "
                             f"on; use {', '.join(NO_CALIBRATION)} or give a model")
        if args.export_hf:
            raise UsageError("--export-hf: loose layers are not a model")
    if args.tokenizer is not None and kind != "model":
        raise UsageError(f"--tokenizer {args.tokenizer}: only a model MODEL takes one (MODEL is "
                         + ("a compressed model, which holds its own)" if kind == "compressed"
                            else "loose layers)"))
    if args.export_hf:
        try:
            check_export_dir(args.export_hf)
        except FileExistsError as e:
            raise UsageError(f"--export-hf: {e}") from None
    if args.out is not None and (args.out.is_dir()
                                 or (args.out.exists() and not args.force)):
        raise UsageError(f"--out {args.out}: " + (
            "is a directory" if args.out.is_dir() else "exists (--force replaces it)"))
    if kind == "compressed" and (args.out or args.json):
        raise UsageError(f"--{'out' if args.out else 'json'}: {args.model} is already a "
                         "compressed model (--export-hf DIR writes it as a Hugging Face "
                         "directory)")


# ---------------------------------------------------------------------- the modes
def _safetensor_layers(path: Path, select: str):
    """Yield ``(name, float32 array)`` of the selected 2-D tensors of a file or directory."""
    from safetensors import SafetensorError, safe_open
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files:
        raise UsageError(f"{path}: no .safetensors files")
    pat = re.compile(select)
    names = []
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as h:
                names += [(f, n) for n in h.keys() if pat.search(n)]
        except (SafetensorError, OSError) as e:
            raise UsageError(f"{f}: not a readable safetensors file ({e})") from None
    if not names:
        raise UsageError(f"{path}: no tensor matches --select {select!r}")

    def gen():
        for f, n in names:
            with safe_open(str(f), framework="pt") as h:
                t = h.get_tensor(n)
            if t.ndim != 2:
                continue
            yield n.removesuffix(".weight"), t.float().numpy()
    return gen(), len(names)


def _layers(args, kind: str, fmt: WeightFormat) -> tuple[list[LayerReport], CompressedModel]:
    if kind == "layers":
        layers, total = _safetensor_layers(Path(args.model), args.select)
        source = str(args.model)
    else:
        layers = random_llama_layers(args.blocks)
        total = args.blocks * len(llama_layer_shapes())
        source = f"{args.blocks} random LLaMA-7B-shaped block(s)"
    print(f"compressing {source}: {fmt.pattern} int{fmt.bits} group {fmt.group or 'row'} "
          f"{'asym' if args.asym else 'sym'}, streams for {args.lanes} lanes")
    reports, kept = compress_layers(layers, fmt, lanes=args.lanes, total=total,
                                    keep=args.out is not None, progress=not args.quiet)
    return reports, CompressedModel(weights=kept, meta={"source": source},
                                    recipe=_recipe(args, fmt, calibrated=False))


def _recipe(args, fmt: WeightFormat, calibrated: bool, seq_len: int | None = None) -> dict:
    r = {"method": args.method, "pattern": str(fmt.pattern), "bits": fmt.bits,
         "group": fmt.group, "symmetric": fmt.symmetric, "lanes": args.lanes}
    if calibrated:
        r["calibration"] = {"sequences": args.calib, "seq_len": seq_len, "seed": args.seed,
                            "split": "train", "text": args.calib_domain}
    return r


def _report(name: str, w: np.ndarray, qw: QuantizedWeight, lanes: int, seconds: float
            ) -> LayerReport:
    bpw = stream_layout(qw.fmt, *qw.shape, lanes).bits_per_weight
    err = float(np.linalg.norm(qw.dequantize() - w) / max(np.linalg.norm(w), 1e-30))
    return LayerReport(name=name, shape=qw.shape, pattern=str(qw.fmt.pattern), bits=qw.fmt.bits,
                       group=qw.fmt.group, bits_values=bpw["values"],
                       bits_indices=bpw["indices"], bits_scales=bpw["scales"],
                       bits_per_weight=bpw["total"], ratio_vs_fp16=16.0 / bpw["total"],
                       rel_error=err, seconds=seconds)


def _model(args, fmt: WeightFormat) -> tuple[list[LayerReport], CompressedModel]:
    try:
        src = open_model(args.model, option="MODEL", tokenizer=args.tokenizer)
    except ModelSourceError as e:
        raise UsageError(str(e)) from None
    model = src.model
    calibrated = calibrates(args.method)
    seq = min(args.seq_len, model.config.max_position_embeddings)
    print(f"compressing {src.name} ({model.num_parameters():,} parameters) with "
          f"{args.method}: {fmt.pattern} int{fmt.bits} group {fmt.group or 'row'} "
          f"{'asym' if args.asym else 'sym'}"
          + (f", {args.calib} x {seq} calibration tokens of {args.calib_domain}"
             if calibrated else "")
          + f", streams for {args.lanes} lanes")
    originals = {name: mod.weight.detach().float().numpy().copy()
                 for name, mod in selected_linears(model).items()}
    calibration = (src.calibration(args.calib, seq, args.seed, args.calib_domain)
                   if calibrated else None)
    t0 = time.perf_counter()
    try:
        weights = compress_llama(model, fmt, args.method, calibration,
                                 progress=not args.quiet)
    except (CalibrationError, ValueError, TypeError) as e:
        raise UsageError(f"--method {args.method}: {e}") from None
    seconds = time.perf_counter() - t0
    print(f"compressed in {seconds:.1f} s (calibrated layer-wise: no per-layer times)")
    reports = [_report(name.removeprefix("model."), originals[name], qw, args.lanes, 0.0)
               for name, qw in weights.items()]
    cm = from_llama(model, weights, tokenizer=src.tokenizer_record(),
                    recipe=_recipe(args, fmt, calibrated, seq),
                    meta={"source": src.name, "note": src.note,
                          "compress_s": round(seconds, 2)})
    return reports, cm


def _summary(path: str) -> CompressedModel:
    try:
        cm = load(path)
    except CompressedFileError as e:
        raise UsageError(str(e)) from None
    total = sum(w.shape[0] * w.shape[1] for w in cm.weights.values())
    lanes = (cm.recipe or {}).get("lanes", 64)
    bits = sum(stream_layout(w.fmt, *w.shape, lanes).bits_per_weight["total"] * w.shape[0]
               * w.shape[1] for w in cm.weights.values()) / max(total, 1)
    mc = cm.model_config
    print(f"{path}: checksums verified; {len(cm.weights)} compressed layers ({total:,} "
          f"weights, {bits:.3f} bits/weight), {len(cm.tensors)} float tensors"
          + (f"; model {mc.num_hidden_layers} layers, hidden {mc.hidden_size}, vocabulary "
             f"{mc.vocab_size}" if mc else "; loose layers (no model)"))
    print(f"source: {cm.meta.get('source', '?')}; recipe: {json.dumps(cm.recipe)}")
    return cm


def run(args) -> int:
    """Run the command for parsed ``args``; raises :class:`UsageError` on bad input."""
    kind = _kind(args)
    _check(args, kind)
    if kind == "compressed":
        cm = _summary(args.model)
    else:
        fmt = _format(args)
        reports, cm = _model(args, fmt) if kind == "model" else _layers(args, kind, fmt)
        print(format_table(reports))
        notes = dict.fromkeys(storage_warning(fmt, *r.shape, args.lanes) for r in reports)
        for note in filter(None, notes):
            print(f"note: {note}")
        if args.out:
            save(cm, args.out, lanes=args.lanes)
            print(f"wrote {args.out}")
        if args.json:
            text = json.dumps([r.to_dict() for r in reports], indent=1)
            atomic_write(args.json, lambda tmp: tmp.write_text(text))
            print(f"wrote {args.json}")
    if args.export_hf:
        try:
            export_hf(cm, args.export_hf, path=args.model)
        except (CompressedFileError, FileExistsError) as e:
            raise UsageError(f"--export-hf {args.export_hf}: {e}") from None
        print(f"wrote {args.export_hf}/config.json, model.safetensors, tokenizer.json, "
              "tokenizer_config.json")
    return 0


@command("sw.compress")
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return run(args)
    except (UsageError, FormatError, ConfigError, OSError) as e:
        print(f"sw.compress: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
