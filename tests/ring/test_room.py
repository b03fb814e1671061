"""What limits the ring (fastload/_ring/room.py): the memory cgroup's limit,
read as the kernel lays it out, v2 and v1, on a fake hierarchy."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from fastload._ring import room
from fastload._ring.room import SharedMemoryError, cgroup_memory_room, check_room_for_slots
from paths import REPO_DIR

MIB = 1 << 20


def _hierarchy(tmp_path, monkeypatch, cgroup_lines: str, files: dict[str, str]):
    proc = tmp_path / "cgroup"
    proc.write_text(cgroup_lines)
    root = tmp_path / "sys"
    for path, text in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    monkeypatch.setattr(room, "PROC_CGROUP", str(proc))
    monkeypatch.setattr(room, "CGROUP_ROOT", str(root))


def test_v2_limit_less_usage_less_reclaimable_page_cache(tmp_path, monkeypatch):
    _hierarchy(tmp_path, monkeypatch, "0::/pod/app\n", {
        "pod/app/memory.max": f"{512 * MIB}\n",
        "pod/app/memory.current": f"{200 * MIB}\n",
        "pod/app/memory.stat": f"anon 1000\ninactive_file {50 * MIB}\nactive_file 7\n",
    })
    free, limit, path = cgroup_memory_room()
    assert (free, limit) == (362 * MIB, 512 * MIB)
    assert path.endswith("pod/app/memory.max")


def test_v2_unlimited_is_no_limit_and_an_ancestor_limit_counts(tmp_path, monkeypatch):
    _hierarchy(tmp_path, monkeypatch, "0::/pod/app\n", {
        "pod/app/memory.max": "max\n",
        "pod/app/memory.current": f"{10 * MIB}\n",
        "pod/memory.max": f"{100 * MIB}\n",
        "pod/memory.current": f"{90 * MIB}\n",
    })
    assert cgroup_memory_room()[:2] == (10 * MIB, 100 * MIB)
    (tmp_path / "sys/pod/memory.max").write_text("max\n")
    assert cgroup_memory_room() is None


def test_v1_memory_controller_and_its_unlimited_value(tmp_path, monkeypatch):
    _hierarchy(tmp_path, monkeypatch, "5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n", {
        "memory/docker/abc/memory.limit_in_bytes": f"{64 * MIB}\n",
        "memory/docker/abc/memory.usage_in_bytes": f"{20 * MIB}\n",
        "memory/docker/abc/memory.stat": f"total_inactive_file {4 * MIB}\n",
        "memory/memory.limit_in_bytes": "9223372036854771712\n",
    })
    assert cgroup_memory_room()[:2] == (48 * MIB, 64 * MIB)


def test_a_container_whose_mount_is_its_own_cgroup(tmp_path, monkeypatch):
    # /proc/self/cgroup names a path the container's mount does not show: the
    # mount itself is the process's cgroup.
    _hierarchy(tmp_path, monkeypatch, "0::/kubepods/pod1/c1\n", {
        "memory.max": f"{256 * MIB}\n", "memory.current": f"{6 * MIB}\n"})
    assert cgroup_memory_room()[:2] == (250 * MIB, 256 * MIB)


def test_no_cgroup_information_is_no_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(room, "PROC_CGROUP", str(tmp_path / "missing"))
    assert cgroup_memory_room() is None


def test_the_check_names_the_limit_and_what_to_change(tmp_path, monkeypatch):
    _hierarchy(tmp_path, monkeypatch, "0::/\n", {
        "memory.max": f"{100 * MIB}\n", "memory.current": f"{70 * MIB}\n"})
    check_room_for_slots(7, 4 * MIB, 8, posix=False)  # 28 MiB of 30 free: fits
    with pytest.raises(SharedMemoryError) as excinfo:
        check_room_for_slots(7, 8 * MIB, 8, posix=False)
    message = str(excinfo.value)
    assert isinstance(excinfo.value, RuntimeError)
    assert message.startswith("fastload needs 56.0 MiB more shared memory for its ring: 7 more "
                              "slots of 8.0 MiB (64.0 MiB for all 8); the memory cgroup's limit "
                              "is 100.0 MiB"), message
    assert "30.0 MiB of it free" in message and "prefetch_factor" in message, message
    assert "--memory" in message and "/dev/shm" not in message, message


_IN_CGROUP = """
import sys
import time
sys.path[:0] = [{repo!r}]
import numpy as np
import fastload as fl
from fastload._ring import SharedMemoryError

class SixteenMiB(fl.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i >= 4:  # the first batch tells the slot's size: the check comes before the next
            time.sleep(1)
        return np.full(1 << 22, i, np.float32)  # 16 MiB: a batch of 4 is 64 MiB

try:
    # One worker (its samples and a slot fit the limit), 6 batches in flight (they do not).
    for _ in fl.DataLoader(SixteenMiB(), batch_size=4, num_workers=1, prefetch_factor=6):
        pass
    print("NO ERROR")
except SharedMemoryError as exc:
    print("MESSAGE", exc)
"""


def _child_cgroup(tmp_path, limit: int):
    """A new memory cgroup under this process's, limited to ``limit`` bytes, as
    (directory, the file that takes a pid); skips where cgroups are not ours to make."""
    for directory, version in room._cgroup_dirs():
        child = f"{directory}/fl_test_{tmp_path.name[-12:]}"
        limit_file = "memory.max" if version == "v2" else "memory.limit_in_bytes"
        try:
            if not os.path.exists(f"{directory}/{limit_file}") and directory != room.CGROUP_ROOT:
                continue
            os.mkdir(child)
        except OSError:
            continue
        try:
            with open(f"{child}/{limit_file}", "w") as file:
                file.write(str(limit))
            return child
        except OSError:
            os.rmdir(child)
    pytest.skip("cannot make a memory cgroup with a limit here (not root, or not delegated)")


@pytest.mark.timeout(120)
def test_a_loader_in_a_memory_cgroup_too_small_for_its_ring_says_so(tmp_path, no_leaks):
    child = _child_cgroup(tmp_path, 320 * MIB)
    script = tmp_path / "in_cgroup.py"
    script.write_text(_IN_CGROUP.format(repo=str(REPO_DIR)))
    try:
        result = subprocess.run(["sh", "-c", f"echo $$ > {child}/cgroup.procs && "
                                             f"exec {sys.executable} {script}"],
                                capture_output=True, text=True, timeout=100)
    finally:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.rmdir(child)
                break
            except OSError:  # its processes are still exiting
                time.sleep(0.1)
    assert result.stdout.startswith("MESSAGE fastload needs 320.0 MiB more shared memory for its "
                                    "ring: 5 more slots of 64.0 MiB (384.0 MiB for all 6); the "
                                    "memory cgroup's limit is 320.0 MiB"), \
        (result.stdout, result.stderr[-3000:])
