"""How every op of the library is built: :class:`LibraryOp`, one tuned op per *regime*, made on first use.

A regime is a small hashable key the op's public function computes from the call's shapes (the row
regime of a norm, whether a weight is present, the split-K regime of a small-M GEMM; ``None`` for an
op with one space). Each regime has its own :class:`~tiletune.Space`, so a space may depend on the
call's problem and the tuner never measures configurations that cannot apply to it. Tests, tools and
benchmarks swap the tuning database (and other ``autotune`` settings) of every library op at once with
:meth:`LibraryOp.configure`.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Hashable, Mapping, Sequence

from tiletune.devices.verify import reads_only
from tiletune.op.tuned_op import ToleranceFn, TunedOp, autotune, defer_worker_start
from tiletune.space.spaces import Space
from tiletune.space.strategies.base import Budget

__all__ = ["LibraryOp", "reference_fallback"]


class LibraryOp:
    """Tuned ops of one kind, one per regime, made on first use.

    Args:
        name: op name in logs and the database (``"tiletune.rms_norm"``).
        space_for: ``space_for(regime) -> Space``.
        plan: the launch plan shared by every regime.
        reference, writes, inplace, tolerance, buckets: as for :func:`tiletune.autotune`; the reference
            must write none of its arguments (it is marked
            :func:`~tiletune.devices.verify.reads_only`: checks do not copy the arguments it reads).
        budget: the op's default tuning budget (``autotune``'s ``budget=``): with
            ``Budget(max_evals=n)`` a regime's space larger than ``n`` configs is searched with the
            ``"auto"`` strategy for ``n`` evaluations instead of measured whole, which bounds the stall
            of a cold key. A ``budget=`` or ``strategy=`` of :meth:`configure` takes precedence.
        tune_single: as for :func:`tiletune.autotune` (False: a regime whose space holds one config
            launches it without a tuning session).
        on_miss: as for :func:`tiletune.autotune`; the library's ops default to ``"nearest"``: a shape
            nobody tuned is served at once by its nearest tuned neighbour's config (checked once) and
            recorded as pending. ``configure(on_miss=...)`` overrides it for every library op.
        fallback: as for :func:`tiletune.autotune` (the op in torch, run while a new key's config
            compiles in the background); ``"reference"``: the reference, its results copied into the
            written arguments (for ops whose reference costs about what torch's own op would).
    """

    _overrides: dict[str, Any] = {}  # autotune keywords shared by every library op: see configure
    _instances: list["LibraryOp"] = []

    def __init__(
        self,
        name: str,
        space_for: Callable[[Hashable], Space],
        plan: Callable[..., Any],
        *,
        reference: Callable[..., Any] | None = None,
        writes: Sequence[str] = (),
        inplace: Sequence[str] = (),
        tolerance: Mapping[str, tuple[float, float]] | ToleranceFn | None = None,
        buckets: Any = None,
        budget: Budget | None = None,
        tune_single: bool = True,
        on_miss: str = "nearest",
        fallback: Callable[..., Any] | str | None = None,
    ) -> None:
        self.name = name
        if fallback == "reference":
            if reference is None:
                raise ValueError(f"{name}: fallback='reference' needs a reference")
            fallback = reference_fallback(plan, reference, writes, inplace)
        if fallback is not None and not callable(fallback):
            raise TypeError(f"{name}: fallback must be a callable, 'reference' or None, got {fallback!r}")
        self.fallback = fallback
        self.tune_single = bool(tune_single)
        self.on_miss = on_miss
        self.buckets = buckets
        self.budget = budget
        self.space_for = space_for
        self.plan = plan
        # the library's references compute new tensors from their arguments and write none of them: a check
        # passes them the caller's unwritten arguments (KV caches, weights) without copying them
        self.reference = reads_only(reference) if reference is not None else None
        self.writes = tuple(writes)
        self.inplace = tuple(inplace)
        self.tolerance = tolerance
        self._ops: dict[Hashable, TunedOp] = {}
        self._lock = threading.Lock()
        LibraryOp._instances.append(self)

    def op(self, regime: Hashable) -> TunedOp:
        """The tuned op of ``regime`` (created on first use)."""
        op = self._ops.get(regime)
        if op is None:
            with self._lock:
                op = self._ops.get(regime)
                if op is None:
                    kwargs: dict[str, Any] = dict(LibraryOp._overrides)
                    if self.budget is not None and "budget" not in kwargs and "strategy" not in kwargs:
                        kwargs["budget"] = self.budget
                    kwargs.setdefault("on_miss", self.on_miss)
                    token = defer_worker_start.set(True)  # made on a call: its worker starts if it tunes
                    try:
                        op = autotune(
                            self.space_for(regime),
                            reference=self.reference,
                            writes=list(self.writes),
                            inplace=list(self.inplace),
                            tolerance=self.tolerance,
                            name=self.name,
                            buckets=self.buckets,
                            tune_single=self.tune_single,
                            fallback=self.fallback,
                            **kwargs,
                        )(self.plan)
                    finally:
                        defer_worker_start.reset(token)
                    op.origin = {"library": self.name, "regime": _regime_json(regime)}
                    op.race_variants = True  # the library's kernels do not fault: untried configs may race
                    self._ops[regime] = op
        return op

    def ops(self) -> dict[Hashable, TunedOp]:
        """Every op made so far, by regime."""
        return dict(self._ops)

    def chosen(self) -> list[dict[str, Any]]:
        """Every (regime, config) decided so far, for reports."""
        out = []
        for regime, op in self._ops.items():
            for cfg in list(op.chosen().values()):
                out.append({"regime": regime, "config": dict(cfg)})
        return out

    def op_for_origin(self, regime_json: Any) -> TunedOp:
        """The tuned op of a regime given in its JSON form (:attr:`TunedOp.origin`)."""
        return self.op(_regime_from_json(regime_json))

    @classmethod
    def named(cls, name: str) -> "LibraryOp | None":
        """The library op of this name among those constructed so far, or None."""
        for lib in cls._instances:
            if lib.name == name:
                return lib
        return None

    @classmethod
    def instances(cls) -> list["LibraryOp"]:
        """Every library op constructed so far (those of the modules imported), in construction order."""
        return list(cls._instances)

    @classmethod
    def warm_identity_sources(cls) -> int:
        """Read, once per process, the source texts a library op's identity hashes: each plan's and each
        cuTile kernel's its module holds (:func:`tiletune.identity.function_source` keeps them), so a
        first miss does not tokenize them. :func:`tiletune.kernels.load_in_background` calls it after its
        imports, while the program builds its model. Returns how many functions it read."""
        from tiletune.identity import function_source

        seen: set[int] = set()
        for lib in cls.instances():
            fns = [lib.plan]
            module = sys.modules.get(getattr(lib.plan, "__module__", "") or "")
            for value in list(vars(module).values()) if module is not None else ():
                pyfunc = getattr(value, "_pyfunc", None) if type(value).__module__.startswith("cuda.tile") else None
                if callable(pyfunc):
                    fns.append(pyfunc)
            for fn in fns:
                if id(fn) not in seen:
                    seen.add(id(fn))
                    try:
                        function_source(fn)
                    except Exception:  # noqa: BLE001 - best effort: the first miss reads it and reports
                        pass
        return len(seen)

    @classmethod
    def configure(cls, **autotune_kwargs: Any) -> None:
        """Pass ``db=``, ``options=``, ``progress=``, ``backend=``, ``strategy=`` or ``budget=`` to every
        library op made from now on (``configure()`` with no arguments restores the defaults), and
        forget the ops made so far: they are re-made with the new settings on their next use. For
        tests, tools and benchmarks."""
        allowed = {"db", "options", "progress", "backend", "strategy", "budget", "on_miss", "background"}
        bad = set(autotune_kwargs) - allowed
        if bad:
            raise TypeError(f"LibraryOp.configure: unknown setting(s) {sorted(bad)}; allowed: {sorted(allowed)}")
        cls._overrides = dict(autotune_kwargs)
        for lib_op in cls._instances:
            with lib_op._lock:
                lib_op._ops.clear()
        from tiletune.kernels.fastcall import clear_recipes

        clear_recipes()  # recipes hold the old ops' choices


def reference_fallback(plan: Callable[..., Any], reference: Callable[..., Any], writes: Sequence[str],
                       inplace: Sequence[str] = ()) -> Callable[..., None]:
    """A fallback made of an op's reference: ``fallback(*args)`` calls ``reference(*args)`` and copies what it
    returns (the written arguments' values: outputs, then in-place ones) into those arguments; a
    :data:`~tiletune.devices.verify.SCRATCH` value, or the argument itself (a reference that wrote it in
    place), is left as it is."""
    import inspect

    from tiletune.devices.verify import SCRATCH

    params = list(inspect.signature(plan).parameters)[1:]  # after the config
    missing = [n for n in (*writes, *inplace) if n not in params]
    if missing:
        raise ValueError(f"reference_fallback: {missing} are not parameters of the plan {params}")
    positions = [params.index(n) for n in (*writes, *inplace)]

    def fallback(*args: Any) -> None:
        out = reference(*args)
        out = out if isinstance(out, (tuple, list)) else (out,)
        for pos, value in zip(positions, out):
            if value is SCRATCH or value is args[pos]:
                continue
            args[pos].copy_(value)

    return fallback


def _regime_json(regime: Any) -> Any:
    """A regime (a small hashable of ints, strings, bools, None and tuples of them) as JSON."""
    if isinstance(regime, tuple):
        return {"tuple": [_regime_json(r) for r in regime]}
    if regime is None or isinstance(regime, (bool, int, float, str)):
        return regime
    return {"repr": repr(regime)}


def _regime_from_json(doc: Any) -> Any:
    if isinstance(doc, dict) and "tuple" in doc:
        return tuple(_regime_from_json(r) for r in doc["tuple"])
    if isinstance(doc, dict):
        raise ValueError(f"a regime that cannot be rebuilt from JSON: {doc}")
    return doc
