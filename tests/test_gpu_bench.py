"""tiletune.devices.bench on a real GPU (run on the GPU host with ``pytest -m gpu``)."""

from __future__ import annotations

import pytest


torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

import tiletune as tt


def _copy(n: int):
    src = torch.empty(n, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    return dst, src


def test_bench_a_torch_op_and_results_are_sane():
    dst, src = _copy(1 << 20)
    r = tt.bench(torch.Tensor.copy_, dst, src)
    assert r.mode == "cold_l2" and r.n >= 10 and r.n == len(r.samples_us)
    assert 0 < r.min_us <= r.median_us and r.ci_low_us <= r.median_us <= r.ci_high_us
    assert r.median_us < 1000.0  # 4 MiB copied: microseconds, not milliseconds
    assert torch.equal(dst, src)
    assert "NVIDIA" in r.device or r.device


def test_bigger_copy_takes_longer():
    small = tt.bench(torch.Tensor.copy_, *_copy(1 << 20))  # 4 MiB
    big = tt.bench(torch.Tensor.copy_, *_copy(1 << 26))  # 256 MiB
    assert big.median_us > 8 * small.median_us


def test_graph_replay_path():
    dst, src = _copy(1 << 22)
    eager = tt.bench(torch.Tensor.copy_, dst, src)
    dst.zero_()
    graphed = tt.bench(torch.Tensor.copy_, dst, src, graph=True)
    assert graphed.graph and graphed.n >= 10
    assert torch.equal(dst, src)  # the replays did the copy
    assert 0.5 < graphed.median_us / eager.median_us < 2.0  # the same device work


def test_rotating_workspaces_on_the_gpu():
    n = 1 << 24  # 64 MiB per set: 4 sets (x2 tensors) are well over an H200's L2
    r = tt.bench(torch.Tensor.copy_, *_copy(n), workspaces=4)
    assert r.workspaces == 4 and r.mode == "workspaces" and r.n >= 10
    cold = tt.bench(torch.Tensor.copy_, *_copy(n))
    assert 0.5 < r.median_us / cold.median_us < 2.0  # rotation keeps the data out of L2 as the flush does


def test_nvml_readings_when_available():
    pytest.importorskip("pynvml")
    r = tt.bench(torch.Tensor.copy_, *_copy(1 << 22))
    assert r.readings and r.sm_clock_mhz and r.sm_clock_mhz > 100
    assert len(r.throttled) == r.n


#: how much wider ``do_bench``'s event pair may read than ours on the same device work, in us. On the
#: H200 (``benchmarks/results/h200/probe_timer.json.gz``, 2026-12-02) CUPTI timed the same kernel alike
#: under both harnesses (1024x4096x4096 GEMM: 44.54 and 44.22 us) while ``do_bench``'s events read it
#: 0.78 us above ours, and 16 MiB copies 0.1-0.9 us above (12.74-12.82 against 12.90-13.60 us): a
#: fixed gap that is 6% of a 13 us copy and 0.6% of a 130 us one.
DO_BENCH_EVENT_GAP_US = 1.0


@pytest.mark.parametrize("n", [1 << 22, 1 << 26])  # 16 MiB and 256 MiB copies
def test_bench_agrees_with_triton_do_bench(n):
    """The harness against a neutral timer: medians within 3%, or within do_bench's wider event pair
    (:data:`DO_BENCH_EVENT_GAP_US`) below it (both flush L2 between samples)."""
    testing = pytest.importorskip("triton.testing")
    dst, src = _copy(n)
    ours = tt.bench(torch.Tensor.copy_, dst, src).median_us
    theirs = testing.do_bench(lambda: dst.copy_(src), return_mode="median") * 1e3
    assert abs(ours / theirs - 1.0) <= 0.03 or 0.0 <= theirs - ours <= DO_BENCH_EVENT_GAP_US, (ours, theirs)
