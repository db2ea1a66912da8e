# Temporary helper script (not part of the repo): num_worker_warps / TMA experiments on the GPU.
import itertools, time
from types import SimpleNamespace as NS
import torch, cuda.tile as ct
from tiletune.kernels.matmul_kernels import *
from tiletune.kernels.rmsnorm_kernels import *
dev = "cuda"; torch.manual_seed(0)
NUM_SMS = torch.cuda.get_device_properties(0).multi_processor_count
stream = torch.cuda.current_stream()
def bench(fn, warm=3, reps=30):
    for _ in range(warm): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return ts[len(ts)//2] * 1e3
M = N = K = 4096
a = torch.randn(M, K, device=dev, dtype=torch.bfloat16); b = torch.randn(K, N, device=dev, dtype=torch.bfloat16)
c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
ref = matmul_reference(a, b).float()
a2 = torch.randn(1000, 700, device=dev, dtype=torch.bfloat16); b2 = torch.randn(700, 520, device=dev, dtype=torch.bfloat16)
ref2 = matmul_reference(a2, b2).float()
rows = []
for TM, TN, TK in [(128,256,64),(256,128,64),(128,256,32),(256,128,32),(128,128,64),(64,256,64)]:
    for nww in ((8,) if TM*TN == 32768 else (None, 8)):
        for gm in ((8,) if (TM,TN,TK)!=(128,128,64) or nww else (1, 8, 16)):
            cfg = NS(TM=TM, TN=TN, TK=TK, occupancy=1, GROUP_M=gm)
            h = dict(occupancy=1) if nww is None else dict(occupancy=1, num_worker_warps=nww)
            k = matmul_kernel.replace_hints(**h)
            try:
                args = matmul_args(cfg, a, b, c); g = matmul_grid(cfg, M, N)
                c.fill_(float('nan')); ct.launch(stream, g, k, args); torch.cuda.synchronize()
                err = ((c.float()-ref).abs().max()/ref.abs().max()).item()
                c2 = torch.full((1000, 520), float('nan'), device=dev, dtype=torch.bfloat16)
                ct.launch(stream, matmul_grid(cfg, 1000, 520), k, matmul_args(cfg, a2, b2, c2)); torch.cuda.synchronize()
                err2 = ((c2.float()-ref2).abs().max()/ref2.abs().max()).item()
                us = bench(lambda: ct.launch(stream, g, k, args))
                rows.append((us, f"TM={TM} TN={TN} TK={TK} GM={gm} nww={nww}", err, err2))
            except Exception as e:
                print("FAIL", TM, TN, TK, nww, type(e).__name__, str(e)[:200])
for us, lab, err, err2 in sorted(rows):
    print(f"  {lab:36} {us:8.1f} us {2*M*N*K/us/1e6:6.1f} TFLOP/s  err {err:.1e} odd {err2:.1e}")
us = bench(lambda: torch.matmul(a, b, out=c)); print(f"  torch.matmul {us:.1f} us {2*M*N*K/us/1e6:.1f} TFLOP/s")

@ct.kernel
def rms_notma(X, W, Y, eps, TILE_N: ct.Constant[int]):
    M = X.shape[0]; N = X.shape[1]; inv_n = 1.0 / N
    w = ct.load(W, (0,), shape=(TILE_N,), padding_mode=ct.PaddingMode.ZERO).astype(ct.float32).reshape((1, TILE_N))
    for row in range(ct.bid(0), M, ct.num_blocks(0)):
        x = ct.load(X, (row, 0), shape=(1, TILE_N), padding_mode=ct.PaddingMode.ZERO, allow_tma=False).astype(ct.float32)
        r = ct.rsqrt(ct.sum(x * x, axis=1, keepdims=True) * inv_n + eps)
        ct.store(Y, (row, 0), (x * r * w).astype(Y.dtype), allow_tma=False)
for dt, (Mr, Nr) in [(torch.bfloat16, (16384, 4096))]:
    x = torch.randn(Mr, Nr, device=dev, dtype=dt); w = torch.randn(Nr, device=dev, dtype=dt)
    refr = rmsnorm_reference(x, w, 1e-6).float()
    for name, kern in [("tma", rmsnorm_kernel), ("notma", rms_notma)]:
        for occ in (2, 4):
            cfg = NS(occupancy=occ); y = torch.full_like(x, float('nan'))
            k = kern.replace_hints(occupancy=occ); g = rmsnorm_grid(cfg, Mr, NUM_SMS); args = rmsnorm_args(cfg, x, w, y, 1e-6)
            ct.launch(stream, g, k, args); torch.cuda.synchronize()
            err = (y.float() - refr).abs().max().item()
            us = bench(lambda: ct.launch(stream, g, k, args))
            print(f"rms {name:5} {Mr}x{Nr} occ={occ}: err {err:.2e} {us:7.1f} us {2*x.numel()*x.element_size()/us/1e3:7.1f} GB/s")
    y = torch.empty_like(x); us = bench(lambda: y.copy_(x)); print(f"  copy {us:.1f} us {2*x.numel()*x.element_size()/us/1e3:7.1f} GB/s")
