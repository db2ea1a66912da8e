#!/usr/bin/env python
"""Hugging Face Llama and Qwen2 patched with ``tiletune.kernels.hf`` vs the same model unpatched (GPU only).

Models built from a config with full 8B layer dimensions (Llama-3-8B: hidden 4096, 32/8 heads of 128,
MLP 14336; Qwen2.5-7B: 3584, 28/4, 128, 18944), ``--layers`` decoder layers (default 2), a
``--vocab``-token head (default 32000), random weights, bfloat16, on the GPU; attention ``"sdpa"``
unpatched. Per row:

* **prefill** ``(batch, seq)``: one forward over ``seq`` new tokens into a new ``DynamicCache``.
* **decode** ``(batch, seq)``: one new token per sequence over a ``DynamicCache`` holding ``seq``
  positions (prefilled by the unpatched model; every timed call is followed by a ``cache.crop`` back to ``seq``, on
  both sides).
* **generate** ``(batch, seq)`` (only with ``--phases`` naming it): as decode, but 64 steps in a row, each
  growing the cache by one position as ``model.generate`` does, timed together (ms per token); a new key
  length on every step, and under ``torch.compile`` a recompile for the growing length in the warm-up.

``unpatched_eager_ms``, ``unpatched_compile_ms`` (``torch.compile(model)``, default mode),
``patched_ms`` (after ``apply_tiletune(model)``), ``patched_compile_ms``: median of
``triton.testing.do_bench`` after warm-up calls (the first patched call of a shape resolves the ops' keys,
into a tuning database at a temporary path; keys whose configs were still compiling ran the ops' torch
fallbacks, so the benchmark waits for those compiles, ``tiletune.wait_for_compiles``, and records
``compile_wait_s``, before any logits are compared or anything is timed);
``logits_rel_err`` = ``||patched - unpatched|| / ||unpatched||`` of the eager logits after that wait
(decode: the same cache on both sides). A compile that fails leaves its column None and the error in ``errors``.

Per compiled column ``X`` (``unpatched_compile``, ``patched_compile``), what Dynamo did over the whole
timing (first call, warm-up and ``do_bench``): ``X_graphs`` (graphs compiled), ``X_graph_breaks``,
``X_recompiles`` (graphs compiled after the first call: a guard failing from step to step shows here),
and, where there were breaks, their reasons (``graph_break_reasons[X]``: reason -> count). The
patched model should compile into as many graphs as the unpatched one, with no break and no
recompilation (docs/COMPILE-TAX.md, "A patched Hugging Face model under torch.compile").
``fastcall_patched`` / ``fastcall_patched_compile``: :func:`tiletune.kernels.fastcall.report` after the patched
eager / compiled timings (per op: recipes learnt, calls that ran the op's whole Python path, and why a
signature kept that path). ``--profile`` adds, per column, ``torch.profiler`` figures of 20 steps (key
``profile``). ``--custom-ops-column`` adds ``patched_compile_custom_ms``: the patched model compiled with
``TILETUNE_COMPILE_FUSE=0`` (RMSNorm, RoPE and SwiGLU as custom ops instead of torch expressions Inductor
fuses; ``compile_fuse`` records the setting of the other columns). ``--rounds N`` times every column N times in interleaved rounds (the patch reverted and applied again
between them) and keeps the medians (``<column>_rounds_ms``: each round). ``--budget-s`` bounds the run: past 60% of it the compiled columns are skipped, past it the rows.

Usage (writes ``hf_patch.json`` under ``--out``, default ``$OUT`` or ``benchmarks/results/h200``)::

    python benchmarks/hf_patch.py            # 2 prefill + 2 decode shapes per model
    python benchmarks/hf_patch.py --quick    # 1 + 1 per model
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parent.parent

#: model -> (config class name, model class name, layer dimensions)
MODELS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM",
              dict(hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                   rope_theta=500000.0, rms_norm_eps=1e-5)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              dict(hidden_size=3584, num_attention_heads=28, num_key_value_heads=4, intermediate_size=18944,
                   rope_theta=1000000.0, rms_norm_eps=1e-6)),
}
#: (phase, batch, seq); the first of each phase is the --quick set
SHAPES = [("prefill", 1, 1024), ("decode", 8, 1024), ("prefill", 4, 2048), ("decode", 32, 2048),
          ("generate", 8, 1024), ("generate", 1, 2048)]
QUICK = [SHAPES[0], SHAPES[1], SHAPES[4]]
#: decode steps a ``generate`` row times (each grows the cache by one position)
GENERATE_STEPS = 64


def build(name: str, layers: int, vocab: int) -> Any:
    import torch
    import transformers

    cfg_name, model_name, dims = MODELS[name]
    cfg = getattr(transformers, cfg_name)(vocab_size=vocab, num_hidden_layers=layers, max_position_embeddings=8192,
                                         **dims)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = getattr(transformers, model_name)(cfg)
    model = model.to(torch.bfloat16).eval()
    model.requires_grad_(False)
    return model


def cache_kw(model: Any) -> str:
    """The forward's cache argument: ``cache`` (transformers >= 5.2x) or ``past_key_values``."""
    return "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"


def out_cache(out: Any) -> Any:
    c = out.__dict__.get("cache")
    return c if c is not None else out.past_key_values


def bench_ms(fn: Callable[[], Any], warmup_calls: int = 3) -> float:
    import torch
    from triton.testing import do_bench

    for _ in range(warmup_calls):  # compiles / recompiles happen here, not in do_bench's estimate
        fn()
    torch.cuda.synchronize()
    return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))


def dynamo_counts() -> dict[str, Any]:
    """What Dynamo compiled since ``torch._dynamo.utils.counters`` were last cleared: graphs, graph breaks
    and their reasons (reason -> count, each reason cut to its first line)."""
    from torch._dynamo.utils import counters

    reasons: dict[str, int] = {}
    for reason, n in counters["graph_break"].items():
        key = str(reason).strip().splitlines()[0][:200] if str(reason).strip() else "?"
        reasons[key] = reasons.get(key, 0) + int(n)
    return {"graphs": int(counters["stats"].get("unique_graphs", 0)), "graph_breaks": sum(reasons.values()),
            "reasons": reasons}


def timed_compiled(fn: Callable[[], Any], bench: Callable[[], float] | None = None) -> tuple[float, dict[str, Any]]:
    """``bench_ms(fn)`` (or ``bench()``) for a call of a compiled model, with :func:`dynamo_counts` over the
    timing and ``recompiles``: the graphs compiled after the first call."""
    from torch._dynamo.utils import counters

    counters.clear()
    fn()  # the first call compiles
    first = dynamo_counts()["graphs"]
    ms = bench_ms(fn) if bench is None else bench()
    counts = dynamo_counts()
    counts["recompiles"] = counts["graphs"] - first
    return ms, counts


def profile_steps(fn: Callable[[], Any], steps: int = 20, top: int = 25) -> dict[str, Any]:
    """Where one step's time goes: ``torch.profiler`` over ``steps`` calls (after a warm-up), per step:
    the host's wall time, the GPU's summed kernel time, and the ``top`` operators by self CPU time
    (name, calls per step, self and total CPU us per step, self GPU us per step)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t_host = time.perf_counter()
    for _ in range(steps):
        fn()
    host_s = time.perf_counter() - t_host  # enqueue only: the host's cost when the GPU keeps up
    torch.cuda.synchronize()
    sync_s = time.perf_counter() - t_host
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()

    def dev(e: Any, attr: str) -> float:
        v = getattr(e, attr.replace("cuda", "device"), None)
        return float(v if v is not None else getattr(e, attr, 0.0) or 0.0)

    events = prof.key_averages()
    gpu_us = sum(dev(e, "self_cuda_time_total") for e in events)
    ops = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {"steps": steps, "host_us_per_step": round(host_s / steps * 1e6, 1),
            "synced_us_per_step": round(sync_s / steps * 1e6, 1), "gpu_us_per_step": round(gpu_us / steps, 1),
            "top_self_cpu": [[e.key[:80], round(e.count / steps, 2), round(e.self_cpu_time_total / steps, 1),
                              round(e.cpu_time_total / steps, 1), round(dev(e, "self_cuda_time_total") / steps, 1)]
                             for e in ops]}


def rel_err(got: Any, want: Any) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


class Row:
    """One (model, phase, batch, seq): the forward to time for a given callable model."""

    def __init__(self, model: Any, phase: str, bsz: int, seq: int, vocab: int) -> None:
        import torch

        self.phase, self.seq, self.kw = phase, seq, cache_kw(model)
        gen = torch.Generator("cuda").manual_seed(1)
        if phase == "prefill":
            self.ids = torch.randint(0, vocab, (bsz, seq), device="cuda", generator=gen)
            self.cache = None
        else:
            prompt = torch.randint(0, vocab, (bsz, seq), device="cuda", generator=gen)
            self.ids = torch.randint(0, vocab, (bsz, 1), device="cuda", generator=gen)
            params = inspect.signature(type(model).forward).parameters
            keep = {k: 1 for k in ("logits_to_keep", "num_logits_to_keep") if k in params}  # no (B, S, V) logits
            out = model(prompt, use_cache=True, **keep)
            self.cache = out_cache(out)
            del out
            self.forward_with(model)()  # one step + crop: the cache now has the layout every timed call sees

    def bench(self, fwd: Any) -> float:
        """ms per call of ``fwd`` (a model) in this row: ``bench_ms`` of one step (prefill; decode, the cache
        cropped back after each), or for ``generate`` the mean over :data:`GENERATE_STEPS` steps that grow
        the cache by one position each, as ``model.generate`` does (after 4 such steps of warm-up, in
        which a compiled model recompiles for the growing length), cropped back afterwards."""
        if self.phase != "generate":
            return bench_ms(self.forward_with(fwd))
        import torch

        def grow(n: int) -> float:
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(n):
                fwd(input_ids=self.ids, use_cache=True, **{self.kw: self.cache})
            torch.cuda.synchronize()
            dt = time.perf_counter() - t
            drop = self.cache.get_seq_length() - self.seq
            if drop > 0:  # crop(0) would empty the cache
                self.cache.crop(-drop)
            return dt

        grow(4)
        return grow(GENERATE_STEPS) / GENERATE_STEPS * 1e3

    def forward_with(self, fwd: Any) -> Callable[[], Any]:
        if self.phase == "prefill":
            # with a (fresh) cache, as generate's prefill: without one, a compiled forward gets an explicit mask
            # from transformers' packed-sequence check, which sends attention to SDPA
            return lambda: fwd(input_ids=self.ids, use_cache=True).logits

        def step() -> Any:
            logits = fwd(input_ids=self.ids, use_cache=True, **{self.kw: self.cache}).logits
            drop = self.cache.get_seq_length() - self.seq
            if drop > 0:
                self.cache.crop(-drop)  # negative: remove that many (transformers 5.2x refuses a positive length)
            return logits

        return step


def measure(model: Any, name: str, phase: str, bsz: int, seq: int, args: Any, t0: float) -> dict[str, Any]:
    import torch

    import tiletune
    import tiletune.kernels.hf as tthf
    from tiletune.kernels import fastcall

    row: dict[str, Any] = {"model": name, "phase": phase, "batch": bsz, "seq": seq, "unpatched_eager_ms": None,
                           "unpatched_compile_ms": None, "patched_ms": None, "patched_compile_ms": None,
                           "logits_rel_err": None, "errors": {}}
    from tiletune import settings

    row["compile_fuse"] = settings.compile_fuse()
    do_compile = not args.no_compile

    rounds: dict[str, list[float]] = {}

    def note(col: str, ms: float | None) -> None:
        if ms is not None:
            rounds.setdefault(col, []).append(ms)

    def compiled(col: str, first: bool) -> None:
        if not do_compile:
            return
        if time.perf_counter() - t0 > 0.6 * args.budget_s:
            row["errors"][col] = "skipped: time budget"
            return
        torch._dynamo.reset()
        try:
            cm = torch.compile(model)
            fn = r.forward_with(cm)
            ms, counts = timed_compiled(fn, lambda: r.bench(cm))
            note(col, ms)
            prefix = col.removesuffix("_ms")
            if args.profile and first:
                row.setdefault("profile", {})[prefix] = profile_steps(fn)
            for key in ("graphs", "graph_breaks", "recompiles"):
                row[f"{prefix}_{key}"] = max(row.get(f"{prefix}_{key}", 0), counts[key])
            if counts["reasons"]:
                row.setdefault("graph_break_reasons", {})[prefix] = counts["reasons"]
        except Exception as exc:  # record and go on: the other columns still stand
            row["errors"][col] = f"{type(exc).__name__}: {str(exc)[:300]}"
        torch._dynamo.reset()

    def custom_ops_compiled(first: bool) -> None:
        """The patched model compiled with every op its custom op (TILETUNE_COMPILE_FUSE=0)."""
        saved = os.environ.get("TILETUNE_COMPILE_FUSE")
        os.environ["TILETUNE_COMPILE_FUSE"] = "0"
        try:
            compiled("patched_compile_custom_ms", first)
        finally:
            if saved is None:
                del os.environ["TILETUNE_COMPILE_FUSE"]
            else:
                os.environ["TILETUNE_COMPILE_FUSE"] = saved

    with torch.inference_mode():
        r = Row(model, phase, bsz, seq, args.vocab)
        want = r.forward_with(model)().float()
        note("unpatched_eager_ms", r.bench(model))
        if args.profile:
            row.setdefault("profile", {})["unpatched_eager"] = profile_steps(r.forward_with(model))
        compiled("unpatched_compile_ms", True)
        report = tthf.apply_tiletune(model)
        try:
            t_first = time.perf_counter()
            r.forward_with(model)()  # the first patched call of this shape (ops may run their torch fallbacks)
            torch.cuda.synchronize()
            row["first_patched_call_s"] = round(time.perf_counter() - t_first, 3)
            # keys served while their configs compiled ran the ops' torch fallbacks: wait for those compiles,
            # so that the logits and the timings below are the cuTile kernels' (one call resolves each key)
            t_wait = time.perf_counter()
            row["compiles_done"] = bool(tiletune.wait_for_compiles(120.0))
            row["compile_wait_s"] = round(time.perf_counter() - t_wait, 3)
            r.forward_with(model)()
            got = r.forward_with(model)().float()
            row["logits_rel_err"] = rel_err(got, want)
            note("patched_ms", r.bench(model))
            row["fastcall_patched"] = fastcall.report()  # slow calls and refusals of the ops' recipes so far
            if args.profile:
                row.setdefault("profile", {})["patched"] = profile_steps(r.forward_with(model))
            compiled("patched_compile_ms", True)
            row["fastcall_patched_compile"] = fastcall.report()
            if args.custom_ops_column:  # every patched op its custom op under compile, as before lowering
                custom_ops_compiled(True)
            # further rounds, each column again in the same order (unpatched, then patched): on a host whose
            # speed drifts, the medians of interleaved rounds compare the columns, not the moments they ran at
            for _ in range(1, args.rounds):
                if time.perf_counter() - t0 > 0.6 * args.budget_s:
                    row["errors"]["rounds"] = "skipped: time budget"
                    break
                report.revert()
                note("unpatched_eager_ms", r.bench(model))
                compiled("unpatched_compile_ms", False)
                report = tthf.apply_tiletune(model)
                r.forward_with(model)()  # re-fuses the gate/up weights (eager), as the first round's first call
                note("patched_ms", r.bench(model))
                compiled("patched_compile_ms", False)
                if args.custom_ops_column:
                    custom_ops_compiled(False)
        finally:
            report.revert()
        del r, want
    for col, values in rounds.items():
        row[col] = float(statistics.median(values))
        if args.rounds > 1:
            row[col.removesuffix("_ms") + "_rounds_ms"] = [round(v, 4) for v in values]
    gc.collect()
    torch.cuda.empty_cache()
    if not row["errors"]:
        del row["errors"]
    return row


def environment() -> dict[str, Any]:
    try:
        from _common import environment as env

        out = env()
    except Exception as exc:  # the shared helper moved or failed: the essentials by hand
        import torch

        out = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": torch.cuda.get_device_name(0),
               "driver": "unknown", "versions": {"torch": torch.__version__}, "environment_error": str(exc)}
    import transformers

    out.setdefault("versions", {})["transformers"] = transformers.__version__
    return out


def select_shapes(shapes: list[tuple[str, int, int]], phases: list[str]) -> list[tuple[str, int, int]]:
    """``shapes`` of the given phases, phase by phase in the order given (each phase's own order kept)."""
    return [sh for ph in phases for sh in shapes if sh[0] == ph]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="one shape per phase per model")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    p.add_argument("--vocab", type=int, default=32000, help="vocabulary of the head (default 32000)")
    p.add_argument("--models", default="llama,qwen2", help="comma-separated: llama, qwen2")
    p.add_argument("--no-compile", action="store_true", help="leave the torch.compile columns out")
    p.add_argument("--rounds", type=int, default=1,
                   help="time every column this many times, in interleaved rounds (unpatched, patched, ...); the "
                        "row holds the medians and <column>_rounds_ms the rounds (default 1)")
    p.add_argument("--custom-ops-column", action="store_true",
                   help="also time the patched model compiled with TILETUNE_COMPILE_FUSE=0 (every op its custom "
                        "op): column patched_compile_custom_ms")
    p.add_argument("--phases", default="prefill,decode",
                   help="comma-separated phases (prefill, decode, generate) in the order to run them (default "
                        "prefill,decode; decode first "
                        "when its compiled columns matter most under a tight budget)")
    p.add_argument("--budget-s", type=float, default=230.0,
                   help="past 60%% of this the compiled columns are skipped, past it the remaining rows")
    p.add_argument("--profile", action="store_true",
                   help="per column, torch.profiler over 20 steps: host and GPU us per step, top operators (key 'profile')")
    p.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "benchmarks" / "results" / "h200"))
    args = p.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("hf_patch.py needs a CUDA GPU", file=sys.stderr)
        return 2
    os.environ.setdefault("TILETUNE_DB", str(Path(tempfile.mkdtemp(prefix="tiletune-hf-")) / "tuning.db"))
    cache_limit = 64  # patched and unpatched graphs of several shapes share the models' forward code objects
    for knob in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                 "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, max(getattr(torch._dynamo.config, knob), cache_limit))

    t0 = time.perf_counter()
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    phases = [ph.strip() for ph in args.phases.split(",") if ph.strip()]
    unknown = sorted(set(phases) - {"prefill", "decode", "generate"})
    if unknown:
        p.error(f"--phases: unknown {', '.join(unknown)} (choose prefill, decode, generate)")
    shapes = select_shapes(QUICK if args.quick else SHAPES, phases)
    models = {n: build(n, args.layers, args.vocab) for n in names}
    rows = []
    for phase, bsz, seq in shapes:  # shape-major: with a tight budget every model keeps its first rows
        for name in names:
            if time.perf_counter() - t0 > args.budget_s:
                rows.append({"model": name, "phase": phase, "batch": bsz, "seq": seq, "skipped": "time budget"})
                continue
            row = measure(models[name], name, phase, bsz, seq, args, t0)
            print(json.dumps(row), flush=True)
            rows.append(row)
    doc = {"benchmark": "hf_patch", **environment(), "layers": args.layers, "vocab": args.vocab,
           "quick": args.quick, "tuning_db": os.environ["TILETUNE_DB"], "wall_s": round(time.perf_counter() - t0, 1),
           "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "hf_patch.json"
    path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"wrote {path} ({doc['wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
