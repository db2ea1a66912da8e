"""``tiletune.kernels.attention``: autotuned fused attention forward (FlashAttention-style).

``attention(q, k, v, causal=False, scale=None)`` computes
``softmax(scale * q @ k^T [+ causal mask]) @ v`` like
``torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)``,
for ``q`` of shape ``(B, H, Sq, D)`` and ``k``, ``v`` of shape ``(B, Hkv, Sk, D)`` with
``H % Hkv == 0`` (grouped-query attention), bfloat16 or float16, ``D`` in {64, 128}.  The tile
sizes, load latency hint, occupancy and worker warps are tuned per problem
(:data:`ATTENTION_SPACE`; heads of 64 :data:`ATTENTION_SMALL_HEAD_SPACE`, see
:mod:`tiletune.kernels.attention_kernels`).
"""

from __future__ import annotations

from typing import Any

from tiletune.devices.backends.base import Launch
from tiletune.kernels.fastcall import custom_op_route, fast_op
from tiletune.space.spaces import Space
from tiletune.devices.verify import Tolerance, derived_tolerance, eps
from tiletune.kernels._attention_checks import (
    aligned_operand,
    check_cuda_device,
    check_head_dim,
    check_kv_shapes,
    check_qkv_tensors,
    softmax_scale,
)
from tiletune.kernels.decode_attention_kernels import DECODE_MAX_Q
from tiletune.kernels.decode_attention_op import full_lengths, prepare_decode
from tiletune.kernels.library_op import LibraryOp
from tiletune.kernels._membound import Prepared
from tiletune.kernels._keys import ProblemKey, attention_problem_dict, dtype_name
from tiletune.kernels.attention_kernels import (
    ATTENTION_BASELINE,
    ATTENTION_CONSTRAINTS,
    ATTENTION_HEAD_DIMS,
    ATTENTION_FULL_SPACE_PARAMS,
    ATTENTION_LIBRARY_CONSTRAINTS,
    ATTENTION_SMALL_HEAD_CONSTRAINTS,
    ATTENTION_SMALL_HEAD_SPACE_PARAMS,
    ATTENTION_SPACE_PARAMS,
    LOG2E,
    attention_grid,
    attention_kernel,
    attention_reference,
)

__all__ = ["ATTENTION", "ATTENTION_FULL_SPACE", "ATTENTION_SMALL_HEAD_SPACE", "ATTENTION_SPACE", "SMALL_HEAD",
           "attention", "attention_op_for", "attention_plan", "attention_problem", "attention_regime",
           "prepare_attention"]

#: The 330-config space recorded on the H200 (``benchmarks/spaces/h200_attention_*.json.gz``):
#: BLOCK_M x BLOCK_N (score tile <= 128*256) x KV_LATENCY x occupancy x num_worker_warps.
ATTENTION_FULL_SPACE = Space(**ATTENTION_FULL_SPACE_PARAMS, constraints=ATTENTION_CONSTRAINTS,
                             baseline=ATTENTION_BASELINE)
#: The space of heads of 128 (17 configs), shrunk from the full one: no latency hint, BLOCK_N >= 64,
#: occupancy 1 and, for score tiles of at most 64 x 128, occupancy 2, no tile whose registers spill (see
#: ``ATTENTION_SPACE_PARAMS``).
ATTENTION_SPACE = Space(**ATTENTION_SPACE_PARAMS, constraints=ATTENTION_LIBRARY_CONSTRAINTS,
                        baseline=ATTENTION_BASELINE)


def _reference(q: Any, k: Any, v: Any, o: Any, causal: bool, qk_scale_log2: float) -> Any:
    return attention_reference(q, k, v, causal, qk_scale_log2 / LOG2E)


def _tolerance(q: Any, k: Any, v: Any, *_: Any) -> dict:
    """The kernel rounds the probabilities to ``q``'s dtype before ``P @ V`` (half an ulp each), so
    an output is off by up to ``eps/2 * max|v|`` whatever its own size (a short causal row whose
    values cancel): ``atol = 2 eps max|v|`` per element, while the aggregate keeps 1.5 ulp of the
    output's RMS (those errors are random, about 0.4 ulp) and no absolute part; two ulps relative as for any
    once-rounded result, the float32 sums over ``Sk`` keys inside."""
    vmax = float(v.abs().amax()) if v.numel() else 0.0
    out = {}
    for d in ("float16", "bfloat16"):
        t = derived_tolerance(d, length=k.shape[-2], agg_ulps=1.5)
        out[d] = Tolerance(rtol=t.rtol, atol=2.0 * eps(d) * vmax, atol_rms=t.atol_rms, agg=t.agg, agg_atol=0.0)
    return out


def attention_plan(cfg: Any, q: Any, k: Any, v: Any, o: Any, causal: bool, qk_scale_log2: float) -> Launch:
    """Launch plan: ``o = attention(q, k, v)``; ``qk_scale_log2 = scale * log2(e)`` (> 0).

    The plan only passes its arguments through (plus int/bool constants), so the tuned op's hot
    path replays it without calling it.
    """
    return Launch(attention_kernel, attention_grid(cfg, q),
                  (q, k, v, o, qk_scale_log2, q.shape[-1], cfg.BLOCK_M, cfg.BLOCK_N, causal, cfg.KV_LATENCY))


#: The space of heads of at most 64 elements (40 configs): :data:`ATTENTION_SPACE` plus occupancy 2 and 4
#: for score tiles up to 128 x 128 (see ``ATTENTION_SMALL_HEAD_SPACE_PARAMS``).
ATTENTION_SMALL_HEAD_SPACE = Space(**ATTENTION_SMALL_HEAD_SPACE_PARAMS, constraints=ATTENTION_SMALL_HEAD_CONSTRAINTS,
                                   baseline=ATTENTION_BASELINE)
#: The regime of heads of at most 64 elements (:data:`ATTENTION_SMALL_HEAD_SPACE`); other heads are regime None.
SMALL_HEAD = "small_head"


def attention_regime(head_dim: int) -> str | None:
    """The regime of :data:`ATTENTION` for heads of ``head_dim`` elements: :data:`SMALL_HEAD` up to 64, else None."""
    return SMALL_HEAD if head_dim <= 64 else None


def _space_for(regime: str | None) -> Space:
    return ATTENTION_SMALL_HEAD_SPACE if regime == SMALL_HEAD else ATTENTION_SPACE


def attention_problem(args: Any, exact: bool = False) -> dict[str, Any]:
    """The named problem of an attention launch (:func:`attention_plan`'s arguments): batch x query heads
    (the grid's second axis, bucketed to a power of two), the group size (query heads per kv head), the
    query and key lengths (each bucketed to a power of two: the kernel masks ragged tiles), the head
    dimension, the mask and the dtype. Strides do not enter: views of a fused qkv output (token-major) and
    contiguous ``(B, H, S, D)`` tensors run the same kernel code through their strides; the softmax scale
    is a run-time value."""
    q, k = args[0], args[1]
    b, h, sq, d = (int(x) for x in q.shape)
    p = attention_problem_dict(b, h, int(k.shape[1]), sq, int(k.shape[2]), d, bool(args[4]), dtype_name(q.dtype),
                               exact)
    del p["problem"]
    return p


#: The FlashAttention-style kernel as a library op: one plan, a space per head-size regime
#: (:func:`attention_regime`), keys of :func:`attention_problem`.
def _fallback(q: Any, k: Any, v: Any, o: Any, causal: bool, qk_scale_log2: float) -> None:
    """The op in torch (``scaled_dot_product_attention``, top-left causal like the kernel), into ``o``."""
    import torch.nn.functional as F

    o.copy_(F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), scale=qk_scale_log2 / LOG2E,
                                           enable_gqa=k.shape[1] != q.shape[1]))


ATTENTION = LibraryOp("tiletune.attention", _space_for, attention_plan, reference=_reference, writes=["o"],
                      tolerance=_tolerance, fallback=_fallback,
                      buckets=ProblemKey("attention", attention_problem,
                                         {"batch_heads": "pow2", "q_len": "pow2", "kv_len": "pow2"}))


def attention_op_for(head_dim: int) -> Any:
    """The tuned op that runs the FlashAttention-style kernel for heads of ``head_dim`` elements."""
    return ATTENTION.op(attention_regime(head_dim))


#: Whether :func:`attention` sends short queries to the split-KV decode kernels. On since
#: ``tests/test_gpu_decode_attention.py`` passed on the H200; set it False to keep every call on the
#: FlashAttention-style kernel.
ROUTE_SHORT_QUERIES_TO_DECODE = True


def _routes_to_decode(sq: int, sk: int) -> bool:
    """Whether a call with ``sq`` queries and ``sk`` keys runs the split-KV decode kernels."""
    return ROUTE_SHORT_QUERIES_TO_DECODE and sq <= DECODE_MAX_Q and sk > sq


@fast_op(route=custom_op_route("attention"))
def attention(q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None) -> Any:
    """Scaled dot-product attention of ``(B, H, S, D)`` CUDA tensors, autotuned.

    Args:
        q: ``(B, H, Sq, D)`` queries, bfloat16 or float16, ``D`` in {64, 128}.
        k, v: ``(B, Hkv, Sk, D)`` keys and values, same dtype and device; ``H % Hkv == 0``.
        causal: top-left aligned causal mask (query ``i`` attends to keys ``0..i``), like
            ``scaled_dot_product_attention(is_causal=True)``.
        scale: softmax scale, default ``1 / sqrt(D)``; must be a positive finite number.

    Returns:
        A new ``(B, H, Sq, D)`` tensor of ``q``'s dtype.

    With :data:`ROUTE_SHORT_QUERIES_TO_DECODE` set (the default), calls with ``Sq <= 16`` query tokens and more keys
    than queries run the split-KV decode kernel (:func:`tiletune.kernels.decode_attention`), the
    others the FlashAttention-style kernel.
    """
    import torch

    names = ("q", "k", "v")
    check_qkv_tensors("attention", names, q, k, v)
    check_cuda_device("attention", names, q, k, v)
    check_head_dim("attention", q, ATTENTION_HEAD_DIMS)
    check_kv_shapes("attention", names, q, k, v)
    bsz, h, sq, d = q.shape
    sk = k.shape[2]
    if sq < 1 or sk < 1:
        raise ValueError(f"attention: empty sequence (Sq={sq}, Sk={sk})")
    scale = softmax_scale("attention", scale, d)
    if bsz == 0 or h == 0:
        return torch.empty((bsz, h, sq, d), dtype=q.dtype, device=q.device)
    return prepare_attention(q, k, v, causal, scale).run()


def prepare_attention(q: Any, k: Any, v: Any, causal: bool, scale: float, sms: int | None = None) -> Any:
    """What :func:`attention` launches (no checks, no launch): a
    :class:`~tiletune.kernels._membound.Prepared` of :data:`ATTENTION` or, for short queries, the
    :class:`~tiletune.kernels.decode_attention_op.DecodeCall` (``sms``: as for ``prepare_decode``);
    ``run()`` launches it and returns the output. Works on meta tensors (keys without a GPU)."""
    import torch

    bsz, h, sq, d = q.shape
    sk = k.shape[2]
    if _routes_to_decode(sq, sk):
        # few queries, many keys: the split-KV decode kernel. Top-left causal: query i sees keys
        # 0..i, so only the first Sq keys matter, where top-left and bottom-right alignment agree.
        if causal:
            k, v = k[:, :, :sq], v[:, :, :sq]
        lens = full_lengths(bsz, k.shape[2], q.device)
        return prepare_decode(q, k, v, lens, bool(causal), scale, sms=sms)
    q, k, v = aligned_operand(q), aligned_operand(k), aligned_operand(v)
    o = torch.empty((bsz, h, sq, d), dtype=q.dtype, device=q.device)
    return Prepared(ATTENTION, attention_regime(d), (q, k, v, o, bool(causal), scale * LOG2E), o)

