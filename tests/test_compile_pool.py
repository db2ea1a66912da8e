"""The compile pool's threading, error handling and hand-over, with cuTile's internals faked.

The real pool drives cuTile's front end and ``tileiras``; here those are replaced by a fake with the
same shape (signature, bytecode, assembler with a delay, disk cache) so the pool's logic runs on a CPU.
"""

from __future__ import annotations

import threading
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tiletune.devices import compile_pool
from tiletune.devices.compile_pool import CompileJob, CompilePool


class FakeKernel:
    def __init__(self, name: str) -> None:
        self.name = name
        self._annotated_function = name
        self._compiler_options = SimpleNamespace()
        self.offers: list[tuple[object, bytes, str]] = []

    def offer(self, sig, cubin, arch):
        self.offers.append((sig, cubin, arch))


def make_internals(tmp_path: Path, *, delay=0.05, fail=(), frontend_fail=(), timeout=(), cached=()):
    disk: dict[str, bytes] = {k: b"cached-" + k.encode() for k in cached}
    active = {"now": 0, "peak": 0}
    lock = threading.Lock()
    stores: list[str] = []

    def compile_tile(name, sigs, **kw):
        active.setdefault("nice_front", []).append(os.getpriority(os.PRIO_PROCESS, 0))
        if name in frontend_fail:
            raise TypeError(f"tile shape of {name} is not a power of two")
        return SimpleNamespace(bytecode=name.encode())

    def compile_cubin(path, opts, arch, timeout_sec):
        name = Path(path).read_bytes().decode()
        with lock:
            active["now"] += 1
            active["peak"] = max(active["peak"], active["now"])
            active.setdefault("nice", []).append(os.getpriority(os.PRIO_PROCESS, 0))  # this thread's
        try:
            time.sleep(delay)
            if name in fail:
                raise RuntimeError(f"tileiras failed on {name}")
            if name in timeout:
                raise type("TileCompilerTimeoutError", (Exception,), {})(f"exceeded timeout {timeout_sec}s")
            out = Path(path).with_suffix(".cubin")
            out.write_bytes(b"cubin-" + name.encode())
            return out
        finally:
            with lock:
                active["now"] -= 1

    def cache_store(cache_dir, key, cubin, meta):
        stores.append(key)
        disk[key] = cubin

    ints = SimpleNamespace(
        KernelSignature=SimpleNamespace(from_kernel_args=lambda k, args, conv: ("sig", k.name, args)),
        convention="v1",
        compiler_version="tileiras 13.4",
        comp=SimpleNamespace(
            compile_tile=compile_tile,
            compile_cubin=compile_cubin,
            _tileiras_effective_opt_and_device_debug=lambda opts, arch: (3, False),
        ),
        cache=SimpleNamespace(
            cache_key=lambda ver, arch, opt, bc, dbg: bc.decode(),
            cache_lookup=lambda d, key: disk.get(key),
            cache_store=cache_store,
            MetadataV1=lambda **kw: SimpleNamespace(to_dict=lambda: kw),
        ),
        context=SimpleNamespace(config=SimpleNamespace(temp_dir=str(tmp_path))),
        cache_dir=str(tmp_path / "cache"),
    )
    return ints, active, stores, disk


@pytest.fixture
def fake(monkeypatch, tmp_path):
    def install(**kw):
        ints, active, stores, disk = make_internals(tmp_path, **kw)
        monkeypatch.setattr(compile_pool, "_internals", ints)
        monkeypatch.setattr(compile_pool, "_internals_error", None)
        return ints, active, stores, disk

    return install


def jobs(names):
    return [CompileJob(i, FakeKernel(n), (i,), "sm_90") for i, n in enumerate(names)]


def test_compiles_in_parallel_and_hands_cubins_over(fake):
    _, active, stores, disk = fake(delay=0.1)
    js = jobs([f"k{i}" for i in range(8)])
    t = time.perf_counter()
    results = list(CompilePool(workers=4).compile_all(js))
    wall = time.perf_counter() - t
    assert sorted(r.tag for r in results) == list(range(8))
    assert all(r.error is None for r in results)
    assert active["peak"] == 4  # four assemblers at once, never more
    assert wall < 0.8 * 8 * 0.1  # well under the serial time
    for j in js:  # each kernel got exactly its own cubin for its own signature
        assert j.kernel.offers == [(("sig", j.kernel.name, j.args), b"cubin-" + j.kernel.name.encode(), "sm_90")]
    assert compile_pool.flush(5)
    assert sorted(stores) == sorted(f"k{i}" for i in range(8))  # and it reached the disk cache


def test_compiles_run_below_the_process_priority_so_checks_and_timing_run_first(fake):
    _, active, _, _ = fake(delay=0.01)
    base = os.getpriority(os.PRIO_PROCESS, os.getpid())
    list(CompilePool(workers=2).compile_all(jobs(["a", "b", "c"])))
    want = min(19, base + compile_pool.COMPILE_NICE)
    assert active["nice"] == [want] * 3 and active["nice_front"] == [want] * 3
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the calling thread keeps its priority


def test_failures_and_timeouts_are_results_not_exceptions(fake):
    fake(fail={"bad"}, frontend_fail={"front"}, timeout={"slow"})
    results = {r.tag: r for r in CompilePool(workers=2).compile_all(jobs(["ok", "bad", "front", "slow"]))}
    assert results[0].error is None
    assert "tileiras failed on bad" in results[1].error and not results[1].timed_out
    assert "power of two" in results[2].error
    assert results[3].timed_out and "timeout" in results[3].error


def test_disk_cache_hit_skips_the_assembler(fake):
    _, active, stores, _ = fake(cached={"k0"})
    js = jobs(["k0", "k1"])
    results = {r.tag: r for r in CompilePool(workers=2).compile_all(js)}
    assert results[0].cached and not results[1].cached
    assert js[0].kernel.offers[0][1] == b"cached-k0"
    assert compile_pool.flush(5)
    assert stores == ["k1"]


def test_without_internals_the_pool_defers_to_cutile(monkeypatch):
    monkeypatch.setattr(compile_pool, "_internals", None)
    monkeypatch.setattr(compile_pool, "_internals_error", "AttributeError: compile_cubin")
    pool = CompilePool(workers=2)
    assert not pool.parallel and "compile_cubin" in pool.why_serial
    results = list(pool.compile_all(jobs(["a", "b"])))
    assert [r.deferred for r in results] == [True, True]


def test_the_launch_signature_takes_convention_v2_only_when_a_constraint_needs_it():
    """cuTile's launcher specialises size-1 dimensions as shape constants, which only convention v2
    can carry: the pool must compute that signature (seen on the H200: decode attention, one query
    token, missed every cubin compiled ahead under v1), and v1 for everything else."""
    from tiletune.devices.compile_pool import launch_signature

    def array(*consts):
        return SimpleNamespace(shape_constant=consts)

    class TupleConstraint:  # named like cuda.tile's
        pass

    def make(params_by_conv):
        return SimpleNamespace(
            convention="v1", convention_v2="v2",
            KernelSignature=SimpleNamespace(from_kernel_args=lambda k, args, conv: SimpleNamespace(
                conv=conv, parameters=params_by_conv(conv, args))))

    size_one = make(lambda conv, args: [array(None, 1 if conv == "v2" else None), SimpleNamespace(value=3)])
    assert launch_signature(size_one, object(), (1,)).conv == "v2"
    plain = make(lambda conv, args: [array(None, None), SimpleNamespace(value=3)])
    assert launch_signature(plain, object(), (1,)).conv == "v1"
    listed = make(lambda conv, args: [SimpleNamespace(element=array(1 if conv == "v2" else None))])
    assert launch_signature(listed, object(), (1,)).conv == "v2"
    tupled = make(lambda conv, args: [TupleConstraint()])
    assert launch_signature(tupled, object(), (1,)).conv == "v2"
    def refuse_v2(k, args, conv):
        if conv == "v2":
            raise TypeError("not expressible in v2")
        return SimpleNamespace(conv=conv, parameters=[array(None)])

    refusing = SimpleNamespace(convention="v1", convention_v2="v2", KernelSignature=SimpleNamespace(
        from_kernel_args=refuse_v2))
    assert launch_signature(refusing, object(), (1,)).conv == "v1"
    # a cuda-tile without convention v2: v1, as before
    old = SimpleNamespace(convention="v1", KernelSignature=SimpleNamespace(
        from_kernel_args=lambda k, args, conv: SimpleNamespace(conv=conv, parameters=[array(1)])))
    assert launch_signature(old, object(), (1,)).conv == "v1"


def test_the_launch_signature_is_named_once_without_cutiles_self_check(monkeypatch):
    """``from_kernel_args`` asked for no symbol mangles the kernel's name and demangles it again to check
    itself, for each convention tried: the pool asks for a placeholder and names the signature it keeps once
    (``frontend_cache.kernel_symbol``, the same string)."""
    from tiletune.devices import frontend_cache
    from tiletune.devices.compile_pool import launch_signature

    calls, named = [], []

    class Sig(SimpleNamespace):
        def with_symbol(self, symbol):
            return Sig(**{**vars(self), "symbol": symbol})

    def from_kernel_args(kernel, args, conv, *, symbol=None):
        calls.append((conv, symbol))
        return Sig(conv=conv, parameters=[SimpleNamespace(shape_constant=(None,))], symbol=symbol)

    monkeypatch.setattr(frontend_cache, "kernel_symbol", lambda name, sig: named.append(name) or f"{name}_K{sig.conv}")
    kernel = SimpleNamespace(_annotated_function=SimpleNamespace(pyfunc=SimpleNamespace(__name__="rms")))
    ints = SimpleNamespace(convention="v1", convention_v2="v2", KernelSignature=SimpleNamespace(
        from_kernel_args=from_kernel_args))
    sig = launch_signature(ints, kernel, (1,))
    assert sig.conv == "v1" and sig.symbol == "rms_Kv1"
    assert calls == [("v2", "_"), ("v1", "_")] and named == ["rms"]  # both unnamed, the kept one named once
    # a from_kernel_args that raises for another reason is not asked again without the symbol
    def broken(kernel, args, conv, *, symbol=None):
        raise TypeError("unsupported argument type: dict")

    with pytest.raises(TypeError, match="unsupported argument"):
        launch_signature(SimpleNamespace(convention="v1", KernelSignature=SimpleNamespace(from_kernel_args=broken)),
                         kernel, ({},))


class FakeTicket:
    """A front-end cache entry held in a dict (``store``): what ``frontend_cache.ticket`` returns."""

    def __init__(self, store: dict, key: str) -> None:
        self.store, self.key = store, key

    def load(self):
        return self.store.get(self.key)

    def save(self, cubin, symbol, cutile_key=None):
        time.sleep(0.2)  # a slow disk: nobody may wait for this
        self.store[self.key] = (cubin, symbol)
        self.store.setdefault("refs", {})[self.key] = cutile_key
        return True


@pytest.fixture
def frontend(monkeypatch):
    entries: dict = {}
    monkeypatch.setattr(compile_pool, "_frontend_ticket", lambda ints, job, sig, candidates=False: FakeTicket(
        entries.setdefault("candidates", {}) if candidates else entries, job.kernel.name))
    return entries


class Sig(tuple):
    symbol = "kernel_symbol"


def test_a_front_end_cache_hit_skips_the_front_end_and_the_compiler(fake, frontend, monkeypatch):
    ints, active, stores, _ = fake()
    ints.KernelSignature = SimpleNamespace(from_kernel_args=lambda k, args, conv: Sig(("sig", k.name)))
    frontend["k0"] = (b"frontend-k0", "kernel_symbol")

    def no_front_end(*a, **k):
        raise AssertionError("the front end ran for a job the front-end cache answers")

    monkeypatch.setattr(ints.comp, "compile_tile", no_front_end)
    monkeypatch.setattr(CompilePool, "parallel", property(lambda self: pytest.fail("the compiler was loaded")))
    js = jobs(["k0"])
    results = list(CompilePool(workers=2).compile_all(js))
    assert results[0].cached and results[0].error is None
    assert js[0].kernel.offers == [(Sig(("sig", "k0")), b"frontend-k0", "sm_90")]


def test_kept_jobs_reach_the_front_end_cache_without_the_caller_waiting(fake, frontend):
    ints, _, stores, _ = fake(delay=0.01, cached={"k1"})
    ints.KernelSignature = SimpleNamespace(from_kernel_args=lambda k, args, conv: Sig(("sig", k.name)))
    js = [CompileJob(0, FakeKernel("k0"), (0,), "sm_90", keep=True),
          CompileJob(1, FakeKernel("k1"), (1,), "sm_90", keep=True),  # in cuTile's disk cache already
          CompileJob(2, FakeKernel("k2"), (2,), "sm_90")]  # a tuning candidate: not kept
    t = time.perf_counter()
    results = list(CompilePool(workers=2).compile_all(js))
    assert time.perf_counter() - t < 0.3  # the 0.2 s front-end cache writes are not waited for
    assert all(r.error is None for r in results)
    assert compile_pool.flush(5)
    refs = frontend.pop("refs")
    # the tuning candidate's entry goes to the candidates' folder, never among the served configs'
    assert frontend.pop("candidates") == {"k2": (b"cubin-k2", "kernel_symbol"), "refs": {"k2": "k2"}}
    assert frontend == {"k0": (b"cubin-k0", "kernel_symbol"), "k1": (b"cached-k1", "kernel_symbol")}
    assert sorted(stores) == ["k0", "k2"]
    # one store of the cubins: the front-end entries are records of cuTile's keys (k0 stored just before)
    assert refs == {"k0": "k0", "k1": "k1"}


def test_disk_stores_are_batched_into_one_transaction_and_read_back_without_writing(tmp_path):
    """cuTile's ``cache_store`` opens the database and re-runs its schema statements per cubin; the writer
    stores what queued in one connection, and the lookup reads without a write (no access-time update)."""
    import functools
    import sqlite3

    connects = []

    def connect(cache_dir):
        connects.append(cache_dir)
        conn = sqlite3.connect(str(Path(cache_dir) / "cache.db"))
        conn.execute("CREATE TABLE IF NOT EXISTS cache (key TEXT PRIMARY KEY, blob BLOB NOT NULL, "
                     "blob_size INTEGER NOT NULL, atime REAL NOT NULL, metadata TEXT)")
        return conn

    ints = SimpleNamespace(cache_dir=str(tmp_path), compiler_version="tileiras 13.4",
                           cache=SimpleNamespace(_connect=connect, MetadataV1=lambda **kw: SimpleNamespace(
                               to_dict=lambda: kw), cache_lookup=lambda d, k: pytest.fail("cuTile's lookup")))
    w = compile_pool._Writer()
    gate = threading.Event()
    w.submit(gate.wait)  # hold the writer so the three stores queue up behind it
    for i in range(3):
        w.submit(functools.partial(compile_pool._store_disk, ints, f"k{i}", b"cubin%d" % i, 0.1))
    gate.set()
    assert w.flush(5)
    assert connects == [str(tmp_path)]  # one connection for the three
    assert compile_pool._lookup_disk(ints, "k1") == b"cubin1"
    assert compile_pool._lookup_disk(ints, "nope") is None
    atimes = sqlite3.connect(str(tmp_path / "cache.db")).execute("SELECT count(*) FROM cache").fetchone()
    assert atimes == (3,)


def test_if_cached_jobs_are_answered_from_the_front_end_cache_or_skipped(fake, frontend):
    """A job marked ``if_cached`` (a raced config beside the one a caller needs) is handed its cubin when
    the front-end cache holds it, and otherwise skipped: no front end, no ``tileiras`` for it, even when
    cuTile's disk cache holds its cubin (its key is the front end's output)."""
    ints, active, stores, _ = fake(delay=0.05, cached={"k1"})
    ints.KernelSignature = SimpleNamespace(from_kernel_args=lambda k, args, conv: Sig(("sig", k.name)))
    frontend["k2"] = (b"frontend-k2", "kernel_symbol")
    assembled = []
    real = ints.comp.compile_cubin
    ints.comp.compile_cubin = lambda path, *a, **k: (assembled.append(Path(path).read_bytes().decode()),
                                                     real(path, *a, **k))[1]
    js = [CompileJob(0, FakeKernel("k0"), (0,), "sm_90"),  # needed: compiled whatever the caches hold
          CompileJob(1, FakeKernel("k1"), (1,), "sm_90", if_cached=True),  # in the disk cache only: skipped
          CompileJob(2, FakeKernel("k2"), (2,), "sm_90", if_cached=True),  # in the front-end cache
          CompileJob(3, FakeKernel("k3"), (3,), "sm_90", if_cached=True)]  # nowhere: skipped
    results = {r.tag: r for r in CompilePool(workers=4).compile_all(js)}
    assert assembled == ["k0"]
    assert results[0].error is None and not results[0].skipped and not results[0].cached
    assert results[1].skipped and not results[1].cached and js[1].kernel.offers == []
    assert results[2].cached and js[2].kernel.offers[0][1] == b"frontend-k2"
    assert results[3].skipped and results[3].error is None and js[3].kernel.offers == []
    assert compile_pool.flush(5)
    assert stores == ["k0"]


def test_if_cached_jobs_do_not_load_the_compiler_to_look_in_the_disk_cache(fake, frontend, monkeypatch):
    """With every needed job answered by the front-end cache the compiler stays unloaded, and an ``if_cached``
    job the front-end cache does not hold is skipped without running the front end (whose import and run
    would cost more than the race saves)."""
    ints, _, _, _ = fake(cached={"k1"})
    ints.KernelSignature = SimpleNamespace(from_kernel_args=lambda k, args, conv: Sig(("sig", k.name)))
    frontend["k0"] = (b"frontend-k0", "kernel_symbol")
    monkeypatch.setattr(ints.comp, "compile_tile", lambda *a, **k: pytest.fail("the front end ran"))
    js = [CompileJob(0, FakeKernel("k0"), (0,), "sm_90"),
          CompileJob(1, FakeKernel("k1"), (1,), "sm_90", if_cached=True)]
    results = {r.tag: r for r in CompilePool(workers=2).compile_all(js)}
    assert results[0].cached and results[1].skipped


def test_without_internals_if_cached_jobs_are_skipped_not_deferred(monkeypatch):
    monkeypatch.setattr(compile_pool, "_internals", None)
    monkeypatch.setattr(compile_pool, "_internals_error", "AttributeError: compile_cubin")
    js = [CompileJob(0, FakeKernel("a"), (0,), "sm_90"), CompileJob(1, FakeKernel("b"), (1,), "sm_90", if_cached=True)]
    results = {r.tag: r for r in CompilePool(workers=2).compile_all(js)}
    assert results[0].deferred and not results[0].skipped
    assert results[1].skipped and not results[1].deferred


def test_compiles_are_pipelined_over_the_pool_and_results_stream_before_the_last_ends(fake):
    """N jobs over P assemblers take about ceil(N/P) assembler times, and the first result is handed over
    while most compiles still run (the session checks it meanwhile)."""
    _, active, _, _ = fake(delay=0.2)
    t = time.perf_counter()
    arrivals = [time.perf_counter() - t for _ in CompilePool(workers=3).compile_all(jobs([f"k{i}" for i in range(9)]))]
    assert active["peak"] == 3
    # ceil(9/3) = 3 rounds (0.6 s), far from 9 x 0.2 in sequence; the bound leaves room for a loaded CI host
    assert 3 * 0.2 - 0.05 <= arrivals[-1] < 9 * 0.2 * 0.7
    assert arrivals[0] < 0.5 and arrivals[0] < arrivals[-1] - 0.2  # the first came long before the last


def test_the_pool_takes_every_core_by_default(monkeypatch):
    monkeypatch.delenv("TILETUNE_COMPILE_WORKERS", raising=False)
    monkeypatch.setattr(compile_pool, "cpu_count", lambda: 13)
    assert CompilePool().workers == 13


def test_a_stopped_pool_compiles_nothing_new_and_lets_running_compiles_finish(fake):
    _, active, _, _ = fake(delay=0.3)
    stop = threading.Event()
    js = jobs([f"k{i}" for i in range(6)])
    threading.Timer(0.1, stop.set).start()  # while the first two assemble
    results = {r.tag: r for r in CompilePool(workers=2).compile_all(js, stop=stop)}
    done = [t for t, r in results.items() if not r.deferred]
    assert len(done) == 2 and all(results[t].error is None for t in done)
    assert all(r.deferred for t, r in results.items() if t not in done)
    assert sum(bool(j.kernel.offers) for j in js) == 2


def test_compiling_ahead_stores_in_the_background_and_hands_over_its_figures(fake):
    _, _, stores, _ = fake(delay=0.1, fail={"bad"})
    ahead = compile_pool.AheadCompile(CompilePool(workers=2), jobs(["k0", "k1", "bad", "k3"]))
    assert not ahead.done
    time.sleep(0.6)  # meanwhile: the worker starts
    got = ahead.finish(5.0)
    assert ahead.done
    assert got["ahead_jobs"] == 4 and got["ahead_compiled"] == 3 and got["ahead_errors"] == 1
    assert got["ahead_stopped"] == 0 and got["ahead_wait_s"] < 0.3 and got["ahead_cpu_s"] >= 4 * 0.1 - 1e-6
    assert sorted(stores) == ["k0", "k1", "k3"]  # in cuTile's disk cache by the time finish returns


def test_finishing_a_compile_ahead_early_stops_what_has_not_started(fake):
    fake(delay=0.3)
    ahead = compile_pool.AheadCompile(CompilePool(workers=1), jobs([f"k{i}" for i in range(5)]))
    time.sleep(0.1)
    t = time.perf_counter()
    got = ahead.finish(5.0)
    assert time.perf_counter() - t < 0.5  # waits for the one running, not for the four others
    assert got["ahead_compiled"] == 1 and got["ahead_stopped"] == 4


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_front_ends_run_in_forked_processes(fake, tmp_path):
    """Several front ends at once run in forked children (they queue behind one interpreter lock in one
    process); the cubins, the errors and the hand-over are those of the in-process path."""
    import os

    ints, _, _, _ = fake(delay=0.01, frontend_fail=("bad",))
    pids = tmp_path / "pids"
    inner = ints.comp.compile_tile

    def compile_tile(name, sigs, **kw):
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
        return inner(name, sigs, **kw)

    ints.comp.compile_tile = compile_tile
    js = jobs(["k0", "k1", "bad", "k3", "k4", "k5"])
    results = {r.tag: r for r in CompilePool(workers=3, fork_front_ends=True).compile_all(js)}
    assert "not a power of two" in results[2].error and results[2].error.startswith("TypeError")
    assert all(results[i].error is None for i in (0, 1, 3, 4, 5))
    for j in js:
        if j.kernel.name != "bad":
            assert [c for _, c, _ in j.kernel.offers] == [b"cubin-" + j.kernel.name.encode()]
    ran = {int(x) for x in pids.read_text().split()}
    assert os.getpid() not in ran and len(ran) >= 1


def test_front_ends_stay_in_process_for_a_few_jobs_or_when_asked(fake, tmp_path, monkeypatch):
    import os

    ints, _, _, _ = fake(delay=0.01)
    seen: list[int] = []
    inner = ints.comp.compile_tile
    ints.comp.compile_tile = lambda name, sigs, **kw: seen.append(os.getpid()) or inner(name, sigs, **kw)
    list(CompilePool(workers=3, fork_front_ends=True).compile_all(jobs(["a", "b"])))  # fewer than FORK_MIN
    monkeypatch.setenv("TILETUNE_FRONTEND_PROCS", "1")
    list(CompilePool(workers=3, fork_front_ends=True).compile_all(jobs(["c", "d", "e", "f"])))
    assert seen == [os.getpid()] * 6


def test_only_a_worker_forks_front_ends_by_default(fake, monkeypatch):
    """The caller's process runs other threads (a model's, other ops' background compiles): a child forked
    there could inherit a lock held; a tuning worker forks."""
    ints, _, _, _ = fake()
    monkeypatch.setattr(compile_pool, "_Internals", type(ints))  # the fake stands for the real internals
    pool = CompilePool(workers=4)
    fronts = [object()] * 5
    monkeypatch.delenv("TILETUNE_IN_WORKER", raising=False)
    assert pool._forks(ints, fronts) == 1
    monkeypatch.setenv("TILETUNE_IN_WORKER", "1")
    assert pool._forks(ints, fronts) == 4
    assert pool._forks(ints, fronts[:2]) == 1


def test_a_candidate_compiled_before_is_answered_without_the_front_end(fake, frontend, monkeypatch):
    """A worker that replaces one lost to a fault (or a later session) compiles the remaining candidates
    again: their entries in the candidates' folder answer them, no front end, no assembler."""
    ints, _, _, _ = fake(delay=0.01)
    ints.KernelSignature = SimpleNamespace(from_kernel_args=lambda k, args, conv: Sig(("sig", k.name)))
    first = list(CompilePool(workers=2).compile_all(jobs(["c0", "c1", "c2"])))
    assert all(r.error is None and not r.cached for r in first)
    assert compile_pool.flush(5)
    monkeypatch.setattr(ints.comp, "compile_tile", lambda *a, **k: pytest.fail("the front end ran again"))
    again = jobs(["c0", "c1", "c2"])
    results = list(CompilePool(workers=2).compile_all(again))
    assert all(r.cached and r.error is None for r in results)
    assert [j.kernel.offers[0][1] for j in again] == [b"cubin-c0", b"cubin-c1", b"cubin-c2"]
    assert set(frontend) == {"candidates"}  # nothing among the served configs' entries


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
@pytest.mark.parametrize("fork", [True, False])
def test_compile_trace_records_each_jobs_front_end_and_assembler(fake, tmp_path, monkeypatch, fork):
    """TILETUNE_COMPILE_TRACE: one JSON line per assembled job, its front end (in a forked child or here)
    before its bytecode reached the assemblers, and that before its assembler ran."""
    import json

    fake(delay=0.05)
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("TILETUNE_COMPILE_TRACE", str(trace))
    results = list(CompilePool(workers=2, fork_front_ends=fork).compile_all(jobs(["a", "b", "c", "d"])))
    assert all(r.error is None for r in results)
    lines = [x for x in map(json.loads, trace.read_text().splitlines()) if "front" in x]  # marks aside
    assert sorted(x["tag"] for x in lines) == ["0", "1", "2", "3"]
    for x in lines:
        assert x["front"][0] <= x["front"][1] <= x["queued"] <= x["asm"][0] <= x["asm"][1]
        assert x["asm"][1] - x["asm"][0] >= 0.04  # the fake assembler's delay
        assert (x["front_pid"] != os.getpid()) == fork and x["pool_pid"] == os.getpid()


def test_no_compile_trace_unless_asked(fake, tmp_path, monkeypatch):
    fake(delay=0.01)
    monkeypatch.delenv("TILETUNE_COMPILE_TRACE", raising=False)
    pool = CompilePool(workers=2)
    assert pool.trace_path is None
    list(pool.compile_all(jobs(["a", "b"])))
    assert not list(tmp_path.glob("*.jsonl"))


def _order_recorder(ints):
    fronts, asms = [], []
    front, asm = ints.comp.compile_tile, ints.comp.compile_cubin
    ints.comp.compile_tile = lambda name, sigs, **kw: fronts.append(name) or front(name, sigs, **kw)
    ints.comp.compile_cubin = lambda path, *a, **k: asms.append(Path(path).read_bytes().decode()) or asm(path, *a, **k)
    return fronts, asms


def tiled(shapes):
    """Jobs whose launch arguments carry their tile sizes as integers (as a cuTile kernel's constants)."""
    return [CompileJob(i, FakeKernel(n), ("tensor", *tile), "sm_90") for i, (n, tile) in enumerate(shapes)]


@pytest.mark.parametrize("order", ["largest", "given"])
def test_the_biggest_tiles_compile_first_unless_told_otherwise(fake, monkeypatch, order):
    """A session's slowest compiles (the biggest tiles) start first instead of making its tail;
    TILETUNE_COMPILE_ORDER=given keeps the space's order."""
    ints, _, _, _ = fake(delay=0.01)
    fronts, asms = _order_recorder(ints)
    monkeypatch.setenv("TILETUNE_COMPILE_ORDER", order)
    shapes = [("s64", (64, 64, 32)), ("s256", (256, 128, 64)), ("s128a", (128, 128, 32)), ("s128b", (128, 128, 32))]
    results = list(CompilePool(workers=1).compile_all(tiled(shapes)))
    assert sorted(r.tag for r in results) == [0, 1, 2, 3] and all(r.error is None for r in results)
    want = ["s256", "s128a", "s128b", "s64"] if order == "largest" else ["s64", "s256", "s128a", "s128b"]
    assert fronts == want and asms == want


def test_the_biggest_bytecode_waiting_gets_the_next_assembler(fake, monkeypatch):
    """Among jobs whose bytecode waits for a free assembler (alike in tile size), the biggest goes first."""
    ints, _, _, _ = fake(delay=0.15)
    fronts, asms = _order_recorder(ints)
    monkeypatch.delenv("TILETUNE_COMPILE_ORDER", raising=False)
    names = ["first", "b", "dddd", "cc"]
    list(CompilePool(workers=1).compile_all(tiled([(n, (64, 64)) for n in names])))
    assert fronts == names  # one tile size: the given order
    assert asms == ["first", "dddd", "cc", "b"]  # "first" had the assembler to itself; then by size


def test_tile_volume_multiplies_the_integer_arguments_only():
    job = CompileJob(0, FakeKernel("k"), ("tensor", 128, 64, True, 2.5, 0, -4), "sm_90")
    assert compile_pool.tile_volume(job) == 128 * 64 * 1 * 4
    assert compile_pool.tile_volume(CompileJob(0, FakeKernel("k"), ("t",), "sm_90")) == 1


def test_an_invalid_compile_order_is_named_and_the_default_kept(monkeypatch):
    from tiletune import settings

    monkeypatch.setenv("TILETUNE_COMPILE_ORDER", "fastest")
    with pytest.raises(ValueError, match="TILETUNE_COMPILE_ORDER='fastest'"):
        settings.compile_order()
    assert compile_pool._largest_first()


def test_timeline_marks_the_pool_and_is_silent_unless_asked(fake, tmp_path, monkeypatch):
    """TILETUNE_COMPILE_TRACE also gets the timeline's marks (the pool's start, its front ends ready),
    wall-clock and with this process's pid; unset, nothing is written anywhere."""
    import json

    from tiletune.devices import timeline

    fake(delay=0.01)
    trace = tmp_path / "trace.jsonl"
    monkeypatch.setenv("TILETUNE_COMPILE_TRACE", str(trace))
    t0 = time.time()
    list(CompilePool(workers=2).compile_all(jobs(["a", "b"])))
    timeline.mark("custom", detail=3)
    lines = [json.loads(x) for x in trace.read_text().splitlines()]
    marks = [x for x in lines if "mark" in x]
    assert [m["mark"] for m in marks] == ["pool_start", "fronts_ready", "custom"]
    assert marks[0]["jobs"] == 2 and marks[1]["fronts"] == 2 and marks[2]["detail"] == 3
    assert all(m["pid"] == os.getpid() and t0 <= m["t"] <= time.time() for m in marks)
    assert len([x for x in lines if "front" in x]) == 2
    monkeypatch.delenv("TILETUNE_COMPILE_TRACE")
    trace.unlink()
    timeline.mark("nothing")
    assert not trace.exists()


def test_the_baseline_compiles_before_bigger_tiles(fake, monkeypatch):
    ints, _, _, _ = fake(delay=0.01)
    fronts, asms = _order_recorder(ints)
    monkeypatch.delenv("TILETUNE_COMPILE_ORDER", raising=False)
    js = tiled([("s64", (64, 64)), ("s256", (256, 256)), ("base", (32, 32)), ("s128", (128, 128))])
    js[2] = CompileJob(2, js[2].kernel, js[2].args, "sm_90", first=True)
    list(CompilePool(workers=1).compile_all(js))
    assert fronts == ["base", "s256", "s128", "s64"] and asms == fronts


# ---------------------------------------------------------------------- claims: one assembly per cubin


def _claim_path(ints, key):
    import hashlib

    return Path(ints.cache_dir) / compile_pool.CLAIMS_DIR / hashlib.sha256(key.encode()).hexdigest()[:40]


def _plant_claim(ints, key, pid):
    path = _claim_path(ints, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{pid} 0")
    return path


def test_two_pools_compiling_the_same_cubins_at_once_assemble_each_once(fake, monkeypatch):
    """The caller compiling ahead while its worker compiles the same candidates (or two ranks): the second
    to reach a key waits for the first's cubin instead of running tileiras on it again."""
    ints, active, _, disk = fake(delay=0.3)
    runs: list[str] = []
    inner = ints.comp.compile_cubin

    def counting(path, *a, **k):
        runs.append(Path(path).read_bytes().decode())
        return inner(path, *a, **k)

    monkeypatch.setattr(ints.comp, "compile_cubin", counting)
    names = [f"k{i}" for i in range(4)]
    got: dict[int, dict] = {}

    def run(i):
        got[i] = {r.tag: r for r in CompilePool(workers=4).compile_all(jobs(names))}

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sorted(runs) == names  # each cubin assembled once in all
    for results in got.values():
        assert all(r.error is None and not r.deferred for r in results.values())
    assert sum(r.cached for results in got.values() for r in results.values()) == 4  # the waiters' answers
    assert compile_pool.flush(5) and not list((Path(ints.cache_dir) / compile_pool.CLAIMS_DIR).iterdir())


def test_a_key_another_live_process_claims_is_taken_from_the_disk_cache_once_stored(fake):
    import subprocess
    import sys

    ints, active, _, disk = fake(delay=0.05)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        claim = _plant_claim(ints, "k0", other.pid)

        def store_then_release():
            disk["k0"] = b"cubin-from-the-other-process"
            claim.unlink()

        threading.Timer(0.3, store_then_release).start()
        t = time.perf_counter()
        (r,) = list(CompilePool(workers=2).compile_all(jobs(["k0"])))
        assert r.cached and r.error is None and time.perf_counter() - t >= 0.25
        assert "nice" not in active  # no tileiras ran here
    finally:
        other.kill()
        other.wait()


def test_a_claim_of_a_dead_process_or_one_given_up_is_assembled_here(fake):
    import subprocess
    import sys

    ints, active, _, disk = fake(delay=0.05)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _plant_claim(ints, "k0", gone.pid)  # stale: its process is gone
    (r,) = list(CompilePool(workers=1).compile_all(jobs(["k0"])))
    assert not r.cached and r.error is None and len(active["nice"]) == 1
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        claim = _plant_claim(ints, "k1", other.pid)
        threading.Timer(0.2, claim.unlink).start()  # the other gives up without storing anything
        (r,) = list(CompilePool(workers=1).compile_all(jobs(["k1"])))
        assert not r.cached and r.error is None and len(active["nice"]) == 2
    finally:
        other.kill()
        other.wait()
    assert compile_pool.flush(5) and disk["k1"] == b"cubin-k1"


def test_a_failed_assembly_releases_its_claim(fake):
    ints, _, _, _ = fake(fail={"bad"})
    (r,) = list(CompilePool(workers=1).compile_all(jobs(["bad"])))
    assert r.error is not None
    assert compile_pool.flush(5) and not _claim_path(ints, "bad").exists()
