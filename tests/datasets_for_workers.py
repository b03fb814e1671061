"""Datasets and helpers the worker processes must import by name.

spawn and forkserver workers unpickle the dataset, so its class has to live
in an importable module (not in a test function); the fault and ring tests
share them.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

from fastload import Dataset


class SquareDataset(Dataset):
    """Sample ``i`` is ``(uint8 image filled with i % 251, i)``."""

    def __init__(self, n: int = 64, shape: tuple = (3, 8, 8)) -> None:
        self.n = n
        self.shape = shape

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return np.full(self.shape, i % 251, dtype=np.uint8), i


class WorkerIdDataset(SquareDataset):
    """Also returns which worker made the sample, and the numpy RNG's first draw there."""

    def __getitem__(self, i):
        from fastload import get_worker_info

        info = get_worker_info()
        image, label = super().__getitem__(i)
        return image, label, -1 if info is None else info.id


class SlowDataset(SquareDataset):
    def __init__(self, n: int = 64, delay: float = 0.2, shape: tuple = (4,)) -> None:
        super().__init__(n, shape)
        self.delay = delay

    def __getitem__(self, i):
        time.sleep(self.delay)
        return super().__getitem__(i)


class CallLoggingDataset(SlowDataset):
    """``SlowDataset`` that appends each index it starts on to the file ``log``
    (one write per line, so the lines of several workers do not mix); the
    indices in ``quick`` take no time."""

    def __init__(self, log: str, n: int = 64, delay: float = 0.2, quick: tuple = ()) -> None:
        super().__init__(n, delay)
        self.log = log
        self.quick = quick

    def __getitem__(self, i):
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{i}\n".encode())
        finally:
            os.close(fd)
        if i in self.quick:
            return SquareDataset.__getitem__(self, i)
        return super().__getitem__(i)


class CompletionLoggingDataset(SlowDataset):
    """``SlowDataset`` that appends ``start i`` to the file ``log`` as it starts
    on sample ``i`` and ``done i`` once it has made it."""

    def __init__(self, log: str, n: int = 64, delay: float = 0.2) -> None:
        super().__init__(n, delay)
        self.log = log

    def _write(self, line: str) -> None:
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{line}\n".encode())
        finally:
            os.close(fd)

    def __getitem__(self, i):
        self._write(f"start {i}")
        sample = super().__getitem__(i)
        self._write(f"done {i}")
        return sample


def logged_calls(log: str) -> list[int]:
    with open(log) as handle:
        return sorted(int(line) for line in handle)


class GrowingDataset(Dataset):
    """Samples grow with their batch: batch ``b`` holds float64 vectors of ``(b+1) * step`` items.

    So later batches need bigger slots than earlier ones (the ring must regrow).
    """

    def __init__(self, n: int, batch_size: int, step: int = 512) -> None:
        self.n = n
        self.batch_size = batch_size
        self.step = step

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        length = (i // self.batch_size + 1) * self.step
        return np.arange(length, dtype=np.float64) + i, f"sample-{i}"


class FaultyDataset(SquareDataset):
    """``SquareDataset`` that misbehaves on index ``bad``.

    ``mode``: "raise" raises ``error_type(*error_args)``; "sigkill" kills its
    own process; "exit" calls ``os._exit(3)``; "sys.exit" calls ``sys.exit()``.
    """

    def __init__(self, n: int, bad: int, mode: str = "raise", error_type: type = ValueError,
                 error_args: tuple = ("bad sample",)) -> None:
        super().__init__(n, (4,))
        self.bad = bad
        self.mode = mode
        self.error_type = error_type
        self.error_args = error_args

    def __getitem__(self, i):
        if i == self.bad:
            if self.mode == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(10)
            elif self.mode == "exit":
                os._exit(3)
            elif self.mode == "sys.exit":
                sys.exit("the dataset called sys.exit()")
            else:
                raise self.error_type(*self.error_args)
        return super().__getitem__(i)


def record_init(worker_id: int) -> None:
    """A picklable worker_init_fn (spawn/forkserver) that leaves a mark get_worker_info can see."""
    import fastload

    info = fastload.get_worker_info()
    assert info is not None and info.id == worker_id


def linger_at_exit(worker_id: int) -> None:
    """worker_init_fn: the worker's exit hangs (a finalizer that sleeps a minute)."""
    from multiprocessing import util

    util.Finalize(None, time.sleep, args=(60,), exitpriority=0)


class PageFaultCounting(Dataset):
    """Each sample makes four 1 MiB temporaries at once, as an image pipeline makes
    its decoded and resized copies, and returns the page faults that took."""

    def __init__(self, n: int = 24) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        import resource

        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        temporaries = [np.ones(1 << 20, dtype=np.uint8) for _ in range(4)]
        del temporaries
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


class LazyTorchShards(Dataset):
    """A map-style dataset that imports torch only inside ``__getitem__`` (this
    module must not import it), and reports what torch's worker set-up gave it."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i):
        import torch  # noqa: PLC0415 - lazily, on purpose

        info = torch.utils.data.get_worker_info()
        if info is None:
            return [-1, -1, -1]
        return [info.id, info.num_workers, int(torch.get_num_threads() == 1
                                               and torch.initial_seed() == info.seed)]
