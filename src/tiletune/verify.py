"""Correctness gate and in-place safety for tuning sessions (works on any torch device).

* :class:`ArgGuard` saves every argument the kernel writes before tuning and restores them between
  candidates and at the end, so the caller's tensors are never left half-written by a candidate.
* :class:`Checker` computes the reference once, on the pristine arguments, and compares each
  candidate's outputs with per-dtype tolerances. Outputs are poisoned with NaN (or an integer
  sentinel) before the candidate runs, so an element the kernel forgot to write fails the check.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

# (rtol, atol) per dtype name; bf16 has 8 mantissa bits, fp16 11, tf32-accumulated fp32 ~10.
DEFAULT_TOLERANCE: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-3, 1e-3),
    "float16": (1e-2, 1e-2),
    "bfloat16": (2e-2, 2e-2),
    "float8_e4m3fn": (1.25e-1, 1e-1),
    "float8_e5m2": (2.5e-1, 2e-1),
}
INT_SENTINEL = -123456789


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    s = str(dtype)
    return s[6:] if s.startswith("torch.") else s


def tolerance_for(dtype: Any, overrides: Mapping[str, tuple[float, float]] | None = None) -> tuple[float, float]:
    """(rtol, atol) for a dtype: user overrides first, then :data:`DEFAULT_TOLERANCE`, exact for ints."""
    name = dtype_name(dtype)
    if overrides and name in overrides:
        return overrides[name]
    return DEFAULT_TOLERANCE.get(name, (0.0, 0.0))


def poison(t: Any) -> None:
    """Fill a tensor with NaN (floating dtypes) or :data:`INT_SENTINEL` (integers)."""
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif str(t.dtype) == "torch.bool":
        t.fill_(True)
    else:
        t.fill_(INT_SENTINEL)


class ArgGuard:
    """Saves the written arguments of a call and puts them back on demand.

    ``outputs`` are positions the kernel only writes (poisoned before a checked run); ``inplace``
    are positions it reads and writes (restored before every run so inputs stay pristine).
    """

    def __init__(self, args: Sequence[Any], outputs: Sequence[int], inplace: Sequence[int] = ()) -> None:
        self.args = tuple(args)
        self.outputs = tuple(outputs)
        self.inplace = tuple(inplace)
        self.saved = {i: self.args[i].clone() for i in (*self.outputs, *self.inplace)}

    def restore(self) -> None:
        """Copy the saved contents back into every written argument."""
        for i, copy in self.saved.items():
            self.args[i].copy_(copy)

    def prepare_checked_run(self) -> None:
        """Restore in-place arguments and poison pure outputs before a correctness run."""
        for i in self.inplace:
            self.args[i].copy_(self.saved[i])
        for i in self.outputs:
            poison(self.args[i])

    def pristine_args(self) -> tuple[Any, ...]:
        """The call's arguments with written ones replaced by their saved copies (for the reference)."""
        return tuple(self.saved.get(i, a) for i, a in enumerate(self.args))


class Checker:
    """Compares a candidate's written arguments with the reference's answer."""

    def __init__(
        self,
        reference: Callable[..., Any] | None,
        guard: ArgGuard,
        tolerance: Mapping[str, tuple[float, float]] | None = None,
    ) -> None:
        self.guard = guard
        self.tolerance = tolerance
        self.positions = (*guard.outputs, *guard.inplace)
        self.expected: tuple[Any, ...] | None = None
        if reference is not None and self.positions:
            ref_args = tuple(a.clone() if hasattr(a, "clone") else a for a in guard.pristine_args())
            out = reference(*ref_args)
            out = out if isinstance(out, (tuple, list)) else (out,)
            if len(out) != len(self.positions):
                raise ValueError(
                    f"the reference returned {len(out)} value(s) but the op writes {len(self.positions)} "
                    "argument(s) (outputs then in-place ones)"
                )
            self.expected = tuple(out)

    def compare(self) -> str | None:
        """``None`` when every written argument matches, else the reason for the mismatch."""
        if self.expected is None:
            return None
        for pos, want in zip(self.positions, self.expected):
            got = self.guard.args[pos]
            reason = compare_tensors(got, want, self.tolerance)
            if reason is not None:
                return f"argument {pos}: {reason}"
        return None


def compare_tensors(got: Any, want: Any, overrides: Mapping[str, tuple[float, float]] | None = None) -> str | None:
    """``None`` if ``got`` matches ``want`` within the tolerance of got's dtype, else a reason."""
    import torch

    want = torch.as_tensor(want, device=got.device)
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {tuple(got.shape)} != expected {tuple(want.shape)}"
    rtol, atol = tolerance_for(got.dtype, overrides)
    if got.is_floating_point():
        work = torch.float64 if got.dtype == torch.float64 else torch.float32
        g, w = got.to(work), want.to(work)
        err = (g - w).abs_()
        ok = err <= atol + rtol * w.abs()  # False wherever got or want is NaN
        ok |= torch.isnan(g) & torch.isnan(w)  # NaN expected and produced
        if bool(ok.all()):
            return None
        g_nan = torch.isnan(g) & ~torch.isnan(w)
        n_nan = int(g_nan.sum())
        if n_nan:
            return f"{n_nan} of {g.numel()} elements are NaN (unwritten or invalid)"
        n = int((~ok).sum())
        worst = float(err[~ok].max())
        return f"{n} of {g.numel()} elements differ (max abs error {worst:.3g}, rtol={rtol}, atol={atol})"
    bad = got != want.to(got.dtype)
    if bool(bad.any()):
        return f"{int(bad.sum())} of {got.numel()} elements differ"
    return None
