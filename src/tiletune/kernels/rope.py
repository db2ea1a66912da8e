"""Autotuned rotary position embedding (RoPE) in cuTile, applied in place to q and k.

Public op::

    apply_rope_(q, k, cos, sin, layout="bshd")   # rotates q and k in place, returns (q, k)

* ``q``: ``(B, S, Hq, D)`` and ``k``: ``(B, S, Hk, D)`` for ``layout="bshd"`` (the layout a
  ``view(B, S, H, D)`` of a projection output has; the default), or ``(B, Hq, S, D)`` /
  ``(B, Hk, S, D)`` for ``layout="bhsd"`` (Hugging Face's after ``transpose(1, 2)``). Any strides
  with a unit last stride: q and k may be views of one fused qkv tensor. One float dtype for both.
* ``cos``, ``sin``: ``(S, R)`` or ``(B or 1, S, R)`` with ``R`` the rotary dimension (even,
  ``<= D``; ``R < D`` leaves ``q[..., R:]`` alone, "partial rotary"), any float dtype.
* The rotation is the "rotate half" (GPT-NeoX / Llama / Hugging Face) form: with ``x1 = x[..., :R/2]``
  and ``x2 = x[..., R/2:R]``, ``x1' = x1 * cos[..., :R/2] - x2 * sin[..., :R/2]`` and
  ``x2' = x2 * cos[..., R/2:] + x1 * sin[..., R/2:]``, i.e. ``x * cos + rotate_half(x) * sin``
  (float32 math, rounded once to the tensors' dtype). Interleaved (GPT-J) pairs are not supported.

In-place tuning: the tuned op names the four half views as ``inplace`` arguments, so the tuner
restores the caller's q and k before every candidate's checked run and at the end, then launches
the winner once: after the first call q and k hold exactly one rotation, like every later call.

Kernel: the op passes q and k as two half views each, ``(B, S, H, R/2)`` (so any ``R/2``, power of
two or not, is tiled without touching the other half), and cos/sin as ``(Bc, S, R/2)`` halves. A
persistent grid walks ``(batch, TS positions)`` units; each loads both halves of all heads of
those positions, rotates them and stores them back (same block, read before write). Space:
:func:`tiletune.space.templates.rope_space` (positions per tile x occupancy x worker warps).
"""

from __future__ import annotations

from typing import Any

import cuda.tile as ct

from tiletune.devices.backends.base import Launch
from tiletune.kernels._rope_checks import check_rope_shapes
from tiletune.kernels.fastcall import custom_op_route, fast_op
from tiletune.space.spaces import Space
from tiletune.space.templates import next_power_of_2, rope_space
from tiletune.devices.verify import derived_tolerances
from tiletune.kernels.library_op import LibraryOp
from tiletune.kernels._membound import Prepared, check_device, check_float, int64_twin, needs_int64, persistent_grid
from tiletune.kernels._keys import ProblemKey, dtype_name, rope_problem_dict

__all__ = ["ROPE", "apply_rope_", "prepare_rope", "rope_plan", "rope_reference"]

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
ZERO = ct.PaddingMode.ZERO


def _rotate(X1, X2, b, sb, c1, c2, s1, s2, TS, TH, TD, STORE_TMA):
    """Rotate both halves of ``TS`` positions of every head of one tensor, in place."""
    x1 = ct.load(X1, (b, sb, 0, 0), shape=(1, TS, TH, TD), padding_mode=ZERO).astype(ct.float32)
    x2 = ct.load(X2, (b, sb, 0, 0), shape=(1, TS, TH, TD), padding_mode=ZERO).astype(ct.float32)
    ct.store(X1, (b, sb, 0, 0), (x1 * c1 - x2 * s1).astype(X1.dtype), allow_tma=STORE_TMA)
    ct.store(X2, (b, sb, 0, 0), (x2 * c2 + x1 * s2).astype(X2.dtype), allow_tma=STORE_TMA)


def _trig(A, cb, sb, TS, TD):
    return ct.load(A, (cb, sb, 0), shape=(1, TS, TD), padding_mode=ZERO).astype(ct.float32).reshape((1, TS, 1, TD))


def rope_kernel_fn(Q1, Q2, K1, K2, C1, C2, S1, S2, TS: ConstInt, THQ: ConstInt, THK: ConstInt, TD: ConstInt,
                   COS_BATCHED: ConstBool, STORE_TMA: ConstBool):
    """In-place RoPE on ``(B, S, H, R/2)`` half views of q and k with ``(Bc, S, R/2)`` cos/sin halves."""
    B = Q1.shape[0]
    S = Q1.shape[1]
    nsb = ct.cdiv(S, TS)
    for u in range(ct.bid(0), B * nsb, ct.num_blocks(0)):
        b = u // nsb
        sb = u % nsb
        if COS_BATCHED:
            cb = b
        else:
            cb = 0
        c1 = _trig(C1, cb, sb, TS, TD)
        c2 = _trig(C2, cb, sb, TS, TD)
        s1 = _trig(S1, cb, sb, TS, TD)
        s2 = _trig(S2, cb, sb, TS, TD)
        _rotate(Q1, Q2, b, sb, c1, c2, s1, s2, TS, THQ, TD, STORE_TMA)
        _rotate(K1, K2, b, sb, c1, c2, s1, s2, TS, THK, TD, STORE_TMA)


rope_kernel = ct.kernel(rope_kernel_fn)
rope_kernel_i64 = int64_twin(rope_kernel_fn, ["Q1", "Q2", "K1", "K2"])


def rope_reference(q1: Any, q2: Any, k1: Any, k2: Any, c1: Any, c2: Any, s1: Any, s2: Any) -> tuple:
    """Expected contents of the four in-place half views after one rotation (float32 math)."""

    def trig(t: Any) -> Any:  # (Bc, S, R/2) -> (Bc, S, 1, R/2)
        return t.float().unsqueeze(2)

    cc1, cc2, ss1, ss2 = trig(c1), trig(c2), trig(s1), trig(s2)
    out = []
    for x1, x2 in ((q1, q2), (k1, k2)):
        a, b = x1.float(), x2.float()
        out += [(a * cc1 - b * ss1).to(x1.dtype), (b * cc2 + a * ss2).to(x2.dtype)]
    return tuple(out)


def rope_heads_elems(q1: Any) -> int:
    """Padded elements of one half of one position's heads: ``pow2(H) * pow2(R/2)``."""
    return next_power_of_2(q1.shape[2]) * next_power_of_2(q1.shape[3])


def rope_plan(cfg: Any, q1: Any, q2: Any, k1: Any, k2: Any, c1: Any, c2: Any, s1: Any, s2: Any) -> Launch:
    """Launch plan of the in-place rotation (views as described in :func:`rope_kernel_fn`)."""
    b, s, hq, half = q1.shape
    ts = int(cfg.TS)
    grid = persistent_grid(b * -(-s // ts), q1.get_device(), cfg.occupancy)
    kernel = rope_kernel_i64 if needs_int64(q1, q2, k1, k2) else rope_kernel
    return Launch(kernel, grid, (q1, q2, k1, k2, c1, c2, s1, s2, ts, next_power_of_2(hq),
                                 next_power_of_2(k1.shape[2]), next_power_of_2(half), c1.shape[0] > 1,
                                 cfg.STORE_TMA))


def _space_for(regime: Any) -> Space:
    return rope_space(int(regime))


def rope_tolerance(*_: Any) -> dict:
    """``x1 * c - x2 * s``: a difference of two products (contracted to an FMA or not), rounded once:
    two ulps relative and 2 ulps of the output's RMS for the cancellation."""
    return derived_tolerances(atol_ulps=2.0)


def rope_problem(args: Any, exact: bool = False) -> dict[str, Any]:
    """The named problem of a RoPE launch (:func:`rope_plan`'s arguments): the tokens ``B * S`` (bucketed to
    a power of two), not how they split into batch and sequence; the heads of q and k, the rotary
    dimension, the dtypes, and whether cos/sin hold a row per batch entry (a kernel constant). The views'
    strides do not enter: half views of a fused qkv output and of separate q, k are read alike."""
    q1, k1, c1 = args[0], args[2], args[4]
    b, s, hq, half = (int(x) for x in q1.shape)
    p = rope_problem_dict(b * s, hq, int(k1.shape[2]), half, dtype_name(q1.dtype), dtype_name(c1.dtype),
                          int(c1.shape[0]) > 1, exact)
    del p["problem"]
    return p


ROPE = LibraryOp("tiletune.rope", _space_for, rope_plan, reference=rope_reference, tolerance=rope_tolerance,
                 inplace=["q1", "q2", "k1", "k2"], buckets=ProblemKey("rope", rope_problem, {"tokens": "pow2"}),
                 fallback="reference")


def _distinct(q: Any, k: Any, *_: Any) -> bool:
    return q.data_ptr() != k.data_ptr()


@fast_op(route=custom_op_route("apply_rope_"), precheck=_distinct)
def apply_rope_(q: Any, k: Any, cos: Any, sin: Any, layout: str = "bshd") -> tuple[Any, Any]:
    """Rotate ``q`` and ``k`` in place by the rotary embedding ``cos``/``sin``; returns ``(q, k)``.

    See the module docstring for shapes and layouts. The first call with new shapes tunes; the
    caller's ``q`` and ``k`` are rotated exactly once by every call, tuning included.
    """
    op = "apply_rope_"
    check_float(op, "q", q)
    check_float(op, "k", k, like=q)
    check_float(op, "cos", cos)
    check_float(op, "sin", sin)
    check_rope_shapes(op, q, k, cos, sin, layout)
    if q.stride(-1) != 1 or k.stride(-1) != 1:
        raise ValueError(f"{op}(): q and k must have a unit stride in the head dimension (they are updated in place)")
    check_device(op, q=q, k=k, cos=cos, sin=sin)
    if q.numel() and q.data_ptr() == k.data_ptr():
        raise ValueError(f"{op}(): q and k must not be the same memory")
    if q.numel() == 0 or k.numel() == 0:
        return q, k
    return prepare_rope(q, k, cos, sin, layout).run()


def _foldable(t: Any) -> bool:
    """Whether ``(B, S, ...)`` ``t`` is a ``(1, B * S, ...)`` view (batch stride = S x position stride)."""
    b, s = t.shape[0], t.shape[1]
    return b == 1 or s == 1 or t.stride(0) == s * t.stride(1)


def _fold_tokens(q4: Any, k4: Any, c3: Any, s3: Any) -> tuple[Any, Any, Any, Any]:
    """``(B, S, H, D)`` q, k and ``(Bc, S, R)`` cos/sin as one sequence of ``B * S`` tokens where that is a
    view of each (a batch of one; one position per batch entry with cos/sin per entry, as in decoding; views
    of a ``(B, S, ...)`` projection output, fused qkv included), so the kernel walks the tokens as the key
    counts them; otherwise as they are (cos/sin shared by the batch)."""
    b, s = q4.shape[0], q4.shape[1]
    if b == 1 or not (_foldable(q4) and _foldable(k4)):
        return q4, k4, c3, s3
    if c3.shape[0] != b or not (_foldable(c3) and _foldable(s3)):
        return q4, k4, c3, s3  # cos/sin shared by the batch: no per-token view of them
    return (q4.reshape(1, b * s, *q4.shape[2:]), k4.reshape(1, b * s, *k4.shape[2:]),
            c3.reshape(1, b * s, c3.shape[-1]), s3.reshape(1, b * s, s3.shape[-1]))


def prepare_rope(q: Any, k: Any, cos: Any, sin: Any, layout: str = "bshd") -> Prepared:
    """Half views and regime of :func:`apply_rope_` (no checks, no launch); ``result`` is ``(q, k)``."""
    q4, k4 = (q, k) if layout == "bshd" else (q.transpose(1, 2), k.transpose(1, 2))
    r = cos.shape[-1]
    c3 = cos if cos.dim() == 3 else cos.unsqueeze(0)
    s3 = sin if sin.dim() == 3 else sin.unsqueeze(0)
    if c3.stride(-1) != 1:
        c3 = c3.contiguous()
    if s3.stride(-1) != 1:
        s3 = s3.contiguous()
    q4, k4, c3, s3 = _fold_tokens(q4, k4, c3, s3)
    h = r // 2
    args = (q4[..., :h], q4[..., h:r], k4[..., :h], k4[..., h:r],
            c3[..., :h], c3[..., h:], s3[..., :h], s3[..., h:])
    return Prepared(ROPE, rope_heads_elems(args[0]), args, (q, k))
