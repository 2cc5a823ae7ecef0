"""Content-keyed memos of the compiler's costliest pure steps, for one process.

A compilation repeats work: ``_fuse_attention`` fuses each merged program on a copy of the
programs before it fuses the ones that fit, and ``sw.deploy`` compiles the model twice with
the same formats (the DRAM-sizing probe, then with the weights), whose programs differ only
in the DRAM's size, which no step here reads. On SmolLM2 a fusion takes about a second and
the moves of a fused program as long, so each repeat is worth a lookup:

* :func:`fuse_parts_cached`: :func:`sw.compile.fusion.fuse_parts`;
* :func:`moves_cached`: the on-chip moves of a program's words
  (:func:`sw.compile.onchip.onchip_moves`, then :func:`~sw.compile.onchip.out_moves`, then
  :func:`~sw.compile.onchip.vout_moves`, each kept where the words still fit the
  instruction memory).

The memos answer only inside :func:`enabled` (``sw.deploy`` runs its pipeline there): a
lookup cannot tell that a function the step calls was replaced (a test's stand-in), so
outside it every call computes.

A key is the SHA-256 of everything the step reads (:func:`content_key`): its name, the
configuration but ``memory.size_bytes`` (read under :mod:`sw.compile` only by the DRAM plan,
and by none of the hardware modules these steps call), every array's dtype, shape and bytes,
and the other arguments' ``repr``. An outcome is the step's result, or the
:class:`~sw.compile.errors.LoweringError` it raised (raised again, the same message); each
call gets its own copy of the arrays in it, since a caller may change them.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from hw.config import AcceleratorConfig
from sw.compile.errors import LoweringError
from sw.compile.fusion import fuse_parts
from sw.compile.onchip import moved_waits, onchip_moves, out_moves, vout_moves

__all__ = ["MAX_BYTES", "MOVE_PASSES", "content_key", "enabled", "fuse_parts_cached", "moves",
           "moves_cached", "clear", "stats"]

#: The outcomes' bytes kept (least recently used first out): a SmolLM2 compilation's
#: fusions and moves hold some tens of MB.
MAX_BYTES = 256 << 20

_memo: OrderedDict[str, tuple | str] = OrderedDict()
_stats = {"hits": 0, "misses": 0, "bytes": 0}
_depth = [0]  # how many enabled() blocks are open


@contextmanager
def enabled() -> Iterator[None]:
    """Memoise inside the block; the outermost block forgets every outcome at its end
    (:func:`clear`)."""
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        if not _depth[0]:
            clear()


def _cfg_key(cfg: AcceleratorConfig) -> str:
    d = cfg.to_dict()
    d["memory"] = {k: v for k, v in d["memory"].items() if k != "size_bytes"}
    return json.dumps(d, sort_keys=True)


def content_key(name: str, cfg: AcceleratorConfig, arrays: Sequence[np.ndarray], *extra
                ) -> str:
    """The SHA-256 (hex) of step ``name`` on ``cfg`` (but its DRAM's size), ``arrays`` (each
    dtype, shape and bytes) and ``extra`` (their ``repr``): equal keys, equal outcomes."""
    h = hashlib.sha256(f"{name}|{_cfg_key(cfg)}|{extra!r}|{len(arrays)}".encode())
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(f"|{a.dtype.str}{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _copy(outcome: tuple) -> tuple:
    return tuple(x.copy() if isinstance(x, np.ndarray) else x for x in outcome)


def _size(outcome: tuple | str) -> int:
    if isinstance(outcome, str):
        return len(outcome)
    return sum(x.nbytes for x in outcome if isinstance(x, np.ndarray))


def _cached(key: str, compute: Callable[[], tuple]) -> tuple:
    """``compute()``'s outcome, from the memo where ``key`` was computed before (outside
    :func:`enabled`: computed)."""
    if not _depth[0]:
        return compute()
    hit = _memo.get(key)
    if hit is None:
        _stats["misses"] += 1
        try:
            hit = _copy(compute())
        except LoweringError as e:
            hit = str(e)
        _memo[key] = hit
        _stats["bytes"] += _size(hit)
        while _stats["bytes"] > MAX_BYTES and len(_memo) > 1:
            _stats["bytes"] -= _size(_memo.popitem(last=False)[1])
    else:
        _stats["hits"] += 1
        _memo.move_to_end(key)
    if isinstance(hit, str):
        raise LoweringError(hit)
    return _copy(hit)


def fuse_parts_cached(cfg: AcceleratorConfig, parts: Sequence[np.ndarray], spread: bool = True,
                      fuse: Callable = fuse_parts
                      ) -> tuple[np.ndarray, tuple[tuple[int, ...], ...]]:
    """``fuse(cfg, parts, spread=spread)`` (:func:`~sw.compile.fusion.fuse_parts`), from
    the memo where the same arguments were fused before inside :func:`enabled`; another
    ``fuse`` (a test's stand-in) is called, never memoised.

    Raises
    ------
    LoweringError
        As ``fuse`` does (its message).
    """
    if fuse is not fuse_parts or not _depth[0]:
        return fuse(cfg, parts, spread=spread)
    key = content_key("fuse_parts", cfg, parts, spread)
    return _cached(key, lambda: fuse_parts(cfg, parts, spread=spread))


#: The passes of :func:`moves`, in order.
MOVE_PASSES = (onchip_moves, out_moves, vout_moves, moved_waits)


def moves(cfg: AcceleratorConfig, words: np.ndarray, keep: Collection[int],
          passes: Sequence[Callable] = MOVE_PASSES
          ) -> tuple[np.ndarray, tuple[int, ...] | None]:
    """``words`` with their round trips of vector rows through DRAM as moves
    (:func:`~sw.compile.onchip.onchip_moves`), then those of GEMM results
    (:func:`~sw.compile.onchip.out_moves`), then those of rows several STOREs of VOUT write
    (:func:`~sw.compile.onchip.vout_moves`) -- ``passes``, in that order -- ``keep`` (words
    the runtime rewrites per step) as they are, the later passes kept where their words
    still fit ``cfg``'s instruction memory; and per input word its index in them.
    ``(words, None)`` where nothing changed or the moves do not fit."""
    first, *later = passes
    out, where = first(cfg, words, keep)
    for rewrite in later:
        more, after = rewrite(cfg, out, {where[i] for i in keep})
        if more is not out and more.shape[0] <= cfg.imem_depth:
            out, where = more, tuple(after[i] for i in where)
    if out is words or out.shape[0] > cfg.imem_depth:
        return words, None
    return out, where


def moves_cached(cfg: AcceleratorConfig, words: np.ndarray, keep: Collection[int],
                 passes: Sequence[Callable] = MOVE_PASSES
                 ) -> tuple[np.ndarray, tuple[int, ...] | None]:
    """:func:`moves` ``(cfg, words, keep, passes)``, from the memo where the same arguments
    were rewritten before inside :func:`enabled`; other ``passes`` (a test's stand-ins) are
    run, never memoised."""
    if tuple(passes) != MOVE_PASSES or not _depth[0]:
        return moves(cfg, words, keep, passes)
    key = content_key("moves", cfg, [words], tuple(keep))
    return _cached(key, lambda: moves(cfg, words, keep))


def clear() -> None:
    """Forget every outcome (and the counts of :func:`stats`)."""
    _memo.clear()
    _stats.update(hits=0, misses=0, bytes=0)


def stats() -> dict[str, int]:
    """Lookups answered from the memo (``hits``) and computed (``misses``) since the last
    :func:`clear`, the outcomes kept (``entries``) and their arrays' ``bytes``."""
    return {**_stats, "entries": len(_memo)}
