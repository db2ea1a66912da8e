#!/usr/bin/env python
"""Record three large tuning spaces exhaustively on the GPU, for replay (search-strategy studies).

For each space, every configuration is compiled (in parallel, by tiletune's compile pool), checked
against a torch reference and timed with cold L2 through tiletune's own harness, with racing
*disabled* (no candidate is cut short because a faster one exists), so every valid config gets
10-30 samples (rel. CI 2%, at most 0.3 s of GPU time each).  Nothing is read from or written to
the tuning database.  Each space is written as soon as it is done, with
:func:`tiletune.lab.recordings.save_recording`, to ``<out>/<name>.json.gz``:

* ``<gpu>_gemm_bf16_4096``: persistent GEMM, bf16 4096 x 4096 x 4096, 512 configs;
* ``<gpu>_layernorm_bf16_16384x4096``: LayerNorm forward, bf16 16384 x 4096 (eps 1e-5), 352 configs;
* ``<gpu>_attention_bf16_b4h16s4096d128_causal``: FMHA forward, bf16, B=4 H=16 S=4096 D=128,
  causal, 330 configs.

(``<gpu>`` is e.g. ``h200``.)  The recordings hold every measurement (config, status, reason,
samples rounded to 1 ns, cold compile seconds) plus the space (parameter values, constraint names,
baseline, hash, size) and the problem key.  By default the cuTile disk cache is pointed at a fresh
empty directory first, so the recorded compile times are cold (``--warm-cache`` keeps yours).

Usage (GPU host, repo root)::

    source .gpu/activate.sh && python benchmarks/record_spaces.py --out $OUT
    python benchmarks/record_spaces.py --only gemm,layernorm        # default out: benchmarks/spaces

Expected run time on an H200 host with 16 cores: ~2-4 min in all.  Cold compilation of the 1194
kernels took 770 CPU-seconds on a 2-core x86 box (GEMM 163 s, mean 0.32 s per config; attention
418 s, mean 1.27 s, max 4.4 s; LayerNorm 189 s, mean 0.54 s, max 6.9 s), i.e. ~50 s on 16 cores plus
the serial front end (~15 / 60 / 40 ms per config); measuring overlaps with compiling and is capped
at 0.3 s of GPU time per config.  Exit status 0 when every space was recorded with at least one valid config.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

SPACES = ("gemm", "layernorm", "attention")
REASON_CHARS = 400  # failure reasons are truncated to this many characters in the recordings


def _log(msg: str) -> None:
    print(msg, flush=True)


# ------------------------------------------------------------------------------------------
# progress: a thin wrapper around the live backend's session
# ------------------------------------------------------------------------------------------


class _ProgressSession:
    """Delegates to a live session; prints a line every ``every_s`` seconds of compile/measure."""

    def __init__(self, inner: Any, label: str, total: int, every_s: float = 10.0) -> None:
        self.inner = inner
        self.label = label
        self.total = total
        self.every_s = every_s
        self.t0 = time.perf_counter()
        self.last = self.t0
        self.compiled = self.compile_failed = self.checked = self.check_failed = self.sampled = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _maybe_print(self, force: bool = False) -> None:
        now = time.perf_counter()
        if force or now - self.last >= self.every_s:
            self.last = now
            _log(f"  [{self.label}] {now - self.t0:6.1f} s: compiled {self.compiled}/{self.total} "
                 f"({self.compile_failed} failed), checked {self.checked} ({self.check_failed} failed), "
                 f"{self.sampled} samples")

    def clock(self) -> float:
        return self.inner.clock()

    def compile(self, candidates):
        for outcome in self.inner.compile(candidates):
            self.compiled += 1
            self.compile_failed += outcome.status.failed
            self._maybe_print()
            yield outcome
        _log(f"  [{self.label}] {time.perf_counter() - self.t0:6.1f} s: compilation done "
             f"({self.compile_failed} of {self.total} failed)")

    def check(self, candidate):
        out = self.inner.check(candidate)
        self.checked += 1
        self.check_failed += out.status.failed
        self._maybe_print()
        return out

    def sample(self, candidate, n):
        out = self.inner.sample(candidate, n)
        self.sampled += len(out)
        self._maybe_print()
        return out

    def finish(self, winner):
        self._maybe_print(force=True)
        return self.inner.finish(winner)


class _ProgressBackend:
    """The live cuTile backend, with :class:`_ProgressSession` sessions."""

    def __init__(self, inner: Any, label: str, total: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.label = label
        self.total = total

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def open_session(self, plan, args, **kw):
        return _ProgressSession(self.inner.open_session(plan, args, **kw), self.label, self.total)


# ------------------------------------------------------------------------------------------
# the three problems
# ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Problem:
    name: str  # file stem without the gpu prefix
    op_name: str
    space: Any
    plan: Callable[..., Any]
    reference: Callable[..., Any]
    writes: tuple[str, ...]
    make_args: Callable[[], tuple]
    describe: str
    work: Callable[[float], str]  # median us -> throughput text


def problems(sm_count: int) -> dict[str, Problem]:
    import torch

    from tiletune import Launch, Space
    from tiletune.kernels.attention_op import ATTENTION_FULL_SPACE, attention_plan
    from tiletune.kernels.attention_kernels import LOG2E, attention_reference
    from tiletune.kernels.gemm import GEMM, GEMM_FULL_SPACE
    from tiletune.lab.examples.layernorm_kernels import (
        LAYERNORM_BASELINE,
        LAYERNORM_CONSTRAINTS,
        LAYERNORM_SPACE_PARAMS,
        layernorm_args,
        layernorm_grid,
        layernorm_kernel,
        layernorm_reference,
    )

    dev = torch.device("cuda")
    bf16 = torch.bfloat16

    # -- gemm ------------------------------------------------------------------------------
    n = 4096

    def gemm_args():
        g = torch.Generator(device=dev).manual_seed(0)
        a = torch.randn(n, n, device=dev, dtype=bf16, generator=g)
        b = torch.randn(n, n, device=dev, dtype=bf16, generator=g)
        one = torch.ones(1, device=dev, dtype=torch.float32)
        return (a.unsqueeze(0), b.unsqueeze(0), torch.empty(1, n, n, device=dev, dtype=bf16), one, one,
                False, False, False)

    def gemm_ref(a, b, c, scale_a, scale_b, trans_a, trans_b, scaled):
        return (a.float() @ b.float()).to(c.dtype)

    # -- layernorm ---------------------------------------------------------------------------
    lm, ln_n = 16384, 4096
    ln_space = Space(**LAYERNORM_SPACE_PARAMS, constraints=LAYERNORM_CONSTRAINTS, baseline=LAYERNORM_BASELINE)

    def ln_plan(cfg, x, w, b, y, eps):
        return Launch(layernorm_kernel, layernorm_grid(cfg, x.shape[0], sm_count), layernorm_args(cfg, x, w, b, y, eps))

    def ln_args():
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(lm, ln_n, device=dev, dtype=bf16, generator=g) * 2.0 + 0.5
        w = torch.randn(ln_n, device=dev, dtype=bf16, generator=g)
        b = torch.randn(ln_n, device=dev, dtype=bf16, generator=g)
        return (x, w, b, torch.empty_like(x), 1e-5)

    def ln_ref(x, w, b, y, eps):
        return layernorm_reference(x, w, b, eps)

    # -- attention ---------------------------------------------------------------------------
    B, H, S, D = 4, 16, 4096, 128

    def att_args():
        g = torch.Generator(device=dev).manual_seed(0)
        q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=bf16, generator=g) for _ in range(3))
        return (q, k, v, torch.empty_like(q), True, (1.0 / D ** 0.5) * LOG2E)

    def att_ref(q, k, v, o, causal, qk_scale_log2):
        return attention_reference(q, k, v, causal, qk_scale_log2 / LOG2E)

    return {
        "gemm": Problem(
            "gemm_bf16_4096", "tiletune.gemm", GEMM_FULL_SPACE, GEMM.plan, gemm_ref, ("c",), gemm_args,
            f"persistent GEMM bf16 {n}x{n}x{n}", lambda us: f"{2 * n ** 3 / us / 1e6:.0f} TFLOP/s"),
        "layernorm": Problem(
            "layernorm_bf16_16384x4096", "tiletune.layer_norm", ln_space, ln_plan, ln_ref, ("y",), ln_args,
            f"LayerNorm bf16 {lm}x{ln_n}", lambda us: f"{(2 * lm * ln_n * 2 + 2 * ln_n * 2) / us / 1e3:.0f} GB/s"),
        "attention": Problem(
            "attention_bf16_b4h16s4096d128_causal", "tiletune.attention", ATTENTION_FULL_SPACE, attention_plan,
            att_ref, ("o",), att_args, f"FMHA fwd bf16 B={B} H={H} S={S} D={D} causal",
            lambda us: f"{2 * B * H * S * S * D / us / 1e6:.0f} TFLOP/s"),
    }


def space_doc(space: Any, arch: str) -> dict[str, Any]:
    """The space as JSON: parameter values, hint names, constraint names, baseline, hash, size."""
    base = space.baseline(arch)
    return {
        "params": {n: list(space.values(n, arch)) for n in space.names},
        "hints": list(space.hint_names),
        "constraints": list(space.constraint_names),
        "baseline": None if base is None else base.as_dict(),
        "hash": space.hash,
        "size": space.size(arch),
        "arch": arch,
    }


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def record_one(p: Problem, gpu_slug: str, out_dir: Path, options: Any, backend: Any) -> dict[str, Any]:
    import torch

    from tiletune import autotune
    from tiletune.lab.recordings import save_recording

    arch = backend.device_info(0).arch
    total = p.space.size(arch)
    _log(f"\n== {p.name}: {p.describe}, {total} configs")
    args = p.make_args()
    _sync()
    op = autotune(p.space, reference=p.reference, writes=list(p.writes), name=p.op_name, db=False,
                  options=options, progress=False,
                  backend=_ProgressBackend(backend, p.name.split("_")[0], total))(p.plan)
    t0 = time.perf_counter()
    op(*args)
    _sync()
    wall = time.perf_counter() - t0
    (res,) = op.results.values()

    ms = tuple(dataclasses.replace(m, reason=m.reason[:REASON_CHARS]) for m in res.measurements)
    path = out_dir / f"{gpu_slug}_{p.name}.json.gz"
    save_recording(
        path,
        name=p.op_name,
        key=json.loads(res.identity.key),
        device=res.identity.device,
        versions=json.loads(res.identity.versions),
        measurements=ms,
        space=space_doc(p.space, arch),
        note=(f"benchmarks/record_spaces.py: {p.describe}; exhaustive (racing disabled: race_margin=inf, "
              f"hopeless_factor=inf), {options.stopping}, cold L2 per sample, cold cuTile compile cache; "
              f"tuning wall {wall:.1f} s"),
    )
    ok = [m for m in ms if not m.status.failed]
    failed: dict[str, int] = {}
    for m in ms:
        if m.status.failed:
            failed[m.status.value] = failed.get(m.status.value, 0) + 1
    base = next((m for m in ms if m.is_baseline), None)
    meds = sorted(m.median_us for m in ok if m.median_us is not None)
    comp = [m.compile_s for m in ms if m.compile_s]
    summary = {
        "name": path.name,
        "configs": len(ms),
        "ok": len(ok),
        "failed": failed,
        "winner": dict(res.winner),
        "winner_us": round(res.winner_median_us, 3),
        "winner_throughput": p.work(res.winner_median_us),
        "baseline_us": None if base is None or base.median_us is None else round(base.median_us, 3),
        "slowest_ok_us": round(meds[-1], 3) if meds else None,
        "tied": len(res.tied),
        "samples": int(res.stats.get("samples", 0)),
        "compile_s_sum": round(sum(comp), 1),
        "compile_s_max": round(max(comp, default=0.0), 2),
        "wall_s": round(wall, 1),
        "file_kb": round(path.stat().st_size / 1024, 1),
    }
    _log(res.summary(top=5))
    _log(f"-> wrote {path} ({summary['file_kb']} KiB): {summary['ok']}/{summary['configs']} ok, winner "
         f"{summary['winner_us']} us ({summary['winner_throughput']}), baseline {summary['baseline_us']} us, "
         f"wall {summary['wall_s']} s")
    del args, op
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "spaces"), help="output directory")
    ap.add_argument("--only", default=",".join(SPACES), help=f"comma-separated subset of {','.join(SPACES)}")
    ap.add_argument("--warm-cache", action="store_true",
                    help="keep the current cuTile disk cache (default: a fresh one, so compile times are cold)")
    args = ap.parse_args(argv)
    names = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in names if s not in SPACES]
    if bad:
        ap.error(f"unknown space(s) {bad}; choose from {SPACES}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    cache_tmp = None
    if not args.warm_cache:  # must happen before cuda.tile is imported (it reads the variable then)
        cache_tmp = tempfile.mkdtemp(prefix="tiletune-record-cache-")
        os.environ["CUDA_TILE_CACHE_DIR"] = cache_tmp
    try:
        return _record(args, names, out_dir)
    finally:
        if cache_tmp is not None:
            shutil.rmtree(cache_tmp, ignore_errors=True)


def _record(args: argparse.Namespace, names: list[str], out_dir: Path) -> int:
    import torch

    import tiletune as tt
    from tiletune.devices.backends.cutile import CutileBackend

    if not torch.cuda.is_available():
        print("record_spaces.py needs a CUDA GPU", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    backend = CutileBackend()
    info = backend.device_info(0)
    gpu_slug = "".join(ch for ch in info.name.lower().replace("nvidia", "").split()[0] if ch.isalnum()) or "gpu"
    options = tt.TunerOptions(
        race_margin=float("inf"),
        hopeless_factor=float("inf"),
        stopping=tt.StoppingRule(min_samples=10, max_samples=30, rel_ci=0.02, max_seconds=0.3),
    )
    _log(f"recording {', '.join(names)} on {info.name} ({info.arch}, {info.sm_count} SMs), "
         f"{os.cpu_count()} CPUs, cuTile cache {os.environ.get('CUDA_TILE_CACHE_DIR', '(default)')} -> {out_dir}")
    probs = problems(info.sm_count)
    summaries = []
    rc = 0
    for name in names:
        try:
            summaries.append(record_one(probs[name], gpu_slug, out_dir, options, backend))
        except Exception as exc:  # keep going: the other spaces are still worth recording
            import traceback

            traceback.print_exc()
            _log(f"!! {name} failed: {type(exc).__name__}: {exc}")
            summaries.append({"name": name, "error": f"{type(exc).__name__}: {exc}"})
            rc = 1
        _log(f"   elapsed so far: {time.perf_counter() - t_start:.1f} s")

    total = time.perf_counter() - t_start
    _log(f"\n== summary ({total:.1f} s in all)")
    for s in summaries:
        _log("  " + json.dumps(s))
    (out_dir / "record_spaces_summary.json").write_text(
        json.dumps({"device": info.as_dict(), "total_s": round(total, 1), "spaces": summaries}, indent=1) + "\n")
    if any(s.get("ok", 0) == 0 for s in summaries):
        rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
