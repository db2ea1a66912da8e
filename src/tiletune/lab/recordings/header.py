"""The header every ``tiletune-recording`` document starts with: what the format module reads and
the importers write (kept apart so that the importers need not import the format module, which
calls them)."""

from __future__ import annotations

from typing import Any

__all__ = ["FORMAT", "VERSION", "headed"]

#: the document's ``format`` field
FORMAT = "tiletune-recording"
#: the one version of the format this tiletune reads and writes
VERSION = 1


def headed(**fields: Any) -> dict[str, Any]:
    """A recording document: the header, then ``fields`` in their order."""
    return {"format": FORMAT, "version": VERSION, **fields}
