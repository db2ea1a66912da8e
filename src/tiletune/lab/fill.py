"""Fill a tuning database ahead of time: many ops x shapes in one go (``tiletune tune``).

Warm a machine before serving, so no request stalls on a first call: every listed call is made
once on fresh tensors, which tunes its key (or finds it in the database, a table or a tuned bucket)
and records the winner. Re-running the same list after an interruption skips what is already
stored (those calls are database hits), so a fill is resumable.

A list of calls comes from a spec file (JSON, or TOML on Python 3.11+)::

    {"calls": [
      {"op": "tiletune.kernels:rms_norm",
       "args": [{"shape": [8, 4096], "dtype": "bfloat16"}, {"shape": [4096], "dtype": "bfloat16"}],
       "kwargs": {"eps": 1e-6}},
      {"op": "mypkg.ops:my_tuned_op", "args": [{"shape": [1024]}, {"shape": [1024]}, 3]}
    ]}

A tensor argument is ``{"shape": [...], "dtype": "bfloat16", "fill": "normal" | "zeros" |
"randint:N", "transposed": false}`` (dtype float32 and fill normal by default; ``randint:N`` draws
integers in [0, N), e.g. class indices; ``transposed``: the tensor is the transpose of a contiguous one,
its last two dimensions swapped, like ``w.t()`` of an ``nn.Linear`` weight); anything else is passed
as it is. Tensors go to ``device`` (``cuda`` by default). Or from the library's LLM shapes
(:func:`llm_calls`): ``tiletune tune rms_norm matmul --tokens 1,8,128 --hidden 4096``.
"""

from __future__ import annotations

import importlib
import json
import math
import pathlib
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = ["Call", "load_spec", "llm_calls", "LLM_OPS", "resolve_op", "materialize", "run_calls", "FillReport", "tune_calls",
           "tune_pending"]


@dataclass(frozen=True)
class Call:
    """One call to make: the op's import path, its arguments (tensor specs or values), keywords."""

    op: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        def one(a: Any) -> str:
            if isinstance(a, Mapping) and "shape" in a:
                return (f"{'x'.join(str(n) for n in a['shape'])}:{a.get('dtype', 'float32')}"
                        + (":transposed" if a.get("transposed") else ""))
            return repr(a)

        parts = [one(a) for a in self.args] + [f"{k}={one(v)}" for k, v in self.kwargs.items()]
        return f"{self.op}({', '.join(parts)})"


def _tensor_spec(value: Any, where: str) -> Any:
    """Validate a tensor spec (a mapping with ``shape``); other values pass."""
    if not isinstance(value, Mapping) or "shape" not in value:
        return value
    shape = value["shape"]
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 2**40
                                               for n in shape):
        raise ValueError(f"{where}.shape: expected a list of non-negative ints, got {shape!r}")
    unknown = set(value) - {"shape", "dtype", "fill", "transposed"}
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {sorted(unknown)} (a tensor has shape, dtype, fill, transposed)")
    transposed = value.get("transposed", False)
    if not isinstance(transposed, bool):
        raise ValueError(f"{where}.transposed: expected true or false, got {transposed!r}")
    if transposed and len(shape) < 2:
        raise ValueError(f"{where}.transposed: a transposed tensor needs two or more dimensions, got shape {shape}")
    fill = value.get("fill", "normal")
    if not (fill in ("normal", "zeros") or (isinstance(fill, str) and fill.startswith("randint:")
                                             and fill[8:].isdigit() and int(fill[8:]) > 0)):
        raise ValueError(f"{where}.fill: expected 'normal', 'zeros' or 'randint:N', got {fill!r}")
    return dict(value)


def load_spec(path: str | pathlib.Path) -> list[Call]:
    """The calls of a spec file (JSON, or TOML with Python 3.11+); ValueError names the bad field."""
    p = pathlib.Path(path)
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".toml":
        try:
            import tomllib
        except ImportError as exc:  # pragma: no cover - Python 3.10
            raise ValueError(f"{p}: TOML specs need Python 3.11+ (tomllib); write it as JSON") from exc
        try:
            doc = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{p}: not valid TOML: {exc}") from None
    else:
        try:
            doc = json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(f"{c} is not allowed")))
        except ValueError as exc:
            raise ValueError(f"{p}: not valid JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("calls"), list) or not doc["calls"]:
        raise ValueError(f"{p}: expected {{\"calls\": [...]}} with at least one call")
    calls = []
    for i, raw in enumerate(doc["calls"]):
        where = f"{p}: calls[{i}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("op"), str) or ":" not in raw["op"]:
            raise ValueError(f"{where}: expected an object with \"op\": \"package.module:function\"")
        args = raw.get("args", [])
        kwargs = raw.get("kwargs", {})
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise ValueError(f"{where}: args must be a list and kwargs an object")
        unknown = set(raw) - {"op", "args", "kwargs"}
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {sorted(unknown)}")
        calls.append(Call(raw["op"], tuple(_tensor_spec(a, f"{where}.args[{j}]") for j, a in enumerate(args)),
                          {k: _tensor_spec(v, f"{where}.kwargs.{k}") for k, v in kwargs.items()}))
    return calls


# ------------------------------------------------------------------------------------ LLM shapes


def _t(shape: Sequence[int], dtype: str, fill: str = "normal", transposed: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"shape": list(shape), "dtype": dtype, "fill": fill}
    if transposed:
        spec["transposed"] = True
    return spec


def _llm_args(op: str, m: int, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
              vocab: int, dtype: str, linear_weights: bool = False) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if op in ("rms_norm", "layer_norm"):
        extra = (_t([hidden], dtype),) * (1 if op == "rms_norm" else 2)
        return (_t([m, hidden], dtype), *extra), {}
    if op == "rms_norm_residual":
        return (_t([m, hidden], dtype), _t([m, hidden], dtype), _t([hidden], dtype)), {}
    if op == "softmax":
        return (_t([m, hidden], dtype),), {}
    if op in ("swiglu", "geglu"):
        return (_t([m, 2 * intermediate], dtype),), {}
    if op == "matmul":  # one hidden x hidden projection (llm_calls(projections=True): every one of a layer)
        return (_t([m, hidden], dtype), _t([hidden, hidden], dtype, transposed=linear_weights)), {}
    if op == "apply_rope_":
        return (_t([1, m, heads, head_dim], dtype), _t([1, m, kv_heads, head_dim], dtype),
                _t([m, head_dim], dtype), _t([m, head_dim], dtype)), {}
    if op == "attention":
        return (_t([1, heads, m, head_dim], dtype), _t([1, kv_heads, m, head_dim], dtype),
                _t([1, kv_heads, m, head_dim], dtype)), {"causal": True}
    if op == "cross_entropy":
        return (_t([m, vocab], dtype), _t([m], "int64", f"randint:{vocab}")), {}
    raise ValueError(f"unknown library op {op!r}; choose from {', '.join(LLM_OPS)}")


LLM_OPS = ("rms_norm", "rms_norm_residual", "layer_norm", "softmax", "swiglu", "geglu", "matmul", "apply_rope_",
           "attention", "cross_entropy")

#: Decoder shapes of common models, as :func:`llm_calls` keyword arguments (``--model`` of ``tiletune
#: tune`` and ``benchmarks/make_table.py``). Without a model, llm_calls uses Llama-class shapes with a
#: 32000-word vocabulary.
MODEL_SHAPES: dict[str, dict[str, int]] = {
    "llama3-8b": dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256),
    "mistral-7b": dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, vocab=32768),
    "qwen2.5-7b": dict(hidden=3584, intermediate=18944, heads=28, kv_heads=4, head_dim=128, vocab=152064),
}


def model_dims(model: str | None = None, **given: int | None) -> dict[str, int]:
    """:func:`llm_calls` keyword arguments: ``model``'s :data:`MODEL_SHAPES` (none: llm_calls' own
    defaults), then each of ``given`` that is not None (``hidden=3584``, ...). ValueError for an
    unknown model."""
    if model is not None and model not in MODEL_SHAPES:
        raise ValueError(f"unknown model {model!r}; choose from {', '.join(MODEL_SHAPES)}")
    dims = dict(MODEL_SHAPES[model]) if model is not None else {}
    dims.update({k: v for k, v in given.items() if v is not None})
    return dims


def _projections(m: int, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
                 dtype: str, linear_weights: bool = False) -> list[tuple[Any, ...]]:
    """``(x, w)`` of each projection of a decoder layer. Weights stored ``[K, N]``: fused qkv, attention
    output, fused gate-up, down. With ``linear_weights``, a layer of separate ``nn.Linear`` layers (the
    Hugging Face layout): q, k (= v), o, gate (= up) and down, each ``(K, N)`` once, the weight stored
    ``[N, K]`` and passed transposed, as ``F.linear`` reads it."""
    q, kv = heads * head_dim, kv_heads * head_dim
    if linear_weights:
        kn = list(dict.fromkeys(((hidden, q), (hidden, kv), (q, hidden), (hidden, intermediate),
                                 (intermediate, hidden))))
    else:
        kn = [(hidden, q + 2 * kv), (q, hidden), (hidden, 2 * intermediate), (intermediate, hidden)]
    return [(_t([m, k], dtype), _t([k, n], dtype, transposed=linear_weights)) for k, n in kn]


def llm_calls(ops: Iterable[str], tokens: Iterable[int], *, hidden: int = 4096, intermediate: int = 14336,
              heads: int = 32, kv_heads: int = 8, head_dim: int = 128, vocab: int = 32000,
              dtype: str = "bfloat16", projections: bool = False, linear_weights: bool = False) -> list[Call]:
    """Calls of library ops over token counts of a Llama-class decoder (hidden 4096, GQA 32/8 by
    default; :data:`MODEL_SHAPES` for others): norms and activations over ``[tokens, hidden]`` rows,
    the matmul of a ``hidden x hidden`` projection (with ``projections``: the four projections of a
    layer, qkv, output, gate-up and down, weights stored ``[K, N]``), RoPE and causal attention over a
    sequence of ``tokens``, cross-entropy over ``vocab`` classes. ``linear_weights``: matmul weights in
    ``nn.Linear``'s layout (stored ``[N, K]``, passed as ``w.t()``), and with ``projections`` the
    separate q, k, v, o, gate, up and down layers of a Hugging Face decoder, each shape once."""
    out = []
    for op in ops:
        for m in tokens:
            if m < 1:
                raise ValueError(f"token counts must be >= 1, got {m}")
            if op == "matmul" and projections:
                out += [Call("tiletune.kernels:matmul", xw, {})
                        for xw in _projections(int(m), hidden, intermediate, heads, kv_heads, head_dim, dtype,
                                               linear_weights)]
                continue
            args, kwargs = _llm_args(op, int(m), hidden, intermediate, heads, kv_heads, head_dim, vocab, dtype,
                                     linear_weights)
            out.append(Call(f"tiletune.kernels:{op}", args, kwargs))
    return out


# ------------------------------------------------------------------------------------ running


def resolve_op(path: str) -> Callable[..., Any]:
    """``package.module:attribute`` to the callable it names (ValueError with the reason otherwise)."""
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{path!r}: expected package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{path!r}: cannot import {module_name!r} ({exc})") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{path!r}: {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{path!r} is not callable")
    return obj


def _allocate(value: Any, device: str) -> Any:
    """A tensor spec as an uninitialised tensor (no kernel runs); other values as they are."""
    if not isinstance(value, Mapping) or "shape" not in value:
        return value
    import torch

    dtype = getattr(torch, value.get("dtype", "float32"), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {value.get('dtype')!r}")
    shape = list(value["shape"])
    transposed = value.get("transposed", False)
    if transposed:  # allocated as the contiguous tensor it is the transpose of
        shape[-2:] = shape[-1], shape[-2]
    t = torch.empty(shape, dtype=dtype, device=device)
    return t.transpose(-1, -2) if transposed else t


def _fill(t: Any, value: Any, gen: Any) -> None:
    """Write a tensor spec's ``fill`` into ``t`` (made by :func:`_allocate` from ``value``)."""
    if not isinstance(value, Mapping) or "shape" not in value:
        return
    import torch

    shape = tuple(value["shape"])
    fill = value.get("fill", "normal")
    if fill == "zeros":
        t.zero_()
    elif fill.startswith("randint:"):
        t.copy_(torch.randint(0, int(fill[8:]), shape, dtype=t.dtype, device=t.device, generator=gen))
    else:
        f = torch.empty(shape, dtype=torch.float32, device=t.device)
        f.normal_(generator=gen)
        if len(shape) >= 2 and shape[-1] > 1:
            f /= math.sqrt(shape[-1])  # keeps products (matmul, attention) in range
        t.copy_(f)


def _materialize(value: Any, device: str, gen: Any) -> Any:
    t = _allocate(value, device)
    if device != "meta":
        _fill(t, value, gen)
    return t


def materialize(call: Call, device: str = "cuda", gen: Any = None) -> tuple[list[Any], dict[str, Any]]:
    """The tensors of ``call``: its tensor specs made on ``device`` (random from ``gen``), other values
    as given."""
    args = [_materialize(a, device, gen) for a in call.args]
    kwargs = {k: _materialize(v, device, gen) for k, v in call.kwargs.items()}
    return args, kwargs


@dataclass
class FillReport:
    """What a fill did, per call: ``ok`` (seconds) or the error."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(1 for r in self.rows if not r["ok"])

    def as_dict(self) -> dict[str, Any]:
        return {"calls": len(self.rows), "failed": self.failed, "rows": self.rows}


def run_calls(calls: Sequence[Call], *, device: str = "cuda", seed: int = 0, progress: bool | None = None,
              on_row: Callable[[dict[str, Any]], None] | None = None) -> FillReport:
    """Make every call once (tuning each new key exactly: no neighbour's config answers a fill); a failing call
    is reported and the fill goes on."""
    import torch

    from tiletune.engine.progress import tuning_progress

    from tiletune.resolve.chain import miss_scope

    gen = torch.Generator(device=device).manual_seed(seed) if device != "meta" else None
    report = FillReport()
    with tuning_progress("fill", len(calls), progress) as bar, miss_scope(on_miss="tune"):  # every key exactly
        for i, call in enumerate(calls):
            t0 = time.perf_counter()
            row: dict[str, Any] = {"call": call.describe()}
            try:
                fn = resolve_op(call.op)
                args, kwargs = materialize(call, device, gen)
                fn(*args, **kwargs)
                if device.startswith("cuda"):
                    torch.cuda.synchronize()
                row.update(ok=True, seconds=round(time.perf_counter() - t0, 3))
            except Exception as exc:  # noqa: BLE001 - one failing call must not stop a fill
                row.update(ok=False, seconds=round(time.perf_counter() - t0, 3), error=f"{type(exc).__name__}: {exc}")
            report.rows.append(row)
            if on_row is not None:
                on_row(row)
            if bar is not None:
                bar(call.describe(), i + 1, len(calls))
    return report


def tune_calls(calls: Sequence[Call], *, device: str = "cuda", seed: int = 0,
               progress: bool | None = None) -> FillReport:
    """Make ``calls`` split across the ranks (rank ``r`` makes calls ``r, r + W, ...``, tuning their
    keys in parallel), then wait for every rank (a barrier). Afterwards each key has one pick in the
    job, and a rank that misses one of them gets it at once. Outside a multi-rank job: every call
    here. Every rank must call this (the barrier is a collective). Returns this rank's report."""
    from tiletune.resolve.peers import torch_distributed

    dist = torch_distributed()
    mine = list(calls) if dist is None else list(calls)[dist.get_rank()::dist.get_world_size()]
    report = run_calls(mine, device=device, seed=seed, progress=progress)
    if dist is not None:
        dist.barrier()
    return report


def tune_pending(*, device: str = "cuda", db_path: str | None = None,
                 on_row: Callable[[dict[str, Any]], None] | None = None) -> FillReport:
    """Tune the keys recorded in the tuning database's pending file (keys answered provisionally, see
    :mod:`tiletune.resolve.pending`), each on fresh tensors of its recorded shapes; a tuned key is taken
    off the file. Keys of ops that are not library ops cannot be rebuilt in another process: they are
    reported (tune them with ``op.tune_pending()`` in the program that made them)."""
    import importlib

    import torch

    from tiletune.kernels.library_op import LibraryOp
    from tiletune.resolve import pending
    from tiletune.resolve.database import open_database

    import tiletune.kernels as kernels

    for name in kernels.__all__ + ["decode_attention", "kv_cache_append", "matmul_swiglu"]:
        getattr(kernels, name)  # every library op constructed (their modules import lazily)
    importlib.import_module("tiletune.kernels.gemm")
    db = open_database(db_path)
    path = pending.pending_path(db)
    report = FillReport()
    done: list[tuple[str, str, str]] = []
    for entry in pending.read(path):
        t0 = time.perf_counter()
        row: dict[str, Any] = {"call": f"{entry['name']} {entry['key'][:120]}"}
        try:
            origin = entry.get("origin")
            if not isinstance(origin, dict) or "library" not in origin:
                raise ValueError("not a library op: tune it with op.tune_pending() in the program that met it")
            lib = LibraryOp.named(origin["library"])
            if lib is None:
                raise ValueError(f"no library op named {origin['library']!r}")
            if entry.get("args") is None:
                raise ValueError("its arguments were not recorded")
            op = lib.op_for_origin(origin.get("regime"))
            if db is not None and op.db is not None and op.db.where != db.where:
                raise ValueError(f"the library ops use {op.db.where}, not {db.where}")
            args = pending.materialize(entry["args"], device)
            key_json = op.problem(args, op.key_of(*args)).identity.key
            if key_json != entry["key"]:
                raise ValueError(f"the rebuilt call's key {key_json} differs from the recorded {entry['key']}")
            cfg = op.tune(*args)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            done.append(pending.identity_of(entry))
            row.update(ok=True, seconds=round(time.perf_counter() - t0, 3), config=cfg.as_dict())
        except Exception as exc:  # noqa: BLE001 - one failing key must not stop the rest
            row.update(ok=False, seconds=round(time.perf_counter() - t0, 3), error=f"{type(exc).__name__}: {exc}")
        report.rows.append(row)
        if on_row is not None:
            on_row(row)
    if done:
        pending.remove(path, done)
    return report
