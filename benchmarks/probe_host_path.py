#!/usr/bin/env python
"""Where a library op's host time goes, layer by layer (issue 12 diagnostics).

``host_cost.py`` (H200, 2026-12-02) put softmax and cross_entropy at 1.2-1.36x torch's host time while the
bare launches of the same kernels cost 0.5-0.7x of torch's whole call: the rest is the wrapper. For
each row given, this times (interleaved batches, ``host_cost.host_times``) the public call, the learnt
recipe called directly, the bare launches (``host_cost.launch_floor``), the output allocation alone,
``torch.compiler.is_compiling()``, the guard lookup, and torch's route; and prints each recipe's source.

    python benchmarks/probe_host_path.py [--rows "softmax M=8,rms_norm[weight] M=8"] [--out DIR]

Writes ``<out>/probe_host_path.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_OUT, run_rows, write_result  # noqa: E402

DEFAULT_ROWS = "softmax M=8,rms_norm[weight] M=8,cross_entropy M=8,layer_norm M=8"


def specs_named(names: list[str]) -> list[dict[str, Any]]:
    """host_cost's row specs with these names (ValueError naming the unknown ones)."""
    import host_cost

    by_name = {s["name"]: s for s in host_cost.row_specs()}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown rows {unknown}; host_cost rows are: {', '.join(by_name)}")
    return [by_name[n] for n in names]


def layers(spec: dict[str, Any], rounds: int) -> dict[str, Any]:
    import torch

    import host_cost
    from tiletune.kernels import fastcall

    case = host_cost.build_case(spec)
    args = case["make"](0)
    tt_fn = case["tiletune"]
    for _ in range(4):
        tt_fn(*args)
    torch.cuda.synchronize()
    floor, n_launches = host_cost.launch_floor(tt_fn, args)
    route_name, route = next(iter(case["routes"].items()))
    recipes = [(w.name, sig, r) for w in fastcall._wrappers for sig, r in w.recipes.items()]
    # the recipe this call replays: the one whose wrapper's guard table passes these arguments
    replayed = None
    for w in fastcall._wrappers:
        hit = w.guards.lookup(tuple(args))
        if hit is not None:
            replayed = (w, hit)
    variants: dict[str, tuple[Callable[..., Any], tuple, int]] = {
        "public": (tt_fn, args, 200), "floor": (floor, args, 200), route_name: (route, args, 200),
        "empty_like": (lambda *a: torch.empty_like(a[0]), args, 200),
        "is_compiling": (lambda *a: torch.compiler.is_compiling(), args, 200),
    }
    if replayed is not None:
        w, recipe = replayed
        variants["recipe"] = (lambda *a, _r=recipe: _r(a), args, 200)
        variants["guard_lookup"] = (lambda *a, _g=w.guards: _g.lookup(a), args, 200)
    res = host_cost.host_times(variants, rounds)
    return {"row": spec["name"], "launches": n_launches, "us": {k: round(v["us"], 3) for k, v in res.items()},
            "replayed_wrapper": replayed[0].name if replayed else None,
            "recipe_source": getattr(replayed[1], "source", None) if replayed else None,
            "recipes_learnt": [(name, len(str(sig))) for name, sig, _ in recipes][:20]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=DEFAULT_ROWS, help="host_cost row names, comma-separated")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    try:
        specs = specs_named([n.strip() for n in a.rows.split(",") if n.strip()])
    except ValueError as exc:
        ap.error(str(exc))
    import torch

    if not torch.cuda.is_available():
        print("probe_host_path: needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(a.out or os.environ.get("BENCH_OUT") or DEFAULT_OUT)
    rows, _ = run_rows(specs, lambda spec: layers(spec, a.rounds),
                       lambda r: [f"{r['row']}: {r['us']}", str(r["recipe_source"])])
    write_result("probe_host_path", {"rows": rows}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
