"""End-to-end tuning on a real GPU (run on the GPU host with ``pytest -m gpu``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
ct = pytest.importorskip("cuda.tile")

import tiletune as tt
from tiletune.records import Status


@ct.kernel
def scale_inplace_kernel(X, T: ct.Constant[int]):
    i = ct.bid(0)
    x = ct.load(X, index=(i,), shape=(T,), padding_mode=ct.PaddingMode.ZERO)
    ct.store(X, (i,), x * 2.0)


@ct.kernel
def copy_kernel(X, Y, T: ct.Constant[int], SKIP_LAST: ct.Constant[int]):
    i = ct.bid(0)
    x = ct.load(X, index=(i,), shape=(T,), padding_mode=ct.PaddingMode.ZERO)
    if SKIP_LAST == 0:
        ct.store(Y, (i,), x)
    else:
        if i < ct.num_blocks(0) - 1:
            ct.store(Y, (i,), x)


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def test_matmul_tunes_end_to_end_and_persists(tmp_path):
    from tiletune.lab.examples.simple_matmul import MATMUL_SPACE, matmul_into

    db = tt.TuningDB(tmp_path / "t.db")
    op = tt.autotune(MATMUL_SPACE, reference=matmul_into.reference, writes=["c"], db=db, progress=False)(matmul_into.plan)
    a = torch.randn(1024, 768, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(768, 512, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(1024, 512, device="cuda", dtype=torch.bfloat16)
    op(a, b, c)
    torch.cuda.synchronize()
    assert op.tuning_count == 1
    (res,) = op.results.values()
    assert len(res.measurements) == 32
    assert len(res.successes) >= 24, res.summary()
    torch.testing.assert_close(c.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-1)
    # a second op over the same database (as a fresh process would be) does not tune
    op2 = tt.autotune(MATMUL_SPACE, reference=matmul_into.reference, writes=["c"], db=tt.TuningDB(tmp_path / "t.db"),
                      progress=False)(matmul_into.plan)
    c2 = torch.empty_like(c)
    op2(a, b, c2)
    assert op2.tuning_count == 0
    assert op2.config_for(a, b, c2) == op.config_for(a, b, c)
    torch.testing.assert_close(c2, c)


def test_fresh_process_reuses_database(tmp_path):
    script = textwrap.dedent(
        """
        import sys, torch
        from tiletune.lab.examples.rmsnorm import rms_norm_into
        x = torch.randn(4096, 1024, device="cuda", dtype=torch.float16)
        w = torch.randn(1024, device="cuda", dtype=torch.float16)
        y = torch.empty_like(x)
        rms_norm_into(x, w, y, 1e-6)
        torch.cuda.synchronize()
        print("TUNED", rms_norm_into.tuning_count, rms_norm_into.config_for(x, w, y, 1e-6))
        """
    )
    env = dict(os.environ, TILETUNE_DB=str(tmp_path / "t.db"))
    outs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    for o in outs:
        assert o.returncode == 0, o.stderr[-2000:]
    first = [line for line in outs[0].stdout.splitlines() if line.startswith("TUNED")][0]
    second = [line for line in outs[1].stdout.splitlines() if line.startswith("TUNED")][0]
    assert first.startswith("TUNED 1 ")
    assert second.startswith("TUNED 0 ")
    assert first.split(" ", 2)[2] == second.split(" ", 2)[2]


def test_rms_norm_op_is_correct():
    from tiletune.kernels import rms_norm

    for shape, dtype in [((3, 5, 1000), torch.bfloat16), ((1, 4096), torch.float16), ((777, 256), torch.float32)]:
        x = torch.randn(*shape, device="cuda", dtype=dtype)
        w = torch.randn(shape[-1], device="cuda", dtype=dtype)
        y = rms_norm(x, w, 1e-5)
        ref = (x.float() * (x.float().pow(2).mean(-1, keepdim=True) + 1e-5).rsqrt() * w.float()).to(dtype)
        torch.testing.assert_close(y, ref, rtol=2e-2, atol=2e-2)


def test_inplace_kernel_leaves_exactly_one_launch(tmp_path):
    space = tt.Space(T=[128, 256, 512], occupancy=[1, 2], baseline=dict(T=256, occupancy=1))

    @tt.autotune(space, reference=lambda x: x * 2, inplace=["x"], db=False, progress=False)
    def op(cfg, x):
        return tt.Launch(scale_inplace_kernel, (_cdiv(x.shape[0], cfg.T),), (x, cfg.T))

    x = torch.randn(100_000, device="cuda")
    orig = x.clone()
    op(x)
    torch.cuda.synchronize()
    (res,) = op.results.values()
    assert not res.failures, res.summary()
    assert torch.equal(x, orig * 2)
    op(x)
    torch.cuda.synchronize()
    assert torch.equal(x, orig * 4)


def test_unwritten_outputs_and_compile_errors_are_failures_not_crashes():
    space = tt.Space(T=[64, 96, 128, 256], SKIP=[0, 1], baseline=dict(T=128, SKIP=0))

    @tt.autotune(space, reference=lambda x, y: x.clone(), writes=["y"], db=False, progress=False)
    def op(cfg, x, y):
        return tt.Launch(copy_kernel, (_cdiv(x.shape[0], cfg.T),), (x, y, cfg.T, cfg.SKIP))

    x = torch.randn(10_000, device="cuda")
    y = torch.zeros_like(x)
    op(x, y)
    torch.cuda.synchronize()
    (res,) = op.results.values()
    by = {(m.config["T"], m.config["SKIP"]): m for m in res.measurements}
    assert by[(96, 0)].status is Status.COMPILE_ERROR  # not a power of two
    assert all(by[(t, 1)].status is Status.MISMATCH for t in (64, 128, 256))
    assert res.winner["SKIP"] == 0 and res.winner["T"] != 96
    assert torch.equal(y, x)


def test_all_failing_space_raises_with_reasons_and_restores_output():
    space = tt.Space(T=[128, 256], SKIP=[1], baseline=dict(T=128, SKIP=1))

    @tt.autotune(space, reference=lambda x, y: x.clone(), writes=["y"], db=False, progress=False)
    def op(cfg, x, y):
        return tt.Launch(copy_kernel, (_cdiv(x.shape[0], cfg.T),), (x, y, cfg.T, cfg.SKIP))

    x = torch.randn(1000, device="cuda")
    y = torch.full_like(x, 7.0)
    with pytest.raises(tt.AllCandidatesFailed, match="mismatch"):
        op(x, y)
    assert torch.equal(y, torch.full_like(x, 7.0))
