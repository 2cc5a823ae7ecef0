"""Compress a set of layers and report storage and error per layer and in total."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

import numpy as np
from tqdm import tqdm

from hw.format import QuantizedWeight, WeightFormat, stream_layout
from sw.compress.core import compress_matrix

__all__ = ["LayerReport", "compress_layers", "format_table", "llama_layer_shapes",
           "random_llama_layers"]

#: Linear layers of one LLaMA decoder block: name -> (out, in) per hidden/intermediate size.
_LLAMA_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LayerReport:
    """Storage and error of one compressed matrix."""

    name: str
    shape: tuple[int, int]
    pattern: str
    bits: int
    group: int
    bits_values: float
    bits_indices: float
    bits_scales: float
    bits_per_weight: float
    ratio_vs_fp16: float
    rel_error: float
    seconds: float

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d


def llama_layer_shapes(hidden: int = 4096, intermediate: int = 11008,
                       kv_hidden: int | None = None) -> dict[str, tuple[int, int]]:
    """Shapes ``(out, in)`` of the linear layers of one LLaMA block (LLaMA-7B by default)."""
    kv = kv_hidden or hidden
    return {"q_proj": (hidden, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden),
            "o_proj": (hidden, hidden), "gate_proj": (intermediate, hidden),
            "up_proj": (intermediate, hidden), "down_proj": (hidden, intermediate)}


def random_llama_layers(blocks: int = 1, seed: int = 0, hidden: int = 4096,
                        intermediate: int = 11008) -> Iterator[tuple[str, np.ndarray]]:
    """Gaussian weights with LLaMA-7B shapes (std 0.02), generated lazily, one at a time."""
    rng = np.random.default_rng(seed)
    for b in range(blocks):
        for name, shape in llama_layer_shapes(hidden, intermediate).items():
            yield f"layers.{b}.{name}", (rng.standard_normal(shape, dtype=np.float32) * 0.02)


def compress_layers(layers: Iterable[tuple[str, np.ndarray]], fmt: WeightFormat,
                    lanes: int = 64, total: int | None = None, keep: bool = False,
                    progress: bool = True
                    ) -> tuple[list[LayerReport], dict[str, QuantizedWeight]]:
    """Compress every ``(name, weight)``; return reports (and the compressed weights if
    ``keep``)."""
    reports, kept = [], {}
    for name, w in tqdm(layers, total=total, desc=f"compress {fmt.pattern} int{fmt.bits}",
                        unit="layer", disable=not progress):
        t0 = time.perf_counter()
        qw = compress_matrix(w, fmt, name=name)
        seconds = time.perf_counter() - t0
        w32 = np.asarray(w, dtype=np.float32)
        err = float(np.linalg.norm(qw.dequantize() - w32) / max(np.linalg.norm(w32), 1e-30))
        bpw = stream_layout(fmt, *qw.shape, lanes).bits_per_weight
        reports.append(LayerReport(
            name=name, shape=qw.shape, pattern=str(fmt.pattern), bits=fmt.bits,
            group=fmt.group, bits_values=bpw["values"], bits_indices=bpw["indices"],
            bits_scales=bpw["scales"], bits_per_weight=bpw["total"],
            ratio_vs_fp16=16.0 / bpw["total"], rel_error=err, seconds=seconds))
        if keep:
            kept[name] = qw
    return reports, kept


def total_report(reports: list[LayerReport]) -> LayerReport:
    """Weight-count-weighted totals over layers (errors as root of summed squared norms are not
    available here, so the error is the weight-count-weighted mean)."""
    counts = np.array([r.shape[0] * r.shape[1] for r in reports], dtype=np.float64)
    wavg = lambda xs: float(np.dot(counts, xs) / counts.sum())  # noqa: E731
    bpw = wavg([r.bits_per_weight for r in reports])
    r0 = reports[0]
    return LayerReport(
        name="TOTAL", shape=(int(counts.sum()), 1), pattern=r0.pattern, bits=r0.bits,
        group=r0.group, bits_values=wavg([r.bits_values for r in reports]),
        bits_indices=wavg([r.bits_indices for r in reports]),
        bits_scales=wavg([r.bits_scales for r in reports]), bits_per_weight=bpw,
        ratio_vs_fp16=16.0 / bpw, rel_error=wavg([r.rel_error for r in reports]),
        seconds=sum(r.seconds for r in reports))


def format_table(reports: list[LayerReport]) -> str:
    """A plain-text table with one row per layer and a total row."""
    head = (f"{'layer':<24}{'shape':>14}{'values':>8}{'index':>8}{'scales':>8}{'bits/w':>8}"
            f"{'vs fp16':>9}{'rel err':>9}{'time s':>8}")
    lines = [head, "-" * len(head)]
    rows = reports + ([total_report(reports)] if len(reports) > 1 else [])
    for r in rows:
        shape = f"{r.shape[0]}x{r.shape[1]}" if r.name != "TOTAL" else f"{r.shape[0]:,}"
        if r.name == "TOTAL":
            lines.append("-" * len(head))
        lines.append(f"{r.name:<24}{shape:>14}{r.bits_values:>8.3f}{r.bits_indices:>8.3f}"
                     f"{r.bits_scales:>8.3f}{r.bits_per_weight:>8.3f}{r.ratio_vs_fp16:>8.2f}x"
                     f"{r.rel_error:>9.4f}{r.seconds:>8.2f}")
    return "\n".join(lines)
