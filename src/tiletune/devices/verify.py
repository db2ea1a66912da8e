"""Correctness gate and in-place safety for tuning sessions (works on any torch device).

* :class:`ArgGuard` saves every argument the kernel writes before tuning and restores them between
  candidates and at the end, so the caller's tensors are never left half-written by a candidate.
* :class:`Checker` computes the reference once, on the pristine arguments, and compares *every*
  written argument of each candidate with it (:func:`compare_tensors`). Outputs are poisoned with NaN
  (or an integer sentinel) before the candidate runs, so an element the kernel forgot to write fails.
  A reference answers :data:`SCRATCH` for a written argument that is scratch (its contents after the
  launch depend on the config): it is saved and restored like the others, its values never compared.
* :class:`GuardBand`: the checked run does not write into the arguments themselves but into twins of
  the written (and in-place) tensors, each laid out like the original (shape, strides, dtype, data
  pointer modulo 256) inside a larger buffer filled with a sentinel byte: guard bands before and after
  the elements, and the gaps between the elements of a strided view. A kernel that writes past the end of
  an output (a tile's stores not masked at the edge) or between its rows changes sentinel bytes and fails
  its check ("wrote outside argument 1: 12 bytes past its end") instead of winning and then overwriting
  the caller's memory next to its output. The results are copied back into the arguments for the
  :class:`Checker`; timing runs use the arguments as they are (a candidate that failed is never timed).

The rule (:func:`compare_tensors`), for a candidate's output ``g`` and the reference ``w``
----------------------------------------------------------------------------------------------

1. **Shape and kind**: ``g.shape == w.shape``; floating outputs need a floating reference, integer
   outputs an integer one, bool outputs a bool one.
2. **Integer and bool outputs** are compared exactly.
3. **Non-finite values**: where ``w`` (rounded to ``g``'s dtype) is NaN, ``g`` must be NaN; where it
   is ``+-inf``, ``g`` must be the same infinity; where it is finite, ``g`` must be finite (a NaN there
   is an unwritten or invalid element).
4. **Per element**, over the finite elements, with ``e = eps(g.dtype)`` and ``rms(w)`` the root mean
   square of the reference's finite elements (the output's own scale)::

       |g - w| <= floor + atol + atol_rms * rms(w) + rtol * |w|

   ``floor = max(smallest subnormal of g.dtype, smallest normal float32)``: one step of the dtype's
   subnormal grid, and what a flush-to-zero float32 computation may lose. No fixed per-dtype absolute
   tolerance: a probability of 1e-5 must be right to ``rtol`` relative, whatever the dtype.
5. **Aggregate**: the normalized error over the finite elements::

       rms(g - w) <= agg * rms(w) + agg_atol + floor

   Many elements each inside the per-element bound (say just under ``atol_rms * rms(w)``: a bias, a
   dropped tail of small values) add up here.

The numbers come from a :class:`Tolerance` per dtype name: ``tolerance=`` of :func:`tiletune.autotune`
maps dtype names to a :class:`Tolerance` or to a plain ``(rtol, atol)`` pair; an entry
``"output:<i>"`` (a mapping of its own) replaces the mapping for the i-th written argument
(:func:`output_tolerance`). A pair is read as
``Tolerance(rtol, atol, atol_rms=0, agg=max(default agg, rtol), agg_atol=atol)``: the caller's
explicit absolute slack is honoured in both checks, the aggregate is never tighter than ``rtol``.

Default tolerances are *derived*, not chosen (:func:`derived_tolerance`): a kernel that computes in
float32 and rounds once to its output dtype is off from an exact (float64) result by at most half an
ulp, ``eps/2`` relative; the reference (float32 math rounded to the same dtype) by as much again. So
``rtol = 2 eps`` (two ulps) plus a float32 term for the computation itself,
``(compute_ulps + 4 sqrt(length) + 2 exp_range) * eps(float32)``: ``length`` terms accumulated as
a random walk, ``exp_range`` the spread of an ``exp`` argument (each unit of it costs float32 ulps of
relative error). ``atol_rms = 1 eps`` (plus the same float32 term) covers cancellation: outputs that
are sums of terms of mixed sign carry errors of the size of the terms, not of the result.
``agg = 1 eps`` (plus the float32 term): the root-mean-square error of a once-rounded result is
about ``0.3 eps`` of the output's RMS. Library ops pass their accumulation length and, where they
cancel, a larger ``atol_rms`` (see their ``tolerance=``). ``tests/test_verify.py`` checks that the
float64-exact result rounded to each dtype, and float32-accumulated-then-rounded results, pass.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple, Sequence

INT_SENTINEL = -123456789

#: attribute :func:`reads_only` sets on a reference
READS_ONLY_ATTR = "__tiletune_reads_only__"


def reads_only(reference: Callable[..., Any]) -> Callable[..., Any]:
    """Declare that ``reference`` reads its arguments and writes none of them (it returns new tensors):
    :class:`Checker` then passes it the arguments the kernel does not write as they are, not copies (no copy
    of a KV cache or a weight per check). Returns ``reference``. Without it every argument is copied first,
    so a reference that writes its inputs cannot touch the caller's tensors."""
    setattr(reference, READS_ONLY_ATTR, True)
    return reference



class _Scratch:
    """Type of :data:`SCRATCH`."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "tiletune.devices.verify.SCRATCH"


#: What a reference returns for a written argument that is scratch: memory a kernel writes and reads
#: itself (per-block partial sums, split-K partial tiles) whose contents after a launch depend on the
#: config. The argument is declared written, so it is saved, restored and may change; the gate does not
#: compare its values, only that an in-place scratch holds no NaN or infinity where it held a finite value
#: before the launch.
SCRATCH = _Scratch()

#: machine epsilon (distance from 1 to the next value) per dtype name; tf32 is float32 with 10 bits
EPS: dict[str, float] = {
    "float64": 2.0 ** -52,
    "float32": 2.0 ** -23,
    "tfloat32": 2.0 ** -10,
    "float16": 2.0 ** -10,
    "bfloat16": 2.0 ** -7,
    "float8_e4m3fn": 2.0 ** -3,
    "float8_e5m2": 2.0 ** -2,
}
#: smallest positive subnormal per dtype name (the absolute rounding step near zero)
SUBNORMAL: dict[str, float] = {
    "float64": 2.0 ** -1074,
    "float32": 2.0 ** -149,
    "float16": 2.0 ** -24,
    "bfloat16": 2.0 ** -133,
    "float8_e4m3fn": 2.0 ** -9,
    "float8_e5m2": 2.0 ** -16,
}
FLOAT32_TINY = 2.0 ** -126  # smallest normal float32: what flush-to-zero may drop


class Tolerance(NamedTuple):
    """Bounds of :func:`compare_tensors` for one dtype (see the module docstring for the rule).

    ``rtol``: per element, relative to ``|want|``; ``atol``: per element, absolute; ``atol_rms``:
    per element, relative to ``rms(want)``; ``agg``: bound of ``rms(got - want) / rms(want)`` (None:
    ``max(default, rtol)``); ``agg_atol``: absolute part of the aggregate bound (None: ``atol``).
    """

    rtol: float
    atol: float = 0.0
    atol_rms: float = 0.0
    agg: float | None = None
    agg_atol: float | None = None


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    s = str(dtype)
    return s[6:] if s.startswith("torch.") else s


def eps(dtype: Any) -> float:
    """Machine epsilon of a dtype (or dtype name, ``"tfloat32"`` included); 0 for non-float dtypes."""
    return EPS.get(dtype_name(dtype), 0.0)


def derived_tolerance(
    dtype: Any,
    *,
    length: float = 1,
    ulps: float = 2.0,
    atol_ulps: float = 1.0,
    agg_ulps: float = 1.0,
    compute_ulps: float = 16.0,
    exp_range: float = 0.0,
    compute: Any = "float32",
) -> Tolerance:
    """Tolerance of a result computed in ``compute`` precision and rounded once to ``dtype``.

    Bounds are multiples of ``eps(dtype)`` (rounding of the result and of the reference: ``ulps``
    relative, ``atol_ulps`` of the output's RMS, ``agg_ulps`` for the normalized error) plus the
    computation's own error in ``eps(compute)``: ``compute_ulps`` (a handful of roundings and
    approximate ``exp2``/``rsqrt``/division) ``+ 4 sqrt(length)`` (``length`` terms accumulated,
    random-walk growth with a 4x margin) ``+ 2 exp_range`` (``exp(x)`` with ``|x| <= exp_range``
    inherits ``|x|`` float32 ulps of relative error from its argument, in the kernel and the
    reference alike). Dtypes wider than ``compute`` use their own epsilon for both. ``atol_ulps=0``
    (an op without cancellation, e.g. softmax) gives no slack tied to the output's RMS at all.
    """
    e = eps(dtype)
    ec = eps(compute)
    if e <= 0.0:
        return Tolerance(0.0, 0.0, 0.0, 0.0, 0.0)
    if e < ec:
        ec = e
    c = (compute_ulps + 4.0 * math.sqrt(max(1.0, float(length))) + 2.0 * max(0.0, float(exp_range))) * ec
    atol_rms = atol_ulps * e + c if atol_ulps > 0 else 0.0  # no cancellation: no slack tied to the RMS
    return Tolerance(rtol=ulps * e + c, atol=0.0, atol_rms=atol_rms, agg=agg_ulps * e + c, agg_atol=0.0)


LIBRARY_DTYPES = ("float32", "float16", "bfloat16")


def derived_tolerances(dtypes: Sequence[str] = LIBRARY_DTYPES, **kw: Any) -> dict[str, Tolerance]:
    """``{dtype name: derived_tolerance(dtype, **kw)}``: the ``tolerance=`` mapping of a library op."""
    return {d: derived_tolerance(d, **kw) for d in dtypes}


def exp_range(x: Any, cap: float = 128.0) -> float:
    """Largest spread ``max - min`` of the finite values of a row of ``x`` (last dimension), at most
    ``cap`` (beyond it ``exp`` underflows and the floor takes over): the ``exp_range`` of a softmax."""
    import torch

    if x.numel() == 0:
        return 0.0
    fin = torch.isfinite(x)
    inf = torch.tensor(float("inf"), dtype=x.dtype, device=x.device)
    hi = torch.where(fin, x, -inf).amax(dim=-1)
    lo = torch.where(fin, x, inf).amin(dim=-1)
    # a spread that overflows float32 is beyond the cap; rows without finite values have none
    spread = (hi.float() - lo.float()).nan_to_num_(0.0, cap, 0.0).clamp_(0.0, cap)
    return float(spread.max())


#: default :class:`Tolerance` per dtype name: :func:`derived_tolerance` with its defaults
DEFAULT_TOLERANCE: dict[str, Tolerance] = {
    name: derived_tolerance(name)
    for name in ("float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")
}


def tolerance_for(dtype: Any, overrides: Mapping[str, Any] | None = None) -> Tolerance:
    """The :class:`Tolerance` of a dtype: user overrides first (a :class:`Tolerance` or an
    ``(rtol, atol)`` pair), then :data:`DEFAULT_TOLERANCE`; all zero (exact) for other dtypes."""
    name = dtype_name(dtype)
    default = DEFAULT_TOLERANCE.get(name, Tolerance(0.0, 0.0, 0.0, 0.0, 0.0))
    tol = overrides.get(name) if overrides else None
    if tol is None:
        return default
    if not isinstance(tol, Tolerance):
        vals = tuple(None if v is None else float(v) for v in tol)  # a pair, or a Tolerance sent as a list
        if len(vals) == 2:
            if None in vals:
                raise TypeError(f"tolerance for {name}: (rtol, atol) must both be numbers, got {tuple(tol)!r}")
            rtol, atol = vals
            return Tolerance(rtol, atol, 0.0, max(default.agg or 0.0, rtol), atol)
        tol = Tolerance(*vals)
    agg = tol.agg if tol.agg is not None else max(default.agg or 0.0, tol.rtol)
    agg_atol = tol.agg_atol if tol.agg_atol is not None else tol.atol
    return Tolerance(float(tol.rtol), float(tol.atol), float(tol.atol_rms), float(agg), float(agg_atol))


def output_tolerance(tolerance: Mapping[str, Any] | None, index: int) -> Mapping[str, Any] | None:
    """The dtype mapping for output ``index``: ``tolerance["output:<index>"]`` when the op gives
    one (outputs of one dtype that need different bounds, e.g. a loss and a gradient), else the
    mapping itself (the ``"output:..."`` entries are ignored for dtype lookups)."""
    if not tolerance:
        return tolerance
    own = tolerance.get(f"output:{index}")
    if own is not None:
        return own
    return tolerance


def floor_for(dtype: Any) -> float:
    """Absolute slack every element gets: one subnormal step of ``dtype``, and float32 flush-to-zero
    for dtypes no wider than float32."""
    name = dtype_name(dtype)
    sub = SUBNORMAL.get(name, 0.0)
    return sub if name == "float64" else max(sub, FLOAT32_TINY)


def poison(t: Any) -> None:
    """Fill a tensor with NaN (floating dtypes) or :data:`INT_SENTINEL` (integers)."""
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif str(t.dtype) == "torch.bool":
        t.fill_(True)
    else:
        t.fill_(INT_SENTINEL)


#: the byte guard bands and gaps are filled with: a normal (finite, non-zero) value in every float
#: dtype (0xA5A5A5A5 is -2.9e-16 as float32, 0xA5A5 -0.022 as float16), not a value kernels like to write
GUARD_BYTE = 0xA5
#: the twin's data pointer sits at the original's offset modulo this (cuTile specializes on alignment)
GUARD_ALIGN = 256
GUARD_MIN_PAD = 1 << 20  # bytes of guard band on each side, at least...
GUARD_MAX_PAD = 64 << 20  # ...and at most (between the two: a quarter of the elements' span)

_SAME_SIZE_INT = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def guard_pad_bytes(span: int) -> int:
    """Bytes of guard band on each side of a span of ``span`` bytes: a quarter of the span, at least
    1 MiB (tiles past the edge of a small output) and at most 64 MiB, a multiple of :data:`GUARD_ALIGN`."""
    pad = max(GUARD_MIN_PAD, min(span // 4, GUARD_MAX_PAD))
    return -(-pad // GUARD_ALIGN) * GUARD_ALIGN


def _edge_bytes(buf: Any, a0: int, a1: int, b0: int, b1: int) -> Any:
    """``buf[a0:a1]`` and ``buf[b0:b1]`` as one tensor, None when both are empty."""
    import torch

    parts = [p for p in (buf[a0:a1], buf[b0:b1]) if p.numel()]
    return torch.cat(parts) if parts else None


class GuardBand:
    """A twin of one written tensor inside a sentinel-filled buffer, for a checked run.

    :attr:`view` has the original's shape, strides and dtype, and its data pointer has the original's
    offset modulo :data:`GUARD_ALIGN` (alignment as seen by the kernel unchanged); before it lie
    :func:`guard_pad_bytes` bytes of band, after its last element as many. :meth:`arm` fills the whole
    buffer with :data:`GUARD_BYTE` (the caller then writes the elements); :meth:`damage` (after the
    launch, and after the result was copied out of :attr:`view`) says which bytes outside the elements
    are no longer the sentinel: only the two bands for a dense tensor; for a view with gaps it puts the
    sentinel into the elements first and compares the whole buffer. The comparison runs on 8-byte words
    (no byte-wide temporary); the buffer is made once and reused by every checked run.
    """

    def __init__(self, t: Any) -> None:
        import torch

        self.shape, self.strides, self.dtype = tuple(t.shape), tuple(t.stride()), t.dtype
        self.itemsize = t.element_size()
        if t.numel() == 0:
            self.span = 0
        else:  # strides are never negative in torch: the first element is at the view's data pointer
            self.span = (1 + sum((n - 1) * s for n, s in zip(self.shape, self.strides))) * self.itemsize
        self.pad = guard_pad_bytes(self.span)
        lead = self.pad + t.data_ptr() % GUARD_ALIGN
        lead += -lead % self.itemsize
        self.lead = lead
        total = lead + self.span + self.pad
        total += -total % 8  # whole 8-byte words (the after-band grows by a few bytes)
        self.buf = torch.empty(total, dtype=torch.uint8, device=t.device)
        self._words = self.buf.view(torch.int64)
        self._word = int.from_bytes(bytes([GUARD_BYTE]) * 8, "little", signed=True)
        self.dense = t.numel() * self.itemsize == self.span
        self.view = torch.empty(0, dtype=t.dtype, device=t.device).set_(
            self.buf.untyped_storage(), lead // self.itemsize, self.shape, self.strides)
        name = _SAME_SIZE_INT.get(self.itemsize)
        if name is not None:  # the elements as integers of the same size: exact byte fills on any strides
            self._elements = self.view.view(getattr(torch, name))
            self._fill: Any = int.from_bytes(bytes([GUARD_BYTE]) * self.itemsize, "little", signed=name != "uint8")
        else:  # e.g. complex128: copy a value whose bytes are the sentinel (two normal float64s)
            self._elements = self.view
            self._fill = torch.full((self.itemsize,), GUARD_BYTE, dtype=torch.uint8, device=t.device).view(t.dtype)

    def arm(self) -> Any:
        """Fill the whole buffer with the sentinel; returns :attr:`view` (whose elements the caller sets)."""
        self.buf.fill_(GUARD_BYTE)
        return self.view

    def damage(self) -> str | None:
        """None when every byte outside the elements still holds the sentinel, else which bytes changed
        (before the start, past the end, between the elements). Overwrites the elements (copy them first)."""
        end = self.lead + self.span
        if self.dense:  # no gaps: the bands alone (the words around the elements)
            lo, hi = self.lead // 8, -(-end // 8)
            clean = not bool((self._words[:lo] != self._word).any()) and \
                not bool((self._words[hi:] != self._word).any())
            if clean:  # the words the elements share with a band at either edge: check those bytes
                edge = _edge_bytes(self.buf, lo * 8, self.lead, end, hi * 8)
                clean = edge is None or not bool((edge != GUARD_BYTE).any())
        else:
            if isinstance(self._fill, int):
                self._elements.fill_(self._fill)
            else:
                self._elements.copy_(self._fill.expand(self.shape))
            clean = not bool((self._words != self._word).any())
        if clean:
            return None
        bad = self.buf != GUARD_BYTE
        if self.dense:
            bad[self.lead:end] = False
        idx = bad.nonzero().flatten()
        parts = []
        before = idx[idx < self.lead]
        after = idx[idx >= end]
        inside = idx[(idx >= self.lead) & (idx < end)]
        if after.numel():
            parts.append(f"{after.numel()} bytes past its end (up to +{int(after.max()) - end + 1} bytes)")
        if before.numel():
            parts.append(f"{before.numel()} bytes before its start (from -{self.lead - int(before.min())} bytes)")
        if inside.numel():
            parts.append(f"{inside.numel()} bytes between its elements (in the gaps of its strides)")
        return ", ".join(parts)


class _Unmovable(Exception):
    """A kernel argument that cannot be moved onto a guard band's twin."""


class ArgGuard:
    """Saves the written arguments of a call and puts them back on demand.

    ``outputs`` are positions the kernel only writes (poisoned before a checked run); ``inplace``
    are positions it reads and writes (restored before every run so inputs stay pristine).

    A checked run goes through :meth:`checked_args` (the arguments to launch on: written tensors
    replaced by :class:`GuardBand` twins) and :meth:`after_checked_run` (results copied back into the
    arguments, bands verified). ``bands=False``, a written argument that is not a torch tensor and one
    whose memory another argument shares (the twin would break the aliasing) run in place, as
    :meth:`prepare_checked_run` does.
    """

    def __init__(self, args: Sequence[Any], outputs: Sequence[int], inplace: Sequence[int] = (),
                 *, bands: bool = True) -> None:
        self.args = tuple(args)
        self.outputs = tuple(outputs)
        self.inplace = tuple(inplace)
        self.saved = {i: self.args[i].clone() for i in (*self.outputs, *self.inplace)}
        self.banded = self._bandable() if bands else ()
        self.band_error: str | None = None  # why the bands were given up (their buffers could not be made)
        self._bands: dict[int, GuardBand] = {}

    def _bandable(self) -> tuple[int, ...]:
        """Written positions that get guard bands: torch tensors sharing their memory with no other argument."""
        try:
            import torch
        except ImportError:  # pragma: no cover - the guard is used with torch tensors only
            return ()

        def storage(a: Any) -> tuple[Any, int] | None:
            if not isinstance(a, torch.Tensor):
                return None
            st = a.untyped_storage()
            return (a.device, st.data_ptr()) if st.nbytes() else None

        keys = [storage(a) for a in self.args]
        out = []
        for i in (*self.outputs, *self.inplace):
            k = keys[i]
            if not isinstance(self.args[i], torch.Tensor):
                continue
            if k is not None and any(j != i and keys[j] == k for j in range(len(keys))):
                continue  # aliased with another argument: the kernel must see them share memory
            out.append(i)
        return tuple(out)

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

    def checked_args(self) -> tuple[Any, ...]:
        """Prepare a correctness run and return the arguments to launch it on: banded positions
        replaced by their (re-armed) :class:`GuardBand` twins holding the saved contents (in-place) or
        poison (outputs); the other written arguments restored or poisoned in place. Follow the launch
        with :meth:`after_checked_run`."""
        run = list(self.args)
        banded = set(self.banded)
        for i in (*self.outputs, *self.inplace):
            if i in banded:
                band = self._bands.get(i)
                if band is None:
                    band = self._bands[i] = GuardBand(self.args[i])
                run[i] = band.arm()
                if i in self.inplace:
                    run[i].copy_(self.saved[i])
                else:
                    poison(run[i])
            elif i in self.inplace:
                self.args[i].copy_(self.saved[i])
            else:
                poison(self.args[i])
        return tuple(run)

    def checked_kernel_args(self, kargs: Sequence[Any]) -> tuple[Any, ...] | None:
        """Prepare a correctness run of a launch whose kernel arguments are ``kargs`` (evaluated by the
        plan on :attr:`args`) and return them moved onto the twins: every torch tensor among them (or in
        a tuple or list among them) that views a banded argument's memory becomes the same view (shape,
        strides, dtype, byte offset from the argument) of its twin. So the plan is not evaluated again
        and the kernel sees the layout it was compiled for. None, with nothing prepared, when there is
        nothing to band or a view cannot be moved (it reaches beyond the twin's buffer, or a non-torch
        array is passed); then run in place after :meth:`prepare_checked_run`."""
        if not self.banded:
            return None
        import torch

        try:
            for i in self.banded:
                if i not in self._bands:
                    self._bands[i] = GuardBand(self.args[i])
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory: no bands for this session
            self.band_error = f"{type(exc).__name__}: {exc}"[:300]
            self.banded, self._bands = (), {}
            return None
        owners = {}
        for i in self.banded:
            st = self.args[i].untyped_storage()
            if st.nbytes():
                owners[(self.args[i].device, st.data_ptr())] = i

        def move(k: Any) -> Any:
            if isinstance(k, (tuple, list)):
                return type(k)(move(v) for v in k)
            if not isinstance(k, torch.Tensor):
                if hasattr(k, "__cuda_array_interface__") or hasattr(k, "__dlpack__"):
                    raise _Unmovable
                return k
            st = k.untyped_storage()
            i = owners.get((k.device, st.data_ptr())) if st.nbytes() else None
            if i is None:
                return k
            band = self._bands[i]
            start = band.lead + k.data_ptr() - self.args[i].data_ptr()
            size = k.element_size()
            span = 0 if k.numel() == 0 else (1 + sum((n - 1) * s for n, s in zip(k.shape, k.stride()))) * size
            if start < 0 or start % size or start + span > band.buf.numel():
                raise _Unmovable
            return torch.empty(0, dtype=k.dtype, device=k.device).set_(
                band.buf.untyped_storage(), start // size, tuple(k.shape), k.stride())

        try:
            moved = tuple(move(k) for k in kargs)
        except _Unmovable:
            return None
        self.checked_args()
        return moved

    def after_checked_run(self) -> str | None:
        """After the launch on :meth:`checked_args`: copy the twins' contents into the arguments (where
        :meth:`Checker.compare` reads them) and verify the bands; the reason when a kernel wrote outside
        an argument's elements, else None."""
        reasons = []
        for i in self.banded:
            band = self._bands.get(i)
            if band is None:
                continue
            self.args[i].copy_(band.view)
            damage = band.damage()
            if damage is not None:
                reasons.append(f"wrote outside argument {i}: {damage}")
        return "; ".join(reasons) if reasons else None

    def pristine_args(self) -> tuple[Any, ...]:
        """The call's arguments with written ones replaced by their saved copies (for the reference)."""
        return tuple(self.saved.get(i, a) for i, a in enumerate(self.args))


class Checker:
    """Compares every written argument of a candidate with the reference's answer.

    The reference runs when the checker is made, or with ``defer=True`` at :meth:`prepare` (a worker
    starts its compiles first: the reference is then off their way), at the latest before the first
    checked launch (:meth:`prepare` again: a no-op once done) and never after one (a candidate's stray
    write into an input would reach it)."""

    def __init__(
        self,
        reference: Callable[..., Any] | None,
        guard: ArgGuard,
        tolerance: Mapping[str, Any] | None = None,
        defer: bool = False,
    ) -> None:
        self.guard = guard
        self.tolerance = tolerance
        self.positions = (*guard.outputs, *guard.inplace)
        self.expected: tuple[Any, ...] | None = None
        self._reference = reference if (reference is not None and self.positions) else None
        if not defer:
            self.prepare()

    @property
    def prepared(self) -> bool:
        """Whether the reference has run (or there is none to run)."""
        return self._reference is None

    def prepare(self) -> None:
        """Run the reference on the pristine arguments, once (raises what it raises, and ValueError when it
        returns another number of values than the op writes)."""
        reference, self._reference = self._reference, None
        if reference is None:
            return
        shared = bool(getattr(reference, READS_ONLY_ATTR, False))  # reads_only: unwritten args as they are
        written = set(self.positions)
        ref_args = tuple(a if shared and i not in written else a.clone() if hasattr(a, "clone") else a
                         for i, a in enumerate(self.guard.pristine_args()))
        self.set_expected(reference(*ref_args))

    def set_expected(self, out: Any) -> None:
        """Take the reference's answer computed elsewhere (the caller's, when a worker cannot run the
        reference); ValueError when it holds another number of values than the op writes."""
        out = out if isinstance(out, (tuple, list)) else (out,)
        if len(out) != len(self.positions):
            raise ValueError(
                f"the reference returned {len(out)} value(s) but the op writes {len(self.positions)} "
                "argument(s) (outputs then in-place ones)"
            )
        self._reference = None
        self.expected = tuple(out)

    def compare(self) -> str | None:
        """``None`` when every written argument matches, else the reasons (every failing output)."""
        if self.expected is None:
            return None
        reasons = []
        for i, (pos, want) in enumerate(zip(self.positions, self.expected)):
            if want is SCRATCH:
                before = self.guard.saved[pos] if pos in self.guard.inplace else None
                reason = _new_non_finite(self.guard.args[pos], before)
            else:
                reason = compare_tensors(self.guard.args[pos], want, output_tolerance(self.tolerance, i))
            if reason is not None:
                reasons.append(f"output {i} (argument {pos}): {reason}")
        return "; ".join(reasons) if reasons else None


def _new_non_finite(got: Any, before: Any) -> str | None:
    """Why an in-place scratch argument fails: a NaN or infinity where ``before`` (its content before the
    launch) was finite (the rule :func:`compare_tensors` applies to finite references), or None (also for
    integer scratch and for a scratch output, which has no content before)."""
    import torch

    if before is None or not (got.dtype.is_floating_point or got.dtype.is_complex):
        return None
    n = int((~torch.isfinite(got) & torch.isfinite(before)).sum())
    return f"scratch: {n} NaN or infinite value(s) where it held finite ones before the launch" if n else None


def _kind(t: Any) -> str:
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return "float"
    return "bool" if str(t.dtype) == "torch.bool" else "int"


def compare_tensors(got: Any, want: Any, overrides: Mapping[str, Any] | None = None) -> str | None:
    """``None`` if ``got`` matches the reference ``want`` under the rule of the module docstring
    (tolerance of got's dtype, :func:`tolerance_for`), else a reason naming the failed measure, its
    value and its bound."""
    import torch

    want = torch.as_tensor(want, device=got.device)
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {tuple(got.shape)} != expected {tuple(want.shape)}"
    kg, kw = _kind(got), _kind(want)
    if kg != kw:
        return f"dtype {dtype_name(got.dtype)} ({kg}) but the reference is {dtype_name(want.dtype)} ({kw})"
    n = got.numel()
    if kg != "float":
        bad = got != want.to(got.dtype)
        nbad = int(bad.sum())
        if nbad:
            return f"exact: {nbad} of {n} elements differ (integer/bool output, bound 0)"
        return None
    if n == 0:
        return None
    tol = tolerance_for(got.dtype, overrides)
    floor = floor_for(got.dtype)
    work = torch.float64 if torch.float64 in (got.dtype, want.dtype) else torch.float32
    g = got.to(work)
    w = want.to(work)
    wr = want.to(got.dtype).to(work)  # the reference as the output dtype can hold it (overflow -> inf)
    g_fin, w_fin = torch.isfinite(g), torch.isfinite(wr)
    both = g_fin & w_fin
    if not bool(both.all()):
        g_nan, w_nan = torch.isnan(g), torch.isnan(wr)
        k = int((g_nan & ~w_nan).sum())
        if k:
            return f"NaN: {k} of {n} elements are NaN where the reference is not (unwritten or invalid; bound 0)"
        k = int((~g_nan & w_nan).sum())
        if k:
            return f"NaN: {k} of {n} elements are not NaN where the reference is NaN (bound 0)"
        inf_bad = (~g_fin | ~w_fin) & ~(g_nan & w_nan) & (g != wr)
        k = int(inf_bad.sum())
        if k:
            return f"Inf: {k} of {n} elements differ in infinities from the reference (bound 0)"
    if not bool(both.any()):
        return None
    if not bool(both.all()):
        g, w = g[both], w[both]
    err = (g - w).abs_()
    w_abs = w.abs()
    rms_w = float(torch.linalg.vector_norm(w)) / math.sqrt(w.numel())
    abs_part = floor + tol.atol + tol.atol_rms * rms_w
    bound = w_abs.mul_(tol.rtol).add_(abs_part)
    over = err > bound
    k = int(over.sum())
    if k:
        err, bound = err.reshape(-1), bound.reshape(-1)
        i = int(torch.argmax((err - bound).div_(bound)))
        return (f"elementwise: {k} of {n} elements differ by more than atol_eff + rtol*|want| "
                f"(worst: |got-want| {float(err[i]):.3g} > bound {float(bound[i]):.3g} at want "
                f"{float(w.reshape(-1)[i]):.3g}; rtol {tol.rtol:.3g}, atol_eff {abs_part:.3g} = "
                f"floor {floor:.3g} + atol {tol.atol:.3g} + {tol.atol_rms:.3g} * rms(want) {rms_w:.3g})")
    rms_e = float(torch.linalg.vector_norm(err)) / math.sqrt(err.numel())
    agg = tol.agg if tol.agg is not None else tol.rtol
    agg_atol = tol.agg_atol if tol.agg_atol is not None else tol.atol
    agg_bound = agg * rms_w + agg_atol + floor
    if rms_e > agg_bound:
        rel = rms_e / rms_w if rms_w > 0 else math.inf
        return (f"aggregate: rms(got-want) {rms_e:.3g} > bound {agg_bound:.3g} = {agg:.3g} * rms(want) "
                f"{rms_w:.3g} + {agg_atol:.3g} + floor (normalized error {rel:.3g} vs {agg:.3g})")
    return None
