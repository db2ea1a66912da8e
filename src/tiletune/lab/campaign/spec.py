"""A campaign's spec file: which ops, over which shapes and dtypes, with which strategy and budget.

TOML (``tomllib``), YAML (when PyYAML is importable) or JSON, one document::

    device = "cuda"                # where tensors are made (default "cuda")
    seed = 0                       # data of the tensors, seed of the strategies

    [defaults]                     # optional: what every [[ops]] entry starts from
    dtypes = ["bfloat16"]
    strategy = "exhaustive"        # any registered strategy name, or package.module:Class
    budget = { evals = 16, seconds = 60 }

    [[ops]]                        # a library op (tiletune.kernels): tensors from LLM dimensions
    op = "rms_norm"                # or "tiletune.kernels:rms_norm"
    tokens = [1, 128, 4096]        # each list is an axis of a grid of calls
    hidden = [4096, 8192]

    [[ops]]                        # any op by import path: tensors by named dimensions
    op = "mypkg.ops:fused_thing"
    args = [{ shape = ["M", "N"] }, { shape = ["N"], dtype = "float32" }, { dim = "M" }]
    kwargs = { eps = 1e-6 }
    shapes = { M = [128, 4096], N = [4096] }            # a grid of dimensions
    # shapes = [{ M = 128, N = 4096 }, { M = 4096, N = 8192 }]   # or a list of points
    dtypes = ["bfloat16", "float16"]                     # tensors without a dtype of their own
    strategy = "random"
    budget = { evals = 8 }

A tensor is ``{shape = [...], dtype = ..., fill = "normal" | "zeros" | "randint:N"}`` whose shape
entries are integers or dimension names; ``{dim = "M"}`` passes a dimension's value as an integer;
anything else is passed as it is. Library ops take the dimensions ``tokens`` (rows), ``hidden``,
``intermediate``, ``heads``, ``kv_heads``, ``head_dim`` and ``vocab`` (defaults of
:func:`tiletune.lab.fill.llm_calls`), each a number or a list. Every combination of the lists of an
entry is one call, for each of its dtypes; calls that come out the same (an op that ignores a
dimension) are made once. Each call is one task of the campaign: the tuned ops it reaches tune their
keys (or find them in the database) with the entry's strategy and budget.
"""

from __future__ import annotations

import itertools
import json
import pathlib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from tiletune.lab.fill import LLM_OPS, Call, _llm_args, _tensor_spec
from tiletune.space.strategies.base import Budget

__all__ = ["CampaignSpec", "Task", "load_campaign", "parse_campaign", "LLM_DIMS"]

#: Dimensions of the library ops' LLM shapes and their defaults (a Llama-class 8B decoder).
LLM_DIMS = {"tokens": 128, "hidden": 4096, "intermediate": 14336, "heads": 32, "kv_heads": 8, "head_dim": 128,
            "vocab": 32000}
_ENTRY_FIELDS = {"op", "args", "kwargs", "shapes", "dtypes", "strategy", "budget", "seed", "strategy_options",
                 *LLM_DIMS}
_TOP_FIELDS = {"device", "seed", "defaults", "ops", "name"}


@dataclass(frozen=True)
class Task:
    """One call of a campaign and how to tune the keys it meets. JSON-able (:meth:`as_json`)."""

    id: str  # the call's description: unique in a campaign
    call: Call
    label: str  # the op as the spec named it (the report's per-op grouping)
    strategy: str | None = None
    budget: Budget | None = None
    seed: int = 0
    strategy_options: Mapping[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        b = self.budget
        return {"id": self.id, "label": self.label, "op": self.call.op, "args": list(self.call.args),
                "kwargs": dict(self.call.kwargs), "strategy": self.strategy, "seed": self.seed,
                "budget": None if b is None else {"evals": b.max_evals, "seconds": b.max_seconds},
                "strategy_options": dict(self.strategy_options)}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "Task":
        b = d.get("budget")
        return Task(id=str(d["id"]), call=Call(str(d["op"]), tuple(d.get("args", ())), dict(d.get("kwargs", {}))),
                    label=str(d["label"]), strategy=d.get("strategy"), seed=int(d.get("seed", 0)),
                    budget=None if b is None else Budget(max_evals=b.get("evals"), max_seconds=b.get("seconds")),
                    strategy_options=dict(d.get("strategy_options") or {}))


@dataclass(frozen=True)
class CampaignSpec:
    """A loaded spec: its tasks (in spec order, duplicates removed) and where tensors are made."""

    tasks: tuple[Task, ...]
    device: str = "cuda"
    seed: int = 0
    name: str = "campaign"
    source: str = ""


def _read(path: pathlib.Path) -> Any:
    text = path.read_text(encoding="utf-8")
    suffix = path.suffix.lower()
    if suffix == ".toml":
        try:
            import tomllib
        except ImportError as exc:  # pragma: no cover - Python 3.10
            raise ValueError(f"{path}: TOML specs need Python 3.11+ (tomllib); write it as YAML or JSON") from exc
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not valid TOML: {exc}") from None
    if suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise ValueError(f"{path}: YAML specs need PyYAML (pip install pyyaml); or write the spec as TOML") from None
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
    if suffix == ".json":
        try:
            return json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} is not allowed")))
        except ValueError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from None
    raise ValueError(f"{path}: a campaign spec is a .toml, .yaml/.yml or .json file")


def load_campaign(path: str | pathlib.Path) -> CampaignSpec:
    """Read and validate a spec file; ValueError names the file and the bad field."""
    p = pathlib.Path(path)
    return parse_campaign(_read(p), str(p))


def _int(value: Any, where: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{where}: expected an integer >= {low}, got {value!r}")
    return value


def _axis(value: Any, where: str) -> list[Any]:
    """A number or a non-empty list of them: one axis of a grid."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise ValueError(f"{where}: expected a number or a non-empty list, got []")
    return [_int(v, f"{where}[{i}]" if isinstance(value, list) else where, 1) for i, v in enumerate(values)]


def _budget(value: Any, where: str) -> Budget | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) - {"evals", "seconds"}:
        raise ValueError(f"{where}: expected {{evals = N, seconds = S}} (either or both), got {value!r}")
    try:
        return Budget(max_evals=value.get("evals"), max_seconds=value.get("seconds"))
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _strategy(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a strategy name or package.module:Class, got {value!r}")
    from tiletune.space.strategies import resolve_strategy

    try:
        resolve_strategy(value)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    return value


def _points(shapes: Any, where: str) -> list[dict[str, int]]:
    """The dimension points of ``shapes``: a grid (a table of lists) or a list of tables."""
    if shapes is None:
        return [{}]
    if isinstance(shapes, Mapping):
        names = list(shapes)
        axes = [_axis(shapes[n], f"{where}.{n}") for n in names]
        return [dict(zip(names, combo)) for combo in itertools.product(*axes)]
    if isinstance(shapes, list) and shapes:
        out = []
        for i, pt in enumerate(shapes):
            if not isinstance(pt, Mapping):
                raise ValueError(f"{where}[{i}]: expected a table of dimension values, got {pt!r}")
            out.append({str(k): _int(v, f"{where}[{i}].{k}", 1) for k, v in pt.items()})
        return out
    raise ValueError(f"{where}: expected a table of dimension lists or a non-empty list of tables, got {shapes!r}")


def _bind(value: Any, dims: Mapping[str, int], dtype: str | None, where: str) -> Any:
    """A user op's argument with its dimension names replaced by the point's values."""
    if isinstance(value, Mapping) and set(value) == {"dim"}:
        name = value["dim"]
        if name not in dims:
            raise ValueError(f"{where}: unknown dimension {name!r} (shapes define {sorted(dims)})")
        return dims[name]
    if isinstance(value, Mapping) and "shape" in value:
        shape = value["shape"]
        if not isinstance(shape, list):
            raise ValueError(f"{where}.shape: expected a list of integers and dimension names, got {shape!r}")
        bound = []
        for j, n in enumerate(shape):
            if isinstance(n, str):
                if n not in dims:
                    raise ValueError(f"{where}.shape[{j}]: unknown dimension {n!r} (shapes define {sorted(dims)})")
                n = dims[n]
            bound.append(n)
        spec = dict(value, shape=bound)
        if "dtype" not in spec and dtype is not None:
            spec["dtype"] = dtype
        return _tensor_spec(spec, where)
    return value


def _library_name(op: str) -> str | None:
    if op in LLM_OPS:
        return op
    module, _, attr = op.partition(":")
    return attr if module == "tiletune.kernels" and attr in LLM_OPS else None


def _entry_calls(raw: Mapping[str, Any], where: str) -> tuple[str, list[Call]]:
    op = raw.get("op")
    if not isinstance(op, str) or not op:
        raise ValueError(f"{where}.op: expected a library op name ({', '.join(LLM_OPS)}) or package.module:function")
    dtypes = raw.get("dtypes")
    if dtypes is not None and (not isinstance(dtypes, list) or not dtypes
                               or not all(isinstance(d, str) and d for d in dtypes)):
        raise ValueError(f"{where}.dtypes: expected a non-empty list of dtype names, got {dtypes!r}")
    library = _library_name(op) if "args" not in raw else None
    if library is not None:
        if "shapes" in raw or "kwargs" in raw:
            raise ValueError(f"{where}: a library op takes LLM dimensions ({', '.join(LLM_DIMS)}), not shapes/kwargs")
        axes = {d: _axis(raw.get(d, default), f"{where}.{d}") for d, default in LLM_DIMS.items()}
        calls = []
        for dtype in dtypes or ["bfloat16"]:
            for combo in itertools.product(*axes.values()):
                dims = dict(zip(axes, combo))
                args, kwargs = _llm_args(library, dims["tokens"], dims["hidden"], dims["intermediate"], dims["heads"],
                                         dims["kv_heads"], dims["head_dim"], dims["vocab"], dtype)
                calls.append(Call(f"tiletune.kernels:{library}", args, kwargs))
        return f"tiletune.kernels:{library}", calls
    if ":" not in op:
        raise ValueError(f"{where}.op: {op!r} is neither a library op ({', '.join(LLM_OPS)}) nor "
                         "package.module:function")
    stray = sorted(set(raw) & set(LLM_DIMS))
    if stray:
        raise ValueError(f"{where}: {', '.join(stray)} are dimensions of the library ops; an op by import path "
                         "takes args and shapes")
    args, kwargs = raw.get("args", []), raw.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, Mapping):
        raise ValueError(f"{where}: args must be a list and kwargs a table")
    calls = []
    for dtype in dtypes or [None]:
        for dims in _points(raw.get("shapes"), f"{where}.shapes"):
            calls.append(Call(op, tuple(_bind(a, dims, dtype, f"{where}.args[{j}]") for j, a in enumerate(args)),
                              {k: _bind(v, dims, dtype, f"{where}.kwargs.{k}") for k, v in kwargs.items()}))
    return op, calls


def parse_campaign(doc: Any, origin: str = "<spec>") -> CampaignSpec:
    """Validate a spec document (see the module docstring) and expand it into tasks."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"{origin}: expected a table with [[ops]] entries")
    unknown = set(doc) - _TOP_FIELDS
    if unknown:
        raise ValueError(f"{origin}: unknown field(s) {sorted(unknown)} (a spec has {sorted(_TOP_FIELDS)})")
    device = doc.get("device", "cuda")
    if not isinstance(device, str) or not device:
        raise ValueError(f"{origin}: device: expected a device name such as cuda or cpu, got {device!r}")
    seed = _int(doc.get("seed", 0), f"{origin}: seed")
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, Mapping) or set(defaults) - (_ENTRY_FIELDS - {"op", "args", "kwargs"}):
        raise ValueError(f"{origin}: defaults: expected a table of entry fields "
                         f"({', '.join(sorted(_ENTRY_FIELDS - {'op', 'args', 'kwargs'}))})")
    entries = doc.get("ops")
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{origin}: expected at least one [[ops]] entry")
    tasks: list[Task] = []
    seen: set[str] = set()
    for i, raw in enumerate(entries):
        where = f"{origin}: ops[{i}]"
        if not isinstance(raw, Mapping):
            raise ValueError(f"{where}: expected a table")
        unknown = set(raw) - _ENTRY_FIELDS
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")
        # defaults' LLM dimensions go to library ops only, their shapes to ops by import path only
        library = "args" not in raw and _library_name(str(raw.get("op"))) is not None
        drop = {"shapes"} if library else set(LLM_DIMS)
        entry = {**{k: v for k, v in defaults.items() if k not in drop}, **raw}
        label, calls = _entry_calls(entry, where)
        strategy = _strategy(entry.get("strategy"), f"{where}.strategy")
        budget = _budget(entry.get("budget"), f"{where}.budget")
        task_seed = _int(entry.get("seed", seed), f"{where}.seed")
        options = entry.get("strategy_options", {})
        if not isinstance(options, Mapping):
            raise ValueError(f"{where}.strategy_options: expected a table")
        for call in calls:
            cid = call.describe()
            try:
                json.dumps([call.args, dict(call.kwargs)], allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}: an argument cannot travel to a worker as JSON ({exc})") from None
            if cid in seen:
                continue
            seen.add(cid)
            tasks.append(Task(cid, call, label, strategy, budget, task_seed, dict(options)))
    name = doc.get("name", pathlib.Path(origin).stem if origin != "<spec>" else "campaign")
    return CampaignSpec(tuple(tasks), device=device, seed=seed, name=str(name), source=origin)


def tasks_from_calls(calls: Sequence[Call], *, strategy: str | None = None, budget: Budget | None = None,
                     seed: int = 0) -> list[Task]:
    """Tasks of plain calls (``tiletune tune`` lists), duplicates removed, labelled by their op."""
    out, seen = [], set()
    for c in calls:
        cid = c.describe()
        if cid not in seen:
            seen.add(cid)
            out.append(Task(cid, c, c.op, strategy, budget, seed))
    return out
