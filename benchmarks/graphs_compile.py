"""Library ops inside CUDA graphs and ``torch.compile``: does each op capture, replay and compile?

For every public op of :mod:`tiletune.kernels` (small bfloat16 shapes) and for a small decoder
block made of them (hidden 256, 4 query / 2 key-value heads of 64, RoPE in place on q/k views,
causal attention, residual RMSNorm, SwiGLU MLP; op ``"decoder_block"``), four cases:

* ``manual_capture``: warm up eagerly (tunes), capture one call in a ``torch.cuda.graph``, copy new
  data into the static inputs, replay, compare with an eager call on the same data;
* ``new_key_in_capture``: a shape never seen before is called first *inside* the capture (the tuned
  op launches the database record or the baseline config there and tunes later); the capture must
  succeed and its replay on new data must match eager on the same data;
* ``compile_fullgraph``: ``torch.compile(fn, fullgraph=True)`` (the ops become their
  ``torch.ops.tiletune`` custom ops) vs eager on the same data;
* ``reduce_overhead``: ``torch.compile(fn, mode="reduce-overhead", fullgraph=True)`` called three
  times on new data, each output vs eager (``cudagraph_skips``: inductor's count of graphs it ran
  without CUDA graphs during the case, expected 0).

Each row: ``case``, ``op``, ``ok`` (no exception and ``max_err`` within ``tol``), ``max_err`` (max abs
difference from eager tiletune, relative to max(1, max|eager|)), ``ref_err`` (relative RMS error of
the result against torch's own ops in float32, a check that eager itself is right), ``seconds``, and
``error`` (the exception) when it failed. Every case runs in its own ``try``: a failure is recorded
and the others still run. A fresh temporary tuning database (``TILETUNE_DB`` and
``LibraryOp.configure``) and short tuning measurements keep runs reproducible; a full run from an
empty database takes about 8 minutes on an H200 (most of it tuning the new keys).

    cd benchmarks && python graphs_compile.py [--out DIR] [--ops rms_norm,matmul] [--cases ...]
        [--api public|compiled_call] [--deadline SECONDS]

Writes ``graphs_compile.json`` (``rows`` plus counts).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Callable

from _common import failure_fields, write_result

CASES = ("manual_capture", "new_key_in_capture", "compile_fullgraph", "reduce_overhead")
B, H, HKV, D, FF = 2, 4, 2, 64, 512
HID = H * D
SEQ = (64, 96)  # the decoder block's sequence length: variant 0 (warmed up) and 1 (first seen in capture)
TOL = {"bfloat16": 5e-2, "float16": 1e-2, "float32": 1e-4}

torch: Any = None
F: Any = None
BF16: Any = None
DEV = "cuda"


# ------------------------------------------------------------------------------------------------ ops


def randn(shape: tuple, seed: int, scale: float = 1.0, dtype: Any = None) -> Any:
    g = torch.Generator(device=DEV).manual_seed(seed)
    return (torch.randn(shape, device=DEV, generator=g) * scale).to(dtype or BF16)


def randint(high: int, shape: tuple, seed: int) -> Any:
    g = torch.Generator(device=DEV).manual_seed(seed)
    return torch.randint(0, high, shape, device=DEV, generator=g)


def rope_tables(seq: int) -> tuple[Any, Any]:
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device=DEV, dtype=torch.float32) / D))
    emb = torch.outer(torch.arange(seq, device=DEV, dtype=torch.float32), inv)
    emb = torch.cat([emb, emb], dim=-1)
    return emb.cos().to(BF16), emb.sin().to(BF16)


def rope_ref(t: Any, cos: Any, sin: Any) -> Any:
    """Rotate-half RoPE of a (B, S, H, D) tensor in float32 (cos/sin (S, D))."""
    d = t.shape[-1]
    tf = t.float()
    rot = torch.cat([-tf[..., d // 2:], tf[..., :d // 2]], dim=-1)
    return tf * cos.float()[None, :, None, :] + rot * sin.float()[None, :, None, :]


def gqa_sdpa(q: Any, k: Any, v: Any, causal: bool) -> Any:
    rep = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(rep, 1),
                                          v.float().repeat_interleave(rep, 1), is_causal=causal)


class Spec:
    """One op of the benchmark: ``make(variant, seed)`` -> inputs, ``fn(*inputs)`` -> tuple of
    outputs (the library op through the chosen API), ``ref(*inputs)`` -> torch's float32 result."""

    def __init__(self, name: str, make: Callable[[int, int], tuple], fn: Callable[..., Any],
                 ref: Callable[..., Any]) -> None:
        self.name, self.make, self.fn, self.ref = name, make, fn, ref


def _tuple(out: Any) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def decoder_block(K: Any, W: dict) -> Callable[..., Any]:
    def block(x: Any, cos: Any, sin: Any) -> Any:
        b, s, _ = x.shape
        h = K.rms_norm(x, W["norm1"])
        qkv = K.matmul(h, W["qkv"])
        q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)
        q, k, v = q.view(b, s, H, D), k.view(b, s, HKV, D), v.view(b, s, HKV, D)
        K.apply_rope_(q, k, cos, sin)
        o = K.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        a = K.matmul(o.transpose(1, 2).reshape(b, s, HID), W["o"])
        y, res = K.rms_norm_residual(a, x, W["norm2"])
        return K.matmul(K.swiglu(K.matmul(y, W["up"])), W["down"]) + res

    return block


def decoder_block_ref(W: dict, x: Any, cos: Any, sin: Any) -> Any:
    b, s, _ = x.shape

    def rms(t: Any, w: Any) -> Any:
        return F.rms_norm(t.float(), (HID,), w.float(), 1e-6).to(BF16)

    q, k, v = (rms(x, W["norm1"]) @ W["qkv"]).split([H * D, HKV * D, HKV * D], dim=-1)
    q = rope_ref(q.view(b, s, H, D), cos, sin).to(BF16)
    k = rope_ref(k.view(b, s, HKV, D), cos, sin).to(BF16)
    v = v.view(b, s, HKV, D)
    o = gqa_sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True).to(BF16)
    res = ((o.transpose(1, 2).reshape(b, s, HID) @ W["o"]).float() + x.float()).to(BF16)
    u = (rms(res, W["norm2"]) @ W["up"]).float()
    return (F.silu(u[..., :FF]) * u[..., FF:]).to(BF16) @ W["down"] + res


def specs(K: Any) -> list[Spec]:
    """The benchmark's ops; variant 0 and 1 shapes differ in every key (variant 1 is first met in a capture)."""
    W = {
        "norm1": (1.0 + randn((HID,), 1, 0.1, torch.float32)).to(BF16),
        "qkv": randn((HID, (H + 2 * HKV) * D), 2, HID ** -0.5),
        "o": randn((HID, HID), 3, HID ** -0.5),
        "norm2": (1.0 + randn((HID,), 4, 0.1, torch.float32)).to(BF16),
        "up": randn((HID, 2 * FF), 5, HID ** -0.5),
        "down": randn((FF, HID), 6, FF ** -0.5),
    }
    rows2 = ((8, 512), (24, 768))  # (rows, width) of the row-wise ops
    glu2 = ((8, 1024), (24, 768))
    vocab = ((16, 4096), (24, 5000))

    def rows(v: int, s: int, n: int = 1) -> tuple:
        m, w = rows2[v]
        return tuple(randn((m, w), s + i) for i in range(n))

    def vec(v: int, s: int) -> Any:
        return (1.0 + randn((rows2[v][1],), s, 0.1, torch.float32)).to(BF16)

    def rope_make(v: int, s: int) -> tuple:
        b, seq = ((2, 32), (1, 48))[v]
        return (randn((b, seq, H, D), s), randn((b, seq, HKV, D), s + 1), *rope_tables(seq))

    def rope_fn(q: Any, k: Any, cos: Any, sin: Any) -> tuple:
        q, k = q.clone(), k.clone()  # the graph stays functional: replays start from the inputs
        return _tuple(K.apply_rope_(q, k, cos, sin))

    def ce_make(v: int, s: int) -> tuple:
        m, n = vocab[v]
        return randn((m, n), s, 2.0), randint(n, (m,), s + 1)

    def ce_grad_ref(lg: Any, t: Any) -> tuple:
        p = lg.float().softmax(-1)
        onehot = torch.zeros_like(p).scatter_(1, t.unsqueeze(1), 1.0)
        return F.cross_entropy(lg.float(), t), (p - onehot) / lg.shape[0]

    def mm_make(v: int, s: int) -> tuple:
        sa, sb = (((2, 32, 256), (256, 384)), ((48, 256), (256, 320)))[v]
        return randn(sa, s), randn(sb, s + 1, 256 ** -0.5)

    def attn_make(v: int, s: int) -> tuple:
        seq = (64, 96)[v]
        return randn((1, H, seq, D), s), randn((1, HKV, seq, D), s + 1), randn((1, HKV, seq, D), s + 2)

    def block_make(v: int, s: int) -> tuple:
        return (randn((B, SEQ[v], HID), s), *rope_tables(SEQ[v]))

    block = decoder_block(K, W)
    rms_ref = lambda x, w: F.rms_norm(x.float(), (x.shape[-1],), w.float(), 1e-6)  # noqa: E731
    return [
        Spec("decoder_block", block_make, lambda x, c, s: (block(x, c, s),),
             lambda x, c, s: (decoder_block_ref(W, x, c, s),)),
        Spec("rms_norm", lambda v, s: (*rows(v, s), vec(v, s + 5)), lambda x, w: (K.rms_norm(x, w),),
             lambda x, w: (rms_ref(x, w),)),
        Spec("rms_norm_residual", lambda v, s: (*rows(v, s, 2), vec(v, s + 5)),
             lambda x, r, w: _tuple(K.rms_norm_residual(x, r, w)),
             lambda x, r, w: (rms_ref((x.float() + r.float()).to(BF16), w), x.float() + r.float())),
        Spec("layer_norm", lambda v, s: (*rows(v, s), vec(v, s + 5), vec(v, s + 6)),
             lambda x, w, b: (K.layer_norm(x, w, b),),
             lambda x, w, b: (F.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(), 1e-5),)),
        Spec("softmax", lambda v, s: (randn(((8, 1000), (24, 333))[v], s, 3.0),), lambda x: (K.softmax(x),),
             lambda x: (x.float().softmax(-1),)),
        Spec("swiglu", lambda v, s: (randn(glu2[v], s),), lambda x: (K.swiglu(x),),
             lambda x: (F.silu(x[..., :x.shape[-1] // 2].float()) * x[..., x.shape[-1] // 2:].float(),)),
        Spec("geglu", lambda v, s: (randn(glu2[v], s),), lambda x: (K.geglu(x, approximate="tanh"),),
             lambda x: (F.gelu(x[..., :x.shape[-1] // 2].float(), approximate="tanh")
                        * x[..., x.shape[-1] // 2:].float(),)),
        Spec("apply_rope_", rope_make, rope_fn, lambda q, k, c, s: (rope_ref(q, c, s), rope_ref(k, c, s))),
        Spec("cross_entropy", ce_make, lambda lg, t: (K.cross_entropy(lg, t),),
             lambda lg, t: (F.cross_entropy(lg.float(), t),)),
        Spec("cross_entropy_grad", ce_make, lambda lg, t: _tuple(K.cross_entropy(lg, t, return_grad=True)),
             ce_grad_ref),
        Spec("matmul", mm_make, lambda a, b: (K.matmul(a, b),), lambda a, b: (a.float() @ b.float(),)),
        Spec("attention", attn_make, lambda q, k, v: (K.attention(q, k, v, causal=True),),
             lambda q, k, v: (gqa_sdpa(q, k, v, True),)),
    ]


# ------------------------------------------------------------------------------------------------ cases


def _errors(got: tuple, want: tuple, ref: tuple) -> tuple[float, float, float]:
    """(max abs error vs eager relative to max(1, max|eager|), its tolerance, relative RMS error vs torch)."""
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} outputs, eager gave {len(want)}")
    err, tol, ref_err = 0.0, 0.0, 0.0
    for g, w, r in zip(got, want, ref):
        if tuple(g.shape) != tuple(w.shape) or g.dtype != w.dtype:
            raise AssertionError(f"output {tuple(g.shape)} {g.dtype}, eager {tuple(w.shape)} {w.dtype}")
        scale = max(1.0, float(w.float().abs().max())) if w.numel() else 1.0
        err = max(err, float((g.float() - w.float()).abs().max()) / scale if w.numel() else 0.0)
        tol = max(tol, TOL[str(w.dtype).replace("torch.", "")])
        denom = float(torch.linalg.vector_norm(r.float()))
        ref_err = max(ref_err, float(torch.linalg.vector_norm(g.float() - r.float())) / max(denom, 1e-30))
    return err, tol, ref_err


def _refill(static: tuple, new: tuple) -> None:
    for s, n in zip(static, new):
        s.copy_(n)


def _clone(out: tuple) -> tuple:
    return tuple(t.clone() for t in out)


def capture_and_replay(spec: Spec, variant: int, warm_up: bool) -> tuple:
    static = spec.make(variant, 1)
    if warm_up:
        spec.fn(*static)
        torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = spec.fn(*static)
    _refill(static, spec.make(variant, 2))
    graph.replay()
    torch.cuda.synchronize()
    got = _clone(out)
    want = spec.fn(*static)  # eager on the same data
    torch.cuda.synchronize()
    return _errors(got, want, spec.ref(*static))


def case_manual_capture(spec: Spec) -> tuple:
    return capture_and_replay(spec, 0, warm_up=True)


def case_new_key_in_capture(spec: Spec) -> tuple:
    return capture_and_replay(spec, 1, warm_up=False)


def case_compile_fullgraph(spec: Spec) -> tuple:
    torch._dynamo.reset()
    inputs = spec.make(0, 3)
    want = spec.fn(*inputs)
    got = _tuple(torch.compile(spec.fn, fullgraph=True)(*inputs))
    torch.cuda.synchronize()
    return _errors(got, want, spec.ref(*inputs))


def case_reduce_overhead(spec: Spec) -> tuple:
    torch._dynamo.reset()
    compiled = torch.compile(spec.fn, mode="reduce-overhead", fullgraph=True)
    worst = (0.0, 0.0, 0.0)
    for i in range(3):  # warm-up run, recording run, replay
        inputs = spec.make(0, 10 + i)
        want = spec.fn(*inputs)
        got = _clone(_tuple(compiled(*inputs)))  # the next replay overwrites the graph's outputs
        torch.cuda.synchronize()
        e = _errors(got, want, spec.ref(*inputs))
        worst = tuple(max(a, b) for a, b in zip(worst, e))
    return worst


CASE_FNS = {"manual_capture": case_manual_capture, "new_key_in_capture": case_new_key_in_capture,
            "compile_fullgraph": case_compile_fullgraph, "reduce_overhead": case_reduce_overhead}


def run_case(case: str, spec: Spec) -> dict:
    row: dict[str, Any] = {"case": case, "op": spec.name}
    counters = torch._dynamo.utils.counters["inductor"]
    skips = counters["cudagraph_skips"]
    t0 = time.perf_counter()
    try:
        err, tol, ref_err = CASE_FNS[case](spec)
        row.update(ok=bool(err <= tol), max_err=err, tol=tol, ref_err=ref_err)
        if err > tol:
            row["error"] = f"max_err {err:.3g} > tol {tol}"
    except Exception as exc:  # recorded; the other cases still run
        row.update(ok=False, max_err=None, **failure_fields(exc, report=False))
        try:
            torch.cuda.synchronize()
        except Exception as sync_exc:  # a sticky error: later cases will fail too, and say so
            row["sync_error"] = f"{type(sync_exc).__name__}: {sync_exc}"[:500]
    row["seconds"] = round(time.perf_counter() - t0, 2)
    if case == "reduce_overhead":
        row["cudagraph_skips"] = counters["cudagraph_skips"] - skips
    status = "ok " if row["ok"] else "FAIL"
    print(f"{status} {case:20s} {spec.name:20s} max_err={row.get('max_err')} ref_err={row.get('ref_err')} "
          f"{row['seconds']}s {row.get('error', '')[:200]}", flush=True)
    return row


# ------------------------------------------------------------------------------------------------ main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--ops", default=None, help="comma-separated op names (default: all, decoder_block first)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ",".join(CASES))
    ap.add_argument("--api", choices=("public", "compiled_call"), default="public",
                    help="call the public functions (default) or tiletune.kernels.torch_ops.compiled_call")
    ap.add_argument("--deadline", type=float, default=500.0, help="start no case after this many seconds (a full run from an empty database takes about 8 minutes on an H200)")
    ap.add_argument("--full-tuning", action="store_true", help="the default tuner options (slower)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="tiletune-graphs-"))
    db_path = tmp / "tuning.db"
    os.environ["TILETUNE_DB"] = str(db_path)  # matmul and attention open the default database lazily

    global torch, F, BF16
    import torch as _torch

    torch, F, BF16 = _torch, _torch.nn.functional, _torch.bfloat16

    import tiletune as tt
    from tiletune.kernels import _MEMORY_OPS
    from tiletune.kernels.library_op import LibraryOp
    from tiletune.kernels.torch_ops import PUBLIC_OPS, compiled_call

    fast = None if args.full_tuning else tt.TunerOptions(
        stopping=tt.StoppingRule(min_samples=3, max_samples=10, max_seconds=0.05), showdown_rounds=1)
    LibraryOp.configure(db=tt.TuningDB(db_path), progress=False, **({"options": fast} if fast else {}))

    if args.api == "public":
        where = {**_MEMORY_OPS, "matmul": "gemm", "attention": "attention_op"}
        # from the defining modules
        K = types.SimpleNamespace(**{n: getattr(importlib.import_module(f"tiletune.kernels.{m}"), n)
                                     for n, m in where.items()})
    else:
        K = types.SimpleNamespace(**{n: functools.partial(compiled_call, n) for n in PUBLIC_OPS})

    all_specs = specs(K)
    wanted_ops = args.ops.split(",") if args.ops else [s.name for s in all_specs]
    unknown = set(wanted_ops) - {s.name for s in all_specs}
    if unknown:
        ap.error(f"unknown ops {sorted(unknown)}")
    cases = args.cases.split(",")
    if set(cases) - set(CASES):
        ap.error(f"unknown cases {sorted(set(cases) - set(CASES))}")
    chosen = [s for s in all_specs if s.name in wanted_ops]

    t_start = time.perf_counter()
    rows = []
    for case in cases:
        for spec in chosen:
            if time.perf_counter() - t_start > args.deadline:
                rows.append({"case": case, "op": spec.name, "ok": False, "max_err": None, "skipped": True,
                             "error": f"skipped: past the {args.deadline:.0f} s deadline"})
                continue
            rows.append(run_case(case, spec))

    done = [r for r in rows if not r.get("skipped")]
    path = write_result("graphs_compile", {
        "api": args.api,
        "tuner": "default" if fast is None else "short measurements (min 3, max 10 samples, 0.05 s)",
        "shapes": {"decoder_block": {"batch": B, "seq": list(SEQ), "hidden": HID, "heads": H, "kv_heads": HKV,
                                     "head_dim": D, "ffn": FF, "dtype": "bfloat16"}},
        "total_seconds": round(time.perf_counter() - t_start, 1),
        "n_rows": len(rows),
        "n_ok": sum(1 for r in rows if r["ok"]),
        "n_skipped": len(rows) - len(done),
        "rows": rows,
    }, args.out)
    print(f"{sum(1 for r in rows if r['ok'])}/{len(rows)} ok; {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
