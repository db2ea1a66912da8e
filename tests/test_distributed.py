"""Rank-consistent picks (tiletune.resolve.peers): three CPU processes in a gloo process group, fake
backends whose timings differ per rank. On their own the ranks pick differently; in the job every key
has one pick, tuned once, whichever rank meets it first, and ``tune_calls`` splits the tuning."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available in this torch build", allow_module_level=True)

from tiletune.resolve import peers as distributed  # noqa: E402

HELPERS = Path(__file__).parent / "helpers"
SRC = Path(__file__).resolve().parents[1] / "src"
WORLD = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_process_group_no_peers():
    assert distributed.peers() is None


def test_ranks_use_one_pick_per_key(tmp_path):
    port = _free_port()
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   DIST_TEST_DIR=str(tmp_path), TILETUNE_PROGRESS="0",
                   PYTHONPATH=os.pathsep.join([str(SRC), str(HELPERS), os.environ.get("PYTHONPATH", "")]))
        procs.append(subprocess.Popen([sys.executable, str(HELPERS / "dist_ranks.py")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outs = []
    for p in procs:
        text = p.communicate(timeout=240)[0].decode()
        assert p.returncode == 0, text
    for rank in range(WORLD):
        outs.append(json.loads((tmp_path / f"rank{rank}.json").read_text()))
    keys = list(outs[0]["agree"])
    # the control: tuned alone, each rank picks its own fastest config
    assert [sorted(set(o["alone"].values())) for o in outs] == [[0], [1], [2]]
    # in the job: one pick per key on every rank, each key tuned once in the whole job
    for k in keys:
        assert len({o["agree"][k] for o in outs}) == 1, (k, [o["agree"][k] for o in outs])
        assert len({o["split"][k] for o in outs}) == 1, (k, [o["split"][k] for o in outs])
    assert sum(o["agree_tuned"] for o in outs) == len(keys)
    # tune_calls: rank r made calls r, r + 3: two keys each, tuned in parallel; afterwards nothing is tuned
    assert [o["split_calls"] for o in outs] == [2, 2, 2]
    assert [o["split_tuned"] for o in outs] == [2, 2, 2]
    assert [o["split_tuned_after"] for o in outs] == [2, 2, 2]
    # every rank's database holds every key of both ops (the others' picks recorded without measurements)
    assert [o["stored"] for o in outs] == [2 * len(keys)] * WORLD
