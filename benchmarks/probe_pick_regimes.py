"""Why tiletune's pick and exhaustive_search's differ on the example matmul: the same two configs timed
under several load regimes, with the SM clock and power read after each block.

On an H200 (2026-12-07) the tuner's worker measured the 4096^3 example matmul's occupancy-1 and
occupancy-2 configs 0.7-2% apart, while timing them interleaved in one process afterwards
(``tuning_speed.py``'s re-time) put them 6-7% apart, both slower than in the worker; the hypothesis is
the GPU's clock under sustained load (a kernel near the power limit). Regimes, each interleaved over the
configs for ``--rounds`` rounds:

* ``idle_gaps``: one cold-L2 sample, then ``--gap-ms`` of idle GPU (a burst after rest);
* ``batch10``: ten cold-L2 samples per config and round (the tuner's batches; the re-time's method);
* ``heated``: ``--heat-ms`` of back-to-back launches of the config first, then ten cold-L2 samples;
* ``do_bench``: ``triton.testing.do_bench`` (warm L2, back-to-back).

    python benchmarks/probe_pick_regimes.py --out $OUT [--rounds 6]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import write_result  # noqa: E402

CONFIGS = ({"TM": 128, "TN": 128, "TK": 64, "occupancy": 1}, {"TM": 128, "TN": 128, "TK": 64, "occupancy": 2})


def gpu_state(nvml, handle) -> dict:
    """SM clock (MHz), power (W) and the clock-event reasons (a bit mask) of the GPU now."""
    out = {"sm_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
           "power_w": round(nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, 1)}
    try:
        out["reasons"] = int(nvml.nvmlDeviceGetCurrentClocksEventReasons(handle))
    except Exception:  # noqa: BLE001 - an older binding names it differently
        out["reasons"] = None
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--gap-ms", type=float, default=30.0)
    ap.add_argument("--heat-ms", type=float, default=300.0)
    args = ap.parse_args()

    import pynvml as nvml
    import torch
    import cuda.tile as ct
    import triton.testing

    import tuning_speed
    from tiletune.devices.backends.cutile import HintedKernels
    from tiletune.devices.measure import ColdL2Timer

    ns: dict = {}
    exec(tuning_speed.SETUP["matmul"], ns)  # noqa: S102 - the benchmark's own set-up code
    kernel, launch_of, hints_of, targs = ns["KERNEL"], ns["launch_of"], ns["hints_of"], ns["ARGS"]
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    stream = torch._C._cuda_getCurrentRawStream(torch.cuda.current_device())
    h = HintedKernels()

    def launcher(cfg):
        k = h.get(kernel, hints_of(cfg))
        g, a = launch_of(cfg, *targs)
        return lambda: ct.launch(stream, g, k, a)

    fns = [launcher(c) for c in CONFIGS]
    timer = ColdL2Timer(torch.cuda.current_device())
    for f in fns:
        timer.time(f, 3)
    torch.cuda.synchronize()

    def heat(f, ms):
        t_end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < t_end:
            for _ in range(20):
                f()
            torch.cuda.synchronize()

    regimes = {}
    for regime in ("idle_gaps", "batch10", "heated", "do_bench", "batch10_again"):
        samples = [[] for _ in fns]
        states = []
        for r in range(args.rounds):
            order = list(range(len(fns))) if r % 2 == 0 else list(range(len(fns)))[::-1]
            for i in order:
                f = fns[i]
                if regime == "idle_gaps":
                    for _ in range(10):
                        time.sleep(args.gap_ms / 1e3)
                        samples[i] += timer.time(f, 1)
                elif regime.startswith("batch10"):
                    samples[i] += timer.time(f, 10)
                elif regime == "heated":
                    heat(f, args.heat_ms)
                    samples[i] += timer.time(f, 10)
                else:
                    samples[i].append(1e3 * triton.testing.do_bench(f, warmup=25, rep=100, return_mode="median"))
                states.append(dict(gpu_state(nvml, handle), config=i))
        med = [sorted(v)[len(v) // 2] for v in samples]
        regimes[regime] = {"median_us": [round(m, 3) for m in med], "n": [len(v) for v in samples],
                           "occ2_over_occ1": round(med[1] / med[0], 4), "gpu": states}
        print(f"{regime:14s} occ1 {med[0]:8.2f} us  occ2 {med[1]:8.2f} us  ratio {med[1] / med[0]:.4f}  "
              f"sm {min(s['sm_mhz'] for s in states)}-{max(s['sm_mhz'] for s in states)} MHz  "
              f"power {max(s['power_w'] for s in states)} W", flush=True)
    out = {"configs": list(CONFIGS), "problem": "example matmul bf16 4096^3",
           "rounds": args.rounds, "gap_ms": args.gap_ms, "heat_ms": args.heat_ms, "regimes": regimes}
    write_result("probe_pick_regimes", out, args.out)


if __name__ == "__main__":
    main()
