"""The worker process: read tasks, make batches into ring slots, answer.

What travels on the two pipes is listed in ``wire/messages.py``.  A worker
also exits by itself when the main process dies (it watches for that, see
``ParentWatch``), and then unlinks every segment of its ring, so a killed
main process leaves neither an orphan nor a segment behind; so does a worker
terminated with the main process (see ``_unlink_ring_when_terminated``).
"""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.machinery
import os
import pickle
import platform
import random
import select
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from fastload import _core
from fastload._lifetime import pipe_ends
from fastload.dataset_state import is_stateful, restore_copy, snapshot
from fastload._loading.fetch import BatchSource
from fastload._loading.wire.frames import FrameReader, send_frame
from fastload._lifetime.interrupts import restore_callers_handlers
from fastload._loading.wire.layouts import LayoutSender
from fastload._loading.wire.messages import BATCH_FAILED, BATCH_MADE, DATASET_STATE, EPOCH, \
    INDIRECT, KIND, RESEND_LAYOUTS, RETIRE, STOP, STOP_BYTES, STREAM_ENDED, start_failed_reply, \
    with_snapshot
from fastload.ring import Segment, SlotInfo, SlotWriter, unlink_prefixed
from fastload._loading.wire.payload import PickledPayload

__all__ = ["WorkerInfo", "get_worker_info", "ExceptionWrapper", "worker_loop", "ParentWatch",
           "LIVENESS_INTERVAL"]

# How often an idle worker checks that the main process is alive, where the
# kernel cannot tell it (no pidfd).  Seconds.
LIVENESS_INTERVAL = 0.5
# How long a worker that lost its pipes waits for the main process to be
# reported gone before deciding it is alive (and will clean up itself).
_ORPHAN_GRACE = 2.0


@dataclass(frozen=True)
class WorkerInfo:
    """What ``get_worker_info()`` returns inside a worker (as torch's).

    ``rng`` and ``worker_method`` are torch 2.13's later fields, with the
    values torch gives a process worker.
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any
    rng: Any = None
    worker_method: str | None = "multiprocessing"


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """This worker's ``WorkerInfo``; ``None`` in the main process."""
    return _worker_info


class ExceptionWrapper:
    """An exception caught in a worker, carried to the main process and re-raised there
    with the same type where possible, the worker id and the worker's traceback."""

    def __init__(self, where: str, exc_info: tuple | None = None) -> None:
        exc_type, exc_value, exc_tb = exc_info or sys.exc_info()
        self.exc_type = exc_type
        self.where = where
        self.text = "".join(traceback.format_exception(exc_type, exc_value, exc_tb))

    def __reduce__(self):
        # The type must unpickle in the main process; fall back to RuntimeError.
        try:
            pickle.dumps(self.exc_type)
            exc_type = self.exc_type
        except Exception:
            exc_type = RuntimeError
        return (_rebuild_wrapper, (exc_type, self.where, self.text))

    def reraise(self) -> None:
        message = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {self.text}"
        if self.exc_type is KeyError:
            # KeyError repr()s its argument, which would mangle the traceback.
            message = _KeyErrorMessage(message)
        try:
            if getattr(self.exc_type, "message", None):
                # Types that declare a ``message`` (often keyword-only), as torch handles them.
                exception = self.exc_type(message=message)
            else:
                exception = self.exc_type(message)
        except Exception:
            # Some exception types need other arguments.
            raise RuntimeError(message) from None
        try:
            raise exception
        finally:
            # The traceback holds this frame: without this, exception -> traceback
            # -> frame -> exception would keep the iterator (and its workers)
            # alive until the garbage collector runs.
            del exception


class _KeyErrorMessage(str):
    def __repr__(self) -> str:
        return self


def _rebuild_wrapper(exc_type: type, where: str, text: str) -> ExceptionWrapper:
    wrapper = ExceptionWrapper.__new__(ExceptionWrapper)
    wrapper.exc_type, wrapper.where, wrapper.text = exc_type, where, text
    return wrapper


# NOTE [ Why workers tune malloc ]
# glibc serves a large allocation (128 KiB at first) with its own mmap and
# unmaps it on free(), but raises that threshold to the size of the largest
# such block freed, so a process that keeps making multi-MiB temporaries
# soon serves them from its heap without touching the kernel.  A worker never
# learns this: its biggest buffers, the batches, are ring slots, not malloc.
# So every decoded image was mapped, faulted in page by page and unmapped
# again, which a single process running the same pipeline does not pay (its
# batch buffers raise the threshold).
# Workers set the thresholds glibc would have reached by itself.
_MMAP_THRESHOLD = 32 << 20   # glibc's own ceiling for its moving threshold (64-bit)
_TRIM_THRESHOLD = 64 << 20   # twice that, as glibc sets it when it moves the threshold
_M_TRIM_THRESHOLD = -1       # mallopt parameters, from glibc's malloc.h
_M_MMAP_THRESHOLD = -3


def _find_mallopt() -> Any:
    """glibc's ``mallopt``, or None (another libc).  Looked up at import, in the
    main process: a forked worker then calls it without loading anything."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # pragma: no cover - a libc without mallopt
        return None


_mallopt = _find_mallopt()


def _tune_malloc() -> None:
    """Keep large temporaries on the heap in this worker (glibc only; else nothing)."""
    if _mallopt is not None:
        _mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
        _mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)


def _be_a_torch_worker(info: WorkerInfo) -> None:
    """Set up torch as torch's own workers do: now if the worker has it loaded,
    else the moment the caller's code imports it.

    Code written for torch's DataLoader runs here unchanged: an
    IterableDataset that shards itself by ``torch.utils.data.get_worker_info()``
    (else every worker would yield the whole stream, silently), torch's RNG
    seeded per worker, and one intra-op thread per worker, so that torch ops
    in ``__getitem__`` do not oversubscribe the CPUs.  Torch is never imported
    here: only a dataset (or its module) that uses it loads it, perhaps only
    in its ``__iter__`` (``_TorchImportWatch``).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        sys.meta_path.insert(0, _TorchImportWatch(info))
        return
    torch.set_num_threads(1)
    torch.manual_seed(info.seed)
    try:
        from torch.utils.data._utils import worker as torch_worker

        torch_worker._worker_info = torch_worker.WorkerInfo(
            id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset)
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - another torch layout
        pass  # fastload.get_worker_info() still answers


class _TorchImportWatch(importlib.abc.MetaPathFinder):
    """Sets torch up for this worker (``_be_a_torch_worker``) right after the
    caller's code first imports it: finds ``torch`` as the other finders would,
    and runs the set-up once its module has executed."""

    def __init__(self, info: WorkerInfo) -> None:
        self.info = info

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once, and out of the search below
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, info = spec.loader.exec_module, self.info

        def exec_then_set_up(module: Any) -> None:
            exec_module(module)
            _be_a_torch_worker(info)

        spec.loader.exec_module = exec_then_set_up
        return spec


class ParentWatch:
    """Tells a worker whether the main process (pid ``parent_pid``) has exited.

    On Linux a pidfd, which becomes readable when that process exits, lets the
    worker wait for tasks and for its parent's death in one ``poll``.  Without
    one, ``gone()`` is asked every ``LIVENESS_INTERVAL``.  The parent is not
    always the process that forked the worker: forkserver workers are children
    of the fork server, so ``getppid()`` alone cannot tell.
    """

    def __init__(self, parent_pid: int) -> None:
        self.parent_pid = parent_pid
        self._forked_by_parent = os.getppid() == parent_pid
        self.fd: int | None = None
        self._exited = False
        try:
            self.fd = os.pidfd_open(parent_pid)
        except ProcessLookupError:
            self._exited = True
        except (AttributeError, OSError):  # no pidfd on this platform or kernel
            pass

    def gone(self) -> bool:
        if self._exited:
            return True
        if self.fd is not None:
            self._exited = bool(select.select([self.fd], [], [], 0)[0])
        elif self._forked_by_parent:
            # Re-parented (to init or a subreaper) the moment the parent exits.
            self._exited = os.getppid() != self.parent_pid
        else:
            try:
                os.kill(self.parent_pid, 0)
            except ProcessLookupError:
                self._exited = True
            except PermissionError:
                pass
        return self._exited

    def wait_gone(self, timeout: float) -> bool:
        """``gone()``, waiting up to ``timeout`` seconds for it to become true."""
        deadline = time.monotonic() + timeout
        while not self.gone():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self.fd is not None:
                select.select([self.fd], [], [], remaining)
            else:
                time.sleep(min(remaining, 0.05))
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _decode_task(data: bytes) -> Any:
    message = pickle.loads(data)
    if message is not STOP and message[KIND] == INDIRECT:
        # A task too large for the pipe: it waits in shared memory (see pool.py).
        _, name, size = message
        segment = Segment(name)
        data = segment.array[:size].tobytes()
        segment.unlink()
        message = pickle.loads(data)
    return message


def worker_loop(worker_id: int, num_workers: int, payload: Any, task_conn: Any,
                result_conn: Any, base_seed: int, parent_pid: int, ring_prefix: str,
                inherited_slots: dict[int, Segment] | None = None) -> None:
    """Entry point of a worker process (``payload`` is pickled bytes under spawn,
    see ``worker_payload``).

    ``ring_prefix`` names every segment of this iterator's ring: if the main
    process dies, the worker unlinks them on its way out.  ``inherited_slots``
    (fork only): slots whose mappings came with the fork (see ``SlotWriter``).
    """
    restore_callers_handlers()  # before the SIGTERM/SIGHUP take-over looks at them
    pipe_ends.let_go_of_inherited((task_conn.fileno(), result_conn.fileno()))
    parent = ParentWatch(parent_pid)
    _unlink_ring_when_terminated(parent, ring_prefix)
    orphaned = True
    try:
        orphaned = _serve(worker_id, num_workers, payload, task_conn, result_conn, base_seed,
                          parent, inherited_slots)
    except BaseException:
        # The caller's code ended this worker (``sys.exit()`` in a dataset, say):
        # it dies as torch's would, and the main process reports the exit.
        orphaned = parent.gone()
        raise
    finally:
        # A killed main process closes its pipe ends before the kernel reports
        # it gone, so a worker that lost its pipes waits (briefly) to be sure.
        if orphaned and parent.wait_gone(_ORPHAN_GRACE):
            # Nobody else will: the main process unlinks the ring when it ends
            # normally, but it was killed.  Every worker does this as it exits,
            # so a segment one of them created late is not missed.
            unlink_prefixed(ring_prefix)
        parent.close()


# Signals that end a whole process group: ``kill -TERM -<pgid>``, GNU
# ``timeout``, a batch scheduler, a closed terminal.
_TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


# How long a terminated worker looks for signs that the main process was
# terminated with it (the kernel signals a group's processes one by one).
_GROUP_SIGNAL_WINDOW = 0.05
# When a terminated worker that has not died yet is killed: after the longest
# its handler takes (the window, the wait for the main process, the unlinks).
_TERMINATION_DEADLINE = _GROUP_SIGNAL_WINDOW + _ORPHAN_GRACE + 3.0


def _unlink_ring_when_terminated(parent: ParentWatch, ring_prefix: str) -> None:
    """Make a terminating signal unlink the ring first if the main process dies too.

    Sent to the process group, such a signal kills the main process and the
    workers at once: nobody would be left to unlink the ring's segments.  A
    worker so signalled checks whether the main process is dying too (gone,
    or a fatal signal pending); if so it waits (boundedly) for it to go and
    unlinks the ring.  Then it dies of the same signal, so a main process
    that survives (the worker was signalled alone, or the main process
    handles the signal) reports the worker's death as torch's would.  A
    worker stuck in C code, where no Python handler runs, is killed after
    ``_TERMINATION_DEADLINE`` instead (``_core.kill_after_handling``).
    SIGTERM is always taken over, as torch's workers do: a handler the main
    process set and a forked worker inherited (a graceful shutdown that
    saves a checkpoint) must not run in every worker too.  SIGHUP only at
    its default action: ``nohup``'s ignoring it, or a handler, stays the
    caller's choice, as with torch.  (The main process stops its own workers
    with SIGKILL, never with these; ``worker_init_fn`` may install its own.)
    """
    def unlink_then_die(signum: int, frame: Any) -> None:
        signal.signal(signum, signal.SIG_DFL)
        deadline = time.monotonic() + _GROUP_SIGNAL_WINDOW
        while not (parent.gone() or _fatal_signal_pending(parent.parent_pid, signum)):
            if time.monotonic() >= deadline:
                break
            time.sleep(0.005)
        else:
            if parent.wait_gone(_ORPHAN_GRACE):
                unlink_prefixed(ring_prefix)
        os.kill(os.getpid(), signum)

    for signum in _TERMINATING_SIGNALS:
        if signum == signal.SIGTERM or signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, unlink_then_die)
            # A worker stuck in C code never runs this handler: it is killed
            # once the handler had time to finish (see _termination.pxi).
            _core.kill_after_handling(signum, _TERMINATION_DEADLINE)


def _fatal_signal_pending(pid: int, signum: int) -> bool:
    """Whether process ``pid`` is about to die of ``signum`` (or is dying: the
    kernel turns a fatal signal into a pending SIGKILL for each thread), as
    /proc shows its pending signals; a process already gone counts too."""
    try:
        with open(f"/proc/{pid}/status") as status:
            lines = status.read().splitlines()
    except OSError:
        return True
    masks = 0
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("SigPnd", "ShdPnd"):
            masks |= int(value, 16)
        elif key == "State" and value.split()[:1] in (["Z"], ["X"]):
            return True
    return bool(masks & ((1 << (signum - 1)) | (1 << (signal.SIGKILL - 1))))


def _serve(worker_id: int, num_workers: int, payload: Any, task_conn: Any,
           result_conn: Any, base_seed: int, parent: ParentWatch,
           inherited_slots: dict[int, Segment] | None) -> bool:
    """Answer tasks until told to stop; True if the main process went away instead."""
    global _worker_info
    # Ctrl-C reaches the whole process group; the main process decides what
    # happens (it shuts the workers down), so workers ignore it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    where = f"in DataLoader worker process {worker_id}"
    # One poll object for the life of the worker: Connection.poll() would
    # build a selector on every call, on the per-batch path.
    tasks_ready = select.poll()
    task_fd = task_conn.fileno()
    tasks_ready.register(task_fd, select.POLLIN)
    if parent.fd is not None:
        tasks_ready.register(parent.fd, select.POLLIN)
    liveness_ms = None if parent.fd is not None else int(LIVENESS_INTERVAL * 1000)

    def wait_for_task() -> bool:
        """Until a task can be read: True, or False if the main process is gone."""
        while not any(fd == task_fd for fd, _ in tasks_ready.poll(liveness_ms)):
            if parent.gone():
                return False
        return True

    # An answer larger than what the pipe holds waits for the main process to
    # read it; if that process is killed, nobody will, and other processes
    # that inherited the pipe's read end (workers of other loaders) keep the
    # write from failing.  So the answer pipe is written without blocking,
    # and a full pipe is waited on together with the main process's liveness.
    # A stop sent meanwhile (the caller left the epoch) is seen too: the main
    # process would otherwise wait out the grace period for this worker.
    result_fd = result_conn.fileno()
    os.set_blocking(result_fd, False)
    answer_room = select.poll()
    answer_room.register(result_fd, select.POLLOUT)
    answer_room.register(task_fd, select.POLLIN)
    if parent.fd is not None:
        answer_room.register(parent.fd, select.POLLIN)
    tasks = FrameReader(task_fd)
    stop_while_sending = False

    def wait_writable() -> bool:
        """Until the answer pipe has room: True; False if the main process is gone or
        has told this worker to stop (``stop_while_sending``)."""
        nonlocal stop_while_sending
        while True:
            events = answer_room.poll(liveness_ms)
            if any(fd == result_fd for fd, _ in events):
                return True
            if any(fd == task_fd for fd, _ in events):
                try:
                    tasks.fill()
                except (EOFError, OSError):
                    return False  # the main process closed our pipes
                if tasks.holds(STOP_BYTES):
                    stop_while_sending = True
                    return False
            elif parent.gone():
                return False

    # Nothing of the caller's (dataset, worker_init_fn) runs before the first
    # message: a main process that stops during start-up never sends one.
    if not wait_for_task():
        return True
    try:
        if isinstance(payload, PickledPayload):
            payload = _unpickle_payload(payload, worker_id)
        dataset, batch_settings, worker_init_fn = payload
        seed = base_seed + worker_id
        _tune_malloc()
        _seed_everything(seed)
        _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                  dataset=dataset)
        _be_a_torch_worker(_worker_info)
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
        source = BatchSource(dataset, batch_settings)
        stateful = is_stateful(dataset)  # then each answer carries its snapshot
    except Exception:
        # The main process re-raises it and stops the pool.
        return not _send(result_conn, start_failed_reply(ExceptionWrapper(where)),
                         wait_writable=wait_writable)
    writer = SlotWriter(inherited_slots)
    layouts = LayoutSender()
    read_at = 0.0  # when the task pipe was last read

    def told_to_stop() -> bool:
        """Whether a stop message waits behind the task about to be made.

        A task read a while ago (ahead of a slow batch) may have a stop sent
        since behind it, so the pipe is read again first (without waiting),
        and the main process may have died meanwhile (``_MainProcessGone``).
        After quick batches it is not: a stop then costs at most
        ``prefetch_factor`` of them, and the steady state makes no system call.
        """
        nonlocal read_at
        if time.monotonic() - read_at > _STOP_CHECK_AGE:
            events = tasks_ready.poll(0)
            if any(fd == parent.fd for fd, _ in events) and parent.gone():
                raise _MainProcessGone
            if any(fd == task_fd for fd, _ in events):
                try:
                    tasks.fill()
                except (EOFError, OSError):
                    return True  # the main process closed our pipe: nobody will read the batch
                read_at = time.monotonic()
        return tasks.has_leftover and tasks.holds(STOP_BYTES)

    while True:
        try:
            data = tasks.pending()  # tasks sent together arrive in one read
            if data is None:
                if not wait_for_task():
                    break  # the main process is gone: nobody will read our batches
                tasks.fill()
                read_at = time.monotonic()
                data = tasks.pending()
                if data is None:
                    continue  # part of a long task: the rest is on its way
            message = _decode_task(data)
            stop = message is STOP or told_to_stop()
        except (EOFError, OSError, _MainProcessGone):
            break  # the main process closed our task pipe without a word, or died
        if stop:
            result_conn.close()
            return False
        kind = message[KIND]
        if kind == EPOCH:
            source.start_epoch(message[1])
            continue
        if kind == RETIRE:
            writer.forget(message[1], message[2])
            continue
        if kind == RESEND_LAYOUTS[KIND]:
            layouts = LayoutSender()
            continue
        if kind == DATASET_STATE:
            try:
                restore_copy(dataset, source, message[1])
            except Exception:
                # As a worker that could not start: the main process re-raises it.
                error = ExceptionWrapper(f"{where} (loading the dataset's state_dict)")
                if not _send(result_conn, start_failed_reply(error),
                             wait_writable=wait_writable):
                    break
            continue
        _, batch_no, slot, kernel_batch, indices = message
        slot_info = SlotInfo(*slot)
        if kernel_batch:  # our BatchSampler kernel's int64 index array, sent as its bytes
            indices = np.frombuffer(indices, dtype=np.int64)
        allocation = writer.allocator(slot_info)
        try:
            kind, payload = BATCH_MADE, source.make_into(batch_no, indices, kernel_batch, allocation)
        except StopIteration:
            # The end of this worker's IterableDataset replica.  From a map-style
            # dataset it is an error that the main process re-raises, as torch does
            # (ending the caller's loop there).
            kind, payload = (STREAM_ENDED, None) if source.iterable \
                else (BATCH_FAILED, ExceptionWrapper(where))
        except Exception:
            kind, payload = BATCH_FAILED, ExceptionWrapper(where)
        if kind == BATCH_MADE:
            try:
                payload = layouts.encode(payload)
            except Exception:
                # e.g. a non-array leaf of the batch that cannot be pickled
                kind, payload = BATCH_FAILED, ExceptionWrapper(
                    f"{where} (sending the batch to the main process)")
        # The created segment is reported even for a failed batch, so the main
        # process adopts (and later unlinks) it.
        reply = (kind, batch_no, slot_info.slot_id, allocation.created_name, payload)
        if stateful:
            try:
                reply = with_snapshot(reply, snapshot(dataset, source.stream_ended))
            except Exception:
                reply = (BATCH_FAILED,) + reply[1:4] + (ExceptionWrapper(
                    f"{where} (taking the dataset's state_dict() after batch {batch_no})"),)
        if not _send(result_conn, reply, where, wait_writable):
            if stop_while_sending:
                result_conn.close()
                return False
            break
    result_conn.close()
    return True


def _unpickle_payload(payload: PickledPayload, worker_id: int) -> Any:
    """The dataset, batch settings and worker_init_fn, unpickled from their bytes.

    A failure here (a class the worker cannot import) is a ``RuntimeError``,
    the type torch raises: its worker dies unpickling them, and the main
    process reports the death.
    """
    try:
        return pickle.loads(payload.take())  # the bytes go once unpickled
    except Exception as error:
        raise RuntimeError(
            f"DataLoader worker process {worker_id} could not unpickle the dataset, collate_fn "
            f"and worker_init_fn the main process sent it ({type(error).__name__}: {error}); "
            f"under spawn or forkserver each must be importable by the worker: defined at "
            f"module level of a module it can import, not inside a function or an "
            f"`if __name__ == '__main__':` block") from error


class _MainProcessGone(Exception):
    """The main process died: nobody will read this worker's batches."""


# Tasks read longer ago than this (seconds) are checked for a stop sent since.
_STOP_CHECK_AGE = 0.002


def _send(conn: Any, reply: tuple, where: str = "",
          wait_writable: Callable[[], bool] | None = None) -> bool:
    """Send a reply; one that cannot be pickled (an odd exception) becomes an error reply.
    False when the main process is gone.

    A batch's own values were pickled already, by ``LayoutSender.encode``."""
    try:
        send_frame(conn.fileno(), pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL),
                   wait_writable)
        return True
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return False  # the main process is gone
    except Exception:
        # e.g. an exception (in an error reply) that cannot be pickled
        error = ExceptionWrapper(f"{where} (sending the batch to the main process)")
        try:
            send_frame(conn.fileno(), pickle.dumps((BATCH_FAILED,) + reply[1:4] + (error,),
                                                   protocol=pickle.HIGHEST_PROTOCOL), wait_writable)
            return True
        except Exception:
            return False
