"""Campaigns (tiletune.lab.campaign, ``tiletune campaign``) on the CPU with the fake backend: specs, the local
pool of worker processes, streaming into the caller's database, resuming (also after SIGKILL), reports."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from typer.testing import CliRunner  # noqa: E402

import tiletune as tt  # noqa: E402
from tiletune.lab import campaign  # noqa: E402
from tiletune.resolve import chain as tuning
from tiletune.devices.backends import FakeBackend  # noqa: E402
from tiletune.lab.campaign import compare_picks, load_campaign, parse_campaign, run_campaign, worker_slots  # noqa: E402
from tiletune.cli import _fill_optional_values, app  # noqa: E402
from tiletune.op.tuned_op import first_launch  # noqa: E402
from tiletune.records import Measurement, Status, TuningIdentity, DeviceInfo  # noqa: E402
from tiletune.store import TuningDB  # noqa: E402

HELPERS = Path(__file__).parent / "helpers"
SRC = Path(__file__).resolve().parents[1] / "src"

SPEC = """
device = "cpu"
[[ops]]
op = "campaign_ops:double"
args = [{shape = ["N"]}, {shape = ["N"], fill = "zeros"}]
shapes = {N = [8, 16, 32]}
[[ops]]
op = "campaign_ops:scale"
args = [{shape = ["M", "N"]}, {shape = ["M", "N"]}]
shapes = [{M = 2, N = 8}, {M = 4, N = 8}]
dtypes = ["float32", "float64"]
strategy = "random"
budget = {evals = 3}
[[ops]]
op = "campaign_ops:boom"
args = [{shape = [4]}]
"""


@pytest.fixture(autouse=True)
def helpers_on_path(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(HELPERS))
    monkeypatch.setenv("TILETUNE_DB", str(tmp_path / "default.db"))
    sys.modules.pop("campaign_ops", None)
    yield
    sys.modules.pop("campaign_ops", None)


def write(tmp_path, text, name="spec.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


# ------------------------------------------------------------------------------------------ specs


def test_a_spec_expands_into_tasks(tmp_path):
    spec = load_campaign(write(tmp_path, SPEC))
    assert spec.device == "cpu" and spec.name == "spec"
    ids = [t.id for t in spec.tasks]
    assert ids[:3] == [f"campaign_ops:double({n}:float32, {n}:float32)" for n in (8, 16, 32)]
    assert ids[3:7] == ["campaign_ops:scale(2x8:float32, 2x8:float32)", "campaign_ops:scale(4x8:float32, 4x8:float32)",
                        "campaign_ops:scale(2x8:float64, 2x8:float64)", "campaign_ops:scale(4x8:float64, 4x8:float64)"]
    scale = spec.tasks[3]
    assert scale.strategy == "random" and scale.budget == tt.Budget(max_evals=3) and scale.label == "campaign_ops:scale"
    assert spec.tasks[0].call.args[1] == {"shape": [8], "fill": "zeros"}
    # tasks travel as JSON
    again = campaign.Task.from_json(json.loads(json.dumps(scale.as_json())))
    assert again == scale


def test_library_ops_take_llm_dimensions_and_duplicates_go():
    spec = parse_campaign({
        "defaults": {"tokens": [1, 16], "dtypes": ["bfloat16"], "budget": {"seconds": 30}},
        "ops": [{"op": "rms_norm", "hidden": [64, 128]},
                {"op": "tiletune.kernels:swiglu", "intermediate": 96, "hidden": [64, 128]},  # hidden: ignored
                {"op": "rms_norm", "hidden": 64}]})  # the same calls again
    ids = [t.id for t in spec.tasks]
    assert len(ids) == 4 + 2
    assert ids[0] == "tiletune.kernels:rms_norm(1x64:bfloat16, 64:bfloat16)"
    assert "tiletune.kernels:swiglu(16x192:bfloat16)" in ids
    assert all(t.budget == tt.Budget(max_seconds=30) for t in spec.tasks)
    assert {t.label for t in spec.tasks} == {"tiletune.kernels:rms_norm", "tiletune.kernels:swiglu"}


def test_dimension_values_and_dtypes_bind():
    spec = parse_campaign({"ops": [{"op": "m:f", "args": [{"shape": ["M", 4]}, {"dim": "M"}, "text"],
                                    "kwargs": {"w": {"shape": ["M"], "dtype": "int32"}},
                                    "shapes": {"M": [2, 3]}, "dtypes": ["float16"]}]})
    call = spec.tasks[1].call
    assert call.args == ({"shape": [3, 4], "dtype": "float16"}, 3, "text")
    assert call.kwargs == {"w": {"shape": [3], "dtype": "int32"}}


def test_yaml_specs(tmp_path):
    pytest.importorskip("yaml")
    p = write(tmp_path, "device: cpu\nops:\n  - op: rms_norm\n    tokens: [1, 2]\n    hidden: 64\n", "spec.yaml")
    assert len(load_campaign(p).tasks) == 2


@pytest.mark.parametrize("doc,message", [
    ({}, "expected at least one [[ops]] entry"),
    ({"ops": [], "extra": 1}, "unknown field(s) ['extra']"),
    ({"ops": [{"op": "rmsnorm"}]}, "ops[0].op: 'rmsnorm' is neither a library op"),
    ({"ops": [{"op": "rms_norm", "tokens": [0]}]}, "ops[0].tokens[0]: expected an integer >= 1"),
    ({"ops": [{"op": "rms_norm", "shapes": {"M": [1]}}]}, "a library op takes LLM dimensions"),
    ({"ops": [{"op": "m:f", "args": [{"shape": ["K"]}], "shapes": {"M": [1]}}]},
     "ops[0].args[0].shape[0]: unknown dimension 'K'"),
    ({"ops": [{"op": "m:f", "args": [], "tokens": 4}]}, "tokens are dimensions of the library ops"),
    ({"ops": [{"op": "m:f", "budget": {"evals": 0}}]}, "ops[0].budget: Budget.max_evals must be a positive int"),
    ({"ops": [{"op": "m:f", "budget": {"calls": 3}}]}, "ops[0].budget: expected {evals = N, seconds = S}"),
    ({"ops": [{"op": "m:f", "strategy": "nope"}]}, "ops[0].strategy:"),
    ({"ops": [{"op": "m:f", "colour": 1}]}, "ops[0]: unknown field(s) ['colour']"),
    ({"ops": [{"op": "m:f", "args": [{"shape": [2], "fill": "ones"}]}]}, "ops[0].args[0].fill"),
    ({"ops": [{"op": "m:f", "dtypes": "float16"}]}, "ops[0].dtypes: expected a non-empty list"),
])
def test_spec_errors_name_the_field(doc, message):
    with pytest.raises(ValueError) as err:
        parse_campaign(doc, "s.toml")
    assert message in str(err.value)


def test_bad_spec_files(tmp_path):
    with pytest.raises(ValueError, match="not valid TOML"):
        load_campaign(write(tmp_path, "[[ops]\n"))
    with pytest.raises(ValueError, match="is a .toml, .yaml/.yml or .json file"):
        load_campaign(write(tmp_path, "{}", "spec.txt"))


def test_worker_slots_on_the_cpu():
    assert worker_slots(None, "cpu") == [None]
    assert worker_slots("3", "cpu") == [None] * 3
    assert worker_slots("0,1", "cpu") == [None, None]
    for bad in ("0", "x", "1,1", "-1,"):
        with pytest.raises(ValueError, match="--gpus"):
            worker_slots(bad, "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU is visible"):
            worker_slots(None, "cuda")


# ------------------------------------------------------------------------------------------ pieces


def _op(backend=None, **kw):
    backend = backend or FakeBackend(lambda cfg: 100.0 - cfg.K, noise=0.0)

    @tt.autotune(tt.Space(K=[0, 1, 2, 3], baseline=dict(K=0)), reference=lambda x, y: x * 2, writes=["y"],
                 backend=backend, progress=False, **kw)
    def op(cfg, x, y):
        return tt.Launch(lambda a, b: b.copy_(a * 2), (1,), (x, y))

    return op, backend


def test_first_launch_stops_before_anything_runs():
    op, backend = _op(db=False)
    x, y = torch.ones(4), torch.zeros(4)
    hit = first_launch(lambda a, b: op(a, b) and None, x, y)
    assert hit is not None and hit.op is op and hit.key is None and hit.args == (x, y)
    assert op.tuning_count == 0 and backend.launches == [] and bool((y == 0).all())
    op(x, y)  # tunes
    n = len(backend.launches)
    hit = first_launch(op, x, y)
    assert hit.key is not None and len(backend.launches) == n  # a cached key is not launched either
    assert first_launch(lambda: 3) is None


def test_precompile_skips_backends_that_compile_nothing():
    op, _ = _op(db=False)
    from tiletune.lab.campaign.runner import precompile

    assert precompile(op, (torch.ones(2), torch.zeros(2)), {}) == {"skipped": "the fake backend compiles nothing ahead"}


def test_miss_scope_overrides_the_search_and_lists_what_was_resolved(tmp_path):
    db = TuningDB(tmp_path / "s.db")
    op, _ = _op(db=db)
    x, y = torch.ones(4), torch.zeros(4)
    with tuning.miss_scope(strategy="random", budget=tt.Budget(max_evals=2), seed=5) as scope:
        op(x, y)
    (r,) = scope.resolved
    assert r.source == "tuned" and r.op == op.name and len(r.result.measurements) == 2
    assert r.result.stats["strategy"] == "random"
    again, _ = _op(db=db)
    with tuning.miss_scope() as scope:
        again(x, y)
    assert [s.source for s in scope.resolved] == ["database"] and again.tuning_count == 0
    with pytest.raises(ValueError):
        with tuning.miss_scope(strategy="no-such-strategy"):
            pass


def test_export_of_chosen_sessions(tmp_path):
    db = TuningDB(tmp_path / "e.db")
    ident = lambda k: TuningIdentity("k", "s", json.dumps([k]), DeviceInfo("d", "sm_90", 1), "{}", "n")  # noqa: E731
    m = Measurement({"K": 1}, Status.OK, samples_us=(2.0,))
    ids = [db.record_session(ident(k), [m], {"K": 1}, 2.0) for k in range(3)]
    buf = io.StringIO()
    assert db.export_json(buf, session_ids=ids[1:]) == 2
    assert [s["session_id"] for s in json.loads(buf.getvalue())["sessions"]] == ids[1:]
    assert db.export_json(io.StringIO(), session_ids=[]) == 0


def test_compare_picks(tmp_path):
    def db_with(name, picks):
        db = TuningDB(tmp_path / f"{name}.db")
        for k, (win, meds) in picks.items():
            ident = TuningIdentity("k", "s", json.dumps([k]), DeviceInfo("d", "sm_90", 1), "{}", "op")
            ms = [Measurement({"K": c}, Status.OK, samples_us=(us,)) for c, us in meds.items()]
            db.record_session(ident, ms, {"K": win}, meds[win], [])
        return db

    a = db_with("a", {1: (0, {0: 10.0, 1: 10.2, 2: 20.0}), 2: (0, {0: 10.0, 2: 20.0}), 3: (1, {1: 5.0, 2: 9.0})})
    b = db_with("b", {1: (1, {0: 10.3, 1: 10.1}), 2: (2, {0: 30.0, 2: 19.0}), 3: (1, {1: 5.1})})
    got = compare_picks(a, b)
    verdicts = sorted(r["verdict"] for r in got["rows"])
    assert verdicts == ["differ", "same", "tied"] and not got["same_or_tied"]
    assert got["keys"] == 3 and got["same"] == 1 and got["tied"] == 1 and got["differ"] == 1


def test_optional_value_of_ray(tmp_path):
    spec = write(tmp_path, SPEC)
    assert _fill_optional_values(["campaign", "s.toml", "--ray"]) == ["campaign", "s.toml", "--ray", "default"]
    assert _fill_optional_values(["campaign", "--ray", "--gpus", "2"]) == ["campaign", "--ray", "default", "--gpus", "2"]
    assert _fill_optional_values(["campaign", "--ray", str(spec)]) == ["campaign", "--ray", "default", str(spec)]
    assert _fill_optional_values(["campaign", "s.toml", "--ray", "h:6379"]) == ["campaign", "s.toml", "--ray", "h:6379"]


# ------------------------------------------------------------------------------------------ the local pool


def test_a_campaign_on_two_workers_streams_into_the_database_and_resumes(tmp_path):
    spec = load_campaign(write(tmp_path, SPEC))
    db = TuningDB(tmp_path / "c.db")
    seen = []
    first = run_campaign(spec, db=db, gpus=2, out=tmp_path / "report", on_result=lambda r, t: seen.append(r["worker"]))
    rep = first.report
    assert (rep["tasks"], rep["tuned"], rep["stored"], rep["failed"]) == (8, 7, 0, 1)
    # two workers were started (the first one up may run every task of this tiny campaign)
    assert {w["worker"] for w in rep["workers"]} <= {0, 1} and set(seen) <= {0, 1} and rep["workers"]
    assert len(db.winners()) == 7 and len(db.sessions()) == 7
    picks = {r["task"]: r["keys"][0]["config"] for r in rep["rows"] if r["keys"]}
    assert {json.dumps(v, sort_keys=True) for k, v in picks.items() if "double" in k} == {
        json.dumps({"TM": 64, "occupancy": 2}, sort_keys=True)}
    scale = [r for r in rep["rows"] if "scale" in r["task"]]
    assert all(r["keys"][0]["configs"] == 3 and r["strategy"] == "random" for r in scale)  # the budget held
    boom = rep["rows"][-1]
    assert boom["status"] == "failed" and boom["error"] == "RuntimeError: this op always fails"
    assert rep["per_op"]["campaign_ops:double"]["tuned"] == 3
    assert rep["per_op"]["campaign_ops:double"]["geomean_speedup_vs_baseline"] > 1.1
    names = sorted(p.name for p in first.paths)
    assert names[:2] == ["campaign.json", "campaign.md"]
    if _has_matplotlib():
        assert "campaign_timeline.png" in names and "campaign_campaign_ops_double.png" in names
    assert "| campaign_ops:double | 3 | 3 |" in (tmp_path / "report" / "campaign.md").read_text()
    # again: every key is in the database, nothing is tuned, nothing is recorded twice
    again = run_campaign(spec, db=db, gpus=2)
    assert (again.report["tuned"], again.report["stored"], again.report["failed"]) == (0, 7, 1)
    assert len(db.sessions()) == 7
    assert [r["keys"][0]["config"] for r in again.report["rows"] if r["keys"]] == list(picks.values())


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_a_worker_that_dies_fails_its_task_and_is_replaced(tmp_path):
    spec = parse_campaign({"device": "cpu", "ops": [
        {"op": "os:_exit", "args": [3]},
        {"op": "campaign_ops:double", "args": [{"shape": ["N"]}, {"shape": ["N"]}], "shapes": {"N": [4, 8]}}]})
    rep = run_campaign(spec, db=tmp_path / "d.db", gpus=1, lookahead=1).report
    assert [r["status"] for r in rep["rows"]] == ["failed", "tuned", "tuned"]
    assert rep["rows"][0]["error"].startswith("campaign worker 0 died: the worker process ended (exit code 3)")


def _running_in_group(pgid: int) -> bool:
    """Whether a process of the group still runs: an exited one (a zombie until whoever inherited it
    reaps it, which may take seconds in a container) has stopped."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def test_a_sigkilled_campaign_resumes_where_it_stopped(tmp_path):
    """The campaign process is SIGKILLed mid-way: its workers stop with it, the finished tasks are in the
    database, and the next run tunes only the rest."""
    n = 12
    spec = write(tmp_path, f"""
device = "cpu"
[[ops]]
op = "campaign_ops:slow_double"
args = [{{shape = ["N"]}}, {{shape = ["N"]}}]
shapes = {{N = {list(range(1, n + 1))}}}
""")
    dbp = tmp_path / "k.db"
    # each task sleeps in its launches (about 0.9 s a task: the kill lands mid-way, seconds before the
    # last task could end); the resuming run below needs no slow tasks (it checks what is tuned, not when)
    env = dict(os.environ, CAMPAIGN_TEST_SLEEP="0.03", TILETUNE_PROGRESS="0",
               PYTHONPATH=os.pathsep.join([str(SRC), str(HELPERS), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "tiletune.cli", "campaign", str(spec), "--gpus", "2", "--db", str(dbp)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    done = 0
    while time.monotonic() < deadline and proc.poll() is None:
        done = len(TuningDB(dbp).winners()) if dbp.exists() else 0
        if done >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stdout.read().decode()
    assert 3 <= done < n
    proc.kill()  # SIGKILL: no cleanup runs in the campaign process
    proc.wait()
    for _ in range(200):  # its workers notice (their stdin closes) and stop
        if not _running_in_group(proc.pid):
            break
        time.sleep(0.05)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the campaign's workers outlived it")
    stored = len(TuningDB(dbp).winners())
    assert stored >= done
    out = subprocess.run(cmd + ["--json", str(tmp_path / "r.json")], env=dict(env, CAMPAIGN_TEST_SLEEP="0"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    assert (rep["stored"], rep["tuned"], rep["failed"]) == (stored, n - stored, 0)
    db = TuningDB(dbp)
    assert len(db.winners()) == n and len(db.sessions()) == n  # nothing tuned twice


def test_cli_campaign(tmp_path):
    spec = write(tmp_path, SPEC.replace('[[ops]]\nop = "campaign_ops:boom"\nargs = [{shape = [4]}]\n', ""))
    runner = CliRunner()
    r = runner.invoke(app, ["campaign", str(spec), "--gpus", "1", "--db", str(tmp_path / "cli.db"),
                            "--json", str(tmp_path / "r.json"), "--no-precompile"])
    assert r.exit_code == 0, r.output
    assert "7 task(s)" in r.output and "7 tuned" in r.output
    assert json.loads((tmp_path / "r.json").read_text())["tuned"] == 7
    r = runner.invoke(app, ["campaign", str(spec), "--gpus", "x"])
    assert r.exit_code == 2 and "--gpus 'x'" in r.output
    bad = write(tmp_path, "[[ops]]\nop = 3\n", "bad.toml")
    r = runner.invoke(app, ["campaign", str(bad)])
    assert r.exit_code == 2 and "ops[0].op" in r.output


def test_the_benchmark_campaign_is_40_sessions_of_library_ops():
    """benchmarks/campaign.py: >= 40 tasks of memory-bound library ops, in distinct row buckets, whose
    shapes the ops accept (checked on meta tensors, up to the device check)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "campaign.py"
    sys.path.insert(0, str(path.parent))
    try:
        mod_spec = importlib.util.spec_from_file_location("bench_campaign", path)
        bench = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(path.parent))
    full, quick = parse_campaign(bench.spec_doc(False)), parse_campaign(bench.spec_doc(True))
    assert len(full.tasks) >= 40 and len(quick.tasks) == 8
    assert {t.label.split(":")[1] for t in full.tasks} == set(bench.OPS)
    # the token counts are distinct powers of two: no two tasks of an op share a row bucket (one session each)
    assert len(set(bench.TOKENS)) == len(bench.TOKENS) and all(m & (m - 1) == 0 for m in bench.TOKENS)
    pytest.importorskip("cuda.tile")
    from tiletune.lab.fill import _materialize, resolve_op

    for t in full.tasks:
        args = [_materialize(a, "meta", None) for a in t.call.args]
        with pytest.raises(ValueError, match="CUDA"):
            resolve_op(t.call.op)(*args, **t.call.kwargs)
