"""Shared test settings.

GPU tests were written to exercise tuning: a library op meeting a new key tunes it there and then.
The library's ops answer a new key from their nearest tuned neighbour by default (``on_miss="nearest"``),
so every GPU test runs with ``TILETUNE_ON_MISS=tune`` unless it is marked ``served`` (a test of what a
first call is served, such as the model-warming and Hugging Face tests)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _gpu_tests_tune_every_key(request, monkeypatch):
    if request.node.get_closest_marker("gpu") is not None and request.node.get_closest_marker("served") is None:
        monkeypatch.setenv("TILETUNE_ON_MISS", "tune")
    yield
