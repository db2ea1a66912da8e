"""Make text from files and databases safe to print on a terminal.

Op names, problem keys, configs, device names and file names can come from an imported export, a
recording or a database written by someone else. Printed as is, such text can inject ``rich``
markup (``[/bold]`` crashes a table, ``[link=...]`` forges a link) or terminal escape sequences
(``ESC [ 2 J`` clears the screen, OSC sequences set the window title or the clipboard).

* :func:`escape_controls`: every control character (C0 ``\\x00``-``\\x1f``, DEL, C1
  ``\\x80``-``\\x9f``) and every Unicode bidirectional / line-separator control is replaced by a
  visible escape (``\\x1b``, ``\\n``, ``\\t``, ``\\u202e``); none is let through, newlines and tabs
  included, so one value stays on one line.
* :func:`safe`: the same, then ``rich`` markup escaped; for anything given to a ``rich`` console
  (``console.print``, table cells, titles).
"""

from __future__ import annotations

import re
from typing import Any

from rich.markup import escape as _markup_escape

__all__ = ["escape_controls", "safe"]

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# C0, DEL, C1; bidi embeddings/overrides/isolates and marks; line and paragraph separators
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _visible(match: re.Match[str]) -> str:
    ch = match.group()
    if ch in _SHORT:
        return _SHORT[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: Any) -> str:
    """``str(text)`` with every control character replaced by a visible escape (e.g. ``\\x1b``)."""
    return _UNSAFE.sub(_visible, str(text))


def safe(text: Any) -> str:
    """``str(text)`` safe for a ``rich`` console: control characters made visible, markup escaped."""
    return _markup_escape(escape_controls(text))
