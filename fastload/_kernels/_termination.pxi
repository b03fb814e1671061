# A deadline on a worker's death once it is told to terminate.
#
# A worker takes SIGTERM and SIGHUP over with a Python handler, to unlink its
# ring when the main process is terminated with it (_loading/parent_watch.py,
# ``unlink_ring_when_terminated``).  A Python handler runs only when the
# worker's main thread next runs Python code: a worker stuck in C (a
# deadlocked library, a blocking call that retries on EINTR) would outlive a
# signal whose default action had killed it at once.  So the C-level handler
# CPython installed is wrapped: the wrapper first arms a timer that sends the
# worker SIGKILL after a delay, then calls CPython's handler.  Only
# async-signal-safe calls run in the wrapper (timer_settime); the timer is
# created beforehand, once per process (timers are not inherited by fork).

from libc.errno cimport errno

import os

cdef extern from *:
    """
    #include <errno.h>
    #include <signal.h>
    #include <string.h>
    #include <time.h>
    #include <unistd.h>

    static timer_t fl_kill_timer;
    static pid_t fl_kill_timer_owner = 0;  /* the process that created it */
    static long long fl_kill_after_ns = 0;
    static struct sigaction fl_wrapped[NSIG];

    static void fl_on_termination(int sig, siginfo_t *info, void *context) {
        struct itimerspec when;
        memset(&when, 0, sizeof when);
        when.it_value.tv_sec = (time_t)(fl_kill_after_ns / 1000000000LL);
        when.it_value.tv_nsec = (long)(fl_kill_after_ns % 1000000000LL);
        timer_settime(fl_kill_timer, 0, &when, NULL);
        struct sigaction *next = &fl_wrapped[sig];
        if (next->sa_flags & SA_SIGINFO)
            next->sa_sigaction(sig, info, context);
        else if (next->sa_handler != SIG_DFL && next->sa_handler != SIG_IGN)
            next->sa_handler(sig);
    }

    /* 0, or -1 with errno set. */
    static int fl_kill_after_handling(int sig, long long after_ns) {
        if (sig <= 0 || sig >= NSIG) { errno = EINVAL; return -1; }
        if (fl_kill_timer_owner != getpid()) {
            struct sigevent event;
            memset(&event, 0, sizeof event);
            event.sigev_notify = SIGEV_SIGNAL;
            event.sigev_signo = SIGKILL;
            if (timer_create(CLOCK_MONOTONIC, &event, &fl_kill_timer) != 0) return -1;
            fl_kill_timer_owner = getpid();
        }
        fl_kill_after_ns = after_ns;
        struct sigaction current, ours;
        if (sigaction(sig, NULL, &current) != 0) return -1;
        if (current.sa_sigaction == fl_on_termination) return 0;  /* wrapped already */
        fl_wrapped[sig] = current;
        memset(&ours, 0, sizeof ours);
        ours.sa_sigaction = fl_on_termination;
        ours.sa_flags = SA_SIGINFO | (current.sa_flags & (SA_ONSTACK | SA_RESTART));
        ours.sa_mask = current.sa_mask;
        return sigaction(sig, &ours, NULL);
    }
    """
    int fl_kill_after_handling(int sig, long long after_ns) nogil


def kill_after_handling(int signum, double seconds):
    """Make ``signum`` also arm a SIGKILL ``seconds`` later, around the handler
    installed now (call it after ``signal.signal``; another ``signal.signal``
    for ``signum`` removes the wrapper)."""
    if not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    if fl_kill_after_handling(signum, <long long>(seconds * 1e9)) != 0:
        raise OSError(errno, os.strerror(errno))
