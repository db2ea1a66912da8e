"""``tiletune.devices.frontend_cache``: a fresh process finds a kernel's cubin without cuTile's front end, and
any change to what the kernel's code reads retires the entry.

The compiles are real (cuTile's front end and ``tileiras`` for sm_90 run without a GPU); the
signatures are written by hand, as cuTile's launcher would make them for two float32 vectors and a
constant.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ct = pytest.importorskip("cuda.tile")
pytest.importorskip("cutile_cache")

from tiletune.devices import frontend_cache  # noqa: E402
from tiletune.devices.prefetch_kernel import PrefetchKernel  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"

KERNEL_MODULE = """
import cuda.tile as ct
from {helpers} import helper

SCALE = {scale}

@ct.kernel
def scale_kernel(X, Y, T: ct.Constant[int]):
    i = ct.bid(0)
    ct.store(Y, (i,), helper(ct.load(X, index=(i,), shape=(T,))) * SCALE)
"""
HELPER_MODULE = """
import cuda.tile as ct

@ct.function
def helper(t):
    return t + {offset}
"""


def _signature(tile: int = 256):
    from cuda.tile.compilation import ArrayConstraint, CallingConvention, ConstantConstraint, KernelSignature

    arr = dict(index_dtype=ct.int32, stride_lower_bound_incl=0, alias_groups=(), may_alias_internally=False)
    return KernelSignature([ArrayConstraint(ct.float32, 1, **arr), ArrayConstraint(ct.float32, 1, **arr),
                            ConstantConstraint(tile)], CallingConvention.cutile_python_v1())


def _context(cache_dir: Path):
    from types import SimpleNamespace

    from cuda.tile._cext import default_tile_context

    cfg = default_tile_context.config
    return SimpleNamespace(config=SimpleNamespace(**{**vars(cfg), "cache_dir": str(cache_dir)}))


_counter = [0]


def _write_modules(folder: Path, scale: int = 2, offset: int = 1) -> str:
    """Write a kernel module and its helper module under fresh names; returns the kernel module's name."""
    _counter[0] += 1
    n = _counter[0]
    (folder / f"fc_helpers_{n}.py").write_text(HELPER_MODULE.format(offset=offset))
    (folder / f"fc_kernel_{n}.py").write_text(KERNEL_MODULE.format(helpers=f"fc_helpers_{n}", scale=scale))
    return f"fc_kernel_{n}"


@pytest.fixture
def modules(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TILETUNE_FRONTEND_CACHE", raising=False)
    for v in ("CUDA_TILE_LOGS", "CUDA_TILE_DUMP_TILEIR", "CUDA_TILE_DUMP_BYTECODE"):
        monkeypatch.delenv(v, raising=False)
    return tmp_path


def _kernel(name: str, **hints):
    mod = importlib.import_module(name)
    return PrefetchKernel.with_hints(mod.scale_kernel, hints)


def test_a_second_kernel_object_gets_the_cubin_without_compiling(modules, monkeypatch):
    name = _write_modules(modules)
    ctx = _context(modules / "cache")
    first = _kernel(name, occupancy=2)
    cubin, symbol, extra, providers = first._compile(_signature(), ctx, (9, 0))
    assert first.frontend_hits == 0 and cubin[:4] == b"\x7fELF"
    entries = sorted(p.suffix for p in (modules / "cache" / "tiletune-frontend").iterdir())
    assert entries == [".cubin", ".json"]

    second = _kernel(name, occupancy=2)
    import cuda.tile._execution as execution

    def no_front_end(*a, **k):
        raise AssertionError("cuTile's front end ran although the cache holds the cubin")

    monkeypatch.setattr(execution.kernel, "_compile", no_front_end)
    got = second._compile(_signature(), ctx, (9, 0))
    assert second.frontend_hits == 1
    assert got == (cubin, symbol, None, ())


def test_other_hints_signature_or_arch_are_other_entries(modules):
    name = _write_modules(modules)
    ctx = _context(modules / "cache")
    _kernel(name, occupancy=2)._compile(_signature(256), ctx, (9, 0))
    for kernel, sig, cc in ((_kernel(name, occupancy=1), _signature(256), (9, 0)),
                            (_kernel(name, occupancy=2), _signature(512), (9, 0)),
                            (_kernel(name, occupancy=2), _signature(256), (10, 0))):
        assert frontend_cache.lookup(kernel, sig, ctx, f"sm_{cc[0]}{cc[1]}") is None


@pytest.mark.parametrize("change", ["constant", "helper"])
def test_a_changed_constant_or_helper_module_retires_the_entry(modules, change):
    ctx = _context(modules / "cache")
    before = _write_modules(modules)
    k = _kernel(before, occupancy=2)
    k._compile(_signature(), ctx, (9, 0))
    assert frontend_cache.lookup(_kernel(before, occupancy=2), _signature(), ctx, "sm_90") is not None
    after = _write_modules(modules, scale=3) if change == "constant" else _write_modules(modules, offset=5)
    # the same kernel text under a module whose constant (or whose helper module) differs
    assert frontend_cache.lookup(_kernel(after, occupancy=2), _signature(), ctx, "sm_90") is None


def test_fingerprint_follows_files_closures_and_refuses_opaque_globals(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "fp_a.py").write_text("K = 1\ndef f(x):\n    return x * K\n")
    import fp_a

    fa = frontend_cache.code_fingerprint(fp_a.f)
    assert fa is not None and fa == frontend_cache.code_fingerprint(fp_a.f)
    (tmp_path / "fp_a.py").write_text("K = 1\ndef f(x):\n    return x * K  # edited\n")
    os.utime(tmp_path / "fp_a.py", ns=(1, 1))
    sys.modules.pop("fp_a")
    import fp_a as fp_a2

    assert frontend_cache.code_fingerprint(fp_a2.f) not in (None, fa)  # the file changed

    def closure(k):
        def g(x):
            return x * k
        return g

    assert frontend_cache.code_fingerprint(closure(2)) != frontend_cache.code_fingerprint(closure(3))

    class Thing:
        pass

    thing = Thing()

    def reads_object(x):
        return x * thing

    assert frontend_cache.code_fingerprint(reads_object) is None


def test_damaged_entries_and_switches_fall_back_to_compiling(modules, monkeypatch):
    name = _write_modules(modules)
    ctx = _context(modules / "cache")
    _kernel(name, occupancy=2)._compile(_signature(), ctx, (9, 0))
    kernel = _kernel(name, occupancy=2)
    assert frontend_cache.lookup(kernel, _signature(), ctx, "sm_90") is not None
    monkeypatch.setenv("TILETUNE_FRONTEND_CACHE", "0")
    assert frontend_cache.lookup(kernel, _signature(), ctx, "sm_90") is None
    monkeypatch.delenv("TILETUNE_FRONTEND_CACHE")
    monkeypatch.setenv("CUDA_TILE_LOGS", "TILEIR")  # the user asked for the compile's logs
    assert frontend_cache.lookup(kernel, _signature(), ctx, "sm_90") is None
    monkeypatch.delenv("CUDA_TILE_LOGS")
    off = _context(modules / "cache")
    off.config.cache_dir = None  # cuTile's disk cache off: this one too
    assert frontend_cache.lookup(kernel, _signature(), off, "sm_90") is None
    (cubin,) = (modules / "cache" / "tiletune-frontend").glob("*.cubin")
    cubin.write_bytes(cubin.read_bytes()[:-7])  # truncated
    assert frontend_cache.lookup(kernel, _signature(), ctx, "sm_90") is None
    got = kernel._compile(_signature(), ctx, (9, 0))  # compiles again and repairs the entry
    assert kernel.frontend_hits == 0 and got[0][:4] == b"\x7fELF"
    assert frontend_cache.lookup(kernel, _signature(), ctx, "sm_90")[0] == got[0]


def test_eviction_drops_the_least_recently_used_by_count_and_size(tmp_path):
    for i in range(6):
        (tmp_path / f"{i}.cubin").write_bytes(b"x" * 100)
        (tmp_path / f"{i}.json").write_text("{}")
        os.utime(tmp_path / f"{i}.json", ns=(i * 10**9, i * 10**9))
    (tmp_path / "versions.json").write_text("{}")  # not an entry: never evicted
    assert frontend_cache._evict(tmp_path, keep=4) == 2
    assert sorted(p.stem for p in tmp_path.glob("*.cubin")) == ["2", "3", "4", "5"]
    assert frontend_cache._evict(tmp_path, keep=10, max_bytes=250) == 2  # 400 bytes -> 200
    assert sorted(p.name for p in tmp_path.iterdir()) == ["4.cubin", "4.json", "5.cubin", "5.json", "versions.json"]


def test_a_hit_marks_the_entry_used(modules):
    name = _write_modules(modules)
    ctx = _context(modules / "cache")
    _kernel(name, occupancy=2)._compile(_signature(), ctx, (9, 0))
    (rec,) = (modules / "cache" / "tiletune-frontend").glob("*.json")
    os.utime(rec, ns=(10**9, 10**9))
    assert frontend_cache.lookup(_kernel(name, occupancy=2), _signature(), ctx, "sm_90") is not None
    assert rec.stat().st_mtime_ns > 10**9


def test_tuning_candidates_and_workers_do_not_fill_the_cache(modules, monkeypatch):
    name = _write_modules(modules)
    ctx = _context(modules / "cache")
    folder = modules / "cache" / "tiletune-frontend"
    donor = _kernel(name, occupancy=2)
    cubin, symbol, _, _ = donor._compile(_signature(), _context(modules / "elsewhere"), (9, 0))
    cand = _kernel(name, occupancy=2)
    cand.offer(_signature(), cubin, "sm_90")  # compiled ahead by the compile pool
    assert cand._compile(_signature(), ctx, (9, 0))[0] == cubin and cand.prefetch_hits == 1
    assert not folder.exists()
    monkeypatch.setenv("TILETUNE_IN_WORKER", "1")
    _kernel(name, occupancy=2)._compile(_signature(), ctx, (9, 0))
    assert not folder.exists()


def test_toolchain_versions_are_read_once_per_toolchain(tmp_path, monkeypatch):
    from tiletune.devices.backends import cutile as backend

    monkeypatch.setenv("CUDA_TILE_CACHE_DIR", str(tmp_path))
    assert frontend_cache.stored_toolchain_versions() is None
    frontend_cache.store_toolchain_versions({"cuda_tile": "1.7.0", "tileiras": "unknown", "driver": "x"})
    assert frontend_cache.stored_toolchain_versions() is None  # an unknown version is never recorded
    frontend_cache.store_toolchain_versions({"cuda_tile": "1.7.0", "tileiras": "13.4.92", "driver": "x"})
    assert frontend_cache.stored_toolchain_versions() == {"cuda_tile": "1.7.0", "tileiras": "13.4.92"}
    backend.software_versions.cache_clear()
    import cuda.tile._compile as comp

    monkeypatch.setattr(comp, "_get_compiler_version_string", lambda: pytest.fail("tileiras was asked"))
    try:
        got = backend.software_versions()
    finally:
        backend.software_versions.cache_clear()
    assert got["tileiras"] == "13.4.92" and got["cuda_tile"] == "1.7.0"
    record = json.loads((tmp_path / "tiletune-frontend" / "versions.json").read_text())
    monkeypatch.setattr(frontend_cache, "_toolchain", "another toolchain")  # e.g. tileiras replaced
    assert frontend_cache.stored_toolchain_versions() is None and len(record) == 1


CHILD = """
import sys, time
sys.path.insert(0, {folder!r})
import importlib
from tiletune.devices.prefetch_kernel import PrefetchKernel
from test_frontend_cache import _signature, _context
from pathlib import Path
mod = importlib.import_module({name!r})
k = PrefetchKernel.with_hints(mod.scale_kernel, dict(occupancy=2))
k._compile(_signature(), _context(Path({cache!r})), (9, 0))
print(k.frontend_hits, "cuda.tile._compile" in sys.modules)
"""


def test_a_fresh_process_never_imports_cutiles_compiler_on_a_hit(modules):
    name = _write_modules(modules)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(Path(__file__).parent)])}
    code = CHILD.format(folder=str(modules), name=name, cache=str(modules / "cache"))
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    for r in runs:
        assert r.returncode == 0, r.stderr[-2000:]
    assert [r.stdout.split() for r in runs] == [["0", "True"], ["1", "False"]]


def test_library_kernels_are_cacheable():
    """Every kernel of the library has a fingerprint (none reads a global the cache cannot describe)."""
    import pkgutil

    import tiletune.kernels as lib

    kernels = {}
    for info in pkgutil.iter_modules(lib.__path__):
        mod = importlib.import_module(f"tiletune.kernels.{info.name}")
        for attr, v in vars(mod).items():
            if isinstance(v, ct.kernel):
                kernels[f"{info.name}.{attr}"] = v._pyfunc
    assert len(kernels) >= 10
    missing = sorted(name for name, fn in kernels.items() if frontend_cache.code_fingerprint(fn) is None)
    assert not missing


def test_a_failing_cache_never_fails_the_compile(modules, monkeypatch):
    name = _write_modules(modules)
    ctx = _context(modules / "cache")

    def broken(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(frontend_cache, "ticket", broken)
    cubin, symbol, _, _ = _kernel(name, occupancy=2)._compile(_signature(), ctx, (9, 0))
    assert cubin[:4] == b"\x7fELF" and symbol
    monkeypatch.undo()
    monkeypatch.setattr(frontend_cache.Ticket, "save", broken)  # a lookup miss, then the store fails
    cubin2, _, _, _ = _kernel(name, occupancy=2)._compile(_signature(), ctx, (9, 0))
    assert cubin2 == cubin


def test_a_global_the_program_changes_between_compiles_changes_the_key(tmp_path, monkeypatch):
    """The fingerprint is made at every compile: a later compile after ``mod.K = 2`` is not stored under
    the key of ``K = 1`` (a fresh process with ``K = 1`` would load a cubin built with 2)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "fp_mut.py").write_text("K = 1\ndef f(x):\n    return x * K\n")
    import fp_mut

    before = frontend_cache.code_fingerprint(fp_mut.f)
    fp_mut.K = 2
    assert frontend_cache.code_fingerprint(fp_mut.f) != before
    fp_mut.K = 1
    assert frontend_cache.code_fingerprint(fp_mut.f) == before


def test_attributes_read_through_a_module_are_part_of_the_fingerprint(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    pkg = tmp_path / "fp_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .consts import BLOCK\n")
    (pkg / "consts.py").write_text("BLOCK = 64\n")
    (tmp_path / "fp_user.py").write_text("import fp_pkg\ndef f(x):\n    return x * fp_pkg.BLOCK\n")
    import fp_pkg
    import fp_user

    before = frontend_cache.code_fingerprint(fp_user.f)
    fp_pkg.BLOCK = 128  # what a changed consts.py gives a fresh process (fp_pkg/__init__.py unchanged)
    assert frontend_cache.code_fingerprint(fp_user.f) != before


CHILD_LAUNCH_PATH = """
import hashlib, sys
sys.path.insert(0, {folder!r})
import importlib
from cuda.tile._cext import default_tile_context
from tiletune.devices.prefetch_kernel import PrefetchKernel
from test_frontend_cache import _signature
mod = importlib.import_module({name!r})
k = PrefetchKernel.with_hints(mod.scale_kernel, dict(occupancy=2))
cubin = k._compile(_signature(), default_tile_context, (9, 0))[0]
print(k.frontend_hits, "cuda.tile._compile" in sys.modules, hashlib.sha256(cubin).hexdigest())
"""


def test_on_the_launch_path_the_cubin_is_stored_once_in_cutiles_cache(modules):
    """A launch compiles through the pool: cuTile's disk cache keeps the cubin, the front-end entry only
    its key; a later process is served from cuTile's database without the front end, and a cubin cuTile
    no longer holds is a miss (compiled again), never an error."""
    import sqlite3

    name = _write_modules(modules)
    cache = modules / "cache"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), str(Path(__file__).parent)]),
           "CUDA_TILE_CACHE_DIR": str(cache)}
    code = CHILD_LAUNCH_PATH.format(folder=str(modules), name=name)

    def run():
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout.split()

    first = run()
    assert first[:2] == ["0", "True"]
    folder = cache / "tiletune-frontend"
    records = [json.loads(p.read_text()) for p in folder.glob("*.json") if p.name != "versions.json"]
    assert len(records) == 1 and isinstance(records[0].get("cutile_key"), str)
    assert list(folder.glob("*.cubin")) == []  # one store: cuTile's
    db = sqlite3.connect(str(cache / "cache.db"))
    atime = db.execute("SELECT atime FROM cache WHERE key = ?", (records[0]["cutile_key"],)).fetchone()
    db.close()
    assert atime is not None

    second = run()
    assert second == ["1", "False", first[2]]  # served by reference, cuTile's compiler never imported
    db = sqlite3.connect(str(cache / "cache.db"))
    touched = db.execute("SELECT atime FROM cache WHERE key = ?", (records[0]["cutile_key"],)).fetchone()
    assert touched[0] > atime[0]  # marked used in cuTile's database at exit
    db.execute("DELETE FROM cache")  # cuTile evicted it
    db.commit()
    db.close()
    third = run()
    assert third == ["0", "True", first[2]]  # a miss: compiled again, same cubin


def test_a_reference_whose_cubin_changed_is_a_miss(tmp_path):
    from cutile_cache import _cache as cutile

    folder = tmp_path / "tiletune-frontend"
    t = frontend_cache.Ticket(folder, "entry", "sm_90", "k")
    cutile.cache_store(str(tmp_path), "ck", b"\x7fELF-one", None)
    assert t.save(b"\x7fELF-one", "sym", cutile_key="ck")
    assert t.load() == (b"\x7fELF-one", "sym")
    import sqlite3

    db = sqlite3.connect(str(tmp_path / "cache.db"))
    db.execute("UPDATE cache SET blob = ? WHERE key = ?", (b"\x7fELF-two", "ck"))  # another cubin under the key
    db.commit()
    db.close()
    assert t.load() is None
    assert frontend_cache.Ticket(folder, "other", "sm_90", "k").load() is None


def test_candidates_have_their_own_folder_beside_the_cache(modules):
    """Tuning candidates' entries live beside the served configs' (their own eviction), and a record of
    cuTile's key there reads cuTile's cache of the same folder."""
    name = _write_modules(modules)
    ctx = _context(modules / "cache")
    served = frontend_cache.ticket(_kernel(name, occupancy=2), _signature(), ctx, "sm_90")
    cand = frontend_cache.ticket(_kernel(name, occupancy=2), _signature(), ctx, "sm_90", candidates=True)
    assert served.key == cand.key
    assert cand.folder == modules / "cache" / frontend_cache.CANDIDATES_FOLDER
    assert cand.folder.parent == served.folder.parent
    assert cand.save(b"\x7fELF-cubin", "sym") and cand.load() == (b"\x7fELF-cubin", "sym")
    assert served.load() is None


def test_the_toolchain_versions_are_read_once_while_two_threads_ask(monkeypatch):
    """The prewarm thread and a first miss ask at once: one reads (cuTile's compiler, tileiras), the other
    waits for that answer."""
    import threading
    import time as _time

    from tiletune.devices import frontend_cache
    from tiletune.devices.backends import cutile as backend

    reads = []

    def slow_read():
        reads.append(threading.get_ident())
        _time.sleep(0.2)
        return {"cuda_tile": "1.7.0", "tileiras": "13.4.0"}

    monkeypatch.setattr(frontend_cache, "stored_toolchain_versions", slow_read)
    backend.software_versions.cache_clear()
    try:
        got = []
        threads = [threading.Thread(target=lambda: got.append(backend.software_versions())) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(reads) == 1 and len(got) == 2 and got[0] == got[1] and got[0]["tileiras"] == "13.4.0"
    finally:
        backend.software_versions.cache_clear()


def test_kernel_symbol_is_cutiles_mangled_name_for_every_catalogue_signature(monkeypatch):
    """The name the front-end cache keys on and the launcher's signature carries, made without
    ``mangle_kernel_name``'s demangling self-check: the same string for every config of every catalogue
    space and problem variant, and cuTile's own function where its mangling parts are not there."""
    from cuda.tile.compilation import mangle_kernel_name

    sys.path.insert(0, str(SRC.parent / "tools"))
    try:
        import compile_check_all as cca
    finally:
        sys.path.remove(str(SRC.parent / "tools"))
    n = 0
    for space in cca.DEFAULT_SPACES:
        sd = cca.space_defs()[space]
        name = sd.kernel._annotated_function.pyfunc.__name__
        for var in sd.variants:
            for cfg in list(sd.space.configs("sm_90"))[::7]:
                sig = cca.signature(var.make_args(cfg))
                assert frontend_cache.kernel_symbol(name, sig) == mangle_kernel_name(name, sig)
                n += 1
    assert n > 100
    monkeypatch.setattr(frontend_cache, "_mangler", False)  # other internals: the public function
    assert frontend_cache.kernel_symbol(name, sig) == mangle_kernel_name(name, sig)


def test_the_signature_naming_benchmark_writes_its_rows(tmp_path):
    sys.path.insert(0, str(SRC.parent / "benchmarks"))
    try:
        import signature_naming
    finally:
        sys.path.remove(str(SRC.parent / "benchmarks"))
    assert signature_naming.main(["--out", str(tmp_path), "--spaces", "layernorm", "--rounds", "1",
                                  "--stride", "40"]) == 0
    (row,) = json.loads((tmp_path / "signature_naming.json").read_text())["rows"]
    assert row["space"] == "layernorm" and row["signatures"] > 0 and row["same_names"] is True
    assert row["mangle_us"] > 0 and row["kernel_symbol_us"] > 0
