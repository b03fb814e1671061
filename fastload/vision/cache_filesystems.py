"""Which file system a cache directory is on, and whether its writers may share files there.

The store's writers take over a dead writer's files by ``flock``
(``cache_store``).  Only a local file system keeps that lock as the store
needs it: NFS emulates ``flock`` with ``fcntl`` locks, which any ``close()``
of the file by the holder releases and a ``nolock`` mount keeps per host;
SMB, Lustre (without ``-o flock``), GPFS, FUSE file systems and 9p each keep
their own rules.  So the cache shares files between writers only on the
local file systems named in ``LOCAL_FILESYSTEMS``; anywhere else (or where
the type cannot be read) each writer keeps to new files of its own
(``StoreWriter(solo=True)``).

The type comes from ``/proc/self/mountinfo``: the mount whose mount point is
the longest prefix of the directory's real path (the last such line, when
mounts are stacked).
"""

from __future__ import annotations

import os
import re
import warnings

__all__ = ["LOCAL_FILESYSTEMS", "filesystem_type", "shares_files", "writers_kept_apart"]

# Disk and memory file systems of one kernel, whose flock is the kernel's own.
LOCAL_FILESYSTEMS = frozenset({
    "ext2", "ext3", "ext4", "xfs", "btrfs", "bcachefs", "f2fs", "jfs", "reiserfs", "nilfs2",
    "zfs", "tmpfs", "ramfs", "overlay", "vfat", "exfat", "ntfs3", "hfsplus", "apfs",
})
MOUNTINFO = "/proc/self/mountinfo"
_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    return _ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def filesystem_type(directory: str, mountinfo: str = MOUNTINFO) -> str | None:
    """The type of the file system ``directory`` is on (``"ext4"``, ``"nfs4"``,
    ``"fuse.sshfs"``, ...), or None when it cannot be read."""
    path = os.path.realpath(directory)
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    best, found = -1, None
    for line in lines:
        before, separator, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if not separator or len(fields) < 5 or not tail:
            continue
        mount_point = _unescape(fields[4])
        inside = path == mount_point or path.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= best:
            best, found = len(mount_point), tail[0]
    return found


def shares_files(fstype: str | None) -> bool:
    """Whether writers may take over each other's files on a file system of this type."""
    return fstype in LOCAL_FILESYSTEMS


def writers_kept_apart(directory: str) -> bool:
    """Whether the writers of a cache in ``directory`` must keep to files of their
    own (it is not on a local file system); if so, says it in a ``RuntimeWarning``."""
    fstype = filesystem_type(directory)
    if shares_files(fstype):
        return False
    kind = "a file system of unknown type" if fstype is None else f"a {fstype!r} file system"
    warnings.warn(
        f"fastload image cache {directory!r} is on {kind}, where file locks cannot be "
        f"trusted (NFS, SMB, Lustre, GPFS, FUSE, 9p...): its processes do not share files "
        f"there (each writing process makes new files of its own, never taking over "
        f"another's), so the directory grows by a file pair per writing process. Put "
        f"cache= on a local file system (ext4, xfs, btrfs, tmpfs...) to share it fully",
        RuntimeWarning, stacklevel=5)
    return True
