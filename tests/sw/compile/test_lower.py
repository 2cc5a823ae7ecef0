"""Lowering of graph nodes: the KV cache layout matches the packed stream the hardware reads."""

import numpy as np
import pytest

from hw.format import QuantizedWeight, WeightFormat, pack
from sw.compile.lower import KEY_FORMAT, VALUE_FORMAT, KVLayout, context_bucket


def _dense8(fmt: WeightFormat, w: np.ndarray) -> QuantizedWeight:
    n, k = w.shape
    kp = fmt.padded_k(k)
    vals = np.zeros((n, kp), np.int16)
    vals[:, :k] = w
    groups = kp // fmt.group_of(kp)
    return QuantizedWeight(fmt, (n, k), vals, None, np.ones((n, groups), np.uint8), None,
                           np.ones(n, np.float32))


@pytest.mark.parametrize("lanes, head_dim, max_context", [(16, 16, 40), (64, 128, 100),
                                                          (8, 24, 17)])
def test_kv_offsets_are_where_pack_puts_each_element(lanes, head_dim, max_context):
    rng = np.random.default_rng(lanes + head_dim)
    kv = KVLayout(head_dim, context_bucket(max_context), lanes, 16)
    k = rng.integers(-127, 128, (kv.max_context, head_dim)).astype(np.int8)
    region = np.zeros(kv.key_bytes, np.uint8)
    stream = pack(_dense8(KEY_FORMAT, k), lanes).reshape(kv.keys.tiles, -1)
    stride = kv.key_bytes // kv.keys.tiles
    for j in range(kv.keys.tiles):
        region[j * stride:j * stride + stream.shape[1]] = stream[j]
    pos = np.arange(kv.max_context)
    assert np.array_equal(region[kv.key_offsets(pos)].view(np.int8), k)
    v = rng.integers(-127, 128, (kv.max_context, head_dim)).astype(np.int8)
    region = np.zeros(kv.value_bytes, np.uint8)
    stream = pack(_dense8(VALUE_FORMAT, v.T.copy()), lanes).reshape(kv.values.tiles, -1)
    for j in range(kv.values.tiles):
        s = j * kv.value_tile_stride
        region[s:s + stream.shape[1]] = stream[j]
    assert np.array_equal(region[kv.value_offsets(pos)].view(np.int8), v)


def test_context_buckets_follow_the_value_stream_groups():
    assert [context_bucket(s) for s in (1, 16, 17, 33)] == [16, 16, 32, 48]
