"""The ``tiletune`` command line: the demo (main job), the tuning database, and a health check.

Errors: every failure of a command is one line on stderr, ``error: <message>``, with a
``hint: ...`` line where one helps, and a non-zero exit status: **2** when the input is refused
(usage, option values, files, databases, environment variables), **1** when something failed while
running (no GPU backend, every candidate failed, a locked database, an unexpected exception, which
also names its class). ``--debug`` (anywhere on the command line) or ``TILETUNE_DEBUG=1`` prints the
full traceback instead. This is done once, in :class:`_TiletuneGroup.main`, for every command.

Text that comes from files or databases (op names, keys, configs, device names) goes through
:func:`tiletune.terminal.safe` before it reaches the terminal.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sqlite3
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, List, NoReturn, Optional

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperGroup

from tiletune import settings
from tiletune.terminal import escape_controls, safe


# ---------------------------------------------------------------------------------------- errors


class CliError(Exception):
    """A command refusing its input (``code`` 2) or failing (``code`` 1), with an optional hint."""

    def __init__(self, message: str, hint: str | None = None, code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.code = code


def _fail(message: str, hint: str | None = None, code: int = 2) -> NoReturn:
    raise CliError(message, hint, code)


def _click_exception_modules() -> list[Any]:
    mods = []
    for name in ("typer._click.exceptions", "click.exceptions"):  # typer >= 0.2x vendors click
        try:
            mods.append(importlib.import_module(name))
        except ImportError:  # pragma: no cover - depends on the typer version
            pass
    return mods


_CLICK = _click_exception_modules()
_USAGE_ERRORS: tuple[type, ...] = tuple(m.UsageError for m in _CLICK)
_CLICK_ERRORS: tuple[type, ...] = tuple(m.ClickException for m in _CLICK)
_NO_ARGS_HELP: tuple[type, ...] = tuple(m.NoArgsIsHelpError for m in _CLICK if hasattr(m, "NoArgsIsHelpError"))
_ABORTS: tuple[type, ...] = (typer.Abort,) + tuple(m.Abort for m in _CLICK if hasattr(m, "Abort"))
_EXITS: tuple[type, ...] = (typer.Exit,) + tuple(m.Exit for m in _CLICK if hasattr(m, "Exit"))

_DEBUG_HINT = "rerun with --debug (or TILETUNE_DEBUG=1) for the full traceback"
#: OSErrors caused by the paths given (refused input, exit 2); other OSErrors are failures (exit 1)
_PATH_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, FileExistsError, PermissionError)


def _describe(exc: BaseException) -> tuple[str, str | None, int]:
    """``(message, hint, exit status)`` of an exception raised by a command."""
    from tiletune import errors

    if isinstance(exc, CliError):
        return exc.message, exc.hint, exc.code
    if isinstance(exc, _USAGE_ERRORS):
        ctx = getattr(exc, "ctx", None)
        hint = f"run '{ctx.command_path} --help'" if ctx is not None else None
        return exc.format_message(), hint, 2  # type: ignore[attr-defined]
    if isinstance(exc, _CLICK_ERRORS):
        return exc.format_message(), None, int(getattr(exc, "exit_code", 1))  # type: ignore[attr-defined]
    if isinstance(exc, _ABORTS):
        return "aborted", None, 1
    if isinstance(exc, errors.TiletuneError):
        message, hint = str(exc), None
        path, problem, fix = (getattr(exc, k, None) for k in ("path", "problem", "fix"))
        if path and problem and fix and message == f"tuning database {path}: {problem}; {fix}":
            message, hint = f"tuning database {path}: {problem}", str(fix)
        runtime = (errors.NoBackendError, errors.AllCandidatesFailed, RuntimeError,
                   *(c for c in (getattr(errors, "DatabaseLocked", None),) if c is not None))
        return message, hint, 1 if isinstance(exc, runtime) else 2
    if isinstance(exc, sqlite3.Error):
        hint = "check that --path (or TILETUNE_DB) names a tiletune tuning database"
        return f"database error: {exc}", hint, 1 if isinstance(exc, sqlite3.OperationalError) else 2
    if isinstance(exc, OSError):
        if exc.strerror and exc.filename is not None:
            message = f"{exc.strerror}: {exc.filename}"
            if getattr(exc, "filename2", None) is not None:
                message += f" -> {exc.filename2}"
        else:
            message = str(exc) or type(exc).__name__
        return message, None, 2 if isinstance(exc, _PATH_ERRORS) else 1
    if isinstance(exc, (ValueError, TypeError)):
        return str(exc) or type(exc).__name__, None, 2
    text = str(exc)
    return (f"{type(exc).__name__}: {text}" if text else type(exc).__name__), f"unexpected error; {_DEBUG_HINT}", 1


def _report(exc: BaseException, debug: bool) -> int:
    """Print ``exc`` as one ``error:`` line (and a ``hint:`` line) or, with ``debug``, its traceback;
    return the exit status."""
    if isinstance(exc, _NO_ARGS_HELP):  # ``tiletune`` or ``tiletune db`` alone: the help
        ctx = getattr(exc, "ctx", None)
        typer.echo(ctx.get_help() if ctx is not None else exc.format_message())  # type: ignore[attr-defined]
        return int(getattr(exc, "exit_code", 2))
    message, hint, code = _describe(exc)
    if debug and not isinstance(exc, (CliError, *_CLICK_ERRORS, *_ABORTS)):
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
        return code
    lines = [ln for ln in str(message).strip().splitlines() if ln.strip()] or [type(exc).__name__]
    if len(lines) > 1 and hint is None:
        hint = f"{len(lines) - 1} more line(s) of detail: {_DEBUG_HINT}"
    typer.echo(f"error: {escape_controls(lines[0].strip())}", err=True)
    if hint:
        typer.echo(f"hint: {escape_controls(hint)}", err=True)
    return code


def _take_debug(args: list[str]) -> tuple[list[str], bool]:
    """``args`` without ``--debug`` (accepted anywhere before ``--``), and whether it was there."""
    out, found, literal = [], False, False
    for a in args:
        if not literal and a == "--debug":
            found = True
            continue
        if a == "--":
            literal = True
        out.append(a)
    return out, found


#: Options whose value may be left out (then this value stands for it): ``--ray`` alone uses Ray's
#: default cluster (RAY_ADDRESS, or a new local one).
_OPTIONAL_VALUES = {"--ray": "default"}
_SPEC_SUFFIXES = (".toml", ".yaml", ".yml", ".json")


def _fill_optional_values(args: list[str]) -> list[str]:
    """``args`` with the value of an optional-value option made explicit where it was left out: the
    option is last, or followed by another option, or by a spec file (``--ray spec.toml``)."""
    out: list[str] = []
    for i, a in enumerate(args):
        out.append(a)
        if a == "--":
            return out + args[i + 1:]
        if a in _OPTIONAL_VALUES:
            nxt = args[i + 1] if i + 1 < len(args) else None
            if nxt is None or nxt.startswith("-") or (nxt.lower().endswith(_SPEC_SUFFIXES) and Path(nxt).is_file()):
                out.append(_OPTIONAL_VALUES[a])
    return out


class _TiletuneGroup(TyperGroup):
    """The top-level command group: turns every error of every command into one line."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        argv, debug = _take_debug(list(sys.argv[1:] if args is None else args))
        argv = _fill_optional_values(argv)
        try:
            debug = settings.debug() or debug
            env_problem: ValueError | None = None
        except ValueError as exc:
            env_problem = exc
        try:
            if env_problem is not None:
                raise env_problem
            rv = super().main(argv, prog_name, complete_var, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) and not isinstance(rv, bool) else 0
        except SystemExit:
            raise
        except _EXITS as exc:
            code = int(getattr(exc, "exit_code", 0) or 0)
        except BaseException as exc:  # noqa: BLE001 - every error becomes one line (or a traceback)
            if isinstance(exc, KeyboardInterrupt):
                typer.echo("error: interrupted", err=True)
                code = 130
            else:
                code = _report(exc, debug)
        if not standalone_mode:
            return code
        sys.exit(code)


# ---------------------------------------------------------------------------------------- the app

app = typer.Typer(cls=_TiletuneGroup, add_completion=False, no_args_is_help=True,
                  help="Autotuning for NVIDIA cuTile kernels.")
db_app = typer.Typer(no_args_is_help=True, help="Inspect, export and import the tuning database.")
app.add_typer(db_app, name="db")
recording_app = typer.Typer(no_args_is_help=True, help="Recorded spaces: import Kernel Tuner / T4 files.")
app.add_typer(recording_app, name="recording")
console = Console(width=None if sys.stdout.isatty() else 160)  # logs: do not wrap tables at 80

_PATH_HELP = "Database file (default: TILETUNE_DB, else TILETUNE_CACHE_DIR/tuning.db, else the user cache)."


def _show_version(value: bool) -> None:
    if value:
        from tiletune import __version__

        typer.echo(f"tiletune {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    ctx: typer.Context,
    version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                 help="Print tiletune's version and exit."),
    debug: bool = typer.Option(False, "--debug",
                               help="Show the full traceback of an error instead of one line (also "
                                    "TILETUNE_DEBUG=1; accepted anywhere on the command line)."),
) -> None:
    """Autotuning for NVIDIA cuTile kernels."""
    if ctx.invoked_subcommand != "doctor":  # doctor reports them instead
        problems = settings.check_all()
        if problems:
            more = f" ({len(problems) - 1} more invalid variable(s))" if len(problems) > 1 else ""
            _fail(problems[0], hint="fix or unset the variable" + more + "; 'tiletune doctor' lists them")


def _gpu_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _need_gpu(device: str, command: str) -> None:
    """Refuse, before any work, a command that would make CUDA tensors on a machine torch sees no GPU on."""
    if device.strip().lower().split(":")[0] == "cuda" and not _gpu_available():
        _fail(f"tiletune {command}: needs an NVIDIA GPU with CUDA (torch.cuda.is_available() is False)",
              hint="run it on a machine with a CUDA GPU" + (" (or --device cpu for calls of your own ops in --spec)"
                                                             if command == "tune" else ""))


def _check_strategy(spec: str) -> None:
    from tiletune.space.strategies import resolve_strategy

    resolve_strategy(spec)  # StrategyError (a ValueError) naming the registered strategies


def _check_out_file(path: Path, option: str) -> None:
    """Refuse, before any work, a file to write whose folder is missing or that is a folder."""
    if path.is_dir():
        _fail(f"{option} {path} is a directory; give the file to write")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        _fail(f"{option} {path}: folder {parent} does not exist", hint="create it first, or choose another path")


# ---------------------------------------------------------------------------------------- demo


@app.command()
def demo(
    fresh: bool = typer.Option(False, help="Use an empty tuning database and an empty cuTile cache (cold tune)."),
    replay: bool = typer.Option(False, help="Replay recorded H200 measurements even when a GPU is present."),
    record: Optional[Path] = typer.Option(
        None, help="Directory to write recordings of live tuning sessions to (needs a GPU; not with --replay)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the rows as JSON to this file."),
    strategy: Optional[str] = typer.Option(
        None, help="Search strategy when replaying: exhaustive (default), random, evolutionary, model, "
                   "another registered name, or package.module:Class."),
    budget_evals: Optional[int] = typer.Option(None, min=1, help="With --strategy: at most this many configs per op."),
    seed: int = typer.Option(0, help="Seed of the replay and of the strategy."),
) -> None:
    """Tune the example matmul (32 configs) and RMSNorm (4 configs) end to end."""
    from tiletune.space.strategies import Budget

    if strategy is not None:
        _check_strategy(strategy)
    budget = Budget(max_evals=budget_evals) if budget_evals is not None else None
    live = _gpu_available() and not replay
    if record is not None:
        if not live:
            _fail("--record cannot record without a GPU: it records live tuning sessions"
                  + (" and --replay was given" if replay else ", and no GPU was found"),
                  hint="run it on a machine with a CUDA GPU, or leave out --record" + (" or --replay" if replay else ""))
        if record.exists() and not record.is_dir():
            _fail(f"--record {record} is a file, not a directory")
    if live and (strategy is not None or budget_evals is not None):
        _fail("--strategy and --budget-evals apply to the replay only", hint="add --replay, or leave them out")
    if json_out is not None:
        _check_out_file(json_out, "--json")
    if fresh:
        if not live:
            console.print("[dim]--fresh has no effect on a replay (it uses no database and no cuTile cache).[/]")
        tmp = Path(tempfile.mkdtemp(prefix="tiletune-demo-"))
        os.environ["TILETUNE_DB"] = str(tmp / "tuning.db")
        os.environ["CUDA_TILE_CACHE_DIR"] = str(tmp / "cutile-cache")  # read when cuda.tile is imported
    from tiletune.lab import demo as d

    if live:
        console.print("[bold]GPU found:[/] tuning live.")
        rows = d.run_live(record)
    else:
        recs = d.packaged_recordings()
        why = "replay requested" if replay else "no GPU found"
        console.print(f"[bold yellow]{why}:[/] replaying measurements recorded on an H200 through the same tuning "
                      "loop, with a simulated clock. Nothing runs on a GPU.")
        for p in recs:
            from tiletune.lab.recordings import Recording

            r = Recording.load(p)
            console.print(safe(f"  {p.name}: {r.device.name} ({r.device.arch}), recorded {r.recorded}, "
                               f"cuda-tile {r.versions.get('cuda_tile')}, {len(r.measurements)} configs"))
        rows = d.run_replay(recs, seed=seed, strategy=strategy, budget=budget)
    table = Table(title="tiletune demo" + (" (replay)" if not live else ""))
    for col in ("op", "problem", "configs", "ok", "failed", "winner", "time", "vs baseline", "throughput", "tuning"):
        table.add_column(col)
    for r in rows:
        vs = f"{r.baseline_us / r.winner_us:.2f}x" if r.baseline_us else "-"
        table.add_row(safe(r.op), safe(r.problem), str(r.configs), str(r.ok), str(r.failed),
                      safe(" ".join(f"{k}={v}" for k, v in r.winner.items())), f"{r.winner_us:.1f} us", vs,
                      safe(r.throughput), f"{r.tuning_s:.1f} s" + ("" if live else " (simulated)"))
    console.print(table)
    if record is not None:
        console.print(safe(f"recordings written to {record}"))
    if json_out is not None:
        json_out.write_text(json.dumps([r.__dict__ for r in rows], indent=1))


# ---------------------------------------------------------------------------------------- strategies


def _library_calls(ops: List[str], tokens: str, **dims: Any) -> list:
    """The calls of library ops (``all``: every one) over comma-separated token counts, for
    ``tiletune tune`` and ``tiletune ab``; bad names or counts end the command with one line."""
    from tiletune.lab.fill import LLM_OPS, llm_calls

    names = list(LLM_OPS) if ops == ["all"] else list(ops)
    bad = [o for o in names if o not in LLM_OPS]
    if bad:
        _fail(f"unknown library op(s) {', '.join(map(repr, bad))}", hint=f"choose from {', '.join(LLM_OPS)}")
    try:
        counts = [int(t) for t in tokens.split(",") if t.strip()]
    except ValueError:
        _fail(f"--tokens {tokens!r}: expected comma-separated integers, e.g. 1,8,128")
    if not counts or min(counts) < 1:
        _fail(f"--tokens {tokens!r}: expected token counts >= 1")
    return llm_calls(names, counts, **dims)


def _model_line(model: str, dims: dict, n: int) -> str:
    """What ``tiletune tune --model`` read of the model, before it tunes: a config's dimensions can be checked."""
    return (f"{model}: hidden {dims.get('hidden', 4096)}, intermediate {dims.get('intermediate', 14336)}, heads "
            f"{dims.get('heads', 32)}/{dims.get('kv_heads', 8)}, head dim {dims.get('head_dim', 128)}, vocab "
            f"{dims.get('vocab', 32000)}: {n} call(s)")


def _model_calls(model: str, phase: str, batch: str, seq: str, cache: str, dtype: str, **given: Any) -> list:
    """The calls of ``model``'s decoder layer over the ranges (``tiletune tune --model M``); bad values end the
    command with one line."""
    from tiletune.lab.fill import PHASES, layer_calls, model_dims, parse_range

    try:
        dims = model_dims(model, **given)
    except ValueError as exc:
        _fail(f"--model: {exc}")
    phases = [p.strip() for p in phase.split(",") if p.strip()]
    if not phases or any(p not in PHASES for p in phases):
        _fail(f"--phase {phase!r}: expected prefill, decode or both (comma-separated)")
    try:
        b = parse_range(batch, "--batch")
        lengths = {"prefill": parse_range(seq, "--seq"), "decode": parse_range(cache, "--cache")}
    except ValueError as exc:
        _fail(str(exc))
    calls = [c for p in phases for c in layer_calls(dims, p, b, lengths[p], dtype=dtype)]
    console.print(safe(_model_line(model, dims, len(calls))))
    return calls


@app.command("tune")
def tune_cmd(
    ops: Optional[List[str]] = typer.Argument(None, help="Library ops to tune over LLM shapes (rms_norm, matmul, "
                                              "attention, ...; 'all' for every one). Not with --spec."),
    spec: Optional[Path] = typer.Option(None, exists=True, dir_okay=False, readable=True,
                                        help="A JSON (or TOML) file of calls: {\"calls\": [{\"op\": \"pkg.mod:fn\", "
                                             "\"args\": [...], \"kwargs\": {...}}]} (see tiletune.lab.fill)."),
    tokens: str = typer.Option("1,8,128", help="Comma-separated token counts (rows) for the library ops."),
    model: Optional[str] = typer.Option(None, help="Shapes of a model: a name (llama3-8b, llama3-70b, llama3.2-1b, "
                                        "llama3.2-3b, mistral-7b, qwen2.5-7b, qwen2.5-14b, qwen2.5-32b, qwen2.5-72b, "
                                        "gemma2-9b, phi3-mini), the path of its Hugging Face config.json (or of the "
                                        "folder holding it), or its hub id (org/name) where the Hugging Face cache "
                                        "holds it; the size options below override single dimensions."),
    projections: bool = typer.Option(False, "--projections", help="matmul: the four projections of a decoder "
                                     "layer (qkv, output, gate-up, down) instead of one hidden x hidden."),
    linear_weights: bool = typer.Option(False, "--linear-weights", help="matmul weights in nn.Linear's layout "
                                        "(stored N x K, passed as w.t()); with --projections the separate q, k, v, "
                                        "o, gate, up and down layers of a Hugging Face decoder."),
    hidden: Optional[int] = typer.Option(None, min=1, help="Hidden size of the library ops' shapes (default 4096)."),
    intermediate: Optional[int] = typer.Option(None, min=1, help="MLP size; swiglu/geglu take 2x this (default "
                                               "14336)."),
    heads: Optional[int] = typer.Option(None, min=1, help="Query heads, rope and attention (default 32)."),
    kv_heads: Optional[int] = typer.Option(None, min=1, help="Key/value heads, rope and attention (default 8)."),
    head_dim: Optional[int] = typer.Option(None, min=1, help="Head dimension, rope and attention (default 128)."),
    vocab: Optional[int] = typer.Option(None, min=2, help="Vocabulary, cross_entropy (default 32000)."),
    dtype: str = typer.Option("bfloat16", help="Dtype of the library ops' tensors."),
    device: str = typer.Option("cuda", help="Where tensors are made."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the per-call report as JSON here."),
    pending: bool = typer.Option(False, "--pending", help="Tune the keys the library ops answered provisionally "
                                 "(nearest neighbour or default config), recorded beside the tuning database."),
    phase: str = typer.Option("prefill,decode", help="--model without ops: the phases of the model's decoder "
                              "layer to warm (prefill, decode or both)."),
    batch: str = typer.Option("1", help="--model without ops: sequences per call, N or LO-HI (every bucket of "
                              "the range is warmed)."),
    seq: str = typer.Option("1-2048", help="--model without ops: prefill tokens per sequence, N or LO-HI."),
    cache: str = typer.Option("1-8192", help="--model without ops: decode KV-cache length (capacity), N or LO-HI."),
) -> None:
    """Tune many calls in one go (warm a machine before serving); re-running skips what is stored.

    With --model and no ops: the calls of the model's decoder layer built from the library ops (fused qkv
    and gate-up as x @ w.t(), RoPE on views of the qkv output, GQA attention; decode: kv_cache_append and
    decode_attention over the cache), for every key the --batch x --seq (prefill) and --batch x --cache
    (decode) ranges meet."""
    from tiletune.lab.fill import LLM_OPS, load_spec, run_calls

    if pending:
        if spec is not None or ops:
            _fail("--pending tunes the recorded keys: give no ops and no --spec with it")
        if json_out is not None:
            _check_out_file(json_out, "--json")
        from tiletune.lab.fill import tune_pending

        report = tune_pending(device=device, on_row=lambda r: console.print(safe(
            f"{'ok ' if r['ok'] else 'ERR'} {r['seconds']:8.2f} s  {r['call']}" + ("" if r["ok"] else f"  {r['error']}"))))
        if json_out is not None:
            json_out.write_text(json.dumps(report.as_dict(), indent=1, allow_nan=False) + "\n")
        console.print(safe(f"{len(report.rows) - report.failed} of {len(report.rows)} pending key(s) tuned"))
        if report.failed:
            _fail(f"{report.failed} pending key(s) failed (listed above)", code=1)
        return
    if spec is not None and ops:
        _fail("give library ops or --spec, not both")
    if spec is None and not ops and model is None:
        _fail("nothing to tune", hint=f"name library ops ({', '.join(LLM_OPS)} or all), pass --spec FILE or --model M")
    if json_out is not None:
        _check_out_file(json_out, "--json")
    if spec is not None:
        calls = load_spec(spec)
    elif not ops:
        calls = _model_calls(model, phase, batch, seq, cache, dtype, hidden=hidden, intermediate=intermediate,
                             heads=heads, kv_heads=kv_heads, head_dim=head_dim)
    else:
        from tiletune.lab.fill import model_dims

        try:
            dims = model_dims(model, hidden=hidden, intermediate=intermediate, heads=heads, kv_heads=kv_heads,
                              head_dim=head_dim, vocab=vocab)
        except ValueError as exc:
            _fail(f"--model: {exc}")
        calls = _library_calls(ops or [], tokens, dtype=dtype, projections=projections,
                               linear_weights=linear_weights, **dims)
        if model is not None:
            console.print(safe(_model_line(model, dims, len(calls))))
    _need_gpu(device, "tune")
    report = run_calls(calls, device=device, on_row=lambda r: console.print(safe(
        f"{'ok ' if r['ok'] else 'ERR'} {r['seconds']:8.2f} s  {r['call']}" + ("" if r["ok"] else f"  {r['error']}"))))
    if json_out is not None:
        json_out.write_text(json.dumps(report.as_dict(), indent=1, allow_nan=False) + "\n")
    console.print(safe(f"{len(report.rows) - report.failed} of {len(report.rows)} call(s) tuned or found"))
    if report.failed:
        _fail(f"{report.failed} call(s) failed (listed above)", code=1)


@app.command("campaign")
def campaign_cmd(
    spec: Path = typer.Argument(..., exists=True, dir_okay=False, readable=True,
                                help="The campaign: a TOML (or YAML, JSON) file of ops, shapes, dtypes, strategy and "
                                     "budget per op (see tiletune/lab/campaign/spec.py)."),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="Workers, one per GPU: a count (2) or visible GPU indices "
                                       "(0,1); default: every visible GPU. With --device cpu: that many workers. "
                                       "With --ray: a count of GPU actors (default: every GPU of the cluster)."),
    ray: Optional[str] = typer.Option(None, "--ray", metavar="[ADDRESS]",
                                      help="Run the workers as Ray actors holding one GPU each: --ray alone uses "
                                           "RAY_ADDRESS or starts a local cluster; --ray auto or --ray HOST:6379 "
                                           "joins a running cluster (ray start --head). Needs tiletune[ray]."),
    db: Optional[Path] = typer.Option(None, "--db", help=_PATH_HELP + " Results stream into it; keys it holds "
                                      "are skipped."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the report here: campaign.json, campaign.md and "
                                       "PNGs (with matplotlib)."),
    device: Optional[str] = typer.Option(None, help="Where tensors are made (overrides the spec's device)."),
    lookahead: int = typer.Option(2, min=0, help="Tasks each worker holds ahead of the running one, their "
                                  "candidates compiled while the GPU measures."),
    precompile: bool = typer.Option(True, "--precompile/--no-precompile",
                                    help="Compile the next tasks' candidates ahead (CUDA)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Also write the report as JSON to this file."),
) -> None:
    """Tune many ops x shapes x dtypes on every GPU of this host (or of a Ray cluster), resumably."""
    import dataclasses

    from tiletune.lab.campaign import load_campaign, run_campaign, status_of

    if out is not None and out.exists() and not out.is_dir():
        _fail(f"--out {out} is a file, not a directory")
    if json_out is not None:
        _check_out_file(json_out, "--json")
    if db is not None and db.is_dir():
        _fail(f"--db {db} is a directory, not a tuning database file")
    plan = load_campaign(spec)
    if device is not None:
        plan = dataclasses.replace(plan, device=device)
    console.print(safe(f"campaign {plan.name}: {len(plan.tasks)} task(s) on {plan.device}"
                       + (f", Ray {'(default cluster)' if ray == 'default' else ray}" if ray else "")))

    def ready(slot: int, info: dict) -> None:
        console.print(safe(f"worker {slot}: {info.get('host')} pid {info.get('pid')} "
                           f"{info.get('gpu') or 'cpu'} (CUDA_VISIBLE_DEVICES={info.get('visible_devices')}), "
                           f"{info.get('compile_workers')} compile cores"))

    def line(result: dict, task: Any) -> None:
        status = status_of(result)
        picks = "; ".join(" ".join(f"{k}={v}" for k, v in r["config"].items()) for r in result.get("resolved", []))
        tail = f"  {result.get('error')}" if status == "failed" else (f"  -> {picks}" if picks else "")
        console.print(safe(f"{status:6s} {float(result.get('seconds') or 0):8.2f} s  w{result.get('worker')}  "
                           f"{task.id}{tail}"))

    result = run_campaign(plan, db=db, gpus=gpus, ray=(True if ray == "default" else ray) if ray else None,
                          lookahead=lookahead, precompile=precompile, out=out, on_result=line, on_ready=ready)
    r = result.report
    if json_out is not None:
        json_out.write_text(json.dumps(r, indent=1, allow_nan=False) + "\n")
    console.print(safe(f"{r['tasks']} task(s) in {r['wall_s']:.1f} s on {len(r['workers'])} worker(s): {r['tuned']} "
                       f"tuned, {r['stored']} already stored, {r['reused']} reused, {r['failed']} failed; "
                       f"database {r['database']}"))
    for p in result.paths:
        console.print(safe(f"wrote {p}"))
    if r["failed"]:
        _fail(f"{r['failed']} task(s) failed (listed above)", code=1)


@app.command("strategies")
def strategies_cmd(
    recordings: list[Path] = typer.Argument(..., exists=True, dir_okay=False, readable=True,
                                            help="Recorded spaces: tiletune recordings (.json/.json.gz), "
                                                 "Kernel Tuner cache files or T4 results files."),
    strategy: list[str] = typer.Option(["exhaustive", "random", "evolutionary", "model"], "--strategy", "-s",
                                       help="Strategy to evaluate (repeat the option for several): a registered "
                                            "name or package.module:Class."),
    seeds: int = typer.Option(100, min=1, help="Seeds per strategy and space."),
    exhaustive_seeds: int = typer.Option(10, min=1,
                                         help="Seeds for exhaustive search (its order does not depend on the seed)."),
    workers: int = typer.Option(16, min=1, help="Simulated compile workers."),
    batch: Optional[int] = typer.Option(None, min=1, help="Configs per ask (default: the compile workers)."),
    budget: Optional[int] = typer.Option(None, "--budget", min=1,
                                         help="Evaluations per run at most (default: until within 1% of the "
                                              "optimum, or the space is exhausted)."),
    no_baseline: bool = typer.Option(False, "--no-baseline",
                                     help="Drop the recorded baseline from each space, so every search starts "
                                          "from its own first picks."),
    truth: Optional[str] = typer.Option(None, "--truth", metavar="time|times-median",
                                        help="The recorded time that is the ground truth: 'time' (a Kernel Tuner "
                                             "cache's time field, as Kernel Tuner scores it) or 'times-median' "
                                             "(the median of the samples). Default: each file's own (time for a "
                                             "Kernel Tuner cache, times-median for a tiletune recording)."),
    out: Optional[Path] = typer.Option(None, help="Write strategies.json and one PNG per space to this directory."),
) -> None:
    """Evaluate search strategies on recorded spaces (replayed, simulated clock, no GPU).

    For each space and strategy: evaluations and simulated seconds to get within 5% and 1% of the
    recorded optimum (median and 95% interval over seeds), against random search's expected count.
    Which recorded time is the truth is printed per space.
    """
    from tiletune.errors import TiletuneError
    from tiletune.lab.recordings.format import TRUTHS
    from tiletune.lab.strategy_eval import evaluate, load_truth, plot_space, write_results

    seen: set[str] = set()
    for s in strategy:
        if s in seen:
            _fail(f"--strategy {s} is given twice", hint="name each strategy once")
        seen.add(s)
        _check_strategy(s)
    if out is not None and out.exists() and not out.is_dir():
        _fail(f"--out {out} is a file, not a directory")
    if truth is not None and truth not in TRUTHS:
        _fail(f"--truth {truth!r}: expected one of {', '.join(TRUTHS)}")
    spaces = []
    for path in recordings:
        try:
            spaces.append(load_truth(path, baseline=not no_baseline, truth=truth))
        except TiletuneError:  # an unreadable or malformed file: reported as such
            raise
        except ValueError as exc:  # a truth the file does not have, or no successful config
            _fail(f"--truth {truth}: {exc}" if truth is not None else str(exc),
                  hint="leave out --truth to use each file's own" if truth is not None else None)
    for t in spaces:
        console.print(safe(f"{t.name}: truth = {t.truth_field} ({TRUTHS[t.truth_field]}); "
                           f"baseline {'dropped' if no_baseline else 'kept'}; "
                           f"budget {budget if budget is not None else 'none'}"))
    rows, runs, truths = evaluate(spaces, strategy, seeds, workers=workers, batch=batch, max_evals=budget,
                                  exhaustive_seeds=exhaustive_seeds, progress=lambda m: console.print(safe(m)))
    table = Table(title="search strategies on recorded spaces (evaluations: median [95% interval])")
    for col in ("space", "configs", "truth", "strategy", "to 5%", "random expects", "ratio", "to 1%",
                "seconds to 5%"):
        table.add_column(col)
    for r in rows:
        table.add_row(safe(r["space"]), f"{r['n_configs']} ({r['n_valid']} ok)", safe(r["truth"]), safe(r["strategy"]),
                      safe(f"{r['median_evals_to_5pct']} {r['evals_to_5pct_ci95']}"),
                      f"{r['random_expected_evals_to_5pct']:.1f}", safe(r["ratio_to_random_5pct"]),
                      safe(f"{r['median_evals_to_1pct']} {r['evals_to_1pct_ci95']}"),
                      safe(r["median_seconds_to_5pct"]))
    console.print(table)
    if out is not None:
        path = write_results(rows, out, {"seeds": seeds, "workers": workers, "batch": batch, "budget_evals": budget,
                                         "baseline": not no_baseline, "truth": truth or "each file's own"})
        console.print(safe(f"wrote {path}"))
        for t in truths:
            png = plot_space(t, {s: runs[(t.name, s)] for s in strategy}, Path(out) / f"strategies_{t.name}.png")
            console.print(safe(f"wrote {png}"))


# ---------------------------------------------------------------------------------------- suggest


@app.command("suggest")
def suggest_cmd(
    kernel: str = typer.Argument(..., help="The kernel as MODULE:NAME (a @ct.kernel object or its function); "
                                 "the current directory is importable."),
    settings_: Optional[List[str]] = typer.Option(None, "--set", help="A template argument NAME=VALUE, e.g. "
                                                  "n_cols=8192 (repeat the option for several)."),
    template_name: Optional[str] = typer.Option(None, "--template", help="Print this catalogue template instead "
                                                "of the one the source suggests."),
) -> None:
    """Classify a cuTile kernel from its source and print the matching template's Space as Python code."""
    from tiletune.lab.suggest import parse_setting, suggest

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    args = dict(parse_setting(s) for s in settings_ or [])
    typer.echo(suggest(kernel, args, template=template_name))


# ---------------------------------------------------------------------------------------- ab, shrink


@app.command("ab")
def ab_cmd(
    ops: Optional[List[str]] = typer.Argument(None, help="Library ops over LLM shapes (as 'tiletune tune'), or "
                                              "none with --spec."),
    spec: Optional[Path] = typer.Option(None, exists=True, dir_okay=False, readable=True,
                                        help="A calls file as for 'tiletune tune --spec'; each call is one case."),
    against: str = typer.Option("baseline", help="'baseline' or a JSON object of every parameter's value."),
    tokens: str = typer.Option("1,8,128", help="Comma-separated token counts for the library ops."),
    rounds: int = typer.Option(10, min=3, help="Interleaved rounds per case."),
    batch: int = typer.Option(10, min=1, help="Samples per config per round."),
    device: str = typer.Option("cuda", help="Where tensors are made."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the report as JSON here."),
    png: Optional[Path] = typer.Option(None, help="Write a PNG of the ratios here (needs matplotlib)."),
) -> None:
    """A/B each call's tuned pick against a fixed config (interleaved, cold L2): ratio, 95% CI, verdict."""
    from tiletune.lab.ab import ab, geomean
    from tiletune.lab.fill import LLM_OPS, load_spec, materialize, resolve_op

    if (spec is None) == (not ops):
        _fail("give library ops or --spec (one of them)", hint=f"library ops: {', '.join(LLM_OPS)}")
    for out, opt in ((json_out, "--json"), (png, "--png")):
        if out is not None:
            _check_out_file(out, opt)
    fixed: Any = against
    if against != "baseline":
        try:
            fixed = json.loads(against)
        except ValueError:
            fixed = None
        if not isinstance(fixed, dict):
            _fail(f"--against {against!r}: expected 'baseline' or a JSON object of parameter values")
    calls = load_spec(spec) if spec is not None else _library_calls(ops or [], tokens)
    _need_gpu(device, "ab")
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    reports = []
    for call in calls:
        fn = resolve_op(call.op)
        args, kwargs = materialize(call, device, gen)
        rep = ab(fn, [{"args": args, "kwargs": kwargs, "label": call.describe()}], against=fixed, rounds=rounds,
                 batch=batch)
        console.print(safe(rep.table().splitlines()[1]))
        reports.append(rep)
    rows = [r for rep in reports for r in rep.rows]
    g = geomean(r.ratio for r in rows)
    console.print(safe(f"geomean {g:.3f} over {len(rows)} case(s); "
                       + ", ".join(f"{v} {sum(1 for r in rows if r.verdict == v)}" for v in ("faster", "tied", "slower"))))
    if reports:
        from tiletune.lab.ab import ABReport

        merged = ABReport(op="calls", against=reports[0].against, rows=rows, band=reports[0].band)
        if json_out is not None:
            merged.save(json_out)
        if png is not None and merged.plot(png) is None:
            console.print("[yellow]matplotlib is not installed: no PNG[/]")


@app.command("shrink")
def shrink_cmd(
    op: Optional[str] = typer.Argument(None, help="The op's name in the tuning database (e.g. tiletune.gemm)."),
    recording: Optional[List[Path]] = typer.Option(None, "--recording", exists=True, dir_okay=False, readable=True,
                                                   help="Recorded spaces instead of the database (repeatable; "
                                                        "each is one key)."),
    path: Optional[Path] = typer.Option(None, help=_PATH_HELP),
    tolerance: float = typer.Option(0.02, min=0.0, max=0.99, help="Allowed loss per key vs the full space's best."),
    max_configs: int = typer.Option(8, min=1, help="Most configs per architecture."),
    verify: bool = typer.Option(True, help="A/B the shrunk space against each key's best by replaying the records."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the result as JSON here."),
    space: Optional[str] = typer.Option(None, help="Space hash (or prefix) to shrink when the op was tuned over "
                                                   "several spaces (default: each in turn)."),
) -> None:
    """Choose the fewest configs per architecture within a tolerance of the full space's best on every key."""
    from tiletune.lab import shrink as sh

    if (op is None) == (not recording):
        _fail("give an op name (database) or --recording FILE (one of them)")
    if json_out is not None:
        _check_out_file(json_out, "--json")
    if recording:
        groups = {"": sh.tables_from_recordings(recording)}
    else:
        db = _open_db(path, must_exist=True)
        if space is None:
            groups = sh.tables_by_space(db, op)
            if not groups:
                _fail(f"{db.where}: no tuning results for {op!r}")
        else:
            try:
                groups = {space: sh.tables_from_db(db, op, space)}
            except ValueError as exc:
                _fail(str(exc))
    doc: dict[str, Any] = {"source": op or [str(r) for r in recording or []]}
    per_space = {}
    for h, tables in groups.items():
        if len(groups) > 1:
            console.print(safe(f"space {h[:12]} ({op} was tuned over {len(groups)} spaces; each is shrunk on its own)"))
        per_space[h] = _shrink_tables(sh, tables, tolerance, max_configs, verify)
    if len(per_space) == 1:
        doc.update(next(iter(per_space.values())))
    else:
        doc["spaces"] = per_space
    if json_out is not None:
        json_out.write_text(json.dumps(doc, indent=1, allow_nan=False, default=str) + "\n")


def _shrink_tables(sh: Any, tables: dict, tolerance: float, max_configs: int, verify: bool) -> dict[str, Any]:
    """Shrink one space's per-arch tables; print the summary and the Space code; return the JSON part."""
    results = {a: sh.shrink(t, tolerance, max_configs) for a, t in tables.items()}
    doc: dict[str, Any] = {"archs": {}}
    for a, r in sorted(results.items()):
        console.print(safe(f"{a}: {r.keys} key(s), {r.configs_before} -> {len(r.configs)} config(s), worst loss "
                           f"{100 * r.worst_loss:.2f}% ({'within' if r.met else 'NOT within'} "
                           f"{100 * tolerance:g}%); {r.method}"))
        for key, loss in sorted(r.losses.items(), key=lambda kv: -kv[1]):
            console.print(safe(f"  {100 * loss:6.2f}%  {key[:110]}"))
        d = r.as_dict()
        if verify:
            v = sh.verify_replay(tables[a], r)
            d["ab_replay"] = v
            console.print(safe(f"  A/B by replay (shrunk pick / full best): geomean {v['geomean']:.3f}"))
        doc["archs"][a] = d
    code = sh.space_code(results, comment=f"tiletune shrink: tolerance {tolerance:g}, <= {max_configs} per arch")
    doc["space_code"] = code
    typer.echo(code)
    return doc


# ---------------------------------------------------------------------------------------- recording


@recording_app.command("import")
def recording_import(
    src: Path = typer.Argument(..., exists=True, dir_okay=False, readable=True,
                               help="A Kernel Tuner cache file or a T4 results file (or a tiletune recording)."),
    dest: Path = typer.Argument(..., help="The tiletune recording to write (.json or .json.gz)."),
    arch: str = typer.Option("unknown", help="Architecture of the device, e.g. sm_90 (the files do not name it)."),
    device: Optional[str] = typer.Option(None, help="Device name for T4 files (they do not name it)."),
) -> None:
    """Convert a public recorded space to a tiletune recording (replayable, searchable)."""
    from tiletune.lab.recordings import import_recording

    if arch != "unknown" and not re.fullmatch(r"sm_\d+[a-z]?", arch):
        _fail(f"--arch {arch!r} is not an architecture", hint="give it as sm_XX, e.g. sm_90 (H100/H200), "
                                                              "sm_100 (B200), sm_80 (A100), or leave it out")
    if not dest.name.endswith((".json", ".json.gz")):
        _fail(f"DEST {dest}: a recording is written as .json or .json.gz", hint=f"e.g. {dest.with_suffix('.json')}")
    _check_out_file(dest, "DEST")
    # checks the destination (never the source, also through a link), validates the whole source and
    # that it makes a space, keeps its date, then writes atomically
    rec = import_recording(src, dest, arch=arch, device=device or "unknown")
    ok = sum(1 for m in rec.measurements if not m.status.failed)
    console.print(safe(f"{dest}: {len(rec.measurements)} configs ({ok} ok) over {', '.join(rec.param_values)}; "
                       f"scored by {rec.truth} (kept: {', '.join(rec.truths)})"))


# ---------------------------------------------------------------------------------------- db


def _open_db(path: Optional[Path], *, must_exist: bool) -> Any:
    """The tuning database at ``path`` (or the default one); refuses a directory, and a missing
    file when ``must_exist`` (reading commands never create a database)."""
    from tiletune.store import TuningDB, default_db_path

    p = Path(path) if path is not None else Path(default_db_path())
    origin = "--path" if path is not None else ("TILETUNE_DB" if settings.db_path() else "the default database")
    if p.is_dir():
        _fail(f"{p} is a directory, not a tuning database file",
              hint=f"{origin} takes the database file itself, e.g. {p / 'tuning.db'}")
    if must_exist and not p.exists():
        if path is not None or settings.db_path():
            hint = f"check {origin}; tuning or 'tiletune db import' creates a database"
        else:
            hint = "nothing was tuned with the default database yet"
        _fail(f"no tuning database at {p}", hint=hint)
    return TuningDB(p)


@db_app.command("stats")
def db_stats(path: Optional[Path] = typer.Option(None, help=_PATH_HELP)) -> None:
    """Counts (sessions, measurements, winners, leases, progress rows of unfinished sessions) and size
    of the tuning database."""
    console.print_json(json.dumps(_open_db(path, must_exist=True).stats(), default=str))


@db_app.command("list")
def db_list(
    path: Optional[Path] = typer.Option(None, help=_PATH_HELP),
    name: Optional[str] = typer.Option(None, help="Only the winners of the op with this name."),
) -> None:
    """One line per stored winner."""
    winners = _open_db(path, must_exist=True).winners(name=name)
    table = Table()
    for col in ("op", "device", "key", "winner", "median"):
        table.add_column(col)
    for w in winners:
        table.add_row(safe(w.identity.name), safe(w.identity.device.name), safe(w.identity.key[:60]),
                      safe(json.dumps(w.config)), f"{w.median_us:.2f} us")
    console.print(table)
    if not winners:
        console.print(safe("no stored winners" + (f" named {name!r}" if name is not None else "")))


@db_app.command("export")
def db_export(
    dest: Path = typer.Argument(..., help="The JSON file to write (replaced if it exists; .gz for gzip with --table)."),
    path: Optional[Path] = typer.Option(None, help=_PATH_HELP),
    name: Optional[str] = typer.Option(None, help="Only the sessions of the op with this name."),
    table: bool = typer.Option(False, "--table", help="Write a tuning table (winners only, one device and one "
                               "set of versions), for 'tiletune db import --table' on other machines."),
    pins: bool = typer.Option(False, "--pins", help="Write a pins file of the winners (exact keys, per "
                              "architecture), for TILETUNE_PINS: pinned keys are never tuned."),
) -> None:
    """Write sessions (measurements, winners) as JSON, the winners as a tuning table, or as pins."""
    _check_out_file(dest, "DEST")
    if table and pins:
        _fail("give --table or --pins, not both")
    db = _open_db(path, must_exist=True)
    if pins:
        from tiletune.resolve.pins import PinFile

        pf = PinFile.from_db(db, name=name)
        pf.save(dest)
        console.print(safe(f"wrote {len(pf)} pin(s) to {dest}; use them with TILETUNE_PINS={dest}"))
        return
    if table:
        from tiletune.resolve.tables import TuningTable

        t = TuningTable.from_db(db, name=name)
        t.save(dest)
        console.print(safe(f"wrote a tuning table of {len(t)} winner(s) for {t.device.name} ({t.device.arch}) "
                           f"to {dest}"))
        return
    n = db.export_json(dest, name=name)
    console.print(safe(f"exported {n} session(s) to {dest}"))


@db_app.command("import")
def db_import(
    src: Path = typer.Argument(..., exists=True, dir_okay=False, readable=True,
                               help="A JSON export written by 'tiletune db export' (with --table: a tuning table)."),
    path: Optional[Path] = typer.Option(None, help=_PATH_HELP + " Created if missing."),
    table: bool = typer.Option(False, "--table", help="Install a tuning table: validated, then copied into the "
                               "user's table folder, consulted after the database on the device it was made for."),
) -> None:
    """Read sessions from a JSON export (sessions already present are skipped), or install a tuning table."""
    if table:
        from tiletune.resolve.tables import TuningTable, install

        dest = install(src)
        t = TuningTable.load(dest)
        console.print(safe(f"installed a tuning table of {len(t)} winner(s) for {t.device.name} ({t.device.arch}) "
                           f"as {dest}"))
        return
    n = _open_db(path, must_exist=False).import_json(src)
    console.print(safe(f"imported {n} new session(s) from {src}"))


@db_app.command("clear")
def db_clear(
    path: Optional[Path] = typer.Option(None, help=_PATH_HELP),
    yes: bool = typer.Option(False, "--yes", help="Do not ask for confirmation."),
) -> None:
    """Delete every record."""
    db = _open_db(path, must_exist=True)
    if not yes:
        try:
            typer.confirm(f"delete every record in {escape_controls(db.where)}?", abort=True)
        except _ABORTS:
            _fail("not confirmed: nothing was deleted", hint="pass --yes to delete without the question", code=1)
    console.print(f"removed {db.clear()} row(s)")


# ---------------------------------------------------------------------------------------- doctor


def _fault_events_row(device_index: int) -> str:
    """Whether the tuning watchdog can read the GPU's fault events (NVML Xids, :mod:`tiletune.devices.xid`)."""
    from tiletune.devices import xid

    if xid.watch_for(device_index) is not None:
        return "readable (NVML Xid events): a check whose kernel faults but reports late is ruled a fault, not a hang"
    return ("not readable (needs nvidia-ml-py and NVML events): a kernel fault reported after its check's "
            "deadline is ruled a hang")


@app.command()
def doctor() -> None:
    """Report what tiletune sees: Python packages, GPU, cuTile toolchain, database, environment."""
    from tiletune.store import default_db_path

    rows = []
    try:
        import torch

        rows.append(("torch", torch.__version__))
        gpu = torch.cuda.is_available()
        rows.append(("GPU", torch.cuda.get_device_name() if gpu else "none"))
        if gpu:
            rows.append(("GPU fault events", _fault_events_row(torch.cuda.current_device())))
    except Exception as exc:
        rows.append(("torch", f"missing ({exc})"))
    try:
        from tiletune.devices.backends.cutile import software_versions

        for k, v in software_versions().items():
            rows.append((k, v))
    except Exception as exc:
        rows.append(("cuda-tile", f"missing ({exc})"))
    from tiletune.devices.compile_pool import CompilePool, cpu_count

    try:
        pool = CompilePool()
        rows.append(("parallel compile", f"yes, {cpu_count()} workers" if pool.parallel else f"no: {pool.why_serial}"))
    except Exception as exc:
        rows.append(("parallel compile", f"no: {exc}"))
    try:
        rows.append(("database", str(default_db_path())))
    except Exception as exc:
        rows.append(("database", f"unknown ({exc})"))
    problems = settings.check_all()
    try:
        db = default_db_path()
        if db.is_dir():
            via = "TILETUNE_DB" if settings.db_path() else "the default database path"
            problems.append(f"{via} names {db}, a directory: give the database file (e.g. {db / 'tuning.db'})")
    except Exception:  # already in problems (an invalid variable) or in the database row
        pass
    rows.append(("environment", "; ".join(problems) if problems else "ok"))
    table = Table(show_header=False)
    for k, v in rows:
        table.add_row(safe(k), safe(v))
    console.print(table)


if __name__ == "__main__":  # pragma: no cover
    app()
