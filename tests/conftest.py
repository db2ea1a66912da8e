"""Shared test settings.

GPU tests were written to exercise tuning: a library op meeting a new key tunes it there and then.
The library's ops answer a new key from their nearest tuned neighbour by default (``on_miss="nearest"``),
and the shipped tables answer their keys, so every GPU test runs with ``TILETUNE_ON_MISS=tune`` and
``TILETUNE_TABLES=0`` unless it is marked ``served`` (a test of what a first call is served, such as the
model-warming and Hugging Face tests)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _gpu_tests_tune_every_key(request, monkeypatch):
    """GPU tests not marked ``served`` tune every key they meet: ``on_miss="tune"``, and no shipped table answers
    a key (the H200 table holds the 4096 x 4096 norms and the 4096-row SwiGLU: a test that asserts every
    candidate of its tuning passed would find no tuning)."""
    if request.node.get_closest_marker("gpu") is not None and request.node.get_closest_marker("served") is None:
        monkeypatch.setenv("TILETUNE_ON_MISS", "tune")
        monkeypatch.setenv("TILETUNE_TABLES", "0")
    yield


#: ``TILETUNE_WORKER_ZYGOTE`` as the runner of the suite set it (None: unset, the tests choose)
RUNNER_ZYGOTE = os.environ.get("TILETUNE_WORKER_ZYGOTE")


@pytest.fixture(autouse=True)
def _cpu_workers_fork_from_a_zygote(request, monkeypatch):
    """CPU tests' tuning workers fork from a zygote (``TILETUNE_WORKER_ZYGOTE=on``), as on a GPU host, rather
    than each importing torch in a fresh interpreter (about 2 CPU-seconds a worker on a 2-core machine, and
    the suite starts about a hundred). A test of a fresh interpreter's start (the default where no GPU is
    visible) is marked ``spawned_workers``; tests that set the variable themselves keep their value."""
    if request.node.get_closest_marker("gpu") is None and RUNNER_ZYGOTE is None:
        monkeypatch.setenv("TILETUNE_WORKER_ZYGOTE",
                           "off" if request.node.get_closest_marker("spawned_workers") is not None else "on")
    yield


#: Tests of several seconds each on a 2-core machine (worker and zygote processes started and killed, a Ray
#: cluster, real TileIR compiles, Inductor code generation), by file and name prefix. They are marked
#: ``slow``: ``-m "not gpu and not slow"`` is the quick loop while editing (about half the suite's time);
#: CI and the README's test command run everything.
SLOW = {
    "test_campaign_ray.py": ("test_a_campaign_on_ray_actors",),
    "test_campaign.py": ("test_a_sigkilled_campaign", "test_a_worker_that_dies", "test_a_campaign_on_two_workers"),
    "test_workers.py": ("test_only_verified_configs", "test_every_fault_is_a_failed", "test_a_compiler_that_crashes",
                        "test_a_slow_first_launch", "test_all_failing_raises", "test_plan_the_worker_cannot_import"),
    "test_worker_lifecycle.py": ("test_a_slow_first_launch_in_a_new_worker", "test_two_faults_in_quick_succession",
                                 "test_after_a_crash_the_warm_spare", "test_keep_spares_starts_them",
                                 "test_a_session_starts_its_spares", "test_exit_after_isolated_tuning",
                                 "test_the_dead_worker_is_reaped", "test_a_hang_costs_about"),
    "test_tuning.py": ("test_concurrent_processes_tune_a_key_once", "test_sigkill_mid_tune"),
    "test_distributed.py": ("test_ranks_use_one_pick_per_key",),
    "test_zygote.py": ("test_a_changed_import_time_environment", "test_a_dead_zygote_never_blocks",
                       "test_an_import_that_starts_a_thread"),
    "test_zygote_fork.py": ("test_a_plan_a_forked_worker_cannot_load", "test_a_compiler_warm_up_that_makes",
                            "test_a_caller_that_cannot_be_forked"),
    "test_torch_import_race.py": ("test_first_call_with_prestart_in_the_background",),
    "test_frontend_cache.py": ("test_on_the_launch_path_the_cubin", "test_a_fresh_process_never_imports"),
    "test_bench_scripts_tuning.py": ("test_frontend_cache_benchmark",),
    "test_bench_scripts_new.py": ("test_compile_tax_cpu",),
    "test_hf_compile.py": ("test_patched_decode_compiles_into_one_graph",),
    "test_gemm_splitk.py": ("test_splitk_configs_compile_for_sm90",),
    "test_decode_attention.py": ("test_every_row_shape_compiles_for_sm90", "test_direct_kernel_extreme_configs_compile",
                                 "test_direct_kernel_compiles_for_sm90"),
    "test_recorded_spaces.py": ("test_baseline_compiles_for_sm90",),
    "test_lazy_spaces.py": ("test_a_billion_configs_in_under_500_mb",),
    "test_kernels_background_import.py": ("test_a_fork_waits_for_the_background_import",
                                           "test_a_fork_waits_for_one_module"),
}


@pytest.fixture
def private_tables(tmp_path, monkeypatch):
    """Tuning tables read from ``tmp_path`` only: the user's folder beside the database (via
    ``TILETUNE_CACHE_DIR``, with compile caches of its own) and an empty shipped folder, ``tmp_path/shipped``
    (yielded); re-read at the next lookup, and again after the test."""
    from tiletune.resolve import tables

    monkeypatch.setenv("TILETUNE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TILETUNE_TABLES", raising=False)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setattr(tables, "SHIPPED", shipped)
    tables.forget()
    yield shipped
    tables.forget()


#: Files whose every test is marked ``gpu`` (a module-level ``pytestmark``; tests/test_suite_layout.py keeps
#: it true). A run whose ``-m`` expression selects no ``gpu`` test does not import them: collecting them
#: costs each pytest-xdist worker seconds (transformers, assertion rewriting) for tests it would deselect.
GPU_FILES = "test_gpu_*.py"


def selects_no_gpu_test(markexpr: str) -> bool:
    """Whether the ``-m`` expression is false for every test marked ``gpu``, whatever its other marks: every
    combination of the other names in it is tried. An expression this cannot read selects some."""
    import itertools
    import keyword
    import re

    expr = (markexpr or "").strip()
    if not expr or re.search(r"[^\w\s()]", expr):
        return False
    names = sorted({w for w in re.findall(r"[A-Za-z_]\w*", expr) if not keyword.iskeyword(w)} - {"gpu"})
    if len(names) > 8:
        return False
    try:
        code = compile(expr, "<markexpr>", "eval")
        for values in itertools.product((False, True), repeat=len(names)):
            if eval(code, {"__builtins__": {}}, dict(zip(names, values), gpu=True)):  # noqa: S307 - names only
                return False
    except Exception:  # noqa: BLE001 - not a plain boolean expression of names: collect as usual
        return False
    return True


def pytest_ignore_collect(collection_path, config):
    if collection_path.match(GPU_FILES) and selects_no_gpu_test(config.getoption("markexpr", "")):
        return True
    return None


def pytest_collection_modifyitems(config, items):
    for item in items:
        prefixes = SLOW.get(item.path.name)
        if prefixes and item.name.startswith(prefixes):
            item.add_marker(pytest.mark.slow)
