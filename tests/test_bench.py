"""tiletune.devices.bench on a CPU: a simulated timing source stands in for the CUDA timer."""

from __future__ import annotations

import random

import pytest

import tiletune as tt
from tiletune.devices.bench import BenchResult, ClockReading, bench


class FakeTimer:
    """Runs each launch (so the harness's call order is observable) and returns a modelled time."""

    def __init__(self, mean_us: float = 10.0, noise: float = 0.0, seed: int = 0) -> None:
        self.mean_us = mean_us
        self.noise = noise
        self.rng = random.Random(seed)
        self.batches: list[int] = []
        self.spun = 0.0

    def time_each(self, launches):
        self.batches.append(len(launches))
        out = []
        for launch in launches:
            launch()
            out.append(self.mean_us * self.rng.lognormvariate(0.0, self.noise) if self.noise else self.mean_us)
        return out

    def spin(self, seconds=0.05):
        self.spun += seconds

    def close(self):
        pass


class FakeProbe:
    def __init__(self, readings):
        self.readings = list(readings)
        self.i = 0

    def read(self):
        r = self.readings[min(self.i, len(self.readings) - 1)]
        self.i += 1
        return r


def test_adaptive_stopping_stops_when_the_interval_is_tight():
    timer = FakeTimer(noise=0.002, seed=1)
    r = bench(lambda: None, timer=timer, warmup=2, batch=10)
    assert isinstance(r, BenchResult)
    assert r.stop == "converged" and r.n == 10  # 0.2% noise: the first 10 samples already give a <1% CI
    assert timer.batches[0] == 2 and sum(timer.batches[1:]) == r.n  # the warm-up is not sampled
    assert r.ci_low_us <= r.median_us <= r.ci_high_us and r.rel_ci <= 0.01
    assert r.min_us == min(r.samples_us) and r.flags == ()


def test_noisy_source_takes_more_samples_and_hits_the_cap():
    quiet = bench(lambda: None, timer=FakeTimer(noise=0.01, seed=2), warmup=0)
    noisy = bench(lambda: None, timer=FakeTimer(noise=0.5, seed=2), warmup=0,
                  stopping=tt.StoppingRule(rel_ci=0.01, min_samples=10, max_samples=60, max_seconds=10.0,
                                           abs_ci_us=0.0))
    assert quiet.n < noisy.n
    assert noisy.n == 60 and noisy.stop == "max_samples" and "not_converged" in noisy.flags


def test_fixed_sample_count():
    timer = FakeTimer(noise=0.3, seed=3)
    r = bench(lambda: None, timer=timer, warmup=0, samples=25, batch=10)
    assert r.n == 25 and timer.batches == [10, 10, 5]
    assert "not_converged" not in r.flags


def test_workspaces_are_cycled_in_order():
    seen = []
    r = bench(lambda ws: seen.append(ws), timer=FakeTimer(), warmup=0, samples=7, batch=3,
              workspaces=3, make_workspace=lambda i: (i,))
    assert seen == [0, 1, 2, 0, 1, 2, 0]
    assert r.workspaces == 3 and r.mode == "workspaces"  # rotating sets: no flush by default


def test_warmup_cycles_the_workspaces_too():
    seen = []
    bench(lambda ws: seen.append(ws), timer=FakeTimer(), warmup=4, samples=2, workspaces=3,
          make_workspace=lambda i: (i,))
    assert seen == [0, 1, 2, 0, 0, 1]  # 4 warm-up calls, then sampling starts again at set 0


def test_workspaces_clone_tensor_arguments():
    torch = pytest.importorskip("torch")
    x = torch.arange(4.0)
    used = []
    r = bench(lambda t, k: used.append((t, k)), x, 5, timer=FakeTimer(), warmup=0, samples=4, workspaces=2)
    assert r.workspaces == 2 and r.mode == "workspaces"
    assert used[0][0] is x and used[1][0] is not x and torch.equal(used[1][0], x)
    assert used[2][0] is x and used[3][0] is used[1][0]
    assert all(k == 5 for _, k in used)  # non-tensor arguments are shared


def test_flush_default_and_override():
    assert bench(lambda: None, timer=FakeTimer(), warmup=0, samples=3).mode == "cold_l2"
    assert bench(lambda: None, timer=FakeTimer(), warmup=0, samples=3, flush_l2=False).mode == "warm"
    r = bench(lambda i: None, timer=FakeTimer(), warmup=0, samples=3, workspaces=2, make_workspace=lambda i: (i,),
              flush_l2=True)
    assert r.mode == "cold_l2"


def test_throttled_batches_are_flagged():
    ok = ClockReading(1980.0, 500.0)
    hot = ClockReading(1500.0, 700.0, ("sw_power_cap",))
    r = bench(lambda: None, timer=FakeTimer(), warmup=0, samples=30, batch=10, probe=FakeProbe([ok, hot, ok]))
    assert r.throttled == (False,) * 10 + (True,) * 10 + (False,) * 10
    assert "throttled" in r.flags and "clock_changed" in r.flags
    assert r.sm_clock_mhz == 1980.0 and r.power_w == 500.0
    d = r.as_dict()
    assert d["readings"][1] == {"sm_mhz": 1500.0, "power_w": 700.0, "reasons": ["sw_power_cap"]}
    steady = bench(lambda: None, timer=FakeTimer(), warmup=0, samples=20, probe=FakeProbe([ok]))
    assert steady.flags == () and not any(steady.throttled)


def test_str_and_dict():
    r = bench(lambda: None, timer=FakeTimer(noise=0.001), warmup=0)
    assert str(r).startswith("median 10.00 us [") and "converged" in str(r)
    d = r.as_dict()
    assert d["n"] == r.n and d["samples_us"] == list(r.samples_us) and d["sm_clock_mhz"] is None


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(workspaces=0), ValueError, "workspaces must be an int >= 1"),
    (dict(workspaces=True), ValueError, "workspaces must be an int >= 1"),
    (dict(workspaces=2), ValueError, "none of the arguments is a torch tensor"),
    (dict(make_workspace=lambda i: (i,)), ValueError, "make_workspace= needs workspaces=N"),
    (dict(workspaces=2, make_workspace=lambda i: i), TypeError, r"make_workspace\(0\) must return a tuple"),
    (dict(workspaces=2, make_workspace=3), TypeError, "make_workspace must be callable"),
    (dict(warmup=-1), ValueError, "warmup must be an int >= 0"),
    (dict(batch=0), ValueError, "batch must be an int >= 1"),
    (dict(samples=0), ValueError, "samples must be an int >= 1"),
    (dict(samples=5, stopping=tt.StoppingRule()), ValueError, "not both"),
    (dict(stopping={"rel_ci": 0.01}), TypeError, "stopping must be a tiletune.StoppingRule"),
    (dict(backlog_us=-1.0), ValueError, "backlog_us must be a finite number >= 0"),
    (dict(confidence=1.5), ValueError, "confidence must be a float in"),
    (dict(graph=True), ValueError, "graph=True captures CUDA graphs"),
])
def test_bad_arguments_give_clear_errors(kwargs, error, match):
    args = () if "make_workspace" in kwargs else (1,)
    with pytest.raises(error, match=match):
        bench(lambda *a: None, *args, timer=FakeTimer(), **kwargs)


def test_not_callable_and_make_workspace_with_args():
    with pytest.raises(TypeError, match="fn must be callable"):
        bench(3, timer=FakeTimer())
    with pytest.raises(ValueError, match="not both"):
        bench(lambda *a: None, 1, workspaces=2, make_workspace=lambda i: (i,), timer=FakeTimer())


def test_no_cuda_without_a_timer():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(tt.NoBackendError, match="needs a CUDA device"):
        bench(lambda: None)


def test_exported():
    assert tt.bench is bench and tt.BenchResult is BenchResult


class FakeCuda:
    """Stands in for ``torch.cuda``'s streams and graphs, logging what the capture helpers do."""

    def __init__(self) -> None:
        self.log: list[str] = []
        self.current = "main"
        fake = self

        class Stream:
            def __init__(self) -> None:
                self.name = "side"

            def wait_stream(self, other) -> None:
                fake.log.append(f"{self.name} waits {other.name}")

        class Main(Stream):
            def __init__(self) -> None:
                self.name = "main"

        class CUDAGraph:
            def replay(self) -> None:
                fake.log.append("replay")

        self.Stream, self.CUDAGraph, self._main = Stream, CUDAGraph, Main()

        import contextlib

        @contextlib.contextmanager
        def stream(s):
            before, fake.current = fake.current, s.name
            yield
            fake.current = before

        @contextlib.contextmanager
        def graph(g):
            before, fake.current = fake.current, "capture"
            yield
            fake.current = before

        self.stream, self.graph = stream, graph

    def current_stream(self):
        return self._main

    def synchronize(self) -> None:
        self.log.append("synchronize")


def test_capture_graph_warms_on_a_side_stream_then_captures_one_call(monkeypatch):
    torch = pytest.importorskip("torch")
    from tiletune.devices.bench import _capture, capture_graph, warm_on_side_stream

    fake = FakeCuda()
    for name in ("Stream", "CUDAGraph", "stream", "graph", "current_stream", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))

    def call():
        fake.log.append(f"call on {fake.current}")
        return len(fake.log)

    graph, out = capture_graph(call)
    assert fake.log == ["side waits main", "call on side", "main waits side", "call on capture"]
    assert out == 4 and isinstance(graph, fake.CUDAGraph)  # the captured call's output
    fake.log.clear()
    warm_on_side_stream(call, times=3)
    assert fake.log == ["side waits main"] + ["call on side"] * 3 + ["main waits side"]
    fake.log.clear()
    replay = _capture(call)  # bench(graph=True): the same capture, synchronized, then replayed
    assert fake.log == ["side waits main", "call on side", "main waits side", "call on capture", "synchronize"]
    replay()
    assert fake.log[-1] == "replay"
