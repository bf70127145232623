"""A small progress bar on stderr for long solves and ensembles.

On a terminal the bar redraws in place (``\\r``); in a log (not a TTY) it prints a line
at most every ``log_every`` seconds and at the end, so CI logs stay short.  A disabled
bar does nothing, which is how ``--quiet`` and library calls (``progress=False``) work.
"""
from __future__ import annotations

import sys
import time

__all__ = ["Progress"]


class Progress:
    """``with Progress("saddle", total=8, enabled=True) as bar: ... bar.advance(note="group 1")``."""

    def __init__(self, label: str, total: int, *, enabled: bool = True, stream=None,
                 width: int = 24, log_every: float = 10.0):
        self.label, self.total, self.enabled = label, max(1, int(total)), bool(enabled)
        self.stream = stream if stream is not None else sys.stderr
        self.width, self.log_every = width, log_every
        self.done = 0
        self.start = time.perf_counter()
        self._last_log = self.start
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(ok=exc_type is None)
        return False

    def line(self, note: str = "") -> str:
        """The text of the bar in its current state."""
        filled = int(round(self.width * self.done / self.total))
        bar = "#" * filled + "." * (self.width - filled)
        text = f"{self.label} [{bar}] {self.done}/{self.total} {time.perf_counter() - self.start:6.1f}s"
        return f"{text} {note}".rstrip()

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.total, self.done + n)
        if not self.enabled:
            return
        now = time.perf_counter()
        if self._tty:
            self.stream.write("\r" + self.line(note).ljust(78))
            self.stream.flush()
        elif now - self._last_log >= self.log_every or self.done == self.total:
            self._last_log = now
            self.stream.write(self.line(note) + "\n")
            self.stream.flush()

    def close(self, ok: bool = True) -> None:
        if self.enabled and self._tty:
            self.stream.write("\r" + self.line("done" if ok else "interrupted").ljust(78) + "\n")
            self.stream.flush()
        self.enabled = False
