"""Where new workers start: spread over the CPUs, yet with the affinity they inherited."""

import errno
import os
import subprocess
import sys

import numpy as np
import pytest

import fastload as fl
from fastload import cpu_placement
from fastload.cpu_placement import WorkerPlacement

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity (Linux)"),
]


_affinity_at_init = None


def record_affinity_at_init(worker_id):
    global _affinity_at_init
    _affinity_at_init = sorted(os.sched_getaffinity(0))


class AffinityPerSample(fl.Dataset):
    """Each sample: the CPU set of the worker that fetched it, then as its worker_init_fn saw it."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.array(sorted(os.sched_getaffinity(0)) + [-1] + _affinity_at_init, dtype=np.int64)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_keep_the_main_process_affinity(method):
    # Workers are pinned for a moment while they are placed; none of the
    # caller's code may see that, not even worker_init_fn.
    loader = fl.DataLoader(AffinityPerSample(), batch_size=2, num_workers=2,
                           multiprocessing_context=method, worker_init_fn=record_affinity_at_init)
    expected = sorted(os.sched_getaffinity(0))
    for _ in range(3 if method == "fork" else 1):  # new workers every epoch
        for batch in loader:
            for row in batch:
                assert row.tolist() == expected + [-1] + expected
    # The main thread held one CPU while it started a worker born there.
    assert sorted(os.sched_getaffinity(0)) == expected


def test_workers_of_a_main_process_restricted_to_one_cpu_stay_on_it():
    cpu = min(os.sched_getaffinity(0))
    script = (
        "import os, fastload as fl\n"
        "from test_cpu_placement import AffinityPerSample, record_affinity_at_init\n"
        f"os.sched_setaffinity(0, {{{cpu}}})\n"
        "loader = fl.DataLoader(AffinityPerSample(), batch_size=2, num_workers=2,\n"
        "                       worker_init_fn=record_affinity_at_init)\n"
        "print(sorted({tuple(row.tolist()) for batch in loader for row in batch}))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__),
                                                       os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str([(cpu, -1, cpu)])


@pytest.fixture
def fake_cpus(monkeypatch):
    """Pretend the main process may use ``allowed``, runs on ``current`` and that the
    kernel queues new workers on ``queued`` (by pid; the main process's CPU if absent);
    record setaffinity calls."""
    calls = []

    def configure(allowed, current, queued=None, fail_on=()):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(allowed))
        monkeypatch.setattr(cpu_placement, "_sched_getcpu", lambda: current)
        monkeypatch.setattr(cpu_placement, "_cpu_of", lambda pid: (queued or {}).get(pid, current))

        def setaffinity(pid, cpus):
            calls.append((pid, set(cpus)))
            if len(calls) in fail_on:
                raise OSError(errno.EINVAL, "Invalid argument")

        monkeypatch.setattr(os, "sched_setaffinity", setaffinity)
        return calls

    return configure


def test_workers_queued_behind_the_main_process_spread_with_its_cpu_last(fake_cpus):
    calls = fake_cpus(allowed={0, 1, 2, 3}, current=1)
    placement = WorkerPlacement()
    assert placement.order == [2, 3, 0, 1]
    for worker_index in range(5):
        placement.start_on_own_cpu(worker_index, 1000 + worker_index)
    # The fourth lands on the main process's CPU, where the kernel queued it: no move.
    moved = [(pid, cpus) for pid, cpus in calls if len(cpus) == 1]
    restores = [cpus for _, cpus in calls if len(cpus) > 1]
    assert moved == [(1000, {2}), (1001, {3}), (1002, {0}), (1004, {2})]
    assert restores == [{0, 1, 2, 3}] * 4
    assert [pid for pid, _ in calls] == [1000, 1000, 1001, 1001, 1002, 1002, 1004, 1004]


def _start_workers(placement, pids):
    for worker_index, pid in enumerate(pids):
        with placement.starting(worker_index):
            pass  # the fork
        placement.start_on_own_cpu(worker_index, pid)


def test_a_worker_whose_cpu_is_the_main_processs_is_born_there(fake_cpus):
    # Worker 0 is queued on the idle CPU 1: kept.  Worker 1's CPU is the main
    # process's: the main thread holds CPU 0 alone around its start (pid 0: the
    # calling thread), then the worker and the thread get both back.
    calls = fake_cpus(allowed={0, 1}, current=0, queued={20: 1, 21: 1})
    _start_workers(WorkerPlacement(), (20, 21))
    assert calls == [(0, {0}), (0, {0, 1}), (21, {0, 1})]


def test_workers_not_children_of_the_main_process_are_moved_instead(fake_cpus):
    # forkserver: a worker does not inherit the main thread's CPU set.
    calls = fake_cpus(allowed={0, 1}, current=0, queued={20: 1, 21: 1})
    _start_workers(WorkerPlacement(children_inherit_affinity=False), (20, 21))
    assert calls == [(21, {0}), (21, {0, 1})]


def test_a_main_thread_that_cannot_be_pinned_moves_the_worker_instead(fake_cpus):
    calls = fake_cpus(allowed={0, 1}, current=0, queued={20: 1, 21: 1}, fail_on=(1,))
    _start_workers(WorkerPlacement(), (20, 21))
    assert calls == [(0, {0}), (21, {0}), (21, {0, 1})]


def test_a_main_thread_that_moved_meanwhile_is_not_pinned(fake_cpus, monkeypatch):
    calls = fake_cpus(allowed={0, 1}, current=0, queued={20: 1, 21: 1})
    placement = WorkerPlacement()
    monkeypatch.setattr(cpu_placement, "_sched_getcpu", lambda: 1)  # pinning would move it
    _start_workers(placement, (20, 21))
    assert calls == [(21, {0}), (21, {0, 1})]


def test_the_main_thread_gets_its_cpus_back_when_a_start_fails(fake_cpus):
    calls = fake_cpus(allowed={0, 1}, current=0, queued={20: 1})
    placement = WorkerPlacement()
    placement.start_on_own_cpu(0, 20)
    with pytest.raises(OSError):
        with placement.starting(1):
            raise OSError(errno.EAGAIN, "fork failed")
    assert calls == [(0, {0}), (0, {0, 1})]


def test_a_cpu_of_its_own_chosen_by_the_kernel_is_kept(fake_cpus):
    # Worker 0 queued on idle CPU 3: kept.  Worker 1 queued there too: moved to
    # the first CPU nobody took (2).  Worker 2 queued on 0: kept.
    calls = fake_cpus(allowed={0, 1, 2, 3}, current=1, queued={10: 3, 11: 3, 12: 0})
    placement = WorkerPlacement()
    for worker_index, pid in enumerate((10, 11, 12)):
        placement.start_on_own_cpu(worker_index, pid)
    assert calls == [(11, {2}), (11, {0, 1, 2, 3})]


def test_unknown_cpus_keep_the_plain_order(fake_cpus):
    calls = fake_cpus(allowed={4, 2, 7}, current=-1, queued={1: -1, 2: -1})
    placement = WorkerPlacement()
    assert placement.order == [2, 4, 7]
    placement.start_on_own_cpu(0, 1)
    placement.start_on_own_cpu(1, 2)
    assert [cpus for _, cpus in calls] == [{2}, {2, 4, 7}, {4}, {2, 4, 7}]


def test_a_single_allowed_cpu_moves_nothing(fake_cpus):
    calls = fake_cpus(allowed={3}, current=3)
    placement = WorkerPlacement()
    placement.start_on_own_cpu(0, 1234)
    assert placement.order == [] and calls == []


def test_a_failed_restore_falls_back_to_every_cpu_rather_than_a_pin(fake_cpus):
    # The CPU set changed between reading and restoring it: the kernel refuses the
    # old set, so the worker gets every CPU (intersected by the kernel) instead.
    calls = fake_cpus(allowed={0, 1}, current=0, fail_on=(2,))
    WorkerPlacement().start_on_own_cpu(0, 4321)
    assert [cpus for _, cpus in calls] == [{1}, {0, 1}, set(range(os.cpu_count() or 1))]


def test_a_failed_pin_leaves_the_worker_alone(fake_cpus):
    calls = fake_cpus(allowed={0, 1}, current=0, fail_on=(1,))
    WorkerPlacement().start_on_own_cpu(0, 4321)
    assert len(calls) == 1


def test_the_cpu_a_process_is_on_is_read_from_proc():
    assert cpu_placement._cpu_of(os.getpid()) in os.sched_getaffinity(0)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    assert cpu_placement._cpu_of(child.pid) == -1  # reaped: gone


def test_real_process_ends_with_its_inherited_affinity():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        placement = WorkerPlacement()
        placement.start_on_own_cpu(0, child.pid)
        assert os.sched_getaffinity(child.pid) == os.sched_getaffinity(0)
    finally:
        child.kill()
        child.wait(timeout=10)


def test_a_process_that_is_gone_is_ignored():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    placement = WorkerPlacement()
    placement.start_on_own_cpu(0, child.pid)  # no error: placement is only a hint
    placement.start_on_own_cpu(1, None)


def test_a_worker_gets_its_first_message_only_once_placed(monkeypatch):
    import fastload.pool as pool_module

    events = []
    real_send, real_place = pool_module.send_frame, WorkerPlacement.start_on_own_cpu

    def send_frame(fd, data):
        events.append(("send", fd))
        real_send(fd, data)

    def start_on_own_cpu(self, worker_index, pid):
        events.append(("placed", worker_index))
        real_place(self, worker_index, pid)

    monkeypatch.setattr(pool_module, "send_frame", send_frame)
    monkeypatch.setattr(WorkerPlacement, "start_on_own_cpu", start_on_own_cpu)
    loader = fl.DataLoader(list(range(40)), batch_size=4, num_workers=2)
    iterator = iter(loader)
    task_fds = list(iterator._pool._task_fds)
    assert sum(len(batch) for batch in iterator) == 40
    for worker_index, fd in enumerate(task_fds):
        placed = events.index(("placed", worker_index))
        first_send = events.index(("send", fd))
        assert placed < first_send
