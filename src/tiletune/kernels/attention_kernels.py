"""Fused multi-head attention forward (FlashAttention-style) written in cuTile, plus its tuning space.

``O = softmax(scale * Q @ K^T + mask) @ V`` for ``Q`` of shape ``(B, H, Sq, D)`` and ``K``, ``V`` of
shape ``(B, Hkv, Sk, D)`` with ``H % Hkv == 0`` (grouped-query attention: query head ``h`` reads
key/value head ``h // (H // Hkv)``; ``Hkv == H`` is plain multi-head attention).

* dtypes: bfloat16 or float16 (``Q``, ``K``, ``V`` and ``O`` all the same); head dims 64 and 128
  (``HEAD_DIM`` is a kernel constant and must equal ``D``).
* One block computes a ``BLOCK_M x D`` tile of ``O`` for one (batch, head): grid
  ``(cdiv(Sq, BLOCK_M), B * H)`` (see :func:`attention_grid`).  The ``Q`` tile is loaded once;
  the block walks the keys in ``BLOCK_N`` steps: ``S = Q @ K_j^T`` on the tensor cores (fp32
  accumulator; ``K_j^T`` is loaded directly in transposed order), online softmax in fp32 with
  ``exp2`` (the softmax scale is folded into ``log2(e)`` on the host, so the kernel receives
  ``scale * log2(e)``), ``acc = acc * alpha + P @ V_j`` with ``P`` rounded to the input dtype
  (exactly what FlashAttention does), and one division by the row sums at the end.
* Causal masking (``CAUSAL`` constant; top-left aligned like ``torch.nn.functional.
  scaled_dot_product_attention(is_causal=True)``: query ``i`` sees keys ``j <= i``): key tiles
  that lie entirely above the diagonal are never loaded (the loop stops at the diagonal), and
  the mask is only computed for the tiles that straddle it.  Key tiles that run past ``Sk`` are
  masked the same way, so ``Sq`` and ``Sk`` need not be multiples of the tile sizes; query rows
  past ``Sq`` are computed on zero padding and dropped by the store.
* No row is ever fully masked (key 0 is visible to every query), so the running max is finite
  after the first key tile and there is no ``-inf - -inf``.  Fully masked entries give
  ``exp2(-inf) = 0``.  Requires ``scale > 0`` (the row max is taken before scaling).
* With ``CAUSAL`` the query tiles are visited from the last (most keys) to the first, so the
  heavy blocks of each head start first and the tail of the launch is made of light blocks.

Full tuning space (:data:`ATTENTION_FULL_SPACE_PARAMS`): ``BLOCK_M``, ``BLOCK_N`` (kernel constants),
``KV_LATENCY`` (the ``latency=`` hint on the K and V tile loads; 0 lets the compiler infer it),
and the cuTile hints ``occupancy`` and ``num_worker_warps`` (4: one consumer warpgroup, the
default on sm_90; 8: two consumer warpgroups sharing the ``BLOCK_M`` rows).  The
:func:`fits` constraint bounds the fp32 ``S`` tile (``BLOCK_M * BLOCK_N <= 128 * 256``): 11 tile
shapes x 5 latencies x 3 occupancies x 2 warp counts = 330 configs, all of which compile for sm_90
(``tools/compile_check_all.py``). The library op tunes over :data:`ATTENTION_SPACE_PARAMS`, the
17 configs of it that the H200 recording, the probes and the compiled code say matter.
"""

from __future__ import annotations

import math

import cuda.tile as ct
from tiletune.space.templates import param as _param

__all__ = [
    "ATTENTION_BASELINE",
    "ATTENTION_CONSTRAINTS",
    "ATTENTION_FULL_SPACE_PARAMS",
    "ATTENTION_HEAD_DIMS",
    "ATTENTION_SMALL_HEAD_CONSTRAINTS",
    "ATTENTION_SMALL_HEAD_SPACE_PARAMS",
    "ATTENTION_SPACE_PARAMS",
    "LOG2E",
    "attention_args",
    "attention_grid",
    "attention_hints",
    "attention_kernel",
    "attention_reference",
    "fits",
]

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]

#: ``log2(e)``: ``exp(x) == exp2(x * LOG2E)``; the kernel receives ``scale * LOG2E``.
LOG2E = 1.0 / math.log(2.0)

#: Head dimensions the kernel is built and checked for.
ATTENTION_HEAD_DIMS = (64, 128)

#: Tuning parameters (``occupancy`` and ``num_worker_warps`` are cuTile hints, the rest constants).
ATTENTION_FULL_SPACE_PARAMS = dict(
    BLOCK_M=[64, 128, 256],
    BLOCK_N=[32, 64, 128, 256],
    KV_LATENCY=[0, 1, 2, 4, 8],
    occupancy=[1, 2, 4],
    num_worker_warps=[4, 8],
)

#: The library op's space: the tile shapes (>= 64) and warp counts of the full space, no latency
#: hint, occupancy 1, and occupancy 2 for score tiles of at most 64 x 128 (:func:`in_flight_up_to`), without
#: the tiles whose registers spill (:func:`consumer_registers_fit`; 17 configs). The recording that shrank the full space (causal S=4096) found occupancy 1 within 0.3% of the
#: best there; on shorter sequences (``benchmarks/probe_attention.py`` on GQA rows of S 552 and 1404) the
#: full space's winners ran two blocks per SM with 4 worker warps (64 x 128 and 128 x 64 tiles). Larger
#: tiles at occupancy 2 either compile to their occupancy-1 kernel (the hint not honoured: 168 or 255
#: registers) or spill heavily (``benchmarks/results/cpu/sass_attention_causal_2026-12-07.txt``).
ATTENTION_SPACE_PARAMS = dict(
    BLOCK_M=[64, 128, 256],
    BLOCK_N=[64, 128, 256],
    KV_LATENCY=[0],
    occupancy=[1, 2],
    num_worker_warps=[4, 8],
)

#: A sensible hand-picked config (FlashAttention-2-like tiles); measured first by the tuner.
ATTENTION_BASELINE = dict(BLOCK_M=128, BLOCK_N=64, KV_LATENCY=0, occupancy=1, num_worker_warps=4)


def fits(cfg) -> bool:
    """The fp32 score tile ``S`` (``BLOCK_M x BLOCK_N``) has at most ``128 * 256`` elements."""
    return _param(cfg, "BLOCK_M") * _param(cfg, "BLOCK_N") <= 128 * 256


#: ``Space(**ATTENTION_FULL_SPACE_PARAMS, constraints=ATTENTION_CONSTRAINTS)``.
ATTENTION_CONSTRAINTS = {"fits": fits}

#: Heads of at most 64: the library's tiles and warp counts, and occupancy 2 and 4 for score tiles of at
#: most 128 x 128 (40 configs). On the H200 (``benchmarks/probe_attention.py``, all 330 configs at D=64,
#: ``results/h200/probe_attention.json.gz``) 64 x 64 tiles at occupancy 4 beat every config at occupancy 1.
ATTENTION_SMALL_HEAD_SPACE_PARAMS = dict(ATTENTION_SPACE_PARAMS, occupancy=[1, 2, 4])


def in_flight_up_to(elements: int):
    """Constraint: occupancy above 1 only for score tiles of at most ``elements`` elements."""

    def in_flight(cfg) -> bool:
        return _param(cfg, "occupancy") == 1 or _param(cfg, "BLOCK_M") * _param(cfg, "BLOCK_N") <= elements

    return in_flight


def consumer_registers_fit(head_dim: int, per_thread: int = 192):
    """Constraint: the fp32 output accumulator (``BLOCK_M x head_dim``) and score tile (``BLOCK_M x BLOCK_N``)
    come to at most ``per_thread`` elements per thread of the worker warps. Beyond that the sm_90 kernel
    spills: heads of 128 with 4 worker warps at 128 x 128 and up, and with 8 at 256 x 128 (268-3,996
    spilled loads, ``benchmarks/results/cpu/sass_attention_causal_2026-12-07.txt``)."""

    def consumer_registers(cfg) -> bool:
        return (_param(cfg, "BLOCK_M") * (head_dim + _param(cfg, "BLOCK_N"))
                <= per_thread * 32 * _param(cfg, "num_worker_warps"))

    return consumer_registers


#: ``Space(**ATTENTION_SPACE_PARAMS, constraints=ATTENTION_LIBRARY_CONSTRAINTS)``: heads of 128.
ATTENTION_LIBRARY_CONSTRAINTS = {"fits": fits, "in_flight": in_flight_up_to(64 * 128),
                                 "registers": consumer_registers_fit(128)}
#: ``Space(**ATTENTION_SMALL_HEAD_SPACE_PARAMS, constraints=ATTENTION_SMALL_HEAD_CONSTRAINTS)``.
ATTENTION_SMALL_HEAD_CONSTRAINTS = {"fits": fits, "in_flight": in_flight_up_to(128 * 128)}


@ct.kernel
def attention_kernel(Q, K, V, O, qk_scale_log2,
                     HEAD_DIM: ConstInt,
                     BLOCK_M: ConstInt,
                     BLOCK_N: ConstInt,
                     CAUSAL: ConstBool,
                     KV_LATENCY: ConstInt):
    """One ``BLOCK_M x HEAD_DIM`` tile of the attention output per block.

    Args:
        Q: ``(B, H, Sq, D)`` queries (bfloat16 / float16).
        K, V: ``(B, Hkv, Sk, D)`` keys and values, ``H % Hkv == 0``, same dtype as ``Q``.
        O: ``(B, H, Sq, D)`` output, same dtype; must not alias the inputs.
        qk_scale_log2 (runtime float32): ``softmax scale * log2(e)``, must be > 0.
        HEAD_DIM (constant int): ``D`` (64 or 128).
        BLOCK_M, BLOCK_N (constant ints, powers of two): query rows / keys per tile.
        CAUSAL (constant bool): top-left aligned causal mask (query ``i`` sees keys ``<= i``).
        KV_LATENCY (constant int): ``latency=`` hint for the K and V loads (1-10), 0 for none.

    Grid: ``(cdiv(Sq, BLOCK_M), B * H)``.
    """
    H = Q.shape[1]
    group = H // K.shape[1]
    seq_k = K.shape[2]
    bh = ct.bid(1)
    b = bh // H
    h = bh % H
    hk = h // group
    if CAUSAL:
        bid_m = ct.num_blocks(0) - 1 - ct.bid(0)  # heavy (late) query tiles first
    else:
        bid_m = ct.bid(0)

    q = ct.load(Q, (b, h, bid_m, 0), shape=(1, 1, BLOCK_M, HEAD_DIM),
                padding_mode=ct.PaddingMode.ZERO).reshape((BLOCK_M, HEAD_DIM))

    m_i = ct.full((BLOCK_M, 1), -math.inf, dtype=ct.float32)
    l_i = ct.zeros((BLOCK_M, 1), dtype=ct.float32)
    acc = ct.zeros((BLOCK_M, HEAD_DIM), dtype=ct.float32)

    if CAUSAL:
        # keys past the last query row of this tile are masked for every row: never loaded
        kv_end = min((bid_m + 1) * BLOCK_M, seq_k)
        # first key tile that may hold a masked (above-diagonal or out-of-range) entry
        mask_from = min((bid_m * BLOCK_M) // BLOCK_N, seq_k // BLOCK_N)
    else:
        kv_end = seq_k
        mask_from = seq_k // BLOCK_N
    num_kv = ct.cdiv(kv_end, BLOCK_N)

    offs_m = (bid_m * BLOCK_M + ct.arange(BLOCK_M, dtype=ct.int32)).reshape((BLOCK_M, 1))
    offs_n0 = ct.arange(BLOCK_N, dtype=ct.int32).reshape((1, BLOCK_N))

    for j in range(num_kv):
        # K_j^T: (HEAD_DIM, BLOCK_N), read straight from the (Sk, D) layout in transposed order
        if KV_LATENCY > 0:
            kt = ct.load(K, (b, hk, 0, j), shape=(1, 1, HEAD_DIM, BLOCK_N), order=(0, 1, 3, 2),
                         padding_mode=ct.PaddingMode.ZERO, latency=KV_LATENCY)
        else:
            kt = ct.load(K, (b, hk, 0, j), shape=(1, 1, HEAD_DIM, BLOCK_N), order=(0, 1, 3, 2),
                         padding_mode=ct.PaddingMode.ZERO)
        kt = kt.reshape((HEAD_DIM, BLOCK_N))
        s = ct.mma(q, kt, ct.zeros((BLOCK_M, BLOCK_N), dtype=ct.float32))

        if j >= mask_from:
            offs_n = j * BLOCK_N + offs_n0
            if CAUSAL:
                keep = (offs_n <= offs_m) & (offs_n < seq_k)
            else:
                keep = offs_n < seq_k
            s = ct.where(keep, s, -math.inf)

        # online softmax in base 2; the scale (> 0) is applied after the row max
        m_new = ct.maximum(m_i, ct.max(s, axis=1, keepdims=True) * qk_scale_log2)
        p = ct.exp2(s * qk_scale_log2 - m_new, flush_to_zero=True)
        alpha = ct.exp2(m_i - m_new, flush_to_zero=True)
        l_i = l_i * alpha + ct.sum(p, axis=1, keepdims=True)

        if KV_LATENCY > 0:
            v = ct.load(V, (b, hk, j, 0), shape=(1, 1, BLOCK_N, HEAD_DIM),
                        padding_mode=ct.PaddingMode.ZERO, latency=KV_LATENCY)
        else:
            v = ct.load(V, (b, hk, j, 0), shape=(1, 1, BLOCK_N, HEAD_DIM),
                        padding_mode=ct.PaddingMode.ZERO)
        v = v.reshape((BLOCK_N, HEAD_DIM))
        acc = ct.mma(p.astype(Q.dtype), v, acc * alpha)
        m_i = m_new

    out = acc * (1.0 / l_i)
    ct.store(O, (b, h, bid_m, 0), out.astype(O.dtype).reshape((1, 1, BLOCK_M, HEAD_DIM)))


# --------------------------------------------------------------------------------------------
# host-side helpers
# --------------------------------------------------------------------------------------------


def attention_grid(cfg, q) -> tuple[int, int]:
    """``(cdiv(Sq, BLOCK_M), B * H)`` for ``q`` of shape ``(B, H, Sq, D)``."""
    bm = int(_param(cfg, "BLOCK_M"))
    bsz, h, sq = int(q.shape[0]), int(q.shape[1]), int(q.shape[2])
    return (max(1, -(-sq // bm)), max(1, bsz * h))


def attention_hints(cfg) -> dict:
    """cuTile hints of a config (``occupancy``, ``num_worker_warps`` when present)."""
    hints = {"occupancy": int(_param(cfg, "occupancy", 1))}
    nww = _param(cfg, "num_worker_warps")
    if nww is not None:
        hints["num_worker_warps"] = int(nww)
    return hints


def attention_args(cfg, q, k, v, o, causal: bool, scale: float) -> tuple:
    """Kernel arguments, in order: ``(q, k, v, o, scale * LOG2E, D, BLOCK_M, BLOCK_N, causal, KV_LATENCY)``.

    ``scale`` is the softmax scale (``1 / sqrt(D)`` by default in the public op); it must be > 0.
    """
    return (q, k, v, o, float(scale) * LOG2E, int(q.shape[-1]),
            int(_param(cfg, "BLOCK_M")), int(_param(cfg, "BLOCK_N")), bool(causal),
            int(_param(cfg, "KV_LATENCY", 0)))


def attention_reference(q, k, v, causal: bool = False, scale: float | None = None):
    """Reference attention with torch, math in float32, result in ``q.dtype``.

    Same semantics as ``torch.nn.functional.scaled_dot_product_attention(q, k, v,
    is_causal=causal, scale=scale)`` (with GQA: ``k``/``v`` heads are repeated ``H // Hkv``
    times; causal: the mask is ``ones(Sq, Sk).tril()``), computed by torch's
    ``scaled_dot_product_attention`` on float32 copies, a batch entry and a group of heads at a
    time: a fused kernel on a GPU (no score matrix in memory), so checking a long prefill costs
    milliseconds.
    """
    import torch

    h, hkv = q.shape[1], k.shape[1]
    if h % hkv:
        raise ValueError(f"attention_reference: {h} query heads is not a multiple of {hkv} kv heads")
    scale = (1.0 / math.sqrt(q.shape[-1])) if scale is None else float(scale)
    group = h // hkv
    # heads per call: a backend that does materialise the scores (torch's math one) stays under ~4 GiB
    heads = max(1, min(h, (1 << 30) // max(1, q.shape[2] * k.shape[2])))
    out = torch.empty_like(q)
    for i in range(q.shape[0]):
        for h0 in range(0, h, heads):
            h1 = min(h, h0 + heads)
            kv_heads = torch.arange(h0, h1, device=q.device) // group
            kf = k[i].index_select(0, kv_heads).float().unsqueeze(0)
            vf = v[i].index_select(0, kv_heads).float().unsqueeze(0)
            out[i, h0:h1] = torch.nn.functional.scaled_dot_product_attention(
                q[i:i + 1, h0:h1].float(), kf, vf, is_causal=bool(causal), scale=scale)[0].to(q.dtype)
    return out
