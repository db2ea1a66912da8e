"""Tune the library ops over LLM shapes and write the shipped tuning table.

Tunes ``tiletune.lab.fill.llm_calls`` for the library ops over token counts (one per row bucket: powers of
two 1..16384; attention at a few sequence lengths, it is not bucketed) into a fresh database, the
commonest token counts first, until a wall-clock deadline; then exports the winners as a tuning
table (``TuningTable.from_db``), merged into the existing table file when it was made for the same
device and versions (so a later run adds buckets: pass the token counts still missing with
``--tokens``; an entry of a call tuned again replaces the old one). Re-running with the same ``--db``
resumes: stored keys are skipped. ``tests/test_shipped_table.py`` fails when a kernel, plan or space
edit leaves shipped entries stale: re-run this on the GPU for their token counts.

    python benchmarks/make_table.py --db /tmp/fill.db --table src/tiletune/data/tables/h200-sm90.json \
        [--deadline-s 400] [--report OUT.json]

The matmul entries ``benchmarks/nearest_quality.py``'s worst rows asked for (2026-12-04: the table held
``x @ w.t()`` winners for Llama widths only, so a Phi-3 ``o`` projection at 286 tokens raced three Llama
configs and ran 1.25x its exact tuning, 64x64 tiles against 64x128): the fused projections of Llama-3-8B
(= Mistral-7B), Qwen2.5-7B, Gemma-2-9B and Phi-3-mini in ``nn.Linear`` layout, plain GEMM buckets first
(74 new keys, ~2-4 s each), then split-K buckets (42 new keys, ~10-15 s each; what the deadline leaves is
printed and can be run later with the same ``--db``). ``TILETUNE_TABLES=1`` skips keys the table holds::

    TILETUNE_TABLES=1 python benchmarks/make_table.py --db /tmp/fill.db \
        --table src/tiletune/data/tables/h200-sm90.json --ops matmul --no-attention --projections \
        --linear-weights --fused --model llama3-8b,qwen2.5-7b,gemma2-9b,phi3-mini \
        --tokens 512,1024,2048,4096,8192,256,64,16 --deadline-s 480 --report $OUT/fill_matmul.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# the order keys are tuned in: the commonest batch x token counts first, so a deadline cuts the rarest
TOKENS = (1, 16, 128, 1024, 4096, 8, 64, 512, 2048, 2, 4, 32, 256, 8192, 16384)
ATTENTION_S = (1024, 2048, 4096)
MEMORY_OPS = ("rms_norm", "rms_norm_residual", "layer_norm", "softmax", "swiglu", "geglu", "apply_rope_",
              "cross_entropy", "matmul")


def attention_variants(calls: list, causal: str) -> list:
    """The attention calls (made causal) as asked: ``true`` as they are, ``false`` non-causal, ``both``
    each call causal then non-causal."""
    from dataclasses import replace

    def flag(c, value: bool):
        return replace(c, kwargs={**dict(c.kwargs), "causal": value})

    if causal == "true":
        return list(calls)
    if causal == "false":
        return [flag(c, False) for c in calls]
    return [v for c in calls for v in (c, flag(c, False))]


def unique_calls(calls):
    """The calls in order, each once (two models sharing a projection shape tune it once)."""
    seen, out = set(), []
    for c in calls:
        k = c.describe()
        if k not in seen:
            seen.add(k)
            out.append(c)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True, help="tuning database to fill (resumed if it exists)")
    ap.add_argument("--table", required=True, help="table file to write (.gz for gzip)")
    ap.add_argument("--deadline-s", type=float, default=400.0, help="stop starting new keys after this")
    ap.add_argument("--report", default=None, help="per-call report JSON")
    ap.add_argument("--no-attention", action="store_true")
    ap.add_argument("--tokens", default=None, help="comma-separated token counts (default: all, commonest first)")
    ap.add_argument("--ops", default=",".join(MEMORY_OPS), help="library ops tuned over --tokens (default: all)")
    ap.add_argument("--attention-s", default=",".join(map(str, ATTENTION_S)),
                    help="attention sequence lengths (default: %(default)s)")
    ap.add_argument("--attention-first", action="store_true", help="tune the attention keys before the rest")
    ap.add_argument("--attention-causal", choices=("true", "false", "both"), default="true",
                    help="attention keys: causal (default), non-causal (encoders, cross-attention), or both")
    ap.add_argument("--model", default=None, help="shapes of a model of tiletune.lab.fill.MODEL_SHAPES, or several "
                    "comma-separated (one device call fills them all; a call two models share is tuned once) "
                    "(default: Llama-class, vocabulary 32000)")
    ap.add_argument("--projections", action="store_true",
                    help="matmul: the four projections of a decoder layer instead of one hidden x hidden")
    ap.add_argument("--linear-weights", action="store_true",
                    help="matmul weights in nn.Linear's layout (stored N x K, passed as w.t()); with --projections "
                         "the separate q, k, v, o, gate, up and down layers of a Hugging Face decoder")
    ap.add_argument("--fused", action="store_true",
                    help="with --projections --linear-weights: the fused qkv, o, fused gate-up and down weights in "
                         "nn.Linear's layout (the matmul shapes benchmarks/nearest_quality.py draws)")
    ap.add_argument("--whole-spaces", action="store_true",
                    help="measure every config of every key (LibraryOp.configure(budget=Budget())), not the "
                         "budgeted search a cold key gets at run time: a shipped table is made once, offline")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")] if args.tokens else list(TOKENS)
    seqs = [int(s) for s in args.attention_s.split(",") if s]
    off = [n for n in (*tokens, *seqs) if n < 1 or n & (n - 1)]
    if off:  # a shipped table answers a bucketed call from its entry nearest the call (tables.made_at_bounds)
        ap.error(f"token counts and sequence lengths must be powers of two, the bounds of the keys' buckets "
                 f"(a shipped entry is tuned at its key's sizes): {off}")
    os.environ["TILETUNE_DB"] = args.db
    os.environ.setdefault("TILETUNE_TABLES", "0")  # tune every key: an older table must not answer

    from tiletune.lab.fill import llm_calls, model_dims, run_calls
    from tiletune.store import TuningDB
    from tiletune.resolve.tables import TuningTable

    ops = [o for o in args.ops.split(",") if o]
    unknown = sorted(set(ops) - set(MEMORY_OPS))
    if unknown:
        ap.error(f"unknown op(s) {unknown}; known: {', '.join(MEMORY_OPS)}")
    try:
        all_dims = [model_dims(m) for m in args.model.split(",") if m] if args.model else [model_dims(None)]
    except ValueError as exc:
        ap.error(str(exc))
    if args.whole_spaces:
        from tiletune import Budget
        from tiletune.kernels.library_op import LibraryOp

        LibraryOp.configure(budget=Budget())
    calls = unique_calls(c for m in tokens for dims in all_dims
                         for c in llm_calls(ops, [m], projections=args.projections, linear_weights=args.linear_weights,
                                            fused=args.fused, **dims)) if ops else []
    if not args.no_attention:
        attention = unique_calls(c for dims in all_dims
                                 for c in llm_calls(["attention"], seqs, **dims))
        attention = attention_variants(attention, args.attention_causal)
        calls = attention + calls if args.attention_first else calls + attention
    t0 = time.perf_counter()
    rows, skipped = [], 0
    for call in calls:
        if time.perf_counter() - t0 > args.deadline_s:
            skipped += 1
            continue
        rep = run_calls([call], progress=False)
        row = rep.rows[0]
        rows.append(row)
        print(f"{'ok ' if row['ok'] else 'ERR'} {row['seconds']:8.2f} s  {row['call']}"
              + ("" if row["ok"] else f"  {row['error']}"), flush=True)
    table = TuningTable.from_db(TuningDB(args.db))
    if os.path.exists(args.table):
        old = TuningTable.load(args.table)
        if old.device == table.device and old.versions == table.versions:
            # an old entry for a call this run tuned again (same op name and key, e.g. after a kernel edit
            # changed its kernel id) is replaced, not kept beside the new one
            redone = {(e.name, e.key) for e in table.entries.values()}
            kept = [e for k, e in old.entries.items() if k not in table.entries and (e.name, e.key) not in redone]
            table = TuningTable(table.device, table.versions, [*kept, *table.entries.values()])
            print(f"merged {len(kept)} entries of the existing table", flush=True)
        else:
            print(f"the existing table was made for {old.device} {old.versions}: replaced", flush=True)
    path = table.save(args.table)
    size = path.stat().st_size
    print(f"table: {len(table)} entries, {size} bytes -> {path}; {skipped} call(s) left for a later run", flush=True)
    if args.report:
        with open(args.report, "w") as f:
            json.dump({"calls": len(calls), "done": len(rows), "skipped": skipped, "table_entries": len(table),
                       "table_bytes": size, "wall_s": time.perf_counter() - t0, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
