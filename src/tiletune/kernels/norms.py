"""Autotuned normalizations in cuTile: RMSNorm, RMSNorm fused with a residual add, LayerNorm.

Public ops (torch tensors in, new tensors out, any leading batch shape, normalization over the
last dimension, bfloat16 / float16 / float32 inputs, float32 statistics)::

    y = rms_norm(x, weight, eps=1e-6)                       # x * rsqrt(mean(x^2) + eps) * weight
    y, h = rms_norm_residual(x, residual, weight, eps=1e-6) # h = x + residual; y = rms_norm(h)
    y = layer_norm(x, weight, bias, eps=1e-5)               # like torch.nn.functional.layer_norm

``weight`` (and ``bias``) may be None; they may have any float dtype (they are read as float32).
Outputs have the input's dtype. Rows may be strided (``x = big[:, :n]`` is read in place).

Kernels (one Python function each, compiled per configuration): persistent, ``num_SMs *
occupancy`` blocks walk row blocks ``bid, bid + blocks, ...``. Rows of up to 16384 (padded)
elements are one tile (``TM`` short rows at once, TMA loads zero-padded past ``N``; the store drops
the padding); longer rows take two passes over ``CHUNK``-column pieces (pass 1 reduces, pass 2
reloads, mostly from L2, and writes). LayerNorm's chunked pass 1 merges per-chunk mean and
centered sum of squares (Chan et al.), so it keeps the two-pass accuracy. The tuning spaces come
from :func:`tiletune.space.templates.rowwise_space`: occupancy, the load latency hint and TMA or plain
stores (plus rows per tile or the chunk width by regime).

``rms_norm_residual`` rounds ``h = x + residual`` to the input dtype and normalizes the rounded
value, exactly what the unfused ``residual = x + residual; y = rms_norm(residual)`` computes.
"""

from __future__ import annotations

from typing import Any, Hashable

import cuda.tile as ct

from tiletune.devices.backends.base import Launch
from tiletune.space.spaces import Space
from tiletune.space.templates import ROW_MAX_ELEMS, next_power_of_2, row_regime, rowwise_space, tma_rows
from tiletune.kernels._tile_ops import load_zero_padded as _ld
from tiletune.devices.verify import derived_tolerances
from tiletune.kernels.fastcall import custom_op_route, fast_op
from tiletune.kernels._scratch import placeholder
from tiletune.kernels.library_op import LibraryOp
from tiletune.kernels._membound import (
    Prepared,
    as_rows,
    check_device,
    check_float,
    int64_twin,
    needs_int64,
    persistent_grid,
    rows_bucketed,
)

__all__ = [
    "LAYER_NORM",
    "RMS_NORM",
    "RMS_NORM_RESIDUAL",
    "layer_norm",
    "layer_norm_reference",
    "prepare_layer_norm",
    "prepare_rms_norm",
    "prepare_rms_norm_residual",
    "rms_norm",
    "rms_norm_reference",
    "rms_norm_residual",
    "rms_norm_residual_reference",
]

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
ZERO = ct.PaddingMode.ZERO



def _vec(V, c, TN, HAS, fill):
    """Chunk ``c`` of a length-N vector as a ``(1, TN)`` float32 tile (``fill`` when absent)."""
    if HAS:
        v = ct.load(V, (c,), shape=(TN,), padding_mode=ct.PaddingMode.ZERO).astype(ct.float32).reshape((1, TN))
    else:
        v = ct.full((1, TN), fill, dtype=ct.float32)
    return v


# ---------------------------------------------------------------------------------------------
# RMSNorm
# ---------------------------------------------------------------------------------------------


def rms_norm_kernel_fn(X, W, Y, eps, TM: ConstInt, TN: ConstInt, CHUNKED: ConstBool, HAS_W: ConstBool,
                       LAT: ConstInt, STORE_TMA: ConstBool):
    """``Y = X * rsqrt(mean(X^2, 1) + eps) * W`` over rows of a 2-D ``X`` (persistent grid).

    ``TN``: the padded row (``CHUNKED`` False; ``TM`` rows per tile) or the chunk width.
    """
    M = X.shape[0]
    N = X.shape[1]
    inv_n = 1.0 / N
    num_rb = ct.cdiv(M, TM)
    if CHUNKED:
        nch = ct.cdiv(N, TN)
        for rb in range(ct.bid(0), num_rb, ct.num_blocks(0)):
            acc = ct.zeros((TM, TN), dtype=ct.float32)
            for c in range(nch):
                x = _ld(X, (rb, c), (TM, TN), LAT).astype(ct.float32)
                acc = acc + x * x
            rstd = ct.rsqrt(ct.sum(acc, axis=1, keepdims=True) * inv_n + eps)
            for c in range(nch):
                x = _ld(X, (rb, c), (TM, TN), LAT).astype(ct.float32)
                w = _vec(W, c, TN, HAS_W, 1.0)
                ct.store(Y, (rb, c), (x * rstd * w).astype(Y.dtype), allow_tma=STORE_TMA)
    else:
        w = _vec(W, 0, TN, HAS_W, 1.0)
        for rb in range(ct.bid(0), num_rb, ct.num_blocks(0)):
            x = _ld(X, (rb, 0), (TM, TN), LAT).astype(ct.float32)
            rstd = ct.rsqrt(ct.sum(x * x, axis=1, keepdims=True) * inv_n + eps)
            ct.store(Y, (rb, 0), (x * rstd * w).astype(Y.dtype), allow_tma=STORE_TMA)


rms_norm_kernel = ct.kernel(rms_norm_kernel_fn)
rms_norm_kernel_i64 = int64_twin(rms_norm_kernel_fn, ["X", "Y"])


def rms_norm_residual_kernel_fn(X, R, W, Y, H, eps, TM: ConstInt, TN: ConstInt, CHUNKED: ConstBool,
                                HAS_W: ConstBool, LAT: ConstInt, STORE_TMA: ConstBool):
    """``H = X + R`` (rounded to ``H``'s dtype), ``Y = H * rsqrt(mean(H^2, 1) + eps) * W``.

    The chunked pass 2 recomputes ``H`` from ``X`` and ``R`` (reloads, mostly L2 hits) instead of
    reading back ``H`` it just wrote.
    """
    M = X.shape[0]
    N = X.shape[1]
    inv_n = 1.0 / N
    num_rb = ct.cdiv(M, TM)
    if CHUNKED:
        nch = ct.cdiv(N, TN)
        for rb in range(ct.bid(0), num_rb, ct.num_blocks(0)):
            acc = ct.zeros((TM, TN), dtype=ct.float32)
            for c in range(nch):
                x = _ld(X, (rb, c), (TM, TN), LAT).astype(ct.float32)
                r = _ld(R, (rb, c), (TM, TN), LAT).astype(ct.float32)
                h = (x + r).astype(H.dtype)
                ct.store(H, (rb, c), h, allow_tma=STORE_TMA)
                hf = h.astype(ct.float32)
                acc = acc + hf * hf
            rstd = ct.rsqrt(ct.sum(acc, axis=1, keepdims=True) * inv_n + eps)
            for c in range(nch):
                x = _ld(X, (rb, c), (TM, TN), LAT).astype(ct.float32)
                r = _ld(R, (rb, c), (TM, TN), LAT).astype(ct.float32)
                hf = (x + r).astype(H.dtype).astype(ct.float32)
                w = _vec(W, c, TN, HAS_W, 1.0)
                ct.store(Y, (rb, c), (hf * rstd * w).astype(Y.dtype), allow_tma=STORE_TMA)
    else:
        w = _vec(W, 0, TN, HAS_W, 1.0)
        for rb in range(ct.bid(0), num_rb, ct.num_blocks(0)):
            x = _ld(X, (rb, 0), (TM, TN), LAT).astype(ct.float32)
            r = _ld(R, (rb, 0), (TM, TN), LAT).astype(ct.float32)
            h = (x + r).astype(H.dtype)
            ct.store(H, (rb, 0), h, allow_tma=STORE_TMA)
            hf = h.astype(ct.float32)
            rstd = ct.rsqrt(ct.sum(hf * hf, axis=1, keepdims=True) * inv_n + eps)
            ct.store(Y, (rb, 0), (hf * rstd * w).astype(Y.dtype), allow_tma=STORE_TMA)


rms_norm_residual_kernel = ct.kernel(rms_norm_residual_kernel_fn)
rms_norm_residual_kernel_i64 = int64_twin(rms_norm_residual_kernel_fn, ["X", "R", "Y", "H"])


# ---------------------------------------------------------------------------------------------
# LayerNorm
# ---------------------------------------------------------------------------------------------


def layer_norm_kernel_fn(X, W, B, Y, eps, TM: ConstInt, TN: ConstInt, CHUNKED: ConstBool, HAS_W: ConstBool,
                         HAS_B: ConstBool, LAT: ConstInt, STORE_TMA: ConstBool):
    """``Y = (X - mean) * rsqrt(var + eps) * W + B`` over rows (biased variance, float32 stats)."""
    M = X.shape[0]
    N = X.shape[1]
    inv_n = 1.0 / N
    num_rb = ct.cdiv(M, TM)
    cols = ct.arange(TN, dtype=ct.int32).reshape((1, TN))
    if CHUNKED:
        nch = ct.cdiv(N, TN)
        for rb in range(ct.bid(0), num_rb, ct.num_blocks(0)):
            mean = ct.zeros((TM, 1), dtype=ct.float32)
            m2 = ct.zeros((TM, 1), dtype=ct.float32)
            for c in range(nch):
                x = _ld(X, (rb, c), (TM, TN), LAT).astype(ct.float32)
                done = c * TN  # columns merged so far
                cnt = min(TN, N - done)
                n_new = done + cnt
                cmean = ct.sum(x, axis=1, keepdims=True) * (1.0 / cnt)
                d = ct.where(cols + done < N, x - cmean, 0.0)
                cm2 = ct.sum(d * d, axis=1, keepdims=True)
                frac = cnt / n_new  # weight of this chunk in the merged mean
                delta = cmean - mean
                mean = mean + delta * frac
                m2 = m2 + cm2 + delta * delta * (done * frac)
            rstd = ct.rsqrt(m2 * inv_n + eps)
            for c in range(nch):
                x = _ld(X, (rb, c), (TM, TN), LAT).astype(ct.float32)
                w = _vec(W, c, TN, HAS_W, 1.0)
                b = _vec(B, c, TN, HAS_B, 0.0)
                ct.store(Y, (rb, c), ((x - mean) * rstd * w + b).astype(Y.dtype), allow_tma=STORE_TMA)
    else:
        w = _vec(W, 0, TN, HAS_W, 1.0)
        b = _vec(B, 0, TN, HAS_B, 0.0)
        for rb in range(ct.bid(0), num_rb, ct.num_blocks(0)):
            x = _ld(X, (rb, 0), (TM, TN), LAT).astype(ct.float32)
            mean = ct.sum(x, axis=1, keepdims=True) * inv_n
            d = ct.where(cols < N, x - mean, 0.0)  # padding columns stay out of the variance
            var = ct.sum(d * d, axis=1, keepdims=True) * inv_n
            rstd = ct.rsqrt(var + eps)
            ct.store(Y, (rb, 0), (d * rstd * w + b).astype(Y.dtype), allow_tma=STORE_TMA)


layer_norm_kernel = ct.kernel(layer_norm_kernel_fn)
layer_norm_kernel_i64 = int64_twin(layer_norm_kernel_fn, ["X", "Y"])


# ---------------------------------------------------------------------------------------------
# Spaces, plans, references
# ---------------------------------------------------------------------------------------------


def row_key(*arrays: Any, streams: int = 1) -> tuple[Hashable, bool]:
    """The part of a regime that fixes the row space of 2-D inputs (outputs are contiguous): the
    padded row ("chunked" for long rows) and whether every row tile can move by TMA."""
    n = arrays[0].shape[1]
    b = arrays[0].element_size()
    strides = [a.stride(0) if a.shape[0] > 1 else n for a in arrays] + [n]
    tma = all(tma_rows(n, st, b) for st in strides)
    return ("chunked" if row_regime(n, streams) == "chunked" else next_power_of_2(n)), tma


def row_space_for(streams: int):
    """``space_for(regime)`` of a row-wise family whose regimes start with :func:`row_key`."""

    def space_for(regime: Hashable) -> Space:
        row, tma = regime[0], regime[1]
        return rowwise_space(ROW_MAX_ELEMS * 2 if row == "chunked" else int(row), streams=streams, tma=tma)

    return space_for


def _row_tiles(cfg: Any, n: int) -> tuple[int, int, bool]:
    """``(TM, TN, CHUNKED)`` of a config for rows of ``n`` elements."""
    chunk = int(cfg.CHUNK)
    if chunk > 0:
        return 1, chunk, True
    return int(cfg.TM), next_power_of_2(n), False


def _grid(cfg: Any, m: int, tm: int, dev: int) -> tuple[int]:
    return persistent_grid(-(-m // tm), dev, cfg.occupancy, cfg.get("GRID_FRAC", 1.0))


def rms_norm_reference(x: Any, w: Any, y: Any, eps: float, has_w: bool) -> Any:
    """Torch reference of :func:`rms_norm_plan`'s output (float32 math, cast to ``y.dtype``)."""
    xf = x.float()
    out = xf * (xf.pow(2).mean(dim=-1, keepdim=True) + eps).rsqrt()
    if has_w:
        out = out * w.float()
    return out.to(y.dtype)


def rms_norm_plan(cfg: Any, x: Any, w: Any, y: Any, eps: float, has_w: bool) -> Launch:
    """Launch plan: ``y = rms_norm(x) * w`` for 2-D ``x`` and ``y`` (``w`` read iff ``has_w``)."""
    m, n = x.shape
    tm, tn, chunked = _row_tiles(cfg, n)
    kernel = rms_norm_kernel_i64 if needs_int64(x, y) else rms_norm_kernel
    return Launch(kernel, _grid(cfg, m, tm, x.get_device()),
                  (x, w, y, eps, tm, tn, chunked, has_w, cfg.LAT, cfg.STORE_TMA))


def rms_norm_residual_reference(x: Any, r: Any, w: Any, y: Any, h: Any, eps: float, has_w: bool) -> tuple:
    """Torch reference: ``(y, h)`` with ``h = (x + r)`` rounded to ``h.dtype``."""
    hh = (x.float() + r.float()).to(h.dtype)
    return rms_norm_reference(hh, w, y, eps, has_w), hh


def rms_norm_residual_plan(cfg: Any, x: Any, r: Any, w: Any, y: Any, h: Any, eps: float, has_w: bool) -> Launch:
    """Launch plan: ``h = x + r``; ``y = rms_norm(h) * w`` (2-D, writes ``y`` and ``h``)."""
    m, n = x.shape
    tm, tn, chunked = _row_tiles(cfg, n)
    kernel = rms_norm_residual_kernel_i64 if needs_int64(x, r, y, h) else rms_norm_residual_kernel
    return Launch(kernel, _grid(cfg, m, tm, x.get_device()),
                  (x, r, w, y, h, eps, tm, tn, chunked, has_w, cfg.LAT, cfg.STORE_TMA))


def layer_norm_reference(x: Any, w: Any, b: Any, y: Any, eps: float, has_w: bool, has_b: bool) -> Any:
    """Torch reference (float32 statistics, biased variance), cast to ``y.dtype``."""
    import torch

    n = x.shape[-1]
    out = torch.nn.functional.layer_norm(x.float(), (n,), w.float() if has_w else None,
                                         b.float() if has_b else None, eps)
    return out.to(y.dtype)


def layer_norm_plan(cfg: Any, x: Any, w: Any, b: Any, y: Any, eps: float, has_w: bool, has_b: bool) -> Launch:
    """Launch plan: ``y = layer_norm(x) * w + b`` for 2-D ``x`` and ``y``."""
    m, n = x.shape
    tm, tn, chunked = _row_tiles(cfg, n)
    kernel = layer_norm_kernel_i64 if needs_int64(x, y) else layer_norm_kernel
    return Launch(kernel, _grid(cfg, m, tm, x.get_device()),
                  (x, w, b, y, eps, tm, tn, chunked, has_w, has_b, cfg.LAT, cfg.STORE_TMA))


def _norm_tolerance(x: Any, *_: Any) -> dict:
    """Products of the input with float32 row statistics (a sum of ``N`` squares), rounded once:
    two ulps relative plus the float32 accumulation over the row (see :func:`tiletune.devices.verify.derived_tolerance`)."""
    return derived_tolerances(length=x.shape[-1])


def _layer_norm_tolerance(x: Any, *_: Any) -> dict:
    """As :func:`_norm_tolerance`, with 2 ulps of the output's RMS for the cancellation of
    ``(x - mean) * rstd * w`` against ``b`` (and of ``x`` against its mean)."""
    return derived_tolerances(length=x.shape[-1], atol_ulps=2.0)


RMS_NORM = LibraryOp("tiletune.rms_norm", row_space_for(1), rms_norm_plan,
                     reference=rms_norm_reference, writes=["y"], tolerance=_norm_tolerance,
                     buckets=rows_bucketed("x", "y"), fallback="reference")
RMS_NORM_RESIDUAL = LibraryOp("tiletune.rms_norm_residual", row_space_for(2), rms_norm_residual_plan,
                              reference=rms_norm_residual_reference, writes=["y", "h"], tolerance=_norm_tolerance,
                              buckets=rows_bucketed("x", "r", "y", "h"), fallback="reference")
# LayerNorm keeps x and x - mean live at once: it spills where RMSNorm does not (streams=2)
LAYER_NORM = LibraryOp("tiletune.layer_norm", row_space_for(2), layer_norm_plan,
                       reference=layer_norm_reference, writes=["y"], tolerance=_layer_norm_tolerance,
                       buckets=rows_bucketed("x", "y"), fallback="reference")


# ---------------------------------------------------------------------------------------------
# Public ops
# ---------------------------------------------------------------------------------------------


def _check_vector(op: str, name: str, v: Any, n: int) -> None:
    check_float(op, name, v)
    if v.dim() != 1 or v.shape[0] != n:
        raise ValueError(f"{op}(): '{name}' must have shape ({n},) to match the last dimension of the input, "
                         f"got {tuple(v.shape)}")


def _check_input(op: str, x: Any) -> None:
    check_float(op, "x", x)
    if x.dim() < 1:
        raise ValueError(f"{op}(): the input must have at least one dimension, got a 0-d tensor")
    if x.shape[-1] < 1:
        raise ValueError(f"{op}(): the normalized (last) dimension must not be empty, got shape {tuple(x.shape)}")


def _vector_arg(v: Any, like: Any) -> Any:
    """A weight/bias as the kernel reads it (contiguous), or a 1-element placeholder when absent (never
    read: the kernel's HAS_W / HAS_B constant is False; :func:`._scratch.placeholder`)."""
    if v is None:
        return placeholder(like.device, like.dtype, (1,))
    return v if v.stride(0) == 1 else v.contiguous()


def prepare_rms_norm(x: Any, weight: Any = None, eps: float = 1e-6) -> Prepared:
    """Views, output and tuned-op regime of :func:`rms_norm` (no checks, no launch)."""
    import torch

    x2 = as_rows(x)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    has_w = weight is not None
    return Prepared(RMS_NORM, (*row_key(x2), has_w), (x2, _vector_arg(weight, x2), y, float(eps), has_w),
                    y.view(x.shape))


def prepare_rms_norm_residual(x: Any, residual: Any, weight: Any = None, eps: float = 1e-6) -> Prepared:
    """Views, outputs and regime of :func:`rms_norm_residual` (no checks, no launch)."""
    import torch

    x2, r2 = as_rows(x), as_rows(residual)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    h = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    has_w = weight is not None
    return Prepared(RMS_NORM_RESIDUAL, (*row_key(x2, r2, streams=2), has_w),
                    (x2, r2, _vector_arg(weight, x2), y, h, float(eps), has_w), (y.view(x.shape), h.view(x.shape)))


def prepare_layer_norm(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Prepared:
    """Views, output and regime of :func:`layer_norm` (no checks, no launch)."""
    import torch

    x2 = as_rows(x)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    has_w, has_b = weight is not None, bias is not None
    return Prepared(LAYER_NORM, (*row_key(x2, streams=2), has_w, has_b),
                    (x2, _vector_arg(weight, x2), _vector_arg(bias, x2), y, float(eps), has_w, has_b),
                    y.view(x.shape))


@fast_op(route=custom_op_route("rms_norm"))
def rms_norm(x: Any, weight: Any = None, eps: float = 1e-6) -> Any:
    """RMSNorm over the last dimension: ``x * rsqrt(mean(x^2, -1) + eps) * weight``.

    Args:
        x: CUDA tensor ``[..., N]`` of bfloat16, float16 or float32.
        weight: ``[N]`` float tensor on the same device, or None.
        eps: added to the mean of squares.

    Returns:
        a new tensor shaped and typed like ``x``.
    """
    op = "rms_norm"
    _check_input(op, x)
    if weight is not None:
        _check_vector(op, "weight", weight, x.shape[-1])
    check_device(op, x=x, weight=weight)
    if x.numel() == 0:
        return x.new_empty(x.shape)
    return prepare_rms_norm(x, weight, eps).run()


@fast_op(route=custom_op_route("rms_norm_residual"))
def rms_norm_residual(x: Any, residual: Any, weight: Any = None, eps: float = 1e-6) -> tuple[Any, Any]:
    """Fused residual add and RMSNorm: ``h = x + residual``, ``y = rms_norm(h, weight, eps)``.

    Args:
        x, residual: CUDA tensors of one shape ``[..., N]`` and one dtype (bf16, fp16 or fp32).
        weight: ``[N]`` float tensor or None.

    Returns:
        ``(y, h)``: the normalized output and the new residual stream (``x + residual`` rounded to
        the input dtype), both new tensors shaped like ``x``.
    """
    op = "rms_norm_residual"
    _check_input(op, x)
    check_float(op, "residual", residual, like=x)
    if tuple(residual.shape) != tuple(x.shape):
        raise ValueError(f"{op}(): 'residual' must have the shape of 'x' {tuple(x.shape)}, got {tuple(residual.shape)}")
    if weight is not None:
        _check_vector(op, "weight", weight, x.shape[-1])
    check_device(op, x=x, residual=residual, weight=weight)
    if x.numel() == 0:
        return x.new_empty(x.shape), x.new_empty(x.shape)
    return prepare_rms_norm_residual(x, residual, weight, eps).run()


@fast_op(route=custom_op_route("layer_norm"))
def layer_norm(x: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    """LayerNorm over the last dimension, like ``torch.nn.functional.layer_norm(x, (N,), weight, bias, eps)``.

    Args:
        x: CUDA tensor ``[..., N]`` of bfloat16, float16 or float32.
        weight, bias: ``[N]`` float tensors on the same device, or None.
        eps: added to the (biased) variance.

    Returns:
        a new tensor shaped and typed like ``x``.
    """
    op = "layer_norm"
    _check_input(op, x)
    if weight is not None:
        _check_vector(op, "weight", weight, x.shape[-1])
    if bias is not None:
        _check_vector(op, "bias", bias, x.shape[-1])
    check_device(op, x=x, weight=weight, bias=bias)
    if x.numel() == 0:
        return x.new_empty(x.shape)
    return prepare_layer_norm(x, weight, bias, eps).run()
