"""GPU tests of the split-K GEMM (issue 14) and the swapped small-M route (issue 20): correctness against
``torch.matmul`` with ``SPLIT_K > 1`` or ``SWAP`` forced by fixed configs, counters left at zero, repeated calls, a second stream, the fast path.

Run on the GPU host: ``python -m pytest -m gpu -q tests/test_gpu_splitk.py`` (about 20 kernels to
compile on a cold cuTile cache, a minute or so on 16 cores; the runs themselves take milliseconds).

Each fixed config is a one-config tuned op over the production launch plan, reference and
correctness gate (so the tuner's gate checks it too, counters included), swapped into
``tiletune.kernels.gemm.GEMM_SPLITK`` so that the public ``matmul`` runs its real routing and workspace.
"""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("cuda.tile")

import tiletune as tt  # noqa: E402

gemm_mod = importlib.import_module("tiletune.kernels.gemm")
gk = importlib.import_module("tiletune.kernels.gemm_kernels")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(autouse=True)
def _route_small_m_to_splitk(monkeypatch):
    """The public matmul routes to split-K only when asked (off until this file passes on a GPU)."""
    monkeypatch.setattr(gemm_mod, "ROUTE_SMALL_M_TO_SPLITK", True)

CONFIGS = {
    # SPLIT_K, TM, TN, TK, occupancy[, SWAP]
    "swap_64x16": (1, 64, 16, 128, 2, 1),
    "swap_128x32": (1, 128, 32, 64, 1, 1),
    "swap_64x64": (1, 64, 64, 128, 1, 1),
    "s2_64x128": (2, 64, 128, 64, 1),
    "s4_64x64": (4, 64, 64, 128, 2),
    "s8_64x128": (8, 64, 128, 64, 1),
    "s16_64x256": (16, 64, 256, 32, 1),
    "s4_128x128": (4, 128, 128, 64, 1),
}


class _Fixed:
    """Stands in for the ``GEMM_SPLITK`` family: every regime gets one op over one config."""

    def __init__(self, split: int, tm: int, tn: int, tk: int, occ: int, swap: int = 0) -> None:
        self.cfg = dict(TM=tm, TN=tn, TK=tk, GROUP_M=8, LAT=0, occupancy=occ, num_worker_warps=4, SPLIT_K=split,
                        SWAP=swap)
        self.ops: dict = {}
        self.regimes: list = []

    def op(self, regime):
        self.regimes.append(regime)
        if regime not in self.ops:
            space = tt.Space(**{k: [v] for k, v in self.cfg.items()}, baseline=self.cfg)
            self.ops[regime] = tt.autotune(space, reference=gemm_mod._splitk_reference, writes=["c"],
                                           inplace=["ws", "sem"], tolerance=gemm_mod._splitk_tolerance,
                                           name="test.gemm_splitk", db=False, progress=False,
                                           buckets=gemm_mod.GEMM_BUCKETS)(gemm_mod._splitk_plan)
        return self.ops[regime]


@pytest.fixture
def fixed(request, monkeypatch):
    from tiletune.kernels.fastcall import clear_recipes

    fam = _Fixed(*CONFIGS[request.param])
    monkeypatch.setattr(gemm_mod, "GEMM_SPLITK", fam)
    clear_recipes()  # matmul's fast path would replay the previous test's op for the same shapes
    yield fam
    clear_recipes()


def _inputs(m, n, k, dtype, b_transposed):
    g = torch.Generator(device="cuda").manual_seed(m * 7 + k)
    a = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    if b_transposed:
        b = torch.randn(n, k, device="cuda", dtype=dtype, generator=g).t()  # x @ W.t()
    else:
        b = torch.randn(k, n, device="cuda", dtype=dtype, generator=g)
    return a, b


def _check(out, a, b):
    want = (a.double() @ b.double())
    ref16 = torch.matmul(a, b)
    assert out.shape == ref16.shape and out.dtype == a.dtype
    err = (out.double() - want).abs()
    scale = float(want.abs().max())
    # fp32 accumulation in another order than cuBLAS: within a few output ulps of the exact product
    ulp = torch.finfo(a.dtype).eps
    assert float(err.max()) <= 4 * ulp * scale, float(err.max()) / scale
    assert float((ref16.double() - want).abs().max()) <= 4 * ulp * scale  # the bound is fair to torch


def _sems_are_zero():
    for pool in gemm_mod._pools.values():
        torch.cuda.synchronize()
        assert int(pool.sem.abs().sum()) == 0


@pytest.mark.parametrize("fixed", list(CONFIGS), indirect=True)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m", [1, 16, 128])
@pytest.mark.parametrize("k", [4096, 14336])
def test_splitk_matches_torch(fixed, dtype, m, k):
    token_tile = fixed.cfg["TN"] if fixed.cfg["SWAP"] else fixed.cfg["TM"]
    if token_tile > max(64, gk.pow2_ceil(m)):
        pytest.skip("token tile above the regime's cap")
    n = 4096
    for b_t, a_t in ((True, False), (False, False), (False, True)):
        a, b = _inputs(m, n, k, dtype, b_t)
        if a_t:  # A given as K x M (a transposed view)
            a = a.t().contiguous().t()
        out = gemm_mod.matmul(a, b)
        assert fixed.regimes, "matmul did not take the split-K route"
        _check(out, a, b)
        # the counters are back to zero: the second call reduces every tile again
        again = gemm_mod.matmul(a, b)
        assert torch.equal(out, again)  # same split order: bit-identical
        _sems_are_zero()


@pytest.mark.parametrize("fixed", ["s8_64x128"], indirect=True)
def test_splitk_on_a_second_stream_and_through_the_fast_path(fixed):
    a, b = _inputs(16, 4096, 4096, torch.bfloat16, True)
    first = gemm_mod.matmul(a, b)
    for _ in range(3):  # learns and replays the recipe
        assert torch.equal(gemm_mod.matmul(a, b), first)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        outs = [gemm_mod.matmul(a, b) for _ in range(3)]
    torch.cuda.current_stream().wait_stream(side)
    for o in outs:
        assert torch.equal(o, first)
    _sems_are_zero()
    # the side stream's calls got scratch memory of their own, not kept (see _scratch.keepable)
    assert len({key[1] for key in gemm_mod._pools}) == 1


@pytest.mark.parametrize("fixed", ["swap_64x16", "s4_64x64"], indirect=True)
def test_graph_capture_adds_no_scratch_kernels_where_the_config_ignores_them(fixed):
    """Captured into a CUDA graph, a small-M product whose config ignores the split-K scratch replays as
    its one GEMM kernel (no per-replay fill of a fresh workspace); a real split still gets zeroed
    counters of its own and stays correct."""
    from torch.profiler import ProfilerActivity, profile

    a, b = _inputs(8, 4096, 4096, torch.bfloat16, True)
    first = gemm_mod.matmul(a, b)  # tuned (one config) outside the capture
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        gemm_mod.matmul(a, b)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemm_mod.matmul(a, b)
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert torch.equal(out, first)
    assert sum("gemm" in k for k in kernels) == 1, kernels
    if not gemm_mod.uses_scratch(type("C", (), fixed.cfg)):
        assert len(kernels) == 1, kernels


def test_production_splitk_op_tunes_and_matches_torch():
    """The real family (its regime space, tuned exhaustively with the gate) on one small problem."""
    a, b = _inputs(16, 4096, 4096, torch.bfloat16, True)
    out = gemm_mod.matmul(a, b)
    _check(out, a, b)
    regime = gk.splitk_regime(16, 4096, 4096, 2)
    assert regime in gemm_mod.GEMM_SPLITK.ops()
    _sems_are_zero()
