"""``tiletune.kernels._scratch``: placeholders are kept only where memory may outlive the call."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cuda.tile")

from tiletune import fastcall  # noqa: E402
from tiletune.kernels import _scratch  # noqa: E402


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(_scratch, "_placeholders", {})


def test_placeholders_are_cached_and_constant_where_keepable():
    cpu = torch.device("cpu")
    a = _scratch.placeholder(cpu, torch.bfloat16, (1,))
    assert a is _scratch.placeholder(cpu, torch.bfloat16, (1,))
    assert a.shape == (1,) and a.dtype == torch.bfloat16 and id(a) in fastcall._constants
    b = _scratch.placeholder(cpu, torch.bfloat16, (1, 1))
    c = _scratch.placeholder(cpu, torch.float32, (1,))
    assert len({id(a), id(b), id(c)}) == 3 and b.shape == (1, 1) and c.dtype == torch.float32


def test_placeholders_are_fresh_where_memory_belongs_to_a_graph(monkeypatch):
    monkeypatch.setattr(_scratch, "keepable", lambda device: False)
    cpu = torch.device("cpu")
    a = _scratch.placeholder(cpu, torch.float16, (1,))
    b = _scratch.placeholder(cpu, torch.float16, (1,))
    assert a is not b and _scratch._placeholders == {}
    assert id(a) not in fastcall._constants and id(b) not in fastcall._constants


def test_keepable_rule(monkeypatch):
    assert _scratch.keepable(torch.device("cpu"))
    cuda = torch.device("cuda", 0)
    state = {"stream": 0, "capturing": False}
    monkeypatch.setattr(_scratch, "current_raw_stream", lambda dev: state["stream"])
    monkeypatch.setattr(_scratch, "_default_raw_stream", lambda dev: 0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: state["capturing"])
    assert _scratch.keepable(cuda)
    state["stream"] = 12345  # a side stream: torch.cuda.graph's, or reduce-overhead's graph trees'
    assert not _scratch.keepable(cuda)
    state.update(stream=0, capturing=True)  # capture on the default stream
    assert not _scratch.keepable(cuda)
