#!/usr/bin/env python
"""Planted wrong kernels against the correctness gate, for every library op (issue 21), on a GPU.

For each op (rms_norm, rms_norm_residual, layer_norm, softmax, swiglu, geglu, rope, cross_entropy,
matmul, attention) on one moderate bf16 problem:

1. **Real configs**: the op tunes from a fresh temporary database (``TILETUNE_DB``); every candidate
   must pass the gate (``real_configs``: candidates and MISMATCH count per op).
2. **Planted bugs**: the real kernel's output is taken, a bug is planted into a copy of one output
   (:func:`plant`), and the copy goes through the gate exactly as the tuner does: an
   :class:`tiletune.devices.verify.ArgGuard` over the op's launch-plan arguments, a
   :class:`tiletune.devices.verify.Checker` with the op's own reference and tolerance
   (a callable ``tolerance=`` evaluated on the plan's arguments), outputs poisoned, the planted output written, ``compare()``.
   Each bug must be rejected; the unmodified real output (bug ``none``) must pass.

Bugs (:data:`BUGS`): ``zeroed_tail`` (last 1/8 of each row set to 0), ``dropped_small`` (the nonzero
elements with ``|want|`` at or below their 10th percentile set to 0), ``off_by_one_row`` (rows shifted
by one; a single row: elements shifted by one), ``eps_bias`` (``+ 4 * max(eps(dtype), 2^-10) * max|want|``
everywhere: 4 ulps of a 16-bit dtype, 4 tf32 ulps for float32, of the largest output), ``stale_previous``
(the op's output for other inputs of the same shape), ``stale_zeros``, ``stale_row`` (row 0 repeated; a single row: its first element).
Multi-output ops get every bug in every output (``op[h]`` names the second output).

Writes ``<out>/planted_bugs.json``: ``{"gpu", "driver", "versions", "date", "rows": [{"op", "bug",
"rejected", "reason"}], "real_configs": [{"op", "candidates", "mismatches"}]}``. Small shapes, at most
8 evaluations per memory-bound op (GEMM and attention tune their 38 and 17 configs): a few minutes on
an H200. ``python benchmarks/planted_bugs.py --out $OUT``. Importing this module does no work; the
planting functions run on any torch device (``tests/test_verify.py`` runs them on CPU tensors).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

BUGS = ("zeroed_tail", "dropped_small", "off_by_one_row", "eps_bias", "stale_previous", "stale_zeros", "stale_row")


def _rows(t: Any) -> Any:
    """A 2-D view (rows = all leading dims, columns = the last dim) of a contiguous tensor."""
    if t.dim() == 0:
        return t.reshape(1, 1)
    return t.reshape(-1, t.shape[-1])


def bias_of(want: Any) -> float:
    """The ``eps_bias`` amount: ``4 * max(eps(dtype), 2^-10) * max|want|`` (finite elements)."""
    import torch

    from tiletune.devices.verify import eps

    w = want.float()
    w = w[torch.isfinite(w)]
    m = float(w.abs().max()) if w.numel() else 1.0
    return 4.0 * max(eps(want.dtype), 2.0 ** -10) * (m if m > 0 else 1.0)


def plant(bug: str, want: Any, previous: Any = None) -> Any:
    """A copy of ``want`` (the correct output) with ``bug`` planted; same shape and dtype."""
    import torch

    g = want.detach().clone().contiguous()
    r = _rows(g)
    n_rows, n = r.shape
    if bug == "zeroed_tail":
        r[:, n - max(1, n // 8):] = 0
    elif bug == "dropped_small":
        a = want.detach().float().abs().reshape(-1)
        nz = a[a > 0]
        if nz.numel():
            k = max(1, int(0.1 * nz.numel()))
            thr = float(torch.kthvalue(nz.cpu(), k).values)
            flat = g.reshape(-1)
            flat[(a > 0) & (a <= thr)] = 0
    elif bug == "off_by_one_row":
        if n_rows >= 2:
            r.copy_(torch.roll(r.clone(), 1, dims=0))
        else:
            r.copy_(torch.roll(r.clone(), 1, dims=1))
    elif bug == "eps_bias":
        g.copy_((want.detach().to(torch.float64) + bias_of(want)).to(g.dtype))
    elif bug == "stale_previous":
        if previous is None:
            raise ValueError("stale_previous needs the previous problem's output")
        g.copy_(previous)
    elif bug == "stale_zeros":
        g.zero_()
    elif bug == "stale_row":
        if n_rows >= 2:
            r.copy_(r[:1].expand_as(r).clone())
        else:  # one row: its first element repeated
            r.copy_(r[:, :1].expand_as(r).clone())
    else:
        raise ValueError(f"unknown bug {bug!r}")
    return g


def gate_rows(op_name: str, tuned: Any, make_args: Callable[[int], tuple], out_names: tuple[str, ...] | None = None,
              run: bool = True) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Tune ``tuned`` on ``make_args(0)`` (unless ``run`` is False), then run every bug through the
    gate as the tuner does. Returns ``(rows, real_configs_row)``."""
    from tiletune.records import Status
    from tiletune.devices.verify import ArgGuard, Checker

    args = make_args(0)
    guard = ArgGuard(args, tuned.writes, tuned.inplace)  # pristine inputs saved before anything runs
    tol = tuned.tolerance(*args) if callable(tuned.tolerance) else tuned.tolerance  # as the tuner resolves it
    checker = Checker(tuned.reference, guard, dict(tol) if tol else None)
    positions = checker.positions
    n_before = len(tuned.results)
    if run:
        tuned(*args)  # tunes (fresh database); the args then hold exactly one launch of the winner
    real = [args[p].detach().clone() for p in positions]
    prev_args = make_args(1)
    tuned(*prev_args)  # same key: the cached winner, on other inputs
    previous = [prev_args[p].detach().clone() for p in positions]
    names = out_names or tuple(f"out{i}" for i in range(len(positions)))
    rows: list[dict[str, Any]] = []

    def check(outputs: list[Any]) -> str | None:
        guard.prepare_checked_run()
        for p, o in zip(positions, outputs):
            args[p].copy_(o)
        return checker.compare()

    reason = check(real)
    rows.append({"op": op_name, "bug": "none", "rejected": reason is not None, "reason": reason or ""})
    for i in range(len(positions)):
        label = op_name if i == 0 else f"{op_name}[{names[i]}]"
        for bug in BUGS:
            outs = list(real)
            outs[i] = plant(bug, real[i], previous[i])
            reason = check(outs)
            rows.append({"op": label, "bug": bug, "rejected": reason is not None, "reason": reason or ""})
    guard.restore()
    results = list(tuned.results.values())[n_before:] if run else []
    cands = sum(len(r.measurements) for r in results)
    mism = [m for r in results for m in r.measurements if m.status is Status.MISMATCH]
    real_row = {"op": op_name, "candidates": cands, "mismatches": len(mism),
                "mismatch_reasons": [m.reason for m in mism][:5]}
    return rows, real_row


def _cases(dev: str, dtype: Any) -> list[tuple[str, Any, Callable[[int], tuple], tuple[str, ...]]]:
    """``(op name, tuned op, make_args(seed), output names)`` per library op (launch-plan args)."""
    import torch

    import importlib

    att_mod = importlib.import_module("tiletune.kernels.attention_op")  # the package's attention() shadows it
    gemm_mod = importlib.import_module("tiletune.kernels.gemm")
    from tiletune import autotune
    from tiletune.kernels.cross_entropy_op import prepare_cross_entropy
    from tiletune.kernels.glu import ACT_GELU_TANH, ACT_SILU, prepare_glu
    from tiletune.kernels.norms import prepare_layer_norm, prepare_rms_norm, prepare_rms_norm_residual
    from tiletune.kernels.rope import prepare_rope
    from tiletune.kernels.softmax_op import prepare_softmax

    def rnd(seed: int, *shape: int, scale: float = 1.0, dt: Any = dtype) -> Any:
        g = torch.Generator(device=dev).manual_seed(1234 + seed)
        return (torch.randn(*shape, generator=g, device=dev) * scale).to(dt)

    M, N = 512, 1024

    def fam(prep: Callable[[int], Any]) -> tuple[Any, Callable[[int], tuple]]:
        p0 = prep(0)
        return p0.family.op(p0.regime), (lambda s: prep(s).args)

    cases = []
    for name, prep, outs in (
        ("rms_norm", lambda s: prepare_rms_norm(rnd(s, M, N), rnd(9, N), 1e-6), ("y",)),
        ("rms_norm_residual", lambda s: prepare_rms_norm_residual(rnd(s, M, N), rnd(s + 50, M, N), rnd(9, N), 1e-6),
         ("y", "h")),
        ("layer_norm", lambda s: prepare_layer_norm(rnd(s, M, N), rnd(9, N), rnd(10, N), 1e-5), ("y",)),
        ("softmax", lambda s: prepare_softmax(rnd(s, M, N, scale=3.0)), ("y",)),
        ("swiglu", lambda s: prepare_glu(rnd(s, M, 2 * N), ACT_SILU), ("y",)),
        ("geglu", lambda s: prepare_glu(rnd(s, M, 2 * N), ACT_GELU_TANH), ("y",)),
        ("rope", lambda s: prepare_rope(rnd(s, 2, 256, 8, 128), rnd(s + 50, 2, 256, 2, 128),
                                        torch.cos(rnd(7, 256, 128, dt=torch.float32)).to(dtype),
                                        torch.sin(rnd(7, 256, 128, dt=torch.float32)).to(dtype)),
         ("q1", "q2", "k1", "k2")),
        ("cross_entropy", lambda s: prepare_cross_entropy(
            rnd(s, 256, 8192), torch.randint(0, 8192, (256,), device=dev,
                                             generator=torch.Generator(device=dev).manual_seed(5 + s)),
            return_grad=True), ("loss", "grad")),
    ):
        op, mk = fam(prep)
        cases.append((name, op, mk, outs))

    def mm_args(s: int) -> tuple:
        a, b = rnd(s, 1, 512, 1024), rnd(s + 50, 1, 1024, 768)
        c = torch.empty(1, 512, 768, dtype=dtype, device=dev)
        one = torch.ones(1, dtype=torch.float32, device=dev)
        return (a, b, c, one, one, False, False, False)

    # matmul's GEMM is a library op too, but is tuned over its whole space here, as it was before it became
    # one: main's LibraryOp.configure(budget=...) is meant for the memory-bound ops
    lib = gemm_mod.GEMM
    gemm_op = autotune(lib.space_for(None), reference=lib.reference, writes=list(lib.writes), tolerance=lib.tolerance,
                       name=lib.name, buckets=lib.buckets)(lib.plan)
    cases.append(("matmul", gemm_op, mm_args, ("c",)))

    def att_args(s: int) -> tuple:
        q, k, v = rnd(s, 1, 8, 512, 128), rnd(s + 50, 1, 2, 512, 128), rnd(s + 90, 1, 2, 512, 128)
        o = torch.empty_like(q)
        return (q, k, v, o, True, att_mod.LOG2E / 128 ** 0.5)

    cases.append(("attention", att_mod.attention_op_for(128), att_args, ("o",)))
    return cases


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="directory for planted_bugs.json")
    ap.add_argument("--max-evals", type=int, default=8, help="evaluations per memory-bound op's tuning")
    ns = ap.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="tiletune-planted-")
    os.environ["TILETUNE_DB"] = str(Path(tmp) / "tuning.db")  # fresh database: every op really tunes
    import torch

    if not torch.cuda.is_available():
        print("planted_bugs.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import tiletune as tt
    from tiletune.kernels.library_op import LibraryOp

    LibraryOp.configure(db=os.environ["TILETUNE_DB"], progress=False, budget=tt.Budget(max_evals=ns.max_evals))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    try:
        from _common import environment

        env = environment()
    except Exception as exc:  # pragma: no cover - metadata only
        env = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "environment_error": repr(exc)}

    rows: list[dict[str, Any]] = []
    real: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for name, op, mk, outs in _cases("cuda", torch.bfloat16):
        t1 = time.perf_counter()
        try:
            r, rc = gate_rows(name, op, mk, outs)
        except Exception as exc:  # record and go on: one broken op must not hide the others
            r, rc = [{"op": name, "bug": "error", "rejected": None, "reason": f"{type(exc).__name__}: {exc}"}], \
                {"op": name, "candidates": 0, "mismatches": None, "error": f"{type(exc).__name__}: {exc}"}
        rc["seconds"] = round(time.perf_counter() - t1, 2)
        rows += r
        real.append(rc)
        bad = [x for x in r if (x["bug"] == "none") == bool(x["rejected"])]
        print(f"{name}: {len(r)} rows, {len(bad)} wrong verdicts, {rc['candidates']} candidates, "
              f"{rc['mismatches']} mismatches ({rc['seconds']} s)", flush=True)
    planted = [x for x in rows if x["bug"] not in ("none", "error")]
    doc = {
        "benchmark": "planted_bugs",
        "gpu": env.get("gpu"), "driver": env.get("driver"), "versions": env.get("versions"), "date": env.get("date"),
        "environment": env,
        "dtype": "bfloat16",
        "bugs": list(BUGS),
        "all_planted_rejected": all(x["rejected"] is True for x in planted) and bool(planted),
        "all_real_outputs_pass": all(x["rejected"] is False for x in rows if x["bug"] == "none"),
        "all_real_configs_pass": all(x.get("mismatches") == 0 and x.get("candidates", 0) > 0 for x in real),
        "seconds": round(time.perf_counter() - t0, 1),
        "rows": rows,
        "real_configs": real,
    }
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "planted_bugs.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(json.dumps({k: doc[k] for k in ("all_planted_rejected", "all_real_outputs_pass", "all_real_configs_pass",
                                          "seconds")}))
    return 0 if doc["all_planted_rejected"] and doc["all_real_outputs_pass"] and doc["all_real_configs_pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
