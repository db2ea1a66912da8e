"""CPU tests of ``benchmarks/first_forward.py`` (issue 40), ``compile_tax.py`` (issue 43), ``offgrid.py``
(issue 42) and their shared layer ``_layer.py``: what decides what a GPU run measures.

* argument parsing (defaults, ``--quick``, refusals);
* seeded shape draws: the same list twice, another seed another list, a quick run a prefix of the full
  one, every shape off the grids and within the caps;
* the user-style layer: with torch stand-ins for ``tiletune.kernels`` (which check the weights arrive as
  ``w.t()`` and RoPE rotates views of the fused qkv output) it equals the plain-torch reference, and a
  decode step over a cache with spare capacity equals the last token of a prefill;
* the torch routes of ``offgrid.py`` agree with each other on CPU;
* each script's ``main`` end to end with its GPU part replaced by fake timings: the JSON it writes holds
  ``gpu``, ``driver``, ``versions`` (torch, cuda-tile, the tiletune commit), ``date`` and the issue's row
  fields.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import _layer as L  # noqa: E402
import compile_tax  # noqa: E402
import first_forward  # noqa: E402
import offgrid  # noqa: E402

torch = pytest.importorskip("torch")
F = torch.nn.functional

ENV_KEYS = ("gpu", "driver", "versions", "date")


def _check_env(doc: dict) -> None:
    for key in ENV_KEYS:
        assert key in doc, key
    v = doc["versions"]
    for key in ("torch", "cuda_tile", "tiletune_commit", "tiletune_src_sha256"):
        assert key in v, key
    assert doc["date"].endswith("Z")


# --------------------------------------------------------------------------------------------
# imports
# --------------------------------------------------------------------------------------------


def test_imports_are_light():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import first_forward, compile_tax, offgrid, json; "
            "print(json.dumps([m for m in ('torch', 'triton', 'cuda.tile', 'tiletune.kernels.gemm') "
            "if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code, str(BENCH)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


# --------------------------------------------------------------------------------------------
# _layer: shapes
# --------------------------------------------------------------------------------------------


def test_layer_shapes_seeded_prefix_and_off_grid():
    a = L.draw_shapes("llama3-8b", 12, 0)
    assert a == L.draw_shapes("llama3-8b", 12, 0)
    assert a != L.draw_shapes("llama3-8b", 12, 1)
    assert a != L.draw_shapes("qwen2.5-7b", 12, 0)
    assert L.draw_shapes("llama3-8b", 4, 0) == a[:4]
    assert [s["phase"] for s in a] == ["prefill", "decode"] * 6
    for s in a:
        if s["phase"] == "prefill":
            assert 1 <= s["B"] <= 4 and 300 <= s["S"] <= 5000
            assert not L.is_pow2(s["S"]) and not L.is_pow2(s["B"] * s["S"])
        else:
            assert 1 <= s["B"] <= 64 and 500 <= s["L"] <= 9000
            assert not L.is_pow2(s["B"]) and not L.is_pow2(s["L"])
            assert s["L"] + 1 < s["capacity"] <= s["L"] + 1 + 512
    assert all(s["phase"] == "decode" for s in L.draw_shapes("llama3-8b", 3, 0, ("decode",)))


def test_layer_dims_of_models():
    d = L.dims("qwen2.5-7b")
    assert (d.hidden, d.heads, d.kv_heads, d.head_dim, d.ffn) == (3584, 28, 4, 128, 18944)
    assert L.dims("llama3-8b").rope_base == 500000.0
    with pytest.raises(ValueError):
        L.dims("gpt-2")


# --------------------------------------------------------------------------------------------
# _layer: the forward, with torch stand-ins for tiletune.kernels
# --------------------------------------------------------------------------------------------


def fake_ops(record: dict | None = None) -> types.SimpleNamespace:
    """torch versions of the ops the layer calls, checking how the layer calls them."""

    def rms_norm(x, w=None, eps=1e-6):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return (y * w.float()).to(x.dtype)

    def matmul(a, b):
        assert b.dim() == 2 and b.stride(0) == 1 and b.stride(1) == b.shape[0], "weights arrive as w.t()"
        return torch.matmul(a, b)

    def apply_rope_(q, k, cos, sin, layout="bshd"):
        assert q._base is not None and q._base is k._base, "q and k are views of one fused qkv output"
        c, s = cos.float(), sin.float()
        c, s = (c[None, :, None, :], s[None, :, None, :]) if c.dim() == 2 else (c[:, :, None, :], s[:, :, None, :])
        for z in (q, k):
            zf, h = z.float(), z.shape[-1] // 2
            z.copy_((zf * c + torch.cat((-zf[..., h:], zf[..., :h]), -1) * s).to(z.dtype))
        return q, k

    def attention(q, k, v, causal=False):
        assert q.shape[1] % k.shape[1] == 0 and q.shape[1] != k.shape[1], "GQA"
        if record is not None:
            record["k"], record["v"] = k.clone(), v.clone()
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)

    def kv_cache_append(ck, cv, k, v, start):
        assert start.dtype == torch.int64 and k.shape[2] == 1
        for b in range(ck.shape[0]):
            p = int(start[b])
            ck[b, :, p:p + 1], cv[b, :, p:p + 1] = k[b], v[b]
        return ck, cv

    def decode_attention(q, ck, cv, lens, causal=True):
        assert lens.dtype == torch.int32 and int(lens.max()) < ck.shape[2], "a cache with spare capacity"
        return torch.cat([F.scaled_dot_product_attention(q[b:b + 1], ck[b:b + 1, :, :int(lens[b])],
                                                         cv[b:b + 1, :, :int(lens[b])], enable_gqa=True)
                          for b in range(q.shape[0])])

    def swiglu(x):
        h = x.shape[-1] // 2
        return F.silu(x[..., :h]) * x[..., h:]

    return types.SimpleNamespace(rms_norm=rms_norm, matmul=matmul, apply_rope_=apply_rope_, attention=attention,
                                 kv_cache_append=kv_cache_append, decode_attention=decode_attention, swiglu=swiglu)


TINY = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96)


@pytest.mark.parametrize("shape", [{"phase": "prefill", "B": 2, "S": 7},
                                   {"phase": "decode", "B": 3, "L": 5, "capacity": 9}])
def test_layer_matches_torch_reference(shape):
    d = L.dims("llama3-8b", **TINY)
    w = L.make_weights(d, "cpu", 0, torch.float32)
    assert w["qkv"].shape == (d.q_dim + 2 * d.kv_dim, d.hidden) and w["down"].shape == (d.hidden, d.ffn)
    inp = L.Inputs(d, shape, "cpu", dtype=torch.float32)
    c1, c2 = inp.caches(), inp.caches()
    layer = L.tiletune_layer(d, w, shape["phase"], c1, ops=fake_ops())
    got = layer(*inp.args())
    want = L.reference_forward(d, w, inp, c2)
    t = shape["S"] if shape["phase"] == "prefill" else 1
    assert got.shape == (shape["B"], t, d.hidden)
    assert L.rel_err(got, want) < 1e-5
    if shape["phase"] == "decode":
        assert torch.equal(c1[0], c2[0]) and torch.equal(c1[1], c2[1])
        n = shape["L"]
        assert c1[0][:, :, n].abs().sum() > 0 and c1[0][:, :, n + 1:].abs().sum() == 0  # only position L written


def test_decode_step_equals_last_prefill_token():
    """A decode step at position L over a cache holding a prefill's k/v of positions [0, L) gives the
    prefill's output at position L: positions, RoPE and cache indexing agree."""
    d = L.dims("qwen2.5-7b", **TINY)
    w = L.make_weights(d, "cpu", 0, torch.float32)
    n, b = 6, 2
    pre = L.Inputs(d, {"phase": "prefill", "B": b, "S": n + 1}, "cpu", dtype=torch.float32)
    seen: dict = {}
    y_pre = L.tiletune_layer(d, w, "prefill", ops=fake_ops(seen))(*pre.args())
    dec = L.Inputs(d, {"phase": "decode", "B": b, "L": n, "capacity": n + 4}, "cpu", dtype=torch.float32)
    ck, cv = dec.caches()
    ck.zero_()
    cv.zero_()
    ck[:, :, :n], cv[:, :, :n] = seen["k"][:, :, :n], seen["v"][:, :, :n]
    x = pre.x[:, n:n + 1].clone()
    y_dec = L.tiletune_layer(d, w, "decode", (ck, cv), ops=fake_ops())(x, dec.cos, dec.sin, dec.pos, dec.lens)
    assert L.rel_err(y_dec[:, 0], y_pre[:, n]) < 1e-5
    assert torch.allclose(ck[:, :, n], seen["k"][:, :, n], atol=1e-6)


def test_tuning_sessions_sums_every_library_op(monkeypatch):
    from tiletune.kernels.library_op import LibraryOp

    def lib(name, counts):
        ops = {i: types.SimpleNamespace(tuning_count=c) for i, c in enumerate(counts)}
        return types.SimpleNamespace(name=name, ops=lambda: ops)

    monkeypatch.setattr(LibraryOp, "instances", classmethod(lambda cls: [lib("tiletune.gemm", [2, 1]),
                                                                         lib("tiletune.rms_norm", [0]),
                                                                         lib("tiletune.rope", [1])]))
    assert L.tuning_sessions() == 4
    assert L.tuning_sessions(by_op=True) == (4, {"tiletune.gemm": 3, "tiletune.rope": 1})


def test_source_log_counts_log_lines():
    log = L.SourceLog().install()
    lg = logging.getLogger("tiletune")
    lg.info("%s: tuning table %s -> %s", "tiletune.rms_norm", "shipped", {"TM": 4})
    lg.info("%s: tuned %s\n%s", "tiletune.gemm", "key", "summary")
    lg.info("%s: bucket hit for %r -> %s", "tiletune.swiglu", "k", {})
    lg.info("%s: no tuned neighbour of %s; the default config %s, provisionally", "tiletune.attention", "k", {})
    lg.warning("tiletune: something odd")
    snap = log.snapshot()
    assert snap["sources"] == {"table": 1, "tuned": 1, "bucket": 1, "default": 1}
    assert snap["tuned_ops"] == ["tiletune.gemm"] and snap["warnings"] == ["tiletune: something odd"]
    log.reset()
    assert log.snapshot()["sources"] == {}


# --------------------------------------------------------------------------------------------
# first_forward.py
# --------------------------------------------------------------------------------------------


def test_first_forward_args_and_plan():
    full, quick = first_forward.parse_args([]), first_forward.parse_args(["--quick"])
    assert (full.shapes, full.tuned_rows, full.seed, full.models) == (6, 2, 0, ["llama3-8b", "qwen2.5-7b"])
    assert (quick.shapes, quick.tuned_rows, quick.budget_s, full.budget_s) == (2, 1, 300.0, 450.0)
    p_full, p_quick = first_forward.plan(full), first_forward.plan(quick)
    assert len(p_full) == 12 and len(p_quick) == 4
    for model in full.models:
        f = [i["shape"] for i in p_full if i["model"] == model]
        q = [i["shape"] for i in p_quick if i["model"] == model]
        assert q == f[:2] and {s["phase"] for s in f} == {"prefill", "decode"}
        assert [i["tune"] for i in p_full if i["model"] == model] == [True, True] + [False] * 4
    assert first_forward.plan(first_forward.parse_args(["--seed", "3"])) != p_full
    with pytest.raises(SystemExit):
        first_forward.parse_args(["--models", "gpt-2"])
    with pytest.raises(SystemExit):
        first_forward.parse_args(["--shapes", "0"])


def test_first_forward_child_code_carries_the_spec():
    spec = {"model": "llama3-8b", "shape": {"phase": "decode", "B": 3, "L": 600, "capacity": 700}, "tune": True}
    code = first_forward.CHILD % json.dumps(spec)
    tree = ast.parse(code)
    lits = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert spec in [json.loads(x) for x in lits if x.startswith("{")]
    assert "f.child(" in code


def _fake_child(served_vs_tuned: float = 1.25):
    def run_child(code, env, timeout=600):
        assert env["TILETUNE_TABLES"] == "1" and env["TILETUNE_LOG"] == "1"
        assert env["TILETUNE_DB"].endswith("tuning.db") and env["CUDA_TILE_CACHE_DIR"]
        spec = json.loads(ast.literal_eval(code.split("json.loads(")[1].split(")))")[0]))
        calls.append((spec, env["CUDA_TILE_CACHE_DIR"], env["TILETUNE_DB"]))
        out = {"first_forward_s": 1.5, "tuning_sessions": 2, "tuning_by_op": {"tiletune.gemm": 2},
               "log_sources": {"table": 3, "tuned": 2}, "second_forward_s": 0.01, "served_ms": 1.0}
        if spec["tune"]:
            out.update(tuned_ms=1.0 / served_vs_tuned, served_vs_tuned=served_vs_tuned, tune_s=30.0)
        return out

    calls: list = []
    return run_child, calls


def test_first_forward_main_writes_the_schema(tmp_path, monkeypatch):
    import _common

    run_child, calls = _fake_child()
    monkeypatch.setattr(_common, "run_child", run_child)
    assert first_forward.main(["--quick", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "first_forward.json").read_text())
    _check_env(doc)
    assert doc["benchmark"] == "first_forward" and doc["seed"] == 0 and doc["complete"] is True
    rows = doc["rows"]
    assert len(rows) == 8 and len(calls) == 8
    for r in rows:
        for key in first_forward.ROW_KEYS:
            assert key in r, key
        assert r["phase"] in ("prefill", "decode") and r["cutile_cache"] in ("cold", "warm")
    assert [r["cutile_cache"] for r in rows] == ["cold", "warm"] * 4
    # cold and warm of one shape share the cuTile cache folder, never the database
    for (s1, cache1, db1), (s2, cache2, db2) in zip(calls[::2], calls[1::2]):
        assert s1["shape"] == s2["shape"] and cache1 == cache2 and db1 != db2
    assert len({c[1] for c in calls}) == 4 and len({c[2] for c in calls}) == 8
    tuned = [r["served_vs_tuned"] for r in rows]
    assert tuned == [1.25, 1.25, None, None, 1.25, 1.25, None, None]  # first shape of each model, both rows
    assert doc["summary"]["warm"]["rows"] == 4 and doc["summary"]["served_vs_tuned"]["n"] == 2


def test_first_forward_failed_child_is_a_row(tmp_path, monkeypatch):
    import _common

    def run_child(code, env, timeout=600):
        raise RuntimeError("child failed (1): boom")

    monkeypatch.setattr(_common, "run_child", run_child)
    assert first_forward.main(["--quick", "--models", "llama3-8b", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "first_forward.json").read_text())
    assert len(doc["rows"]) == 4 and all("boom" in r["error"] and r["first_forward_s"] is None for r in doc["rows"])
    assert doc["summary"]["errors"] == 4


def test_first_forward_budget_skips_shapes(tmp_path, monkeypatch):
    import _common

    run_child, calls = _fake_child()
    monkeypatch.setattr(_common, "run_child", run_child)
    clock = iter(range(0, 10000, 100))
    monkeypatch.setattr(first_forward.time, "perf_counter", lambda: float(next(clock)))
    assert first_forward.main(["--out", str(tmp_path), "--budget-s", "250"]) == 0
    doc = json.loads((tmp_path / "first_forward.json").read_text())
    assert 0 < len(doc["rows"]) < 24 and doc["skipped_for_budget"]
    assert len(doc["rows"]) // 2 + len(doc["skipped_for_budget"]) == 12


# --------------------------------------------------------------------------------------------
# compile_tax.py
# --------------------------------------------------------------------------------------------


def test_compile_tax_args_and_plan():
    full, quick = compile_tax.parse_args([]), compile_tax.parse_args(["--quick"])
    assert (full.per_phase, quick.per_phase, quick.budget_s) == (3, 1, 170.0)
    p_full, p_quick = compile_tax.plan(full), compile_tax.plan(quick)
    assert len(p_full) == 12 and len(p_quick) == 4
    for model in full.models:
        phases = [s["phase"] for m, s in p_full if m == model]
        assert phases.count("prefill") == 3 and phases.count("decode") == 3
        assert [s for m, s in p_quick if m == model] == [s for m, s in p_full if m == model][:2]
    only = compile_tax.plan(compile_tax.parse_args(["--phases", "decode", "--quick"]))
    assert [s["phase"] for _, s in only] == ["decode", "decode"]
    with pytest.raises(SystemExit):
        compile_tax.parse_args(["--phases", "train"])


def test_compile_tax_stack_runs_the_layer_n_times_in_one_compiled_frame():
    import torch

    class Layer(torch.nn.Module):  # a layer that writes its cache in place, as the decode layer does
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("w", torch.full((4,), 0.5), persistent=False)
            self.register_buffer("cache", torch.zeros(4), persistent=False)

        def forward(self, x, pos):
            self.cache.add_(x.sum() * pos)
            return x * self.w + 1

    assert compile_tax.parse_args(["--stack", "4"]).stack == 4 and compile_tax.parse_args([]).stack == 1
    one = Layer()
    assert compile_tax.stacked(one, 1) is one
    x, pos = torch.arange(4.0), torch.tensor(2.0)
    eager = compile_tax.stacked(Layer(), 3)
    want = ((x * 0.5 + 1) * 0.5 + 1) * 0.5 + 1
    torch.testing.assert_close(eager(x, pos), want)
    assert len(list(eager.buffers())) == 2  # one layer's buffers: shared, not copied
    torch._dynamo.reset()
    compiled = torch.compile(compile_tax.stacked(Layer(), 3), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, pos), want)


def test_compile_tax_ratios():
    got = compile_tax.ratios({"eager_us": 100.0, "compiled_us": 120.0, "graph_us": 80.0, "graph_copy_us": 82.5,
                              "reduce_overhead_us": 88.0, "eager_host_us": 50.0, "compiled_host_us": 75.0,
                              "torch_eager_us": 90.0, "torch_compiled_us": 45.0})
    assert set(got) == set(compile_tax.RATIOS)
    assert (got["compiled_vs_eager"], got["ro_vs_graph"], got["ro_vs_graph_copy"]) == (1.2, 1.1, 1.0667)
    assert (got["compiled_vs_eager_host"], got["torch_compiled_vs_eager"]) == (1.5, 0.5)
    assert got["ro_vs_graph_copy_host"] is None and got["torch_compiled_vs_eager_host"] is None
    empty = compile_tax.ratios({"eager_us": 100.0})
    assert empty["compiled_vs_eager"] is None and empty["ro_vs_graph"] is None


def test_compile_tax_host_key_and_merge_blocks():
    assert compile_tax.host_key("compiled_us") == "compiled_host_us"
    assert compile_tax.host_key("graph_copy_us") == "graph_copy_host_us"
    with pytest.raises(ValueError):
        compile_tax.host_key("notes")
    merged = compile_tax.merge_blocks([{"eager_us": 10.0, "graph_us": 5.0}, {"eager_us": 14.0, "compiled_us": 20.0},
                                       {"eager_us": 11.0}])
    assert merged == {"eager_us": 11.0, "graph_us": 5.0, "compiled_us": 20.0}
    every = {key for key, *_ in compile_tax.COMPILED}
    assert {"compiled_us", "reduce_overhead_us", "torch_compiled_us"} <= every
    assert all(compile_tax.host_key(k) in {n for pair in compile_tax.RATIOS.values() for n in pair} for k in every)


def test_compile_tax_copy_then_refills_static_buffers_before_the_call():
    static = (torch.zeros(3), torch.zeros(2, dtype=torch.int64))
    fresh = (torch.arange(3.0), torch.tensor([7, 8]))
    seen = []
    call = compile_tax.copy_then(static, fresh, lambda: seen.append((static[0].tolist(), static[1].tolist())) or 5)
    assert seen == [] and call() == 5
    assert seen == [([0.0, 1.0, 2.0], [7, 8])]
    fresh[0].add_(1)  # the next step's inputs, written in place by the caller
    call()
    assert seen[-1] == ([1.0, 2.0, 3.0], [7, 8])
    with pytest.raises(ValueError, match="input 1"):
        compile_tax.copy_then(static, (fresh[0], torch.tensor([7, 8], dtype=torch.int32)), lambda: None)
    with pytest.raises(ValueError, match="2 static buffers for 1 inputs"):
        compile_tax.copy_then(static, fresh[:1], lambda: None)


def test_torch_layer_is_a_module_with_buffers_and_refuses_a_decode_without_caches():
    d = L.dims("llama3-8b", **TINY)
    w = L.make_weights(d, "cpu", 0, torch.float32)
    inp = L.Inputs(d, {"phase": "decode", "B": 2, "L": 5, "capacity": 8}, "cpu", dtype=torch.float32)
    ck, cv = inp.caches()
    layer = L.torch_layer(d, w, "decode", (ck, cv), 5)
    assert {n for n, _ in layer.named_buffers()} == set(w) | {"ck", "cv"}
    y = layer(*inp.args())
    assert y.shape == (2, 1, d.hidden) and ck[:, :, 5].abs().sum() > 0 and ck[:, :, 6:].abs().sum() == 0
    with pytest.raises(ValueError, match="KV caches"):
        L.torch_layer(d, w, "decode", (ck, cv))
    with pytest.raises(ValueError, match="phase"):
        L.torch_layer(d, w, "train")


def test_compile_tax_notes_catch_cudagraph_warnings():
    with compile_tax.Notes() as notes:
        logging.getLogger("torch._inductor.cudagraph_utils.__cudagraphs").warning(
            "skipping cudagraphs due to mutated inputs (2 instances)")
        logging.getLogger("torch._dynamo").debug("a debug line nobody needs")
        warnings.warn("a user warning")
    assert any("mutated inputs" in line for line in notes.lines)
    assert any("UserWarning: a user warning" in line for line in notes.lines)
    assert not any("debug line" in line for line in notes.lines)
    logging.getLogger("torch._inductor.cudagraph_utils.__cudagraphs").warning("after: not caught")
    assert not any("after" in line for line in notes.lines)


def test_compile_tax_main_writes_the_schema(tmp_path, monkeypatch):
    monkeypatch.setenv("TILETUNE_DB", str(tmp_path / "x.db"))
    monkeypatch.setenv("CUDA_TILE_CACHE_DIR", str(tmp_path / "cache"))
    used: list = []
    monkeypatch.setattr(L, "use_fresh_database", lambda path, tables, **kw: used.append((path, tables, kw)))
    monkeypatch.setattr(L, "make_weights", lambda d, device="cuda", seed=0, dtype=None: {"model": d.model})

    def fake_row(model, shape, w, profile, stack=1):
        assert w == {"model": model}
        row = {"model": model, "phase": shape["phase"], "shape": shape, "eager_us": 100.0, "graph_us": 80.0,
               "compiled_us": 110.0, "reduce_overhead_us": 84.0, "notes": ["[reduce_overhead] skipping cudagraphs"]}
        if profile and shape["phase"] == "decode":
            row["profile"] = {"compiled": [{"op": "aten::empty", "self_cpu_us": 3.0, "cpu_total_us": 3.0,
                                            "calls": 2.0}]}
        return {**row, **compile_tax.ratios(row)}

    monkeypatch.setattr(compile_tax, "measure_row", fake_row)
    assert compile_tax.main(["--quick", "--profile", "--out", str(tmp_path)]) == 0
    assert used and used[0][1] is True and "options" in used[0][2]  # tables on, short tuning measurements
    doc = json.loads((tmp_path / "compile_tax.json").read_text())
    _check_env(doc)
    assert doc["complete"] and len(doc["rows"]) == 4 and doc["profile"] is True
    for r in doc["rows"]:
        for key in compile_tax.ROW_KEYS:
            assert key in r, key
        assert r["compiled_vs_eager"] == 1.1 and r["ro_vs_graph"] == 1.05
    assert sum(1 for r in doc["rows"] if "profile" in r) == 2


# --------------------------------------------------------------------------------------------
# offgrid.py
# --------------------------------------------------------------------------------------------


def test_offgrid_draws_seeded_within_caps():
    for fam in offgrid.FAMILIES:
        a, skipped = offgrid.draw_family(fam, 30, 0)
        assert (a, skipped) == offgrid.draw_family(fam, 30, 0)
        assert a != offgrid.draw_family(fam, 30, 1)[0]
        assert offgrid.draw_family(fam, 4, 0)[0] == a[:4]
        assert len(a) == 30 and all(offgrid.why_not(s) is None for s in a)
        assert all(s["reason"] for s in skipped)
        for s in a:
            m = offgrid.MODEL_DIMS[s["model"]]
            if fam == "gemm_linear":
                assert 1 <= s["M"] <= 16384 and (s["N"], s["K"]) == offgrid.projection(m, s["proj"])
            elif fam == "attention_gqa":
                assert 128 <= s["S"] <= 32768 and s["D"] in (64, 128) and s["H"] % s["Hkv"] == 0
            else:
                assert 1 <= s["T"] <= 16384
    att, skipped = offgrid.draw_family("attention_gqa", 30, 0)
    assert {s["model"] for s in att} <= {"llama3-8b", "mistral-7b", "qwen2.5-7b"}
    assert any("head dim" in s["reason"] for s in skipped)  # Gemma-2 (256) and Phi-3 (96) are set aside, said so
    assert len({s["model"] for f in offgrid.FAMILIES for s in offgrid.draw_family(f, 30, 0)[0]}) == 5
    assert {s["causal"] for s in att} == {True, False}


def test_offgrid_plan_is_round_robin():
    rows, _ = offgrid.plan(["gemm_linear", "softmax"], 3, 0)
    assert [r["family"] for r in rows] == ["gemm_linear", "softmax"] * 3
    later, _ = offgrid.plan(["gemm_linear", "softmax"], 3, 0, start_round=1)
    assert later == rows[2:]


def test_offgrid_pure_helpers():
    assert offgrid.geomean([1.0, 4.0]) == pytest.approx(2.0) and offgrid.geomean([]) is None
    assert offgrid.best({"a": 2.0, "b": 1.0, "c": None}) == ("b", 1.0) and offgrid.best({}) == (None, None)
    assert offgrid.served_source({"table": 1}, 0) == "table"
    assert offgrid.served_source({"table": 1}, 2) == "tuned"
    assert offgrid.served_source({}, 0) == "other"
    assert offgrid.served_source({"default": 1}, 0) == "default"
    rows = [{"family": "softmax", "ratio": 2.0, "served_ms": 2.0, "tiletune_ms": 1.0},
            {"family": "softmax", "ratio": 0.5, "served_ms": 1.0, "tiletune_ms": 1.0},
            {"family": "softmax", "error": "x"}]
    s = offgrid.summarize(rows, ["softmax", "swiglu"])
    assert s["softmax"]["geomean"] == pytest.approx(1.0) and s["softmax"]["min"] == 0.5
    assert s["softmax"]["n"] == 2 and s["softmax"]["errors"] == 1 and s["softmax"]["wins"] == 1
    assert s["softmax"]["served_vs_tuned_geomean"] == pytest.approx(2 ** 0.5)
    assert s["swiglu"] == {"geomean": None, "min": None, "n": 0, "served_vs_tuned_geomean": None, "wins": 0,
                           "errors": 0}
    with pytest.raises(SystemExit):
        offgrid.parse_args(["--families", "conv"])
    assert offgrid.parse_args(["--quick"]).per_family == 4 and offgrid.parse_args([]).per_family == 30


@pytest.mark.parametrize("shape", [
    {"family": "gemm_linear", "model": "x", "proj": "q", "M": 5, "N": 24, "K": 16},
    {"family": "attention_gqa", "model": "x", "B": 2, "H": 4, "Hkv": 2, "S": 9, "D": 16, "causal": True},
    {"family": "rms_norm", "model": "x", "T": 5, "N": 32},
    {"family": "swiglu", "model": "x", "T": 5, "H": 16},
    {"family": "softmax", "model": "x", "T": 5, "N": 40},
])
def test_offgrid_torch_routes_agree_on_cpu(shape):
    _, routes = offgrid.make_calls(shape, dev="cpu")
    outs = {name: fn().float() for name, fn in routes.items() if name != "torch.compile"}
    ref = next(iter(outs.values()))
    for name, out in outs.items():
        assert out.shape == ref.shape and L.rel_err(out, ref) < 2e-2, name
    if shape["family"] == "softmax":
        assert torch.allclose(ref.sum(-1), torch.ones(ref.shape[0]), atol=2e-2)


def test_offgrid_main_writes_the_schema(tmp_path, monkeypatch):
    monkeypatch.setenv("TILETUNE_DB", str(tmp_path / "x.db"))
    monkeypatch.setenv("CUDA_TILE_CACHE_DIR", str(tmp_path / "cache"))
    checked: list = []

    def fake_measure(shape, tmp, index, log, timer_check):
        checked.append(timer_check)
        row = {"family": shape["family"], "shape": shape, "tiletune_ms": 1.0, "served_ms": 1.5,
               "best_torch_ms": 1.2, "best_torch_route": "eager", "ratio": 1.2, "served_source": "table"}
        if shape["family"] == "softmax" and index > 10:
            raise RuntimeError("boom")
        return row

    monkeypatch.setattr(offgrid, "measure", fake_measure)
    assert offgrid.main(["--quick", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "offgrid.json").read_text())
    _check_env(doc)
    assert doc["seed"] == 0 and doc["complete"] and len(doc["rows"]) == 20
    assert checked[:3] == [True] * 3 and not any(checked[3:])
    for r in doc["rows"]:
        if "error" not in r:
            for key in offgrid.ROW_KEYS:
                assert key in r, key
    s = doc["summary"]
    assert set(s) == set(offgrid.FAMILIES)
    assert s["gemm_linear"] == {"geomean": pytest.approx(1.2), "min": 1.2, "n": 4,
                                "served_vs_tuned_geomean": pytest.approx(1.5), "wins": 4, "errors": 0}
    assert s["softmax"]["errors"] == 2 and s["softmax"]["n"] == 2


def test_offgrid_budget_stops_and_writes(tmp_path, monkeypatch):
    monkeypatch.setenv("TILETUNE_DB", str(tmp_path / "x.db"))
    monkeypatch.setenv("CUDA_TILE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(offgrid, "measure", lambda shape, tmp, index, log, timer_check: {
        "family": shape["family"], "shape": shape, "tiletune_ms": 1.0, "served_ms": 1.0, "best_torch_ms": 1.0,
        "best_torch_route": "eager", "ratio": 1.0})
    clock = iter(range(0, 100000, 10))
    monkeypatch.setattr(offgrid.time, "perf_counter", lambda: float(next(clock)))
    assert offgrid.main(["--out", str(tmp_path), "--budget-s", "95"]) == 0
    doc = json.loads((tmp_path / "offgrid.json").read_text())
    assert not doc["complete"] and 0 < len(doc["rows"]) < 150
    assert doc["rows_not_reached_in_budget"] == 150 - len(doc["rows"])


def test_make_table_attention_variants():
    import make_table
    from tiletune.lab.fill import llm_calls

    calls = llm_calls(["attention"], [512, 1024])
    assert [c.kwargs["causal"] for c in make_table.attention_variants(calls, "true")] == [True, True]
    assert [c.kwargs["causal"] for c in make_table.attention_variants(calls, "false")] == [False, False]
    both = make_table.attention_variants(calls, "both")
    assert [c.kwargs["causal"] for c in both] == [True, False, True, False]
    assert both[1].args == calls[0].args and calls[0].kwargs["causal"] is True  # the originals untouched


@pytest.mark.parametrize("flag", [["--tokens", "1,48"], ["--attention-s", "1000"]])
def test_make_table_refuses_sizes_off_the_buckets_bounds(tmp_path, monkeypatch, capsys, flag):
    """A shipped table answers a bucketed call from its entry nearest the call, which holds only when each
    entry was tuned at its key's sizes: make_table tunes powers of two only, and says so before any work."""
    import make_table

    monkeypatch.setattr(sys, "argv", ["make_table.py", "--db", str(tmp_path / "f.db"), "--table",
                                      str(tmp_path / "t.json"), *flag])
    with pytest.raises(SystemExit) as exc:
        make_table.main()
    assert exc.value.code == 2 and "powers of two" in capsys.readouterr().err
    assert not (tmp_path / "f.db").exists() and not (tmp_path / "t.json").exists()
    assert os.environ.get("TILETUNE_DB") != str(tmp_path / "f.db")  # refused before it set its environment


def test_compile_tax_cpu_writes_one_row_per_stack(tmp_path):
    """benchmarks/compile_tax_cpu.py: the tiny decode layer eager over stand-ins and compiled over the
    public ops bound to the same stand-ins gives the same output, one row per stack."""
    pytest.importorskip("cuda.tile")
    import compile_tax_cpu

    assert compile_tax_cpu.main(["--out", str(tmp_path), "--stacks", "1,2", "--rounds", "1", "--forwards", "2"]) == 0
    doc = json.loads((tmp_path / "compile_tax_cpu.json").read_text())
    assert [r["stack"] for r in doc["rows"]] == [1, 2]
    for r in doc["rows"]:
        assert r["same_output"] is True and r["eager_us"] > 0 and r["compiled_us"] > 0
        assert r["extra_us_per_layer"] == pytest.approx((r["compiled_us"] - r["eager_us"]) / r["stack"], abs=0.11)
    with pytest.raises(SystemExit):
        compile_tax_cpu.main(["--out", str(tmp_path), "--stacks", "0"])
