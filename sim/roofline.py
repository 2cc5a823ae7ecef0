"""Roofline bounds and plots: where each layer sits against compute and bandwidth limits.

The bound of a layer on a configuration is ``max(read_bytes / bw, write_bytes / bw, macs /
peak)`` cycles, with DRAM read and write channels of ``bw = cfg.dram_bytes_per_cycle`` each (a
beat per cycle, or per ``cycles_per_beat`` cycles on a paced port; see hw/config.py) and
``peak = cfg.lanes`` MACs per cycle on kept weights. Bytes are the minimum a layer must move
(the packed weight stream, activations in, results out, each once).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hw.config import AcceleratorConfig

__all__ = ["LayerPoint", "bound_cycles", "label_offsets", "plot_roofline", "roofline_figure"]


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
    bw = cfg.dram_bytes_per_cycle
    return max(read_bytes / bw, write_bytes / bw, macs / cfg.peak_macs_per_cycle)


#: Marker size of a layer point in the plot (points, matplotlib's ``ms``).
MARKER_PT = 7.0
#: Font size of the number that names a point (points).
LABEL_PT = 8.0


def label_offsets(points: np.ndarray, obstacles: np.ndarray, box: tuple[float, float],
                  marker: float, frame: tuple[float, float, float, float]
                  ) -> list[tuple[float, float]]:
    """Where to put each point's label so that no label covers a marker, an obstacle or
    another label: greedily, the first free spot on rings of growing radius around the point.

    Parameters
    ----------
    points : ndarray
        ``[n, 2]`` display coordinates of the points (pixels).
    obstacles : ndarray
        ``[m, 2]`` display coordinates of other things to keep clear of (the roofline).
    box : tuple of float
        Width and height of a label (pixels).
    marker : float
        Marker diameter (pixels).
    frame : tuple of float
        ``(x0, y0, x1, y1)`` the labels must stay inside (the axes).

    Returns
    -------
    list of tuple
        ``(dx, dy)`` of each label's centre from its point, in pixels (the last spot tried
        when none is free).

    >>> offs = label_offsets(np.array([[50.0, 50.0], [52.0, 51.0]]), np.zeros((0, 2)),
    ...                      (6.0, 9.0), 10.0, (0.0, 0.0, 100.0, 100.0))
    >>> len(offs), offs[0] != offs[1]
    (2, True)
    """
    w, h = box
    half = np.array([w / 2, h / 2])

    def clear(centre, boxes_at, halves):
        if len(boxes_at) == 0:
            return True
        return not np.any(np.all(np.abs(boxes_at - centre) < halves + half, axis=1))

    placed: list[np.ndarray] = []
    fixed = np.concatenate([points, obstacles]) if len(obstacles) else points
    fixed_half = np.concatenate([np.full((len(points), 2), marker / 2),
                                 np.full((len(obstacles), 2), 1.0)])
    angles = np.deg2rad([45, 135, -45, -135, 90, -90, 0, 180, 22.5, 157.5, -22.5, -157.5])
    out = []
    for p in points:
        spot = None
        for ring in (1.2, 2.0, 3.0, 4.2, 5.6, 7.5):
            r = ring * marker
            for a in angles:
                c = p + r * np.array([np.cos(a), np.sin(a)])
                inside = (frame[0] <= c[0] - w / 2 and c[0] + w / 2 <= frame[2]
                          and frame[1] <= c[1] - h / 2 and c[1] + h / 2 <= frame[3])
                if inside and clear(c, fixed, fixed_half) and clear(
                        c, np.array(placed).reshape(-1, 2), np.full((len(placed), 2), half)):
                    spot = c
                    break
            if spot is not None:
                break
        if spot is None:
            spot = c
        placed.append(spot)
        out.append((float(spot[0] - p[0]), float(spot[1] - p[1])))
    return out


def _log_ticks(axis, lo: float, hi: float) -> None:
    """Plain-number ticks on a log axis, as many per decade as the range leaves room for
    (1, 1.5, 2, 3, 4, 5, 7 within a decade; 1, 2, 3, 5 within 2; 1, 2, 5 within 4; 1 beyond),
    no minor labels: the default mathtext minor labels run into each other."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    decades = np.log10(hi / lo)
    subs = next(s for d, s in ((1, (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.0)), (2, (1.0, 2.0, 3.0, 5.0)),
                               (4, (1.0, 2.0, 5.0)), (np.inf, (1.0,))) if decades <= d)
    axis.set_major_locator(LogLocator(base=10, subs=subs))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def plot_roofline(points: list[LayerPoint], cfg: AcceleratorConfig, path: str | Path,
                  title: str = "") -> Path:
    """Write :func:`roofline_figure` as a PNG at ``path`` (creating the directory)."""
    import matplotlib.pyplot as plt

    fig = roofline_figure(points, cfg, title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def roofline_figure(points: list[LayerPoint], cfg: AcceleratorConfig, title: str = ""):
    """Achieved MACs/cycle against arithmetic intensity (MACs per DRAM byte), log-log, as a
    matplotlib Figure (Agg).

    Each point carries its number beside it (placed clear of the other points, labels and
    the roofline, with a leader line when it sits apart); the legend names the numbers."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peak, bw = cfg.peak_macs_per_cycle, cfg.dram_bytes_per_cycle
    xs = np.array([p.macs / max(1, p.read_bytes) for p in points])
    ys = np.array([p.macs / p.cycles for p in points])
    lo, hi = min(xs.min(), peak / bw) / 2, max(xs.max(), peak / bw) * 2
    grid = np.geomspace(lo, hi, 200)
    roof = np.minimum(peak, bw * grid)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.loglog(grid, roof, "k-", lw=2, label="roofline")
    ax.axvline(peak / bw, color="gray", ls=":", lw=1)
    ax.annotate(f"peak {peak:g} MACs/cycle", (hi, peak), xytext=(-4, 4),
                textcoords="offset points", ha="right", va="bottom", fontsize=8)
    ax.annotate(f"ridge {peak / bw:g} MACs/B ({bw} B/cycle)", (peak / bw, 0.02),
                xycoords=("data", "axes fraction"), xytext=(4, 0), textcoords="offset points",
                ha="left", va="bottom", fontsize=8, color="gray")
    ylo, yhi = min(roof.min(), ys.min()), max(roof.max(), ys.max())
    ax.set_xlim(lo / 1.1, hi * 1.1)
    ax.set_ylim(ylo / 1.25, yhi * 1.25)
    _log_ticks(ax.xaxis, lo, hi)
    _log_ticks(ax.yaxis, ylo, yhi)
    markers = "os^vD<>ph*"
    for i, (p, x, y) in enumerate(zip(points, xs, ys, strict=True)):
        # hollow: where points coincide, every outline stays visible
        ax.plot(x, y, markers[i % len(markers)], ms=MARKER_PT, mfc="none", mew=1.5,
                label=f"{i + 1}: {p.name} ({p.fraction(cfg):.0%} of bound)")
    ax.set_xlabel("arithmetic intensity (MACs per DRAM byte read)")
    ax.set_ylabel("achieved MACs per cycle")
    ax.set_title(title or f"{cfg.rows}x{cfg.cols} array, {bw} B/cycle", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7,
              ncol=1 if len(points) <= 16 else 2)
    fig.tight_layout()
    # Points of similar intensity overlap: number them, each number where it is readable.
    px = fig.dpi / 72
    to_disp = ax.transData.transform
    frame = ax.get_window_extent()
    digits = len(str(len(points)))
    offsets = label_offsets(to_disp(np.c_[xs, ys]), to_disp(np.c_[grid, roof]),
                            (0.65 * LABEL_PT * digits * px + 2, LABEL_PT * px + 2),
                            MARKER_PT * px, (frame.x0, frame.y0, frame.x1, frame.y1))
    for i, (x, y, (dx, dy)) in enumerate(zip(xs, ys, offsets, strict=True)):
        far = np.hypot(dx, dy) > 1.5 * MARKER_PT * px
        ax.annotate(str(i + 1), (x, y), xytext=(dx / px, dy / px), textcoords="offset points",
                    ha="center", va="center", fontsize=LABEL_PT,
                    arrowprops=dict(arrowstyle="-", lw=0.5, color="0.4", shrinkA=0,
                                    shrinkB=MARKER_PT / 2) if far else None)
    return fig
