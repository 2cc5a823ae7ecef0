"""Golden numerics: the exact integer semantics of the datapath (level 1 of the ladder).

Everything the hardware computes is defined here once, in numpy, with a torch twin for
model-level use. The fast model (sim/) and the tests import these functions; the RTL must
agree with them bit for bit. See docs/architecture.md, "Numerics", for a worked example.

The datapath, for tokens ``t`` and output channels ``n``::

    a[t, k]   = clip(rint(x[t, k] / s_x[t]), -127, 127)        s_x[t] = max_k |x[t, k]| / 127
    w[n, k]   = code[n, g(k)] * (q[n, k] - zero[n, g(k)])       (0 where pruned)
    acc[t, n] = wrap(sum_k a[t, k] * w[n, k], acc_bits)         exact integers, two's complement

and one of the epilogues:

* WIDE (host or model-level float output): ``y = float32(acc) * row_scale[n] * s_x[t]``, evaluated
  left to right in float32;
* INT8 (on-chip requantisation): ``y = sat8(((acc * mult[n]) + 2**(shift-1)) >> shift + res)``
  with ``>>`` an arithmetic (flooring) shift, no rounding term when ``shift == 0``, an optional int8
  residual ``res[t, n]``, and saturation to [-128, 127].

Integer sums are order-independent, so any accumulation order (systolic, tiled, BLAS) gives the
same bits as long as intermediate sums are exact: float64 BLAS is exact below 2**53, far above
any reachable sum (|a| <= 128, |w| < 2**17, K < 2**24).

INT8 KV-cache attention (torch only: the host's side of the attention products). The accelerator
multiplies INT8 by INT8 in both attention products, with the KV cache as the weight stream
(``raw`` INT8, no scales) and the queries or probabilities as activations. The scales live on
the host:

* keys and values are quantised per position and kv head (symmetric INT8 over ``head_dim``,
  :func:`kv_rows`, once when written to the cache);
* scores: queries are quantised per (head, token) row; ``acc = q8 . k8`` exactly, then
  ``scores = (float32(acc) * s_k[j]) * s_q[t]`` -- the WIDE epilogue with the key scales as
  row scales;
* softmax of ``scores * scale + mask`` in fp32 on the host
  (:func:`sw.models.llama.attention_probs`);
* values: the value scales are folded into the probabilities, ``p'[t, j] = p[t, j] * s_v[j]``,
  which are then quantised per (head, token) row; ``acc = p8 . v8`` exactly and
  ``out = (float32(acc) * 1) * s_p[t]``.

Grouped-query attention never repeats K/V: the ``groups`` query heads that share a kv head are
stacked as ``groups * T`` activation rows against that head's cache (row ``i * T + t`` is query
head ``kv * groups + i``, token ``t``: HF ``repeat_kv`` order).

Each product is split into a *prologue* (host: quantise the activation rows), the integer
product (accelerator, or :func:`gemm_acc_torch` in the model-level twin) and an *epilogue*
(host: dequantise). The compiler's interpreter, the runtime and the model-level twin
(:class:`sw.compress.attention.HardwareAttentionProducts`) all compose these functions, so they
agree bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch

from hw.format import QuantizedWeight

__all__ = [
    "ACT_QMAX", "quantize_activations", "wrap", "gemm_acc", "gemm_acc_packed",
    "dequant_output", "requantize_int8", "bias_to_acc", "add_bias_wide", "golden_linear",
    "quantize_activations_torch", "gemm_acc_torch", "dequant_output_torch",
    "bias_to_acc_torch", "golden_linear_torch",
    "kv_rows", "group_rows", "ungroup_rows", "scores_prologue", "scores_epilogue",
    "values_prologue", "values_epilogue",
]

#: Activations are symmetric INT8 in [-127, 127] (-128 unused, so negation is exact).
ACT_QMAX = 127


# ---------------------------------------------------------------------- numpy (golden)
def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-token symmetric INT8 quantisation.

    Parameters
    ----------
    x:
        ``float32 [T, K]`` activations.

    Returns
    -------
    a, scale:
        ``int8 [T, K]`` and ``float32 [T]`` with ``x ~= a * scale[:, None]``. All-zero rows get
        scale 1.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"activations must be 2-D [tokens, K], got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("activations contain NaN or Inf")
    amax = np.abs(x).max(axis=1) if x.shape[1] else np.zeros(x.shape[0], np.float32)
    scale = np.where(amax > 0, amax / np.float32(ACT_QMAX), np.float32(1)).astype(np.float32)
    a = np.clip(np.rint(x / scale[:, None]), -ACT_QMAX, ACT_QMAX).astype(np.int8)
    return a, scale


def wrap(acc: np.ndarray, bits: int) -> np.ndarray:
    """Two's complement wrap of integers to ``bits`` bits (returned as int64)."""
    acc = np.asarray(acc, dtype=np.int64)
    half = np.int64(1) << np.int64(bits - 1)
    return ((acc + half) & ((half << 1) - 1)) - half


def gemm_acc(a: np.ndarray, w_int: np.ndarray, acc_bits: int = 32,
             acc_in: np.ndarray | None = None) -> np.ndarray:
    """Integer GEMM ``acc[t, n] = wrap(acc_in + sum_k a[t, k] * w_int[n, k])`` (dense reference).

    ``a`` is ``[T, K]`` int8, ``w_int`` is ``[N, K]`` integer weights (``int_weight()``).
    Computed with float64 BLAS, exact for every reachable magnitude (asserted).
    """
    a = np.asarray(a)
    w_int = np.asarray(w_int)
    if a.shape[1] != w_int.shape[1]:
        raise ValueError(f"K mismatch: activations {a.shape}, weights {w_int.shape}")
    bound = float(np.abs(w_int).max(initial=0)) * 128.0 * a.shape[1]
    if bound >= 2.0**53:
        raise ValueError("sum could exceed float64's exact integer range")
    acc = (a.astype(np.float64) @ w_int.astype(np.float64).T).astype(np.int64)
    if acc_in is not None:
        acc = acc + np.asarray(acc_in, dtype=np.int64)
    return wrap(acc, acc_bits)


def gemm_acc_packed(a: np.ndarray, w: QuantizedWeight, acc_bits: int = 32) -> np.ndarray:
    """Integer GEMM computed the way the array does: per step, select the activation by index.

    For every output row and step, the PE multiplies the dequantised kept value by the
    activation its index selects; pruned positions are never touched. Must equal
    ``gemm_acc(a, w.int_weight())`` bit for bit.
    """
    a = np.asarray(a)
    if a.shape[1] != w.k_padded:
        raise ValueError(f"activations have K={a.shape[1]}, weight expects padded "
                         f"K={w.k_padded}")
    pos = w.positions()              # [N, S] which activation each step selects
    wv = w.int_values().astype(np.int64)  # [N, S] dequantised kept values
    acc = np.zeros((a.shape[0], w.n_out), dtype=np.int64)
    a64 = a.astype(np.int64)
    chunk = max(1, (1 << 22) // max(1, pos.shape[1] * a.shape[0]))
    for n0 in range(0, w.n_out, chunk):
        sel = a64[:, pos[n0:n0 + chunk]]             # [T, n, S] gathered activations
        acc[:, n0:n0 + chunk] = (sel * wv[None, n0:n0 + chunk]).sum(axis=2)
    return wrap(acc, acc_bits)


def dequant_output(acc: np.ndarray, row_scale: np.ndarray, act_scale: np.ndarray) -> np.ndarray:
    """WIDE epilogue to float: ``float32(acc) * row_scale[n] * act_scale[t]`` in float32."""
    y = np.asarray(acc).astype(np.float32) * np.asarray(row_scale, np.float32)[None, :]
    return y * np.asarray(act_scale, np.float32)[:, None]


def requantize_int8(acc: np.ndarray, mult: np.ndarray, shift: int,
                    residual: np.ndarray | None = None) -> np.ndarray:
    """INT8 epilogue: ``sat8(round_shift(acc * mult[n], shift) + residual)``.

    ``mult`` is an unsigned 16-bit per-channel multiplier, ``shift`` in [0, 31].
    """
    mult = np.asarray(mult)
    if mult.min(initial=0) < 0 or mult.max(initial=0) > 0xFFFF:
        raise ValueError("requantisation multipliers must be unsigned 16-bit")
    if not 0 <= shift <= 31:
        raise ValueError(f"shift must be in [0, 31], got {shift}")
    prod = np.asarray(acc, dtype=np.int64) * mult.astype(np.int64)[None, :]
    if shift:
        prod = (prod + (np.int64(1) << np.int64(shift - 1))) >> np.int64(shift)
    if residual is not None:
        prod = prod + np.asarray(residual, dtype=np.int64)
    return np.clip(prod, -128, 127).astype(np.int8)


#: The WIDE epilogues write int32: bias rows are saturated to it.
_INT32 = np.iinfo(np.int32)


def bias_to_acc(bias: np.ndarray, row_scale: np.ndarray, act_scale: np.ndarray) -> np.ndarray:
    """A float per-channel bias in accumulator units, one row per token (the WIDE_BIAS operand).

    ``rint(bias[n] / (row_scale[n] * act_scale[t]))`` in float64 (the float32 product is exact
    there), saturated to int32: ``int32 [T, N]``. The accumulator's unit is per token because
    activation scales are (:func:`quantize_activations`), so the runtime converts a bias per
    call, as it converts the activations. Rounding costs at most half an accumulator unit.
    """
    unit = np.asarray(row_scale, np.float64)[None, :] * np.asarray(act_scale, np.float64)[:, None]
    q = np.rint(np.asarray(bias, np.float64)[None, :] / unit)
    return np.clip(q, _INT32.min, _INT32.max).astype(np.int32)


def add_bias_wide(acc: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """WIDE_BIAS epilogue: the WIDE output (low 32 bits of ``acc``) plus ``bias [T, N]``, modulo
    2**32: ``int32 [T, N]``."""
    return wrap(wrap(np.asarray(acc, np.int64), 32) + np.asarray(bias, np.int64), 32
                ).astype(np.int32)


def golden_linear(x: np.ndarray, w: QuantizedWeight, acc_bits: int = 32,
                  bias: np.ndarray | None = None) -> np.ndarray:
    """W4A8 (or W8A8) linear layer with hardware numerics: float ``[T, K]`` -> float ``[T, N]``;
    a float ``bias [N]`` enters the accumulators as the WIDE_BIAS epilogue adds it."""
    x = np.asarray(x, dtype=np.float32)
    if x.shape[1] != w.k:
        raise ValueError(f"input has K={x.shape[1]}, weight has K={w.k}")
    a, s_x = quantize_activations(x)
    a = np.pad(a, ((0, 0), (0, w.k_padded - w.k)))
    acc = gemm_acc(a, w.int_weight(), acc_bits)
    if bias is not None:
        acc = add_bias_wide(acc, bias_to_acc(bias, w.row_scale, s_x))
    return dequant_output(acc, w.row_scale, s_x)


# ---------------------------------------------------------------------- torch twin
def quantize_activations_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch twin of :func:`quantize_activations` (bit-identical, any leading dims)."""
    x = x.to(torch.float32)
    amax = x.abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / ACT_QMAX, torch.ones_like(amax))
    a = torch.clamp(torch.round(x / scale.unsqueeze(-1)), -ACT_QMAX, ACT_QMAX)
    return a.to(torch.int8), scale


def _wrap_torch(acc: torch.Tensor, bits: int) -> torch.Tensor:
    half = 1 << (bits - 1)
    return ((acc + half) & ((half << 1) - 1)) - half


def gemm_acc_torch(a: torch.Tensor, w_int: torch.Tensor, acc_bits: int = 32) -> torch.Tensor:
    """Torch twin of :func:`gemm_acc`: ``[..., K] x [N, K] -> int64 [..., N]``; a batched
    ``w_int [..., N, K]`` multiplies batch by batch (the attention products)."""
    acc = (a.to(torch.float64) @ w_int.to(torch.float64).transpose(-2, -1)).to(torch.int64)
    return _wrap_torch(acc, acc_bits)


def dequant_output_torch(acc: torch.Tensor, row_scale: torch.Tensor,
                         act_scale: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`dequant_output`."""
    return (acc.to(torch.float32) * row_scale.to(torch.float32)) * \
        act_scale.to(torch.float32).unsqueeze(-1)


def bias_to_acc_torch(bias: torch.Tensor, row_scale: torch.Tensor,
                      act_scale: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`bias_to_acc` (bit-identical; any leading dims of ``act_scale``)."""
    unit = row_scale.to(torch.float64) * act_scale.to(torch.float64).unsqueeze(-1)
    q = torch.round(bias.to(torch.float64) / unit)
    return torch.clamp(q, _INT32.min, _INT32.max).to(torch.int64)


def golden_linear_torch(x: torch.Tensor, w_int: torch.Tensor, row_scale: torch.Tensor,
                        acc_bits: int = 32, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Hardware-numerics linear layer in torch (for whole-model accuracy runs).

    ``w_int`` is ``QuantizedWeight.int_weight()`` cut to the original K (padding columns are
    zero, so cutting them changes nothing); ``bias`` as in :func:`golden_linear`.
    """
    a, s_x = quantize_activations_torch(x)
    acc = gemm_acc_torch(a, w_int, acc_bits)
    if bias is not None:
        acc = _wrap_torch(_wrap_torch(acc, 32) + bias_to_acc_torch(bias, row_scale, s_x), 32)
    return dequant_output_torch(acc, row_scale, s_x)


# ---------------------------------------------------------------------- INT8 KV-cache attention
def kv_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise keys or values ``[B, KV, S, d]`` per position: int8 and scales ``[B, KV, S]``."""
    return quantize_activations_torch(x)


def group_rows(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``[B, H, T, n]`` -> ``[B, KV, H // KV * T, n]``: the query heads of each kv head as rows."""
    b, h, t, n = x.shape
    return x.reshape(b, kv_heads, h // kv_heads * t, n)


def ungroup_rows(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Inverse of :func:`group_rows`: ``[B, KV, G * T, n]`` -> ``[B, H, T, n]``."""
    b, kv, rows, n = x.shape
    return x.reshape(b, heads, rows * kv // heads, n)


def scores_prologue(q: torch.Tensor, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries ``[B, H, T, d]`` -> INT8 rows ``[B, KV, G*T, d]`` and scales ``[B, KV, G*T]``."""
    return quantize_activations_torch(group_rows(q, kv_heads))


def scores_epilogue(acc: torch.Tensor, s_q: torch.Tensor, s_k: torch.Tensor,
                    heads: int) -> torch.Tensor:
    """Integer scores ``[B, KV, G*T, S]`` -> float32 ``[B, H, T, S]`` (key scales as row scales)."""
    y = dequant_output_torch(acc, s_k.unsqueeze(-2), s_q)
    return ungroup_rows(y, heads)


def values_prologue(probs: torch.Tensor, s_v: torch.Tensor, kv_heads: int
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities ``[B, H, T, S]`` times the value scales ``[B, KV, S]`` of their kv head,
    as INT8 rows ``[B, KV, G*T, S]`` and scales ``[B, KV, G*T]``."""
    folded = group_rows(probs, kv_heads) * s_v.unsqueeze(-2)
    return quantize_activations_torch(folded)


def values_epilogue(acc: torch.Tensor, s_p: torch.Tensor, heads: int) -> torch.Tensor:
    """Integer outputs ``[B, KV, G*T, d]`` -> float32 ``[B, H, T, d]``."""
    ones = torch.ones(acc.shape[-1], dtype=torch.float32)
    return ungroup_rows(dequant_output_torch(acc, ones, s_p), heads)
