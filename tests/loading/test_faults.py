"""Faults with num_workers > 0: errors in workers, dead workers, timeouts, interrupts.

Every test runs under the ``no_leaks`` fixture: afterwards no new ``fl_``
segment of ours exists in /dev/shm and no child process of ours is alive.
Timeouts are hang guards only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import multiprocessing
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import weakref
from typing import Iterator

import numpy as np
import psutil
import pytest

try:
    import _posixshmem
except ImportError:  # pragma: no cover
    _posixshmem = None

import fastload as fl
from datasets_for_workers import (CallLoggingDataset, CompletionLoggingDataset, FaultyDataset,
                                  SlowDataset, SquareDataset, WorkerIdDataset, logged_calls,
                                  record_init)
from fastload._lifetime import pipe_ends
from forking import fork_child
from leakcheck import memory_files_held, is_alive, shm_entries
from paths import REPO_DIR, TESTS_DIR


class CustomError(Exception):
    """A module-level exception type: it unpickles in the main process."""


class TwoArgError(Exception):
    """Cannot be rebuilt from a message alone: the re-raise falls back to RuntimeError."""

    def __init__(self, code, detail):
        super().__init__(code, detail)


class MessageFieldError(Exception):
    """Declares a ``message`` and takes it by keyword only: torch rebuilds such types
    with ``message=``."""

    message = "declared"

    def __init__(self, *, message: str) -> None:
        super().__init__(message)


class RaisesMessageFieldError(SquareDataset):
    def __getitem__(self, i):
        if i == 5:
            raise MessageFieldError(message="message-field failure")
        return super().__getitem__(i)


def _worker_pid_in(message: str, pids: list[int]) -> int:
    match = re.search(r"pid (\d+)", message)
    assert match, f"no pid in {message!r}"
    pid = int(match.group(1))
    assert pid in pids, f"pid {pid} in the message is not one of the workers {pids}"
    return pid


def _wait_gone(pids, seconds=5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if is_alive(p)]
        if not alive:
            return []
        time.sleep(0.05)
    return [p for p in pids if is_alive(p)]


def _prefix_entries(prefix: str) -> list[str]:
    """What is left of a ring: its POSIX segments' names, and its memory files
    (``memfd:<prefix>...``) that a process other than this one still holds open
    or mapped (this one may hold batches, which keep theirs)."""
    return sorted({name for name in shm_entries() if name.startswith(prefix)}
                  | set(memory_files_held(prefix, exclude=os.getpid())))


# ---------------------------------------------------------------------------
# Exceptions in the worker re-raise in the main process
# ---------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("error_type, error_args, expected_type", [
    (CustomError, ("custom failure 17",), CustomError),
    (KeyError, ("missing-key-17",), KeyError),
    (TwoArgError, (17, "two-arg failure"), RuntimeError),
])
def test_getitem_exception_reraises_with_type_worker_id_and_traceback(
        no_leaks, error_type, error_args, expected_type):
    dataset = FaultyDataset(40, bad=9, error_type=error_type, error_args=error_args)
    loader = fl.DataLoader(dataset, batch_size=4, num_workers=2)
    it = iter(loader)
    assert next(it)[1].tolist() == [0, 1, 2, 3]
    assert next(it)[1].tolist() == [4, 5, 6, 7]
    with pytest.raises(expected_type) as excinfo:
        next(it)
    assert type(excinfo.value) is expected_type
    message = str(excinfo.value)
    assert re.search(r"in DataLoader worker process [01]\b", message), message
    assert "Traceback (most recent call last)" in message
    # The worker's own frames: the dataset's __getitem__ and the raise line.
    assert "datasets_for_workers.py" in message and "__getitem__" in message, message
    assert error_type.__name__ in message
    assert str(error_args[-1]) in message
    if error_type is KeyError:
        # KeyError must not repr() the message (which would escape the newlines).
        assert "\\n" not in message and "\n" in message
    del it


@pytest.mark.timeout(60)
def test_exception_declaring_a_message_field_keeps_its_type_as_torch(torch, no_leaks):
    for library in (fl, torch.utils.data):
        it = iter(library.DataLoader(RaisesMessageFieldError(12), batch_size=2, num_workers=2))
        next(it), next(it)
        with pytest.raises(MessageFieldError) as excinfo:
            next(it)
        assert "message-field failure" in str(excinfo.value)
        assert "in DataLoader worker process" in str(excinfo.value)
        # To the end, so that both stop their workers at once (torch's iterator,
        # collected unfinished, would take 5 s a worker).
        assert len(list(it)) == 3


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_stop_iteration_from_a_map_style_dataset_ends_the_loop_as_torch(torch, no_leaks, num_workers):
    # torch re-raises a worker's StopIteration, which ends the caller's for
    # loop there; it must not be taken for the end of an IterableDataset and
    # silently skip the batch.
    def batches(library):
        dataset = FaultyDataset(12, bad=3, error_type=StopIteration, error_args=())
        it = iter(library.DataLoader(dataset, batch_size=2, num_workers=num_workers))
        seen = [np.asarray(labels).tolist() for _, labels in it]
        # The rest of the epoch, as in torch: so both stop their workers at once.
        rest = [np.asarray(labels).tolist() for _, labels in it]
        return seen, rest

    assert batches(fl) == batches(torch.utils.data) == ([[0, 1]], [[4, 5], [6, 7], [8, 9], [10, 11]])


@pytest.mark.timeout(60)
def test_unimportable_exception_type_falls_back_to_runtime_error(no_leaks):
    class LocalError(Exception):  # pickling the type fails: RuntimeError carries the text
        pass

    loader = fl.DataLoader(FaultyDataset(16, bad=1, error_type=LocalError, error_args=("local!",)),
                           batch_size=4, num_workers=1)
    with pytest.raises(RuntimeError) as excinfo:
        for _ in loader:
            pass
    message = str(excinfo.value)
    assert "worker process 0" in message and "Traceback" in message, message
    assert "LocalError: local!" in message, message  # the original type survives as text


@pytest.mark.timeout(60)
def test_iteration_continues_after_getitem_exception_as_torch(no_leaks):
    expected = [list(range(b, min(b + 4, 40))) for b in range(0, 40, 4)]
    loader = fl.DataLoader(FaultyDataset(40, bad=9), batch_size=4, num_workers=2)
    it = iter(loader)
    seen, errors = [], 0
    while True:
        try:
            batch = next(it)
        except StopIteration:
            break
        except ValueError as exc:
            assert "bad sample" in str(exc)
            errors += 1
            continue
        seen.append(batch[1].tolist())
        np.testing.assert_array_equal(batch[0][:, 0], np.asarray(batch[1]) % 251)
    assert errors == 1
    assert seen == expected[:2] + expected[3:]
    # The epoch ended normally: workers stopped and segments unlinked.
    assert it.closed


class RaisingCollate:
    def __call__(self, samples):
        if samples[0][1] == 8:
            raise CustomError("collate refused batch starting at 8")
        return fl.default_collate(samples)


@pytest.mark.timeout(60)
def test_collate_fn_exception_reraises(no_leaks):
    loader = fl.DataLoader(SquareDataset(24, (4,)), batch_size=4, num_workers=2,
                           collate_fn=RaisingCollate())
    it = iter(loader)
    assert next(it)[1].tolist() == [0, 1, 2, 3]
    assert next(it)[1].tolist() == [4, 5, 6, 7]
    with pytest.raises(CustomError) as excinfo:
        next(it)
    message = str(excinfo.value)
    assert "in DataLoader worker process" in message
    assert "RaisingCollate" in message or "__call__" in message
    assert "collate refused batch starting at 8" in message
    assert next(it)[1].tolist() == [12, 13, 14, 15]  # continues, as torch
    del it


def _rebuild_only_in_workers():
    if fl.get_worker_info() is None:
        raise CustomError("this value cannot be rebuilt in the main process")
    return WorkerOnlyValue()


class WorkerOnlyValue:
    """Pickles in a worker, but its unpickling fails in the main process."""

    def __reduce__(self):
        return (_rebuild_only_in_workers, ())


class CollateWithWorkerOnlyValue:
    """Batch 1 (and only it) carries a value that does not unpickle in the main process."""

    def __call__(self, samples):
        batch = fl.default_collate(samples)
        return {"x": batch[1], "extra": WorkerOnlyValue() if samples[0][1] == 4 else None}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True])
def test_answer_that_fails_to_unpickle_in_main_fails_its_batch_only(no_leaks, persistent):
    # The answer arrives whole but cannot be unpacked: its batch raises the
    # error with a note naming it, and every later batch (the worker's first
    # layout travelled with the failed one) comes, instead of a hang.
    loader = fl.DataLoader(SquareDataset(16, (4,)), batch_size=4, num_workers=2,
                           collate_fn=CollateWithWorkerOnlyValue(), persistent_workers=persistent)
    for _ in range(2):
        it = iter(loader)
        assert next(it)["x"].tolist() == [0, 1, 2, 3]
        with pytest.raises(CustomError, match="cannot be rebuilt") as excinfo:
            next(it)
        assert "unpickling batch 1 from worker 1" in "\n".join(excinfo.value.__notes__)
        assert [b["x"].tolist() for b in it] == [[8, 9, 10, 11], [12, 13, 14, 15]]
        del it


def _failing_init(worker_id):
    if worker_id == 1:
        raise KeyError("init failed in worker 1")


def _two_arg_failing_init(worker_id):
    raise TwoArgError(worker_id, "init two-arg failure")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("init_fn, expected_type, text", [
    (_failing_init, KeyError, "init failed in worker 1"),
    (_two_arg_failing_init, RuntimeError, "init two-arg failure"),
])
def test_worker_init_fn_exception_reraises(no_leaks, init_fn, expected_type, text):
    loader = fl.DataLoader(SquareDataset(24, (4,)), batch_size=4, num_workers=2,
                           worker_init_fn=init_fn)
    with pytest.raises(expected_type) as excinfo:
        for _ in loader:
            pass
    message = str(excinfo.value)
    assert type(excinfo.value) is expected_type
    assert re.search(r"in DataLoader worker process [01]\b", message), message
    assert init_fn.__name__ in message and "Traceback" in message
    assert text in message


@pytest.mark.timeout(60)
def test_dropping_iterator_after_worker_exception_stops_workers_without_gc(no_leaks):
    """After a re-raised worker error, ``del it`` alone must stop the workers.

    The traceback of the re-raised exception must not keep the iterator (and
    so its workers and segments) alive in a reference cycle until some later
    garbage collection.
    """
    loader = fl.DataLoader(FaultyDataset(40, bad=5), batch_size=4, num_workers=2)
    gc.disable()
    try:
        it = iter(loader)
        pids, prefix = it.worker_pids, it._ring.prefix
        next(it)
        with pytest.raises(ValueError):
            next(it)
        ref = weakref.ref(it)
        del it
        assert ref() is None, "the iterator is still referenced after del (reference cycle?)"
        assert _wait_gone(pids, 5.0) == []
        assert _prefix_entries(prefix) == []
    finally:
        gc.enable()


_GC_SCRIPT = """
import gc, os, sys, time
sys.path[:0] = [{tests!r}, {repo!r}]
import fastload as fl
from datasets_for_workers import SquareDataset

loader = fl.DataLoader(SquareDataset(40, (4,)), batch_size=4, num_workers=2)
it = iter(loader)
next(it)
print("PIDS", *it.worker_pids)
print("PREFIX", it._ring.prefix, flush=True)
it.cycle = it          # only the cyclic GC can free it now
del it
gc.collect()
print("COLLECTED", flush=True)
time.sleep(30)         # the test inspects us now, before any atexit cleanup
"""


@pytest.mark.timeout(60)
def test_iterator_collected_by_gc_still_cleans_up(tmp_path, no_leaks):
    """An iterator that only the cyclic GC frees (it sits in a reference cycle)
    must still stop its workers and unlink its segments when collected, without
    its __del__ raising.  (Run in a fresh interpreter: which finalizer the GC
    runs first depends on the process's allocation history, and this script
    reproduces the bad order every time.)"""
    script = tmp_path / "gc_script.py"
    script.write_text(_GC_SCRIPT.format(tests=TESTS_DIR, repo=REPO_DIR))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        no_leaks.watch_pid(proc.pid)
        pids, (prefix,) = _read_workers(proc)
        _read_marker(proc, "COLLECTED")
        left_workers = _wait_gone(pids, 5.0)
        left_segments = _prefix_entries(prefix)
    finally:
        proc.kill()
        _, stderr = proc.communicate(timeout=20)
        for pid in pids:
            if is_alive(pid):
                os.kill(pid, signal.SIGKILL)
    for name in _prefix_entries(prefix):  # do not leave the leak to the next tests
        _posixshmem.shm_unlink("/" + name)
    assert "Exception ignored" not in stderr, stderr
    assert left_workers == []
    assert left_segments == [], "segments outlived the collected iterator"


# ---------------------------------------------------------------------------
# Dead workers and timeouts
# ---------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_worker_sigkilled_inside_getitem_raises_runtime_error(no_leaks):
    loader = fl.DataLoader(FaultyDataset(400, bad=13, mode="sigkill"), batch_size=4,
                           num_workers=2)
    it = iter(loader)
    pids, prefix = it.worker_pids, it._ring.prefix
    start = time.monotonic()
    with pytest.raises(RuntimeError) as excinfo:
        for _ in it:
            pass
    assert time.monotonic() - start < 30  # no hang (a generous deadline, for loaded hosts)
    message = str(excinfo.value)
    _worker_pid_in(message, pids)
    assert "SIGKILL" in message and "killed by signal" in message, message
    assert it.closed
    assert _wait_gone(pids, 5.0) == []
    assert _prefix_entries(prefix) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_worker_killed_from_outside_raises_runtime_error(no_leaks, signum):
    # SIGTERM: the worker's handler sees the main process alive and dies of it.
    loader = fl.DataLoader(SlowDataset(400, delay=0.005), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    pids, prefix = it.worker_pids, it._ring.prefix
    victim = pids[1]
    os.kill(victim, signum)
    start = time.monotonic()
    with pytest.raises(RuntimeError) as excinfo:
        for _ in range(100):  # at most the batches already made, then the error
            next(it)
    assert time.monotonic() - start < 30  # no hang (a generous deadline, for loaded hosts)
    message = str(excinfo.value)
    assert _worker_pid_in(message, pids) == victim
    assert signal.Signals(signum).name in message, message
    assert _wait_gone(pids, 5.0) == []
    assert _prefix_entries(prefix) == []
    with pytest.raises(StopIteration):  # the iterator is finished, not hung
        next(it)


@dataclasses.dataclass
class TensorHolder:
    """A custom collate_fn's batch: it travels pickled, its tensor handed over by descriptor."""

    tensor: object


def collate_into_holder(samples):
    import torch

    return TensorHolder(torch.tensor(samples))


@pytest.mark.timeout(60)
def test_worker_dead_before_its_tensor_is_fetched_raises_its_death(torch, no_leaks, tmp_path,
                                                                  monkeypatch):
    """Worker 1 is killed after answering the epoch's last batch, whose tensor waits
    in it to be fetched: torch reports the death ("exited unexpectedly"), and so must
    fastload, not the failed fetch's connection error (with no task left to send,
    nothing else finds the death)."""
    # The killed worker's resource sharer leaves its pymp-* folder: in tmp_path.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    loader = fl.DataLoader(range(8), batch_size=4, num_workers=2, collate_fn=collate_into_holder)
    it = iter(loader)
    pids, prefix = it.worker_pids, it._ring.prefix
    assert next(it).tensor.tolist() == [0, 1, 2, 3]
    answers_of_worker_1 = it._pool._readers[1].fd
    assert select.select([answers_of_worker_1], [], [], 10.0)[0], "worker 1 never answered"
    os.kill(pids[1], signal.SIGKILL)
    assert _wait_gone([pids[1]], 10.0) == []
    with pytest.raises(RuntimeError) as excinfo:
        next(it)
    message = str(excinfo.value)
    assert _worker_pid_in(message, pids) == pids[1]
    assert "SIGKILL" in message and "killed by signal" in message, message
    assert _wait_gone(pids, 5.0) == []
    assert _prefix_entries(prefix) == []


class SlowFirstBatch(SquareDataset):
    """Worker 0 takes ``delay`` seconds over its first batch; the rest is quick.
    ``done``: a file made once that slow sample is (an event the tests can see)."""

    def __init__(self, n: int, delay: float, done: str | None = None) -> None:
        super().__init__(n, (2,))
        self.delay, self.done = delay, done

    def __getitem__(self, i):
        if i == 0:
            time.sleep(self.delay)
            if self.done is not None:
                open(self.done, "w").close()
        return super().__getitem__(i)


@pytest.mark.timeout(60)
def test_worker_killed_while_another_workers_batch_is_awaited_raises_at_once(no_leaks, tmp_path):
    # The main process watches only the awaited worker's answers (NOTE [
    # Waking for the awaited answer only ] in _loading/pool.py), but every sentinel.
    done = str(tmp_path / "batch 0 made")
    loader = fl.DataLoader(SlowFirstBatch(64, delay=5.0, done=done), batch_size=4, num_workers=2)
    it = iter(loader)
    pids, prefix = it.worker_pids, it._ring.prefix
    # Stopping the pool waits for worker 0 to finish its batch: what must come
    # first is the moment the iterator starts to stop it (an event, not a time).
    stopped_at = []
    shutdown = it.shutdown

    def recording_shutdown():
        stopped_at.append(os.path.exists(done))
        shutdown()

    it.shutdown = recording_shutdown
    killer = threading.Timer(0.3, os.kill, (pids[1], signal.SIGKILL))
    killer.start()
    try:
        with pytest.raises(RuntimeError) as excinfo:
            next(it)  # batch 0: worker 0 sleeps in it for 5 s
    finally:
        killer.cancel()
    assert stopped_at == [False], "the death was seen only with worker 0's answer"
    message = str(excinfo.value)
    assert _worker_pid_in(message, pids) == pids[1]
    assert "SIGKILL" in message, message
    assert _wait_gone(pids, 10.0) == []
    assert _prefix_entries(prefix) == []


@pytest.mark.timeout(60)
def test_out_of_order_a_dead_worker_is_reported_while_the_other_has_answers(no_leaks):
    # Out of order the main process takes any worker's answer; with the live
    # worker always ahead of a slow consumer, the death was reported only
    # when the epoch ran out (torch reports it at once).
    loader = fl.DataLoader(SquareDataset(2000, shape=(4,)), batch_size=4, num_workers=2,
                           in_order=False)
    it = iter(loader)
    pids, prefix = it.worker_pids, it._ring.prefix
    taken = 0
    with pytest.raises(RuntimeError, match=rf"pid {pids[1]}\).*SIGKILL"):
        for _ in it:
            taken += 1
            if taken == 5:
                os.kill(pids[1], signal.SIGKILL)
            time.sleep(0.02)  # the training step: the live worker is always ahead
    # Only what was already read or sent before the death comes first.
    assert taken <= 5 + 2 * 2 + 2, taken
    assert _wait_gone(pids, 10.0) == []
    assert _prefix_entries(prefix) == []


@pytest.mark.timeout(60)
def test_persistent_worker_killed_between_epochs_raises_runtime_error(no_leaks):
    loader = fl.DataLoader(SquareDataset(32, (2,)), batch_size=4, num_workers=2,
                           persistent_workers=True)
    assert len(list(loader)) == 8
    iterator = loader._iterator
    pids, prefix = iterator.worker_pids, iterator._ring.prefix
    os.kill(pids[0], signal.SIGKILL)
    assert _wait_gone([pids[0]], 5.0) == []
    # The dead worker's task pipe is closed: the next epoch's first message
    # must not surface as a BrokenPipeError.
    with pytest.raises(RuntimeError) as excinfo:
        list(loader)
    message = str(excinfo.value)
    assert _worker_pid_in(message, pids) == pids[0]
    assert "SIGKILL" in message, message
    assert _wait_gone(pids, 5.0) == []
    assert _prefix_entries(prefix) == []


@pytest.mark.timeout(60)
def test_a_dead_worker_does_not_kill_a_main_process_with_sigpipe_at_default(tmp_path, no_leaks):
    # ``signal(SIGPIPE, SIG_DFL)``, the idiom of tools piped into ``head``:
    # the next epoch's first task to a persistent worker killed in between
    # finds no reader, and must raise torch's RuntimeError, not end the process.
    script = _script(tmp_path, """
        import os, signal, time
        import fastload as fl
        from datasets_for_workers import SquareDataset

        if __name__ == "__main__":
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)
            loader = fl.DataLoader(SquareDataset(32, (2,)), batch_size=4, num_workers=2,
                                   persistent_workers=True)
            list(loader)
            pid = loader._iterator.worker_pids[0]
            os.kill(pid, signal.SIGKILL)
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped
            try:
                list(loader)
            except RuntimeError as error:
                print("RAISED", error, flush=True)
            assert len(list(loader)) == 8  # new workers
            print("SURVIVED", signal.getsignal(signal.SIGPIPE) == signal.SIG_DFL,
                  signal.SIGPIPE in signal.sigpending(), flush=True)
        """)
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert "is killed by signal: Killed (SIGKILL)" in proc.stdout, proc.stdout
    assert "SURVIVED True False" in proc.stdout, proc.stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sigchld", ["ignored", "reaped by a handler"])
def test_workers_reaped_by_someone_else_are_not_waited_for(tmp_path, no_leaks, sigchld):
    # SIGCHLD set to SIG_IGN (the kernel reaps children at once) or a handler
    # calling waitpid(-1): multiprocessing's is_alive() then stays True, and
    # every teardown waited out the 5 s grace; a dead worker was reported only
    # after it, with "exit code None".
    script = _script(tmp_path, f"""
        import os, signal, time
        import fastload as fl
        from datasets_for_workers import FaultyDataset, SquareDataset

        def reap_all(signum, frame):
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                pass

        if __name__ == "__main__":
            signal.signal(signal.SIGCHLD, signal.SIG_IGN if {sigchld!r} == "ignored" else reap_all)
            loader = fl.DataLoader(SquareDataset(400, (2,)), batch_size=4, num_workers=2)
            start = time.monotonic()
            it = iter(loader)
            next(it)
            del it                     # an epoch abandoned: busy workers stopped
            assert len(list(loader)) == 100
            del loader                 # its last epoch's workers waited for
            print("TEARDOWN", time.monotonic() - start, flush=True)
            start = time.monotonic()
            try:
                list(fl.DataLoader(FaultyDataset(400, bad=6, mode="exit"), batch_size=4,
                                   num_workers=2))
            except RuntimeError as error:
                print("DEATH", time.monotonic() - start, error, flush=True)
        """)
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    # The grace is 5 s; without waiting for it all of this takes well under 1.
    assert float(lines["TEARDOWN"]) < 3.0, proc.stdout
    seconds, message = lines["DEATH"].split(" ", 1)
    assert float(seconds) < 3.0, proc.stdout
    # A Python handler runs when the main thread next checks for signals:
    # before or after the loader has reaped the worker itself.
    told = ["collected elsewhere"] + (["exit code 3"] if sigchld != "ignored" else [])
    assert "exited unexpectedly" in message and any(t in message for t in told), message


@pytest.mark.timeout(60)
def test_a_main_process_sigterm_handler_does_not_run_in_forked_workers(tmp_path, no_leaks):
    # A graceful-shutdown handler (say, saving a checkpoint) that forked
    # workers inherit must run once, in the main process: workers die of a
    # SIGTERM sent to the group, as torch's, and the loop reports it.
    log = tmp_path / "handler.log"
    script = _script(tmp_path, f"""
        import os, signal, time
        import fastload as fl
        from datasets_for_workers import SlowDataset

        def on_sigterm(signum, frame):
            with open({str(log)!r}, "a") as out:
                out.write(f"{{os.getpid()}}\\n")

        if __name__ == "__main__":
            signal.signal(signal.SIGTERM, on_sigterm)
            loader = fl.DataLoader(SlowDataset(400, delay=0.01, shape=(2,)), batch_size=4,
                                   num_workers=2, multiprocessing_context="fork")
            try:
                for n, batch in enumerate(loader):
                    if n == 2:
                        os.killpg(0, signal.SIGTERM)
                        time.sleep(0.5)
            except RuntimeError as error:
                print("RAISED", error, flush=True)
            print("MAIN", os.getpid(), flush=True)
        """)
    proc = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=50,
                          start_new_session=True)
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    assert "is killed by signal: Terminated (SIGTERM)" in proc.stdout, proc.stdout
    main_pid = proc.stdout.split("MAIN ")[1].split()[0]
    assert log.read_text().split() == [main_pid]


class _RaisedByAHandler(Exception):
    """What a caller's signal handler raises in the middle of fastload's code."""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("where", ["start", "shutdown"])
def test_an_exception_from_a_signal_handler_in_start_or_teardown_leaves_no_worker(
        monkeypatch, no_leaks, where):
    # A SIGALRM timeout or a SIGCHLD handler that raises can interrupt the pool
    # anywhere: right after a worker was forked, or while workers are told to
    # stop.  None may be left running (no_leaks checks).
    from fastload._loading import pool
    from fastload._loading.wire.messages import STOP_BYTES

    if where == "start":
        real_release = pool.WorkerPool._release_held

        def interrupted(self, worker_id):
            real_release(self, worker_id)
            if worker_id == 1:  # worker 1 is forked: raised before start() returns
                raise _RaisedByAHandler()

        monkeypatch.setattr(pool.WorkerPool, "_release_held", interrupted)
    else:
        real_send = pool.send_frame

        def interrupted(fd, data):
            if data == STOP_BYTES:  # before any worker was told to stop
                raise _RaisedByAHandler()
            real_send(fd, data)

        monkeypatch.setattr(pool, "send_frame", interrupted)
    loader = fl.DataLoader(SquareDataset(400, (2,)), batch_size=4, num_workers=2)
    with pytest.raises(_RaisedByAHandler):
        iterator = iter(loader)
        next(iterator)
        iterator.shutdown()
    monkeypatch.undo()


class _HoldsAnotherIterator(fl.Dataset):
    """Drops, in the worker, its copy of another loader's live iterator, then
    uses a new pipe (which takes the lowest free descriptors)."""

    def __init__(self, inner):
        self.inner = inner

    def __len__(self):
        return 2

    def __getitem__(self, i):
        reader, writer = os.pipe()
        self.inner = None
        gc.collect()
        try:
            os.write(writer, b"x")
            return os.read(reader, 1).decode()
        finally:
            os.close(reader)
            os.close(writer)


@pytest.mark.timeout(60)
def test_a_worker_dropping_another_loaders_pool_leaves_its_own_descriptors_alone(no_leaks):
    # A forked worker lets go of the pipe ends of other pools it inherits; the
    # Connections owning them may live on in it and close their numbers when
    # dropped: that must not close what the worker has opened since.
    other = fl.DataLoader(list(range(8)), num_workers=1)
    dataset = _HoldsAnotherIterator(iter(other))
    next(dataset.inner)  # the other loader's pool is running
    assert list(fl.DataLoader(dataset, batch_size=None, num_workers=1)) == ["x", "x"]
    dataset.inner = None


@pytest.mark.timeout(60)
def test_a_callers_raising_handler_waits_for_the_teardown_to_end(monkeypatch, no_leaks):
    # A handler that raises (a SIGALRM timeout, a SIGCHLD handler: workers exit
    # during teardown), signalled twice inside a teardown: once while the busy
    # workers are stopped, once while the ring is unlinked.  Cut short there,
    # a worker that survived made a slot's segment after the names were
    # unlinked.  The signals are handled once the teardown is over.
    from fastload._loading import reaping
    from fastload._ring import Ring

    class Raised(Exception):
        pass

    def raising(signum, frame):
        raise Raised()

    armed = []  # only this iterator's teardown: not what earlier tests left to reap

    def signalled_before(real):
        def call(*args, **kwargs):
            if armed:
                os.kill(os.getpid(), signal.SIGUSR1)  # its handler runs at the next check
            return real(*args, **kwargs)
        return call

    previous = signal.signal(signal.SIGUSR1, raising)
    try:
        monkeypatch.setattr(reaping, "stop", signalled_before(reaping.stop))
        monkeypatch.setattr(Ring, "close", signalled_before(Ring.close))
        loader = fl.DataLoader(SlowDataset(64, delay=0.05, shape=(2,)), batch_size=2,
                               num_workers=2)
        iterator = iter(loader)
        next(iterator)
        pids, prefix = iterator.worker_pids, iterator._ring.prefix
        armed.append(True)
        with pytest.raises(Raised):
            del iterator   # torn down as a finalizer; the signal comes again after
            time.sleep(5)  # where the handler raises, in the caller's code
        assert _wait_gone(pids, 5.0) == []
        assert _prefix_entries(prefix) == []
        assert signal.getsignal(signal.SIGUSR1) is raising
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.timeout(60)
def test_a_teardown_cut_short_as_it_begins_is_finished_by_the_next_iterator(monkeypatch,
                                                                            no_leaks):
    # A handler of the caller's that raises the moment the teardown finalizer
    # starts, before it holds the signals, ends the teardown there; a
    # finalizer runs once, so the workers and the ring were left behind.
    from fastload._loading import teardown

    class Raised(Exception):
        pass

    def cut_short(*args):
        raise Raised()

    loader = fl.DataLoader(SquareDataset(64, (2,)), batch_size=4, num_workers=2,
                           persistent_workers=True)
    with monkeypatch.context() as patched:
        patched.setattr(teardown, "release_workers_and_ring", cut_short)
        iterator = iter(loader)
    next(iterator)
    pids, prefix = iterator.worker_pids, iterator._ring.prefix
    with pytest.raises(Raised):
        iterator.shutdown()
    assert _prefix_entries(prefix) and all(is_alive(p) for p in pids)
    del iterator, loader
    again = fl.DataLoader(SquareDataset(8, (2,)), batch_size=4, num_workers=1)
    assert len(list(again)) == 2
    assert _wait_gone(pids, 5.0) == []
    assert _prefix_entries(prefix) == []


@pytest.mark.timeout(60)
def test_a_teardown_cut_short_is_finished_at_exit(tmp_path, no_leaks):
    script = _script(tmp_path, """
        import fastload as fl
        from fastload._loading import teardown
        from datasets_for_workers import SquareDataset

        def cut_short(*args):
            raise TimeoutError("raised by a signal handler")

        if __name__ == "__main__":
            teardown.release_workers_and_ring = cut_short
            iterator = iter(fl.DataLoader(SquareDataset(64, (2,)), batch_size=4, num_workers=2))
            next(iterator)
            print("PIDS", *iterator.worker_pids, flush=True)
            print("PREFIX", iterator._ring.prefix, flush=True)
            try:
                iterator.shutdown()
            except TimeoutError:
                print("CUT SHORT", flush=True)
        """)
    with _running(script) as proc:
        pids, prefixes = _read_workers(proc)
        _read_marker(proc, "CUT SHORT")
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    _assert_workers_and_segments_go(pids, prefixes, "the process that exited")


@pytest.mark.timeout(60)
def test_a_worker_exits_when_the_main_process_closes_its_task_pipe(no_leaks):
    # Forked workers let go of the pipe ends they inherit that are not theirs,
    # the writing end of their own task pipe among them: a pool lost without
    # a word (its stop message never sent) still ends its workers.
    loader = fl.DataLoader(SquareDataset(32, (2,)), batch_size=4, num_workers=2,
                           persistent_workers=True)
    assert len(list(loader)) == 8
    iterator = loader._iterator
    pids = iterator.worker_pids
    for conn in iterator._pool._task_conns:
        os.close(conn.fileno())  # behind the pool's back: no stop message
    assert _wait_gone(pids, 10.0) == []
    for conn in iterator._pool._task_conns:
        conn._handle = None  # already closed
    del loader, iterator


_pipes_opened_before_fork: list = []
_open_a_pipe_before_the_next_fork = False


def _open_a_pool_pipe_now() -> None:
    global _open_a_pipe_before_the_next_fork
    if _open_a_pipe_before_the_next_fork:
        _open_a_pipe_before_the_next_fork = False
        reader, writer = multiprocessing.Pipe(duplex=False)
        pipe_ends.track(reader, writer)
        _pipes_opened_before_fork.append((reader, writer))


os.register_at_fork(before=_open_a_pool_pipe_now)


@pytest.mark.timeout(60)
def test_workers_let_go_of_pipes_another_pool_opened_just_before_their_fork(no_leaks):
    # Another thread's pool may open (or close) pipes at any instant, up to
    # the fork of a worker: the worker lets go of the ends as they were at
    # its fork, not as a snapshot taken a moment before (which another
    # thread's pool could change meanwhile, even while it was being taken).
    global _open_a_pipe_before_the_next_fork
    loader = fl.DataLoader(SquareDataset(8, (2,)), batch_size=4, num_workers=1,
                           persistent_workers=True)
    _open_a_pipe_before_the_next_fork = True
    iterator = iter(loader)
    assert _open_a_pipe_before_the_next_fork is False, "the worker was not forked"
    (reader, writer), = _pipes_opened_before_fork
    _pipes_opened_before_fork.clear()
    try:
        next(iterator)  # the worker is running
        pipe_ends.close(writer)
        # The worker holds no copy of the writing end: the reader sees EOF.
        assert reader.poll(10.0)
        with pytest.raises(EOFError):
            reader.recv_bytes()
    finally:
        pipe_ends.close(writer)
        pipe_ends.close(reader)
    del loader, iterator


def _children_among(pids: list[int]) -> list[int]:
    """Those of ``pids`` still this process's children: running, or exited and not reaped."""
    import psutil

    return [p.pid for p in psutil.Process().children() if p.pid in pids]


@pytest.mark.timeout(60)
def test_finished_epochs_leave_no_process_behind(no_leaks):
    # Idle workers exit on their own at the end of an epoch; nobody waits for
    # them then, and the next epoch reaps them: no zombie piles up.  Once the
    # loader is gone, not even its last epoch's workers are left unreaped.
    loader = fl.DataLoader(SquareDataset(64, (2,)), batch_size=4, num_workers=2)
    seen = []
    for _ in range(5):
        iterator = iter(loader)
        seen += iterator.worker_pids
        assert len(list(iterator)) == 16
    assert _wait_gone(seen, 5.0) == []
    leftovers = _children_among(seen)
    assert len(leftovers) <= 2, f"unreaped workers of earlier epochs: {leftovers}"
    del loader, iterator
    assert _children_among(seen) == [], "the loader is gone, its workers are not reaped"


@pytest.mark.timeout(60)
def test_persistent_workers_are_reaped_when_their_loader_goes(no_leaks):
    loader = fl.DataLoader(SquareDataset(16, (2,)), batch_size=4, num_workers=2,
                           persistent_workers=True)
    iterator = iter(loader)
    pids = iterator.worker_pids
    assert len(list(iterator)) == 4
    del loader, iterator
    assert _children_among(pids) == [], "workers left unreaped (zombies)"


@pytest.mark.timeout(60)
def test_workers_are_reaped_when_a_loop_left_by_the_last_batchs_error_is_dropped(no_leaks):
    # Every task answered when the error comes: nothing is in flight, but the
    # epoch did not end, so the workers are waited for when the iterator goes.
    loader = fl.DataLoader(FaultyDataset(16, bad=13), batch_size=4, num_workers=2)
    iterator = iter(loader)
    pids = iterator.worker_pids
    with pytest.raises(ValueError, match="bad sample"):
        list(iterator)
    del iterator
    assert _children_among(pids) == [], "workers left unreaped (zombies)"


def test_reaping_run_again_in_its_own_middle_loses_no_worker(monkeypatch):
    # _reap_exiting can run inside itself: the collector runs a dropped
    # loader's teardown at any allocation (join_exiting_workers), and another
    # thread's pool reaps or adds workers at any bytecode.  What that inner
    # call keeps, and what is added meanwhile, must still be listed after the
    # outer call: those workers are reaped by nobody else (CI once found a
    # finished epoch's two workers unreaped after their loader was gone).
    from fastload._loading import reaping

    class Worker:
        exited = False

    first, second, third = Worker(), Worker(), Worker()
    soon = time.monotonic() + 60
    kept = (os.getpid(), soon, [second])
    added = (os.getpid(), soon, [third])

    def running(process):
        if process is first and not first.exited:
            first.exited = True        # it exits meanwhile
            reaping.reap_exiting()       # the inner call: drops it, keeps `kept`
            reaping._exiting.append(added)  # another pool's epoch ends
        return not process.exited

    monkeypatch.setattr(reaping, "running", running)
    monkeypatch.setattr(reaping, "_exiting", [(os.getpid(), soon, [first]), kept])
    reaping.reap_exiting()
    assert reaping._exiting == [kept, added]
    assert kept[2] == [second] and added[2] == [third]


@pytest.mark.timeout(60)
def test_idle_worker_that_does_not_exit_is_terminated_after_the_grace(monkeypatch, no_leaks):
    from datasets_for_workers import linger_at_exit
    from fastload._loading import reaping

    monkeypatch.setattr(reaping, "JOIN_GRACE", 0.5)
    loader = fl.DataLoader(SquareDataset(16, (2,)), batch_size=4, num_workers=2,
                           worker_init_fn=linger_at_exit)
    iterator = iter(loader)
    first_pids = iterator.worker_pids
    assert len(list(iterator)) == 4
    time.sleep(0.3)
    assert all(is_alive(p) for p in first_pids), "their exit should hang"
    time.sleep(0.4)
    iterator = iter(loader)  # a new pool reaps what is past its grace
    assert [p for p in first_pids if is_alive(p)] == []
    second_pids = iterator.worker_pids
    assert len(list(iterator)) == 4
    time.sleep(0.6)
    reaping.reap_exiting()
    assert [p for p in second_pids if is_alive(p)] == []


def test_reaping_leaves_alone_the_workers_a_forked_child_inherited(monkeypatch):
    from fastload._loading import reaping

    class ParentsWorker:
        def is_alive(self):
            raise AssertionError("a forked child must not poll its parent's workers")

    monkeypatch.setattr(reaping, "_exiting", [(os.getpid() + 1, 0.0, [ParentsWorker()])])
    reaping.reap_exiting()
    assert reaping._exiting == []


@pytest.mark.timeout(60)
def test_worker_os_exit_raises_runtime_error_with_exit_code(no_leaks):
    loader = fl.DataLoader(FaultyDataset(400, bad=6, mode="exit"), batch_size=4, num_workers=2)
    it = iter(loader)
    pids = it.worker_pids
    with pytest.raises(RuntimeError, match=r"exit code 3\b") as excinfo:
        for _ in it:
            pass
    _worker_pid_in(str(excinfo.value), pids)


@pytest.mark.timeout(60)
def test_timeout_raises_without_waiting_for_the_stuck_workers(no_leaks, tmp_path):
    # The workers are stuck in 8-second samples: the error comes at the
    # timeout, as torch's does, not once they have finished; the loop left
    # then, they are terminated, not waited for.  Events say so, not times:
    # no sample was finished when the error came, nor when the workers were gone.
    log = str(tmp_path / "samples")
    loader = fl.DataLoader(CompletionLoggingDataset(log, 8, delay=8.0), batch_size=2,
                           num_workers=2, timeout=0.5)
    it = iter(loader)
    pids = it.worker_pids
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"timed out after 0\.5 seconds"):
        next(it)
    assert time.monotonic() - start >= 0.45  # not before the timeout
    assert _finished_samples(log) == [], "the error waited for the workers"
    del it
    assert _wait_gone(pids, 5.0) == []
    assert _finished_samples(log) == [], "the workers were waited for, not terminated"


def _finished_samples(log: str) -> list[str]:
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [line for line in f.read().splitlines() if line.startswith("done")]


class _OneSlowSample(SquareDataset):
    def __getitem__(self, i):
        if i == 2:
            time.sleep(1.0)
        return super().__getitem__(i)


@pytest.mark.timeout(60)
def test_after_a_timeout_the_iterator_goes_on_as_torchs_does(torch, no_leaks):
    # torch raises and keeps its iterator: the next call waits for the batch
    # again.  (Ending the epoch there lost the rest of it without a word.)
    def outcomes(library):
        loader = library.DataLoader(_OneSlowSample(8, (2,)), batch_size=2, num_workers=2,
                                    timeout=0.4, collate_fn=lambda batch: [int(s[1]) for s in batch])
        it, seen = iter(loader), []
        while True:
            try:
                seen.append(next(it))
            except RuntimeError as error:
                assert "timed out after 0.4 seconds" in str(error)
                seen.append("timeout")
            except StopIteration:
                return seen

    ours = outcomes(fl)
    assert [b for b in ours if b != "timeout"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert "timeout" in ours
    assert [b for b in outcomes(torch.utils.data) if b != "timeout"] == \
        [b for b in ours if b != "timeout"]


@pytest.mark.timeout(60)
def test_sys_exit_in_a_worker_raises_runtime_error_as_torch(torch, no_leaks):
    # SystemExit ends the worker (as in torch's), and the main process reports
    # the exit: it must not re-raise SystemExit and end the caller's program.
    for library in (fl, torch.utils.data):
        # Batches as plain lists: torch passes a tensor batch's storage as a file
        # descriptor that the main process fetches from the worker, which may
        # already have exited (ConnectionResetError, torch's own race).
        loader = library.DataLoader(FaultyDataset(40, bad=5, mode="sys.exit"), batch_size=2,
                                    num_workers=2, collate_fn=list)
        with pytest.raises(RuntimeError, match=r"exited unexpectedly"):
            for _ in loader:
                pass


def _sys_exit_at_init(worker_id):
    sys.exit("worker_init_fn called sys.exit()")


@pytest.mark.timeout(60)
def test_sys_exit_in_worker_init_fn_raises_runtime_error_as_torch(torch, no_leaks):
    for library in (fl, torch.utils.data):
        loader = library.DataLoader(SquareDataset(8), batch_size=2, num_workers=2,
                                    worker_init_fn=_sys_exit_at_init)
        with pytest.raises(RuntimeError, match=r"exited unexpectedly"):
            list(loader)


@pytest.mark.timeout(60)
def test_timeout_not_triggered_when_batches_arrive(no_leaks):
    loader = fl.DataLoader(SlowDataset(8, delay=0.01), batch_size=2, num_workers=2, timeout=5)
    assert [b[1].tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]


# ---------------------------------------------------------------------------
# Leaving an epoch early
# ---------------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_break_then_del_stops_workers_and_unlinks(no_leaks):
    loader = fl.DataLoader(SquareDataset(200, (4,)), batch_size=4, num_workers=2)
    it = iter(loader)
    pids, prefix = it.worker_pids, it._ring.prefix
    for i, batch in enumerate(it):
        if i == 3:
            break
    assert _prefix_entries(prefix), "the ring should have segments while iterating"
    kept = batch
    gc.disable()  # refcounting alone must do it
    try:
        del it
        assert _wait_gone(pids, 5.0) == []
        assert _prefix_entries(prefix) == []
    finally:
        gc.enable()
    # A batch the caller still holds stays valid after the segments are unlinked.
    assert kept[1].tolist() == [12, 13, 14, 15]
    np.testing.assert_array_equal(kept[0], np.repeat(np.arange(12, 16, dtype=np.uint8)[:, None], 4, 1))


@pytest.mark.timeout(60)
def test_stopping_mid_epoch_skips_the_batches_still_queued_as_torch(torch, tmp_path, no_leaks,
                                                                   monkeypatch):
    # Batch size 1, 2 workers, 2 tasks each in flight.  Sample 0 is quick, the
    # others take 1 s: when the loop stops (0.3 s after batch 0), worker 0 is
    # making sample 2 with sample 4 queued, worker 1 sample 1 with sample 3
    # queued.  Each finishes the sample in hand and skips the rest, as torch's
    # workers do, so stopping waits for one sample, not two.
    # A torch worker stopped so sends its last sample's tensor as it exits:
    # its queue's feeder thread may create multiprocessing's pymp-* folder
    # (for the tensor's descriptor) after the exit's clean-up has run, which
    # then stays behind (in about one run of three).  In tmp_path, not /tmp.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def calls_made(library, log):
        loader = library.DataLoader(CallLoggingDataset(str(log), n=40, delay=1.0, quick=(0,)),
                                    batch_size=1, num_workers=2)
        it = iter(loader)
        next(it)
        time.sleep(0.3)
        pids = [w.pid for w in it._workers] if library is not fl else it.worker_pids
        del it
        assert _wait_gone(pids, 10.0) == []
        return logged_calls(str(log))

    assert calls_made(fl, tmp_path / "fastload.log") == [0, 1, 2]
    assert calls_made(torch.utils.data, tmp_path / "torch.log") == [0, 1, 2]


@pytest.mark.timeout(60)
def test_for_loop_break_without_names_stops_workers(no_leaks):
    loader = fl.DataLoader(SquareDataset(200, (4,)), batch_size=4, num_workers=2)
    gc.disable()
    try:
        for batch in loader:
            it = loader._last_iterator()
            pids, prefix = it.worker_pids, it._ring.prefix
            del it
            break
        assert _wait_gone(pids, 5.0) == []
        assert _prefix_entries(prefix) == []
    finally:
        gc.enable()


class LongNames(fl.Dataset):
    """Answers larger than a pipe: each sample carries a 1 MiB string, pickled."""

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return np.full(4, i, np.float32), "x" * (1 << 20)


@pytest.mark.timeout(60)
def test_leaving_an_epoch_stops_workers_that_wait_to_write_an_answer(no_leaks):
    # Their answers fill the pipe, so they wait to write the rest; told to
    # stop meanwhile, they stop at once instead of being waited for (5 s) and
    # then terminated.
    loader = fl.DataLoader(LongNames(), batch_size=4, num_workers=2)
    it = iter(loader)
    assert list(next(it)[1]) == ["x" * (1 << 20)] * 4
    time.sleep(0.5)  # the workers make their next batches and fill the pipes
    pids, prefix = it.worker_pids, it._ring.prefix
    workers = list(it._workers)
    del it
    # Stopped at once, they exit on their own (0); waited for, they would
    # have been terminated (by a signal) after 5 s.
    for worker in workers:
        worker.join(20)
    assert [worker.exitcode for worker in workers] == [0, 0]
    assert _wait_gone(pids, 5.0) == []
    assert _prefix_entries(prefix) == []


@pytest.mark.timeout(60)
def test_dropping_a_persistent_workers_loader_stops_its_workers_without_gc(no_leaks):
    """As torch: ``del loader`` (persistent_workers=True) stops the workers at once."""
    loader = fl.DataLoader(SquareDataset(40, (4,)), batch_size=4, num_workers=2,
                           persistent_workers=True)
    gc.disable()
    try:
        for _ in loader:
            pass
        pids, prefix = loader._iterator.worker_pids, loader._iterator._ring.prefix
        assert all(is_alive(p) for p in pids)  # they persist between epochs
        del loader
        assert _wait_gone(pids, 5.0) == [], "workers outlived their loader (reference cycle?)"
        assert _prefix_entries(prefix) == []
    finally:
        gc.enable()


def _consume_and_fail(loader, info):
    for i, batch in enumerate(loader):
        if i == 0:
            it = loader._last_iterator()
            info["pids"], info["prefix"] = it.worker_pids, it._ring.prefix
            del it
        if i == 2:
            raise CustomError("training step failed")


@pytest.mark.timeout(60)
def test_exception_in_loop_body_then_iterator_dropped(no_leaks):
    loader = fl.DataLoader(SquareDataset(200, (4,)), batch_size=4, num_workers=2)
    info = {}
    with pytest.raises(CustomError):
        _consume_and_fail(loader, info)
    # Even while the traceback (and the failed frame) is kept, then once dropped:
    gc.collect()
    assert _wait_gone(info["pids"], 5.0) == []
    assert _prefix_entries(info["prefix"]) == []


# ---------------------------------------------------------------------------
# Signals to the main process (run in a subprocess)
# ---------------------------------------------------------------------------

def _script(tmp_path, body: str) -> str:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(f"""\
        import sys
        sys.path[:0] = [{TESTS_DIR!r}, {REPO_DIR!r}]
        """) + textwrap.dedent(body))
    return str(path)


# Scripts that check their stderr start two workers; on a machine with fewer
# CPUs torch's worker-count warning (which fastload gives too) is not theirs.
QUIET_ON_FEW_CPUS = "ignore:This DataLoader will create:UserWarning"


@contextlib.contextmanager
def _running(script: str) -> Iterator[subprocess.Popen]:
    """``script`` in a process of its own session, output piped; killed on the way out.

    Its temporary files go beside the script, in the test's ``tmp_path``: a
    process killed on purpose cannot remove multiprocessing's ``pymp-*``
    folders (a forkserver's socket, a resource sharer's), and pytest prunes
    its own folders where /tmp would keep them.
    """
    proc = subprocess.Popen([sys.executable, script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TMPDIR": os.path.dirname(script),
                                 "PYTHONWARNINGS": QUIET_ON_FEW_CPUS})
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def _read_marker(proc, marker: str, seconds: float = 30.0) -> str:
    """Read the child's stdout until a line starting with ``marker``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"child ended before {marker!r}: rc={proc.wait()}, "
                                 f"stderr={proc.stderr.read()}")
        if line.startswith(marker):
            return line[len(marker):].strip()
    raise AssertionError(f"no {marker!r} from child")


def _read_workers(proc) -> tuple[list[int], list[str]]:
    """The worker pids and ring prefixes a child script printed (``PIDS ...``, ``PREFIX ...``)."""
    pids = [int(p) for p in _read_marker(proc, "PIDS").split()]
    return pids, _read_marker(proc, "PREFIX").split()


@pytest.mark.timeout(60)
def test_ctrl_c_in_main_process_raises_keyboard_interrupt_and_cleans_up(tmp_path, no_leaks):
    script = _script(tmp_path, """
        import os, time
        import fastload as fl
        from datasets_for_workers import SlowDataset

        loader = fl.DataLoader(SlowDataset(10_000, delay=0.05), batch_size=2, num_workers=2)
        it = iter(loader)
        next(it)
        print("PIDS", *it.worker_pids, flush=True)
        print("PREFIX", it._ring.prefix, flush=True)
        for batch in it:
            pass
        """)
    with _running(script) as proc:
        no_leaks.watch_pid(proc.pid)
        pids, (prefix,) = _read_workers(proc)
        assert prefix.startswith(f"fl_{proc.pid}_")
        assert all(is_alive(p) for p in pids)
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C does: the whole process group
        _, stderr = proc.communicate(timeout=20)
    assert proc.returncode != 0
    assert "KeyboardInterrupt" in stderr, stderr
    assert stderr.rstrip().splitlines()[-1].startswith("KeyboardInterrupt"), stderr
    assert "leaked shared_memory" not in stderr, stderr  # cleaned by us, not the tracker
    assert _wait_gone(pids, 5.0) == []
    assert _prefix_entries(prefix) == []


@pytest.mark.timeout(60)
def test_a_ctrl_c_lets_busy_workers_finish_their_sample(tmp_path, no_leaks):
    # Killed in the middle of the dataset's code, a worker could leave a lock
    # shared with the main process taken, or a file half written; the caller's
    # `except KeyboardInterrupt` may need either.  Busy workers get their
    # grace (a second Ctrl-C stops them at once).
    log = str(tmp_path / "log")
    loader = fl.DataLoader(CompletionLoggingDataset(log, 64, delay=1.0), batch_size=2,
                           num_workers=2)
    ctrl_c = threading.Timer(0.5, signal.pthread_kill, (threading.main_thread().ident,
                                                        signal.SIGINT))
    ctrl_c.start()
    with pytest.raises(KeyboardInterrupt):
        next(iter(loader))
    ctrl_c.join()
    with open(log) as lines:
        events = lines.read().split("\n")
    started = {line.split()[1] for line in events if line.startswith("start")}
    finished = {line.split()[1] for line in events if line.startswith("done")}
    assert started and started == finished, events


@pytest.mark.timeout(60)
@pytest.mark.parametrize("handler", ["default", "custom"])
def test_ctrl_c_while_a_worker_is_forked_is_not_lost(tmp_path, no_leaks, handler):
    # A SIGINT that lands inside os.fork's at-fork hooks used to raise there,
    # where CPython drops the exception ("Exception ignored in ..."), and the
    # loop went on.  The hook below raises SIGINT at exactly that point.
    script = _script(tmp_path, f"""
        import os, signal
        import fastload as fl

        received = []
        if {handler == "custom"!r}:
            signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
        forks = []

        def interrupt_during_first_fork():
            forks.append(1)
            if len(forks) == 1:
                signal.raise_signal(signal.SIGINT)

        os.register_at_fork(after_in_parent=interrupt_during_first_fork)
        loader = fl.DataLoader(list(range(8)), batch_size=2, num_workers=2)
        try:
            for epoch in range(3):
                for batch in loader:
                    pass
            print("FINISHED", received, len(forks), flush=True)
        except KeyboardInterrupt:
            print("INTERRUPTED", len(forks), flush=True)
        """)
    with _running(script) as proc:
        no_leaks.watch_pid(proc.pid)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "Exception ignored" not in stderr, stderr
    if handler == "default":
        # Raised once the epoch's two workers had started, before any third fork.
        assert stdout.split() == ["INTERRUPTED", "2"], stdout
    else:  # the caller's own handler ran, once, and the epochs went on
        assert stdout.split() == ["FINISHED", f"[{int(signal.SIGINT)}]", "6"], stdout


@pytest.mark.timeout(60)
def test_ctrl_c_while_a_dropped_iterator_stops_busy_workers_is_raised_and_cleans_up(
        tmp_path, no_leaks):
    # After a `break` the iterator's finalizer waits for the busy workers; a
    # Ctrl-C then raised inside the finalizer, where CPython prints and drops
    # it: the loop went on, and the workers, never stopped, created slots'
    # segments after the ring had unlinked its names.
    script = _script(tmp_path, """
        import os, signal, threading, time
        import fastload as fl
        from datasets_for_workers import SlowDataset

        loader = fl.DataLoader(SlowDataset(64, delay=0.5), batch_size=2, num_workers=2)
        it = iter(loader)
        print("PIDS", *it.worker_pids, flush=True)
        print("PREFIX", it._ring.prefix, flush=True)
        try:
            for batch in it:
                threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
                start = time.monotonic()
                del it
                break
            time.sleep(3.0)
            print("LOST", flush=True)
        except KeyboardInterrupt:
            print("INTERRUPTED", round(time.monotonic() - start, 1), flush=True)
        """)
    with _running(script) as proc:
        no_leaks.watch_pid(proc.pid)
        pids, (prefix,) = _read_workers(proc)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "Exception ignored" not in stderr, stderr
    # Interrupted, not lost (the loop going on to print LOST); the time only proves no hang.
    assert stdout.split()[0] == "INTERRUPTED" and float(stdout.split()[1]) < 20.0, stdout
    assert _wait_gone(pids, 5.0) == []
    assert _prefix_entries(prefix) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True])
def test_dropping_an_epoch_and_its_batches_runs_no_python_code(no_leaks, persistent):
    # Where the caller drops the batches and the finished iterator, Python
    # code (a __del__, a weakref callback) is where a Ctrl-C can be lost:
    # CPython drops a KeyboardInterrupt raised there.  The workers' pipes and
    # processes are let go in shutdown, with Ctrl-C held, and the ring learns
    # of dropped batches without running Python code.
    loader = fl.DataLoader([np.full(4, i, np.float32) for i in range(64)], batch_size=16,
                           num_workers=2, persistent_workers=persistent)
    for _ in range(2):  # the second epoch starts from slots the first one left
        it = iter(loader)
        batches = list(it)
    calls = []
    sys.setprofile(lambda frame, event, arg: calls.append(frame.f_code.co_qualname)
                   if event == "call" else None)
    try:
        del it, batches
    finally:
        sys.setprofile(None)
    assert calls == []
    assert [b[:, 0].tolist() for b in loader] == [[16.0 * k + i for i in range(16)] for k in range(4)]
    del loader


@pytest.mark.timeout(60)
def test_a_process_the_caller_forks_leaves_the_loader_alone_at_its_exit(tmp_path, no_leaks):
    # The child inherits the iterator's finalizer and runs it at exit; the
    # workers and the segments are the parent's, still in use.
    script = _script(tmp_path, """
        import os, sys
        import numpy as np
        import fastload as fl

        loader = fl.DataLoader([np.full(4, i, np.float32) for i in range(64)], batch_size=8,
                               num_workers=2)
        it = iter(loader)
        first = next(it)
        child = os.fork()
        if child == 0:
            # atexit handlers run: the loader's finalizer, and multiprocessing's,
            # which terminates the daemonic processes it lists as children (it
            # took the parent's workers, as it does under torch).
            sys.exit(0)
        _, status = os.waitpid(child, 0)
        print("BATCHES", status, [int(b[0, 0]) for b in it], flush=True)
        """)
    with _running(script) as proc:
        no_leaks.watch_pid(proc.pid)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert stdout.split() == ["BATCHES", "0", "[8,", "16,", "24,", "32,", "40,", "48,", "56]"], stderr
    assert stderr == ""


@pytest.mark.timeout(60)
def test_a_forked_child_iterates_a_persistent_loader_with_workers_of_its_own(no_leaks):
    # The child's copy of the loader holds the parent's iterator, whose
    # workers answer the parent: asking them, the child took the parent's
    # batches and the parent waited forever (torch's loader the same).
    expected = [labels.tolist() for _, labels in fl.DataLoader(SquareDataset(40, (2,)), batch_size=4)]
    loader = fl.DataLoader(SquareDataset(40, (2,)), batch_size=4, num_workers=2,
                           persistent_workers=True)
    iterator = iter(loader)
    parents_workers = iterator.worker_pids
    assert next(iterator)[1].tolist() == expected[0]

    def child():
        assert [labels.tolist() for _, labels in loader] == expected
        assert not set(loader._iterator.worker_pids) & set(parents_workers)
        loader._iterator.shutdown()

    assert fork_child(child) == 0
    assert [labels.tolist() for _, labels in iterator] == expected[1:]
    assert [labels.tolist() for _, labels in loader] == expected
    assert loader._iterator.worker_pids == parents_workers


@pytest.mark.timeout(60)
def test_next_on_an_iterator_a_fork_brought_raises_and_leaves_the_parents_epoch_alone(no_leaks):
    expected = [labels.tolist() for _, labels in fl.DataLoader(SquareDataset(40, (2,)), batch_size=4)]
    iterator = iter(fl.DataLoader(SquareDataset(40, (2,)), batch_size=4, num_workers=2))
    assert next(iterator)[1].tolist() == expected[0]
    parent = os.getpid()

    def child():
        with pytest.raises(RuntimeError, match=f"came with a fork from process {parent}, "
                                               f"whose workers serve that process only"):
            next(iterator)

    assert fork_child(child) == 0
    assert [labels.tolist() for _, labels in iterator] == expected[1:]


_kept_by_the_child: list = []


def _leave_a_loader_running():
    loader = fl.DataLoader(SquareDataset(40, (2,)), batch_size=4, num_workers=2,
                           persistent_workers=True)
    _kept_by_the_child.append(loader)  # alive when the child returns
    assert len(list(loader)) == 10


@pytest.mark.timeout(60)
def test_a_multiprocessing_child_ending_with_a_loader_alive_leaves_no_segment(no_leaks):
    # multiprocessing ends a child it forked with os._exit, after its own exit
    # function (which terminates the child's daemonic processes, the loader's
    # workers) but running no atexit handler, so no iterator finalizer.
    child = multiprocessing.get_context("fork").Process(target=_leave_a_loader_running)
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert [n for n in shm_entries() if n.startswith(f"fl_{child.pid}_")] == []


@pytest.mark.timeout(60)
def test_an_exhausted_iterator_a_fork_brought_still_stops(no_leaks):
    iterator = iter(fl.DataLoader(SquareDataset(8, (2,)), batch_size=4, num_workers=2))
    assert len(list(iterator)) == 2

    def child():
        with pytest.raises(StopIteration):
            next(iterator)

    assert fork_child(child) == 0


def _assert_workers_and_segments_go(pids: list[int], prefixes: list[str], outlived: str) -> None:
    """Within 10 s no worker of ``pids`` is alive and no segment of ``prefixes`` is left
    (workers still alive then are killed, after the test has failed)."""
    def leftovers():
        return [name for prefix in prefixes for name in _prefix_entries(prefix)]

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (any(is_alive(p) for p in pids) or leftovers()):
        time.sleep(0.1)
    orphans = [p for p in pids if is_alive(p)]
    try:
        assert orphans == [], f"workers {orphans} outlived {outlived}"
        assert leftovers() == [], f"segments outlived {outlived}"
    finally:
        for pid in orphans:
            os.kill(pid, signal.SIGKILL)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["fork", "forkserver"])
@pytest.mark.parametrize("busy", ["idle", "busy", "oversized"])
def test_sigkilled_main_process_leaves_no_orphans_or_segments(tmp_path, no_leaks, method, busy):
    # The workers notice that the main process is gone (forkserver workers are
    # not its children) and exit, and the ring's memory files go with the last
    # process that holds them.  "busy" adds a second loader whose workers are
    # inside __getitem__ at the time.
    # "oversized": its workers' answers (pickled strings) are larger than the
    # pipe, so they are waiting to write them, a write nobody will read.
    script = _script(tmp_path, f"""
        import os, time
        import numpy as np
        import fastload as fl
        from datasets_for_workers import SquareDataset, SlowDataset

        class LongNames(fl.Dataset):
            def __len__(self):
                return 64

            def __getitem__(self, i):
                return np.full(4, i, np.float32), "x" * (1 << 20)

        if __name__ == "__main__":
            loader = fl.DataLoader(SquareDataset(64, (3, 16, 16)), batch_size=4, num_workers=2,
                                   persistent_workers=True, multiprocessing_context={method!r})
            held = list(loader)          # one full epoch, every batch held
            it = iter(loader)            # a second epoch, left mid-way
            batch = next(it)
            iterators = [it]
            if {busy!r} == "busy":
                slow = fl.DataLoader(SlowDataset(64, delay=0.3, shape=(3, 32, 32)), batch_size=8,
                                     num_workers=2, multiprocessing_context={method!r})
                iterators.append(iter(slow))
            if {busy!r} == "oversized":
                long = fl.DataLoader(LongNames(), batch_size=4, num_workers=2,
                                     multiprocessing_context={method!r})
                iterators.append(iter(long))
                next(iterators[-1])
                time.sleep(1)  # the workers fill the pipe and wait to write the rest
            print("PIDS", *[pid for it in iterators for pid in it.worker_pids], flush=True)
            print("PREFIX", *[it._ring.prefix for it in iterators], flush=True)
            time.sleep(60)
        """)
    with _running(script) as proc:
        no_leaks.watch_pid(proc.pid)
        pids, prefixes = _read_workers(proc)
        assert all(is_alive(p) for p in pids)
        assert _prefix_entries(prefixes[0]), "the child's ring should have segments"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    _assert_workers_and_segments_go(pids, prefixes, "their killed main process")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_process_group_terminated_leaves_no_segments(tmp_path, no_leaks, signum, method):
    # ``kill -TERM -<pgid>`` (GNU timeout, a scheduler, a closed terminal for
    # SIGHUP) ends the main process and the workers together, and nothing of
    # the ring is left.  The second loader's workers are busy in __getitem__
    # at the time.
    script = _script(tmp_path, f"""
        import time
        import fastload as fl
        from datasets_for_workers import SquareDataset, SlowDataset

        if __name__ == "__main__":
            loader = fl.DataLoader(SquareDataset(64, (3, 16, 16)), batch_size=4, num_workers=2,
                                   persistent_workers=True, multiprocessing_context={method!r})
            it = iter(loader)
            batch = next(it)
            slow = iter(fl.DataLoader(SlowDataset(64, delay=0.3, shape=(3, 32, 32)), batch_size=8,
                                      num_workers=2, multiprocessing_context={method!r}))
            next(slow)
            print("PIDS", *it.worker_pids, *slow.worker_pids, flush=True)
            print("PREFIX", it._ring.prefix, slow._ring.prefix, flush=True)
            time.sleep(60)
        """)
    with _running(script) as proc:
        no_leaks.watch_pid(proc.pid)
        pids, prefixes = _read_workers(proc)
        assert all(_prefix_entries(prefix) for prefix in prefixes)
        os.killpg(proc.pid, signum)
        assert proc.wait(timeout=10) == -signum

    _assert_workers_and_segments_go(pids, prefixes, "their terminated process group")


@pytest.mark.timeout(60)
def test_a_worker_stuck_in_c_code_still_dies_when_its_group_is_terminated(tmp_path, no_leaks):
    # Worker 1 waits inside C (system() retries its wait on EINTR), where no
    # Python handler could run: SIGTERM, left at its default action, kills it.
    pidfile = tmp_path / "sleeper.pid"
    script = _script(tmp_path, f"""
        import os, time
        import fastload as fl
        from datasets_for_workers import SquareDataset

        class StuckInC(SquareDataset):
            def __getitem__(self, i):
                info = fl.get_worker_info()
                if info is not None and info.id == 1:
                    os.system("exec setsid sh -c 'echo $$ > {pidfile}; exec sleep 30'")
                return super().__getitem__(i)

        if __name__ == "__main__":
            it = iter(fl.DataLoader(StuckInC(64, (3, 16, 16)), batch_size=4, num_workers=2))
            batch = next(it)
            print("PIDS", *it.worker_pids, flush=True)
            print("PREFIX", it._ring.prefix, flush=True)
            time.sleep(60)
        """)
    try:
        with _running(script) as proc:
            no_leaks.watch_pid(proc.pid)
            pids, (prefix,) = _read_workers(proc)
            deadline = time.monotonic() + 10
            while not pidfile.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pidfile.exists(), "worker 1 never got stuck"
            time.sleep(0.2)
            start = time.monotonic()
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        gone = _wait_gone(pids, 15.0)
        assert gone == [], f"workers {gone} outlived their terminated group"
        assert time.monotonic() - start < 12
        assert _prefix_entries(prefix) == []
    finally:
        if pidfile.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


@pytest.mark.timeout(60)
def test_sigkilled_main_process_between_epochs_leaves_nothing(tmp_path, no_leaks):
    # Between two epochs of new (forked) workers the loader keeps the ring's
    # slots for the next epoch (NOTE [ Slots that outlive an epoch ]): mapped
    # in the main process only, with no name, so its death frees them.
    script = _script(tmp_path, """
        import os, time
        import fastload as fl
        from datasets_for_workers import SquareDataset

        if __name__ == "__main__":
            loader = fl.DataLoader(SquareDataset(64, (3, 16, 16)), batch_size=4, num_workers=2,
                                   multiprocessing_context="fork")
            for _ in range(2):
                for batch in loader:
                    pass
            with open("/proc/self/maps") as maps:
                kept = sum(f"fl_{os.getpid()}_" in line and "(deleted)" in line for line in maps)
            print("KEPT", kept, flush=True)
            time.sleep(60)
        """)
    with _running(script) as proc:
        no_leaks.watch_pid(proc.pid)
        kept = int(_read_marker(proc, "KEPT"))
        assert kept >= 4, "the loader should keep its slots between epochs"
        children = psutil.Process(proc.pid).children(recursive=True)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert _wait_gone([c.pid for c in children], 5.0) == []
    assert [n for n in shm_entries() if n.startswith(f"fl_{proc.pid}_")] == []


# ---------------------------------------------------------------------------
# Start methods and pickling
# ---------------------------------------------------------------------------

class LambdaDataset(SquareDataset):
    def __init__(self):
        super().__init__(8, (2,))
        self.transform = lambda x: x


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_unpicklable_dataset_fails_at_iter_naming_it(no_leaks, method):
    loader = fl.DataLoader(LambdaDataset(), batch_size=2, num_workers=2,
                           multiprocessing_context=method)
    with pytest.raises(Exception) as excinfo:
        iter(loader)
    message = str(excinfo.value)
    assert "dataset" in message and "'fork'" in message and "lambda" in message, message


@pytest.mark.timeout(60)
def test_local_class_dataset_fails_at_iter_under_spawn(no_leaks):
    class LocalDataset(fl.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return i

    loader = fl.DataLoader(LocalDataset(), batch_size=2, num_workers=1,
                           multiprocessing_context="spawn")
    with pytest.raises(Exception) as excinfo:
        iter(loader)
    message = str(excinfo.value)
    assert "dataset" in message and "LocalDataset" in message and "'fork'" in message, message


@pytest.mark.timeout(60)
def test_unpicklable_worker_init_fn_fails_at_iter_under_spawn(no_leaks):
    loader = fl.DataLoader(SquareDataset(8, (2,)), batch_size=2, num_workers=2,
                           multiprocessing_context="spawn", worker_init_fn=lambda i: None)
    with pytest.raises(Exception) as excinfo:
        iter(loader)
    message = str(excinfo.value)
    assert "worker_init_fn" in message and "'fork'" in message, message
    assert "dataset" not in message.split("worker_init_fn")[0], message  # names the culprit


@pytest.mark.timeout(90)
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_each_start_method_runs_an_epoch(no_leaks, method):
    dataset = WorkerIdDataset(30, (2, 3))
    expected = list(fl.DataLoader(dataset, batch_size=4))
    loader = fl.DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context=method,
                           worker_init_fn=record_init)
    got = list(loader)
    assert len(got) == len(expected) == 8
    for ours, ref in zip(got, expected):
        np.testing.assert_array_equal(ours[0], ref[0])
        np.testing.assert_array_equal(ours[1], ref[1])
    worker_ids = set(np.concatenate([b[2] for b in got]).tolist())
    assert worker_ids <= {0, 1} and worker_ids, worker_ids  # made in workers, not in main
