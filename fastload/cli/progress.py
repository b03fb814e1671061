"""Progress bars for ``python -m fastload bench``: tqdm's when installed, else a plain line.

tqdm comes with the ``bench`` extra, but the command must also run after a
bare ``pip install fastload``; a progress bar is no reason to fail a
benchmark, so without tqdm a plain one-line counter is drawn instead.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

__all__ = ["progress_bar", "PlainProgress", "DataWaitNote", "show_data_wait"]

# How often the bench's bar asks the loader for its report (seconds).
_NOTE_INTERVAL = 0.5


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
        self.note = ""  # shown after the rate (set_postfix_str, as tqdm's)
        self._start = time.monotonic()
        self._drawn_at = self._start
        self._width = 0

    def update(self, count: int) -> None:
        self.count += count
        now = time.monotonic()
        if now - self._drawn_at >= self.interval or self.count >= self.total:
            self._draw(now)

    def set_postfix_str(self, note: str, refresh: bool = True) -> None:
        """Show ``note`` after the rate from the next redraw on (tqdm's method)."""
        self.note = note
        if refresh and self._width:
            self._draw(time.monotonic())

    def _draw(self, now: float) -> None:
        elapsed = now - self._start
        rate = f", {self.count / elapsed:.0f} img/s" if elapsed > 0 else ""
        note = f", {self.note}" if self.note else ""
        line = f"{self.description}: {self.count}/{self.total} img{rate}{note}"
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


class DataWaitNote:
    """Keeps ``bar``'s note at the share of time the consumer of ``loader`` waits for
    data (``loader.report()``), refreshed at most every half second."""

    def __init__(self, bar: Any, loader: Any) -> None:
        self.bar, self.loader = bar, loader
        self._shown_at = time.monotonic()

    def update(self) -> None:
        now = time.monotonic()
        if now - self._shown_at >= _NOTE_INTERVAL:
            self._shown_at = now
            self.bar.set_postfix_str(show_data_wait(self.loader.report()), refresh=False)


def show_data_wait(report: Any) -> str:
    """The progress bar's words for a ``LoaderReport``: the consumer's wait for data."""
    return f"data wait {100 * report.wait_share:.0f} %"
