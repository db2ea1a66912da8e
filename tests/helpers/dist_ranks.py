"""One rank of tests/test_distributed.py: tunes with and without a gloo process group, writes what it picked."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import dist_ops
from tiletune.lab import fill
from tiletune.lab.fill import tune_calls

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
sizes = [4, 8, 16, 32, 64, 128]
order = sizes[rank:] + sizes[:rank]  # ranks meet the keys in different orders


def run(op):
    picks = {}
    for n in order:
        x, y = torch.ones(n), torch.empty(n)
        op(x, y)
        assert bool((y == 2).all())
        picks[n] = op.config_for(x, y).K
    return picks


out = {"rank": rank, "alone": run(dist_ops.alone)}  # no process group: every rank tunes on its own
dist.init_process_group("gloo", rank=rank, world_size=world)
out["agree"] = run(dist_ops.agree)
out["agree_tuned"] = dist_ops.agree.tuning_count
calls = [fill.Call("dist_ops:split", ({"shape": [n]}, {"shape": [n]})) for n in sizes]
report = tune_calls(calls, device="cpu")  # rank r makes calls r, r + world, ...
out["split_calls"] = len(report.rows)
out["split_tuned"] = dist_ops.split.tuning_count
out["split"] = run(dist_ops.split)
out["split_tuned_after"] = dist_ops.split.tuning_count
out["stored"] = len(dist_ops.DB.winners())
dist.barrier()
dist.destroy_process_group()
with open(os.path.join(os.environ["DIST_TEST_DIR"], f"rank{rank}.json"), "w") as f:
    json.dump(out, f)
