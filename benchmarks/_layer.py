"""A decoder layer written the way a user writes it with ``tiletune.kernels`` (issues 40 and 43).

Shared by ``first_forward.py`` and ``compile_tax.py``. One Llama / Qwen2.5 layer, bf16, weights in
``nn.Linear``'s layout (``[out_features, in_features]``, passed as ``w.t()``):

    h = K.rms_norm(x, norm1)                      x: (B, T, hidden)
    qkv = K.matmul(h, w_qkv.t())                  fused q, k, v projection: (B, T, (H + 2 Hkv) D)
    q, k, v = views of qkv                        (B, T, H|Hkv, D), no copies
    K.apply_rope_(q, k, cos, sin)                 rotate-half RoPE in place on the views
    prefill: o = K.attention(q^T, k^T, v^T, causal=True)            GQA, (B, H, S, D) views
    decode:  K.kv_cache_append(ck, cv, k^T, v^T, pos)               the new token at position pos = L
             o = K.decode_attention(q^T, ck, cv, lens, causal=True) over positions [0, L + 1) of a cache
                                                                    of ``capacity`` > L positions
    h2 = x + K.matmul(o, w_o.t())
    out = h2 + K.matmul(K.swiglu(K.matmul(K.rms_norm(h2, norm2), w_gate_up.t())), w_down.t())

The layer is a ``torch.nn.Module`` (weights and KV caches as buffers, so ``torch.compile``'s
``reduce-overhead`` mode treats them as static); its ops come from a namespace (``tiletune.kernels`` by
default), so the CPU tests run the same forward with torch stand-ins and compare it with
:func:`reference_forward` (plain torch: ``F.linear``, SDPA with ``enable_gqa``).

Shapes are drawn at random (:func:`draw_shapes`, seeded, the same list on every machine) off every
project grid: no token count, sequence length or cache length is a power of two.

Nothing here imports torch or tiletune at module level.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

#: RoPE base by model; the other dimensions are :data:`tiletune.lab.fill.MODEL_SHAPES`'
ROPE_BASES = {"llama3-8b": 500000.0, "qwen2.5-7b": 1000000.0, "mistral-7b": 1000000.0}
#: the models these benchmarks run by default
MODELS = ("llama3-8b", "qwen2.5-7b")
EPS = 1e-5

#: where drawn shapes come from (issue 40): prefill B x S, decode B sequences over a cache of L positions
PREFILL_B = (1, 4)
PREFILL_S = (300, 5000)
DECODE_B = (1, 64)
DECODE_L = (500, 9000)
#: extra cache positions beyond the new token (capacity = L + 1 + a draw in this range)
DECODE_SLACK = (1, 512)


@dataclass(frozen=True)
class Dims:
    """One model's layer dimensions."""

    model: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    rope_base: float
    eps: float = EPS

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def dims(model: str, **override: int) -> Dims:
    """The layer dimensions of ``model`` (``tiletune.lab.fill.MODEL_SHAPES`` + its RoPE base); keyword
    overrides for tests (tiny layers on CPU)."""
    from tiletune.lab.fill import MODEL_SHAPES

    if model not in MODEL_SHAPES or model not in ROPE_BASES:
        known = ", ".join(sorted(set(MODEL_SHAPES) & set(ROPE_BASES)))
        raise ValueError(f"unknown model {model!r}; choose from {known}")
    m = MODEL_SHAPES[model]
    fields = dict(model=model, hidden=m["hidden"], heads=m["heads"], kv_heads=m["kv_heads"], head_dim=m["head_dim"],
                  ffn=m["intermediate"], rope_base=ROPE_BASES[model])
    fields.update(override)
    return Dims(**fields)


# --------------------------------------------------------------------------------------------
# shapes
# --------------------------------------------------------------------------------------------


def is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def _draw(r: random.Random, lo: int, hi: int) -> int:
    """An integer in ``[lo, hi]`` that is not a power of two."""
    while True:
        v = r.randint(lo, hi)
        if not is_pow2(v):
            return v


def draw_prefill(r: random.Random) -> dict[str, Any]:
    while True:
        b, s = r.randint(*PREFILL_B), _draw(r, *PREFILL_S)
        if not is_pow2(b * s):
            return {"phase": "prefill", "B": b, "S": s}


def draw_decode(r: random.Random) -> dict[str, Any]:
    b, cache_len = _draw(r, *DECODE_B), _draw(r, *DECODE_L)
    return {"phase": "decode", "B": b, "L": cache_len, "capacity": cache_len + 1 + r.randint(*DECODE_SLACK)}


def draw_shapes(model: str, n: int, seed: int, phases: tuple[str, ...] = ("prefill", "decode")) -> list[dict[str, Any]]:
    """``n`` shapes for ``model``, the phases taken in turn (prefill, decode, prefill, ...): the same list for
    the same ``(model, seed, phases)`` on every machine, and the first ``k`` of ``n`` are the shapes of a run
    asking for ``k`` (a quick run measures a prefix of the full one). Each phase draws from its own stream."""
    streams = {p: random.Random(f"tiletune-layer:{seed}:{model}:{p}") for p in phases}
    out = []
    for i in range(n):
        phase = phases[i % len(phases)]
        out.append(draw_prefill(streams[phase]) if phase == "prefill" else draw_decode(streams[phase]))
    return out


def shape_label(shape: dict[str, Any]) -> str:
    if shape["phase"] == "prefill":
        return f"prefill B={shape['B']} S={shape['S']}"
    return f"decode B={shape['B']} L={shape['L']} cap={shape['capacity']}"


def tokens(shape: dict[str, Any]) -> int:
    """Tokens through the projections in one forward."""
    return shape["B"] * (shape["S"] if shape["phase"] == "prefill" else 1)


# --------------------------------------------------------------------------------------------
# weights and inputs
# --------------------------------------------------------------------------------------------


def make_weights(d: Dims, device: str = "cuda", seed: int = 0, dtype: Any = None) -> dict[str, Any]:
    """The layer's weights in ``nn.Linear`` layout (``[N, K]``): ``qkv`` ``[(H + 2 Hkv) D, hidden]``, ``o``
    ``[hidden, H D]``, ``gate_up`` ``[2 ffn, hidden]`` (gate rows first), ``down`` ``[hidden, ffn]``; the
    two norm weights ``[hidden]``."""
    import torch

    dtype = dtype or torch.bfloat16
    g = torch.Generator(device=device).manual_seed(seed)

    def lin(n: int, k: int) -> Any:
        return (torch.randn(n, k, device=device, generator=g) / math.sqrt(k)).to(dtype)

    def norm() -> Any:
        return (1.0 + 0.1 * torch.randn(d.hidden, device=device, generator=g)).to(dtype)

    return {"qkv": lin(d.q_dim + 2 * d.kv_dim, d.hidden), "o": lin(d.hidden, d.q_dim),
            "gate_up": lin(2 * d.ffn, d.hidden), "down": lin(d.hidden, d.ffn), "norm1": norm(), "norm2": norm()}


def rope_table(d: Dims, positions: Any) -> tuple[Any, Any]:
    """``(cos, sin)`` of ``positions`` (an int64 tensor), shape ``positions.shape + (D,)``, float32
    (rotate-half layout: the half-frequencies repeated)."""
    import torch

    dev = positions.device
    inv = 1.0 / (d.rope_base ** (torch.arange(0, d.head_dim, 2, device=dev, dtype=torch.float32) / d.head_dim))
    f = positions.to(torch.float32).unsqueeze(-1) * inv
    emb = torch.cat((f, f), dim=-1)
    return emb.cos(), emb.sin()


class Inputs:
    """The inputs of one shape: ``x``, ``cos``/``sin`` and, for decode, the new token's position ``pos``
    (``(B,)`` int64, = L), the attended lengths ``lens`` (``(B,)`` int32, = L + 1) and the initial caches
    (``(B, Hkv, capacity, D)``, positions ``[0, L)`` filled, the rest zero)."""

    def __init__(self, d: Dims, shape: dict[str, Any], device: str = "cuda", seed: int = 1, dtype: Any = None) -> None:
        import torch

        dtype = dtype or torch.bfloat16
        g = torch.Generator(device=device).manual_seed(seed)
        self.d, self.shape, self.phase, self.B = d, dict(shape), shape["phase"], shape["B"]
        b = self.B
        if self.phase == "prefill":
            s = shape["S"]
            self.x = torch.randn(b, s, d.hidden, device=device, generator=g).to(dtype)
            cos, sin = rope_table(d, torch.arange(s, device=device))
            self.cos, self.sin = cos.to(dtype), sin.to(dtype)  # (S, D)
            self.ck = self.cv = self.pos = self.lens = None
        elif self.phase == "decode":
            cache_len, cap = shape["L"], shape["capacity"]
            if cap < cache_len + 1:
                raise ValueError(f"decode shape {shape}: capacity must hold the L cached positions and the new one")
            self.x = torch.randn(b, 1, d.hidden, device=device, generator=g).to(dtype)
            self.pos = torch.full((b,), cache_len, dtype=torch.int64, device=device)
            self.lens = torch.full((b,), cache_len + 1, dtype=torch.int32, device=device)
            cos, sin = rope_table(d, self.pos.unsqueeze(1))  # (B, 1, D)
            self.cos, self.sin = cos.to(dtype), sin.to(dtype)
            self.ck = torch.zeros(b, d.kv_heads, cap, d.head_dim, device=device, dtype=dtype)
            self.cv = torch.zeros_like(self.ck)
            self.ck[:, :, :cache_len] = (0.5 * torch.randn(b, d.kv_heads, cache_len, d.head_dim, device=device,
                                                           generator=g)).to(dtype)
            self.cv[:, :, :cache_len] = torch.randn(b, d.kv_heads, cache_len, d.head_dim, device=device,
                                                    generator=g).to(dtype)
        else:
            raise ValueError(f"unknown phase {self.phase!r}")

    def args(self) -> tuple[Any, ...]:
        """The layer's forward arguments."""
        if self.phase == "prefill":
            return (self.x, self.cos, self.sin)
        return (self.x, self.cos, self.sin, self.pos, self.lens)

    def caches(self) -> tuple[Any, Any]:
        """A fresh copy of the initial caches (decode; ``(None, None)`` for prefill)."""
        if self.ck is None:
            return None, None
        return self.ck.clone(), self.cv.clone()


# --------------------------------------------------------------------------------------------
# the layer
# --------------------------------------------------------------------------------------------


def tiletune_layer(d: Dims, w: dict[str, Any], phase: str, caches: tuple[Any, Any] = (None, None),
                   ops: Any = None) -> Any:
    """The layer as a ``torch.nn.Module`` over ``ops`` (default ``tiletune.kernels``; looked up at every
    call, as ``K.matmul`` in a user's module is). ``forward(x, cos, sin)`` for prefill,
    ``forward(x, cos, sin, pos, lens)`` for decode (writes the new token's k/v into the caches, in place).
    Returns ``(B, T, hidden)``."""
    import torch

    if ops is None:
        import tiletune.kernels as ops
    K = ops
    if phase not in ("prefill", "decode"):
        raise ValueError(f"unknown phase {phase!r}")
    if phase == "decode" and caches[0] is None:
        raise ValueError("a decode layer needs its KV caches")
    qd, kd, nh, nkv, hd, hidden, eps = d.q_dim, d.kv_dim, d.heads, d.kv_heads, d.head_dim, d.hidden, d.eps

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for name, t in w.items():
                self.register_buffer(name, t, persistent=False)
            if phase == "decode":
                self.register_buffer("ck", caches[0], persistent=False)
                self.register_buffer("cv", caches[1], persistent=False)

        def _attend(self, q: Any, k: Any, v: Any, pos: Any, lens: Any) -> Any:
            if phase == "prefill":
                return K.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
            K.kv_cache_append(self.ck, self.cv, k.transpose(1, 2), v.transpose(1, 2), pos)
            return K.decode_attention(q.transpose(1, 2), self.ck, self.cv, lens, causal=True)

        def forward(self, x: Any, cos: Any, sin: Any, pos: Any = None, lens: Any = None) -> Any:
            bsz, t, _ = x.shape
            h = K.rms_norm(x, self.norm1, eps)
            qkv = K.matmul(h, self.qkv.t())
            q = qkv[..., :qd].unflatten(-1, (nh, hd))
            k = qkv[..., qd:qd + kd].unflatten(-1, (nkv, hd))
            v = qkv[..., qd + kd:].unflatten(-1, (nkv, hd))
            K.apply_rope_(q, k, cos, sin)
            o = self._attend(q, k, v, pos, lens)  # (B, H, T, D)
            h2 = x + K.matmul(o.transpose(1, 2).reshape(bsz, t, qd), self.o.t())
            y = K.rms_norm(h2, self.norm2, eps)
            return h2 + K.matmul(K.swiglu(K.matmul(y, self.gate_up.t())), self.down.t())

    return Layer()


def torch_layer(d: Dims, w: dict[str, Any], phase: str, caches: tuple[Any, Any] = (None, None),
                cache_len: int | None = None) -> Any:
    """The same layer in plain torch as a ``torch.nn.Module`` (float32 norms, ``F.linear``, SDPA with
    ``enable_gqa``), weights and caches as buffers like :func:`tiletune_layer`'s: what any user pays for
    eager torch or ``torch.compile`` on this layer. ``forward(x, cos, sin)`` for prefill, ``forward(x, cos,
    sin, pos, lens)`` for decode, where the step writes k/v at position ``cache_len`` (the shape's ``L``, the
    same for every sequence: ``pos`` and ``lens`` are accepted, not read) and attends positions
    ``[0, cache_len]``."""
    import torch
    import torch.nn.functional as F

    if phase not in ("prefill", "decode"):
        raise ValueError(f"unknown phase {phase!r}")
    if phase == "decode" and (caches[0] is None or cache_len is None):
        raise ValueError("a decode layer needs its KV caches and the cached length")
    hd, qd, kd = d.head_dim, d.q_dim, d.kv_dim

    def rms(z: Any, weight: Any) -> Any:
        zf = z.float()
        return (zf * torch.rsqrt(zf.pow(2).mean(-1, keepdim=True) + d.eps) * weight.float()).to(z.dtype)

    def rope(z: Any, cos: Any, sin: Any) -> Any:  # z: (B, T, H, D); cos/sin (T, D) or (B, T, D)
        c, s = cos.float(), sin.float()
        c, s = (c[None, :, None, :], s[None, :, None, :]) if c.dim() == 2 else (c[:, :, None, :], s[:, :, None, :])
        zf = z.float()
        rot = torch.cat((-zf[..., hd // 2:], zf[..., :hd // 2]), dim=-1)
        return (zf * c + rot * s).to(z.dtype)

    class TorchLayer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for name, t in w.items():
                self.register_buffer(name, t, persistent=False)
            if phase == "decode":
                self.register_buffer("ck", caches[0], persistent=False)
                self.register_buffer("cv", caches[1], persistent=False)

        def forward(self, x: Any, cos: Any, sin: Any, pos: Any = None, lens: Any = None) -> Any:
            bsz, t, _ = x.shape
            qkv = F.linear(rms(x, self.norm1), self.qkv)
            q = rope(qkv[..., :qd].unflatten(-1, (d.heads, hd)), cos, sin).transpose(1, 2)
            k = rope(qkv[..., qd:qd + kd].unflatten(-1, (d.kv_heads, hd)), cos, sin).transpose(1, 2)
            v = qkv[..., qd + kd:].unflatten(-1, (d.kv_heads, hd)).transpose(1, 2)
            if phase == "prefill":
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            else:
                n = cache_len
                self.ck[:, :, n] = k[:, :, 0]
                self.cv[:, :, n] = v[:, :, 0]
                o = F.scaled_dot_product_attention(q, self.ck[:, :, :n + 1], self.cv[:, :, :n + 1], enable_gqa=True)
            h2 = x + F.linear(o.transpose(1, 2).reshape(bsz, t, qd), self.o)
            gu = F.linear(rms(h2, self.norm2), self.gate_up)
            return h2 + F.linear(F.silu(gu[..., :d.ffn]) * gu[..., d.ffn:], self.down)

    return TorchLayer()


def reference_forward(d: Dims, w: dict[str, Any], inp: Inputs, caches: tuple[Any, Any] = (None, None)) -> Any:
    """The same layer in plain torch (:func:`torch_layer`, one forward); writes the decode step's k/v into
    ``caches`` like the layer does. For correctness checks."""
    return torch_layer(d, w, inp.phase, caches, inp.shape.get("L"))(*inp.args())


def rel_err(got: Any, want: Any) -> float:
    import torch

    return float(torch.linalg.vector_norm(got.float() - want.float()) / torch.linalg.vector_norm(want.float()))


# --------------------------------------------------------------------------------------------
# timing and tuning counts
# --------------------------------------------------------------------------------------------


def bench_ms(fn: Any, warmup: int = 25, rep: int = 100) -> float:
    """``triton.testing.do_bench``'s median of ``fn`` (ms; L2 flushed between calls)."""
    from triton.testing import do_bench

    try:
        return float(do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    except TypeError:  # an older triton: no return_mode
        got = do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5])
        return float(got[0] if isinstance(got, (list, tuple)) else got)


def tuning_sessions(by_op: bool = False) -> Any:
    """Tuning sessions started so far by the library's ops: the sum of ``tuning_count`` over the tuned op
    of every regime of every :class:`~tiletune.kernels.library_op.LibraryOp` (ops forgotten by
    ``LibraryOp.configure`` no longer count). With ``by_op``: ``(total, {op name: sessions})``."""
    from tiletune.kernels.library_op import LibraryOp

    per: dict[str, int] = {}
    for lib in LibraryOp.instances():
        n = sum(int(getattr(op, "tuning_count", 0)) for op in lib.ops().values())
        if n:
            per[lib.name] = per.get(lib.name, 0) + n
    total = sum(per.values())
    return (total, per) if by_op else total


#: tiletune log line fragments -> where a config came from
LOG_SOURCES = ((": tuning table ", "table"), (": database hit", "database"), (": bucket hit", "bucket"),
               (": nothing compiled holds a config for ", "fallback"),
               (": tuned ", "tuned"), (": refined ", "refined"), (": nearest", "nearest"),
               (": no tuned neighbour of ", "default"), ("or beat the default config", "default"),
               ("met a new problem key during CUDA graph capture", "capture_miss"))


def settle_compiles(call: Any, timeout: float = 300.0) -> float:
    """Wait for the configs that compile in the background while ops run their torch fallbacks
    (:func:`tiletune.wait_for_compiles`), then ``call()`` once so each such key resolves to its config;
    returns the seconds waited."""
    import tiletune

    t0 = time.perf_counter()
    tiletune.wait_for_compiles(timeout)
    waited = time.perf_counter() - t0
    call()
    return round(waited, 3)


class SourceLog:
    """Counts tiletune's log lines by where a config came from (:data:`LOG_SOURCES`) and names the ops
    that tuned. ``install()`` attaches it to the ``tiletune`` logger at INFO."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.tuned_ops: list[str] = []
        self.warnings: list[str] = []

    def feed(self, message: str, levelno: int = 20) -> None:
        for needle, what in LOG_SOURCES:
            if needle in message:
                self.counts[what] = self.counts.get(what, 0) + 1
                if what == "tuned":
                    self.tuned_ops.append(message.split(":", 1)[0])
        if levelno >= 30:
            self.warnings.append(message.splitlines()[0][:300])

    def reset(self) -> None:
        self.counts, self.tuned_ops, self.warnings = {}, [], []

    def snapshot(self) -> dict[str, Any]:
        return {"sources": dict(self.counts), "tuned_ops": list(self.tuned_ops), "warnings": self.warnings[:20]}

    def install(self) -> "SourceLog":
        import logging

        outer = self

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    outer.feed(record.getMessage(), record.levelno)
                except Exception:  # noqa: BLE001 - a log line must never break the benchmark
                    pass

        log = logging.getLogger("tiletune")
        log.addHandler(Handler())
        if log.getEffectiveLevel() > logging.INFO:
            log.setLevel(logging.INFO)
        return self


def use_fresh_database(path: str, tables: bool, **configure: Any) -> None:
    """Point every library op at a new (empty) tuning database ``path`` and turn the tuning tables on or
    off (``TILETUNE_TABLES``, read at each lookup). The ops made so far are forgotten
    (``LibraryOp.configure``): the next call of each key goes down the miss path again."""
    import os

    import tiletune as tt
    from tiletune.kernels.library_op import LibraryOp

    os.environ["TILETUNE_TABLES"] = "1" if tables else "0"
    os.environ["TILETUNE_DB"] = str(path)  # ops that open the default database lazily
    LibraryOp.configure(db=tt.TuningDB(path), progress=False, **configure)
