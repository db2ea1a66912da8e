"""Library ops at the host cost of one launch: a per-call-signature recipe learnt from the op itself.

A library op (``tiletune.kernels.rms_norm`` ...) checks its arguments, builds views and outputs and
calls a tuned op: several microseconds of Python on every call before the launch. :func:`fast_op`
wraps such a function. Its *call signature* is, for each argument, the type, shape, strides, dtype
and device of a tensor, or the type and value of anything else. The first calls with a signature
run the function itself (checks, tuning), while the tuned op's launches are recorded; once a call
ran as exactly one launch of a tuned op's cached choice, the wrapper derives a *recipe* and from then
on a call with that signature allocates the outputs, assembles the kernel arguments and launches:

* every tensor kernel argument is one of the call's tensors, a view into one of them (same storage,
  inside its extent, at a byte offset fixed by the signature), a new output, a view into a new
  output, or a tensor registered with :func:`constant_tensor` (a cached placeholder);
* every other kernel argument, the grid and the hinted kernel are constants of the signature (the
  launch plans are functions of shapes, strides, dtypes and scalar values: the ``cache_plan`` rule);
* the function's result is made of the call's tensors, ``None`` and new outputs; each new output is
  a contiguous tensor covering its whole storage, written by the launch (one of the tuned op's
  ``writes`` or ``inplace`` arguments covers it): outputs are allocated with ``torch.empty``, so a
  function that initialises an output, post-processes it, or uses scratch memory is never replayed.

Anything else (a copy made for an unaligned input, two launches, a tuning call, a key met during CUDA
graph capture) leaves that signature on the slow path. Views are passed to cuTile as
``__cuda_array_interface__`` objects (no torch view op per call) where cuTile can read the dtype that
way. A recipe is dropped whenever a tuned op's choice changes (``cache_clear``, ``tune_pending``,
``LibraryOp.configure``). Under ``torch.compile`` tracing the wrapper calls the op's ``torch.library``
custom op instead (:mod:`tiletune.kernels.torch_ops`).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from typing import Any, Callable

from . import dispatch
from .binding import positional_binder
from .hotpath import TYPESTR as _TYPESTR, CudaArrayView

logger = logging.getLogger("tiletune")

__all__ = ["CudaArrayView", "constant_tensor", "fast_op", "clear_recipes", "recipe_count", "custom_op_route"]

#: signatures per op kept at most (a model has a handful; a stream of new shapes must not grow memory)
MAX_RECIPES = 1024
#: attempts to learn a signature's recipe before it stays on the slow path
MAX_ATTEMPTS = 3

_constants: dict[int, Any] = {}  # id -> tensor registered as a constant kernel argument
_wrappers: list["_FastOp"] = []



def constant_tensor(t: Any) -> Any:
    """Register ``t`` (a cached placeholder or constant the library passes to kernels) as a constant
    kernel argument recipes may keep; returns ``t``."""
    _constants[id(t)] = t
    return t


def clear_recipes() -> None:
    """Forget every learnt recipe (a tuned op's choice changed)."""
    for w in _wrappers:
        w.clear()


def recipe_count() -> int:
    """Recipes learnt so far, over every wrapped op."""
    return sum(len(w.recipes) for w in _wrappers)


dispatch._change_hooks.append(clear_recipes)


def _torch() -> Any:
    import torch

    return torch


def _call_signature(args: tuple[Any, ...], tensor_type: type) -> tuple:
    out: tuple = ()
    for a in args:
        if isinstance(a, tensor_type):
            out += (a.__class__, a.shape, a.stride(), a.dtype, a.get_device())
        else:
            out += (a.__class__, a)
    return out


class _Refused(Exception):
    """The recorded call cannot be replayed as a recipe (the message says why)."""


class _FastOp:
    def __init__(self, fn: Callable[..., Any], route: Callable[..., Any] | None,
                 precheck: Callable[..., bool] | None) -> None:
        self.fn = fn
        self.route = route
        self.precheck = precheck
        self.learn = True
        self.name = fn.__name__
        self.signature = inspect.signature(fn)
        self.recipes: dict[tuple, Callable[[tuple[Any, ...]], Any]] = {}
        self.attempts: dict[tuple, int] = {}
        self.refusals: dict[tuple, str] = {}
        self._lock = threading.Lock()
        _wrappers.append(self)

    def clear(self) -> None:
        with self._lock:
            self.recipes.clear()
            self.attempts.clear()
            self.refusals.clear()

    # the slow path: run the function, record its launches, learn a recipe when the call allows one
    def slow(self, args: tuple[Any, ...], sig: tuple | None) -> Any:
        if (not self.learn or sig is None or self.attempts.get(sig, 0) >= MAX_ATTEMPTS
                or len(self.recipes) >= MAX_RECIPES):
            return self.fn(*args)
        tid = threading.get_ident()
        if tid in dispatch._recorders:  # a library op calling another one: only the outer one learns
            return self.fn(*args)
        rec: list = []
        dispatch._recorders[tid] = rec
        try:
            result = self.fn(*args)
        finally:
            dispatch._recorders.pop(tid, None)
        with self._lock:
            if len(self.attempts) >= 4 * MAX_RECIPES:  # a stream of unlearnable signatures: bounded memory
                self.attempts.clear()
                self.refusals.clear()
            self.attempts[sig] = self.attempts.get(sig, 0) + 1
            try:
                self.recipes[sig] = _learn(args, result, rec)
                self.refusals.pop(sig, None)
            except _Refused as why:
                self.refusals[sig] = str(why)
                logger.debug("tiletune.fastcall: %s keeps the slow path for this signature: %s", self.name, why)
        return result


def custom_op_route(name: str) -> Callable[..., Any]:
    """``route`` of a library op: its ``torch.ops.tiletune`` custom op (:mod:`tiletune.kernels.torch_ops`)."""

    def route(*args: Any, **kwargs: Any) -> Any:
        from .kernels.torch_ops import compiled_call

        return compiled_call(name, *args, **kwargs)

    return route


def fast_op(route: Callable[..., Any] | None = None,
            precheck: Callable[..., bool] | None = None,
            learn: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a library op (see the module docstring).

    Args:
        route: ``route(*args, **kwargs)`` is called instead of the op while ``torch.compile`` traces
            (the op's custom op).
        precheck: ``precheck(*args) -> bool`` for what a signature cannot see (e.g. two arguments that
            must not share memory): False sends the call down the slow path, which raises.
        learn: False for an op that is never one launch (it only gets the ``torch.compile`` route).
    """

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        fast = _FastOp(fn, route, precheck)
        fast.learn = learn
        torch = _torch()
        tensor_type = torch.Tensor
        is_compiling = torch.compiler.is_compiling
        recipes = fast.recipes
        bind = positional_binder(fast.signature)
        recorders = dispatch._recorders

        if not learn:

            @functools.wraps(fn)
            def routed(*args: Any, **kwargs: Any) -> Any:
                if is_compiling() and fast.route is not None:
                    return fast.route(*args, **kwargs)
                return fn(*args, **kwargs)

            routed.fastcall = fast  # type: ignore[attr-defined]
            return routed

        @functools.wraps(fn)
        def op(*args: Any, **kwargs: Any) -> Any:
            if is_compiling() and fast.route is not None:
                return fast.route(*args, **kwargs)
            if kwargs:
                try:
                    bound, rest = bind(args, kwargs)
                except TypeError:
                    return fn(*args, **kwargs)  # the op raises its own error
                if rest:  # keyword-only parameters: no recipe
                    return fn(*args, **kwargs)
                args = bound
            try:
                sig = _call_signature(args, tensor_type)
                recipe = recipes.get(sig)
            except TypeError:  # an unhashable argument: no recipe
                return fn(*args)
            if recipe is not None and not recorders and (precheck is None or precheck(*args)):
                return recipe(args)
            return fast.slow(args, sig)

        op.fastcall = fast  # type: ignore[attr-defined]
        return op

    return wrap


# ------------------------------------------------------------------------------------------------ learning


def _extent(t: Any) -> tuple[int, int]:
    """[first byte, last byte + 1) a strided tensor spans (empty tensors span nothing)."""
    es = t.element_size()
    lo = hi = t.data_ptr()
    for n, st in zip(t.shape, t.stride()):
        if n > 1:
            if st >= 0:
                hi += (n - 1) * st * es
            else:
                lo += (n - 1) * st * es
    return lo, hi + es


def _storage(t: Any) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def _is_dense(t: Any) -> bool:
    return bool(t.is_contiguous())


def _learn(args: tuple[Any, ...], result: Any, rec: list) -> Callable[[tuple[Any, ...]], Any]:
    torch = _torch()
    if len(rec) != 1:
        raise _Refused(f"{len(rec)} tuned-op launches (one is replayed)")
    op, key, op_args = rec[0]
    if key is None or key not in op._cache or key in op._pending:
        raise _Refused("the launch was not a cached choice (tuning, capture or first call)")
    if not op.cache_plan:
        raise _Refused("the tuned op's plan may read more than the key (cache_plan is off)")
    cfg = op._configs[key]
    kernel, grid, kargs = op._launch_spec(cfg, op_args)
    dev = op.backend.arg_device(op_args)
    launch, stream, hinted, dev = op.backend.launch_parts(cfg, kernel, dev)

    inputs = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    in_ids = {id(a) for _, a in inputs}
    # the result: call tensors by position, fresh outputs, None
    as_tuple = isinstance(result, tuple)
    flat = list(result) if as_tuple else [result]
    outputs: list[Any] = []
    result_parts: list[tuple[str, Any]] = []
    for r in flat:
        if r is None:
            result_parts.append(("none", None))
        elif isinstance(r, torch.Tensor) and id(r) in in_ids:
            result_parts.append(("arg", next(i for i, a in inputs if a is r)))
        elif isinstance(r, torch.Tensor):
            sp, nbytes = _storage(r)
            if not (_is_dense(r) and r.data_ptr() == sp and r.numel() * r.element_size() == nbytes):
                raise _Refused("a result is not a whole new contiguous tensor")
            if any(_storage(a)[0] == sp for _, a in inputs) or any(_storage(o)[0] == sp for o in outputs):
                raise _Refused("a result shares memory with an argument or another result")
            result_parts.append(("out", len(outputs)))
            outputs.append(r)
        else:
            raise _Refused(f"a result of type {type(r).__name__}")
    # every new output must be written whole by the launch
    written = [op_args[i] for i in (*op.writes, *op.inplace)]
    for o in outputs:
        sp, nbytes = _storage(o)
        if not any(isinstance(w, torch.Tensor) and _storage(w)[0] == sp and _is_dense(w)
                   and w.data_ptr() == sp and w.numel() * w.element_size() == nbytes for w in written):
            raise _Refused("a new output is not written whole by the launch")

    sources = [("arg", i, a) for i, a in inputs] + [("out", j, o) for j, o in enumerate(outputs)]
    parts: list[tuple] = []
    for v in kargs:
        if isinstance(v, torch.Tensor):
            if id(v) in _constants:
                parts.append(("const", v))
                continue
            parts.append(_locate(v, sources))
        else:
            parts.append(("const", v))
    views_by_interface = bool(getattr(op.backend, "accepts_array_interface", False))
    return _build(parts, result_parts, as_tuple, outputs, launch, stream, hinted, dev, tuple(grid), args,
                  views_by_interface)


def _addressable(src: Any, byte_offset: int) -> bool | None:
    """Whether ``byte_offset`` from ``src``'s first element is one of ``src``'s elements (an in-bounds
    index of its shape); None when the strides overlap and it cannot be told."""
    es = src.element_size()
    if byte_offset < 0 or byte_offset % es:
        return False
    off = byte_offset // es
    dims = sorted(((int(st), int(n)) for n, st in zip(src.shape, src.stride()) if n > 1 and st != 0), reverse=True)
    covered = 1
    for st, n in reversed(dims):  # non-overlapping strides: each stride spans the dims below it
        if st < covered:
            return None
        covered = st * n
    for st, n in dims:
        i = off // st
        if i >= n:
            return False
        off -= i * st
    return off == 0


def _derives_from(v: Any, src: Any) -> bool | None:
    """Whether ``v``'s first and last elements are elements of ``src`` (None: cannot be told)."""
    lo, hi = _extent(v)
    first = _addressable(src, v.data_ptr() - src.data_ptr())
    last = _addressable(src, hi - v.element_size() - src.data_ptr()) if v.numel() > 1 else first
    if first is None or last is None:
        return None
    return first and last


def _locate(v: Any, sources: list[tuple[str, int, Any]]) -> tuple:
    """How a tensor kernel argument derives from the call's tensors and new outputs.

    A source qualifies when ``v`` lies inside its extent and ``v``'s first and last elements are
    elements of it: views of one fused buffer (q and k of a qkv tensor) interleave their extents,
    but not their elements."""
    sp = _storage(v)[0]
    lo, hi = _extent(v)
    hits = []
    for kind, idx, src in sources:
        if src.device != v.device or _storage(src)[0] != sp:
            continue
        slo, shi = _extent(src)
        if slo <= lo and hi <= shi and _derives_from(v, src) is not False:
            hits.append((kind, idx, src))
    if not hits:
        raise _Refused("a kernel argument is neither a call tensor, a view of one, nor a new output "
                       "(a copy or scratch memory)")
    if len(hits) > 1:
        raise _Refused("a kernel argument lies inside several call tensors (aliased arguments)")
    kind, idx, src = hits[0]
    if (v.data_ptr() == src.data_ptr() and tuple(v.shape) == tuple(src.shape)
            and tuple(v.stride()) == tuple(src.stride()) and v.dtype == src.dtype):
        return (kind, idx)
    es = v.element_size()
    return ("view", kind, idx, v.data_ptr() - src.data_ptr(), tuple(int(n) for n in v.shape),
            tuple(int(s) * es for s in v.stride()), v.dtype, tuple(int(s) for s in v.stride()),
            int(v.storage_offset()) - int(src.storage_offset()) if v.dtype == src.dtype else None)


def _build(parts: list[tuple], result_parts: list[tuple[str, Any]], as_tuple: bool, outputs: list[Any], launch: Any,
           stream: Any, hinted: Any, dev: int, grid: tuple[int, ...], args: tuple[Any, ...],
           views_by_interface: bool) -> Callable:
    """The per-call function of a recipe, as straight-line code (no loop, no per-argument calls).

    Views go to the kernel as :class:`CudaArrayView` objects when the backend reads them
    (``views_by_interface``; cuTile does) and the dtype has a typestr, else as torch views."""
    torch = _torch()
    ns: dict[str, Any] = {"_launch": launch, "_stream": stream, "_kernel": hinted, "_dev": dev, "_grid": grid,
                          "_CA": CudaArrayView, "_empty": torch.empty, "_empty_like": torch.empty_like}
    lines = ["def recipe(a):"]
    for j, o in enumerate(outputs):
        like = next((i for i, x in enumerate(args) if isinstance(x, torch.Tensor) and x.is_contiguous()
                     and x.shape == o.shape and x.dtype == o.dtype and x.device == o.device), None)
        if like is not None:
            lines.append(f"    o{j} = _empty_like(a[{like}])")
        else:
            ns[f"_os{j}"], ns[f"_od{j}"], ns[f"_ov{j}"] = tuple(o.shape), o.dtype, o.device
            lines.append(f"    o{j} = _empty(_os{j}, dtype=_od{j}, device=_ov{j})")
    items = []
    for n, p in enumerate(parts):
        kind = p[0]
        if kind == "const":
            ns[f"_c{n}"] = p[1]
            items.append(f"_c{n}")
        elif kind in ("arg", "out"):
            items.append(f"a[{p[1]}]" if kind == "arg" else f"o{p[1]}")
        else:
            _, src_kind, idx, delta, shape, bstrides, dtype, strides, elem_off = p
            src = f"a[{idx}]" if src_kind == "arg" else f"o{idx}"
            typestr = _TYPESTR.get(str(dtype).replace("torch.", "")) if views_by_interface else None
            ns[f"_s{n}"], ns[f"_t{n}"] = shape, bstrides
            if typestr is not None:
                items.append(f"_CA({{'shape': _s{n}, 'strides': _t{n}, 'typestr': {typestr!r}, "
                             f"'data': ({src}.data_ptr() + {delta}, False)}})")
            elif elem_off is not None:
                ns[f"_e{n}"] = strides
                items.append(f"{src}.as_strided(_s{n}, _e{n}, {src}.storage_offset() + {elem_off})")
            else:
                raise _Refused(f"a reinterpreting view of dtype {dtype}")
    lines.append(f"    _launch(_stream(_dev), _grid, _kernel, ({', '.join(items)}{',' if len(items) == 1 else ''}))")
    res = [("None" if k == "none" else f"a[{v}]" if k == "arg" else f"o{v}") for k, v in result_parts]
    lines.append(f"    return ({', '.join(res)},)" if as_tuple else f"    return {res[0]}")
    code = "\n".join(lines)
    exec(compile(code, "<tiletune.fastcall recipe>", "exec"), ns)  # noqa: S102 - our own generated code
    fn = ns["recipe"]
    fn.source = code  # type: ignore[attr-defined]
    return fn
