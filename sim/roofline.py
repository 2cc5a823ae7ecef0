"""Roofline bounds and plots: where each layer sits against compute and bandwidth limits.

The bound of a layer on a configuration is ``max(read_bytes / bw, write_bytes / bw, macs /
peak)`` cycles, with DRAM read and write channels of ``cfg.beat_bytes`` each per cycle (see
hw/config.py) and ``peak = cfg.lanes`` MACs per cycle on kept weights. Bytes are the minimum a
layer must move (the packed weight stream, activations in, results out, each once).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hw.config import AcceleratorConfig

__all__ = ["LayerPoint", "bound_cycles", "plot_roofline"]


@dataclass
class LayerPoint:
    """One simulated layer: its work and how long it took."""

    name: str
    read_bytes: int
    write_bytes: int
    macs: int
    cycles: int

    def bound(self, cfg: AcceleratorConfig) -> float:
        return bound_cycles(cfg, self.read_bytes, self.write_bytes, self.macs)

    def fraction(self, cfg: AcceleratorConfig) -> float:
        """Fraction of the roofline bound achieved (1.0 = at the bound)."""
        return self.bound(cfg) / self.cycles


def bound_cycles(cfg: AcceleratorConfig, read_bytes: int, write_bytes: int, macs: int) -> float:
    """Roofline lower bound in cycles."""
    bw = cfg.beat_bytes
    return max(read_bytes / bw, write_bytes / bw, macs / cfg.peak_macs_per_cycle)


def plot_roofline(points: list[LayerPoint], cfg: AcceleratorConfig, path: str | Path,
                  title: str = "") -> Path:
    """Achieved MACs/cycle against arithmetic intensity (MACs per DRAM byte), log-log."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    peak, bw = cfg.peak_macs_per_cycle, cfg.beat_bytes
    xs = np.array([p.macs / max(1, p.read_bytes) for p in points])
    ys = np.array([p.macs / p.cycles for p in points])
    lo, hi = min(xs.min(), peak / bw) / 4, max(xs.max(), peak / bw) * 4
    grid = np.geomspace(lo, hi, 200)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.loglog(grid, np.minimum(peak, bw * grid), "k-", lw=2, label="roofline")
    ax.axvline(peak / bw, color="gray", ls=":", lw=1)
    # Points of similar intensity overlap: name them in the legend, never on the plot.
    markers = "os^vD<>ph*"
    for i, (p, x, y) in enumerate(zip(points, xs, ys, strict=True)):
        ax.plot(x, y, markers[i % len(markers)], ms=7, alpha=0.8,
                label=f"{p.name} ({p.fraction(cfg):.0%} of bound)")
    ax.set_xlabel("arithmetic intensity (MACs per DRAM byte read)")
    ax.set_ylabel("achieved MACs per cycle")
    ax.set_title(title or f"{cfg.rows}x{cfg.cols} array, {bw} B/cycle", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7,
              ncol=1 if len(points) <= 16 else 2)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
