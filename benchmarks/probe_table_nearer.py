#!/usr/bin/env python
"""Probe the tables' bucket answers: the bucket's entry against the entry nearest the call's own rows.

A GEMM key buckets its rows up to a power of two (``M = 1,058`` keys as the 2,048-row bucket), and the shipped
table's entry for a bucket was tuned at its bound. Should such a call be answered by the bucket's entry, or by the
entry nearest the call's own sizes (the 1,024-row entry for 1,058 rows)? This probe measures the two on the rows
where their configs differ. (Its H200 run of 2026-12-07, ``results/h200/probe_table_nearer_seed13_2026-12-07``:
neither wins reliably; since then a shipped table leaves such calls to the
nearest-neighbour race, both entries among the configs raced, and the library call's column measures that.)

Rows (``--rows M:N:K,...``, or drawn with ``--seed`` from the H200 table's ``tiletune.gemm`` entries of
``nn.Linear``'s layout): for each pair of entries of one ``(N, K)`` at ``M_lo`` and ``2 M_lo`` whose configs
differ, ``--per-pair`` values of ``M`` are drawn where the rule switches (above ``M_lo``, below the geometric
middle). For each row, ``x @ w.t()`` in bf16: the bucket entry's config and the nearer entry's config (each as
a one-config op over the library GEMM's plan), the library call as served (what answered: source, config,
neighbour), ``F.linear``, all timed with ``triton.testing.do_bench`` (L2 flushed) in interleaved rounds.
``nearer_vs_bucket`` < 1: the rule helps on that row. Writes ``<out>/probe_table_nearer.json.gz``.

    python benchmarks/probe_table_nearer.py [--seed 5] [--per-pair 2] [--rows M:N:K,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import do_bench_rounds, run_probe  # noqa: E402

TABLE = Path(__file__).resolve().parent.parent / "src" / "tiletune" / "data" / "tables" / "h200-sm90.json"


def gemm_entries(table: Path = TABLE) -> dict[tuple[int, int, int], dict[str, Any]]:
    """``{(M, N, K): config}`` of the table's plain GEMM entries for ``x @ w.t()`` (layout ``nt``, bf16, batch 1)."""
    doc = json.loads(table.read_text())
    out = {}
    for e in doc["entries"]:
        if e["name"] != "tiletune.gemm":
            continue
        p = json.loads(e["key"])[-1]
        if p.get("layout") == "nt" and p.get("batch") == 1 and p.get("dtype") == "bfloat16" and not p.get("scaled"):
            out[(int(p["M"]), int(p["N"]), int(p["K"]))] = dict(e["config"])
    return out


def bucket(m: int) -> int:
    return 1 << (m - 1).bit_length()


def nearer_m(m: int, have: list[int]) -> int:
    """The tuned row count nearest ``m`` (log scale, as the table source measures; ties: the larger)."""
    return min(have, key=lambda t: (abs(math.log2(1 + m) - math.log2(1 + t)), -t))


def draw_rows(seed: int, per_pair: int, entries: dict[tuple[int, int, int], dict[str, Any]]) -> list[tuple[int, int, int]]:
    rng = random.Random(seed)
    rows = []
    for (m, n, k), cfg in sorted(entries.items()):
        hi = entries.get((2 * m, n, k))
        if hi is None or hi == cfg:
            continue
        top = int(math.sqrt((m + 1) * (2 * m + 1))) - 1  # the geometric middle: below it the lower entry is nearer
        for _ in range(per_pair):
            rows.append((rng.randint(m + 1, max(m + 1, top - 1)), n, k))
    return rows


def parse_rows(text: str) -> list[tuple[int, int, int]]:
    rows = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        parts = item.split(":")
        if len(parts) != 3 or not all(p.strip().isdigit() for p in parts):
            raise ValueError(f"row {item!r}: expected M:N:K (integers)")
        m, n, k = (int(p) for p in parts)
        if m < 257:
            raise ValueError(f"row {item!r}: M >= 257 (smaller products take the split-K op)")
        rows.append((m, n, k))
    if not rows:
        raise ValueError("no rows")
    return rows


def probe_row(m: int, n: int, k: int) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    import tiletune as tt
    import tiletune.kernels as K
    from tiletune import wait_for_compiles
    from tiletune.kernels.gemm import GEMM
    from nearest_quality import ChoiceLog
    from probe_gemm_space import linear_operands

    entries = gemm_entries()
    have = sorted(t for (t, nn, kk) in entries if (nn, kk) == (n, k))
    if bucket(m) not in have:
        raise ValueError(f"{m}x{n}x{k}: the table has no entry for the {bucket(m)}-row bucket of this N, K")
    near = nearer_m(m, have)
    cfg_bucket, cfg_near = entries[(bucket(m), n, k)], entries[(near, n, k)]
    x, w, args = linear_operands(m, n, k, seed=m)

    def one_config(cfg: dict[str, Any], tag: str) -> Any:
        return tt.autotune(tt.Space(**{p: [v] for p, v in cfg.items()}), reference=GEMM.reference,
                           writes=list(GEMM.writes), tolerance=GEMM.tolerance, name=f"probe_table_nearer.{tag}",
                           db=False, progress=False)(GEMM.plan)

    at_bucket, at_near = one_config(cfg_bucket, "bucket"), one_config(cfg_near, "nearer")
    routes = {"bucket entry": lambda: at_bucket(*args), "nearer entry": lambda: at_near(*args),
              "library call": lambda: K.matmul(x, w.t()), "F.linear": lambda: F.linear(x, w)}
    with ChoiceLog() as log:
        for fn in routes.values():
            fn()
        wait_for_compiles()
        routes["library call"]()
    torch.cuda.synchronize()
    served = [dict(info, op=name) for name, _, info in log.items if name.startswith("tiletune.gemm")]
    head = do_bench_rounds(routes, warmup=10, rep=60)
    return {"shape": f"{m}x{n}x{k}", "bucket_m": bucket(m), "nearer_m": near, "bucket_config": cfg_bucket,
            "nearer_config": cfg_near, "served": [{q: v for q, v in c.items() if q != "tuning"} for c in served],
            "head_to_head_us": head,
            "nearer_vs_bucket": round(head["nearer entry"] / head["bucket entry"], 4),
            "library_vs_linear": round(head["library call"] / head["F.linear"], 4)}


def report(r: dict[str, Any]) -> list[str]:
    return [f"{r['shape']}: nearer ({r['nearer_m']}) / bucket ({r['bucket_m']}) = {r['nearer_vs_bucket']}; "
            f"{r['head_to_head_us']}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default=None, help="M:N:K, comma-separated (default: drawn from the table)")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--per-pair", type=int, default=2)
    ap.add_argument("--out", default=None)
    pre, _ = ap.parse_known_args()
    if pre.rows is None:  # drawn rows, written out so run_probe parses them like given ones
        drawn = draw_rows(pre.seed, pre.per_pair, gemm_entries())
        ap.set_defaults(rows=",".join(f"{m}:{n}:{k}" for m, n, k in drawn))
    return run_probe("probe_table_nearer", ap, parse_rows, lambda row, args: probe_row(*row), report)


if __name__ == "__main__":
    sys.exit(main())
