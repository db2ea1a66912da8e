"""The race of a new shape times kernels, not the host (run on the GPU host with ``pytest -m gpu``).

2026-12-08 (H100): race samples of small memory-bound kernels read 2-5x their ``do_bench`` time, and the batch's
first candidate the most: each sample's events enclosed cuTile's Python launch. The race now holds each batch
behind a spin kernel (``ColdL2Timer.time_each(..., hold=True)``), and so does a tuning session; this test compares
both sessions' samples with ``triton.testing.do_bench`` (cold L2 as well) config by config."""

from __future__ import annotations

import statistics

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
pytest.importorskip("cuda.tile")


def test_race_samples_of_a_small_kernel_track_do_bench_for_every_candidate():
    triton_testing = pytest.importorskip("triton.testing")
    import tiletune.kernels as K
    from tiletune.devices.backends.base import Candidate
    from tiletune.op.tuned_op import first_launch
    from tiletune.records import Status

    x = torch.randn(21, 4096, device="cuda", dtype=torch.bfloat16)  # a 6 us kernel: the host outlasts it
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    hit = first_launch(K.rms_norm, x, w)
    assert hit is not None
    op, args = hit.op, hit.args
    arch = op.backend.device_info(0).arch
    cfgs = op.space.candidates(arch)[:6]
    tol = op.tolerance(*args) if callable(op.tolerance) else op.tolerance
    session = op.backend.open_session(op.plan, args, device_index=0, writes=op.writes, inplace=op.inplace,
                                      reference=op.reference, tolerance=tol, name=op.name)
    try:
        cands = [Candidate(cfg, i, is_baseline=(i == 0)) for i, cfg in enumerate(cfgs)]
        ready = [o.candidate for o in session.compile(cands) if o.status is Status.OK]
        assert len(ready) >= 2
        samples = session.race_samples(ready, 5)
        assert samples is not None
        # (host enqueue us, spin us) of the last held batch, and how many batches were taken again
        hold = (session.timer.last_hold, session.stats.get("race_hold_retakes", 0))
        tuning = {c.order: statistics.median(session.sample(c, 10)) for c in ready}  # a tuning session's samples
    finally:
        session.finish(None)
    ratios, tuned = {}, {}
    for c in ready:
        parts, grid, kargs = op.launch_parts(c.config, args)
        launch, stream, kernel, dev = parts
        bench = triton_testing.do_bench(lambda: launch(stream(dev), grid, kernel, kargs), warmup=5, rep=20) * 1000.0
        ratios[c.order] = statistics.median(samples[c.order]) / bench
        tuned[c.order] = tuning[c.order] / bench
    # the race's median of each config within a third of do_bench's (it was 2-5x before the hold), and the
    # batch's first candidate no further off than the others
    assert all(0.67 <= r <= 1.5 for r in ratios.values()), (ratios, hold)
    first = ratios[ready[0].order]
    assert first <= 1.25 * max(r for o, r in ratios.items() if o != ready[0].order), (ratios, hold)
    assert hold[0] is not None and session.timer.hold_covered, hold  # the last batch was enqueued within its spin
    # a tuning session's held samples track do_bench as well (its picks are the ones a table keeps)
    assert all(0.67 <= r <= 1.5 for r in tuned.values()), (tuned, hold)
