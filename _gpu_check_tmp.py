# Temporary helper script (not part of the repo): correctness + rough timing on the GPU.
import itertools, time, sys
from types import SimpleNamespace as NS
import torch, cuda.tile as ct
from tiletune.kernels.matmul_kernels import *
from tiletune.kernels.rmsnorm_kernels import *
from tiletune.kernels import matmul_kernels as mk
dev = "cuda"; torch.manual_seed(0)
NUM_SMS = torch.cuda.get_device_properties(0).multi_processor_count
stream = torch.cuda.current_stream()
def bench(fn, warm=3, reps=20):
    for _ in range(warm): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return ts[len(ts)//2] * 1e3  # us median
kcache = {}
def hinted(k, occ):
    key = (id(k), occ)
    if key not in kcache: kcache[key] = k.replace_hints(occupancy=occ)
    return kcache[key]
mm_space = [NS(**dict(zip(MATMUL_SPACE_PARAMS, v))) for v in itertools.product(*MATMUL_SPACE_PARAMS.values())]
mm_space = [c for c in mm_space if tile_fits(c)]
print("matmul configs", len(mm_space))
# --- correctness, odd sizes
for dt in (torch.bfloat16, torch.float16):
    for (M, N, K) in [(1000, 520, 700), (4096, 4096, 4096), (77, 1100, 33)]:
        a = torch.randn(M, K, device=dev, dtype=dt); b = torch.randn(K, N, device=dev, dtype=dt)
        ref = matmul_reference(a, b).float()
        worst = 0
        for cfg in mm_space:
            c = torch.full((M, N), float('nan'), device=dev, dtype=dt)
            ct.launch(stream, matmul_grid(cfg, M, N), hinted(matmul_kernel, cfg.occupancy), matmul_args(cfg, a, b, c))
            torch.cuda.synchronize()
            err = ((c.float() - ref).abs().max() / ref.abs().max()).item()
            if not err < 2e-2: print("  BAD", dt, M, N, K, vars(cfg), err)
            worst = max(worst, err) if err == err else float('inf')
        print(f"matmul {dt} {M}x{N}x{K}: worst rel err over {len(mm_space)} cfgs {worst:.2e}")
# --- perf 4096^3 bf16
M = N = K = 4096
a = torch.randn(M, K, device=dev, dtype=torch.bfloat16); b = torch.randn(K, N, device=dev, dtype=torch.bfloat16)
c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
res = []
t0 = time.time()
for cfg in mm_space:
    k = hinted(matmul_kernel, cfg.occupancy); g = matmul_grid(cfg, M, N); args = matmul_args(cfg, a, b, c)
    us = bench(lambda: ct.launch(stream, g, k, args))
    res.append((us, vars(cfg)))
print(f"compile+bench {time.time()-t0:.1f}s")
for us, cfg in sorted(res, key=lambda r: r[0]):
    print(f"  {cfg}  {us:8.1f} us  {2*M*N*K/us/1e6:6.1f} TFLOP/s")
us = bench(lambda: torch.matmul(a, b, out=c)); print(f"  torch.matmul {us:.1f} us {2*M*N*K/us/1e6:.1f} TFLOP/s")
# --- rmsnorm
for dt, (M, N) in [(torch.bfloat16, (16384, 4096)), (torch.bfloat16, (4096, 8192)), (torch.bfloat16, (65536, 1024)),
                   (torch.float16, (1000, 1000)), (torch.float32, (3000, 5000)), (torch.bfloat16, (7, 4096))]:
    x = torch.randn(M, N, device=dev, dtype=dt); w = torch.randn(N, device=dev, dtype=dt)
    ref = rmsnorm_reference(x, w, 1e-6).float()
    for occ in RMSNORM_SPACE_PARAMS["occupancy"]:
        cfg = NS(occupancy=occ); y = torch.full_like(x, float('nan'))
        k = hinted(rmsnorm_kernel, occ); g = rmsnorm_grid(cfg, M, NUM_SMS); args = rmsnorm_args(cfg, x, w, y, 1e-6)
        ct.launch(stream, g, k, args); torch.cuda.synchronize()
        err = (y.float() - ref).abs().max().item()
        us = bench(lambda: ct.launch(stream, g, k, args))
        print(f"rmsnorm {dt} {M}x{N} occ={occ}: maxabs err {err:.3e}  {us:7.1f} us  {2*x.numel()*x.element_size()/us/1e3:7.1f} GB/s")
    us = bench(lambda: torch.nn.functional.rms_norm(x, (N,), w, 1e-6)); print(f"  torch rms_norm {us:.1f} us")
