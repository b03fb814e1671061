"""The worker processes of one iterator: start, message, watch, stop.

Each worker has two pipes: tasks in, answers out.  The main process polls
answer pipes *and* every worker's process sentinel at once (``poll`` objects
registered once), so a worker that dies wakes it immediately: no polling
interval, and no wait that a dead worker can hang.

NOTE [ Waking for the awaited answer only ]
In order, the main process needs batch k next and knows which worker makes
it, so it watches that worker's answer pipe alone (with every sentinel).
Other workers' answers wait in their pipes until they are the ones needed:
woken for one of them, the main process would only read it, put it aside and
sleep again, and with more processes than CPUs every such wake-up preempts a
worker.  With two workers that halved the main process's voluntary context
switches (144 to 79 a `dict` epoch with persistent workers) and made such
epochs 2-6 % shorter (paired alternating runs of `epoch_costs.py`'s loop:
`dict` 16 pairs, 12 faster; `array` 12 pairs, 9 faster); with new workers
every epoch it changed nothing beyond the noise.  Nothing waits on an unread
answer: a worker whose answer is larger than its pipe blocks until it is
needed, and nothing the awaited worker does depends on it.  A sentinel that
fires comes before every answer pipe: the dead worker's own pipe is read for
what it sent before dying, then its death is reported, however many answers
the live workers have ready (out of order they nearly always have one, and
a death noticed only when they ran out of work was noticed at the epoch's end).

NOTE [ Why sending a task never blocks ]
A worker has at most ``prefetch_factor`` unread tasks, each a few KB (a batch
number, a slot and the batch's index array), so they fit in the pipe, which is
enlarged to 1 MiB where the OS allows.  A task too large for that share of
the pipe (a huge batch of indices) travels in a memory file instead, and only
its handle goes through the pipe.  So the main process never
waits on a worker that is itself waiting for the main process to read its
answer.  (A ``multiprocessing.Queue`` would also never block, but its feeder
thread costs a GIL hand-off per batch in the main process.)
"""

from __future__ import annotations

import _signal
import gc
import os
import pickle
import select
import signal
import time
from typing import Any

from fastload._lifetime import pipe_ends
from fastload._lifetime.descriptors import readable
from fastload._lifetime.interrupts import signals_held
from fastload._loading import reaping
from fastload._loading.wire.frames import FrameReader, send_frame
from fastload._loading.wire.messages import STOP_BYTES, indirect_task
from fastload._loading.wire.picklers import dumps_task
from fastload._loading.worker_loop import worker_loop
from fastload._ring import Segment
from fastload._ring.segments import write_message

try:
    from fcntl import fcntl
    _F_SETPIPE_SZ, _F_GETPIPE_SZ = 1031, 1032  # Linux
except ImportError:  # pragma: no cover - non-POSIX
    fcntl = None

__all__ = ["WorkerPool"]

_PIPE_BYTES = 1 << 20
# Pipe capacity assumed when sizing tasks: Linux's default, unless enlarged.
_DEFAULT_PIPE_BYTES = 1 << 16


def _enlarge_pipe(conn: Any) -> int:
    """Ask for a 1 MiB pipe buffer; return the capacity we can count on.

    Refused (past ``/proc/sys/fs/pipe-max-size``, or a user over
    ``pipe-user-pages-soft``, whose new pipes get 2 pages), the pipe keeps
    what it has, which is read back: it may be less than the usual 64 KiB.
    """
    if fcntl is None:
        return _DEFAULT_PIPE_BYTES
    try:
        return fcntl(conn.fileno(), _F_SETPIPE_SZ, _PIPE_BYTES)
    except OSError:
        pass
    try:
        return fcntl(conn.fileno(), _F_GETPIPE_SZ)
    except OSError:
        return 4096  # a pipe holds at least a page


# signal's functions turn their answers into enums (signal.getsignal: 0.3
# microseconds a task); _signal's do not.
_SIGPIPE, _SIG_IGN = int(signal.SIGPIPE), int(signal.SIG_IGN)


def _send_frame(fd: int, data: bytes) -> None:
    """``send_frame``, where a pipe whose worker has died fails with EPIPE
    (``BrokenPipeError``) and never kills the main process.

    Python ignores SIGPIPE, but a program may have restored its default
    action (``signal(SIGPIPE, SIG_DFL)``, the idiom of tools piped into
    ``head``), and a dead worker's task pipe has no reader left (torch's
    queues keep one in the main process).  Then the signal is blocked over
    the write, and one the write raised is taken back before it is unblocked.
    """
    if _signal.getsignal(_SIGPIPE) == _SIG_IGN:  # Python's default: no signal
        send_frame(fd, data)
        return
    mask = _signal.pthread_sigmask(signal.SIG_BLOCK, {_SIGPIPE})
    pending_before = _SIGPIPE in _signal.sigpending()
    try:
        send_frame(fd, data)
    except BrokenPipeError:
        if not pending_before:
            _signal.sigtimedwait({_SIGPIPE}, 0)
        raise
    finally:
        _signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class WorkerPool:
    """``num_workers`` processes running ``worker_loop``.

    Made in two steps: the constructor creates every worker's pipes, so the
    caller can queue the first tasks, then ``start()`` launches the processes.
    The first tasks are held back until their worker's process exists, and
    written the moment it does: before the worker has even finished starting
    up, so it finds them waiting.  That costs the
    main process no wake-ups (and no preemption by workers that would wake up
    only to find a single task), and a worker starts its first batch the
    moment it is ready.
    """

    def __init__(self, context: Any, num_workers: int, payload: Any, base_seed: int,
                 prefetch: int, ring_prefix: str,
                 inherited_slots: dict[int, Segment] | None = None) -> None:
        self.context = context
        self.processes: list[Any] = []  # until shutdown
        self._pids: list[int] = []
        self._closed = False
        self._poller = select.poll()
        # Per worker: its answer pipe and every worker's sentinel (see receive()).
        self._worker_pollers: list[Any] = []
        self._worker_of_fd: dict[int, int] = {}
        self._process_of_fd: dict[int, Any] = {}
        self._ring_prefix = ring_prefix
        self._messages: list[Segment] = []  # tasks too large for a pipe, until read
        self._messages_sent = 0
        # How long shutdown lets a busy worker finish the batch in hand.
        self.exit_grace = reaping.JOIN_GRACE
        # ``inherited_slots`` (fork only): ring slots the workers write through
        # the mappings they inherit (NOTE [ Slots that outlive an epoch ]).
        self._args = (num_workers, payload, base_seed, os.getpid(), inherited_slots or {})
        # What a worker added later is started with (num_workers="auto"), and the
        # workers retired since: their exit is no error.
        self._later_args = (payload, base_seed, os.getpid())
        self.retired: set[int] = set()
        self._live: tuple[int, ...] = ()
        self._live_key = (0, 0)
        self._task_conns: list[Any] = []
        self._result_conns: list[Any] = []
        self._task_fds: list[int] = []
        self._readers: list[FrameReader] = []
        # Workers whose reader holds bytes past the message it last gave.
        self._leftover: set[int] = set()
        self._child_ends: list[tuple[Any, Any]] = []   # (task_reader, result_writer), until start()
        # Messages for workers not started yet; None once every worker is.
        self._held: list[list[bytes]] | None = [[] for _ in range(num_workers)]
        capacities = []
        try:
            for _ in range(num_workers):
                capacities += self._make_pipes()
        except BaseException:
            self.shutdown()
            raise
        # Every unread task (at most `prefetch`, plus control messages) must
        # fit in the smallest pipe at once; see NOTE [ Why sending a task never blocks ].
        self._prefetch = prefetch
        self._max_task_bytes = min(capacities, default=_DEFAULT_PIPE_BYTES) // (prefetch + 2)

    def _make_pipes(self) -> list[int]:
        """A new worker's two pipes; returns their capacities."""
        task_reader, task_writer = self.context.Pipe(duplex=False)
        result_reader, result_writer = self.context.Pipe(duplex=False)
        self._task_conns.append(task_writer)
        self._result_conns.append(result_reader)
        self._task_fds.append(task_writer.fileno())
        self._readers.append(FrameReader(result_reader.fileno()))
        self._child_ends.append((task_reader, result_writer))
        pipe_ends.track(task_reader, task_writer, result_reader, result_writer)
        return [_enlarge_pipe(task_writer), _enlarge_pipe(result_writer)]

    def start(self) -> None:
        """Launch the workers (on failure, stop the ones already started)."""
        # It forks, and drops the reaped workers of earlier epochs and the
        # workers' pipe ends (on return: they are its locals too), all of
        # which run Python code where a Ctrl-C would be lost (NOTE [ Ctrl-C
        # held over fork and teardown ]).
        with signals_held():
            self._start_workers()

    def _start_workers(self) -> None:
        num_workers, payload, base_seed, parent_pid, inherited_slots = self._args
        reaping.reap_exiting()
        # A forked worker's garbage collector walks every object it inherited,
        # writing to their pages, so each worker would copy much of the parent's
        # heap page by page.  Objects frozen at fork time are never walked; the
        # parent unfreezes its own right after.  A caller that froze objects
        # itself keeps managing that.  Unfreezing puts every object in the
        # oldest generation, where a reference cycle that became garbage since
        # the last young collection (one holding a batch, and so its slot)
        # would wait for a full collection, which CPython seldom runs: the
        # young generations are collected first.
        freeze = self.context.get_start_method() == "fork" and gc.get_freeze_count() == 0
        if freeze:
            gc.collect(1)
            gc.freeze()
        try:
            for worker_id, (task_reader, result_writer) in enumerate(self._child_ends):
                self._launch(worker_id, task_reader, result_writer,
                             (worker_id, num_workers, payload, task_reader, result_writer,
                              base_seed, parent_pid, inherited_slots))
                self._release_held(worker_id)
            for worker_id, conn in enumerate(self._result_conns):
                poller = select.poll()
                poller.register(conn.fileno(), select.POLLIN)
                for process in self.processes:
                    poller.register(process.sentinel, select.POLLIN)
                self._worker_pollers.append(poller)
        except BaseException:
            self.shutdown()
            raise
        finally:
            if freeze:
                gc.unfreeze()
            self._child_ends = []
            self._held = None
            self._args = None  # the workers have it; inherited slots must not outlive the ring

    def _launch(self, worker_id: int, task_reader: Any, result_writer: Any, args: tuple) -> None:
        """Start worker ``worker_id``'s process and watch its answers and its death."""
        process = self.context.Process(target=worker_loop, args=args, daemon=True)
        # Listed before it starts: an exception raised while it starts
        # (by a handler of the caller's signals) must not lose it.
        self.processes.append(process)
        reaping.workers_of_this_process.add(process)
        # start() returns once the child is launched, not once it has
        # imported anything: all workers start up concurrently.
        process.start()
        self._pids.append(process.pid)
        # The worker's ends: EOF then means the worker is gone.
        pipe_ends.close(task_reader)
        pipe_ends.close(result_writer)
        result_fd = self._result_conns[worker_id].fileno()
        self._worker_of_fd[result_fd] = worker_id
        self._process_of_fd[process.sentinel] = process
        self._poller.register(result_fd, select.POLLIN)
        self._poller.register(process.sentinel, select.POLLIN)

    def add_worker(self, num_workers: int) -> int:
        """Start one more worker (``num_workers="auto"``) and return its id, the next
        one (a retired worker's id is not reused).  ``num_workers``: what its
        ``get_worker_info().num_workers`` says.  Its tasks may be sent at once."""
        payload, base_seed, parent_pid = self._later_args
        worker_id = len(self._task_conns)
        capacities = self._make_pipes()
        self._max_task_bytes = min(self._max_task_bytes, min(capacities) // (self._prefetch + 2))
        task_reader, result_writer = self._child_ends.pop()
        freeze = self.context.get_start_method() == "fork" and gc.get_freeze_count() == 0
        with signals_held():  # as start(): it forks, and drops the worker's pipe ends
            if freeze:  # see _start_workers
                gc.collect(1)
                gc.freeze()
            try:
                self._launch(worker_id, task_reader, result_writer,
                             (worker_id, num_workers, payload, task_reader, result_writer,
                              base_seed, parent_pid, {}))
            finally:
                if freeze:
                    gc.unfreeze()
        process = self.processes[worker_id]
        poller = select.poll()
        poller.register(self._result_conns[worker_id].fileno(), select.POLLIN)
        for other_id, other in enumerate(self.processes):
            if other_id not in self.retired:
                poller.register(other.sentinel, select.POLLIN)
                if other_id != worker_id:
                    self._worker_pollers[other_id].register(process.sentinel, select.POLLIN)
        self._worker_pollers.append(poller)
        return worker_id

    def retire_worker(self, worker_id: int) -> None:
        """Tell a worker with no task left to exit (``num_workers="auto"``): from now
        on its exit is expected, not a death to report."""
        process = self.processes[worker_id]
        self.retired.add(worker_id)
        self._process_of_fd.pop(process.sentinel, None)
        for poller in [self._poller, *self._worker_pollers]:
            try:
                poller.unregister(process.sentinel)
            except KeyError:
                pass
        if self._readers[worker_id].fd in self._worker_of_fd:
            self._forget_pipe(worker_id)
        try:
            _send_frame(self._task_fds[worker_id], STOP_BYTES)
        except OSError:
            pass  # exiting already
        reaping.leave_to_exit([process])

    @property
    def live_workers(self) -> tuple[int, ...]:
        """The ids of the workers not retired (kept until one is added or retired:
        num_workers="auto" asks for them with every batch)."""
        key = (len(self._task_conns), len(self.retired))  # workers are only ever added and retired
        if key != self._live_key:
            self._live = tuple(worker_id for worker_id in range(len(self._task_conns))
                               if worker_id not in self.retired)
            self._live_key = key
        return self._live

    @property
    def pids(self) -> list[int]:
        return list(self._pids)

    def _pack(self, message: Any, may_hold_tensors: bool = False) -> bytes:
        """``message``'s bytes for a task pipe.  ``may_hold_tensors``: tensors
        in it travel as torch's do where plain pickling would not rebuild
        them (NOTE [ Tasks that may hold tensors ] in wire/picklers.py)."""
        if may_hold_tensors:
            data = dumps_task(message)
        else:
            data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) <= self._max_task_bytes:
            return data
        # Too big for the pipe's share: hand it over in a memory file, kept
        # (open) until its worker has read and emptied it.
        self._messages = [segment for segment in self._messages if segment.file_size() > 0]
        segment = write_message(f"{self._ring_prefix}m{self._messages_sent}", data)
        self._messages_sent += 1
        self._messages.append(segment)
        return pickle.dumps(indirect_task(segment.name, len(data)),
                            protocol=pickle.HIGHEST_PROTOCOL)

    def send(self, worker_id: int, message: Any, may_hold_tensors: bool = False) -> None:
        self._send_bytes(worker_id, self._pack(message, may_hold_tensors))

    def broadcast(self, message: Any) -> None:
        """Send ``message`` to every worker not retired."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        for worker_id in range(len(self._task_conns)):
            if worker_id not in self.retired:
                self._send_bytes(worker_id, data)

    def _release_held(self, worker_id: int) -> None:
        held, self._held[worker_id] = self._held[worker_id], []
        for data in held:
            _send_frame(self._task_fds[worker_id], data)

    def _send_bytes(self, worker_id: int, data: bytes) -> None:
        """Write a task; a worker that has gone (its pipe is closed) raises ``WorkerDied``."""
        if self._held is not None:  # not started yet: see the class docstring
            self._held[worker_id].append(data)
            return
        try:
            _send_frame(self._task_fds[worker_id], data)
        except (BrokenPipeError, ConnectionResetError):
            # e.g. killed while idle between two epochs of persistent workers
            raise reaping.died(self.processes[worker_id]) from None

    def raise_if_exiting(self, worker_id: int, grace: float = 0.2) -> None:
        """``WorkerDied`` if the worker has exited, or exits within ``grace``
        seconds; nothing if it lives on.

        For an answer that failed to arrive whole because its worker was
        gone: a value handed over by descriptor (NOTE [ Pickled as torch's
        workers pickle ] in wire/layouts.py) cannot be fetched from a dead
        worker, and torch reports that as the worker's death.  The worker's
        descriptors all close together as it exits, so its sentinel follows
        the failed fetch at once.
        """
        process = self.processes[worker_id]
        if readable(process.sentinel, grace):
            raise reaping.died(process)

    def receive(self, timeout: float | None, awaited: int | None = None) -> tuple[int, Any] | None:
        """The next answer from any worker, or None when ``timeout`` passes.

        ``awaited``: the worker whose answer the caller needs next.  Only its
        pipe (and every sentinel) is watched, so answers that would only be
        put aside wait in their pipes instead of waking the main process, on
        a CPU where it would preempt a worker (see NOTE [ Waking for the
        awaited answer only ]).

        Raises ``WorkerDied`` as soon as a worker has exited (after the
        answers it sent before have been returned), even while other workers'
        answers are ready: a dead worker is reported at once, not when the
        others run out of work.
        """
        # Answers already read (one read can bring several) come first.
        if self._leftover:
            for worker_id in sorted(self._leftover):
                if awaited is None or worker_id == awaited:
                    got = self._take(worker_id)
                    if got is not None:
                        return got
        poller = self._poller if awaited is None else self._worker_pollers[awaited]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait_ms = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            events = poller.poll(wait_ms)
            if not events:
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                continue
            for fd, _ in events:
                if fd in self._process_of_fd:
                    # Before any answer: a live worker with answers ready must
                    # not keep a death unreported (out of order it always has one).
                    return self._after_death(self._process_of_fd[fd])
            for fd, _ in events:
                worker_id = self._worker_of_fd[fd]
                try:
                    self._readers[worker_id].fill()
                except EOFError:
                    self._forget_pipe(worker_id)  # the worker is gone: its sentinel says why
                    continue
                got = self._take(worker_id)
                if got is not None:
                    return got

    def _forget_pipe(self, worker_id: int) -> None:
        """Stop watching the answer pipe of a worker that has closed it."""
        fd = self._readers[worker_id].fd
        self._poller.unregister(fd)
        self._worker_pollers[worker_id].unregister(fd)
        del self._worker_of_fd[fd]

    def _after_death(self, dead: Any) -> tuple[int, Any]:
        """An answer the dead worker sent before it died, while one is unread;
        then ``WorkerDied``."""
        got = self._answer_left_by(self.processes.index(dead))
        if got is not None:
            return got
        raise reaping.died(dead)

    def _answer_left_by(self, worker_id: int) -> tuple[int, Any] | None:
        """The next answer a dead worker sent before it died, if one is unread."""
        got = self._take(worker_id)
        fd = self._readers[worker_id].fd
        # Never blocks: only what is in the pipe already is read (a process
        # forked while this pipe was open might still hold its writing end).
        while got is None and fd in self._worker_of_fd and readable(fd):
            try:
                self._readers[worker_id].fill()
            except EOFError:
                self._forget_pipe(worker_id)
                break
            got = self._take(worker_id)
        return got

    def _take(self, worker_id: int) -> tuple[int, Any] | None:
        """The next whole answer read from ``worker_id``, if there is one."""
        reader = self._readers[worker_id]
        message = reader.pending()
        if reader.has_leftover:
            self._leftover.add(worker_id)
        else:
            self._leftover.discard(worker_id)
        return None if message is None else (worker_id, pickle.loads(message))

    def shutdown(self, wait: bool = True) -> None:
        """Ask every worker to exit; reap them within a bounded time, terminating the rest.

        ``wait=False`` (idle workers, at the end of an epoch) leaves them to
        exit on their own, so the caller's ``StopIteration`` does not wait for
        processes to tear down; ``reaping.reap_exiting`` collects them later,
        and stops any that outstay ``reaping.JOIN_GRACE``.  Only idle workers may be left
        so: a busy one could still be writing a slot the ring is about to
        let go of.  A Ctrl-C ends the wait for busy workers (they are then
        terminated) and is raised once all is torn down.
        """
        if self._closed:
            return
        # The pipes and the processes of reaped workers have Python finalizers:
        # they are dropped here, with Ctrl-C held (see NOTE [ Ctrl-C held over
        # fork and teardown ]), not wherever the pool happens to be freed.
        with signals_held() as interrupted:
            self._closed = True
            processes = self.processes
            left_exiting = False
            try:
                self._process_of_fd.clear()
                for conn, process in zip(self._task_conns, processes):
                    if reaping.running(process):
                        try:
                            _send_frame(conn.fileno(), STOP_BYTES)
                        except OSError:
                            pass  # it is exiting already
                if wait:
                    reaping.reap(processes, self.exit_grace, interrupted)
                elif processes:
                    reaping.leave_to_exit(processes)
                    left_exiting = True
                reaping.reap_exiting()
            finally:
                # Also when a handler of the caller's signals raised in the
                # middle: no worker may outlive its pool unwatched.
                if not left_exiting:
                    reaping.stop(processes)
                self.processes = []
                connections = self._task_conns + self._result_conns
                connections += [conn for pair in self._child_ends for conn in pair]
                self._task_conns, self._result_conns, self._child_ends = [], [], []
                for conn in connections:
                    pipe_ends.close(conn)
                del connections, processes
                for segment in self._messages:
                    segment.unlink()  # a worker that died before reading it
                self._messages = []
