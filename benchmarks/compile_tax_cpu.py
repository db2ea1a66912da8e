#!/usr/bin/env python
"""Host cost of a tiletune decode layer under ``torch.compile`` on a CPU: one layer against a stack of N
layers compiled as one frame (issue 43; no GPU needed).

The layer is ``_layer.tiletune_layer`` (the one ``compile_tax.py`` times on the GPU) at tiny dimensions
(hidden 64, 4 / 2 heads of 16, ffn 96, bf16, decode B=2 over 8 cached positions), so the ops' own work is
small and what is timed is mostly the host path:

* eager: the layer over plain-torch stand-ins of the ops, called directly (no tiletune dispatch: the
  floor of an eager call);
* compiled: the layer over ``tiletune.kernels`` (the public functions, as a model calls them; the memory-bound
  ones trace as torch expressions unless ``TILETUNE_COMPILE_FUSE=0``, ``same_output`` is then to bf16 rounding) under
  ``torch.compile(fullgraph=True, dynamic=False)`` (Inductor); each op is one ``torch.ops.tiletune`` node
  whose implementation is bound to the same stand-in (``torch_ops.bind``).

``--stacks 1,8``: the layer alone and N copies in sequence in one module (``compile_tax.stacked``): the
per-frame costs of a compiled call (Dynamo's guards, the AOT wrappers, the generated ``call``) are paid once
per stack, each op's own dispatch and Inductor's asserts once per layer. Per stack: the best of
``--rounds`` rounds of ``--forwards`` forwards, eager and compiled alternating (one thread).

    python benchmarks/compile_tax_cpu.py [--out DIR] [--stacks 1,8] [--rounds 7] [--forwards 300]

Writes ``compile_tax_cpu.json``: ``{"rows": [{"stack", "eager_us", "compiled_us", "compiled_vs_eager",
"extra_us_per_layer"}]}`` (per forward of the whole stack; ``extra_us_per_layer`` = (compiled - eager) / stack).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

NAME = "compile_tax_cpu"
TINY = dict(hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96)
SHAPE = {"phase": "decode", "B": 2, "L": 8, "capacity": 16}


def standins() -> dict[str, Any]:
    """Plain-torch versions of the ops with their custom ops' positional arguments (``SCHEMAS``)."""
    import torch
    import torch.nn.functional as F

    def rms_norm(x, weight, eps):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)

    def matmul(a, b):
        return torch.matmul(a, b)

    def apply_rope_(q, k, cos, sin, layout="bshd"):
        c, s = cos.float()[:, :, None, :], sin.float()[:, :, None, :]
        for z in (q, k):
            zf, h = z.float(), z.shape[-1] // 2
            z.copy_((zf * c + torch.cat((-zf[..., h:], zf[..., :h]), -1) * s).to(z.dtype))

    def kv_cache_append(ck, cv, k, v, start, start_int=None):
        b = torch.arange(ck.shape[0])
        ck[b, :, start] = k[:, :, 0]
        cv[b, :, start] = v[:, :, 0]

    def decode_attention(q, ck, cv, lengths, lengths_int=None, causal=True, scale=None):
        n = int(lengths[0])
        return F.scaled_dot_product_attention(q, ck[:, :, :n], cv[:, :, :n], enable_gqa=True).contiguous()

    def swiglu(x):
        h = x.shape[-1] // 2
        return (F.silu(x[..., :h].float()) * x[..., h:].float()).to(x.dtype)

    return dict(rms_norm=rms_norm, matmul=matmul, apply_rope_=apply_rope_, kv_cache_append=kv_cache_append,
                decode_attention=decode_attention, swiglu=swiglu)


def eager_namespace(s: dict[str, Any]) -> Any:
    """The stand-ins with the public functions' signatures (what the eager layer calls)."""

    def apply_rope_(q, k, cos, sin, layout="bshd"):
        s["apply_rope_"](q, k, cos, sin, layout)
        return q, k

    def kv_cache_append(ck, cv, k, v, start):
        s["kv_cache_append"](ck, cv, k, v, start)
        return ck, cv

    return types.SimpleNamespace(rms_norm=lambda x, w=None, eps=1e-6: s["rms_norm"](x, w, eps), matmul=s["matmul"],
                                 apply_rope_=apply_rope_, kv_cache_append=kv_cache_append,
                                 decode_attention=lambda q, ck, cv, lens, causal=True: s["decode_attention"](q, ck, cv, lens),
                                 swiglu=s["swiglu"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or None)
    ap.add_argument("--stacks", default="1,8")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--forwards", type=int, default=300)
    a = ap.parse_args(argv)
    stacks = [int(x) for x in a.stacks.split(",") if x]
    if not stacks or min(stacks) < 1:
        raise SystemExit("--stacks takes positive layer counts")

    import torch

    import _layer as L
    import tiletune.kernels as K
    from _common import write_result
    from compile_tax import stacked
    from tiletune.kernels import torch_ops

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    s = standins()
    saved = {name: torch_ops.bind(name, fn) for name, fn in s.items()}
    d = L.dims("llama3-8b", **TINY)
    w = L.make_weights(d, "cpu", 0, torch.bfloat16)
    inp = L.Inputs(d, SHAPE, "cpu", dtype=torch.bfloat16)
    args = inp.args()

    def host_us(fn: Any) -> float:
        t = time.perf_counter()
        for _ in range(a.forwards):
            fn(*args)
        return (time.perf_counter() - t) / a.forwards * 1e6

    rows = []
    try:
        with torch.no_grad():
            for n in stacks:
                eager = stacked(L.tiletune_layer(d, w, "decode", inp.caches(), ops=eager_namespace(s)), n)
                torch._dynamo.reset()
                compiled = torch.compile(stacked(L.tiletune_layer(d, w, "decode", inp.caches(), ops=K), n),
                                         fullgraph=True, dynamic=False)
                # Inductor compiles the memory-bound ops' torch expressions itself (TILETUNE_COMPILE_FUSE): equal
                # to bf16 rounding, not bit for bit
                want, got = eager(*args), compiled(*args)
                same = bool(torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2))
                max_diff = float((got.float() - want.float()).abs().max())
                compiled(*args)
                e, c = [], []
                for _ in range(a.rounds):
                    e.append(host_us(eager))
                    c.append(host_us(compiled))
                row = {"stack": n, "eager_us": round(min(e), 1), "compiled_us": round(min(c), 1),
                       "compiled_vs_eager": round(min(c) / min(e), 3),
                       "extra_us_per_layer": round((min(c) - min(e)) / n, 1), "same_output": same,
                       "max_abs_diff": max_diff}
                rows.append(row)
                print(row, flush=True)
    finally:
        for name, fn in saved.items():
            torch_ops.bind(name, fn)
        torch.set_num_threads(threads)
    doc = {"torch": torch.__version__, "cpus": os.cpu_count(), "threads": 1, "dims": TINY, "shape": SHAPE,
           "rounds": a.rounds, "forwards": a.forwards,
           "method": "best of rounds, eager and compiled alternating; eager = stand-ins called directly, compiled = "
                     "tiletune.kernels under torch.compile(fullgraph=True, dynamic=False), ops bound to the stand-ins",
           "rows": rows}
    write_result(NAME, doc, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
