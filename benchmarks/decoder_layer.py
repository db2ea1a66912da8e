#!/usr/bin/env python
"""A Llama-3-8B-shaped decoder layer from ``tiletune.kernels`` vs torch eager and torch.compile (issue 20).

One layer, bf16: hidden 4096, GQA 32/8 query/kv heads, head dim 128, MLP 14336 (``--model qwen2.5-7b``:
3584, 28/4, 128, 18944; ``--model mistral-7b``: Llama's shapes, another RoPE base); RMSNorm, fused QKV
projection, RoPE in place (rotate-half), attention, residual + RMSNorm, fused gate-up projection,
SwiGLU, down projection, residual. Weights are stored ``[K, N]`` (``x @ w``).

* **prefill** ``(B, S)``: ``S`` new tokens, causal attention over themselves.
* **decode** ``(B, S)``: one new token per sequence with ``S`` positions in a preallocated KV cache
  (the new token's k/v are written at position ``S - 1``, attention over positions ``[0, S)``).
  tiletune: ``K.kv_cache_append`` + ``K.decode_attention`` with a device lengths tensor (no
  ``torch.cat``); torch: the same cache written by index and ``scaled_dot_product_attention`` over
  the cache slice (``enable_gqa``).

Per row: ``tiletune_us`` = GPU time of one forward replayed from a CUDA graph (tiletune ops are
capture-safe once tuned: the first forward tunes, a second warms, then the step is captured);
``tiletune_stream_us`` = GPU time of forwards launched back to back without a graph;
``tiletune_host_us`` = host time of the launch calls of one forward (``time.perf_counter``, no sync);
``eager_us``, ``compile_us`` (``torch.compile`` default), ``compile_ro_us`` (``mode="reduce-overhead"``,
CUDA graphs) and ``compile_ro_static_us`` (the same with the inputs marked static, meant to save the copy
into the graph's input buffers at every replay, as in a graph over a whole model; on torch 2.11 the
replays still began with that copy; ``vs_compile_ro_best`` compares with the faster of the two) = GPU
time per forward from CUDA events around a back-to-back loop; these (with ``tiletune_us``) are measured
in five interleaved rounds, the median round each (:func:`interleaved_us`); ``rel_err`` =
``||tiletune - eager|| / ||eager||`` of the layer output; ``first_forward_s`` (one row) = wall time of
the first forward in a fresh process that shares this run's tuning database and cuTile disk cache.

Usage (one command writes ``decoder_layer.json`` + ``decoder_layer.png`` under ``--out``, default
``$OUT`` or ``benchmarks/results/h200``)::

    python benchmarks/decoder_layer.py --quick        # 4 rows, tuning included (budget: < 4 min on an H200)
    python benchmarks/decoder_layer.py                # full: prefill B 1-8 x S 512-8192, decode B 1-128 x S 512-32k
    python benchmarks/decoder_layer.py --quick --fused-mlp   # MLP gate-up + SwiGLU as one K.matmul_swiglu
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from _common import small_png

from tiletune.lab.fill import MODEL_SHAPES

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: RoPE base by model (``--model``); the layer's shapes are ``tiletune tune --model``'s
#: (:data:`tiletune.lab.fill.MODEL_SHAPES`: hidden, query heads, key-value heads, head dim, MLP width). Shapes
#: only (no QKV bias for Qwen2.5, no sliding window for Mistral): the kernels' work is the same.
ROPE_BASES = {"llama3-8b": 500000.0, "qwen2.5-7b": 1000000.0, "mistral-7b": 1000000.0}
MODELS = {name: {**MODEL_SHAPES[name], "rope_base": base} for name, base in ROPE_BASES.items()}
MODEL = "llama3-8b"
HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 4096, 32, 8, 128, 14336
EPS = 1e-5
ROPE_BASE = 500000.0


def use_model(name: str) -> None:
    """Set the layer shapes (module globals) to those of ``name`` in :data:`MODELS`."""
    global MODEL, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, ROPE_BASE
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    m = MODELS[name]
    MODEL = name
    HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = m["hidden"], m["heads"], m["kv_heads"], m["head_dim"], m["intermediate"]
    ROPE_BASE = m["rope_base"]

QUICK_ROWS = [("decode", 8, 2048), ("decode", 64, 2048), ("decode", 8, 8192), ("prefill", 1, 2048)]
FULL_ROWS = ([("prefill", b, s) for b in (1, 4, 8) for s in (512, 2048, 8192) if b * s <= 32768]
             + [("decode", b, s) for b in (1, 8, 32, 64, 128) for s in (512, 2048, 8192, 32768)
                if b * s <= 128 * 8192 or b <= 8])


def rows_for(quick: bool, only: str | None = None) -> list[tuple[str, int, int]]:
    """The rows of a run (pure); ``only`` = ``"phase:B:S,..."`` picks rows by hand."""
    if only:
        rows = []
        for item in only.split(","):
            phase, b, s = item.strip().split(":")
            if phase not in ("prefill", "decode") or int(b) < 1 or int(s) < 1:
                raise ValueError(f"--rows: {item!r} is not prefill|decode:B:S")
            rows.append((phase, int(b), int(s)))
        return rows
    return list(QUICK_ROWS if quick else FULL_ROWS)


# --------------------------------------------------------------------------------------------
# the layer
# --------------------------------------------------------------------------------------------


def make_weights(device: str = "cuda", seed: int = 0) -> dict[str, Any]:
    import torch

    g = torch.Generator(device=device).manual_seed(seed)

    def w(k: int, n: int) -> Any:
        return (torch.randn(k, n, device=device, generator=g) / math.sqrt(k)).to(torch.bfloat16)

    return {"qkv": w(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM), "o": w(HIDDEN, HIDDEN),
            "gate_up": w(HIDDEN, 2 * FFN), "down": w(FFN, HIDDEN),
            "norm1": (1.0 + 0.1 * torch.randn(HIDDEN, device=device, generator=g)).to(torch.bfloat16),
            "norm2": (1.0 + 0.1 * torch.randn(HIDDEN, device=device, generator=g)).to(torch.bfloat16)}


def rope_table(max_pos: int, device: str = "cuda") -> tuple[Any, Any]:
    """``(cos, sin)`` of shape ``(max_pos, HEAD_DIM)`` in bf16 (rotate-half layout: halves repeated)."""
    import torch

    inv = 1.0 / (ROPE_BASE ** (torch.arange(0, HEAD_DIM, 2, device=device, dtype=torch.float32) / HEAD_DIM))
    f = torch.outer(torch.arange(max_pos, device=device, dtype=torch.float32), inv)
    emb = torch.cat((f, f), dim=-1)
    return emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)


class State:
    """Inputs of one row: activations, positions, caches (one copy per implementation)."""

    def __init__(self, phase: str, bsz: int, s: int, device: str = "cuda", seed: int = 1) -> None:
        import torch

        g = torch.Generator(device=device).manual_seed(seed)
        self.phase, self.B, self.S = phase, bsz, s
        cos, sin = rope_table(s, device)
        if phase == "prefill":
            self.x = torch.randn(bsz, s, HIDDEN, device=device, generator=g).to(torch.bfloat16)
            self.cos, self.sin = cos, sin  # (S, D)
        else:
            self.x = torch.randn(bsz, 1, HIDDEN, device=device, generator=g).to(torch.bfloat16)
            self.pos = torch.full((bsz,), s - 1, dtype=torch.int64, device=device)
            self.lens = torch.full((bsz,), s, dtype=torch.int32, device=device)
            self.cos, self.sin = cos[self.pos].unsqueeze(1), sin[self.pos].unsqueeze(1)  # (B, 1, D)
            shape = (bsz, KV_HEADS, s, HEAD_DIM)
            self.ck = (torch.randn(shape, device=device, generator=g) * 0.5).to(torch.bfloat16)
            self.cv = torch.randn(shape, device=device, generator=g).to(torch.bfloat16)

    def caches(self) -> tuple[Any, Any]:
        """A fresh copy of the caches (each implementation writes its own)."""
        return self.ck.clone(), self.cv.clone()


def tiletune_layer(w: dict[str, Any], st: State, ck: Any = None, cv: Any = None, fused_mlp: bool = False):
    """``forward()`` of the layer built from ``tiletune.kernels`` for this row's shapes; with
    ``fused_mlp`` the gate-up projection and SwiGLU are one ``K.matmul_swiglu``."""
    import tiletune.kernels as K

    bsz, s = st.B, st.S
    x, cos, sin = st.x, st.cos, st.sin
    qd, kd = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    t = s if st.phase == "prefill" else 1

    def forward() -> Any:
        h = K.rms_norm(x, w["norm1"], EPS)
        qkv = K.matmul(h.view(bsz * t, HIDDEN), w["qkv"]).view(bsz, t, -1)
        q = qkv[..., :qd].unflatten(-1, (HEADS, HEAD_DIM))
        k = qkv[..., qd:qd + kd].unflatten(-1, (KV_HEADS, HEAD_DIM))
        v = qkv[..., qd + kd:].unflatten(-1, (KV_HEADS, HEAD_DIM))
        K.apply_rope_(q, k, cos, sin)
        if st.phase == "prefill":
            o = K.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        else:
            K.kv_cache_append(ck, cv, k.transpose(1, 2), v.transpose(1, 2), st.pos)
            o = K.decode_attention(q.transpose(1, 2), ck, cv, st.lens, causal=True)
        a = K.matmul(o.transpose(1, 2).reshape(bsz * t, HIDDEN), w["o"])
        y, res = K.rms_norm_residual(a, x.view(bsz * t, HIDDEN), w["norm2"], EPS)
        if fused_mlp:
            out = K.matmul(K.matmul_swiglu(y, w["gate_up"]), w["down"])
        else:
            out = K.matmul(K.swiglu(K.matmul(y, w["gate_up"])), w["down"])
        return (out + res).view(bsz, t, HIDDEN)

    return forward


def torch_module(w: dict[str, Any], st: State, ck: Any = None, cv: Any = None) -> Any:
    """The same layer as a ``torch.nn.Module`` (caches as buffers, so graph modes may mutate them)."""
    import torch
    import torch.nn.functional as F

    qd, kd = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    phase, s = st.phase, st.S

    def rms(x: Any, weight: Any) -> Any:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype) * weight

    def rot(x: Any) -> Any:
        x1, x2 = x[..., :HEAD_DIM // 2], x[..., HEAD_DIM // 2:]
        return torch.cat((-x2, x1), dim=-1)

    class Layer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for name, t in w.items():
                self.register_buffer(name, t, persistent=False)
            if phase == "decode":
                self.register_buffer("ck", ck, persistent=False)
                self.register_buffer("cv", cv, persistent=False)

        def forward(self, x: Any, cos: Any, sin: Any) -> Any:
            bsz, t, _ = x.shape
            h = rms(x, self.norm1)
            qkv = h @ self.qkv
            q = qkv[..., :qd].view(bsz, t, HEADS, HEAD_DIM)
            k = qkv[..., qd:qd + kd].view(bsz, t, KV_HEADS, HEAD_DIM)
            v = qkv[..., qd + kd:].view(bsz, t, KV_HEADS, HEAD_DIM)
            c, sn = (cos[:, None, :], sin[:, None, :]) if cos.dim() == 2 else (cos[:, :, None, :], sin[:, :, None, :])
            q = q * c + rot(q) * sn
            k = k * c + rot(k) * sn
            if phase == "prefill":
                o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                   is_causal=True, enable_gqa=True)
            else:
                self.ck[:, :, s - 1] = k[:, 0]
                self.cv[:, :, s - 1] = v[:, 0]
                o = F.scaled_dot_product_attention(q.transpose(1, 2), self.ck, self.cv, enable_gqa=True)
            a = o.transpose(1, 2).reshape(bsz, t, HIDDEN) @ self.o
            res = x + a
            y = rms(res, self.norm2)
            gu = y @ self.gate_up
            act = F.silu(gu[..., :FFN]) * gu[..., FFN:]
            return act @ self.down + res

    return Layer()


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------


def gpu_us(fn: Any, iters: int, warmup: int = 3) -> float:
    """GPU time per call (CUDA events around ``iters`` back-to-back calls)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1000.0 / iters


def interleaved_us(fns: dict[str, Any], iters: int, rounds: int = 5) -> dict[str, float]:
    """:func:`gpu_us` of every callable of ``fns``, measured in ``rounds`` interleaved rounds of about
    ``iters / rounds`` calls each (the order rotates every round), the median round per name: clock and
    thermal drift over a run reach every variant alike instead of whichever was timed last."""
    import statistics

    names = list(fns)
    per = max(3, -(-iters // rounds))
    got: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            got[name].append(gpu_us(fns[name], per, warmup=2))
    return {n: statistics.median(v) for n, v in got.items()}


def host_us(fn: Any, iters: int) -> float:
    """Host time per call of the launch calls (no synchronization inside the loop)."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt * 1e6 / iters


def iters_for(phase: str, bsz: int, s: int) -> int:
    tokens = bsz * (s if phase == "prefill" else 1)
    return max(5, min(200, int(2e5 // max(1, tokens))))


def rel_err(got: Any, want: Any) -> float:
    import torch

    return float(torch.linalg.vector_norm((got.float() - want.float())) / torch.linalg.vector_norm(want.float()))


def kernel_table(kernels: Any, forwards: int, top: int = 25) -> list[dict[str, Any]]:
    """Per-kernel GPU time of one forward from ``(kernel name, duration us)`` pairs of ``forwards`` forwards:
    ``[{"kernel", "us", "calls"}]`` per forward, slowest first, the first ``top`` (the rest summed into
    one ``"(other kernels)"`` entry)."""
    total: dict[str, list[float]] = {}
    for name, us in kernels:
        t = total.setdefault(name, [0.0, 0])
        t[0] += float(us)
        t[1] += 1
    rows = sorted(({"kernel": k, "us": v[0] / forwards, "calls": v[1] / forwards} for k, v in total.items()),
                  key=lambda r: -r["us"])
    if len(rows) > top:
        rest = rows[top:]
        rows = rows[:top] + [{"kernel": "(other kernels)", "us": sum(r["us"] for r in rest),
                              "calls": sum(r["calls"] for r in rest)}]
    return rows


def kernel_sums(profile: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """GPU time per forward of each side of a ``kernel_profile`` (the sum of its kernels, rounded to 0.1 us)."""
    return {side: round(sum(k["us"] for k in kernels), 1) for side, kernels in profile.items()}


def cuda_kernels(fn: Any, forwards: int = 10) -> list[tuple[str, float, float]]:
    """``(name, start_us, end_us)`` of every GPU activity of ``forwards`` calls of ``fn`` (one forward each)
    under ``torch.profiler`` (CUDA activity), after a warm-up call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            fn()
        torch.cuda.synchronize()
    cuda = torch.autograd.DeviceType.CUDA
    return [(e.name, float(e.time_range.start), float(e.time_range.end)) for e in prof.events()
            if e.device_type == cuda]


def profile_kernels(fn: Any, forwards: int = 10) -> list[dict[str, Any]]:
    """:func:`kernel_table` of ``fn`` (one forward) from :func:`cuda_kernels`."""
    return kernel_table(((name, end - start) for name, start, end in cuda_kernels(fn, forwards)), forwards)


def timeline(kernels: list[tuple[str, float, float]], forwards: int) -> dict[str, Any]:
    """Where the GPU time of ``forwards`` consecutive forwards goes, from their kernels' ``(name, start_us,
    end_us)``: per forward, ``span_us`` (first kernel start to last kernel end), ``kernel_us`` (time with a
    kernel running), ``gap_us`` (idle time between the forward's kernels), ``between_forwards_us`` (idle
    time from one forward's last kernel to the next one's first) and, per kernel position, its mean
    ``us`` and the mean idle ``gap_before_us`` (blank when the forwards do not hold the same number of
    kernels)."""
    ev = sorted(kernels, key=lambda e: e[1])
    n = len(ev)
    out: dict[str, Any] = {"forwards": forwards, "kernels_per_forward": n / max(1, forwards)}
    if not ev or forwards < 1:
        return out
    k = n // forwards
    chunks = [ev[i * k:(i + 1) * k] for i in range(forwards)] if k and n == k * forwards else [ev]
    span = busy = 0.0
    pos_us = [0.0] * k if len(chunks) == forwards else []
    pos_gap = [0.0] * len(pos_us)
    for chunk in chunks:
        span += chunk[-1][2] - chunk[0][1]
        end = chunk[0][1]
        for i, (_, a, b) in enumerate(chunk):
            gap = max(0.0, a - end)
            busy += b - max(a, end) if b > end else 0.0
            end = max(end, b)
            if pos_us:
                pos_us[i] += b - a
                if i:
                    pos_gap[i] += gap
    between = [nxt[0][1] - cur[-1][2] for cur, nxt in zip(chunks, chunks[1:])]
    out.update(span_us=span / forwards, kernel_us=busy / forwards, gap_us=(span - busy) / forwards,
               between_forwards_us=(sum(between) / len(between)) if between else None)
    if pos_us:
        out["kernels"] = [{"kernel": chunks[0][i][0][:60], "us": round(pos_us[i] / forwards, 2),
                           "gap_before_us": round(pos_gap[i] / forwards, 2)} for i in range(k)]
    return out


def replay_timeline(fn: Any, forwards: int = 10) -> dict[str, Any]:
    """:func:`timeline` of ``fn`` (one forward, e.g. a CUDA graph's ``replay``) from :func:`cuda_kernels`:
    tells a graph's launch gaps from its kernels' own time."""
    return timeline(cuda_kernels(fn, forwards), forwards)


def static_inputs(st: "State") -> tuple[Any, Any, Any]:
    """Copies of the layer's inputs marked as static addresses for ``torch.compile``, so that its
    ``reduce-overhead`` graphs may read them in place, as a graph over a whole model reads each layer's
    input, instead of starting every replay with a copy into the graph's own input buffers (what a
    single layer called with fresh inputs pays). Whether they do is for the replay timeline to say
    (``replay_timeline["compile_ro_static"]``)."""
    import torch

    out = tuple(t.clone() for t in (st.x, st.cos, st.sin))
    for t in out:
        torch._dynamo.mark_static_address(t)
    return out  # type: ignore[return-value]


def measure_row(w: dict[str, Any], phase: str, bsz: int, s: int, fused_mlp: bool = False,
                profile: bool = False) -> dict[str, Any]:
    """One row: tune + time tiletune, time eager / compile / compile reduce-overhead, check rel_err.

    With ``profile``, ``row["kernel_profile"]`` holds per-kernel GPU time per forward of tiletune's
    layer and of ``torch.compile``'s (default mode: the same Inductor kernels reduce-overhead replays
    from a graph), each launched without a graph so the profiler sees every kernel."""
    import torch

    from tiletune.devices.bench import capture_graph

    st = State(phase, bsz, s)
    row: dict[str, Any] = {"phase": phase, "B": bsz, "S": s}
    n = iters_for(phase, bsz, s)
    tt_caches = st.caches() if phase == "decode" else (None, None)
    fwd = tiletune_layer(w, st, *tt_caches, fused_mlp=fused_mlp)
    t0 = time.perf_counter()
    out_tt = fwd()  # tunes every op of the layer on its first forward
    torch.cuda.synchronize()
    row["tune_s"] = time.perf_counter() - t0
    fwd()
    torch.cuda.synchronize()
    row["tiletune_host_us"] = host_us(fwd, n)
    row["tiletune_stream_us"] = gpu_us(fwd, n)
    g, _ = capture_graph(fwd)

    eager_caches = st.caches() if phase == "decode" else (None, None)
    mod = torch_module(w, st, *eager_caches)
    timed: dict[str, Any] = {"tiletune_us": g.replay}
    with torch.no_grad():
        out_eager = mod(st.x, st.cos, st.sin)
        torch.cuda.synchronize()
        row["rel_err"] = rel_err(out_tt, out_eager)
        timed["eager_us"] = lambda m=mod, x=st.x, c=st.cos, sn=st.sin: m(x, c, sn)
        row["eager_host_us"] = host_us(timed["eager_us"], n)
        torch._dynamo.reset()
        for key, mode, inputs in (("compile_us", None, None), ("compile_ro_us", "reduce-overhead", None),
                                  ("compile_ro_static_us", "reduce-overhead", static_inputs(st))):
            cmod = torch_module(w, st, *(st.caches() if phase == "decode" else (None, None)))
            fn = torch.compile(cmod, mode=mode) if mode else torch.compile(cmod)
            x_in, c_in, s_in = inputs or (st.x, st.cos, st.sin)
            try:
                t0 = time.perf_counter()
                out_c = fn(x_in, c_in, s_in)
                torch.cuda.synchronize()
                row[key.replace("_us", "_warmup_s")] = time.perf_counter() - t0
                row[key.replace("_us", "_rel_err")] = rel_err(out_c, out_eager)
                timed[key] = (lambda f=fn, x=x_in, c=c_in, sn=s_in: f(x, c, sn))
            except Exception as exc:  # noqa: BLE001 - a compile failure is a result, not a crash
                row[key] = None
                row[key.replace("_us", "_error")] = f"{type(exc).__name__}: {str(exc)[:300]}"
        # every GPU time of the row in interleaved rounds (tiletune's graph, eager, both compiled modes)
        row.update(interleaved_us(timed, n))
        if profile and "compile_us" in timed:
            row["kernel_profile"] = {"torch.compile": profile_kernels(timed["compile_us"]),
                                     "tiletune": profile_kernels(fwd)}
            row["kernel_sum_us"] = kernel_sums(row["kernel_profile"])
            # the same forwards as timed: tiletune's graph replay and reduce-overhead's, kernel by kernel
            row["replay_timeline"] = {"tiletune": replay_timeline(g.replay)}
            for key in ("compile_ro", "compile_ro_static"):
                if f"{key}_us" in timed:
                    row["replay_timeline"][key] = replay_timeline(timed[f"{key}_us"])
        del timed
    for key in ("compile_us", "compile_ro_us", "compile_ro_static_us"):
        if row.get(key):
            row[f"vs_{key[:-3]}"] = row[key] / row["tiletune_us"]
    ro = [row[k] for k in ("compile_ro_us", "compile_ro_static_us") if row.get(k)]
    if ro:  # the faster reduce-overhead route a user could take
        row["vs_compile_ro_best"] = min(ro) / row["tiletune_us"]
    row["first_forward_s"] = None
    del g, fwd, mod, st
    gc.collect()
    torch.cuda.empty_cache()
    return row


def first_forward_child(phase: str, bsz: int, s: int, splitk: bool = True, fused_mlp: bool = False,
                        model: str = "llama3-8b") -> float:
    """Wall time of the first forward of the layer in this (fresh) process."""
    import torch

    use_model(model)

    import tiletune.kernels as K  # noqa: F401
    import tiletune.kernels.gemm as _gemm

    _gemm.ROUTE_SMALL_M_TO_SPLITK = splitk

    w = make_weights()
    st = State(phase, bsz, s)
    fwd = tiletune_layer(w, st, *(st.caches() if phase == "decode" else (None, None)), fused_mlp=fused_mlp)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fwd()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def first_forward_fresh(phase: str, bsz: int, s: int, splitk: bool = True, fused_mlp: bool = False,
                        model: str = "llama3-8b") -> float | None:
    from _common import run_child

    env = dict(os.environ)
    root = Path(__file__).resolve().parent.parent
    env["PYTHONPATH"] = f"{root / 'src'}{os.pathsep}{root / 'benchmarks'}{os.pathsep}" + env.get("PYTHONPATH", "")
    code = ("import json, decoder_layer as d; "
            f"print('RESULT ' + json.dumps(d.first_forward_child({phase!r}, {bsz}, {s}, {splitk!r}, {fused_mlp!r}, "
            f"{model!r})))")
    try:
        return float(run_child(code, env, timeout=300))
    except Exception as exc:  # noqa: BLE001
        print(f"first forward child failed: {exc}", file=sys.stderr)
        return None


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # pragma: no cover - matplotlib is optional
        return
    labels = [f"{r['phase']}\nB={r['B']}\nS={r['S']}" for r in rows]
    fig, ax = plt.subplots(figsize=(min(18, max(6, 0.9 * len(rows))), 4))
    xs = range(len(rows))
    for off, key, name in ((-0.3, "eager_us", "eager"), (-0.1, "compile_us", "torch.compile"),
                           (0.1, "compile_ro_us", "compile reduce-overhead"), (0.3, "tiletune_us", "tiletune (graph)")):
        ax.bar([x + off for x in xs], [(r["tiletune_us"] / r[key]) if r.get(key) else 0 for r in rows], 0.2,
               label=name)
    ax.axhline(1.0, color="k", lw=0.5)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("speed relative to tiletune (higher = faster)")
    ax.set_title(f"{MODEL} decoder layer, bf16, H200")
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110 if len(rows) <= 8 else 80)
    plt.close(fig)
    small_png(path)


#: kernel-name fragments -> the part of the layer a kernel belongs to (first match wins)
KERNEL_PARTS = (
    ("GEMM", ("gemm", "nvjet", "splitk", "cublas", "gemv")),
    ("attention", ("decode_", "attention_kernel", "sdpa", "flash", "fmha", "cudnn")),
    ("norm", ("rms_norm", "rsqrt", "layer_norm")),
    ("RoPE + KV cache", ("rope", "kv_append", "cat_copy_mul_neg", "copy_select_slice")),
    ("SwiGLU", ("glu", "silu")),
)


def kernel_part(name: str) -> str:
    """The part of the layer (:data:`KERNEL_PARTS`) a kernel's name belongs to, else ``"other"``."""
    low = name.lower()
    for part, keys in KERNEL_PARTS:
        if any(k in low for k in keys):
            return part
    return "other"


def _by_part(kernels: list[dict[str, Any]]) -> dict[str, float]:
    """``{"kernel", "us"}`` entries summed by part of the layer (:func:`kernel_part`)."""
    parts: dict[str, float] = {}
    for k in kernels:
        part = kernel_part(k["kernel"])
        parts[part] = parts.get(part, 0.0) + float(k["us"])
    return parts


def timeline_parts(t: dict[str, Any]) -> dict[str, float]:
    """One forward of a :func:`timeline` by part of the layer (us), idle time included: the gaps between
    the forward's kernels and the gap before the next forward."""
    parts = _by_part(t.get("kernels", []))
    parts["idle"] = float(t.get("gap_us") or 0.0) + float(t.get("between_forwards_us") or 0.0)
    return parts


#: the replay timelines :func:`plot_timelines` draws per row: (timeline key, label)
TIMELINE_SIDES = (("tiletune", "tiletune"), ("compile_ro", "reduce-overhead"),
                  ("compile_ro_static", "reduce-overhead, static inputs"))


def plot_timelines(rows: list[dict[str, Any]], path: Path,
                   sides: tuple[tuple[str, str], ...] = TIMELINE_SIDES, dpi: int = 110) -> bool:
    """Stacked bars of each row's replay timelines (tiletune's graph vs ``reduce-overhead``), by part of
    the layer: where one forward's GPU time goes. False when no row has timelines or no matplotlib."""
    rows = [r for r in rows if r.get("replay_timeline", {}).get("tiletune", {}).get("kernels")]
    if not rows:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # pragma: no cover - matplotlib is optional
        return False
    names = [p for p, _ in KERNEL_PARTS] + ["other", "idle"]
    labels, stacks, timed = [], [], []
    for r in rows:
        for key, side in sides:
            t = r["replay_timeline"].get(key)
            if t and t.get("kernels"):
                labels.append(f"{r['phase']} B={r['B']} S={r['S']}\n{side}")
                stacks.append(timeline_parts(t))
                timed.append(r.get(f"{key}_us"))
    fig, axes = plt.subplots(1, 2, figsize=(13, max(3.0, 0.3 * len(labels) + 1.0)),
                             gridspec_kw={"width_ratios": [1, 1]})
    handles: list[Any] = []
    names_: list[str] = []
    for ax, subset in zip(axes, ("decode", "prefill")):
        idx = [i for i, lab in enumerate(labels) if lab.startswith(subset)]
        if not idx:
            ax.axis("off")
            continue
        left = [0.0] * len(idx)
        for part in names:
            vals = [stacks[i].get(part, 0.0) for i in idx]
            ax.barh(range(len(idx)), vals, left=left, label=part, color="lightgrey" if part == "idle" else None)
            left = [a + b for a, b in zip(left, vals)]
        marks = [(y, timed[i]) for y, i in enumerate(idx) if timed[i]]
        ax.scatter([m[1] for m in marks], [m[0] for m in marks], marker="|", s=400, color="black", zorder=3,
                   label="timed per forward, no profiler")
        ax.set_yticks(list(range(len(idx))))
        ax.set_yticklabels([labels[i] for i in idx], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("GPU time of one forward, replayed from a CUDA graph (us)")
        ax.set_title(f"{subset}: where the time goes")
        if not handles:  # the legend of the first panel that drew bars (a run may hold one phase only)
            handles, names_ = ax.get_legend_handles_labels()
    fig.legend(handles, names_, fontsize=7, loc="lower center", ncol=max(1, len(names_)))
    fig.suptitle(f"{MODEL} decoder layer, bf16, H200: tiletune vs torch.compile(mode='reduce-overhead'), under "
                 "torch.profiler\n(reduce-overhead's idle time includes its CUDA-graph trees' host work, which "
                 "the profiler slows down: compare the timed marks)", fontsize=9)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    small_png(path)
    return True


# --------------------------------------------------------------------------------------------
# merging runs: one result file from rows measured in several device calls
# --------------------------------------------------------------------------------------------

#: per-row diagnostics too large for the summary file: kept in ``<name>_detail.json.gz``
DETAIL_KEYS = ("kernel_profile", "replay_timeline")
#: what must agree between the runs merged into one file
SAME_IN_MERGED_RUNS = ("gpu", "arch", "driver", "torch", "versions", "layer", "fused_mlp", "splitk")


def kernel_list_parts(kernels: list[dict[str, Any]]) -> dict[str, float]:
    """A ``kernel_profile`` side (per-forward kernel list) summed by part of the layer (us, 0.1 us)."""
    return {p: round(v, 1) for p, v in _by_part(kernels).items()}


def row_parts(row: dict[str, Any]) -> dict[str, dict[str, float]]:
    """GPU time per forward by part of the layer, per side: ``<side>_replay`` from the graph replays'
    timelines (idle time included), ``<side>`` from the kernel profile launched without a graph."""
    out = {f"{side}_replay": {p: round(v, 1) for p, v in timeline_parts(t).items()}
           for side, t in row.get("replay_timeline", {}).items() if t.get("kernels")}
    out.update({side: kernel_list_parts(ks) for side, ks in row.get("kernel_profile", {}).items()})
    return out


def summary_row(row: dict[str, Any]) -> dict[str, Any]:
    """A row without its :data:`DETAIL_KEYS`, with their by-part sums (:func:`row_parts`) as ``parts_us``
    and what bounds the row:

    * ``ceiling_vs_compile``: ``compile_us`` over the GEMM + attention kernel time of ``torch.compile``'s
      forward, i.e. the ratio to default ``torch.compile`` that tiletune's layer would reach with its GEMM and
      attention kernels exactly as fast as cuBLAS's and cuDNN's and every other kernel (and launch) free;
    * decode rows: ``kv_cache_bytes`` (the K and V positions ``[0, S)`` attention reads, the layer's
      shapes, 2-byte elements) and ``attention_tbps``, that read over tiletune's attention time in its
      graph replay (TB/s)."""
    out = {k: v for k, v in row.items() if k not in DETAIL_KEYS}
    parts = row_parts(row)
    if parts:
        out["parts_us"] = parts
    ref = parts.get("torch.compile", {})
    bound = ref.get("GEMM", 0.0) + ref.get("attention", 0.0)
    if bound > 0 and row.get("compile_us"):
        out["ceiling_vs_compile"] = round(row["compile_us"] / bound, 3)
    if row["phase"] == "decode":
        kv = 2 * row["B"] * KV_HEADS * row["S"] * HEAD_DIM * 2
        out["kv_cache_bytes"] = kv
        att = parts.get("tiletune_replay", {}).get("attention")
        if att:
            out["attention_tbps"] = round(kv / att / 1e6, 2)
    return out


def row_label(row: dict[str, Any]) -> str:
    return f"{row['phase']}:{row['B']}:{row['S']}"


def merge_docs(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """One result document from the documents of several runs of the same layer on the same machine:
    their rows, a row measured twice taken from the later run (by ``date``), ordered as the full row set;
    ``merged_from`` says which run gave which rows, ``rows_missing`` which rows of the full set none did,
    ``quick`` whether every run was a ``--quick`` one.
    Runs that disagree on the GPU, the software versions or the layer raise ``ValueError``."""
    if not docs:
        raise ValueError("nothing to merge")
    docs = sorted(docs, key=lambda d: str(d.get("date", "")))
    first = docs[0]
    for d in docs[1:]:
        for key in SAME_IN_MERGED_RUNS:
            if d.get(key) != first.get(key):
                raise ValueError(f"cannot merge runs that differ in {key!r}: {first.get(key)!r} vs {d.get(key)!r}")
    rows: dict[str, dict[str, Any]] = {}
    sources = []
    for d in docs:
        for r in d["rows"]:
            rows[row_label(r)] = r
        sources.append({"date": d.get("date"), "wall_s": d.get("wall_s"), "rows": [row_label(r) for r in d["rows"]]})
    order = {f"{p}:{b}:{s}": i for i, (p, b, s) in enumerate(FULL_ROWS)}
    merged = sorted(rows.values(), key=lambda r: (order.get(row_label(r), len(order)), r["phase"], r["B"], r["S"]))
    first_forward = [r for r in merged if r.get("first_forward_s") is not None]
    out = {k: v for k, v in docs[-1].items() if k not in ("rows", "wall_s", "quick")}
    out.update({"quick": all(d.get("quick") for d in docs), "merged_from": sources, "rows": merged,
                "rows_missing": [label for label in order if label not in rows],
                "first_forward_rows": [row_label(r) for r in first_forward]})
    return out


def read_result(path: Path) -> dict[str, Any]:
    """A result document from ``.json`` or ``.json.gz``."""
    if path.suffix == ".gz":
        import gzip

        return json.loads(gzip.decompress(path.read_bytes()))
    return json.loads(path.read_text())


def merge_results(paths: list[Path], out_dir: Path) -> Path:
    """Merge the result files of several runs (:func:`merge_docs`) into ``<out_dir>/<name>.json`` (rows
    by :func:`summary_row`) and ``<name>_detail.json.gz`` (the rows whole), and draw both PNGs."""
    import gzip

    doc = merge_docs([read_result(p) for p in paths])
    model = doc.get("layer", {}).get("model", "llama3-8b")
    use_model(model)
    name = "decoder_layer" + ("" if model == "llama3-8b" else f"_{model}") + \
        ("_fused_mlp" if doc.get("fused_mlp") else "")
    out_dir.mkdir(parents=True, exist_ok=True)
    full_rows = doc["rows"]
    (out_dir / f"{name}_detail.json.gz").write_bytes(
        gzip.compress((json.dumps(doc, separators=(",", ":")) + "\n").encode(), mtime=0))
    summary = dict(doc, rows=[summary_row(r) for r in full_rows], detail=f"{name}_detail.json.gz")
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(summary, indent=1) + "\n")
    plot(summary["rows"], path.with_suffix(".png"))
    plot_merged_timelines(full_rows, out_dir / f"{name}_timeline.png")
    return path


def plot_merged_timelines(rows: list[dict[str, Any]], path: Path) -> bool:
    """:func:`plot_timelines` of a merged file's many rows: tiletune and plain ``reduce-overhead`` only, at a
    lower resolution (the tracked tree's size)."""
    return plot_timelines(rows, path, sides=TIMELINE_SIDES[:2], dpi=72)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 rows (budget < 4 min on a fresh H200)")
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="output folder")
    ap.add_argument("--no-first-forward", action="store_true")
    ap.add_argument("--profile-kernels", action="store_true",
                    help="per-kernel GPU time of one forward, tiletune vs torch.compile, in each row (torch.profiler)")
    ap.add_argument("--no-splitk", action="store_true",
                    help="keep small-M 16-bit GEMMs on the plain GEMM (tiletune.kernels.gemm.ROUTE_SMALL_M_TO_SPLITK = False)")
    ap.add_argument("--model", default="llama3-8b", choices=sorted(MODELS),
                    help="layer shapes (default llama3-8b; other models write decoder_layer_<model>*.json)")
    ap.add_argument("--rows", default=None, help="rows by hand: phase:B:S[,phase:B:S...] (e.g. decode:8:2048)")
    ap.add_argument("--splitk", action="store_true",
                    help="(the default since split-K passed on the H200; kept for old command lines)")
    ap.add_argument("--fused-mlp", action="store_true",
                    help="gate-up projection + SwiGLU as one fused GEMM (tiletune.kernels.matmul_swiglu)")
    ap.add_argument("--merge", metavar="JSON", nargs="+", default=None,
                    help="no GPU: merge the result files of several runs into one (written under --out)")
    ap.add_argument("--replot", metavar="JSON", default=None,
                    help="no GPU: redraw the PNGs of a result file (bars, and replay timelines where recorded)")
    args = ap.parse_args(argv)
    if args.merge:
        path = merge_results([Path(p) for p in args.merge], Path(args.out or Path(__file__).parent / "results" / "h200"))
        print(f"merged {len(args.merge)} runs into {path}")
        return 0
    if args.replot:
        src = Path(args.replot)
        doc = read_result(src)
        use_model(doc.get("layer", {}).get("model", "llama3-8b"))
        rows = doc["rows"]
        plot(rows, src.with_suffix(".png"))
        if doc.get("detail") and (src.parent / doc["detail"]).exists():  # a merged file: timelines in its detail
            drawn = plot_merged_timelines(read_result(src.parent / doc["detail"])["rows"],
                                          src.with_name(src.stem + "_timeline.png"))
        else:
            drawn = plot_timelines(rows, src.with_name(src.stem + "_timeline.png"))
        print(f"redrew {src.with_suffix('.png')}" + (f" and {src.stem}_timeline.png" if drawn else ""))
        return 0
    import torch

    import tiletune.kernels.gemm as _gemm

    use_model(args.model)
    if args.no_splitk:
        _gemm.ROUTE_SMALL_M_TO_SPLITK = False
    splitk = _gemm.ROUTE_SMALL_M_TO_SPLITK

    from _common import write_result

    t_start = time.perf_counter()
    w = make_weights()
    rows = []
    out = Path(args.out) if args.out else None
    # a --fused-mlp run writes decoder_layer_fused_mlp.json beside the unfused run's decoder_layer.json
    name = "decoder_layer" + ("" if args.model == "llama3-8b" else f"_{args.model}") + \
        ("_fused_mlp" if args.fused_mlp else "")

    def save() -> Path:  # after every row too, so a run cut by a deadline keeps its finished rows
        return write_result(name, {"quick": args.quick, "splitk": splitk, "fused_mlp": args.fused_mlp,
                                   "rows": rows, "wall_s": time.perf_counter() - t_start,
                                   "layer": {"model": MODEL, "hidden": HIDDEN, "heads": HEADS, "kv_heads": KV_HEADS,
                                             "head_dim": HEAD_DIM, "ffn": FFN, "dtype": "bfloat16"}}, out)

    for phase, bsz, s in rows_for(args.quick, args.rows):
        r = measure_row(w, phase, bsz, s, fused_mlp=args.fused_mlp, profile=args.profile_kernels)
        rows.append(r)
        print(json.dumps(r), flush=True)
        save()
    if rows and not args.no_first_forward:
        r0 = rows[0]
        r0["first_forward_s"] = first_forward_fresh(r0["phase"], r0["B"], r0["S"], splitk, args.fused_mlp,
                                                    args.model)
    path = save()
    plot(rows, path.with_suffix(".png"))
    plot_timelines(rows, path.with_name(path.stem + "_timeline.png"))
    del torch
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
