"""Reference writers and readers of the classic datasets' published formats, for the tests.

Written from the format descriptions, not from fastload's code:

* IDX (yann.lecun.com/exdb/mnist): a big-endian int32 magic number
  0x00000803 (unsigned bytes, 3 dimensions) or 0x00000801 (1 dimension), one
  big-endian int32 per dimension, then the bytes, row-major.
* CIFAR python batches (cs.toronto.edu/~kriz/cifar.html): a pickled dict whose
  ``data`` is uint8 (N, 3072), each row the 1024 red values of the 32x32 image
  row by row, then the 1024 green, then the 1024 blue; ``labels`` (CIFAR-10)
  or ``fine_labels`` and ``coarse_labels`` (CIFAR-100); the meta file has
  ``label_names`` (CIFAR-10) or ``fine_label_names`` and
  ``coarse_label_names`` (CIFAR-100).  The published files were written by
  Python 2's cPickle, protocol 2, with numpy 1's arrays: ``python2_pickle``
  writes that form opcode by opcode (str as Python 2's byte strings).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import struct
import tarfile

import numpy as np

MNIST_NAMES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer",
                 "dog", "frog", "horse", "ship", "truck"]


def md5_of(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def file_md5(path) -> str:
    with open(path, "rb") as f:
        return md5_of(f.read())


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file of unsigned bytes holding ``array``."""
    assert array.dtype == np.uint8
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += b"".join(struct.pack(">i", d) for d in array.shape)
    return header + array.tobytes(order="C")


def read_idx_reference(data: bytes) -> np.ndarray:
    zero1, zero2, type_code, ndim = struct.unpack(">BBBB", data[:4])
    assert (zero1, zero2, type_code) == (0, 0, 0x08)
    dims = struct.unpack(">" + "i" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data[4 + 4 * ndim:], np.uint8).reshape(dims)


def mnist_arrays(n_train: int = 40, n_test: int = 12, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train-labels-idx1-ubyte": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test, dtype=np.uint8),
    }


def write_mnist(root, folder: str = "MNIST", gz: bool = False, **kwargs) -> dict[str, np.ndarray]:
    """Writes the four IDX files under ``root/folder/raw``; returns the arrays by file name."""
    arrays = mnist_arrays(**kwargs)
    raw = os.path.join(root, folder, "raw")
    os.makedirs(raw, exist_ok=True)
    for name, array in arrays.items():
        data = idx_bytes(array)
        if gz:
            with open(os.path.join(raw, name + ".gz"), "wb") as f:
                f.write(gzip.compress(data))
        else:
            with open(os.path.join(raw, name), "wb") as f:
                f.write(data)
    return arrays


def cifar_rows(images: np.ndarray) -> np.ndarray:
    """(N, 32, 32, 3) images as the (N, 3072) rows of the format: R plane, G plane, B plane."""
    return np.stack([images[..., c].reshape(len(images), 1024) for c in range(3)], axis=1
                    ).reshape(len(images), 3072)


def image_from_row(row: np.ndarray) -> np.ndarray:
    """One (3072,) row back to the (32, 32, 3) picture: pixel (y, x) of channel c is
    row[c * 1024 + y * 32 + x]."""
    out = np.empty((32, 32, 3), np.uint8)
    for c in range(3):
        for y in range(32):
            out[y, :, c] = row[c * 1024 + y * 32: c * 1024 + y * 32 + 32]
    return out


def _keyed(entry: dict, bytes_keys: bool) -> dict:
    return {k.encode() if bytes_keys else k: v for k, v in entry.items()}


class _Python2Pickler:
    """Protocol 2 as Python 2's cPickle writes it, for str (a byte string there), int,
    list, dict and numpy 1's ndarray; every container and string memoized (BINPUT)."""

    def __init__(self) -> None:
        self.out = [b"\x80\x02"]
        self.memo = 0

    def put(self) -> None:
        self.memo += 1
        self.out.append(b"q" + bytes([self.memo]) if self.memo < 256
                        else b"r" + struct.pack("<I", self.memo))

    def string(self, data: bytes) -> None:
        self.out.append(b"U" + bytes([len(data)]) + data if len(data) < 256
                        else b"T" + struct.pack("<i", len(data)) + data)
        self.put()

    def integer(self, value: int) -> None:
        self.out.append(b"K" + bytes([value]) if 0 <= value < 256 else
                        b"M" + struct.pack("<H", value) if 0 <= value < 65536 else
                        b"J" + struct.pack("<i", value))

    def batched(self, items: list, opcode: bytes) -> None:
        for start in range(0, len(items), 1000):  # cPickle's batch of APPENDS/SETITEMS
            self.out.append(b"(")
            for item in items[start:start + 1000]:
                self.value(item)
            self.out.append(opcode)

    def array(self, array: np.ndarray) -> None:
        self.out.append(b"cnumpy.core.multiarray\n_reconstruct\n")
        self.put()
        self.out.append(b"cnumpy\nndarray\n")
        self.put()
        self.out.append(b"K\x00\x85U\x01b\x87R")
        self.put()
        self.out.append(b"(K\x01")
        for d in array.shape:
            self.integer(d)
        self.out.append({1: b"\x85", 2: b"\x86", 3: b"\x87"}[array.ndim])
        self.out.append(b"cnumpy\ndtype\n")
        self.put()
        self.string(array.dtype.str[1:].encode())
        self.out.append(b"K\x00K\x01\x87R")
        self.put()
        self.out.append(b"(K\x03U\x01" + array.dtype.str[:1].encode()
                        + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89")
        self.string(array.tobytes())
        self.out.append(b"tb")

    def value(self, value) -> None:
        if isinstance(value, str):
            self.string(value.encode("latin-1"))
        elif isinstance(value, int):
            self.integer(value)
        elif isinstance(value, list):
            self.out.append(b"]")
            self.put()
            self.batched(value, b"e")
        elif isinstance(value, dict):
            self.out.append(b"}")
            self.put()
            self.batched([part for item in value.items() for part in item], b"u")
        elif isinstance(value, np.ndarray):
            self.array(value)
        else:
            raise TypeError(f"no Python 2 form for {type(value).__name__}")


def python2_pickle(value) -> bytes:
    pickler = _Python2Pickler()
    pickler.value(value)
    return b"".join(pickler.out) + b"."


def pickle_bytes(entry: dict, bytes_keys: bool = False, python2: bool = False) -> bytes:
    """A batch pickled as Python 3 writes protocol 2, or as the published files hold it."""
    return python2_pickle(entry) if python2 else pickle.dumps(_keyed(entry, bytes_keys),
                                                              protocol=2)


def cifar10_files(n_per_batch: int = 6, n_test: int = 5, seed: int = 1, bytes_keys: bool = False,
                  python2: bool = False) -> tuple[dict[str, bytes], dict]:
    """The files of ``cifar-10-batches-py`` (name -> bytes), and what they hold."""
    rng = np.random.default_rng(seed)
    files, truth = {}, {"train": ([], []), "test": ([], [])}
    for name in ["data_batch_%d" % i for i in range(1, 6)] + ["test_batch"]:
        count = n_test if name == "test_batch" else n_per_batch
        rows = rng.integers(0, 256, (count, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, count)]
        files[name] = pickle_bytes({"batch_label": name, "data": rows, "labels": labels,
                                    "filenames": [f"{name}_{i}.png" for i in range(count)]},
                                   bytes_keys, python2)
        split = truth["test" if name == "test_batch" else "train"]
        split[0].extend(rows)
        split[1].extend(labels)
    files["batches.meta"] = pickle_bytes({"label_names": CIFAR10_NAMES, "num_cases_per_batch":
                                          n_per_batch, "num_vis": 3072}, bytes_keys, python2)
    return files, truth


def cifar100_files(n_train: int = 14, n_test: int = 6, seed: int = 2, bytes_keys: bool = False,
                   python2: bool = False) -> tuple[dict[str, bytes], dict]:
    rng = np.random.default_rng(seed)
    files, truth = {}, {}
    for name, count in (("train", n_train), ("test", n_test)):
        rows = rng.integers(0, 256, (count, 3072), dtype=np.uint8)
        fine = [int(v) for v in rng.integers(0, 100, count)]
        coarse = [f // 5 for f in fine]
        files[name] = pickle_bytes({"filenames": [f"{i}.png" for i in range(count)],
                                    "batch_label": name, "fine_labels": fine,
                                    "coarse_labels": coarse, "data": rows}, bytes_keys, python2)
        truth[name] = (list(rows), fine)
    fine_names = [f"fine_{i:02d}" for i in range(100)]
    files["meta"] = pickle_bytes({"fine_label_names": fine_names,
                                  "coarse_label_names": [f"coarse_{i}" for i in range(20)]},
                                 bytes_keys, python2)
    truth["classes"] = fine_names
    return files, truth


def write_files(directory, files: dict[str, bytes]) -> None:
    os.makedirs(directory, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(directory, name), "wb") as f:
            f.write(data)


def tar_gz(folder: str, files: dict[str, bytes]) -> bytes:
    """A .tar.gz holding ``folder/`` and its files, as the CIFAR archives are laid out."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo(folder)
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        archive.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def install_cifar(cls, root, files: dict[str, bytes], monkeypatch) -> None:
    """Writes ``files`` under ``root/cls.base_folder`` and sets the class's MD5 table to
    them, as a user with a local copy would set it."""
    write_files(os.path.join(root, cls.base_folder), files)
    for name, value in cifar_lists(cls, files).items():
        monkeypatch.setattr(cls, name, value)


def cifar_lists(cls, files: dict[str, bytes]) -> dict:
    """Class attributes ``train_list``, ``test_list`` and ``meta`` with these files' MD5s."""
    return {
        "train_list": [[name, md5_of(files[name])] for name, _ in cls.train_list],
        "test_list": [[name, md5_of(files[name])] for name, _ in cls.test_list],
        "meta": dict(cls.meta, md5=md5_of(files[cls.meta["filename"]])),
    }
