#!/usr/bin/env python
"""Rewrite the keys of a tuning table to the library ops' current key format (issue 40, item 3).

The GEMM, RoPE, attention and decode-attention ops key named problems now
(:mod:`tiletune.kernels._keys`); entries stored with the older per-argument keys would never match a call
again. :func:`tiletune.kernels._keys.convert_stored_key` re-keys each entry where that is a pure re-keying
(a GEMM key: the same bucket, named; a RoPE key of a batch of one: tokens = sequence; an attention key whose
sizes are the tops of their new power-of-two buckets) and the entry is dropped otherwise (it is re-made by
tuning on first use, or on a GPU with ``benchmarks/make_table.py``). Kernel ids, space hashes and configs
are left as they are.

    python tools/convert_table_keys.py src/tiletune/data/tables/h200-sm90.json      # in place
    python tools/convert_table_keys.py IN.json --out OUT.json --dry-run             # counts only
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import Counter

from tiletune.kernels._keys import convert_stored_key
from tiletune.records import canonical_json
from tiletune.resolve.tables import TuningTable


def convert_table(table: TuningTable) -> tuple[TuningTable, Counter, Counter, Counter]:
    """``(converted table, kept unchanged, re-keyed, dropped)`` (counters by op name)."""
    same: Counter = Counter()
    rekeyed: Counter = Counter()
    dropped: Counter = Counter()
    entries = []
    for e in sorted(table.entries.values(), key=lambda e: (e.name, e.key)):
        new = convert_stored_key(e.name, json.loads(e.key))
        if new is None:
            dropped[e.name] += 1
            continue
        text = canonical_json(new)
        if text == e.key:
            same[e.name] += 1
        else:
            rekeyed[e.name] += 1
        entries.append(dataclasses.replace(e, key=text))
    out = TuningTable(table.device, table.versions, entries, source=table.source, created=table.created)
    return out, same, rekeyed, dropped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("table")
    ap.add_argument("--out", help="write here (default: in place)")
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    table = TuningTable.load(a.table)
    out, same, rekeyed, dropped = convert_table(table)
    print(f"{a.table}: {len(table)} entries: {sum(same.values())} unchanged, {sum(rekeyed.values())} re-keyed, "
          f"{sum(dropped.values())} dropped -> {len(out)}")
    for name in sorted(set(same) | set(rekeyed) | set(dropped)):
        print(f"  {name:32s} unchanged {same[name]:3d}  re-keyed {rekeyed[name]:3d}  dropped {dropped[name]:3d}")
    if not a.dry_run:
        out.save(a.out or a.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
