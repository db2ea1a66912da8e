"""A library op's first call must not pull in torch's compiler stack.

``torch.broadcast_shapes`` in ``matmul``'s checks imported ``torch.fx.experimental.symbolic_shapes``
and with it sympy and mpmath (~520 modules): seconds of a process's first matmul call on the H200
host (docs/GPU-NOTES.md). This runs every public op's argument checks in a fresh interpreter (CPU
tensors: each op gets as far as its device check) and fails if any of them imports sympy, dynamo or
inductor.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("cuda.tile")

HEAVY = ("sympy", "mpmath", "torch._dynamo", "torch._inductor", "torch.fx.experimental.symbolic_shapes")

CODE = r"""
import json, sys, torch
import tiletune.kernels as K
bf = torch.bfloat16
z = lambda *s: torch.zeros(*s, dtype=bf)
calls = {
    "rms_norm": lambda: K.rms_norm(z(4, 64), z(64)),
    "rms_norm_residual": lambda: K.rms_norm_residual(z(4, 64), z(4, 64), z(64)),
    "layer_norm": lambda: K.layer_norm(z(4, 64), z(64), z(64)),
    "softmax": lambda: K.softmax(z(4, 64)),
    "swiglu": lambda: K.swiglu(z(4, 64)),
    "geglu": lambda: K.geglu(z(4, 64)),
    "apply_rope_": lambda: K.apply_rope_(z(1, 4, 2, 64), z(1, 4, 1, 64), z(4, 64), z(4, 64)),
    "cross_entropy": lambda: K.cross_entropy(z(4, 64), torch.zeros(4, dtype=torch.int64)),
    "matmul": lambda: K.matmul(z(2, 3, 4, 8), z(3, 8, 16)),
    "attention": lambda: K.attention(z(1, 2, 8, 64), z(1, 2, 8, 64), z(1, 2, 8, 64)),
    "matmul_swiglu": lambda: K.matmul_swiglu(z(4, 64), z(64, 32)),
    "decode_attention": lambda: K.decode_attention(z(1, 2, 1, 64), z(1, 1, 16, 64), z(1, 1, 16, 64), 8),
}
heavy = %r
out = {"at_import": [m for m in sys.modules if m.startswith(heavy)], "calls": {}}
for name, call in calls.items():
    try:
        call()
        err = None
    except ValueError as exc:
        err = str(exc)
    out["calls"][name] = {"error": err, "heavy": sorted(m for m in sys.modules if m.startswith(heavy))}
print(json.dumps(out))
"""


def test_no_public_op_check_imports_the_compiler_stack():
    res = subprocess.run([sys.executable, "-c", CODE % (HEAVY,)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["at_import"] == [], out["at_import"][:10]
    for name, r in out["calls"].items():
        assert r["error"] and "CUDA" in r["error"], (name, r["error"])  # reached the device check
        assert r["heavy"] == [], f"{name}'s checks imported {r['heavy'][:5]}"
