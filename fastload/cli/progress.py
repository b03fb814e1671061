"""Progress bars for ``python -m fastload bench``: tqdm's when installed, else a plain line.

tqdm comes with the ``bench`` extra, but the command must also run after a
bare ``pip install fastload``; a progress bar is no reason to fail a
benchmark, so without tqdm a plain one-line counter is drawn instead.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["progress_bar", "PlainProgress"]


class PlainProgress:
    """``description: count/total img, rate img/s``, redrawn in place on ``stream``.

    Redrawn at most every ``interval`` seconds (and when the count reaches the
    total), so a fast loop does not spend its time writing to a terminal.
    ``close`` erases the line, as tqdm's ``leave=False`` does.
    """

    def __init__(self, total: int, description: str, stream: TextIO | None = None,
                 interval: float = 0.5) -> None:
        self.total = total
        self.description = description
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.count = 0
        self._start = time.monotonic()
        self._drawn_at = self._start
        self._width = 0

    def update(self, count: int) -> None:
        self.count += count
        now = time.monotonic()
        if now - self._drawn_at >= self.interval or self.count >= self.total:
            self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = now - self._start
        rate = f", {self.count / elapsed:.0f} img/s" if elapsed > 0 else ""
        line = f"{self.description}: {self.count}/{self.total} img{rate}"
        # Pad over the previous line's tail, which may have been longer.
        self.stream.write("\r" + line.ljust(self._width))
        self.stream.flush()
        self._width = len(line)
        self._drawn_at = now

    def close(self) -> None:
        if self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self.stream.flush()
            self._width = 0


def progress_bar(total: int, description: str, enabled: bool) -> Any:
    """A bar with ``update(n)`` and ``close()`` on stderr, or None when not ``enabled``."""
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return PlainProgress(total, description)
    return tqdm(total=total, desc=description, unit="img", file=sys.stderr, dynamic_ncols=True,
                leave=False)
