"""Who owns which files of a decoded-image cache, on local and other file systems
(fastload.vision.cache_filesystems, cache_store.StoreWriter).

The file-system type is faked (the detector monkeypatched): off a local file
system writers keep to new ``*.solo`` pairs, warned of once, and nothing takes
them over.  Whatever the file system, a process never opens a second descriptor
of an index it holds locked (closing it would release an ``fcntl`` lock, which
is what NFS makes of ``flock``): watched through Python's audit hook.
"""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import pytest

from fastload.vision import ImageFolder, cache_store
from fastload.vision import cache_filesystems
from fastload.vision.cache_filesystems import filesystem_type, shares_files
from images import cache_fill_reference, save_folder

SIDE = 64
FILES = [("a", "0.jpg", (40, 30)), ("a", "1.png", (64, 48)), ("b", "2.jpg", (150, 100))]


@pytest.fixture
def folder(tmp_path):
    return save_folder(tmp_path / "images", FILES)


def pixels_of(ds) -> list[np.ndarray]:
    return [np.asarray(ds[index][0]) for index in range(len(ds))]


def reference(path: str) -> np.ndarray:
    return np.asarray(cache_fill_reference(path, SIDE))


def index_names(cache) -> list[str]:
    return sorted(name for name in os.listdir(cache) if name.endswith(".index"))


# -- the detector ------------------------------------------------------------

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
40 27 0:50 / /data rw,relatime shared:1 - nfs4 server:/export rw,vers=4.2
41 40 0:51 / /data/local rw,relatime - xfs /dev/vdb rw
42 27 0:52 / /mnt/my\\040share rw - cifs //host/share rw
43 27 0:53 / /home/me/remote rw,nosuid - fuse.sshfs me@host:/ rw
44 27 0:54 / /scratch rw - lustre 10.0.0.1@tcp:/fs rw
45 44 0:55 / /scratch rw - tmpfs tmpfs rw
"""


@pytest.mark.parametrize("directory, expected", [
    ("/", "ext4"), ("/home/me", "ext4"), ("/data", "nfs4"), ("/data/cache", "nfs4"),
    ("/data/local/cache", "xfs"), ("/datastore", "ext4"), ("/mnt/my share/c", "cifs"),
    ("/home/me/remote/c", "fuse.sshfs"), ("/scratch/c", "tmpfs"),  # the last mount on top
])
def test_the_type_is_the_longest_mount_point_s(tmp_path, monkeypatch, directory, expected):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(MOUNTINFO)
    monkeypatch.setattr(os.path, "realpath", lambda path: path)
    assert filesystem_type(directory, str(mountinfo)) == expected


def test_an_unreadable_mount_table_gives_no_type(tmp_path):
    assert filesystem_type(str(tmp_path), str(tmp_path / "missing")) is None


@pytest.mark.parametrize("fstype, shared", [
    ("ext4", True), ("xfs", True), ("btrfs", True), ("tmpfs", True), ("overlay", True),
    ("nfs", False), ("nfs4", False), ("cifs", False), ("smb3", False), ("lustre", False),
    ("gpfs", False), ("fuse.sshfs", False), ("fuse", False), ("9p", False), ("ceph", False),
    (None, False),
])
def test_files_are_shared_only_on_local_file_systems(fstype, shared):
    assert shares_files(fstype) is shared


def test_this_machine_s_temporary_directory_has_a_type(tmp_path):
    if not os.path.exists("/proc/self/mountinfo"):
        pytest.skip("no /proc/self/mountinfo on this system")
    assert isinstance(filesystem_type(str(tmp_path)), str)


# -- solo writers off a local file system -------------------------------------


@pytest.fixture
def on_nfs(monkeypatch):
    monkeypatch.setattr(cache_filesystems, "filesystem_type", lambda directory: "nfs4")


def test_off_a_local_file_system_writers_keep_to_files_of_their_own(folder, tmp_path, on_nfs,
                                                                      monkeypatch):
    def no_locks(*args):
        raise AssertionError("a solo writer takes no lock")

    monkeypatch.setattr(cache_store.fcntl, "flock", no_locks)
    cache = tmp_path / "c"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
        pixels_of(first)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1, messages
    assert "'nfs4'" in messages[0] and "local file system" in messages[0]
    first.image_cache._writer.close()  # its writer is gone: a local writer would take it over
    solo, = index_names(cache)
    assert solo.endswith(cache_store.SOLO_SUFFIX + ".index")
    before = {name: (cache / name).read_bytes() for name in os.listdir(cache)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        second = ImageFolder(folder, cache=cache, cache_max_side=32)  # other entries to store
        pixels_of(second)
    assert len(index_names(cache)) == 2  # a new pair of its own
    assert all((cache / name).read_bytes() == data for name, data in before.items())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reader = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
        for got, (path, _) in zip(pixels_of(reader), reader.samples):
            assert np.array_equal(got, reference(path))
    assert reader.image_cache.stats()["hits"] == len(FILES)


def test_a_local_writer_never_takes_a_solo_pair_over(folder, tmp_path, monkeypatch):
    cache = tmp_path / "c"
    monkeypatch.setattr(cache_filesystems, "filesystem_type", lambda directory: "fuse.sshfs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        solo = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
        solo[0]
    solo.image_cache._writer.close()
    before = {name: (cache / name).read_bytes() for name in os.listdir(cache)}
    monkeypatch.setattr(cache_filesystems, "filesystem_type", lambda directory: "ext4")
    local = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    for got, (path, _) in zip(pixels_of(local), local.samples):
        assert np.array_equal(got, reference(path))
    assert local.image_cache.stats()["hits"] == 1
    assert len(index_names(cache)) == 2
    assert all((cache / name).read_bytes() == data for name, data in before.items())


def test_a_pickled_cache_keeps_to_solo_files(folder, tmp_path, on_nfs):
    import pickle

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = ImageFolder(folder, cache=tmp_path / "c", cache_max_side=SIDE)
        again = pickle.loads(pickle.dumps(ds))  # as a spawned worker gets it: no new warning
        pixels_of(again)
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
    assert index_names(tmp_path / "c")[0].endswith(cache_store.SOLO_SUFFIX + ".index")


# -- a held index is never opened again --------------------------------------

_OPENED: list[str] | None = None


def _watch_opens(event: str, args: tuple) -> None:
    if _OPENED is not None and event == "open" and isinstance(args[0], (str, bytes)):
        _OPENED.append(os.path.realpath(os.fsdecode(args[0])))


def test_a_process_never_opens_another_descriptor_of_an_index_it_holds(folder, tmp_path):
    global _OPENED
    if not getattr(sys, "_fastload_cache_open_hook", False):
        sys.addaudithook(_watch_opens)  # a hook stays for the process: it looks only when asked
        sys._fastload_cache_open_hook = True
    cache = tmp_path / "c"
    first = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    first[0]  # its writer now holds its index, locked
    held, = (os.path.realpath(cache / name) for name in index_names(cache))
    _OPENED = []
    try:
        pixels_of(first)
        first.image_cache.refresh()
        # Another cache of the same directory in this process: it stores entries of
        # its own (another side), so it makes a writer; both read each other's index.
        second = ImageFolder(folder, cache=cache, cache_max_side=32)
        pixels_of(second)
        second.image_cache.refresh()
        first.image_cache.refresh()
        pixels_of(ImageFolder(folder, cache=cache, cache_max_side=SIDE))
    finally:
        opened, _OPENED = _OPENED, None
    other, = (os.path.realpath(cache / name) for name in index_names(cache)
              if os.path.realpath(cache / name) != held)
    assert held not in opened
    assert opened.count(other) == 1  # made by the second writer, then read through it only
    assert second.image_cache.stats()["stored"] == len(FILES)
    assert first.image_cache.stats()["entries"] == 2 * len(FILES)
