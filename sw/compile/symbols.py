"""Names of the DRAM symbols (regions) of a compiled model, defined once.

The compiler names every region it places; the :class:`~sw.compile.executable.Executable`
records the names next to what they hold (program members, the KV cache table), so the runtime
never builds a name itself.
"""

from __future__ import annotations

from sw.compile.executable import EMBEDDING_TABLE

__all__ = ["weights", "cache", "buffer", "norm_weight", "rope_table", "dequant_channels",
           "score_channels", "value_codes", "values_channels", "within"]


def weights(layer: str) -> str:
    """The packed weight stream of ``layer`` (a module name)."""
    return f"w:{layer}"


def cache(kind: str, layer: int, head: int) -> str:
    """The INT8 keys (``kind="k"``) or values (``"v"``) of one kv head of one layer."""
    return f"{kind}:{layer}:{head}"


def buffer(kind: str, phase: str, node: str, index: int | None = None) -> str:
    """An arena buffer of a program: its input (``"x"``), output (``"y"``) or bias rows
    (``"b"``), per member ``index`` where a node has several."""
    return f"{kind}:{phase}:{node}" + ("" if index is None else f":{index}")


def norm_weight(param: str) -> str:
    """The RMSNorm weight ``param`` as the vector engine reads it (int32 ``norm_weight``
    words, one row)."""
    return f"nw:{param}"


def embedding_table() -> str:
    """Every token's embedding row as the vector engine reads it (Q15.16 words, one row per
    token id; one for the model)."""
    return EMBEDDING_TABLE


def rope_table() -> str:
    """The rotary table of every position as the vector engine reads it (``rope_pairs``
    words, one row per position; one for the model)."""
    return "rope"


def dequant_channels(layer: str) -> str:
    """The DEQUANT channel words of ``layer``'s row scales (int32
    :func:`hw.numerics.dequant_channels` words, one row)."""
    return f"dq:{layer}"


def score_channels(layer: int, head: int) -> str:
    """The DEQUANT channel words of the scores against one kv head's keys: the key scales
    with the softmax scale folded in (:func:`hw.numerics.scores_channels`), one int32 word
    per cached position, written by the host as the cache grows."""
    return f"sc:{layer}:{head}"


def value_codes(layer: int, head: int) -> str:
    """The value codes FOLD reads for one kv head's values: each cached position's integer
    ``amax`` (:func:`hw.numerics.value_codes`), one int32 word per position, written by the
    host as the cache grows."""
    return f"vc:{layer}:{head}"


def values_channels(qmax: int, length: int) -> str:
    """The values epilogue's DEQUANT channel words: ``length`` copies of
    :func:`hw.numerics.values_channel` of a value cache of ``qmax`` (one constant row)."""
    return f"vq:{qmax}:{length}"


def within(symbol: str, offset: int) -> str:
    """The rows of buffer ``symbol`` from byte ``offset`` on, as a region of their own (a
    fused part that writes part of another part's operand rows)."""
    return f"{symbol}+{offset}"
