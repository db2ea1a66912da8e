"""Progress display for tuning sessions and the ``TILETUNE_LOG`` switch."""

from __future__ import annotations

import contextlib
import logging
import sys
from typing import Iterator

from tiletune import settings
from tiletune.engine.tuner import ProgressFn

_log_configured = False


def configure_logging_from_env() -> None:
    """With ``TILETUNE_LOG`` on, send the ``tiletune`` logger's lines to stderr (once): a true
    boolean (``1/true/yes/on``) logs INFO, a level name (``debug``, ``info``, ``warning``,
    ``error``) that level. False, empty or unset: nothing. Any other value: ValueError naming the
    variable (:func:`tiletune.settings.log_level`)."""
    global _log_configured
    if _log_configured:
        return
    level = settings.log_level()
    if level is None:
        return
    _log_configured = True
    log = logging.getLogger("tiletune")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[tiletune] %(message)s"))
        log.addHandler(handler)
    log.setLevel(level)


def _interactive() -> bool:
    if not settings.progress_enabled():  # an invalid TILETUNE_PROGRESS raises here
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # no stderr, or a closed one
        return False


@contextlib.contextmanager
def tuning_progress(name: str, total: int, enabled: bool | None = None) -> Iterator[ProgressFn | None]:
    """A progress bar on interactive terminals (``rich``); ``None`` elsewhere."""
    if enabled is None:
        enabled = _interactive()
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn(f"[bold]tiletune[/] {name}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
        transient=True,
        console=None,
    ) as bar:
        task = bar.add_task("", total=total)

        def update(message: str, done: int, total_: int) -> None:
            bar.update(task, completed=done, total=total_, description=message[:60])

        yield update
