"""Probe: the one-launch cross-entropy kernels with and without TMA loads (wrong losses, GPU time).

``benchmarks/_ce_one_launch.py`` finishes the mean inside the launch (row terms to scratch, an arrival
counter, the last block sums). On 2026-12-02 the tuner's gate rejected its CHUNK 8192 / occupancy 4
config on a 7 x 32000 bf16 problem. This launches kernels directly (no tuner) several times per
shape and config of the loss space and counts wrong losses: the fixture's kernel (also with a
128-wide tile for the final sum, without the latency hint, and with its logit loads made without
TMA) and the library's kernel (``tiletune.kernels.cross_entropy_op``: block partials, every load
without TMA), without and with ``PREFETCH``. With ``--time`` it then times, on larger shapes, the
library kernel at the loss space's configs and more (more blocks in flight instead of TMA's pipeline)
against the fixture's TMA kernel, the public op (its tuned pick, fresh database) and
``F.cross_entropy`` (``triton.testing.do_bench``, L2 flushed, median): what giving up TMA costs. With
``--grad`` the same for the loss + gradient kernels (the grad space's pairs, with and without
``PREFETCH``) against ``torch.autograd.grad`` of ``F.cross_entropy``.

    python benchmarks/probe_ce_tail.py [--out DIR] [--launches 20] [--time] [--grad]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import tempfile

import torch
import torch.nn.functional as F

import cuda.tile as ct

from _common import write_result

HERE = os.path.dirname(os.path.abspath(__file__))


def one_launch_kernel(row_tile: int, tmp: str, tma: bool = True):
    """The fixture's kernel with ``ROW_TILE`` set, and with ``tma=False`` its logit loads made without
    TMA (a module of its own: cuTile reads the source)."""
    text = open(os.path.join(HERE, "_ce_one_launch.py")).read().replace("ROW_TILE = 1024", f"ROW_TILE = {row_tile}")
    if not tma:
        text = text.replace("_ld(L, (row, c), (1, TV), LAT)",
                            "ct.load(L, (row, c), shape=(1, TV), padding_mode=ct.PaddingMode.ZERO, allow_tma=False)")
    name = f"ce_one_launch_{row_tile}_{int(tma)}"
    path = os.path.join(tmp, f"{name}.py")
    with open(path, "w") as f:
        f.write(text + "\nK = ct.kernel(cross_entropy_kernel_fn)\n")
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.K


#: (shape, configs) probed: the failing problem at every config of the loss space, then more shapes
SHAPES = ((7, 32000), (8, 32000), (128, 32000), (33, 128256))
CONFIGS = ((4096, 1), (4096, 2), (4096, 4), (8192, 1), (8192, 2), (8192, 4), (16384, 1), (16384, 2))
#: more configs timed for the plain-load kernels (more blocks in flight instead of TMA's pipeline)
MORE_PLAIN_CONFIGS = ((1024, 16), (2048, 8), (2048, 16), (4096, 8))
#: (CHUNK, num_worker_warps, STORE_TMA) of the loss + gradient configs timed with ``--grad`` (occupancy 2)
GRAD_CONFIGS = tuple((c, w, st) for c in (8192, 16384) for w in (4, 8) for st in (False, True))
#: shapes timed with ``--grad``
GRAD_SHAPES = ((128, 32000), (1024, 32000), (4096, 32000), (16384, 32000), (4096, 128256))
#: shapes timed with ``--time``
TIME_SHAPES = ((8, 32000), (128, 32000), (1024, 32000), (4096, 32000), (16384, 32000), (33, 128256),
               (4096, 128256))


def _launcher(kern, x, t, chunk, occ, lat, sms, extra=(), grad=False, store_tma=False, warps=None):
    """``(run, out, sem)``: ``run()`` launches one config of a one-launch kernel on ``x``, ``t`` (``extra``:
    kernel arguments after the fixture's, the library's ``PREFETCH``; ``grad``: the gradient too, stored
    with TMA when ``store_tma``; ``warps``: the ``num_worker_warps`` hint)."""
    import torch

    m, v = x.shape
    dev = x.device
    hinted = kern.replace_hints(occupancy=occ, **({"num_worker_warps": warps} if warps else {}))
    grid = (min(m, sms * occ),)
    out = torch.empty(1, device=dev)
    scratch = torch.zeros(max(1024, -(-m // 1024) * 1024), device=dev)  # >= rows (fixture) and >= blocks
    sem = torch.zeros(1, dtype=torch.int32, device=dev)
    g_out = torch.empty_like(x) if grad else torch.empty(1, 1, dtype=x.dtype, device=dev)
    args = (x, t, out, g_out, scratch, sem, -100, chunk, grad, v % chunk == 0, lat, store_tma, *extra)

    def run():
        ct.launch(torch.cuda.current_stream().cuda_stream, grid, hinted, args)

    return run, out, sem


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--time", action="store_true", help="also time the TMA and plain-load kernels on TIME_SHAPES")
    ap.add_argument("--grad", action="store_true", help="also time the loss + gradient kernels on GRAD_SHAPES")
    args = ap.parse_args()
    from tiletune.kernels.cross_entropy_op import cross_entropy_kernel

    tmp = tempfile.mkdtemp()
    # name -> (kernel, LAT, extra kernel arguments)
    variants = {"one_launch": (one_launch_kernel(1024, tmp), 10, ()),
                "one_launch_tile128": (one_launch_kernel(128, tmp), 10, ()),
                "one_launch_lat0": (one_launch_kernel(1024, tmp), 0, ()),
                "one_launch_no_tma": (one_launch_kernel(1024, tmp, tma=False), 10, ()),
                "library": (cross_entropy_kernel, 10, (False,)),
                "library_prefetch": (cross_entropy_kernel, 10, (True,))}
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for m, v in SHAPES:
        x, t = _problem(m, v, g)
        want = float(F.cross_entropy(x.float(), t))
        for chunk, occ in CONFIGS:
            for name, (kern, lat, extra) in variants.items():
                if name == "one_launch_tile128" and (m, v) != SHAPES[0]:
                    continue
                got = []
                try:
                    run, out, sem = _launcher(kern, x, t, chunk, occ, lat, sms, extra)
                    for _ in range(args.launches):
                        run()
                        got.append(out.clone())
                    torch.cuda.synchronize()
                except Exception as exc:  # noqa: BLE001 - a config that does not compile or launch
                    rows.append({"shape": f"{m}x{v}", "chunk": chunk, "occupancy": occ, "variant": name,
                                 "error": f"{type(exc).__name__}: {exc}"[:300]})
                    print(rows[-1], flush=True)
                    continue
                errs = torch.cat(got).double() - want
                bad = int((errs.abs() > 1e-3 * max(1.0, abs(want))).sum())
                row = {"shape": f"{m}x{v}", "chunk": chunk, "occupancy": occ, "variant": name, "lat": lat,
                       "launches": args.launches, "wrong": bad, "max_abs_err": float(errs.abs().max()), "want": want,
                       "counter_after": int(sem.item())}
                if bad:
                    print(row, flush=True)
                rows.append(row)
        if args.out:  # what ran so far, should the run be cut short
            os.makedirs(args.out, exist_ok=True)
            with open(os.path.join(args.out, "probe_ce_tail_partial.json"), "w") as f:
                json.dump(rows, f)
    summary = {}
    for r in rows:
        s = summary.setdefault(r["variant"], {"runs": 0, "wrong_runs": 0, "errors": 0})
        s["runs"] += 1
        s["wrong_runs"] += int(bool(r.get("wrong")))
        s["errors"] += int("error" in r)
    print(summary)
    result = {"problem": "one-launch cross-entropy kernels: the fixture's (benchmarks/_ce_one_launch.py, row terms; "
                         "TMA logit loads unless the variant says) and the library's (block partials, no TMA): "
                         "wrong losses per variant, shape and config (bf16 logits * 3, int64 targets, LAT 10 "
                         "unless the variant says)",
              "summary": summary, "rows": rows}
    if args.time:
        result["timing"] = time_variants(variants, sms, g)
    if args.grad:
        result["grad_timing"] = time_grad(variants, sms, g)
    write_result("probe_ce_tail", result, args.out, compress=True)


def _problem(m, v, g):
    """bf16 logits (``randn * 3``) and int64 targets of an ``m x v`` problem."""
    dev = torch.device("cuda")
    x = (torch.randn(m, v, device=dev, generator=g) * 3.0).to(torch.bfloat16)
    return x, torch.randint(0, v, (m,), device=dev, generator=g)


def _time_configs(makers):
    """``{"configs_us", "best", "best_us"}`` over ``makers`` (label -> ``make()`` returning the launcher's
    ``run``): each run timed with ``triton.testing.do_bench`` (L2 flushed, median), a config that does not
    compile or launch recorded as its error."""
    from triton.testing import do_bench

    per = {}
    for label, make in makers.items():
        try:
            per[label] = 1e3 * do_bench(make(), return_mode="median")
        except Exception as exc:  # noqa: BLE001 - a config that does not compile or launch
            per[label] = f"{type(exc).__name__}: {exc}"[:200]
    times = {k: u for k, u in per.items() if isinstance(u, float)}
    best = min(times, key=times.get) if times else None
    return {"configs_us": per, "best": best, "best_us": times.get(best)}


def time_variants(variants, sms, g):
    """Per shape: the best config's GPU time of the library kernel (plain loads, without and with
    ``PREFETCH``) and of the fixture's TMA kernel, the public op's (its tuned pick) and
    ``F.cross_entropy``'s (``triton.testing.do_bench``, L2 flushed, median)."""
    from triton.testing import do_bench

    import tiletune.kernels as K
    from tiletune.kernels.cross_entropy_op import prepare_cross_entropy

    out = []
    for m, v in TIME_SHAPES:
        x, t = _problem(m, v, g)
        row = {"shape": f"{m}x{v}", "torch_us": 1e3 * do_bench(lambda: F.cross_entropy(x, t), return_mode="median")}
        for name in ("library", "library_prefetch", "one_launch"):
            kern, lat, extra = variants[name]
            configs = CONFIGS + (MORE_PLAIN_CONFIGS if name != "one_launch" else ())
            row[name] = _time_configs({
                f"{chunk}/{occ}": (lambda chunk=chunk, occ=occ: _launcher(kern, x, t, chunk, occ, lat, sms, extra)[0])
                for chunk, occ in configs})
        lib, pre, tma = (row[k]["best_us"] for k in ("library", "library_prefetch", "one_launch"))
        row["plain_best_us"] = min(u for u in (lib, pre) if u)
        row["plain_over_tma"] = row["plain_best_us"] / tma if tma else None
        # the public op: its tuned pick (loss space, fresh database) and a call's GPU time
        K.cross_entropy(x, t)
        torch.cuda.synchronize()
        prep = prepare_cross_entropy(x, t)
        row["public_pick"] = dict(prep.config())
        row["public_us"] = 1e3 * do_bench(lambda: K.cross_entropy(x, t), return_mode="median")
        row["public_over_tma"] = row["public_us"] / tma if tma else None
        row["torch_over_public"] = row["torch_us"] / row["public_us"]
        print(f"{row['shape']:>14}: plain {lib:.2f} us ({row['library']['best']}), plain+prefetch {pre:.2f} us "
              f"({row['library_prefetch']['best']}), TMA {tma:.2f} us ({row['one_launch']['best']}), public "
              f"{row['public_us']:.2f} us, torch {row['torch_us']:.2f} us", flush=True)
        out.append(row)
    return out


def time_grad(variants, sms, g):
    """Per shape, loss + gradient: the best config's GPU time of the library kernel (plain loads, without
    and with ``PREFETCH``) and of the fixture's TMA kernel over :data:`GRAD_CONFIGS` at occupancy 2, the
    public op's (``return_grad=True``, its tuned pick) and torch's (``F.cross_entropy`` and
    ``torch.autograd.grad`` of it), ``triton.testing.do_bench``, L2 flushed, median."""
    from triton.testing import do_bench

    import tiletune.kernels as K

    out = []
    for m, v in GRAD_SHAPES:
        x, t = _problem(m, v, g)
        xg = x.clone().requires_grad_(True)
        row = {"shape": f"{m}x{v}", "torch_us": 1e3 * do_bench(
            lambda: torch.autograd.grad(F.cross_entropy(xg, t), xg), return_mode="median")}
        for name in ("library", "library_prefetch", "one_launch"):
            kern, lat, extra = variants[name]
            row[name] = _time_configs({
                f"{chunk}/w{warps}/{'tma' if st else 'st'}":
                    (lambda chunk=chunk, warps=warps, st=st: _launcher(kern, x, t, chunk, 2, lat, sms, extra, grad=True,
                                                                       store_tma=st, warps=warps)[0])
                for chunk, warps, st in GRAD_CONFIGS})
        K.cross_entropy(x, t, return_grad=True)
        torch.cuda.synchronize()
        row["public_us"] = 1e3 * do_bench(lambda: K.cross_entropy(x, t, return_grad=True), return_mode="median")
        tma = row["one_launch"]["best_us"]
        plain = min(u for u in (row["library"]["best_us"], row["library_prefetch"]["best_us"]) if u)
        row["plain_over_tma"] = plain / tma if tma else None
        row["public_over_tma"] = row["public_us"] / tma if tma else None
        print(f"{row['shape']:>14} grad: plain {plain:.2f} us, TMA {tma:.2f} us, public {row['public_us']:.2f} us, "
              f"torch {row['torch_us']:.2f} us", flush=True)
        out.append(row)
    return out


if __name__ == "__main__":
    main()
