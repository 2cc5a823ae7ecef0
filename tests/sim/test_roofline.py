"""The roofline plot is readable: tick labels never run into each other, and every point keeps
a number of its own, clear of the markers, the roofline and the other numbers, even where
points of the same intensity coincide (the demo's decode step: 4 of 6 within a few pixels)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from hw.config import AcceleratorConfig
from sim.roofline import LayerPoint, label_offsets, plot_roofline, roofline_figure

#: The demo's decode step (``python -m sw.deploy``): intensity (MACs/byte) and MACs/cycle.
DEMO = {"self_attn.q_proj+2": (1.27, 17.1), "self_attn.scores": (1.6, 14.5),
        "self_attn.values": (1.93, 16.3), "self_attn.o_proj": (1.26, 16.4),
        "mlp.gate_proj+1": (1.24, 17.5), "mlp.down_proj": (1.26, 18.0)}


def _points(spec: dict[str, tuple[float, float]]) -> list[LayerPoint]:
    macs = 10 ** 6
    return [LayerPoint(name, round(macs / x), 1000, macs, round(macs / y))
            for name, (x, y) in spec.items()]


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _wide() -> dict[str, tuple[float, float]]:
    rng = np.random.default_rng(0)
    cfg = AcceleratorConfig()
    out = {}
    for i in range(20):
        x = 10 ** rng.uniform(-1.5, 2)
        out[f"layer{i}"] = (x, min(cfg.peak_macs_per_cycle, cfg.beat_bytes * x)
                            * rng.uniform(0.3, 0.95))
    return out


@pytest.mark.parametrize("spec", [DEMO, _wide()], ids=["demo", "wide"])
def test_ticks_and_numbers_do_not_overprint(spec):
    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    cfg = AcceleratorConfig()
    fig = roofline_figure(_points(spec), cfg, "test")
    try:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        for axis in (ax.xaxis, ax.yaxis):
            labels = [t.get_window_extent(renderer) for t in axis.get_ticklabels()
                      if t.get_visible() and t.get_text()]
            assert len(labels) >= 2, "a log axis with fewer than two labelled ticks"
            for a, b in itertools.combinations(labels, 2):
                assert not _overlap(a, b), (a, b)
        numbers = [t for t in ax.texts if t.get_text().isdigit()]
        assert sorted(int(t.get_text()) for t in numbers) == list(range(1, len(spec) + 1))
        # the text alone (an Annotation's own extent includes its leader line)
        boxes = [Text.get_window_extent(t, renderer) for t in numbers]
        for a, b in itertools.combinations(boxes, 2):
            assert not _overlap(a, b), (a, b)
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert all(f"{i}: {name} (" in legend[i] for i, name in enumerate(spec, 1))
    finally:
        plt.close(fig)


def test_label_offsets_keep_clear_of_markers_obstacles_and_each_other():
    # four points within 3 pixels of each other, a line of obstacles through them
    points = np.array([[100.0, 100.0], [102.0, 101.0], [101.0, 98.0], [99.0, 102.0],
                       [160.0, 60.0]])
    line = np.c_[np.linspace(0, 200, 101), np.linspace(0, 200, 101)]
    w, h, marker, frame = 8.0, 11.0, 10.0, (0.0, 0.0, 200.0, 200.0)
    offsets = label_offsets(points, line, (w, h), marker, frame)
    centres = points + np.array(offsets)
    half = np.array([w / 2, h / 2])
    for i, c in enumerate(centres):
        assert frame[0] <= c[0] - w / 2 and c[0] + w / 2 <= frame[2], i
        assert frame[1] <= c[1] - h / 2 and c[1] + h / 2 <= frame[3], i
        assert np.all(np.any(np.abs(points - c) >= half + marker / 2, axis=1)), i
        assert np.all(np.any(np.abs(line - c) >= half + 1.0, axis=1)), i
        others = np.delete(centres, i, axis=0)
        assert np.all(np.any(np.abs(others - c) >= 2 * half, axis=1)), i


def test_plot_writes_a_png(tmp_path):
    path = plot_roofline(_points(DEMO), AcceleratorConfig(), tmp_path / "sub" / "r.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
