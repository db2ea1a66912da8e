"""Keys answered provisionally (a neighbour's config, the default config), recorded to be tuned later.

Each database has a pending file beside it (``<database>.pending.jsonl``): one JSON object a line,
appended when a key is answered provisionally, holding what ``tiletune tune --pending`` needs to tune
it in another process: the op's name and origin (for a library op: its name and regime), the stored
key, and the call's arguments as specs (tensors by shape, strides and dtype; scalars by value). A key
is taken off the file once it is tuned. JSON only; a line that cannot be read is skipped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
import threading
import time
from typing import TYPE_CHECKING, Any, Iterable, Iterator

from tiletune.keys import _dtype_name, is_tensor

if TYPE_CHECKING:  # pragma: no cover
    from tiletune.resolve.problem import Choice, Problem
    from tiletune.store import TuningDB

logger = logging.getLogger("tiletune")

__all__ = ["pending_path", "record", "read", "remove", "arg_specs", "materialize", "identity_of"]

SUFFIX = ".pending.jsonl"
_lock = threading.Lock()


def pending_path(db: "TuningDB | None") -> pathlib.Path | None:
    """The pending file of a database (None for an in-memory one or none)."""
    if db is None or db.path is None:
        return None
    return pathlib.Path(str(db.where) + SUFFIX)


def arg_specs(args: Iterable[Any]) -> list[dict[str, Any]] | None:
    """JSON specs of a call's arguments, or None when one of them cannot be described."""
    out: list[dict[str, Any]] = []
    for a in args:
        if isinstance(a, (bool, int, float, str)) or a is None:
            out.append({"value": a})
        elif is_tensor(a):
            out.append({"tensor": {"shape": [int(s) for s in a.shape], "stride": [int(s) for s in a.stride()],
                                   "dtype": _dtype_name(a.dtype)}})
        elif type(a).__name__ == "dtype":
            out.append({"dtype": _dtype_name(a)})
        else:
            return None
    return out


def materialize(specs: list[dict[str, Any]], device: str = "cuda") -> tuple[Any, ...]:
    """Fresh arguments from their specs: tensors of the recorded shapes and strides (floats normal,
    integers zero), scalars as recorded."""
    import torch

    out: list[Any] = []
    for s in specs:
        if "tensor" in s:
            t = s["tensor"]
            dtype = getattr(torch, t["dtype"])
            x = torch.empty_strided(tuple(t["shape"]), tuple(t["stride"]), dtype=dtype, device=device)
            if x.is_floating_point():
                x.normal_()
            else:
                x.zero_()
            out.append(x)
        elif "dtype" in s:
            out.append(getattr(torch, s["dtype"]))
        else:
            out.append(s["value"])
    return tuple(out)


def identity_of(entry: dict[str, Any]) -> tuple[str, str, str]:
    return str(entry.get("kernel_id")), str(entry.get("space_hash")), str(entry.get("key"))


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock, open(str(path) + ".lock", "a") as fh:
        try:
            import fcntl

            fcntl.flock(fh, fcntl.LOCK_EX)
        except (ImportError, OSError):  # pragma: no cover - no flock: this process's lock only
            pass
        yield


def record(problem: "Problem", choice: "Choice") -> bool:
    """Append the problem to its database's pending file; False when there is none or it failed."""
    db = problem.database.db
    path = pending_path(db)
    if path is None:
        return False
    ident = problem.identity
    entry = {
        "name": problem.name,
        "origin": problem.spec.origin,
        "kernel_id": ident.kernel_id,
        "space_hash": ident.space_hash,
        "key": ident.key,
        "arch": problem.arch,
        "args": arg_specs(problem.args),
        "source": choice.source,
        "neighbour": choice.neighbour,
        "config": choice.config.as_dict(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        line = json.dumps(entry, sort_keys=True, allow_nan=False, default=str)
        with _locked(path), open(path, "a") as fh:
            fh.write(line + "\n")
    except (OSError, ValueError, TypeError) as exc:
        logger.debug("%s: pending key not recorded (%s)", problem.name, exc)
        return False
    return True


def read(path: pathlib.Path | None) -> list[dict[str, Any]]:
    """The pending entries of a file, one per identity (the latest), in the order first met."""
    if path is None or not path.exists():
        return []
    seen: dict[tuple[str, str, str], dict[str, Any]] = {}
    try:
        text = path.read_text()
    except OSError:
        return []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(entry.get("key"), str):
            seen[identity_of(entry)] = entry
    return list(seen.values())


def remove(path: pathlib.Path | None, done: Iterable[tuple[str, str, str]]) -> int:
    """Take the tuned identities off the file; returns how many entries remain."""
    if path is None or not path.exists():
        return 0
    done = set(done)
    with _locked(path):
        kept = [e for e in read(path) if identity_of(e) not in done]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(e, sort_keys=True, default=str) + "\n" for e in kept))
        os.replace(tmp, path)
    return len(kept)
