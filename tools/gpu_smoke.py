"""Quick checks of cuTile assumptions on the GPU host (prints a report; writes $OUT/smoke.json)."""
import json, time

out = {}
import torch
import cuda.tile as ct
from cuda.tile.compilation import KernelSignature, CallingConvention
from cuda.tile import _compile as comp
from cuda.tile._cext import default_tile_context
from cutile_cache import _cache as cache
from tiletune.lab.examples.matmul_kernels import matmul_kernel

out["cache_dir"] = default_tile_context.config.cache_dir
dev = torch.device("cuda")
a = torch.randn(512, 512, device=dev, dtype=torch.bfloat16)
b = torch.randn(512, 512, device=dev, dtype=torch.bfloat16)
c = torch.empty(512, 512, device=dev, dtype=torch.bfloat16)
k = matmul_kernel.replace_hints(occupancy=2)
args = (a, b, c, 64, 64, 32, 8)
ver = comp._get_compiler_version_string()
keys = {}
for name in ("cutile_python_v1", "cutile_python_v2"):
    try:
        sig = KernelSignature.from_kernel_args(k, args, getattr(CallingConvention, name)())
        res = comp.compile_tile(k._annotated_function, [sig], sm_arch="sm_90", compiler_options=k._compiler_options,
                                return_bytecode=True, return_cubin=False)
        opt, dbg = comp._tileiras_effective_opt_and_device_debug(k._compiler_options, "sm_90")
        keys[name] = cache.cache_key(ver, "sm_90", opt, bytes(res.bytecode), dbg)
    except Exception as e:
        keys[name] = f"ERR {type(e).__name__}: {e}"
t = time.perf_counter()
ct.launch(torch._C._cuda_getCurrentRawStream(0), (64,), k, args)
torch.cuda.synchronize()
out["first_launch_s"] = time.perf_counter() - t
out["conv_hits"] = {n: (cache.cache_lookup(out["cache_dir"], kk) is not None) if not kk.startswith("ERR") else kk for n, kk in keys.items()}
torch.testing.assert_close(c.float(), (a.float() @ b.float()), rtol=2e-2, atol=2e-1)
out["matmul_small_ok"] = True
# raw stream int accepted? time bare launch
s = torch._C._cuda_getCurrentRawStream(0)
for _ in range(100): ct.launch(s, (64,), k, args)
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(2000): ct.launch(s, (64,), k, args)
out["bare_launch_us_host"] = (time.perf_counter() - t) / 2000 * 1e6
torch.cuda.synchronize()
print(json.dumps(out, indent=1))
