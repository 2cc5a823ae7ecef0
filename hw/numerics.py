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
  (:func:`sw.models.llama.attention_probs`); with the vector unit the scaled scores are its
  DEQUANT's (:func:`scores_vector`: the key scales times ``scale`` as channel words, as
  CHANNEL computes them from the key rows' integer ``amax``, :func:`vec_channel`; the query
  rows' integer ``amax``) and the softmax its :func:`vec_softmax`;
* values: the value scales are folded into the probabilities, ``p'[t, j] = p[t, j] * s_v[j]``,
  which are then quantised per (head, token) row; ``acc = p8 . v8`` exactly and
  ``out = (float32(acc) * 1) * s_p[t]``.

The INT4 KV cache (``kv_bits`` 4, :func:`kv4_rows`) changes only the cached rows: keys are
two-level like the weights (``s_k`` per position, an 8-bit code per group of
:data:`KV4_KEY_GROUP` channels, values in [-7, 7]; the GEMM's integer weight is ``code * q``),
values one scale per position (``s_v``, folded into the probabilities as above). The queries,
probabilities, prologues and epilogues are the INT8 cache's; with the vector unit the rows
are :func:`vec_kv4_rows` (:func:`kv4_rows_vector`).

Grouped-query attention never repeats K/V: the ``groups`` query heads that share a kv head are
stacked as ``groups * T`` activation rows against that head's cache (row ``i * T + t`` is query
head ``kv * groups + i``, token ``t``: HF ``repeat_kv`` order).

Each product is split into a *prologue* (host: quantise the activation rows), the integer
product (accelerator, or :func:`gemm_acc_torch` in the model-level twin) and an *epilogue*
(host: dequantise). The compiler's interpreter, the runtime and the model-level twin
(:class:`sw.compress.attention.HardwareAttentionProducts`) all compose these functions, so they
agree bit for bit.

The vector unit (the last sections): exact integer semantics of the host ops of a step
(reductions, exp, reciprocal, rsqrt, saturating add and multiply, RoPE, SiLU-gate, RMSNorm,
softmax, INT8 requantisation, argmax, and the dequantisation of a GEMM's WIDE outputs with
fixed-point channel words: :func:`vec_dequant`) on Q15.16 activations, with table + Newton / table +
linear-step units (:data:`RECIP_LUT`, :data:`RSQRT_LUT`, :data:`EXP2_LUT`), and their float
interface (:func:`rms_norm_vector` ...) through which the twin (:mod:`sw.compress.vector`), the
interpreter and the runtime use them (``vector=True``). docs/architecture.md, section 3, justifies
the format.
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
    "KV_BITS", "KV4_QMAX", "KV4_CODE_BITS", "KV4_CODE_MAX", "KV4_KEY_GROUP", "kv4_key_group",
    "kv4_rows", "kv4_weight", "kv4_rows_torch", "kv4_weight_torch",
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
                        acc_bits: int = 32, bias: torch.Tensor | None = None,
                        vector: bool = False) -> torch.Tensor:
    """Hardware-numerics linear layer in torch (for whole-model accuracy runs).

    ``w_int`` is ``QuantizedWeight.int_weight()`` cut to the original K (padding columns are
    zero, so cutting them changes nothing); ``bias`` as in :func:`golden_linear`; with
    ``vector`` the activations are requantised as the vector unit does it
    (:func:`vec_requant_torch` of :func:`to_fixed_torch`, the bias converted with
    :func:`act_scale_torch` of its ``amax``) and the outputs dequantised as it does it
    (:func:`dequant_output_vector_torch` with the channel words of ``row_scale`` and the
    ``amax``).
    """
    if vector:
        a, amax = vec_requant_torch(to_fixed_torch(x))
        s_x = act_scale_torch(amax)
    else:
        a, s_x = quantize_activations_torch(x)
    acc = gemm_acc_torch(a, w_int, acc_bits)
    if bias is not None:
        acc = _wrap_torch(_wrap_torch(acc, 32) + bias_to_acc_torch(bias, row_scale, s_x), 32)
    if vector:
        return dequant_output_vector_torch(acc, dequant_channels_torch(row_scale), amax)
    return dequant_output_torch(acc, row_scale, s_x)


# ---------------------------------------------------------------------- INT4 KV cache
#: KV-cache element widths: INT8 (per-position symmetric, like the activations) or INT4.
KV_BITS = (8, 4)
#: INT4 cache values are symmetric in [-7, 7] (-8 unused, so negation is exact).
KV4_QMAX = 7
#: The keys' INT4 scale codes: unsigned, as the weights' (``WeightFormat.code_bits``).
KV4_CODE_BITS = 8
KV4_CODE_MAX = (1 << KV4_CODE_BITS) - 1
#: Head-dim elements of a key row sharing one scale code (fewer when the head is narrower).
KV4_KEY_GROUP = 32


def kv4_key_group(head_dim: int) -> int:
    """The keys' INT4 group along ``head_dim``: :data:`KV4_KEY_GROUP`, or the whole row when
    the head is narrower (``ValueError`` naming a head_dim the groups cannot tile)."""
    group = min(KV4_KEY_GROUP, head_dim)
    if head_dim % group:
        raise ValueError(f"head_dim={head_dim} is not a multiple of the INT4 key group "
                         f"({KV4_KEY_GROUP})")
    return group


def kv4_rows(x: np.ndarray, group: int | None) -> tuple[np.ndarray, np.ndarray | None,
                                                          np.ndarray]:
    """INT4 quantisation of key or value rows ``x [..., d]`` (float32), one row per position.

    With ``group`` (keys), two levels as the weights' stream holds them: a float32 row scale
    ``s = amax / (7 * 255)`` (1 for an all-zero row) and per group of ``group`` elements an
    8-bit code ``c = clip(ceil(amax_g / (7 * s)), 1, 255)``; the values ``q =
    clip(rint(x / (s * c)), -7, 7)``, so ``x ~= s * c * q`` and the GEMM's integer weight is
    ``c * q`` (:func:`kv4_weight`). Without (``None``: values, a raw stream with no header)
    one level: ``s = amax / 7``, ``q = clip(rint(x / s), -7, 7)``, codes None. Every step is
    one float32 operation in this order (the torch twin :func:`kv4_rows_torch` repeats it).

    Returns
    -------
    q, codes, scale:
        ``int8 [..., d]``, ``uint8 [..., d // group]`` (or None), ``float32 [...]``.
    """
    x = np.asarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ValueError("keys or values contain NaN or Inf")
    amax = np.abs(x).max(axis=-1)
    qmax = np.float32(KV4_QMAX)
    if group is None:
        s = np.where(amax > 0, amax / qmax, np.float32(1)).astype(np.float32)
        q = np.clip(np.rint(x / s[..., None]), -KV4_QMAX, KV4_QMAX).astype(np.int8)
        return q, None, s
    d = x.shape[-1]
    if group <= 0 or d % group:
        raise ValueError(f"group {group} does not tile rows of {d} elements")
    s = np.where(amax > 0, amax / np.float32(KV4_QMAX * KV4_CODE_MAX),
                 np.float32(1)).astype(np.float32)
    amax_g = np.abs(x).reshape(*x.shape[:-1], d // group, group).max(axis=-1)
    c = np.clip(np.ceil(amax_g / (s * qmax)[..., None]), 1, KV4_CODE_MAX).astype(np.float32)
    unit = np.repeat(s[..., None] * c, group, axis=-1)
    q = np.clip(np.rint(x / unit), -KV4_QMAX, KV4_QMAX).astype(np.int8)
    return q, c.astype(np.uint8), s


def kv4_weight(q: np.ndarray, codes: np.ndarray | None) -> np.ndarray:
    """The integer weights ``c * q`` (``int32 [..., d]``) of :func:`kv4_rows`'s output (``q``
    itself without codes)."""
    q = np.asarray(q, dtype=np.int32)
    if codes is None:
        return q
    group = q.shape[-1] // codes.shape[-1]
    return q * np.repeat(np.asarray(codes, np.int32), group, axis=-1)


def kv4_rows_torch(x: torch.Tensor, group: int | None
                   ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Torch twin of :func:`kv4_rows` (bit-identical; ``q`` int8, codes uint8)."""
    x = x.to(torch.float32)
    amax = x.abs().amax(dim=-1)
    one = torch.ones_like(amax)
    if group is None:
        s = torch.where(amax > 0, amax / KV4_QMAX, one)
        q = torch.clamp(torch.round(x / s.unsqueeze(-1)), -KV4_QMAX, KV4_QMAX)
        return q.to(torch.int8), None, s
    d = x.shape[-1]
    if group <= 0 or d % group:
        raise ValueError(f"group {group} does not tile rows of {d} elements")
    s = torch.where(amax > 0, amax / float(KV4_QMAX * KV4_CODE_MAX), one)
    amax_g = x.abs().reshape(*x.shape[:-1], d // group, group).amax(dim=-1)
    c = torch.clamp(torch.ceil(amax_g / (s * KV4_QMAX).unsqueeze(-1)), 1, KV4_CODE_MAX)
    unit = (s.unsqueeze(-1) * c).repeat_interleave(group, dim=-1)
    q = torch.clamp(torch.round(x / unit), -KV4_QMAX, KV4_QMAX)
    return q.to(torch.int8), c.to(torch.uint8), s


def kv4_weight_torch(q: torch.Tensor, codes: torch.Tensor | None) -> torch.Tensor:
    """Torch twin of :func:`kv4_weight` (int32)."""
    if codes is None:
        return q.to(torch.int32)
    group = q.shape[-1] // codes.shape[-1]
    return q.to(torch.int32) * codes.to(torch.int32).repeat_interleave(group, dim=-1)


# ---------------------------------------------------------------------- KV-cache attention
def kv_rows(x: torch.Tensor, vector: bool = False, bits: int = 8, group: int | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise keys or values ``[B, KV, S, d]`` per position: the integer weights the
    attention GEMMs stream and the row scales ``[B, KV, S]``.

    ``bits`` 8: int8 rows (with ``vector``, as the vector unit requantises:
    :func:`quantize_activations_vector`); 4: :func:`kv4_rows_torch` (with ``vector``
    :func:`kv4_rows_vector_torch`) with ``group`` (keys: :func:`kv4_key_group`; None for
    values), the weights ``c * q`` (:func:`kv4_weight_torch`).
    """
    if bits not in KV_BITS:
        raise ValueError(f"KV-cache bits must be one of {KV_BITS}, got {bits!r}")
    if bits == 4:
        q, codes, s = (kv4_rows_vector_torch if vector else kv4_rows_torch)(x, group)
        return kv4_weight_torch(q, codes), s
    if vector:
        return quantize_activations_vector_torch(x)
    return quantize_activations_torch(x)


def group_rows(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """``[B, H, T, n]`` -> ``[B, KV, H // KV * T, n]``: the query heads of each kv head as rows."""
    b, h, t, n = x.shape
    return x.reshape(b, kv_heads, h // kv_heads * t, n)


def ungroup_rows(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Inverse of :func:`group_rows`: ``[B, KV, G * T, n]`` -> ``[B, H, T, n]``."""
    b, kv, rows, n = x.shape
    return x.reshape(b, heads, rows * kv // heads, n)


def scores_prologue(q: torch.Tensor, kv_heads: int, vector: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries ``[B, H, T, d]`` -> INT8 rows ``[B, KV, G*T, d]`` and scales ``[B, KV, G*T]``
    (with ``vector``, requantised by the vector unit)."""
    return kv_rows(group_rows(q, kv_heads), vector)


def scores_epilogue(acc: torch.Tensor, s_q: torch.Tensor, s_k: torch.Tensor,
                    heads: int) -> torch.Tensor:
    """Integer scores ``[B, KV, G*T, S]`` -> float32 ``[B, H, T, S]`` (key scales as row scales)."""
    y = dequant_output_torch(acc, s_k.unsqueeze(-2), s_q)
    return ungroup_rows(y, heads)


def values_prologue(probs: torch.Tensor, s_v: torch.Tensor, kv_heads: int,
                    vector: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Probabilities ``[B, H, T, S]`` times the value scales ``[B, KV, S]`` of their kv head,
    as INT8 rows ``[B, KV, G*T, S]`` and scales ``[B, KV, G*T]`` (with ``vector``, in
    integers on the vector unit: ``s_v`` is the value rows' integer codes,
    :func:`value_amax_torch`, and :func:`fold_values_vector` gives FOLD's amax words in
    place of the scales)."""
    if vector:
        return fold_values_vector(probs, s_v, kv_heads)
    folded = group_rows(probs, kv_heads) * s_v.unsqueeze(-2)
    return quantize_activations_torch(folded)


def values_epilogue(acc: torch.Tensor, s_p: torch.Tensor, heads: int, vector: bool = False,
                    kv_bits: int = 8) -> torch.Tensor:
    """Integer outputs ``[B, KV, G*T, d]`` -> float32 ``[B, H, T, d]`` (with ``vector``,
    ``s_p`` is :func:`values_prologue`'s amax words and the outputs are float64, the exact
    Q15.16 words of the vector unit's DEQUANT: :func:`values_vector`)."""
    if vector:
        return values_vector(acc, s_p, heads, ACT_QMAX if kv_bits == 8 else KV4_QMAX)
    ones = torch.ones(acc.shape[-1], dtype=torch.float32)
    return ungroup_rows(dequant_output_torch(acc, ones, s_p), heads)


# ---------------------------------------------------------------------- vector unit
# The host ops of a decode step (RMSNorm, RoPE, softmax, SiLU-gate, residual add, INT8
# requantisation, argmax) in exact integer arithmetic: what the vector unit computes. Values
# are two's complement integers in int64 containers; every intermediate fits int64 (stated
# per function), so numpy and torch agree bit for bit. See docs/architecture.md, section 3.

#: Fraction bits of the activation format: a value ``x`` is the integer ``rint(x * 2**16)``.
ACT_FRAC = 16
#: Activations are 32-bit words, saturated symmetrically (``-ACT_MAX`` .. ``ACT_MAX``).
ACT_BITS = 32
ACT_MAX = (1 << (ACT_BITS - 1)) - 1
#: Fraction bits of values in [-1, 1] inside a composed op: RMSNorm's normalised row
#: (``|x| / rms / sqrt(K) <= 1``) and the SiLU-gate's exp and sigmoid.
NORM_FRAC = 30
#: Fraction bits of the rotary cos / sin tables (1.0 = 2**14 fits a signed 16-bit word).
ROPE_FRAC = 14
#: Index bits of the reciprocal, rsqrt and exp2 lookup tables.
LUT_BITS = 6
#: Width of the normalised mantissa the reciprocal and rsqrt tables are indexed by.
MANT_BITS = 16
#: Fraction bits of the log2(e) constant of exp and of the ln(2) interpolation slope.
CONST_FRAC = 16
#: Reciprocal and rsqrt results carry this many significant bits (a value in (2**15, 2**16]).
RECIP_FRAC = 2 * MANT_BITS - 1
RSQRT_FRAC = MANT_BITS + MANT_BITS // 2 - 1
#: Inputs of the reciprocal and rsqrt (and so of every reduction feeding them) stay below
#: ``2**TABLE_IN_BITS`` (float64's exact integers: :func:`_bit_length` uses ``frexp``).
TABLE_IN_BITS = 53
_EXACT = 1 << TABLE_IN_BITS

LOG2E_Q = int(np.rint(np.log2(np.e) * (1 << CONST_FRAC)))
LN2_Q = int(np.rint(np.log(2.0) * (1 << CONST_FRAC)))
#: ``RECIP_LUT[i] = rint(2**31 / m)``, ``m`` the midpoint of mantissa interval ``i`` of
#: [2**15, 2**16).
RECIP_LUT = np.rint(2.0 ** RECIP_FRAC / (
    (2 ** LUT_BITS + np.arange(2 ** LUT_BITS) + 0.5) * 2.0 ** (MANT_BITS - 1 - LUT_BITS))
).astype(np.int64)
#: ``RSQRT_LUT[i] = rint(2**23 / sqrt(m))`` over the two octaves [2**14, 2**16).
RSQRT_LUT = np.rint(2.0 ** RSQRT_FRAC / np.sqrt(
    (2 ** (LUT_BITS - 1) + np.arange(3 * 2 ** (LUT_BITS - 1)) + 0.5)
    * 2.0 ** (MANT_BITS - 1 - LUT_BITS))).astype(np.int64)
#: ``EXP2_LUT[i] = rint(2**(i / 2**LUT_BITS) * 2**16)``: 2**f at the start of each interval.
EXP2_LUT = np.rint(2.0 ** (np.arange(2 ** LUT_BITS) / 2 ** LUT_BITS) * (1 << ACT_FRAC)
                   ).astype(np.int64)

__all__ += [
    "ACT_FRAC", "ACT_BITS", "ACT_MAX", "NORM_FRAC", "ROPE_FRAC", "LUT_BITS", "MANT_BITS",
    "CONST_FRAC", "RECIP_FRAC", "RSQRT_FRAC", "TABLE_IN_BITS", "LOG2E_Q", "LN2_Q", "RECIP_LUT",
    "RSQRT_LUT", "EXP2_LUT",
    "to_fixed", "from_fixed", "round_shift", "saturate", "vec_sum", "vec_sumsq", "vec_max",
    "vec_add", "vec_mul", "vec_exp", "vec_recip", "vec_rsqrt", "vec_rope", "vec_silu_gate",
    "norm_weight", "norm_eps", "vec_rmsnorm", "vec_softmax", "vec_requant", "act_scale",
    "vec_argmax", "vec_argmax_words", "rope_table",
    "ROPE_HALF_BITS", "rope_pairs", "rope_unpack", "vec_rope_pairs",
    "to_fixed_torch", "from_fixed_torch", "round_shift_torch", "saturate_torch",
    "vec_sumsq_torch", "vec_add_torch", "vec_mul_torch", "vec_exp_torch", "vec_recip_torch",
    "vec_rsqrt_torch", "vec_rope_torch", "vec_silu_gate_torch", "norm_weight_torch",
    "vec_rmsnorm_torch", "vec_softmax_torch", "vec_requant_torch", "act_scale_torch",
    "vec_argmax_torch", "rope_table_torch",
]


def to_fixed(x: np.ndarray, frac: int = ACT_FRAC) -> np.ndarray:
    """Float to the activation format: ``sat(rint(float64(x) * 2**frac))`` as int64.

    The float64 product is exact (a power-of-two scale); ``rint`` rounds half to even;
    saturation is to ``[-ACT_MAX, ACT_MAX]`` (also for infinities). NaN is an error.
    """
    x = np.asarray(x, dtype=np.float64)
    if np.isnan(x).any():
        raise ValueError("vector operand contains NaN")
    return np.clip(np.rint(x * 2.0 ** frac), -ACT_MAX, ACT_MAX).astype(np.int64)


def from_fixed(q: np.ndarray, frac: int = ACT_FRAC) -> np.ndarray:
    """The activation format to float64: ``q * 2**-frac``, exact for every word (an int32
    word has 31 significant bits, a float64 53), so ``to_fixed(from_fixed(q)) == q``: a
    value that leaves the vector unit and comes back is the same word (float32 would round
    from ``|q| >= 2**24`` on, 256.0 in Q15.16, which residual streams reach)."""
    return np.asarray(q, dtype=np.int64).astype(np.float64) * 2.0 ** -frac


def round_shift(v: np.ndarray, s: np.ndarray | int) -> np.ndarray:
    """Rounding arithmetic right shift: ``(v + 2**(s-1)) >> s`` (round half up) for ``s > 0``,
    ``v`` for ``s == 0``, ``v << -s`` for ``s < 0``; ``s`` is clamped to 62 (the result is then
    0 for every ``|v| < 2**61``). ``v`` and the result are int64."""
    v = np.asarray(v, dtype=np.int64)
    s = np.minimum(np.asarray(s, dtype=np.int64), 62)
    pos = np.maximum(s, 0)
    bias = np.where(pos > 0, np.left_shift(np.int64(1), np.maximum(pos - 1, 0)), 0)
    right = np.right_shift(v + bias, pos)
    return np.where(s < 0, np.left_shift(v, np.maximum(-s, 0)), right)


def saturate(v: np.ndarray, bits: int = ACT_BITS) -> np.ndarray:
    """Symmetric saturation to ``[-(2**(bits-1) - 1), 2**(bits-1) - 1]`` (int64)."""
    m = (1 << (bits - 1)) - 1
    return np.clip(np.asarray(v, dtype=np.int64), -m, m)


def vec_sum(x: np.ndarray) -> np.ndarray:
    """Sum reduction of the last axis, exact in int64 (``K * ACT_MAX < 2**63`` for K < 2**32)."""
    return np.asarray(x, dtype=np.int64).sum(axis=-1)


def vec_max(x: np.ndarray) -> np.ndarray:
    """Max reduction of the last axis (int64)."""
    return np.asarray(x, dtype=np.int64).max(axis=-1)


def vec_sumsq(x: np.ndarray, shift: np.ndarray | int) -> np.ndarray:
    """Sum of squares of ``x >> shift`` (arithmetic, flooring; ``shift`` per row, broadcast
    over the last axis) over the last axis, exact in int64 when every ``|x >> shift| <= 2**16``
    and K < 2**30 (below 2**62)."""
    y = np.right_shift(np.asarray(x, dtype=np.int64), np.asarray(shift, np.int64)[..., None])
    return (y * y).sum(axis=-1)


def vec_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise ``sat32(a + b)``."""
    return saturate(np.asarray(a, np.int64) + np.asarray(b, np.int64))


def vec_mul(a: np.ndarray, b: np.ndarray, frac: int = ACT_FRAC) -> np.ndarray:
    """Elementwise ``sat32(round_shift(a * b, frac))``: the product of a value with ``frac``
    fraction bits and one in the activation format (exact 63-bit product for two 31-bit
    magnitudes)."""
    return saturate(round_shift(np.asarray(a, np.int64) * np.asarray(b, np.int64), frac))


def _bit_length(x: np.ndarray) -> np.ndarray:
    """Bit length of non-negative integers below 2**53 (frexp of the exact float64)."""
    x = np.asarray(x, dtype=np.int64)
    if (x < 0).any() or (x >= _EXACT).any():
        raise ValueError(f"operand out of the table units' range [0, 2**53): "
                         f"{int(x.min())}..{int(x.max())}")
    return np.frexp(x.astype(np.float64))[1].astype(np.int64)


def _normalise(x: np.ndarray, e: np.ndarray) -> np.ndarray:
    """``x >> e`` (flooring) for ``e >= 0``, ``x << -e`` otherwise."""
    return np.where(e >= 0, np.right_shift(x, np.maximum(e, 0)),
                    np.left_shift(x, np.maximum(-e, 0)))


def vec_recip(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal of positive integers ``1 <= x < 2**53``: ``(r, sh)`` with ``1/x ~= r / 2**sh``.

    Leading-one normalisation to a 16-bit mantissa ``m = x >> (n - 16)`` (flooring; ``x <<
    (16 - n)`` for ``n < 16``, ``n`` the bit length, ``sh = n + 15``), a table of 2**LUT_BITS
    entries indexed by the 6 bits after the leading one (:data:`RECIP_LUT`, the reciprocal
    of the interval's midpoint) and one Newton step ``r = (r0 * (2**32 - m * r0)) >> 31``
    (every product below 2**48). ``r`` is in (2**15, 2**16]; its relative error is below
    2**-13 (table 2**-7.5 squared by Newton, plus the mantissa truncation and the flooring).
    """
    x = np.asarray(x, dtype=np.int64)
    if (x < 1).any():
        raise ValueError(f"reciprocal of {int(x.min())}: operands must be >= 1")
    n = _bit_length(x)
    m = _normalise(x, n - MANT_BITS)
    r0 = RECIP_LUT[(m >> (MANT_BITS - 1 - LUT_BITS)) - 2 ** LUT_BITS]
    r = (r0 * ((np.int64(1) << (RECIP_FRAC + 1)) - m * r0)) >> RECIP_FRAC
    return r, n + RECIP_FRAC - MANT_BITS


def vec_rsqrt(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal square root of positive integers ``1 <= x < 2**53``: ``(r, sh)`` with
    ``1/sqrt(x) ~= r / 2**sh``.

    Normalisation by an even shift ``e`` (``n - 16`` rounded up to even, ``n`` the bit
    length) to ``m`` in [2**14, 2**16) (flooring right shift, or left shift), a table of
    3 * 2**(LUT_BITS-1) entries over the two octaves (:data:`RSQRT_LUT`, at the midpoints)
    indexed by ``(m >> 9) - 32``, and one Newton step ``t = (m * r0 * r0) >> 16``,
    ``r = (r0 * (3 * 2**30 - t)) >> 31`` (products below 2**49); ``sh = 23 + e / 2``. ``r`` is
    in (2**15, 2**16]; relative error below 2**-13.
    """
    x = np.asarray(x, dtype=np.int64)
    if (x < 1).any():
        raise ValueError(f"rsqrt of {int(x.min())}: operands must be >= 1")
    e = _bit_length(x) - MANT_BITS
    e = e + (e & 1)
    m = _normalise(x, e)
    r0 = RSQRT_LUT[(m >> (MANT_BITS - 1 - LUT_BITS)) - 2 ** (LUT_BITS - 1)]
    t = (m * r0 * r0) >> MANT_BITS
    r = (r0 * ((3 << (2 * RSQRT_FRAC - MANT_BITS)) - t)) >> (2 * RSQRT_FRAC - MANT_BITS + 1)
    return r, RSQRT_FRAC + e // 2


def vec_exp(d: np.ndarray, frac: int = ACT_FRAC) -> np.ndarray:
    """``exp(d)`` of non-positive activations ``d`` (``-2**32 < d <= 0``, 16 fraction bits),
    with ``frac`` fraction bits (16: the activation format, in [0, 2**16]; the SiLU-gate uses
    :data:`NORM_FRAC` = 30 to keep small results' precision).

    ``u = (d * LOG2E_Q) >> 16`` (flooring; ``d * log2(e)`` with 16 fraction bits, product
    below 2**50); ``k = u >> 16`` (<= 0) and ``f = u & 0xFFFF``; ``2**f`` from the table of
    2**LUT_BITS entries (:data:`EXP2_LUT`) at the top 6 bits of ``f`` and a linear step over
    the low 10 bits ``lo``: ``p = T + round_shift(T * lo * LN2_Q, 32)`` (in [2**16, 2**17));
    then ``round_shift(p, 16 - frac - k)``. ``vec_exp(0) == 2**frac`` exactly. Error: at most
    ``2**-12 * exp(d) + 2**-frac`` in real terms (constant quantisation, the interpolation's
    ``(ln2 * 2**-6)**2 / 2`` and the final rounding).
    """
    d = np.asarray(d, dtype=np.int64)
    if (d > 0).any():
        raise ValueError(f"exp of {int(d.max())} > 0: the unit takes max-subtracted operands")
    u = (d * LOG2E_Q) >> CONST_FRAC
    k = u >> ACT_FRAC
    f = u & ((1 << ACT_FRAC) - 1)
    lo_bits = ACT_FRAC - LUT_BITS
    t = EXP2_LUT[f >> lo_bits]
    p = t + round_shift(t * (f & ((1 << lo_bits) - 1)) * LN2_Q, ACT_FRAC + CONST_FRAC)
    return round_shift(p, ACT_FRAC - frac - k)


def rope_table(c: np.ndarray) -> np.ndarray:
    """A float rotary table (cos or sin) in fixed point: ``rint(float64(c) * 2**ROPE_FRAC)``."""
    return np.rint(np.asarray(c, np.float64) * 2.0 ** ROPE_FRAC).astype(np.int64)


def vec_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotary rotation of activations ``x [..., d]`` by fixed-point tables ``cos, sin [..., d]``
    (:func:`rope_table`; the halves repeat the frequencies, HF's rotate_half pairing):
    ``sat32(round_shift(x * cos + rot(x) * sin, ROPE_FRAC))`` with ``rot(x) = (-x2, x1)``
    (exact: activations are symmetric); both products below 2**46, their sum exact."""
    x = np.asarray(x, dtype=np.int64)
    h = x.shape[-1] // 2
    rot = np.concatenate((-x[..., h:], x[..., :h]), axis=-1)
    return saturate(round_shift(x * np.asarray(cos, np.int64) + rot * np.asarray(sin, np.int64),
                                ROPE_FRAC))


# The rotary tables as the vector engine holds them (VecFunc.ROPE): LLaMA's halves repeat the
# frequencies, so one (cos, sin) per pair index k < d/2 suffices, packed into one VIN word.
#: Bits of each half of a packed RoPE table word (a signed Q1.14 value: cos or sin).
ROPE_HALF_BITS = ROPE_FRAC + 2


def rope_pairs(cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """The fixed-point rotary tables ``cos, sin [..., d]`` (:func:`rope_table`) as the vector
    engine's table words ``[..., d/2]``: word ``k`` holds ``cos[k]`` in its low
    :data:`ROPE_HALF_BITS` bits and ``sin[k]`` in its high ones (two's complement halves), as
    a signed 32-bit value in int64 (a VIN element).

    Raises ``ValueError`` unless ``d`` is even, the two halves of each table are equal (HF's
    rotate_half pairing with LLaMA's repeated frequencies: elements ``k`` and ``k + d/2``
    rotate by the same angle) and every value fits a signed half; so
    ``vec_rope_pairs(x, rope_pairs(cos, sin), d) == vec_rope(x, cos, sin)`` for every row of
    heads of ``d`` elements.
    """
    cos, sin = np.asarray(cos, np.int64), np.asarray(sin, np.int64)
    if cos.shape != sin.shape or not cos.shape or cos.shape[-1] % 2:
        raise ValueError(f"rope tables must have one even-length shape, got {cos.shape} and "
                         f"{sin.shape}")
    h = cos.shape[-1] // 2
    lim = 1 << (ROPE_HALF_BITS - 1)
    for name, t in (("cos", cos), ("sin", sin)):
        if not np.array_equal(t[..., :h], t[..., h:]):
            k = int(np.argwhere(t[..., :h] != t[..., h:])[0, -1])
            raise ValueError(f"rope {name} table: its halves differ (element {k} is "
                             f"{int(t[..., k].ravel()[0])}, element {k + h} "
                             f"{int(t[..., k + h].ravel()[0])}); the engine holds one angle "
                             f"per pair")
        if (t < -lim).any() or (t >= lim).any():
            raise ValueError(f"rope {name} table value {int(t[(t < -lim) | (t >= lim)][0])} "
                             f"does not fit {ROPE_HALF_BITS} signed bits")
    lo = cos[..., :h] & ((1 << ROPE_HALF_BITS) - 1)
    return lo + (sin[..., :h] << ROPE_HALF_BITS)


def rope_unpack(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ``(cos, sin)`` halves ``[..., d/2]`` of table words (any 32-bit patterns, signed or
    unsigned): the low and high :data:`ROPE_HALF_BITS` bits, sign-extended."""
    w = np.asarray(words, np.int64)
    m, sign = (1 << ROPE_HALF_BITS) - 1, 1 << (ROPE_HALF_BITS - 1)
    return (((w & m) ^ sign) - sign, (((w >> ROPE_HALF_BITS) & m) ^ sign) - sign)


def vec_rope_pairs(x: np.ndarray, words: np.ndarray, head_dim: int) -> np.ndarray:
    """:func:`vec_rope` of each head of ``x [..., heads * head_dim]`` (heads side by side, as
    a q or k row of a token) with the table words ``[head_dim / 2]`` (:func:`rope_pairs`;
    any bit patterns, :func:`rope_unpack`), the same table for every head: what
    ``VecFunc.ROPE`` computes. Element ``i < d/2`` of a head pairs with ``i + d/2``."""
    x = np.asarray(x, np.int64)
    if head_dim < 2 or head_dim % 2 or x.shape[-1] % head_dim:
        raise ValueError(f"head_dim={head_dim} must be even, >= 2 and divide the row's "
                         f"{x.shape[-1]} elements")
    c, s = rope_unpack(words)
    if c.shape != (head_dim // 2,):
        raise ValueError(f"rope table of shape {c.shape}: head_dim={head_dim} needs "
                         f"{head_dim // 2} words")
    heads = x.reshape(*x.shape[:-1], -1, head_dim)
    y = vec_rope(heads, np.concatenate((c, c)), np.concatenate((s, s)))
    return y.reshape(x.shape)


def vec_silu_gate(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    """SwiGLU's gate ``silu(g) * u`` of activations.

    With 30 fraction bits (:data:`NORM_FRAC`) for the sigmoid: ``e = vec_exp(-|g|, 30)``;
    ``s = 1 / (1 + e)`` as ``round_shift(r, sh - 60)`` with ``(r, sh) = vec_recip(2**30 + e)``
    (in [2**29, 2**30]); the sigmoid is ``s`` for ``g >= 0`` and ``round_shift(e * s, 30)``
    (= e / (1 + e), accurate relative to itself) below; ``silu = round_shift(g * sigmoid, 30)``
    (products below 2**61) and the result ``vec_mul(silu, u)`` (product below 2**63). The
    sigmoid is within 2**-12 of its value relatively (exp and reciprocal) plus 2**-30, then
    the two roundings to the activation format.
    """
    g = np.asarray(g, dtype=np.int64)
    e = vec_exp(-np.abs(g), NORM_FRAC)
    r, sh = vec_recip((1 << NORM_FRAC) + e)
    s = round_shift(r, sh - 2 * NORM_FRAC)
    sig = np.where(g >= 0, s, round_shift(e * s, NORM_FRAC))
    return vec_mul(round_shift(g * sig, NORM_FRAC), u)


def norm_weight(w: np.ndarray, k: int) -> np.ndarray:
    """An RMSNorm weight as the vector unit holds it: ``rint(float64(w) * sqrt(k) * 2**16)``
    (the norm's ``sqrt(K)`` folded in, so the unit never divides by K), int64."""
    return np.rint(np.asarray(w, np.float64) * np.sqrt(np.float64(k)) * 2.0 ** ACT_FRAC
                   ).astype(np.int64)


def norm_eps(eps: float, k: int) -> int:
    """RMSNorm's epsilon as the vector unit holds it: ``rint(eps * k * 2**32)`` (in units of a
    sum of squares of activations, ``K`` times ``eps`` at 2 * 16 fraction bits)."""
    return int(np.rint(np.float64(eps) * k * 2.0 ** (2 * ACT_FRAC)))


def vec_rmsnorm(x: np.ndarray, w: np.ndarray, eps: int) -> np.ndarray:
    """RMSNorm of activations ``x [..., K]`` with a unit weight ``w [K]`` (:func:`norm_weight`)
    and epsilon ``eps`` (:func:`norm_eps`).

    Per row: ``s = max(0, bitlen(max|x|) - 17)`` so that every ``|x >> s| < 2**17`` (the sum
    of squares stays below 2**53 for K < 2**19);
    ``ss = vec_sumsq(x, s) + (eps >> 2s)`` (flooring); ``(r, sh) = vec_rsqrt(ss)`` (``ss = 0``,
    an all-zero row with ``eps = 0``, gives zeros); the normalised row ``n = round_shift(x * r,
    sh + s - NORM_FRAC)`` (= ``x / sqrt(mean(x**2) + eps) / sqrt(K)`` with 30 fraction bits,
    ``|n| <= 2**30``; product below 2**48) and ``sat32(round_shift(n * w, NORM_FRAC))``
    (product below 2**63 for ``|w| < 2**32``). Relative error below 2**-12 plus half an output
    unit.
    """
    x = np.asarray(x, dtype=np.int64)
    amax = np.abs(x).max(axis=-1)
    s = np.maximum(0, _bit_length(amax) - (ACT_FRAC + 1))
    ss = vec_sumsq(x, s) + np.right_shift(np.int64(eps), 2 * s)
    r, sh = vec_rsqrt(np.maximum(ss, 1))
    r = np.where(ss > 0, r, 0)
    n = round_shift(x * r[..., None], (sh + s - NORM_FRAC)[..., None])
    return saturate(round_shift(n * np.asarray(w, np.int64), NORM_FRAC))


def vec_softmax(x: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Softmax of activations ``x [..., S]`` over the ``valid`` positions (the mask: the others
    get 0), in the activation format (probabilities with 16 fraction bits, in [0, 2**16]).

    ``m = max(x[valid])``; ``e = vec_exp(x - m)`` (0 where not valid; the max's is exactly
    2**16); ``S = vec_sum(e)`` (>= 2**16, below 2**53 for S < 2**36 positions); ``(r, sh) =
    vec_recip(S)``; ``p = round_shift(e * r, sh - 16)`` (product below 2**34). A row with no
    valid position is all zeros. Each ``p`` is within ``2**-11 * p + 2**-15`` of the exact
    softmax of ``x``'s real values (exp and reciprocal errors, roundings).
    """
    x = np.asarray(x, dtype=np.int64)
    valid = np.asarray(valid, dtype=bool)
    m = np.where(valid, x, -ACT_MAX).max(axis=-1, keepdims=True)
    e = np.where(valid, vec_exp(np.where(valid, x - m, 0)), 0)
    total = vec_sum(e)[..., None]
    r, sh = vec_recip(np.maximum(total, 1))
    return np.where(total > 0, round_shift(e * r, sh - ACT_FRAC), 0)


def vec_requant(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row symmetric INT8 requantisation of activations ``x [..., K]``, as the unit does it.

    ``amax = max|x|`` per row; rows wider than the activation format (``amax >= 2**31``, up to
    2**53: the attention's folded probabilities) are first shifted right (flooring) by ``s =
    bitlen(amax) - 31``, else ``s = 0``; ``(r, sh) = vec_recip(amax >> s)``; ``a =
    clip(round_shift((x >> s) * 127 * r, sh), -127, 127)`` (product below 2**55): ``a ~= x *
    127 / amax`` within 0.5 + 2**-13 * 127 codes (plus 2**-30 * 127 from a shift). An all-zero
    row gives zeros and ``amax = 0``. Returns ``(int8 a, int64 amax)``; the
    dequantisation scale is :func:`act_scale`.
    """
    x = np.asarray(x, dtype=np.int64)
    amax = np.abs(x).max(axis=-1)
    s = np.maximum(0, _bit_length(amax) - (ACT_BITS - 1))[..., None]
    r, sh = vec_recip(np.maximum(amax[..., None] >> s, 1))
    a = round_shift((x >> s) * ACT_QMAX * r, sh)
    a = np.where(amax[..., None] > 0, np.clip(a, -ACT_QMAX, ACT_QMAX), 0)
    return a.astype(np.int8), amax


def vec_kv4_rows(x: np.ndarray, group: int | None
                 ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray]:
    """INT4 KV rows of activations ``x [..., d]`` as the unit quantises them (the integer
    :func:`kv4_rows`).

    Rows wider than the activation format are shifted as in :func:`vec_requant`: ``s =
    max(0, bitlen(max|x|) - 31)``, ``y = x >> s`` (flooring), ``a = max|y|``; ``(r, sh) =
    vec_recip(a)``. Without ``group`` (values): ``q = clip(round_shift(y * 7 * r, sh), -7,
    7)``. With it (keys): per group ``c = clip(ceil(max_g|y| * 255 * r / 2**sh), 1, 255)``
    (the ceiling an arithmetic shift of the negation; product below 2**55), ``(r2, sh2) =
    vec_recip(a * c)`` (below 2**39), ``q = clip(round_shift(y * 1785 * r2, sh2), -7, 7)``
    (below 2**58). An all-zero row gives zeros. Returns ``(int8 q, uint8 codes or None,
    int64 a, int64 s)``; the row scale is :func:`kv4_scale`.
    """
    x = np.asarray(x, dtype=np.int64)
    amax = np.abs(x).max(axis=-1)
    s = np.maximum(0, _bit_length(amax) - (ACT_BITS - 1))
    y = x >> s[..., None]
    a = np.abs(y).max(axis=-1)
    r, sh = vec_recip(np.maximum(a, 1))
    live = a[..., None] > 0
    if group is None:
        q = round_shift(y * KV4_QMAX * r[..., None], sh[..., None])
        return np.where(live, np.clip(q, -KV4_QMAX, KV4_QMAX), 0).astype(np.int8), None, a, s
    d = x.shape[-1]
    if group <= 0 or d % group:
        raise ValueError(f"group {group} does not tile rows of {d} elements")
    ag = np.abs(y).reshape(*x.shape[:-1], d // group, group).max(axis=-1)
    c = -((-(ag * KV4_CODE_MAX * r[..., None])) >> sh[..., None])
    c = np.clip(c, 1, KV4_CODE_MAX)
    r2, sh2 = vec_recip(np.maximum(a, 1)[..., None] * c)
    q = round_shift(y * (KV4_QMAX * KV4_CODE_MAX) * np.repeat(r2, group, axis=-1),
                    np.repeat(sh2, group, axis=-1))
    q = np.where(live, np.clip(q, -KV4_QMAX, KV4_QMAX), 0)
    return q.astype(np.int8), c.astype(np.uint8), a, s


def kv4_scale(a: np.ndarray, s: np.ndarray, group: int | None) -> np.ndarray:
    """The float32 row scale of :func:`vec_kv4_rows`'s rows: ``a * 2**s / (7 * 255) *
    2**-16`` for keys (``group``), ``a * 2**s / 7 * 2**-16`` for values, in float64 (1 for an
    all-zero row)."""
    div = KV4_QMAX * (KV4_CODE_MAX if group is not None else 1)
    v = np.asarray(a, np.int64).astype(np.float64) * np.exp2(np.asarray(s, np.float64))
    return np.where(v > 0, v / div * 2.0 ** -ACT_FRAC, 1.0).astype(np.float32)


def act_scale(amax: np.ndarray, frac: int = ACT_FRAC) -> np.ndarray:
    """The float32 dequantisation scale of a requantised row (the WIDE epilogue's ``s_x``):
    ``float32(amax / 127 * 2**-frac)`` evaluated in float64 (1 for an all-zero row)."""
    amax = np.asarray(amax, dtype=np.int64).astype(np.float64)
    s = amax / ACT_QMAX * 2.0 ** -frac
    return np.where(amax > 0, s, 1.0).astype(np.float32)


def vec_argmax(x: np.ndarray) -> np.ndarray:
    """Index of the maximum of the last axis; ties go to the lowest index (int64)."""
    return np.argmax(np.asarray(x, dtype=np.int64), axis=-1).astype(np.int64)


def vec_argmax_words(x: np.ndarray, base: int = 0, pairs: bool = False) -> np.ndarray:
    """The two words an ARGMAX writes (:func:`hw.isa.argmax_imm`): ``base`` plus the index of
    the first maximum of the 1-D int32 row ``x`` (:func:`vec_argmax`), then the maximum; with
    ``pairs``, ``x`` is ``len(x) // 2`` pairs ``(index, value)`` (an odd last word is
    ignored) and the words are ``base`` plus the index word of the first pair of maximal
    value, then that value. The index word wraps to int32 (two's complement), as the
    engine's 32-bit adder.

    The PAIRS form composes segments exactly: for a row cut into consecutive segments whose
    words are ``vec_argmax_words(segment, first index of the segment)``, the PAIRS form over
    the segments' words in order is ``vec_argmax_words`` of the whole row (the first
    segment holding the maximum holds its first index)."""
    x = np.asarray(x, dtype=np.int64)
    if pairs:
        tags, x = x[0:len(x) - 1:2], x[1::2]
    i = int(vec_argmax(x))
    index = (base + (int(tags[i]) if pairs else i) + (1 << 31)) % (1 << 32) - (1 << 31)
    return np.array([index, int(x[i])], dtype=np.int64)


# ------------------------------------------------- vector unit: torch twin (bit-identical)
_LUTS_T: dict[str, torch.Tensor] = {}


def _lut_t(name: str, table: np.ndarray, device: torch.device) -> torch.Tensor:
    key = f"{name}:{device}"
    if key not in _LUTS_T:
        _LUTS_T[key] = torch.from_numpy(table).to(device)
    return _LUTS_T[key]


def to_fixed_torch(x: torch.Tensor, frac: int = ACT_FRAC) -> torch.Tensor:
    """Torch twin of :func:`to_fixed` (int64)."""
    x = x.to(torch.float64)
    if torch.isnan(x).any():
        raise ValueError("vector operand contains NaN")
    return torch.clamp(torch.round(x * 2.0 ** frac), -ACT_MAX, ACT_MAX).to(torch.int64)


def from_fixed_torch(q: torch.Tensor, frac: int = ACT_FRAC) -> torch.Tensor:
    """Torch twin of :func:`from_fixed` (float64, exact)."""
    return q.to(torch.float64) * 2.0 ** -frac


def round_shift_torch(v: torch.Tensor, s: torch.Tensor | int) -> torch.Tensor:
    """Torch twin of :func:`round_shift` (fewest passes: it is the twin's inner loop)."""
    if isinstance(s, int):
        s = min(s, 62)
        return (v + (1 << (s - 1))) >> s if s > 0 else v << -s
    s = s.clamp(max=62)
    pos = s.clamp(min=0)
    right = (v + ((torch.ones_like(pos) << pos) >> 1)) >> pos  # 2**(s-1), 0 for s == 0
    if bool((s < 0).any()):
        return torch.where(s < 0, v << (-s).clamp(min=0), right)
    return right


def saturate_torch(v: torch.Tensor, bits: int = ACT_BITS) -> torch.Tensor:
    """Torch twin of :func:`saturate`."""
    m = (1 << (bits - 1)) - 1
    return v.clamp(-m, m)


def vec_sumsq_torch(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`vec_sumsq`."""
    y = x >> shift.unsqueeze(-1)
    return (y * y).sum(dim=-1)


def vec_add_torch(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`vec_add`."""
    return saturate_torch(a + b)


def vec_mul_torch(a: torch.Tensor, b: torch.Tensor, frac: int = ACT_FRAC) -> torch.Tensor:
    """Torch twin of :func:`vec_mul`."""
    return saturate_torch(round_shift_torch(a * b, frac))


def _bit_length_torch(x: torch.Tensor) -> torch.Tensor:
    if (x < 0).any() or (x >= _EXACT).any():
        raise ValueError(f"operand out of the table units' range [0, 2**53): "
                         f"{int(x.min())}..{int(x.max())}")
    return torch.frexp(x.to(torch.float64))[1].to(torch.int64)


def _normalise_torch(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    return torch.where(e >= 0, x >> e.clamp(min=0), x << (-e).clamp(min=0))


def vec_recip_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch twin of :func:`vec_recip`."""
    if (x < 1).any():
        raise ValueError(f"reciprocal of {int(x.min())}: operands must be >= 1")
    n = _bit_length_torch(x)
    m = _normalise_torch(x, n - MANT_BITS)
    r0 = _lut_t("recip", RECIP_LUT, x.device)[(m >> (MANT_BITS - 1 - LUT_BITS)) - 2 ** LUT_BITS]
    r = (r0 * ((1 << (RECIP_FRAC + 1)) - m * r0)) >> RECIP_FRAC
    return r, n + RECIP_FRAC - MANT_BITS


def vec_rsqrt_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch twin of :func:`vec_rsqrt`."""
    if (x < 1).any():
        raise ValueError(f"rsqrt of {int(x.min())}: operands must be >= 1")
    e = _bit_length_torch(x) - MANT_BITS
    e = e + (e & 1)
    m = _normalise_torch(x, e)
    lut = _lut_t("rsqrt", RSQRT_LUT, x.device)
    r0 = lut[(m >> (MANT_BITS - 1 - LUT_BITS)) - 2 ** (LUT_BITS - 1)]
    t = (m * r0 * r0) >> MANT_BITS
    r = (r0 * ((3 << (2 * RSQRT_FRAC - MANT_BITS)) - t)) >> (2 * RSQRT_FRAC - MANT_BITS + 1)
    return r, RSQRT_FRAC + torch.div(e, 2, rounding_mode="floor")


def vec_exp_torch(d: torch.Tensor, frac: int = ACT_FRAC) -> torch.Tensor:
    """Torch twin of :func:`vec_exp`."""
    if (d > 0).any():
        raise ValueError(f"exp of {int(d.max())} > 0: the unit takes max-subtracted operands")
    u = (d * LOG2E_Q) >> CONST_FRAC
    k = u >> ACT_FRAC
    f = u & ((1 << ACT_FRAC) - 1)
    lo_bits = ACT_FRAC - LUT_BITS
    t = _lut_t("exp2", EXP2_LUT, d.device)[f >> lo_bits]
    p = t + round_shift_torch(t * (f & ((1 << lo_bits) - 1)) * LN2_Q, ACT_FRAC + CONST_FRAC)
    return round_shift_torch(p, ACT_FRAC - frac - k)


def rope_table_torch(c: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`rope_table`."""
    return torch.round(c.to(torch.float64) * 2.0 ** ROPE_FRAC).to(torch.int64)


def vec_rope_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`vec_rope`."""
    h = x.shape[-1] // 2
    rot = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return saturate_torch(round_shift_torch(x * cos + rot * sin, ROPE_FRAC))


def vec_silu_gate_torch(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`vec_silu_gate`."""
    e = vec_exp_torch(-g.abs(), NORM_FRAC)
    r, sh = vec_recip_torch((1 << NORM_FRAC) + e)
    s = round_shift_torch(r, sh - 2 * NORM_FRAC)
    sig = torch.where(g >= 0, s, round_shift_torch(e * s, NORM_FRAC))
    return vec_mul_torch(round_shift_torch(g * sig, NORM_FRAC), u)


def norm_weight_torch(w: torch.Tensor, k: int) -> torch.Tensor:
    """Torch twin of :func:`norm_weight`."""
    return torch.round(w.detach().to(torch.float64) * float(np.sqrt(np.float64(k)))
                       * 2.0 ** ACT_FRAC).to(torch.int64)


def vec_rmsnorm_torch(x: torch.Tensor, w: torch.Tensor, eps: int) -> torch.Tensor:
    """Torch twin of :func:`vec_rmsnorm`."""
    amax = x.abs().amax(dim=-1)
    s = (_bit_length_torch(amax) - (ACT_FRAC + 1)).clamp(min=0)
    ss = vec_sumsq_torch(x, s) + (torch.full_like(s, eps) >> (2 * s))
    r, sh = vec_rsqrt_torch(ss.clamp(min=1))
    r = torch.where(ss > 0, r, torch.zeros_like(r))
    n = round_shift_torch(x * r.unsqueeze(-1), (sh + s - NORM_FRAC).unsqueeze(-1))
    return saturate_torch(round_shift_torch(n * w, NORM_FRAC))


def vec_softmax_torch(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`vec_softmax`."""
    neg = torch.full_like(x, -ACT_MAX)
    m = torch.where(valid, x, neg).amax(dim=-1, keepdim=True)
    zero = torch.zeros_like(x)
    e = torch.where(valid, vec_exp_torch(torch.where(valid, x - m, zero)), zero)
    total = e.sum(dim=-1, keepdim=True)
    r, sh = vec_recip_torch(total.clamp(min=1))
    return torch.where(total > 0, round_shift_torch(e * r, sh - ACT_FRAC), zero)


def vec_requant_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch twin of :func:`vec_requant`."""
    amax = x.abs().amax(dim=-1)
    s = (_bit_length_torch(amax) - (ACT_BITS - 1)).clamp(min=0).unsqueeze(-1)
    r, sh = vec_recip_torch((amax.unsqueeze(-1) >> s).clamp(min=1))
    a = round_shift_torch((x >> s) * ACT_QMAX * r, sh)
    a = torch.where(amax.unsqueeze(-1) > 0, a.clamp(-ACT_QMAX, ACT_QMAX), torch.zeros_like(a))
    return a.to(torch.int8), amax


def vec_kv4_rows_torch(x: torch.Tensor, group: int | None
                       ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Torch twin of :func:`vec_kv4_rows`."""
    amax = x.abs().amax(dim=-1)
    s = (_bit_length_torch(amax) - (ACT_BITS - 1)).clamp(min=0)
    y = x >> s.unsqueeze(-1)
    a = y.abs().amax(dim=-1)
    r, sh = vec_recip_torch(a.clamp(min=1))
    live = a.unsqueeze(-1) > 0
    zero = torch.zeros_like(y)
    if group is None:
        q = round_shift_torch(y * KV4_QMAX * r.unsqueeze(-1), sh.unsqueeze(-1))
        q = torch.where(live, q.clamp(-KV4_QMAX, KV4_QMAX), zero)
        return q.to(torch.int8), None, a, s
    d = x.shape[-1]
    if group <= 0 or d % group:
        raise ValueError(f"group {group} does not tile rows of {d} elements")
    ag = y.abs().reshape(*x.shape[:-1], d // group, group).amax(dim=-1)
    c = -((-(ag * KV4_CODE_MAX * r.unsqueeze(-1))) >> sh.unsqueeze(-1))
    c = c.clamp(1, KV4_CODE_MAX)
    r2, sh2 = vec_recip_torch(a.clamp(min=1).unsqueeze(-1) * c)
    q = round_shift_torch(y * (KV4_QMAX * KV4_CODE_MAX) * r2.repeat_interleave(group, dim=-1),
                          sh2.repeat_interleave(group, dim=-1))
    q = torch.where(live, q.clamp(-KV4_QMAX, KV4_QMAX), zero)
    return q.to(torch.int8), c.to(torch.uint8), a, s


def kv4_scale_torch(a: torch.Tensor, s: torch.Tensor, group: int | None) -> torch.Tensor:
    """Torch twin of :func:`kv4_scale`."""
    div = KV4_QMAX * (KV4_CODE_MAX if group is not None else 1)
    v = a.to(torch.float64) * torch.exp2(s.to(torch.float64))
    return torch.where(v > 0, v / div * 2.0 ** -ACT_FRAC, torch.ones_like(v)).to(torch.float32)


def act_scale_torch(amax: torch.Tensor, frac: int = ACT_FRAC) -> torch.Tensor:
    """Torch twin of :func:`act_scale`."""
    a = amax.to(torch.float64)
    s = a / ACT_QMAX * 2.0 ** -frac
    return torch.where(a > 0, s, torch.ones_like(s)).to(torch.float32)


def vec_argmax_torch(x: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`vec_argmax` (ties: lowest index, made explicit)."""
    m = x.amax(dim=-1, keepdim=True)
    idx = torch.arange(x.shape[-1], device=x.device).expand_as(x)
    return torch.where(x == m, idx, torch.full_like(idx, x.shape[-1])).amin(dim=-1)


# ------------------------------------------------- vector unit: the float interface
# The model-level twin and the runtime hold activations as float tensors: float32 from the
# float WIDE epilogue and the attention products, float64 from the vector unit. A vector op
# converts its float operands with to_fixed, computes exactly, and returns from_fixed of the
# result (float64: every value it writes is on the 2**-16 grid and the exact word, so a later
# vector op -- or a fused program's later part, on chip -- reads the very word). A float host
# op (a float LM head) reads such a value as float32.
def rms_norm_vector(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the last dimension with the vector unit's numerics (:func:`vec_rmsnorm`;
    the weight and epsilon as the unit holds them: :func:`norm_weight`, :func:`norm_eps`)."""
    k = x.shape[-1]
    y = vec_rmsnorm_torch(to_fixed_torch(x), norm_weight_torch(weight, k), norm_eps(eps, k))
    return from_fixed_torch(y)


def rope_vector(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding with the vector unit's numerics (:func:`vec_rope`; float tables in
    fixed point by :func:`rope_table`)."""
    return from_fixed_torch(vec_rope_torch(to_fixed_torch(x), rope_table_torch(cos),
                                           rope_table_torch(sin)))


def softmax_vector(scores: torch.Tensor, scale: float, mask: torch.Tensor) -> torch.Tensor:
    """Attention softmax with the vector unit's numerics: ``z = scores * scale + mask`` in
    float32 (the scale belongs to the scores' float epilogue, the additive mask only says
    which positions are valid: finite ``z``), then :func:`vec_softmax` of ``to_fixed(z)``."""
    z = scores * scale + mask
    valid = torch.isfinite(z)
    zero = torch.zeros((), dtype=z.dtype)
    return from_fixed_torch(vec_softmax_torch(to_fixed_torch(torch.where(valid, z, zero)),
                                              valid))


def silu_gate_vector(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` with the vector unit's numerics (:func:`vec_silu_gate`)."""
    return from_fixed_torch(vec_silu_gate_torch(to_fixed_torch(gate), to_fixed_torch(up)))


def add_vector(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Residual addition with the vector unit's numerics (:func:`vec_add`)."""
    return from_fixed_torch(vec_add_torch(to_fixed_torch(a), to_fixed_torch(b)))


def quantize_activations_vector(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row INT8 requantisation as the vector unit does it: :func:`vec_requant` of
    ``to_fixed(x)`` and the scale :func:`act_scale` (the drop-in for
    :func:`quantize_activations`: ``int8 [T, K]``, ``float32 [T]``)."""
    a, amax = vec_requant(to_fixed(x))
    return a, act_scale(amax)


def quantize_activations_vector_torch(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch twin of :func:`quantize_activations_vector` (any leading dims)."""
    a, amax = vec_requant_torch(to_fixed_torch(x))
    return a, act_scale_torch(amax)


def fold_values_vector(probs: torch.Tensor, codes: torch.Tensor, kv_heads: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The values prologue on the vector unit: probabilities ``[B, H, T, S]`` (on the 2**-16
    grid) times the value rows' integer codes ``codes [B, KV, S]`` (:func:`value_amax_torch`:
    each cached value row's integer ``amax``), requantised per row.

    ``w = to_fixed(p) * c`` exactly (below 2**47: ``p`` with 16 fraction bits times an
    ``amax`` below 2**31) and :func:`vec_requant` of ``w`` per (head, token) row, together
    :func:`vec_fold_torch` (what FOLD computes), and the row's amax word
    :func:`fold_amax_word` (what FOLD writes after the codes). Returns INT8 rows ``[B, KV,
    G*T, S]`` and the amax words (int64 ``[B, KV, G*T]``), which :func:`values_vector` turns
    into the outputs' scale.
    """
    a, amax = vec_fold_torch(group_rows(to_fixed_torch(probs), kv_heads), codes.unsqueeze(-2))
    return a, fold_amax_word_torch(amax)


def value_codes(s_v: torch.Tensor, qmax: int = ACT_QMAX) -> torch.Tensor:
    """A value row's integer ``amax`` recovered from its float32 scale, ``rint(float64(s_v) *
    qmax * 2**16)`` (int64): :func:`value_amax_torch` of the row where ``0 < amax < 2**23``
    (an all-zero row's scale is 1, its code ``qmax * 2**16``; wider rows round)."""
    return torch.round(s_v.to(torch.float64) * qmax * 2.0 ** ACT_FRAC).to(torch.int64)


def value_amax_torch(v: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """FOLD's value codes of value rows ``v [..., S, d]``: each row's integer ``amax`` as the
    cache's append computes it (int64 ``[..., S]``). ``bits`` 8: REQUANT's ``amax``
    (:func:`requant_amax_torch`, what the on-chip append writes as the code); 4: ``a << s``
    of :func:`vec_kv4_rows_torch` (the integer of :func:`kv4_scale` times 7). An all-zero
    row's code is 0 (it adds nothing to the probabilities' row)."""
    if bits not in KV_BITS:
        raise ValueError(f"KV-cache bits must be one of {KV_BITS}, got {bits!r}")
    if bits == 8:
        return requant_amax_torch(v)
    _, _, a, s = vec_kv4_rows_torch(to_fixed_torch(v), None)
    return a << s


# ------------------------------------------------- vector unit: the values prologue (FOLD)
# The attention's values prologue on chip (VecFunc.FOLD): each probability times its cached
# value row's integer amax, exact in 54 bits, then REQUANT of those wide rows.

#: Signed bits of FOLD's products ``w = a * c``, saturated: rows below 2**53, as
#: :func:`vec_requant` takes them (its ``s = bitlen(amax) - 31`` at most 22).
FOLD_BITS = TABLE_IN_BITS + 1
#: Bits of the ``amax`` mantissa in FOLD's ``amax`` word (:func:`fold_amax_word`); the
#: :data:`FOLD_AMAX_SHIFT_BITS` bits above hold its shift.
FOLD_AMAX_MANT_BITS = 27
FOLD_AMAX_SHIFT_BITS = ACT_BITS - FOLD_AMAX_MANT_BITS

__all__ += ["FOLD_BITS", "FOLD_AMAX_MANT_BITS", "FOLD_AMAX_SHIFT_BITS", "vec_fold",
            "vec_fold_torch", "fold_amax_word", "fold_amax_word_torch", "fold_amax_fields",
            "fold_amax"]


def vec_fold(a: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The values prologue of rows ``a [..., S]`` (Q15.16 probabilities) and ``c [..., S]``
    (each position's integer value code, broadcast against ``a``), as FOLD computes it.

    ``w = sat54(a * c)`` (the int32 x int32 product exact in int64, below 2**62, then
    saturated symmetrically to :data:`FOLD_BITS` bits: below 2**53), then
    :func:`vec_requant` of ``w`` per row. For the attention (``0 <= a <= 2**16``, ``0 <= c <
    2**31``) the saturation never acts: ``w < 2**47``. Returns ``(int8 codes, int64 amax)``
    (``amax = max |w|`` per row, up to 2**53 - 1; the word FOLD writes is
    :func:`fold_amax_word` of it).
    """
    w = saturate(np.asarray(a, np.int64) * np.asarray(c, np.int64), FOLD_BITS)
    return vec_requant(w)


def vec_fold_torch(a: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch twin of :func:`vec_fold`."""
    return vec_requant_torch(saturate_torch(a.to(torch.int64) * c.to(torch.int64), FOLD_BITS))


def fold_amax_word(amax: np.ndarray) -> np.ndarray:
    """The 32-bit word FOLD writes after its codes for a row's ``amax`` (below 2**53, wider
    than a word): ``(amax >> s) | (s << 27)`` with ``s = max(0, bitlen(amax) - 27)`` (at most
    26, five bits), the mantissa flooring. ``fold_amax(word)`` is within ``2**-26`` of
    ``amax`` relatively, and equal to it below ``2**27``; int64."""
    amax = np.asarray(amax, np.int64)
    s = np.maximum(0, _bit_length(amax) - FOLD_AMAX_MANT_BITS)
    return (amax >> s) | (s << FOLD_AMAX_MANT_BITS)


def fold_amax_word_torch(amax: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`fold_amax_word`."""
    s = (_bit_length_torch(amax) - FOLD_AMAX_MANT_BITS).clamp(min=0)
    return (amax >> s) | (s << FOLD_AMAX_MANT_BITS)


def fold_amax_fields(word):
    """The fields ``(m, s)`` of a :func:`fold_amax_word` word (any 32-bit word): ``m`` its
    low :data:`FOLD_AMAX_MANT_BITS` bits, ``s`` the bits above; ints, arrays or tensors."""
    return (word & ((1 << FOLD_AMAX_MANT_BITS) - 1),
            (word >> FOLD_AMAX_MANT_BITS) & ((1 << FOLD_AMAX_SHIFT_BITS) - 1))


def fold_amax(word: np.ndarray) -> np.ndarray:
    """The ``amax`` a :func:`fold_amax_word` word stands for: ``m << s`` (int64)."""
    m, s = fold_amax_fields(np.asarray(word, np.int64))
    return m << s


def kv4_rows_vector(x: np.ndarray, group: int | None
                    ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """:func:`kv4_rows` as the vector unit computes it: :func:`vec_kv4_rows` of
    ``to_fixed(x)`` and the scale :func:`kv4_scale` (the same outputs: ``q``, codes, float32
    row scales)."""
    q, c, a, s = vec_kv4_rows(to_fixed(x), group)
    return q, c, kv4_scale(a, s, group)


def kv4_rows_vector_torch(x: torch.Tensor, group: int | None
                          ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Torch twin of :func:`kv4_rows_vector`."""
    q, c, a, s = vec_kv4_rows_torch(to_fixed_torch(x), group)
    return q, c, kv4_scale_torch(a, s, group)


__all__ += ["rms_norm_vector", "rope_vector", "softmax_vector", "silu_gate_vector",
            "add_vector", "quantize_activations_vector", "quantize_activations_vector_torch",
            "fold_values_vector", "value_codes", "value_amax_torch", "vec_kv4_rows",
            "vec_kv4_rows_torch", "kv4_scale", "kv4_scale_torch", "kv4_rows_vector",
            "kv4_rows_vector_torch"]


# ------------------------------------------------- vector unit: dequantisation of GEMM outputs
# The WIDE epilogue's int32 accumulators to activations on chip (VecFunc.DEQUANT): the float
# dequant_output with its float32 row scale replaced by a fixed-point channel word chosen at
# compile time, and the token's act_scale by the integer amax REQUANT wrote after its codes.

#: Bits of a channel word's mantissa ``m``: normalised, ``m`` in [2**16, 2**17), so that it
#: and the 17-bit factor ``q`` are each one unsigned operand of an 18x18 signed multiplier.
DEQUANT_MANT_BITS = MANT_BITS + 1
#: Bits of a channel word's exponent ``E`` (bits 17..23 of the word; the bits above are 0).
DEQUANT_EXP_BITS = 7
DEQUANT_EXP_MAX = (1 << DEQUANT_EXP_BITS) - 1
#: Bits of a channel word that hold its fields (those above are ignored).
DEQUANT_WORD_BITS = DEQUANT_MANT_BITS + DEQUANT_EXP_BITS
#: The final shift ``E - k`` is clamped to [-DEQUANT_LEFT_MAX, DEQUANT_SH_MAX]: a left shift
#: by 15 of a non-zero ``acc * q`` (``>= 2**16`` for a normalised word) already saturates, and
#: a right shift by 63 of ``|acc * q| < 2**48`` gives 0, as any larger one does.
DEQUANT_LEFT_MAX = (ACT_BITS - 1) - (DEQUANT_MANT_BITS - 1)
DEQUANT_SH_MAX = 63
#: The amax that stands for an all-zero row (REQUANT writes 0; :func:`act_scale` is then 1):
#: ``127 * 2**16``, so that the factor is ``row_scale * 1``.
DEQUANT_ZERO_AMAX = ACT_QMAX << ACT_FRAC

__all__ += ["DEQUANT_MANT_BITS", "DEQUANT_EXP_BITS", "DEQUANT_EXP_MAX", "DEQUANT_WORD_BITS",
            "DEQUANT_LEFT_MAX",
            "DEQUANT_SH_MAX", "DEQUANT_ZERO_AMAX", "dequant_channels", "dequant_channels_torch",
            "requant_amax", "requant_amax_torch", "vec_dequant_factor",
            "vec_dequant_factor_torch", "vec_dequant", "vec_dequant_torch",
            "dequant_output_vector", "dequant_output_vector_torch"]

_MANT_MASK = (1 << DEQUANT_MANT_BITS) - 1


def _check_row_scale(bad: np.ndarray, row_scale) -> None:
    """ValueError naming the first channel whose scale no channel word holds (``bad``)."""
    if bad.any():
        n = int(np.flatnonzero(bad.reshape(-1))[0])
        raise ValueError(f"row_scale[{n}] = {np.asarray(row_scale).reshape(-1)[n]!r}: a channel "
                         f"word holds finite scales in [0, {ACT_QMAX} * (2**"
                         f"{DEQUANT_MANT_BITS} - 1/2))")


def dequant_channels(row_scale: np.ndarray) -> np.ndarray:
    """The DEQUANT channel words of float32 row scales (compile time): int64 ``[N]``.

    A word holds ``c = float64(row_scale) / 127`` (the ``1 / 127`` of :func:`act_scale` folded
    in) as ``c ~= m * 2**-E``: bits 0..16 the mantissa ``m`` in [2**16, 2**17) and bits 17..23
    the exponent ``E`` in [0, 127], the bits above 0 (a non-negative int32). With ``(f, x) =
    frexp(c)``: ``m = rint(f * 2**17)``, ``E = 17 - x`` (``m = 2**17`` becomes ``2**16`` with
    ``E - 1``): ``|m * 2**-E - c| <= 2**-17 * c``. A zero scale, and one below ``2**-111``
    (``E > 127``: every output then rounds to 0 anyway, ``|acc * amax * c| < 2**-48``), gives
    the word 0 (all outputs 0). ``ValueError`` names a negative, non-finite or too large
    scale (``E < 0``: ``c >= 2**17 - 1/2``).
    """
    return _channel_words(np.asarray(row_scale, np.float32).astype(np.float64) / ACT_QMAX,
                          row_scale)


def _channel_words(c: np.ndarray, row_scale) -> np.ndarray:
    """:func:`dequant_channels`' words of ``c`` (float64, the ``1 / 127`` folded in);
    ``row_scale``: what a ``ValueError`` names."""
    finite = np.isfinite(c)
    f, x = np.frexp(np.where(finite, c, 0.0))
    m = np.rint(f * 2.0 ** DEQUANT_MANT_BITS).astype(np.int64)
    e = DEQUANT_MANT_BITS - x.astype(np.int64)
    carry = m >> DEQUANT_MANT_BITS
    m, e = np.where(carry > 0, m >> 1, m), e - carry
    _check_row_scale(~finite | (c < 0) | ((c > 0) & (e < 0)), row_scale)
    return np.where((c > 0) & (e <= DEQUANT_EXP_MAX), m | (e << DEQUANT_MANT_BITS), 0)


def requant_amax(x: np.ndarray) -> np.ndarray:
    """The ``amax`` REQUANT writes after the codes of float rows ``x [..., K]``
    (:func:`vec_requant` of ``to_fixed(x)``): ``max |to_fixed(x)|`` per row, int64."""
    return np.abs(to_fixed(x)).max(axis=-1)


def vec_dequant_factor(chan: np.ndarray, amax: np.ndarray, shift: np.ndarray | int = 0
                       ) -> tuple[np.ndarray, np.ndarray]:
    """The per-element factor of :func:`vec_dequant`: ``(q, sh)`` with ``m * A * 2**(shift -
    E) ~= q * 2**-sh``, for channel words ``chan [..., N]``, a row's ``amax [...]`` (an
    unsigned 32-bit word, broadcast over the last axis) and its ``shift [...]`` (0 .. 31: the
    amax is ``amax * 2**shift``, a FOLD word's fields, :func:`fold_amax_fields`; 0 else).

    ``A = amax``, or :data:`DEQUANT_ZERO_AMAX` when ``amax = 0``; ``b = bitlen(A)`` (1..32,
    once per row); ``m, E`` the word's fields (any word is an operand: bits above 23 are
    ignored; :func:`dequant_channels` writes normalised ones); ``p = m * A`` (exact, below
    2**49); ``t = (p >> (b + 16)) & 1`` and ``k = b - 1 + t`` (``bitlen(p) - 17`` for a
    normalised ``m``: ``p`` in [2**(b+15), 2**(b+17))); ``q = min(round_shift(p, k), 2**17 -
    1)`` (in [2**16, 2**17) for a normalised word: relative error at most 2**-17, the clamp
    included); ``sh = clip(E - k - shift, -15, 63)``.
    """
    chan = np.asarray(chan, np.int64)
    amax = np.asarray(amax, np.int64)
    shift = np.asarray(shift, np.int64)[..., None]
    if (amax < 0).any() or (amax >> 32).any():
        raise ValueError(f"amax must be an unsigned 32-bit word, got {int(amax.min())}.."
                         f"{int(amax.max())}")
    q, e = _factor(chan, np.where(amax > 0, amax, DEQUANT_ZERO_AMAX)[..., None])
    return q, np.clip(e - shift, -DEQUANT_LEFT_MAX, DEQUANT_SH_MAX)


def _factor(chan: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`vec_dequant_factor`'s ``(q, E - k)`` of channel words ``chan`` and amax values
    ``a`` (zero replaced, broadcast together), before the shift and the clip."""
    b = _bit_length(a)
    m = chan & _MANT_MASK
    p = m * a
    k = b - 1 + ((p >> (b + MANT_BITS)) & 1)
    q = np.minimum(round_shift(p, k), _MANT_MASK)
    return q, ((chan >> DEQUANT_MANT_BITS) & DEQUANT_EXP_MAX) - k


def vec_dequant(acc: np.ndarray, chan: np.ndarray, amax: np.ndarray,
                shift: np.ndarray | int = 0) -> np.ndarray:
    """WIDE outputs to activations: ``acc [..., N]`` (int32 accumulators of one GEMM, a row
    per token), channel words ``chan [N]`` (:func:`dequant_channels`) and the token's ``amax
    [...]`` (as REQUANT wrote it for the GEMM's input row) -> Q15.16 int64 ``[..., N]``.

    ``y = sat32(round_shift(acc * q, sh))`` (round half up; the product exact, below 2**48,
    and below 2**63 after a left shift) with ``(q, sh) = vec_dequant_factor(chan, amax)``:
    ``y ~= acc * row_scale[n] * act_scale(amax) * 2**16``, the float WIDE epilogue
    (:func:`dequant_output`) in the activation format. Error bound (normalised words, no
    saturation): ``|y - Y| <= 2**-16 * (1 + 2**-16) * |Y| + 1/2`` with ``Y`` the exact value
    in output units (``m`` and ``q`` each within 2**-17 relatively, the final rounding half a
    unit); the float32 ``row_scale`` is exact in float64 and ``amax`` is an integer. With
    ``shift`` (a FOLD word's, :func:`fold_amax_fields`), the amax is ``amax * 2**shift``.
    """
    q, sh = vec_dequant_factor(chan, amax, shift)
    return saturate(round_shift(np.asarray(acc, np.int64) * q, sh))


def dequant_output_vector(acc: np.ndarray, chan: np.ndarray, amax: np.ndarray) -> np.ndarray:
    """The WIDE epilogue as the vector unit computes it (the drop-in for
    :func:`dequant_output` with ``vector``): ``from_fixed(vec_dequant(acc, chan, amax))``,
    float64 (exact)."""
    return from_fixed(vec_dequant(acc, chan, amax))


def dequant_channels_torch(row_scale: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`dequant_channels` (int64)."""
    return _channel_words_torch(row_scale.to(torch.float32).to(torch.float64) / ACT_QMAX,
                                row_scale)


def _channel_words_torch(c: torch.Tensor, row_scale: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`_channel_words`."""
    finite = torch.isfinite(c)
    f, x = torch.frexp(torch.where(finite, c, torch.zeros_like(c)))
    m = torch.round(f * 2.0 ** DEQUANT_MANT_BITS).to(torch.int64)
    e = DEQUANT_MANT_BITS - x.to(torch.int64)
    carry = m >> DEQUANT_MANT_BITS
    m, e = torch.where(carry > 0, m >> 1, m), e - carry
    bad = ~finite | (c < 0) | ((c > 0) & (e < 0))
    if bad.any():
        _check_row_scale(bad.cpu().numpy(), row_scale.cpu().numpy())
    return torch.where((c > 0) & (e <= DEQUANT_EXP_MAX), m | (e << DEQUANT_MANT_BITS),
                       torch.zeros_like(m))


def requant_amax_torch(x: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`requant_amax`."""
    return to_fixed_torch(x).abs().amax(dim=-1)


def vec_dequant_factor_torch(chan: torch.Tensor, amax: torch.Tensor,
                             shift: torch.Tensor | int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch twin of :func:`vec_dequant_factor`."""
    shift = torch.as_tensor(shift, dtype=torch.int64).unsqueeze(-1)
    if (amax < 0).any() or (amax >> 32).any():
        raise ValueError(f"amax must be an unsigned 32-bit word, got {int(amax.min())}.."
                         f"{int(amax.max())}")
    a = torch.where(amax > 0, amax, torch.full_like(amax, DEQUANT_ZERO_AMAX)).unsqueeze(-1)
    q, e = _factor_torch(chan, a)
    return q, (e - shift).clamp(-DEQUANT_LEFT_MAX, DEQUANT_SH_MAX)


def _factor_torch(chan: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch twin of :func:`_factor`."""
    b = _bit_length_torch(a)
    m = chan & _MANT_MASK
    p = m * a
    k = b - 1 + ((p >> (b + MANT_BITS)) & 1)
    q = round_shift_torch(p, k).clamp(max=_MANT_MASK)
    return q, ((chan >> DEQUANT_MANT_BITS) & DEQUANT_EXP_MAX) - k


def vec_dequant_torch(acc: torch.Tensor, chan: torch.Tensor, amax: torch.Tensor,
                      shift: torch.Tensor | int = 0) -> torch.Tensor:
    """Torch twin of :func:`vec_dequant`."""
    q, sh = vec_dequant_factor_torch(chan, amax, shift)
    return saturate_torch(round_shift_torch(acc.to(torch.int64) * q, sh))


def dequant_output_vector_torch(acc: torch.Tensor, chan: torch.Tensor,
                                amax: torch.Tensor) -> torch.Tensor:
    """Torch twin of :func:`dequant_output_vector`."""
    return from_fixed_torch(vec_dequant_torch(acc, chan, amax))


# ------------------------------------------------- vector unit: attention scores on chip
# The scores GEMM's int32 accumulators to the softmax's input rows on chip: a DEQUANT whose
# channel words hold the key scales with the softmax scale folded in (one word per key
# position and kv head, written as the cache grows) and whose amax words are the query
# rows' (REQUANT's, or the host's :func:`scores_prologue_vector`).

__all__ += ["scores_channels", "scores_channels_torch", "scores_prologue_vector",
            "scores_vector"]


def scores_channels(s_k: np.ndarray, scale: float) -> np.ndarray:
    """The DEQUANT channel words of the scores: key scales ``s_k [..., S]`` (float32, one per
    cached position) times the softmax ``scale``, int64 ``[..., S]``.

    As :func:`dequant_channels` of ``float64(s_k) * float64(scale)`` (one float64 product,
    not rounded to float32 before the words are formed): ``|m * 2**-E - c| <= 2**-17 * c``
    with ``c = s_k * scale / 127``. ``ValueError`` as :func:`dequant_channels`.
    """
    c = np.asarray(s_k, np.float32).astype(np.float64) * float(scale) / ACT_QMAX
    return _channel_words(c, s_k)


def scores_channels_torch(s_k: torch.Tensor, scale: float) -> torch.Tensor:
    """Torch twin of :func:`scores_channels` (int64)."""
    c = s_k.to(torch.float32).to(torch.float64) * float(scale) / ACT_QMAX
    return _channel_words_torch(c, s_k)


def scores_prologue_vector(q: torch.Tensor, kv_heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries ``[B, H, T, d]`` -> INT8 rows ``[B, KV, G*T, d]`` and each row's ``amax``
    (int64 ``[B, KV, G*T]``): :func:`vec_requant` of ``to_fixed`` of the grouped rows, what a
    REQUANT part writes (the codes equal :func:`scores_prologue`'s with ``vector``)."""
    return vec_requant_torch(to_fixed_torch(group_rows(q, kv_heads)))


def scores_vector(acc: torch.Tensor, amax: torch.Tensor, amax_k: torch.Tensor, scale: float,
                  heads: int, kv_bits: int = 8) -> torch.Tensor:
    """The scaled scores as the vector unit's DEQUANT writes them: integer scores ``acc [B,
    KV, G*T, S]``, the query rows' ``amax [B, KV, G*T]`` (:func:`scores_prologue_vector`) and
    the key rows' integer ``amax_k [B, KV, S]`` (:func:`requant_amax_torch` of the keys) ->
    float64 ``[B, H, T, S]`` (the exact words), ``from_fixed(vec_dequant(acc, chan, amax))``
    with the channel words ``chan`` CHANNEL's, :func:`scores_channels_vector`.

    This is ``scores * scale`` of the float path (:func:`scores_epilogue`, then the softmax's
    scale) computed on chip in Q15.16: each element is within ``(3 * 2**-17 + 2**-32) * |z|
    + 2**-17`` of the exact ``z = acc * s_q * s_k * scale`` (``s_q``, ``s_k`` the exact
    ``amax / 127 * 2**-16`` of the query and key rows, ``amax_k / (7 * 255) * 2**-16`` for
    INT4 keys): the channel word's value within ``(2**-16 + 2**-34)`` relatively
    (:func:`vec_channel`), then :func:`vec_dequant`'s factor ``q`` within ``2**-17`` and its
    rounding half a unit. The float path's float32 products are within about ``2**-23 *
    |z|``; the softmax of these rows (:func:`vec_softmax`) then differs from the float path's
    by at most ``2**-15 |z|``-sized shifts of its inputs on top of its own error. Elements
    are on the 2**-16 grid.
    """
    chan = scores_channels_vector_torch(amax_k, scale, kv_bits).unsqueeze(-2)
    return ungroup_rows(from_fixed_torch(vec_dequant_torch(acc, chan, amax)), heads)


# ------------------------------------------------- vector unit: channel words on chip
# The scores' channel words computed on chip (VecFunc.CHANNEL): each cached key row's amax
# word (REQUANT's, as it wrote it after the row's codes) times one constant channel word,
# written as a channel word: DEQUANT's factor, normalised the same way.

__all__ += ["vec_channel", "vec_channel_torch", "scores_scale_word",
            "scores_channels_vector", "scores_channels_vector_torch"]


def _channel_word(q, e):
    """The channel word of ``q * 2**-e`` (``q`` below 2**17, ``e <= 127``; arrays or
    tensors): ``q | e << 17``, or for ``e < 0`` (no word holds it) the largest word ``2**17 -
    1`` (``q > 0``) or 0."""
    return ((e >= 0) * (q | (e.clip(0) << DEQUANT_MANT_BITS))
            + ((e < 0) & (q > 0)) * _MANT_MASK)


def vec_channel(amax: np.ndarray, word: int) -> np.ndarray:
    """The channel words of a constant channel ``word`` times each ``amax`` of a row (unsigned
    32-bit words, as REQUANT writes them), as CHANNEL computes them: int64 like ``amax``.

    ``(q, E - k)`` as :func:`vec_dequant_factor` of ``word`` and ``A = amax`` (``A =``
    :data:`DEQUANT_ZERO_AMAX` for 0, as there) before its shift and clip: ``q`` in [2**16,
    2**17) for a normalised word, ``q * 2**(k - E)`` within ``2**-17`` of ``m * A * 2**-E``
    relatively. The result is the word ``q | (E - k) << 17`` (``E - k <= 127`` as ``k >= 0``).
    ``E - k < 0`` (the product at least 2**16, beyond a channel word) gives the largest word
    ``2**17 - 1`` (0 for ``q = 0``): it never happens when ``E >= 32`` (``k <= 32``), as
    :func:`scores_scale_word` ensures. Bound (normalised ``word`` holding ``c0`` within
    ``2**-17``, ``E - k >= 0``): the result's value is within ``(2**-16 + 2**-34) * c0 * A``
    of ``c0 * A``.
    """
    amax = np.asarray(amax, np.int64)
    if (amax < 0).any() or (amax >> 32).any():
        raise ValueError(f"amax must be an unsigned 32-bit word, got {int(amax.min())}.."
                         f"{int(amax.max())}")
    q, e = _factor(np.int64(word), np.where(amax > 0, amax, DEQUANT_ZERO_AMAX))
    return _channel_word(q, e)


def vec_channel_torch(amax: torch.Tensor, word: int) -> torch.Tensor:
    """Torch twin of :func:`vec_channel`."""
    amax = amax.to(torch.int64)
    if (amax < 0).any() or (amax >> 32).any():
        raise ValueError(f"amax must be an unsigned 32-bit word, got {int(amax.min())}.."
                         f"{int(amax.max())}")
    a = torch.where(amax > 0, amax, torch.full_like(amax, DEQUANT_ZERO_AMAX))
    q, e = _factor_torch(torch.full_like(a, word), a)
    return _channel_word(q, e)


def _key_qmax(kv_bits: int) -> int:
    """The divisor of a key row's scale: ``act_scale = amax / 127 * 2**-16`` (INT8) or
    :func:`kv4_scale` ``= amax / (7 * 255) * 2**-16`` (INT4, keys)."""
    if kv_bits not in KV_BITS:
        raise ValueError(f"KV-cache bits must be one of {KV_BITS}, got {kv_bits!r}")
    return ACT_QMAX if kv_bits == 8 else KV4_QMAX * KV4_CODE_MAX


def scores_scale_word(scale: float, kv_bits: int = 8) -> int:
    """The constant of the scores' CHANNEL: the channel word (as :func:`dequant_channels`
    forms it, within ``2**-17`` relatively) of ``c0 = scale * 2**-16 / (127 * kq)``, with
    ``kq`` 127 for the INT8 keys and ``7 * 255`` for the INT4 ones (:func:`_key_qmax`), so
    that ``c0 * amax_k = s_k * scale / 127``, :func:`scores_channels`' value, for a key row's
    integer ``amax_k``. ``ValueError`` names a ``scale`` that is not positive and finite or
    whose word's exponent is below 32 (``scale`` about 2**15 or more for INT8 keys: some
    amax would saturate :func:`vec_channel`) or above 127 (the word would be 0)."""
    c = np.array([float(scale) * 2.0 ** -ACT_FRAC / (ACT_QMAX * _key_qmax(kv_bits))])
    if not (np.isfinite(c[0]) and c[0] > 0):
        raise ValueError(f"scale={scale!r}: the softmax scale must be positive and finite")
    word = int(_channel_words(c, c)[0])
    e = word >> DEQUANT_MANT_BITS
    if word == 0 or e < 32:
        raise ValueError(f"scale={scale!r}: its channel word's exponent {e} is outside "
                         f"[32, {DEQUANT_EXP_MAX}]")
    return word


def scores_channels_vector(amax_k: np.ndarray, scale: float, kv_bits: int = 8) -> np.ndarray:
    """The scores' DEQUANT channel words as CHANNEL computes them on chip: the key rows'
    integer ``amax_k [..., S]`` (what REQUANT writes after a key row's codes, or
    :func:`vec_kv4_rows`' ``a`` of an INT4 row: ``requant_amax`` of the keys either way) ->
    int64 ``[..., S]``, :func:`vec_channel` of them and :func:`scores_scale_word`.

    Against ``c = s_k * scale / 127`` (``s_k = amax_k / kq * 2**-16`` exactly) each word's
    value is within ``(2**-16 + 2**-34) * c`` (:func:`vec_channel`'s bound); the float
    :func:`scores_channels` of the float32 ``s_k`` is within ``(2**-17 + 2**-24) * c``, so
    the two words' values differ by at most ``(3 * 2**-17 + 2**-23) * c``. A zero row (amax
    0) gets the word of ``127 * 2**16 * c0``; its codes, so its scores, are 0.
    """
    return vec_channel(amax_k, scores_scale_word(scale, kv_bits))


def scores_channels_vector_torch(amax_k: torch.Tensor, scale: float,
                                 kv_bits: int = 8) -> torch.Tensor:
    """Torch twin of :func:`scores_channels_vector`."""
    return vec_channel_torch(amax_k, scores_scale_word(scale, kv_bits))


# ------------------------------------------------- vector unit: attention values on chip
# The P.V GEMM's int32 accumulators to the attention's outputs on chip: a DEQUANT whose
# channel words hold the fixed factor 2**-16 / (127 * qmax) (one constant word per output
# element) and whose amax word is FOLD's (fold_amax_word; the DEQUANT's imm says so:
# hw.isa.dequant_imm).

__all__ += ["values_channel", "values_vector"]


def values_channel(qmax: int = ACT_QMAX) -> int:
    """The DEQUANT channel word of the values epilogue: :func:`dequant_channels`' word of
    ``c = 2**-16 / (127 * qmax)`` (``qmax`` the value cache's, 127 or 7), so that ``acc * c *
    amax_w`` is the output in Q15.16 (``amax_w`` FOLD's amax: the 2**-32 of ``p * s_v`` less
    the output's 2**16, the 1 / 127 of the probabilities' codes and the 1 / qmax of the
    values' codes). ``|m * 2**-E - c| <= 2**-17 * c``."""
    c = np.array([2.0 ** -ACT_FRAC / (ACT_QMAX * qmax)])
    return int(_channel_words(c, c)[0])


def values_vector(acc: torch.Tensor, word: torch.Tensor, heads: int,
                  qmax: int = ACT_QMAX) -> torch.Tensor:
    """The values epilogue as the vector unit's DEQUANT computes it: P.V accumulators ``acc
    [B, KV, G*T, d]`` and FOLD's amax words ``word [B, KV, G*T]`` (:func:`fold_values_vector`)
    -> float64 ``[B, H, T, d]`` (exact Q15.16 words), ``from_fixed(vec_dequant(acc,
    values_channel(qmax), m, s))`` with ``(m, s) = fold_amax_fields(word)``.

    Error bound: against the exact ``z = acc * amax_w / (127 * qmax) * 2**-32`` (``amax_w``
    the row's exact amax, :func:`vec_fold`), ``|y - z| <= (2**-16 + 2**-25) * |z| + 2**-17``:
    :func:`vec_dequant`'s ``2**-16 * (1 + 2**-16)`` relative and half a unit, and the amax
    word's flooring of less than ``2**-26`` relative (:func:`fold_amax_word`). The float
    epilogue (:func:`values_epilogue` without ``vector``, the scale ``float32(z / acc)``) is
    within ``2**-23 * |z|`` of ``z``, so the two differ by at most ``(2**-16 + 2**-22) * |z|
    + 2**-17``. An all-zero row (word 0) has zero codes, so zero accumulators and outputs.
    """
    m, s = fold_amax_fields(word.to(torch.int64))
    chan = torch.full((acc.shape[-1],), values_channel(qmax), dtype=torch.int64)
    y = vec_dequant_torch(acc, chan, m, s)
    return ungroup_rows(from_fixed_torch(y), heads)


# ---------------------------------------------------------------------------- INSERT
__all__ += ["insert_offsets", "vec_insert"]


def insert_offsets(base: int, group: int, groups: int, stride: int, skip: int) -> np.ndarray:
    """The bytes of a row an INSERT writes its codes to (:class:`hw.isa.InsertGeometry`):
    code ``j`` of ``group * groups`` to ``base + (j // group) * (group * stride + skip) + (j
    % group) * stride``; int64. With ``stride >= 1`` they increase, and code ``j``'s byte is
    at least ``j``."""
    j = np.arange(group * groups, dtype=np.int64)
    return base + (j // group) * (group * stride + skip) + (j % group) * stride


def vec_insert(a: np.ndarray, b: np.ndarray, base: int, group: int, groups: int,
               stride: int, skip: int) -> np.ndarray:
    """INSERT: the row ``a [L]`` (int32 words, as loaded: here bytes of a cache region) with
    the int8 codes of ``b`` (words, four codes each as REQUANT packs them: code ``j`` in byte
    ``j % 4`` of word ``j // 4``) written to the bytes :func:`insert_offsets` names (words
    little-endian: byte ``k`` of the row is byte ``k % 4`` of word ``k // 4``). A code whose
    byte lies past the row's ``4 L`` is dropped, so only the first ``L`` words of ``b`` are
    read. Returns the row's words as signed int32 values in int64."""
    a = np.asarray(a, np.int64)
    row = (a & 0xFFFFFFFF).astype("<u4").view(np.uint8).copy()
    codes = (np.asarray(b, np.int64) & 0xFFFFFFFF).astype("<u4").view(np.uint8)
    at = insert_offsets(base, group, groups, stride, skip)
    j = np.flatnonzero(at < row.size)
    row[at[j]] = codes[j]
    return row.view("<i4").astype(np.int64)


# ---------------------------------------------------------------------------- INT4 KV on chip
# The INT4 KV append on chip: KV4 quantises a key or value row as vec_kv4_rows does and packs
# its nibbles, group codes and amax into words; INSERT4 scatters nibbles into a loaded row
# (INSERT in half bytes: an INT4 key's field shares its byte with the next position's).
__all__ += ["KV4_NIBBLES_PER_WORD", "kv4_words", "vec_kv4", "vec_insert4"]

#: INT4 codes per 32-bit word as KV4 packs them (code ``i`` in bits ``4 (i % 8)`` of word
#: ``i // 8``).
KV4_NIBBLES_PER_WORD = 8


def kv4_words(q: np.ndarray, codes: np.ndarray | None, amax: int) -> np.ndarray:
    """The words KV4 writes for one row: ``q``'s INT4 values (``[d]`` in [-8, 7]) as nibbles
    (two's complement), eight per word, code ``i`` in bits ``4 (i % 8)`` of word ``i // 8``;
    then, with ``codes`` (``[groups]`` uint8), the codes four per word as REQUANT packs its
    int8 codes (code ``j`` in byte ``j % 4`` of word ``j // 4``); the last word of each part
    zero above its codes; then ``amax`` as an unsigned 32-bit word. Returns the words as
    unsigned 32-bit values in int64."""
    q = np.asarray(q, np.int64)
    nib = np.zeros(-(-q.size // KV4_NIBBLES_PER_WORD) * KV4_NIBBLES_PER_WORD, np.int64)
    nib[:q.size] = q & 0xF
    words = (nib.reshape(-1, KV4_NIBBLES_PER_WORD)
             << (4 * np.arange(KV4_NIBBLES_PER_WORD, dtype=np.int64))).sum(axis=1)
    parts = [words]
    if codes is not None:
        c = np.zeros(-(-np.size(codes) // 4) * 4, np.uint8)
        c[:np.size(codes)] = np.asarray(codes, np.uint8).reshape(-1)
        parts.append(c.view("<u4").astype(np.int64))
    parts.append(np.array([int(amax) & 0xFFFFFFFF], np.int64))
    return np.concatenate(parts)


def vec_kv4(x: np.ndarray, group: int | None) -> np.ndarray:
    """KV4 of a row ``x [d]`` (int32 words, Q15.16): :func:`vec_kv4_rows` of it (keys with
    ``group``, values without) and its words, :func:`kv4_words` of ``q``, the codes and
    ``amax = a << s``, the row's ``max |x|`` (as REQUANT's: what CHANNEL takes for a key row,
    and FOLD's value code of a value row, :func:`value_amax_torch` with ``bits`` 4)."""
    q, c, a, s = vec_kv4_rows(np.asarray(x, np.int64), group)
    return kv4_words(q, c, int(a) << int(s))


def vec_insert4(a: np.ndarray, b: np.ndarray, base: int, group: int, groups: int,
                stride: int, skip: int) -> np.ndarray:
    """INSERT4: :func:`vec_insert` in half bytes. The row ``a [L]`` (int32 words: ``8 L``
    nibbles, nibble ``n`` in bits ``4 (n % 2)`` of byte ``n // 2``, words little-endian) with
    the nibbles of ``b`` (code ``j`` in bits ``4 (j % 8)`` of word ``j // 8``, as KV4 packs
    them; a byte code is two nibbles, low first) written to the nibbles
    :func:`insert_offsets` names (its ``base``, ``stride`` and ``skip`` count nibbles). A
    code past the row's ``8 L`` nibbles is dropped, so only the first ``L`` words of ``b`` are
    read. Returns the row's words as signed int32 values in int64."""
    a = np.asarray(a, np.int64)
    row = (a & 0xFFFFFFFF).astype("<u4").view(np.uint8)
    nib = np.stack([row & 0xF, row >> 4], axis=-1).reshape(-1)
    codes = (np.asarray(b, np.int64) & 0xFFFFFFFF).astype("<u4").view(np.uint8)
    codes = np.stack([codes & 0xF, codes >> 4], axis=-1).reshape(-1)
    at = insert_offsets(base, group, groups, stride, skip)
    j = np.flatnonzero(at < nib.size)
    nib[at[j]] = codes[j]
    pairs = nib.reshape(-1, 2)
    out = (pairs[:, 0] | (pairs[:, 1] << 4)).astype(np.uint8)
    return out.view("<i4").astype(np.int64)
