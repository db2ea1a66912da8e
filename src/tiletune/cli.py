"""The ``tiletune`` command line: the demo (main job), the tuning database, and a health check."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Autotuning for NVIDIA cuTile kernels.")
db_app = typer.Typer(no_args_is_help=True, help="Inspect, export and import the tuning database.")
app.add_typer(db_app, name="db")
recording_app = typer.Typer(no_args_is_help=True, help="Recorded spaces: import Kernel Tuner / T4 files.")
app.add_typer(recording_app, name="recording")
console = Console(width=None if sys.stdout.isatty() else 160)  # logs: do not wrap tables at 80


def _gpu_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


@app.command()
def demo(
    fresh: bool = typer.Option(False, help="Use an empty tuning database and an empty cuTile cache (cold tune)."),
    replay: bool = typer.Option(False, help="Replay recorded H200 measurements even when a GPU is present."),
    record: Optional[Path] = typer.Option(None, help="Directory to write recordings of live tuning sessions to."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the rows as JSON to this file."),
    strategy: Optional[str] = typer.Option(
        None, help="Search strategy when replaying: exhaustive (default), random, evolutionary or model."),
    budget_evals: Optional[int] = typer.Option(None, help="With --strategy: at most this many configs per op."),
    seed: int = typer.Option(0, help="Seed of the replay and of the strategy."),
) -> None:
    """Tune the library's matmul (32 configs) and RMSNorm (4 configs) end to end."""
    budget = _budget(strategy, budget_evals)
    if fresh:
        tmp = Path(tempfile.mkdtemp(prefix="tiletune-demo-"))
        os.environ["TILETUNE_DB"] = str(tmp / "tuning.db")
        os.environ["CUDA_TILE_CACHE_DIR"] = str(tmp / "cutile-cache")  # read when cuda.tile is imported
    from . import demo as d

    live = _gpu_available() and not replay
    if live:
        console.print("[bold]GPU found:[/] tuning live.")
        rows = d.run_live(record)
    else:
        recs = d.packaged_recordings()
        why = "replay requested" if replay else "no GPU found"
        console.print(f"[bold yellow]{why}:[/] replaying measurements recorded on an H200 through the same tuning "
                      "loop, with a simulated clock. Nothing runs on a GPU.")
        for p in recs:
            from .recordings import Recording

            r = Recording.load(p)
            console.print(f"  {p.name}: {r.device.name} ({r.device.arch}), recorded {r.recorded}, "
                          f"cuda-tile {r.versions.get('cuda_tile')}, {len(r.measurements)} configs")
        rows = d.run_replay(recs, seed=seed, strategy=strategy, budget=budget)
    table = Table(title="tiletune demo" + (" (replay)" if not live else ""))
    for col in ("op", "problem", "configs", "ok", "failed", "winner", "time", "vs baseline", "throughput", "tuning"):
        table.add_column(col)
    for r in rows:
        vs = f"{r.baseline_us / r.winner_us:.2f}x" if r.baseline_us else "-"
        table.add_row(r.op, r.problem, str(r.configs), str(r.ok), str(r.failed),
                      " ".join(f"{k}={v}" for k, v in r.winner.items()), f"{r.winner_us:.1f} us", vs,
                      r.throughput, f"{r.tuning_s:.1f} s" + ("" if live else " (simulated)"))
    console.print(table)
    if json_out is not None:
        json_out.write_text(json.dumps([r.__dict__ for r in rows], indent=1))


def _budget(strategy: Optional[str], budget_evals: Optional[int]) -> object:
    from .strategies import STRATEGY_NAMES, Budget

    if strategy is not None and strategy not in STRATEGY_NAMES:
        raise typer.BadParameter(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGY_NAMES)}",
                                 param_hint="--strategy")
    if budget_evals is not None and budget_evals < 1:
        raise typer.BadParameter("must be >= 1", param_hint="--budget-evals")
    return Budget(max_evals=budget_evals) if budget_evals is not None else None


@app.command("strategies")
def strategies_cmd(
    recordings: list[Path] = typer.Argument(..., help="Recorded spaces: tiletune recordings (.json/.json.gz), "
                                                      "Kernel Tuner cache files or T4 results files."),
    strategy: list[str] = typer.Option(["exhaustive", "random", "evolutionary", "model"], "--strategy", "-s",
                                       help="Strategy to evaluate (repeat the option for several)."),
    seeds: int = typer.Option(100, help="Seeds per strategy and space."),
    exhaustive_seeds: int = typer.Option(10, help="Seeds for exhaustive search (its order does not depend on the seed)."),
    workers: int = typer.Option(16, help="Simulated compile workers."),
    batch: Optional[int] = typer.Option(None, help="Configs per ask (default: the compile workers)."),
    out: Optional[Path] = typer.Option(None, help="Write strategies.json and one PNG per space to this directory."),
) -> None:
    """Evaluate search strategies on recorded spaces (replayed, simulated clock, no GPU).

    For each space and strategy: evaluations and simulated seconds to get within 5% and 1% of the
    recorded optimum (median and 95% interval over seeds), against random search's expected count.
    """
    from .strategies import STRATEGY_NAMES
    from .strategy_eval import evaluate, plot_space, write_results

    for s in strategy:
        if s not in STRATEGY_NAMES:
            raise typer.BadParameter(f"unknown strategy {s!r}; choose from {', '.join(STRATEGY_NAMES)}",
                                     param_hint="--strategy")
    rows, runs, truths = evaluate(recordings, strategy, seeds, workers=workers, batch=batch,
                                  exhaustive_seeds=exhaustive_seeds, progress=lambda m: console.print(m))
    table = Table(title="search strategies on recorded spaces (evaluations: median [95% interval])")
    for col in ("space", "configs", "strategy", "to 5%", "random expects", "ratio", "to 1%", "seconds to 5%"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["space"], f"{r['n_configs']} ({r['n_valid']} ok)", r["strategy"],
                      f"{r['median_evals_to_5pct']} {r['evals_to_5pct_ci95']}",
                      f"{r['random_expected_evals_to_5pct']:.1f}", str(r["ratio_to_random_5pct"]),
                      f"{r['median_evals_to_1pct']} {r['evals_to_1pct_ci95']}", str(r["median_seconds_to_5pct"]))
    console.print(table)
    if out is not None:
        path = write_results(rows, out, {"seeds": seeds, "workers": workers, "batch": batch})
        console.print(f"wrote {path}")
        for t in truths:
            png = plot_space(t, {s: runs[(t.name, s)] for s in strategy}, Path(out) / f"strategies_{t.name}.png")
            console.print(f"wrote {png}")


@recording_app.command("import")
def recording_import(
    src: Path = typer.Argument(..., help="A Kernel Tuner cache file or a T4 results file (or a tiletune recording)."),
    dest: Path = typer.Argument(..., help="The tiletune recording to write (.json or .json.gz)."),
    arch: str = typer.Option("unknown", help="Architecture of the device, e.g. sm_90 (the files do not name it)."),
    device: Optional[str] = typer.Option(None, help="Device name for T4 files (they do not name it)."),
) -> None:
    """Convert a public recorded space to a tiletune recording (replayable, searchable)."""
    from .recordings import Recording, load_any, save_recording

    rec = load_any(src, arch=arch, device=device or "unknown")
    save_recording(dest, name=rec.name, key=rec.key, device=rec.device, versions=rec.versions,
                   measurements=rec.measurements, space=rec.space, note=rec.note)
    ok = sum(1 for m in rec.measurements if not m.status.failed)
    console.print(f"{dest}: {len(rec.measurements)} configs ({ok} ok) over {', '.join(rec.param_values)}")
    Recording.load(dest).space_from_params()  # it must make a space


@db_app.command("stats")
def db_stats(path: Optional[Path] = typer.Option(None, help="Database file (default: TILETUNE_DB or the user cache).")) -> None:
    """Counts (sessions, measurements, winners, leases, progress rows of unfinished sessions) and size
    of the tuning database."""
    from .store import TuningDB

    console.print_json(json.dumps(TuningDB(path).stats(), default=str))


@db_app.command("list")
def db_list(path: Optional[Path] = typer.Option(None), name: Optional[str] = typer.Option(None)) -> None:
    """One line per stored winner."""
    from .store import TuningDB

    table = Table()
    for col in ("op", "device", "key", "winner", "median"):
        table.add_column(col)
    for w in TuningDB(path).winners(name=name):
        table.add_row(w.identity.name, w.identity.device.name, w.identity.key[:60],
                      json.dumps(w.config), f"{w.median_us:.2f} us")
    console.print(table)


@db_app.command("export")
def db_export(dest: Path, path: Optional[Path] = typer.Option(None), name: Optional[str] = typer.Option(None)) -> None:
    """Write sessions (measurements, winners) as JSON."""
    from .store import TuningDB

    n = TuningDB(path).export_json(dest, name=name)
    console.print(f"exported {n} session(s) to {dest}")


@db_app.command("import")
def db_import(src: Path, path: Optional[Path] = typer.Option(None)) -> None:
    """Read sessions from a JSON export (sessions already present are skipped)."""
    from .store import TuningDB

    n = TuningDB(path).import_json(src)
    console.print(f"imported {n} new session(s) from {src}")


@db_app.command("clear")
def db_clear(path: Optional[Path] = typer.Option(None), yes: bool = typer.Option(False, "--yes")) -> None:
    """Delete every record."""
    from .store import TuningDB

    db = TuningDB(path)
    if not yes:
        typer.confirm(f"delete every record in {db.where}?", abort=True)
    console.print(f"removed {db.clear()} row(s)")


@app.command()
def doctor() -> None:
    """Report what tiletune sees: Python packages, GPU, cuTile toolchain, database."""
    from .store import default_db_path

    rows = []
    try:
        import torch

        rows.append(("torch", torch.__version__))
        rows.append(("GPU", torch.cuda.get_device_name() if torch.cuda.is_available() else "none"))
    except Exception as exc:
        rows.append(("torch", f"missing ({exc})"))
    try:
        from .backends.cutile import software_versions

        for k, v in software_versions().items():
            rows.append((k, v))
    except Exception as exc:
        rows.append(("cuda-tile", f"missing ({exc})"))
    from .compile_pool import CompilePool, cpu_count

    try:
        pool = CompilePool()
        rows.append(("parallel compile", f"yes, {cpu_count()} workers" if pool.parallel else f"no: {pool.why_serial}"))
    except Exception as exc:
        rows.append(("parallel compile", f"no: {exc}"))
    rows.append(("database", str(default_db_path())))
    table = Table(show_header=False)
    for k, v in rows:
        table.add_row(k, str(v))
    console.print(table)


if __name__ == "__main__":  # pragma: no cover
    app()
