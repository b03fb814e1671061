"""Leak checks for the multiprocess tests: shared-memory segments and child processes.

``LeakCheck`` records, before a test, the ``fl_`` entries of /dev/shm and the
live descendants of this process; after the test it polls (up to a grace
period, processes may still be exiting) until no *new* ``fl_`` segment made by
this process (or by a pid the test registered with ``watch_pid``) exists and
no new descendant is alive, and fails naming what leaked.

Other people's runs may create ``fl_`` segments on this machine at the same
time, so only segments whose name carries one of our pids
(``fl_<pid>_...``, the ring's prefix) count.  The resource tracker and the
forkserver server are long-lived helpers of multiprocessing, started once
per session by design, so they are not counted as leaked children (the
workers a forkserver forks *are*).
"""

from __future__ import annotations

import gc
import os
import time

import psutil

SHM_DIR = "/dev/shm"


def shm_entries(prefix: str = "fl_") -> set[str]:
    try:
        return {name for name in os.listdir(SHM_DIR) if name.startswith(prefix)}
    except FileNotFoundError:  # pragma: no cover
        return set()


def memory_files_held(prefix: str = "fl_", exclude: int | None = None) -> list[str]:
    """The ring's memory files (``memfd:<prefix>...``) that any process but ``exclude``
    holds open or mapped, as ``"<pid> <file>"``: a memory file lives as long as one does."""
    held = set()
    needle = "/memfd:" + prefix
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == exclude:
            continue
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                try:
                    target = os.readlink(f"/proc/{entry}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith(needle):
                    held.add(f"{entry} {target}")
            with open(f"/proc/{entry}/maps") as maps:
                held.update(f"{entry} {line.split(None, 5)[-1].strip()}" for line in maps
                            if needle in line)
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return sorted(held)


def segment_pid(name: str) -> int | None:
    """The pid in a ring segment's name ``fl_<pid>_<hex>_s<slot>g<gen>``."""
    parts = name.split("_")
    if len(parts) >= 3 and parts[0] == "fl" and parts[1].isdigit():
        return int(parts[1])
    return None


def is_alive(pid: int) -> bool:
    """True for a running process; a zombie (exited, not yet reaped) counts as gone."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def _helper_pids() -> set[int]:
    """multiprocessing's session-long helpers: the resource tracker and the forkserver."""
    import importlib

    pids = set()
    for module_name, instance, field in (("resource_tracker", "_resource_tracker", "_pid"),
                                         ("forkserver", "_forkserver", "_forkserver_pid")):
        try:
            module = importlib.import_module(f"multiprocessing.{module_name}")
            pid = getattr(getattr(module, instance), field, None)
        except Exception:  # pragma: no cover
            continue
        if pid:
            pids.add(pid)
    return pids


def live_descendants() -> dict[int, str]:
    """pid -> command line of every live (non-zombie) descendant of this process."""
    result = {}
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() == psutil.STATUS_ZOMBIE:
                continue
            result[child.pid] = " ".join(child.cmdline()) or child.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return result


class LeakCheck:
    """Context manager: no new ``fl_`` segment and no new live child after the block."""

    def __init__(self, grace: float = 5.0) -> None:
        self.grace = grace
        self.pids = {os.getpid()}

    def watch_pid(self, pid: int) -> None:
        """Also count segments named after ``pid`` (e.g. a subprocess running a loader)."""
        self.pids.add(pid)

    def __enter__(self) -> "LeakCheck":
        self.segments_before = shm_entries()
        self.children_before = set(live_descendants())
        return self

    def leaks(self) -> tuple[set[str], dict[int, str]]:
        segments = {name for name in shm_entries() - self.segments_before
                    if segment_pid(name) in self.pids}
        helpers = _helper_pids()
        children = {pid: cmd for pid, cmd in live_descendants().items()
                    if pid not in self.children_before and pid not in helpers}
        return segments, children

    def check(self) -> None:
        # Tests that need "freed by refcounting alone" assert that themselves;
        # here a cycle (e.g. a traceback pytest keeps) must not look like a leak.
        gc.collect()
        deadline = time.monotonic() + self.grace
        while True:
            segments, children = self.leaks()
            if not segments and not children:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        raise AssertionError(
            f"leaked after {self.grace:.0f} s: shared-memory segments {sorted(segments)}, "
            f"live child processes {children}")

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.check()
        else:
            # The test already failed; still report (but do not mask) a leak.
            try:
                self.check()
            except AssertionError as leak:
                exc.add_note(str(leak))
