"""Tiling: a layer's DRAM stream is its packed tiles, each on a beat, at one stride that every
user (plans, the weight image, the KV cache) derives from the stream layout alone."""

import numpy as np
import pytest

from hw.config import AcceleratorConfig
from hw.format import WeightFormat, pack, random_quantized, stream_layout
from sw.compile.tiling import plan_linear, stream_bytes, tile_stride, weight_image


@pytest.mark.parametrize("fmt, n, k", [(WeightFormat("2:4", 4, 128), 40, 1000),
                                       (WeightFormat("dense", 8, 0), 17, 72),
                                       (WeightFormat("1:8", 4, 64, symmetric=False), 64, 320)])
def test_weight_image_is_the_packed_tiles_at_the_tile_stride(fmt, n, k):
    cfg = AcceleratorConfig(rows=2, cols=8)
    w = random_quantized(fmt, (n, k), np.random.default_rng(n))
    lay = stream_layout(fmt, n, k, cfg.lanes)
    stride = tile_stride(lay, cfg.beat_bytes)
    assert stride % cfg.beat_bytes == 0 and 0 <= stride - lay.tile_bytes < cfg.beat_bytes
    image = weight_image(w, cfg.lanes, cfg.beat_bytes)
    assert image.size == stream_bytes(lay, cfg.beat_bytes) == lay.tiles * stride
    tiles = image.reshape(lay.tiles, stride)
    assert np.array_equal(tiles[:, :lay.tile_bytes].reshape(-1), pack(w, cfg.lanes))
    assert not tiles[:, lay.tile_bytes:].any()
    for tokens in (1, 7, 300):  # the plan's stride does not depend on the token count
        assert plan_linear(cfg, fmt, n, k, tokens).tile_stride == stride
