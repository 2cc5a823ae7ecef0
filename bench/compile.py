"""Compiler benchmark: compile time, program size, memory plan and the gain of the fusion
passes, for LLaMA-7B shapes (on the meta device: no weights) and the reference model.

``python -m bench.compile`` compiles a decode step (context 128) and a prefill (256 tokens for
LLaMA-7B, 64 for the reference model) with 2:4 INT4 g128 formats, with and without the fusion
passes, runs one step of each on the fast model (timing-only) and writes
``bench/results/compile.json`` (with ``--record``; by default under ``build/bench/``): per model
and phase ``capture_s`` (torch.export and
translation, timed apart), ``compile_s`` (passes, planning, lowering: the median of
``--repeats`` runs), ``instructions``, ``programs``, ``arena_bytes``,
``arena_lower_bound_bytes``, ``fused_cycles``, ``unfused_cycles`` (accelerator cycles of the
step) and ``host_transitions_per_token``; and the program size with and without hardware loops
(``CompileOptions(loops=True)``, :mod:`sw.compile.roll`): ``instruction_bytes_per_token`` /
``looped_instruction_bytes_per_token`` (the words of every program the step runs, per token),
``weight_bytes_per_token`` (weight streams the step reads, per token), their ratio
``looped_instruction_to_weight_bytes``, ``step_instructions`` / ``looped_step_instructions``
(words of the step's programs together), ``largest_program`` / ``looped_largest_program``
(instructions) and ``looped_cycles``.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from torch import nn

from bench.common import RESULTS, command, parser, positive_int, stamp, write_json
from bench.scaling import llama7b
from hw.config import AcceleratorConfig
from hw.format import WeightFormat
from sim.backends import make_backend
from sw.compile import CompileOptions, compile_model
from sw.models import LlamaLM
from sw.models.reference_model import load_reference
from sw.runtime import Runtime

FORMAT = WeightFormat("2:4", 4, 128)


def reference() -> LlamaLM:
    return load_reference()


def _formats(model: LlamaLM) -> dict[str, WeightFormat]:
    return {n: FORMAT for n, m in model.named_modules() if isinstance(m, nn.Linear)}


def _step(e, cfg, phase: str, tokens: int, context: int):
    """One step of executable ``e`` on the fast model (timing-only)."""
    rt = Runtime(e, make_backend("model-timing", cfg))
    if phase == "decode":
        rt.seek(context - 1)
        return rt.step(torch.zeros((1, 1), dtype=torch.long))[1]
    return rt.step(torch.zeros((1, tokens), dtype=torch.long))[1]


def program_sizes(e, st) -> dict:
    """Instruction and weight bytes of the programs step ``st`` of executable ``e`` ran, per
    token, and the largest of them (instructions)."""
    ran = [e.programs[p.program] for p in st.programs]
    words = sum(p.words.nbytes for p in ran)
    weights = sum(m.stream_bytes for p in ran for m in p.members if m.row_scale is not None)
    return {"instruction_bytes_per_token": words / st.tokens,
            "weight_bytes_per_token": weights / st.tokens,
            "step_instructions": sum(p.instructions for p in ran),
            "largest_program": max((p.instructions for p in ran), default=0)}


def measure(name: str, model: LlamaLM, cfg, phase: str, tokens: int, context: int,
            repeats: int) -> dict:
    """Compile one phase (fused, unfused, fused with hardware loops) and run one step of each,
    timing-only."""
    prompt = tokens if phase == "prefill" else context - 1
    opts = dict(prompt_tokens=prompt, max_context=context, decode_contexts=(context,),
                phases=(phase,))
    walls, exe = [], None
    for _ in range(repeats):
        exe = compile_model(model, cfg, CompileOptions(**opts), formats=_formats(model))
        walls.append(exe.report["compile_s"])
    cycles = {}
    for fuse in (True, False):
        e = exe if fuse else compile_model(model, cfg, CompileOptions(**opts, fuse=False),
                                           formats=_formats(model))
        cycles[fuse] = _step(e, cfg, phase, tokens, context)
    looped = compile_model(model, cfg, CompileOptions(**opts, loops=True),
                           formats=_formats(model))
    st_loop = _step(looped, cfg, phase, tokens, context)
    sizes = program_sizes(exe, cycles[True])
    sizes_loop = program_sizes(looped, st_loop)
    rep = exe.report
    ph = rep["phases"][phase]
    return {"model": name, "phase": phase, "tokens": tokens, "context": context,
            "capture_s": rep["capture_s"], "compile_s": statistics.median(walls),
            "instructions": rep["instructions"], "programs": rep["programs"],
            "templates": rep["templates"], "arena_bytes": rep["arena_bytes"],
            "arena_lower_bound_bytes": rep["arena_lower_bound_bytes"],
            "fused_cycles": cycles[True].cycles, "unfused_cycles": cycles[False].cycles,
            "fused_host_unit_cycles": cycles[True].host_unit_cycles,
            "unfused_host_unit_cycles": cycles[False].host_unit_cycles,
            "host_transitions_per_token": cycles[True].transitions,
            "unfused_host_transitions_per_token": cycles[False].transitions,
            "nodes_captured": ph["nodes_captured"], "nodes": ph["nodes"],
            **sizes, "looped_cycles": st_loop.cycles,
            **{f"looped_{k}": v for k, v in sizes_loop.items() if k != "weight_bytes_per_token"},
            "looped_instruction_to_weight_bytes": sizes_loop["instruction_bytes_per_token"]
            / max(1, sizes["weight_bytes_per_token"])}


@command("bench.compile")
def main(argv: list[str] | None = None) -> int:
    ap = parser("python -m bench.compile", __doc__)
    ap.add_argument("--repeats", type=positive_int, default=3,
                    help="compilations per point; compile_s is their median")
    ap.add_argument("--out", default=str(RESULTS / "compile.json"), help="results JSON")
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    t0 = time.perf_counter()
    cfg7 = AcceleratorConfig().timing_only()  # LLaMA-7B's addresses and programs fit
    points = [("llama-7b", llama7b, cfg7, "decode", 1, 128),
              ("llama-7b", llama7b, cfg7, "prefill", 256, 256),
              ("reference", reference, AcceleratorConfig(), "decode", 1, 128),
              ("reference", reference, AcceleratorConfig(), "prefill", 64, 64)]
    head = (f"{'model':<10}{'phase':>8}{'capture s':>10}{'compile s':>10}{'instr':>10}"
            f"{'programs':>9}{'arena / bound':>15}{'fused cyc':>12}{'unfused':>12}{'gain':>7}"
            f"{'transitions':>12}{'instr B/token':>15}{'looped':>12}{'/ weight B':>11}"
            f"{'largest':>9}{'looped':>8}")
    print(head + "\n" + "-" * len(head))
    records = []
    models = {}
    for name, make, cfg, phase, tokens, context in points:
        model = models.setdefault(name, make())
        r = measure(name, model, cfg, phase, tokens, context, args.repeats)
        records.append(r)
        print(f"{name:<10}{phase:>8}{r['capture_s']:>10.2f}{r['compile_s']:>10.3f}"
              f"{r['instructions']:>10,}{r['programs']:>9}"
              f"{r['arena_bytes'] / max(1, r['arena_lower_bound_bytes']):>14.3f}x"
              f"{r['fused_cycles']:>12,}{r['unfused_cycles']:>12,}"
              f"{r['unfused_cycles'] / r['fused_cycles']:>6.3f}x"
              f"{r['host_transitions_per_token']:>6} vs {r['unfused_host_transitions_per_token']}"
              f"{r['instruction_bytes_per_token']:>15,.0f}"
              f"{r['looped_instruction_bytes_per_token']:>12,.0f}"
              f"{r['looped_instruction_to_weight_bytes']:>11.5f}"
              f"{r['largest_program']:>9,}{r['looped_largest_program']:>8,}", flush=True)
    write_json(Path(args.out), stamp(records, AcceleratorConfig()))
    print(f"wrote {args.out} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
