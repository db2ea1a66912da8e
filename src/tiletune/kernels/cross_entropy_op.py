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
scaled by ``1 / n_valid`` in the kernel. The mean is finished in the same launch: each block stores
the sum of its rows' losses to a scratch slot and counts its arrival on a counter; the last block to
arrive sums the slots in block order (the result does not depend on which block came last), writes
the loss and puts the counter back to zero. Every load is a plain one (no TMA): with TMA logit loads
and the arrival counter in one kernel, cuda-tile 1.7.0 / tileiras 13.4 computed wrong losses at several
(shape, config) pairs, and never without (``benchmarks/probe_ce_tail.py``, ``docs/GPU-NOTES.md``).
One launch per call, so a call costs one launch and one allocation on the host
(:mod:`tiletune.kernels.fastcall`), like a bare ``ct.launch``.

Differences from torch: no ``weight``/``label_smoothing``; out-of-range targets are not checked
(torch raises a device-side assert; here the row's loss is its logsumexp); when every target is
ignored the loss is 0 (torch: nan).
"""

from __future__ import annotations


import math
from typing import Any

import cuda.tile as ct

from tiletune.devices.backends.base import Launch
from tiletune.kernels.fastcall import custom_op_route, fast_op
from tiletune.kernels._scratch import on_default_stream, placeholder, reduction_scratch
from tiletune.space.spaces import Space
from tiletune.space.templates import cross_entropy_space, next_power_of_2
from tiletune.kernels.library_op import LibraryOp
from tiletune.kernels._membound import Prepared, check_device, check_float, check_tensor, int64_twin, needs_int64, persistent_grid
from tiletune.kernels._membound import rows_bucketed, sm_count
from tiletune.kernels._tile_ops import load_zero_padded_plain as _ld
from tiletune.devices.verify import SCRATCH, derived_tolerances, eps, exp_range

__all__ = [
    "CE_GRAD",
    "CE_LOSS",
    "cross_entropy",
    "cross_entropy_grad_plan",
    "cross_entropy_grad_reference",
    "cross_entropy_plan",
    "cross_entropy_reference",
    "partial_slots",
    "prepare_cross_entropy",
]

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
LOG2E = 1.4426950408889634
COUNT_TILE = 1024  # targets per load when counting the valid ones
PART_TILE = 1024  # block partials per load when the last block sums them
#: occupancy the scratch of block partials is sized for (``sm_count * MAX_OCCUPANCY`` slots at least)
MAX_OCCUPANCY = 32
#: SMs the scratch is sized for off a GPU (meta and CPU tensors: offline compiles, tests)
NOMINAL_SMS = 256



def _online_lse_step(x, m, s, c, cols, V, TV, EVEN):
    """One chunk ``x`` (float32, ``(1, TV)``, chunk ``c``) of the online logsumexp: the new running max
    and the running sum rescaled to it (padding columns masked to ``-inf`` unless ``EVEN``)."""
    if not EVEN:
        x = ct.where(cols + c * TV < V, x, -math.inf)
    m_new = ct.maximum(m, ct.max(x, axis=1, keepdims=True))
    s = s * ct.exp2((m - m_new) * LOG2E, flush_to_zero=True) + ct.sum(
        ct.exp2((x - m_new) * LOG2E, flush_to_zero=True), axis=1, keepdims=True)
    return m_new, s


def cross_entropy_kernel_fn(L, T, LOSS, G, PART, SEM, ignore_index, TV: ConstInt, WITH_GRAD: ConstBool,
                            EVEN: ConstBool, LAT: ConstInt, STORE_TMA: ConstBool, PREFETCH: ConstBool):
    """``LOSS[0] = sum_i (logsumexp(L[i]) - L[i, T[i]]) / n_valid`` over the rows whose target is not
    ``ignore_index`` and, with ``WITH_GRAD``, ``G[i] = (softmax(L[i]) - onehot(T[i])) / n_valid`` (0 on
    ignored rows), in one launch.

    ``TV``: columns per chunk; ``EVEN``: ``V % TV == 0`` (no padding columns to mask); ``PREFETCH``:
    the logsumexp pass loads chunk ``c + 1`` before it reduces chunk ``c`` (two chunks in registers:
    what TMA's pipeline would overlap, for blocks that stream long rows alone). ``PART``:
    float32 scratch of at least ``num_blocks`` slots; ``SEM``: one int32 counter, zero on entry and
    left zero on exit. Block ``b`` stores the sum of its rows' losses to ``PART[b]`` (a generic store,
    no TMA, so the acquire-release atomic below orders it) and increments ``SEM[0]``; the block that
    sees ``num_blocks - 1`` there sums ``PART[0:num_blocks]`` in block order, stores it to ``LOSS`` and
    resets the counter.
    """
    M = L.shape[0]
    V = L.shape[1]
    nch = ct.cdiv(V, TV)
    cols = ct.arange(TV, dtype=ct.int32).reshape((1, TV))

    # n_valid: every block counts the valid targets itself (M * 8 bytes, read from L2)
    cidx = ct.arange(COUNT_TILE, dtype=ct.int32).reshape((1, COUNT_TILE))
    cnt = ct.zeros((1, COUNT_TILE), dtype=ct.float32)
    for i in range(ct.cdiv(M, COUNT_TILE)):
        t = ct.load(T, (i,), shape=(COUNT_TILE,), padding_mode=ct.PaddingMode.ZERO,
                    allow_tma=False).reshape((1, COUNT_TILE))
        ok = (t != ignore_index) & (cidx + i * COUNT_TILE < M)
        cnt = cnt + ct.where(ok, 1.0, 0.0)
    inv_count = 1.0 / ct.maximum(ct.sum(cnt, axis=1, keepdims=True), 1.0)

    acc = ct.zeros((1, 1), dtype=ct.float32)
    for row in range(ct.bid(0), M, ct.num_blocks(0)):
        tgt = ct.load(T, (row,), shape=(1,), allow_tma=False).reshape((1, 1))
        scale = ct.where(tgt != ignore_index, inv_count, 0.0)
        tgt32 = tgt.astype(ct.int32)
        m = ct.full((1, 1), -math.inf, dtype=ct.float32)
        s = ct.zeros((1, 1), dtype=ct.float32)
        # the target's logit: one gathered element (0 for ignored or out-of-range targets)
        tl = ct.gather(L, (row, tgt32)).astype(ct.float32)
        if PREFETCH:
            xn = _ld(L, (row, 0), (1, TV), LAT)
            for c in range(nch):
                x = xn.astype(ct.float32)
                xn = _ld(L, (row, c + 1), (1, TV), LAT)  # past the last chunk: all padding, never used
                m, s = _online_lse_step(x, m, s, c, cols, V, TV, EVEN)
        else:
            for c in range(nch):
                m, s = _online_lse_step(_ld(L, (row, c), (1, TV), LAT).astype(ct.float32), m, s, c, cols, V, TV,
                                        EVEN)
        lse = m + ct.log(s)
        acc = acc + ct.where(tgt != ignore_index, (lse - tl) * scale, 0.0)
        if WITH_GRAD:
            for c in range(nch):
                x = _ld(L, (row, c), (1, TV), LAT).astype(ct.float32)
                cc = cols + c * TV
                p = ct.exp2((x - lse) * LOG2E, flush_to_zero=True) * scale
                g = p - ct.where(cc == tgt32, scale, 0.0)
                ct.store(G, (row, c), g.astype(G.dtype), allow_tma=STORE_TMA)

    # the mean, in this launch: the last block to arrive sums every block's partial in block order
    nb = ct.num_blocks(0)
    ct.store(PART, (ct.bid(0),), acc.reshape((1,)), allow_tma=False)
    arrived = ct.atomic_add(SEM, 0, 1, memory_order=ct.MemoryOrder.ACQ_REL, memory_scope=ct.MemoryScope.DEVICE)
    if arrived == nb - 1:
        pidx = ct.arange(PART_TILE, dtype=ct.int32).reshape((1, PART_TILE))
        total = ct.zeros((1, PART_TILE), dtype=ct.float32)
        for i in range(ct.cdiv(nb, PART_TILE)):
            part = ct.load(PART, (i,), shape=(PART_TILE,), padding_mode=ct.PaddingMode.ZERO,
                           allow_tma=False).reshape((1, PART_TILE))
            total = total + ct.where(pidx + i * PART_TILE < nb, part, 0.0)
        ct.store(LOSS, (0,), ct.sum(total, axis=1), allow_tma=False)
        ct.atomic_xchg(SEM, 0, 0, memory_order=ct.MemoryOrder.RELAXED, memory_scope=ct.MemoryScope.DEVICE)


cross_entropy_kernel = ct.kernel(cross_entropy_kernel_fn)
cross_entropy_kernel_i64 = int64_twin(cross_entropy_kernel_fn, ["L", "G"])


# ---------------------------------------------------------------------------------------------
# Spaces, plans, references
# ---------------------------------------------------------------------------------------------


def loss_space() -> Space:
    """The loss-only op's space: :func:`tiletune.space.templates.cross_entropy_space` ``("loss")``."""
    return cross_entropy_space("loss")


def grad_space() -> Space:
    """The loss + gradient op's space: :func:`tiletune.space.templates.cross_entropy_space` ``("grad")``."""
    return cross_entropy_space("grad")


def _valid_scale(target: Any, ignore_index: int) -> tuple[Any, Any]:
    valid = target != ignore_index
    return valid, 1.0 / valid.sum().clamp(min=1).float()


def _mean_loss(logits: Any, target: Any, ignore_index: int) -> Any:
    """``F.cross_entropy`` in float32 over the valid rows, 0 when none is valid, as a ``(1,)`` tensor."""
    import torch

    valid, inv = _valid_scale(target, ignore_index)
    ce = torch.nn.functional.cross_entropy(logits.float(), target.long().clamp(min=0), reduction="none")
    return (torch.where(valid, ce, torch.zeros_like(ce)).sum() * inv).reshape(1)


def cross_entropy_reference(logits: Any, target: Any, loss: Any, placeholder: Any, part: Any, sem: Any,
                            ignore_index: int) -> tuple:
    """Expected outputs of the loss-only plan: the mean loss (float32, shape ``(1,)``), the block
    partials (scratch: :data:`~tiletune.devices.verify.SCRATCH`) and the counter back at zero."""
    import torch

    return _mean_loss(logits, target, ignore_index).to(loss.dtype), SCRATCH, torch.zeros_like(sem)


def cross_entropy_grad_reference(logits: Any, target: Any, loss: Any, grad: Any, part: Any, sem: Any,
                                 ignore_index: int) -> tuple:
    """Expected ``(loss, grad, partials, counter)`` of the fused loss + gradient plan (partials:
    :data:`~tiletune.devices.verify.SCRATCH`)."""
    import torch

    valid, inv = _valid_scale(target, ignore_index)
    p = logits.float().softmax(dim=-1)
    onehot = torch.zeros_like(p).scatter_(1, target.long().clamp(min=0).unsqueeze(1), 1.0)
    g = (p - onehot) * (valid.float() * inv).unsqueeze(1)
    return (_mean_loss(logits, target, ignore_index).to(loss.dtype), g.to(grad.dtype), SCRATCH,
            torch.zeros_like(sem))


def _launch(cfg: Any, logits: Any, target: Any, loss: Any, grad: Any, part: Any, sem: Any, ignore_index: int,
            with_grad: bool) -> Launch:
    m, v = logits.shape
    tv = int(cfg.CHUNK)
    grid = persistent_grid(m, logits.get_device(), cfg.occupancy, cfg.get("GRID_FRAC", 1.0))
    if grid[0] > part.shape[0]:
        raise ValueError(f"cross_entropy: {grid[0]} blocks need as many partial slots, the scratch has "
                         f"{part.shape[0]} (occupancy {cfg.occupancy} above {MAX_OCCUPANCY}?)")
    big = needs_int64(logits, grad) if with_grad else needs_int64(logits)
    kernel = cross_entropy_kernel_i64 if big else cross_entropy_kernel
    return Launch(kernel, grid, (logits, target, loss, grad, part, sem, ignore_index, tv, with_grad, v % tv == 0,
                                 cfg.LAT, cfg.STORE_TMA, bool(cfg.get("PREFETCH", False))))


def cross_entropy_plan(cfg: Any, logits: Any, target: Any, loss: Any, placeholder: Any, part: Any, sem: Any,
                       ignore_index: int) -> Launch:
    """Launch plan, loss only: writes the mean loss to ``loss`` (``(1,)``) for 2-D ``logits``."""
    return _launch(cfg, logits, target, loss, placeholder, part, sem, ignore_index, False)


def cross_entropy_grad_plan(cfg: Any, logits: Any, target: Any, loss: Any, grad: Any, part: Any, sem: Any,
                            ignore_index: int) -> Launch:
    """Launch plan, loss and gradient in one kernel."""
    return _launch(cfg, logits, target, loss, grad, part, sem, ignore_index, True)


def _tolerance(logits: Any, target: Any, loss: Any, grad: Any, part: Any, sem: Any, ignore_index: int) -> dict:
    """Gradients ``(p - onehot) / n`` (logits' dtype) are O(1/(rows * V)) with no cancellation except
    at the target column, whose float32 error is a few ulps of ``1/n``: two ulps relative plus the
    float32 error of a row sum of ``V`` terms and of ``exp(x - lse)`` over the row's spread of logits
    plus ``log V``, no slack tied to the RMS (the target column dominates it), ``atol = 4 eps32 / n``.
    The loss (float32, ``"output:0"``) is a sum of ``n`` row terms ``(lse - x_t) / n`` that each cancel
    ``lse`` against ``x_t``: per term the same bound plus ``4 eps32 (max|x| + log V + 1) / n`` (float32
    ulps of the terms), so ``atol = 4 eps32 (max|x| + log V + 1)`` over the sum, and the float32
    rounding of a sum of ``rows`` non-negative terms, ``(2 + 4 sqrt(rows)) eps32`` relative."""
    import torch

    v = logits.shape[-1]
    er = exp_range(logits) + math.log(max(2, v))
    n_valid = max(1, int((target != ignore_index).sum()))
    e32 = eps(torch.float32)
    grad_tol = {d: t._replace(atol=4.0 * e32 / n_valid)
                for d, t in derived_tolerances(length=v, atol_ulps=0.0, exp_range=er).items()}
    xmax = float(logits.abs().amax()) if logits.numel() else 0.0
    base = grad_tol["float32"]
    loss_tol = {"float32": base._replace(rtol=base.rtol + (2.0 + 4.0 * math.sqrt(logits.shape[0])) * e32,
                                         atol=4.0 * e32 * (xmax + math.log(max(2, v)) + 1.0))}
    return {**grad_tol, "output:0": loss_tol}


_TOL = _tolerance

CE_LOSS = LibraryOp("tiletune.cross_entropy", lambda regime: loss_space(), cross_entropy_plan,
                    reference=cross_entropy_reference, writes=["loss"], inplace=["part", "sem"], tolerance=_TOL,
                    buckets=rows_bucketed("logits", "target"))
CE_GRAD = LibraryOp("tiletune.cross_entropy_grad", lambda regime: grad_space(), cross_entropy_grad_plan,
                    reference=cross_entropy_grad_reference, writes=["loss", "grad"], inplace=["part", "sem"],
                    tolerance=_TOL, buckets=rows_bucketed("logits", "target", "grad"))

_INT_TARGETS = ("torch.int64", "torch.int32")


@fast_op(route=custom_op_route("cross_entropy"), precheck=on_default_stream)
def cross_entropy(logits: Any, target: Any, return_grad: bool = False, ignore_index: int = -100) -> Any:
    """Mean cross-entropy of ``logits`` ``[..., V]`` against class indices ``target`` ``[...]``, in one launch.

    Args:
        logits: CUDA tensor of bfloat16, float16 or float32; the last dimension is the vocabulary.
        target: int64 or int32 tensor of shape ``logits.shape[:-1]`` on the same device.
        return_grad: also return ``d loss / d logits`` (written in the same pass).
        ignore_index: target value whose rows are skipped (and not counted in the mean).

    Returns:
        ``loss`` (a float32 scalar tensor), or ``(loss, grad)`` with ``return_grad=True``.
    """
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

        loss = torch.zeros((), dtype=torch.float32, device=logits.device)
        return (loss, logits.new_zeros(logits.shape)) if return_grad else loss
    return prepare_cross_entropy(logits, target, bool(return_grad), ignore_index).run()


def partial_slots(device: Any) -> int:
    """Slots of the block-partials scratch on ``device``: a power of two of at least
    ``sm_count * MAX_OCCUPANCY`` (off a GPU: as for :data:`NOMINAL_SMS`), one size per device so it
    never changes a key."""
    sms = NOMINAL_SMS
    if getattr(device, "type", "cuda") == "cuda":
        import torch

        sms = sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return max(PART_TILE, next_power_of_2(sms * MAX_OCCUPANCY))


def prepare_cross_entropy(logits: Any, target: Any, return_grad: bool = False, ignore_index: int = -100) -> Prepared:
    """Views, outputs, scratch and tuned op of :func:`cross_entropy` (no checks, no launch).

    ``result`` is the loss (a float32 0-d tensor), or ``(loss, grad)`` with ``return_grad``.
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
    loss = torch.empty((), dtype=torch.float32, device=logits.device)
    part, sem = reduction_scratch(logits.device, partial_slots(logits.device))
    if return_grad:
        grad = torch.empty((m, v), dtype=logits.dtype, device=logits.device)
        return Prepared(CE_GRAD, "grad", (l2, t1, loss.view(1), grad, part, sem, int(ignore_index)),
                        (loss, grad.view(logits.shape)))
    return Prepared(CE_LOSS, "loss", (l2, t1, loss.view(1), _grad_placeholder(l2), part, sem, int(ignore_index)),
                    loss)


def _grad_placeholder(like: Any) -> Any:
    """The gradient argument of the loss-only kernel (never written: ``WITH_GRAD`` is off), cached
    per device and dtype so a recipe may keep it (:func:`._scratch.placeholder`)."""
    return placeholder(like.device, like.dtype, (1, 1))
