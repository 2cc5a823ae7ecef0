"""``python -m sw.compress``: compress weights and report storage and error per layer.

Examples
--------
``python -m sw.compress``    one block of random LLaMA-7B-shaped layers, 2:4 INT4 g128
``python -m sw.compress model_dir --pattern 4:8 --out m.safetensors``
``python -m sw.compress --blocks 2 --pattern dense --bits 4 --json report.json``
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from hw.config import ConfigError, NMPattern
from hw.format import FormatError, WeightFormat
from sw.compress.io import CompressedModel, save
from sw.compress.report import (
    compress_layers,
    format_table,
    llama_layer_shapes,
    random_llama_layers,
)

DEFAULT_SELECT = r"(q|k|v|o|gate|up|down)_proj\.weight$"


def _safetensor_layers(path: Path, select: str):
    """Yield ``(name, float32 array)`` of the selected 2-D tensors of a file or HF directory."""
    from safetensors import safe_open
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"{path}: no .safetensors files")
    pat = re.compile(select)
    names = []
    for f in files:
        with safe_open(str(f), framework="pt") as h:
            names += [(f, n) for n in h.keys() if pat.search(n)]
    if not names:
        raise ValueError(f"{path}: no tensor matches --select {select!r}")

    def gen():
        for f, n in names:
            with safe_open(str(f), framework="pt") as h:
                t = h.get_tensor(n)
            if t.ndim != 2:
                continue
            yield n.removesuffix(".weight"), t.float().numpy()
    return gen(), len(names)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sw.compress", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("weights", nargs="?", type=Path,
                    help="safetensors file or HF model directory (default: random LLaMA-7B "
                         "shaped layers)")
    ap.add_argument("--demo", action="store_true",
                    help="compress one block of built-in random LLaMA-7B-shaped layers")
    ap.add_argument("--blocks", type=int, default=1, help="random blocks to generate")
    ap.add_argument("--pattern", default="2:4", help="N:M pattern or 'dense' (default 2:4)")
    ap.add_argument("--bits", type=int, default=4, choices=(4, 8))
    ap.add_argument("--group", type=int, default=128, help="group size, 0 = whole row")
    ap.add_argument("--asym", action="store_true", help="asymmetric (zero points)")
    ap.add_argument("--lanes", type=int, default=64, help="array lanes the stream is packed for")
    ap.add_argument("--select", default=DEFAULT_SELECT, help="regex of tensor names to compress")
    ap.add_argument("--out", type=Path, help="write the compressed weights (.safetensors)")
    ap.add_argument("--json", type=Path, help="write the per-layer report as JSON")
    args = ap.parse_args(argv)
    try:
        fmt = WeightFormat(NMPattern.parse(args.pattern), args.bits, args.group,
                           symmetric=not args.asym)
        if args.weights and not args.demo:
            layers, total = _safetensor_layers(args.weights, args.select)
            source = str(args.weights)
        else:
            layers = random_llama_layers(args.blocks)
            total = args.blocks * len(llama_layer_shapes())
            source = f"{args.blocks} random LLaMA-7B-shaped block(s)"
        print(f"compressing {source}: {fmt.pattern} int{fmt.bits} group {fmt.group or 'row'} "
              f"{'asym' if args.asym else 'sym'}, streams for {args.lanes} lanes")
        reports, kept = compress_layers(layers, fmt, lanes=args.lanes, total=total,
                                        keep=args.out is not None)
    except (ConfigError, FormatError, ValueError, TypeError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_table(reports))
    if args.out:
        save(CompressedModel(weights=kept, meta={"source": source}), args.out, lanes=args.lanes)
        print(f"wrote {args.out}")
    if args.json:
        args.json.write_text(json.dumps([r.to_dict() for r in reports], indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
