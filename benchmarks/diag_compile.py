#!/usr/bin/env python
"""Diagnose the compiled route of a decode layer: which custom-op implementations miss the eager fast path.

For one decode shape of a model: tunes eagerly (served, then on_miss=tune), then runs the eager layer and the
``torch.compile(fullgraph=True)`` layer N times each, counting per op the calls that went down the fast
path's slow branch (``_FastOp.slow``) and the signatures seen, and records each op's refusal reasons.
Also: the host time per forward (no sync inside the loop) of eager vs compiled, the host time of one
custom op called through ``torch.ops.tiletune`` vs the public function, and the Inductor wrapper code.

    python benchmarks/diag_compile.py --out DIR [--model llama3-8b] [--B 12 --L 3000]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--B", type=int, default=12)
    ap.add_argument("--L", type=int, default=3000)
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    import torch

    import _layer as L
    import tiletune.kernels as K
    from tiletune.kernels import fastcall

    L.use_fresh_database(str(Path(tempfile.mkdtemp()) / "t.db"), tables=True, on_miss="tune")
    d = L.dims(a.model)
    shape = {"phase": "decode", "B": a.B, "L": a.L, "capacity": a.L + 100}
    w = L.make_weights(d, "cuda", seed=0)
    inp = L.Inputs(d, shape, "cuda")
    mod = L.tiletune_layer(d, w, "decode", inp.caches(), ops=K)
    args = inp.args()

    slow_calls: Counter = Counter()
    sigs: dict = defaultdict(set)
    orig_slow = fastcall._FastOp.slow

    def slow(self, call_args, sig):
        slow_calls[self.name] += 1
        try:
            sigs[self.name].add(repr(sig)[:600])
        except Exception:  # noqa: BLE001
            pass
        return orig_slow(self, call_args, sig)

    fastcall._FastOp.slow = slow
    res: dict = {"shape": shape, "model": a.model}
    with torch.no_grad():
        for _ in range(4):
            mod(*args)
        torch.cuda.synchronize()
        res["eager_warm_slow_calls"] = dict(slow_calls)
        slow_calls.clear()
        for _ in range(20):
            mod(*args)
        torch.cuda.synchronize()
        res["eager_slow_calls_20"] = dict(slow_calls)
        res["eager_sigs"] = {k: sorted(v) for k, v in sigs.items()}
        sigs.clear()
        slow_calls.clear()

        from torch._inductor.utils import run_and_get_code

        cmod = torch.compile(mod, fullgraph=True, dynamic=False)
        t0 = time.perf_counter()
        _, codes = run_and_get_code(cmod, *args)
        torch.cuda.synchronize()
        res["compile_s"] = time.perf_counter() - t0
        (out / "inductor_code.py").write_text("\n\n# ======\n\n".join(codes))
        res["compiled_first_slow_calls"] = dict(slow_calls)
        slow_calls.clear()
        for _ in range(20):
            cmod(*args)
        torch.cuda.synchronize()
        res["compiled_slow_calls_20"] = dict(slow_calls)
        res["compiled_sigs"] = {k: sorted(v) for k, v in sigs.items()}
        res["refusals"] = {w_.name: {repr(k)[:300]: v for k, v in w_.refusals.items()} for w_ in fastcall._wrappers
                           if w_.refusals}
        res["recipes"] = {w_.name: len(w_.recipes) for w_ in fastcall._wrappers if w_.recipes}

        def host(fn, n=200):
            for _ in range(10):
                fn()
            torch.cuda.synchronize()
            best = float("inf")
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                t = (time.perf_counter() - t0) / n * 1e6
                torch.cuda.synchronize()
                best = min(best, t)
            return best

        res["host_us"] = {"eager": host(lambda: mod(*args)), "compiled": host(lambda: cmod(*args))}
        res["host_us"]["eager2"] = host(lambda: mod(*args))
        res["host_us"]["compiled2"] = host(lambda: cmod(*args))
        # one op: public vs through the dispatcher
        x = torch.randn(a.B, d.hidden, device="cuda", dtype=torch.bfloat16)
        wn = w["norm1"]
        K.rms_norm(x, wn, d.eps)
        torch.ops.tiletune.rms_norm(x, wn, d.eps)
        res["op_host_us"] = {
            "rms_norm_public": host(lambda: K.rms_norm(x, wn, d.eps), 1000),
            "rms_norm_dispatcher": host(lambda: torch.ops.tiletune.rms_norm.default(x, wn, d.eps), 1000),
            "rms_norm_direct": host(lambda: K.rms_norm.fastcall.direct(x, wn, d.eps), 1000),
            "torch_add": host(lambda: x + x, 1000),
        }
        # a profile of compiled host time by Python function
        import cProfile
        import pstats
        import io

        pr = cProfile.Profile()
        pr.enable()
        for _ in range(50):
            cmod(*args)
        pr.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(45)
        (out / "compiled_cprofile.txt").write_text(s.getvalue())
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(50):
            mod(*args)
        pr.disable()
        torch.cuda.synchronize()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(45)
        (out / "eager_cprofile.txt").write_text(s.getvalue())
    (out / "diag_compile.json").write_text(json.dumps(res, indent=1, default=str))
    print(json.dumps({k: res[k] for k in ("compiled_slow_calls_20", "eager_slow_calls_20", "host_us", "op_host_us",
                                          "recipes")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
