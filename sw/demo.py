"""``python -m sw.demo`` (``make demo``): the whole pipeline on the shipped reference model.

1. load the trained reference model (a small LLaMA-style model, ``sw/models/reference``);
2. compress every linear layer to 2:4 sparsity + INT4 group-128 (SparseGPT with GPTQ-style
   error compensation, calibrated on the training split) and report the storage;
3. measure accuracy: perplexity of fp32, of the compressed model, and of the compressed model
   computing with the accelerator's exact integer numerics (INT8 activations);
4. generate text with both;
5. run block 0's seven linear layers on the fast cycle-accurate model, with the real activations
   of a prompt, and check the simulator's outputs equal the model-level hardware numerics bit
   for bit; report cycles, utilisation and DRAM traffic, and write a Perfetto trace.

Everything runs offline in a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import numpy as np
import torch

from hw.config import AcceleratorConfig, MemoryModel
from hw.format import WeightFormat, stream_layout
from hw.numerics import dequant_output, quantize_activations
from sim.model import FastModel
from sim.trace import write_trace
from sw.compile.linear import LayerSpec, build_layers
from sw.compress.model import HardwareLinear, compress_llama, use_hardware_numerics
from sw.models.eval import EvalProtocol, calibration_samples, perplexity
from sw.models.generate import generate
from sw.models.reference_model import load_reference
from sw.models.tokenizer import decode, encode

OUT = Path(__file__).resolve().parents[1] / "build" / "demo"


def _section(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 70 - len(title)))


def storage_table(weights: dict, lanes: int) -> tuple[str, float]:
    """Per-layer bits/weight table and the total compression ratio against FP16."""
    lines = [f"{'layer':<36}{'shape':>11}{'bits/w':>8}{'vs fp16':>9}"]
    bits = count = 0
    for name, qw in weights.items():
        bpw = stream_layout(qw.fmt, *qw.shape, lanes).bits_per_weight["total"]
        n = qw.shape[0] * qw.shape[1]
        bits += bpw * n
        count += n
        lines.append(f"{name.removeprefix('model.'):<36}{qw.shape[0]:>5}x{qw.shape[1]:<5}"
                     f"{bpw:>8.3f}{16 / bpw:>8.2f}x")
    lines.append(f"{'all compressed layers':<36}{count:>11,}{bits / count:>8.3f}"
                 f"{16 * count / bits:>8.2f}x")
    return "\n".join(lines), 16 * count / bits


def run_block_on_simulator(hw_model, weights: dict, prompt: torch.Tensor,
                           cfg: AcceleratorConfig) -> dict:
    """Capture block 0's linear inputs for ``prompt``, run them on the fast model, compare."""
    block = [n for n in weights if n.startswith("model.layers.0.")]
    captured: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = []
    for name in block:
        mod = hw_model.get_submodule(name)
        assert isinstance(mod, HardwareLinear)
        hooks.append(mod.register_forward_hook(
            lambda m, inp, out, name=name: captured.__setitem__(
                name, (inp[0][0].detach().clone(), out[0].detach().clone()))))
    with torch.no_grad():
        hw_model(prompt)
    for h in hooks:
        h.remove()
    specs, scales = [], []
    for name in block:
        x, _ = captured[name]
        a, s_x = quantize_activations(x.numpy())
        qw = weights[name]
        specs.append(LayerSpec(qw.fmt, qw.shape[0], qw.shape[1], a.shape[0], qw, a))
        scales.append(s_x)
    lp = build_layers(cfg, specs)
    t0 = time.perf_counter()
    r = FastModel(cfg).run(lp.program, lp.dram, trace=True)
    seconds = time.perf_counter() - t0
    exact = True
    for L, name in enumerate(block):
        y = dequant_output(lp.read_output(r.dram, L), weights[name].row_scale, scales[L])
        exact &= np.array_equal(y.view(np.uint32), captured[name][1].numpy().view(np.uint32))
    OUT.mkdir(parents=True, exist_ok=True)
    trace = write_trace(OUT / "block0_trace.json", lp.program, r.trace, cfg)
    return {"result": r, "program": lp, "seconds": seconds, "exact": exact, "trace": trace,
            "layers": [n.split(".")[-1] for n in block]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sw.demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="sparsegpt+gptq",
                    help="compression method (see sw.compress.model.COMPRESS_METHODS)")
    ap.add_argument("--pattern", default="2:4")
    ap.add_argument("--calib", type=int, default=64, help="calibration sequences of 256 tokens")
    ap.add_argument("--eval-tokens", type=int, default=16384)
    ap.add_argument("--prompt", default="class Stack:\n    def push(self, item")
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(2)
    t_all = time.perf_counter()
    cfg = AcceleratorConfig(memory=MemoryModel(size_bytes=1 << 23))

    _section("1. reference model")
    fp32 = load_reference()
    n_params = sum(p.numel() for p in fp32.parameters())
    print(f"{n_params:,} parameters, {fp32.config.num_hidden_layers} layers, hidden "
          f"{fp32.config.hidden_size}, trained on the Python standard library (byte-level)")

    _section(f"2. compress: {args.pattern} + INT4 g128, {args.method}")
    fmt = WeightFormat(args.pattern, 4, 128)
    model = copy.deepcopy(fp32)
    t0 = time.perf_counter()
    calib = calibration_samples(args.calib, 256, seed=0)
    weights = compress_llama(model, fmt, args.method, calib)
    print(f"compressed {len(weights)} layers in {time.perf_counter() - t0:.1f} s "
          f"(calibration: {args.calib} x 256 tokens of the training split)")
    table, ratio = storage_table(weights, cfg.lanes)
    print(table)

    _section("3. accuracy (held-out Python stdlib files)")
    proto = EvalProtocol(max_tokens=args.eval_tokens)
    hw_model = use_hardware_numerics(copy.deepcopy(model), weights)
    ppl = {}
    for label, m in (("fp32", fp32), (f"{args.pattern} INT4 (float)", model),
                     (f"{args.pattern} INT4 W4A8 hardware numerics", hw_model)):
        with torch.no_grad():
            ppl[label] = perplexity(m, proto).perplexity
        print(f"{label:<42} perplexity {ppl[label]:7.3f}")

    _section("4. generation (greedy)")
    prompt = torch.from_numpy(encode(args.prompt).astype(np.int64))[None]
    for label, m in (("fp32", fp32), ("hardware numerics", hw_model)):
        out = generate(m, prompt, max_new_tokens=60)
        text = decode(out[0, prompt.shape[1]:].tolist())
        print(f"--- {label}:\n{args.prompt}{text}")

    _section("5. block 0 on the cycle-accurate model")
    sim = run_block_on_simulator(hw_model, weights, prompt, cfg)
    r, lp = sim["result"], sim["program"]
    c = r.counters
    print(f"{len(sim['layers'])} layers ({', '.join(sim['layers'])}) x {prompt.shape[1]} "
          f"tokens in one program of {len(lp.program)} instructions on {cfg.rows}x{cfg.cols} "
          f"lanes, {cfg.beat_bytes} B/cycle DRAM at {cfg.clock_mhz:g} MHz")
    print(f"{r.cycles:,} cycles ({r.cycles / cfg.clock_mhz:,.1f} us), array utilisation "
          f"{r.utilisation:.1%}, DRAM read {c['dram_read_beats'] * cfg.beat_bytes:,} B, "
          f"load engine busy {c['load_exec'] / r.cycles:.1%}; simulated in "
          f"{sim['seconds'] * 1e3:.0f} ms")
    print(f"simulator outputs == model-level hardware numerics, bit for bit: "
          f"{'PASS' if sim['exact'] else 'FAIL'}")
    print(f"timeline: {sim['trace']} (open in ui.perfetto.dev)")
    print(f"\nstorage {ratio:.2f}x smaller than FP16; perplexity {ppl['fp32']:.3f} -> "
          f"{list(ppl.values())[-1]:.3f}; {time.perf_counter() - t_all:.0f} s in all. "
          f"`make sim` runs a layer on the RTL, `python -m bench.accuracy` every method.")
    return 0 if sim["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
