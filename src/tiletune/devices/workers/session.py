"""A tuning session whose candidates run in a worker process (the caller runs none of them).

:class:`IsolatedBackend` wraps the caller's backend: everything the caller needs for itself (device
info, versions, kernel sources, the launch parts of the winner) comes from the wrapped backend, while
:meth:`IsolatedBackend.open_session` returns a :class:`WorkerSession`, which implements the
:class:`~tiletune.devices.backends.base.TuningSession` primitives (compile, check, sample) as requests to the
worker. Every fault is turned into a failed candidate:

* the worker dies (a signal, ``os._exit``, out of memory, a compiler crash), or reports that its CUDA
  context is lost (illegal or misaligned address, a trap): the candidate in flight fails with the
  message and the worker's last output, and a warm spare (started in the background when the
  session opens, :attr:`IsolationOptions.spare`) takes over the rest of the session at once;
* a request outlives its watchdog (a kernel that never finishes): the worker is killed, the
  candidate fails with ``timeout``;
* an invalid reply: the worker is killed, the candidate fails.

What a fault costs after its watchdog or death: the dead worker is killed and reaped in the
background; a spare started ahead takes over (:attr:`IsolationOptions.start_spares` start with the
session, alongside its worker; each fault of the session raises the spares kept, up to
:attr:`IsolationOptions.max_spares`, started in parallel, so faults in quick succession each find one
ready; back to ``start_spares`` when the session ends); the session is opened there again (the arguments shipped
again) and candidates are compiled there again when they next run (from cuTile's disk cache; those
still to be measured in one request). Nothing already judged is checked or timed again. Timing waits
until the dead worker is gone (a kernel that hung runs on the GPU until its context is torn down);
checks do not. Each fault's entry in ``stats["faults"]`` says what it cost: ``waited_s`` (the
watchdog or the death), ``lost_s`` (from then until the session was open in the next worker),
``spare`` (a spare took over) with ``spare_wait_s``, ``open_s``, and ``reap_wait_s`` (timing waiting
for the dead worker to be gone).

Watchdog (adapts to the kernel): a sample request may take ``max(watchdog_floor_s, watchdog_factor x``
the expected time of its launches), where the expected time is the fastest median measured so far in
the session (plus the cache flush per sample); before anything is measured, ``first_watchdog_s``. A
check (a candidate's first launch) is watched in phases, which the worker reports as it passes them
(:mod:`tiletune.devices.launch_marks`): its kernel, from launch to end, may take ``max(kernel_floor_s,
watchdog_factor x`` the slowest median so far, ``check_slack_factor x`` the slowest checked kernel so
far, twice the longest a kernel with a fatal error took to be reported) (more while a killed worker's
context is still torn down), so an endless kernel costs about a second when the session's kernels are short (a kernel past that
deadline while the GPU has reported a memory fault, an Xid read through NVML, :mod:`tiletune.devices.xid`,
is given a few seconds more to report it: a fault, not a hang); the phases before the launch (the guard,
module loads, cuTile's launch path: slow in a new worker) and after the kernel (the reference, the
comparison) are given ``check_slack_factor`` x their slowest time so far in the session, at least
``check_slack_s`` (a legitimately slow first launch is not taken for a hang). A worker that reports
no phases has the whole check under the former rule: the sample's deadline plus ``check_slack_s`` for
the first check in each worker, afterwards ``check_slack_factor`` x the slowest check so far, within
``[check_slack_min_s, check_slack_s]``. Compile time is not counted: while a first launch compiles its
candidate in the worker again, the worker sends heartbeats that restart the count (up to the compile
limit), so a hung kernel costs about the watchdog, not the compile allowance. Each check's time to
its launch is in ``stats["check_load_s"]``, the first check of each worker in ``stats["first_check_s"]``;
a timeout's fault entry says which ``phase`` it waited for and its ``deadline_s``; a fatal one the
check's ``check_s`` and ``probe_s`` in the worker and, when it got that far, ``launched_s``. Compiles in
workers that took over are counted in ``recompiled`` (their seconds summed in ``recompile_s``), those for
which ``tileiras`` ran (no cache answered) in ``recompiled_assembled``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from tiletune.devices import timeline, xid
from tiletune.devices.backends.base import Backend, Candidate, CheckOutcome, CompileOutcome, Launch, LaunchParts
from tiletune import settings
from tiletune.records import DeviceInfo, Status
from tiletune.devices.workers.client import WorkerFault, WorkerProcess, worker_for
from tiletune.devices.workers.protocol import WORKER_STATS, ProtocolError, candidate_wire, samples_from, status_from
from tiletune.devices.workers.shipping import IsolationUnavailable, Unshippable, collect_shared, dumps

logger = logging.getLogger("tiletune")

__all__ = ["IsolationOptions", "IsolatedBackend", "WorkerSession", "CandidateFault"]


#: Counters of the worker's own session reported back when it closes (``prefetch_hits``: first
#: launches answered by a cubin compiled ahead; ``prefetch_misses``: first launches that compiled
#: again although cubins compiled ahead were waiting, i.e. a signature mismatch).
class CandidateFault(Exception):
    """A candidate took its worker down or timed out; ``status`` is LAUNCH_ERROR or TIMEOUT."""

    def __init__(self, status: Status, reason: str) -> None:
        super().__init__(reason)
        self.status = status




@dataclass(frozen=True)
class IsolationOptions:
    """Deadlines of the worker watchdog (seconds).

    ``first_watchdog_s`` (``TILETUNE_WATCHDOG_S``) bounds a check before anything of the session
    has been timed; afterwards a sample request may take ``max(watchdog_floor_s, watchdog_factor x``
    the expected time of its launches) (``TILETUNE_WATCHDOG_FACTOR``). A check is watched in three
    phases (see the module docstring): its kernel only ``max(kernel_floor_s, watchdog_factor x`` the
    slowest median so far), what comes before and after it a generous slack. ``spare``: keep workers
    started ahead, so a fault costs no cold start: ``start_spares`` from the session's start (started
    alongside its worker), one more after each fault of the session, up to ``max_spares`` (faults in
    quick succession then find a spare ready, not one still starting). ``reap_timeout_s``: how long
    timing waits for a killed worker to be gone.
    """

    watchdog_factor: float = field(default_factory=lambda: settings.watchdog_factor())
    watchdog_floor_s: float = 0.5
    #: a kernel's floor: a GPU may report an illegal address well after the launch (the driver handles
    #: the fault first); a floor below that reports such a fault as a hang
    kernel_floor_s: float = 1.0
    check_slack_s: float = 0.5
    #: after a check's kernel has ended, its reference and the comparison (no place for an endless
    #: kernel; the first mismatch of a session runs code paths, and loads kernels, seen there first)
    check_after_s: float = 3.0
    check_slack_min_s: float = 0.1
    check_slack_factor: float = 4.0
    first_watchdog_s: float = field(default_factory=lambda: settings.watchdog_s())
    flush_us: float = 60.0  # cache flush and event pair per sample
    compile_timeout_s: float = 300.0  # the assembler's own limit; the worker gets this plus slack
    compile_slack_s: float = 60.0  # no compile result for this long past the assembler's limit: hung
    open_timeout_s: float = 120.0
    spare: bool = True
    start_spares: int = 2
    max_spares: int = 4
    reap_timeout_s: float = 30.0
    #: how long the end of the session's compiles waits for the caller's compiles ahead still running (and
    #: their stores), for their figures; the compiles themselves never wait for them (a cubin being
    #: assembled is claimed, see compile_pool)
    ahead_wait_s: float = 10.0
    #: most configs the caller compiles ahead for a worker forked by the zygote (up in a few tenths of a
    #: second, its front ends spread over forked processes): the caller's front ends run one at a time, so
    #: a bigger space would leave the worker waiting for the caller's assemblies instead of compiling
    ahead_forked_max: int = 4
    #: ask the GPU (NVML's Xid events) whether a check's kernel that outlived its deadline faulted
    #: (:mod:`tiletune.devices.xid`; nothing where NVML gives no events)
    xid_watch: bool = True


class IsolatedBackend:
    """The caller's backend, with tuning sessions run in a worker process."""

    ships_plan = True  # open_session takes the user's raw plan (shipped as is to the worker)
    compiles_ahead = True  # open_session takes ``ahead`` (configs this process may compile while the worker starts)

    def __init__(self, local: Backend, worker_spec: Any = "cutile", options: IsolationOptions | None = None,
                 worker_command: list[str] | None = None) -> None:
        self.local = local
        self.name = f"{getattr(local, 'name', 'backend')}+process"
        self.worker_spec = worker_spec
        self.options = options or IsolationOptions()
        self.worker_command = worker_command
        self._key = "cutile" if worker_spec == "cutile" else f"obj{id(worker_spec)}"

    # the caller-side half delegates to the local backend
    def device_info(self, device_index: int) -> DeviceInfo:
        return self.local.device_info(device_index)

    def versions(self) -> Mapping[str, str]:
        return self.local.versions()

    def arg_device(self, args: Sequence[Any]) -> int:
        return self.local.arg_device(args)

    def kernel_sources(self, kernel: Any) -> str:
        return self.local.kernel_sources(kernel)

    def launch_parts(self, config: Any, kernel: Any, device_index: int) -> LaunchParts:
        return self.local.launch_parts(config, kernel, device_index)

    def worker(self, device_index: int) -> WorkerProcess:
        """The worker process serving ``device_index`` (shared by every op of this process)."""
        spec, cmd = self.worker_spec, self.worker_command
        key = self._key if cmd is None else f"{self._key}:{' '.join(cmd)}"
        return worker_for(key, device_index, lambda: WorkerProcess(spec, device_index, command=cmd))

    def open_session(
        self,
        plan: Callable[..., Launch],
        args: tuple[Any, ...],
        *,
        device_index: int,
        writes: Sequence[int],
        inplace: Sequence[int] = (),
        reference: Callable[..., Any] | None,
        tolerance: Mapping[str, tuple[float, float]] | None,
        name: str,
        ahead: Sequence[Any] = (),
    ) -> "WorkerSession":
        """Ship the plan, reference and arguments to the worker (raises :class:`Unshippable`).

        ``ahead``: configs the session will compile first (an exhaustive search: all of them). While
        the worker is not ready yet (starting), this process compiles them into cuTile's disk cache
        meanwhile, when the local backend can (``compile_ahead``): the worker's compiles then find them
        there instead of starting only once it is up. Not for more than
        :attr:`IsolationOptions.ahead_forked_max` configs when the worker was forked by the zygote (it is
        about to answer)."""
        payload = {
            "backend": self.worker_spec,
            "plan": plan,
            "args": tuple(args),
            "writes": tuple(writes),
            "inplace": tuple(inplace),
            "reference": reference,
            "tolerance": None if tolerance is None else dict(tolerance),
            "device_index": device_index,
            "name": name,
        }
        dumps(payload, probe=True)  # fail here, before any worker is involved, when something cannot be shipped
        timeline.mark("session_payload_probed")
        worker = self.worker(device_index)
        pre = None
        compile_ahead = getattr(self.local, "compile_ahead", None)
        if ahead and compile_ahead is not None and not worker.ready and not (
                getattr(worker, "forked", False) and len(ahead) > self.options.ahead_forked_max):
            try:
                pre = compile_ahead(plan, tuple(args), list(ahead), device_index)
            except Exception as exc:  # noqa: BLE001 - an optimisation: the worker compiles everything itself
                logger.debug("tiletune: compiling ahead in the caller failed (%s: %s)", type(exc).__name__, exc)
        try:
            return WorkerSession(worker, payload, self.options, ahead=pre)
        except WorkerFault as fault:
            raise IsolationUnavailable(f"the worker process failed ({fault.kind}): {fault}") from fault


class WorkerSession:
    """One tuning problem served by a worker (see the module docstring for the fault rules)."""

    launches_winner = False  # the caller launches the winner itself once tuning is over

    _next_sid = 0

    def __init__(self, worker: WorkerProcess, payload: dict, options: IsolationOptions, ahead: Any = None) -> None:
        self.t0 = time.perf_counter()
        self._ahead = ahead  # the caller's compile-ahead (compile_pool.AheadCompile) running meanwhile, or None
        self._ahead_stopped = False
        self.worker = worker
        self.payload = payload
        self.options = options
        WorkerSession._next_sid += 1
        self.sid = WorkerSession._next_sid
        self.stats: dict[str, Any] = {"isolation": "process", "worker_restarts": 0, "faults": []}
        self._opened_gen = -1  # worker generation the session is open in
        self._prepared_gen = -1  # worker generation that has run the session's reference (see _prepare)
        self._expected: tuple[Any, ...] | None = None  # the reference's answer computed here (see _prepare)
        self._compiled: set[int] = set()  # candidates compiled in the current worker generation
        self._compile_s: dict[int, float] = {}  # each candidate's compile time in the worker
        self._best_us: float | None = None
        self._stash: dict[int, tuple[int, Any]] = {}  # order -> (worker generation, compile event)
        self._sent: set[int] = set()  # candidates sent to compile in the current worker generation
        self._ok: dict[int, Candidate] = {}  # compiled fine and not failed since: may run again
        self._median: dict[int, float] = {}  # each candidate's last median (recompile order after a fault)
        self._check_max_s = 0.0  # the slowest check (in the worker) so far
        self._load_max_s = 0.0  # the slowest time to a check's launch (module loads: first checks) so far
        self._kernel_max_s = 0.0  # the slowest checked kernel (launch to end) so far
        self._after_max_s = 0.0  # the slowest verdict after a checked kernel (the reference, the comparison)
        self._fatal_kernel_max_s = 0.0  # the longest a kernel with a fatal error took, from launch to its report
        self._slow_us: float | None = None  # the slowest median so far
        self._checks_in_gen = 0  # checks answered by the current worker generation
        self._fault_at: float | None = None  # perf_counter of the last fault not yet recovered from
        self._xid: Any = None  # the GPU's Xid watch (devices.xid), made at the first check
        self._xid_tried = False
        self._xid_seen0 = 0  # the watch's Xids read before this session
        self.workers = None  # the batch size of a search defaults to the compile workers (unknown here)
        if options.spare:  # before waiting for the worker: they start alongside a worker still starting
            worker.keep_spares(max(1, options.start_spares, len(worker.spares)))
        timeline.mark("session_start", op=payload.get("name"))
        t = time.perf_counter()
        worker.lock.acquire()  # a worker started in the background (prestart) holds it until it is up
        try:
            worker.ensure()
            timeline.mark("session_worker_ready")
            self.stats["worker_wait_s"] = round(time.perf_counter() - t, 4)
            self.stats["worker_forked"] = bool(getattr(worker, "forked", False))  # by the zygote, imports done
            self._gen0 = worker.generation
            self._spares_used0 = worker.spares_used
            self._reaped0 = len(worker.reap_s)
            self._open()
        except BaseException:
            worker.lock.release()
            raise

    # -- plumbing --------------------------------------------------------------------------
    def clock(self) -> float:
        return time.perf_counter() - self.t0

    def _open(self) -> None:
        w = self.worker
        used0, starts0 = w.spares_used, len(w.start_s)
        t = time.perf_counter()
        w.ensure()
        if self._opened_gen == w.generation:
            return
        t_open = time.perf_counter()
        timeline.mark("session_open_request")  # pickling the payload (sharing its CUDA tensors) and sending follow
        reply = w.request(dict(self.payload, op="open", session=self.sid, defer_reference=True),
                          self.options.open_timeout_s)
        collect_shared()  # the worker has copied the arguments and released its views of their staging copies
        timeline.mark("session_opened")
        if not reply.ok and w.forked and w.fork_ok:
            # a copy of the zygote could not load the plan (a module it holds differs from a fresh import):
            # workers of this op start from scratch from now on, and this one is retried that way, rather
            # than the session falling back to tuning unisolated in this process
            logger.warning("tiletune: a worker forked from the zygote could not open %s's session (%s); "
                           "starting its workers from scratch", self.payload.get("name") or "an op", str(reply.error)[:300])
            self.stats["fork_refused_session"] = True
            spares = len(w.spares)
            w.fork_ok = False
            w.keep_spares(0)
            w.kill()
            w.start()
            if spares:
                w.keep_spares(spares)
            self.stats["worker_forked"] = bool(w.forked)
            reply = w.request(dict(self.payload, op="open", session=self.sid, defer_reference=True),
                              self.options.open_timeout_s)
            collect_shared()
        if not reply.ok:
            raise Unshippable(f"the worker could not open the session: {reply.error}")
        self._opened_gen = w.generation
        self._compiled.clear()
        self._sent.clear()
        self._checks_in_gen = 0
        self.stats.setdefault("arg_copy_s", []).append(round(float(reply.body.get("copy_s", 0.0)), 4))
        if self._fault_at is not None and self.stats["faults"]:  # what the last fault cost until now
            now = time.perf_counter()
            self.stats["faults"][-1].update({
                "lost_s": round(now - self._fault_at, 4),
                "spare": w.spares_used > used0,
                "spare_wait_s": round(w.start_s[-1], 4) if w.spares_used > used0 and len(w.start_s) > starts0 else None,
                "start_s": round(t_open - t, 4),
                "open_s": round(now - t_open, 4),
            })
            self._fault_at = None

    def _restarted(self, fault: WorkerFault, order: int | None, since: float | None = None) -> None:
        """Record a fault; ``since``: perf_counter when the failed request was sent (the fault's
        ``waited_s`` is what the watchdog or the death cost). Raises the spares kept (one more per
        fault of the session, up to ``max_spares``): they start now, before the next one is needed."""
        self.stats["worker_restarts"] += 1
        entry: dict[str, Any] = {"order": order, "kind": fault.kind, "message": str(fault)[:500]}
        if since is not None:
            entry["waited_s"] = round(time.perf_counter() - since, 4)
        if fault.kind == "timeout" and fault.deadline_s is not None:  # what the watchdog waited for, and how long
            entry.update({"phase": fault.phase, "deadline_s": round(fault.deadline_s, 4)})
        if self.worker.xids:  # the GPU's memory faults met at the kernel's deadline
            entry["xids"] = list(self.worker.xids)
        launched = self.worker.marks.get("launched") if since is not None else None
        if launched is not None:
            entry["launched_s"] = round(launched, 4)  # from sending to the kernel's launch
            if fault.kind == "fatal" and "waited_s" in entry:
                self._fatal_kernel_max_s = max(self._fatal_kernel_max_s, entry["waited_s"] - launched)
        for k in ("check_s", "probe_s"):  # a fatal error: the check's time in the worker, its context probe
            v = fault.info.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                entry[k] = round(float(v), 4)
        self.stats["faults"].append(entry)
        self._fault_at = time.perf_counter()
        if order is not None:
            self._ok.pop(order, None)
        if self.options.spare:
            o = self.options
            want = min(max(1, o.max_spares), max(1, o.start_spares) + len(self.stats["faults"]))
            self.worker.keep_spares(max(want, len(self.worker.spares)))
            self.stats["spares_max"] = max(self.stats.get("spares_max", 1), want)
        logger.info("tiletune worker fault (%s) on candidate %s: %s", fault.kind, order, str(fault).splitlines()[0])

    def _deadline(self, launches: int) -> float:
        o = self.options
        if self._best_us is None:
            return o.first_watchdog_s
        return max(o.watchdog_floor_s, o.watchdog_factor * launches * (self._best_us + o.flush_us) * 1e-6)

    def _check_watch(self) -> tuple[float, dict[str, float] | None]:
        """The watchdog of a check: (deadline until its kernel is launched, deadlines from each phase
        the worker reports, see :mod:`tiletune.devices.launch_marks`).

        Before anything of the session is timed, ``first_watchdog_s`` for the whole check. Afterwards
        the kernel itself (launch to end) gets :meth:`_kernel_deadline`; what comes before it (the
        guard's set-up, module loads and cuTile's launch path: a few tenths of a second for the first
        check in a new worker) and after it (the reference and the comparison) are no place for an
        endless kernel and get generous deadlines: ``check_slack_factor`` x the slowest such phase
        so far in the session, at least ``check_slack_s`` before the launch (and at least the whole
        check's former deadline, which stands alone for a worker that reports no phases) and
        ``check_after_s`` after it. Compiles
        are covered by the worker's heartbeats (see :meth:`_compile_allowance`)."""
        o = self.options
        if self._best_us is None:
            return o.first_watchdog_s, None
        whole = self._deadline(1) + self._check_slack()
        load = max(whole, o.check_slack_factor * self._load_max_s)
        after = max(o.check_after_s, o.check_slack_factor * self._after_max_s)
        return load, {"launched": self._kernel_deadline(), "ran": after}

    def _kernel_deadline(self) -> float:
        """How long a check's kernel may run from its launch: ``max(kernel_floor_s, watchdog_factor x``
        the slowest median so far (plus the flush), ``check_slack_factor x`` the slowest checked kernel
        so far, twice the slowest fatal report so far where the GPU's Xids are not known to reach this
        process), plus, while a killed worker is still being torn down (a kernel that hung there holds
        the GPU until its context is gone), what is left of 1.5x the slowest teardown so far (at least
        ``check_slack_s``): a teardown that began seconds before the launch has mostly passed."""
        o = self.options
        slow = self._slow_us if self._slow_us is not None else (self._best_us or 0.0)
        # a fault the GPU reports late is not taken for a hang: twice the slowest report so far, unless the
        # GPU's own word on faults (Xids) has been seen to reach this process, which then decides at the deadline
        late = 0.0 if self._xid is not None and self._xid.proven else 2.0 * self._fatal_kernel_max_s
        d = max(o.kernel_floor_s, o.watchdog_factor * (slow + o.flush_us) * 1e-6, o.check_slack_factor * self._kernel_max_s,
                late)
        since = self.worker.reaping_for_s()
        if since is not None:  # what is left of the teardown, expected from the slowest one so far
            d += max(o.check_slack_s, 1.5 * max(self.worker.reap_s or [0.0]) - since)
        return d

    def _check_slack(self) -> float:
        """What a check may take besides its launch when its phases are not reported: ``check_slack_s``
        for the first check in a worker (its first launches load modules), afterwards
        ``check_slack_factor`` x the slowest check so far, within ``[check_slack_min_s, check_slack_s]``."""
        o = self.options
        if self._checks_in_gen == 0:
            return o.check_slack_s
        return min(o.check_slack_s, max(o.check_slack_min_s, o.check_slack_factor * self._check_max_s))

    def _note_marks(self, marks: Mapping[str, float], total_s: float) -> None:
        """Keep the phases of an answered check (seconds from sending, as the caller saw them)."""
        launched, ran = marks.get("launched"), marks.get("ran")
        if launched is None:
            return
        self.stats.setdefault("check_load_s", []).append(round(launched, 4))
        self._load_max_s = max(self._load_max_s, launched)
        if ran is not None:
            self._kernel_max_s = max(self._kernel_max_s, ran - launched)
            self._after_max_s = max(self._after_max_s, total_s - ran)

    def _compile_allowance(self) -> float:
        return self.options.compile_timeout_s + self.options.compile_slack_s

    def _wire(self, cand: Candidate) -> tuple:
        return candidate_wire(cand.order, cand.config, cand.is_baseline)

    def _event_for(self, orders: Sequence[int], limit: float) -> tuple[int, Any]:
        """The next compile event of this session for one of ``orders`` (with the worker generation
        it came from); events for other candidates are kept for whoever waits for them."""
        while True:
            for o in orders:
                got = self._stash.pop(o, None)
                if got is not None:
                    return got
            ev = self.worker.next_event(limit)
            if ev.session == self.sid:
                self._stash[ev.order] = (self.worker.generation, ev)
                if self.worker.generation != self._gen0:  # compiled again in a worker that took over: what it cost
                    st = self.stats
                    st["recompiled"] = st.get("recompiled", 0) + 1
                    st["recompiled_assembled"] = st.get("recompiled_assembled", 0) + (1 if ev.assembled else 0)
                    st["recompile_s"] = round(st.get("recompile_s", 0.0) + float(ev.seconds or 0.0), 4)

    def _ensure_compiled(self, cand: Candidate) -> None:
        """After a worker restart, compile ``cand`` in the new worker before it runs there; in the same
        request every other candidate that may still run and is not compiled there yet (fastest
        first), so the rest of the session waits for no compile of its own."""
        self._open()
        if cand.order in self._compiled:
            self._prepare()
            return
        if cand.order not in self._sent:
            rest = sorted((c for o, c in self._ok.items() if o not in self._sent and o != cand.order),
                          key=lambda c: (self._median.get(c.order, float("inf")), c.order))
            batch = [cand, *rest]
            self._sent.update(c.order for c in batch)
            self.worker.request({"op": "compile", "session": self.sid, "candidates": [self._wire(c) for c in batch]},
                                30.0)
        self._prepare()  # while those compile; before the check's watchdog starts
        limit = self.options.compile_timeout_s + self.options.compile_slack_s
        while True:
            gen, ev = self._event_for([cand.order], limit)
            if gen != self.worker.generation:
                continue  # a result from a worker that has since been replaced
            self._compiled.add(ev.order)
            self._compile_s[ev.order] = float(ev.seconds or 0.0)
            if ev.status is not Status.OK:
                raise CandidateFault(ev.status, f"recompiling in a new worker failed: {ev.reason}")
            return

    def _prepare(self) -> None:
        """Have the worker run the session's reference, once per worker generation (deferred at the open,
        so the session's first compiles start before it). Its time counts against the open's timeout,
        never against a check's watchdog; a reference that raises fails the session like an open that
        fails."""
        w = self.worker
        if self._prepared_gen == w.generation:
            return
        msg: dict[str, Any] = {"op": "prepare", "session": self.sid}
        if self._expected is not None:  # the worker could not run the reference before: the caller's answer
            msg["expected"] = self._expected
        reply = w.request(msg, self.options.open_timeout_s)
        if not reply.ok and self._expected is None:
            # the reference fails in the worker: run it here, where the op was defined (raises what it raises
            # here, e.g. a reference returning the wrong number of values), and send its answer
            logger.info("tiletune: %s's reference failed in the worker (%s); running it in this process",
                        self.payload.get("name") or "an op", str(reply.error).splitlines()[0][:200])
            self._expected = self._reference_here()
            collect_shared()
            reply = w.request({"op": "prepare", "session": self.sid, "expected": self._expected},
                              self.options.open_timeout_s)
            collect_shared()
        if not reply.ok:
            raise Unshippable(f"the worker could not open the session: {reply.error}")
        self._prepared_gen = w.generation
        self.stats.setdefault("reference_s", []).append(round(float(reply.body.get("seconds", 0.0)), 4))

    def _reference_here(self) -> tuple[Any, ...]:
        """The reference's answer computed in this process, on clones of the written arguments (the caller's
        tensors are not touched: nothing of the session has run on them)."""
        from tiletune.devices.verify import ArgGuard, Checker

        p = self.payload
        guard = ArgGuard(p["args"], p["writes"], p["inplace"], bands=False)
        checker = Checker(p["reference"], guard, p["tolerance"])
        return tuple(checker.expected or ())

    def _xid_watch(self) -> Any:
        """The GPU's Xid watch for this session's checks (None: not a real GPU's worker, or NVML gives
        no events here); ``stats["xid_watch"]`` says which."""
        if not self._xid_tried:
            self._xid_tried = True
            if self.options.xid_watch:
                self._xid = xid.watch_for(self.worker.device_index)
                self._xid_seen0 = len(self._xid.seen) if self._xid is not None else 0
            self.stats["xid_watch"] = self._xid is not None
        return self._xid

    def _fault_status(self, fault: WorkerFault) -> Status:
        return Status.TIMEOUT if fault.kind == "timeout" else Status.LAUNCH_ERROR

    # -- TuningSession ---------------------------------------------------------------------
    def compile(self, candidates: Sequence[Candidate]) -> Iterator[CompileOutcome]:
        """Compile in the worker; yield outcomes as they arrive.

        A worker that dies or stops answering while compiling is replaced and the candidates still
        pending are sent again, then one at a time: the one in flight when it dies again is the
        culprit and fails (``compiling took the worker down``).
        """
        if self._ahead is not None and not self._ahead_stopped:
            # the caller compiled ahead while the worker started: it starts no more; what it is assembling
            # is claimed (compile_pool), so the worker's compiles of those wait for their cubins rather than
            # assemble them again, and everything else compiles in the worker from now on
            self._ahead.stop()
            self._ahead_stopped = True
        pending = {c.order: c for c in candidates}
        serial = False
        need_send = True
        sent_gen = -1
        in_flight: list[int] = []
        limit = self.options.compile_timeout_s + self.options.compile_slack_s
        while pending:
            try:
                if need_send or not self.worker.alive or self.worker.generation != sent_gen:
                    self._open()
                    batch = list(pending.values())[:1] if serial else list(pending.values())
                    in_flight = [c.order for c in batch]  # before sending: it may die before it answers
                    need_send = False
                    sent_gen = self.worker.generation
                    self._sent.update(in_flight)
                    timeline.mark("session_compile_sent", n=len(batch))
                    self.worker.request(
                        {"op": "compile", "session": self.sid, "candidates": [self._wire(c) for c in batch]}, 30.0
                    )
                    self._prepare()  # the reference runs in the worker while these compile
                gen, ev = self._event_for(list(pending), limit)
            except WorkerFault as fault:
                self._restarted(fault, None)
                need_send = True
                if serial and in_flight and in_flight[0] in pending:
                    culprit = pending.pop(in_flight[0])
                    status = Status.TIMEOUT if fault.kind == "timeout" else Status.COMPILE_ERROR
                    yield CompileOutcome(culprit, status, 0.0, f"compiling took the worker down: {fault}")
                serial = True
                continue
            c = pending.pop(ev.order)
            if ev.status is Status.OK:
                self._ok[c.order] = c
                if gen == self.worker.generation:
                    self._compiled.add(ev.order)
                    self._compile_s[ev.order] = float(ev.seconds or 0.0)
            yield CompileOutcome(c, ev.status, ev.seconds, ev.reason, cpu_s=ev.cpu_s)
            if serial and not any(o in pending for o in in_flight):
                need_send = True  # the next one
        if self._ahead is not None and self._ahead_stopped:  # every compile is in: its figures (done by now)
            ahead, self._ahead = self._ahead, None
            self.stats.update(ahead.finish(self.options.ahead_wait_s))

    def check(self, candidate: Candidate) -> CheckOutcome:
        since = None
        try:
            self._ensure_compiled(candidate)
            watch = self._xid_watch()
            since = time.perf_counter()
            first, phases = self._check_watch()
            reply = self.worker.request(
                {"op": "check", "session": self.sid, "candidate": self._wire(candidate)},
                first,
                compile_allowance=self._compile_allowance(),
                phases=phases,
                xid=watch,
            )
            if not reply.ok:
                self._checks_in_gen += 1
                self._ok.pop(candidate.order, None)
                return CheckOutcome(Status.LAUNCH_ERROR, reply.error)
            secs = reply.body.get("seconds")
            if isinstance(secs, (int, float)) and not isinstance(secs, bool):  # the first launch and the check
                self.stats.setdefault("check_s", []).append(float(secs))
                self._check_max_s = max(self._check_max_s, float(secs))
                if self._checks_in_gen == 0:  # the first check in this worker (module loads, lazy set-up)
                    self.stats.setdefault("first_check_s", []).append(float(secs))
            self._checks_in_gen += 1
            self._note_marks(self.worker.marks, time.perf_counter() - since)
            status, reason = status_from(reply)
            if status is not Status.OK:
                self._ok.pop(candidate.order, None)
            return CheckOutcome(status, reason)
        except WorkerFault as fault:
            self._restarted(fault, candidate.order, since)
            return CheckOutcome(self._fault_status(fault), f"worker {fault.kind}: {fault}")
        except CandidateFault as fault:
            self._ok.pop(candidate.order, None)
            return CheckOutcome(fault.status, str(fault))
        except ProtocolError as exc:
            self.worker.kill()
            self._restarted(WorkerFault("protocol", str(exc)), candidate.order)
            return CheckOutcome(Status.LAUNCH_ERROR, f"worker protocol: {exc}")

    def sample(self, candidate: Candidate, n: int) -> list[float]:
        since = None
        try:
            self._ensure_compiled(candidate)
            self._wait_reaped()
            since = time.perf_counter()
            reply = self.worker.request(
                {"op": "sample", "session": self.sid, "candidate": self._wire(candidate), "n": n},
                self._deadline(n + 2),
            )
            if not reply.ok:
                raise CandidateFault(Status.LAUNCH_ERROR, reply.error)
            samples = samples_from(reply, n)
        except WorkerFault as fault:
            self._restarted(fault, candidate.order, since)
            raise CandidateFault(self._fault_status(fault), f"worker {fault.kind}: {fault}") from None
        except ProtocolError as exc:
            self.worker.kill()
            self._restarted(WorkerFault("protocol", str(exc)), candidate.order)
            raise CandidateFault(Status.LAUNCH_ERROR, f"worker protocol: {exc}") from None
        except CandidateFault:
            self._ok.pop(candidate.order, None)
            raise
        if samples:
            med = sorted(samples)[len(samples) // 2]
            self._median[candidate.order] = med
            if self._best_us is None or med < self._best_us:
                self._best_us = med
            if self._slow_us is None or med > self._slow_us:
                self._slow_us = med
        return samples

    def _wait_reaped(self) -> None:
        """Before timing: wait until the workers killed in this session are gone (a kernel that hung
        runs on the GPU until its process's context is torn down, and would skew the samples)."""
        if not self.stats["faults"]:
            return
        waited = self.worker.wait_reaped(self.options.reap_timeout_s)
        if waited >= 1e-4:
            self.stats["faults"][-1]["reap_wait_s"] = round(
                self.stats["faults"][-1].get("reap_wait_s", 0.0) + waited, 4)

    def finish(self, winner: Candidate | None) -> None:
        """Close the worker-side session (the caller's tensors were never touched); the worker drops what
        it held of the session, then this process collects the CUDA memory it had shared
        (``shares_held`` in the stats: the worker's IPC views still alive after the close, 0 normally)."""
        timeline.mark("session_finish")
        if self._ahead is not None:  # never compiled (or not to the end): nothing more of it is wanted
            self._ahead.finish(0.0)
            self._ahead = None
        try:
            if self.worker.alive and self._opened_gen == self.worker.generation:
                try:
                    reply = self.worker.request({"op": "close", "session": self.sid}, 60.0)
                    held = reply.body.get("shares_held")
                    if isinstance(held, int) and not isinstance(held, bool):
                        self.stats["shares_held"] = held
                    got = reply.body.get("stats") if reply.ok else None
                    if isinstance(got, dict):  # the worker session's compile-ahead counters
                        self.stats.update({k: int(v) for k, v in got.items()
                                           if k in WORKER_STATS and isinstance(v, int) and not isinstance(v, bool)})
                except WorkerFault as fault:
                    self._restarted(fault, None)
        finally:
            collect_shared()
            self.stats["worker_starts"] = self.worker.starts
            self.stats["spares_used"] = self.worker.spares_used - self._spares_used0
            if self._xid is not None:  # every Xid the GPU reported during the session (its faults', any process's)
                try:
                    self._xid.mark()
                    self.stats["xids_seen"] = list(self._xid.seen[self._xid_seen0:])
                except Exception:
                    pass
            reaped = self.worker.reap_s[self._reaped0:]
            if reaped:
                self.stats["reap_s"] = list(reaped)  # SIGKILL to gone, per killed worker (in the background)
            keep = max(1, self.options.start_spares)
            if self.options.spare and len(self.worker.spares) > keep:
                self.worker.keep_spares(keep)  # the extra spares were for this session's run of faults
            self.worker.lock.release()
