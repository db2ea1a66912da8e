"""GPU: every candidate's first launch is answered by the cubin compiled ahead (no second compile),
for launches signed with calling convention v1 and with v2 (an argument with a size-1 dimension).

Run on the GPU host: ``python -m pytest -m gpu -q tests/test_gpu_compile_pool.py`` (8 small kernels to
compile, well under a minute on a cold cuTile cache).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
ct = pytest.importorskip("cuda.tile")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

import tiletune as tt  # noqa: E402


@ct.kernel
def double_columns_kernel(X, Y, T: ct.Constant[int], C: ct.Constant[int]):
    i = ct.bid(0)
    x = ct.load(X, index=(i, 0), shape=(T, C), padding_mode=ct.PaddingMode.ZERO)
    ct.store(Y, (i, 0), x * 2.0)


SPACE = tt.Space(T=[32, 64], occupancy=[1, 2], num_worker_warps=[4, 8], baseline=dict(T=32, occupancy=1,
                                                                                     num_worker_warps=4))


def _plan(cfg, x, y):
    return tt.Launch(double_columns_kernel, (-(-x.shape[0] // cfg.T),), (x, y, cfg.T, x.shape[1]))


@pytest.mark.parametrize("cols", [1, 2], ids=["size-1 dim (v2)", "no size-1 dim (v1)"])
@pytest.mark.parametrize("isolation", ["none", "process"])
def test_every_first_launch_is_a_prefetch_hit(cols, isolation):
    op = tt.autotune(SPACE, reference=lambda x, y: x * 2, writes=["y"], db=False, progress=False,
                     isolation=isolation, name=f"test.prefetch_{cols}_{isolation}")(_plan)
    x = torch.randn(1000, cols, device="cuda")
    y = torch.empty_like(x)
    op(x, y)
    torch.cuda.synchronize()
    (res,) = op.results.values()
    assert len(res.successes) == len(SPACE.configs("sm_90")), res.summary()
    assert res.stats.get("prefetch_misses") == 0, res.stats
    assert res.stats.get("prefetch_hits") == len(res.measurements), res.stats
    torch.testing.assert_close(y, x * 2)
