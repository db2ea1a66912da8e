"""Shared helpers of the benchmark scripts: environment metadata, result files, subprocesses."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "h200"

# Steady-state timings measure kernels: a library op on a fresh machine would otherwise run its torch
# fallback while its config compiles in the background (tiletune.resolve.fallback), and a timing loop
# could measure both. Scripts that measure what a user's first call costs (first_forward.py, offgrid.py's
# served call) turn it back on for that phase.
os.environ.setdefault("TILETUNE_FALLBACK", "0")


def environment() -> dict[str, Any]:
    """GPU, driver, software versions and the date, for every result file."""
    env: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        import torch

        env["torch"] = torch.__version__
        if torch.cuda.is_available():
            p = torch.cuda.get_device_properties(0)
            env["gpu"] = p.name
            env["arch"] = f"sm_{p.major}{p.minor}"
            env["sm_count"] = p.multi_processor_count
    except Exception as exc:  # pragma: no cover
        env["torch"] = f"unavailable: {exc}"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        env["driver"] = out.stdout.strip().splitlines()[0] if out.returncode == 0 else "unknown"
    except Exception:
        env["driver"] = "unknown"
    from tiletune.devices.backends.cutile import software_versions

    env["versions"] = {**software_versions(), "python": sys.version.split()[0]}
    import tiletune

    env["versions"]["tiletune"] = tiletune.__version__
    env["cpus"] = os.cpu_count()
    env.setdefault("gpu", None)  # no CUDA device: the key is there, empty
    return env


def source_commit() -> dict[str, str]:
    """Which code ran: ``tiletune_commit`` (``$TILETUNE_COMMIT`` if set, else ``git rev-parse HEAD`` of this
    checkout, else ``"unknown"``: a copy of the tree without ``.git``), ``tiletune_dirty`` (``git status``
    shows changes under ``src/`` or ``benchmarks/``; ``"unknown"`` without git) and ``tiletune_src_sha256``
    (first 16 hex digits of a SHA-256 over the paths and contents of ``src/tiletune``'s files: names
    the code even where git is absent; the same tree gives the same value anywhere)."""
    import hashlib

    out = {"tiletune_commit": os.environ.get("TILETUNE_COMMIT", "").strip() or "unknown", "tiletune_dirty": "unknown"}
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True, text=True,
                             timeout=20)
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != ROOT.resolve():
            raise LookupError("this tree is not a git checkout of its own")
        if out["tiletune_commit"] == "unknown":
            got = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=20)
            if got.returncode == 0 and got.stdout.strip():
                out["tiletune_commit"] = got.stdout.strip()
        st = subprocess.run(["git", "status", "--porcelain", "--", "src", "benchmarks"], cwd=ROOT,
                            capture_output=True, text=True, timeout=20)
        if st.returncode == 0:
            out["tiletune_dirty"] = "yes" if st.stdout.strip() else "no"
    except Exception:  # noqa: BLE001 - no git on this host: the source hash still names the code
        pass
    h = hashlib.sha256()
    src = ROOT / "src" / "tiletune"
    for f in sorted(p for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                    and not p.name.endswith((".pyc", ".pyo"))):
        h.update(f.relative_to(src).as_posix().encode() + b"\0")
        h.update(f.read_bytes() + b"\0")
    out["tiletune_src_sha256"] = h.hexdigest()[:16]
    return out


def write_result(name: str, data: dict[str, Any], out_dir: str | os.PathLike | None = None,
                 compress: bool = False, commit: bool = False) -> Path:
    """Write ``<out_dir>/<name>.json`` with the environment merged in; print it. With ``compress``:
    ``<name>.json.gz``, compact JSON (for per-config sweeps, which would weigh on the tracked tree). With
    ``commit``: torch's version and :func:`source_commit`'s fields added to ``versions``."""
    out = Path(out_dir or os.environ.get("BENCH_OUT") or DEFAULT_OUT)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": name, **environment(), **data}
    if commit:
        doc["versions"] = {"torch": doc.get("torch"), **doc.get("versions", {}), **source_commit()}
    if compress:
        import gzip

        path = out / f"{name}.json.gz"
        path.write_bytes(gzip.compress((json.dumps(doc, separators=(",", ":"), default=str) + "\n").encode(), mtime=0))
    else:
        path = out / f"{name}.json"
        path.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if not isinstance(v, (list, dict)) or k in ("picks",)},
                     default=str))
    return path


def small_png(path: str | os.PathLike, colors: int = 256) -> None:
    """Rewrite a matplotlib PNG with a palette of ``colors`` (flat-colour charts lose nothing visible;
    the file shrinks two- to threefold, which the tracked tree's size limit needs). No-op without Pillow."""
    try:
        from PIL import Image
    except Exception:  # pragma: no cover - Pillow comes with matplotlib
        return
    with Image.open(path) as im:
        if im.mode == "P":
            return
        small = im.convert("RGB").quantize(colors=colors)
    small.save(path, optimize=True)


def fresh_env(**extra: str) -> dict[str, str]:
    """Environment for a child process with an empty cuTile cache and an empty tuning database."""
    tmp = Path(tempfile.mkdtemp(prefix="tiletune-bench-"))
    env = dict(os.environ)
    env["CUDA_TILE_CACHE_DIR"] = str(tmp / "cutile-cache")
    env["TILETUNE_DB"] = str(tmp / "tuning.db")
    env["PYTHONPATH"] = f"{ROOT / 'src'}{os.pathsep}{ROOT / 'benchmarks'}{os.pathsep}" + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_child(code: str, env: dict[str, str], timeout: float = 600) -> dict[str, Any]:
    """Run Python ``code`` in a fresh process; it must print one line ``RESULT <json>``."""
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"child printed no RESULT line:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def profile_rows(prof: Any, top: int) -> list[dict[str, Any]]:
    """The ``top`` entries of a ``cProfile.Profile`` by cumulative time, as JSON-able rows (function as
    ``folder/file.py:line(name)``, cumulative and own seconds, calls). Child processes of the
    benchmarks import it (:func:`fresh_env` puts this folder on their path)."""
    import pstats

    rows = [{"function": "/".join(file.rsplit("/", 2)[-2:]) + f":{line}({fn})", "cumtime_s": ct_, "tottime_s": tt,
             "calls": nc}
            for (file, line, fn), (cc, nc, tt, ct_, callers) in pstats.Stats(prof).stats.items()]
    rows.sort(key=lambda r: -r["cumtime_s"])
    return rows[:top]


def interleaved_ab(launch_a: Any, launch_b: Any, rounds: int = 30, per_round: int = 10) -> dict[str, float]:
    """Time two launch functions alternately (cold L2); medians and relative gap (b - a) / a."""
    import statistics

    from tiletune.devices.measure import ColdL2Timer

    timer = ColdL2Timer(0)
    timer.time(launch_a, 3)
    timer.time(launch_b, 3)
    sa: list[float] = []
    sb: list[float] = []
    for _ in range(rounds):
        sa += timer.time(launch_a, per_round)
        sb += timer.time(launch_b, per_round)
    ma, mb = statistics.median(sa), statistics.median(sb)
    return {"a_us": ma, "b_us": mb, "gap": (mb - ma) / ma, "samples_each": len(sa)}


def tune_once(tuned: Any, args: tuple) -> tuple[Any, float]:
    """Run a fresh tuned op's first call on ``args`` (it tunes); ``(its one TuneResult, wall seconds)``."""
    import torch

    t0 = time.perf_counter()
    tuned(*args)
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    (res,) = tuned.results.values()
    return res, wall


def measurement_rows(result: Any, throughput: Callable[[float], dict[str, Any]],
                     extra: Callable[[dict[str, Any]], dict[str, Any]] = lambda cfg: {}) -> list[dict[str, Any]]:
    """One row per measured config of a :class:`~tiletune.TuneResult`: config, status, median (us), the
    fields ``throughput(median_us)`` returns (None values without a median), ``extra(config)``, and the
    failure reason."""
    rows = []
    for m in result.measurements:
        us = m.median_us
        cfg = dict(m.config)
        rate = throughput(us) if us else {k: None for k in throughput(1.0)}
        rows.append({"config": cfg, **extra(cfg), "status": m.status.value,
                     "median_us": None if us is None else round(us, 2), **rate,
                     "reason": m.reason[:200] if m.status.failed else ""})
    return rows


def ranked_ok(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of :func:`measurement_rows` that have a median and did not fail, fastest first."""
    return sorted((r for r in rows if r["median_us"] and r["status"] != "failed"), key=lambda r: r["median_us"])


def do_bench_rounds(routes: dict[str, Callable[[], Any]], rounds: int = 5, warmup: int = 25,
                    rep: int = 100) -> dict[str, float]:
    """Each route timed by ``triton.testing.do_bench`` (L2 flushed) in ``rounds`` interleaved rounds:
    ``{route: median of the rounds in us}``."""
    import triton.testing as tt

    times: dict[str, list[float]] = {name: [] for name in routes}
    for _ in range(rounds):
        for name, fn in routes.items():
            times[name].append(tt.do_bench(fn, warmup=warmup, rep=rep))
    return {name: round(sorted(v)[len(v) // 2] * 1e3, 2) for name, v in times.items()}


def failure_fields(exc: BaseException, report: bool = True) -> dict[str, str]:
    """``{"error", "traceback"}`` of an exception caught while the run goes on (message and traceback
    tail bounded for the result file); with ``report`` the error's first line is printed too."""
    import traceback

    fields = {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": traceback.format_exc()[-3000:]}
    if report:
        print("    ERROR " + fields["error"].splitlines()[0], flush=True)
    return fields


def run_rows(rows: list[Any], probe: Callable[[Any], dict[str, Any]],
             report: Callable[[dict[str, Any]], list[str]],
             after_row: Callable[[list[dict[str, Any]], float], None] | None = None) -> tuple[list[dict[str, Any]], float]:
    """Each row through ``probe(row)``, its start time printed and ``report(result)``'s lines after it; a
    row that raises becomes ``{"row": row, "error", "traceback"}`` and the others go on. ``after_row(results
    so far, seconds so far)`` after each row (a probe cut short by a time limit keeps what it finished).
    Returns ``(results, wall seconds)``."""
    results: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for i, row in enumerate(rows):
        if i and after_row is not None:
            after_row(results, round(time.perf_counter() - t0, 1))
        print(f"[{time.perf_counter() - t0:6.1f} s] {row}", flush=True)
        try:
            r = probe(row)
            for line in report(r):
                print("    " + line, flush=True)
        except Exception as exc:  # noqa: BLE001 - one failing row must not lose the others
            r = {"row": list(row) if isinstance(row, tuple) else row, **failure_fields(exc)}
        results.append(r)
    return results, round(time.perf_counter() - t0, 1)


def run_probe(name: str, ap: Any, parse_rows: Callable[[str], list[Any]],
              probe: Callable[[Any, Any], dict[str, Any]], report: Callable[[dict[str, Any]], list[str]]) -> int:
    """The main of a probe script whose parser ``ap`` has ``--rows`` and ``--out``: parse the rows (a bad one
    is a usage error), refuse without a CUDA GPU (exit status 2), run ``probe(row, args)`` on each
    (:func:`run_rows`) and write ``<out>/<name>.json.gz`` (``{"problems", "wall_s"}`` and the environment)."""
    args = ap.parse_args()
    try:
        rows = parse_rows(args.rows)
    except ValueError as exc:
        ap.error(str(exc))
    import torch

    if not torch.cuda.is_available():
        print(f"{name}: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(args.out or os.environ.get("BENCH_OUT") or DEFAULT_OUT)

    def partial(done: list[dict[str, Any]], wall_s: float) -> None:  # the rows so far, "complete": false
        with contextlib.redirect_stdout(io.StringIO()):
            write_result(name, {"problems": done, "wall_s": wall_s, "complete": False}, out, compress=True)

    results, wall = run_rows(rows, lambda row: probe(row, args), report, after_row=partial)
    path = write_result(name, {"problems": results, "wall_s": wall, "complete": True}, out, compress=True)
    print(f"wrote {path}")
    return 0
