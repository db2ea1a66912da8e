"""The per-call path of a tuned op: turn a cached decision into one ``ct.launch``.

For each problem key the op keeps an *entry*: one closure that launches the chosen config's hinted
kernel. When the launch plan is a pure function of the config and the key (the default key holds
shapes, strides, dtypes, the device and by-value scalars), the entry does not call the plan at all:
the plan's output for this key is recorded once as a *recipe* (kernel, grid, which call arguments go
where, which values are constants) and replayed with one C-level tuple operation. A recipe is only
used when it is provably a function of the key:

* every kernel argument is either one of the call's arguments passed straight through (matched by
  identity, and not ambiguously: two call arguments that are the same object refuse the recipe), or
  an int/bool/str/None constant;
* every call argument is a tensor or keyed by value, except floats; and the plan's grid, kernel and
  constants do not move when the float arguments are changed (checked once by calling the plan with
  perturbed floats).

Otherwise the entry calls the plan on every call. What the recipe cannot see, and the plan must not
read when ``cache_plan`` is on: tensor data pointers and storage offsets.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable

from tiletune.devices.backends.base import LaunchParts
from tiletune.keys import _BY_VALUE, is_tensor

Entry = Callable[[tuple[Any, ...]], None]

#: ``__cuda_array_interface__`` typestr of the dtypes cuTile reads that way (bfloat16 as ``<V2``)
TYPESTR = {"float32": "<f4", "float16": "<f2", "bfloat16": "<V2", "float64": "<f8", "int32": "<i4",
           "int64": "<i8", "int16": "<i2", "int8": "|i1", "uint8": "|u1"}


class CudaArrayView:
    """A strided view of device memory for cuTile (``__cuda_array_interface__``), built without torch.

    ``ct.launch`` converts a torch tensor through DLPack on every call; this object is read as a
    plain dict instead (shape, byte strides, typestr, data pointer)."""

    __slots__ = ("__cuda_array_interface__",)

    def __init__(self, iface: dict) -> None:
        self.__cuda_array_interface__ = iface


def array_view(t: Any) -> CudaArrayView | None:
    """A :class:`CudaArrayView` of a CUDA torch tensor as it is now, or None (a dtype without typestr,
    not a CUDA tensor)."""
    typestr = TYPESTR.get(str(getattr(t, "dtype", "")).replace("torch.", ""))
    if typestr is None or not getattr(t, "is_cuda", False):
        return None
    es = t.element_size()
    return CudaArrayView({"shape": tuple(int(n) for n in t.shape), "strides": tuple(int(s) * es for s in t.stride()),
                          "typestr": typestr, "data": (t.data_ptr(), False)})

_CONST_TYPES = (int, bool, str, type(None))


def plan_recipe(kargs: tuple[Any, ...], args: tuple[Any, ...]) -> tuple[tuple[int, ...], tuple[Any, ...]] | None:
    """``(indices, consts)`` such that ``kargs == tuple((args + consts)[i] for i in indices)``, or None."""
    n = len(args)
    consts: list[Any] = []
    indices: list[int] = []
    for v in kargs:
        hits = [i for i, a in enumerate(args) if v is a]
        if len(hits) > 1 and type(v) not in _CONST_TYPES:
            return None  # op(a, a): positions are ambiguous, a later op(b, c) must not launch (b, b)
        if hits:
            indices.append(hits[0])
            continue
        if type(v) not in _CONST_TYPES:
            return None
        indices.append(n + len(consts))
        consts.append(v)
    return tuple(indices), tuple(consts)


def _args_allow_recipe(args: tuple[Any, ...]) -> bool:
    for a in args:
        t = type(a)
        if t is float or t in _BY_VALUE:
            continue
        if not is_tensor(a):
            return False  # keyed by type only: the plan could read anything from it
    return True


def _floats_are_pass_through(plan: Callable[..., Any], cfg: Any, args: tuple[Any, ...], spec: Any,
                             recipe: tuple[tuple[int, ...], tuple[Any, ...]]) -> bool:
    """Call the plan once more with every float argument changed: the recipe must not change."""
    pos = [i for i, a in enumerate(args) if type(a) is float]
    if not pos:
        return True
    moved = tuple(a * 1.5 + 1.0 if i in pos else a for i, a in enumerate(args))
    try:
        k2, g2, ka2 = plan(cfg, *moved)
    except Exception:
        return False
    if k2 is not spec[0] or tuple(g2) != tuple(spec[1]):
        return False
    return plan_recipe(tuple(ka2), moved) == recipe


def build_entry(
    plan: Callable[..., Any],
    cfg: Any,
    spec: Any,
    args: tuple[Any, ...],
    parts_for: Callable[[Any], LaunchParts],
    use_recipe: bool,
) -> tuple[Entry, bool]:
    """The per-call closure for one key, and whether it replays a recipe (True) or calls the plan."""
    kernel, grid, kargs = spec[0], tuple(spec[1]), tuple(spec[2])
    launch, stream, hinted, dev = parts_for(kernel)
    recipe = None
    if use_recipe and _args_allow_recipe(args):
        recipe = plan_recipe(kargs, args)
        if recipe is not None and not _floats_are_pass_through(plan, cfg, args, spec, recipe):
            recipe = None
    if recipe is not None:
        indices, consts = recipe
        if not indices:

            def entry(a: tuple[Any, ...]) -> None:
                launch(stream(dev), grid, hinted, ())

        elif indices == tuple(range(len(args) + len(consts))):
            if not consts:

                def entry(a: tuple[Any, ...]) -> None:
                    launch(stream(dev), grid, hinted, a)

            else:

                def entry(a: tuple[Any, ...]) -> None:
                    launch(stream(dev), grid, hinted, a + consts)

        else:
            pick = itemgetter(*indices) if len(indices) > 1 else (lambda t, _i=indices[0]: (t[_i],))

            def entry(a: tuple[Any, ...]) -> None:
                launch(stream(dev), grid, hinted, pick(a + consts))

        return entry, True

    known: dict[int, LaunchParts] = {id(kernel): LaunchParts(launch, stream, hinted, dev)}
    keep = [kernel]  # keeps id() of the plan's kernels unique while they are cached

    def entry(a: tuple[Any, ...]) -> None:
        k, g, ka = plan(cfg, *a)
        p = known.get(id(k))
        if p is None:
            p = known[id(k)] = parts_for(k)
            keep.append(k)
        p[0](p[1](p[3]), g, p[2], ka)

    return entry, False


def bound_launcher(parts: LaunchParts, grid: tuple[int, ...], kargs: tuple[Any, ...], result: Any,
                   views: bool = False, **attrs: Any) -> Callable[[], Any]:
    """``launch()``: one launch of a hinted kernel on fixed kernel arguments, returning ``result``.

    The closure holds everything in cells: a call costs the raw-stream read and the launch. With
    ``views`` (a backend that reads ``__cuda_array_interface__``), tensors go to the launch as
    :class:`CudaArrayView` objects made once (no DLPack conversion per call); the launcher keeps their
    storages alive, so a bound tensor that is later reallocated (``resize_``, ``set_``) leaves the
    launcher writing its old memory, never freed memory. ``attrs`` become attributes of the function.
    """
    launch, stream, hinted, dev = parts
    keep: list[Any] = []
    if views:
        out = []
        for v in kargs:
            view = array_view(v) if is_tensor(v) else None
            if view is not None:
                keep.append(v.untyped_storage())
                out.append(view)
            else:
                out.append(v)
        kargs = tuple(out)
    attrs["storages"] = keep

    def bound() -> Any:
        launch(stream(dev), grid, hinted, kargs)
        return result

    for name, value in attrs.items():
        setattr(bound, name, value)
    return bound
