"""Downloading the classic datasets: mirrors, MD5 checks, truncated transfers, files kept.

Every download goes to an HTTP server the test starts on 127.0.0.1, serving
files the test generates; the classes' ``mirrors``/``resources`` (MNIST) and
``url``/``filename``/``tgz_md5``/``train_list``/``test_list``/``meta`` (CIFAR)
are pointed at it as a user would point them at a local mirror.
"""

from __future__ import annotations

import gzip
import http.server
import io
import os
import shutil
import tarfile
import threading

import numpy as np
import pytest

from fastload.vision import CIFAR10, CIFAR100, MNIST, FashionMNIST
from fastload.vision.download import DownloadError, download_url, extract_archive
from classic_files import (MNIST_NAMES, cifar10_files, cifar100_files, cifar_lists, idx_bytes,
                           image_from_row, md5_of, mnist_arrays, tar_gz)


class FileServer:
    """Serves ``files`` (URL path -> bytes) on 127.0.0.1; ``mode[path]`` misbehaves:
    ``"truncate"`` declares the full length and closes halfway, ``"truncate-no-length"``
    sends half with no length, ``"corrupt"`` flips a byte; unknown paths get 404.
    ``requests`` lists the paths asked for."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.mode: dict[str, str] = {}
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                server.requests.append(self.path)
                data = server.files.get(self.path)
                if data is None:
                    self.send_error(404)
                    return
                mode = server.mode.get(self.path)
                if mode == "corrupt":
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                self.send_response(200)
                if mode != "truncate-no-length":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if mode in ("truncate", "truncate-no-length"):
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)
        self.thread.start()

    def url(self, prefix: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{prefix}/"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


@pytest.fixture
def server():
    files = FileServer()
    yield files
    files.close()


def _leftovers(directory) -> list[str]:
    """Temporary (hidden, .part) files a download left behind."""
    found = []
    for dirpath, _, names in os.walk(directory):
        found += [os.path.join(dirpath, n) for n in names if n.startswith(".") or ".part" in n]
    return found


@pytest.fixture
def mnist_mirror(server, monkeypatch):
    """The four MNIST archives on the server under /m1/ and /m2/; MNIST pointed at /m1/."""
    arrays = mnist_arrays()
    archives = {name + ".gz": gzip.compress(idx_bytes(array)) for name, array in arrays.items()}
    for prefix in ("m1", "m2"):
        for name, data in archives.items():
            server.files[f"/{prefix}/{name}"] = data
    monkeypatch.setattr(MNIST, "mirrors", [server.url("m1")])
    monkeypatch.setattr(MNIST, "resources", [(name, md5_of(data)) for name, data in archives.items()])
    return arrays, archives


@pytest.mark.timeout(60)
def test_mnist_download_then_load(tmp_path, server, mnist_mirror):
    arrays, archives = mnist_mirror
    ds = MNIST(tmp_path, download=True)
    np.testing.assert_array_equal(ds.data, arrays["train-images-idx3-ubyte"])
    assert ds.targets.tolist() == arrays["train-labels-idx1-ubyte"].tolist()
    raw = tmp_path / "MNIST" / "raw"
    for name in MNIST_NAMES:  # unpacked beside the archive, as torchvision leaves them
        assert (raw / name).read_bytes() == idx_bytes(arrays[name])
        assert (raw / (name + ".gz")).read_bytes() == archives[name + ".gz"]
    assert sorted(server.requests) == sorted(f"/m1/{name}" for name in archives)
    assert _leftovers(tmp_path) == []
    # Already present: nothing is fetched again, with or without the archives.
    server.requests.clear()
    MNIST(tmp_path, train=False, download=True)
    for name in archives:
        os.remove(raw / name)
    MNIST(tmp_path, download=True)
    assert server.requests == []


@pytest.mark.timeout(60)
def test_mnist_archive_present_is_unpacked_not_fetched(tmp_path, server, mnist_mirror):
    arrays, archives = mnist_mirror
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    (raw / "train-images-idx3-ubyte.gz").write_bytes(archives["train-images-idx3-ubyte.gz"])
    (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(b"a damaged archive")
    MNIST(tmp_path, download=True)
    assert "/m1/train-images-idx3-ubyte.gz" not in server.requests
    assert "/m1/t10k-labels-idx1-ubyte.gz" in server.requests  # wrong MD5: fetched again
    assert (raw / "t10k-labels-idx1-ubyte.gz").read_bytes() == archives["t10k-labels-idx1-ubyte.gz"]


@pytest.mark.timeout(60)
def test_mnist_next_mirror_when_one_fails(tmp_path, server, mnist_mirror, monkeypatch):
    arrays, archives = mnist_mirror
    # A mirror that answers 404, one that serves a truncated file, one that refuses
    # connections (a port just closed), then a good one.
    probe = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    closed = f"http://127.0.0.1:{probe.server_address[1]}/"
    probe.server_close()
    for name in archives:
        server.files[f"/cut/{name}"] = archives[name]
        server.mode[f"/cut/{name}"] = "truncate"
    monkeypatch.setattr(MNIST, "mirrors", [server.url("gone"), server.url("cut"), closed,
                                           server.url("m2")])
    ds = MNIST(tmp_path, download=True)
    np.testing.assert_array_equal(ds.data, arrays["train-images-idx3-ubyte"])
    first = "train-images-idx3-ubyte.gz"
    assert server.requests[:3] == [f"/gone/{first}", f"/cut/{first}", f"/m2/{first}"]
    assert _leftovers(tmp_path) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode, message", [
    ("corrupt", "has MD5"),
    ("truncate", "cut short"),
    ("truncate-no-length", "has MD5"),
])
def test_mnist_failed_download_leaves_no_complete_looking_file(tmp_path, server, mnist_mirror,
                                                               mode, message):
    arrays, archives = mnist_mirror
    bad = "t10k-images-idx3-ubyte.gz"
    server.mode[f"/m1/{bad}"] = mode
    with pytest.raises(RuntimeError, match=f"Error downloading {bad}") as error:
        MNIST(tmp_path, download=True)
    assert message in str(error.value)
    assert f"{server.url('m1')}{bad}" in str(error.value)  # the URL
    raw = tmp_path / "MNIST" / "raw"
    assert str(raw / bad) in str(error.value)  # the file
    assert not (raw / bad).exists() and not (raw / bad[:-3]).exists()
    assert _leftovers(tmp_path) == []
    with pytest.raises(RuntimeError, match="Dataset not found"):
        MNIST(tmp_path, train=False)
    # The files that did arrive are kept; a later download fetches only the missing ones
    # (the failed file, and the one after it, never reached).
    server.mode.clear()
    server.requests.clear()
    MNIST(tmp_path, train=False, download=True)
    assert server.requests == [f"/m1/{bad}", "/m1/t10k-labels-idx1-ubyte.gz"]


@pytest.mark.timeout(60)
def test_fashion_mnist_downloads_into_its_own_folder(tmp_path, server, mnist_mirror, monkeypatch):
    _, archives = mnist_mirror
    monkeypatch.setattr(FashionMNIST, "mirrors", [server.url("m2")])
    monkeypatch.setattr(FashionMNIST, "resources", MNIST.resources)
    ds = FashionMNIST(tmp_path, download=True)
    assert ds.raw_folder == str(tmp_path / "FashionMNIST" / "raw")
    assert all(r.startswith("/m2/") for r in server.requests)


@pytest.fixture
def cifar_mirror(server, monkeypatch):
    files, truth = cifar10_files()
    archive = tar_gz("cifar-10-batches-py", files)
    server.files["/kriz/cifar-10-python.tar.gz"] = archive
    monkeypatch.setattr(CIFAR10, "url", server.url("kriz") + "cifar-10-python.tar.gz")
    monkeypatch.setattr(CIFAR10, "tgz_md5", md5_of(archive))
    for name, value in cifar_lists(CIFAR10, files).items():
        monkeypatch.setattr(CIFAR10, name, value)
    return files, truth, archive


@pytest.mark.timeout(60)
def test_cifar_download_then_load(tmp_path, server, cifar_mirror):
    files, truth, archive = cifar_mirror
    ds = CIFAR10(tmp_path, download=True)
    rows, labels = truth["train"]
    assert ds.targets == labels
    np.testing.assert_array_equal(ds.data[7], image_from_row(rows[7]))
    assert (tmp_path / "cifar-10-python.tar.gz").read_bytes() == archive
    for name, data in files.items():
        assert (tmp_path / "cifar-10-batches-py" / name).read_bytes() == data
    assert server.requests == ["/kriz/cifar-10-python.tar.gz"]
    CIFAR10(tmp_path, train=False, download=True)  # intact: not fetched again
    os.remove(tmp_path / "cifar-10-batches-py" / "data_batch_4")
    CIFAR10(tmp_path, download=True)  # the archive is there and intact: unpacked again
    assert server.requests == ["/kriz/cifar-10-python.tar.gz"]
    assert _leftovers(tmp_path) == []


@pytest.mark.timeout(60)
def test_cifar100_download(tmp_path, server, monkeypatch):
    files, truth = cifar100_files()
    archive = tar_gz("cifar-100-python", files)
    server.files["/c100/cifar-100-python.tar.gz"] = archive
    monkeypatch.setattr(CIFAR100, "url", server.url("c100") + "cifar-100-python.tar.gz")
    monkeypatch.setattr(CIFAR100, "tgz_md5", md5_of(archive))
    for name, value in cifar_lists(CIFAR100, files).items():
        monkeypatch.setattr(CIFAR100, name, value)
    ds = CIFAR100(tmp_path, train=False, download=True)
    assert ds.targets == truth["test"][1] and ds.classes == truth["classes"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode, message", [("corrupt", "has MD5"), ("truncate", "cut short"),
                                           ("truncate-no-length", "has MD5")])
def test_cifar_failed_download_leaves_nothing(tmp_path, server, cifar_mirror, mode, message):
    server.mode["/kriz/cifar-10-python.tar.gz"] = mode
    with pytest.raises(RuntimeError, match=message) as error:
        CIFAR10(tmp_path, download=True)
    assert CIFAR10.url in str(error.value)
    assert str(tmp_path / "cifar-10-python.tar.gz") in str(error.value)
    assert os.listdir(tmp_path) == []
    with pytest.raises(RuntimeError, match="Dataset not found or corrupted"):
        CIFAR10(tmp_path)


def test_download_url_errors_name_url_and_file(tmp_path, server):
    with pytest.raises(DownloadError) as error:
        download_url(server.url("nowhere") + "x.bin", tmp_path, "x.bin")
    assert server.url("nowhere") + "x.bin" in str(error.value)
    assert str(tmp_path / "x.bin") in str(error.value) and "404" in str(error.value)
    assert os.listdir(tmp_path) == []


def _tar(members: list[tuple[str, bytes | None]]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.SYMTYPE
                info.linkname = "/etc/passwd"
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize("members, message", [
    ([("../escaped", b"x")], "outside"),
    ([("/abs/escaped", b"x")], "outside"),
    ([("folder/link", None)], "not a regular file"),
])
def test_archives_that_reach_outside_are_refused(tmp_path, members, message):
    path = tmp_path / "bad.tar.gz"
    path.write_bytes(_tar(members))
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(RuntimeError, match=message) as error:
        extract_archive(path, target)
    assert str(path) in str(error.value)
    assert not (tmp_path / "escaped").exists() and not (target / "folder" / "link").exists()


def test_truncated_archives_are_errors_naming_them(tmp_path):
    archive = tar_gz("folder", {"a": os.urandom(300_000)})
    path = tmp_path / "cut.tar.gz"
    path.write_bytes(archive[:len(archive) // 2])
    with pytest.raises(RuntimeError, match="not a complete tar archive") as error:
        extract_archive(path, tmp_path)
    assert str(path) in str(error.value)
    assert not (tmp_path / "folder" / "a").exists() and _leftovers(tmp_path) == []
    gz = tmp_path / "x.gz"
    gz.write_bytes(gzip.compress(os.urandom(100_000))[:-1000])
    with pytest.raises(RuntimeError, match="not a complete gzip file") as error:
        extract_archive(gz)
    assert str(gz) in str(error.value) and not (tmp_path / "x").exists()


@pytest.mark.timeout(60)
def test_mnist_mirror_of_plain_files(tmp_path, server, monkeypatch):
    # A local mirror may hold the unpacked files: they are fetched as they are.
    arrays = mnist_arrays()
    for name, array in arrays.items():
        server.files[f"/plain/{name}"] = idx_bytes(array)
    monkeypatch.setattr(MNIST, "mirrors", [server.url("plain")])
    monkeypatch.setattr(MNIST, "resources", [(name, md5_of(idx_bytes(array)))
                                             for name, array in arrays.items()])
    ds = MNIST(tmp_path, train=False, download=True)
    np.testing.assert_array_equal(ds.data, arrays["t10k-images-idx3-ubyte"])
    assert sorted(os.listdir(tmp_path / "MNIST" / "raw")) == sorted(MNIST_NAMES)


# -- tar archives: all or nothing -------------------------------------------


def _special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, linkname
    return info


def _archive(path, members: list) -> str:
    """A .tar.gz of ``members``: ``(name, bytes)`` files, ``(name, None)`` directories,
    and TarInfo for anything else."""
    with tarfile.open(path, "w:gz") as archive:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                archive.addfile(member)
                continue
            name, data = member
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return str(path)


def _tree(directory) -> dict[str, bytes | None]:
    """Every path under ``directory`` (hidden ones too), files with their bytes."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(directory):
        for name in dirnames:
            found[os.path.relpath(os.path.join(dirpath, name), directory)] = None
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as f:
                found[os.path.relpath(os.path.join(dirpath, name), directory)] = f.read()
    return found


GOOD_MEMBERS = [("folder", None), ("folder/a", b"first"), ("folder/deep/b", b"second" * 1000)]


@pytest.mark.parametrize("bad, message", [
    (("../evil", b"x"), "outside"),
    (("folder/../../evil", b"x"), "outside"),
    (("/tmp/evil", b"x"), "outside"),
    (_special("folder/link", tarfile.SYMTYPE, "/etc/passwd"), "not a regular file"),
    (_special("folder/hard", tarfile.LNKTYPE, "../../etc/passwd"), "not a regular file"),
    (_special("folder/dev", tarfile.CHRTYPE), "not a regular file"),
    (_special("folder/fifo", tarfile.FIFOTYPE), "not a regular file"),
])
def test_a_refused_member_leaves_the_destination_as_it_was(tmp_path, bad, message):
    target = tmp_path / "out"
    (target / "folder").mkdir(parents=True)
    (target / "folder" / "a").write_bytes(b"kept")
    (target / "other").write_bytes(b"untouched")
    before = _tree(tmp_path)
    path = _archive(tmp_path / "bad.tar.gz", GOOD_MEMBERS + [bad] + [("folder/after", b"z")])
    before["bad.tar.gz"] = (tmp_path / "bad.tar.gz").read_bytes()
    with pytest.raises(RuntimeError, match=message) as error:
        extract_archive(path, target)
    name = bad.name if isinstance(bad, tarfile.TarInfo) else bad[0]
    assert path in str(error.value) and repr(name) in str(error.value)
    assert "nothing was extracted" in str(error.value)
    assert _tree(tmp_path) == before  # no member, no temporary directory, no evil
    assert not os.path.exists("/tmp/evil")


def test_a_refused_archive_does_not_create_the_destination(tmp_path):
    path = _archive(tmp_path / "bad.tar.gz", GOOD_MEMBERS + [("../evil", b"x")])
    with pytest.raises(RuntimeError, match="outside"):
        extract_archive(path, tmp_path / "new" / "out")
    assert sorted(os.listdir(tmp_path)) == ["bad.tar.gz"]


def test_a_good_archive_extracts_completely_and_merges(tmp_path):
    target = tmp_path / "out"
    (target / "folder").mkdir(parents=True)
    (target / "folder" / "a").write_bytes(b"old")
    (target / "folder" / "mine").write_bytes(b"mine")
    members = GOOD_MEMBERS + [("./folder/empty", None), ("top", b"t"), ("folder/a", b"last wins")]
    extract_archive(_archive(tmp_path / "good.tar.gz", members), target)
    assert _tree(target) == {"folder": None, "folder/a": b"last wins", "folder/mine": b"mine",
                             "folder/deep": None, "folder/deep/b": b"second" * 1000,
                             "folder/empty": None, "top": b"t"}


def test_a_member_that_would_replace_a_directory_moves_nothing(tmp_path):
    target = tmp_path / "out"
    (target / "top").mkdir(parents=True)
    (target / "top" / "x").write_bytes(b"x")
    before = _tree(target)
    path = _archive(tmp_path / "clash.tar.gz", GOOD_MEMBERS + [("top", b"a file")])
    with pytest.raises(RuntimeError, match="'top' would replace") as error:
        extract_archive(path, target)
    assert path in str(error.value)
    assert _tree(target) == before


@pytest.mark.parametrize("stage", ["unpacking", "moving"])
def test_an_interrupted_extraction_leaves_nothing_half_written(tmp_path, monkeypatch, stage):
    import fastload.vision.download as download
    target = tmp_path / "out"
    target.mkdir()
    path = _archive(tmp_path / "a.tar.gz", GOOD_MEMBERS + [("z", b"the last")])
    calls = []

    def interrupted(real):
        def call(*args, **kwargs):
            calls.append(args)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return real(*args, **kwargs)
        return call
    if stage == "unpacking":
        monkeypatch.setattr(download.shutil, "copyfileobj", interrupted(shutil.copyfileobj))
    else:
        monkeypatch.setattr(download.os, "replace", interrupted(os.replace))
    with pytest.raises(KeyboardInterrupt):
        extract_archive(path, target)
    monkeypatch.undo()
    left = _tree(target)
    # Unpacking: nothing moved.  Moving: what moved is whole (here the first
    # top-level entry, "folder", renamed at once), and no temporary directory stays.
    folder = {"folder": None, "folder/a": b"first", "folder/deep": None,
              "folder/deep/b": b"second" * 1000}
    assert left == ({} if stage == "unpacking" else folder)
    extract_archive(path, target)  # a later run completes it
    assert _tree(target) == dict(folder, z=b"the last")
