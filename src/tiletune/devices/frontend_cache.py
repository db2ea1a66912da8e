"""A disk cache of cuTile's front end: the cubin of (kernel code, hints, launch signature, GPU arch).

cuTile compiles a kernel object on its first launch for a specialisation. Its disk cache is keyed by
the Tile IR bytecode, so even when that cache holds the cubin a fresh process first runs the front
end: it imports cuTile's compiler, asks ``tileiras`` for its version and bytecode level
(subprocesses), and lowers the Python function to bytecode. That is a few tenths of a second on the
first call of every kernel of a process, most of a served first call. This cache keys the cubin by
what the bytecode is a function of instead, so a hit skips the whole front end:

* the kernel's code: a fingerprint, made before every compile, of its Python function (its code in
  memory and its source file) and, transitively, of every global it reads (the functions it calls,
  the files of the modules it reaches, the values of the constants and module attributes it reads;
  cuda.tile itself is covered by its version). A global the fingerprint cannot describe (an
  arbitrary object) makes the kernel uncacheable here: it then always takes cuTile's own path;
* the compiler options (hints), the launch signature (cuTile's mangled name of it: dtypes, ranks,
  constants, divisibility and alias facts), the GPU arch and the calling convention;
* cuda-tile's version, where ``tileiras`` lives (path, size and modification time of each binary cuTile
  could pick) and the ``CUDA_TILE_*`` variables that can change a compile.

Entries live next to cuTile's own cache (``<cuTile cache dir>/tiletune-frontend``): with cuTile's disk
cache off this cache is off too, and clearing cuTile's folder clears it. One store holds the cubins:
where the compile went through tiletune's compile pool (every launch and tuning compile does), the
cubin is in cuTile's disk cache under cuTile's own key, and the entry is only a JSON record of that key
and the cubin's symbol, size and SHA-256: a hit reads the cubin from cuTile's database (read-only) and
checks it, an entry whose cubin cuTile evicted is a miss. Only a cubin compiled by cuTile's own path
(whose key tiletune does not see) is kept as a file beside its record. The cuTile entries served this
way are marked used in cuTile's database at exit (one write per process, off the launch path), so
cuTile's eviction sees them as used. No pickle. ``TILETUNE_FRONTEND_CACHE=0`` turns the cache off.
Tuning candidates' entries live in a folder of their own beside it (``tiletune-candidates``, the same
records and eviction): a worker that replaces one lost to a fault, or a later session, compiles them
without the front end, and a tuning session never evicts a served config's entry.
"""

from __future__ import annotations

import atexit
import hashlib
import inspect
import json
import logging
import os
import random
import sys
import threading
import types
from pathlib import Path
from typing import Any

logger = logging.getLogger("tiletune")

__all__ = ["Ticket", "ticket", "lookup", "store", "read_cutile_cache", "code_fingerprint", "toolchain_fingerprint", "cache_folder", "MAX_ENTRIES",
           "MAX_BYTES", "FORMAT", "stored_toolchain_versions", "store_toolchain_versions"]

#: bumped when the key material or the entry layout changes
FORMAT = 1
#: entries kept at most, and their cubins' total size; the least recently used go first
MAX_ENTRIES = 2048
MAX_BYTES = 512 << 20
#: variables cuTile reads that do not change a compile's output (the rest of CUDA_TILE_* are keyed)
_NEUTRAL_ENV = {"CUDA_TILE_CACHE_DIR", "CUDA_TILE_CACHE_SIZE", "CUDA_TILE_TEMP_DIR",
                "CUDA_TILE_COMPILER_TIMEOUT_SEC", "CUDA_TILE_ENABLE_CRASH_DUMP"}
#: variables that ask cuTile for logs or dumps of a compile: the front end must run, so no cache
_WANTS_FRONT_END = ("CUDA_TILE_LOGS", "CUDA_TILE_DUMP_TILEIR", "CUDA_TILE_DUMP_BYTECODE")
_SIMPLE = (int, float, bool, str, bytes, complex, type(None))

_lock = threading.Lock()
_touched: dict[str, set[str]] = {}  # cuTile cache folder -> keys of cubins served from it by reference
_file_hashes: dict[str, tuple[tuple[int, int], str]] = {}  # path -> ((mtime_ns, size), sha256)
_toolchain: str | None = None


class _Opaque(Exception):
    """A global the fingerprint cannot describe."""


def _enabled() -> bool:
    from tiletune import settings

    if not settings.frontend_cache():
        return False
    return not any(os.environ.get(v) for v in _WANTS_FRONT_END)


def cache_folder(context: Any = None) -> Path | None:
    """The cache's folder for this cuTile context (its config's ``cache_dir``), or None when cuTile's
    disk cache is off."""
    base = getattr(getattr(context, "config", None), "cache_dir", None) if context is not None else None
    if base is None and context is None:
        try:
            from cutile_cache._env import get_cache_dir_from_env

            base = get_cache_dir_from_env()
        except Exception:  # noqa: BLE001 - an unknown cuTile layout: no cache
            return None
    return Path(base) / "tiletune-frontend" if base else None


# ---------------------------------------------------------------------------------------- fingerprints
def _file_hash(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    stamp = (st.st_mtime_ns, st.st_size)
    known = _file_hashes.get(path)
    if known is not None and known[0] == stamp:
        return known[1]
    try:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None
    _file_hashes[path] = (stamp, digest)
    return digest


def _is_cutile(obj: Any) -> bool:
    mod = getattr(obj, "__module__", None) or getattr(type(obj), "__module__", "") or ""
    if isinstance(obj, types.ModuleType):
        mod = obj.__name__
    return mod == "cuda.tile" or mod.startswith("cuda.tile.") or mod.startswith("cutile_cache")


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


def _code_text(code: types.CodeType) -> str:
    parts = [code.co_name, code.co_code.hex(), repr(code.co_names), repr(code.co_varnames)]
    for c in code.co_consts:
        parts.append(_code_text(c) if isinstance(c, types.CodeType) else repr(c))
    return "|".join(parts)


class _Walker:
    def __init__(self) -> None:
        self.parts: list[str] = []
        self.seen: set[int] = set()
        self.names: set[str] = set()  # every name the code reached so far reads (attribute names too)

    def function(self, fn: Any) -> None:
        fn = inspect.unwrap(fn)
        inner = getattr(fn, "_pyfunc", None)
        if inner is not None:
            fn = inner
        if id(fn) in self.seen:
            return
        self.seen.add(id(fn))
        code = getattr(fn, "__code__", None)
        if code is None:
            raise _Opaque(f"no code object: {fn!r}")
        path = code.co_filename
        digest = _file_hash(path) if path and not path.startswith("<") else None
        # the code in memory, and the defining file as it is now (cuTile's front end reads the source from
        # the file: after an edit the two differ, and the key differs from a fresh process's either way)
        self.parts.append(f"fn {getattr(fn, '__module__', '')}.{fn.__qualname__} file {digest} "
                          f"code {_code_text(code)}")
        names = _code_names(code)
        self.names |= names
        glb = getattr(fn, "__globals__", {})
        for name in sorted(names):
            if name in glb:
                self.value(f"{fn.__qualname__}:{name}", glb[name])
        for i, cell in enumerate(getattr(fn, "__closure__", None) or ()):
            try:
                self.value(f"{fn.__qualname__}:cell{i}", cell.cell_contents)
            except ValueError:  # an empty cell
                continue
        for i, d in enumerate(getattr(fn, "__defaults__", None) or ()):
            self.value(f"{fn.__qualname__}:default{i}", d)
        for k, d in sorted((getattr(fn, "__kwdefaults__", None) or {}).items()):
            self.value(f"{fn.__qualname__}:kwdefault {k}", d)

    def value(self, where: str, v: Any) -> None:
        if isinstance(v, _SIMPLE):
            self.parts.append(f"{where}={type(v).__name__}:{v!r}")
        elif isinstance(v, (tuple, list, frozenset)):
            self.parts.append(f"{where}={type(v).__name__}[{len(v)}]")
            for i, x in enumerate(sorted(v, key=repr) if isinstance(v, frozenset) else v):
                self.value(f"{where}[{i}]", x)
        elif _is_cutile(v):
            self.parts.append(f"{where}=cuda.tile {type(v).__name__} {v!r}" if not callable(v)
                              or isinstance(v, types.ModuleType) else f"{where}=cuda.tile {getattr(v, '__name__', '?')}")
        elif isinstance(v, types.ModuleType):
            f = getattr(v, "__file__", None)
            self.parts.append(f"{where}=module {v.__name__} {_file_hash(f) if f else 'builtin'}")
            if id(v) in self.seen:
                return
            self.seen.add(id(v))
            # ``mod.NAME`` in the code: what the module holds under each name the code reads (a constant
            # or helper defined in another file of a package and re-exported)
            attrs = getattr(v, "__dict__", {})
            for name in sorted(self.names):
                if name in attrs and not name.startswith("__"):
                    self.value(f"{where}.{name}", attrs[name])
        elif isinstance(v, type):
            mod = sys.modules.get(v.__module__)
            f = getattr(mod, "__file__", None)
            self.parts.append(f"{where}=class {v.__module__}.{v.__qualname__} {_file_hash(f) if f else 'builtin'}")
        elif isinstance(v, (types.FunctionType, types.MethodType)) or hasattr(v, "_pyfunc") or (
                callable(v) and hasattr(v, "__wrapped__")):
            if getattr(v, "__module__", "") == "builtins":
                self.parts.append(f"{where}=builtin {v!r}")
            else:
                self.function(v)
        elif isinstance(v, types.BuiltinFunctionType):
            self.parts.append(f"{where}=builtin {getattr(v, '__module__', '')}.{v.__qualname__}")
        else:
            raise _Opaque(f"{where} is a {type(v).__name__}")


def code_fingerprint(fn: Any) -> str | None:
    """A SHA-256 of a kernel's Python function and everything global it reads (see the module doc), or
    None when it reads a global the fingerprint cannot describe. Computed at every request (once per
    compile): a global changed by the program between two compiles changes the fingerprint."""
    w = _Walker()
    try:
        w.function(fn)
    except _Opaque as exc:
        logger.debug("tiletune: %s: not in the front-end cache (%s)", getattr(fn, "__qualname__", fn), exc)
        return None
    return hashlib.sha256("\n".join(w.parts).encode()).hexdigest()


def toolchain_fingerprint() -> str:
    """cuda-tile's version and every ``tileiras`` cuTile could run (path, size, modification time): the
    pip package's, the one on PATH and the one under CUDA_HOME / CUDA_PATH. Read once per process."""
    global _toolchain
    if _toolchain is not None:
        return _toolchain
    import importlib.util
    import shutil

    import cuda.tile as ct

    found: list[str] = []
    try:
        spec = importlib.util.find_spec("nvidia.cu13")
        for root in (spec.submodule_search_locations or []) if spec is not None else []:
            found.append(os.path.join(root, "bin", "tileiras"))
    except (ImportError, ValueError):
        pass
    on_path = shutil.which("tileiras")
    if on_path:
        found.append(on_path)
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home:
            found.append(os.path.join(home, "bin", "tileiras"))
    parts = [f"cuda_tile {ct.__version__}"]
    for p in found:
        try:
            st = os.stat(p)
        except OSError:
            continue
        parts.append(f"{os.path.realpath(p)} {st.st_size} {st.st_mtime_ns}")
    _toolchain = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    return _toolchain


_mangler: Any = None


def kernel_symbol(function_name: str, signature: Any) -> str:
    """cuTile's mangled name of a kernel ``signature`` (the string ``mangle_kernel_name`` returns), without
    the round trip ``mangle_kernel_name`` adds to check itself: it demangles every name it makes, which is
    most of its cost (about 1.2 of 1.8 ms on a CPU host for a GEMM signature), paid for each config a miss
    or a compile looks up. Made from cuTile's own mangling parts; where those differ from what this was
    written against, cuTile's public function (with its check)."""
    global _mangler
    if _mangler is None:
        try:
            from cuda.tile.compilation import _name_mangling as nm

            parts = (nm._map_alias_groups, nm._mangle_constraint, nm._CollectedGlobals)

            def fast(name: str, sig: Any) -> str:
                alias_map, _names = parts[0](sig.parameters)
                collected = parts[2](dataclasses=set(), enums=set())
                return (name + f"_K{sig.calling_convention.code}"
                        + "".join("_" + parts[1](c, alias_map, collected) for c in sig.parameters))

            _mangler = fast
        except Exception:  # noqa: BLE001 - other internals: the public function
            _mangler = False
    if _mangler:
        try:
            return _mangler(function_name, signature)
        except Exception:  # noqa: BLE001 - a signature the parts do not take: the public function says why
            pass
    from cuda.tile.compilation import mangle_kernel_name

    return mangle_kernel_name(function_name, signature)


def _entry_key(kernel: Any, signature: Any, arch: str) -> str | None:
    pyfunc = getattr(kernel, "_pyfunc", None)
    if pyfunc is None:
        return None
    code = code_fingerprint(pyfunc)
    if code is None:
        return None
    sig = getattr(signature, "symbol", None)
    if not (isinstance(sig, str) and sig.startswith(pyfunc.__name__ + "_K")):
        try:  # a signature without its mangled name (the launcher's carries it)
            sig = kernel_symbol(pyfunc.__name__, signature)
        except Exception:  # noqa: BLE001 - a signature cuTile cannot name: its own path
            return None
    env = _tile_env()
    material = json.dumps({"format": FORMAT, "toolchain": toolchain_fingerprint(), "arch": arch, "code": code,
                           "options": repr(getattr(kernel, "_compiler_options", None)), "signature": sig,
                           "calling_convention": getattr(signature.calling_convention, "code", None),
                           "env": env}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()


def _tile_env() -> list[tuple[str, str]]:
    """cuTile's environment variables that change a compile, sorted ``(name, value)`` pairs (the names are
    filtered before any value is read: a process holds many other variables)."""
    env = os.environ
    return sorted((k, env[k]) for k in env
                  if k.startswith(("CUDA_TILE_", "EXPERIMENTAL_CUDA_TILE_")) and k not in _NEUTRAL_ENV)


# ---------------------------------------------------------------------------------------- versions
def stored_toolchain_versions() -> dict[str, str] | None:
    """The cuda-tile and tileiras versions recorded for this toolchain (:func:`toolchain_fingerprint`),
    or None. Reading ``tileiras``' version costs cuTile's compiler import and a subprocess; a process
    served from the caches needs it only for its tuning identity."""
    if not _enabled():
        return None
    folder = cache_folder()
    if folder is None:
        return None
    try:
        known = json.loads((folder / "versions.json").read_text())
        got = known.get(toolchain_fingerprint()) if isinstance(known, dict) else None
    except (OSError, ValueError):
        return None
    if isinstance(got, dict) and all(isinstance(got.get(k), str) for k in ("cuda_tile", "tileiras")):
        return {"cuda_tile": got["cuda_tile"], "tileiras": got["tileiras"]}
    return None


def store_toolchain_versions(versions: dict[str, str]) -> None:
    """Record ``{"cuda_tile", "tileiras"}`` for this toolchain (nothing if either is unknown)."""
    if not _enabled() or any(versions.get(k) in (None, "unknown") for k in ("cuda_tile", "tileiras")):
        return
    folder = cache_folder()
    if folder is None:
        return
    path = folder / "versions.json"
    try:
        known = json.loads(path.read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    known = dict(list(known.items())[-15:])  # a few toolchains at most
    known[toolchain_fingerprint()] = {"cuda_tile": versions["cuda_tile"], "tileiras": versions["tileiras"]}
    _write_files(folder, [(path.name, json.dumps(known).encode())], "toolchain versions")


def _write_files(folder: Path, files: list[tuple[str, bytes]], what: str) -> bool:
    """Write each ``(name, data)`` into ``folder`` (created if missing) atomically, in order
    (:func:`tiletune.jsonio.write_atomic`); False, logged, when one could not be written."""
    from tiletune import jsonio as _io

    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files:
            _io.write_atomic(folder / name, data)
    except (OSError, _io.Problem) as exc:
        logger.debug("tiletune: front-end cache: %s not written (%s)", what, exc)
        return False
    return True


# ------------------------------------------------------------------------------ cuTile's disk cache
def read_cutile_cache(cache_dir: str | os.PathLike, key: str) -> bytes | None:
    """The cubin cuTile's disk cache in ``cache_dir`` holds under ``key`` (its SQLite file ``cache.db``,
    table ``cache``), read-only: no schema statements, no write lock. None when the file or the key is
    absent; ``sqlite3.Error`` when the file cannot be read so (another layout, a damaged file)."""
    import sqlite3

    path = os.path.join(os.fspath(cache_dir), "cache.db")
    if not os.path.exists(path):
        return None
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
    try:
        row = conn.execute("SELECT blob FROM cache WHERE key = ?", (key,)).fetchone()
    finally:
        conn.close()
    return None if row is None else bytes(row[0])


def _touch_cutile_entries() -> None:
    """Mark the cuTile entries this process served by reference as used (cuTile evicts by access time)."""
    import sqlite3
    import time

    with _lock:
        touched = {d: sorted(keys) for d, keys in _touched.items() if keys}
        _touched.clear()
    for cache_dir, keys in touched.items():
        try:
            conn = sqlite3.connect(os.path.join(cache_dir, "cache.db"), timeout=1.0)
            try:
                with conn:
                    conn.executemany("UPDATE cache SET atime = ? WHERE key = ?", [(time.time(), k) for k in keys])
            finally:
                conn.close()
        except sqlite3.Error as exc:
            logger.debug("tiletune: front-end cache: cuTile entries not marked used (%s)", exc)


atexit.register(_touch_cutile_entries)


# ---------------------------------------------------------------------------------------- entries
class Ticket:
    """One compile's entry: its folder and key, computed before the compile (so what is stored after
    it is keyed by the globals the compile read, not by values the program set later)."""

    __slots__ = ("folder", "key", "arch", "qualname")

    def __init__(self, folder: Path, key: str, arch: str, qualname: str) -> None:
        self.folder, self.key, self.arch, self.qualname = folder, key, arch, qualname

    def load(self) -> tuple[bytes, str] | None:
        """``(cubin, symbol)`` stored under this key, or None (absent, damaged, or a reference to a cubin
        cuTile's disk cache no longer holds)."""
        import sqlite3

        try:
            meta = json.loads((self.folder / f"{self.key}.json").read_text())
            ref = meta.get("cutile_key") if isinstance(meta, dict) else None
            if isinstance(ref, str):
                cubin = read_cutile_cache(self.folder.parent, ref)
                if cubin is None:
                    return None
            else:
                cubin = (self.folder / f"{self.key}.cubin").read_bytes()
        except (OSError, ValueError, sqlite3.Error):
            return None
        if (not isinstance(meta, dict) or meta.get("size") != len(cubin)
                or meta.get("sha256") != hashlib.sha256(cubin).hexdigest() or not isinstance(meta.get("symbol"), str)):
            logger.debug("tiletune: front-end cache entry %s is damaged; compiling", self.key)
            return None
        try:
            os.utime(self.folder / f"{self.key}.json")  # recently used: evicted last
        except OSError:
            pass
        if isinstance(ref, str):
            with _lock:
                _touched.setdefault(os.fspath(self.folder.parent), set()).add(ref)
        return cubin, meta["symbol"]

    def save(self, cubin: bytes, symbol: str, cutile_key: str | None = None) -> bool:
        """Keep ``cubin`` for later processes; True if stored. ``cutile_key``: cuTile's disk cache holds
        the cubin under this key (or will, once its store is written): the entry is a record of the key
        only. Without it the cubin is kept as a file beside the record."""
        if not isinstance(cubin, (bytes, bytearray)) or not isinstance(symbol, str):
            return False
        meta: dict[str, Any] = {"symbol": symbol, "size": len(cubin), "sha256": hashlib.sha256(cubin).hexdigest(),
                                "arch": self.arch, "kernel": self.qualname}
        if isinstance(cutile_key, str):
            meta["cutile_key"] = cutile_key
            files = [(f"{self.key}.json", json.dumps(meta).encode())]
        else:  # the record goes last: a reader sees it only with its cubin
            files = [(f"{self.key}.cubin", bytes(cubin)), (f"{self.key}.json", json.dumps(meta).encode())]
        if not _write_files(self.folder, files, f"entry {self.key}"):
            return False
        if isinstance(cutile_key, str):
            try:  # an older entry of this key kept the cubin itself
                (self.folder / f"{self.key}.cubin").unlink()
            except OSError:
                pass
        if random.random() < 1 / 64:
            _evict(self.folder)
        return True


#: the folder (beside :func:`cache_folder`'s) of tuning candidates' entries: a worker that replaces one lost to
#: a fault, or a later session, compiles them without the front end; kept apart (with its own eviction) so a
#: tuning session never evicts the entries of configs that are served
CANDIDATES_FOLDER = "tiletune-candidates"


def ticket(kernel: Any, signature: Any, context: Any, arch: str, candidates: bool = False) -> Ticket | None:
    """The entry of this kernel object's compile of ``signature`` on ``arch`` in ``context``'s cuTile
    cache, or None (cache off, kernel not fingerprintable, signature cuTile cannot name). ``candidates``:
    in the tuning candidates' folder (:data:`CANDIDATES_FOLDER`) instead."""
    if not _enabled():
        return None
    folder = cache_folder(context)
    if folder is None:
        return None
    if candidates:
        folder = folder.parent / CANDIDATES_FOLDER
    key = _entry_key(kernel, signature, arch)
    if key is None:
        return None
    return Ticket(folder, key, arch, getattr(getattr(kernel, "_pyfunc", None), "__qualname__", "?"))


def lookup(kernel: Any, signature: Any, context: Any, arch: str) -> tuple[bytes, str] | None:
    """``(cubin, symbol)`` stored for this kernel object's compile of ``signature`` on ``arch``, or None."""
    t = ticket(kernel, signature, context, arch)
    return t.load() if t is not None else None


def store(kernel: Any, signature: Any, context: Any, arch: str, cubin: bytes, symbol: str,
          cutile_key: str | None = None) -> bool:
    """Keep ``cubin`` (compiled for ``signature`` on ``arch``) for later processes; True if stored
    (``cutile_key``: see :meth:`Ticket.save`)."""
    t = ticket(kernel, signature, context, arch)
    return t.save(cubin, symbol, cutile_key) if t is not None else False


def _evict(folder: Path, keep: int | None = None, max_bytes: int | None = None) -> int:
    """Drop the least recently used entries beyond ``keep`` entries (default :data:`MAX_ENTRIES`) or
    ``max_bytes`` of cubins (default :data:`MAX_BYTES`); returns how many went."""
    keep = MAX_ENTRIES if keep is None else keep
    max_bytes = MAX_BYTES if max_bytes is None else max_bytes
    with _lock:
        entries = []
        try:
            for rec in folder.glob("*.json"):
                if rec.name == "versions.json":
                    continue
                try:
                    used = rec.stat().st_mtime_ns
                except OSError:
                    used = 0
                try:
                    size = rec.with_suffix(".cubin").stat().st_size
                except OSError:
                    size = 0  # a record of cuTile's key: the cubin is cuTile's to keep
                entries.append((used, size, rec))
        except OSError:
            return 0
        entries.sort(key=lambda e: e[0])
        total = sum(e[1] for e in entries)
        gone = 0
        for used, size, rec in entries:
            if len(entries) - gone <= keep and total <= max_bytes:
                break
            for p in (rec, rec.with_suffix(".cubin")):
                try:
                    p.unlink()
                except OSError:
                    pass
            total -= size
            gone += 1
        return gone
