"""``tiletune.kernels.matmul_swiglu``: the gate-up projection and SwiGLU of an MLP in one autotuned GEMM.

``matmul_swiglu(x, w_gate_up)`` equals ``swiglu(matmul(x, w_gate_up))`` (``silu(g) * u`` with ``g``
the first ``N`` columns of ``x @ w_gate_up`` and ``u`` the last ``N``, vLLM's ``silu_and_mul``
convention, as :func:`tiletune.kernels.swiglu`) without the ``M x 2N`` intermediate: the persistent
kernel of :mod:`tiletune.kernels.gemm_glu_kernels` keeps both float32 accumulators of an output tile
and stores the activation.

* ``x`` is ``[..., K]`` (the leading dims are folded into ``M``), ``w_gate_up`` is ``[K, 2N]``, either
  row-major or a transposed view ``W.t()`` of a row-major ``[2N, K]`` linear-layer weight (read in
  transposed order, not copied); bfloat16 or float16, one dtype; the result is ``[..., N]``.
* Status: written and compiled for sm_90 on a CPU host only. It is not used by any other library
  path; ``benchmarks/decoder_layer.py --fused-mlp`` opts in. ``tests/test_gpu_gemm_glu.py`` is the
  GPU check it needs first. Like the other library ops it replays its launch per call signature
  (:mod:`tiletune.kernels.fastcall`) and is the ``torch.library`` custom op ``tiletune::matmul_swiglu`` under
  ``torch.compile`` (:mod:`tiletune.kernels.torch_ops`); it is not in ``tiletune.kernels.__all__``.

One tuned op (:data:`GEMM_SWIGLU`, one regime) over :data:`GEMM_SWIGLU_SPACE`; the correctness gate
compares every measured config with :func:`_reference` (products in float64, activation in float32)
under :func:`_tolerance`.
"""

from __future__ import annotations

from typing import Any

from tiletune.devices.backends.base import Launch
from tiletune.buckets import Buckets
from tiletune.kernels.fastcall import custom_op_route, fast_op
from tiletune.devices.verify import Tolerance, derived_tolerance
from tiletune.kernels.library_op import LibraryOp
from tiletune.kernels._membound import Prepared, check_device, check_tensor, sm_count
from tiletune.kernels.gemm_glu_kernels import gemm_swiglu_args, gemm_swiglu_grid, gemm_swiglu_kernel, gemm_swiglu_space
from tiletune.kernels.gemm_kernels import narrow_result

__all__ = [
    "GEMM_SWIGLU",
    "GEMM_SWIGLU_BUCKETS",
    "GEMM_SWIGLU_SPACE",
    "matmul_swiglu",
    "plan_args",
    "prepare_matmul_swiglu",
]

#: bfloat16 / float16 inputs: the matmul template under the two-accumulator constraints.
GEMM_SWIGLU_SPACE = gemm_swiglu_space()

#: ``M`` (dimension 0 of ``a`` and ``c``) is bucketed to a power of two: a new token count inside a
#: tuned bucket reuses its winner.
GEMM_SWIGLU_BUCKETS = Buckets({"a": {0: "pow2"}, "c": {0: "pow2"}})


def plan_args(cfg: Any, a: Any, bg: Any, bu: Any, c: Any, trans_b: bool) -> tuple:
    """The kernel arguments of :func:`_plan` (without the grid): what ``tools/compile_check_gemm_glu.py``
    signs for each config."""
    return gemm_swiglu_args(cfg, a, bg, bu, c, trans_b)


def _plan(cfg: Any, a: Any, bg: Any, bu: Any, c: Any, trans_b: bool) -> Launch:
    """``c = silu(a @ op(bg)) * (a @ op(bu))`` for 2-D ``a`` (``M x K``), ``bg`` / ``bu`` (``K x N``, or
    ``N x K`` with ``trans_b``: ``op`` transposes them back) and ``c`` (``M x N``)."""
    grid = gemm_swiglu_grid(cfg, c.shape[0], c.shape[1], sm_count(c.get_device()))
    return Launch(gemm_swiglu_kernel, grid, plan_args(cfg, a, bg, bu, c, trans_b))


def _reference(a: Any, bg: Any, bu: Any, c: Any, trans_b: bool) -> Any:
    """``silu(g) * u`` with ``g = a @ op(bg)`` and ``u = a @ op(bu)`` computed in float64 and rounded to
    float32, the activation in float32 (as :func:`tiletune.kernels.glu.glu_reference`), cast to
    ``c.dtype``. float64 products keep the reference off the tf32 path whatever torch's matmul
    precision setting."""
    import torch
    import torch.nn.functional as F

    a64 = a.to(torch.float64)

    def prod(b: Any) -> Any:
        b64 = b.to(torch.float64)
        return (a64 @ (b64.t() if trans_b else b64)).to(torch.float32)

    return (F.silu(prod(bg)) * prod(bu)).to(c.dtype)


def _fallback(a: Any, bg: Any, bu: Any, c: Any, trans_b: bool) -> None:
    """The op in torch: both products by ``torch.matmul`` (cuBLAS), the activation in float32, into ``c``."""
    import torch.nn.functional as F

    g = a @ (bg.t() if trans_b else bg)
    u = a @ (bu.t() if trans_b else bu)
    c.copy_(F.silu(g.float()) * u.float())


def _k_of(a: Any) -> int:
    return int(a.shape[1])


def _tolerance(a: Any, *_: Any) -> dict[str, Tolerance]:
    """Both products accumulate ``K`` float32 terms and the result is rounded once to the 16-bit
    dtype (the reference is exact up to float32): two ulps relative, 2 ulps of the output's RMS for
    outputs near zero (sums of products of both signs, or ``silu`` of a large negative gate), plus the
    float32 accumulation over ``K`` and 64 float32 ulps for the approximate ``exp2`` / division of
    SiLU (glu.py's allowance). A wrong tile, a swapped gate and up, or an unrounded error of a few
    ulps of the output's RMS fails."""
    k = _k_of(a)
    return {d: derived_tolerance(d, length=k, atol_ulps=2.0, compute_ulps=64.0) for d in ("float16", "bfloat16")}


GEMM_SWIGLU = LibraryOp("tiletune.gemm_swiglu", lambda regime: GEMM_SWIGLU_SPACE, _plan, reference=_reference,
                        writes=["c"], tolerance=_tolerance, buckets=GEMM_SWIGLU_BUCKETS, fallback=_fallback)


# --------------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------------


def _aligned_rows(t: Any) -> bool:
    """A 2-D view the kernel can read by TMA: unit column stride, 16-byte multiple row stride that
    covers the row, 16-byte aligned start."""
    es = t.element_size()
    if t.stride(1) != 1 and t.shape[1] > 1:
        return False
    if t.shape[0] > 1 and ((t.stride(0) * es) % 16 or t.stride(0) < t.shape[1]):
        return False
    return (t.storage_offset() * es) % 16 == 0


def _kernel_rows(t: Any) -> Any:
    """``t`` itself if the kernel can read it (:func:`_aligned_rows`), else a contiguous copy (a new
    allocation: ``contiguous()`` would return a contiguous tensor with a misaligned start as it is)."""
    import torch

    return t if _aligned_rows(t) else t.clone(memory_format=torch.contiguous_format)


def prepare_matmul_swiglu(x: Any, w: Any) -> Prepared:
    """Views, output and regime of ``matmul_swiglu(x, w)`` (no checks, no launch; meta tensors work).

    ``x`` ``[..., K]`` is viewed as ``M x K`` rows; ``w`` ``[K, 2N]`` is read row-major
    (``trans_b=False``, gate ``w[:, :N]`` and up ``w[:, N:]``) or, when it is a transposed view of a
    row-major ``[2N, K]`` weight, as that weight's halves ``w.t()[:N]`` and ``w.t()[N:]``
    (``trans_b=True``). Other layouts, and halves the kernel cannot read by TMA, are copied.
    """
    import torch

    k, n = int(w.shape[0]), int(w.shape[1]) // 2
    a = _kernel_rows(x.reshape(-1, k))
    wt = w.t()
    if not _aligned_rows(w) and _aligned_rows(wt):
        trans_b, halves = True, (wt[:n], wt[n:])
    else:
        trans_b, halves = False, (w[:, :n], w[:, n:])
    bg, bu = (_kernel_rows(h) for h in halves)
    c = torch.empty((a.shape[0], n), dtype=x.dtype, device=x.device)
    return Prepared(GEMM_SWIGLU, 2, (a, bg, bu, c, trans_b), c.view(tuple(x.shape[:-1]) + (n,)))


def _aligned_starts(x: Any, w_gate_up: Any, *_: Any) -> bool:
    """Precheck of :func:`matmul_swiglu`'s fast path: both operands start 16 bytes into their storage.

    A call signature holds shapes and strides but not the start offset, on which
    :func:`prepare_matmul_swiglu` decides to copy an operand (TMA needs 16-byte aligned starts): a
    recipe is only ever learnt from a call that copied nothing, so a call with a misaligned start
    takes the slow path, which copies. Non-tensors go to the slow path too (it raises)."""
    try:
        return ((x.storage_offset() * x.element_size()) % 16 == 0
                and (w_gate_up.storage_offset() * w_gate_up.element_size()) % 16 == 0)
    except AttributeError:
        return False


def _dtype(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


@fast_op(route=custom_op_route("matmul_swiglu"), precheck=_aligned_starts)
def matmul_swiglu(x: Any, w_gate_up: Any) -> Any:
    """``swiglu(x @ w_gate_up)`` in one autotuned fused GEMM: ``silu(g) * u`` with ``g`` the first and
    ``u`` the last ``N`` columns of the ``[..., 2N]`` product (float32 accumulation and activation).

    Args:
        x: CUDA tensor ``[..., K]``, bfloat16 or float16.
        w_gate_up: CUDA tensor ``[K, 2N]`` of ``x``'s dtype: row-major, or ``W.t()`` of a row-major
            ``[2N, K]`` weight (read in place).

    Returns a new ``[..., N]`` tensor of ``x``'s dtype. A result of one row or one column whose size is not a
    multiple of 16 bytes is computed with torch (:func:`~tiletune.kernels.gemm_kernels.narrow_result`).

    Calls after the first ones with a signature replay the launch (:func:`tiletune.kernels.fastcall.fast_op`);
    a call that copies an operand or a weight half the kernel cannot read by TMA, or whose operands
    start misaligned (:func:`_aligned_starts`), runs this function. Under ``torch.compile`` it is the
    custom op ``torch.ops.tiletune.matmul_swiglu`` (:mod:`tiletune.kernels.torch_ops`).
    """
    import torch

    op = "matmul_swiglu"
    check_tensor(op, "x", x)
    check_tensor(op, "w_gate_up", w_gate_up)
    for name, t in (("x", x), ("w_gate_up", w_gate_up)):
        if t.dtype not in (torch.bfloat16, torch.float16):
            raise TypeError(f"{op}(): '{name}' must be bfloat16 or float16, got {_dtype(t)}")
    if x.dtype != w_gate_up.dtype:
        raise TypeError(f"{op}(): 'x' is {_dtype(x)} but 'w_gate_up' is {_dtype(w_gate_up)}; they must match")
    if x.dim() < 1:
        raise ValueError(f"{op}(): 'x' must have at least one dimension ([..., K]), got a scalar")
    if w_gate_up.dim() != 2:
        raise ValueError(f"{op}(): 'w_gate_up' must be 2-D [K, 2N], got shape {tuple(w_gate_up.shape)}")
    n2 = int(w_gate_up.shape[1])
    if n2 < 2 or n2 % 2:
        raise ValueError(f"{op}(): 'w_gate_up' must have an even number of columns >= 2 (gate and up halves), "
                         f"got shape {tuple(w_gate_up.shape)}")
    if x.shape[-1] != w_gate_up.shape[0]:
        raise ValueError(f"{op}(): inner dimensions differ: x {tuple(x.shape)} @ w_gate_up {tuple(w_gate_up.shape)}")
    check_device(op, x=x, w_gate_up=w_gate_up)
    out_shape = tuple(x.shape[:-1]) + (n2 // 2,)
    if x.numel() == 0 or x.shape[-1] == 0:  # no rows, or K = 0: silu(0) * 0 = 0
        return torch.zeros(out_shape, dtype=x.dtype, device=x.device)
    if narrow_result(x.numel() // x.shape[-1], n2 // 2, x.element_size()):  # one row or column: torch
        y = torch.matmul(x, w_gate_up).float()
        return (torch.nn.functional.silu(y[..., : n2 // 2]) * y[..., n2 // 2:]).to(x.dtype)
    return prepare_matmul_swiglu(x, w_gate_up).run()
