"""``tiletune tune --model`` warms exactly the keys a model's layer meets (issue 40, item 5). GPU.

1. ``tiletune tune --model llama3-8b`` over a small range (prefill: one sequence of 33-64 tokens; decode:
   one sequence over caches of 300-512 positions) into a fresh database, tables off;
2. a fresh process builds the decoder layer from ``tiletune.kernels`` (:func:`tiletune.lab.fill.decoder_layer`:
   ``x @ w.t()`` projections, RoPE on views of the fused qkv output, GQA attention; decode:
   ``kv_cache_append`` + ``decode_attention`` over the cache) at shapes inside that range that were not
   tuned as such (50 tokens; a 400-position cache), runs its first forward of each phase, and no tuning
   session starts: every library op's ``tuning_count`` stays 0.

Run on the GPU host: ``python -m pytest -m gpu -q tests/test_gpu_warm_model.py`` (about 2 minutes on an H200).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.tile")
pytestmark = [pytest.mark.gpu, pytest.mark.served, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FORWARD = textwrap.dedent("""
    import json, torch
    import tiletune.kernels as K
    from tiletune.kernels.library_op import LibraryOp
    from tiletune.lab.fill import decoder_layer, layer_inputs, model_dims

    dims = model_dims("llama3-8b")
    for phase, batch, length in (("prefill", 1, 50), ("decode", 1, 400)):
        p, args, kwargs = layer_inputs(dims, phase, batch, length, device="cuda")
        out = decoder_layer(K, p, *args, **kwargs)
        torch.cuda.synchronize()
        assert torch.isfinite(out.float()).all()
    print(json.dumps({"tuned": sum(op.tuning_count for lib in LibraryOp.instances() for op in lib.ops().values()),
                      "ops": sorted({lib.name for lib in LibraryOp.instances() if lib.ops()})}))
""")


def test_tune_model_warms_the_layer_it_then_runs(tmp_path):
    env = dict(os.environ, TILETUNE_DB=str(tmp_path / "tuning.db"), TILETUNE_TABLES="0", TILETUNE_PROGRESS="0")
    tune = subprocess.run(
        [sys.executable, "-m", "tiletune.cli", "tune", "--model", "llama3-8b", "--phase", "prefill,decode",
         "--batch", "1", "--seq", "33-64", "--cache", "300-512"],
        env=env, capture_output=True, text=True, timeout=600)
    assert tune.returncode == 0, tune.stdout[-4000:] + tune.stderr[-4000:]
    run = subprocess.run([sys.executable, "-c", FORWARD], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["tuned"] == 0, got
    assert {"tiletune.rope", "tiletune.attention", "tiletune.rms_norm", "tiletune.swiglu"} <= set(got["ops"]), got
