#!/usr/bin/env python
"""What ``torch.compile`` and CUDA graphs cost or save on a tiletune decoder layer (issue 43).

Llama-3-8B and Qwen2.5-7B layers built from ``tiletune.kernels`` as a user writes them (:mod:`_layer`,
the same builder as ``first_forward.py``), prefill and decode, shapes drawn with ``--seed`` off every
grid (:func:`_layer.draw_shapes`). Every key is tuned first, eagerly (a temporary empty database,
the shipped tables on, short tuning measurements unless ``--full-tuning``; two eager forwards), so that
no tuning happens inside a capture or a compile; the row records any that still did
(``tuning_in_graph_capture``, ``tuning_in_compile``, ``tuning_in_reduce_overhead``).

Per row, GPU time per forward (CUDA events around back-to-back forwards, in five interleaved rounds, the
median round each: ``decoder_layer.interleaved_us``) and host time per forward (``<route>_host_us``: N
back-to-back forwards without a sync inside, ``decoder_layer.host_us``) of every route:

* ``eager_us``: the module called eagerly;
* ``graph_us``: one forward captured by hand in a ``torch.cuda.CUDAGraph`` (warmed on a side stream), replayed
  on the same input tensors; ``graph_copy_us``: the same captured on static input buffers, each replay after
  copying fresh inputs into them (what a hand graph costs when the inputs change every step, as the
  reduce-overhead route's input copies do);
* ``compiled_us``: ``torch.compile(layer, fullgraph=True, dynamic=False)``; ``compiled_noasserts_us`` (decode
  rows): the same with Inductor's ``size_asserts`` and ``alignment_asserts`` off;
* ``reduce_overhead_us``: ``torch.compile(layer, mode="reduce-overhead", dynamic=False)`` (three calls
  before timing: warm-up, recording, replay);
* ``torch_eager_us``, ``torch_compiled_us``: the same layer in plain torch (``_layer.torch_layer``), eager and
  ``torch.compile(fullgraph=True, dynamic=False)``: what compiling costs or saves any user of this layer;
* ratios (:data:`RATIOS`): ``compiled_vs_eager`` = compiled_us / eager_us (> 1: compiling costs),
  ``ro_vs_graph`` = reduce_overhead_us / graph_us (> 1: reduce-overhead is slower than a hand-made graph),
  ``ro_vs_graph_copy``, the host-time ratios (``*_host``) and the plain-torch ones;
* ``notes``: warnings of dynamo / inductor / the CUDA-graph trees while compiling and on the first
  calls (e.g. "skipping cudagraphs due to mutated inputs"), and ``cudagraph_skips`` (inductor's counter);
* ``rel_err_vs_torch`` (eager layer vs the same layer in plain torch), ``compiled_rel_err``,
  ``reduce_overhead_rel_err``, ``graph_rel_err``, ``graph_copy_rel_err`` (vs the eager layer),
  ``torch_compiled_rel_err`` (vs plain torch eager), ``compile_s``, ``reduce_overhead_first_calls_s``,
  ``tune_s``.

Each compiled route is compiled after ``torch._dynamo.reset()`` (no route reuses or adds to another's cache
entries of the layer's code object) and timed in its own block, interleaved with the uncompiled routes; a
route timed in several blocks gets the median over them (``eager_us_by_block``: eager in each block).

``--profile``: for decode rows, ``torch.profiler`` over 20 forwards of the compiled step (and, for
comparison, the eager and reduce-overhead steps): the top 15 CPU ops by self time, per forward
(``profile``), to show where the compiled route spends its host time.

    python benchmarks/compile_tax.py [--out DIR] [--quick] [--seed 0] [--per-phase 3] [--profile]
        [--models llama3-8b,qwen2.5-7b] [--phases prefill,decode] [--budget-s 450] [--full-tuning]

``--quick``: 1 shape per phase per model (4 rows). Writes ``compile_tax.json`` after every row.

``--stack N``: every route runs N copies of the layer in sequence in one module (one compiled frame, as
when a whole model is compiled: torch.compile's per-frame costs, its guards and wrappers, are then paid once
per N layers; each op's own cost N times); ``rel_err_vs_torch`` is then against the plain-torch stack. The
copies share the layer's weights and caches (host costs are what this measures). Writes
``compile_tax_stack<N>.json``, rows with ``stack``.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _layer import MODELS, draw_shapes, shape_label  # noqa: E402

NAME = "compile_tax"
PHASES = ("prefill", "decode")
ROW_KEYS = ("model", "phase", "shape", "eager_us", "graph_us", "compiled_us", "reduce_overhead_us",
            "compiled_vs_eager", "ro_vs_graph", "notes")
#: keys printed per row
SHOW_KEYS = ("eager_us", "graph_us", "compiled_us", "reduce_overhead_us", "compiled_vs_eager", "ro_vs_graph",
             "ro_vs_graph_copy", "eager_host_us", "compiled_host_us", "compiled_vs_eager_host", "torch_eager_us",
             "torch_compiled_us")
#: loggers whose warnings a row keeps (artifact loggers do not propagate: each is named); tiletune's says when
#: a key first met inside a capture launched a baseline config
TORCH_LOGGERS = ("torch._inductor.cudagraph_trees", "torch._inductor.cudagraph_trees.__cudagraphs",
                 "torch._inductor.cudagraph_utils", "torch._inductor.cudagraph_utils.__cudagraphs",
                 "torch._inductor.compile_fx", "torch._inductor.compile_fx.__perf_hints", "torch._inductor",
                 "torch._dynamo", "torch._functorch", "tiletune")
PROFILE_TOP = 15
PROFILE_FORWARDS = 20


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default=os.environ.get("OUT") or None, help="output folder (default $OUT)")
    ap.add_argument("--quick", action="store_true", help="1 shape per phase per model")
    ap.add_argument("--stack", type=int, default=1, help="layers in sequence in one module (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-phase", type=int, default=None, help="shapes per phase per model (default 3; --quick 1)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--phases", default=",".join(PHASES))
    ap.add_argument("--profile", action="store_true",
                    help="torch.profiler: top 15 CPU ops and GPU kernels by self time of each decode step")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no new row after this many seconds (default 450; --quick 170; 0: no limit)")
    ap.add_argument("--full-tuning", action="store_true",
                    help="the library's default tuning measurements (default: short ones; the configs matter "
                         "less here than what compiling does around them)")
    args = ap.parse_args(argv)
    if args.per_phase is None:
        args.per_phase = 1 if args.quick else 3
    if args.budget_s is None:
        args.budget_s = 170.0 if args.quick else 450.0
    args.models = [m for m in args.models.split(",") if m]
    args.phases = [p for p in args.phases.split(",") if p]
    from _layer import ROPE_BASES

    if [m for m in args.models if m not in ROPE_BASES]:
        ap.error(f"unknown model(s); choose from {sorted(ROPE_BASES)}")
    if not args.phases or [p for p in args.phases if p not in PHASES]:
        ap.error(f"--phases: choose from {', '.join(PHASES)}")
    if args.per_phase < 1:
        ap.error("--per-phase must be >= 1")
    return args


def plan(args: argparse.Namespace) -> list[tuple[str, dict[str, Any]]]:
    """``(model, shape)`` of every row, in order (pure): per model, the phases in turn."""
    out = []
    for model in args.models:
        for shape in draw_shapes(model, args.per_phase * len(args.phases), args.seed, tuple(args.phases)):
            out.append((model, shape))
    return out


def host_key(time_key: str) -> str:
    """The host-time key of a route's time key: ``compiled_us`` -> ``compiled_host_us``."""
    if not time_key.endswith("_us"):
        raise ValueError(f"not a time key: {time_key!r}")
    return time_key[:-3] + "_host_us"


#: ratio -> (numerator, denominator) keys of a row
RATIOS = {
    "compiled_vs_eager": ("compiled_us", "eager_us"),
    "ro_vs_graph": ("reduce_overhead_us", "graph_us"),
    "ro_vs_graph_copy": ("reduce_overhead_us", "graph_copy_us"),
    "compiled_vs_eager_host": ("compiled_host_us", "eager_host_us"),
    "compiled_noasserts_vs_eager_host": ("compiled_noasserts_host_us", "eager_host_us"),
    "ro_vs_graph_copy_host": ("reduce_overhead_host_us", "graph_copy_host_us"),
    "torch_compiled_vs_eager": ("torch_compiled_us", "torch_eager_us"),
    "torch_compiled_vs_eager_host": ("torch_compiled_host_us", "torch_eager_host_us"),
}


def ratios(row: dict[str, Any]) -> dict[str, Any]:
    """Every :data:`RATIOS` of a row's timings (None where one side is missing), e.g. ``compiled_vs_eager``
    = compiled_us / eager_us and ``ro_vs_graph`` = reduce_overhead_us / graph_us."""

    def div(a: Any, b: Any) -> float | None:
        return round(a / b, 4) if a and b else None

    return {name: div(row.get(num), row.get(den)) for name, (num, den) in RATIOS.items()}


class Notes:
    """Warnings from torch's compile / CUDA-graph loggers and Python warnings, while active."""

    def __init__(self, names: tuple[str, ...] = TORCH_LOGGERS) -> None:
        self.names = names
        self.lines: list[str] = []
        outer = self

        class Handler(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                try:
                    msg = record.getMessage()
                except Exception:  # noqa: BLE001
                    return
                if record.levelno >= logging.WARNING or "cudagraph" in msg.lower() or "skipping" in msg.lower():
                    outer.add(f"{record.name}: {msg}")

        self.handler = Handler(level=logging.DEBUG)
        self._warn: Any = None
        self._caught: Any = None

    def add(self, line: str) -> None:
        line = " ".join(line.split())[:400]
        if line and line not in self.lines:
            self.lines.append(line)

    def __enter__(self) -> "Notes":
        for n in self.names:
            logging.getLogger(n).addHandler(self.handler)
        self._warn = warnings.catch_warnings(record=True)
        self._caught = self._warn.__enter__()
        warnings.simplefilter("always")
        return self

    def __exit__(self, *exc: Any) -> None:
        for n in self.names:
            logging.getLogger(n).removeHandler(self.handler)
        for w in self._caught or []:
            if not issubclass(w.category, DeprecationWarning):  # torch's own deprecations: noise here
                self.add(f"{w.category.__name__}: {w.message}")
        self._warn.__exit__(*exc)


def profile_top(fn: Any, forwards: int = PROFILE_FORWARDS, top: int = PROFILE_TOP) -> list[dict[str, Any]]:
    """The ``top`` CPU ops by self time, then the ``top`` device kernels by self device time, over ``forwards``
    calls of ``fn`` (after 3 warm-up calls), per forward."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            fn()
        torch.cuda.synchronize()
    events = prof.key_averages()

    def device_us(e: Any) -> float:
        return float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0) or 0.0)

    rows = sorted(events, key=lambda e: -e.self_cpu_time_total)[:top]
    out = [{"op": e.key[:120], "self_cpu_us": round(e.self_cpu_time_total / forwards, 2),
            "cpu_total_us": round(e.cpu_time_total / forwards, 2), "calls": e.count / forwards} for e in rows]
    gpu = sorted((e for e in events if device_us(e) > 0), key=lambda e: -device_us(e))[:top]
    out += [{"gpu_op": e.key[:120], "self_device_us": round(device_us(e) / forwards, 2), "calls": e.count / forwards}
            for e in gpu]
    return out


def _set_dynamo_limits() -> None:
    import torch._dynamo

    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(256, int(getattr(torch._dynamo.config, name))))


def capture(fn: Any) -> tuple[Any, Any]:
    """``(graph, its static output)``: a ``torch.cuda.CUDAGraph`` of one ``fn()``, warmed on a side stream
    first, as torch asks."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    torch.cuda.synchronize()
    return g, out


def copy_then(static: tuple[Any, ...], fresh: tuple[Any, ...], then: Any) -> Any:
    """A call that copies each ``fresh`` tensor into its ``static`` buffer, then calls ``then()``: a hand-captured
    graph replayed on inputs that change every step (what ``reduce-overhead`` does with its non-static
    inputs). Refuses buffers that do not match their inputs (shape or dtype)."""
    if len(static) != len(fresh):
        raise ValueError(f"copy_then: {len(static)} static buffers for {len(fresh)} inputs")
    for i, (s, f) in enumerate(zip(static, fresh)):
        if tuple(s.shape) != tuple(f.shape) or s.dtype != f.dtype:
            raise ValueError(f"copy_then: input {i} is {tuple(f.shape)} {f.dtype}, its buffer "
                             f"{tuple(s.shape)} {s.dtype}")
    pairs = tuple(zip(static, fresh))

    def call() -> Any:
        for s, f in pairs:
            s.copy_(f)
        return then()

    return call


def merge_blocks(blocks: list[dict[str, float]]) -> dict[str, float]:
    """One time per route from timing blocks (each a ``route -> us`` dict; a route may be in several): the
    median over the blocks that timed it."""
    import statistics

    got: dict[str, list[float]] = {}
    for block in blocks:
        for name, us in block.items():
            got.setdefault(name, []).append(us)
    return {name: statistics.median(v) for name, v in got.items()}


#: compiled routes, each compiled after ``torch._dynamo.reset()`` and timed in its own block with the
#: uncompiled routes: (time key, which module, torch.compile keywords, calls before timing, stem, first-calls key)
COMPILED = (
    ("compiled_us", "tiletune", {"fullgraph": True}, 1, "compiled", "compile_s"),
    ("compiled_noasserts_us", "tiletune",
     {"fullgraph": True, "options": {"size_asserts": False, "alignment_asserts": False}}, 1, "compiled_noasserts",
     "compiled_noasserts_s"),
    ("reduce_overhead_us", "tiletune", {"mode": "reduce-overhead"}, 3, "reduce_overhead",
     "reduce_overhead_first_calls_s"),
    ("torch_compiled_us", "torch", {"fullgraph": True}, 1, "torch_compiled", "torch_compile_s"),
)


def stacked(layer: Any, n: int) -> Any:
    """``layer`` n times in sequence, in one module (the same module object: weights and caches shared)."""
    import torch

    if n == 1:
        return layer

    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList([layer] * n)

        def forward(self, x: Any, *rest: Any) -> Any:
            for one in self.layers:
                x = one(x, *rest)
            return x

    return Stack()


def measure_row(model: str, shape: dict[str, Any], w: dict[str, Any], profile: bool, stack: int = 1) -> dict[str, Any]:
    import torch
    import torch._dynamo

    import _layer as L
    from decoder_layer import host_us, interleaved_us

    d = L.dims(model)
    inp = L.Inputs(d, shape, "cuda")
    mods = {"tiletune": stacked(L.tiletune_layer(d, w, shape["phase"], inp.caches()), stack),
            "torch": stacked(L.torch_layer(d, w, shape["phase"], inp.caches(), shape.get("L")), stack)}
    mod = mods["tiletune"]
    args = inp.args()
    row: dict[str, Any] = {"model": model, "phase": shape["phase"], "shape": dict(shape), "stack": stack}
    notes: list[str] = []
    counters = torch._dynamo.utils.counters["inductor"]
    n_iter = max(5, min(200, int(2e5 // max(1, L.tokens(shape)))))
    decode_profile = profile and shape["phase"] == "decode"
    torch._dynamo.reset()  # one row's compiled code at a time (and the per-code cache limit never reached)
    with torch.no_grad():
        s0 = L.tuning_sessions()
        t0 = time.perf_counter()
        y = mod(*args)  # tunes every key of this shape
        mod(*args)
        torch.cuda.synchronize()
        row["tune_s"] = round(time.perf_counter() - t0, 2)
        row["tuning_sessions"] = L.tuning_sessions() - s0
        ref = L.reference_forward(d, w, inp, inp.caches()) if stack == 1 else \
            stacked(L.torch_layer(d, w, shape["phase"], inp.caches(), shape.get("L")), stack)(*args)
        row["rel_err_vs_torch"] = L.rel_err(y, ref)
        del ref

        eager = (lambda: mod(*args))
        torch_eager = (lambda t=mods["torch"]: t(*args))
        y_torch = torch_eager()
        base: dict[str, Any] = {"eager_us": eager, "torch_eager_us": torch_eager}

        s0 = L.tuning_sessions()
        try:  # a graph of the layer on the benchmark's own inputs (static: the same tensors every step)
            g, g_out = capture(eager)
            base["graph_us"] = g.replay
            g.replay()
            torch.cuda.synchronize()
            row["graph_rel_err"] = L.rel_err(g_out, y)
            # the same on static input buffers that each step refills from fresh inputs
            static = tuple(a.clone() for a in args)
            g2, g2_out = capture(lambda: mod(*static))
            base["graph_copy_us"] = copy_then(static, args, g2.replay)
            base["graph_copy_us"]()
            torch.cuda.synchronize()
            row["graph_copy_rel_err"] = L.rel_err(g2_out, y)
        except Exception as exc:  # noqa: BLE001 - a failed capture is a result
            row["graph_error"] = f"{type(exc).__name__}: {exc}"[:500]
        row["tuning_in_graph_capture"] = L.tuning_sessions() - s0

        blocks = [interleaved_us(base, n_iter)]
        hosts = {key: host_us(fn, n_iter) for key, fn in base.items()}
        profiles: dict[str, Any] = {}
        if decode_profile:
            profiles["eager"] = profile_top(eager)
        for key, which, kwargs, calls, stem, first in COMPILED:
            if stem == "compiled_noasserts" and shape["phase"] != "decode":
                continue  # host-bound decode only: a compile less per prefill row
            torch._dynamo.reset()  # no cache entry of an earlier variant on the same code object
            s0, skips0 = L.tuning_sessions(), counters["cudagraph_skips"]
            fn = None
            with Notes() as caught:
                try:
                    compiled = torch.compile(mods[which], dynamic=False, **kwargs)
                    t0 = time.perf_counter()
                    for _ in range(calls):
                        out = compiled(*args)
                        torch.cuda.synchronize()
                    row[first] = round(time.perf_counter() - t0, 2)
                    row[f"{stem}_rel_err"] = L.rel_err(out.clone(), y if which == "tiletune" else y_torch)
                    fn = (lambda f=compiled: f(*args))
                except Exception as exc:  # noqa: BLE001 - a compile failure is a result
                    row[f"{stem}_error"] = f"{type(exc).__name__}: {exc}"[:800]
            if which == "tiletune":
                row["tuning_in_compile" if stem != "reduce_overhead" else "tuning_in_reduce_overhead"] = (
                    L.tuning_sessions() - s0)
            skipped = counters["cudagraph_skips"] - skips0
            if stem == "reduce_overhead":
                row["cudagraph_skips"] = skipped
            notes += [f"[{stem}] {line}" for line in caught.lines]
            if fn is None:
                continue
            blocks.append(interleaved_us({**base, key: fn}, n_iter))
            hosts[key] = host_us(fn, n_iter)
            if decode_profile and stem in ("compiled", "reduce_overhead"):
                profiles[stem] = profile_top(fn)
            del fn, compiled
        row["notes"] = notes

        row.update({k: round(v, 2) for k, v in merge_blocks(blocks).items()})
        row["eager_us_by_block"] = [round(b["eager_us"], 2) for b in blocks]
        row.update({host_key(k): round(v, 2) for k, v in hosts.items()})
        row.update(ratios(row))
        if decode_profile:
            row["profile"] = profiles
    del base, mods, mod, inp
    gc.collect()
    torch.cuda.empty_cache()
    return row


def _compile_fuse() -> bool:
    """``TILETUNE_COMPILE_FUSE``: whether the compiled routes lowered the memory-bound ops to torch expressions
    (norms, SwiGLU, RoPE fused by Inductor) or kept every op its custom op."""
    from tiletune import settings

    return settings.compile_fuse()


def document(args: argparse.Namespace, rows: list[dict[str, Any]], skipped: list[Any], wall_s: float,
             complete: bool, tuner: str) -> dict[str, Any]:
    from _layer import dims

    return {"quick": args.quick, "seed": args.seed, "complete": complete, "wall_s": round(wall_s, 1),
            "profile": args.profile, "tuner": tuner,
            "timer": "CUDA events around back-to-back forwards, 5 interleaved rounds, median round",
            "compile": "torch.compile(layer, fullgraph=True, dynamic=False), the same without Inductor's size and "
                       "alignment asserts (decode rows), (layer, mode='reduce-overhead', dynamic=False) and the "
                       "plain-torch layer (fullgraph=True, dynamic=False); torch._dynamo.reset() before each",
            "host_timer": "perf_counter around N back-to-back forwards, no sync inside (decoder_layer.host_us)",
            "layers": {m: dims(m).as_dict() for m in args.models}, "stack": args.stack,
            "compile_fuse": _compile_fuse(),
            "skipped_for_budget": skipped, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tiletune-compile-tax-"))
    os.environ["TILETUNE_DB"] = str(tmp / "tuning.db")
    os.environ.setdefault("CUDA_TILE_CACHE_DIR", str(tmp / "cutile-cache"))
    import torch

    import tiletune as tt
    import _layer as L
    from _common import failure_fields, write_result

    _set_dynamo_limits()
    options = None if args.full_tuning else tt.TunerOptions(
        stopping=tt.StoppingRule(min_samples=3, max_samples=10, max_seconds=0.05), showdown_rounds=1)
    L.use_fresh_database(str(tmp / "tuning.db"), tables=True, **({"options": options} if options else {}))
    tuner = "library defaults" if args.full_tuning else "short measurements (min 3, max 10 samples, 0.05 s)"

    if args.stack < 1:
        raise SystemExit("--stack takes a positive number of layers")
    name = NAME if args.stack == 1 else f"{NAME}_stack{args.stack}"
    rows: list[dict[str, Any]] = []
    skipped: list[Any] = []
    weights: dict[str, Any] = {}
    t0 = time.perf_counter()
    for model, shape in plan(args):
        spent = time.perf_counter() - t0
        if args.budget_s and spent > args.budget_s:
            skipped.append({"model": model, "shape": shape})
            continue
        print(f"[{spent:6.1f} s] {model} {shape_label(shape)}", flush=True)
        if model not in weights:
            weights.clear()
            gc.collect()
            torch.cuda.empty_cache()
            weights[model] = L.make_weights(L.dims(model), "cuda", seed=0)
        try:
            r = measure_row(model, shape, weights[model], args.profile, stack=args.stack)
        except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
            r = {"model": model, "phase": shape["phase"], "shape": shape, **failure_fields(exc)}
            torch.cuda.empty_cache()
        rows.append(r)
        print("    " + json.dumps({k: r.get(k) for k in SHOW_KEYS} | {"tune_s": r.get("tune_s"),
                                                                         "error": r.get("error")}), flush=True)
        for line in r.get("notes", [])[:5]:
            print("    note: " + line[:200], flush=True)
        write_result(name, document(args, rows, skipped, time.perf_counter() - t0, False, tuner), args.out,
                     commit=True)
    write_result(name, document(args, rows, skipped, time.perf_counter() - t0, True, tuner), args.out, commit=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
