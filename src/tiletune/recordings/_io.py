"""Reading the JSON of recorded spaces (plain or gzip), shared by the loader and the importers."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any, Mapping

from ..errors import TiletuneError


def read_json(path: str | os.PathLike, allow_open_kt_cache: bool = False) -> Any:
    """JSON from a plain or gzip file. Kernel Tuner leaves caches unterminated while tuning runs."""
    try:
        raw = Path(path).read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise TiletuneError(f"{path}: cannot read ({type(exc).__name__}: {exc})") from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        if allow_open_kt_cache and '"cache"' in text:
            body = text.rstrip().rstrip(",")
            for tail in ("}}", "}", ""):
                try:
                    return json.loads(body + tail)
                except ValueError:
                    continue
        raise TiletuneError(f"{path}: not valid JSON ({exc})") from exc


def first_timestamp(entries: Any) -> str | None:
    """The first ``timestamp`` among imported entries (when the space was measured), or None."""
    for e in entries:
        if isinstance(e, Mapping) and e.get("timestamp"):
            return str(e["timestamp"])
    return None
