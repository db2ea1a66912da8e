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
import os
import pathlib
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = ["Call", "load_spec", "llm_calls", "LLM_OPS", "resolve_op", "materialize", "run_calls", "FillReport", "tune_calls",
           "tune_pending", "decoder_layer", "layer_inputs", "layer_keys", "layer_calls", "KeyRecorder", "PHASES",
           "parse_range"]


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
    if op == "softmax":  # over the vocabulary: a language model's softmax outside attention (sampling)
        return (_t([m, vocab], dtype),), {}
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
#: 32000-word vocabulary. Any other model: its Hugging Face ``config.json`` (:func:`hf_config_dims`).
MODEL_SHAPES: dict[str, dict[str, int]] = {
    "llama3-8b": dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256),
    "llama3-70b": dict(hidden=8192, intermediate=28672, heads=64, kv_heads=8, head_dim=128, vocab=128256),
    "llama3.2-1b": dict(hidden=2048, intermediate=8192, heads=32, kv_heads=8, head_dim=64, vocab=128256),
    "llama3.2-3b": dict(hidden=3072, intermediate=8192, heads=24, kv_heads=8, head_dim=128, vocab=128256),
    "mistral-7b": dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, vocab=32768),
    "qwen2.5-7b": dict(hidden=3584, intermediate=18944, heads=28, kv_heads=4, head_dim=128, vocab=152064),
    "qwen2.5-14b": dict(hidden=5120, intermediate=13824, heads=40, kv_heads=8, head_dim=128, vocab=152064),
    "qwen2.5-32b": dict(hidden=5120, intermediate=27648, heads=40, kv_heads=8, head_dim=128, vocab=152064),
    "qwen2.5-72b": dict(hidden=8192, intermediate=29568, heads=64, kv_heads=8, head_dim=128, vocab=152064),
    # head dims 256 and 96: their matmul, norm and activation shapes (K.attention takes head dims 64 and 128)
    "gemma2-9b": dict(hidden=3584, intermediate=14336, heads=16, kv_heads=8, head_dim=256, vocab=256000),
    "phi3-mini": dict(hidden=3072, intermediate=8192, heads=32, kv_heads=32, head_dim=96, vocab=32064),
}

#: :func:`hf_config_dims`: each dimension and the Hugging Face config fields it is read from, first found
HF_FIELDS: dict[str, tuple[str, ...]] = {
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "intermediate": ("intermediate_size", "ffn_dim", "n_inner"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "head_dim": ("head_dim",),
    "vocab": ("vocab_size",),
}


#: a model id of the Hugging Face hub (``org/name``)
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _hub_cache() -> pathlib.Path:
    """Where ``huggingface_hub`` keeps downloads: ``HF_HUB_CACHE``, else ``HF_HOME``/hub, else
    ``~/.cache/huggingface/hub``."""
    if os.environ.get("HF_HUB_CACHE"):
        return pathlib.Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    return pathlib.Path(home).expanduser() / "hub"


def hub_config(model_id: str) -> pathlib.Path | None:
    """The ``config.json`` of a downloaded hub model (``org/name``) in the Hugging Face cache, without any
    network: the snapshot ``refs/main`` names, else the newest snapshot that holds one; None when none does."""
    folder = _hub_cache() / ("models--" + model_id.replace("/", "--"))
    snapshots = folder / "snapshots"
    try:
        ref = (folder / "refs" / "main").read_text().strip()
    except OSError:
        ref = ""
    if ref and (snapshots / ref / "config.json").is_file():
        return snapshots / ref / "config.json"
    try:
        found = [d / "config.json" for d in snapshots.iterdir() if (d / "config.json").is_file()]
    except OSError:
        return None
    return max(found, key=lambda c: c.stat().st_mtime) if found else None


def hf_config_dims(path: str | pathlib.Path) -> dict[str, int]:
    """:func:`llm_calls` keyword arguments read from a Hugging Face ``config.json`` (the file, a folder
    holding one, or the id of a hub model the Hugging Face cache holds: :func:`hub_config`). A config that nests its decoder's fields under ``text_config`` (the
    multimodal ones) is read there. ``num_key_value_heads`` defaults to the query heads (no GQA) and
    ``head_dim`` to ``hidden_size / num_attention_heads``, as in ``transformers``. ValueError, naming the
    file and the field, for anything missing or not a positive integer, and for query heads that are not a
    multiple of the key/value heads."""
    p = pathlib.Path(path).expanduser()
    if not p.exists() and isinstance(path, str) and _HUB_ID.match(path):
        found = hub_config(path)
        if found is None:
            raise ValueError(f"{path}: no such file, and the Hugging Face cache ({_hub_cache()}) holds no download "
                             f"of {path!r} (download its config.json, e.g. `huggingface-cli download {path} "
                             "config.json`, or give the path of one)")
        p = found
    if p.is_dir():
        p = p / "config.json"
    try:
        raw = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{p}: not a readable JSON config ({type(exc).__name__}: {exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{p}: expected a JSON object, got {type(raw).__name__}")
    cfg = raw
    if "hidden_size" not in raw and isinstance(raw.get("text_config"), dict):
        cfg = raw["text_config"]

    def field_of(dim: str, required: bool = True) -> int | None:
        for name in HF_FIELDS[dim]:
            v = cfg.get(name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{p}: {name} must be a positive integer, got {v!r}")
            return v
        if required:
            raise ValueError(f"{p}: no {' / '.join(HF_FIELDS[dim])} (is this a decoder model's config.json?)")
        return None

    dims = {d: field_of(d) for d in ("hidden", "intermediate", "heads", "vocab")}
    heads = dims["heads"]
    kv_heads = field_of("kv_heads", required=False) or heads
    if heads % kv_heads:
        raise ValueError(f"{p}: {heads} query heads are not a multiple of {kv_heads} key/value heads")
    head_dim = field_of("head_dim", required=False)
    if head_dim is None:
        if dims["hidden"] % heads:
            raise ValueError(f"{p}: no head_dim, and hidden_size {dims['hidden']} is not a multiple of "
                             f"{heads} heads")
        head_dim = dims["hidden"] // heads
    return {"hidden": dims["hidden"], "intermediate": dims["intermediate"], "heads": heads, "kv_heads": kv_heads,
            "head_dim": head_dim, "vocab": dims["vocab"]}


def _is_config_path(model: str) -> bool:
    if model.endswith(".json") or "/" in model or "\\" in model:
        return True
    try:
        return pathlib.Path(model).expanduser().is_dir()
    except (OSError, ValueError):  # a name no file system takes (a NUL byte, too long)
        return False


def model_dims(model: str | None = None, **given: int | None) -> dict[str, int]:
    """:func:`llm_calls` keyword arguments: ``model``'s dimensions (a name of :data:`MODEL_SHAPES`, or the
    path of a Hugging Face ``config.json`` or of a folder holding one: :func:`hf_config_dims`; none:
    llm_calls' own defaults), then each of ``given`` that is not None (``hidden=3584``, ...). ValueError
    for an unknown model or a config that cannot be read."""
    if model is None:
        dims: dict[str, int] = {}
    elif model in MODEL_SHAPES:
        dims = dict(MODEL_SHAPES[model])
    elif _is_config_path(model):
        dims = hf_config_dims(model)
    else:
        raise ValueError(f"unknown model {model!r}; choose from {', '.join(MODEL_SHAPES)}, or give the path of "
                         "a Hugging Face config.json")
    dims.update({k: v for k, v in given.items() if v is not None})
    return dims


def _projections(m: int, hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int,
                 dtype: str, linear_weights: bool = False, fused: bool = False) -> list[tuple[Any, ...]]:
    """``(x, w)`` of each projection of a decoder layer. Weights stored ``[K, N]``: fused qkv, attention
    output, fused gate-up, down. With ``linear_weights``, a layer of separate ``nn.Linear`` layers (the
    Hugging Face layout): q, k (= v), o, gate (= up) and down, each ``(K, N)`` once, the weight stored
    ``[N, K]`` and passed transposed, as ``F.linear`` reads it; with ``fused`` too, the fused projections
    (qkv, o, gate-up, down) in that layout (``nn.Linear`` layers of fused weights, as Phi-3 has them and
    ``benchmarks/nearest_quality.py`` draws them)."""
    q, kv = heads * head_dim, kv_heads * head_dim
    if linear_weights and not fused:
        kn = list(dict.fromkeys(((hidden, q), (hidden, kv), (q, hidden), (hidden, intermediate),
                                 (intermediate, hidden))))
    else:
        kn = [(hidden, q + 2 * kv), (q, hidden), (hidden, 2 * intermediate), (intermediate, hidden)]
    return [(_t([m, k], dtype), _t([k, n], dtype, transposed=linear_weights)) for k, n in kn]


def llm_calls(ops: Iterable[str], tokens: Iterable[int], *, hidden: int = 4096, intermediate: int = 14336,
              heads: int = 32, kv_heads: int = 8, head_dim: int = 128, vocab: int = 32000,
              dtype: str = "bfloat16", projections: bool = False, linear_weights: bool = False,
              fused: bool = False) -> list[Call]:
    """Calls of library ops over token counts of a Llama-class decoder (hidden 4096, GQA 32/8 by
    default; :data:`MODEL_SHAPES` for others): norms and activations over ``[tokens, hidden]`` rows,
    the matmul of a ``hidden x hidden`` projection (with ``projections``: the four projections of a
    layer, qkv, output, gate-up and down, weights stored ``[K, N]``), RoPE and causal attention over a
    sequence of ``tokens``, cross-entropy over ``vocab`` classes. ``linear_weights``: matmul weights in
    ``nn.Linear``'s layout (stored ``[N, K]``, passed as ``w.t()``), and with ``projections`` the
    separate q, k, v, o, gate, up and down layers of a Hugging Face decoder, each shape once (with
    ``fused`` as well: the fused qkv, o, gate-up and down weights in that layout)."""
    out = []
    for op in ops:
        for m in tokens:
            if m < 1:
                raise ValueError(f"token counts must be >= 1, got {m}")
            if op == "matmul" and projections:
                out += [Call("tiletune.kernels:matmul", xw, {})
                        for xw in _projections(int(m), hidden, intermediate, heads, kv_heads, head_dim, dtype,
                                               linear_weights, fused)]
                continue
            args, kwargs = _llm_args(op, int(m), hidden, intermediate, heads, kv_heads, head_dim, vocab, dtype,
                                     linear_weights)
            out.append(Call(f"tiletune.kernels:{op}", args, kwargs))
    return out


# ------------------------------------------------------------------------------------ a model's layer

#: The phases of a decoder layer :func:`layer_calls` knows.
PHASES = ("prefill", "decode")


def decoder_layer(K: Any, p: Mapping[str, Any], x: Any, cos: Any, sin: Any, *, cache: Any = None, start: Any = None,
                  lengths: Any = None, eps: float = 1e-5) -> Any:
    """One decoder layer (Llama / Mistral / Qwen2.5 shape) written with the library ops ``K`` the way a user
    writes it: ``K`` is :mod:`tiletune.kernels` (or :class:`KeyRecorder`, which computes the same ops'
    keys on meta tensors). ``x``: ``(B, T, hidden)``; ``p``: ``nn.Linear`` weights ``[N, K]`` (passed as
    ``w.t()``), fused ``w_qkv`` and ``w_gate_up``, ``w_o``, ``w_down``, norms ``norm1``/``norm2`` and
    ``heads``/``kv_heads``/``head_dim``; RoPE in place on views of the fused qkv output (``cos``/``sin``:
    ``(T, D)`` or ``(B, T, D)``). Prefill (``cache`` None): causal attention over the ``T`` tokens (GQA).
    Decode: ``K.kv_cache_append`` at ``start`` and ``K.decode_attention`` over ``lengths`` positions of the
    ``cache = (cache_k, cache_v)``, each ``(B, kv_heads, capacity, head_dim)``."""
    b, t, hidden = x.shape
    hq, hk, d = int(p["heads"]), int(p["kv_heads"]), int(p["head_dim"])
    h = K.rms_norm(x, p["norm1"], eps)
    qkv = K.matmul(h, p["w_qkv"].t())
    q = qkv[..., :hq * d].unflatten(-1, (hq, d))
    k = qkv[..., hq * d:(hq + hk) * d].unflatten(-1, (hk, d))
    v = qkv[..., (hq + hk) * d:].unflatten(-1, (hk, d))
    K.apply_rope_(q, k, cos, sin)
    if cache is None:
        o = K.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
    else:
        cache_k, cache_v = cache
        K.kv_cache_append(cache_k, cache_v, k.transpose(1, 2), v.transpose(1, 2), start)
        o = K.decode_attention(q.transpose(1, 2), cache_k, cache_v, lengths, causal=True)
    x = x + K.matmul(o.transpose(1, 2).reshape(b, t, hq * d), p["w_o"].t())
    h = K.rms_norm(x, p["norm2"], eps)
    return x + K.matmul(K.swiglu(K.matmul(h, p["w_gate_up"].t())), p["w_down"].t())


def layer_inputs(dims: Mapping[str, int], phase: str, batch: int, length: int, *, device: str = "cuda",
                 dtype: str = "bfloat16", seed: int = 0) -> tuple[dict[str, Any], tuple[Any, ...], dict[str, Any]]:
    """``(p, args, kwargs)`` of :func:`decoder_layer` for a model's dims: prefill ``batch`` sequences of
    ``length`` tokens (cos/sin ``(T, D)``); decode one token for each of ``batch`` sequences over a cache of
    capacity ``length`` (positions ``length - 1``, cos/sin ``(B, 1, D)``, start and lengths as device
    tensors). Random values off the meta device."""
    import torch

    if phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    dt = getattr(torch, dtype)
    hidden, inter = dims["hidden"], dims["intermediate"]
    hq, hk, d = dims["heads"], dims["kv_heads"], dims["head_dim"]
    gen = torch.Generator(device=device).manual_seed(seed) if device != "meta" else None

    def rand(*shape: int, scale: float = 1.0) -> Any:
        t = torch.empty(shape, dtype=torch.float32, device=device)
        if device != "meta":
            t.normal_(generator=gen).mul_(scale)
        return t.to(dt)

    p: dict[str, Any] = dict(heads=hq, kv_heads=hk, head_dim=d,
                             w_qkv=rand((hq + 2 * hk) * d, hidden, scale=hidden ** -0.5),
                             w_o=rand(hidden, hq * d, scale=(hq * d) ** -0.5),
                             w_gate_up=rand(2 * inter, hidden, scale=hidden ** -0.5),
                             w_down=rand(hidden, inter, scale=inter ** -0.5),
                             norm1=rand(hidden, scale=0.1) + 1 if device != "meta" else rand(hidden),
                             norm2=rand(hidden, scale=0.1) + 1 if device != "meta" else rand(hidden))
    t = length if phase == "prefill" else 1
    x = rand(batch, t, hidden)
    pos = torch.arange(length, device=device, dtype=torch.float32)
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=device, dtype=torch.float32) / d))
    ang = torch.outer(pos, inv)
    emb = torch.cat((ang, ang), dim=-1)
    cos, sin = emb.cos().to(dt), emb.sin().to(dt)
    if phase == "prefill":
        return p, (x, cos, sin), {}
    cos = cos[-1:].expand(batch, 1, d).contiguous()
    sin = sin[-1:].expand(batch, 1, d).contiguous()
    cache = (rand(batch, hk, length, d), rand(batch, hk, length, d))
    start = torch.full((batch,), length - 1, dtype=torch.int32, device=device)
    lengths = torch.full((batch,), length, dtype=torch.int32, device=device)
    return p, (x, cos, sin), dict(cache=cache, start=start, lengths=lengths)


class KeyRecorder:
    """The library ops of :func:`decoder_layer` on meta tensors: each call builds the launch arguments its
    op would (the ops' ``prepare_*`` functions, no checks, no device), records the tuned ops' stored keys
    (``keys``: ``(op name, regime, canonical key JSON)``) and the call itself (``calls``:
    ``(op, args, kwargs, keys)``), and returns a meta output of the right shape. Keys only: no GPU."""

    def __init__(self, sms: int = 132) -> None:
        self.sms = sms
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any], list[tuple[str, Any, str]]]] = []

    @property
    def keys(self) -> list[tuple[str, Any, str]]:
        return [k for *_, ks in self.calls for k in ks]

    @staticmethod
    def key_of(lib_op: Any, regime: Any, args: Sequence[Any]) -> tuple[str, Any, str]:
        """``(op name, regime, stored key)`` of one tuned-op launch, as the op's identity computes it."""
        import inspect

        from tiletune.records import canonical_json
        from tiletune.keys import args_key_json

        if lib_op.buckets is None:
            key = args_key_json(args)
        else:
            params = list(inspect.signature(lib_op.plan).parameters)[1:]
            key = lib_op.buckets.resolve(params).key_json(args)
        return lib_op.name, regime, canonical_json(key)

    def _note(self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any], launches: Sequence[Any]) -> None:
        self.calls.append((op, args, kwargs, [self.key_of(f, r, a) for f, r, a in launches]))

    def rms_norm(self, x: Any, weight: Any = None, eps: float = 1e-6) -> Any:
        from tiletune.kernels.norms import prepare_rms_norm

        pr = prepare_rms_norm(x, weight, eps)
        self._note("rms_norm", (x, weight, eps), {}, [pr[:3]])
        return pr.result

    def swiglu(self, x: Any) -> Any:
        from tiletune.kernels.glu import ACT_SILU, prepare_glu

        pr = prepare_glu(x, ACT_SILU)
        self._note("swiglu", (x,), {}, [pr[:3]])
        return pr.result

    def matmul(self, a: Any, b: Any) -> Any:
        import torch

        from tiletune.kernels.gemm import broadcast_batch, prepare_matmul

        one = torch.empty(1, dtype=torch.float32, device=a.device)
        lib_op, regime, args = prepare_matmul(a, b, a.dtype, one, one)
        self._note("matmul", (a, b), {}, [(lib_op, regime, args)])
        batch = broadcast_batch(tuple(a.shape[:-2]), tuple(b.shape[:-2])) or ()
        return args[2].reshape(*batch, a.shape[-2], b.shape[-1])

    def apply_rope_(self, q: Any, k: Any, cos: Any, sin: Any, layout: str = "bshd") -> tuple[Any, Any]:
        from tiletune.kernels.rope import prepare_rope

        pr = prepare_rope(q, k, cos, sin, layout)
        self._note("apply_rope_", (q, k, cos, sin), {}, [pr[:3]])
        return q, k

    def _decode(self, call: Any) -> list[Any]:
        from tiletune.kernels.decode_attention_op import DECODE_COMBINE, DECODE_DIRECT, DECODE_PARTIAL

        if call.direct:
            return [(DECODE_DIRECT, None, call.direct_args)]
        return [(DECODE_PARTIAL, None, call.partial_args), (DECODE_COMBINE, None, call.combine_args)]

    def attention(self, q: Any, k: Any, v: Any, causal: bool = False, scale: float | None = None) -> Any:
        from tiletune.kernels.attention_op import prepare_attention

        pr = prepare_attention(q, k, v, causal, scale or q.shape[-1] ** -0.5, sms=self.sms)
        launches = [pr[:3]] if hasattr(pr, "family") else self._decode(pr)
        self._note("attention", (q, k, v), {"causal": causal}, launches)
        return pr.result if hasattr(pr, "family") else pr.out

    def kv_cache_append(self, cache_k: Any, cache_v: Any, k: Any, v: Any, start: Any) -> tuple[Any, Any]:
        from tiletune.kernels.decode_attention_op import prepare_kv_cache_append

        pr = prepare_kv_cache_append(cache_k, cache_v, k, v, start)
        self._note("kv_cache_append", (cache_k, cache_v, k, v, start), {}, [pr[:3]])
        return cache_k, cache_v

    def decode_attention(self, q: Any, cache_k: Any, cache_v: Any, lengths: Any = None, causal: bool = True,
                         scale: float | None = None) -> Any:
        import torch

        from tiletune.kernels.decode_attention_op import prepare_decode

        bsz = q.shape[0]
        lens = lengths if isinstance(lengths, torch.Tensor) else torch.empty(bsz, dtype=torch.int32, device=q.device)
        call = prepare_decode(q, cache_k, cache_v, lens.to(torch.int32), causal, scale or q.shape[-1] ** -0.5,
                              sms=self.sms)
        self._note("decode_attention", (q, cache_k, cache_v, lengths), {"causal": causal}, self._decode(call))
        return call.out


def _spec_of(value: Any, dtype_fill: Mapping[str, str]) -> Any:
    """A recorded argument as a fill spec: a tensor by shape and dtype (``transposed`` for the transpose
    of a contiguous tensor, as ``w.t()``; other views as a contiguous tensor of the same shape: the ops'
    keys do not depend on those strides), anything else as it is."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    dtype = str(value.dtype).replace("torch.", "")
    shape = list(value.shape)
    transposed = value.dim() >= 2 and value.transpose(-1, -2).is_contiguous() and not value.is_contiguous()
    return _t(shape, dtype, dtype_fill.get(dtype, "normal"), transposed=transposed)


def _layer_recording(dims: Mapping[str, int], phase: str, batch: int, length: int, dtype: str,
                     sms: int) -> KeyRecorder:
    rec = KeyRecorder(sms)
    p, args, kwargs = layer_inputs(dims, phase, batch, length, device="meta", dtype=dtype)
    decoder_layer(rec, p, *args, **kwargs)
    return rec


def layer_keys(model: str | Mapping[str, int], phase: str, batch: int, length: int, *, dtype: str = "bfloat16",
               sms: int = 132) -> list[tuple[str, Any, str]]:
    """The stored keys (``(op name, regime, key JSON)``, in launch order) of the tuned-op launches of one
    forward of :func:`decoder_layer` (``phase``, ``batch`` sequences, ``length`` tokens per sequence in
    prefill, the cache capacity in decode) for ``model`` (a :data:`MODEL_SHAPES` name or its dims),
    computed on meta tensors (``sms``: the GPU's SM count, which picks decode attention's splits; 132 for
    the H200)."""
    dims = model_dims(model) if isinstance(model, str) else dict(model)
    return _layer_recording(dims, phase, batch, length, dtype, sms).keys


def _layer_call(op: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], length: int) -> Call:
    """A recorded public call as a fill call: tensors as specs; the start of an append as zeros and the
    lengths of decode attention as the int ``length`` (the keys do not read their values)."""
    fills = {"int32": "zeros", "int64": "zeros"}
    specs = [_spec_of(a, fills) for a in args]
    if op == "decode_attention":
        specs[3] = length
    return Call(f"tiletune.kernels:{op}", tuple(specs), {k: _spec_of(v, fills) for k, v in kwargs.items()})


def parse_range(text: str, what: str) -> tuple[int, int]:
    """``"N"`` or ``"LO-HI"`` (inclusive, >= 1) as ``(lo, hi)``; ValueError names ``what``."""
    parts = str(text).split("-")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) in (1, 2) else (0, -1)
    except ValueError:
        lo, hi = 0, -1
    if lo < 1 or hi < lo:
        raise ValueError(f"{what} {text!r}: expected N or LO-HI with 1 <= LO <= HI")
    return lo, hi


def _candidates(lo: int, hi: int, extra: Iterable[int] = ()) -> list[int]:
    """Sizes of ``[lo, hi]`` that meet every bucket a power-of-two or grid rule makes of the range (both
    ends of each bucket), largest first."""
    from tiletune.kernels._keys import KV_LEN_GRID

    out = {lo, hi}
    edges = [1 << i for i in range(0, max(hi, 1).bit_length() + 1)] + list(KV_LEN_GRID) + list(extra)
    for e in edges:
        out.update(x for x in (e, e + 1) if lo <= x <= hi)
    return sorted(out, reverse=True)


def layer_calls(model: str | Mapping[str, int], phase: str, batch: int | tuple[int, int],
                length: int | tuple[int, int], *, dtype: str = "bfloat16", sms: int = 132) -> list[Call]:
    """The library calls that warm every key one forward of :func:`decoder_layer` makes for ``model`` over
    a range of shapes: ``batch`` sequences (an int or an inclusive ``(lo, hi)``) and ``length`` (prefill:
    tokens per sequence; decode: the KV cache's capacity, attended whole), also an int or a range.

    The layer is recorded on meta tensors at sizes that meet every bucket of the range (both ends of each
    power-of-two bucket, the decode length grid, and the batch where decode attention stops splitting the
    cache), largest first; a recorded call is kept when one of its keys is new. Each kept call is a fill
    call on fresh tensors (:func:`_layer_call`) whose keys equal the layer's (the tests check it), so
    ``run_calls`` tunes exactly the keys the layer meets anywhere in the range."""
    dims = model_dims(model) if isinstance(model, str) else dict(model)
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {', '.join(PHASES)}, got {phase!r}")
    b_lo, b_hi = (batch, batch) if isinstance(batch, int) else batch
    l_lo, l_hi = (length, length) if isinstance(length, int) else length
    extra_b: list[int] = []
    extra_l: list[int] = []
    if phase == "decode":  # decode attention takes one split (the direct kernel) once B * Hkv * blocks > sms / 2
        from tiletune.kernels.decode_attention_kernels import GRANULE, decode_rows

        per = dims["kv_heads"] * decode_rows(dims["heads"] // dims["kv_heads"], 1)[2]
        extra_b = [sms // 2 // per, sms // 2 // per + 1]
        extra_l = [GRANULE]
    seen: set[tuple[str, Any, str]] = set()
    out: list[Call] = []
    for b in _candidates(b_lo, b_hi, extra_b):
        for n in _candidates(l_lo, l_hi, extra_l):
            rec = _layer_recording(dims, phase, b, n, dtype, sms)
            for op, args, kwargs, keys in rec.calls:
                new = [k for k in keys if k not in seen]
                if new:
                    seen.update(keys)
                    out.append(_layer_call(op, args, kwargs, n))
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
    from tiletune.resolve.handle import open_database

    import tiletune.kernels as kernels

    import pkgutil

    for info in pkgutil.iter_modules(kernels.__path__):  # every library op constructed (modules import lazily)
        if not info.name.startswith("_") and info.name != "hf":
            importlib.import_module(f"{kernels.__name__}.{info.name}")
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
