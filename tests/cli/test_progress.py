"""The plain progress line drawn when tqdm is not installed."""

from __future__ import annotations

import io

from fastload.cli import PlainProgress


def test_plain_progress_redraws_in_place_at_most_every_interval():
    stream = io.StringIO()
    bar = PlainProgress(10, "loading", stream=stream, interval=3600)
    bar.update(4)
    assert stream.getvalue() == ""  # within the interval: not redrawn
    bar.update(6)  # the total: always drawn
    drawn = stream.getvalue()
    assert drawn.startswith("\rloading: 10/10 img, ") and drawn.endswith(" img/s")
    bar.close()
    assert stream.getvalue() == drawn + "\r" + " " * (len(drawn) - 1) + "\r"
