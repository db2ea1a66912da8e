"""GPU tests of the fused gate-up GEMM + SwiGLU (issue 20, item 3): ``tiletune.kernels.matmul_swiglu``.

Run on the GPU host: ``python -m pytest -m gpu -q tests/test_gpu_gemm_glu.py`` (about 70 kernels to
compile on a cold cuTile cache, 18 configs measured per shape with few timing samples; about two
minutes on an H200).

The op's real space, launch plan, reference and correctness gate are tuned (with a test database and
few timing samples) over Llama-3-8B's MLP shapes (``M`` = 1, 16, 128, 2048 tokens, ``N`` = 14336,
``K`` = 4096; the weight both ``[K, 2N]`` row-major and ``W.t()`` of a ``[2N, K]`` linear weight):
every measured config must pass the gate, and the winner's output is checked against float64 torch
and against the unfused route ``K.swiglu(K.matmul(x, w))`` (run at its baseline configs, untuned).
"""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("cuda.tile")

import tiletune as tt  # noqa: E402
from tiletune.devices.verify import compare_tensors, derived_tolerance  # noqa: E402
from tiletune.kernels.gemm_kernels import narrow_result  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

gg = importlib.import_module("tiletune.kernels.gemm_glu")
K = importlib.import_module("tiletune.kernels")

#: These tests check correctness, not the choice: few timing samples per candidate.
FAST = tt.TunerOptions(stopping=tt.StoppingRule(min_samples=3, max_samples=6, max_seconds=0.05), batch=3,
                       showdown_rounds=1)

HIDDEN, FFN = 4096, 14336
_op: dict[str, tt.TunedOp] = {}


@pytest.fixture
def tuned(monkeypatch):
    """The op's family answers with one tuned op over the production space, plan, reference and gate,
    without the user's database (shared by the tests of this process)."""
    if "op" not in _op:
        fam = gg.GEMM_SWIGLU
        _op["op"] = tt.autotune(gg.GEMM_SWIGLU_SPACE, reference=fam.reference, writes=list(fam.writes),
                                tolerance=fam.tolerance, buckets=fam.buckets, db=False, progress=False,
                                options=FAST, name="tiletune.gemm_swiglu[test]")(fam.plan)
    monkeypatch.setattr(gg.GEMM_SWIGLU, "op", lambda regime: _op["op"])
    return _op["op"]


def _inputs(m, n, k, dtype, trans_b, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", dtype=dtype, generator=g)
    scale = k ** -0.5
    if trans_b:  # a linear layer's [2N, K] weight, passed as W.t()
        w = (torch.randn(2 * n, k, device="cuda", generator=g) * scale).to(dtype).t()
    else:
        w = (torch.randn(k, 2 * n, device="cuda", generator=g) * scale).to(dtype)
    return x, w


def _f64(x, w):
    gu = x.double() @ w.double()
    n = w.shape[1] // 2
    return torch.nn.functional.silu(gu[..., :n]) * gu[..., n:]


def _all_passed(op, before):
    new = [res for key, res in op.results.items() if key not in before]
    assert new, "no tuning session ran"
    for res in new:
        assert res.successes, res.summary()
        assert not res.failures, res.summary()
    return new


def _check(y, x, w):
    n = w.shape[1] // 2
    assert y.shape == (*x.shape[:-1], n) and y.dtype == x.dtype and y.is_contiguous()
    tol = {d: derived_tolerance(d, length=x.shape[-1], atol_ulps=2.0, compute_ulps=64.0)
           for d in ("float16", "bfloat16")}
    why = compare_tensors(y, _f64(x, w), tol)
    assert why is None, why


@pytest.mark.parametrize("trans_b", [False, True], ids=["kn", "wt"])
@pytest.mark.parametrize("m", [1, 16, 128, 2048])
def test_decoder_shapes_tuned(tuned, monkeypatch, m, trans_b):
    x, w = _inputs(m, FFN, HIDDEN, torch.bfloat16, trans_b, seed=m)
    before = set(tuned.results)
    y = K.matmul_swiglu(x, w)
    torch.cuda.synchronize()
    _all_passed(tuned, before)
    _check(y, x, w)
    # a second call with another token count in the bucket reuses the tuning (no new session)
    if m > 1:
        before = set(tuned.results)
        x2 = x[: m - 1]
        _check(K.matmul_swiglu(x2, w), x2, w)
        assert set(tuned.results) == before
    # the unfused route (its baseline configs, no tuning): equal up to the rounding of gate and up to bf16
    monkeypatch.setenv("TILETUNE_DISABLE", "1")
    unfused = K.swiglu(K.matmul(x, w))
    loose = {"bfloat16": derived_tolerance("bfloat16", length=HIDDEN, ulps=4.0, atol_ulps=4.0, compute_ulps=64.0)}
    why = compare_tensors(y, unfused.double(), loose)
    assert why is None, why


@pytest.mark.parametrize("m,n,k,dtype", [(1000, 1000, 1000, torch.float16), (37, 100, 264, torch.bfloat16),
                                         (5, 12, 40, torch.float16),
                                         (1, 1001, 256, torch.bfloat16)])  # one row, not 16 bytes: torch
@pytest.mark.parametrize("trans_b", [False, True], ids=["kn", "wt"])
def test_ragged_shapes(tuned, m, n, k, dtype, trans_b):
    """Edge tiles in every dimension; ``N = 12`` puts the up half 24 bytes into each row (the op copies
    the halves of a row-major weight there)."""
    x, w = _inputs(m, n, k, dtype, trans_b, seed=3)
    before = set(tuned.results)
    y = K.matmul_swiglu(x.view(1, m, k), w)
    if narrow_result(m, n, x.element_size()):  # one row whose bytes are not a multiple of 16: torch, no tuning
        assert set(tuned.results) == before
    else:
        _all_passed(tuned, before)
    _check(y, x.view(1, m, k), w)


def test_empty_and_batched(tuned):
    x, w = _inputs(6, 64, 128, torch.bfloat16, True, seed=5)
    assert K.matmul_swiglu(x[:0], w).shape == (0, 64)
    xb = x.view(2, 3, 128)
    _check(K.matmul_swiglu(xb, w), xb, w)


def test_baseline_without_tuning(monkeypatch):
    """The production op itself, tuning disabled: its baseline config."""
    monkeypatch.setenv("TILETUNE_DISABLE", "1")
    x, w = _inputs(128, FFN, HIDDEN, torch.bfloat16, True, seed=11)
    _check(K.matmul_swiglu(x, w), x, w)
