"""What auto's memory budget counts: a process's PSS, and the memory available."""

import multiprocessing
import os
import subprocess
import sys

import numpy as np
import pytest

from fastload._loading import memory_budget
from fastload._loading import stage_clock
from fastload._loading.stage_clock import MEMORY, MEMORY_SAMPLE_INTERVAL, PSS_REREAD_SECONDS, \
    RESIDENT, StageTotals
from fastload._loading.memory_budget import DEFAULT_SHARE, available_memory, default_budget, \
    worker_memory


def _pss_from_smaps(pid):
    """PSS summed over the mappings of /proc/<pid>/smaps (the long form), bytes."""
    with open(f"/proc/{pid}/smaps") as f:
        return 1024 * sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="needs Linux 4.14+")
def test_a_process_is_counted_at_its_pss_and_grows_with_what_it_touches():
    before = worker_memory(os.getpid())
    assert before == pytest.approx(_pss_from_smaps(os.getpid()), rel=0.05)
    ballast = np.ones(64 << 20, dtype=np.uint8)  # 64 MB touched
    assert worker_memory(os.getpid()) - before >= 60 << 20
    del ballast


def test_a_gone_process_counts_nothing():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    assert worker_memory(child.pid) is None


def test_without_smaps_rollup_the_resident_size_is_counted(monkeypatch):
    monkeypatch.setattr(memory_budget, "pss_bytes", lambda pid: None)
    with open(f"/proc/{os.getpid()}/statm") as f:
        resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    assert worker_memory(os.getpid()) == pytest.approx(resident, rel=0.1)


def test_a_worker_keeps_its_pss_current_by_its_resident_size():
    totals = StageTotals()
    totals.watch_memory = True
    totals.sample_cpu(1.0)
    first = totals.seconds[MEMORY]
    assert first == pytest.approx(_pss_from_smaps(os.getpid()), rel=0.05)
    ballast = np.ones(64 << 20, dtype=np.uint8)  # past PSS_REREAD_BYTES: read again
    totals.sample_cpu(2.0)
    assert totals.seconds[MEMORY] - first >= 60 << 20
    del ballast
    quiet = StageTotals()
    quiet.sample_cpu(1.0)
    assert quiet.seconds[MEMORY] == -1  # only num_workers="auto" weighs memory


def test_a_worker_reads_its_memory_at_most_every_memory_interval():
    totals = StageTotals()
    totals.watch_memory = True
    totals.sample_cpu(1.0)
    first = totals.seconds[MEMORY]
    ballast = np.ones(64 << 20, dtype=np.uint8)
    # Its CPU time is due again, its memory not yet: the figure stands.
    totals.sample_cpu(1.0 + MEMORY_SAMPLE_INTERVAL / 2)
    assert totals.seconds[MEMORY] == first
    totals.sample_cpu(1.0 + MEMORY_SAMPLE_INTERVAL)
    assert totals.seconds[MEMORY] - first >= 60 << 20
    del ballast


def _counting_pss_reads(monkeypatch):
    """The pids whose PSS this process reads from now on."""
    calls, real = [], stage_clock.pss_bytes
    monkeypatch.setattr(stage_clock, "pss_bytes", lambda pid: calls.append(pid) or real(pid))
    return calls


def _hinted(hint_of_resident):
    """An auto worker's totals, given a hint made of this process's resident size."""
    resident = stage_clock._OWN_STATM.resident()
    totals = StageTotals()
    totals.watch_memory = True
    totals.memory_hint = hint_of_resident(resident)
    return totals, resident


def test_a_worker_given_a_siblings_reading_counts_itself_from_it_until_it_moves(monkeypatch):
    reads = _counting_pss_reads(monkeypatch)
    # The sibling held 8 MB more.
    totals, resident = _hinted(lambda resident: (50 << 20, resident + (8 << 20)))
    totals.sample_cpu(1.0)
    assert reads == []
    assert totals.seconds[MEMORY] == pytest.approx(42 << 20, abs=1 << 20)
    assert totals.seconds[RESIDENT] == pytest.approx(resident, abs=1 << 20)
    ballast = np.ones(64 << 20, dtype=np.uint8)  # past PSS_REREAD_BYTES: its own reading
    totals.sample_cpu(2.0)
    assert reads == [os.getpid()]
    assert totals.seconds[MEMORY] == pytest.approx(_pss_from_smaps(os.getpid()), rel=0.05)
    # A hint is for a worker that has no reading yet (a persistent one is told
    # every epoch's): its own stands.
    totals.memory_hint = (1 << 20, 1 << 20)
    totals.sample_cpu(3.0)
    assert totals.seconds[MEMORY] == pytest.approx(_pss_from_smaps(os.getpid()), rel=0.05)
    del ballast


def test_a_hinted_worker_reads_its_own_pss_once_the_reread_interval_passes(monkeypatch):
    reads = _counting_pss_reads(monkeypatch)
    # Counted at most at its resident size.
    totals, resident = _hinted(lambda resident: (resident * 10, resident))
    totals.sample_cpu(1.0)
    assert reads == []
    assert totals.seconds[MEMORY] == pytest.approx(resident, abs=1 << 20)
    totals.sample_cpu(1.0 + PSS_REREAD_SECONDS)
    assert reads == [os.getpid()]
    assert totals.seconds[MEMORY] == pytest.approx(_pss_from_smaps(os.getpid()), rel=0.05)


def _child_reads_its_own_resident_size(answers):
    ballast = np.ones(256 << 20, dtype=np.uint8)  # the child's alone: the parent has no such pages
    with open("/proc/self/statm") as f:
        expected = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    answers.send((stage_clock._OWN_STATM.resident(), expected))
    del ballast


@pytest.mark.timeout(120)
def test_a_forked_child_reads_its_own_resident_size_not_its_parents():
    # The parent has its descriptor open; the child must not read through it.
    assert stage_clock._OWN_STATM.resident() is not None
    receiver, sender = multiprocessing.get_context("fork").Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(
        target=_child_reads_its_own_resident_size, args=(sender,))
    child.start()
    try:
        assert receiver.poll(60)
        read, expected = receiver.recv()
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join(30)
    assert child.exitcode == 0
    assert read == pytest.approx(expected, rel=0.05)
    assert stage_clock._OWN_STATM.resident() < read - (128 << 20)  # the parent's is still its own


def test_the_default_budget_is_the_stated_share_of_the_available_memory(monkeypatch):
    monkeypatch.setattr(memory_budget, "available_memory", lambda: 8 << 30)
    assert default_budget() == int(DEFAULT_SHARE * (8 << 30)) == 4 << 30


def test_a_cgroup_limit_tighter_than_the_machine_is_what_is_available(monkeypatch):
    machine = available_memory()
    assert machine is not None and machine > 0
    monkeypatch.setattr(memory_budget, "cgroup_memory_room", lambda: (1 << 20, 2 << 20, "memory.max"))
    assert available_memory() == 1 << 20
    with open("/proc/meminfo") as f:
        mem_available = next(int(line.split()[1]) * 1024 for line in f
                             if line.startswith("MemAvailable:"))
    monkeypatch.setattr(memory_budget, "cgroup_memory_room",
                        lambda: (mem_available * 4, mem_available * 8, "memory.max"))
    # The machine's is tighter now (MemAvailable moves a little between two reads).
    assert available_memory() == pytest.approx(mem_available, rel=0.2)
