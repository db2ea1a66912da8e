"""A campaign on a local Ray cluster (2 actors on 2 logical GPUs, fake backend, CPU): the results stream
into the caller's database and the picks are those of the local pool.

Two actors, as many as the local pool's workers: each is a Python importing torch and tiletune (2-3
CPU-seconds on a small CPU machine), and two already show one GPU per actor."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from tiletune.lab.campaign import compare_picks, parse_campaign, run_campaign  # noqa: E402
from tiletune.store import TuningDB  # noqa: E402

HELPERS = Path(__file__).parent / "helpers"

SPEC = {"device": "cpu", "ops": [
    {"op": "campaign_ops:slow_double", "args": [{"shape": ["N"]}, {"shape": ["N"]}], "shapes": {"N": [2, 4, 8, 16, 32]}},
    {"op": "campaign_ops:scale", "args": [{"shape": ["M", "N"]}, {"shape": ["M", "N"]}],
     "shapes": {"M": [2, 4], "N": [8, 16]}, "strategy": "evolutionary", "budget": {"evals": 4}},
]}


@pytest.fixture(autouse=True)
def helpers_on_path(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(HELPERS))
    monkeypatch.setenv("TILETUNE_DB", str(tmp_path / "default.db"))
    monkeypatch.setenv("CAMPAIGN_TEST_SLEEP", "0.02")
    sys.modules.pop("campaign_ops", None)
    yield
    sys.modules.pop("campaign_ops", None)


def test_a_campaign_on_ray_actors_picks_what_the_local_pool_picks(tmp_path):
    spec = parse_campaign(SPEC)
    local_db = TuningDB(tmp_path / "local.db")
    local = run_campaign(spec, db=local_db, gpus=2).report
    assert (local["tuned"], local["failed"]) == (9, 0)
    ray_db = TuningDB(tmp_path / "ray.db")
    assert not ray.is_initialized()
    try:
        # a local cluster with 2 logical GPUs: the actors ask for num_gpus=1 each, as on a GPU cluster
        got = run_campaign(spec, db=ray_db, ray=True, lookahead=1,
                           ray_init={"num_cpus": 2, "num_gpus": 2, "logging_level": "ERROR",
                                     "include_dashboard": False}).report
        assert ray.cluster_resources().get("GPU") == 2
    finally:
        ray.shutdown()
    assert got["ray"] and (got["tuned"], got["failed"]) == (9, 0), got["rows"]
    devices = [w["visible_devices"] for w in got["workers"]]
    assert len(devices) == len(set(devices)) and set(devices) <= {"0", "1"}  # one GPU per actor
    assert {r["worker"] for r in got["rows"]} <= {0, 1}
    assert len(ray_db.winners()) == 9 and len(ray_db.sessions()) == 9  # streamed into the caller's database
    same = compare_picks(local_db, ray_db)
    assert (same["keys"], same["same"]) == (9, 9), same["rows"]
