"""What a process becomes as a loader's worker: ``WorkerInfo``, seeds, torch's set-up, malloc.

``start_as_worker`` does it all, once, before the caller's ``worker_init_fn``.
"""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.machinery
import platform
import random
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload._loading.torch_seeding import seed_torch

__all__ = ["batch_seed", "seed_for_batch", "WorkerInfo", "get_worker_info", "start_as_worker"]


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


def batch_seed(base_seed: int, batch_no: int) -> int:
    """Batch ``batch_no``'s seed in auto mode: splitmix64 of the pair, so that
    nearby batch numbers give unrelated seeds."""
    z = (base_seed * 0x9E3779B97F4A7C15 + batch_no + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def seed_for_batch(base_seed: int, batch_no: int) -> None:
    """``num_workers="auto"``: seed every generator a dataset may draw from (Python's
    ``random``, numpy's global one, torch's once loaded) from ``(base_seed,
    batch_no)``, so a batch does not depend on which worker made it."""
    seed = batch_seed(base_seed, batch_no)
    _seed_everything(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        seed_torch(torch, seed)


_MASK64 = (1 << 64) - 1


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


def start_as_worker(worker_id: int, num_workers: int, seed: int, dataset: Any) -> WorkerInfo:
    """Make this process worker ``worker_id``: malloc tuned, every RNG seeded with
    ``seed``, ``get_worker_info()`` answering (torch's too, once torch is loaded)."""
    global _worker_info
    _tune_malloc()
    _seed_everything(seed)
    _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed, dataset=dataset)
    _be_a_torch_worker(_worker_info)
    return _worker_info
