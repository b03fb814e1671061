"""num_workers="auto": the climb converges on pipelines whose best setting is known,
keeps under its memory budget, and keeps order and determinism while it adds and
retires workers mid-epoch (against a fixed count seeded per batch, as auto is)."""

import gc
import multiprocessing
import os
import random
import signal
import threading
import time
import weakref

import numpy as np
import pytest

import fastload as fl
from fastload._loading import stage_clock
from fastload._loading.autotune import SETTLED_WINDOW, WINDOW, AutoOptions, HillClimb
from fastload._loading.memory_budget import worker_memory

pytestmark = [pytest.mark.timeout(120),
              # the references run 3 workers on whatever CPUs the machine has
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]


class Sleepy(fl.Dataset):
    """Each sample sleeps ``seconds`` (I/O-like: more workers than CPUs help) and
    draws from the global generators, as augmentations do."""

    def __init__(self, n, seconds):
        self.n, self.seconds = n, seconds

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.seconds:
            time.sleep(self.seconds)
        return np.array([i, np.random.randint(1 << 30), random.randrange(1 << 30)])


def run(loader, step=0.0, seconds=None):
    """Every batch (copied), sleeping ``step`` after each; stop after ``seconds``."""
    batches, start = [], time.monotonic()
    for batch in loader:
        batches.append(batch.copy())
        if step:
            time.sleep(step)
        if seconds is not None and time.monotonic() - start > seconds:
            break
    return batches


def reference(dataset, workers, **options):
    """A fixed worker count, seeded per batch as auto mode is."""
    loader = fl.DataLoader(dataset, num_workers=workers, **options)
    loader._seed_per_batch = True
    return loader


def live_workers(loader):
    return len(loader._last_iterator()._pool.live_workers)


def test_sleep_bound_samples_get_more_workers_than_one():
    # 20 ms a batch of sleeping: workers help far past the CPUs.
    loader = fl.DataLoader(Sleepy(4000, 0.01), batch_size=2, num_workers="auto", generator=0)
    run(loader, seconds=5.0)
    assert loader._auto_choice["num_workers"] >= 3
    assert loader.num_workers == 1  # the climb's choice applies from the next epoch on
    report = loader.report()  # every worker the climb started is in the account
    assert report.autopilot and report.num_workers == loader._auto_choice["num_workers"]
    assert len(report.makers) >= report.num_workers
    assert f"num_workers='auto', {report.num_workers} at the latest choice" in str(report)


def test_a_consumer_bound_loop_keeps_one_worker():
    # A batch takes a worker ~2 ms; the consumer 30 ms: one worker keeps up.
    loader = fl.DataLoader(Sleepy(400, 0.001), batch_size=2, num_workers="auto", generator=0)
    run(loader, step=0.03, seconds=3.0)
    # (A second worker, when the machine's load slows the first a while.)
    assert loader._auto_choice["num_workers"] <= 2


def test_batches_keep_sampler_order_and_seeds_while_workers_come_and_go():
    dataset = Sleepy(240, 0.004)
    auto = fl.DataLoader(dataset, batch_size=3, shuffle=True, num_workers="auto", generator=7)
    got = run(auto)
    assert auto._auto_choice["num_workers"] > 1  # workers were added mid-epoch
    for workers in (1, 3):
        want = run(reference(dataset, workers, batch_size=3, shuffle=True, generator=7))
        assert len(got) == len(want) == 80
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


class TorchDraws(fl.Dataset):
    """Each sample draws from torch's generator, as torchvision's random transforms do."""

    def __len__(self):
        return 90

    def __getitem__(self, i):
        import torch

        return np.array([i, int(torch.randint(1 << 30, ()))])


def test_torch_draws_do_not_depend_on_the_workers_that_made_them(torch):
    dataset = TorchDraws()
    got = run(fl.DataLoader(dataset, batch_size=3, num_workers="auto", generator=4))
    want = run(reference(dataset, 3, batch_size=3, generator=4))
    assert len(got) == len(want) == 30
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    # Seeded per batch: a batch's draws start a stream of their own.
    assert len({tuple(batch[:, 1]) for batch in got}) == 30


def test_retired_workers_are_no_error_and_change_no_batch():
    dataset = Sleepy(120, 0.001)
    loader = fl.DataLoader(dataset, batch_size=2, num_workers="auto", generator=3)
    loader._auto_choice.update(num_workers=4, prefetch_factor=2)  # as a state would set it
    iterator = iter(loader)
    assert live_workers(loader) == 4
    got = []
    for batch in iterator:
        got.append(batch.copy())
        time.sleep(0.03)  # the consumer is the bottleneck: workers are retired
    assert loader._auto_choice["num_workers"] < 4
    assert iterator._pool.retired  # retired mid-epoch, and the epoch ended without error
    want = run(reference(dataset, 2, batch_size=2, generator=3))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_a_dropped_auto_iterator_goes_at_once_without_the_collector(no_leaks):
    # The iterator and its autopilot referred to each other: an iterator left
    # half way (a loop broken out of) kept its workers, pipes and ring until the
    # collector ran, and a process running many epochs ran out of descriptors.
    loader = fl.DataLoader(Sleepy(400, 0.001), batch_size=2, num_workers="auto")
    descriptors = []
    gc.disable()
    try:
        for _ in range(4):
            iterator = iter(loader)
            next(iterator)
            gone = weakref.ref(iterator)
            del iterator
            assert gone() is None  # freed at once, as a fixed count's iterator is
            descriptors.append(len(os.listdir("/proc/self/fd")))
    finally:
        gc.enable()
    assert descriptors[-1] <= descriptors[0]


def test_a_reset_report_starts_the_climbs_window_again():
    # 20 ms of sleeping per batch: more workers help, before and after the reset.
    loader = fl.DataLoader(Sleepy(400, 0.01), batch_size=2, num_workers="auto", generator=0)
    iterator = iter(loader)
    for _ in range(10):
        next(iterator)
    loader.report(reset=True)
    next(iterator)
    # The window in progress was of the old account: a new one began at the reset.
    assert loader._auto_climb.window.resets == loader._ledger.resets
    deadline = time.monotonic() + 30
    while loader._auto_choice["num_workers"] < 2 and time.monotonic() < deadline:
        next(iterator)
    assert loader._auto_choice["num_workers"] >= 2


def test_a_settled_climb_judges_longer_windows():
    # A consumer-bound loop: the climb has nothing to do but watch.
    loader = fl.DataLoader(Sleepy(4000, 0), batch_size=2, num_workers="auto", generator=0)
    iterator = iter(loader)  # the climb is made here; its first window begins at the first batch
    climb = loader._auto_climb
    judged_windows = []  # the consumer's seconds in each window judged, and whether settled
    judge = climb.judge

    def recording_judge(*args, **kwargs):
        judged_windows.append((loader._ledger.spent - climb.window.spent, climb.settled))
        return judge(*args, **kwargs)

    climb.judge = recording_judge
    run(iterator, step=0.01, seconds=1.5)
    climb.settled, climb._settled_at = True, time.monotonic()
    run(iterator, step=0.01, seconds=3.5)
    unsettled = [spent for spent, settled in judged_windows if not settled]
    settled = [spent for spent, settled in judged_windows if settled]
    assert unsettled and min(unsettled) >= WINDOW and min(unsettled) < SETTLED_WINDOW
    assert settled and all(spent >= SETTLED_WINDOW for spent in settled)


def test_a_worker_that_dies_is_still_an_error():
    loader = fl.DataLoader(Sleepy(400, 0.01), batch_size=2, num_workers="auto")
    iterator = iter(loader)
    next(iterator)
    os.kill(iterator.worker_pids[0], signal.SIGKILL)
    with pytest.raises(RuntimeError, match="killed by signal"):
        for _ in iterator:
            pass


class Growing(fl.Dataset):
    """Each worker's copy grows by ``grow`` bytes at its first sample (touched pages)."""

    def __init__(self, n, grow):
        self.n, self.grow, self.ballast = n, grow, None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.ballast is None:
            self.ballast = np.ones(self.grow, dtype=np.uint8)
        time.sleep(0.01)
        return np.array([i])


def test_workers_that_grow_200_mb_each_stay_under_the_budget():
    grow = 200 << 20
    budget = int(2.6 * grow)  # two grown workers fit, three do not
    loader = fl.DataLoader(Growing(2000, grow), batch_size=2, num_workers="auto",
                           memory_budget=budget)
    iterator = iter(loader)
    peak, done = [0], threading.Event()

    def watch():
        while not done.wait(0.05):
            processes = iterator._pool.processes  # (a worker being added has no process yet)
            pids = [processes[w].pid for w in iterator._pool.live_workers if w < len(processes)]
            peak[0] = max(peak[0], sum(worker_memory(pid) or 0 for pid in pids)
                          + iterator._ring.mapped_bytes())

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        start = time.monotonic()
        for _ in iterator:
            if time.monotonic() - start > 4.0:
                break
    finally:
        done.set()
        watcher.join()
    # Sleeping samples: without the budget the climb reaches 3 or more (the first
    # test); with it, at most 2 (1 when the load made the second look useless).
    assert 1 <= loader._auto_choice["num_workers"] <= 2
    assert grow < peak[0] <= budget


def _pss_reads_in_forked_workers(monkeypatch):
    """A counter of the PSS readings that forked workers (and this process) take."""
    reads = multiprocessing.get_context("fork").Value("i", 0)
    real = stage_clock.pss_bytes

    def counted(pid):
        with reads.get_lock():
            reads.value += 1
        return real(pid)

    monkeypatch.setattr(stage_clock, "pss_bytes", counted)
    return reads


def _epoch_begun(loader):
    """An epoch's iterator 20 slow steps in, and (what the climb counts its workers
    and ring at, their PSS read here)."""
    iterator = iter(loader)
    for _ in range(20):
        next(iterator)
        time.sleep(0.02)
    pool = iterator._pool
    pids = [pool.processes[w].pid for w in pool.live_workers]
    assert len(pids) == 1  # (more would share the pages that one worker's reading split in two)
    return iterator, (iterator._auto.memory()[0],
                      sum(worker_memory(pid) for pid in pids) + iterator._ring.mapped_bytes())


def test_a_later_epochs_workers_count_their_memory_from_the_last_ones(monkeypatch):
    reads = _pss_reads_in_forked_workers(monkeypatch)
    ballast = np.ones(256 << 20, dtype=np.uint8)  # the caller's memory, which workers share
    loader = fl.DataLoader(Sleepy(120, 0), batch_size=2, num_workers="auto", generator=3,
                           multiprocessing_context="fork")
    run(loader, step=0.02)  # a consumer-bound loop: one worker throughout
    assert reads.value >= 1
    for _ in range(2):
        reads.value = 0
        iterator, (counted, true) = _epoch_begun(loader)
        assert reads.value == 0  # no worker walked its page tables
        assert counted == pytest.approx(true, rel=0.1)
        for _ in iterator:
            pass
    # A reading taken while more workers shared the pages (each held a smaller
    # share of them) is no figure for fewer: the new worker reads its own.
    loader._auto_climb.worker_memory = (1 << 20, 1 << 20, 2)
    reads.value = 0
    iterator, (counted, true) = _epoch_begun(loader)
    assert reads.value >= 1
    assert counted == pytest.approx(true, rel=0.1)
    del iterator, ballast


def test_state_dict_records_the_choice_and_a_resumed_run_starts_there():
    dataset = Sleepy(200, 0.004)
    loader = fl.DataLoader(dataset, batch_size=2, num_workers="auto", generator=5)
    # Sleeping samples and a consumer that does nothing: the climb keeps 3 or adds.
    loader._auto_choice.update(num_workers=3, prefetch_factor=2)
    iterator = iter(loader)
    head = [next(iterator).copy() for _ in range(60)]
    state = loader.state_dict()
    chosen = state["autopilot"]["num_workers"]
    assert chosen == loader._auto_choice["num_workers"] >= 3
    rest = [batch.copy() for batch in iterator]

    resumed = fl.DataLoader(dataset, batch_size=2, num_workers="auto", generator=5)
    resumed.load_state_dict(state)
    again = iter(resumed)
    assert live_workers(resumed) == chosen
    tail = [batch.copy() for batch in again]
    assert len(tail) == len(rest) == 40
    for a, b in zip(tail, rest):
        np.testing.assert_array_equal(a, b)
    assert len(head) == 60


def test_persistent_workers_keep_the_climb_across_epochs():
    dataset = Sleepy(60, 0.004)
    loader = fl.DataLoader(dataset, batch_size=2, num_workers="auto", persistent_workers=True,
                           generator=1)
    want = reference(dataset, 2, batch_size=2, generator=1, persistent_workers=True)
    for _ in range(2):
        for a, b in zip(run(loader), run(want)):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("options, message", [
    (dict(num_workers="automatic"), "num_workers should be an int >= 0 or 'auto'"),
    (dict(num_workers=2, prefetch_factor="auto"), "prefetch_factor should be an int, or 'auto'"),
    (dict(num_workers=2, memory_budget=1 << 30), "memory_budget is the budget of"),
    (dict(num_workers="auto", memory_budget=0), "memory_budget should be a number of bytes > 0"),
])
def test_bad_auto_arguments_are_refused_at_construction(options, message):
    with pytest.raises(ValueError, match=message):
        fl.DataLoader(Sleepy(4, 0.0), **options)


def test_auto_refuses_an_iterable_dataset():
    class Stream(fl.IterableDataset):
        def __iter__(self):
            return iter(range(4))

    with pytest.raises(ValueError, match="needs a map-style dataset"):
        fl.DataLoader(Stream(), num_workers="auto")


def new_climb(workers, clock=lambda: 0.0, **options):
    """A climb starting at ``workers`` (prefetch 2, no budget, up to 16 workers)."""
    fields = dict(start_workers=workers, start_prefetch=2, auto_prefetch=False,
                  memory_budget=None, max_workers=16)
    return HillClimb(workers, 2, AutoOptions(**{**fields, **options}), clock=clock)


def judged(climb, *windows, **kw):
    """The climb's decisions over ``windows`` of (rate, wait share, idle share, needed)."""
    return [climb.judge(rate, wait, idle, needed, None, None, None, **kw)
            for rate, wait, idle, needed in windows]


def test_the_climb_adds_while_it_gains_and_settles_when_it_stops():
    climb = new_climb(1)
    # The first window (workers starting) is not judged; a count's rate is the
    # median of two windows.  The consumer waits; 4 workers would keep up.
    assert judged(climb, (99, .8, 0, 4), (10, .8, 0, 4), (10, .8, 0, 4)) == [None, None, ("add", 1)]
    # Two windows at 2 (after the one a change skips): 19 > 10: kept, and doubled.
    assert judged(climb, (0, .8, 0, 4), (19, .5, 0, 4), (19, .5, 0, 4)) == [None, None, ("add", 2)]
    # Four gave less than 5 % over two: back to two, then one at a time.
    assert judged(climb, (0, .4, 0, 4), (19.5, .4, 0, 4), (19.6, .4, 0, 4)) \
        == [None, None, ("retire", 2)]
    assert judged(climb, (0, .4, 0, 4), (19, .4, 0, 4)) == [None, ("add", 1)]
    assert judged(climb, (0, .4, 0, 4), (19.2, .4, 0, 4), (19.1, .4, 0, 4)) \
        == [None, None, ("retire", 1)]
    assert climb.settled and climb.workers == 2
    # Settled, only the budget still moves it.
    assert climb.judge(19.0, 0.4, 0.0, 4, 900, 400, 1000) is None
    assert climb.judge(19.0, 0.4, 0.0, 4, 1100, 400, 1000) == ("retire", 1)
    assert climb.workers == 1 and climb.cap == 1


def test_the_climb_retires_idle_workers_until_the_consumer_waits():
    climb = new_climb(3)
    # The consumer never waits and the workers sit idle: one fewer, while that holds.
    assert judged(climb, (0, 0, 0, 1), (10, 0, .7, 1), (10, 0, .7, 1)) \
        == [None, None, ("retire", 1)]
    assert judged(climb, (0, 0, 0, 1), (10, 0, .6, 1), (10, .01, .6, 1)) \
        == [None, None, ("retire", 1)]
    # At one worker the consumer waits: the one retired comes back, and the climb settles.
    assert judged(climb, (0, 0, 0, 1), (8, .2, .1, 2), (8, .2, .1, 2)) == [None, None, ("add", 1)]
    assert climb.settled and climb.workers == 2


def test_a_settled_climb_looks_again_a_minute_later():
    now = [0.0]
    climb = new_climb(2, clock=lambda: now[0])
    assert judged(climb, (0, .8, 0, 8), (10, .8, 0, 8), (10, .8, 0, 8)) == [None, None, ("add", 2)]
    assert judged(climb, (0, .8, 0, 8), (10, .8, 0, 8), (10, .8, 0, 8)) == [None, None, ("retire", 2)]
    assert judged(climb, (0, .8, 0, 8), (10, .8, 0, 8)) == [None, ("add", 1)]
    assert judged(climb, (0, .8, 0, 8), (10, .8, 0, 8), (10, .8, 0, 8)) == [None, None, ("retire", 1)]
    assert climb.settled and climb.workers == 2
    now[0] = 59.0
    assert judged(climb, (0, .8, 0, 8), (30, .8, 0, 8), (30, .8, 0, 8)) == [None, None, None]
    # A minute on (another job left the machine, say): one worker at a time again.
    now[0] = 61.0
    assert judged(climb, (30, .8, 0, 8), (30, .8, 0, 8)) == [None, ("add", 1)]
    assert not climb.settled and climb.workers == 3


def test_windows_that_disagree_are_looked_at_again_before_a_decision():
    climb = new_climb(1)
    # 10 and 14 disagree by more than 5 % either side: a third window, a fourth,
    # and then the median of the four decides.
    assert judged(climb, (0, .8, 0, 4), (10, .8, 0, 4), (14, .8, 0, 4), (12, .8, 0, 4)) \
        == [None, None, None, None]
    assert climb.judge(12, .8, 0, 4, None, None, None) == ("add", 1)
    assert climb.rate(1) == 12
    # Two that agree are enough.
    assert judged(climb, (0, .8, 0, 4), (20, .8, 0, 4), (20.5, .8, 0, 4)) \
        == [None, None, ("add", 2)]


def test_the_climb_settles_at_the_fastest_count_when_its_time_is_up():
    now = [0.0]
    climb = new_climb(1, clock=lambda: now[0])
    assert judged(climb, (0, .8, 0, 8), (10, .8, 0, 8), (10, .8, 0, 8)) == [None, None, ("add", 1)]
    assert judged(climb, (0, .8, 0, 8), (30, .8, 0, 8), (30, .8, 0, 8)) == [None, None, ("add", 2)]
    assert judged(climb, (0, .8, 0, 8), (20, .8, 0, 8)) == [None, None]
    now[0] = 11.0  # past SETTLE_SECONDS: back to 2, whose windows were fastest
    assert climb.judge(20, .8, 0, 8, None, None, None) == ("retire", 2)
    assert climb.settled and climb.workers == 2


def test_epochs_shorter_than_a_window_still_climb():
    # 12 batches of 20 ms of sleeping: an epoch at one worker is shorter than a
    # window, so the climb's windows run across epochs.
    loader = fl.DataLoader(Sleepy(24, 0.01), batch_size=2, num_workers="auto", generator=0)
    for _ in range(40):
        run(loader)
        if loader._auto_choice["num_workers"] >= 2:
            break
    chosen = loader._auto_choice["num_workers"]
    assert chosen >= 2
    iterator = iter(loader)
    assert loader.num_workers == chosen  # the next epoch starts where the climb is
    assert len(list(iterator)) == 12


def test_workers_added_under_forkserver_unpickle_the_dataset_and_change_no_batch():
    from datasets_for_workers import SlowDataset

    dataset = SlowDataset(n=800, delay=0.005)
    loader = fl.DataLoader(dataset, batch_size=2, num_workers="auto",
                           multiprocessing_context="forkserver")
    got = [(images.copy(), labels.copy()) for images, labels in loader]
    assert loader._auto_choice["num_workers"] > 1  # added mid-epoch, from the pickled payload
    want = list(reference(dataset, 1, batch_size=2))
    assert len(got) == len(want) == 400
    for (images, labels), (want_images, want_labels) in zip(got, want):
        np.testing.assert_array_equal(images, want_images)
        np.testing.assert_array_equal(labels, want_labels)


def test_cpu_bound_workers_past_the_cpus_are_added_one_at_a_time():
    climb = new_climb(2, cpus=2)
    # The consumer waits, 8 workers would keep up, but the work is CPU-bound:
    # past the CPUs a worker only fills the gaps between the others' batches.
    assert judged(climb, *[(10, .8, 0, 8)] * 3, cpu_bound=True)[-1] == ("add", 1)
    waiting = new_climb(2, cpus=2)  # waiting on I/O: doubling
    assert judged(waiting, *[(10, .8, 0, 8)] * 3)[-1] == ("add", 2)


def test_auto_prefetch_deepens_the_ring_when_the_consumer_waits_on_idle_workers():
    climb = new_climb(2, auto_prefetch=True, cpus=2)
    # Waiting while the workers sit idle half the time: bursts the ring cannot smooth.
    assert judged(climb, *[(10, .3, .6, 3)] * 3)[-1] == ("deepen", 1)
    assert climb.prefetch == 3 and climb.workers == 2
    fixed = new_climb(2, cpus=2)
    assert judged(fixed, *[(10, .3, .6, 3)] * 3)[-1] == ("add", 1)


def test_auto_prefetch_keeps_order_and_batches():
    dataset = Sleepy(200, 0.003)
    loader = fl.DataLoader(dataset, batch_size=2, num_workers="auto", prefetch_factor="auto",
                           generator=4)
    got = run(loader, step=0.002)
    assert 2 <= loader._auto_choice["prefetch_factor"] <= 8
    want = run(reference(dataset, 2, batch_size=2, generator=4))
    assert len(got) == len(want) == 100
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
