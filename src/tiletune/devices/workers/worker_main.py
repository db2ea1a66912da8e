"""The tuning worker process: compiles, checks and times candidates for its caller.

Started by :class:`tiletune.devices.workers.client.WorkerProcess` as ``python -m tiletune.devices.workers.worker_main``
(a fresh interpreter: the caller's ``__main__`` script is never re-run here). It connects back to the
caller over a Unix socket, then serves requests one at a time on its main thread, while compilation
runs in a background thread and streams ``compiled`` events.

It hosts an ordinary :class:`~tiletune.devices.backends.base.Backend` (the live cuTile one, or a shipped
simulated one in tests) and drives that backend's session primitives on its *own copies* of the
caller's arguments. After any launch error it probes its CUDA context; when the context is gone (a
sticky error: illegal or misaligned address, device-side trap) it reports the error as fatal and
exits, and the caller starts a new worker.

The caller's CUDA tensors arrive as CUDA IPC views (of staging copies, see
:mod:`tiletune.devices.workers.shipping`), each keeping a reference counter in the caller above zero
until it is freed here. The worker frees them as early as it can: the arguments as soon as it has
copied them (opening a session), whatever else a session held (tensors that a plan or reference
shipped by value captured) when the session closes, and everything before it answers ``exit``
(:func:`os._exit` runs no destructor, so a view still alive then would never be released). The
replies to ``close`` and ``exit`` say how many views it still holds (``shares_held``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from typing import Any


#: CUDA errors after which a context is unusable (CUDA's "sticky" errors); matched in error texts.
STICKY_CUDA_ERRORS = (
    "illegal memory access",
    "misaligned address",
    "not supported on global/shared address space",
    "illegal instruction",
    "unspecified launch failure",
    "device-side assert",
    "hardware stack error",
    "invalid program counter",
    "launch timed out",
    "uncorrectable ecc",
    "trap",
    "Failed to get a CUDA context",
)


def sticky_error(text: str) -> bool:
    """Whether an error text names a CUDA error that leaves the context unusable."""
    low = text.lower()
    return "acceleratorerror" in low or any(s.lower() in low for s in STICKY_CUDA_ERRORS)


def _context_ok(torch: Any, device_index: int) -> str | None:
    """None when the worker's CUDA context still works, else the error that shows it does not."""
    try:
        torch.cuda.synchronize(device_index)
        x = torch.ones(1, device=f"cuda:{device_index}")
        float((x + 1).item())
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _storage_bytes(t: Any) -> Any:
    import torch

    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


class _Served:
    """One worker-side tuning session.

    Besides the backend's session it keeps a pristine copy of every read-only tensor argument: after a
    candidate's checked run an input that changed fails that candidate ("wrote into its input"), and
    inputs are put back after every run, so one candidate's stray write never skews the next.
    """

    def __init__(self, session: Any, args: tuple, written: set[int]) -> None:
        self.session = session
        self.candidates: dict[int, Any] = {}
        self.compile_threads: list[threading.Thread] = []
        self.args = args
        self.pristine = {
            i: _storage_bytes(a).clone()
            for i, a in enumerate(args)
            if i not in written and hasattr(a, "untyped_storage")
        }

    def changed_inputs(self) -> list[int]:
        """Positions of read-only inputs that differ from their pristine copy (restored here)."""
        changed = []
        for i, saved in self.pristine.items():
            now = _storage_bytes(self.args[i])
            if not bool((now == saved).all()):
                changed.append(i)
                now.copy_(saved)
        return changed

    def restore_inputs(self) -> None:
        for i, saved in self.pristine.items():
            _storage_bytes(self.args[i]).copy_(saved)

    def release(self) -> None:
        """Drop everything of the session (the backend's session with its plan and reference, the
        arguments, the candidates), whoever still holds this object."""
        self.session = None
        self.args = ()
        self.pristine = {}
        self.candidates = {}
        self.compile_threads = []


def drop_shares() -> int:
    """Free the caller's CUDA IPC views this process no longer uses but still holds through a reference
    cycle (the garbage collector runs only then: a full collection costs milliseconds); returns how
    many views are still held afterwards."""
    from tiletune.devices.workers.shipping import held_shares

    if held_shares():
        import gc

        gc.collect()
    return held_shares()


class Worker:
    """The request loop (one per process)."""

    def __init__(self, conn: Any) -> None:
        from tiletune.devices.workers.protocol import encode_reply

        self.conn = conn
        self.encode = encode_reply
        self.send_lock = threading.Lock()
        self.backends: dict[str, Any] = {}
        self.sessions: dict[int, _Served] = {}
        self.device_index = 0

    def send(self, msg: dict) -> None:
        data = self.encode(msg)
        with self.send_lock:
            self.conn.send_bytes(data)

    # -- requests --------------------------------------------------------------------------
    def serve(self) -> None:
        from tiletune.devices import timeline
        from tiletune.devices.workers.shipping import loads

        while True:
            try:
                raw = self.conn.recv_bytes()
            except (EOFError, OSError):
                return  # the caller is gone
            rid = int.from_bytes(raw[:8], "little", signed=True)
            timeline.mark("worker_read", bytes=len(raw))  # loading it (CUDA IPC views, a plan by value) follows
            try:
                msg = loads(raw[8:])
            except Exception as exc:  # an unloadable request (e.g. a plan that cannot be imported here)
                self.send({"id": rid, "ok": False, "error": f"cannot load request: {type(exc).__name__}: {exc}"})
                continue
            op = msg.get("op")
            timeline.mark("worker_recv", op=op)
            if op == "exit":  # release the caller's memory before answering: the caller collects then
                self.send({"id": rid, "ok": True, "shares_held": self.release_all()})
                return
            try:
                handler = getattr(self, f"op_{op}")
                reply = handler(msg)
            except Exception as exc:
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                         "trace": traceback.format_exc()[-2000:]}
            if op in ("check", "sample", "close", "open") and not reply.get("fatal") and (
                not reply.get("ok") or reply.get("status") == "launch_error"
            ):
                t_probe = time.perf_counter()
                dead = self._dead_context(msg, str(reply.get("error") or reply.get("reason") or ""))
                if dead is not None:  # a sticky CUDA error: this worker is done for
                    _flush_stores(0.5)  # cubins compiled here reach the disk cache for the next worker
                    reply = {"ok": False, "fatal": True,
                             "error": f"{reply.get('error') or reply.get('reason')} (CUDA context lost: {dead})",
                             "check_s": reply.get("seconds"), "marks": reply.get("marks"),
                             "probe_s": round(time.perf_counter() - t_probe, 4)}
            reply["id"] = rid
            if _trace_enabled():
                sys.stderr.write(f"tiletune worker: {op} -> {str(reply)[:300]}\n")
            self.send(reply)
            timeline.mark("worker_reply", op=op)
            if reply.get("fatal"):
                sys.stderr.write(f"tiletune worker: fatal: {reply.get('error')}\n")
                sys.stderr.flush()
                os._exit(3)

    def release_all(self) -> int:
        """Drop every session (the caller is leaving); returns the IPC views still held (see :func:`drop_shares`)."""
        sessions, self.sessions = list(self.sessions.values()), {}
        for served in sessions:
            served.release()
        del sessions
        return drop_shares()

    def op_ping(self, msg: dict) -> dict:
        return {"ok": True, "pid": os.getpid()}

    def op_hello(self, msg: dict) -> dict:
        self.device_index = int(msg.get("device_index", 0))
        backend = self._backend(msg.get("backend"))
        info = backend.device_info(self.device_index)
        # no versions here: reading them imports cuTile's compiler and runs tileiras (the warm-up thread
        # does both in the background); nobody reads them off this reply
        return {"ok": True, "pid": os.getpid(), "device": info.as_dict()}

    def _backend(self, spec: Any) -> Any:
        if spec is None or spec == "cutile":
            be = self.backends.get("cutile")
            if be is None:
                from tiletune.devices.backends.cutile import CutileBackend

                be = self.backends["cutile"] = CutileBackend()
                be.torch.cuda.set_device(self.device_index)
                be.torch.cuda.init()
                from tiletune.devices import timeline

                timeline.mark("worker_cuda_ready")
                dev = f"cuda:{self.device_index}"
                threading.Thread(target=_warm, args=(be.torch, dev), name="tiletune-worker-warm", daemon=True).start()
            return be
        return spec  # a shipped backend object (tests)

    def op_open(self, msg: dict) -> dict:
        from tiletune.devices.backends.base import Launch
        from tiletune.devices.plans import PlanCache
        from tiletune.devices.workers.shipping import own_copy

        from tiletune.devices import timeline

        sid = int(msg["session"])
        try:
            backend = self._backend(msg.get("backend"))
            timeline.mark("worker_open_backend")
            t0 = time.perf_counter()
            args = tuple(own_copy(a) for a in msg["args"])
            torch = getattr(backend, "torch", None)
            if torch is not None:
                torch.cuda.synchronize(int(msg["device_index"]))
            copy_s = time.perf_counter() - t0
            timeline.mark("worker_open_args")
        finally:
            del msg["args"]  # drop the IPC views of the caller's memory now (copied, or failed)
        plan = msg["plan"]

        def spec_for(cfg: Any) -> Launch:
            spec = plan(cfg, *args)
            return spec if isinstance(spec, Launch) else Launch(*spec)

        # the caller asks for the reference with "prepare" once it has sent the first compiles: the
        # reference (a first cuBLAS call, a float32 GEMM) then runs while they compile
        defer = {"defer_reference": True} if msg.get("defer_reference") and getattr(
            backend, "defers_reference", False) else {}
        session = backend.open_session(
            PlanCache(spec_for),  # the launch plan is evaluated once per candidate
            args,
            device_index=int(msg["device_index"]),
            writes=tuple(msg["writes"]),
            inplace=tuple(msg["inplace"]),
            reference=msg.get("reference"),
            tolerance=msg.get("tolerance"),
            name=str(msg.get("name", "op")),
            **defer,
        )
        timeline.mark("worker_open_session")
        written = set(msg["writes"]) | set(msg["inplace"])
        self.sessions[sid] = _Served(session, args, written)
        return {"ok": True, "copy_s": copy_s}

    def op_prepare(self, msg: dict) -> dict:
        """Run the session's deferred reference (a no-op for a session without one), or, with ``expected``,
        take the reference's answer the caller computed (copied: the caller's memory is not held)."""
        from tiletune.devices import timeline
        from tiletune.devices.workers.shipping import own_copy

        served = self.sessions[int(msg["session"])]
        prepare = getattr(served.session, "prepare", None)
        t0 = time.perf_counter()
        try:
            expected = msg.get("expected")
            if expected is not None:
                expected = tuple(own_copy(t) for t in expected)
        finally:
            msg.pop("expected", None)  # drop the IPC views of the caller's memory now
        if prepare is not None:
            prepare(expected) if expected is not None else prepare()
        timeline.mark("worker_prepared")
        return {"ok": True, "seconds": round(time.perf_counter() - t0, 4)}

    def _candidates(self, served: _Served, wire: list) -> list[Any]:
        from tiletune.devices.backends.base import Candidate
        from tiletune.space.spaces import Config

        out = []
        for order, names, values, hints, is_base in wire:
            c = served.candidates.get(order)
            if c is None:
                cfg = Config(dict(zip(names, values)), hints)
                c = served.candidates[order] = Candidate(cfg, int(order), bool(is_base))
            out.append(c)
        return out

    def op_compile(self, msg: dict) -> dict:
        sid = int(msg["session"])
        served = self.sessions[sid]
        cands = self._candidates(served, msg["candidates"])

        def run() -> None:
            try:
                for outcome in served.session.compile(cands):
                    self.send({"event": "compiled", "session": sid, "order": outcome.candidate.order,
                               "status": outcome.status.value, "seconds": float(outcome.seconds or 0.0),
                               "reason": outcome.reason, "cpu_s": float(getattr(outcome, "cpu_s", None) or 0.0),
                               "assembled": getattr(outcome, "assembled", None)})
            except Exception as exc:  # the compile machinery itself broke: fail what is left
                sys.stderr.write(traceback.format_exc())
                for c in cands:
                    self.send({"event": "compiled", "session": sid, "order": c.order, "status": "compile_error",
                               "seconds": 0.0, "reason": f"compile pool failed: {type(exc).__name__}: {exc}"})

        t = threading.Thread(target=run, name="tiletune-worker-compile", daemon=True)
        served.compile_threads.append(t)
        t.start()
        return {"ok": True}

    def _torch_of(self, msg: dict) -> Any:
        """The torch module of the live backend serving this request (None for simulated ones)."""
        served = self.sessions.get(msg.get("session", -1)) if isinstance(msg.get("session"), int) else None
        be = getattr(served, "session", None)
        torch = getattr(be, "torch", None)
        if torch is None:
            torch = getattr(self.backends.get("cutile"), "torch", None)
        return torch

    def _dead_context(self, msg: dict, error: str) -> str | None:
        """Why the CUDA context cannot be used after a request failed with ``error``, or None
        (always None for simulated backends): a probe that fails, or an error of the sticky kind."""
        torch = self._torch_of(msg)
        if torch is None:
            return None
        if sticky_error(error):  # no probe: on a lost context it only adds to the caller's wait
            return "sticky CUDA error (the context cannot be trusted after it)"
        return _context_ok(torch, self.device_index)

    def _heartbeat(self, sid: int) -> Any:
        """While a request runs: a ``busy`` event every 0.2 s in which a compile is running here (a first
        launch compiling its candidate again), so the caller's watchdog counts kernel time only.
        Returns the stop event."""
        from tiletune.devices.compile_pool import compiling_now

        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(0.2):
                if compiling_now():
                    try:
                        self.send({"event": "busy", "session": sid, "what": "compiling"})
                    except Exception:  # the caller is gone
                        return

        threading.Thread(target=beat, name="tiletune-worker-heartbeat", daemon=True).start()
        return stop

    def op_check(self, msg: dict) -> dict:
        from tiletune.devices import launch_marks

        sid = int(msg["session"])
        served = self.sessions[sid]
        cand = self._candidates(served, [msg["candidate"]])[0]
        t0 = time.perf_counter()
        marks: dict[str, float] = {}

        def on_mark(what: str) -> None:  # the caller's watchdog re-arms for the kernel, then for the verdict
            marks.setdefault(what, round(time.perf_counter() - t0, 4))
            self.send({"event": "phase", "session": sid, "what": what})

        stop = self._heartbeat(sid)
        launch_marks.listen(on_mark)
        try:
            outcome = served.session.check(cand)
        finally:
            launch_marks.listen(None)
            stop.set()
        reply: dict = {"ok": True, "status": outcome.status.value, "reason": outcome.reason,
                       "seconds": round(time.perf_counter() - t0, 4), "marks": marks}
        if outcome.status.value == "launch_error":
            return reply  # serve() probes the context
        if outcome.status.value in ("ok", "mismatch"):
            changed = served.changed_inputs()
            if changed:
                reply["status"] = "mismatch"
                reply["reason"] = (f"the kernel wrote into read-only argument(s) {changed}"
                                   + (f"; {outcome.reason}" if outcome.reason else ""))
        return reply

    def op_sample(self, msg: dict) -> dict:
        served = self.sessions[int(msg["session"])]
        cand = self._candidates(served, [msg["candidate"]])[0]
        try:
            samples = served.session.sample(cand, int(msg["n"]))
            served.restore_inputs()
        except Exception as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        return {"ok": True, "samples": [float(x) for x in samples]}

    def op_close(self, msg: dict) -> dict:
        served = self.sessions.pop(int(msg["session"]), None)
        if served is not None:
            for t in served.compile_threads:  # cubins reach cuTile's disk cache before the caller
                t.join(60.0)                  # compiles the winner for itself
            error = None
            try:
                served.session.finish(None)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
            stats = getattr(served.session, "stats", None) or {}
            served.release()  # whoever still holds the object: the session's memory goes now
            del served
            if error is not None:
                return {"ok": False, "error": error, "shares_held": drop_shares()}
            from tiletune.devices.workers.protocol import WORKER_STATS

            return {"ok": True, "shares_held": drop_shares(),
                    "stats": {k: v for k, v in stats.items() if k in WORKER_STATS and isinstance(v, int)}}
        return {"ok": True, "shares_held": drop_shares()}


def _flush_stores(timeout: float) -> None:
    """Wait (at most ``timeout``) for the cubins queued for the disk caches, when the compile pool is
    loaded here (a worker about to exit after a fatal error: the next worker finds them there)."""
    pool = sys.modules.get("tiletune.devices.compile_pool")
    if pool is not None:
        try:
            pool.flush(timeout)
        except Exception:  # noqa: BLE001 - best effort
            pass


#: dtypes whose checking kernels a new worker loads ahead (:func:`warm_checks`)
WARM_DTYPES = ("float32", "bfloat16", "float16")


def warm_checks(torch: Any, device: str, dtypes: tuple[str, ...] = WARM_DTYPES) -> dict[str, float]:
    """Run the checking machinery of a candidate's first launch (guard bands armed and verified, outputs
    poisoned, the pristine-input comparison, a reference compared, the mismatch path included) on tiny
    tensors of each of ``dtypes``, so the first check of a session in this worker (a spare taking over
    after a fault) does not load those kernels itself (CUDA loads a kernel at its first use in a
    process). Returns the seconds spent per dtype; a dtype that fails is left out (best effort).
    Tiny tensors: the GPU work is a few dozen launches of microseconds, once per worker."""
    from tiletune.devices.verify import ArgGuard, Checker, compare_tensors

    spent: dict[str, float] = {}
    for name in dtypes:
        t0 = time.perf_counter()
        try:
            dt = getattr(torch, name)
            x = torch.randn(4096 + 77, device=device).to(dt)
            y = torch.empty_like(x)
            guard = ArgGuard((x, y), (1,))
            checker = Checker(lambda a, b: a * 2, guard, None)
            moved = guard.checked_kernel_args((x, y))
            if moved is not None:
                moved[1].copy_(moved[0] * 2)
                guard.after_checked_run()
            else:
                guard.prepare_checked_run()
                y.copy_(x * 2)
            checker.compare()
            compare_tensors(y + 1, x * 2)  # the mismatch path (its reason's figures)
            saved = _storage_bytes(x).clone()
            bool((_storage_bytes(x) == saved).all())  # read-only inputs compared with their pristine copy
            guard.restore()
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)
        except Exception:  # noqa: BLE001 - the first check loads what is missing itself
            continue
        spent[name] = round(time.perf_counter() - t0, 4)
    return spent


def _warm(torch: Any, device: str) -> None:
    """A new worker's background warm-up, while it waits for its first session: the checking kernels
    (:func:`warm_checks`), then cuTile's compiler (:func:`_warm_compiler`)."""
    from tiletune.devices import timeline

    try:
        warm_checks(torch, device)
    except Exception:  # noqa: BLE001 - best effort
        pass
    timeline.mark("worker_checks_warm")
    _warm_compiler()


def _warm_compiler() -> None:
    """Load cuTile's compiler, ask ``tileiras`` its version and bytecode level and load the compile
    pool's internals, while this worker waits for its first session (as a spare, possibly long
    before): the first compile here then pays for none of it."""
    try:
        from tiletune.devices.backends.cutile import prewarm
        from tiletune.devices.compile_pool import load_internals

        from tiletune.devices import timeline

        prewarm()
        load_internals()
        timeline.mark("worker_compiler_warm")
    except Exception:  # best effort: the first compile does this itself otherwise
        pass


def _trace_enabled() -> bool:
    from tiletune import settings

    try:
        return settings.worker_trace()
    except ValueError:  # the caller checked its environment; a bad value here only loses the trace
        return False


def _preload(raw: str | None) -> None:
    """Import the modules the caller's plans need (their kernels' packages) before the first request:
    a session's plan would import them on arrival otherwise. One that fails is left to that moment."""
    if not raw:
        return
    import importlib
    import json

    for name in json.loads(raw):
        try:
            importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - the session that needs it reports it
            pass


def main() -> None:
    """Entry point: connect to the caller named in the environment and serve it."""
    from multiprocessing.connection import Client

    os.environ["TILETUNE_IN_WORKER"] = "1"
    address = os.environ["TILETUNE_WORKER_ADDRESS"]
    authkey = bytes.fromhex(os.environ.pop("TILETUNE_WORKER_AUTHKEY"))
    extra = os.environ.get("TILETUNE_WORKER_SYSPATH")
    if extra:
        import json

        for p in json.loads(extra):
            if p not in sys.path:
                sys.path.append(p)
    from tiletune.devices import timeline

    timeline.mark("worker_main")
    conn = Client(address, family="AF_UNIX", authkey=authkey)
    try:
        import torch.multiprocessing  # noqa: F401  (CUDA IPC rebuild functions)
    except ImportError:
        pass
    _preload(os.environ.get("TILETUNE_WORKER_PRELOAD"))
    timeline.mark("worker_preloaded")
    Worker(conn).serve()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
