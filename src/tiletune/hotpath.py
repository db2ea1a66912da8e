"""The per-call path of a tuned op: turn a cached decision into one ``ct.launch``.

For each problem key the op keeps an *entry*: a closure that launches the chosen config with its
hinted kernel. When the launch plan is a pure function of the config and the key (the default key
holds shapes, strides, dtypes and ints), the entry does not even call the plan: the plan's output
for this key is recorded once as a *recipe* (grid, kernel, which call arguments go where, which
values are constants) and replayed with a C-level tuple operation. Anything the recipe cannot
prove safe falls back to calling the plan on every call:

* a kernel argument that is a tensor but not one of the call's arguments (a view or scratch buffer
  made by the plan),
* a float that is not passed straight through (floats are not part of the key),
* any value of a type other than int, bool, str or None that is not a call argument.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable

from .keys import is_tensor

LaunchFn = Callable[[tuple[int, ...], tuple[Any, ...]], None]
Entry = Callable[[tuple[Any, ...]], None]

_CONST_TYPES = (int, bool, str, type(None))


def plan_recipe(kargs: tuple[Any, ...], args: tuple[Any, ...]) -> tuple[tuple[int, ...], tuple[Any, ...]] | None:
    """``(indices, consts)`` such that ``kargs == tuple((args + consts)[i] for i in indices)``, or None."""
    n = len(args)
    consts: list[Any] = []
    indices: list[int] = []
    for v in kargs:
        for i, a in enumerate(args):
            if v is a:
                indices.append(i)
                break
        else:
            if type(v) not in _CONST_TYPES or is_tensor(v):
                return None
            indices.append(n + len(consts))
            consts.append(v)
    return tuple(indices), tuple(consts)


def build_entry(
    plan: Callable[..., Any],
    cfg: Any,
    spec: Any,
    args: tuple[Any, ...],
    make_launcher: Callable[[Any], LaunchFn],
    use_recipe: bool,
) -> tuple[Entry, bool]:
    """The per-call closure for one key, and whether it replays a recipe (True) or calls the plan."""
    kernel, grid, kargs = spec[0], tuple(spec[1]), tuple(spec[2])
    launch = make_launcher(kernel)
    recipe = plan_recipe(kargs, args) if use_recipe else None
    if recipe is not None:
        indices, consts = recipe
        n = len(args)
        if indices == tuple(range(n + len(consts))):
            if not consts:

                def entry(a: tuple[Any, ...]) -> None:
                    launch(grid, a)

            else:

                def entry(a: tuple[Any, ...]) -> None:
                    launch(grid, a + consts)

        else:
            pick = itemgetter(*indices) if len(indices) > 1 else (lambda t, _i=indices[0]: (t[_i],))

            def entry(a: tuple[Any, ...]) -> None:
                launch(grid, pick(a + consts))

        return entry, True

    launchers: dict[int, LaunchFn] = {id(kernel): launch}
    keep = [kernel]

    def entry(a: tuple[Any, ...]) -> None:
        k, g, ka = plan(cfg, *a)
        fn = launchers.get(id(k))
        if fn is None:
            fn = launchers[id(k)] = make_launcher(k)
            keep.append(k)
        fn(g, ka)

    return entry, False
