"""Probe: why the one-launch cross-entropy kernel was withdrawn (wrong loss at one config).

``benchmarks/_ce_one_launch.py`` finishes the mean inside the launch (row terms to scratch, an arrival
counter, the last block sums). On 2026-12-02 the tuner's gate rejected its CHUNK 8192 / occupancy 4
config on a 7 x 32000 bf16 problem. This launches kernels directly (no tuner) several times per
shape and config of the loss space and counts wrong losses: the one-launch kernel (also with a
128-wide tile for the final sum, without the latency hint, and with its logit loads made without
TMA) and the library's per-row kernel (``tiletune.kernels.cross_entropy_op``) whose row losses
torch sums.

    python benchmarks/probe_ce_tail.py [--out DIR] [--launches 20]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--launches", type=int, default=20)
    args = ap.parse_args()
    from tiletune.kernels.cross_entropy_op import cross_entropy_kernel

    tmp = tempfile.mkdtemp()
    # name -> (kernel, one launch?, LAT)
    variants = {"one_launch": (one_launch_kernel(1024, tmp), True, 10),
                "one_launch_tile128": (one_launch_kernel(128, tmp), True, 10),
                "one_launch_lat0": (one_launch_kernel(1024, tmp), True, 0),
                "one_launch_no_tma": (one_launch_kernel(1024, tmp, tma=False), True, 10),
                "per_row_then_torch_sum": (cross_entropy_kernel, False, 10)}
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for m, v in SHAPES:
        x = (torch.randn(m, v, device=dev, generator=g) * 3.0).to(torch.bfloat16)
        t = torch.randint(0, v, (m,), device=dev, generator=g)
        want = float(F.cross_entropy(x.float(), t))
        ph = torch.empty(1, 1, dtype=torch.bfloat16, device=dev)
        for chunk, occ in CONFIGS:
            for name, (kern, one, lat) in variants.items():
                if name == "one_launch_tile128" and (m, v) != SHAPES[0]:
                    continue
                hinted = kern.replace_hints(occupancy=occ)
                grid = (min(m, sms * occ),)
                out = torch.empty(1, device=dev)
                scratch = torch.zeros(1024, device=dev)
                sem = torch.zeros(1, dtype=torch.int32, device=dev)
                row_loss = torch.empty(m, device=dev)
                got = []
                stream = torch.cuda.current_stream().cuda_stream
                try:
                    for _ in range(args.launches):
                        if one:
                            ct.launch(stream, grid, hinted, (x, t, out, ph, scratch, sem, -100, chunk, False,
                                                             v % chunk == 0, lat, False))
                            got.append(out.clone())
                        else:
                            ct.launch(stream, grid, hinted, (x, t, row_loss, ph, -100, chunk, False, v % chunk == 0,
                                                             lat, False))
                            got.append(row_loss.sum().reshape(1))
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
                       "counter_after": int(sem.item()) if one else None}
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
    write_result("probe_ce_tail", {"problem": "one-launch cross-entropy (benchmarks/_ce_one_launch.py) vs the "
                                              "library's per-row kernel: wrong losses per variant, shape and config "
                                              "(bf16 logits * 3, int64 targets, LAT 10 unless the variant says)",
                                   "summary": summary, "rows": rows}, args.out)


if __name__ == "__main__":
    main()
