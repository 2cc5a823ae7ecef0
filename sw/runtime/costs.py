"""Estimated cycles of the host's work if an on-chip vector unit did it.

The accelerator has no vector unit yet, so norms, rotary embeddings, softmax, the SiLU gate,
residual additions and the (de)quantisation around every program run on the host. To show
what they would cost on chip, each host operation is modelled as one streaming pass through
DRAM at the DMA's bandwidth: it reads its inputs and writes its outputs once, at
``cfg.beat_bytes`` per cycle in each direction (DRAM has separate read and write channels),
so ``cycles = ceil(max(bytes read, bytes written) / beat_bytes)``. Layout operations cost
nothing. This is an estimate, reported apart from the simulated accelerator cycles.
"""

from __future__ import annotations

from hw.config import AcceleratorConfig
from sw.compile.ir import LAYOUT_OPS

__all__ = ["stream_cycles", "host_op_cycles"]

#: Bytes per element of the IR's dtypes and of the accelerator's operands.
ITEMSIZE = {"f32": 4, "i64": 8, "i32": 4, "i8": 1}


def stream_cycles(read_bytes: int, write_bytes: int, cfg: AcceleratorConfig) -> int:
    """Cycles of one streaming pass that reads and writes these many bytes."""
    return -(-max(read_bytes, write_bytes) // cfg.beat_bytes)


def host_op_cycles(op: str, in_bytes: int, out_bytes: int, cfg: AcceleratorConfig) -> int:
    """Estimated on-chip cycles of a host op moving ``in_bytes`` in and ``out_bytes`` out."""
    if op in LAYOUT_OPS:
        return 0
    return stream_cycles(in_bytes, out_bytes, cfg)
