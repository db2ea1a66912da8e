"""Library ops at the host cost of their launches: a per-call-signature recipe learnt from the op itself.

A library op (``tiletune.kernels.rms_norm`` ...) checks its arguments, builds views and outputs and
calls tuned ops: several microseconds of Python on every call before the launches. :func:`fast_op`
wraps such a function. Its *call signature* is, for each argument, the type, shape, strides, dtype
and device of a tensor, or the type and value of anything else. The first calls with a signature
run the function itself (checks, tuning), while the tuned ops' launches are recorded; once a call
ran as one to :data:`MAX_LAUNCHES` launches of tuned ops' cached choices, the wrapper derives a
*recipe* and from then on a call with that signature allocates the outputs and temporaries,
assembles the kernel arguments and launches, in the recorded order:

* every tensor kernel argument is one of the call's tensors, a view into one of them (same storage,
  inside its extent, at a byte offset fixed by the signature), a new output, a temporary, a view into
  either, or a tensor registered with :func:`constant_tensor` (a cached placeholder);
* a *temporary* is a new contiguous tensor covering its whole storage that a launch writes whole (one
  of its tuned op's ``writes``) before any launch reads it, and that the function does not return
  (e.g. split-KV partial results that a second kernel combines);
* every other kernel argument, the grids and the hinted kernels are constants of the signature (the
  launch plans are functions of shapes, strides, dtypes and scalar values: the ``cache_plan`` rule);
* the function's result is made of the call's tensors, ``None`` and new outputs; each new output is
  a contiguous tensor covering its whole storage, written by a launch (one of its tuned op's
  ``writes`` or ``inplace`` arguments covers it): outputs are allocated with ``torch.empty``, so a
  function that initialises an output, post-processes it, or uses scratch memory it does not fully
  write is never replayed.

Anything else (a copy made for an unaligned input, more launches, a tuning call, a key met during CUDA
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

from tiletune import events
from tiletune.op import tuned_op as dispatch
from tiletune.op.binding import positional_binder
from tiletune.op.guards import GuardTable
from tiletune.op.hotpath import TYPESTR as _TYPESTR, CudaArrayView

logger = logging.getLogger("tiletune")

__all__ = ["CudaArrayView", "constant_tensor", "fast_op", "clear_recipes", "recipe_count", "report", "custom_op_route"]

#: recipes per op kept at most, the oldest dropped first (a model has a handful of signatures; a stream of
#: new shapes, such as a cache grown by one position per step, must neither grow memory nor, once the
#: limit is reached, leave every later signature on the slow path)
MAX_RECIPES = 1024
#: attempts to learn a signature's recipe before it stays on the slow path (a call whose keys had no settled
#: config yet, such as one served by an op's fallback while its configs compile, does not count)
MAX_ATTEMPTS = 3
#: tuned-op launches one recipe replays at most
MAX_LAUNCHES = 4

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


def report() -> dict[str, dict[str, Any]]:
    """Per wrapped op that has been called: ``recipes`` learnt, ``slow_calls`` (calls that ran the function
    itself since the recipes were last cleared), ``guard_misses`` (replays that built the call's signature
    because no remembered guard passed: a few per signature, not one per call) and ``refused`` (why signatures keep the slow path:
    reason -> signatures). A model whose ops show slow calls in steady state pays the whole Python path of
    those ops on every call; the reasons say what to change."""
    out: dict[str, dict[str, Any]] = {}
    for w in _wrappers:
        with w._lock:
            if not (w.recipes or w.slow_calls or w.refusals or w.guard_misses):
                continue
            reasons: dict[str, int] = {}
            for why in w.refusals.values():
                reasons[why] = reasons.get(why, 0) + 1
            row = out.setdefault(w.name, {"recipes": 0, "slow_calls": 0, "guard_misses": 0, "refused": {}})
            row["recipes"] += len(w.recipes)
            row["slow_calls"] += w.slow_calls
            row["guard_misses"] += w.guard_misses
            for why, n in reasons.items():
                row["refused"][why] = row["refused"].get(why, 0) + n
    return out


events.subscribe("changed", lambda **_: clear_recipes())


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


class _NotSettled(_Refused):
    """A recorded launch's key had no settled config yet (a tuning call, a first call, a key served by its torch
    fallback while its configs compile, a capture): a later call may learn, so no attempt is used up."""


class _FastOp:
    def __init__(self, fn: Callable[..., Any], route: Callable[..., Any] | None,
                 precheck: Callable[..., bool] | None) -> None:
        self.fn = fn
        self.route = route
        self.precheck = precheck
        self.learn = True
        #: the op on positional arguments without the ``torch.compile`` route (set by :func:`fast_op`)
        self.direct: Callable[..., Any] = fn
        self.name = fn.__name__
        self.signature = inspect.signature(fn)
        self.recipes: dict[tuple, Callable[[tuple[Any, ...]], Any]] = {}
        #: guards of recently replayed signatures with their recipes (:mod:`tiletune.op.guards`)
        self.guards: GuardTable[Callable[[tuple[Any, ...]], Any]] = GuardTable()
        self.attempts: dict[tuple, int] = {}
        self.refusals: dict[tuple, str] = {}
        #: calls that ran ``fn`` itself, and calls replayed after their signature was built because no guard
        #: passed, since the last :meth:`clear` (:func:`report`)
        self.slow_calls = 0
        self.guard_misses = 0
        self._lock = threading.Lock()
        _wrappers.append(self)

    def clear(self) -> None:
        with self._lock:
            self.recipes.clear()
            self.guards.clear()
            self.attempts.clear()
            self.refusals.clear()
            self.slow_calls = 0
            self.guard_misses = 0

    # the slow path: run the function, record its launches, learn a recipe when the call allows one
    def slow(self, args: tuple[Any, ...], sig: tuple | None) -> Any:
        self.slow_calls += 1  # unlocked: a statistic, a lost increment under threads is harmless
        if not self.learn or sig is None or self.attempts.get(sig, 0) >= MAX_ATTEMPTS:
            return self.fn(*args)
        if threading.get_ident() in dispatch.recorders:  # a library op inside another: only the outer one learns
            return self.fn(*args)
        result, rec = dispatch.record_launches(self.fn, *args)
        with self._lock:
            if len(self.attempts) >= 4 * MAX_RECIPES:  # a stream of unlearnable signatures: bounded memory
                self.attempts.clear()
                self.refusals.clear()
            self.attempts[sig] = self.attempts.get(sig, 0) + 1
            try:
                self.recipes[sig] = _learn(args, result, rec)
                while len(self.recipes) > MAX_RECIPES:  # the oldest first (dicts keep insertion order)
                    del self.recipes[next(iter(self.recipes))]
                self.guards.clear()  # a guard's recipe may be this signature's old one
                self.refusals.pop(sig, None)
            except _Refused as why:
                if isinstance(why, _NotSettled):  # its keys still resolve: the attempt does not count
                    self.attempts[sig] -= 1
                self.refusals[sig] = str(why)
                logger.debug("tiletune.kernels.fastcall: %s keeps the slow path for this signature: %s", self.name, why)
        return result

    def remember(self, sig: tuple, args: tuple[Any, ...], recipe: Callable[[tuple[Any, ...]], Any]) -> None:
        """Make ``sig``'s guard the first one its selector tries (recipes change under ``self._lock``)."""
        self.guard_misses += 1
        self.guards.remember_current(sig, args, _by_value, recipe, self.recipes, self._lock)


def _by_value(t: type) -> bool:
    """A call signature holds every non-tensor argument by type and value."""
    return True


def custom_op_route(name: str) -> Callable[..., Any]:
    """``route`` of a library op: its torch expression for Inductor to fuse where it has one and
    ``TILETUNE_COMPILE_FUSE`` allows (:mod:`tiletune.kernels.lowerings`), else its ``torch.ops.tiletune``
    custom op (:mod:`tiletune.kernels.torch_ops`)."""

    def route(*args: Any, **kwargs: Any) -> Any:
        from tiletune.kernels.lowerings import lowering

        lowered = lowering(name)
        if lowered is not None:
            return lowered(*args, **kwargs)
        from tiletune.kernels.torch_ops import compiled_call

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
        guards = fast.guards
        bind = positional_binder(fast.signature)
        recorders = dispatch.recorders

        if not learn:

            @functools.wraps(fn)
            def routed(*args: Any, **kwargs: Any) -> Any:
                if is_compiling() and fast.route is not None:
                    return fast.route(*args, **kwargs)
                return fn(*args, **kwargs)

            routed.fastcall = fast  # type: ignore[attr-defined]
            fast.direct = fn
            return routed

        # ``direct`` and ``op`` share their hot path line for line (one Python frame less per eager call
        # than ``op`` calling ``direct``); tests/test_fastcall.py checks both replay the same recipes
        def direct(*args: Any) -> Any:
            """The op on positional arguments, never routed: a custom op's implementation (a compiled
            graph's call, which is not tracing) goes straight to the guard and the recipe."""
            if not recorders:
                try:
                    row = guards.rows[args[0].shape]
                except Exception:  # noqa: BLE001 - no arguments, no shape, or a shape not seen
                    row = ()
                for check, recipe in row:
                    if check(args):
                        if precheck is None or precheck(*args):
                            return recipe(args)
                        break
            try:
                sig = _call_signature(args, tensor_type)
                recipe = recipes.get(sig)
            except TypeError:  # an unhashable argument: no recipe
                return fn(*args)
            if recipe is not None and not recorders and (precheck is None or precheck(*args)):
                fast.remember(sig, args, recipe)
                return recipe(args)
            return fast.slow(args, sig)

        fast.direct = direct

        @functools.wraps(fn)
        def op(*args: Any, **kwargs: Any) -> Any:
            if is_compiling():  # traced: the op's custom op, else the function itself (never a recipe)
                return fast.route(*args, **kwargs) if fast.route is not None else fn(*args, **kwargs)
            if kwargs:
                try:
                    bound, rest = bind(args, kwargs)
                except TypeError:
                    return fn(*args, **kwargs)  # the op raises its own error
                if rest:  # keyword-only parameters: no recipe
                    return fn(*args, **kwargs)
                args = bound
            if not recorders:  # a guard of a recent signature passes: its recipe, no signature built
                try:
                    row = guards.rows[args[0].shape]
                except Exception:  # noqa: BLE001 - no arguments, no shape, or a shape not seen
                    row = ()
                for check, recipe in row:
                    if check(args):
                        if precheck is None or precheck(*args):
                            return recipe(args)
                        break
            try:
                sig = _call_signature(args, tensor_type)
                recipe = recipes.get(sig)
            except TypeError:  # an unhashable argument: no recipe
                return fn(*args)
            if recipe is not None and not recorders and (precheck is None or precheck(*args)):
                fast.remember(sig, args, recipe)
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


def _whole(t: Any) -> bool:
    """Whether ``t`` is contiguous and covers its whole storage from its first byte."""
    sp, nbytes = _storage(t)
    return _is_dense(t) and t.data_ptr() == sp and t.numel() * t.element_size() == nbytes


def _learn(args: tuple[Any, ...], result: Any, rec: list) -> Callable[[tuple[Any, ...]], Any]:
    torch = _torch()
    if not rec or len(rec) > MAX_LAUNCHES:
        raise _Refused(f"{len(rec)} tuned-op launches (1 to {MAX_LAUNCHES} are replayed)")
    recorded = []
    for op, key, op_args in rec:
        cfg = None if key is None else op.settled(key)
        if cfg is None:
            raise _NotSettled("a launch was not a cached choice (tuning, capture or first call)")
        if not op.cache_plan:
            raise _Refused("a tuned op's plan may read more than the key (cache_plan is off)")
        recorded.append((op, cfg, op_args))

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
            sp = _storage(r)[0]
            if not _whole(r):
                raise _Refused("a result is not a whole new contiguous tensor")
            if any(_storage(a)[0] == sp for _, a in inputs) or any(_storage(o)[0] == sp for o in outputs):
                raise _Refused("a result shares memory with an argument or another result")
            result_parts.append(("out", len(outputs)))
            outputs.append(r)
        else:
            raise _Refused(f"a result of type {type(r).__name__}")
    # every new output must be written whole by a launch
    written = [op_args[i] for op, _, op_args in recorded for i in (*op.writes, *op.inplace)]
    for o in outputs:
        sp = _storage(o)[0]
        if not any(isinstance(w, torch.Tensor) and _storage(w)[0] == sp and _whole(w) for w in written):
            raise _Refused("a new output is not written whole by a launch")

    known = {_storage(a)[0] for _, a in inputs} | {_storage(o)[0] for o in outputs}
    sources = [("arg", i, a) for i, a in inputs] + [("out", j, o) for j, o in enumerate(outputs)]
    temps: list[Any] = []
    launches = []
    for op, cfg, op_args in recorded:
        # what this launch writes whole and nobody has seen yet is a temporary from here on
        for i in op.writes:
            w = op_args[i]
            if isinstance(w, torch.Tensor) and _whole(w) and _storage(w)[0] not in known and id(w) not in _constants:
                known.add(_storage(w)[0])
                sources.append(("tmp", len(temps), w))
                temps.append(w)
        (launch, stream, hinted, dev), grid, kargs = op.launch_parts(cfg, op_args)
        parts: list[tuple] = []
        for v in kargs:
            if isinstance(v, torch.Tensor):
                if id(v) in _constants:
                    parts.append(("const", v))
                    continue
                parts.append(_locate(v, sources))
            else:
                parts.append(("const", v))
        launches.append(_Launch(parts, launch, stream, hinted, dev, tuple(grid),
                                bool(getattr(op.backend, "accepts_array_interface", False))))
    return _build(launches, result_parts, as_tuple, outputs, temps, args)


class _Launch:
    """One recorded launch of a recipe: located kernel arguments and the backend's launch parts."""

    __slots__ = ("parts", "launch", "stream", "hinted", "dev", "grid", "views_by_interface")

    def __init__(self, parts: list[tuple], launch: Any, stream: Any, hinted: Any, dev: int, grid: tuple[int, ...],
                 views_by_interface: bool) -> None:
        self.parts, self.launch, self.stream, self.hinted = parts, launch, stream, hinted
        self.dev, self.grid, self.views_by_interface = dev, grid, views_by_interface


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
        raise _Refused("a kernel argument is neither a call tensor, a view of one, a new output nor a "
                       "temporary a launch wrote before (a copy or scratch memory)")
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


def _build(launches: list[_Launch], result_parts: list[tuple[str, Any]], as_tuple: bool, outputs: list[Any],
           temps: list[Any], args: tuple[Any, ...]) -> Callable:
    """The per-call function of a recipe, as straight-line code (no loop, no per-argument calls).

    Views go to a kernel as :class:`CudaArrayView` objects when its backend reads them
    (``views_by_interface``; cuTile does) and the dtype has a typestr, else as torch views."""
    torch = _torch()
    ns: dict[str, Any] = {"_CA": CudaArrayView, "_empty": torch.empty, "_empty_like": torch.empty_like}
    lines = ["def recipe(a):"]
    for prefix, news in (("o", outputs), ("t", temps)):
        for j, o in enumerate(news):
            like = next((i for i, x in enumerate(args) if isinstance(x, torch.Tensor) and x.is_contiguous()
                         and x.shape == o.shape and x.dtype == o.dtype and x.device == o.device), None)
            if like is not None:
                lines.append(f"    {prefix}{j} = _empty_like(a[{like}])")
            else:
                ns[f"_{prefix}s{j}"], ns[f"_{prefix}d{j}"], ns[f"_{prefix}v{j}"] = tuple(o.shape), o.dtype, o.device
                # sizes as separate ints: torch.empty parses them faster than one tuple (docs/GPU-NOTES.md);
                # a 0-d output keeps the tuple (empty() needs a size)
                splat = "*" if o.dim() else ""
                lines.append(f"    {prefix}{j} = _empty({splat}_{prefix}s{j}, dtype=_{prefix}d{j}, device=_{prefix}v{j})")
    names = {"arg": "a[{}]", "out": "o{}", "tmp": "t{}"}
    for li, ln in enumerate(launches):
        ns[f"_launch{li}"], ns[f"_stream{li}"], ns[f"_kernel{li}"] = ln.launch, ln.stream, ln.hinted
        ns[f"_dev{li}"], ns[f"_grid{li}"] = ln.dev, ln.grid
        items = []
        for n, p in enumerate(ln.parts):
            kind = p[0]
            if kind == "const":
                ns[f"_c{li}_{n}"] = p[1]
                items.append(f"_c{li}_{n}")
            elif kind in names:
                items.append(names[kind].format(p[1]))
            else:
                _, src_kind, idx, delta, shape, bstrides, dtype, strides, elem_off = p
                src = names[src_kind].format(idx)
                typestr = _TYPESTR.get(str(dtype).replace("torch.", "")) if ln.views_by_interface else None
                ns[f"_s{li}_{n}"], ns[f"_t{li}_{n}"] = shape, bstrides
                if typestr is not None:
                    items.append(f"_CA({{'shape': _s{li}_{n}, 'strides': _t{li}_{n}, 'typestr': {typestr!r}, "
                                 f"'data': ({src}.data_ptr() + {delta}, False)}})")
                elif elem_off is not None:
                    ns[f"_e{li}_{n}"] = strides
                    items.append(f"{src}.as_strided(_s{li}_{n}, _e{li}_{n}, {src}.storage_offset() + {elem_off})")
                else:
                    raise _Refused(f"a reinterpreting view of dtype {dtype}")
        lines.append(f"    _launch{li}(_stream{li}(_dev{li}), _grid{li}, _kernel{li}, "
                     f"({', '.join(items)}{',' if len(items) == 1 else ''}))")
    res = [("None" if k == "none" else f"a[{v}]" if k == "arg" else f"o{v}") for k, v in result_parts]
    lines.append(f"    return ({', '.join(res)},)" if as_tuple else f"    return {res[0]}")
    code = "\n".join(lines)
    exec(compile(code, "<tiletune.kernels.fastcall recipe>", "exec"), ns)  # noqa: S102 - our own generated code
    fn = ns["recipe"]
    fn.source = code  # type: ignore[attr-defined]
    return fn
