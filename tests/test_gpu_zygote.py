"""The zygote on a GPU machine: it starts on ``import tiletune``, imports torch and cuda.tile without
touching the GPU (so it may fork), and the workers it forks create their CUDA context and serve a
tuning session."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_the_zygote_imports_without_touching_the_gpu_and_forks_a_worker():
    from tiletune.devices.workers import WorkerProcess
    from tiletune.devices.workers import zygote as zmod

    z = zmod.zygote()
    assert z is not None, "import tiletune starts a zygote where a GPU is visible"
    t0 = time.monotonic()
    while not z.ready and not z.dead and time.monotonic() - t0 < 120:
        time.sleep(0.05)
    assert z.ready and not z.hazard, (z.hazard, z.hazard_module, z.info)
    assert {"torch", "cuda.tile", "tiletune.devices.backends.cutile"} <= set(z.info["modules"]), z.info
    w = WorkerProcess("cutile", torch.cuda.current_device())
    try:
        w.start()
        assert w.forked, "the worker came from the zygote"
        assert w.start_s[-1] < 5.0, w.start_s  # its CUDA context and hello; no imports
        assert w.request({"op": "ping"}, 10).ok
    finally:
        w.close(final=True)


def test_a_session_runs_in_a_forked_worker():
    import tiletune as tt
    from tiletune.lab.examples.rmsnorm_kernels import RMSNORM_BASELINE, next_power_of_2, rmsnorm_kernel

    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    y = torch.empty_like(x)

    def ref(x, w, y, eps):
        xf = x.float()
        return (xf * (xf.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * w.float()).to(y.dtype)

    @tt.autotune(tt.Space(occupancy=[1, 2, 4], baseline=RMSNORM_BASELINE), reference=ref, writes=["y"], db=False,
                 progress=False, name="zygote_rmsnorm")
    def op(cfg, x, w, y, eps):
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count
        return tt.Launch(rmsnorm_kernel, (max(1, min(x.shape[0], sms * cfg.occupancy)),),
                         (x, w, y, eps, next_power_of_2(x.shape[1])))

    op(x, w, y, 1e-6)
    (res,) = op.results.values()
    assert res.stats["isolation"] == "process" and res.stats["worker_forked"] is True, res.stats
    torch.testing.assert_close(y.float(), ref(x, w, y, 1e-6).float(), atol=2e-2, rtol=2e-2)
