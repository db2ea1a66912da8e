#!/usr/bin/env python
"""What one call of a ``torch.library`` op costs on the host, by registration style (issue 43 item 1).

Runs on a CPU machine (no kernel is launched): every implementation is a trivial function that
returns a preallocated tensor, so what is timed is the dispatch around it.

Variants (per call, median of ``--rounds`` batches of ``--calls`` calls, interleaved):

* ``direct``: the trivial implementation called as a Python function;
* ``custom_op`` / ``custom_op_mut``: a ``torch.library.custom_op`` (the registration tiletune used until
  2026-12, with a fake), an rms_norm-shaped op and an apply_rope_-shaped op that mutates two inputs;
* ``lean`` / ``lean_mut``: the same schemas defined with ``torch.library.Library(ns, "DEF")``, the
  implementation registered for the CPU (and CUDA) keys and a fake with ``torch.library.register_fake``
  (no Python autograd or ADInplaceOrView layer);
* ``tiletune``: ``torch.ops.tiletune.rms_norm.default`` itself, with the eager public function behind
  it replaced by the trivial one (whatever this checkout registers), and the ``__import__`` calls one
  such call makes;
* ``compiled_*``: a ``torch.compile(fullgraph=True)`` (Inductor, CPU) function calling the op
  ``--chain`` times, per op call, after subtracting the compiled function's fixed cost (the same
  function with ``torch.ops.aten.alias`` in place of the op).

``--profile`` adds the top entries of a cProfile of 10,000 calls of each registration.

    python benchmarks/compile_dispatch.py [--out DIR] [--calls 2000] [--rounds 9] [--profile]

Writes ``<out>/compile_dispatch.json`` (default ``benchmarks/results/cpu``).
"""

from __future__ import annotations

import argparse
import builtins
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from _common import ROOT, write_result  # noqa: E402

RMS_SCHEMA = "(Tensor x, Tensor? weight, float eps) -> Tensor"
ROPE_SCHEMA = "(Tensor(a!) q, Tensor(b!) k, Tensor cos, Tensor sin, str layout) -> ()"


def register_variants(out: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Callable[..., Any]]:
    """The two registration styles of an rms_norm-shaped and an apply_rope_-shaped op, trivial bodies
    (one of two preallocated tensors, never the input: a custom op may not return its input)."""
    o0, o1 = out

    def rms(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        return o1 if x is o0 else o0

    def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> None:
        return None

    co = torch.library.custom_op("taxco::rms", mutates_args=())(rms)
    co.register_fake(lambda x, weight, eps: x.new_empty(x.shape))
    co_mut = torch.library.custom_op("taxco::rope", mutates_args=("q", "k"))(rope)
    co_mut.register_fake(lambda q, k, cos, sin, layout: None)

    lib = torch.library.Library("taxlean", "DEF")
    register_variants.lib = lib  # type: ignore[attr-defined]  # keep the registrations alive
    lib.define("rms" + RMS_SCHEMA)
    lib.define("rope" + ROPE_SCHEMA)
    for key in ("CPU", "CUDA"):
        lib.impl("rms", rms, key)
        lib.impl("rope", rope, key)
    torch.library.register_fake("taxlean::rms", lambda x, weight, eps: x.new_empty(x.shape), lib=lib)
    torch.library.register_fake("taxlean::rope", lambda q, k, cos, sin, layout: None, lib=lib)
    return {"direct": rms, "direct_mut": rope,
            "custom_op": torch.ops.taxco.rms.default, "custom_op_mut": torch.ops.taxco.rope.default,
            "lean": torch.ops.taxlean.rms.default, "lean_mut": torch.ops.taxlean.rope.default}


def stub_tiletune_rms_norm(out: tuple[torch.Tensor, torch.Tensor]) -> Callable[..., Any]:
    """``torch.ops.tiletune.rms_norm.default`` with the public function behind it made trivial."""
    from tiletune.kernels import torch_ops

    o0, o1 = out

    def trivial(x: Any, weight: Any = None, eps: Any = 1e-6) -> Any:
        return o1 if x is o0 else o0

    if hasattr(torch_ops, "bind"):  # the lean registration: bind the op's implementation
        torch_ops.bind("rms_norm", trivial)
    else:  # the custom_op registration imports the public function on every call
        import tiletune.kernels.norms as norms

        norms.rms_norm = trivial
    return torch.ops.tiletune.rms_norm.default


def imports_per_call(fn: Callable[[], Any], n: int = 100) -> float:
    """``builtins.__import__`` calls per call of ``fn`` (an ``import`` statement in a function calls it)."""
    seen = [0]
    real = builtins.__import__

    def counting(*a: Any, **k: Any) -> Any:
        seen[0] += 1
        return real(*a, **k)

    builtins.__import__ = counting
    try:
        for _ in range(n):
            fn()
    finally:
        builtins.__import__ = real
    return seen[0] / n


def timed(variants: dict[str, Callable[[], Any]], calls: int, rounds: int) -> dict[str, float]:
    """Median per-call microseconds of each zero-argument callable, batches interleaved."""
    samples: dict[str, list[float]] = {k: [] for k in variants}
    for fn in variants.values():
        for _ in range(200):
            fn()
    for _ in range(rounds):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {k: round(statistics.median(v), 3) for k, v in samples.items()}


def compiled_chain(op: Callable[..., Any], chain: int) -> Callable[..., Any]:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        for _ in range(chain):
            x = op(x, w, 1e-6)
        return x

    return torch.compile(f, fullgraph=True, backend="inductor")


def profile_top(fn: Callable[[], Any], n: int = 10_000, top: int = 12) -> list[str]:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    lines = [ln.rstrip() for ln in buf.getvalue().splitlines() if ln.strip()]
    head = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    return [lines[0].strip()] + lines[head:head + top + 1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cpu"))
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--chain", type=int, default=10)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)

    x, w = torch.randn(8, 64), torch.randn(64)
    q, k, cos, sin = torch.randn(1, 4, 2, 8), torch.randn(1, 4, 2, 8), torch.randn(4, 8), torch.randn(4, 8)
    out = (torch.empty(8, 64), torch.empty(8, 64))
    ops = register_variants(out)
    tt = stub_tiletune_rms_norm(out)
    calls = {
        "direct": lambda: ops["direct"](x, w, 1e-6),
        "custom_op": lambda: ops["custom_op"](x, w, 1e-6),
        "lean": lambda: ops["lean"](x, w, 1e-6),
        "tiletune": lambda: tt(x, w, 1e-6),
        "direct_mut": lambda: ops["direct_mut"](q, k, cos, sin, "bshd"),
        "custom_op_mut": lambda: ops["custom_op_mut"](q, k, cos, sin, "bshd"),
        "lean_mut": lambda: ops["lean_mut"](q, k, cos, sin, "bshd"),
    }
    eager = timed(calls, args.calls, args.rounds)

    chains = {name: compiled_chain(op, args.chain) for name, op in
              (("alias", lambda x, w, eps: torch.ops.aten.alias(x)), ("custom_op", ops["custom_op"]),
               ("lean", ops["lean"]), ("tiletune", tt))}
    compiled_calls = {name: (lambda f=f: f(x, w)) for name, f in chains.items()}
    whole = timed(compiled_calls, max(args.calls // args.chain, 50), args.rounds)
    per_op = {f"compiled_{k}": round((v - whole["alias"]) / args.chain, 3) for k, v in whole.items() if k != "alias"}

    data: dict[str, Any] = {
        "what": "host microseconds per call on CPU tensors, trivial implementations (the dispatch alone)",
        "calls": args.calls, "rounds": args.rounds, "chain": args.chain,
        "eager_us": eager,
        "compiled_function_us": whole,
        "compiled_per_op_us": per_op,
        "tiletune_imports_per_call": imports_per_call(calls["tiletune"]),
        "tiletune_registration": "lean" if hasattr(sys.modules["tiletune.kernels.torch_ops"], "bind") else "custom_op",
    }
    if args.profile:
        data["profile"] = {name: profile_top(calls[name]) for name in ("custom_op", "lean", "tiletune",
                                                                      "custom_op_mut", "lean_mut")}
    write_result("compile_dispatch", data, args.out)
    for name, rows in data.get("profile", {}).items():
        print(f"\n== cProfile, 10,000 calls: {name}")
        print("\n".join(rows))
    print(json.dumps({k: data[k] for k in ("eager_us", "compiled_per_op_us", "tiletune_imports_per_call")}, indent=1))
    return 0


if __name__ == "__main__":
    import json

    sys.exit(main())
