#!/usr/bin/env python
"""How good is nearest-neighbour serving? The served config of an untuned shape against its exact tuning.

A library op meeting a shape nobody tuned answers at once with the config of its nearest tuned
neighbour (from the user's database or the shipped table ``tiletune/data/tables/h200-sm90.json``),
checked once (:mod:`tiletune.resolve.nearest`). This script measures what that answer costs against
tuning the exact shape, on shapes drawn at random (seeded) from real model dimensions:

* ``rms_norm``: ``K.rms_norm(x, w)``, x ``(M, H)``;
* ``swiglu``: ``K.swiglu(x)``, x ``(M, 2I)``;
* ``softmax``: ``K.softmax(x, -1)``, x ``(M, V)`` (a row softmax over the vocabulary);
* ``matmul_linear``: ``K.matmul(a, w.t())``, a ``(M, K)``, w ``(N, K)`` an ``nn.Linear`` weight of one of
  the model's projections (fused qkv, o, fused gate-up, down; the lm head is left out: one exact
  tuning of it would take a sizeable part of the budget);
* ``attention``: ``K.attention(q, k, v, causal=True)``, GQA ``(B, H, S, D)`` / ``(B, Hkv, S, D)``, D = 128;
* ``rope``: ``K.apply_rope_(q, k, cos, sin)``, ``(1, S, H|Hkv, D)`` bshd, D = 128;
* ``rms_norm_residual``: ``K.rms_norm_residual(x, r, w)``; ``layer_norm``: ``K.layer_norm(x, w, b)``, x ``(M, H)``;
* ``geglu``: ``K.geglu(x)``, x ``(M, 2I)``; ``cross_entropy``: ``K.cross_entropy(logits, target)``, logits ``(M, V)``.

The first five are the default (``--families default``); the last five (``--families extra``) are the other
library ops with shipped table entries (decode attention has none); ``--families all`` runs the ten.

All bf16. Models (hidden / MLP / heads / kv heads / head dim / vocab): Llama-3-8B, Mistral-7B,
Qwen2.5-7B, Gemma-2-9B, Phi-3-mini (:data:`offgrid.MODEL_DIMS`; attention and rope draw only those
with 128-element heads). Token counts ``M`` are log-uniform in 1-8192, attention's ``S`` in 300-8192
and ``B`` uniform in 1-4; ``M`` and ``S`` are never powers of two (a draw that is one is drawn again),
and a memory-op tensor over :data:`ELEMENT_CAP` elements or a product over :data:`FLOP_CAP` FLOPs is
drawn again (``skipped``). Each family draws from its own stream ``(seed, family)``.

Per shape, in this one process:

1. **served**: every library op on an EMPTY database with the tables on (what a new user gets); the
   public op is called once with its tuned-op launches recorded
   (:func:`tiletune.op.tuned_op.record_launches`) and its choices heard on ``tiletune.events``
   (``"choice"``: source ``table`` / ``nearest`` / ``tuned`` / ...). A call whose every choice was
   ``tuned`` had no neighbour: the row is marked ``no_neighbour`` (it tuned the exact shape; no ratio).
2. **tuned**: another empty database, tables off, ``miss_scope(on_miss="tune")``: the same call tunes
   every kernel it launches on this exact shape (ops with row buckets tune the bucket's key on this
   call's arguments).
3. **timed**: for each kernel launched by the tuned call (its op and arguments), the served config
   and the tuned config through ``op.launch_parts(cfg, args)`` on the same arguments, interleaved: in
   each of ``--rounds`` rounds, ``triton.testing.do_bench``'s median (L2 flushed) of the served launch
   then of the tuned launch, summed over the call's kernels; ``ratio`` = median over rounds of
   served / tuned (> 1: the neighbour's config is slower); ``served_us`` / ``tuned_us`` the rounds'
   medians. A call whose configs are all equal is timed once and has ratio 1 exactly (``identical``).

Costs (H200, 2026-12-04 runs): the exact tuning is nearly all of a row (memory ops 0.4-0.6 s, attention
~1 s, a plain GEMM 2-3 s, a split-K GEMM key (M <= 256: 60% of the matmul draws) 10-23 s, each family's
first rows more while cuTile's cache is cold); the timing 0.1-0.3 s with the defaults (3 rounds, 20 ms
do_bench). Nothing is shared between rows but cuTile's caches (on disk, and tiletune's front-end cache):
a config's cubin depends on its constants, dtypes and the 16-divisibility of shapes and strides that
cuTile's dispatcher infers, not on the sizes, so a family's later rows compile little. Each row keeps its
tunings' stats (``kernels[].tuning``: evaluations, strategy, phases, compile / check / timing seconds),
its ``row_s``, ``tune_s``, ``served_first_call_s`` and ``timing_s``; each family ``time_s`` (their sums).
A row served by a race of neighbours' configs keeps it (``kernels[].raced``: each config weighed, its
neighbour, distance, race median ``race_us`` and verdict); where the served config is over
:data:`RACE_REPLAY_RATIO` slower than the tuned one, every config the race compiled is timed again by
``do_bench`` (``bench_us``): does the race rank them as ``do_bench`` does, or did a faster one fail its check?

Rows are measured round-robin over the families (shape i of every family, then i + 1), so a run cut
by ``--budget-s`` (no new shape is started once it is spent) leaves every family measured alike; the
JSON is written after every row. The run ends up to a row's time (a cold split-K tuning: ~25 s) after the
budget, plus ~20 s of start-up.

    python benchmarks/nearest_quality.py [--out DIR] [--seed 0] [--per-family 40] [--budget-s 360]
        [--families default|extra|all|rms_norm,swiglu,...] [--rounds 3]

Writes ``nearest_quality.json``: ``seed``, ``gpu``, ``driver``, ``versions``, ``date``, ``families``
(per family: ``op``, ``n_shapes`` (rows with a ratio), ``median_ratio``, ``worst_ratio``,
``served_sources`` (row counts), ...), ``rows`` (``family``, ``shape``, ``served_source``, ``served_config``,
``tuned_config``, ``served_us``, ``tuned_us``, ``ratio``, ...) and ``skipped``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from offgrid import MODEL_DIMS, projection  # noqa: E402 - stdlib-only module of this folder

NAME = "nearest_quality"
FAMILIES = ("rms_norm", "swiglu", "softmax", "matmul_linear", "attention", "rope", "rms_norm_residual", "layer_norm",
            "geglu", "cross_entropy")
DEFAULT_FAMILIES = ("rms_norm", "swiglu", "softmax", "matmul_linear", "attention")
#: the library op families with a shipped table entry beyond the defaults (``--families extra``; decode attention
#: has no shipped entry)
EXTRA_FAMILIES = ("rope", "rms_norm_residual", "layer_norm", "geglu", "cross_entropy")
#: token counts (M; rope's S) and attention's sequence lengths and batch
TOKENS = (1, 8192)
SEQ = (300, 8192)
BATCH = (1, 4)
HEAD_DIM = 128
PROJECTIONS = ("qkv", "o", "gate_up", "down")
#: largest memory-op tensor (elements; bf16: 1 GiB) and largest GEMM / attention (FLOPs of one call)
ELEMENT_CAP = 2 ** 29
FLOP_CAP = 4.0e12
EPS = 1e-6
ROUNDS = 3
#: triton.testing.do_bench's warm-up and repetition time (ms) per timed launch (a 10 us kernel: ~2000
#: launches; the largest drawn GEMM, ~1.5 ms: ~13)
BENCH_WARMUP_MS = 5
BENCH_REP_MS = 20
DEFAULT_PER_FAMILY = 40
DEFAULT_BUDGET_S = 360.0
#: a full ``gc.collect()`` every this many rows (torch's allocator cache is emptied after every row)
GC_EVERY = 8


# --------------------------------------------------------------------------------------------
# shapes (pure)
# --------------------------------------------------------------------------------------------


def is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def log_uniform_off_pow2(r: random.Random, lo: int, hi: int) -> int:
    """Log-uniform integer in ``[lo, hi]`` that is not a power of two (drawn again until it is not)."""
    while True:
        n = max(lo, min(hi, int(round(math.exp(r.uniform(math.log(lo), math.log(hi)))))))
        if not is_pow2(n):
            return n


def models_with_head_dim(d: int) -> list[str]:
    return sorted(m for m, dims in MODEL_DIMS.items() if dims["head_dim"] == d)


def _draw_one(family: str, r: random.Random) -> dict[str, Any]:
    if family in ("attention", "rope"):
        model = r.choice(models_with_head_dim(HEAD_DIM))
    else:
        model = r.choice(sorted(MODEL_DIMS))
    m = MODEL_DIMS[model]
    if family in ("rms_norm", "rms_norm_residual", "layer_norm"):
        return {"family": family, "model": model, "M": log_uniform_off_pow2(r, *TOKENS), "H": m["hidden"]}
    if family in ("swiglu", "geglu"):
        return {"family": family, "model": model, "M": log_uniform_off_pow2(r, *TOKENS), "I": m["ffn"]}
    if family in ("softmax", "cross_entropy"):
        return {"family": family, "model": model, "M": log_uniform_off_pow2(r, *TOKENS), "V": m["vocab"]}
    if family == "matmul_linear":
        proj = r.choice(PROJECTIONS)
        n, k = projection(m, proj)
        return {"family": family, "model": model, "proj": proj, "M": log_uniform_off_pow2(r, *TOKENS), "N": n,
                "K": k}
    if family == "attention":
        return {"family": family, "model": model, "B": r.randint(*BATCH), "H": m["heads"], "Hkv": m["kv_heads"],
                "S": log_uniform_off_pow2(r, *SEQ), "D": m["head_dim"]}
    if family == "rope":
        return {"family": family, "model": model, "B": 1, "S": log_uniform_off_pow2(r, *TOKENS), "H": m["heads"],
                "Hkv": m["kv_heads"], "D": m["head_dim"]}
    raise ValueError(f"unknown family {family!r}")


def size_of(shape: dict[str, Any]) -> tuple[int, float]:
    """``(elements of the largest tensor, FLOPs)`` of one call (pure)."""
    f = shape["family"]
    if f in ("rms_norm", "rms_norm_residual", "layer_norm"):
        return shape["M"] * shape["H"], (5.0 if f != "rms_norm" else 4.0) * shape["M"] * shape["H"]
    if f in ("swiglu", "geglu"):
        return 2 * shape["M"] * shape["I"], (4.0 if f == "swiglu" else 8.0) * shape["M"] * shape["I"]
    if f in ("softmax", "cross_entropy"):
        return shape["M"] * shape["V"], 5.0 * shape["M"] * shape["V"]
    if f == "matmul_linear":
        m, n, k = shape["M"], shape["N"], shape["K"]
        return max(m * k, n * k, m * n), 2.0 * m * n * k
    if f == "attention":
        b, h, s, d = shape["B"], shape["H"], shape["S"], shape["D"]
        return b * h * s * d, 4.0 * b * h * s * s * d * 0.5
    if f == "rope":
        return shape["B"] * shape["S"] * shape["H"] * shape["D"], 6.0 * shape["B"] * shape["S"] * (
            shape["H"] + shape["Hkv"]) * shape["D"]
    raise ValueError(f"unknown family {f!r}")


def why_not(shape: dict[str, Any]) -> str | None:
    """Why a drawn shape is not measured (None: it is)."""
    elems, flops = size_of(shape)
    if elems > ELEMENT_CAP:
        return f"{elems} elements > cap {ELEMENT_CAP}"
    if flops > FLOP_CAP:
        return f"{flops:.3g} FLOPs > cap {FLOP_CAP:.3g}"
    return None


def draw_family(family: str, n: int, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``n`` measurable shapes of ``family`` and the draws set aside (``{"shape", "reason"}``), from the
    stream ``(seed, family)``: the same on every machine; the first ``k`` of ``n`` are a run of ``k``'s."""
    r = random.Random(f"tiletune-nearest-quality:{seed}:{family}")
    shapes: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    tries = 0
    while len(shapes) < n:
        tries += 1
        if tries > 100 * n + 100:
            raise RuntimeError(f"{family}: could not draw {n} measurable shapes")
        s = _draw_one(family, r)
        reason = why_not(s)
        if reason:
            skipped.append({"shape": s, "reason": reason})
        else:
            shapes.append(s)
    return shapes, skipped


def plan(families: Sequence[str], n: int, seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every row's shape, round-robin over the families (shape i of each, then i + 1); and the draws
    set aside (pure)."""
    drawn = {f: draw_family(f, n, seed) for f in families}
    rows = [drawn[f][0][i] for i in range(n) for f in families]
    skipped = [s for f in families for s in drawn[f][1]]
    return rows, skipped


def shape_label(s: dict[str, Any]) -> str:
    return f"{s['family']} {s['model']} " + " ".join(f"{k}={v}" for k, v in s.items() if k not in ("family", "model"))


# --------------------------------------------------------------------------------------------
# choices, kernels, timing (pure but for the op objects and the bench function they are given)
# --------------------------------------------------------------------------------------------


def _config_dict(cfg: Any) -> dict[str, Any] | None:
    if cfg is None:
        return None
    as_dict = getattr(cfg, "as_dict", None)
    return dict(as_dict()) if callable(as_dict) else dict(cfg)


def key_shapes(key_json: str | None) -> list[list[int]] | None:
    """The tensor shapes of a stored key (a neighbour's), for the row: the key itself is long."""
    if not key_json:
        return None
    try:
        doc = json.loads(key_json)
    except (TypeError, ValueError):
        return None
    out: list[list[int]] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if isinstance(x.get("shape"), list):
                out.append([int(v) for v in x["shape"]])
                return
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(doc)
    return out


#: what a row keeps of a tuning's stats (``TuneResult.stats``): where an exact tuning's time went
TUNING_STATS = ("strategy", "evaluations", "space_size", "stopped", "batches", "samples", "session_clock_s", "phases",
                "compile_s", "compile_wall_s", "check_s", "timing_s", "idle_s", "worker_start_s", "compiled")


def tuning_stats(result: Any) -> dict[str, Any] | None:
    """The tuning's wall time and the parts of its stats that say where the time went (None: no tuning)."""
    if result is None:
        return None
    stats = getattr(result, "stats", None) or {}
    out: dict[str, Any] = {"wall_s": round(float(getattr(result, "wall_s", 0.0) or 0.0), 3)}
    for k in TUNING_STATS:
        v = stats.get(k)
        if v is None:
            continue
        if isinstance(v, float):
            v = round(v, 4)
        elif isinstance(v, dict):
            v = {str(a): (round(b, 4) if isinstance(b, float) else b) for a, b in v.items()}
        out[k] = v
    return out


def key_summary(key_json: str | None) -> Any:
    """A stored key, short: a problem key's named sizes (``{"M": 512, "N": 4096, ...}``), else its tensor
    shapes (:func:`key_shapes`)."""
    if not key_json:
        return None
    try:
        doc = json.loads(key_json)
    except (TypeError, ValueError):
        return None
    if isinstance(doc, list) and len(doc) == 2 and isinstance(doc[1], dict) and "problem" in doc[1]:
        return dict(doc[1])
    return key_shapes(key_json)


def raced_out(raced: Iterable[Any]) -> list[dict[str, Any]]:
    """A nearest choice's race (:class:`tiletune.resolve.problem.Raced`), for the row: each config weighed,
    its neighbour's shapes, distance, race median (us) and verdict."""
    return [{"config": _config_dict(r.config), "neighbour": key_summary(r.neighbour),
             "distance": None if r.distance is None else round(float(r.distance), 4),
             "race_us": None if r.median_us is None or r.median_us == float("inf") else round(float(r.median_us), 3),
             "verdict": r.verdict, **({"variant": True} if getattr(r, "variant", False) else {})} for r in raced]


class ChoiceLog:
    """Listens to ``tiletune.events``' ``"choice"`` while in a ``with`` block: ``(op name, key) ->
    {"source", "config", "neighbour", "provisional"}`` of every key answered."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Any, dict[str, Any]]] = []

    def __call__(self, op: Any = None, problem: Any = None, choice: Any = None, **_: Any) -> None:
        name = getattr(problem, "name", None) or op
        info = {"source": getattr(choice, "source", None), "config": _config_dict(getattr(choice, "config", None)),
                "neighbour": getattr(choice, "neighbour", None),
                "provisional": bool(getattr(choice, "provisional", False)),
                "seconds": getattr(choice, "seconds", None), "tuning": tuning_stats(getattr(choice, "result", None)),
                "raced": tuple(getattr(choice, "raced", ()) or ())}
        self.items.append((str(name), getattr(problem, "key", None), info))

    def find(self, name: str, key: Any) -> dict[str, Any] | None:
        for n, k, info in self.items:
            try:
                if n == name and k == key:
                    return info
            except Exception:  # noqa: BLE001 - keys that do not compare: not this one
                continue
        return None

    def __enter__(self) -> "ChoiceLog":
        from tiletune import events

        events.subscribe("choice", self)
        return self

    def __exit__(self, *exc: Any) -> None:
        from tiletune import events

        events.unsubscribe("choice", self)


def kernels_of(recorded: Iterable[tuple[Any, Any, tuple[Any, ...]]], log: ChoiceLog) -> list[dict[str, Any]]:
    """The launches of one recorded call: per launch ``{"op" (the tuned op), "name", "args", "config"
    (the config it launched), "source" (the choice's; ``"bucket"`` for a key answered by a bucket another
    launch of the call resolved), "neighbour"}``."""
    out = []
    for op, _key, args in recorded:
        key = op.key_of(*args)
        info = log.find(op.name, key)
        cfg = op.known_config(*args)
        if cfg is None and info is not None:
            cfg = info["config"]
        if cfg is None:
            raise RuntimeError(f"{op.name}: no config known for a launch of the recorded call")
        out.append({"op": op, "name": op.name, "args": args, "config": cfg,
                    "source": info["source"] if info is not None else "bucket",
                    "neighbour": info["neighbour"] if info is not None else None,
                    "tuning": info.get("tuning") if info is not None else None,
                    "raced": info.get("raced") if info is not None else None})
    return out


def combined_source(sources: Sequence[str]) -> str:
    """The row's source: the kernels' distinct sources in launch order, joined by ``+``."""
    seen: list[str] = []
    for s in sources:
        if s not in seen:
            seen.append(s)
    return "+".join(seen) if seen else "none"


def paired(served: Sequence[dict[str, Any]], tuned: Sequence[dict[str, Any]]) -> bool:
    """Whether both calls launched the same kernels in the same order (so each tuned launch's arguments
    time the served config too)."""
    return len(served) == len(tuned) and all(a["name"] == b["name"] for a, b in zip(served, tuned))


def launcher(op: Any, cfg: Any, args: tuple[Any, ...]) -> Callable[[], None]:
    """One launch of ``cfg``'s kernel on ``args`` (outputs overwritten), as the op's hot path issues it."""
    parts, grid, kargs = op.launch_parts(cfg, args)
    launch, stream, kernel, dev = parts  # LaunchParts(launch, stream, kernel, device)

    def run() -> None:
        launch(stream(dev), grid, kernel, kargs)

    return run


def time_pair(served: Sequence[Callable[[], Any]], tuned: Sequence[Callable[[], Any]],
              bench: Callable[[Callable[[], Any]], float], rounds: int = ROUNDS) -> dict[str, Any]:
    """Interleaved rounds: per round each kernel's served launch then its tuned launch by ``bench`` (us),
    summed over the kernels. ``served_us`` / ``tuned_us``: medians of the rounds' sums; ``ratio``: median
    of the rounds' served / tuned; ``round_ratios``."""
    s_rounds: list[float] = []
    t_rounds: list[float] = []
    for _ in range(rounds):
        s_sum = t_sum = 0.0
        for i in range(max(len(served), len(tuned))):
            if i < len(served):
                s_sum += bench(served[i])
            if i < len(tuned):
                t_sum += bench(tuned[i])
        s_rounds.append(s_sum)
        t_rounds.append(t_sum)
    ratios = [s / t for s, t in zip(s_rounds, t_rounds) if t > 0]
    return {"served_us": round(statistics.median(s_rounds), 3), "tuned_us": round(statistics.median(t_rounds), 3),
            "ratio": round(statistics.median(ratios), 4) if ratios else None,
            "round_ratios": [round(x, 4) for x in ratios]}


def do_bench_us(fn: Callable[[], Any]) -> float:
    """``triton.testing.do_bench``'s median of ``fn`` in microseconds (L2 flushed between calls)."""
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=BENCH_WARMUP_MS, rep=BENCH_REP_MS, return_mode="median")) * 1e3


def _configs_out(kernels: Sequence[dict[str, Any]]) -> Any:
    """A row's config field: the one kernel's config, or ``[{"op", "config"}, ...]`` for several."""
    if len(kernels) == 1:
        return _config_dict(kernels[0]["config"])
    return [{"op": k["name"], "config": _config_dict(k["config"])} for k in kernels]


def compare(row: dict[str, Any], served_k: list[dict[str, Any]], tuned_k: list[dict[str, Any]],
            bench: Callable[[Callable[[], Any]], float], rounds: int,
            make_launcher: Callable[[Any, Any, tuple[Any, ...]], Callable[[], None]] = launcher) -> dict[str, Any]:
    """Fill ``row`` with the configs, the per-kernel detail, the times and the ratio of one shape."""
    row["tuned_config"] = _configs_out(tuned_k)
    row["paired"] = paired(served_k, tuned_k)
    row["kernels"] = [{"op": s["name"], "source": s["source"], "served_config": _config_dict(s["config"]),
                       "tuned_config": _config_dict(t["config"]) if t is not None else None,
                       "neighbour": key_summary(s["neighbour"]),
                       "raced": raced_out(s.get("raced") or ()) or None,
                       "tuning": t.get("tuning") if t is not None else None}
                      for s, t in zip(served_k, list(tuned_k) + [None] * max(0, len(served_k) - len(tuned_k)))]
    if row["paired"]:  # both configs on the tuned call's arguments
        s_fns = [make_launcher(t["op"], s["config"], t["args"]) for s, t in zip(served_k, tuned_k)]
        t_fns = [make_launcher(t["op"], t["config"], t["args"]) for t in tuned_k]
        row["identical"] = all(_config_dict(s["config"]) == _config_dict(t["config"])
                               for s, t in zip(served_k, tuned_k))
    else:  # different kernels: each call's own launches, summed
        s_fns = [make_launcher(s["op"], s["config"], s["args"]) for s in served_k]
        t_fns = [make_launcher(t["op"], t["config"], t["args"]) for t in tuned_k]
        row["identical"] = False
    t0 = time.perf_counter()
    for fn in (*s_fns, *t_fns):  # compile (cuTile JIT) outside the timing
        fn()
    if row["identical"]:  # the same launches: timed once, ratio 1 exactly
        us = round(sum(bench(fn) for fn in t_fns), 3)
        row.update(served_us=us, tuned_us=us, ratio=1.0, round_ratios=[])
    else:
        row.update(time_pair(s_fns, t_fns, bench, rounds=rounds))
    if row["paired"] and (row.get("ratio") or 0) > RACE_REPLAY_RATIO:
        replay_race(row, served_k, tuned_k, bench, make_launcher)
    row["timing_s"] = round(time.perf_counter() - t0, 3)
    return row


#: a paired row whose served config is this much slower than the tuned one has its race replayed
RACE_REPLAY_RATIO = 1.10


def replay_race(row: dict[str, Any], served_k: list[dict[str, Any]], tuned_k: list[dict[str, Any]],
                bench: Callable[[Callable[[], Any]], float],
                make_launcher: Callable[[Any, Any, tuple[Any, ...]], Callable[[], None]]) -> None:
    """A slow served row's race, re-timed by ``bench`` on the tuned call's arguments: each raced config
    that the race compiled gets ``bench_us`` in ``row["kernels"][i]["raced"]``, so the row tells whether
    the race's timing ranked the configs as ``bench`` does, or the faster one failed its check."""
    for i, (s, t) in enumerate(zip(served_k, tuned_k)):
        raced = list(s.get("raced") or ())
        out = row["kernels"][i].get("raced") or []
        if len(raced) < 2 or len(out) != len(raced):
            continue
        for r, o in zip(raced, out):
            if r.verdict in ("served", "slower"):
                try:
                    fn = make_launcher(t["op"], r.config, t["args"])
                    fn()
                    o["bench_us"] = round(bench(fn), 3)
                except Exception as exc:  # noqa: BLE001 - a config that cannot launch here: say so in the row
                    o["bench_error"] = f"{type(exc).__name__}: {exc}"[:200]


# --------------------------------------------------------------------------------------------
# results (pure)
# --------------------------------------------------------------------------------------------


def geomean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def summarize(rows: Sequence[dict[str, Any]], families: Sequence[str]) -> list[dict[str, Any]]:
    """Per family: ``op``, ``n_shapes`` (rows with a ratio), ``median_ratio``, ``worst_ratio`` (the largest:
    the served config's worst slowdown), ``geomean_ratio``, ``served_sources`` (row counts, no-neighbour
    and failed rows included), ``no_neighbour``, ``identical``, ``errors``, ``rows``, and the median
    ratio of the rows served by a ``nearest`` choice (``median_ratio_nearest``)."""
    out = []
    for f in families:
        mine = [r for r in rows if r.get("family") == f]
        ratios = [float(r["ratio"]) for r in mine if r.get("ratio") is not None]
        near = [float(r["ratio"]) for r in mine if r.get("ratio") is not None
                and "nearest" in str(r.get("served_source", "")).split("+")]
        sources: dict[str, int] = {}
        for r in mine:
            s = r.get("served_source") or ("error" if "error" in r else "none")
            sources[s] = sources.get(s, 0) + 1
        out.append({"op": f, "n_shapes": len(ratios),
                    "median_ratio": round(statistics.median(ratios), 4) if ratios else None,
                    "worst_ratio": round(max(ratios), 4) if ratios else None,
                    "best_ratio": round(min(ratios), 4) if ratios else None,
                    "geomean_ratio": round(g, 4) if (g := geomean(ratios)) else None,
                    "within_5pct": sum(1 for x in ratios if x <= 1.05),
                    "median_ratio_nearest": round(statistics.median(near), 4) if near else None,
                    "n_nearest": len(near),
                    "served_sources": dict(sorted(sources.items())),
                    "no_neighbour": sum(1 for r in mine if r.get("no_neighbour")),
                    "identical": sum(1 for r in mine if r.get("identical")),
                    "errors": sum(1 for r in mine if "error" in r), "rows": len(mine),
                    "time_s": {k: round(sum(float(r.get(f) or 0.0) for r in mine), 1)
                               for k, f in (("rows", "row_s"), ("served", "served_first_call_s"), ("tune", "tune_s"),
                                            ("timing", "timing_s"))}})
    return out


ROW_KEYS = ("family", "shape", "served_source", "served_config", "tuned_config", "served_us", "tuned_us", "ratio")


# --------------------------------------------------------------------------------------------
# the calls (GPU)
# --------------------------------------------------------------------------------------------


def make_call(shape: dict[str, Any], dev: str = "cuda") -> Callable[[], Any]:
    """The public op's call on this shape, inputs made (bf16, seeded)."""
    import torch

    import tiletune.kernels as K

    g = torch.Generator(device=dev).manual_seed(0)
    bf = torch.bfloat16

    def randn(*size: int, scale: float = 1.0) -> Any:
        return (torch.randn(*size, device=dev, generator=g) * scale).to(bf)

    f = shape["family"]
    if f == "rms_norm":
        x = randn(shape["M"], shape["H"])
        w = (1.0 + 0.1 * torch.randn(shape["H"], device=dev, generator=g)).to(bf)
        return lambda: K.rms_norm(x, w, EPS)
    if f == "rms_norm_residual":
        x, res = randn(shape["M"], shape["H"]), randn(shape["M"], shape["H"])
        w = (1.0 + 0.1 * torch.randn(shape["H"], device=dev, generator=g)).to(bf)
        return lambda: K.rms_norm_residual(x, res, w, EPS)
    if f == "layer_norm":
        x = randn(shape["M"], shape["H"])
        w = (1.0 + 0.1 * torch.randn(shape["H"], device=dev, generator=g)).to(bf)
        b = (0.1 * torch.randn(shape["H"], device=dev, generator=g)).to(bf)
        return lambda: K.layer_norm(x, w, b, 1e-5)
    if f == "swiglu":
        x = randn(shape["M"], 2 * shape["I"])
        return lambda: K.swiglu(x)
    if f == "geglu":
        x = randn(shape["M"], 2 * shape["I"])
        return lambda: K.geglu(x)
    if f == "cross_entropy":
        logits = randn(shape["M"], shape["V"], scale=4.0)
        target = torch.randint(0, shape["V"], (shape["M"],), device=dev, generator=g)
        return lambda: K.cross_entropy(logits, target)
    if f == "softmax":
        x = randn(shape["M"], shape["V"], scale=4.0)
        return lambda: K.softmax(x, -1)
    if f == "matmul_linear":
        a, w = randn(shape["M"], shape["K"]), randn(shape["N"], shape["K"], scale=shape["K"] ** -0.5)
        return lambda: K.matmul(a, w.t())
    if f == "attention":
        b, h, hkv, s, d = (shape[k] for k in ("B", "H", "Hkv", "S", "D"))
        q, k, v = randn(b, h, s, d), randn(b, hkv, s, d), randn(b, hkv, s, d)
        return lambda: K.attention(q, k, v, causal=True)
    if f == "rope":
        b, s, h, hkv, d = (shape[k] for k in ("B", "S", "H", "Hkv", "D"))
        q, k = randn(b, s, h, d), randn(b, s, hkv, d)
        inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=dev, dtype=torch.float32) / d))
        ang = torch.outer(torch.arange(s, device=dev, dtype=torch.float32), inv)
        ang = torch.cat([ang, ang], dim=-1)
        cos, sin = ang.cos().to(bf), ang.sin().to(bf)
        return lambda: K.apply_rope_(q, k, cos, sin)
    raise ValueError(f"unknown family {f!r}")


def measure(shape: dict[str, Any], tmp: Path, index: int, rounds: int = ROUNDS) -> dict[str, Any]:
    """One row: the served call, the exact tuning, both configs timed (see the module docstring)."""
    t_row = time.perf_counter()
    row: dict[str, Any] = {"family": shape["family"], "shape": dict(shape)}
    try:
        return _measure(row, shape, tmp, index, rounds)
    finally:
        row["row_s"] = round(time.perf_counter() - t_row, 3)


def _measure(row: dict[str, Any], shape: dict[str, Any], tmp: Path, index: int, rounds: int) -> dict[str, Any]:
    import torch

    import _layer as L
    from tiletune.op.tuned_op import record_launches
    from tiletune.resolve.chain import miss_scope

    call = make_call(shape)
    served_k: list[dict[str, Any]] = []
    tuned_k: list[dict[str, Any]] = []
    try:
        # 1. served: an empty database, the shipped tables on, the library's own policy (nearest)
        L.use_fresh_database(str(tmp / f"served-{index}.db"), tables=True)
        with ChoiceLog() as log, miss_scope(on_miss="nearest"):
            t0 = time.perf_counter()
            _, rec = record_launches(call)
            torch.cuda.synchronize()
            row["served_first_call_s"] = round(time.perf_counter() - t0, 3)
        from tiletune.devices.measure import ColdL2Timer

        row["race_hold_per_launch"] = ColdL2Timer.hold_per_launch  # learnt so far in this process
        served_k = kernels_of(rec, log)
        del rec
        if not served_k:
            raise RuntimeError("the call launched no tuned op")
        sources = [k["source"] for k in served_k]
        row["served_source"] = combined_source(sources)
        row["served_config"] = _configs_out(served_k)
        row["served_choices"] = len(log.items)
        if served_k and all(s == "tuned" for s in sources):  # no neighbour: the served call tuned exactly
            row["kernels"] = [{"op": k["name"], "source": k["source"], "served_config": _config_dict(k["config"])}
                              for k in served_k]
            row.update(no_neighbour=True, tuned_config=row["served_config"], served_us=None, tuned_us=None,
                       ratio=None, tune_s=row["served_first_call_s"])
            return row
        row["no_neighbour"] = False

        # 2. tuned: another empty database, tables off, every key tuned exactly
        L.use_fresh_database(str(tmp / f"tuned-{index}.db"), tables=False)
        with ChoiceLog() as log2, miss_scope(on_miss="tune"):
            t0 = time.perf_counter()
            _, rec = record_launches(call)
            torch.cuda.synchronize()
            row["tune_s"] = round(time.perf_counter() - t0, 3)
        tuned_k = kernels_of(rec, log2)
        del rec
        row["tuned_sources"] = combined_source([k["source"] for k in tuned_k])

        # 3. both configs on the same arguments, interleaved
        compare(row, served_k, tuned_k, do_bench_us, rounds)
        torch.cuda.synchronize()
        return row
    finally:
        del served_k, tuned_k, call
        if (index + 1) % GC_EVERY == 0:
            gc.collect()
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------
# the run
# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="output folder (default $OUT)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-family", type=int, default=DEFAULT_PER_FAMILY,
                    help=f"shapes per family (default {DEFAULT_PER_FAMILY}; the budget usually stops first)")
    ap.add_argument("--families", default=",".join(DEFAULT_FAMILIES),
                    help=f"comma-separated, of {', '.join(FAMILIES)}; or 'default' ({', '.join(DEFAULT_FAMILIES)}), "
                         f"'extra' ({', '.join(EXTRA_FAMILIES)}), 'all' (default: 'default')")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help=f"start no new shape after this many seconds (default {DEFAULT_BUDGET_S:g}; 0: no limit)")
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"interleaved timing rounds (default {ROUNDS})")
    args = ap.parse_args(argv)
    groups = {"default": DEFAULT_FAMILIES, "extra": EXTRA_FAMILIES, "all": FAMILIES}
    args.families = [g for f in args.families.split(",") if f for g in groups.get(f, (f,))]
    bad = [f for f in args.families if f not in FAMILIES]
    if bad or not args.families:
        ap.error(f"--families: unknown {bad}; choose from {', '.join(FAMILIES)}")
    if len(set(args.families)) != len(args.families):
        ap.error("--families: a family named twice")
    if args.per_family < 1:
        ap.error("--per-family must be >= 1")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if args.budget_s < 0:
        ap.error("--budget-s must be >= 0")
    return args


def shipped_table() -> dict[str, Any]:
    """What the shipped table was made for (its answers count only on that device and those versions)."""
    try:
        from tiletune.resolve.tables import SHIPPED

        out = {}
        for p in sorted(SHIPPED.glob("*.json*")):
            if p.name.endswith(".json"):
                doc = json.loads(p.read_text())
                out[p.name] = {"device": doc.get("device"), "versions": doc.get("versions"),
                               "entries": len(doc.get("entries", []))}
        return out
    except Exception as exc:  # noqa: BLE001 - a note for the reader, never a reason to stop
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def document(args: argparse.Namespace, rows: list[dict[str, Any]], skipped: list[dict[str, Any]],
             not_reached: int, wall_s: float, complete: bool, table: dict[str, Any]) -> dict[str, Any]:
    return {"seed": args.seed, "complete": complete, "wall_s": round(wall_s, 1), "budget_s": args.budget_s,
            "per_family": args.per_family, "families_run": list(args.families), "rounds": args.rounds,
            "timer": f"triton.testing.do_bench median (L2 flushed; warmup {BENCH_WARMUP_MS} ms, rep {BENCH_REP_MS} "
                     f"ms) per launch, summed over a call's kernels; ratio = median over rounds of served / tuned",
            "served": "empty database + shipped tables (tables on), on_miss='nearest' (the library's default)",
            "tuned": "empty database, tables off, miss_scope(on_miss='tune')",
            "dtype": "bfloat16", "models": MODEL_DIMS, "caps": {"elements": ELEMENT_CAP, "flops": FLOP_CAP},
            "shipped_table": table, "rows_not_reached_in_budget": not_reached,
            "families": summarize(rows, args.families), "rows": rows, "skipped": skipped}


def _row_line(r: dict[str, Any]) -> str:
    keep = ("served_source", "served_us", "tuned_us", "ratio", "identical", "no_neighbour", "tune_s", "error")
    return json.dumps({k: r.get(k) for k in keep if k in r}, default=str)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tiletune-nearest-quality-"))
    os.environ["TILETUNE_DB"] = str(tmp / "default.db")  # never the user's database
    os.environ.pop("TILETUNE_ON_MISS", None)  # the library's own policy for the served call
    os.environ["TILETUNE_BACKGROUND"] = "0"  # a provisional answer stays as served
    os.environ["TILETUNE_FALLBACK"] = "0"  # the served config is what is measured: no torch fallback meanwhile
    import _common
    from _common import failure_fields, write_result

    # write_result reads the environment (nvidia-smi, versions) at every write: once per run is enough
    # (every write of this run names the same GPU, driver, versions and start date)
    env = _common.environment()
    fresh_environment = _common.environment
    _common.environment = lambda: dict(env)
    try:
        return _run(args, tmp, failure_fields, write_result)
    finally:
        _common.environment = fresh_environment


def _run(args: argparse.Namespace, tmp: Path, failure_fields: Callable[..., dict[str, str]],
         write_result: Callable[..., Any]) -> int:
    table = shipped_table()
    try:  # the tuning worker starts while the first served call runs
        import torch

        if torch.cuda.is_available():
            from tiletune.devices.workers.client import prestart

            prestart()
    except Exception as exc:  # noqa: BLE001 - it starts on the first tuning instead
        print(f"worker prestart: {type(exc).__name__}: {exc}", flush=True)
    shapes, skipped = plan(args.families, args.per_family, args.seed)
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for i, shape in enumerate(shapes):
        spent = time.perf_counter() - t0
        if args.budget_s and spent > args.budget_s:
            print(f"budget of {args.budget_s:g} s spent: {len(shapes) - i} shapes not measured", flush=True)
            write_result(NAME, document(args, rows, skipped, len(shapes) - i, spent, False, table), args.out,
                         commit=True)
            return 0
        print(f"[{spent:6.1f} s] {shape_label(shape)}", flush=True)
        stop = False
        try:
            r = measure(shape, tmp, i, args.rounds)
        except Exception as exc:  # noqa: BLE001 - one failing shape must not lose the others
            r = {"family": shape["family"], "shape": shape, **failure_fields(exc)}
            try:
                import torch

                if torch.cuda.is_available():
                    torch.cuda.synchronize()
            except Exception as sync_exc:  # noqa: BLE001 - a sticky CUDA error: the rest would fail too
                r["sync_error"] = f"{type(sync_exc).__name__}: {sync_exc}"[:500]
                stop = True
        rows.append(r)
        print("    " + _row_line(r), flush=True)
        write_result(NAME, document(args, rows, skipped, len(shapes) - i - 1, time.perf_counter() - t0, False, table),
                     args.out, commit=True)
        if stop:
            return 1
    write_result(NAME, document(args, rows, skipped, 0, time.perf_counter() - t0, True, table), args.out, commit=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
