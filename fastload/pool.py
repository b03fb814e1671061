"""The worker processes of one iterator: start, message, watch, stop.

Tasks go to each worker on its own queue (a ``multiprocessing.Queue``, whose
feeder thread means the main process never blocks on a full pipe); answers
come back on one pipe per worker.  The main process waits on those pipes *and*
on every worker's process sentinel at once, so a worker that dies wakes it
immediately: no polling interval, and no wait that a dead worker can hang.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import time
from multiprocessing.connection import wait
from typing import Any, Sequence

from fastload.worker import worker_loop

__all__ = ["WorkerPool", "pickle_for_workers"]

# How long shutdown waits for workers to exit before terminating them.
_JOIN_GRACE = 5.0


def pickle_for_workers(named_objects: Sequence[tuple[str, Any]], method: str) -> bytes:
    """Pickle what spawn/forkserver workers need, once for all of them.

    A failure names the object that cannot be pickled and what to do.
    """
    try:
        return pickle.dumps(tuple(obj for _, obj in named_objects), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        for name, obj in named_objects:
            try:
                pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as inner:
                culprit, error = name, inner
                break
        else:  # pragma: no cover - the tuple failed but no part did
            culprit, error = "the worker arguments", exc
        message = (f"DataLoader with multiprocessing_context={method!r} must pickle the {culprit} "
                   f"to send it to the workers, but it cannot be pickled: {error}. Define it at "
                   f"module level (not as a lambda, local function or class), or use "
                   f"multiprocessing_context='fork'.")
        try:
            rebuilt = type(error)(message)
        except Exception:
            rebuilt = TypeError(message)
        raise rebuilt from error


def describe_exit(pid: int, exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
            text = signal.strsignal(-exitcode) or name
        except ValueError:
            name = text = f"signal {-exitcode}"
        return f"DataLoader worker (pid {pid}) is killed by signal: {text} ({name})"
    return f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {exitcode}"


class WorkerDied(RuntimeError):
    """A worker process ended without being asked to."""


class WorkerPool:
    """``num_workers`` processes running ``worker_loop``."""

    def __init__(self, context: Any, num_workers: int, payload: Any, base_seed: int) -> None:
        self.context = context
        self._task_queues: list[Any] = []
        self._conns: list[Any] = []
        self.processes: list[Any] = []
        self._closed = False
        parent_pid = os.getpid()
        try:
            for worker_id in range(num_workers):
                task_queue = context.Queue()
                reader, writer = context.Pipe(duplex=False)
                process = context.Process(
                    target=worker_loop,
                    args=(worker_id, num_workers, payload, task_queue, writer, base_seed, parent_pid),
                    daemon=True,
                )
                # start() returns once the child is launched, not once it has
                # imported anything: all workers start up concurrently.
                process.start()
                writer.close()  # only the worker writes; EOF then means it is gone
                self._task_queues.append(task_queue)
                self._conns.append(reader)
                self.processes.append(process)
        except BaseException:
            self.shutdown()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def send(self, worker_id: int, message: Any) -> None:
        self._task_queues[worker_id].put(message)

    def broadcast(self, message: Any) -> None:
        for task_queue in self._task_queues:
            task_queue.put(message)

    def receive(self, timeout: float | None) -> tuple[int, Any] | None:
        """The next answer from any worker, or None when ``timeout`` passes.

        Raises ``WorkerDied`` as soon as a worker has exited (after its
        pending answers have been read).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            conns = [c for c in self._conns if c is not None]
            sentinels = [p.sentinel for p in self.processes]
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(conns + sentinels, remaining)
            if not ready:
                return None
            for worker_id, conn in enumerate(self._conns):
                if conn is not None and conn in ready:
                    try:
                        return worker_id, conn.recv()
                    except EOFError:
                        self._conns[worker_id] = None  # the process sentinel will tell why
                        conn.close()
            for process in self.processes:
                if process.sentinel in ready:
                    process.join(timeout=1.0)
                    raise WorkerDied(describe_exit(process.pid, process.exitcode))

    def check_alive(self) -> None:
        for process in self.processes:
            if not process.is_alive():
                process.join(timeout=1.0)
                raise WorkerDied(describe_exit(process.pid, process.exitcode))

    def shutdown(self) -> None:
        """Ask every worker to exit, wait a bounded time, then terminate the rest."""
        if self._closed:
            return
        self._closed = True
        for task_queue, process in zip(self._task_queues, self.processes):
            if process.is_alive():
                try:
                    task_queue.put(None)
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + _JOIN_GRACE
        for process in self.processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in self.processes:
            if process.is_alive():
                process.terminate()
                process.join(timeout=1.0)
            if process.is_alive():
                process.kill()
                process.join(timeout=1.0)
        for task_queue in self._task_queues:
            # The feeder thread may hold items no worker will read now.
            task_queue.cancel_join_thread()
            task_queue.close()
        for conn in self._conns:
            if conn is not None:
                conn.close()
        self._conns = [None] * len(self._conns)
