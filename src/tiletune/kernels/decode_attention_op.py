"""``tiletune.kernels.decode_attention`` and ``kv_cache_append``: attention of a few new tokens over a KV cache.

Public ops::

    kv_cache_append(cache_k, cache_v, k, v, start)          # writes k/v at positions start.. in place
    o = decode_attention(q, cache_k, cache_v, lengths, causal=True, scale=None)

* ``q``: ``(B, H, Sq, D)`` with ``1 <= Sq <= 16`` (the new tokens), ``cache_k`` / ``cache_v``:
  ``(B, Hkv, capacity, D)`` preallocated caches, ``H % Hkv == 0`` (GQA), bfloat16 / float16, ``D`` in
  {64, 128}. Batch entry ``b`` attends to cache positions ``[0, lengths[b])``: ``lengths`` is an int,
  a ``(B,)`` integer tensor on the device (CUDA-graph friendly: update it in place between replays),
  or None (the whole capacity). With ``causal`` the ``Sq`` queries are the *last* ``Sq`` of those
  positions (bottom-right aligned: query ``i`` sees positions ``<= lengths[b] - Sq + i``), the usual
  decode / speculative-decoding convention; ``lengths[b] >= Sq`` is then required (rows without a
  visible key return 0).
* The work: :mod:`tiletune.kernels.decode_attention_kernels` (split-KV partials + a combine kernel,
  two library ops, :data:`DECODE_PARTIAL` and :data:`DECODE_COMBINE`). The number of KV splits is
  chosen on the host from the capacity, the batch and the SM count
  (:func:`~tiletune.kernels.decode_attention_kernels.decode_splits`); the partial kernel's key tile,
  K/V latency hint, occupancy and worker warps are tuned (:data:`DECODE_SPACE`, 24 configs), with the
  cache capacity, the batch and the workspace rows bucketed to powers of two.
* When the batch alone fills the GPU (one split) and the group slices tile the heads
  (:func:`~tiletune.kernels.decode_attention_kernels.decode_direct`), one launch of the direct kernel
  (:data:`DECODE_DIRECT`, same space) writes the output instead: no partials, no combine.

:func:`tiletune.kernels.attention` routes calls with ``Sq <= 16`` and ``Sk > Sq`` here (same result).

``kv_cache_append`` with a ``(B,)`` start tensor is one launch of
:mod:`tiletune.kernels.kv_cache_kernels` (library op :data:`KV_APPEND`) writing both caches.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from tiletune.devices.backends.base import Launch
from tiletune.buckets import Buckets
from tiletune.space.spaces import Space
from tiletune.space.templates import next_power_of_2
from tiletune.devices.verify import Tolerance, derived_tolerance, derived_tolerances, eps
from tiletune.kernels._attention_checks import (
    aligned_operand,
    check_append,
    check_cuda_device,
    check_head_dim,
    check_kv_shapes,
    check_lengths,
    check_qkv_tensors,
    softmax_scale,
)
from tiletune.kernels.fastcall import constant_tensor, custom_op_route, fast_op
from tiletune.kernels._membound import Prepared, int64_twin, needs_int64, sm_count
from tiletune.kernels.kv_cache_kernels import KV_APPEND_CHUNK, kv_append_kernel, kv_append_kernel_fn
from tiletune.kernels.library_op import LibraryOp
from tiletune.kernels._keys import KV_LEN_GRID, ProblemKey, dtype_name, rounded
from tiletune.kernels.decode_attention_kernels import (
    DECODE_BASELINE,
    DECODE_HEAD_DIMS,
    DECODE_MAX_Q,
    DECODE_SPACE_PARAMS,
    GRANULE,
    LOG2E,
    decode_combine_kernel,
    decode_combine_kernel_fn,
    decode_direct,
    decode_direct_grouped_kernel,
    decode_direct_grouped_kernel_fn,
    decode_direct_kernel,
    decode_direct_kernel_fn,
    decode_partial_kernel,
    decode_partial_kernel_fn,
    decode_rows,
    decode_splits,
)

__all__ = [
    "DECODE_COMBINE",
    "DECODE_COMBINE_SPACE",
    "DECODE_DIRECT",
    "DIRECT_ANY_GROUP",
    "DECODE_PARTIAL",
    "DECODE_SPACE",
    "KV_APPEND",
    "KV_APPEND_SPACE",
    "decode_attention",
    "decode_combine_plan",
    "decode_combine_reference",
    "decode_direct_plan",
    "decode_direct_reference",
    "split_direct_reference",
    "decode_partial_plan",
    "decode_partial_reference",
    "kv_append_plan",
    "kv_append_reference",
    "kv_cache_append",
    "prepare_decode",
    "prepare_kv_cache_append",
]

#: The partial kernel's space: BLOCK_N x KV_LATENCY x occupancy x num_worker_warps (24 configs).
DECODE_SPACE = Space(**DECODE_SPACE_PARAMS, baseline=DECODE_BASELINE)
#: The combine kernel has nothing worth tuning (one config; tuning checks it once).
DECODE_COMBINE_SPACE = Space(occupancy=[1], num_worker_warps=[4])

decode_partial_kernel_i64 = int64_twin(decode_partial_kernel_fn, ["Q", "K", "V", "PO", "PL"])
decode_combine_kernel_i64 = int64_twin(decode_combine_kernel_fn, ["PO", "PL", "O"])
decode_direct_kernel_i64 = int64_twin(decode_direct_kernel_fn, ["Q", "K", "V", "O"])
decode_direct_grouped_kernel_i64 = int64_twin(decode_direct_grouped_kernel_fn, ["Q", "K", "V", "O5"])

#: Whether a one-split call whose group slices do not tile the heads (``G % GB != 0``: Qwen2.5's 7 query
#: heads per kv head) takes the grouped direct kernel instead of the partial and combine kernels (on since
#: ``tests/test_gpu_decode_attention.py::test_grouped_direct_kernel_serves_any_group`` passed on the H200).
DIRECT_ANY_GROUP = True

_NEG_INF = float("-inf")


# --------------------------------------------------------------------------------------------
# launch plans
# --------------------------------------------------------------------------------------------


def decode_partial_plan(cfg: Any, q5: Any, k: Any, v: Any, lens: Any, po: Any, pl: Any, causal: bool,
                        qk_scale_log2: float) -> Launch:
    """Launch plan of the partial kernel: grid ``(B * Hkv * NGB, NS)``, ``NS = po.shape[0] / (B * Hkv)``."""
    bsz, hkv, g, sq, d = q5.shape
    gb, qp, ngb = decode_rows(g, sq)
    ns = po.shape[0] // max(1, bsz * hkv)
    kernel = decode_partial_kernel_i64 if needs_int64(q5, k, v, po) else decode_partial_kernel
    return Launch(kernel, (bsz * hkv * ngb, ns),
                  (q5, k, v, lens, po, pl, qk_scale_log2, d, gb, qp, cfg.BLOCK_N, causal, cfg.KV_LATENCY))


def decode_direct_plan(cfg: Any, q5: Any, k: Any, v: Any, lens: Any, o: Any, causal: bool,
                       qk_scale_log2: float) -> Launch:
    """Launch plan of a direct kernel (one split): grid ``(B * Hkv * NGB,)``. ``o`` is the ``(B, H, Sq, D)``
    output (:func:`~.decode_attention_kernels.decode_direct_kernel_fn`, ``G % GB == 0``) or its
    ``(B, Hkv, G, Sq, D)`` view (the grouped kernel, any ``G``). The kernel arguments are the partial
    kernel's with ``o`` for the partials."""
    bsz, hkv, g, sq, d = q5.shape
    gb, qp, ngb = decode_rows(g, sq)
    if o.dim() == 5:
        wide, narrow = decode_direct_grouped_kernel_i64, decode_direct_grouped_kernel
    elif g % gb:
        raise ValueError(f"decode_direct_plan: G={g} query heads per kv head are not a multiple of the "
                         f"{gb} heads of a block (Sq={sq}): pass the (B, Hkv, G, Sq, D) view of the output "
                         "(the grouped kernel) or take the split path")
    else:
        wide, narrow = decode_direct_kernel_i64, decode_direct_kernel
    kernel = wide if needs_int64(q5, k, v, o) else narrow
    return Launch(kernel, (bsz * hkv * ngb,),
                  (q5, k, v, lens, o, qk_scale_log2, d, gb, qp, cfg.BLOCK_N, causal, cfg.KV_LATENCY))


def decode_combine_plan(cfg: Any, po: Any, pl: Any, o: Any) -> Launch:
    """Launch plan of the combine kernel: grid ``(B * H,)``."""
    bsz, h, sq, d = o.shape
    _, qp, _ = decode_rows(po.shape[1], sq)
    kernel = decode_combine_kernel_i64 if needs_int64(po, o) else decode_combine_kernel
    return Launch(kernel, (bsz * h,), (po, pl, o, qp, d))


# --------------------------------------------------------------------------------------------
# references (torch, float32 math; any device)
# --------------------------------------------------------------------------------------------


#: float32 bytes of keys and values one step of the references converts at most: a long cache is checked in
#: slices of its sequences, so a check allocates (and maps) a few hundred MB, not several copies of the cache
REFERENCE_CHUNK_BYTES = 256 << 20


def _member_slices(members: list[int], per_member_bytes: int) -> list[list[int]]:
    """``members`` (increasing batch rows) in runs of consecutive rows of at most
    :data:`REFERENCE_CHUNK_BYTES` (at least one row each)."""
    most = max(1, REFERENCE_CHUNK_BYTES // max(1, per_member_bytes))
    runs: list[list[int]] = []
    for b in members:
        if runs and len(runs[-1]) < most and runs[-1][-1] == b - 1:
            runs[-1].append(b)
        else:
            runs.append([b])
    return runs


def _split_attention(q5: Any, k: Any, v: Any, lens: Any, ns: int, causal: bool,
                     qk_scale_log2: float) -> tuple[Any, Any]:
    """``(o, lse)`` of every split, float32 on ``q5``'s device: ``(B * Hkv * ns, G, Sq, D)`` and
    ``(B * Hkv * ns, G, Sq)`` (the partial kernel's layout). Sequences of one length share the arithmetic,
    in runs of consecutive batch rows of bounded size (:data:`REFERENCE_CHUNK_BYTES`), each read as a view
    of the caches."""
    import torch

    bsz, hkv, g, sq, d = q5.shape
    cap = k.shape[2]
    rows = g * sq
    out_o = torch.zeros((bsz * hkv * ns, g, sq, d), dtype=torch.float32, device=q5.device)
    out_l = torch.full((bsz * hkv * ns, g, sq), _NEG_INF, dtype=torch.float32, device=q5.device)
    lens_l = [min(max(int(x), 1), cap) for x in lens.reshape(-1).tolist()]
    qi = torch.arange(rows, device=q5.device) % sq
    groups: dict[int, list[int]] = {}
    for b, n in enumerate(lens_l):
        groups.setdefault(n, []).append(b)
    for n, members in groups.items():
        per = -(-(-(-n // GRANULE)) // ns) * GRANULE
        width = ns * per
        j = torch.arange(n, device=q5.device)
        for run in _member_slices(members, 2 * hkv * width * d * 4):
            b0, nb = run[0], len(run)
            qf = q5[b0:b0 + nb].float().reshape(nb, hkv, rows, d)
            kf = k[b0:b0 + nb, :, :n].float()
            s = (qf @ kf.transpose(-1, -2)) * float(qk_scale_log2)  # (nb, Hkv, rows, n), base-2 units
            del kf
            if causal:
                s = s.masked_fill(~(j[None, :] <= (n - sq + qi)[:, None]), _NEG_INF)
            s = torch.nn.functional.pad(s, (0, width - n), value=_NEG_INF).reshape(nb, hkv, rows, ns, per)
            vp = torch.zeros((nb, hkv, width, d), dtype=torch.float32, device=q5.device)
            vp[:, :, :n] = v[b0:b0 + nb, :, :n]
            vp = vp.reshape(nb, hkv, ns, per, d)
            m = s.amax(dim=-1)  # (nb, Hkv, rows, ns)
            m_use = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
            p = torch.exp2(s - m_use[..., None])
            lsum = p.sum(dim=-1)
            o = torch.einsum("bhrsp,bhspd->bhrsd", p, vp)
            del p, vp
            seen = lsum > 0
            o = o / torch.where(seen, lsum, torch.ones_like(lsum))[..., None]
            lse = torch.where(seen, m + torch.log2(torch.where(seen, lsum, torch.ones_like(lsum))),
                              torch.full_like(m, _NEG_INF))
            lo, hi = b0 * hkv * ns, (b0 + nb) * hkv * ns  # the run's rows: consecutive sequences
            out_o[lo:hi] = o.permute(0, 1, 3, 2, 4).reshape(nb * hkv * ns, g, sq, d)
            out_l[lo:hi] = lse.permute(0, 1, 3, 2).reshape(nb * hkv * ns, g, sq)
    return out_o, out_l


def decode_partial_reference(q5: Any, k: Any, v: Any, lens: Any, po: Any, pl: Any, causal: bool,
                             qk_scale_log2: float) -> tuple[Any, Any]:
    """Expected ``(po, pl)``: per split (boundaries of :func:`~.decode_attention_kernels.split_bounds`),
    the softmax-normalized partial output and the base-2 log-sum-exp of the scaled scores (``-inf`` and
    0 for a split, or a row, with no visible key)."""
    bsz, hkv = q5.shape[:2]
    out_o, out_l = _split_attention(q5, k, v, lens, po.shape[0] // max(1, bsz * hkv), causal, qk_scale_log2)
    return out_o.to(po.device), out_l.to(pl.device)


def decode_combine_reference(po: Any, pl: Any, o: Any) -> Any:
    """Expected ``o``: the partials combined by their log-sum-exps (float32), in ``o``'s dtype."""
    import torch

    bsz, h, sq, d = o.shape
    g = po.shape[1]
    hkv = h // g
    ns = po.shape[0] // max(1, bsz * hkv)
    lse = pl.float().reshape(bsz, hkv, ns, g, sq)
    m = lse.amax(dim=2, keepdim=True)
    m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w = torch.exp2(lse - m)  # (B, Hkv, NS, G, Sq)
    lsum = w.sum(dim=2)
    acc = (po.float().reshape(bsz, hkv, ns, g, sq, d) * w[..., None]).sum(dim=2)
    out = acc / torch.where(lsum > 0, lsum, torch.ones_like(lsum))[..., None]
    return out.reshape(bsz, h, sq, d).to(o.dtype)


def split_direct_reference(q5: Any, k: Any, v: Any, lens: Any, o: Any, causal: bool, qk_scale_log2: float) -> Any:
    """:func:`decode_direct_reference` computed as the one-split partial of
    :func:`decode_partial_reference` (float32 softmax over all the visible keys; 0 for a row with none),
    which is also what :func:`decode_combine_reference` makes of one split; shaped as ``o`` (the output or
    its grouped view)."""
    out, _ = _split_attention(q5, k, v, lens, 1, causal, qk_scale_log2)
    return out.reshape(o.shape).to(device=o.device, dtype=o.dtype)


def decode_direct_reference(q5: Any, k: Any, v: Any, lens: Any, o: Any, causal: bool, qk_scale_log2: float) -> Any:
    """Expected ``o``: the attention output in ``o``'s dtype (float32 softmax over the visible keys, 0 for a row
    with none; what :func:`split_direct_reference` computes as one split), through torch's
    ``scaled_dot_product_attention`` in float32, a fused kernel on a GPU: each
    run of consecutive sequences (at most :data:`REFERENCE_CHUNK_BYTES` of float32 keys and values) is one
    fused call over its longest length, the group's query heads as rows of their key/value head, with a
    boolean mask of the visible keys (``j < lengths[b]``; causal: ``j <= lengths[b] - Sq + i``). Rows
    without a visible key are 0."""
    import torch

    bsz, hkv, g, sq, d = q5.shape
    cap = k.shape[2]
    rows = g * sq
    scale = float(qk_scale_log2) / LOG2E
    lens_l = [min(max(int(x), 1), cap) for x in lens.reshape(-1).tolist()]
    out = torch.empty((bsz, hkv, rows, d), dtype=torch.float32, device=q5.device)
    qi = torch.arange(rows, device=q5.device) % sq
    for run in _member_slices(list(range(bsz)), 2 * hkv * max(lens_l, default=1) * d * 4):
        b0, nb = run[0], len(run)
        n = max(lens_l[b0:b0 + nb])
        n_b = torch.tensor(lens_l[b0:b0 + nb], device=q5.device).view(nb, 1, 1, 1)
        j = torch.arange(n, device=q5.device).view(1, 1, 1, n)
        keep = j < n_b
        if causal:
            keep = keep & (j <= n_b - sq + qi.view(1, 1, rows, 1))
        # an additive float mask whose rows start 16-element aligned (a view of a padded buffer), as the fused
        # kernels want it (a boolean or unaligned mask is converted or padded by torch on every call)
        bias = torch.zeros((nb, 1, rows, -(-n // 16) * 16), dtype=torch.float32, device=q5.device)[..., :n]
        bias.masked_fill_(~keep, _NEG_INF)
        qf = q5[b0:b0 + nb].float().reshape(nb, hkv, rows, d)
        o_run = torch.nn.functional.scaled_dot_product_attention(
            qf, k[b0:b0 + nb, :, :n].float(), v[b0:b0 + nb, :, :n].float(), attn_mask=bias, scale=scale)
        out[b0:b0 + nb] = torch.where(keep.any(dim=-1, keepdim=True), o_run, 0.0)
    return out.reshape(o.shape).to(device=o.device, dtype=o.dtype)


def _output_tolerance(dt: str, k: Any, v: Any) -> Tolerance:
    """Bound of an attention output computed in float32 from ``P`` rounded to ``dt`` before ``P @ V``:
    as :func:`tiletune.kernels.attention_op`'s (``atol = 2 eps max|v|``, 1.5 ulps aggregate, float32
    sums over ``capacity`` keys)."""
    vmax = float(v.abs().amax()) if v.numel() else 0.0
    t = derived_tolerance(dt, length=k.shape[-2], agg_ulps=1.5)
    return Tolerance(rtol=t.rtol, atol=2.0 * eps(dt) * vmax, atol_rms=t.atol_rms, agg=t.agg, agg_atol=0.0)


def _partial_tolerance(q5: Any, k: Any, v: Any, *_: Any) -> dict:
    """Partial outputs (float32, but made of ``q``'s dtype: ``P`` is rounded to it before ``P @ V``): the
    attention op's bound with ``q``'s epsilon (``atol = 2 eps max|v|``). Log-sum-exps: float32 math
    over up to ``capacity`` terms, plus ``2^-12`` absolute (a split's weight off by under 0.02%, a
    quarter of a float16 ulp)."""
    o_tol = _output_tolerance(str(q5.dtype).replace("torch.", ""), k, v)
    lt = derived_tolerance("float32", length=k.shape[-2], compute_ulps=64.0)
    l_tol = Tolerance(rtol=lt.rtol, atol=2.0 ** -12, atol_rms=lt.atol_rms, agg=lt.agg, agg_atol=2.0 ** -14)
    return {"output:0": {"float32": o_tol}, "output:1": {"float32": l_tol}}


def _combine_tolerance(*_: Any) -> dict:
    """A weighted mean of float32 partials with approximate ``exp2`` weights, rounded once (mixed signs:
    2 ulps of the output's RMS)."""
    return derived_tolerances(atol_ulps=2.0, compute_ulps=64.0)


def _direct_tolerance(q5: Any, k: Any, v: Any, lens: Any, o: Any, *_: Any) -> dict:
    """The direct kernel's output, ``q``'s dtype: the same float32 loop as a partial, normalized and
    rounded once to the output dtype, i.e. attention's bound in that dtype (:func:`_output_tolerance`):
    rounding of ``P`` to the input dtype before ``P @ V`` errs by up to ``eps/2`` of each
    probability, so up to ``eps/2 * max|v|`` absolute whatever the output's size (``atol = 2 eps
    max|v|``); the final rounding and the reference's own are within ``rtol`` (2 ulps, plus the float32
    accumulation over ``capacity`` keys); the aggregate keeps 1.5 ulps of the output's RMS. The
    combine's bound (2 ulps of the RMS, no ``max|v|`` term) would be too tight: it compares the combine
    with the combine of the kernel's own partials, whose ``P`` rounding is already inside, while this
    reference is the float32 softmax itself."""
    dt = str(o.dtype).replace("torch.", "")
    return {dt: _output_tolerance(dt, k, v)}


def _rows_bucketed(**dims: int) -> Buckets:
    return Buckets({name: {dim: "pow2"} for name, dim in dims.items()})


def decode_problem(args: Any, exact: bool = False) -> dict[str, Any]:
    """The named problem of a partial or direct decode launch (``q5, k, v, lens, ...``, the plans'
    arguments): the batch (bucketed to a power of two), kv heads, group size (query heads per kv head),
    query tokens, head dimension, the cache length bucketed on the coarse grid :data:`~._keys.KV_LEN_GRID`
    (the attended lengths are on the device; the capacity bounds them), the mask and the dtype. Not the
    caches' strides or their exact capacity, and no second batch size: the caches' batch is the queries'."""
    q5, k = args[0], args[1]
    b, hkv, g, sq, d = (int(x) for x in q5.shape)
    return {"batch": rounded(b, exact=exact), "kv_heads": hkv, "group": g, "q_len": sq, "head_dim": d,
            "kv_len": rounded(int(k.shape[2]), KV_LEN_GRID, exact), "causal": bool(args[-2]),
            "dtype": dtype_name(q5.dtype)}


#: The key of the partial and direct kernels (:func:`decode_problem`).
DECODE_KEY = ProblemKey("decode_attention", decode_problem, {"batch": "pow2", "kv_len": list(KV_LEN_GRID)})

#: The partial kernel's library op (:data:`DECODE_SPACE`, one regime: ``DECODE_PARTIAL.op(None)``; writes
#: ``po`` and ``pl``).
DECODE_PARTIAL = LibraryOp(
    "tiletune.decode_attention", lambda regime: DECODE_SPACE, decode_partial_plan, reference=decode_partial_reference,
    writes=["po", "pl"], tolerance=_partial_tolerance, buckets=DECODE_KEY, fallback="reference",
)

#: The direct kernels' library op (one split; ``G % GB == 0`` with the output, any ``G`` with its grouped
#: view; :data:`DECODE_SPACE`, one regime: writes ``o`` whole, so a one-launch call is replayed by
#: :func:`tiletune.kernels.fastcall.fast_op`).
DECODE_DIRECT = LibraryOp(
    "tiletune.decode_attention_direct", lambda regime: DECODE_SPACE, decode_direct_plan,
    reference=decode_direct_reference, writes=["o"], tolerance=_direct_tolerance, buckets=DECODE_KEY,
    fallback="reference",
)

#: The combine kernel's library op (:data:`DECODE_COMBINE_SPACE`, one regime; writes ``o``). One config:
#: a new key launches it without a tuning session (``tune_single=False``: no measurement to make, and
#: the first decode call of a shape skips a session); ``tests/test_gpu_decode_attention.py`` checks it.
DECODE_COMBINE = LibraryOp(
    "tiletune.decode_combine", lambda regime: DECODE_COMBINE_SPACE, decode_combine_plan,
    reference=decode_combine_reference, writes=["o"], tolerance=_combine_tolerance,
    buckets=_rows_bucketed(po=0, pl=0, o=0), tune_single=False, fallback="reference",
)


# --------------------------------------------------------------------------------------------
# public ops
# --------------------------------------------------------------------------------------------


_CACHE_NAMES = ("q", "cache_k", "cache_v")


def _check_qkv(op: str, q: Any, k: Any, v: Any) -> None:
    """The tensor checks of ``op`` (the shared ones of :mod:`._attention_checks`, the query count and
    the capacity), in the order the messages have always come; the device is checked later."""
    check_qkv_tensors(f"{op}()", _CACHE_NAMES, q, k, v)
    check_head_dim(f"{op}()", q, DECODE_HEAD_DIMS)
    sq = q.shape[2]
    if not 1 <= sq <= DECODE_MAX_Q:
        raise ValueError(f"{op}(): takes 1 to {DECODE_MAX_Q} query tokens, got {sq} (use attention() for more)")
    check_kv_shapes(f"{op}()", _CACHE_NAMES, q, k, v)
    if k.shape[2] < 1:
        raise ValueError(f"{op}(): the caches hold no position (capacity 0)")


#: ``(B,)`` int32 lengths of calls given as one int (or none), by (B, length, device): constant kernel
#: arguments, so that such a call (a decode step over a cache passed whole) replays as a recipe of
#: :mod:`tiletune.kernels.fastcall` instead of running the op's Python every time. Never freed (a CUDA
#: graph captured after a warm-up call holds its address); past :data:`_LENS_MAX` entries a call gets a
#: new tensor, as before.
_LENS: dict[tuple[int, int, Any], Any] = {}
_LENS_MAX = 4096
_lens_lock = threading.Lock()


def full_lengths(bsz: int, sk: int, device: Any) -> Any:
    """A ``(bsz,)`` int32 tensor of ``sk`` on ``device``, shared by the calls of one (B, Sk) (never written)."""
    import torch

    key = (bsz, sk, device)
    t = _LENS.get(key)
    if t is not None:
        return t
    t = torch.full((bsz,), sk, dtype=torch.int32, device=device)
    # only real device tensors (not fake or meta ones of a trace), and never one from a graph's memory pool
    if type(t) is not torch.Tensor or t.device.type != "cuda" or torch.cuda.is_current_stream_capturing():
        return t
    with _lens_lock:
        if len(_LENS) >= _LENS_MAX:
            return t
        t = _LENS.setdefault(key, t)
    return constant_tensor(t)


def _lengths_tensor(op: str, lengths: Any, bsz: int, cap: int, sq: int, causal: bool, device: Any) -> Any:
    """``lengths`` as a ``(B,)`` int32 tensor on ``device`` (ints are checked against the capacity:
    :func:`._attention_checks.check_lengths`)."""
    import torch

    if lengths is None:
        lengths = cap
    check_lengths(f"{op}()", lengths, bsz, cap, sq, causal, device)
    if isinstance(lengths, int):
        return full_lengths(bsz, lengths, device)
    if lengths.dtype != torch.int32 or not lengths.is_contiguous():
        lengths = lengths.to(torch.int32).contiguous()
    return lengths


class DecodeCall:
    """One decode-attention call ready to launch.

    Split path (``direct_args`` None): ``DECODE_PARTIAL(*partial_args)``, then
    ``DECODE_COMBINE(*combine_args)``. Direct path (``splits == 1``, whole group slices):
    ``DECODE_DIRECT(*direct_args)`` alone, ``partial_args`` and ``combine_args`` None (no workspace).
    ``splits``: the KV splits of the call (1 on the direct path); ``out``: the ``(B, H, Sq, D)`` output.
    """

    __slots__ = ("partial_args", "combine_args", "direct_args", "out", "splits")

    def __init__(self, partial_args: tuple | None, combine_args: tuple | None, out: Any, splits: int,
                 direct_args: tuple | None = None) -> None:
        self.partial_args = partial_args
        self.combine_args = combine_args
        self.direct_args = direct_args
        self.out = out
        self.splits = splits

    @property
    def direct(self) -> bool:
        """Whether the call is one launch of the direct kernel."""
        return self.direct_args is not None

    def run(self) -> Any:
        if self.direct_args is not None:
            DECODE_DIRECT.op(None)(*self.direct_args)
        else:
            DECODE_PARTIAL.op(None)(*self.partial_args)
            DECODE_COMBINE.op(None)(*self.combine_args)
        return self.out


def prepare_decode(q: Any, k: Any, v: Any, lens: Any, causal: bool, scale: float,
                   sms: int | None = None, allow_direct: bool = True) -> DecodeCall:
    """Views, workspace and output of one call (no checks, no launch); ``lens`` a ``(B,)`` int32 tensor.

    ``sms``: the SM count used to choose the splits (default: the device's). The call takes a direct
    kernel when :func:`~.decode_attention_kernels.decode_direct` allows it (one split, and ``G % GB == 0``
    or :data:`DIRECT_ANY_GROUP`; the grouped kernel then gets the ``(B, Hkv, G, Sq, D)`` view of the
    output) and ``allow_direct`` (False: the split path whatever the splits, for tests and comparisons)."""
    import torch

    bsz, h, sq, d = q.shape
    hkv, cap = k.shape[1], k.shape[2]
    g = h // hkv
    q = aligned_operand(q)
    k, v = aligned_operand(k), aligned_operand(v)
    q5 = q.unflatten(1, (hkv, g))  # (B, Hkv, G, Sq, D), a view whatever q's strides
    gb, _, ngb = decode_rows(g, sq)
    if sms is None:
        sms = sm_count(q.get_device()) if q.is_cuda else 132
    ns = decode_splits(bsz * hkv * ngb, cap, sms)
    causal, qk_scale_log2 = bool(causal), float(scale) * LOG2E
    o = torch.empty((bsz, h, sq, d), dtype=q.dtype, device=q.device)
    if allow_direct and decode_direct(g, sq, ns, DIRECT_ANY_GROUP):
        o_arg = o.unflatten(1, (hkv, g)) if g % gb else o  # the grouped kernel's view, same memory
        return DecodeCall(None, None, o, ns, direct_args=(q5, k, v, lens, o_arg, causal, qk_scale_log2))
    rows = bsz * hkv * ns
    po = torch.empty((rows, g, sq, d), dtype=torch.float32, device=q.device)
    pl = torch.empty((rows, g, sq), dtype=torch.float32, device=q.device)
    return DecodeCall((q5, k, v, lens, po, pl, causal, qk_scale_log2), (po, pl, o), o, ns)


@fast_op(route=custom_op_route("decode_attention"))
def decode_attention(q: Any, cache_k: Any, cache_v: Any, lengths: Any = None, causal: bool = True,
                     scale: float | None = None) -> Any:
    """Attention of ``Sq <= 16`` new query tokens over the first ``lengths`` positions of a KV cache.

    Args:
        q: ``(B, H, Sq, D)`` queries, bfloat16 or float16, ``D`` in {64, 128}, ``1 <= Sq <= 16``.
        cache_k, cache_v: ``(B, Hkv, capacity, D)`` caches (same dtype and device), ``H % Hkv == 0``.
        lengths: positions attended per batch entry: an int, a ``(B,)`` int32/int64 tensor on the
            caches' device (not checked against the capacity: values are clamped to ``[1, capacity]``),
            or None for the whole capacity.
        causal: query ``i`` sees positions ``<= lengths[b] - Sq + i`` (the queries are the last ``Sq``
            positions); without it every query sees all ``lengths[b]`` positions.
        scale: softmax scale, default ``1 / sqrt(D)``; a positive finite number.

    Returns:
        A new ``(B, H, Sq, D)`` tensor of ``q``'s dtype. No host synchronization: capturable in a CUDA
        graph once tuned (pass ``lengths`` as a tensor and update it in place between replays).

    Calls after the first ones with a signature replay the launches (:func:`tiletune.kernels.fastcall.fast_op`):
    two on the split path (the split partials are a temporary of the recipe), one when the batch
    needs no split (the direct kernel writes the output), when ``lengths`` is an int32 tensor and the
    operands need no copy; otherwise every call takes the checks again. Under ``torch.compile`` the
    call is one node of the graph, the custom op ``tiletune::decode_attention``
    (:mod:`tiletune.kernels.torch_ops`).
    """
    op = "decode_attention"
    _check_qkv(op, q, cache_k, cache_v)
    scale = softmax_scale(f"{op}()", scale, q.shape[-1])
    check_cuda_device(f"{op}()", _CACHE_NAMES, q, cache_k, cache_v)
    bsz, h, sq, _ = q.shape
    lens = _lengths_tensor(op, lengths, bsz, cache_k.shape[2], sq, bool(causal), q.device)
    if bsz == 0 or h == 0:
        return q.new_empty(q.shape)
    return prepare_decode(q, cache_k, cache_v, lens, bool(causal), scale).run()


def kv_cache_append(cache_k: Any, cache_v: Any, k: Any, v: Any, start: Any) -> tuple[Any, Any]:
    """Write ``k``/``v`` (``(B, Hkv, T, D)``) into the caches (``(B, Hkv, capacity, D)``) in place.

    ``start``: the first position written, an int (every batch entry) or a ``(B,)`` int32/int64 tensor
    on the caches' device (per batch entry). Returns ``(cache_k, cache_v)``.

    * An int: the positions ``[start, start + T)`` must fit the capacity (``ValueError`` otherwise);
      two copy kernels.
    * A tensor: one cuTile launch writes both caches (library op :data:`KV_APPEND`, kernel
      :mod:`~tiletune.kernels.kv_cache_kernels`), reading ``start`` on the device: no host
      synchronization, capturable in a CUDA graph once tuned (update ``start`` in place between
      replays). Token ``t`` of batch entry ``b`` goes to position ``start[b] + t`` when that lies in
      ``[0, capacity)``; positions outside it (at or past the capacity, or negative) are **not
      written**, and no error is raised (nothing is checked on the host). Calls after the first ones
      with a signature replay the launch (:func:`tiletune.kernels.fastcall.fast_op`). On CPU tensors, and for
      element sizes other than 1, 2, 4 or 8 bytes, the same writes are made with torch indexing
      (:func:`kv_append_reference`, which synchronizes with the device).

    The op has one config: the first call with a new bucket of shapes launches it without a tuning
    session, so no call copies the caches (see :data:`KV_APPEND`).

    Under ``torch.compile`` the call is one node of the graph, the custom op ``tiletune::kv_cache_append``
    (:mod:`tiletune.kernels.torch_ops`), which mutates both caches.
    """
    import torch

    if torch.compiler.is_compiling():  # traced: the custom op, before any check (as fast_op's route does)
        from tiletune.kernels.torch_ops import compiled_call

        return compiled_call("kv_cache_append", cache_k, cache_v, k, v, start)
    if isinstance(start, torch.Tensor):
        return _kv_cache_append_tensor(cache_k, cache_v, k, v, start)
    return _kv_cache_append(cache_k, cache_v, k, v, start)


def _kv_cache_append(cache_k: Any, cache_v: Any, k: Any, v: Any, start: Any) -> tuple[Any, Any]:
    """:func:`kv_cache_append`: the checks, then the int path or the one-launch tensor path."""
    check_append("kv_cache_append()", cache_k, cache_v, k, v, start)
    bsz, _, cap, _ = cache_k.shape
    t = k.shape[2]
    if isinstance(start, int):
        cache_k[:, :, start:start + t].copy_(k)
        cache_v[:, :, start:start + t].copy_(v)
        return cache_k, cache_v
    if t == 0 or bsz == 0 or k.numel() == 0 or cap == 0:  # nothing to write (or nowhere to write it)
        return cache_k, cache_v
    if not _launches_kernel(cache_k):
        kv_append_reference(cache_k, cache_v, k, v, start)
        return cache_k, cache_v
    return prepare_kv_cache_append(cache_k, cache_v, k, v, start).run()


def _launches_kernel(cache: Any) -> bool:
    """Whether a start-tensor append of these caches is the cuTile launch (CUDA, element size 1/2/4/8 bytes)
    rather than torch indexing."""
    return bool(cache.is_cuda) and kv_append_bits(cache.dtype) is not None


#: ``kv_cache_append`` with a start tensor: after the first calls with a signature, one recorded launch.
#: (An int start stays off this path: every new int is a new signature, and its two copies are no launch
#: of a tuned op, so recording them would only add host time.)
_kv_cache_append_tensor = fast_op()(_kv_cache_append)
kv_cache_append.fastcall = _kv_cache_append_tensor.fastcall  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------
# KV-cache append: the library op of a start tensor (one launch writes both caches)
# --------------------------------------------------------------------------------------------

#: One config: tokens per block. Nothing to tune in a copy; tuning checks the kernel once per bucket.
KV_APPEND_SPACE = Space(CHUNK=[KV_APPEND_CHUNK])

kv_append_kernel_i64 = int64_twin(kv_append_kernel_fn, ["CK", "CV", "K", "V"])

_BITS = {1: "int8", 2: "int16", 4: "int32", 8: "int64"}


@functools.lru_cache(maxsize=None)
def kv_append_bits(dtype: Any) -> Any:
    """The integer dtype of ``dtype``'s element size (the kernel copies bits), or None for other sizes."""
    import torch

    name = _BITS.get(torch.empty((), dtype=dtype).element_size())
    return None if name is None else getattr(torch, name)


def kv_append_plan(cfg: Any, cache_k: Any, cache_v: Any, k: Any, v: Any, start: Any) -> Launch:
    """Launch plan of the append: grid ``(B * Hkv * cdiv(T, CHUNK),)``; ``D`` padded to a power of two."""
    bsz, hkv, t, d = k.shape
    chunk = int(cfg.CHUNK)
    kernel = kv_append_kernel_i64 if needs_int64(cache_k, cache_v, k, v) else kv_append_kernel
    return Launch(kernel, (bsz * hkv * -(-t // chunk),), (cache_k, cache_v, k, v, start, chunk, next_power_of_2(d)))


def kv_append_reference(cache_k: Any, cache_v: Any, k: Any, v: Any, start: Any) -> tuple[Any, Any]:
    """Torch version of the append (any device and dtype): writes ``k[b, :, t]`` / ``v[b, :, t]`` at
    position ``start[b] + t`` of ``cache_k`` / ``cache_v`` *in place* for the positions inside
    ``[0, capacity)``, skips the others, and returns ``(cache_k, cache_v)``. It synchronizes with the
    device (boolean indexing). The tuner calls it on copies of the arguments."""
    import torch

    bsz, _, t, _ = k.shape
    cap = cache_k.shape[2]
    dev = cache_k.device
    pos = start.to(device=dev, dtype=torch.int64)[:, None] + torch.arange(t, device=dev)  # (B, T)
    ok = (pos >= 0) & (pos < cap)
    bi = torch.arange(bsz, device=dev)[:, None].expand(bsz, t)[ok]
    ti = torch.arange(t, device=dev)[None, :].expand(bsz, t)[ok]
    p = pos[ok]
    # (B, capacity, Hkv, D) views: each (batch, position) pair is one (Hkv, D) slab
    cache_k.transpose(1, 2)[bi, p] = k.transpose(1, 2)[bi, ti]
    cache_v.transpose(1, 2)[bi, p] = v.transpose(1, 2)[bi, ti]
    return cache_k, cache_v


def _append_problem(args: Any, exact: bool = False) -> dict[str, Any]:
    """The named problem of an append launch (``cache_k, cache_v, k, v, start``): batch, new tokens and
    capacity bucketed to powers of two, kv heads, head dimension, element type, the start's type. The
    rows' strides (views of a fused qkv output or contiguous tensors) do not enter: the kernel reads them."""
    cache_k, k, start = args[0], args[2], args[4]
    b, hkv, t, d = (int(x) for x in k.shape)
    return {"batch": rounded(b, exact=exact), "kv_heads": hkv, "tokens": rounded(t, exact=exact), "head_dim": d,
            "capacity": rounded(int(cache_k.shape[2]), exact=exact), "bits": dtype_name(k.dtype), "start": dtype_name(start.dtype)}


#: The append's library op (:data:`KV_APPEND_SPACE`, one regime: ``KV_APPEND.op(None)``; reads and writes
#: the caches). Its arguments are integer views of the caches and rows (:func:`prepare_kv_cache_append`).
#: Its space holds one config, so a new bucket of shapes launches it without a tuning session
#: (``tune_single=False``): a session would copy the caches several times (the tuning worker's copy of
#: their storages, the gate's saved copy, the reference's copy), tens of GiB at serving sizes, on the
#: first append of a serving process. The kernel is checked against :func:`kv_append_reference` bit for
#: bit by ``tests/test_gpu_kv_cache.py``; ``tiletune.autotune``'s default would check it per bucket.
KV_APPEND = LibraryOp(
    "tiletune.kv_cache_append", lambda regime: KV_APPEND_SPACE, kv_append_plan, reference=kv_append_reference,
    inplace=["cache_k", "cache_v"], tune_single=False, buckets=ProblemKey("kv_cache_append", _append_problem,
                                                                          {"batch": "pow2", "tokens": "pow2",
                                                                           "capacity": "pow2"}),
    fallback="reference",  # the reference appends in place
)


def prepare_kv_cache_append(cache_k: Any, cache_v: Any, k: Any, v: Any, start: Any) -> Prepared:
    """The append's launch arguments (no checks, no launch): the caches and rows viewed as integers of
    their element size (:func:`kv_append_bits`; no copy, whatever the strides) and ``start`` as it is
    (int32 or int64, read on the device). ``result`` is ``(cache_k, cache_v)``."""
    bits = kv_append_bits(cache_k.dtype)
    args = (cache_k.view(bits), cache_v.view(bits), k.view(bits), v.view(bits), start)
    return Prepared(KV_APPEND, None, args, (cache_k, cache_v))
