"""Defensive JSON reading and atomic writing, shared by the recording loader, the importers and the
tuning database's import/export (:mod:`tiletune.store`).

Reading (:func:`read_bytes`, :func:`decode_text`, :func:`parse_json`, :func:`read_json`) refuses,
before anything is built from the file:

* a file (or gzip content, once decompressed) larger than :data:`MAX_FILE_BYTES`;
* bytes that are not UTF-8 text (a leading byte-order mark is allowed);
* JSON nested deeper than :data:`MAX_DEPTH` arrays/objects (checked by scanning the brackets before
  parsing, so no input can reach Python's recursion limit);
* ``NaN``, ``Infinity`` and ``-Infinity`` (not standard JSON), numbers too large for a float (such
  as ``1e400``) and integers outside the signed 64-bit range; the message names the field;
* strings holding a lone surrogate (an unpaired ``\\ud800`` escape: not Unicode text).

Problems are raised as :class:`Problem` (a problem and the field path, or None for the whole file);
each caller turns it into its public exception (:class:`~tiletune.errors.InvalidRecording`,
:class:`~tiletune.errors.InvalidImport`, :class:`~tiletune.errors.OutputError`), adding the file.

Field paths read like Python/JavaScript access: ``results[3].times.runtimes[2]``,
``cache["32,1"].times[2]`` (a key that is not an identifier is quoted), ``document`` for the top.

Writing (:func:`check_destination`, :func:`write_atomic`): the destination's folder must exist (it is
not created), the destination may not be a folder or one of the input files (compared after resolving
links, and by inode), and the file is written to a temporary file in the same folder and moved over
the destination with :func:`os.replace`: a reader sees the old file or the new one, never a part.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import re
import stat
import tempfile
import zlib
from pathlib import Path
from typing import Any, Iterable, Mapping

#: Largest file read (and largest gzip content once decompressed), in bytes: 512 MiB.
MAX_FILE_BYTES = 512 * 1024 * 1024
#: Deepest nesting of JSON arrays and objects accepted (the formats read here need fewer than 10).
MAX_DEPTH = 64
#: Integers must fit in a signed 64-bit integer (what SQLite stores).
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
#: Times (kernel samples and compile times) must be below this, in microseconds (about 31,700 years).
MAX_TIME_US = 1e18


class Problem(Exception):
    """What is wrong (``problem``) and where (``field``: a path, None for the whole file)."""

    def __init__(self, problem: str, field: str | None = None) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.problem, self.field = problem, field


# ---------------------------------------------------------------------- reading


def _os_reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


def _too_large(size: int | str, limit: int) -> str:
    return f"too large: {size} bytes (the limit is {limit} bytes)"


def read_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of a file, gunzipped when it starts with the gzip magic, within :data:`MAX_FILE_BYTES`."""
    limit = MAX_FILE_BYTES
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise Problem(_too_large(size, limit))
            raw = f.read(limit + 1)
    except OSError as exc:
        raise Problem(f"cannot read it: {_os_reason(exc)}") from None
    if len(raw) > limit:
        raise Problem(_too_large(f"more than {limit}", limit))
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as g:
                raw = g.read(limit + 1)
        except (OSError, EOFError, zlib.error) as exc:
            raise Problem(f"not a valid gzip file: {exc}") from None
        if len(raw) > limit:
            raise Problem(f"too large once decompressed: more than {limit} bytes (the limit is {limit} bytes)")
    return raw


def read_stream(stream: Any) -> str | bytes:
    """What a readable stream holds, within :data:`MAX_FILE_BYTES` (characters or bytes)."""
    limit = MAX_FILE_BYTES
    try:
        data = stream.read(limit + 1)
    except OSError as exc:
        raise Problem(f"cannot read it: {_os_reason(exc)}") from None
    if len(data) > limit:
        raise Problem(_too_large(f"more than {limit}", limit))
    return data


def decode_text(raw: bytes) -> str:
    """UTF-8 text (a leading byte-order mark is dropped)."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        bad = exc.object[exc.start] if exc.start < len(exc.object) else 0
        raise Problem(f"not UTF-8 text: {exc.reason} (byte 0x{bad:02x} at offset {exc.start})") from None


_STRINGS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"[\[{][\]}]")


def nesting_exceeds(text: str, limit: int) -> bool:
    """Whether the JSON text nests arrays/objects deeper than ``limit`` (brackets in strings ignored).

    Exact for balanced text; for unbalanced text (not valid JSON anyway) it may overestimate. Each
    pass over the brackets removes the innermost pairs, so it stops after at most ``limit + 1``
    passes (all in :mod:`re`, no recursion).
    """
    s = _NOT_BRACKETS.sub("", _STRINGS.sub("", text))
    passes = 0
    while s:
        t = _INNERMOST.sub("", s)
        if len(t) == len(s):
            break
        passes += 1
        if passes > limit:
            return True
        s = t
    return passes + s.count("[") + s.count("{") > limit


class _BadNumber:
    """Stands in the parsed document for a number that cannot be accepted (located afterwards)."""

    __slots__ = ("text", "problem")

    def __init__(self, text: str, problem: str) -> None:
        self.text, self.problem = text, problem


def _clip(text: str, n: int = 40) -> str:
    return text if len(text) <= n else f"{text[:n // 2]}...({len(text)} characters)"


class _Hooks:
    def __init__(self) -> None:
        self.bad = False

    def constant(self, text: str) -> _BadNumber:
        self.bad = True
        return _BadNumber(text, f"expected a finite number, got {text} (NaN and Infinity are not standard JSON)")

    def float_(self, text: str) -> Any:
        value = float(text)
        if math.isfinite(value):
            return value
        self.bad = True
        return _BadNumber(text, f"number out of range, got {_clip(text)}")

    def int_(self, text: str) -> Any:
        if len(text) <= 20:
            value = int(text)
            if INT_MIN <= value <= INT_MAX:
                return value
        self.bad = True
        return _BadNumber(text, f"integer out of range (it must fit in 64 bits), got {_clip(text)}")


def join(base: str, key: str | int) -> str:
    """The field path of ``key`` inside the field ``base`` (``""``: the top of the document)."""
    if isinstance(key, int):
        return f"{base}[{key}]"
    if key.isidentifier() and key.isascii():
        return f"{base}.{key}" if base else key
    return f"{base}[{json.dumps(key)}]"


def _locate_bad(doc: Any) -> Problem | None:
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, _BadNumber):
            return Problem(value.problem, where or "document")
        if isinstance(value, dict):
            stack.extend(reversed([(v, join(where, k)) for k, v in value.items()]))
        elif isinstance(value, list):
            stack.extend(reversed([(v, join(where, i)) for i, v in enumerate(value)]))
    return None  # pragma: no cover - a flagged document always holds a _BadNumber


def _locate_surrogate(doc: Any) -> Problem | None:
    """The first string (value or key) holding a lone surrogate (an unpaired ``\\ud800``-style
    escape: not Unicode text, it cannot be written as UTF-8 nor stored by SQLite)."""
    stack: list[tuple[Any, str]] = [(doc, "")]
    while stack:
        value, where = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                code = ord(value[exc.start])
                return Problem(f"expected Unicode text, got a lone surrogate \\u{code:04x} (an unpaired escape)",
                               where or "document")
        elif isinstance(value, dict):
            items = []
            for k, v in value.items():
                items.append((k, where or "document"))  # a bad key is a problem of its object
                items.append((v, join(where, k)))
            stack.extend(reversed(items))
        elif isinstance(value, list):
            stack.extend(reversed([(v, join(where, i)) for i, v in enumerate(value)]))
    return None


def _loads(text: str, hooks: _Hooks) -> Any:
    try:
        return json.loads(text, parse_constant=hooks.constant, parse_float=hooks.float_, parse_int=hooks.int_)
    except RecursionError:  # pragma: no cover - the bracket scan refuses such text first
        raise Problem(f"nested deeper than {MAX_DEPTH} levels") from None


def parse_json(text: str, *, allow_open_kt_cache: bool = False) -> Any:
    """Parse JSON text within the limits (see the module's docstring).

    ``allow_open_kt_cache``: Kernel Tuner leaves its cache file unterminated (a trailing comma, no
    closing braces) while tuning runs; such a text is closed and parsed.
    """
    if nesting_exceeds(text, MAX_DEPTH):
        raise Problem(f"nested deeper than {MAX_DEPTH} levels")
    hooks = _Hooks()
    try:
        doc = _loads(text, hooks)
    except ValueError as exc:
        doc, parsed = None, False
        if allow_open_kt_cache and '"cache"' in text:
            body = text.rstrip().rstrip(",")
            for tail in ("}}", "}"):
                try:
                    doc, parsed = _loads(body + tail, hooks), True
                    break
                except ValueError:
                    continue
        if not parsed:
            raise Problem(f"not valid JSON: {exc}") from None
    if hooks.bad:
        problem = _locate_bad(doc)
        if problem is not None:
            raise problem
    if "\\ud" in text or "\\uD" in text:  # maybe a lone surrogate escape
        problem = _locate_surrogate(doc)
        if problem is not None:
            raise problem
    return doc


def read_json(path: str | os.PathLike, allow_open_kt_cache: bool = False) -> Any:
    """Read and parse a plain or gzip JSON file within the limits; raises :class:`Problem`."""
    return parse_json(decode_text(read_bytes(path)), allow_open_kt_cache=allow_open_kt_cache)


# ---------------------------------------------------------------------- validating


def show(value: Any) -> str:
    """A value as the message shows it: JSON for scalars, the kind for containers."""
    if value is None:
        return "null"
    if value is True or value is False:
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value if len(value) <= 60 else value[:57] + "...")
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    if isinstance(value, Mapping):
        return "an object" if value else "an empty object"
    return type(value).__name__


def need(d: Mapping[str, Any], key: str, where: str) -> Any:
    """``d[key]``; a missing key is a problem of ``where`` (the object)."""
    if key not in d:
        raise Problem(f"missing field {key!r}", where)
    return d[key]


def as_object(value: Any, where: str, *, nonempty: bool = False) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or (nonempty and not value):
        raise Problem(f"expected {'a non-empty' if nonempty else 'an'} object, got {show(value)}", where)
    return value


def as_list(value: Any, where: str, *, nonempty: bool = False, what: str = "list") -> list[Any]:
    if not isinstance(value, list) or (nonempty and not value):
        raise Problem(f"expected {'a non-empty ' if nonempty else 'a '}{what}, got {show(value)}", where)
    return value


def as_str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise Problem(f"expected a string, got {show(value)}", where)
    return value


def opt_str(d: Mapping[str, Any], key: str, where: str, default: str) -> str:
    """``d[key]`` as a string; ``default`` when the key is absent (null is refused)."""
    return as_str(d[key], join(where, key)) if key in d else default


def as_int(value: Any, where: str, *, low: int = 0, high: int = INT_MAX) -> int:
    """An integer (not a boolean) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        bound = f">= {low}" if high == INT_MAX else f"between {low} and {high}"
        raise Problem(f"expected an integer {bound}, got {show(value)}", where)
    return value


def is_number(value: Any) -> bool:
    """An int or a finite float (booleans are not numbers here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def as_time(value: Any, where: str, *, limit: float, positive: bool = True) -> float:
    """A time: a finite number > 0 (``positive``, kernel times) or >= 0 (compile times), below ``limit``."""
    kind = "positive" if positive else "non-negative"
    if not is_number(value) or (value <= 0 if positive else value < 0):
        raise Problem(f"expected a finite {kind} number, got {show(value)}", where)
    if value >= limit:
        raise Problem(f"out of range (a time must be below {limit:g}), got {show(value)}", where)
    return float(value)


def as_times(value: Any, where: str, *, limit: float, positive: bool = True) -> list[float]:
    """A list of times (see :func:`as_time`); the elements are checked in bulk, one by one only to
    name a bad one."""
    values = as_list(value, where)
    if values and set(map(type, values)) <= {float, int}:
        low, high = min(values), max(values)
        if (low > 0 if positive else low >= 0) and high < limit and not any(map(math.isnan, values)):
            return list(map(float, values))
    return [as_time(x, join(where, i), limit=limit, positive=positive) for i, x in enumerate(values)]


def as_scalar(value: Any, where: str) -> Any:
    """A parameter value: a string, a finite number, a boolean or null."""
    if value is None or isinstance(value, (str, bool)) or is_number(value):
        return value
    raise Problem(f"expected a number, string, boolean or null, got {show(value)}", where)


def as_config(value: Any, where: str) -> dict[str, Any]:
    """A configuration: an object of parameter values (:func:`as_scalar`)."""
    config = as_object(value, where)
    return {k: as_scalar(v, join(where, k)) for k, v in config.items()}


def first_timestamp(entries: Iterable[Any]) -> str | None:
    """The first ``timestamp`` among imported entries (when the space was measured), or None."""
    for e in entries:
        if isinstance(e, Mapping) and isinstance(e.get("timestamp"), str) and e["timestamp"]:
            return e["timestamp"]
    return None


# ---------------------------------------------------------------------- writing


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file (after resolving links, or by device and inode)."""
    try:
        if os.path.realpath(a) == os.path.realpath(b):
            return True
        return os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def check_destination(dest: str | os.PathLike, sources: Iterable[str | os.PathLike] = ()) -> Path:
    """Refuse a destination whose folder is missing, that is a folder or that is one of ``sources``."""
    p = Path(dest)
    parent = p.parent
    if not parent.exists():
        raise Problem(f"the folder {parent} does not exist")
    if not parent.is_dir():
        raise Problem(f"{parent} is not a folder")
    if p.is_dir():
        raise Problem("it is a folder")
    for s in sources:
        if same_file(p, s):
            raise Problem(f"it is the input file {s} (choose another destination)")
    return p


def _umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def write_atomic(dest: str | os.PathLike, data: bytes, sources: Iterable[str | os.PathLike] = ()) -> Path:
    """Write ``data`` to ``dest`` atomically (after :func:`check_destination`); raises :class:`Problem`."""
    p = check_destination(dest, sources)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=str(p.parent))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                mode = stat.S_IMODE(os.stat(p).st_mode)
            except OSError:
                mode = 0o666 & ~_umask()
            os.chmod(tmp, mode)
            os.replace(tmp, p)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as exc:
        raise Problem(_os_reason(exc)) from None
    return p


def find_non_finite(doc: Any) -> str | None:
    """The field path of the first NaN or infinite float in ``doc``, or None."""
    stack: list[tuple[Any, str]] = [(doc, "")]
    seen: set[int] = set()
    while stack:
        value, where = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            return where or "document"
        if isinstance(value, (Mapping, list, tuple)):
            if id(value) in seen:  # a circular structure
                continue
            seen.add(id(value))
        if isinstance(value, Mapping):
            stack.extend(reversed([(v, join(where, str(k))) for k, v in value.items()]))
        elif isinstance(value, (list, tuple)):
            stack.extend(reversed([(v, join(where, i)) for i, v in enumerate(value)]))
    return None
