"""loader.report(): the consumer's wait and each stage's share match delays injected
with sleeps (long enough to stand out on a loaded machine), with and without workers."""

import time

import numpy as np
import pytest

import fastload as fl
from fastload.vision import DatasetFolder

pytestmark = pytest.mark.timeout(120)

# Shares are fractions of a whole: "within 10 %" is an absolute 0.1.
TOLERANCE = 0.1


class SleepySamples(fl.Dataset):
    """Each sample sleeps ``seconds`` in __getitem__."""

    def __init__(self, n, seconds):
        self.n, self.seconds = n, seconds

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.seconds)
        return np.full(8, i, dtype=np.int64)


class SleepyCollate:
    def __init__(self, seconds):
        self.seconds = seconds

    def __call__(self, samples):
        time.sleep(self.seconds)
        return fl.default_collate(samples)


def consume(loader, step_seconds):
    count = 0
    for _ in loader:
        time.sleep(step_seconds)
        count += 1
    return count


def test_without_workers_stage_and_wait_shares_match_the_sleeps():
    # A batch: 2 samples x 15 ms fetched, 20 ms collating; the consumer's step 40 ms.
    loader = fl.DataLoader(SleepySamples(24, 0.015), batch_size=2, collate_fn=SleepyCollate(0.02))
    assert consume(loader, 0.04) == 12
    report = loader.report()
    assert report.batches == 12 and report.made == 12 and report.num_workers == 0
    shares = report.stage_shares
    assert shares["fetch"] == pytest.approx(30 / 50, abs=TOLERANCE)
    assert shares["collate"] == pytest.approx(20 / 50, abs=TOLERANCE)
    assert report.wait_share == pytest.approx(50 / 90, abs=TOLERANCE)
    # The consumer takes a batch every ~40 ms, a worker makes one in ~50: 2 keep up.
    assert report.workers_needed == 2
    assert [maker.worker for maker in report.makers] == [None]


def test_with_two_workers_the_consumer_waits_for_slow_workers():
    # A worker makes a batch in 60 ms (40 fetch, 20 collate); the consumer's step is
    # 10 ms: two workers give one every 30 ms, so it waits ~20 of every ~30 ms.
    loader = fl.DataLoader(SleepySamples(48, 0.02), batch_size=2, num_workers=2,
                           collate_fn=SleepyCollate(0.02))
    assert consume(loader, 0.01) == 24
    report = loader.report()
    shares = report.stage_shares
    assert shares["fetch"] == pytest.approx(40 / 60, abs=TOLERANCE)
    assert shares["collate"] == pytest.approx(20 / 60, abs=TOLERANCE)
    assert report.wait_share == pytest.approx(20 / 30, abs=TOLERANCE)
    assert [maker.worker for maker in report.makers] == [0, 1]
    assert [maker.batches for maker in report.makers] == [12, 12]
    for maker in report.makers:
        assert maker.idle_share < TOLERANCE  # always a task waiting: never short of a slot
        assert maker.cpu_share is not None and maker.cpu_share < 0.5  # asleep, not computing
    # About 60 ms / 10 ms workers would remove the wait.
    assert 5 <= report.workers_needed <= 7
    text = str(report)
    assert text.startswith(f"data loading costs {100 * report.wait_share:.0f} % of step time")
    assert f"about {report.workers_needed} workers would remove it" in text
    assert "worker 1" in text


def test_with_two_workers_a_slow_consumer_leaves_them_waiting_for_slots():
    # A batch takes a worker ~4 ms; the consumer's step is 50 ms.
    loader = fl.DataLoader(SleepySamples(40, 0.002), batch_size=2, num_workers=2)
    consume(loader, 0.05)
    report = loader.report()
    assert report.wait_share < TOLERANCE
    # Each worker makes a batch every ~100 ms and is busy ~4 of them (more on a
    # loaded machine, where a 2 ms sleep overshoots).
    assert report.stage_shares["idle"] > 0.8
    assert report.workers_needed == 1
    assert "the consumer is the bottleneck" in report.verdict
    assert "about 1 worker would keep up" in report.verdict


def _text_loader(path):
    time.sleep(0.03)  # the "decode"
    with open(path) as f:
        return np.array([len(f.read())])


def _slow_transform(sample):
    time.sleep(0.01)
    return sample


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_folder_dataset_tells_decoding_from_its_transforms(tmp_path, num_workers):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(4):
            (tmp_path / name / f"{i}.txt").write_text("x" * i)
    folder = DatasetFolder(str(tmp_path), _text_loader, extensions=(".txt",),
                           transform=_slow_transform)
    loader = fl.DataLoader(folder, batch_size=2, num_workers=num_workers)
    consume(loader, 0.0)
    report = loader.report()
    shares = report.stage_shares
    assert shares["decode"] == pytest.approx(30 / 40, abs=TOLERANCE)
    assert shares["transform"] == pytest.approx(10 / 40, abs=TOLERANCE)
    assert shares["fetch"] >= shares["decode"] + shares["transform"] - 1e-9
    assert "of which decode" in report.verdict


def test_reset_starts_a_new_account_and_persistent_workers_count_every_epoch():
    loader = fl.DataLoader(SleepySamples(8, 0.001), batch_size=2, num_workers=2,
                           persistent_workers=True)
    consume(loader, 0.0)
    first = loader.report(reset=True)
    assert first.batches == 4 and first.made == 4
    consume(loader, 0.0)
    consume(loader, 0.0)
    second = loader.report()
    assert second.batches == 8 and second.made == 8  # the same workers, two epochs
    assert second.startup_seconds < first.startup_seconds + second.startup_seconds


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_array_dataset_counts_its_gather_as_fetching(num_workers):
    loader = fl.DataLoader(fl.ArrayDataset(np.arange(64.0).reshape(32, 2)), batch_size=4,
                           num_workers=num_workers)
    consume(loader, 0.0)
    report = loader.report()
    assert report.made == 8
    assert report.stage_seconds["fetch"] > 0 and report.stage_seconds["collate"] == 0


def test_before_any_batch_the_report_says_so():
    loader = fl.DataLoader(SleepySamples(4, 0.0), batch_size=2)
    report = loader.report()
    assert report.batches == 0 and report.wait_share == 0.0 and report.workers_needed is None
    assert str(report).startswith("no batches handed out yet")


def test_a_pickled_loader_starts_a_fresh_account():
    import pickle

    loader = fl.DataLoader(fl.ArrayDataset(np.arange(16.0)), batch_size=4)
    consume(loader, 0.0)
    copy = pickle.loads(pickle.dumps(loader))
    assert loader.report().batches == 4 and copy.report().batches == 0
    consume(copy, 0.0)
    assert copy.report().batches == 4
