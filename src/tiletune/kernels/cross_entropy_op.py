"""Autotuned cross-entropy loss over large vocabularies in cuTile, with the gradient in the same pass.

Public op::

    loss = cross_entropy(logits, target)                          # like F.cross_entropy(..., "mean")
    loss, grad = cross_entropy(logits, target, return_grad=True)  # grad = d loss / d logits

``logits``: CUDA ``[..., V]`` tensor of bfloat16, float16 or float32 (V up to 256k and beyond);
``target``: integer class indices of shape ``logits.shape[:-1]``; entries equal to
``ignore_index`` (default -100) count neither in the loss nor in the mean. The loss is a float32
scalar tensor; ``grad`` has the logits' shape and dtype and equals
``(softmax(logits) - onehot(target)) / n_valid`` on valid rows and 0 on ignored ones.

Kernel: persistent over rows; each row is walked in ``CHUNK``-column pieces with an *online*
logsumexp (running max, running sum rescaled on every new max); the target's logit is one gathered
element, so the loss needs one read of the logits and two block reductions per chunk. With
``return_grad`` a second pass over the same row writes the gradient (the re-read mostly hits L2).
Every block first counts the valid targets (a few KB from L2) so each row's loss and gradient are
scaled by ``1 / n_valid`` in the kernel; the op returns ``loss_rows.sum()``.

Differences from torch: no ``weight``/``label_smoothing``; out-of-range targets are not checked
(torch raises a device-side assert; here the row's loss is its logsumexp); when every target is
ignored the loss is 0 (torch: nan).
"""

from __future__ import annotations


import math
from typing import Any

import cuda.tile as ct

from ..backends.base import Launch
from ..fastcall import custom_op_route, fast_op
from ._scratch import placeholder
from ..space import Space
from ..templates import chunked_row_space
from .library_op import LibraryOp
from ._membound import Prepared, check_device, check_float, check_tensor, int64_twin, needs_int64, persistent_grid
from ._membound import rows_bucketed
from ._tile_ops import load_zero_padded as _ld
from ..verify import derived_tolerances, eps, exp_range

__all__ = [
    "CE_GRAD",
    "CE_LOSS",
    "cross_entropy",
    "cross_entropy_grad_plan",
    "cross_entropy_grad_reference",
    "cross_entropy_plan",
    "cross_entropy_reference",
    "cross_entropy_rows",
    "prepare_cross_entropy",
]

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
LOG2E = 1.4426950408889634
COUNT_TILE = 1024  # targets per load when counting the valid ones



def cross_entropy_kernel_fn(L, T, LOSS, G, ignore_index, TV: ConstInt, WITH_GRAD: ConstBool, EVEN: ConstBool,
                            LAT: ConstInt, STORE_TMA: ConstBool):
    """Per-row ``LOSS[i] = (logsumexp(L[i]) - L[i, T[i]]) / n_valid`` and, with ``WITH_GRAD``,
    ``G[i] = (softmax(L[i]) - onehot(T[i])) / n_valid`` (0 on rows whose target is ``ignore_index``).

    ``TV``: columns per chunk; ``EVEN``: ``V % TV == 0`` (no padding columns to mask).
    """
    M = L.shape[0]
    V = L.shape[1]
    nch = ct.cdiv(V, TV)
    cols = ct.arange(TV, dtype=ct.int32).reshape((1, TV))

    # n_valid: every block counts the valid targets itself (M * 8 bytes, read from L2)
    cidx = ct.arange(COUNT_TILE, dtype=ct.int32).reshape((1, COUNT_TILE))
    cnt = ct.zeros((1, COUNT_TILE), dtype=ct.float32)
    for i in range(ct.cdiv(M, COUNT_TILE)):
        t = ct.load(T, (i,), shape=(COUNT_TILE,), padding_mode=ct.PaddingMode.ZERO).reshape((1, COUNT_TILE))
        ok = (t != ignore_index) & (cidx + i * COUNT_TILE < M)
        cnt = cnt + ct.where(ok, 1.0, 0.0)
    inv_count = 1.0 / ct.maximum(ct.sum(cnt, axis=1, keepdims=True), 1.0)

    for row in range(ct.bid(0), M, ct.num_blocks(0)):
        tgt = ct.load(T, (row,), shape=(1,)).reshape((1, 1))
        scale = ct.where(tgt != ignore_index, inv_count, 0.0)
        tgt32 = tgt.astype(ct.int32)
        m = ct.full((1, 1), -math.inf, dtype=ct.float32)
        s = ct.zeros((1, 1), dtype=ct.float32)
        # the target's logit: one gathered element (0 for ignored or out-of-range targets)
        tl = ct.gather(L, (row, tgt32)).astype(ct.float32)
        for c in range(nch):
            x = _ld(L, (row, c), (1, TV), LAT).astype(ct.float32)
            if not EVEN:
                x = ct.where(cols + c * TV < V, x, -math.inf)
            m_new = ct.maximum(m, ct.max(x, axis=1, keepdims=True))
            s = s * ct.exp2((m - m_new) * LOG2E, flush_to_zero=True) + ct.sum(
                ct.exp2((x - m_new) * LOG2E, flush_to_zero=True), axis=1, keepdims=True)
            m = m_new
        lse = m + ct.log(s)
        ct.store(LOSS, (row,), ((lse - tl) * scale).reshape((1,)), allow_tma=False)
        if WITH_GRAD:
            for c in range(nch):
                x = _ld(L, (row, c), (1, TV), LAT).astype(ct.float32)
                cc = cols + c * TV
                p = ct.exp2((x - lse) * LOG2E, flush_to_zero=True) * scale
                g = p - ct.where(cc == tgt32, scale, 0.0)
                ct.store(G, (row, c), g.astype(G.dtype), allow_tma=STORE_TMA)


cross_entropy_kernel = ct.kernel(cross_entropy_kernel_fn)
cross_entropy_kernel_i64 = int64_twin(cross_entropy_kernel_fn, ["L", "G"])


# ---------------------------------------------------------------------------------------------
# Spaces, plans, references
# ---------------------------------------------------------------------------------------------


def loss_space() -> Space:
    """Loss only (one read): chunk width {4096, 8192, 16384} x occupancy {1, 2, 4}, at most 32768 chunk
    values per SM (8 pairs), loads with ``LAT=10`` (without the hint, fp16/fp32 4096-column chunks
    spilled in the offline probe). On the H200 the probe's best (8192 columns at occupancy 4) ran
    12% faster than the best pair of the older 16384-values-per-SM bound."""
    return chunked_row_space(0, chunks=(4096, 8192, 16384), lat=(10,), store_tma=(False,), values_per_sm=32768)


def grad_space() -> Space:
    """Loss and gradient (the row is read twice): chunks {8192, 16384} at occupancy 2, 4 or 8 worker
    warps, TMA or plain gradient stores: 8 configs. On the H200 the full grid (``GRID_FRAC`` 1) beat
    0.25 and 0.5 of it in every probed pair, so fewer rows in flight is no longer searched."""
    return chunked_row_space(0, chunks=(8192, 16384), lat=(10,), store_tma=(False, True), occupancies=(2,),
                             values_per_sm=32768, worker_warps=(4, 8))


def _valid_scale(target: Any, ignore_index: int) -> tuple[Any, Any]:
    valid = target != ignore_index
    return valid, 1.0 / valid.sum().clamp(min=1).float()


def _loss_rows(logits: Any, target: Any, loss: Any, ignore_index: int) -> Any:
    import torch

    valid, inv = _valid_scale(target, ignore_index)
    ce = torch.nn.functional.cross_entropy(logits.float(), target.long().clamp(min=0), reduction="none")
    return torch.where(valid, ce * inv, torch.zeros_like(ce)).to(loss.dtype)


def cross_entropy_reference(logits: Any, target: Any, loss: Any, placeholder: Any, ignore_index: int) -> Any:
    """Expected output of the loss-only plan: per-row ``CE_i / n_valid`` (0 on ignored rows), float32."""
    return _loss_rows(logits, target, loss, ignore_index)


def cross_entropy_grad_reference(logits: Any, target: Any, loss: Any, grad: Any, ignore_index: int) -> tuple:
    """Expected ``(loss_rows, grad)`` of the fused loss + gradient plan."""
    import torch

    valid, inv = _valid_scale(target, ignore_index)
    rows = _loss_rows(logits, target, loss, ignore_index)
    p = logits.float().softmax(dim=-1)
    onehot = torch.zeros_like(p).scatter_(1, target.long().clamp(min=0).unsqueeze(1), 1.0)
    g = (p - onehot) * (valid.float() * inv).unsqueeze(1)
    return rows, g.to(grad.dtype)


def _launch(cfg: Any, logits: Any, target: Any, loss: Any, grad: Any, ignore_index: int, with_grad: bool) -> Launch:
    m, v = logits.shape
    tv = int(cfg.CHUNK)
    grid = persistent_grid(m, logits.get_device(), cfg.occupancy, cfg.get("GRID_FRAC", 1.0))
    big = needs_int64(logits, grad) if with_grad else needs_int64(logits)
    kernel = cross_entropy_kernel_i64 if big else cross_entropy_kernel
    return Launch(kernel, grid, (logits, target, loss, grad, ignore_index, tv, with_grad, v % tv == 0,
                                 cfg.LAT, cfg.STORE_TMA))


def cross_entropy_plan(cfg: Any, logits: Any, target: Any, loss: Any, placeholder: Any, ignore_index: int) -> Launch:
    """Launch plan, loss only: writes ``loss[i] = CE_i / n_valid`` for 2-D ``logits``."""
    return _launch(cfg, logits, target, loss, placeholder, ignore_index, False)


def cross_entropy_grad_plan(cfg: Any, logits: Any, target: Any, loss: Any, grad: Any, ignore_index: int) -> Launch:
    """Launch plan, loss and gradient in one kernel."""
    return _launch(cfg, logits, target, loss, grad, ignore_index, True)


def _tolerance(logits: Any, target: Any, loss: Any, grad: Any, ignore_index: int) -> dict:
    """Gradients ``(p - onehot) / n`` (logits' dtype) are O(1/(rows * V)) with no cancellation except
    at the target column, whose float32 error is a few ulps of ``1/n``: two ulps relative plus the
    float32 error of a row sum of ``V`` terms and of ``exp(x - lse)`` over the row's spread of logits
    plus ``log V``, no slack tied to the RMS (the target column dominates it), ``atol = 4 eps32 / n``.
    Losses ``(lse - x_t) / n`` (float32, ``"output:0"``) cancel ``lse`` against ``x_t``: the same
    plus ``atol = 4 eps32 (max|x| + log V + 1) / n`` (float32 ulps of the terms)."""
    import torch

    v = logits.shape[-1]
    er = exp_range(logits) + math.log(max(2, v))
    n_valid = max(1, int((target != ignore_index).sum()))
    e32 = eps(torch.float32)
    grad_tol = {d: t._replace(atol=4.0 * e32 / n_valid)
                for d, t in derived_tolerances(length=v, atol_ulps=0.0, exp_range=er).items()}
    xmax = float(logits.abs().amax()) if logits.numel() else 0.0
    loss_tol = {"float32": grad_tol["float32"]._replace(atol=4.0 * e32 * (xmax + math.log(max(2, v)) + 1.0) / n_valid)}
    return {**grad_tol, "output:0": loss_tol}


_TOL = _tolerance

CE_LOSS = LibraryOp("tiletune.cross_entropy", lambda regime: loss_space(), cross_entropy_plan,
                    reference=cross_entropy_reference, writes=["loss"], tolerance=_TOL,
                    buckets=rows_bucketed("logits", "target", "loss"))
CE_GRAD = LibraryOp("tiletune.cross_entropy_grad", lambda regime: grad_space(), cross_entropy_grad_plan,
                    reference=cross_entropy_grad_reference, writes=["loss", "grad"], tolerance=_TOL,
                    buckets=rows_bucketed("logits", "target", "loss", "grad"))

_INT_TARGETS = ("torch.int64", "torch.int32")


@fast_op(route=custom_op_route("cross_entropy"), learn=False)
def cross_entropy(logits: Any, target: Any, return_grad: bool = False, ignore_index: int = -100) -> Any:
    """Mean cross-entropy of ``logits`` ``[..., V]`` against class indices ``target`` ``[...]``.

    Args:
        logits: CUDA tensor of bfloat16, float16 or float32; the last dimension is the vocabulary.
        target: int64 or int32 tensor of shape ``logits.shape[:-1]`` on the same device.
        return_grad: also return ``d loss / d logits`` (written in the same pass).
        ignore_index: target value whose rows are skipped (and not counted in the mean).

    Returns:
        ``loss`` (a float32 scalar tensor), or ``(loss, grad)`` with ``return_grad=True``.
    """
    loss_rows, grad = cross_entropy_rows(logits, target, bool(return_grad), ignore_index)
    loss = loss_rows.sum()
    return (loss, grad) if return_grad else loss


@fast_op()
def cross_entropy_rows(logits: Any, target: Any, return_grad: bool = False, ignore_index: int = -100) -> tuple:
    """The launch of :func:`cross_entropy` (checks included): ``(loss_rows, grad or None)`` with
    ``loss = loss_rows.sum()``; one launch, so repeated calls replay a recipe (:mod:`tiletune.fastcall`)."""
    op = "cross_entropy"
    check_float(op, "logits", logits)
    check_tensor(op, "target", target)
    if str(target.dtype) not in _INT_TARGETS:
        raise TypeError(f"{op}(): 'target' must hold class indices as int64 or int32, got "
                        f"{str(target.dtype).replace('torch.', '')}")
    if logits.dim() < 1 or logits.shape[-1] < 1:
        raise ValueError(f"{op}(): 'logits' must have a non-empty class (last) dimension, got {tuple(logits.shape)}")
    if tuple(target.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"{op}(): 'target' must have shape {tuple(logits.shape[:-1])} (logits without the class "
                         f"dimension), got {tuple(target.shape)}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise TypeError(f"{op}(): 'ignore_index' must be an int, got {type(ignore_index).__name__}")
    check_device(op, logits=logits, target=target)
    if logits.numel() == 0:
        import torch

        rows = torch.zeros((0,), dtype=torch.float32, device=logits.device)
        return rows, (logits.new_zeros(logits.shape) if return_grad else None)
    return prepare_cross_entropy(logits, target, return_grad, ignore_index).run()


def prepare_cross_entropy(logits: Any, target: Any, return_grad: bool = False, ignore_index: int = -100) -> Prepared:
    """Views, outputs and tuned op of :func:`cross_entropy` (no checks, no launch).

    ``result`` is ``(loss_rows, grad)`` (``grad`` None without ``return_grad``); the loss is
    ``loss_rows.sum()``.
    """
    import torch

    v = logits.shape[-1]
    l2 = logits.reshape(-1, v)
    if l2.stride(-1) != 1 or (l2.shape[0] > 1 and l2.stride(0) < v):
        l2 = l2.contiguous()
    t1 = target.reshape(-1)
    if t1.stride(0) != 1:
        t1 = t1.contiguous()
    m = l2.shape[0]
    loss_rows = torch.empty((m,), dtype=torch.float32, device=logits.device)
    if return_grad:
        grad = torch.empty((m, v), dtype=logits.dtype, device=logits.device)
        return Prepared(CE_GRAD, "grad", (l2, t1, loss_rows, grad, int(ignore_index)),
                        (loss_rows, grad.view(logits.shape)))
    return Prepared(CE_LOSS, "loss", (l2, t1, loss_rows, _grad_placeholder(l2), int(ignore_index)), (loss_rows, None))


def _grad_placeholder(like: Any) -> Any:
    """The gradient argument of the loss-only kernel (never written: ``WRITE_GRAD`` is off), cached
    per device and dtype so a recipe may keep it (:func:`._scratch.placeholder`)."""
    return placeholder(like.device, like.dtype, (1, 1))

