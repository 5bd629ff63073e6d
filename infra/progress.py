"""Progress of long work: a bar on a terminal, structured log lines otherwise."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

log = logging.getLogger("kwal.progress")


class Progress:
    """`with Progress("replay", total) as p: p.advance(n)`."""

    def __init__(self, label: str, total: int | None = None, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._last = 0.0
        self._start = time.monotonic()

    def __enter__(self) -> Progress:
        return self

    def advance(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if now - self._last < (0.1 if self.tty else 5.0):
            return
        self._last = now
        self._show(final=False)

    def _show(self, final: bool) -> None:
        elapsed = time.monotonic() - self._start
        if self.tty:
            if self.total:
                frac = min(1.0, self.done / self.total)
                bar = "#" * int(frac * 30)
                text = f"\r{self.label:<12} [{bar:<30}] {self.done}/{self.total} {elapsed:5.1f}s"
            else:
                text = f"\r{self.label:<12} {self.done} {elapsed:5.1f}s"
            self.stream.write(text + ("\n" if final else ""))
            self.stream.flush()
        else:
            log.info("%s progress done=%d total=%s elapsed_s=%.1f final=%s",
                     self.label, self.done, self.total, elapsed, final)

    def __exit__(self, *exc: object) -> None:
        self._show(final=True)
