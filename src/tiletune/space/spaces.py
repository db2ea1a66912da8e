"""Search spaces: the tunable parameters of a cuTile kernel and the configurations they span.

A :class:`Space` names each tunable parameter with the list of values to try, optionally per GPU
architecture (:func:`per_arch`), plus constraints that prune invalid combinations and an optional
baseline configuration that is always measured first::

    import tiletune as tt

    space = tt.Space(
        TM=[64, 128, 256], TN=[64, 128, 256], TK=[32, 64],
        occupancy=tt.per_arch(sm_90=[1, 2], sm_100=[1, 2, 4], default=[1]),
        num_ctas=tt.per_arch(sm_100=[1, 2], default=[1]),
        constraints={"tile_fits": lambda c: c.TM * c.TN <= 128 * 256},
        baseline=dict(TM=128, TN=128, TK=64, occupancy=1, num_ctas=1),
    )
    cfgs = space.candidates("sm_90")  # baseline first, then the rest in space order

Parameters named in :data:`HINT_NAMES` (or in ``hints=``) are cuTile kernel hints, applied with
``kernel.replace_hints(**cfg.hints)``; every other parameter is a kernel constant
(``cfg.constants``). Everything that can be checked without enumerating the space is checked when
the space is defined and reported as :class:`~tiletune.errors.SpaceError`.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import keyword
import math
import numbers
import random
import re
import textwrap
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence, Union

from tiletune.errors import SpaceError
from tiletune.jsonio import INT_MAX, INT_MIN
from tiletune.records import stable_hash

if TYPE_CHECKING:  # pragma: no cover
    from tiletune.space.lazy import LazySpace

__all__ = ["Space", "Config", "PerArch", "per_arch", "HINT_NAMES", "KNOWN_ARCHS"]

#: Parameter names that are cuTile kernel hints (``kernel.replace_hints(**cfg.hints)``).
HINT_NAMES: tuple[str, ...] = ("occupancy", "num_ctas", "opt_level", "num_worker_warps")

#: GPU architectures cuTile targets (Ampere, Hopper, Blackwell datacenter, Blackwell consumer).
#: Any ``sm_<digits>`` name is accepted; these are the ones tiletune knows about.
KNOWN_ARCHS: tuple[str, ...] = ("sm_80", "sm_90", "sm_100", "sm_120")

Scalar = Union[int, float, str, bool, None]
"""A JSON scalar: the only kind of value a parameter may take."""

Constraint = Callable[["Config"], Any]
"""A predicate over a :class:`Config`: True keeps the configuration, False drops it (bools only)."""

_ARCH_RE = re.compile(r"sm_\d+")
#: The most combinations :meth:`Space.configs` (and everything that lists the space) goes through;
#: bigger spaces are only searched lazily (:meth:`Space.lazy`).
_MAX_ENUMERATED = 1 << 24
_ISSUES_SHOWN = 8  # how many offending names an error message lists before "..."


# --------------------------------------------------------------------------------------------
# small helpers
# --------------------------------------------------------------------------------------------


def _vkey(value: Scalar) -> tuple[bool, Scalar]:
    """Equality key of a scalar that keeps ``True`` apart from ``1`` (but ``1`` equal to ``1.0``)."""
    return (type(value) is bool, value)


def _scalar(value: Any, where: str) -> Scalar:
    """``value`` as a JSON scalar (numpy-style integers and reals are converted), or SpaceError."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        i = int(value)
        if not INT_MIN <= i <= INT_MAX:  # what the database and its JSON import hold
            raise SpaceError(f"{where}: integer {i} is out of range: it must fit in 64 bits "
                             f"({INT_MIN} .. {INT_MAX}), as the tuning database stores it")
        return i
    if isinstance(value, numbers.Real):
        f = float(value)
        if not math.isfinite(f):
            raise SpaceError(f"{where}: value {value!r} is not a finite number (not valid JSON)")
        return f
    raise SpaceError(
        f"{where}: value {value!r} of type {type(value).__name__} is not a JSON scalar "
        "(int, float, str, bool or None)"
    )


def _arch(arch: Any) -> str | None:
    """Normalise an architecture argument: ``"sm_90"``, a ``(9, 0)`` capability, or None."""
    if arch is None:
        return None
    if isinstance(arch, tuple) and len(arch) == 2 and all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in arch
    ):
        return f"sm_{arch[0]}{arch[1]}"
    if isinstance(arch, str) and _ARCH_RE.fullmatch(arch):
        return arch
    raise SpaceError(
        f"invalid architecture {arch!r}: expected a name like 'sm_90' (one of {', '.join(KNOWN_ARCHS)} "
        "or another 'sm_<digits>'), a (major, minor) capability tuple, or None for the defaults"
    )


def _on(arch: str | None) -> str:
    return "with the default values (no arch given)" if arch is None else f"on {arch}"


def _arch_sort_key(arch: str) -> int:
    return int(arch[3:])


def _listing(names: Iterable[str]) -> str:
    names = list(names)
    shown = ", ".join(repr(n) for n in names[:_ISSUES_SHOWN])
    return shown + (f", ... ({len(names)} in all)" if len(names) > _ISSUES_SHOWN else "")


# --------------------------------------------------------------------------------------------
# PerArch
# --------------------------------------------------------------------------------------------


class PerArch:
    """A value that depends on the GPU architecture, with an optional default.

    ``PerArch(sm_90=[1, 2], sm_100=[1, 2, 4], default=[1])`` gives ``[1, 2]`` on Hopper,
    ``[1, 2, 4]`` on Blackwell and ``[1]`` everywhere else. Architecture keys must look like
    ``sm_<digits>`` (see :data:`KNOWN_ARCHS`). ``default=None`` means "no default": resolving an
    architecture that is not named then raises :class:`SpaceError`.

    Used for parameter value lists (``Space(occupancy=per_arch(...))``) and for baselines
    (``Space(..., baseline=per_arch(sm_90=dict(...), default=dict(...)))``). Immutable.
    """

    __slots__ = ("_default", "_by_arch")

    def __init__(self, default: Any = None, **by_arch: Any) -> None:
        bad = [a for a in by_arch if not _ARCH_RE.fullmatch(a)]
        if bad:
            raise SpaceError(
                f"per_arch: invalid architecture key(s) {_listing(bad)}; keys must look like "
                f"'sm_90' (known: {', '.join(KNOWN_ARCHS)})"
            )
        if default is None and not by_arch:
            raise SpaceError("per_arch() needs at least one architecture value or a default")
        object.__setattr__(self, "_default", default)
        object.__setattr__(self, "_by_arch", dict(by_arch))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("PerArch is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("PerArch is immutable")

    @property
    def default(self) -> Any:
        """The value for architectures not named explicitly (None: no default)."""
        return self._default

    @property
    def has_default(self) -> bool:
        """Whether a default is set."""
        return self._default is not None

    @property
    def archs(self) -> tuple[str, ...]:
        """The architectures named explicitly, in the order given."""
        return tuple(self._by_arch)

    @property
    def by_arch(self) -> dict[str, Any]:
        """A copy of the explicit ``arch -> value`` map."""
        return dict(self._by_arch)

    def resolve(self, arch: str | None) -> Any:
        """The value for ``arch`` (``None``: the default); SpaceError if neither is set."""
        arch = _arch(arch)
        if arch is not None and arch in self._by_arch:
            return self._by_arch[arch]
        if self._default is not None:
            return self._default
        named = ", ".join(self._by_arch) or "none"
        if arch is None:
            raise SpaceError(f"per_arch value has no default (architectures given: {named})")
        raise SpaceError(f"per_arch value has no entry for {arch} and no default (architectures given: {named})")

    def covers(self, arch: str | None) -> bool:
        """Whether :meth:`resolve` succeeds for ``arch``."""
        arch = _arch(arch)
        return self._default is not None or (arch is not None and arch in self._by_arch)

    def _map(self, fn: Callable[[Any, str | None], Any]) -> "PerArch":
        """A PerArch with ``fn(value, arch)`` applied to every value (``arch`` None: the default)."""
        default = None if self._default is None else fn(self._default, None)
        return PerArch(default, **{a: fn(v, a) for a, v in self._by_arch.items()})

    def _jsonable(self, fn: Callable[[Any], Any] = lambda v: v) -> dict[str, Any]:
        return {
            "default": None if self._default is None else fn(self._default),
            "by_arch": {a: fn(v) for a, v in self._by_arch.items()},
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PerArch):
            return NotImplemented
        return self._default == other._default and self._by_arch == other._by_arch

    __hash__ = None  # type: ignore[assignment]  # values are often lists or dicts

    def __repr__(self) -> str:
        parts = [f"{a}={_plain_repr(v)}" for a, v in self._by_arch.items()]
        if self._default is not None:
            parts.append(f"default={_plain_repr(self._default)}")
        return f"per_arch({', '.join(parts)})"


def per_arch(default: Any = None, **by_arch: Any) -> PerArch:
    """Shorthand for :class:`PerArch`: ``per_arch(sm_90=[1, 2], sm_100=[1, 2, 4], default=[1])``."""
    return PerArch(default, **by_arch)


def _plain_repr(value: Any) -> str:
    """repr with tuples shown as lists (values are stored as tuples but written as lists)."""
    if isinstance(value, tuple):
        return "[" + ", ".join(_plain_repr(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k!r}: {_plain_repr(v)}" for k, v in value.items()) + "}"
    return repr(value)


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------


class Config:
    """One configuration: an immutable, ordered ``parameter name -> value`` record.

    Values are read as attributes (``cfg.TM``) or items (``cfg["TM"]``). ``cfg.hints`` holds the
    cuTile kernel hints (for ``kernel.replace_hints(**cfg.hints)``) and ``cfg.constants`` the
    kernel constants. Configs are hashable; two configs are equal when they have the same parameter
    names in the same order with equal values (``True`` is not equal to ``1``). A Config is a
    read-only :class:`~collections.abc.Mapping`, so ``dict(cfg)`` works, but it never compares
    equal to a plain dict.

    Configs are normally made by a :class:`Space` (which checks them); :meth:`from_dict` makes one
    from stored data.
    """

    # ``__dict__`` is ``_data`` itself when every name is a plain parameter name (what a Space makes): a
    # parameter is then read as an instance attribute, without the failed lookup that precedes
    # ``__getattr__`` (constraints and launch plans read every config's parameters by attribute).
    __slots__ = ("_names", "_values", "_data", "_hint_names", "_key", "_hash", "__dict__")

    def __init__(self, values: Mapping[str, Any], hint_names: Iterable[str] = HINT_NAMES) -> None:
        """Build a config from ``values`` after checking names and values (see :meth:`from_dict`)."""
        if not isinstance(values, Mapping):
            raise SpaceError(f"Config values must be a mapping, got {type(values).__name__}")
        names = tuple(values)
        for n in names:
            _check_param_name(n, "Config")
        vals = tuple(_scalar(values[n], f"Config parameter {n!r}") for n in names)
        hints = _hint_name_set(hint_names)
        self._init(names, vals, hints)

    @classmethod
    def _build(cls, names: tuple[str, ...], values: tuple[Scalar, ...], hints: frozenset[str]) -> "Config":
        """Fast construction from already-checked parts (used by Space)."""
        cfg = cls.__new__(cls)
        cfg._init(names, values, hints)
        return cfg

    def _init(self, names: tuple[str, ...], values: tuple[Scalar, ...], hints: frozenset[str]) -> None:
        data = dict(zip(names, values))
        set_ = object.__setattr__
        set_(self, "_names", names)
        set_(self, "_values", values)
        set_(self, "_data", data)
        set_(self, "_hint_names", hints)
        set_(self, "_key", None)  # the equality key and its hash: made when first compared or hashed
        set_(self, "_hash", None)  # (most configs a space enumerates are dropped by a constraint unhashed)
        if _plain_names(names):
            set_(self, "__dict__", data)

    def _equality_key(self) -> tuple[tuple[str, ...], tuple[tuple[bool, Scalar], ...]]:
        key = self._key
        if key is None:
            key = (self._names, tuple([_vkey(v) for v in self._values]))
            object.__setattr__(self, "_key", key)
            object.__setattr__(self, "_hash", hash(key))
        return key

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], hint_names: Iterable[str] = HINT_NAMES) -> "Config":
        """A config from a ``name -> value`` mapping (for example one stored in the tuning database).

        Names must be valid parameter names and values JSON scalars; ``hint_names`` says which names
        are kernel hints. The values are not checked against any space: use :meth:`Space.config`.
        """
        return cls(d, hint_names)

    # -- immutability ----------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Config is immutable (cannot set {name!r}); use cfg.replace({name}=...)")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Config is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore_config, (self._names, self._values, tuple(sorted(self._hint_names))))

    def __copy__(self) -> "Config":
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> "Config":
        return self

    # -- access ----------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails, i.e. for parameter names (and typos).
        if not name.startswith("_"):
            try:
                return self._data[name]
            except KeyError:
                pass
            raise AttributeError(
                f"Config has no parameter {name!r}; its parameters are: {', '.join(self._names) or '(none)'}"
            )
        raise AttributeError(name)

    def __getitem__(self, name: str) -> Scalar:
        try:
            return self._data[name]
        except KeyError:
            raise KeyError(
                f"Config has no parameter {name!r}; its parameters are: {', '.join(self._names) or '(none)'}"
            ) from None

    def __contains__(self, name: object) -> bool:
        return name in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def keys(self) -> tuple[str, ...]:
        """The parameter names, in definition order."""
        return self._names

    def values(self) -> tuple[Scalar, ...]:
        """The values, in parameter order."""
        return self._values

    def items(self) -> tuple[tuple[str, Scalar], ...]:
        """``(name, value)`` pairs, in parameter order."""
        return tuple(zip(self._names, self._values))

    def get(self, name: str, default: Any = None) -> Any:
        """The value of ``name``, or ``default`` if there is no such parameter."""
        return self._data.get(name, default)

    def as_dict(self) -> dict[str, Scalar]:
        """A new ``dict`` of all parameters, in parameter order."""
        return dict(self._data)

    @property
    def hint_names(self) -> frozenset[str]:
        """The names treated as kernel hints (whether or not this config has them)."""
        return self._hint_names

    @property
    def hints(self) -> dict[str, Scalar]:
        """The kernel hints of this config, for ``kernel.replace_hints(**cfg.hints)``."""
        return {n: v for n, v in zip(self._names, self._values) if n in self._hint_names}

    @property
    def constants(self) -> dict[str, Scalar]:
        """The kernel constants of this config (every parameter that is not a hint)."""
        return {n: v for n, v in zip(self._names, self._values) if n not in self._hint_names}

    @property
    def hash_hex(self) -> str:
        """``stable_hash(cfg.as_dict())``: identical across processes (equals ``Measurement.config_hash``)."""
        return stable_hash(self.as_dict())

    def replace(self, **changes: Any) -> "Config":
        """A copy with some values changed; unknown names raise SpaceError.

        The result is not checked against any space (use :meth:`Space.config` for that).
        """
        unknown = [n for n in changes if n not in self._data]
        if unknown:
            raise SpaceError(
                f"Config.replace: unknown parameter(s) {_listing(unknown)}; "
                f"parameters are: {', '.join(self._names)}"
            )
        vals = tuple(
            _scalar(changes[n], f"Config parameter {n!r}") if n in changes else v
            for n, v in zip(self._names, self._values)
        )
        return Config._build(self._names, vals, self._hint_names)

    # -- comparison ------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Config):
            return NotImplemented
        return self.__hash__() == other.__hash__() and self._equality_key() == other._equality_key()

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            self._equality_key()
            h = self._hash
        return h  # type: ignore[return-value]

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{n}={v!r}" for n, v in zip(self._names, self._values)) + ")"


Mapping.register(Config)


def _restore_config(names: tuple[str, ...], values: tuple[Scalar, ...], hints: tuple[str, ...]) -> Config:
    return Config._build(tuple(names), tuple(values), frozenset(hints))


def _hint_name_set(hint_names: Iterable[str]) -> frozenset[str]:
    if isinstance(hint_names, str):
        raise SpaceError(f"hint names must be a list of names, not the string {hint_names!r}")
    names = frozenset(hint_names)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise SpaceError(f"hint names must be strings, got {bad!r}")
    return names


#: Names a parameter may not have: Config's own attributes, and ``arch`` (a keyword of Space.config).
_RESERVED: frozenset[str] = frozenset({n for n in dir(Config) if not n.startswith("_")} | {"arch"})

_plain: dict[tuple[str, ...], bool] = {}


def _plain_names(names: tuple[str, ...]) -> bool:
    """Whether every name is a valid parameter name, none shadowing a Config attribute: then a config's
    parameters may be its instance attributes (read exactly as ``__getattr__`` would). Remembered per
    tuple of names."""
    plain = _plain.get(names)
    if plain is None:
        plain = all(isinstance(n, str) and n.isidentifier() and not n.startswith("_") and not hasattr(Config, n)
                    for n in names)
        if len(_plain) < 4096:
            _plain[names] = plain
    return plain


def _check_param_name(name: Any, where: str) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise SpaceError(f"{where}: invalid parameter name {name!r}: must be a Python identifier")
    if name.startswith("_"):
        raise SpaceError(f"{where}: invalid parameter name {name!r}: must not start with '_'")
    if name in _RESERVED:
        raise SpaceError(
            f"{where}: invalid parameter name {name!r}: it clashes with a Config attribute or a "
            f"Space.config keyword (reserved: {', '.join(sorted(_RESERVED))})"
        )


# --------------------------------------------------------------------------------------------
# hint value checks
# --------------------------------------------------------------------------------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_HINT_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "occupancy": (lambda v: _is_int(v) and 1 <= v <= 32, "an int from 1 to 32"),
    "num_ctas": (lambda v: _is_int(v) and v in (1, 2, 4, 8, 16), "one of 1, 2, 4, 8, 16"),
    "opt_level": (lambda v: _is_int(v) and 0 <= v <= 3, "an int from 0 to 3"),
    "num_worker_warps": (
        lambda v: _is_int(v) and 1 <= v <= 32 and (v & (v - 1)) == 0,
        "a power of two from 1 to 32",
    ),
}


def _check_hint_values(name: str, values: Sequence[Scalar], where: str) -> None:
    check = _HINT_CHECKS.get(name)
    if check is None:
        return
    ok, what = check
    for v in values:
        if not ok(v):
            raise SpaceError(f"{where}: invalid value {v!r} for cuTile hint {name!r}: must be {what}")


# --------------------------------------------------------------------------------------------
# constraint identity (for Space.hash)
# --------------------------------------------------------------------------------------------


def _plain_json(value: Any) -> Any:
    """``value`` if it is a JSON scalar or a flat list/tuple of them, else a marker (``...``)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)) and all(
        v is None or isinstance(v, (bool, int, float, str)) for v in value
    ):
        return [_plain_json(v) for v in value]
    return ...


def _code_names(code: Any) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if inspect.iscode(c):
            names |= _code_names(c)
    return names


def _bound_values(fn: Any) -> dict[str, Any]:
    """JSON-simple values a function closes over or reads as globals (they change its meaning)."""
    out: dict[str, Any] = {}
    code = getattr(fn, "__code__", None)
    if code is None:
        for k, v in sorted(getattr(fn, "__dict__", {}).items()):
            if isinstance(k, str) and _plain_json(v) is not ...:
                out[f"attr:{k}"] = _plain_json(v)
        return out
    for var, cell in zip(code.co_freevars, getattr(fn, "__closure__", None) or ()):
        try:
            v = _plain_json(cell.cell_contents)
        except ValueError:  # empty cell
            continue
        if v is not ...:
            out[f"closure:{var}"] = v
    globs = getattr(fn, "__globals__", {})
    for name in sorted(_code_names(code)):
        if name in globs:
            v = _plain_json(globs[name])
            if v is not ...:
                out[f"global:{name}"] = v
    return out


def _source_of(fn: Any) -> str | None:
    target = fn
    if not (inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isclass(fn)):
        target = type(fn)  # a callable object: its class's source
    try:
        return textwrap.dedent(inspect.getsource(target)).strip()
    except Exception:  # OSError (no source), TypeError (builtin), tokenize errors
        return None


def _constraint_identity(name: str, fn: Any) -> dict[str, Any]:
    ident: dict[str, Any] = {"name": name}
    if isinstance(fn, functools.partial):  # identify the wrapped function and the bound arguments
        ident["partial"] = {
            "args": [_plain_json(a) if _plain_json(a) is not ... else "..." for a in fn.args],
            "keywords": {
                k: _plain_json(v) if _plain_json(v) is not ... else "..." for k, v in sorted(fn.keywords.items())
            },
        }
        fn = fn.func
    ident["source"] = _source_of(fn)
    ident["bound"] = _bound_values(fn)
    return ident


# --------------------------------------------------------------------------------------------
# Space
# --------------------------------------------------------------------------------------------


class _Enumeration:
    """The cached configurations of one architecture."""

    __slots__ = ("values", "lookups", "configs", "index")

    def __init__(self, values: dict[str, tuple[Scalar, ...]], configs: tuple[Config, ...]) -> None:
        self.values = values
        self.lookups = {n: {_vkey(v): i for i, v in enumerate(vs)} for n, vs in values.items()}
        self.configs = configs
        self.index = {c: i for i, c in enumerate(configs)}


ParamValues = Union[Sequence[Scalar], PerArch]


class Space:
    """A search space: named parameter value lists, constraints and an optional baseline.

    ``Space(**params, constraints=None, baseline=None, hints=None)``

    * ``params``: each keyword is a parameter; its value is a non-empty list or tuple of distinct
      JSON scalars, or a :class:`PerArch` of such lists. Definition order is kept and decides the
      enumeration order (the last parameter varies fastest).
    * ``constraints``: a list of callables (named by ``__name__``, lambdas ``"constraint #i"``
      with ``i`` the 0-based list position) or a dict ``name -> callable``. Each receives a
      :class:`Config` and returns True to keep it, False to drop it (a bool or numpy bool; any
      other result is a SpaceError naming the constraint).
    * ``baseline``: a dict giving every parameter's value (or a :class:`PerArch` of such dicts),
      measured first by the tuner. Checked against the values and constraints when the space is
      defined.
    * ``hints``: names of extra parameters to pass as kernel hints, in addition to those named in
      :data:`HINT_NAMES`.

    A Space is immutable; its enumerations are cached per architecture. It has no ``len()``
    because its size depends on the architecture: use :meth:`size`. Architecture arguments are
    names like ``"sm_90"`` (``None`` selects every parameter's default values).
    """

    def __init__(
        self,
        *,
        constraints: Sequence[Constraint] | Mapping[str, Constraint] | Constraint | None = None,
        baseline: Mapping[str, Any] | PerArch | None = None,
        hints: Iterable[str] | None = None,
        **params: ParamValues,
    ) -> None:
        set_ = object.__setattr__
        if not params:
            raise SpaceError("a Space needs at least one parameter, e.g. Space(TM=[64, 128])")
        norm: dict[str, tuple[Scalar, ...] | PerArch] = {}
        for name, values in params.items():
            _check_param_name(name, "Space")
            norm[name] = _normalise_param(name, values)
        names = tuple(norm)

        # hints
        extra: tuple[str, ...] = ()
        if hints is not None:
            if isinstance(hints, str) or not isinstance(hints, Iterable):
                raise SpaceError(f"hints= must be a list of parameter names, got {hints!r}")
            extra = tuple(hints)
            unknown = [h for h in extra if h not in norm]
            if unknown:
                raise SpaceError(
                    f"hints= names unknown parameter(s) {_listing(unknown)}; parameters are: {', '.join(names)}"
                )
        hint_set = frozenset(HINT_NAMES) | frozenset(extra)
        for name, values in norm.items():
            if name in _HINT_CHECKS:
                if isinstance(values, PerArch):
                    for a, vs in values.by_arch.items():
                        _check_hint_values(name, vs, f"parameter {name!r} for {a}")
                    if values.has_default:
                        _check_hint_values(name, values.default, f"parameter {name!r} (default)")
                else:
                    _check_hint_values(name, values, f"parameter {name!r}")

        set_(self, "_params", norm)
        set_(self, "_names", names)
        set_(self, "_hint_set", hint_set)
        set_(self, "_hint_names", tuple(n for n in names if n in hint_set))
        set_(self, "_constraints", _normalise_constraints(constraints))
        archs = {a for v in norm.values() if isinstance(v, PerArch) for a in v.archs}
        set_(self, "_archs", tuple(sorted(archs, key=_arch_sort_key)))
        set_(self, "_cache", {})
        set_(self, "_lazy", {})
        set_(self, "_hash", None)
        set_(self, "_baseline", self._normalise_baseline(baseline))

    # -- immutability ----------------------------------------------------------------------

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Space is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError("Space is immutable")

    # -- description -----------------------------------------------------------------------

    @property
    def names(self) -> tuple[str, ...]:
        """Parameter names, in definition order."""
        return self._names

    @property
    def params(self) -> dict[str, tuple[Scalar, ...] | PerArch]:
        """A copy of ``name -> values`` (a tuple, or a :class:`PerArch` of tuples)."""
        return dict(self._params)

    @property
    def hint_names(self) -> tuple[str, ...]:
        """The parameters that are kernel hints, in definition order."""
        return self._hint_names

    @property
    def constant_names(self) -> tuple[str, ...]:
        """The parameters that are kernel constants, in definition order."""
        return tuple(n for n in self._names if n not in self._hint_set)

    @property
    def constraint_names(self) -> tuple[str, ...]:
        """The constraint names, in evaluation order."""
        return tuple(n for n, _ in self._constraints)

    @property
    def archs(self) -> tuple[str, ...]:
        """Architectures some parameter names explicitly (sorted); others use the defaults."""
        return self._archs

    def values(self, name: str, arch: str | None = None) -> tuple[Scalar, ...]:
        """The values of parameter ``name`` on ``arch`` (``None``: its default values)."""
        if name not in self._params:
            raise SpaceError(f"unknown parameter {name!r}; parameters are: {', '.join(self._names)}")
        return self._resolve_one(name, _arch(arch))

    @property
    def hash(self) -> str:
        """A stable hex content hash of the space, identical across processes.

        It covers the parameter names and values (including per-architecture maps), the hint
        names, the baseline and each constraint's identity (its name, its source text when
        available, and JSON-simple values it closes over or reads as globals).
        """
        if self._hash is None:
            content = {
                "params": [
                    [n, v._jsonable(list) if isinstance(v, PerArch) else list(v)]
                    for n, v in self._params.items()
                ],
                "hints": list(self._hint_names),
                "baseline": self._baseline._jsonable()
                if isinstance(self._baseline, PerArch)
                else self._baseline,
                "constraints": [_constraint_identity(n, fn) for n, fn in self._constraints],
            }
            object.__setattr__(self, "_hash", stable_hash(content, 32))
        return self._hash  # type: ignore[return-value]

    def __repr__(self) -> str:
        parts = [f"{n}={_plain_repr(v)}" for n, v in self._params.items()]
        if self._constraints:
            parts.append(f"constraints={list(self.constraint_names)!r}")
        if self._baseline is not None:
            parts.append(f"baseline={_plain_repr(self._baseline)}")
        extra = [n for n in self._hint_names if n not in HINT_NAMES]
        if extra:
            parts.append(f"hints={extra!r}")
        return f"Space({', '.join(parts)})"

    # -- enumeration -----------------------------------------------------------------------

    def configs(self, arch: str | None = None) -> list[Config]:
        """Every valid configuration on ``arch``, in space order.

        The product of the parameters' values in definition order (the last parameter varies
        fastest), filtered by the constraints in order. Raises SpaceError if nothing remains,
        naming the constraint that removed the last configurations.
        """
        return list(self._enumerate(_arch(arch)).configs)

    def size(self, arch: str | None = None) -> int:
        """The number of valid configurations on ``arch``.

        Counted without listing the space: without constraints it is the product of the value counts;
        with constraints, a space of at most :data:`tiletune.space.lazy.LAZY_THRESHOLD` combinations is
        enumerated (and cached, as :meth:`configs` does) and a bigger one is streamed through the
        constraints one config at a time (memory stays flat; up to 2^24 combinations, as listing).
        Raises SpaceError like :meth:`configs` when nothing remains.
        """
        from tiletune.space.lazy import LAZY_THRESHOLD

        arch = _arch(arch)
        en = self._cache.get(arch)
        if en is not None:
            return len(en.configs)
        if not self._constraints:
            return self.product_size(arch)
        if self.product_size(arch) <= LAZY_THRESHOLD:
            return len(self._enumerate(arch).configs)
        values, total = self._product_values(arch)
        removed = [0] * len(self._constraints)
        n = sum(1 for _ in self._survivors(values, removed))
        if not n:
            raise self._empty_error(arch, total, removed)
        return n

    def product_size(self, arch: str | None = None) -> int:
        """The number of combinations of the parameters' values on ``arch``, before the constraints
        (the product of the value counts; nothing is enumerated)."""
        arch = _arch(arch)
        return math.prod(len(self._resolve_one(n, arch)) for n in self._names)

    def is_lazy(self, arch: str | None = None) -> bool:
        """Whether the space is too big to enumerate cheaply on ``arch``: more than
        :data:`tiletune.space.lazy.LAZY_THRESHOLD` combinations. Search strategies then work on
        :meth:`lazy` (constraints applied per config, never to the whole product)."""
        from tiletune.space.lazy import is_lazy

        return is_lazy(self, arch)

    def lazy(self, arch: str | None = None) -> "LazySpace":
        """The lazy view of the space on ``arch`` (:class:`tiletune.space.lazy.LazySpace`, cached): size,
        random valid configs, neighbours and membership without enumerating the space."""
        from tiletune.space.lazy import LazySpace

        arch = _arch(arch)
        view = self._lazy.get(arch)
        if view is None:
            view = self._lazy[arch] = LazySpace(self, arch)
        return view

    def baseline(self, arch: str | None = None) -> Config | None:
        """The baseline configuration for ``arch``, or None if there is none for it."""
        arch = _arch(arch)
        b = self._baseline
        if b is None:
            return None
        if isinstance(b, PerArch):
            if not b.covers(arch):
                return None
            b = b.resolve(arch)
        return self._make(tuple(b[n] for n in self._names))

    def candidates(self, arch: str | None = None) -> list[Config]:
        """The configurations to try on ``arch``: the baseline first (if any), then the rest in space order."""
        arch = _arch(arch)
        configs = self._enumerate(arch).configs
        base = self.baseline(arch)
        if base is None:
            return list(configs)
        return [base] + [c for c in configs if c != base]

    def is_candidate(self, cfg: Config, arch: str | None = None) -> bool:
        """Whether ``cfg`` is one of :meth:`candidates` on ``arch`` (the enumeration's index: no list or set
        of the candidates is made)."""
        arch = _arch(arch)
        return cfg in self._enumerate(arch).index or cfg == self.baseline(arch)

    def config(self, arch: str | None = None, **values: Any) -> Config:
        """Build and check one configuration from all its parameter values.

        Raises SpaceError on unknown or missing names, a value not in the parameter's values on
        ``arch`` (with ``arch=None``, parameters that have no default values are not checked), or
        a constraint that rejects it.
        """
        arch = _arch(arch)
        vals = self._assignment(values, "config")
        self._check_membership(vals, arch, "config", skip_unresolved=arch is None)
        cfg = self._make(tuple(vals[n] for n in self._names))
        failed = self._first_failure(cfg)
        if failed is not None:
            raise SpaceError(f"config {cfg!r} violates constraint {failed!r}")
        return cfg

    def index(self, cfg: Mapping[str, Any], arch: str | None = None) -> int:
        """The position of ``cfg`` in :meth:`configs` for ``arch``; SpaceError if it is not there."""
        arch = _arch(arch)
        en = self._enumerate(arch)
        c = self._coerce(cfg, en, arch)
        try:
            return en.index[c]
        except KeyError:
            failed = self._first_failure(c)
            why = f"it violates constraint {failed!r}" if failed else "it is not in the space"
            raise SpaceError(f"{c!r} is not a valid configuration {_on(arch)}: {why}") from None

    # -- for search strategies -------------------------------------------------------------

    def sample(self, rng: random.Random, arch: str | None = None, n: int = 1) -> list[Config]:
        """Up to ``n`` distinct valid configurations drawn without replacement with ``rng``.

        Fewer are returned when the space is smaller than ``n``; the result is deterministic for a
        given ``rng`` state.
        """
        if not _is_int(n) or n < 0:
            raise SpaceError(f"sample: n must be a non-negative int, got {n!r}")
        if self.is_lazy(arch):  # rejection sampling, never the whole product
            return self.lazy(arch).sample(rng, n)
        configs = self._enumerate(_arch(arch)).configs
        return rng.sample(configs, min(n, len(configs)))

    def neighbours(self, cfg: Mapping[str, Any], arch: str | None = None) -> list[Config]:
        """Valid configurations that differ from ``cfg`` in exactly one parameter, by one step.

        A step moves to the previous or next value in that parameter's value list on ``arch``.
        Ordered by parameter (definition order), the previous value before the next one.
        ``cfg`` itself need not satisfy the constraints, but its values must be in the space.
        """
        arch = _arch(arch)
        if self.is_lazy(arch):
            return self.lazy(arch).neighbours(self._assignment(cfg, "config"))
        en = self._enumerate(arch)
        c = self._coerce(cfg, en, arch)
        current = list(c.values())
        out: list[Config] = []
        for i, name in enumerate(self._names):
            vs = en.values[name]
            j = en.lookups[name][_vkey(current[i])]
            for k in (j - 1, j + 1):
                if 0 <= k < len(vs):
                    trial = list(current)
                    trial[i] = vs[k]
                    pos = en.index.get(self._make(tuple(trial)))
                    if pos is not None:
                        out.append(en.configs[pos])
        return out

    def encode(self, cfg: Mapping[str, Any], arch: str | None = None) -> list[float]:
        """One float per parameter, for model-based search.

        ``log2(value)`` when every value of that parameter (on ``arch``) is a positive number
        (bools excluded), otherwise the value's index in the parameter's value list.
        """
        arch = _arch(arch)
        if self.is_lazy(arch):
            return self.lazy(arch).encode(self._assignment(cfg, "config"))
        en = self._enumerate(arch)
        c = self._coerce(cfg, en, arch)
        out: list[float] = []
        for name, v in c.items():
            vs = en.values[name]
            if all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in vs):
                out.append(math.log2(v))  # type: ignore[arg-type]
            else:
                out.append(float(en.lookups[name][_vkey(v)]))
        return out

    def config_of(self, values: Sequence[Scalar]) -> Config:
        """The config of ``values`` (one per parameter, in space order), unchecked: neither the values
        nor the constraints (:meth:`first_failure` says which constraint it breaks). For views that
        walk the product of the values themselves (:class:`~tiletune.space.lazy.LazySpace`)."""
        return self._make(tuple(values))

    def first_failure(self, cfg: Config) -> str | None:
        """The name of the first constraint ``cfg`` breaks, or None when it keeps them all."""
        return self._first_failure(cfg)

    # -- internals -------------------------------------------------------------------------

    def _make(self, values: tuple[Scalar, ...]) -> Config:
        return Config._build(self._names, values, self._hint_set)

    def _resolve_one(self, name: str, arch: str | None) -> tuple[Scalar, ...]:
        v = self._params[name]
        if not isinstance(v, PerArch):
            return v
        if not v.covers(arch):
            if arch is None:
                raise SpaceError(
                    f"parameter {name!r} has per-architecture values without a default "
                    f"(given for {', '.join(v.archs)}); pass an architecture"
                )
            raise SpaceError(
                f"parameter {name!r} has no values for {arch} and no default (given for {', '.join(v.archs)})"
            )
        return v.resolve(arch)

    def _resolves(self, arch: str | None) -> bool:
        return all(not isinstance(v, PerArch) or v.covers(arch) for v in self._params.values())

    def _enumerate(self, arch: str | None) -> _Enumeration:
        en = self._cache.get(arch)
        if en is not None:
            return en
        values, total = self._product_values(arch)
        removed = [0] * len(self._constraints)
        kept = list(self._survivors(values, removed))
        if not kept:
            raise self._empty_error(arch, total, removed)
        en = _Enumeration(values, tuple(kept))
        self._cache[arch] = en
        return en

    def _product_values(self, arch: str | None) -> tuple[dict[str, tuple[Scalar, ...]], int]:
        """Each parameter's values on ``arch`` and the size of their product (SpaceError above 2^24)."""
        values = {n: self._resolve_one(n, arch) for n in self._names}
        total = math.prod(len(vs) for vs in values.values())
        if total > _MAX_ENUMERATED:
            raise SpaceError(
                f"the space has {total:.3g} combinations of parameter values {_on(arch)}: too many to list "
                f"(at most {_MAX_ENUMERATED}); search it with a strategy and a budget (strategies see it "
                "through Space.lazy, which never enumerates it)"
            )
        return values, total

    def _survivors(self, values: dict[str, tuple[Scalar, ...]], removed: list[int]) -> Iterator[Config]:
        """The valid configs of the product of ``values``, one at a time, in space order; ``removed[k]``
        counts the configs constraint ``k`` rejected. A config stops at the first constraint that
        rejects it, as when each constraint filtered the survivors of the previous ones."""
        build, names, hints = Config._build, self._names, self._hint_set  # what _make does, inlined
        constraints = tuple(enumerate(self._constraints))
        judge = self._judge
        for t in itertools.product(*values.values()):
            c = build(names, t, hints)
            for k, (cname, fn) in constraints:  # what _call does, inlined for the common verdicts
                try:
                    verdict = fn(c)
                except Exception as e:
                    raise SpaceError(f"constraint {cname!r} raised {type(e).__name__}: {e} for {c!r}") from e
                if verdict is True or (verdict is not False and judge(cname, verdict, c)):
                    continue
                removed[k] += 1
                break
            else:
                yield c

    def _empty_error(self, arch: str | None, total: int, removed: list[int]) -> SpaceError:
        if not total:
            return SpaceError(f"the space is empty {_on(arch)}: the product of the parameter values is empty")
        last = max(k for k, r in enumerate(removed) if r)
        before = sum(removed[:last])
        return SpaceError(
            f"the space is empty {_on(arch)}: constraint {self._constraints[last][0]!r} removed all "
            f"{total - before} remaining configurations ({total} in the product, "
            f"{before} removed by earlier constraints)"
        )

    @staticmethod
    def _call(cname: str, fn: Constraint, cfg: Config) -> bool:
        try:
            verdict = fn(cfg)
        except Exception as e:
            raise SpaceError(f"constraint {cname!r} raised {type(e).__name__}: {e} for {cfg!r}") from e
        if verdict is True or verdict is False:
            return verdict
        return Space._judge(cname, verdict, cfg)

    @staticmethod
    def _judge(cname: str, verdict: Any, cfg: Config) -> bool:
        """A constraint's verdict that is not ``True`` or ``False``: numpy's bool, else SpaceError."""
        t = type(verdict)
        if t.__module__ == "numpy" and t.__name__ in ("bool_", "bool"):  # numpy's bool scalar
            return bool(verdict)
        shown = repr(verdict)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise SpaceError(f"constraint {cname!r} returned {shown} ({t.__name__}) for {cfg!r}: "
                         "a constraint must return True (keep) or False (drop)")

    def _first_failure(self, cfg: Config) -> str | None:
        for cname, fn in self._constraints:
            if not self._call(cname, fn, cfg):
                return cname
        return None

    def _assignment(self, values: Mapping[str, Any], what: str) -> dict[str, Scalar]:
        """Check that ``values`` names every parameter exactly; return them as scalars in order."""
        if not isinstance(values, Mapping):
            raise SpaceError(f"{what} must be a dict of parameter values, got {type(values).__name__}")
        unknown = [n for n in values if n not in self._params]
        missing = [n for n in self._names if n not in values]
        if unknown or missing:
            msg = []
            if unknown:
                msg.append(f"unknown parameter(s) {_listing(unknown)}")
            if missing:
                msg.append(f"missing parameter(s) {_listing(missing)}")
            raise SpaceError(f"{what}: {'; '.join(msg)} (parameters are: {', '.join(self._names)})")
        return {n: _scalar(values[n], f"{what} parameter {n!r}") for n in self._names}

    def _check_membership(
        self, vals: Mapping[str, Scalar], arch: str | None, what: str, skip_unresolved: bool
    ) -> None:
        for n in self._names:
            p = self._params[n]
            if skip_unresolved and isinstance(p, PerArch) and not p.covers(arch):
                continue
            allowed = self._resolve_one(n, arch)
            if _vkey(vals[n]) not in {_vkey(v) for v in allowed}:
                raise SpaceError(
                    f"{what}: value {vals[n]!r} of parameter {n!r} is not among its values "
                    f"{_on(arch)}: {_plain_repr(allowed)}"
                )

    def _check_constraints(self, vals: Mapping[str, Scalar], what: str) -> None:
        cfg = self._make(tuple(vals[n] for n in self._names))
        failed = self._first_failure(cfg)
        if failed is not None:
            raise SpaceError(f"{what} {cfg!r} violates constraint {failed!r}")

    def _normalise_baseline(self, baseline: Any) -> dict[str, Scalar] | PerArch | None:
        if baseline is None:
            return None
        if isinstance(baseline, PerArch):
            checked: dict[str, Any] = {}
            for a, d in baseline.by_arch.items():
                vals = self._assignment(d, f"baseline for {a}")
                if not self._resolves(a):
                    missing = [n for n in self._names if isinstance(self._params[n], PerArch)
                               and not self._params[n].covers(a)]  # type: ignore[union-attr]
                    raise SpaceError(
                        f"baseline given for {a}, but parameter(s) {_listing(missing)} have no values for {a}"
                    )
                self._check_membership(vals, a, f"baseline for {a}", skip_unresolved=False)
                self._check_constraints(vals, f"baseline for {a}")
                checked[a] = vals
            default = None
            if baseline.has_default:
                default = self._assignment(baseline.default, "default baseline")
                self._check_plain_baseline(default, "default baseline", skip=set(baseline.archs))
            return PerArch(default, **checked)
        if not isinstance(baseline, Mapping):
            raise SpaceError(
                f"baseline must be a dict of parameter values or a per_arch(...) of them, got {type(baseline).__name__}"
            )
        vals = self._assignment(baseline, "baseline")
        self._check_plain_baseline(vals, "baseline", skip=set())
        return vals

    def _check_plain_baseline(self, vals: dict[str, Scalar], what: str, skip: set[str]) -> None:
        """A baseline used on every architecture: check it against the defaults and each named arch."""
        self._check_membership(vals, None, what, skip_unresolved=True)
        for a in self._archs:
            if a not in skip and self._resolves(a):
                self._check_membership(vals, a, what, skip_unresolved=False)
        self._check_constraints(vals, what)

    def _coerce(self, cfg: Mapping[str, Any], en: _Enumeration, arch: str | None) -> Config:
        """``cfg`` as a Config in this space's parameter order, its values checked against ``en``."""
        vals = self._assignment(cfg, "config")
        for n in self._names:
            if _vkey(vals[n]) not in en.lookups[n]:
                raise SpaceError(
                    f"value {vals[n]!r} of parameter {n!r} is not among its values "
                    f"{_on(arch)}: {_plain_repr(en.values[n])}"
                )
        return self._make(tuple(vals[n] for n in self._names))


def _normalise_values(name: str, values: Any, where: str) -> tuple[Scalar, ...]:
    if not isinstance(values, (list, tuple)):
        raise SpaceError(
            f"{where}: values must be a list or tuple (or per_arch(...)), got {type(values).__name__}: "
            f"{values!r} (write {name}=[{values!r}] for a single value)"
        )
    if not values:
        raise SpaceError(f"{where}: no values (the list is empty)")
    out: list[Scalar] = []
    seen: set[tuple[bool, Scalar]] = set()
    for v in values:
        s = _scalar(v, where)
        k = _vkey(s)
        if k in seen:
            raise SpaceError(f"{where}: duplicate value {s!r}")
        seen.add(k)
        out.append(s)
    return tuple(out)


def _normalise_param(name: str, values: Any) -> tuple[Scalar, ...] | PerArch:
    if isinstance(values, PerArch):
        return values._map(
            lambda v, a: _normalise_values(
                name, v, f"parameter {name!r} " + ("(default)" if a is None else f"for {a}")
            )
        )
    return _normalise_values(name, values, f"parameter {name!r}")


def _normalise_constraints(constraints: Any) -> tuple[tuple[str, Constraint], ...]:
    if constraints is None:
        return ()
    items: list[tuple[str, Any]] = []
    if isinstance(constraints, Mapping):
        for k, fn in constraints.items():
            if not isinstance(k, str) or not k:
                raise SpaceError(f"constraint names must be non-empty strings, got {k!r}")
            items.append((k, fn))
    elif callable(constraints):
        items.append((_constraint_name(constraints, 0, set()), constraints))
    elif isinstance(constraints, (list, tuple)):
        used: set[str] = set()
        for i, fn in enumerate(constraints):
            cname = _constraint_name(fn, i, used)
            used.add(cname)
            items.append((cname, fn))
    else:
        raise SpaceError(
            f"constraints= must be a list of callables or a dict name -> callable, got {type(constraints).__name__}"
        )
    for cname, fn in items:
        if not callable(fn):
            raise SpaceError(f"constraint {cname!r} is not callable: {fn!r}")
    return tuple(items)


def _constraint_name(fn: Any, i: int, used: set[str]) -> str:
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or not name or name == "<lambda>":
        name = f"constraint #{i}"
    if name in used:
        name = f"{name} #{i}"
    return name
