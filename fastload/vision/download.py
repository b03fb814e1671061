"""Fetching and unpacking the classic datasets' published archives, never half-written.

torchvision's helpers by name (``check_integrity``, ``download_url``,
``extract_archive``, ``download_and_extract_archive``), with one rule added:
every file is written under a temporary name in its own directory, flushed to
disk, checked (MD5, gzip's CRC) and only then renamed into place, so a failed,
interrupted or truncated download or extraction never leaves a file that
passes for complete.  A tar archive is all or nothing: unpacked into a
temporary directory, moved into place only once every member has passed.
urllib only; every socket wait has a timeout.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from http.client import HTTPException
from typing import IO
from urllib.error import URLError
from urllib.request import urlopen

__all__ = ["DownloadError", "calculate_md5", "check_md5", "check_integrity", "download_url",
           "extract_archive", "download_and_extract_archive"]

_CHUNK = 1 << 20
# Seconds a connection or a single read may stall before the download fails.
DOWNLOAD_TIMEOUT = 60.0


class DownloadError(RuntimeError):
    """A download that failed (network, truncated body, wrong MD5); names the URL and the file."""

    def __init__(self, message: str, url: str, path: str) -> None:
        super().__init__(message)
        self.url = url
        self.path = path


def calculate_md5(fpath: str | os.PathLike, chunk_size: int = _CHUNK) -> str:
    """The hex MD5 of a file's bytes."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(fpath, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def check_md5(fpath: str | os.PathLike, md5: str, **kwargs) -> bool:
    return md5 == calculate_md5(fpath, **kwargs)


def check_integrity(fpath: str | os.PathLike, md5: str | None = None) -> bool:
    """Whether ``fpath`` is a file and, when ``md5`` is given, has that MD5 (torchvision's rule)."""
    if not os.path.isfile(fpath):
        return False
    return md5 is None or check_md5(fpath, md5)


@contextmanager
def _atomic_file(path: str) -> Iterator[IO[bytes]]:
    """A temporary file beside ``path``, renamed over it only if the block succeeds."""
    directory, name = os.path.split(path)
    fd, temp = tempfile.mkstemp(prefix=f".{name}.", suffix=".part", dir=directory or ".")
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, path)
        temp = None
        _fsync_directory(directory or ".")
    finally:
        if temp is not None:
            try:
                os.unlink(temp)
            except FileNotFoundError:
                pass


def _fsync_directory(directory: str) -> None:
    # The rename itself must reach the disk too, or a crash could undo it.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def download_url(url: str, root: str | os.PathLike, filename: str | None = None,
                 md5: str | None = None) -> str:
    """Download ``url`` to ``root/filename`` unless a file with that MD5 is already there.

    Returns the file's path.  Raises ``DownloadError`` (a ``RuntimeError``)
    naming the URL and the file when the connection fails, the body is shorter
    than its ``Content-Length``, or the MD5 is not ``md5``; then no file is
    left at that path.
    """
    root = os.path.expanduser(os.fspath(root))
    filename = filename or os.path.basename(url)
    fpath = os.path.join(root, filename)
    os.makedirs(root, exist_ok=True)
    if check_integrity(fpath, md5):
        return fpath
    print(f"Downloading {url} to {fpath}")
    try:
        with _atomic_file(fpath) as out:
            digest = _copy_response(url, fpath, out)
            if md5 is not None and digest != md5:
                raise DownloadError(f"the file downloaded from {url} has MD5 {digest}, expected "
                                    f"{md5}; {fpath} was not written", url, fpath)
    except DownloadError:
        raise
    except (URLError, HTTPException, OSError) as error:
        raise DownloadError(f"downloading {url} to {fpath} failed: {error}", url, fpath) from error
    return fpath


def _copy_response(url: str, fpath: str, out: IO[bytes]) -> str:
    """Stream ``url``'s body into ``out``; its hex MD5.  A body shorter than its
    ``Content-Length`` is an error (the server or the connection gave up)."""
    digest = hashlib.md5(usedforsecurity=False)
    received = 0
    with urlopen(url, timeout=DOWNLOAD_TIMEOUT) as response:
        declared = response.headers.get("Content-Length")
        while True:
            try:
                chunk = response.read(_CHUNK)
            except HTTPException as error:  # IncompleteRead: the connection closed early
                raise DownloadError(f"the download of {url} was cut short after "
                                    f"{received + len(getattr(error, 'partial', b''))} bytes "
                                    f"({error!r}); {fpath} was not written", url, fpath) from error
            if not chunk:
                break
            received += len(chunk)
            digest.update(chunk)
            out.write(chunk)
    if declared is not None and declared.isdigit() and received != int(declared):
        raise DownloadError(f"the download of {url} was cut short: {received} of {declared} "
                            f"bytes; {fpath} was not written", url, fpath)
    return digest.hexdigest()


def _extract_gzip(from_path: str, to_path: str) -> None:
    try:
        with gzip.open(from_path, "rb") as source, _atomic_file(to_path) as out:
            shutil.copyfileobj(source, out, _CHUNK)
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise RuntimeError(f"{from_path} is not a complete gzip file ({error}); "
                           f"{to_path} was not written") from error


def _extract_tar(from_path: str, to_dir: str) -> None:
    """All or nothing: every member is unpacked into a hidden temporary directory inside
    ``to_dir`` and checked; only when all have passed are they moved into place (a file
    at a time, each whole), and on any failure the temporary directory is removed,
    leaving ``to_dir`` as it was."""
    created = _missing_ancestors(to_dir)
    os.makedirs(to_dir, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(from_path)}.", suffix=".part",
                               dir=to_dir)
    try:
        _unpack_members(from_path, to_dir, staging)
        moves = _placements(from_path, staging, to_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for directory in created:  # deepest first; only those this call made, if still empty
            try:
                os.rmdir(directory)
            except OSError:
                break
        raise
    try:
        for source, destination in moves:
            os.replace(source, destination)
        for directory in {os.path.dirname(destination) for _, destination in moves}:
            _fsync_directory(directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _missing_ancestors(directory: str) -> list[str]:
    """``directory`` and its parents that do not exist yet, deepest first."""
    missing = []
    directory = os.path.abspath(directory)
    while not os.path.exists(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    return missing


def _unpack_members(from_path: str, to_dir: str, staging: str) -> None:
    """Regular files and directories only, each file flushed to disk; a member that would
    land outside (an absolute path, ``..``) or is not a file or directory (a link, a
    device) refuses the archive, naming it."""
    root = os.path.realpath(staging)
    try:
        with tarfile.open(from_path, "r:*") as archive:
            for member in archive:
                name = member.name
                parts = name.replace("\\", "/").split("/")
                destination = os.path.realpath(os.path.join(root, name))
                if os.path.isabs(name) or ".." in parts \
                        or os.path.commonpath([root, destination]) != root:
                    raise RuntimeError(f"{from_path}: member {name!r} is absolute or climbs with "
                                       f"'..', and could land outside {to_dir}; refusing the "
                                       f"archive, nothing was extracted")
                if not (member.isdir() or member.isfile()):
                    raise RuntimeError(f"{from_path}: member {name!r} is not a regular file or "
                                       f"directory; refusing the archive, nothing was extracted")
                try:
                    _unpack_member(archive, member, destination, root)
                except OSError as error:
                    raise RuntimeError(f"{from_path}: member {name!r} cannot be extracted "
                                       f"({error}); nothing was extracted") from error
    except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise RuntimeError(f"{from_path} is not a complete tar archive ({error}); nothing "
                           f"was extracted") from error


def _unpack_member(archive: tarfile.TarFile, member: tarfile.TarInfo, destination: str,
                   root: str) -> None:
    if member.isdir():
        os.makedirs(destination, exist_ok=True)
        return
    if destination == root:
        raise IsADirectoryError(f"a file named {member.name!r} would be the archive's root")
    os.makedirs(os.path.dirname(destination), exist_ok=True)
    with archive.extractfile(member) as source, open(destination, "wb") as out:
        shutil.copyfileobj(source, out, _CHUNK)
        out.flush()
        os.fsync(out.fileno())


def _placements(from_path: str, staging: str, to_dir: str) -> list[tuple[str, str]]:
    """The renames that put the unpacked tree into ``to_dir``: a directory new there moves
    whole, one that exists is merged into, a file replaces a file.  A file where a
    directory stands (or the reverse) refuses the archive before anything moves."""
    moves, todo = [], [(staging, to_dir)]
    while todo:  # not recursive: an archive may nest deeper than Python's stack
        source_dir, destination_dir = todo.pop()
        for entry in sorted(os.listdir(source_dir)):
            source, destination = (os.path.join(source_dir, entry),
                                   os.path.join(destination_dir, entry))
            if not os.path.lexists(destination):
                moves.append((source, destination))
            elif os.path.isdir(source) != os.path.isdir(destination):
                member = os.path.relpath(source, staging)
                raise RuntimeError(f"{from_path}: member {member!r} would replace "
                                   f"{destination}, which is "
                                   f"{'not ' if os.path.isdir(source) else ''}a directory; "
                                   f"nothing was extracted")
            elif os.path.isdir(source):
                todo.append((source, destination))
            else:
                moves.append((source, destination))
    return moves


def extract_archive(from_path: str | os.PathLike, to_path: str | os.PathLike | None = None,
                    remove_finished: bool = False) -> str:
    """Unpack a ``.tar``/``.tar.gz``/``.tgz`` into the directory ``to_path``, or a ``.gz``
    into ``to_path/<name without .gz>``; returns ``to_path``."""
    from_path = os.fspath(from_path)
    to_path = os.path.dirname(from_path) if to_path is None else os.fspath(to_path)
    print(f"Extracting {from_path} to {to_path}")
    name = os.path.basename(from_path)
    if name.endswith((".tar", ".tar.gz", ".tgz")):
        _extract_tar(from_path, to_path)
    elif name.endswith(".gz"):
        _extract_gzip(from_path, os.path.join(to_path, name[:-len(".gz")]))
    else:
        raise RuntimeError(f"{from_path}: unknown archive type (expected .tar, .tar.gz, .tgz or .gz)")
    if remove_finished:
        os.remove(from_path)
    return to_path


def download_and_extract_archive(url: str, download_root: str | os.PathLike,
                                 extract_root: str | os.PathLike | None = None,
                                 filename: str | None = None, md5: str | None = None,
                                 remove_finished: bool = False) -> None:
    """``download_url`` then ``extract_archive`` (into ``download_root`` by default)."""
    download_root = os.path.expanduser(os.fspath(download_root))
    archive = download_url(url, download_root, filename, md5)
    extract_archive(archive, download_root if extract_root is None else extract_root,
                    remove_finished)
