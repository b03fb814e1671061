"""Signals held over code where a handler's exception would be lost or do harm.

The worker pool forks and tears down inside these blocks; see NOTE [ Ctrl-C
held over fork and teardown ] at ``signals_held`` and NOTE [ Every handler
held over teardown ] at ``signals_deferred``.
"""

from __future__ import annotations

import _signal
import _thread
import contextlib
import signal
import sys
import threading
import time
from typing import Any, Iterator

from fastload._lifetime.forks import forked_as_worker
from fastload._lifetime.hooks import at_fork

__all__ = ["signals_held", "signals_deferred", "restore_callers_handlers"]

_CATCHABLE = tuple(int(s) for s in signal.valid_signals()
                   if s not in (signal.SIGKILL, signal.SIGSTOP))
# Those a thread may block for a moment: not the ones a fault raises in it.
_BLOCKABLE = tuple(s for s in _CATCHABLE if s not in (signal.SIGSEGV, signal.SIGBUS,
                                                     signal.SIGFPE, signal.SIGILL))


@contextlib.contextmanager
def signals_held() -> Iterator[list]:
    """Hold every signal with a Python handler that arrives inside the block
    (Ctrl-C first of all); handle each once the block ends (as a pending
    signal: once however often it came), SIGINT last.

    Yields the Ctrl-Cs recorded only: a wait in the block ends at one, not at
    the SIGCHLD of a worker exiting.

    NOTE [ Ctrl-C held over fork and teardown ]
    CPython drops an exception raised inside an at-fork hook, a ``__del__``
    or a weakref callback: it prints "Exception ignored in ..." and goes on.
    Python's SIGINT handler raises KeyboardInterrupt wherever the main thread
    next checks for signals, which may be inside one of those, and then the
    Ctrl-C is lost and the loop goes on.  A loop of short epochs with new
    workers, interrupted at a random instant (``bench/ctrl_c_trials.py``),
    lost 5 Ctrl-Cs in 300 so: in the workers' pipes' ``Connection.__del__``,
    the finalizer multiprocessing attaches to each worker process, and the
    ring's lease ``__del__``; and in 28 more, a new worker printed such a
    dropped KeyboardInterrupt.  torch's DataLoader lost 5 in 100, mostly in
    logging's at-fork hook.
    * ``os.fork`` runs the at-fork hooks that modules register (logging's,
      for one), in the parent and in the child.
    * A worker's pipes and its ``Process`` run Python finalizers when they
      are dropped.
    So the pool forks, and drops what it owned at shutdown, inside this
    block: the main thread's SIGINT handler only records the signal, and the
    handler that was in place gets it once the block is left.  A forked
    worker keeps the recording handler until it ignores SIGINT, so a
    Ctrl-C cannot raise in its start-up either.  (Leases need no such block:
    see NOTE [ Leases ] in _ring/slots.py.)  Since then none is lost or printed in
    600 (300 with new workers, 300 with persistent ones).  Only the
    main thread runs Python signal handlers, so elsewhere this does nothing;
    nor for SIG_DFL and SIG_IGN, which involve no Python handler.
    The teardown of an iterator may itself run as a finalizer (a ``break``,
    and the iterator is dropped), so there a held Ctrl-C is not raised at the
    block's end but sent again once the teardown is over (``signals_deferred``),
    and the teardown's wait for busy workers ends at a Ctrl-C: they are
    terminated, not left running (one could create a slot's segment after the
    ring unlinked its names).  Before, a Ctrl-C during that wait was printed
    and dropped, and left segments behind; in 250 Ctrl-Cs at random instants
    into a loop of short epochs (a helper's storm script, not in the
    repository), none is lost now, no segment and no process is left.
    Every signal with a Python handler, not only SIGINT: a handler of the
    caller's that raises (a SIGALRM timeout, a SIGCHLD handler) could cut a
    fork or a teardown short just as well, and one not held here could even
    land as the block ends, before its handlers are put back, leaving a
    recording handler in place of the caller's for good.  A forked worker
    puts the caller's handlers back first thing (``restore_callers_handlers``).
    """
    with _recorded(_CATCHABLE) as (ctrl_c, others):
        yield ctrl_c
    # Every one is handled even if a handler raises (as CPython runs each
    # pending signal's): the first exception, or Ctrl-C's, comes after.
    raised = None
    for signum, frame in others.values():
        try:
            signal.getsignal(signum)(signum, frame)
        except BaseException as error:
            raised = raised or error
    if ctrl_c:
        signal.getsignal(signal.SIGINT)(*ctrl_c[0])
    if raised is not None:
        raise raised


@contextlib.contextmanager
def signals_deferred() -> Iterator[list]:
    """Hold every signal with a Python handler that arrives inside the block;
    send each again after the block.

    Yields the Ctrl-Cs recorded, as ``signals_held`` does.

    NOTE [ Every handler held over teardown ]
    For teardown that may run as a finalizer (a dropped iterator's), where
    CPython prints and drops any exception: a KeyboardInterrupt raised at
    the block's end, or re-raised there with ``_thread.interrupt_main`` (the
    very next call checks for it), would be lost.  Instead a new thread sends
    the main thread the signals again: they are handled once the main thread
    lets go of the GIL, by then back in the caller's code, and a real signal
    also cuts short a ``sleep`` or a blocking read there.
    Not only Ctrl-C: a handler of the caller's that raises (a SIGALRM
    timeout, a SIGCHLD handler: workers exit during teardown) cut teardown
    short wherever it landed, and a second one could stop it between killing
    a busy worker and unlinking the ring: a surviving worker then made a
    slot's segment after the names were unlinked, left in /dev/shm after the
    process (fuzzing with a fast timer whose handler raises found it).
    Swapping a handler is one system call, made only for the signals that
    have a Python handler (usually SIGINT alone).
    The thread waits until the main thread is out of every finalizer (and
    ``__del__``) first: sent while the teardown's finalizer still ran, or the
    finalizers of what it dropped, a signal was handled there and lost (a
    helper: 2 Ctrl-Cs in 30, on a busy machine).  And the frames the signals
    landed in are not kept: what they held (a worker's ``Process``) would
    be freed only after the block, where signals are no longer held.
    """
    with _recorded(_CATCHABLE, keep_frames=False) as (ctrl_c, others):
        yield ctrl_c
    again = [*others, *([signal.SIGINT] if ctrl_c else [])]
    if again:
        try:
            _thread.start_new_thread(_send_to_main_thread, (again,))
        except RuntimeError:  # the interpreter is exiting (3.12+ starts no thread then)
            pass


# How long signals wait for the main thread to leave finalizers (teardowns'
# own waits are bounded well below this); then they are sent all the same.
_RESEND_WAIT = 30.0


def _send_to_main_thread(signums: list) -> None:
    main = threading.main_thread().ident
    deadline = time.monotonic() + _RESEND_WAIT
    while _in_code_that_drops_exceptions(main) and time.monotonic() < deadline:
        time.sleep(0.001)
    for signum in signums:
        signal.pthread_kill(main, signum)


def _in_code_that_drops_exceptions(thread_id: int) -> bool:
    """Whether that thread runs a finalizer, a ``__del__``, or a deferring block's end."""
    frame = sys._current_frames().get(thread_id)
    dropping = _codes_that_drop_exceptions()
    while frame is not None:
        code = frame.f_code
        if code in dropping or code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _codes_that_drop_exceptions() -> tuple:
    import multiprocessing.util
    import weakref

    return (weakref.finalize.__call__.__code__, multiprocessing.util.Finalize.__call__.__code__,
            signals_deferred.__wrapped__.__code__)


@contextlib.contextmanager
def _recorded(signums: tuple, keep_frames: bool = True) -> Iterator[tuple[list, dict]]:
    """The main thread's Python handlers of ``signums``, inside the block, only
    record the signals: Ctrl-Cs in the first list yielded, the others in the
    dict (signal number -> its first arguments, in order of arrival; the frame
    None unless ``keep_frames``); the handlers in place are back after it.
    Nothing changes in another thread, or for SIG_DFL and SIG_IGN, which
    involve no Python handler."""
    ctrl_c: list[tuple[int, Any]] = []
    others: dict[int, tuple[int, Any]] = {}
    if threading.current_thread() is not threading.main_thread():
        yield ctrl_c, others
        return

    def record(signum: int, frame: Any) -> None:
        if not keep_frames:
            frame = None
        if signum == signal.SIGINT:
            ctrl_c.append((signum, frame))
        else:
            others.setdefault(signum, (signum, frame))

    # _signal.getsignal: signal.getsignal makes an enum of each answer.
    previous = {signum: handler for signum in signums
                if callable(handler := _signal.getsignal(signum))}
    _holding.append(previous)
    try:
        for signum in previous:
            _signal.signal(signum, record)
        yield ctrl_c, others
    finally:
        # Listed until they are all back: a child forked from another thread
        # meanwhile must still put back the caller's handlers.
        try:
            _restore(previous)
        finally:
            _holding[:] = [held for held in _holding if held is not previous]


# The handlers each block in progress replaced, outermost first.
_holding: list[dict] = []


def restore_callers_handlers(but_ctrl_c: bool = True) -> None:
    """In a forked child, first thing: put back the handlers the blocks in
    progress in the parent had replaced with recording ones when it forked
    (the outermost block's are the caller's), as a forked child inherits the
    caller's handlers from torch's loader too.  A worker keeps Ctrl-C's
    recorded (``but_ctrl_c``): it ignores Ctrl-C next (the main process decides)."""
    callers: dict = {}
    for previous in _holding:
        for signum, handler in previous.items():
            callers.setdefault(signum, handler)
    _holding.clear()
    if but_ctrl_c:
        callers.pop(signal.SIGINT, None)
    for signum, handler in callers.items():
        _signal.signal(signum, handler)


def _put_back_callers_handlers_in_a_callers_fork() -> None:
    """In a child the caller forked (from another thread) while a block held
    the signals: that block never ends here, so its recording handlers would
    stay for good (Ctrl-C never raised, the caller's handlers never ran).
    Every handler, Ctrl-C's too, is the caller's again.  A loader's own worker
    puts them back itself (``restore_callers_handlers``), Ctrl-C's aside."""
    if not forked_as_worker():
        restore_callers_handlers(but_ctrl_c=False)


at_fork("signal handlers", after_in_child=_put_back_callers_handlers_in_a_callers_fork)


def _restore(handlers: dict) -> None:
    """Put ``handlers`` back, all of them.

    A handler already put back may raise as the next one is (a Ctrl-C): the
    rest would keep recording, and their signals be lost for good.  The
    signals are blocked meanwhile, and the restoring goes on after such an
    exception, which comes after.
    """
    if not handlers:
        return
    # _signal's functions: signal's wrap every answer in enums, costly for a mask.
    mask = _signal.pthread_sigmask(signal.SIG_BLOCK, _BLOCKABLE)
    left = list(handlers.items())
    raised = None
    try:
        while left:
            try:
                while left:
                    _signal.signal(*left[0])
                    del left[0]
            except BaseException as error:
                raised = raised or error
    finally:
        _signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if raised is not None:
        raise raised
