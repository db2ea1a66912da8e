#!/usr/bin/env python
"""Which first launches of a served first forward compile again: every ``PrefetchKernel._compile`` call
with how it was answered (a cubin compiled ahead, the front-end cache, a compile) and, on a compile,
the signatures that were offered for that kernel object and did not match.

Run in a fresh process with empty caches (the caller sets ``CUDA_TILE_CACHE_DIR`` and ``TILETUNE_DB``):

    python benchmarks/diag_compiles.py [--model llama3-8b] [--phase decode] > out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--phase", default="decode")
    a = ap.parse_args()
    import torch

    import _layer as L
    import tiletune.kernels as K
    from tiletune.devices import prefetch_kernel as pk

    log: list = []
    orig_compile, orig_offer = pk.PrefetchKernel._compile, pk.PrefetchKernel.offer

    def offer(self, signature, cubin, arch):
        log.append({"event": "offer", "kernel": self._pyfunc.__name__, "obj": id(self), "symbol": signature.symbol,
                    "t": time.perf_counter()})
        return orig_offer(self, signature, cubin, arch)

    def _compile(self, signature, context, compute_capability=None):
        offered = [s.symbol for s, *_ in self._ahead]
        h0, f0 = self.prefetch_hits, self.frontend_hits
        t0 = time.perf_counter()
        out = orig_compile(self, signature, context, compute_capability)
        how = "prefetch" if self.prefetch_hits > h0 else "frontend" if self.frontend_hits > f0 else "compiled"
        log.append({"event": "compile", "kernel": self._pyfunc.__name__, "obj": id(self), "how": how,
                    "s": round(time.perf_counter() - t0, 3), "symbol": signature.symbol,
                    "offered_unmatched": offered if how == "compiled" else []})
        return out

    pk.PrefetchKernel.offer, pk.PrefetchKernel._compile = offer, _compile
    d = L.dims(a.model)
    shape = ({"phase": "decode", "B": 19, "L": 3111, "capacity": 3300} if a.phase == "decode"
             else {"phase": "prefill", "B": 2, "S": 1333})
    w = L.make_weights(d, "cuda", seed=0)
    inp = L.Inputs(d, shape, "cuda")
    layer = L.tiletune_layer(d, w, shape["phase"], inp.caches(), ops=K)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.no_grad():
        layer(*inp.args())
        torch.cuda.synchronize()
    print(json.dumps({"first_forward_s": time.perf_counter() - t0, "log": log}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
