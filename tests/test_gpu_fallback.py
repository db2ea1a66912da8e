"""A new shape on a fresh machine does not wait for the compiler: the library op runs its torch fallback
while its config compiles in the background, then launches the compiled config. GPU.

A fresh process with an empty cuTile disk cache (``CUDA_TILE_CACHE_DIR``) and an empty database, tables
on (the neighbours): the first call of each op returns the fallback's result (checked against torch),
``tiletune.wait_for_compiles`` returns, and the next call launches a config (the op holds one) with a
result within the op's tolerance of the first. No tuning session starts.

Run on the GPU host: ``python -m pytest -m gpu -q tests/test_gpu_fallback.py``.
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

CHILD = textwrap.dedent("""
    import json, time, torch
    import torch.nn.functional as F
    import tiletune, tiletune.kernels as K
    from tiletune.kernels.library_op import LibraryOp

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(300, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16, generator=g)
    lin = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16, generator=g) / 64
    q = torch.randn(2, 32, 333, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    kv = torch.randn(2, 8, 333, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    calls = {
        "rms_norm": (lambda: K.rms_norm(x, w, 1e-6),
                     lambda: F.rms_norm(x.float(), (4096,), w.float(), 1e-6).to(x.dtype)),
        "matmul": (lambda: K.matmul(x, lin.t()), lambda: (x.float() @ lin.float().t()).to(x.dtype)),
        "attention": (lambda: K.attention(q, kv, kv, causal=True),
                      lambda: F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)),
    }
    out = {}
    for name, (ours, ref) in calls.items():
        t0 = time.perf_counter()
        first = ours()
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        want = ref().float()
        scale = want.abs().max().item()
        out[name] = {"first_s": first_s, "first_err": (first.float() - want).abs().max().item() / scale}
    t0 = time.perf_counter()
    out["settled"] = tiletune.wait_for_compiles(600)
    out["wait_s"] = time.perf_counter() - t0
    for name, (ours, ref) in calls.items():
        second = ours()
        torch.cuda.synchronize()
        want = ref().float()
        out[name]["second_err"] = (second.float() - want).abs().max().item() / want.abs().max().item()
    ops = [op for lib in LibraryOp.instances() for op in lib.ops().values()]
    out["tuned"] = sum(op.tuning_count for op in ops)
    out["fell_back"] = sorted({op.name for op in ops if op._fell_back})
    out["configs"] = sorted({op.name for op in ops if op.chosen()})
    print(json.dumps(out))
""")


def test_a_cold_machine_serves_the_fallback_then_the_compiled_config(tmp_path):
    env = dict(os.environ, TILETUNE_DB=str(tmp_path / "tuning.db"), CUDA_TILE_CACHE_DIR=str(tmp_path / "cutile"),
               TILETUNE_PROGRESS="0")
    env.pop("TILETUNE_ON_MISS", None)
    env.pop("TILETUNE_FALLBACK", None)
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["settled"] and got["tuned"] == 0, got
    assert set(got["fell_back"]) >= {"tiletune.rms_norm", "tiletune.attention"}, got
    assert set(got["configs"]) >= {"tiletune.rms_norm", "tiletune.attention"}, got  # compiled configs launch now
    for name in ("rms_norm", "matmul", "attention"):
        assert got[name]["first_err"] < 0.02 and got[name]["second_err"] < 0.02, got
