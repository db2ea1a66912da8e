"""Filling a database ahead of time (tiletune.lab.fill, ``tiletune tune``) on the fake backend."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
from typer.testing import CliRunner  # noqa: E402

from tiletune.lab import fill  # noqa: E402
from tiletune.cli import app  # noqa: E402
from tiletune.store import TuningDB  # noqa: E402

HELPERS = Path(__file__).parent / "helpers"


@pytest.fixture(autouse=True)
def helpers_on_path(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(HELPERS))
    monkeypatch.setenv("TILETUNE_DB", str(tmp_path / "fill.db"))
    sys.modules.pop("fill_ops", None)
    yield
    sys.modules.pop("fill_ops", None)


def spec_file(tmp_path, calls, name="spec.json"):
    p = tmp_path / name
    p.write_text(json.dumps({"calls": calls}))
    return p


def test_a_fill_tunes_each_key_once_and_resumes(tmp_path):
    calls = [{"op": "fill_ops:double", "args": [{"shape": [n]}, {"shape": [n]}]} for n in (8, 16, 8)]
    report = fill.run_calls(fill.load_spec(spec_file(tmp_path, calls)), device="cpu", progress=False)
    assert report.failed == 0 and len(report.rows) == 3
    import fill_ops

    assert fill_ops.double.tuning_count == 2
    assert len(TuningDB(tmp_path / "fill.db").winners()) == 2
    # a new process (a fresh op) finds every key in the database: nothing is tuned again
    sys.modules.pop("fill_ops")
    report = fill.run_calls(fill.load_spec(spec_file(tmp_path, calls)), device="cpu", progress=False)
    import fill_ops as again

    assert report.failed == 0 and again.double.tuning_count == 0


def test_a_failing_call_is_reported_and_the_fill_goes_on(tmp_path):
    calls = [{"op": "fill_ops:boom", "args": [{"shape": [4]}]},
             {"op": "fill_ops:nope", "args": []},
             {"op": "fill_ops:double", "args": [{"shape": [4]}, {"shape": [4], "fill": "zeros"}]}]
    report = fill.run_calls(fill.load_spec(spec_file(tmp_path, calls)), device="cpu", progress=False)
    assert [r["ok"] for r in report.rows] == [False, False, True]
    assert report.rows[0]["error"] == "RuntimeError: this op always fails"
    assert "has no 'nope'" in report.rows[1]["error"]


@pytest.mark.parametrize("doc,message", [
    ({}, "expected {\"calls\": [...]}"),
    ({"calls": [{"op": "nocolon"}]}, "calls[0]: expected an object with \"op\""),
    ({"calls": [{"op": "a:b", "args": [{"shape": [-1]}]}]}, "calls[0].args[0].shape: expected a list of non-negative"),
    ({"calls": [{"op": "a:b", "args": [{"shape": [2], "fill": "ones"}]}]}, "calls[0].args[0].fill"),
    ({"calls": [{"op": "a:b", "extra": 1}]}, "unknown field(s) ['extra']"),
    ({"calls": [{"op": "a:b", "args": [{"shape": [2], "size": 3}]}]}, "unknown field(s) ['size']"),
])
def test_spec_errors_name_the_field(tmp_path, doc, message):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(ValueError) as err:
        fill.load_spec(p)
    assert message in str(err.value)


def test_nan_in_a_spec_is_refused(tmp_path):
    p = tmp_path / "nan.json"
    p.write_text('{"calls": [{"op": "a:b", "args": [NaN]}]}')
    with pytest.raises(ValueError, match="not valid JSON: NaN is not allowed"):
        fill.load_spec(p)


def test_llm_calls_build_the_library_shapes():
    calls = fill.llm_calls(fill.LLM_OPS, [1, 8], hidden=64, intermediate=96, heads=4, kv_heads=2, head_dim=16,
                           vocab=100)
    assert len(calls) == 2 * len(fill.LLM_OPS)
    by_op = {c.op.split(":")[1]: c for c in calls}  # the last call of each op: 8 tokens
    assert by_op["swiglu"].args[0]["shape"] == [8, 192]
    assert by_op["attention"].args[1]["shape"] == [1, 2, 8, 16] and by_op["attention"].kwargs == {"causal": True}
    assert by_op["cross_entropy"].args[1] == {"shape": [8], "dtype": "int64", "fill": "randint:100"}
    # every library op named exists
    import tiletune.kernels as K

    assert all(op in K.__all__ for op in fill.LLM_OPS)
    with pytest.raises(ValueError, match=">= 1"):
        fill.llm_calls(["rms_norm"], [0])


def test_projections_and_model_shapes():
    q = fill.MODEL_SHAPES["qwen2.5-7b"]
    calls = fill.llm_calls(["matmul"], [8], projections=True, **q)
    shapes = [(c.args[0]["shape"], c.args[1]["shape"]) for c in calls]
    assert shapes == [([8, 3584], [3584, (28 + 2 * 4) * 128]), ([8, 28 * 128], [28 * 128, 3584]),
                      ([8, 3584], [3584, 2 * 18944]), ([8, 18944], [18944, 3584])]
    assert [c.args[1]["shape"] for c in fill.llm_calls(["matmul"], [8])] == [[4096, 4096]]  # default unchanged
    (ce,) = fill.llm_calls(["cross_entropy"], [2], **fill.MODEL_SHAPES["llama3-8b"])
    assert ce.args[0]["shape"] == [2, 128256]


def test_linear_weights_are_transposed_views_of_n_by_k_weights():
    calls = fill.llm_calls(["matmul"], [8], projections=True, linear_weights=True,
                           **fill.MODEL_SHAPES["llama3-8b"])
    # q, k (= v), o, gate (= up), down: each (K, N) once, weights read as w.t()
    assert [c.args[1]["shape"] for c in calls] == [[4096, 4096], [4096, 1024], [4096, 14336], [14336, 4096]]
    assert all(c.args[1]["transposed"] is True and "transposed" not in c.args[0] for c in calls)
    assert calls[1].describe() == ("tiletune.kernels:matmul(8x4096:bfloat16, 4096x1024:bfloat16:transposed)")
    (one,) = fill.llm_calls(["matmul"], [2], linear_weights=True)
    assert one.args[1] == {"shape": [4096, 4096], "dtype": "bfloat16", "fill": "normal", "transposed": True}
    gen = torch.Generator().manual_seed(0)
    w = fill._materialize({"shape": [3, 5], "dtype": "float32", "transposed": True}, "cpu", gen)
    assert w.shape == (3, 5) and w.stride() == (1, 3) and w.t().is_contiguous()
    assert torch.isfinite(w).all() and w.abs().sum() > 0  # filled through the view
    b = fill._materialize({"shape": [2, 3, 4], "dtype": "int64", "fill": "randint:7", "transposed": True}, "cpu", gen)
    assert b.shape == (2, 3, 4) and b.transpose(-1, -2).is_contiguous() and 0 <= int(b.min()) and int(b.max()) < 7


@pytest.mark.parametrize("bad, msg", [({"shape": [4], "transposed": True}, "two or more dimensions"),
                                      ({"shape": [4, 4], "transposed": "yes"}, "expected true or false")])
def test_transposed_spec_errors(tmp_path, bad, msg):
    p = spec_file(tmp_path, [{"op": "a:b", "args": [bad]}])
    with pytest.raises(ValueError, match=msg):
        fill.load_spec(p)


def test_cli_tune_model_and_projections(monkeypatch):
    import tiletune.lab.fill as fill_mod

    seen = []

    def fake_run(calls, device="cuda", on_row=None):
        seen.extend(calls)
        return fill_mod.FillReport(rows=[])

    monkeypatch.setattr(fill_mod, "run_calls", fake_run)
    monkeypatch.setattr("tiletune.cli._gpu_available", lambda: True)  # run_calls is faked: no GPU needed
    r = CliRunner().invoke(app, ["tune", "matmul", "rms_norm", "--model", "qwen2.5-7b", "--projections",
                                 "--tokens", "4", "--hidden", "3584"])
    assert r.exit_code == 0, r.output
    assert [c.args[1]["shape"] for c in seen[:4]] == [[3584, 4608], [3584, 3584], [3584, 37888], [18944, 3584]]
    assert seen[4].args[0]["shape"] == [4, 3584]
    seen.clear()
    r = CliRunner().invoke(app, ["tune", "matmul", "--model", "llama3-8b", "--projections", "--linear-weights",
                                 "--tokens", "4"])
    assert r.exit_code == 0, r.output
    assert [(c.args[1]["shape"], c.args[1].get("transposed")) for c in seen] == [
        ([4096, 4096], True), ([4096, 1024], True), ([4096, 14336], True), ([14336, 4096], True)]
    r = CliRunner().invoke(app, ["tune", "matmul", "--model", "gpt-5"])
    assert r.exit_code == 2 and "unknown model" in r.output


def test_llm_call_tensors_match_the_ops_on_meta():
    """The library ops' own checks accept every shape llm_calls builds (run on meta tensors up to the device check)."""
    pytest.importorskip("cuda.tile")
    calls = fill.llm_calls(fill.LLM_OPS, [8]) + fill.llm_calls(["matmul"], [8], projections=True, linear_weights=True)
    for call in calls:
        args = [fill._materialize(a, "meta", None) for a in call.args]
        fn = fill.resolve_op(call.op)
        with pytest.raises(ValueError, match="CUDA"):  # the shapes pass; only the device is refused
            fn(*args, **call.kwargs)


def test_cli_tune(tmp_path):
    runner = CliRunner()
    spec = spec_file(tmp_path, [{"op": "fill_ops:double", "args": [{"shape": [4]}, {"shape": [4]}]}])
    out = tmp_path / "report.json"
    r = runner.invoke(app, ["tune", "--spec", str(spec), "--device", "cpu", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "1 of 1 call(s) tuned or found" in r.output
    assert json.loads(out.read_text())["failed"] == 0
    r = runner.invoke(app, ["tune"])
    assert r.exit_code == 2 and "nothing to tune" in r.output
    r = runner.invoke(app, ["tune", "rms_norm", "--spec", str(spec)])
    assert r.exit_code == 2 and "not both" in r.output
    r = runner.invoke(app, ["tune", "rmsnorm"])
    assert r.exit_code == 2 and "unknown library op(s) 'rmsnorm'" in r.output
    r = runner.invoke(app, ["tune", "rms_norm", "--tokens", "1,x"])
    assert r.exit_code == 2 and "comma-separated integers" in r.output
    bad = spec_file(tmp_path, [{"op": "fill_ops:boom", "args": [{"shape": [4]}]}], name="bad.json")
    r = runner.invoke(app, ["tune", "--spec", str(bad), "--device", "cpu"])
    assert r.exit_code == 1 and "1 call(s) failed" in r.output


def test_fused_linear_weight_projections_are_the_shapes_nearest_quality_draws():
    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    if str(bench) not in sys.path:
        sys.path.insert(0, str(bench))
    from offgrid import MODEL_DIMS, projection

    for model in ("llama3-8b", "qwen2.5-7b", "gemma2-9b", "phi3-mini"):
        dims = fill.MODEL_SHAPES[model]
        calls = fill.llm_calls(["matmul"], [8], projections=True, linear_weights=True, fused=True, **dims)
        # a (M, K) @ w.t() with w an (N, K) nn.Linear weight: the call's second argument is w.t(), shape (K, N)
        got = [(c.args[1]["shape"][1], c.args[1]["shape"][0]) for c in calls]
        assert got == [projection(MODEL_DIMS[model], p) for p in ("qkv", "o", "gate_up", "down")], model
        assert all(c.args[1]["transposed"] is True for c in calls)
    # without linear weights, fused changes nothing (the projections are fused already)
    q = fill.MODEL_SHAPES["qwen2.5-7b"]
    assert ([c.describe() for c in fill.llm_calls(["matmul"], [8], projections=True, fused=True, **q)]
            == [c.describe() for c in fill.llm_calls(["matmul"], [8], projections=True, **q)])


def test_make_table_fills_several_models_in_one_call_each_shape_once():
    bench = Path(__file__).resolve().parent.parent / "benchmarks"
    if str(bench) not in sys.path:
        sys.path.insert(0, str(bench))
    import make_table

    calls = [c for m in ("llama3-8b", "mistral-7b")
             for c in fill.llm_calls(["matmul"], [512], projections=True, linear_weights=True, fused=True,
                                     **fill.MODEL_SHAPES[m])]
    once = make_table.unique_calls(calls)
    assert len(calls) == 8 and len(once) == 4  # Mistral-7B's projections are Llama-3-8B's
    assert [c.describe() for c in once] == [c.describe() for c in calls[:4]]
