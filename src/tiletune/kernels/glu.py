"""Autotuned gated activations in cuTile: SwiGLU and GeGLU, ``[..., 2H] -> [..., H]``.

Public ops::

    y = swiglu(x)                      # silu(x[..., :H]) * x[..., H:]
    y = geglu(x, approximate="none")   # gelu(x[..., :H], approximate) * x[..., H:]

The first half of the last dimension is the gate, the second half the linear ("up") part, as in
fused ``gate_up`` projections (vLLM's ``silu_and_mul`` / ``gelu_and_mul`` convention).
``approximate`` is ``"none"`` (erf GELU, torch's default; erf evaluated with the
Abramowitz-Stegun 7.1.26 rational approximation, |error| < 1.5e-7) or ``"tanh"`` (computed as
``g * sigmoid(2 * sqrt(2/pi) * (g + 0.044715 g^3))``, the same function). Math in float32, output
in the input's dtype, rows may be strided.

Kernel: the op passes the gate and up halves as two 2-D views of ``x`` (row stride ``2H``);
a persistent grid walks ``TM x TH`` tiles of the output (``TILE = TM * TH`` elements; tileiras
streams this reduction-free loop with vectorized plain loads and stores). Space:
:func:`tiletune.space.templates.elementwise_space` (tile size x occupancy x worker warps, 16 configs).
"""

from __future__ import annotations

from typing import Any

import cuda.tile as ct

from tiletune.devices.backends.base import Launch
from tiletune.kernels.fastcall import custom_op_route, fast_op
from tiletune.space.templates import elementwise_space, next_power_of_2
from tiletune.kernels.library_op import LibraryOp
from tiletune.kernels._membound import Prepared, as_rows, check_device, check_float, int64_twin, needs_int64, persistent_grid
from tiletune.kernels._membound import rows_bucketed
from tiletune.kernels._tile_ops import load_zero_padded as _ld
from tiletune.devices.verify import derived_tolerances

__all__ = ["GEGLU", "SWIGLU", "geglu", "glu_plan", "glu_reference", "prepare_glu", "swiglu"]

ConstInt = ct.Constant[int]
ConstBool = ct.Constant[bool]
LOG2E = 1.4426950408889634
ACT_SILU, ACT_GELU_TANH, ACT_GELU_ERF = 0, 1, 2
_ACTS = {"silu": ACT_SILU, "gelu_tanh": ACT_GELU_TANH, "gelu": ACT_GELU_ERF}



def _sigmoid_mul(g, z):
    """``g * sigmoid(z) = g / (1 + exp(-z))`` in float32 (approximate division and exp2)."""
    return ct.truediv(g, 1.0 + ct.exp2(z * (-LOG2E), flush_to_zero=True),
                      rounding_mode=ct.RoundingMode.APPROX, flush_to_zero=True)


def _activation(g, ACT):
    if ACT == 0:  # silu
        a = _sigmoid_mul(g, g)
    else:
        if ACT == 1:  # gelu, tanh form: 0.5 * (1 + tanh(y)) == sigmoid(2y)
            a = _sigmoid_mul(g, (g + 0.044715 * g * g * g) * 1.5957691216057308)
        else:  # gelu, erf form
            z = ct.abs(g) * 0.7071067811865476
            t = ct.truediv(1.0, 1.0 + 0.3275911 * z, rounding_mode=ct.RoundingMode.APPROX, flush_to_zero=True)
            poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t
            erf_abs = 1.0 - poly * ct.exp2(z * z * (-LOG2E), flush_to_zero=True)
            a = 0.5 * g * (1.0 + ct.where(g < 0.0, -erf_abs, erf_abs))
    return a


def glu_kernel_fn(GATE, UP, Y, TM: ConstInt, TH: ConstInt, ACT: ConstInt, LAT: ConstInt, STORE_TMA: ConstBool):
    """``Y = act(GATE) * UP`` over 2-D ``(M, H)`` arrays, persistent over ``TM x TH`` tiles."""
    M = GATE.shape[0]
    H = GATE.shape[1]
    nth = ct.cdiv(H, TH)
    ntiles = ct.cdiv(M, TM) * nth
    for t in range(ct.bid(0), ntiles, ct.num_blocks(0)):
        i = t // nth
        j = t % nth
        g = _ld(GATE, (i, j), (TM, TH), LAT).astype(ct.float32)
        u = _ld(UP, (i, j), (TM, TH), LAT).astype(ct.float32)
        ct.store(Y, (i, j), (_activation(g, ACT) * u).astype(Y.dtype), allow_tma=STORE_TMA)


glu_kernel = ct.kernel(glu_kernel_fn)
glu_kernel_i64 = int64_twin(glu_kernel_fn, ["GATE", "UP", "Y"])


def glu_reference(gate: Any, up: Any, y: Any, act: int) -> Any:
    """Torch reference in float32, cast to ``y.dtype``."""
    import torch.nn.functional as F

    g = gate.float()
    if act == ACT_SILU:
        a = F.silu(g)
    elif act == ACT_GELU_TANH:
        a = F.gelu(g, approximate="tanh")
    else:
        a = F.gelu(g)
    return (a * up.float()).to(y.dtype)


def glu_tiles(cfg: Any, h: int) -> tuple[int, int]:
    """``(TM, TH)``: ``TH = min(next_power_of_2(H), TILE)`` columns, ``TM = TILE / TH`` rows."""
    tile = int(cfg.TILE)
    th = min(next_power_of_2(h), tile)
    return max(1, tile // th), th


def glu_plan(cfg: Any, gate: Any, up: Any, y: Any, act: int) -> Launch:
    """Launch plan: ``y = act(gate) * up`` for 2-D views ``gate``, ``up`` and ``y`` of shape ``(M, H)``."""
    m, h = gate.shape
    tm, th = glu_tiles(cfg, h)
    units = -(-m // tm) * -(-h // th)
    grid = persistent_grid(units, gate.get_device(), cfg.occupancy)
    kernel = glu_kernel_i64 if needs_int64(gate, up, y) else glu_kernel
    return Launch(kernel, grid, (gate, up, y, tm, th, act, cfg.LAT, cfg.STORE_TMA))


def glu_tolerance(*_: Any) -> dict:
    """Elementwise, rounded once: two ulps relative; ``act(g)`` near zero for negative ``g`` is a
    difference (``1 + erf``, ``1 + tanh`` in the reference; a polynomial erf with an absolute error of
    1.5e-7 in the kernel), so 2 ulps of the output's RMS and 64 float32 ulps for the approximations."""
    return derived_tolerances(atol_ulps=2.0, compute_ulps=64.0)


SWIGLU = LibraryOp("tiletune.swiglu", lambda regime: elementwise_space(), glu_plan, reference=glu_reference,
                   writes=["y"], tolerance=glu_tolerance, buckets=rows_bucketed("gate", "up", "y"), fallback="reference")
GEGLU = LibraryOp("tiletune.geglu", lambda regime: elementwise_space(), glu_plan, reference=glu_reference,
                  writes=["y"], tolerance=glu_tolerance, buckets=rows_bucketed("gate", "up", "y"), fallback="reference")


def prepare_glu(x: Any, act: int) -> Prepared:
    """Views, output and regime of a gated activation of ``x`` ``[..., 2H]`` (no checks, no launch)."""
    import torch

    h = x.shape[-1] // 2
    x2 = as_rows(x)
    y = torch.empty((x2.shape[0], h), dtype=x.dtype, device=x.device)
    family = SWIGLU if act == ACT_SILU else GEGLU
    return Prepared(family, act, (x2[:, :h], x2[:, h:], y, act), y.view(tuple(x.shape[:-1]) + (h,)))


def _glu(op: str, x: Any, act: int) -> Any:
    check_float(op, "x", x)
    if x.dim() < 1 or x.shape[-1] < 2 or x.shape[-1] % 2:
        raise ValueError(f"{op}(): the last dimension must be even and >= 2 (gate and up halves), got shape "
                         f"{tuple(x.shape)}")
    check_device(op, x=x)
    if x.numel() == 0:
        return x.new_empty(tuple(x.shape[:-1]) + (x.shape[-1] // 2,))
    return prepare_glu(x, act).run()


@fast_op(route=custom_op_route("swiglu"))
def swiglu(x: Any) -> Any:
    """SwiGLU: ``silu(x[..., :H]) * x[..., H:]`` for a CUDA tensor ``[..., 2H]`` (bf16, fp16, fp32).

    Returns a new ``[..., H]`` tensor of ``x``'s dtype.
    """
    return _glu("swiglu", x, ACT_SILU)


@fast_op(route=custom_op_route("geglu"))
def geglu(x: Any, approximate: str = "none") -> Any:
    """GeGLU: ``gelu(x[..., :H], approximate) * x[..., H:]`` for a CUDA tensor ``[..., 2H]``.

    Args:
        x: bf16, fp16 or fp32 CUDA tensor whose last dimension is even.
        approximate: ``"none"`` (erf GELU) or ``"tanh"``, as in ``torch.nn.functional.gelu``.

    Returns a new ``[..., H]`` tensor of ``x``'s dtype.
    """
    if approximate not in ("none", "tanh"):
        raise ValueError(f"geglu(): approximate must be 'none' or 'tanh', got {approximate!r}")
    return _glu("geglu", x, ACT_GELU_TANH if approximate == "tanh" else ACT_GELU_ERF)
