"""``tiletune.kernels.matmul``: autotuned persistent GEMM, like ``torch.matmul`` (and ``torch._scaled_mm``).

``matmul(a, b)`` multiplies CUDA tensors of one dtype with fp32 accumulation on the persistent
kernel of :mod:`tiletune.kernels.gemm_kernels`:

* bfloat16 / float16 (:data:`GEMM_SPACE`), float32 through the tf32 tensor cores
  (:data:`GEMM_TF32_SPACE`), and float8_e4m3fn with per-tensor scales (:data:`GEMM_FP8_SPACE`,
  ``scale_a`` / ``scale_b`` like ``torch._scaled_mm``; output bfloat16 unless ``out_dtype`` says);
* shapes as ``torch.matmul``: 1-D operands, ``(..., M, K) @ (K, N)`` (the leading dims are folded
  into ``M``), and batched ``(..., M, K) @ (..., K, N)`` with broadcast batch dims;
* either operand may be a transposed view (``w.t()``, ``x.transpose(-1, -2)``) of a contiguous
  tensor: it is read in transposed order instead of being copied. Other layouts are copied first.

Each dtype family is its own library op (:data:`GEMM`, :data:`GEMM_TF32`, :data:`GEMM_FP8`: a
:class:`~tiletune.kernels.library_op.LibraryOp` with one regime, ``None``) over a ~40-config space
shrunk from the 512-config space recorded on the H200 (:data:`GEMM_FULL_SPACE`, kept for offline
recording and strategy studies); 16-bit products of few rows go to :data:`GEMM_SPLITK`, whose regime
depends on the problem.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any

from tiletune.devices.backends.base import Launch
from tiletune.kernels.fastcall import constant_tensor, custom_op_route, fast_op
from tiletune.kernels._scratch import current_raw_stream, keepable, placeholder
from tiletune.space.spaces import Space
from tiletune.space.strategies.base import Budget
from tiletune.space.templates import matmul_space
from tiletune.devices.verify import SCRATCH, Tolerance, derived_tolerance, eps
from tiletune.kernels.library_op import LibraryOp
from tiletune.kernels._keys import ProblemKey, dtype_name, layout_name, rounded
from tiletune.kernels.gemm_kernels import (
    GEMM_BASELINE,
    GEMM_CONSTRAINTS,
    GEMM_FULL_SPACE_PARAMS,
    gemm_args,
    gemm_grid,
    gemm_kernel,
    gemm_splitk_kernel,
    gemm_swap_kernel,
    narrow_result,
    pow2_ceil,
    splitk_args,
    splitk_grid,
    splitk_regime,
    splitk_sem_count,
    splitk_space,
    swap_grid,
)

__all__ = [
    "GEMM",
    "GEMM_FP8",
    "GEMM_FP8_SPACE",
    "GEMM_FULL_SPACE",
    "GEMM_SPACE",
    "GEMM_SPLITK",
    "GEMM_TF32",
    "GEMM_TF32_SPACE",
    "gemm",
    "matmul",
    "narrow_output",
    "prepare_matmul",
    "splitk_scratch_shapes",
    "splitk_workspace",
    "uses_scratch",
]

#: The 512-config space recorded on the H200 (``benchmarks/spaces/h200_gemm_bf16_4096.json.gz``).
GEMM_FULL_SPACE = Space(**GEMM_FULL_SPACE_PARAMS, constraints=GEMM_CONSTRAINTS, baseline=GEMM_BASELINE)
#: bfloat16 / float16 inputs: 38 configs from the matmul template.
GEMM_SPACE = matmul_space(2)
#: float32 inputs (tf32): 38 configs.
GEMM_TF32_SPACE = matmul_space(4)
#: float8_e4m3fn inputs: 38 configs.
GEMM_FP8_SPACE = matmul_space(1)

_FP8 = "float8_e4m3fn"


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    import torch

    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def _plan(cfg: Any, a: Any, b: Any, c: Any, scale_a: Any, scale_b: Any, trans_a: bool, trans_b: bool,
          scaled: bool) -> Launch:
    """``c[i] = s * op(a[i]) @ op(b[i])`` for 3-D ``a``, ``b``, ``c`` (``op(x) = x^T`` with the flag,
    ``s = scale_a * scale_b`` when ``scaled``)."""
    grid = gemm_grid(cfg, c.shape[1], c.shape[2], _sm_count(c.get_device()), batch=c.shape[0])
    return Launch(gemm_kernel, grid, gemm_args(cfg, a, b, c, scale_a, scale_b, trans_a, trans_b, scaled))


def _operand(x: Any, trans: bool, dtype: Any) -> Any:
    """A 3-D operand as the matrices it stands for (transposed back), in ``dtype`` (float64 here)."""
    x = x.float().to(dtype)
    return x.transpose(-1, -2) if trans else x


def _reference(a: Any, b: Any, c: Any, scale_a: Any, scale_b: Any, trans_a: bool, trans_b: bool,
               scaled: bool) -> Any:
    """``op(a) @ op(b)`` in float64 (exact for fp8/bf16/fp16 inputs up to fp64 rounding)."""
    import torch

    out = torch.matmul(_operand(a, trans_a, torch.float64), _operand(b, trans_b, torch.float64))
    if scaled:
        out = out * (scale_a.double() * scale_b.double())
    return out.to(c.dtype)


def _fallback(a: Any, b: Any, c: Any, scale_a: Any, scale_b: Any, trans_a: bool, trans_b: bool, scaled: bool,
              *_scratch: Any) -> None:
    """The product in torch (``torch.matmul`` in the inputs' dtype: cuBLAS), into ``c`` (the split-K op's
    workspace and counters are left as they are)."""
    import torch

    out = torch.matmul(a.transpose(-1, -2) if trans_a else a, b.transpose(-1, -2) if trans_b else b)
    if scaled:
        out = out.float() * (scale_a.float() * scale_b.float())
    c.copy_(out)


def _k_of(a: Any, trans_a: bool) -> int:
    return int(a.shape[1] if trans_a else a.shape[2])


def _input_scale(a: Any, b: Any, trans_a: bool) -> float:
    """``rms(a) * rms(b) * sqrt(K)``: the size of an output of ``K`` products of random sign."""
    import torch

    rms = lambda t: float(torch.linalg.vector_norm(t.float())) / math.sqrt(max(1, t.numel()))  # noqa: E731
    return rms(a) * rms(b) * math.sqrt(max(1, _k_of(a, trans_a)))


def _tolerance(a: Any, b: Any, c: Any, scale_a: Any, scale_b: Any, trans_a: bool, *_: Any) -> dict[str, Tolerance]:
    """bf16 / fp16 products accumulated in float32 over ``K`` and rounded once (the reference is
    exact, float64): two ulps relative, 2 ulps of the output's RMS for outputs near zero (sums of
    products of both signs), the float32 accumulation over ``K`` on top."""
    k = _k_of(a, trans_a)
    return {d: derived_tolerance(d, length=k, atol_ulps=2.0) for d in ("float16", "bfloat16")}


def _tf32_tolerance(a: Any, b: Any, c: Any, scale_a: Any, scale_b: Any, trans_a: bool, *_: Any) -> dict[str, Tolerance]:
    """tf32 keeps 10 mantissa bits (``eps_tf32 = 2^-10``): each product is off by up to ``eps_tf32``
    relative, and ``K`` of them add up like a random walk, an error of about ``0.4 eps_tf32 * S``
    with ``S = rms(a) * rms(b) * sqrt(K)`` (the size of a typical output). Per element
    ``atol = 16 eps_tf32 * S`` (``S * 2^-6``, far beyond the largest of millions of such errors) and
    ``rtol = 8 eps_tf32``; the aggregate allows ``2 eps_tf32`` of the output's RMS plus
    ``2 eps_tf32 * S`` (five times the expected RMS error even if tf32 truncates): tf32 passes at any
    K, while a wrong tile, index or mask, or a bias of a few tf32 ulps of the largest output, fails."""
    e = eps("tfloat32")
    s = _input_scale(a, b, trans_a)
    return {"float32": Tolerance(rtol=8 * e, atol=max(16 * e * s, 1e-5), atol_rms=0.0, agg=2 * e, agg_atol=2 * e * s)}


def _fp8_tolerance(a: Any, b: Any, c: Any, scale_a: Any, scale_b: Any, trans_a: bool, *_: Any) -> dict[str, Tolerance]:
    """Hopper's fp8 tensor cores add products with a reduced-precision accumulator, so every result
    carries errors of the tf32 kind (:func:`_tf32_tolerance`, times the scales): a float32 result
    gets exactly that bound, a 16-bit one its own rounding (:func:`_tolerance`) plus the same
    absolute terms."""
    t = _tf32_tolerance(a, b, c, scale_a, scale_b, trans_a)["float32"]
    s = abs(float(scale_a.reshape(-1)[0]) * float(scale_b.reshape(-1)[0]))
    out = {"float32": t._replace(atol=max(t.atol * s, 1e-5), agg_atol=t.agg_atol * s)}
    for d, own in _tolerance(a, b, c, scale_a, scale_b, trans_a).items():
        out[d] = own._replace(atol=out["float32"].atol, agg_atol=out["float32"].agg_atol)
    return out


def gemm_problem(args: Any, exact: bool = False) -> dict[str, Any]:
    """The named problem of a GEMM launch ``(a, b, c, scale_a, scale_b, trans_a, trans_b, scaled, ...)``:
    ``M`` (the rows of ``c``: every leading dimension of a ``(..., M, K) @ (K, N)`` call folded in,
    bucketed to a power of two), ``N``, ``K``, the batch of a batched product, the operands' named layout
    (:func:`~._keys.layout_name`: ``"nt"`` for ``x @ w.t()``), dtypes and whether scales apply. Strides
    do not enter: the kernel reads both operands through their strides whatever they are."""
    a, _, c = args[0], args[1], args[2]
    trans_a, trans_b, scaled = bool(args[5]), bool(args[6]), bool(args[7])
    batch, m, n = (int(x) for x in c.shape)
    return {"batch": batch, "M": rounded(m, exact=exact), "N": n, "K": int(a.shape[1] if trans_a else a.shape[2]),
            "layout": layout_name(trans_a, trans_b), "dtype": dtype_name(a.dtype), "out_dtype": dtype_name(c.dtype),
            "scaled": scaled}


#: The GEMM ops' key (:func:`gemm_problem`): a new token count inside a tuned power-of-two bucket of
#: ``M`` reuses its winner, whatever leading dimensions the call folded into ``M``.
GEMM_BUCKETS = ProblemKey("gemm", gemm_problem, {"M": "pow2"})
#: The bfloat16 / float16 GEMM (:data:`GEMM_SPACE`, one regime: ``GEMM.op(None)``), launch plan :func:`_plan`,
#: arguments ``(a, b, c, scale_a, scale_b, trans_a, trans_b, scaled)``.
GEMM = LibraryOp("tiletune.gemm", lambda regime: GEMM_SPACE, _plan, reference=_reference, writes=["c"],
                 tolerance=_tolerance, buckets=GEMM_BUCKETS, fallback=_fallback)
#: The float32 (tf32) GEMM (:data:`GEMM_TF32_SPACE`, one regime), same plan and arguments.
GEMM_TF32 = LibraryOp("tiletune.gemm_tf32", lambda regime: GEMM_TF32_SPACE, _plan, reference=_reference,
                      writes=["c"], tolerance=_tf32_tolerance, buckets=GEMM_BUCKETS, fallback=_fallback)
#: The float8_e4m3fn GEMM with per-tensor scales (:data:`GEMM_FP8_SPACE`, one regime), same plan and arguments.
GEMM_FP8 = LibraryOp("tiletune.gemm_fp8", lambda regime: GEMM_FP8_SPACE, _plan, reference=_reference,
                     writes=["c"], tolerance=_fp8_tolerance, buckets=GEMM_BUCKETS)


# --------------------------------------------------------------------------------------------
# split-K (small M, large K)
# --------------------------------------------------------------------------------------------


def _splitk_plan(cfg: Any, a: Any, b: Any, c: Any, scale_a: Any, scale_b: Any, trans_a: bool, trans_b: bool,
                 scaled: bool, ws: Any, sem: Any) -> Launch:
    """``SWAP``: one launch of :func:`~tiletune.kernels.gemm_kernels.gemm_swap_kernel` (the transposed
    product, no workspace); ``SPLIT_K == 1``: the plain GEMM launch (:func:`_plan`, no workspace);
    otherwise one launch of :func:`~tiletune.kernels.gemm_kernels.gemm_splitk_kernel` over
    ``tiles * SPLIT_K`` work units."""
    if getattr(cfg, "SWAP", 0):
        grid = swap_grid(cfg, c.shape[1], c.shape[2], _sm_count(c.get_device()), batch=c.shape[0])
        return Launch(gemm_swap_kernel, grid, gemm_args(cfg, a, b, c, scale_a, scale_b, trans_a, trans_b, scaled))
    if cfg.SPLIT_K == 1:
        return _plan(cfg, a, b, c, scale_a, scale_b, trans_a, trans_b, scaled)
    grid = splitk_grid(cfg, c.shape[1], c.shape[2], _sm_count(c.get_device()), batch=c.shape[0])
    return Launch(gemm_splitk_kernel, grid,
                  splitk_args(cfg, a, b, c, scale_a, scale_b, ws, sem, trans_a, trans_b, scaled))


def _splitk_reference(a: Any, b: Any, c: Any, scale_a: Any, scale_b: Any, trans_a: bool, trans_b: bool,
                      scaled: bool, ws: Any, sem: Any) -> tuple[Any, Any, Any]:
    """The product (as :func:`_reference`), the workspace as :data:`~tiletune.devices.verify.SCRATCH` (float32
    partial sums whose values depend on the config: not compared, but a NaN or infinity there fails) and all-zero
    counters (every launch must leave them so)."""
    import torch

    return (_reference(a, b, c, scale_a, scale_b, trans_a, trans_b, scaled), SCRATCH, torch.zeros_like(sem))


def _splitk_tolerance(a: Any, b: Any, c: Any, scale_a: Any, scale_b: Any, trans_a: bool, *_: Any) -> dict[str, Any]:
    """The product's tolerance (:func:`_tolerance`); the counters are int32, compared exactly."""
    return _tolerance(a, b, c, scale_a, scale_b, trans_a)


def _splitk_space_for(regime: tuple[int, int, int, int]) -> Space:
    return splitk_space(*regime)


#: The bfloat16 / float16 split-K GEMM ops, one per regime
#: (:func:`~tiletune.kernels.gemm_kernels.splitk_regime`: input width, ``K`` rounded down, ``TM`` cap,
#: largest split), arguments ``(a, b, c, scale_a, scale_b, trans_a, trans_b, scaled, ws, sem)``:
#: ``ws`` and ``sem`` come from :func:`splitk_workspace`. :func:`matmul` sends products with
#: ``M <= 256`` here; the space's ``SPLIT_K == 1`` configs are the plain GEMM.
#: Evaluations a cold split-K key is searched for (``"auto"`` strategy). A regime's space holds
#: 80-160 configs, and measuring all of them stalled a first call for tens of seconds (docs/GPU-NOTES.md);
#: issue 13 asks for a budgeted search on library spaces over ~40 configs, and on the recorded 512-config
#: GEMM space the model-guided searches came within 1% of the optimum well inside this budget
#: (``benchmarks/results/h200/strategies.json``). ``LibraryOp.configure(budget=tiletune.Budget())``
#: measures every config again.
SPLITK_SEARCH_EVALS = 40
GEMM_SPLITK = LibraryOp("tiletune.gemm_splitk", _splitk_space_for, _splitk_plan, reference=_splitk_reference,
                        writes=["c"], inplace=["ws", "sem"], tolerance=_splitk_tolerance,
                        buckets=GEMM_BUCKETS, budget=Budget(max_evals=SPLITK_SEARCH_EVALS), fallback=_fallback)


class _Pool:
    """The split-K scratch memory of one (device, stream): a float32 workspace and int32 counters, both
    zeroed when allocated (the kernel leaves the counters zero), and the views handed out, by shape."""

    __slots__ = ("ws", "sem", "views")

    def __init__(self) -> None:
        self.ws: Any = None
        self.sem: Any = None
        self.views: dict[tuple, tuple[Any, Any]] = {}


_pools: dict[tuple[int, int], _Pool] = {}
_home_stream: dict[int, int] = {}  # device -> the stream whose scratch memory fast-path recipes may keep
_pool_lock = threading.Lock()


def splitk_scratch_shapes(m: int, n: int, batch: int, s_max: int) -> tuple[tuple[int, int, int], int]:
    """``(workspace shape, counter count)`` of a split-K product ``batch x m x n`` whose regime splits at
    most ``s_max`` ways (functions of ``m``'s bucket, so they never change the tuning key)."""
    return (int(s_max) * int(batch), pow2_ceil(m), int(n)), splitk_sem_count(m, n, batch)


def splitk_workspace(device: Any, m: int, n: int, batch: int, s_max: int) -> tuple[Any, Any]:
    """``(ws, sem)`` for a split-K product ``batch x m x n`` of a regime with largest split ``s_max``.

    ``ws`` is a float32 ``(s_max * batch, pow2_ceil(m), n)`` view and ``sem`` an int32
    ``(splitk_sem_count(m, n, batch),)`` view of buffers kept per (device, current stream): no
    allocation after the first call of a shape, and their shapes are functions of ``m``'s bucket, so
    they never change the tuning key. Launches on one stream run in order, so they may share the
    memory; another stream gets its own. Only the first stream's views are registered as constant
    kernel arguments (:func:`tiletune.kernels.fastcall.constant_tensor`): calls on other streams stay on the
    slow path, which looks their own memory up (see :func:`_same_stream`).

    Memory is kept only where :func:`._scratch.keepable` allows (the default stream, outside graph
    capture): a call on another stream (a ``torch.cuda.graph`` capture, the CUDA-graph trees of
    ``torch.compile(mode="reduce-overhead")``) gets zeroed buffers of its own, which its graph owns.
    """
    import torch

    cuda = device.type == "cuda"
    dev = device.index if device.index is not None else (torch.cuda.current_device() if cuda else 0)
    where = torch.device("cuda", dev) if cuda else device  # (CPU: the host-side tests)
    shape, nsem = splitk_scratch_shapes(m, n, batch, s_max)
    if not keepable(where):
        return (torch.zeros(shape, dtype=torch.float32, device=where), torch.zeros(nsem, dtype=torch.int32, device=where))
    stream = current_raw_stream(dev)
    with _pool_lock:
        home = _home_stream.setdefault(dev, stream)
        pool = _pools.get((dev, stream))
        if pool is None:
            pool = _pools[(dev, stream)] = _Pool()
        hit = pool.views.get((shape, nsem))
        if hit is not None:
            return hit
        need = math.prod(shape)
        if pool.ws is None or pool.ws.numel() < need:  # older views keep the old buffer alive
            size = max(need, 2 * pool.ws.numel()) if pool.ws is not None else need
            pool.ws = torch.zeros(size, dtype=torch.float32, device=where)
        if pool.sem is None or pool.sem.numel() < nsem:
            size = max(nsem, 2 * pool.sem.numel()) if pool.sem is not None else nsem
            pool.sem = torch.zeros(size, dtype=torch.int32, device=where)
        views = (pool.ws[:need].view(shape), pool.sem[:nsem])
        if stream == home:
            constant_tensor(views[0])
            constant_tensor(views[1])
        pool.views[(shape, nsem)] = views
        return views


def uses_scratch(cfg: Any) -> bool:
    """Whether a split-K op config's launch reads and writes the workspace and counters (a real split;
    the swapped and the unsplit configs ignore them)."""
    return not getattr(cfg, "SWAP", 0) and int(getattr(cfg, "SPLIT_K", 1)) > 1


def _splitk_scratch(op: Any, device: Any, args: tuple[Any, ...], m: int, n: int, batch: int,
                    s_max: int) -> tuple[Any, Any]:
    """``(ws, sem)`` for one call of the split-K op ``op`` on ``args`` (its arguments before the scratch).

    Where memory may be kept (:func:`._scratch.keepable`) this is :func:`splitk_workspace`'s pooled,
    zero-cost scratch. Elsewhere (a CUDA graph capture, a side stream) that would allocate and zero a
    fresh workspace on every call: two fill kernels captured into the graph and replayed every time.
    So when the op already holds this key's config and that config does not touch the scratch (the
    swapped or unsplit routes, which is what small-M products pick), the call gets uninitialised
    placeholders of the same shapes instead (same tuning key, no kernel)."""
    if not keepable(device):
        import torch

        shape, nsem = splitk_scratch_shapes(m, n, batch, s_max)
        ws = placeholder(device, torch.float32, shape)
        sem = placeholder(device, torch.int32, (nsem,))
        cfg = op.known_config(*args, ws, sem)
        if cfg is not None and not uses_scratch(cfg):
            return ws, sem
    return splitk_workspace(device, m, n, batch, s_max)


def _same_stream(a: Any, *_: Any) -> bool:
    """Precheck of :func:`matmul`'s fast path: a recipe may hold the first stream's split-K scratch
    memory, so once a device has some, a call on another stream takes the slow path."""
    if not _home_stream:
        return True
    try:
        dev = a.get_device()
    except AttributeError:
        return True
    home = _home_stream.get(dev)
    return home is None or current_raw_stream(dev) == home


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------


def _aligned(x: Any) -> bool:
    """Batch of row-major matrices with unit column stride and 16-byte aligned row / batch strides."""
    es = x.element_size()
    if x.stride(2) != 1 and x.shape[2] > 1:
        return False
    if (x.stride(1) * es) % 16 or x.stride(1) < x.shape[2]:
        return False
    return x.shape[0] == 1 or (x.stride(0) > 0 and (x.stride(0) * es) % 16 == 0)


def _as_kernel_operand(x: Any) -> tuple[Any, bool]:
    """``(tensor the kernel reads, transposed?)`` for a 3-D operand: itself, its transpose, or a copy."""
    if _aligned(x):
        return x, False
    xt = x.transpose(1, 2)
    if _aligned(xt):
        return xt, True
    return x.contiguous(), False


def _scale_tensor(s: Any, name: str, device: Any) -> Any:
    import torch

    if isinstance(s, torch.Tensor):
        if s.numel() != 1:
            raise ValueError(f"matmul: {name} must hold one value (a per-tensor scale), got shape {tuple(s.shape)}")
        if s.device != device:
            raise ValueError(f"matmul: {name} is on {s.device}, the operands on {device}")
        return s.reshape(1).to(torch.float32).contiguous()
    if isinstance(s, (int, float)) and not isinstance(s, bool):
        return torch.full((1,), float(s), dtype=torch.float32, device=device)
    raise TypeError(f"matmul: {name} must be a float or a one-element tensor, got {type(s).__name__}")


def _unit_scale(device: Any) -> Any:
    """The scale placeholder of a non-fp8 product: the kernel reads it only with ``SCALED`` (fp8), so it
    is allocated without a kernel (safe to create during CUDA graph capture) and never read
    (:func:`._scratch.placeholder`)."""
    import torch

    return placeholder(device, torch.float32, (1,))


def broadcast_batch(x: tuple[int, ...], y: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast of two batch shapes (``torch.broadcast_shapes``'s rule), or None when they do not broadcast.

    Plain Python on purpose: ``torch.broadcast_shapes`` imports torch's symbolic-shape machinery
    (and with it sympy) on first use, seconds of a process's first matmul call.
    """
    out = []
    for i in range(1, max(len(x), len(y)) + 1):
        p = x[-i] if i <= len(x) else 1
        q = y[-i] if i <= len(y) else 1
        if p != q and p != 1 and q != 1:
            return None
        out.append(q if p == 1 else p)
    return tuple(reversed(out))


#: Whether :func:`matmul` sends 16-bit products of at most ``SPLITK_MAX_M`` rows to the split-K op
#: (:data:`GEMM_SPLITK`), whose space also holds the plain kernel (``SPLIT_K = 1``). On since
#: ``tests/test_gpu_splitk.py`` passed on the H200; set it False to keep every call on the plain GEMM.
ROUTE_SMALL_M_TO_SPLITK = True


@fast_op(route=custom_op_route("matmul"), precheck=_same_stream)
def matmul(a: Any, b: Any, *, scale_a: Any = None, scale_b: Any = None, out_dtype: Any = None) -> Any:
    """``a @ b`` like ``torch.matmul``, autotuned, with fp32 accumulation.

    Args:
        a, b: CUDA tensors of one dtype: bfloat16, float16, float32 (computed as tf32) or
            float8_e4m3fn. 1-D, 2-D or batched (``(..., M, K) @ (..., K, N)``, batch dims
            broadcast as in torch).
        scale_a, scale_b: per-tensor scales (floats or one-element tensors), required for
            float8_e4m3fn inputs (the result is ``scale_a * scale_b * (a @ b)``), refused otherwise.
        out_dtype: result dtype of an fp8 product (bfloat16 by default; float16 or float32);
            other inputs return their own dtype.

    Returns a new tensor of the broadcast shape. A product whose result is one row or one column of a
    size that is not a multiple of 16 bytes runs through ``torch.matmul`` (:func:`narrow_output`).
    """
    import torch

    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        raise TypeError("matmul expects two torch tensors")
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError("matmul: both arguments need at least one dimension")
    if a.dtype != b.dtype:
        raise TypeError(f"matmul expects two tensors of one dtype (bfloat16, float16, float32 or float8_e4m3fn), "
                        f"got {a.dtype} and {b.dtype}")
    fp8 = a.dtype == getattr(torch, _FP8, None)
    if a.dtype not in (torch.bfloat16, torch.float16, torch.float32) and not fp8:
        raise TypeError(f"matmul supports bfloat16, float16, float32 and float8_e4m3fn, got {a.dtype}")
    if fp8:
        if scale_a is None or scale_b is None:
            raise ValueError("matmul: float8_e4m3fn inputs need scale_a and scale_b (per-tensor scales)")
        out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
        if out_dtype not in (torch.bfloat16, torch.float16, torch.float32):
            raise TypeError(f"matmul: out_dtype of an fp8 product must be bfloat16, float16 or float32, got {out_dtype}")
    else:
        if scale_a is not None or scale_b is not None:
            raise ValueError("matmul: scale_a / scale_b are for float8_e4m3fn inputs only")
        if out_dtype is not None and out_dtype != a.dtype:
            raise TypeError(f"matmul: out_dtype must be the inputs' dtype ({a.dtype}) for non-fp8 inputs")
        out_dtype = a.dtype

    # torch.matmul's rules for 1-D operands
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    if a2.shape[-1] != b2.shape[-2]:
        raise ValueError(f"matmul: inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)}")
    batch = broadcast_batch(tuple(a2.shape[:-2]), tuple(b2.shape[:-2]))
    if batch is None:
        raise ValueError(f"matmul: batch dimensions do not broadcast: {tuple(a.shape)} @ {tuple(b.shape)}")
    if not (a.is_cuda and b.is_cuda) or a.device != b.device:
        raise ValueError(f"matmul expects both tensors on one CUDA device, got {a.device} and {b.device}")
    k = a2.shape[-1]
    out_shape = (*batch, a2.shape[-2], b2.shape[-1])
    if fp8:
        sa, sb = _scale_tensor(scale_a, "scale_a", a.device), _scale_tensor(scale_b, "scale_b", a.device)
    else:
        sa = sb = _unit_scale(a.device)
    lib_op, regime, args = prepare_matmul(a2, b2, out_dtype, sa, sb, fp8)
    c = args[2]
    if c.numel() == 0:
        return _finish(c, out_shape, a, b)
    if k == 0:
        return _finish(c.zero_(), out_shape, a, b)
    if narrow_output(c):
        out = torch.matmul(a2, b2) if not fp8 else (torch.matmul(a2.float(), b2.float()) * (sa * sb)).to(out_dtype)
        return _finish(out, out_shape, a, b)
    if lib_op is GEMM_SPLITK:
        op = GEMM_SPLITK.op(regime)
        ws, sem = _splitk_scratch(op, a.device, args, c.shape[1], c.shape[2], c.shape[0], regime[3])
        op(*args, ws, sem)
    else:
        lib_op.op(regime)(*args)
    return _finish(c, out_shape, a, b)


def narrow_output(c: Any) -> bool:
    """Whether a ``(batch, M, N)`` result is one row or one column (``M == 1`` or ``N == 1``: a vector times
    a matrix, a matrix times a vector) whose ``M * N`` elements do not fill a multiple of 16 bytes.

    The GEMM kernels' tile stores may use TMA, and on sm_90 such a store wrote past the end of these
    results in every config (``benchmarks/probe_narrow_rows.py``), so :func:`matmul`
    computes them with ``torch.matmul`` (cuBLAS; a matrix-vector product is its home ground anyway)."""
    _, m, n = c.shape
    return narrow_result(m, n, c.element_size())


def prepare_matmul(a2: Any, b2: Any, out_dtype: Any, scale_a: Any, scale_b: Any,
                   scaled: bool = False) -> tuple[LibraryOp, Any, tuple[Any, ...]]:
    """``(library op, regime, launch arguments)`` of :func:`matmul` for operands of two or more dimensions
    (1-D ones unsqueezed), no checks, no launch; the split-K op's workspace is not among the arguments
    (:func:`splitk_workspace`). ``(..., M, K) @ (K, N)`` folds the leading dimensions into ``M`` (a view
    when ``a``'s rows allow it); a transposed view (``w.t()``) is read in transposed order. Works on meta
    tensors (keys without a GPU)."""
    import torch

    m, k, n = a2.shape[-2], a2.shape[-1], b2.shape[-1]
    batch = broadcast_batch(tuple(a2.shape[:-2]), tuple(b2.shape[:-2])) or ()
    if b2.dim() == 2 and a2.dim() > 2:
        # (..., M, K) @ (K, N): fold the leading dims into M (a view when a's rows allow it)
        a3, b3 = a2.reshape(1, -1, k), b2.unsqueeze(0)
    else:
        nb = math.prod(batch)
        a3 = a2.expand(*batch, m, k).reshape(nb, m, k)
        b3 = b2.expand(*batch, k, n).reshape(nb, k, n)
    c = torch.empty((a3.shape[0], a3.shape[1], n), dtype=out_dtype, device=a2.device)
    a_arg, trans_a = _as_kernel_operand(a3)
    b_arg, trans_b = _as_kernel_operand(b3)
    args = (a_arg, b_arg, c, scale_a, scale_b, trans_a, trans_b, bool(scaled))
    if scaled:
        return GEMM_FP8, None, args
    regime = None if a2.dtype == torch.float32 or not ROUTE_SMALL_M_TO_SPLITK else \
        splitk_regime(c.shape[1], n, k, 2, c.shape[0])
    if regime is not None:
        return GEMM_SPLITK, regime, args
    return (GEMM_TF32 if a2.dtype == torch.float32 else GEMM), None, args


def _finish(c: Any, out_shape: tuple[int, ...], a: Any, b: Any) -> Any:
    """Reshape the 3-D result to torch.matmul's output shape (dropping 1-D operands' dims)."""
    out = c.reshape(out_shape)
    if a.dim() == 1:
        out = out.squeeze(-2)
    if b.dim() == 1:
        out = out.squeeze(-1)
    return out


def gemm(a: Any, b: Any) -> Any:
    """``a @ b`` for 2-D CUDA tensors (an alias of :func:`matmul` kept for existing callers)."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and (a.dim() != 2 or b.dim() != 2):
        raise ValueError(f"gemm expects 2-D tensors, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    return matmul(a, b)
