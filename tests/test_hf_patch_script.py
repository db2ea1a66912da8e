"""CPU tests of ``benchmarks/hf_patch.py``'s Dynamo counts (graphs, graph breaks, recompiles per compiled column)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import hf_patch  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_counts_graphs_breaks_and_recompiles(monkeypatch):
    monkeypatch.setattr(hf_patch, "bench_ms", lambda fn: [fn() for _ in range(3)] and 1.5)

    def body(x, n):
        x = x + n
        torch._dynamo.graph_break()
        return x * 2

    f = torch.compile(body, backend="eager")
    x = torch.ones(3)
    ms, counts = hf_patch.timed_compiled(lambda: f(x, 1))
    assert ms == 1.5
    assert counts["graphs"] == 2 and counts["graph_breaks"] == 1 and counts["recompiles"] == 0
    assert list(counts["reasons"].values()) == [1] and all(counts["reasons"])

    torch._dynamo.reset()
    calls = iter(range(2, 100))  # a Python int that changes: the second call fails the guard of the first
    _, counts = hf_patch.timed_compiled(lambda: f(x, next(calls)))
    assert counts["recompiles"] >= 1 and counts["graphs"] > 2


def test_one_clean_graph_counts_nothing(monkeypatch):
    monkeypatch.setattr(hf_patch, "bench_ms", lambda fn: [fn() for _ in range(3)] and 0.5)
    f = torch.compile(lambda x: torch.relu(x) + 1, backend="eager")
    x = torch.ones(4)
    _, counts = hf_patch.timed_compiled(lambda: f(x))
    assert counts == {"graphs": 1, "graph_breaks": 0, "reasons": {}, "recompiles": 0}


def test_phases_pick_and_order_the_rows():
    shapes = [("prefill", 1, 1024), ("decode", 8, 1024), ("prefill", 4, 2048), ("decode", 32, 2048)]
    assert hf_patch.select_shapes(shapes, ["decode", "prefill"]) == [
        ("decode", 8, 1024), ("decode", 32, 2048), ("prefill", 1, 1024), ("prefill", 4, 2048)]
    assert hf_patch.select_shapes(shapes[:2], ["decode"]) == [("decode", 8, 1024)]


def test_generate_rows_grow_the_cache_and_crop_it_back(monkeypatch):
    """A ``generate`` row times GENERATE_STEPS steps that each grow the cache by one position (after 4 of
    warm-up), in ms per token, and leaves the cache at the row's length; it is picked only when asked."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)

    class Cache:
        def __init__(self, n):
            self.n = n

        def get_seq_length(self):
            return self.n

        def crop(self, k):
            assert k < 0  # transformers 5.2x refuses a positive length
            self.n += k

    calls = []

    def model(input_ids, use_cache, cache):
        calls.append(cache.get_seq_length())
        cache.n += 1

    r = object.__new__(hf_patch.Row)
    r.phase, r.seq, r.kw, r.ids, r.cache = "generate", 100, "cache", None, Cache(100)
    ms = r.bench(model)
    assert ms >= 0 and r.cache.get_seq_length() == 100
    assert calls == list(range(100, 104)) + list(range(100, 100 + hf_patch.GENERATE_STEPS))
    default = hf_patch.select_shapes(hf_patch.SHAPES, ["prefill", "decode"])
    assert len(default) == 4 and all(s[0] != "generate" for s in default)
    assert [s[0] for s in hf_patch.select_shapes(hf_patch.QUICK, ["generate"])] == ["generate"]
