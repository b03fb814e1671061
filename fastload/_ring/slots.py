"""The shared-memory ring: slots that workers write batches into, in place.

NOTE [ Why one segment per slot ]
A slot is one POSIX shared-memory segment, created once and reused for batch
after batch; the ring preallocates nothing it cannot size (the batch layout is
known only once a worker has collated the first batch), so a slot starts
empty and the worker that first fills it creates its segment at the size the
batch needs.  A batch that no longer fits (variable shapes, promotion) makes
the worker create the slot's next *generation*, with headroom; the main
process then unlinks the old one.  Names are chosen by the main process
(``<prefix>s<slot>g<generation>``), so it can unlink a generation a worker
created even when that worker died before saying so.

NOTE [ Leases ]
The main process hands out numpy views of a slot.  Their base is a
``SlotLease`` (``_core.lease_array`` makes the slot's bytes an array whose
base is the lease, as ``np.asarray(lease)`` does through the lease's
``__array_interface__``), so the slot stays out of circulation for exactly as
long as the caller holds any view; when the last one dies, the slot comes
back.  The ring learns of that death from a weak reference whose callback is
a deque's ``append``, not from a ``__del__``: no Python code runs where the
caller drops a batch, so a Ctrl-C cannot land inside such code, where CPython
would drop the KeyboardInterrupt (see NOTE [ Ctrl-C held over fork and
teardown ] in interrupts.py).  A caller that holds every batch of an epoch makes
the ring grow: it holds at most ``in_flight`` slots that workers may write,
plus one per batch the caller still holds -- the same memory those batches
need anyway.  Free slots beyond ``in_flight`` + 2 are unlinked as they come
back, so memory follows what is held.

NOTE [ Slots that outlive an epoch ]
Without persistent workers every epoch starts new workers, and a ring of its
own would have them create, fill and unlink a fresh set of segments, a
visible share of a short epoch's CPU, and the first one delays the first
batch.  A forked worker inherits the main process's mappings, so under fork
an epoch's ring leaves its slots to the next one's (``Ring.hand_over``, into
the loader's ``SpareSlots``): the free ones at once, one the caller still
holds when its last view dies.  The next epoch's workers write through the
mappings they inherited (``SlotWriter``'s ``inherited``): no segment is made
or opened.  Names are unlinked with the rest of the ring, as always, so
nothing is left in /dev/shm between epochs and a main process killed then
frees the slots with its address space (which is why the slots themselves,
not their names, are carried over).  At most ``SPARE_BYTES`` are kept, so a
loader between two epochs holds little (torch's holds nothing).  Under spawn
or forkserver a worker has nothing to inherit: every epoch makes its own.

NOTE [ Batches a forked child holds ]
A process forked while the caller holds a batch maps that batch's slot too
(fork shares a ``MAP_SHARED`` mapping, it does not copy it): a
``multiprocessing.Process`` given the batch as an argument under fork, or an
``os.fork()`` that saves it in the background.  torch's batches each live in
a segment of their own that nothing writes again, so such a child reads its
batch intact whatever the parent does next.  A slot, though, comes back to
the ring when the parent drops its last view, and a worker would write the
next batch over the one the child is reading.  So at every fork the slots the
caller holds are marked, and one that comes back is retired instead
(unlinked, unmapped here, dropped by the workers, never written again: the
child's mapping keeps its pages), nor kept for the next epoch; a new slot
takes its place when one is needed.  A loader forking its own workers leaves
its own slots alone (its workers never read its batches: the loop's last
batch, still held as the next epoch starts, keeps its slot in circulation),
but not another loader's, which a dataset may hold (a replay buffer).  A
fork from another thread takes ``_marks_lock`` from its marking to its end,
the lock under which leases are made and a ring hands its own to the spares.
"""

from __future__ import annotations

import collections
import errno
import mmap
import operator
import os
import resource  # here, not when needed: loading it takes a descriptor
import secrets
import shutil
import threading
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from fastload._core import lease_array
from fastload._lifetime.forks import workers_being_forked
from fastload._lifetime.hooks import at_fork
from fastload._lifetime.weak_registry import WeakRegistry

try:
    import _posixshmem  # CPython's own POSIX shm bindings (what shared_memory uses)
except ImportError:  # pragma: no cover - non-POSIX platforms
    _posixshmem = None

__all__ = ["Segment", "Ring", "SlotLease", "SlotWriter", "SlotInfo", "SpareSlots",
           "SharedMemoryError", "SHM_DIR", "SPARE_BYTES", "new_prefix", "unlink_name",
           "unlink_prefixed"]

SHM_DIR = "/dev/shm"
_PAGE = mmap.PAGESIZE
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux only
_GROWTH_HEADROOM = 4  # a regrown slot gets 1/4 more than asked, so shapes that vary settle fast
# Free slots kept beyond those in flight: a loop holds the batch it works on
# (and often the previous one) while the next are prefetched, so a ring of
# in_flight + 2 slots is the steady state; retiring below that would create
# and unlink segments every epoch.
_KEPT_SPARE_SLOTS = 2
# The most a loader keeps mapped between two epochs for the next one's workers
# (see NOTE [ Slots that outlive an epoch ]).
SPARE_BYTES = 64 << 20
# madvise(2) advice that faults a range in, writable (Linux 5.14); mmap does
# not name it before Python 3.13.
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


# Every Ring and SpareSlots of this process, for the fork hook (NOTE [ Batches
# a forked child holds ]).
_holders_of_slots = WeakRegistry()


# Held from the marking to the end of a fork, and while a lease is made or a
# ring's leases go to the spares: a fork from another thread then finds every
# lease in one place, marked, and the child holds no lease made after its
# marks.  (Without it, a fork marking the spares, then the ring, while the
# main thread handed the ring's leases to the spares in between, marked the
# caller's batch nowhere: a helper's stress run, 94 children in 5,366 saw
# their batch overwritten.)  Reentrant: a signal handler may fork mid-hand-over.
_marks_lock = threading.RLock()
# A fork waits this long for the lock (a hand-over that runs a collection
# may run a teardown's bounded waits), then marks without it.
_MARKS_WAIT = 10.0
_marks_locked_by_fork = threading.local()


def _mark_slots_held_at_fork() -> None:
    _marks_locked_by_fork.held = _marks_lock.acquire(timeout=_MARKS_WAIT)
    exempt = workers_being_forked() or ()
    for holder in _holders_of_slots.live():
        if not any(holder is other for other in exempt):
            holder.mark_held_at_fork()


def _release_marks_after_fork() -> None:
    if getattr(_marks_locked_by_fork, "held", False):
        _marks_locked_by_fork.held = False
        _marks_lock.release()


def _new_marks_lock_in_child() -> None:
    # The child's only thread is the one that forked, holding the lock.
    global _marks_lock, _marks_locked_by_fork
    _marks_lock = threading.RLock()
    _marks_locked_by_fork = threading.local()


at_fork("slots held at fork", before=_mark_slots_held_at_fork,
        after_in_parent=_release_marks_after_fork, after_in_child=_new_marks_lock_in_child)


class SharedMemoryError(RuntimeError):
    """The ring's shared memory could not be reserved (too little /dev/shm)."""


def new_prefix() -> str:
    """A unique segment-name prefix for one ring; every fastload segment starts with ``fl_``."""
    return f"fl_{os.getpid()}_{secrets.token_hex(4)}_"


def shm_free_bytes() -> int | None:
    try:
        return shutil.disk_usage(SHM_DIR).free
    except OSError:
        return None


def _space_error(shortfall: str) -> SharedMemoryError:
    """``shortfall`` says what was needed ("could not reserve ..."), this adds what is free
    and what to change."""
    free = shm_free_bytes()
    free_text = "unknown" if free is None else f"{free / 2**20:.1f} MiB"
    return SharedMemoryError(
        f"fastload {shortfall}; {SHM_DIR} has {free_text} free. Lower prefetch_factor or num_workers "
        f"(the ring holds num_workers * prefetch_factor batches in flight), use a smaller "
        f"batch_size, release batches you hold, or give the machine a larger {SHM_DIR} "
        f"(Docker: --shm-size=2g)."
    )


def _with_fd_room(call: Callable[[], Any]) -> Any:
    """``call()``, which opens a file descriptor; at the process's limit, torch's error.

    Every mapping holds a descriptor (Python's ``mmap`` keeps its own), so a
    caller holding many batches (an epoch kept in a list) can reach the soft
    limit (often 1024), as a caller of torch's loader does with its
    descriptor-shared tensors.  torch raises a ``RuntimeError`` that says to
    raise ``ulimit -n``, and leaves the limit alone: the process's limits are
    the caller's.  So does this.
    """
    try:
        return call()
    except OSError as error:
        if error.errno != errno.EMFILE:
            raise
        raise too_many_open_files() from error


def near_open_file_limit(margin: int = 10) -> bool:
    """Whether fewer than ``margin`` more descriptors can be opened (torch's test after a
    failed receive: a descriptor sent with a message is dropped when none is left)."""
    opened = []
    try:
        for _ in range(margin):
            opened.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as error:
        return error.errno == errno.EMFILE
    finally:
        for fd in opened:
            os.close(fd)
    return False


def too_many_open_files() -> RuntimeError:
    """torch's error at the open-file limit (its words first), with what holds the files here."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    return RuntimeError(
        f"Too many open files. Communication with the workers is no longer possible. Please "
        f"increase the limit using `ulimit -n` in the shell (now {soft}, at most {hard_text} "
        f"without privileges) or hold fewer batches at once: each batch you hold keeps file "
        f"descriptors open (its shared-memory slot's, and those of tensors a worker sent, as "
        f"torch's do) until it is released")


class Segment:
    """One mapped POSIX shared-memory segment.

    ``create=True`` makes it and reserves its pages (``posix_fallocate``), so a
    too-small /dev/shm fails here with a clear message instead of a SIGBUS in
    the middle of an epoch.  The mapping lives as long as ``array`` (or any
    view of it) does; ``unlink`` only removes the name.
    """

    __slots__ = ("name", "size", "array", "linked")

    def __init__(self, name: str, size: int = 0, create: bool = False,
                 populate: bool = False) -> None:
        if _posixshmem is None:
            raise OSError("fastload's shared-memory ring needs POSIX shared memory")
        self.name = name
        self.linked = True
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = _with_fd_room(lambda: _posixshmem.shm_open("/" + name, flags, mode=0o600))
        try:
            if create:
                try:
                    os.ftruncate(fd, size)
                    if hasattr(os, "posix_fallocate") and size > 0:
                        os.posix_fallocate(fd, 0, size)
                except OSError as exc:
                    if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
                        raise _space_error(f"could not reserve {size / 2**20:.1f} MiB of shared "
                                           f"memory for ring slot {name!r}") from exc
                    raise
            else:
                size = os.fstat(fd).st_size
            self.size = size
            # ``populate``: the caller is about to write every page (a worker
            # filling a slot); mapping them all in one call beats a page
            # fault per 4 KiB.
            map_flags = mmap.MAP_SHARED | (_MAP_POPULATE if populate else 0)
            mapping = _with_fd_room(lambda: mmap.mmap(fd, size, flags=map_flags)) \
                if size > 0 else None
        except BaseException:
            if create:  # nobody else knows the name yet
                self.unlink()
            raise
        finally:
            os.close(fd)
        self.array = np.frombuffer(mapping, dtype=np.uint8) if mapping is not None \
            else np.empty(0, dtype=np.uint8)

    def unlink(self) -> None:
        """Remove the name (idempotent); the mapping stays valid for its holders."""
        if self.linked:
            self.linked = False
            unlink_name(self.name)

    def prefault(self) -> None:
        """Map every page writable now, in one call: for a mapping this process
        inherited, which it is about to fill (``populate`` at creation does the
        same).  Where the kernel cannot, the pages fault in as they are written."""
        mapping = self.array.base
        if isinstance(mapping, mmap.mmap):
            try:
                mapping.madvise(_MADV_POPULATE_WRITE)
            except OSError:  # a kernel older than 5.14
                pass


def unlink_name(name: str) -> bool:
    """Remove segment ``name`` if it exists (mapped here or not); True if it existed."""
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        return False
    return True


def unlink_prefixed(prefix: str) -> None:
    """Unlink every segment whose name starts with ``prefix`` (one ring's, all generations).

    Workers call it when the main process was killed, so no segment outlives
    the loader even then.  (Python's resource tracker could do the same job,
    but it is a process of its own, started on first use: its start-up would
    land on the first batch of every program.)
    """
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            unlink_name(name)


class SlotInfo(tuple):
    """What a worker needs to know of a slot: ``(slot_id, name, capacity, next_name)``.

    ``name`` is None while the slot has no segment yet; ``next_name`` is the
    name the worker must use if it has to create (or regrow) the segment.
    """

    __slots__ = ()

    def __new__(cls, slot_id: int, name: str | None, capacity: int, next_name: str):
        return tuple.__new__(cls, (slot_id, name, capacity, next_name))

    def __getnewargs__(self):
        return tuple(self)

    # itemgetter: read in C, on the per-batch path of both processes
    slot_id = property(operator.itemgetter(0))
    name = property(operator.itemgetter(1))
    capacity = property(operator.itemgetter(2))
    next_name = property(operator.itemgetter(3))


class SlotLease:
    """Holds one slot out of circulation while any view of it is alive.

    numpy arrays made from it (``np.asarray(lease)``) keep it as their base;
    when the last one is gone the slot goes back to the ring.
    """

    __slots__ = ("slot_id", "_segment", "__weakref__")

    def __init__(self, segment: "Segment", slot_id: int) -> None:
        self.slot_id = slot_id
        self._segment = segment  # keeps the mapping alive

    @property
    def __array_interface__(self) -> dict:
        # Only for ``np.asarray(lease)``: the ring's own leases are made into
        # arrays by ``_core.lease_array``, which needs none.
        return self._segment.array.__array_interface__

    def __repr__(self) -> str:
        return f"<SlotLease slot={self.slot_id} bytes={self._segment.size}>"


class _Slot:
    __slots__ = ("segment", "generation", "info", "writer")

    def __init__(self) -> None:
        self.segment: Segment | None = None
        self.generation = 0
        self.info: SlotInfo | None = None  # made on first use, until the segment changes
        self.writer = -1                   # the worker that last got it


class Ring:
    """The main process's side of the ring: which slots exist, which are free.

    Only the main process allocates slot ids and unlinks segments; workers
    create segments under names the ring chose (see ``SlotWriter``).
    """

    def __init__(self, in_flight: int, prefix: str | None = None,
                 spares: Sequence[Segment] = ()) -> None:
        self.prefix = prefix or new_prefix()
        self.in_flight = max(1, in_flight)
        self._slots: dict[int, _Slot] = {}
        self._free: collections.deque[int] = collections.deque()
        # An earlier epoch's free slots (see NOTE [ Slots that outlive an
        # epoch ]): free from the start, already mapped here; forked workers
        # get them as ``inherited``.
        self.inherited: dict[int, Segment] = {}
        for slot_id, segment in enumerate(spares[:self.in_flight + _KEPT_SPARE_SLOTS]):
            slot = _Slot()
            slot.segment = segment
            self._slots[slot_id] = slot
            self._free.append(slot_id)
            self.inherited[slot_id] = segment
        # Slots given back by ``release``.
        self._returned: collections.deque[int] = collections.deque()
        # The caller's leases, by a weak reference whose callback puts it in
        # ``_dead_leases`` (NOTE [ Leases ]); that may happen anywhere (GC,
        # another thread): a deque append is atomic, the rest waits for collect().
        self._lease_slots: dict[weakref.ref, int] = {}
        self._dead_leases: collections.deque[weakref.ref] = collections.deque()
        self._retired: list[tuple[int, str]] = []
        # Slots held when this process forked: retired when they come back
        # (NOTE [ Batches a forked child holds ]).
        self._held_at_fork: set[int] = set()
        _holders_of_slots.add(self)
        self._next_id = len(self._slots)
        self._space_checked = False
        self.closed = False

    def _name(self, slot_id: int, generation: int) -> str:
        return f"{self.prefix}s{slot_id}g{generation}"

    # -- slot circulation ----------------------------------------------------

    def acquire(self, writer: int = 0) -> SlotInfo:
        """A free slot for a task of worker ``writer``, growing the ring if the caller holds them all.

        A slot that ``writer`` filled before is preferred: a worker maps each
        slot it is given, so keeping slots with their writer halves what every
        worker maps (and, with new workers every epoch, maps again).
        """
        self.collect()
        free = self._free
        if free:
            for slot_id in free:
                if self._slots[slot_id].writer == writer:
                    free.remove(slot_id)
                    break
            else:
                slot_id = free.popleft()
        else:
            slot_id = self._next_id
            self._next_id += 1
            self._slots[slot_id] = _Slot()
        self._slots[slot_id].writer = writer
        return self.info(slot_id)

    def info(self, slot_id: int) -> SlotInfo:
        slot = self._slots[slot_id]
        if slot.info is None:
            name = slot.segment.name if slot.segment is not None else None
            capacity = slot.segment.size if slot.segment is not None else 0
            slot.info = SlotInfo(slot_id, name, capacity, self._name(slot_id, slot.generation + 1))
        return slot.info

    def release(self, slot_id: int) -> None:
        """Give back a slot that no lease was made for (a task's slot was not used)."""
        self._returned.append(slot_id)

    def collect(self) -> None:
        """Move returned slots to the free list; retire the ones beyond ``in_flight``."""
        dead, slot_of = self._dead_leases, self._lease_slots
        while dead:
            self._returned.append(slot_of.pop(dead.popleft()))
        while self._returned:
            slot_id = self._returned.popleft()
            slot = self._slots.get(slot_id)
            if slot is None or self.closed:
                continue
            if slot_id in self._held_at_fork:
                self._held_at_fork.discard(slot_id)
                self._retire(slot_id)
            elif len(self._free) >= self.in_flight + _KEPT_SPARE_SLOTS:
                self._retire(slot_id)
            else:
                self._free.append(slot_id)

    def _retire(self, slot_id: int) -> None:
        slot = self._slots.pop(slot_id)
        if slot.segment is not None:
            slot.segment.unlink()
            self._retired.append((slot_id, slot.segment.name))

    def take_retired(self) -> list[tuple[int, str]]:
        """Slots unlinked since the last call: workers should drop their mappings."""
        retired, self._retired = self._retired, []
        return retired

    def mark_held_at_fork(self) -> None:
        """This process forks: the slots the caller holds are never written again."""
        self._held_at_fork.update(slot_id for lease, slot_id in list(self._lease_slots.items())
                                  if lease() is not None)

    def hand_over(self, spares: "SpareSlots") -> None:
        """Leave this ring's slots to the next epoch's: the free ones now, the
        ones the caller still holds when their last view dies.

        Only once no worker writes a slot any more (every task answered), and
        before ``close()``, which unlinks their names as usual: the mappings
        stay valid, and the next ring (whose workers are forked from this
        process) uses them as they are.
        """
        self.collect()
        segments = [self._slots[slot_id].segment for slot_id in self._free]
        spares.put([segment for segment in segments if segment is not None])
        with _marks_lock:  # no fork marks the ring or the spares halfway
            # The latest batches first: the spares take what fits in SPARE_BYTES.
            held = {lease: self._slots[slot_id].segment
                    for lease, slot_id in reversed(self._lease_slots.items())
                    if self._slots[slot_id].segment is not None
                    and slot_id not in self._held_at_fork}
            # Those leases' references land in this deque when they die: it is the spares' now.
            spares.await_leases(self._dead_leases, held)
            # A fork in between (a signal handler of this thread's: the lock
            # is reentrant) marked them here only.  Dead since or not, the
            # child holds them.
            spares.mark_held_at_fork([lease for lease, slot_id in self._lease_slots.items()
                                      if slot_id in self._held_at_fork and lease in held])
            self._lease_slots, self._dead_leases = {}, collections.deque()

    # -- filled slots --------------------------------------------------------

    def adopt(self, slot_id: int, name: str) -> None:
        """A worker created generation ``name`` of a slot: map it, unlink the old one
        (NOTE [ Why one segment per slot ])."""
        slot = self._slots[slot_id]
        if slot.segment is not None and slot.segment.name == name:
            return
        new_segment = Segment(name)
        if slot.segment is not None:
            slot.segment.unlink()
        slot.segment = new_segment
        slot.generation += 1
        slot.info = None
        if not self._space_checked:
            # The first batch tells how big a slot is: check now that the
            # whole ring fits, rather than failing slot by slot later.
            self._space_checked = True
            missing_slots = self.in_flight - sum(
                1 for s in self._slots.values() if s.segment is not None)
            free = shm_free_bytes()
            if free is not None and missing_slots * new_segment.size > free:
                raise _space_error(
                    f"needs {missing_slots * new_segment.size / 2**20:.1f} MiB more shared memory "
                    f"for its ring: {missing_slots} more slots of {new_segment.size / 2**20:.1f} MiB "
                    f"({self.in_flight * new_segment.size / 2**20:.1f} MiB for all {self.in_flight})")

    def lease(self, slot_id: int) -> np.ndarray:
        """The slot's bytes as a uint8 array whose base is a fresh ``SlotLease``."""
        segment = self._slots[slot_id].segment
        if segment is None:
            return np.empty(0, dtype=np.uint8)
        with _marks_lock:  # made before a fork's marks, or after its end
            lease = SlotLease(segment, slot_id)
            self._lease_slots[weakref.ref(lease, self._dead_leases.append)] = slot_id
        return lease_array(lease, segment.array)  # np.asarray(lease), without the interface lookup

    # -- teardown ------------------------------------------------------------

    def close(self, in_flight_ids: list[int] = ()) -> None:
        """Unlink every segment (views the caller holds stay valid).

        ``in_flight_ids`` are slots a worker may have been regrowing: their
        next generation is unlinked too, in case the worker died before
        reporting it.
        """
        if self.closed:
            return
        self.closed = True
        for slot_id in in_flight_ids:
            if slot_id in self._slots:
                unlink_name(self._name(slot_id, self._slots[slot_id].generation + 1))
        for slot in self._slots.values():
            if slot.segment is not None:
                slot.segment.unlink()
        self._slots.clear()
        self._free.clear()
        self.inherited = {}


class SpareSlots:
    """Where a loader keeps the slots one epoch leaves for the next (fork only).

    See NOTE [ Slots that outlive an epoch ].  ``take`` empties it, so two
    iterators of one loader never share a slot; it keeps at most
    ``SPARE_BYTES``, the most recently returned first.  A forked child that
    iterates its copy of the loader gets none: its mappings of these slots are
    shared with the process that keeps them.
    """

    __slots__ = ("_segments", "_awaited", "_held_at_fork", "_pid", "__weakref__")

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._segments: list[Segment] = []
        # Per handed-over ring: where its leases' weak references land when
        # they die (NOTE [ Leases ]), and the segment of each lease still
        # held.  Only this holds those references: when the loader (and so
        # this) is gone, a batch released later gives its slot to nobody.
        self._awaited: list[tuple[collections.deque[weakref.ref], dict[weakref.ref, Segment]]] = []
        # Leases held when this process forked: their slots are not kept
        # (NOTE [ Batches a forked child holds ]).
        self._held_at_fork: set[weakref.ref] = set()
        _holders_of_slots.add(self)

    def __reduce__(self):
        # A copied (or pickled) loader starts with none: these are mappings of
        # this process, which a copy of their bytes could not stand in for.
        return (SpareSlots, ())

    def put(self, segments: list[Segment]) -> None:
        """Keep those of ``segments`` that fit in ``SPARE_BYTES`` with what is kept
        (or awaited) already, in order; the others are freed with their mappings."""
        room = SPARE_BYTES - self.nbytes
        for segment in segments:
            if segment.size <= room:
                self._segments.append(segment)
                room -= segment.size

    def await_leases(self, dead: collections.deque[weakref.ref],
                     held: dict[weakref.ref, Segment]) -> None:
        """Slots whose batches the caller holds past the end of their epoch: each
        is kept here once the weak reference to its lease lands in ``dead``.

        Only as many as fit in ``SPARE_BYTES`` with what is kept already, in
        ``held``'s order: the others are freed with their batch, not kept
        until the next epoch (or for good, by a loader that is not iterated again).
        """
        self._collect_released()
        room = SPARE_BYTES - self.nbytes
        kept = {}
        for lease, segment in held.items():
            if segment.size <= room:
                kept[lease] = segment
                room -= segment.size
        if kept:
            self._awaited.append((dead, kept))

    def _collect_released(self) -> None:
        awaited = []
        for dead, held in self._awaited:
            while dead:
                # A lease that was not kept may land here too, if it died while
                # its ring was handing over (another thread, a collection).
                lease = dead.popleft()
                segment = held.pop(lease, None)
                if lease in self._held_at_fork:
                    self._held_at_fork.discard(lease)
                elif segment is not None:
                    self._segments.append(segment)
            if held:
                awaited.append((dead, held))
        self._awaited = awaited

    def mark_held_at_fork(self, leases: list | None = None) -> None:
        """This process forks: the slots of batches the caller holds are not
        kept; nor those of ``leases``, which a ring marked at a fork."""
        if leases is None:
            leases = [lease for _, held in list(self._awaited) for lease in list(held)
                      if lease() is not None]
        self._held_at_fork.update(leases)

    def take(self) -> list[Segment]:
        self._collect_released()
        segments, self._segments = self._segments, []
        if self._pid != os.getpid():  # inherited by a fork: not ours to write
            self._pid = os.getpid()
            return []
        kept, total = [], 0
        for segment in reversed(segments):
            if total + segment.size <= SPARE_BYTES:
                kept.append(segment)
                total += segment.size
        return kept

    @property
    def nbytes(self) -> int:
        """Bytes kept now or once the batches awaited are released (``take`` caps
        the free ones it returns at ``SPARE_BYTES``)."""
        self._collect_released()
        return sum(segment.size for segment in self._segments) \
            + sum(segment.size for _, held in self._awaited for segment in held.values())


class SlotWriter:
    """A worker's side of the ring: map slots by name, create or regrow them on demand.

    ``inherited``: slots whose mapping a forked worker inherited from the main
    process (their names are gone), by slot id.
    """

    def __init__(self, inherited: dict[int, Segment] | None = None) -> None:
        self._mapped: dict[int, Segment] = dict(inherited or {})
        # Inherited mappings have no page mapped in this process yet.
        self._to_prefault: set[int] = set(self._mapped)
        # The most bytes a batch of this worker has needed: a slot made or regrown
        # gets at least that, so batches of varying size (padded ones) settle all
        # slots at the largest instead of regrowing each slot record by record.
        self.largest = 0

    def forget(self, slot_id: int, name: str) -> None:
        segment = self._mapped.get(slot_id)
        if segment is not None and segment.name == name:
            del self._mapped[slot_id]
            self._to_prefault.discard(slot_id)

    def allocator(self, info: SlotInfo) -> "_TaskAllocation":
        return _TaskAllocation(self, info)


class _TaskAllocation:
    """The ``allocate`` callback for one task: returns the slot's bytes, big enough.

    Records whether it created the slot's next generation, which the worker
    reports (even when the task then fails) so the main process adopts or
    unlinks it.
    """

    def __init__(self, writer: SlotWriter, info: SlotInfo) -> None:
        self.writer = writer
        self.info = info
        self.created: Segment | None = None

    def __call__(self, nbytes: int) -> np.ndarray:
        info = self.info
        if self.created is not None:
            if self.created.size >= nbytes:
                return self.created.array
            self.created.unlink()  # outgrown within one task (promotion): make it again
            self.created = None
        elif info.name is not None and info.capacity >= nbytes:
            writer = self.writer
            segment = writer._mapped.get(info.slot_id)
            if segment is None or segment.name != info.name:
                segment = Segment(info.name, populate=True)
                writer._mapped[info.slot_id] = segment
                writer._to_prefault.discard(info.slot_id)
            elif writer._to_prefault and info.slot_id in writer._to_prefault:
                writer._to_prefault.discard(info.slot_id)
                segment.prefault()
            return segment.array
        writer = self.writer
        writer.largest = max(writer.largest, nbytes)
        size = writer.largest if info.name is None \
            else writer.largest + writer.largest // _GROWTH_HEADROOM
        size = max(_PAGE, (size + _PAGE - 1) // _PAGE * _PAGE)
        self.created = Segment(info.next_name, size, create=True, populate=True)
        self.writer._mapped[info.slot_id] = self.created
        self.writer._to_prefault.discard(info.slot_id)
        return self.created.array

    @property
    def created_name(self) -> str | None:
        return self.created.name if self.created is not None else None
