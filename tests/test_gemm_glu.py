"""Fused gate-up GEMM + SwiGLU (issue 20, item 3) on a CPU: space and constraints, launch plans and
grids on shape-only stand-ins, the op's views of the weight, the reference against
``swiglu(x @ w)``, the correctness gate (rounding-level differences pass, planted errors fail), input
errors, and sm_90 compiles of a few configs.

The kernel itself runs only on a GPU: ``tests/test_gpu_gemm_glu.py``.
"""

from __future__ import annotations

import importlib
import inspect
import io
import os
import sys

import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("cuda.tile")

import torch.nn.functional as F  # noqa: E402

gk = importlib.import_module("tiletune.kernels.gemm_glu_kernels")
gg = importlib.import_module("tiletune.kernels.gemm_glu")
K = importlib.import_module("tiletune.kernels")
from tiletune.space.spaces import Config  # noqa: E402
from tiletune.devices.verify import compare_tensors, eps  # noqa: E402

SHAPES = [(m, 14336, 4096) for m in (1, 16, 128, 2048)] + [(1000, 1000, 1000), (3, 40, 24)]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------------------------- space


def test_space_size_baseline_and_constraints():
    space = gg.GEMM_SWIGLU_SPACE
    cfgs = space.configs("sm_90")
    assert 10 <= len(cfgs) <= 40
    assert dict(space.candidates("sm_90")[0]) == gk.GEMM_SWIGLU_BASELINE  # measured first, and it fits
    assert gk.GEMM_SWIGLU_BASELINE in [dict(c) for c in cfgs]
    for c in cfgs:
        assert 2 * c.TM * c.TN * c.occupancy <= 256 * 128, dict(c)
        assert (c.TM + 2 * c.TN) * c.TK * 2 <= 48 * 1024, dict(c)
        assert 2 * c.TM * c.TN < 256 * 128 or c.num_worker_warps == 8, dict(c)
        assert c.occupancy == 1 or c.TM * c.TN == 64 * 64, dict(c)  # the probe's spills are out
    # the template's values, nothing else
    tpl = gk.GEMM_SWIGLU_SPACE_PARAMS
    for name, values in tpl.items():
        assert {getattr(c, name) for c in cfgs} <= set(values)
    # the single-accumulator GEMM's favourite, 128x256, cannot hold two accumulators
    assert not any(c.TM * c.TN > 128 * 128 for c in cfgs)
    assert {(c.TM, c.TN) for c in cfgs} == {(64, 64), (64, 128), (128, 64), (128, 128), (256, 64)}


def test_constraints_reject_what_they_name():
    base = dict(gk.GEMM_SWIGLU_BASELINE)
    cons = gk.gemm_swiglu_constraints(2)

    def ok(**kw):
        c = Config({**base, **kw})
        return {name: bool(f(c)) for name, f in cons.items()}

    assert all(ok().values())
    assert not ok(occupancy=2)["acc_fits"]  # 2 x 128x128 x 2 CTAs
    assert not ok(num_worker_warps=4)["warps_fit"]
    assert not ok(TK=128)["stage_fits"]  # (128 + 256) x 128 x 2 bytes = 96 KiB
    assert not ok(TM=64, TN=64, num_worker_warps=8)["shape"]
    assert not ok(TM=64, TN=128, occupancy=2, num_worker_warps=4)["regs_fit"]


def test_the_gemm_kernel_and_its_spaces_are_untouched():
    """The fused op has its own kernel; the plain GEMM's module does not import it (its source is part
    of the shipped table's identity)."""
    gemm_kernels = importlib.import_module("tiletune.kernels.gemm_kernels")
    assert "swiglu" not in inspect.getsource(gemm_kernels)
    assert gk.gemm_swiglu_kernel is not gemm_kernels.gemm_kernel


# ------------------------------------------------------------------------------------- plans


class _T:
    """A shape-only stand-in for a 2-D CUDA tensor (what the plan reads)."""

    def __init__(self, *shape, dtype="bf16"):
        self.shape = shape
        self.dtype = dtype

    def get_device(self):
        return 0


@pytest.fixture
def sms(monkeypatch):
    monkeypatch.setattr(gg, "sm_count", lambda dev: 132)
    return 132


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("trans_b", [False, True])
def test_plan_grid_and_arguments(sms, m, n, k, trans_b):
    a, c = _T(m, k), _T(m, n)
    bg, bu = (_T(n, k), _T(n, k)) if trans_b else (_T(k, n), _T(k, n))
    params = list(inspect.signature(gk.gemm_swiglu_kernel._pyfunc).parameters)
    for cfg in gg.GEMM_SWIGLU_SPACE.configs("sm_90"):
        launch = gg._plan(cfg, a, bg, bu, c, trans_b)
        assert launch.kernel is gk.gemm_swiglu_kernel
        tiles = _cdiv(m, cfg.TM) * _cdiv(n, cfg.TN)
        assert launch.grid == (max(1, min(tiles, sms * cfg.occupancy)),)
        assert len(launch.args) == len(params)
        named = dict(zip(params, launch.args))
        assert named["A"] is a and named["BG"] is bg and named["BU"] is bu and named["C"] is c
        assert (named["TM"], named["TN"], named["TK"], named["GROUP_M"]) == (cfg.TM, cfg.TN, cfg.TK, cfg.GROUP_M)
        assert named["TRANS_B"] is trans_b and named["ALLOW_TMA"] is True
        assert named["LAT_A"] == named["LAT_B"] == cfg.LAT


def test_hints_follow_the_config():
    for cfg in gg.GEMM_SWIGLU_SPACE.configs("sm_90"):
        assert gk.gemm_swiglu_hints(cfg) == {"occupancy": cfg.occupancy, "num_worker_warps": cfg.num_worker_warps}
    # without a warps parameter, two 128x128 accumulators get two warpgroups
    assert gk.gemm_swiglu_hints(dict(TM=128, TN=128, occupancy=1))["num_worker_warps"] == 8
    assert "num_worker_warps" not in gk.gemm_swiglu_hints(dict(TM=64, TN=64, occupancy=1))


def test_tile_order_covers_every_tile_once():
    """The kernel's linear tile id -> (row, col) swizzle, replayed on host integers."""
    for num_m, num_n in ((1, 112), (16, 224), (7, 5), (9, 3)):
        for group in (1, 8):
            seen = {gk._tile_coords(t, num_m, num_n, group) for t in range(num_m * num_n)}
            assert seen == {(i, j) for i in range(num_m) for j in range(num_n)}


# ------------------------------------------------------------------------------------- the op's views


@pytest.mark.parametrize("layout", ["kn", "nk_view"])
def test_prepare_splits_gate_and_up_like_swiglu(layout):
    m, n, k = 5, 24, 16
    x = torch.randn(2, m, k, dtype=torch.bfloat16)
    w_nk = torch.randn(2 * n, k, dtype=torch.bfloat16)
    w = w_nk.t() if layout == "nk_view" else w_nk.t().contiguous()
    prep = gg.prepare_matmul_swiglu(x, w)
    a, bg, bu, c, trans_b = prep.args
    assert prep.family is gg.GEMM_SWIGLU
    assert trans_b is (layout == "nk_view")
    assert tuple(a.shape) == (2 * m, k) and tuple(c.shape) == (2 * m, n)
    assert tuple(prep.result.shape) == (2, m, n)
    if trans_b:  # halves of the [2N, K] weight, read in place (no copy)
        assert bg.data_ptr() == w_nk.data_ptr() and tuple(bg.shape) == (n, k) and tuple(bu.shape) == (n, k)
        assert torch.equal(bg.t(), w[:, :n]) and torch.equal(bu.t(), w[:, n:])
    else:
        assert bg.data_ptr() == w.data_ptr() and tuple(bg.shape) == (k, n)
        assert torch.equal(bg, w[:, :n]) and torch.equal(bu, w[:, n:])
    # the plan's reference of these views is swiglu(x @ w)
    want = importlib.import_module("tiletune.kernels.glu").glu_reference((x.float() @ w.float())[..., :n], (x.float() @ w.float())[..., n:],
                               torch.empty(0, dtype=x.dtype), 0).reshape(2 * m, n)
    got = gg._reference(a, bg, bu, c, trans_b)
    assert got.dtype == torch.bfloat16
    assert compare_tensors(got, want, gg._tolerance(a)) is None


def test_prepare_copies_halves_the_kernel_cannot_read_by_tma():
    k, n = 16, 3  # bf16 up half starts 6 bytes into each row: not 16-byte aligned
    w = torch.randn(k, 2 * n, dtype=torch.bfloat16)
    _, bg, bu, _, trans_b = gg.prepare_matmul_swiglu(torch.randn(4, k, dtype=torch.bfloat16), w).args
    assert not trans_b
    assert bg.is_contiguous() and bu.is_contiguous()
    assert torch.equal(bg, w[:, :n]) and torch.equal(bu, w[:, n:])


def test_prepare_works_on_meta_tensors():
    x = torch.empty(1, 4096, dtype=torch.bfloat16, device="meta")
    w = torch.empty(2 * 14336, 4096, dtype=torch.bfloat16, device="meta").t()
    a, bg, bu, c, trans_b = gg.prepare_matmul_swiglu(x, w).args
    assert trans_b and tuple(bg.shape) == (14336, 4096) and bu.storage_offset() == 14336 * 4096


# ------------------------------------------------------------------------------------- reference and gate


def _case(m, n, k, dtype=torch.bfloat16, trans_b=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(k, 2 * n, generator=g) / k ** 0.5).to(dtype)
    w_arg = w.t().contiguous().t() if trans_b else w
    return x, w, gg.prepare_matmul_swiglu(x, w_arg)


def _kernel_like(x, w, n, chunk=64):
    """What the fused kernel computes, emulated: float32 products summed over K tiles in a different
    order than the reference, ``g / (1 + exp2(-g log2 e))`` in float32, one rounding."""
    xf, wf = x.float(), w.float()
    acc = torch.zeros(x.shape[0], 2 * n)
    for k0 in range(0, x.shape[1], chunk):
        acc = acc + xf[:, k0:k0 + chunk] @ wf[k0:k0 + chunk]
    g, u = acc[:, :n], acc[:, n:]
    return (g / (1.0 + torch.exp2(g * -1.4426950408889634)) * u).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("trans_b", [False, True])
def test_reference_matches_swiglu_of_the_product(dtype, trans_b):
    m, n, k = 33, 72, 200
    x, w, prep = _case(m, n, k, dtype, trans_b)
    got = gg._reference(*prep.args)
    gu = (x.double() @ w.double()).float()
    want = (F.silu(gu[:, :n]) * gu[:, n:]).to(dtype)
    assert got.dtype == dtype and tuple(got.shape) == (m, n)
    # float64 vs float32 products differ at most by one rounding of the output
    diff = (got.float() - want.float()).abs()
    assert float(diff.max()) <= eps(dtype) * float(want.float().abs().max())
    # and it is the unfused route's math (torch's swiglu of the rounded product, within rounding)
    unfused = (F.silu((x.float() @ w.float()).to(dtype).float()[:, :n])
               * (x.float() @ w.float()).to(dtype).float()[:, n:]).to(dtype)
    assert compare_tensors(unfused, got, {d: t._replace(rtol=4 * eps(dtype), atol_rms=4 * eps(dtype))
                                          for d, t in gg._tolerance(prep.args[0]).items()}) is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n,k", [(64, 128, 512), (7, 40, 4096), (1, 256, 1024)])
def test_gate_accepts_the_fused_result_and_rejects_planted_errors(dtype, m, n, k):
    x, w, prep = _case(m, n, k, dtype, seed=m)
    tol = gg._tolerance(prep.args[0])
    want = gg._reference(*prep.args)
    good = _kernel_like(x, w, n)
    assert compare_tensors(good, want, tol) is None
    # gate and up swapped
    swapped = (x.float() @ w.float())
    bad = (F.silu(swapped[:, n:]) * swapped[:, :n]).to(dtype)
    assert compare_tensors(bad, want, tol) is not None
    # no activation (the plain product of the halves)
    assert compare_tensors((swapped[:, :n] * swapped[:, n:]).to(dtype), want, tol) is not None
    # one element off by 2% of the output's RMS (a wrong tile edge, a lost K tile)
    one = good.clone()
    i, j = m // 2, n // 3
    one[i, j] = (one[i, j].float() + 0.02 * want.float().pow(2).mean().sqrt() + 0.02 * want[i, j].float().abs()).to(dtype)
    assert compare_tensors(one, want, tol) is not None
    # the last K tile dropped
    short = _kernel_like(x[:, : k - 64], w[: k - 64], n)
    assert compare_tensors(short, want, tol) is not None


# ------------------------------------------------------------------------------------- input errors


def _err(fn, *args):
    with pytest.raises((TypeError, ValueError)) as e:
        fn(*args)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("matmul_swiglu(")
    return e.type, msg


def test_input_errors_are_one_line():
    f = gg.matmul_swiglu
    bf = torch.bfloat16
    x, w = torch.randn(4, 16, dtype=bf), torch.randn(16, 64, dtype=bf)
    assert _err(f, "x", w)[0] is TypeError
    t, msg = _err(f, x.float(), w.float())
    assert t is TypeError and "bfloat16 or float16" in msg and "float32" in msg
    t, msg = _err(f, x, w.half())
    assert t is TypeError and "must match" in msg
    t, msg = _err(f, x, torch.randn(16, 63, dtype=bf))
    assert t is ValueError and "even" in msg
    t, msg = _err(f, x, torch.randn(16, 64, 2, dtype=bf))
    assert t is ValueError and "2-D" in msg
    t, msg = _err(f, x, torch.randn(17, 64, dtype=bf))
    assert t is ValueError and "inner dimensions" in msg
    t, msg = _err(f, torch.tensor(1.0, dtype=bf), w)
    assert t is ValueError
    t, msg = _err(f, x, w)  # all good but on the CPU
    assert t is ValueError and "CUDA" in msg


def test_op_is_exported_but_not_routed_anywhere():
    """Exported and a torch custom op (its route under torch.compile), but no other library path calls it."""
    assert K.matmul_swiglu is gg.matmul_swiglu
    assert "matmul_swiglu" not in K.__all__  # like the decode ops: not in the library's op list yet
    assert gg.matmul_swiglu.fastcall.route is not None  # the custom op while compiling
    src_root = os.path.dirname(K.__file__)
    users = []
    for root, _, files in os.walk(os.path.dirname(src_root)):
        for name in files:
            if name.endswith(".py") and name not in ("gemm_glu.py", "gemm_glu_kernels.py", "__init__.py"):
                with open(os.path.join(root, name)) as fh:
                    text = fh.read()
                if "matmul_swiglu" in text or "gemm_glu" in text:
                    users.append(name)
    assert users == ["torch_ops.py"]  # the custom op's real implementation calls the op itself


# ------------------------------------------------------------------------------------- compiles (sm_90)


def _tools():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
    try:
        return importlib.import_module("compile_check_gemm_glu")
    except Exception as exc:  # pragma: no cover - tileiras missing on this host
        pytest.skip(f"tools/compile_check_gemm_glu.py not importable: {exc}")


def test_decode_launch_is_signed_with_convention_v2():
    tools = _tools()
    sig = tools.signature(tools.launch_args("m1_nt", gk.GEMM_SWIGLU_BASELINE))
    assert "v2" in str(sig.calling_convention)
    assert sig.parameters[0].shape_constant == (1, None)
    sig = tools.signature(tools.launch_args("m16_nn", gk.GEMM_SWIGLU_BASELINE))
    assert "v1" in str(sig.calling_convention)


@pytest.mark.parametrize("variant", ["m1_nt", "odd_fp16"])
def test_configs_compile_for_sm90(variant):
    """The baseline and the smallest tile compile (the tool compiles all of them:
    ``python tools/compile_check_gemm_glu.py``)."""
    tools = _tools()
    cfgs = gg.GEMM_SWIGLU_SPACE.candidates("sm_90")  # the baseline first
    for cfg in (cfgs[0], cfgs[1]):
        ok, _, size, err = tools.compile_one(variant, dict(cfg))
        assert ok and size > 0, err


# ------------------------------------------------------------------------------------- decoder layer routing


@pytest.mark.parametrize("fused", [False, True])
def test_decoder_layer_fused_mlp_flag_routes_the_mlp(monkeypatch, fused):
    """``benchmarks/decoder_layer.py``: the MLP uses ``K.matmul_swiglu`` exactly with ``--fused-mlp``; with
    torch stand-ins for the library ops both routes give the same layer output (CPU, small layer)."""
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    import decoder_layer as dl

    for name, val in (("HIDDEN", 64), ("HEADS", 2), ("KV_HEADS", 1), ("HEAD_DIM", 32), ("FFN", 96)):
        monkeypatch.setattr(dl, name, val)
    calls: list[str] = []

    def rec(name, fn):
        def wrapped(*a, **kw):
            calls.append(name)
            return fn(*a, **kw)
        return wrapped

    def swiglu(t):
        n = t.shape[-1] // 2
        return (F.silu(t[..., :n].float()) * t[..., n:].float()).to(t.dtype)

    def rms(x, w, eps):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)

    def rms_res(a, r, w, eps):
        h = (a.float() + r.float()).to(a.dtype)
        return rms(h, w, eps), h

    def sdpa(q, k, v, causal=True):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                              enable_gqa=True).to(q.dtype)

    fakes = {"rms_norm": rms, "rms_norm_residual": rms_res, "apply_rope_": lambda *a: None, "attention": sdpa,
             "matmul": lambda a, b: (a.float() @ b.float()).to(a.dtype), "swiglu": swiglu,
             "matmul_swiglu": lambda x, w: swiglu((x.float() @ w.float()).to(x.dtype))}
    for name, fn in fakes.items():
        monkeypatch.setattr(K, name, rec(name, fn), raising=False)
    w = dl.make_weights("cpu")
    st = dl.State("prefill", 1, 4, device="cpu")
    out = dl.tiletune_layer(w, st, fused_mlp=fused)()
    assert out.shape == st.x.shape and torch.isfinite(out.float()).all()
    assert ("matmul_swiglu" in calls) is fused
    assert calls.count("swiglu") == (0 if fused else 1)
    assert calls.count("matmul") == (3 if fused else 4)  # qkv, o, [gate_up,] down
