"""Soak: many epochs on persistent workers leave memory, fds and the ring's slots flat."""

from __future__ import annotations

import os

import numpy as np
import psutil
import pytest

import fastload as fl
from leakcheck import memory_files_held, shm_entries

MIB = 2**20


class SoakDataset(fl.Dataset):
    """2,000 samples of a (3, 32, 32) uint8 image and an int label, made per access."""

    def __init__(self, n: int = 2000) -> None:
        self.n = n
        self.base = np.arange(3 * 32 * 32, dtype=np.uint8).reshape(3, 32, 32)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return self.base + np.uint8(i % 251), int(i)


def _snapshot(pids: list[int]) -> dict:
    rss, fds = {}, {}
    for pid in [os.getpid()] + pids:
        rss[pid] = psutil.Process(pid).memory_info().rss
        fds[pid] = len(os.listdir(f"/proc/{pid}/fd"))
    return {"rss": rss, "fds": fds}


def _our_segments(prefix: str) -> set[str]:
    """The ring's slots: POSIX segment names, or the memory files processes hold."""
    return {n for n in shm_entries() if n.startswith(prefix)} | set(memory_files_held(prefix))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_thirty_epochs_on_persistent_workers_stay_flat(no_leaks):
    """30 epochs, persistent_workers=True, 2 workers, batch 64, shuffled.

    Measured after epoch 1 and after epoch 30, for the main process and each
    worker; the bounds:

    * RSS grows by less than 8 MiB per process;
    * the number of open fds (/proc/<pid>/fd) changes by at most 2;
    * the iterator's slots (memory files ``fl_<pid>_...``, or POSIX
      segments) are the same set (none retired and re-made, none added);
    * the worker pids are the same in every epoch (the workers persist);

    and every batch of every epoch is correct (labels a permutation of the
    dataset, images matching their labels).
    """
    dataset = SoakDataset(2000)
    loader = fl.DataLoader(dataset, batch_size=64, shuffle=True, generator=0, num_workers=2,
                           persistent_workers=True)
    try:
        _soak(loader)
    finally:
        if loader._iterator is not None:
            loader._iterator.shutdown()


def _soak(loader) -> None:
    expected_labels = np.arange(2000)
    first = None
    pids = None
    prefix = None
    for epoch in range(1, 31):
        it = iter(loader)
        if pids is None:
            pids, prefix = list(it.worker_pids), it._ring.prefix
        assert it.worker_pids == pids, f"epoch {epoch}: workers changed"
        labels = []
        for images, batch_labels in it:
            labels.append(batch_labels.copy())
            assert images.shape[1:] == (3, 32, 32) and images.dtype == np.uint8
            # image[c, y, x] == (flat index + label) % 256
            np.testing.assert_array_equal(images[:, 0, 0, 1], (1 + batch_labels % 251) % 256)
        del images, batch_labels, it
        labels = np.concatenate(labels)
        assert len(labels) == 2000
        np.testing.assert_array_equal(np.sort(labels), expected_labels)
        if epoch == 1:
            first_order = labels
            first = _snapshot(pids)
            first["shm"] = _our_segments(prefix)
        elif epoch == 2:
            assert not np.array_equal(labels, first_order), "each epoch should reshuffle"
    last = _snapshot(pids)
    last["shm"] = _our_segments(prefix)

    for pid in first["rss"]:
        who = "main" if pid == os.getpid() else f"worker {pid}"
        growth = last["rss"][pid] - first["rss"][pid]
        assert growth < 8 * MIB, f"{who}: RSS grew by {growth / MIB:.1f} MiB over 29 epochs"
        assert abs(last["fds"][pid] - first["fds"][pid]) <= 2, \
            f"{who}: open fds {first['fds'][pid]} -> {last['fds'][pid]}"
    assert first["shm"], "the ring should hold segments between epochs"
    assert len(last["shm"]) == len(first["shm"]), \
        f"/dev/shm segment count changed: {sorted(first['shm'])} -> {sorted(last['shm'])}"
    assert last["shm"] == first["shm"], \
        f"slots were retired and re-created across epochs: {sorted(first['shm'])} -> {sorted(last['shm'])}"
    assert all(psutil.pid_exists(p) for p in pids)
