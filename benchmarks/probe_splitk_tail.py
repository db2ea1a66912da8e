"""Probe: does the split-K GEMM compute wrong products the way the TMA one-launch cross-entropy did?

The first one-launch cross-entropy kernel (``_ce_one_launch.py``: TMA logit loads, then an
acquire-release arrival counter) returned a wrong loss on every launch at many (shape, config) pairs,
and never with plain loads (``probe_ce_tail.py``, cuda-tile 1.7.0 / tileiras 13.4). The split-K GEMM
(``tiletune.kernels.gemm_kernels.gemm_splitk_kernel``) has the same shape: TMA operand loads in the
``K`` loop, then a partial tile stored and a per-tile acquire-release counter, the last split summing
the partials. Its GPU tests check fixed configs; this launches a sample of its production space's
real splits (``SPLIT_K > 1``: per shape, the first config of each ``(SPLIT_K, TM, TN, TK)`` seen, up to
``--configs``), compiled ahead on every core (``tiletune.devices.compile_pool``) and then launched directly,
several times each, on small-M Llama-3-8B projections in both weight layouts, and compares every
product with the op's reference and tolerance (the gate's rule), and the counters with zero.

    python benchmarks/probe_splitk_tail.py [--out DIR] [--launches 10] [--configs 24]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import cuda.tile as ct

from _common import write_result

#: (M, N, K) of ``x[M, K] @ w`` products the public matmul sends to the split-K op
SHAPES = ((1, 4096, 4096), (8, 4096, 14336), (16, 4096, 14336), (64, 14336, 4096), (128, 4096, 14336),
          (128, 6144, 4096))


def sample_configs(space, limit: int) -> list:
    """The space's real splits (``SPLIT_K > 1``, not swapped): the first config of each
    ``(SPLIT_K, TM, TN, TK)``, at most ``limit``."""
    from tiletune.kernels.gemm import uses_scratch

    out, seen = [], set()
    for cfg in space.configs("sm_90"):
        key = (cfg.SPLIT_K, cfg.TM, cfg.TN, cfg.TK)
        if uses_scratch(cfg) and key not in seen:
            seen.add(key)
            out.append(cfg)
    return out[:limit]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--launches", type=int, default=10)
    ap.add_argument("--configs", type=int, default=24, help="configs per (shape, layout) at most")
    args = ap.parse_args()
    from tiletune.kernels import gemm as G
    from tiletune.kernels.gemm_kernels import splitk_regime, splitk_space
    from tiletune.devices.verify import compare_tensors

    from tiletune.devices.backends.cutile import HintedKernels
    from tiletune.devices.compile_pool import CompileJob, CompilePool

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    one = torch.ones(1, device=dev)
    hinted = HintedKernels()
    problems = []  # (shape, layout, call, want, tol, sem, [(cfg, kernel, grid, kargs) or (cfg, error)])
    for m, n, k in SHAPES:
        x = torch.randn(1, m, k, device=dev, generator=gen).to(torch.bfloat16)
        w = torch.randn(n, k, device=dev, generator=gen).to(torch.bfloat16) / k ** 0.5
        for layout, b in (("w.t()", w.t().unsqueeze(0)), ("KxN", w.t().contiguous().unsqueeze(0))):
            a_arg, ta = G._as_kernel_operand(x)
            b_arg, tb = G._as_kernel_operand(b)
            c = torch.empty(1, m, n, dtype=torch.bfloat16, device=dev)
            regime = splitk_regime(m, n, k, 2, 1)
            if regime is None:
                continue
            ws, sem = G.splitk_workspace(dev, m, n, 1, regime[3])
            call = (a_arg, b_arg, c, one, one, ta, tb, False, ws, sem)
            runs = []
            for cfg in sample_configs(splitk_space(*regime), args.configs):
                try:
                    kernel, grid, kargs = G._splitk_plan(cfg, *call)
                    runs.append((cfg, hinted.get(kernel, cfg.hints), tuple(grid), tuple(kargs)))
                except Exception as exc:  # noqa: BLE001 - a plan that rejects the config
                    runs.append((cfg, f"{type(exc).__name__}: {exc}"[:300]))
            problems.append((f"{m}x{n}x{k}", layout, c, G._reference(*call[:8]), G._splitk_tolerance(*call), sem, runs))
    # every (config, problem) compiled ahead on every core, as the tuner does; the launches then load them
    jobs = [CompileJob((i, j), r[1], r[3], "sm_90") for i, p in enumerate(problems) for j, r in enumerate(p[6])
            if len(r) == 4]
    t0 = time.perf_counter()
    compile_errors = {}
    for res in CompilePool().compile_all(jobs):
        if res.error is not None:
            compile_errors[res.tag] = res.error[:300]
    print(f"compiled {len(jobs)} jobs ahead in {time.perf_counter() - t0:.1f} s ({len(compile_errors)} errors)", flush=True)
    rows = []
    stream = torch.cuda.current_stream().cuda_stream
    for i, (shape, layout, c, want, tol, sem, runs) in enumerate(problems):
        for j, run in enumerate(runs):
            row = {"shape": shape, "layout": layout, "config": dict(run[0]), "launches": args.launches}
            if len(run) == 2 or (i, j) in compile_errors:
                row["error"] = run[1] if len(run) == 2 else compile_errors[(i, j)]
                rows.append(row)
                print(row, flush=True)
                continue
            _, kernel, grid, kargs = run
            try:
                wrong, reasons, worst = 0, [], 0.0
                for _ in range(args.launches):
                    c.fill_(float("nan"))
                    ct.launch(stream, grid, kernel, kargs)
                    reason = compare_tensors(c, want, tol)
                    worst = max(worst, float((c.double() - want.double()).abs().max()))
                    if reason is not None:
                        wrong += 1
                        reasons.append(reason)
                torch.cuda.synchronize()
                row.update(wrong=wrong, max_abs_err=worst, counters_nonzero=int((sem != 0).sum()),
                           reason=reasons[0][:300] if reasons else None)
                if wrong or row["counters_nonzero"]:
                    print(row, flush=True)
            except Exception as exc:  # noqa: BLE001 - a config that does not launch
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
                print(row, flush=True)
                sem.zero_()
            rows.append(row)
        print(f"{shape} {layout}: {sum(1 for r in rows if (r['shape'], r['layout']) == (shape, layout))} configs", flush=True)
        if args.out:  # what ran so far, should the run be cut short
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "probe_splitk_tail_partial.json"), "w") as f:
                json.dump(rows, f)
    summary = {"runs": len(rows), "wrong_runs": sum(1 for r in rows if r.get("wrong")),
               "counter_runs": sum(1 for r in rows if r.get("counters_nonzero")),
               "errors": sum(1 for r in rows if "error" in r)}
    print(summary)
    write_result("probe_splitk_tail", {"problem": "split-K GEMM (TMA operand loads, acquire-release tile counters): "
                                                  "wrong products per (shape, weight layout, config), bf16, "
                                                  "launched directly, compared with the op's reference and tolerance",
                                       "summary": summary, "rows": rows}, args.out, compress=True)


if __name__ == "__main__":
    main()
