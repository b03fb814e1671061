"""The plain progress line drawn when tqdm is not installed."""

from __future__ import annotations

import io

import time

import numpy as np

import fastload as fl
from fastload.cli import PlainProgress
from fastload.cli.progress import DataWaitNote


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


def test_plain_progress_shows_a_note_after_the_rate():
    stream = io.StringIO()
    bar = PlainProgress(10, "loading", stream=stream, interval=3600)
    bar.set_postfix_str("data wait 31 %", refresh=False)
    bar.update(10)
    assert stream.getvalue().endswith(" img/s, data wait 31 %")


def test_the_bench_bar_notes_the_loaders_data_wait():
    class SlowSamples(fl.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            time.sleep(0.02)
            return np.zeros(2)

    stream = io.StringIO()
    bar = PlainProgress(12, "loading", stream=stream, interval=0)
    loader = fl.DataLoader(SlowSamples(), batch_size=2)
    note = DataWaitNote(bar, loader)
    note._shown_at -= 1.0  # due now
    for batch in loader:
        bar.update(len(batch))
        note.update()
    bar.update(0)
    # The consumer does nothing: it waits for the main process's batches all the time.
    assert bar.note == f"data wait {100 * loader.report().wait_share:.0f} %"
    assert loader.report().wait_share > 0.9
    assert stream.getvalue().rstrip().endswith(", data wait 100 %")
