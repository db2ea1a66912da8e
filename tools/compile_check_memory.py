#!/usr/bin/env python
"""Compile every config of every memory-bound op's space for representative shapes, no GPU needed.

For each op (RMSNorm, fused residual RMSNorm, LayerNorm, softmax, SwiGLU, GeGLU (erf and tanh),
RoPE, cross-entropy loss and loss + gradient), each dtype (bf16, fp16, fp32) and each case shape
(LLM-typical ones and awkward ones: N not a power of two, N = 1, M = 1, rows longer than one tile,
strided rows, partial rotary, odd head dims), this

1. builds the call on *meta* tensors through the op's own ``prepare_*`` function (the same views,
   outputs, regime and tuned-op family the real call uses),
2. asks the family for the regime's :class:`~tiletune.Space`, and for every candidate on ``--arch``
   runs the op's launch plan (with a fake SM count) to get the kernel and its arguments,
3. turns the arguments into the :class:`~cuda.tile.compilation.KernelSignature` ``ct.launch`` would
   build (dtype, rank, strides, 16-byte divisibility bits, constants, float32/int32 scalars), applies
   the config's hints and compiles to a cubin with
   :func:`~cuda.tile.compilation.export_kernel` (Python -> TileIR -> ``tileiras``).

Identical (kernel, signature, hints) triples are compiled once. With ``--resources`` (needs
``cuobjdump``, and ``nvdisasm`` for the instruction counts, from a CUDA toolkit; found on PATH, in
``$CUDA_HOME/bin`` or via ``--cuda-bin``) it prints registers, spill stack, shared memory, threads
per block and the count of TMA loads/stores in each cubin: the offline probe used to shape the
spaces in :mod:`tiletune.space.templates`.

Usage::

    python tools/compile_check_memory.py [--arch sm_90] [--only rms_norm,softmax] [--dtypes bf16]
                                         [--quick] [--resources] [--jobs N]

Exit status 0 when every config compiled, 1 otherwise (spills are reported, not failures).
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any, Callable

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

import torch  # noqa: E402

import cuda.tile as ct  # noqa: E402
from cuda.tile.compilation import (  # noqa: E402
    ArrayConstraint,
    CallingConvention,
    KernelSignature,
    ScalarConstraint,
    export_kernel,
)

from tiletune.kernels import _membound  # noqa: E402
from tiletune.kernels.cross_entropy_op import prepare_cross_entropy  # noqa: E402
from tiletune.kernels.glu import ACT_GELU_ERF, ACT_GELU_TANH, ACT_SILU, prepare_glu  # noqa: E402
from tiletune.kernels.norms import prepare_layer_norm, prepare_rms_norm, prepare_rms_norm_residual  # noqa: E402
from tiletune.kernels.rope import prepare_rope  # noqa: E402
from tiletune.kernels.softmax_op import prepare_softmax  # noqa: E402

FAKE_SM_COUNT = 132  # H200; only the grid depends on it, and the grid does not enter the cubin
_membound.sm_count = lambda device_index: FAKE_SM_COUNT  # meta tensors have no device

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_CT = {torch.bfloat16: ct.bfloat16, torch.float16: ct.float16, torch.float32: ct.float32,
       torch.int64: ct.int64, torch.int32: ct.int32}


def meta(shape, dtype) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device="meta")


# ---------------------------------------------------------------------------------------------
# Cases: name -> list of (label, builder(dtype) -> Prepared)
# ---------------------------------------------------------------------------------------------


def _w(n, dt):
    return meta((n,), dt)


def _rope(b, s, hq, hk, d, r, layout, cos_b, trig_dtype=torch.float32):
    def build(dt):
        if layout == "bshd":
            q, k = meta((b, s, hq, d), dt), meta((b, s, hk, d), dt)
        else:
            q, k = meta((b, hq, s, d), dt), meta((b, hk, s, d), dt)
        shape = (s, r) if cos_b is None else (cos_b, s, r)
        return prepare_rope(q, k, meta(shape, trig_dtype), meta(shape, trig_dtype), layout)

    return build


def _strided_rows(m, n, row_stride, dt):
    return meta((m, row_stride), dt)[:, :n]


CASES: dict[str, list[tuple[str, Callable[[Any], Any]]]] = {
    "rms_norm": [
        ("4096x4096", lambda dt: prepare_rms_norm(meta((4096, 4096), dt), _w(4096, dt))),
        ("2x500x1000 (N not pow2)", lambda dt: prepare_rms_norm(meta((2, 500, 1000), dt), _w(1000, dt))),
        ("8x1 (N=1)", lambda dt: prepare_rms_norm(meta((8, 1), dt), _w(1, dt))),
        ("1x8192 (M=1), fp32 weight", lambda dt: prepare_rms_norm(meta((1, 8192), dt), _w(8192, torch.float32))),
        ("64x20000 (chunked)", lambda dt: prepare_rms_norm(meta((64, 20000), dt), _w(20000, dt))),
        ("512x3000 rows strided 4096", lambda dt: prepare_rms_norm(_strided_rows(512, 3000, 4096, dt), _w(3000, dt))),
        ("256x768 no weight", lambda dt: prepare_rms_norm(meta((256, 768), dt), None)),
        ("16x12288", lambda dt: prepare_rms_norm(meta((16, 12288), dt), _w(12288, dt))),
        ("33x1001 (row stride not 16-byte aligned: no TMA)", lambda dt: prepare_rms_norm(meta((33, 1001), dt),
                                                                                          _w(1001, dt))),
        ("70000x32768 (int64 indexing)", lambda dt: prepare_rms_norm(meta((70000, 32768), dt), _w(32768, dt))),
    ],
    "rms_norm_residual": [
        ("4096x4096", lambda dt: prepare_rms_norm_residual(meta((4096, 4096), dt), meta((4096, 4096), dt),
                                                           _w(4096, dt))),
        ("333x5120", lambda dt: prepare_rms_norm_residual(meta((333, 5120), dt), meta((333, 5120), dt),
                                                          _w(5120, dt))),
        ("16x24576 (chunked)", lambda dt: prepare_rms_norm_residual(meta((16, 24576), dt), meta((16, 24576), dt),
                                                                    _w(24576, dt))),
        ("7x1 (N=1) no weight", lambda dt: prepare_rms_norm_residual(meta((7, 1), dt), meta((7, 1), dt), None)),
        ("70000x32768 (int64 indexing)", lambda dt: prepare_rms_norm_residual(
            meta((70000, 32768), dt), meta((70000, 32768), dt), _w(32768, dt))),
    ],
    "layer_norm": [
        ("4096x4096 w+b", lambda dt: prepare_layer_norm(meta((4096, 4096), dt), _w(4096, dt), _w(4096, dt))),
        ("1000x1000 w", lambda dt: prepare_layer_norm(meta((1000, 1000), dt), _w(1000, dt), None)),
        ("7x30000 (chunked) w+b", lambda dt: prepare_layer_norm(meta((7, 30000), dt), _w(30000, dt), _w(30000, dt))),
        ("256x768 none", lambda dt: prepare_layer_norm(meta((256, 768), dt), None, None)),
        ("3x1 (N=1) w+b", lambda dt: prepare_layer_norm(meta((3, 1), dt), _w(1, dt), _w(1, dt))),
        ("300000x8192 (int64 indexing)", lambda dt: prepare_layer_norm(meta((300000, 8192), dt), _w(8192, dt),
                                                                       _w(8192, dt))),
    ],
    "softmax": [
        ("4096x4096", lambda dt: prepare_softmax(meta((4096, 4096), dt))),
        ("1000x1000", lambda dt: prepare_softmax(meta((1000, 1000), dt))),
        ("8x1 (N=1)", lambda dt: prepare_softmax(meta((8, 1), dt))),
        ("4x65536 (chunked)", lambda dt: prepare_softmax(meta((4, 65536), dt))),
        ("16x50257 (chunked, odd)", lambda dt: prepare_softmax(meta((16, 50257), dt))),
        ("512x3000 rows strided 4096", lambda dt: prepare_softmax(_strided_rows(512, 3000, 4096, dt))),
        ("600000x4096 (int64 indexing)", lambda dt: prepare_softmax(meta((600000, 4096), dt))),
    ],
    "swiglu": [
        ("4096x(2x14336)", lambda dt: prepare_glu(meta((4096, 2 * 14336), dt), ACT_SILU)),
        ("7x(2x1000)", lambda dt: prepare_glu(meta((7, 2 * 1000), dt), ACT_SILU)),
        ("1x(2x1)", lambda dt: prepare_glu(meta((1, 2), dt), ACT_SILU)),
        ("64x(2x4096) rows strided 3x4096", lambda dt: prepare_glu(_strided_rows(64, 2 * 4096, 3 * 4096, dt),
                                                                   ACT_SILU)),
        ("70000x(2x16384) (int64 indexing)", lambda dt: prepare_glu(meta((70000, 2 * 16384), dt), ACT_SILU)),
    ],
    "geglu": [
        ("4096x(2x4096) erf", lambda dt: prepare_glu(meta((4096, 2 * 4096), dt), ACT_GELU_ERF)),
        ("3x(2x777) tanh", lambda dt: prepare_glu(meta((3, 2 * 777), dt), ACT_GELU_TANH)),
    ],
    "rope": [
        ("bshd 2x1024x32/8x128, cos (S,R) fp32", _rope(2, 1024, 32, 8, 128, 128, "bshd", None)),
        ("bhsd 1x32/8x512x128, cos (1,S,R) bf16", _rope(1, 512, 32, 8, 128, 128, "bhsd", 1, torch.bfloat16)),
        ("bshd 2x16x12/12x96 partial R=64, cos (B,S,R)", _rope(2, 16, 12, 12, 96, 64, "bshd", 2)),
        ("bshd 1x7x5/1x80 (half 40)", _rope(1, 7, 5, 1, 80, 80, "bshd", None)),
        ("decode bshd 4x1x32/8x128", _rope(4, 1, 32, 8, 128, 128, "bshd", None)),
        ("bshd 5x65536x64/8x128 (int64 indexing)", _rope(5, 65536, 64, 8, 128, 128, "bshd", None)),
    ],
    "cross_entropy": [
        ("4096x128256", lambda dt: prepare_cross_entropy(meta((4096, 128256), dt), meta((4096,), torch.int64))),
        ("7x1000", lambda dt: prepare_cross_entropy(meta((7, 1000), dt), meta((7,), torch.int64))),
        ("1x256000 int32 targets", lambda dt: prepare_cross_entropy(meta((1, 256000), dt), meta((1,), torch.int32))),
        ("20000x128256 (int64 indexing)", lambda dt: prepare_cross_entropy(meta((20000, 128256), dt),
                                                                           meta((20000,), torch.int64))),
    ],
    "cross_entropy_grad": [
        ("4096x128256", lambda dt: prepare_cross_entropy(meta((4096, 128256), dt), meta((4096,), torch.int64), True)),
        ("5x50257", lambda dt: prepare_cross_entropy(meta((5, 50257), dt), meta((5,), torch.int64), True)),
        ("20000x128256 (int64 indexing)", lambda dt: prepare_cross_entropy(
            meta((20000, 128256), dt), meta((20000,), torch.int64), True)),
    ],
}


# ---------------------------------------------------------------------------------------------
# Signatures
# ---------------------------------------------------------------------------------------------


def array_constraint(t: torch.Tensor, index_dtype, v2: bool = False) -> ArrayConstraint:
    """The constraint ``ct.launch`` derives for a tensor: strides, 16-byte divisibility, alignment;
    with ``v2`` (calling convention v2) size-1 dimensions are shape constants."""
    itemsize = t.element_size()
    elems_16b = max(1, 16 // itemsize)
    strides = [int(s) for s in t.stride()]
    shape = [int(d) for d in t.shape]
    extra: dict[str, Any] = {"shape_constant": tuple(1 if d == 1 else None for d in shape)} if v2 else {}
    return ArrayConstraint(
        _CT[t.dtype], t.dim(),
        index_dtype=index_dtype,
        stride_lower_bound_incl=0,
        alias_groups=(),
        may_alias_internally=False,
        stride_constant=tuple(1 if s == 1 else None for s in strides),
        stride_divisible_by=tuple(1 if s == 1 else (elems_16b if (s * itemsize) % 16 == 0 else 1) for s in strides),
        shape_divisible_by=tuple(16 if d % 16 == 0 else 1 for d in shape),
        base_addr_divisible_by=16 if (t.storage_offset() * itemsize) % 16 == 0 else itemsize,
        **extra,
    )


def signature(kernel, kargs) -> KernelSignature:
    anns = kernel._annotated_function.parameter_annotations
    if len(anns) != len(kargs):
        raise TypeError(f"kernel takes {len(anns)} arguments, the plan passed {len(kargs)}")
    params = []
    for ann, a in zip(anns, kargs):
        if getattr(ann, "constant", False):
            params.append(a)
        elif isinstance(a, torch.Tensor):
            arr = getattr(ann, "array", None)
            idx = getattr(arr, "index_dtype", None) or ct.int32
            params.append(array_constraint(a, idx))
        elif isinstance(a, bool):
            params.append(ScalarConstraint(ct.bool_))
        elif isinstance(a, int):
            params.append(ScalarConstraint(ct.int32))
        elif isinstance(a, float):
            params.append(ScalarConstraint(ct.float32))
        else:
            raise TypeError(f"cannot model kernel argument {a!r}")
    return KernelSignature(params, CallingConvention.cutile_python_v1())


# ---------------------------------------------------------------------------------------------
# Resources (optional)
# ---------------------------------------------------------------------------------------------


def find_tool(name: str, extra: str | None) -> str | None:
    for d in filter(None, [extra, os.path.join(os.environ.get("CUDA_HOME", ""), "bin")]):
        p = os.path.join(d, name)
        if os.path.exists(p):
            return p
    return shutil.which(name)


def resources(cubin: bytes, cuobjdump: str, nvdisasm: str | None) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        ru = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True).stdout
        elf = subprocess.run([cuobjdump, "-elf", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True).stdout if nvdisasm else ""
    out: dict[str, Any] = {}
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)", ru)
    if m:
        out.update(reg=int(m[1]), stack=int(m[2]), smem=int(m[3]))
    m = re.search(r"EIATTR_REQNTID\s*\n\s*Format:.*\n\s*Value:\s*(0x[0-9a-f]+)", elf)
    if m:
        out["threads"] = int(m[1], 16)
    if sass:
        out["tma_ld"] = len(re.findall(r"\bUTMALDG\b", sass))
        out["tma_st"] = len(re.findall(r"\bUTMASTG\b", sass))
    return out


# ---------------------------------------------------------------------------------------------
# Jobs
# ---------------------------------------------------------------------------------------------


def _indexes_int64(kernel) -> bool:
    anns = kernel._annotated_function.parameter_annotations
    return any(getattr(getattr(a, "array", None), "index_dtype", None) == ct.int64 for a in anns)


def plan_jobs(ops: list[str], dtypes: list[str], arch: str, quick: bool, only_cases: str | None = None) -> list[tuple]:
    """``(op, case index, label, dtype, config dict, hints, dedupe key)`` for every compile."""
    jobs, seen = [], set()
    for op in ops:
        cases = CASES[op][:1] if quick else CASES[op]
        for ci, (label, build) in enumerate(cases):
            if only_cases and only_cases not in label:
                continue
            for dn in dtypes:
                prep = build(DTYPES[dn])
                space = prep.family.space_for(prep.regime)
                for cfg in space.candidates(arch):
                    spec = prep.family.plan(cfg, *prep.args)
                    sig = signature(spec.kernel, spec.args)
                    hints = dict(cfg.hints)
                    key = (id(spec.kernel), repr(sig), tuple(sorted(hints.items())))
                    dup = key in seen
                    seen.add(key)
                    if "int64" in label and not _indexes_int64(spec.kernel):
                        raise AssertionError(f"{op} {label}: the plan did not pick the 64-bit-index kernel")
                    jobs.append((op, ci, label, dn, dict(cfg), hints, dup))
    return jobs


def run_job(job: tuple, arch: str, opt_level: int | None, tools: tuple) -> dict[str, Any]:
    op, ci, label, dn, cfg_d, hints, dup = job
    res: dict[str, Any] = {"op": op, "case": label, "dtype": dn, "config": cfg_d, "dup": dup}
    if dup:
        res.update(ok=True, seconds=0.0)
        return res
    try:
        prep = CASES[op][ci][1](DTYPES[dn])
        space = prep.family.space_for(prep.regime)
        cfg = space.config(arch, **cfg_d)
        spec = prep.family.plan(cfg, *prep.args)
        sig = signature(spec.kernel, spec.args)
        h = dict(hints)
        if opt_level is not None:
            h["opt_level"] = opt_level
        kernel = spec.kernel.replace_hints(**h) if h else spec.kernel
        buf = io.BytesIO()
        t0 = time.perf_counter()
        export_kernel(kernel, [sig], buf, gpu_code=arch, output_format="cubin")
        res.update(ok=True, seconds=time.perf_counter() - t0, cubin_kib=len(buf.getvalue()) / 1024,
                   grid=list(spec.grid))
        if tools[0]:
            res.update(resources(buf.getvalue(), tools[0], tools[1]))
    except Exception as exc:  # noqa: BLE001 - report every failure, keep going
        res.update(ok=False, seconds=0.0, error=f"{type(exc).__name__}: {exc}")
        if os.environ.get("COMPILE_CHECK_TRACEBACK"):
            res["error"] += "\n" + traceback.format_exc()
    return res


def _fmt(r: dict[str, Any]) -> str:
    cfg = " ".join(f"{k}={v}" for k, v in r["config"].items())
    if r.get("dup"):
        return f"  {r['dtype']:<4} {cfg:<70} (same cubin as above)"
    if not r["ok"]:
        return f"  {r['dtype']:<4} {cfg:<70} FAIL\n      " + r["error"].replace("\n", "\n      ")
    extra = ""
    if "reg" in r:
        extra = f" reg={r['reg']:<3} stack={r['stack']:<4} smem={r['smem'] / 1024:6.1f}K thr={r.get('threads', '?')}"
        if "tma_ld" in r:
            extra += f" tma={r['tma_ld']}/{r['tma_st']}"
        if r["stack"]:
            extra += "  SPILL"
    return f"  {r['dtype']:<4} {cfg:<70} {r['seconds']:5.2f}s ok{extra}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--only", default=None, help="comma-separated ops: " + ",".join(CASES))
    ap.add_argument("--dtypes", default="bf16,fp16,fp32")
    ap.add_argument("--quick", action="store_true", help="first case of each op only")
    ap.add_argument("--cases", default=None, help="only cases whose label contains this text")
    ap.add_argument("--resources", action="store_true", help="registers/spills/smem/TMA per cubin")
    ap.add_argument("--cuda-bin", default=None, help="folder with cuobjdump and nvdisasm")
    ap.add_argument("--opt-level", type=int, default=None)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiler processes")
    args = ap.parse_args(argv)

    ops = list(CASES) if not args.only else [o.strip() for o in args.only.split(",")]
    unknown = [o for o in ops if o not in CASES]
    if unknown:
        ap.error(f"unknown op(s) {unknown}; choose from {list(CASES)}")
    dtypes = [d.strip() for d in args.dtypes.split(",")]
    tools: tuple = (None, None)
    if args.resources:
        tools = (find_tool("cuobjdump", args.cuda_bin), find_tool("nvdisasm", args.cuda_bin))
        if not tools[0]:
            print("--resources: cuobjdump not found (PATH, $CUDA_HOME/bin, --cuda-bin); skipping resources")

    t_all = time.perf_counter()
    jobs = plan_jobs(ops, dtypes, args.arch, args.quick, args.cases)
    todo = [j for j in jobs if not j[6]]
    print(f"{len(jobs)} configs ({len(todo)} distinct cubins) over {len(ops)} ops, dtypes {dtypes}, "
          f"{args.arch}, {args.jobs} processes", flush=True)
    results: dict[int, dict[str, Any]] = {}
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futs = {pool.submit(run_job, j, args.arch, args.opt_level, tools): i for i, j in enumerate(jobs)}
            for fut in as_completed(futs):
                results[futs[fut]] = fut.result()
    else:
        for i, j in enumerate(jobs):
            results[i] = run_job(j, args.arch, args.opt_level, tools)

    failed = spills = 0
    last = None
    for i in range(len(jobs)):
        r = results[i]
        head = (r["op"], r["case"])
        if head != last:
            print(f"== {r['op']}: {r['case']}")
            last = head
        print(_fmt(r))
        failed += not r["ok"]
        spills += bool(r.get("stack"))
    n_comp = sum(1 for r in results.values() if not r.get("dup"))
    secs = [r["seconds"] for r in results.values() if r["ok"] and not r.get("dup")]
    print(f"\nTOTAL: {len(jobs) - failed}/{len(jobs)} configs compiled ({n_comp} distinct cubins, "
          f"{sum(secs):.0f} s of compiler time, {time.perf_counter() - t_all:.0f} s wall)"
          + (f"; {spills} cubins spill registers" if args.resources and tools[0] else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
