"""The ``slow`` group of tests/conftest.py names tests that exist: a renamed test leaves the group, loudly."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import SLOW

TESTS = Path(__file__).resolve().parent


def test_every_slow_entry_names_a_test_of_its_file():
    missing = []
    for name, prefixes in SLOW.items():
        path = TESTS / name
        text = path.read_text() if path.exists() else ""
        defined = re.findall(r"^def (test_\w+)", text, flags=re.M)
        missing += [f"{name}::{p}" for p in prefixes if not any(d.startswith(p) for d in defined)]
    assert not missing, f"slow entries that match no test: {missing}"
