"""A campaign of library ops on the GPU: one worker, compiles ahead, results in the caller's database."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.tile")
# a mark, not a module-level skip: the CPU run deselects this module instead of listing a skip
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

from tiletune.lab.campaign import parse_campaign, run_campaign  # noqa: E402
from tiletune.store import TuningDB  # noqa: E402


def test_a_gpu_campaign_compiles_ahead_and_resumes(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_TILE_CACHE_DIR", str(tmp_path / "cutile-cache"))  # the workers compile cold
    spec = parse_campaign({"device": "cuda", "ops": [
        {"op": "rms_norm", "tokens": [64], "hidden": [1024, 2048, 3072]},
        {"op": "softmax", "tokens": [64], "hidden": [1024]}]})
    db = TuningDB(tmp_path / "gpu.db")
    rep = run_campaign(spec, db=db, gpus=1, lookahead=2).report
    assert (rep["tuned"], rep["failed"]) == (4, 0), rep["rows"]
    ahead = [r["precompile"] for r in rep["rows"] if r.get("precompile", {}).get("jobs")]
    assert ahead and all(a["errors"] == 0 for a in ahead), [r.get("precompile") for r in rep["rows"]]
    assert rep["workers"][0]["gpu"] == torch.cuda.get_device_name()
    again = run_campaign(spec, db=db, gpus=1).report
    assert (again["tuned"], again["stored"]) == (0, 4)
    assert [r["keys"][0]["config"] for r in again["rows"]] == [r["keys"][0]["config"] for r in rep["rows"]]
