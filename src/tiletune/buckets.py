"""Shape buckets: problem keys that share one tuning result.

An LLM server meets hundreds of distinct token counts ``M``; tuning each exact shape stalls a
request for seconds each time. An op that declares buckets groups its keys: a dimension of an
argument is rounded up to its bucket's upper bound before the key is formed, so ``M = 300`` and
``M = 500`` both tune as ``M = 512`` and the second call reuses the first one's winner at once (and
so does every process reading the same database).

Rules per dimension:

* ``"pow2"``: the next power of two (1, 2, 4, ... ; 0 stays 0);
* a sorted sequence of boundaries, e.g. ``(16, 64, 256, 1024)``: the smallest boundary >= the size;
  a size above the last boundary is kept exact (a bucket of its own);
* a callable ``size -> bucket``, which must return a value >= the size and be monotone.

Only the *key* is bucketed: the launch plan still sees the call's real arguments, and the tuning
session runs on the call that first met the bucket. The contract for an op that declares buckets:
every config of its space must be correct for every size in a bucket (the correctness gate checks
the size it tunes on). The library's kernels mask ragged edges, so they bucket their row/token
dimensions.

Refinement (``Buckets(..., refine=True)``, off by default): a shape answered by its bucket's winner
(tuned on another shape of the bucket) is still answered at once, and is queued for tuning on its
exact shape later: :meth:`tiletune.TunedOp.refine` tunes the queued shapes (on fresh tensors of
their shapes, never on the caller's), in the calling thread or in a background thread. No call ever
waits for it. An exact winner is stored under the exact key and, for ops that refine, preferred over
the bucket's winner from then on, in this process and in every process reading the database.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, Union

from tiletune.keys import _BY_VALUE, _SCALARS, _dtype_name, is_tensor

__all__ = ["Buckets", "Rule", "bucket_size"]

Rule = Union[str, Sequence[int], Callable[[int], int]]


def bucket_size(n: int, rule: Rule) -> int:
    """The bucket ``n`` falls in under ``rule`` (its upper bound)."""
    n = int(n)
    if n <= 0:
        return n
    if rule == "pow2":
        return 1 << (n - 1).bit_length()
    if callable(rule):
        b = int(rule(n))
        if b < n:
            raise ValueError(f"a bucket rule mapped size {n} to {b}, below the size")
        return b
    for b in rule:  # type: ignore[union-attr]
        if n <= b:
            return int(b)
    return n


def _check_rule(rule: Any, where: str) -> Rule:
    if rule == "pow2" or callable(rule):
        return rule
    if isinstance(rule, (list, tuple)) and rule and all(isinstance(b, int) and not isinstance(b, bool) and b > 0
                                                        for b in rule):
        if list(rule) != sorted(set(rule)):
            raise ValueError(f"{where}: bucket boundaries must be strictly increasing, got {list(rule)}")
        return tuple(rule)
    raise ValueError(f"{where}: a bucket rule is 'pow2', a strictly increasing list of positive ints, or a "
                     f"callable size -> bucket; got {rule!r}")


class Buckets:
    """Which dimensions of which arguments are bucketed, and how.

    Args:
        rules: ``{argument name or position: {dimension: rule}}``; a dimension may be negative
            (counted from the end). Example: ``Buckets({"x": {0: "pow2"}, "y": {0: "pow2"}})``.
        refine: queue the shapes a bucket answers for exact tuning by :meth:`tiletune.TunedOp.refine`
            (see the module docstring); off by default.
    """

    def __init__(self, rules: Mapping[str | int, Mapping[int, Rule]], *, refine: bool = False) -> None:
        if not isinstance(refine, bool):
            raise TypeError(f"Buckets: refine must be True or False, got {refine!r}")
        self.refine = refine
        if not isinstance(rules, Mapping) or not rules:
            raise ValueError("Buckets needs {argument: {dimension: rule}} with at least one argument")
        self.rules: dict[str | int, dict[int, Rule]] = {}
        for arg, dims in rules.items():
            if not isinstance(arg, (str, int)) or isinstance(arg, bool):
                raise TypeError(f"Buckets: an argument is named by its name or position, got {arg!r}")
            if not isinstance(dims, Mapping) or not dims:
                raise ValueError(f"Buckets: argument {arg!r} needs {{dimension: rule}}, got {dims!r}")
            checked: dict[int, Rule] = {}
            for d, rule in dims.items():
                if not isinstance(d, int) or isinstance(d, bool):
                    raise TypeError(f"Buckets: argument {arg!r}: dimension {d!r} is not an int")
                checked[d] = _check_rule(rule, f"Buckets: argument {arg!r} dimension {d}")
            self.rules[arg] = checked
        self._positions: dict[int, dict[int, Rule]] | None = None

    def resolve(self, params: Sequence[str]) -> "Buckets":
        """A copy bound to the positions of a plan's parameters (after the config); one Buckets may
        serve several ops."""
        out: dict[int, dict[int, Rule]] = {}
        for arg, dims in self.rules.items():
            if isinstance(arg, str):
                if arg not in params:
                    raise ValueError(f"Buckets: {arg!r} is not an argument of the launch plan: {list(params)}")
                pos = list(params).index(arg)
            else:
                pos = arg
            out[pos] = dims
        bound = Buckets.__new__(Buckets)
        bound.rules, bound._positions, bound.refine = self.rules, out, self.refine
        return bound

    def _dims(self, pos: int, shape: Sequence[int]) -> tuple[int, ...]:
        assert self._positions is not None, "Buckets.resolve() first"
        rules = self._positions.get(pos)
        if not rules:
            return tuple(int(n) for n in shape)
        nd = len(shape)
        out = [int(n) for n in shape]
        for d, rule in rules.items():
            i = d + nd if d < 0 else d
            if 0 <= i < nd:
                out[i] = bucket_size(out[i], rule)
        return tuple(out)

    def key(self, args: Sequence[Any]) -> tuple:
        """The in-memory bucket key of a call (hashable): bucketed shapes, contiguity, dtypes, scalars."""
        out: list[Any] = []
        device = None
        for pos, a in enumerate(args):
            t = type(a)
            if t in _SCALARS or t in _BY_VALUE:
                out.append(a)
            elif t is not float and is_tensor(a):
                out.append((self._dims(pos, a.shape), _layout(a), a.dtype))
                if device is None:
                    device = a.get_device()
            else:
                out.append(t)
        out.append(device)
        return tuple(out)

    def key_json(self, args: Sequence[Any]) -> list[Any]:
        """The stored (JSON) form of the bucket key: like the default key's, with bucketed shapes and a
        ``bucketed`` marker so a bucket's record never answers for an exact key or the reverse."""
        return self._json(args, self._dims)

    def exact_key_json(self, args: Sequence[Any]) -> list[Any]:
        """:meth:`key_json`'s form with the call's own sizes in place of their buckets' (what a
        nearest-neighbour source measures distances from: the bucket's bound may be twice the size)."""
        return self._json(args, lambda pos, shape: tuple(int(n) for n in shape))

    def _json(self, args: Sequence[Any], dims: Callable[[int, Sequence[int]], tuple[int, ...]]) -> list[Any]:
        out: list[Any] = []
        for pos, a in enumerate(args):
            t = type(a)
            if t in _SCALARS:
                out.append(a)
            elif t is not float and t not in _BY_VALUE and is_tensor(a):
                layout = _layout(a)
                d: dict[str, Any] = {"shape": list(dims(pos, a.shape)), "dtype": _dtype_name(a.dtype),
                                     "contiguous": layout == "contiguous"}
                if layout != "contiguous":
                    d["dim_order"], d["stride_ratios"] = list(layout[0]), list(layout[1])
                out.append(d)
            elif t in _BY_VALUE:
                out.append({"value": a.item() if hasattr(a, "item") else _dtype_name(a), "type": t.__name__})
            else:
                out.append({"type": t.__name__})
        return [{"bucketed": True}, *out]

    def describe(self) -> dict[str, Any]:
        """A JSON-able description (for reports and identities)."""
        return {str(k): {str(d): (r if isinstance(r, str) else list(r) if not callable(r) else getattr(
            r, "__name__", "callable")) for d, r in dims.items()} for k, dims in self.rules.items()}


def _layout(a: Any) -> Any:
    """"contiguous", or the layout of a tensor that is not, in a form that does not grow with a
    bucketed dimension: the order of its dimensions by stride (outermost first) and, per dimension, its
    stride over the stride a dense tensor with that order would have (None for a dimension of size 1,
    whose stride is never used). The half views of a ``(B, S, H, D)`` tensor have a batch stride
    ``S * H * D`` and a transposed ``(M, K)`` matrix a column stride ``M``; their ratios are constant,
    so every size of a bucket shares its key, while a padded row stride still shows."""
    shape = tuple(int(n) for n in a.shape)
    strides = tuple(int(s) for s in a.stride())
    acc = 1
    contiguous = True
    for n, st in zip(reversed(shape), reversed(strides)):
        if n > 1 and st != acc:
            contiguous = False
        acc *= max(n, 1)
    if contiguous:
        return "contiguous"
    used = [i for i, n in enumerate(shape) if n > 1]
    order = sorted(used, key=lambda i: (-abs(strides[i]), -i))  # outermost first
    ratios: list[Any] = [None] * len(shape)
    acc = 1
    for i in reversed(order):  # innermost first
        r = strides[i] / acc
        ratios[i] = int(r) if r == int(r) else round(r, 9)
        acc *= shape[i]
    return (tuple(order), tuple(ratios))
