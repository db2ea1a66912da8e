"""The suite's own rules (tests/conftest.py): the ``slow`` group names tests that exist (a renamed test
leaves the group, loudly); a ``-m "not gpu"`` run skips the GPU files without importing them, which is
right only while every test in them is marked ``gpu``; CPU tests' workers fork from a zygote unless
marked ``spawned_workers``."""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

import pytest

from conftest import GPU_FILES, RUNNER_ZYGOTE, SLOW, selects_no_gpu_test

TESTS = Path(__file__).resolve().parent


def test_every_slow_entry_names_a_test_of_its_file():
    missing = []
    for name, prefixes in SLOW.items():
        path = TESTS / name
        text = path.read_text() if path.exists() else ""
        defined = re.findall(r"^def (test_\w+)", text, flags=re.M)
        missing += [f"{name}::{p}" for p in prefixes if not any(d.startswith(p) for d in defined)]
    assert not missing, f"slow entries that match no test: {missing}"


def _module_marks(path: Path) -> list[str]:
    """The ``pytest.mark.<name>`` names of a module's top-level ``pytestmark``."""
    tree = ast.parse(path.read_text(), str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return [n.attr for n in ast.walk(node.value) if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"]
    return []


@pytest.mark.parametrize("path", sorted(TESTS.glob(GPU_FILES)), ids=lambda p: p.name)
def test_every_gpu_file_marks_all_its_tests_gpu(path):
    assert "gpu" in _module_marks(path), f"{path.name}: a module-level pytestmark with pytest.mark.gpu"


def test_no_file_outside_the_gpu_files_marks_all_its_tests_gpu():
    wrong = [p.name for p in sorted(TESTS.glob("test_*.py")) if not p.match(GPU_FILES) and "gpu" in _module_marks(p)]
    assert not wrong, f"GPU test files are named {GPU_FILES}: {wrong}"


@pytest.mark.parametrize("expr,none", [
    ("not gpu", True), ("not gpu and not slow", True), ("(not gpu) and (slow or not slow)", True),
    ("not (gpu or served)", True), ("", False), ("gpu", False), ("not slow", False), ("not gpu or served", False),
    ("gpu and not served", False), ("not gpu or slow", False), ("not gpu and foo(x=1)", False), ("not gpu and", False),
])
def test_which_mark_expressions_select_no_gpu_test(expr, none):
    assert selects_no_gpu_test(expr) is none


@pytest.mark.skipif(RUNNER_ZYGOTE is not None, reason="the runner set TILETUNE_WORKER_ZYGOTE itself")
def test_cpu_tests_fork_their_workers_from_a_zygote():
    assert os.environ["TILETUNE_WORKER_ZYGOTE"] == "on"


@pytest.mark.spawned_workers
@pytest.mark.skipif(RUNNER_ZYGOTE is not None, reason="the runner set TILETUNE_WORKER_ZYGOTE itself")
def test_a_spawned_workers_test_starts_fresh_interpreters():
    assert os.environ["TILETUNE_WORKER_ZYGOTE"] == "off"
