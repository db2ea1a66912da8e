"""Shipping live objects (launch plans, kernels, references, tensors) to a tuning worker process.

Only for the caller -> worker direction of a live session, never for stored data: the worker's
answers are JSON (:mod:`tiletune.devices.workers.protocol`), and nothing here is written to disk.

* Functions go by reference when the worker can import them: a plan decorated by ``@tt.autotune`` in
  an importable module is found as ``module.<name>.plan``, another function bound to its name in an
  imported module likewise. Anything else (a ``__main__`` script, a notebook cell, a closure) goes by
  value through ``cloudpickle``. A cuTile kernel reached while pickling goes by value wherever it is
  defined, so the worker never imports its package: its Python function and the functions of its
  module that its code names, transitively, in one globals dict where cuTile resolves them (modules
  and classes go as cloudpickle decides). A kernel that cannot (it names a tensor or something
  unpicklable), or any under ``TILETUNE_SHIP_KERNELS=reference``, goes by reference when its module
  binds it to its name. The worker rebuilds a kernel from its function, compiler options and
  evaluated annotations, once per payload (:func:`_rebuild_kernel_from_bytes`: a kernel object holds
  cuTile's in-memory compile cache). Code shipped by value keeps its file name (cloudpickle would
  rename it), and the lines of a file that exists only in the caller's :mod:`linecache` (a notebook
  cell) travel with it, because cuTile parses a kernel's source text and keys its disk cache on the
  file name.
* CUDA tensors go by CUDA IPC (PyTorch's own reduction), through *staging copies*: the caller copies
  each storage into a private buffer and shares that buffer, never the caller's own memory; the worker
  copies them into buffers of its own at once (:func:`own_copy`) and drops its IPC views, so a wild
  write in the worker can never reach the caller's memory. See "CUDA IPC life cycle" below.
* CPU tensors go as raw bytes with dtype, shape, strides and offset.

CUDA IPC life cycle (PyTorch's protocol, ``torch/multiprocessing/cuda_multiprocessing.md``): sharing a
storage puts its memory behind a reference counter in shared memory (set to 1) for the rest of that
storage's life; the consumer decrements it when its view is freed; a storage freed by its producer
while the counter is above zero waits in torch's *limbo* until :func:`collect_shared`
(``torch.cuda.ipc_collect``) finds the counter at zero. At the producer's exit torch prints
"Producer process has been terminated before all shared CUDA tensors released" when any shared
storage is still alive or in limbo. Hence:

* the caller's own tensors are never shared (a staging copy is): a storage that lives until exit (a
  model's weight held by a compiled graph) would otherwise carry torch's counter to the end and make
  that warning at exit whatever the worker did;
* the caller drops the staging copies as soon as the request is pickled (into the limbo: the worker
  has not released them yet) and collects after the worker's reply, by which time the worker has
  released its views (it copies and drops them while opening the session); the worker also drops
  what it still holds of a session when the session closes, and everything when it exits gracefully;
* a worker killed with SIGKILL (a fault, a watchdog) never releases the views it held at that
  moment: their staging copies stay in the limbo, i.e. allocated in the caller, until it exits, and
  torch then warns. The worker holds views only while it opens a session (its copies are made at
  once) and for CUDA tensors that a plan or reference shipped by value captured (held for the
  session), so a fault in a candidate's launch leaves nothing behind.
"""

from __future__ import annotations

import collections
import hashlib
import io
import linecache
import logging
import os
import sys
import threading
import weakref
from typing import Any

from tiletune import settings
from tiletune.errors import TiletuneError
from tiletune.keys import imported_torch

logger = logging.getLogger("tiletune")

__all__ = ["IsolationUnavailable", "Unshippable", "collect_shared", "dumps", "held_shares", "loads", "own_copy"]


class IsolationUnavailable(TiletuneError):
    """Tuning cannot run in a worker process here (the caller then tunes in-process, with a warning)."""


class Unshippable(IsolationUnavailable):
    """An object (plan, reference, argument) cannot be sent to a worker process."""


def _import_attr(module: str, path: str) -> Any:
    import importlib

    obj: Any = importlib.import_module(module)
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _import_plan(module: str, path: str) -> Any:
    """The plan of the tuned op found at ``module.path`` (or the function itself)."""
    obj = _import_attr(module, path)
    return getattr(obj, "plan", obj)


def _rebuild_kernel(cls_name: str, pyfunc: Any, options: dict, annotations: dict | None = None) -> Any:
    """A cuTile kernel rebuilt in the worker from its Python function and compiler options.

    ``annotations`` are the parameter annotations as the caller evaluated them: under
    ``from __future__ import annotations`` they are strings naming globals (``ct.Constant[int]``
    aliases) that a function shipped by value does not carry.
    """
    import cuda.tile as ct

    if annotations:
        pyfunc.__annotations__ = dict(annotations)
    return ct.kernel(pyfunc, **options)


#: Worker side: the kernels rebuilt from by-value payloads, by the SHA-256 of the payload, least recently
#: used first (a kernel object holds cuTile's in-memory compile cache: the same kernel shipped by later
#: sessions gets the same object back).
_kernels: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
_kernels_lock = threading.Lock()
KERNEL_MEMO_SIZE = 256


def _rebuild_kernel_from_bytes(digest: str, payload: bytes) -> Any:
    """The kernel pickled by value into ``payload`` (:func:`_kernel_by_value`), rebuilt once per worker:
    a payload met again (``digest``, its SHA-256) gets the kernel object rebuilt the first time."""
    with _kernels_lock:
        got = _kernels.get(digest)
        if got is not None:
            _kernels.move_to_end(digest)
            return got
    import pickle

    cls_name, pyfunc, options, annotations = pickle.loads(payload)
    kernel = _rebuild_kernel(cls_name, pyfunc, options, annotations)
    with _kernels_lock:
        kernel = _kernels.setdefault(digest, kernel)  # another thread's, had it rebuilt it meanwhile
        _kernels.move_to_end(digest)
        while len(_kernels) > KERNEL_MEMO_SIZE:
            _kernels.popitem(last=False)
    return kernel


def _rebuild_cpu_tensor(data: bytes, dtype: Any, size: tuple, stride: tuple, offset: int) -> Any:
    import torch

    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return torch.empty(0, dtype=dtype).set_(buf.untyped_storage(), offset, size, stride)


def _module_binding(fn: Any) -> tuple[str, str, Any] | None:
    """``(module, qualname, what that name holds)`` for a function of an imported module file (not
    ``__main__``, not a local): the worker can import the name; the caller checks what it holds."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<locals>" in qualname:
        return None
    if getattr(sys.modules.get(module), "__file__", None) is None:
        return None
    try:
        return module, qualname, _import_attr(module, qualname)  # the module is imported already
    except AttributeError:
        return None


def _evaluated_annotations(fn: Any) -> dict | None:
    """``fn``'s annotations with string annotations evaluated in its globals (None if that fails)."""
    import inspect

    try:
        return dict(inspect.get_annotations(fn, eval_str=True))
    except Exception:
        return None


def _make_code(ctor: Any, args: tuple, filename: str, lines: list[str] | None) -> Any:
    """A code object shipped by value, with its real file name (and the file's lines when that file
    exists only in the caller's :mod:`linecache`, as a notebook cell does)."""
    if lines and filename not in linecache.cache:  # mtime None: kept by linecache.checkcache
        linecache.cache[filename] = (sum(len(x) for x in lines), None, list(lines), filename)
    return ctor(*args).replace(co_filename=filename)


def _code_reduce_keeping_filename(obj: Any) -> Any:
    """cloudpickle's code reduction, minus its renaming of ``co_filename`` to ``<dynamic-code>``:
    cuTile reads a kernel's source through its file name, and its disk-cache key contains it."""
    from cloudpickle import cloudpickle as cp

    ctor, args = cp._code_reduce(obj)  # private, present in cloudpickle 3.x (pinned >= 3.0)
    filename = obj.co_filename
    lines = None if os.path.exists(filename) else (linecache.getlines(filename) or None)
    return _make_code, (ctor, args, filename, lines)


class _NotByValue(Exception):
    """A kernel's by-value pickle met something that must not travel inside it (a tensor)."""


def _pickler_classes() -> tuple[type, type]:
    """The pickler of :func:`dumps` and the one that pickles a single kernel by value into bytes."""
    import types

    import cloudpickle

    class _Pickler(cloudpickle.CloudPickler):  # type: ignore[misc, name-defined]
        dispatch_table = collections.ChainMap(
            {types.CodeType: _code_reduce_keeping_filename}, cloudpickle.CloudPickler.dispatch_table
        )
        probe = False  # set on a probe's instance: see dumps(probe=True)
        staged: dict = {}  # a dump's own: the staging copies of the storages shared so far (see _staged)
        kernels_by_value = True  # set by dumps() from TILETUNE_SHIP_KERNELS

        def reducer_override(self, obj: Any) -> Any:
            kernel_cls = _cutile_kernel_class()
            if kernel_cls is not None and isinstance(obj, kernel_cls):
                if self.kernels_by_value:
                    payload = _kernel_by_value(obj)
                    if payload is not None:
                        return _rebuild_kernel_from_bytes, (hashlib.sha256(payload).hexdigest(), payload)
                pyfunc = obj._pyfunc
                bound = _module_binding(pyfunc)
                if bound is not None and bound[2] is obj:
                    return _import_attr, bound[:2]
                import dataclasses

                options = dataclasses.asdict(obj._compiler_options)
                return _rebuild_kernel, (type(obj).__name__, pyfunc, options, _evaluated_annotations(pyfunc))
            if type(obj).__name__ == "function":
                bound = _module_binding(obj)
                if bound is not None and getattr(bound[2], "plan", None) is obj:  # a plan under @autotune
                    return _import_plan, bound[:2]
            torch = imported_torch()  # never a torch another thread is still importing
            if torch is not None and isinstance(obj, torch.Tensor):
                if obj.is_cuda:
                    if self.probe:  # a dry run: no CUDA IPC handle (it would wait for a release forever)
                        return _tensor_placeholder, (tuple(obj.shape), str(obj.dtype))
                    from torch.multiprocessing import reductions

                    staged = _staged(obj, self.staged)
                    rebuild, rargs = reductions.reduce_tensor(obj if staged is None else staged)
                    return _rebuild_shared, (rebuild, rargs)
                if obj.device.type == "cpu":
                    st = obj.untyped_storage()
                    raw = torch.empty(0, dtype=torch.uint8).set_(st).numpy().tobytes() if st.nbytes() else b""
                    return _rebuild_cpu_tensor, (raw, obj.dtype, tuple(obj.shape), obj.stride(), obj.storage_offset())
                raise Unshippable(f"a tensor on device {obj.device} cannot be sent to a worker")
            return super().reducer_override(obj)

    class _KernelPickler(_Pickler):
        """Pickles one kernel's function by value, with the functions of its module that it reaches
        (cloudpickle would send those by reference, i.e. import the module in the worker). A tensor
        raises (:class:`_NotByValue`): a kernel that names one goes the other way."""

        home: Any = None  # the kernel function's globals
        home_name: str | None = None  # and its module's name

        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, types.FunctionType) and (obj.__globals__ is self.home or (
                self.home_name is not None and getattr(obj, "__module__", None) == self.home_name
            )):  # the second: a helper wrapped in its module by a decorator of another (``ct.function``)
                return self._dynamic_function_reduce(obj)  # private, present in cloudpickle 3.x
            torch = imported_torch()
            if torch is not None and isinstance(obj, torch.Tensor):
                raise _NotByValue(f"it names a tensor on {obj.device}")
            return super().reducer_override(obj)

    return _Pickler, _KernelPickler


_PICKLERS: tuple[type, type] | None = None


def _picklers() -> tuple[type, type]:
    global _PICKLERS
    if _PICKLERS is None:
        _PICKLERS = _pickler_classes()
    return _PICKLERS


_in_progress = threading.local()  # ids of the kernels this thread is pickling by value


def _kernel_by_value(obj: Any) -> bytes | None:
    """The cuTile kernel ``obj`` pickled by value (its class name, Python function, compiler options and
    evaluated annotations: the arguments of :func:`_rebuild_kernel`), or None when it cannot be."""
    import dataclasses

    busy = getattr(_in_progress, "ids", None)
    if busy is None:
        busy = _in_progress.ids = set()
    if id(obj) in busy:  # a kernel whose function names the kernel itself: that inner one goes the other way
        return None
    busy.add(id(obj))
    try:
        pyfunc = obj._pyfunc
        buf = io.BytesIO()
        pickler = _picklers()[1](buf, protocol=5)
        pickler.home = pyfunc.__globals__
        pickler.home_name = pyfunc.__module__
        pickler.kernels_by_value = True
        pickler.dump((type(obj).__name__, pyfunc, dataclasses.asdict(obj._compiler_options),
                      _evaluated_annotations(pyfunc)))
    except Exception as exc:  # noqa: BLE001 - anything: the kernel goes by reference (or the enclosing pickle)
        logger.debug("tiletune: kernel %s does not go to the worker by value (%s: %s)",
                     getattr(getattr(obj, "_pyfunc", None), "__qualname__", obj), type(exc).__name__, exc)
        return None
    finally:
        busy.discard(id(obj))
    return buf.getvalue()


def _cutile_kernel_class() -> type | None:
    mod = sys.modules.get("cuda.tile")
    return getattr(mod, "kernel", None) if mod is not None else None


def _staged(obj: Any, memo: dict) -> Any:
    """A tensor like the CUDA tensor ``obj`` (dtype, shape, strides, storage offset, ``requires_grad``,
    :class:`~torch.nn.Parameter` or not) over a private copy of its whole storage, to be shared instead
    of the caller's memory (module docstring). One copy per storage and dump, kept in ``memo``, so
    tensors that share memory still do in the worker. None (share ``obj`` itself) for what has no
    plain storage to copy (an empty one, a sparse or nested layout, a wrapper subclass) and when the
    copy does not fit in the GPU's memory."""
    import torch

    try:
        if obj.layout != torch.strided or obj.is_nested:
            return None
        st = obj.untyped_storage()
        nbytes = st.nbytes()
        if not nbytes:
            return None  # nothing is shared for an empty storage
        key = (str(obj.device), st.data_ptr(), nbytes)
        copy = memo.get(key)
        if copy is None:
            with torch.no_grad():
                buf = torch.empty(nbytes, dtype=torch.uint8, device=obj.device)
                buf.copy_(torch.empty(0, dtype=torch.uint8, device=obj.device).set_(st))
            copy = memo[key] = buf.untyped_storage()
        out = torch.empty(0, dtype=obj.dtype, device=obj.device).set_(
            copy, obj.storage_offset(), tuple(obj.shape), obj.stride()
        )
    except torch.cuda.OutOfMemoryError:
        return None
    except (RuntimeError, NotImplementedError, TypeError):  # no storage of its own (a wrapper subclass)
        return None
    if isinstance(obj, torch.nn.Parameter):
        return torch.nn.Parameter(out, requires_grad=obj.requires_grad)
    return out.requires_grad_() if obj.requires_grad else out


#: Worker side: the CUDA tensors rebuilt from IPC shares that are still alive (weak references).
_received: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _rebuild_shared(rebuild: Any, args: tuple) -> Any:
    """The worker-side rebuild of a shared CUDA tensor (PyTorch's own), remembered in :func:`held_shares`."""
    t = rebuild(*args)
    try:
        _received.add(t)
    except TypeError:  # not weakly referenceable: not counted
        pass
    return t


def held_shares() -> int:
    """How many tensors rebuilt from the caller's CUDA IPC shares this process still holds (each keeps
    the caller's reference counter of its storage above zero until it is freed)."""
    return len(_received)


def collect_shared() -> bool:
    """Free this process's shared CUDA blocks that every consumer has released (``torch.cuda.ipc_collect``:
    torch's limbo, see the module docstring). Cheap (no device work); does nothing (False) before this
    process has initialised CUDA, and never raises."""
    torch = imported_torch()
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    try:
        if cuda is None or not cuda.is_initialized():
            return False
        cuda.ipc_collect()
    except Exception:  # noqa: BLE001 - clean-up only: a broken CUDA context is reported elsewhere
        return False
    return True


def _tensor_placeholder(shape: tuple, dtype: str) -> None:
    """What a probe writes for a CUDA tensor (never loaded: a probe's bytes are not sent)."""
    raise Unshippable("a shipping probe's placeholder was loaded")


def dumps(obj: Any, probe: bool = False) -> bytes:
    """Serialise ``obj`` for a worker; raises :class:`Unshippable` with the reason when it cannot.

    ``probe=True`` checks that ``obj`` can be shipped without shipping it: CUDA tensors are written
    as placeholders instead of being shared. A real share creates a CUDA IPC handle whose memory
    stays pinned in this process until a consumer releases it, i.e. for the life of the process
    when the bytes are never sent; it also makes PyTorch warn at exit ("Producer process has been
    terminated before all shared CUDA tensors released").

    Otherwise CUDA tensors are shared through staging copies (module docstring), which this function
    drops before it returns: they wait in torch's limbo until the consumer has released them and the
    caller runs :func:`collect_shared` (after the worker's reply).

    Raises :class:`ValueError` when ``TILETUNE_SHIP_KERNELS`` holds neither ``value`` nor ``reference``.
    """
    by_value = settings.ship_kernels() == "value"  # an invalid value raises ValueError, naming the variable
    buf = io.BytesIO()
    pickler = _picklers()[0](buf, protocol=5)
    pickler.probe = probe
    pickler.kernels_by_value = by_value
    pickler.staged = {}
    try:
        pickler.dump(obj)
    except Unshippable:
        raise
    except Exception as exc:
        raise Unshippable(f"{type(exc).__name__}: {exc}") from exc
    finally:
        pickler.staged.clear()  # the staging copies: kept by torch until the worker releases them
    return buf.getvalue()


def loads(data: bytes) -> Any:
    """The worker-side inverse of :func:`dumps` (the caller never loads what a worker sends)."""
    import pickle

    return pickle.loads(data)


def own_copy(t: Any) -> Any:
    """A worker-owned copy of a tensor with the same shape, strides, storage offset and dtype.

    The whole underlying storage is copied (not only the viewed elements), so the kernel sees the
    same layout and 16-byte alignment as in the caller, while writing only to the worker's memory.
    """
    import torch

    if not isinstance(t, torch.Tensor):
        return t
    st = t.untyped_storage()
    mine = torch.empty(st.nbytes(), dtype=torch.uint8, device=t.device)
    if st.nbytes():
        mine.copy_(torch.empty(0, dtype=torch.uint8, device=t.device).set_(st))
    out = torch.empty(0, dtype=t.dtype, device=t.device).set_(
        mine.untyped_storage(), t.storage_offset(), tuple(t.shape), t.stride()
    )
    return out
