"""Split-K GEMM (issue 14, item 4) on a CPU: regimes, spaces, launch plans, grids, workspace logic,
the scratch-tolerance plumbing of the correctness check, and sm_90 compiles of split-K configs.

The kernel itself runs only on a GPU: ``tests/test_gpu_splitk.py``.
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

gk = importlib.import_module("tiletune.kernels.gemm_kernels")
gemm_mod = importlib.import_module("tiletune.kernels.gemm")
fastcall = importlib.import_module("tiletune.kernels.fastcall")
from tiletune.space.spaces import Config  # noqa: E402
from tiletune.devices.verify import ArgGuard, Checker  # noqa: E402

#: Llama-3-8B linear layers (N, K) at the token counts of the issue's small-M rows
LLAMA = [(m, n, k) for m in (1, 16, 128) for (n, k) in ((4096, 4096), (14336, 4096), (4096, 14336))]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------------------------- regimes


def test_regime_routes_small_m_only():
    assert gk.splitk_regime(16, 4096, 14336, 2) == (2, 4096, 64, 16)
    assert gk.splitk_regime(1, 4096, 4096, 2) == (2, 4096, 64, 16)
    assert gk.splitk_regime(128, 4096, 4096, 2)[2] == 128
    assert gk.splitk_regime(200, 4096, 4096, 2)[2] == 256
    assert gk.splitk_regime(257, 4096, 4096, 2) is None  # enough tiles: the plain GEMM op
    assert gk.splitk_regime(1024, 4096, 4096, 2) is None
    # a vocabulary projection: the workspace cap leaves no split above 1
    assert gk.splitk_regime(256, 128256, 4096, 2) is None
    # K too shallow for two K tiles per split of any depth
    assert gk.splitk_regime(16, 4096, 64, 2) is None


def test_regime_caps_the_split_by_workspace_and_depth():
    e, k_floor, m_cap, s_max = gk.splitk_regime(128, 14336, 4096, 2)
    assert s_max * 128 * 14336 * 4 <= gk.SPLITK_MAX_WORKSPACE < 2 * s_max * 128 * 14336 * 4
    e, k_floor, m_cap, s_max = gk.splitk_regime(16, 4096, 1000, 2)
    assert k_floor == 512 and s_max * 2 * 32 <= k_floor  # shallowest bf16 TK is 32
    # problems of one regime share one space (one hash), whatever their exact K
    assert gk.splitk_regime(16, 4096, 5000, 2)[:2] == gk.splitk_regime(16, 4096, 14336, 2)[:2]


def test_pow2_helpers():
    assert [gk.pow2_ceil(n) for n in (0, 1, 2, 3, 16, 17, 256)] == [1, 1, 2, 4, 16, 32, 256]
    assert [gk.pow2_floor(n) for n in (1, 2, 3, 4096, 14336)] == [1, 2, 2, 4096, 8192]


# ------------------------------------------------------------------------------------- spaces


def _regime_spaces():
    seen = {}
    for m, n, k in LLAMA + [(16, 4096, 1000), (100, 1000, 5000), (256, 4096, 4096), (16, 4096, 256)]:
        r = gk.splitk_regime(m, n, k, 2)
        if r is not None:
            seen.setdefault(r, (m, n, k))
    return seen


def test_every_regime_space_keeps_its_constraints_and_baseline():
    for regime, (m, n, k) in _regime_spaces().items():
        _, k_floor, m_cap, s_max = regime
        space = gemm_mod._splitk_space_for(regime)
        cfgs = space.configs("sm_90")
        assert cfgs, regime
        assert space.baseline("sm_90") in cfgs
        assert 1 in space.values("SPLIT_K")  # the plain kernel stays a candidate
        for cfg in cfgs:
            assert (cfg.TN if cfg.SWAP else cfg.TM) <= m_cap and cfg.SPLIT_K <= s_max
            assert cfg.TN >= 64 or cfg.SWAP  # narrow token tiles only on the swapped route
            assert cfg.SPLIT_K == 1 or not cfg.SWAP
            assert cfg.SPLIT_K * 2 * cfg.TK <= k_floor <= k
            num_k = _cdiv(k, cfg.TK)
            assert _cdiv(num_k, cfg.SPLIT_K) >= 2  # every split walks two K tiles or more
        assert any(c.SPLIT_K > 1 for c in cfgs)
        assert any(c.SWAP and c.TN == 16 for c in cfgs) and any(not c.SWAP for c in cfgs)
        base = space.baseline("sm_90")
        assert base.SPLIT_K == 1 and bool(base.SWAP) == (m_cap <= 64)


def test_splitk_spaces_leave_the_plain_gemm_space_alone():
    """The plain op's space (and so its hash, its stored records and the shipped table's entries for
    M > 256) is the template's, untouched by split-K."""
    from tiletune.space.templates import matmul_space

    assert gemm_mod.GEMM_SPACE.hash == matmul_space(2).hash
    assert "SPLIT_K" not in gemm_mod.GEMM_SPACE.names
    hashes = {gemm_mod._splitk_space_for(r).hash for r in _regime_spaces()}
    assert gemm_mod.GEMM_SPACE.hash not in hashes and len(hashes) == len(_regime_spaces())


# ------------------------------------------------------------------------------------- launch plans


class _T:
    """A shape-only stand-in for a 3-D CUDA tensor (what the plan reads)."""

    def __init__(self, *shape, dtype="bf16"):
        self.shape = shape
        self.dtype = dtype

    def get_device(self):
        return 0


def _cfg(**kw):
    base = dict(TM=64, TN=128, TK=64, GROUP_M=8, LAT=0, occupancy=1, num_worker_warps=4, SPLIT_K=4)
    base.update(kw)
    return Config(base)


@pytest.fixture
def sms(monkeypatch):
    monkeypatch.setattr(gemm_mod, "_sm_count", lambda dev: 132)
    return 132


def test_split_1_is_the_plain_gemm_launch(sms):
    a, b, c, one = _T(1, 16, 4096), _T(1, 4096, 4096), _T(1, 16, 4096), _T(1)
    ws, sem = _T(16, 16, 4096), _T(64)
    cfg = _cfg(SPLIT_K=1)
    got = gemm_mod._splitk_plan(cfg, a, b, c, one, one, False, True, False, ws, sem)
    plain = gemm_mod._plan(cfg, a, b, c, one, one, False, True, False)
    assert got.kernel is gk.gemm_kernel
    assert got.grid == plain.grid and got.args == plain.args


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (False, True), (True, False)])
def test_swapped_plan_launches_the_transposed_product_on_the_call_tensors(sms, trans_a, trans_b):
    """``SWAP``: one launch of the swapped kernel over ``cdiv(N, TM) * cdiv(M, TN)`` tiles whose tensor
    arguments are the call's own (no views: the hot path's recipe matches them by identity)."""
    m, n, k = 8, 14336, 4096
    a = _T(1, k, m) if trans_a else _T(1, m, k)
    b = _T(1, n, k) if trans_b else _T(1, k, n)
    c, one, ws, sem = _T(1, m, n), _T(1), _T(16, 8, n), _T(64)
    for tm, tn, occ in ((64, 16, 1), (128, 32, 2), (256, 64, 1)):
        cfg = _cfg(TM=tm, TN=tn, SPLIT_K=1, SWAP=1, occupancy=occ)
        launch = gemm_mod._splitk_plan(cfg, a, b, c, one, one, trans_a, trans_b, False, ws, sem)
        assert launch.kernel is gk.gemm_swap_kernel
        assert launch.grid == (min(_cdiv(n, tm) * _cdiv(m, tn), sms * occ),)
        params = list(inspect.signature(gk.gemm_swap_kernel._pyfunc).parameters)
        assert params == list(inspect.signature(gk.gemm_kernel._pyfunc).parameters)
        named = dict(zip(params, launch.args))
        assert named["A"] is a and named["B"] is b and named["C"] is c
        assert (named["TM"], named["TN"], named["TRANS_A"], named["TRANS_B"]) == (tm, tn, trans_a, trans_b)
    # a config of the split-K space without SWAP (records made before it existed) is not swapped
    legacy = Config(dict(TM=64, TN=64, TK=64, GROUP_M=8, LAT=0, occupancy=1, num_worker_warps=4, SPLIT_K=1))
    assert gemm_mod._splitk_plan(legacy, a, b, c, one, one, trans_a, trans_b, False, ws, sem).kernel is gk.gemm_kernel


@pytest.mark.parametrize("m,n,k", LLAMA)
def test_splitk_plan_grid_and_arguments(sms, m, n, k):
    regime = gk.splitk_regime(m, n, k, 2)
    s_max = regime[3]
    a, b, c, one = _T(1, m, k), _T(1, n, k), _T(1, m, n), _T(1)
    ws, sem = _T(s_max, gk.pow2_ceil(m), n), _T(gk.splitk_sem_count(m, n))
    for cfg in gemm_mod._splitk_space_for(regime).configs("sm_90"):
        if cfg.SPLIT_K == 1:
            continue
        assert not cfg.SWAP
        launch = gemm_mod._splitk_plan(cfg, a, b, c, one, one, False, True, False, ws, sem)
        assert launch.kernel is gk.gemm_splitk_kernel
        tiles = _cdiv(m, cfg.TM) * _cdiv(n, cfg.TN)
        assert launch.grid == (min(tiles * cfg.SPLIT_K, sms * cfg.occupancy),)
        params = list(inspect.signature(gk.gemm_splitk_kernel._pyfunc).parameters)
        assert len(launch.args) == len(params)
        named = dict(zip(params, launch.args))
        assert named["WS"] is ws and named["SEM"] is sem and named["C"] is c
        assert (named["TM"], named["TN"], named["TK"], named["SPLIT_K"]) == (cfg.TM, cfg.TN, cfg.TK, cfg.SPLIT_K)
        assert named["TRANS_A"] is False and named["TRANS_B"] is True and named["SCALED"] is False
        # the workspace holds every split's partial tile, and there is a counter for every tile
        assert ws.shape[0] >= cfg.SPLIT_K and ws.shape[1] >= m
        assert sem.shape[0] >= tiles


def test_kernel_work_decomposition_covers_k_once():
    """The kernel's unit -> (tile, split) -> K-tile range arithmetic, replayed on host integers for
    every config of a regime: each (tile, K tile) pair is visited exactly once, counters stay in range
    and the last split of each tile is the one that sees SPLIT_K - 1 arrivals."""
    m, n, k = 16, 4096, 14336
    regime = gk.splitk_regime(m, n, k, 2)
    for cfg in gemm_mod._splitk_space_for(regime).configs("sm_90"):
        if cfg.SWAP:  # the swapped kernel has no splits and no counters
            continue
        S = cfg.SPLIT_K
        num_m, num_n, num_k = _cdiv(m, cfg.TM), _cdiv(n, cfg.TN), _cdiv(k, cfg.TK)
        k_per = _cdiv(num_k, S)
        seen: dict[int, list[int]] = {}
        for unit in range(num_m * num_n * S):
            tile, split = unit // S, unit % S
            lo, hi = split * k_per, min(split * k_per + k_per, num_k)
            seen.setdefault(tile, []).extend(range(lo, hi))
        assert len(seen) == num_m * num_n <= gk.splitk_sem_count(m, n)
        for tile, ks in seen.items():
            assert sorted(ks) == list(range(num_k)), (cfg, tile)


# ------------------------------------------------------------------------------------- workspace


@pytest.fixture
def pools(monkeypatch):
    monkeypatch.setattr(gemm_mod, "_pools", {})
    monkeypatch.setattr(gemm_mod, "_home_stream", {})
    stream = {"now": 7}
    monkeypatch.setattr(gemm_mod, "current_raw_stream", lambda dev: stream["now"])
    return stream


def test_workspace_is_cached_per_bucket_and_stream(pools):
    cpu = torch.device("cpu")
    ws, sem = gemm_mod.splitk_workspace(cpu, 16, 4096, 1, 16)
    assert ws.shape == (16, 16, 4096) and ws.dtype == torch.float32
    assert sem.shape == (gk.splitk_sem_count(16, 4096),) and sem.dtype == torch.int32
    assert int(sem.abs().sum()) == 0
    # same call, same objects (no allocation); another M of the bucket, the same shapes
    again = gemm_mod.splitk_workspace(cpu, 16, 4096, 1, 16)
    assert again[0] is ws and again[1] is sem
    ws9, sem9 = gemm_mod.splitk_workspace(cpu, 9, 4096, 1, 16)
    assert ws9.shape == ws.shape and sem9.shape == sem.shape
    # the first stream's views may be kept by fast-path recipes; another stream's may not
    assert id(ws) in fastcall._constants and id(sem) in fastcall._constants
    pools["now"] = 99
    ws_b, sem_b = gemm_mod.splitk_workspace(cpu, 16, 4096, 1, 16)
    assert ws_b.data_ptr() != ws.data_ptr() and sem_b.data_ptr() != sem.data_ptr()
    assert id(ws_b) not in fastcall._constants and id(sem_b) not in fastcall._constants


def test_workspace_is_per_call_where_memory_may_not_be_kept(pools, monkeypatch):
    """A call on a stream whose allocations belong to a CUDA graph (capture, reduce-overhead's graph
    trees) gets zeroed buffers of its own: nothing is pooled or registered as a recipe constant."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(gemm_mod, "keepable", lambda device: False)
    ws, sem = gemm_mod.splitk_workspace(cpu, 16, 4096, 1, 16)
    again, sem2 = gemm_mod.splitk_workspace(cpu, 16, 4096, 1, 16)
    assert ws.shape == again.shape == (16, 16, 4096) and again is not ws and sem2 is not sem
    assert int(sem.abs().sum()) == 0 and float(ws.abs().sum()) == 0.0
    assert gemm_mod._pools == {} and gemm_mod._home_stream == {}
    assert id(ws) not in fastcall._constants and id(sem) not in fastcall._constants


@pytest.mark.parametrize("known,pooled", [
    ({"SWAP": 1, "SPLIT_K": 1}, False),  # the swapped route ignores the scratch: placeholders, no fill kernel
    ({"SWAP": 0, "SPLIT_K": 1}, False),  # the unsplit GEMM too
    ({"SWAP": 0, "SPLIT_K": 4}, True),   # a real split needs zeroed counters
    (None, True),                        # a key the op does not hold yet: the safe, zeroed scratch
])
def test_scratch_under_capture_is_skipped_for_configs_that_ignore_it(pools, monkeypatch, known, pooled):
    """Inside a CUDA graph capture the zeroed per-call workspace costs two fill kernels in every replay:
    a call whose config never touches it gets uninitialised buffers of the same shapes (same key)."""
    import types

    from tiletune.kernels import _scratch

    cpu = torch.device("cpu")
    monkeypatch.setattr(gemm_mod, "keepable", lambda device: False)
    monkeypatch.setattr(_scratch, "keepable", lambda device: False)
    made = []
    real = gemm_mod.splitk_workspace
    monkeypatch.setattr(gemm_mod, "splitk_workspace", lambda *a: made.append(a) or real(*a))
    seen = []

    class Op:
        def known_config(self, *args):
            seen.append(args)
            return types.SimpleNamespace(**known) if known is not None else None

    head = ("a", "b", "c")
    ws, sem = gemm_mod._splitk_scratch(Op(), cpu, head, 9, 4096, 1, 16)
    assert ws.shape == (16, 16, 4096) and ws.dtype == torch.float32
    assert sem.shape == (gk.splitk_sem_count(9, 4096),) and sem.dtype == torch.int32
    assert seen[0][:3] == head and seen[0][3].shape == ws.shape and seen[0][4].shape == sem.shape
    assert bool(made) == pooled
    if pooled:
        assert int(sem.abs().sum()) == 0 and float(ws.abs().sum()) == 0.0
    # where memory may be kept, the pooled scratch and no lookup at all
    monkeypatch.setattr(gemm_mod, "keepable", lambda device: True)
    seen.clear()
    kept = gemm_mod._splitk_scratch(Op(), cpu, head, 9, 4096, 1, 16)
    assert not seen and kept[0].shape == ws.shape


def test_uses_scratch_only_for_real_splits():
    import types

    assert gemm_mod.uses_scratch(types.SimpleNamespace(SWAP=0, SPLIT_K=2))
    assert not gemm_mod.uses_scratch(types.SimpleNamespace(SWAP=1, SPLIT_K=1))
    assert not gemm_mod.uses_scratch(types.SimpleNamespace(SPLIT_K=1))


def test_workspace_grows_and_old_views_stay_valid(pools):
    cpu = torch.device("cpu")
    small, _ = gemm_mod.splitk_workspace(cpu, 1, 256, 1, 2)
    small.fill_(3.0)
    big, _ = gemm_mod.splitk_workspace(cpu, 128, 4096, 1, 8)
    assert big.shape == (8, 128, 4096)
    assert float(small.sum()) == 3.0 * small.numel()  # the old buffer is still alive
    assert int(gemm_mod._pools[(0, 7)].ws.numel()) >= big.numel()


def test_precheck_sends_other_streams_to_the_slow_path(pools):
    class Dev:
        def get_device(self):
            return 0

    assert gemm_mod._same_stream(Dev())  # no split-K memory yet: every stream may replay
    gemm_mod.splitk_workspace(torch.device("cpu"), 16, 64, 1, 2)
    assert gemm_mod._same_stream(Dev())
    pools["now"] = 8
    assert not gemm_mod._same_stream(Dev())


# ------------------------------------------------------------------------------------- correctness check


def _problem(m=4, n=8, k=64, s_max=4):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1, m, k, generator=g).to(torch.bfloat16)
    b = torch.randn(1, k, n, generator=g).to(torch.bfloat16)
    c = torch.empty(1, m, n, dtype=torch.bfloat16)
    one = torch.ones(1)
    ws = torch.zeros(s_max, gk.pow2_ceil(m), n)
    sem = torch.zeros(8, dtype=torch.int32)
    return (a, b, c, one, one, False, False, False, ws, sem)


def _checker(args):
    guard = ArgGuard(args, outputs=(2,), inplace=(8, 9))
    tol = gemm_mod._splitk_tolerance(*args)
    return guard, Checker(gemm_mod._splitk_reference, guard, tol)


def test_check_ignores_the_workspace_but_not_the_product_or_the_counters():
    args = _problem()
    a, b, c, *_rest = args
    ws, sem = args[8], args[9]
    guard, checker = _checker(args)
    want = (a.double() @ b.double()).to(torch.bfloat16)

    guard.prepare_checked_run()
    c.copy_(want)
    ws.normal_().mul_(1e6)  # partial sums: any finite values
    assert checker.compare() is None

    guard.prepare_checked_run()
    c.copy_(want)
    sem[3] = 1  # a counter left behind: the next launch would finish a tile early
    assert "argument 9" in checker.compare()

    guard.prepare_checked_run()
    c.copy_(want)
    c[0, 0, 0] += 1.0
    assert "argument 2" in checker.compare()

    guard.prepare_checked_run()
    c.copy_(want)
    ws[0, 0, 0] = float("nan")  # NaN partials are a bug even in scratch memory
    assert "argument 8" in checker.compare()

    guard.prepare_checked_run()
    c.copy_(want)
    ws[0, 0, 0] = float("inf")  # and so are infinite ones
    assert "argument 8" in checker.compare()


# ------------------------------------------------------------------------------------- compiles (sm_90)


def _tools():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "tools"))
    try:
        return importlib.import_module("compile_check_all")
    except Exception as exc:  # pragma: no cover - depends on cuda-tile's compilation module
        pytest.skip(f"tools/compile_check_all.py not importable: {exc}")


def _picked_configs(space):
    """One config per SPLIT_K value and per TM, plus the largest tiles: a CI-sized sample (the tool
    compiles every config: ``python tools/compile_check_all.py --only gemm_splitk``)."""
    out, seen = [], set()
    for cfg in space.configs("sm_90"):
        keys = {("S", cfg.SPLIT_K), ("TM", cfg.TM), ("TN", cfg.TN)}
        if not keys <= seen:  # a config counts for every value it covers (no second config for a value)
            seen |= keys
            out.append(cfg)
    return out


@pytest.mark.parametrize("space,variant", [("gemm_splitk", "main"), ("gemm_splitk", "m128"),
                                           ("gemm_splitk", "odd_tn"), ("gemm_swap", "main"), ("gemm_swap", "nt")])
def test_splitk_configs_compile_for_sm90(space, variant):
    tools = _tools()
    from cuda.tile.compilation import export_kernel

    sd = tools.space_defs()[space]
    var = next(v for v in sd.variants if v.name == variant)
    if space == "gemm_swap":  # the narrowest token tile and the deepest K tile
        cfgs = [c for c in sd.space.configs("sm_90") if (c.TN, c.TK) in ((16, 64), (32, 128)) and c.TM == 64][:2]
        assert cfgs
    else:
        cfgs = _picked_configs(sd.space) if variant == "main" else [sd.space.configs("sm_90")[0]]
    for cfg in cfgs:
        kernel = sd.kernel.replace_hints(**sd.hints(cfg))
        buf = io.BytesIO()
        try:
            export_kernel(kernel, [tools.signature(var.make_args(cfg))], buf, gpu_code="sm_90",
                          output_format="cubin")
        except Exception as exc:
            if "tileiras" in str(exc).lower() and "not found" in str(exc).lower():
                pytest.skip(f"no TileIR assembler: {exc}")
            raise AssertionError(f"{variant} {dict(cfg)}: {type(exc).__name__}: {exc}") from exc
        assert len(buf.getvalue()) > 1000


# ------------------------------------------------------------------------------------- benchmark logic


def _bench():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bench = os.path.join(root, "benchmarks")
    if bench not in sys.path:
        sys.path.insert(0, bench)
    return importlib.import_module("kernels_compute")


class _FakeTimer:
    """Times a route by what it returns: the median sample is the callable's result."""

    def time(self, fn, n):
        return [float(fn())] * n


def test_benchmark_quick_rows_are_the_llama_small_m_rows():
    kc = _bench()
    rows = kc.gemm_problems(quick=True)
    assert [(r["M"], r["N"], r["K"]) for r in rows] == [
        (m, n, k) for m in (16, 128, 1024) for (n, k) in kc.LLAMA3_8B_NK]
    assert all(r["dtype"] == "bfloat16" and r["sweep"] for r in rows)


def test_benchmark_picks_the_fastest_torch_route(monkeypatch):
    kc = _bench()
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)

    def broken():
        raise RuntimeError("no such backend")

    row: dict = {}
    best = kc.time_routes(row, {"torch.matmul": lambda: 12.0, "F.linear": lambda: 10.0, "compiled": broken},
                          _FakeTimer(), warmup=1, n=5)
    assert best == "F.linear" == row["torch_best_route"]
    assert row["torch_routes"] == {"torch.matmul": 12.0, "F.linear": 10.0}
    assert "no such backend" in row["torch_route_errors"]["compiled"]


def test_benchmark_routes_of_a_cpu_product_compute_the_same_thing():
    kc = _bench()
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    routes = kc.gemm_torch_routes(a, b, compile_routes=False)
    assert set(routes) == {"torch.matmul", "F.linear"}
    for fn in routes.values():
        assert torch.allclose(fn(), a @ b, atol=1e-5)
    batched = kc.gemm_torch_routes(torch.randn(2, 5, 7), torch.randn(2, 7, 3), compile_routes=False)
    assert set(batched) == {"torch.matmul", "torch.bmm"}


def test_benchmark_summary_reports_the_timer_check():
    kc = _bench()
    rows = [dict(op="gemm", sweep=True, dtype="bfloat16", params=dict(M=16, N=4096, K=4096), ratio=0.9,
                 timer_check=dict(disagreement=0.01, within_tolerance=True)),
            dict(op="gemm", sweep=True, dtype="bfloat16", params=dict(M=128, N=4096, K=4096), ratio=1.1,
                 timer_check=dict(disagreement=0.05, within_tolerance=False))]
    s = kc.summarize(rows, {"gemm": 2})
    assert s["timer_check_rows"] == 2 and s["timer_check_max_disagreement"] == 0.05
    assert s["timer_check_ok"] is False


def test_public_matmul_routes_small_m_to_split_k_since_it_passed_on_a_gpu():
    import tiletune.kernels.gemm as gemm_mod

    assert gemm_mod.ROUTE_SMALL_M_TO_SPLITK is True


def test_split_k_cold_keys_search_a_budget_not_the_whole_space():
    """Issue 13: a library space over ~40 configs is searched under a budget on a cold key."""
    from tiletune.kernels.library_op import LibraryOp
    from tiletune.engine.search import default_search
    from tiletune.space.strategies.base import Budget

    import tiletune.kernels.gemm as gemm_mod

    op = gemm_mod.GEMM_SPLITK.op(gemm_mod.splitk_regime(100, 4096, 4096, 2, 1))
    assert op.budget == Budget(max_evals=gemm_mod.SPLITK_SEARCH_EVALS)
    size = op.space.size("sm_90")
    assert size > gemm_mod.SPLITK_SEARCH_EVALS
    assert default_search(op.space, "sm_90", op.budget) == ("auto", Budget(max_evals=gemm_mod.SPLITK_SEARCH_EVALS))
    try:
        LibraryOp.configure(budget=Budget())  # an explicit unlimited budget measures every config again
        op = gemm_mod.GEMM_SPLITK.op(gemm_mod.splitk_regime(100, 4096, 4096, 2, 1))
        assert default_search(op.space, "sm_90", op.budget)[0] == "exhaustive"
        LibraryOp.configure(strategy="random")  # a strategy of configure brings its own (no) budget
        op = gemm_mod.GEMM_SPLITK.op(gemm_mod.splitk_regime(100, 4096, 4096, 2, 1))
        assert op.strategy == "random" and op.budget in (None, Budget())
    finally:
        LibraryOp.configure()
    assert gemm_mod.GEMM_SPLITK.op(gemm_mod.splitk_regime(100, 4096, 4096, 2, 1)).budget.max_evals == \
        gemm_mod.SPLITK_SEARCH_EVALS


def test_sass_gemm_counts_the_opcodes_that_tell_the_data_paths_apart():
    """``tools/sass_gemm.py`` (the tf32 GEMM's cause, issue 14): opcode counting on cuobjdump text,
    predicated instructions included, other opcodes and non-instruction lines ignored."""
    _tools()
    import sass_gemm

    text = "\n".join([
        "        code for sm_90",
        "        /*0ac0*/                   HGMMA.64x128x8.F32.TF32 R24, gdesc[UR16], R24, UP0 ;",
        "        /*0ad0*/              @!P0 STS.128 [R3], R8 ;",
        "        /*0ae0*/               @P1 STS [R3], R8 ;",
        "        /*0af0*/                   LDSM.16.M88.4 R4, [R2] ;",
        "        /*0b00*/                   FFMA R1, R2, R3, R4 ;",
        "        /*0b10*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R5 ;",
    ])
    counts = sass_gemm.opcode_counts(text)
    assert counts["HGMMA"] == 1 and counts["STS"] == 2 and counts["LDSM"] == 1 and counts["SYNCS"] == 1
    assert counts["LDS"] == 0 and "FFMA" not in counts and set(counts) == set(sass_gemm.CLASSES)


def test_sass_attention_counts_its_classes_and_reads_registers():
    """``tools/sass_attention.py`` (the attention kernel per config, issue 14): its instruction classes
    through sass_gemm's counter, and the registers per thread from ``cuobjdump -res-usage`` text."""
    _tools()
    import sass_attention

    text = "\n".join(["        /*0100*/                   MUFU.EX2 R5, R4 ;",
                      "        /*0110*/               @P0 FFMA R1, R2, R3, R4 ;",
                      "        /*0120*/                   STL [R1], R2 ;"])
    counts = sass_attention.opcode_counts(text, sass_attention.CLASSES)
    assert counts["MUFU"] == 1 and counts["FFMA"] == 1 and counts["STL"] == 1 and counts["HGMMA"] == 0
    assert set(counts) == set(sass_attention.CLASSES)
    res = "Function attention_kernel:\n REG:168 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:904 TEXTURE:0"
    assert sass_attention.registers(res) == 168 and sass_attention.registers("nothing") is None


def test_sass_space_groups_configs_by_their_instructions_not_their_addresses_or_names():
    """``tools/sass_space.py``: two cubins whose instructions are the same (other addresses, another kernel
    name, other encodings) share a digest; one changed operand does not."""
    _tools()
    import sass_space

    def text(name, base, reg):
        return "\n".join([f"        Function : {name}",
                          f"        /*{base:04x}*/                   LDC R1, c[0x0][0x28] ;   /* 0x00000a00ff017b82 */",
                          f"        /*{base + 16:04x}*/               @P0 BRA 0x{base + 64:x} ;   /* 0x000fe20000000800 */",
                          f"        /*{base + 32:04x}*/                   FFMA R{reg}, R2, R3, R4 ;"])

    a = sass_space.code_digest(text("gemm_TM128_occ1", 0x0, 1))
    assert a == sass_space.code_digest(text("gemm_TM128_occ2", 0x100, 1))
    assert a != sass_space.code_digest(text("gemm_TM128_occ2", 0x0, 5))



@pytest.mark.parametrize("sa,sb,narrow", [
    ((1000,), (1000, 100), True),      # vector @ matrix: (1, 100) bf16 is 200 bytes
    ((100, 1000), (1000,), True),      # matrix @ vector: (100, 1)
    ((5, 64, 32), (32,), False),       # (5, 64, 1): 128 bytes per batch, a multiple of 16
    ((1, 4096), (4096, 50257), True),  # decode over an odd vocabulary
    ((1, 4096), (4096, 32000), False),
    ((7, 4096), (4096, 50257), False),  # several rows: the row stride is not 16-byte aligned, no TMA store
])
def test_one_row_or_column_results_off_16_bytes_are_narrow(sa, sb, narrow):
    """matmul computes these with torch.matmul: TMA stores wrote past the end of such results on sm_90."""
    from tiletune.kernels.gemm import narrow_output, prepare_matmul

    a = torch.empty(sa, dtype=torch.bfloat16, device="meta")
    b = torch.empty(sb, dtype=torch.bfloat16, device="meta")
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    one = torch.ones(1, device="meta")
    _, _, args = prepare_matmul(a2, b2, torch.bfloat16, one, one)
    assert narrow_output(args[2]) is narrow


def test_narrow_result_rule():
    from tiletune.kernels.gemm_kernels import narrow_result

    assert narrow_result(1, 1001, 2) and narrow_result(100, 1, 2) and narrow_result(7, 1, 4)
    assert not narrow_result(1, 1000, 2) and not narrow_result(8, 1, 2) and not narrow_result(4, 1, 4)
    assert not narrow_result(7, 1001, 2)  # several rows and columns: the kernels' stores stay in bounds
