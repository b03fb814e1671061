"""``CIFAR10`` and ``CIFAR100``: torchvision's classes, read from the python pickle batches.

The layout is torchvision's: ``root/cifar-10-batches-py/`` (``data_batch_1``
.. ``data_batch_5``, ``test_batch``, ``batches.meta``) and
``root/cifar-100-python/`` (``train``, ``test``, ``meta``); each file's MD5 is
checked as torchvision checks it.  A batch is a pickled dict whose ``data`` is
a uint8 ``(N, 3072)`` array (each row the red, green and blue 32x32 planes)
with ``labels`` (or ``fine_labels``); keys may be str or bytes.  ``data`` is a
uint8 ``(N, 32, 32, 3)`` array, ``targets`` a list of ints, and a sample is
``(PIL image of mode "RGB", int)`` before transforms.

The pickles are read opcode by opcode (``plain_pickle``), never run: plain
Python values and numpy arrays of numeric dtypes are built, anything else
(another global, an object or structured dtype, an array claiming more bytes
than the file holds) raises ``ValueError`` naming the file.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from .download import calculate_md5, check_integrity, download_and_extract_archive
from .image_batches import InMemoryImages
from .plain_pickle import read_plain_pickle

__all__ = ["CIFAR10", "CIFAR100"]


def load_batch(path: str) -> dict[str, Any]:
    """A CIFAR pickle as a dict with str keys (latin-1 for Python 2's strings, as torchvision).

    Read by ``read_plain_pickle``, which runs nothing from the file; a file that
    is not made of plain values and numeric arrays raises ``ValueError`` naming it.
    """
    with open(path, "rb") as f:
        data = f.read()
    try:
        entry = read_plain_pickle(data)
    except pickle.UnpicklingError as error:
        raise ValueError(f"{path}: not a readable CIFAR pickle ({error})") from error
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: a CIFAR pickle holds a dict, found {type(entry).__name__}")
    if not all(isinstance(key, (str, bytes)) for key in entry):
        raise ValueError(f"{path}: a CIFAR pickle's keys are strings")
    return {(key.decode("latin1") if isinstance(key, bytes) else key): value
            for key, value in entry.items()}


def _batch_arrays(path: str) -> tuple[np.ndarray, list]:
    """``(data (N, 3072) uint8, labels)`` of one batch file, checked."""
    entry = load_batch(path)
    data = entry.get("data")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != 3 * 32 * 32:
        found = "no 'data'" if data is None else (
            f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__)
        raise ValueError(f"{path}: 'data' must be a uint8 array of shape (N, 3072), found {found}")
    labels = entry["labels"] if "labels" in entry else entry.get("fine_labels")
    if labels is None:
        raise ValueError(f"{path}: no 'labels' or 'fine_labels' (keys: {sorted(entry)})")
    if not isinstance(labels, (list, tuple, np.ndarray)):
        raise ValueError(f"{path}: labels must be a list of ints, found {type(labels).__name__}")
    labels = list(labels)
    if not all(isinstance(label, (int, np.integer)) for label in labels):
        raise ValueError(f"{path}: labels must be ints")
    if len(labels) != len(data):
        raise ValueError(f"{path}: {len(labels)} labels for {len(data)} images")
    return data, labels


class CIFAR10(InMemoryImages):
    """`CIFAR-10 <https://www.cs.toronto.edu/~kriz/cifar.html>`_, as ``torchvision.datasets.CIFAR10``.

    Args:
        root: the directory holding ``base_folder``.
        train: the training batches (``train_list``) or else the test batch.
        transform: applied to each PIL image.
        target_transform: applied to each target.
        download: fetch ``url`` (``filename``, MD5 ``tgz_md5``) into ``root`` and
            unpack it, unless the files are already there and intact.
    """

    base_folder = "cifar-10-batches-py"
    url = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    filename = "cifar-10-python.tar.gz"
    tgz_md5 = "c58f30108f718f92721af3b95e74349a"
    train_list = [
        ["data_batch_1", "c99cafc152244af753f735de768cd75f"],
        ["data_batch_2", "d4bba439e000b95fd0a9bffe97cbabec"],
        ["data_batch_3", "54ebc095f3ab1f0389bbae665268c751"],
        ["data_batch_4", "634d18415352ddfa80567beed471001a"],
        ["data_batch_5", "482c414d41f54cd18b22e5b47cb7c3cb"],
    ]
    test_list = [
        ["test_batch", "40351d587109b95175f43aff81a1287e"],
    ]
    meta = {
        "filename": "batches.meta",
        "key": "label_names",
        "md5": "5ff9c542aee3614f3951f8cda6e48888",
    }

    _channels = 3
    _int_targets = False

    def __init__(self, root: str | os.PathLike, train: bool = True,
                 transform: Callable | None = None, target_transform: Callable | None = None,
                 download: bool = False) -> None:
        super().__init__(root, transform=transform, target_transform=target_transform)
        self.train = train
        if download:
            self.download()
        problems = self._integrity_problems()
        if problems:
            raise RuntimeError("Dataset not found or corrupted. You can use download=True to "
                               "download it (in " + os.path.join(self.root, self.base_folder)
                               + ": " + "; ".join(problems) + ")")
        parts, self.targets = [], []
        for file_name, _ in (self.train_list if self.train else self.test_list):
            data, labels = _batch_arrays(os.path.join(self.root, self.base_folder, file_name))
            parts.append(data)
            self.targets.extend(labels)
        # Stored (N, 3, 32, 32) plane by plane; torchvision's data is the (N, 32, 32, 3)
        # view of that, here made contiguous for the batch kernel.
        stacked = np.concatenate(parts) if parts else np.empty((0, 3072), np.uint8)
        self.data = np.ascontiguousarray(stacked.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        self._load_meta()

    def _load_meta(self) -> None:
        path = os.path.join(self.root, self.base_folder, self.meta["filename"])
        if not check_integrity(path, self.meta["md5"]):
            raise RuntimeError("Dataset metadata file not found or corrupted. You can use "
                               f"download=True to download it ({path})")
        entry = load_batch(path)
        key = self.meta["key"]
        if key not in entry:
            raise ValueError(f"{path}: no {key!r} (keys: {sorted(entry)})")
        names = entry[key]
        if not isinstance(names, (list, tuple)) or not all(
                isinstance(name, (str, bytes)) for name in names):
            raise ValueError(f"{path}: {key!r} must be a list of strings")
        self.classes = [name.decode("utf-8", "replace") if isinstance(name, bytes) else name
                        for name in names]
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        """``(image, target)``: a PIL image of mode ``RGB`` (then ``transform``), and the target."""
        img, target = self.data[index], self.targets[index]
        img = Image.fromarray(np.asarray(img))
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    def _integrity_problems(self) -> list[str]:
        """What is wrong with the batch files, one phrase per file (empty: all intact)."""
        problems = []
        for file_name, md5 in self.train_list + self.test_list:
            path = os.path.join(self.root, self.base_folder, file_name)
            if not os.path.isfile(path):
                problems.append(f"{file_name} is missing")
            elif md5 is not None:
                actual = calculate_md5(path)
                if actual != md5:
                    problems.append(f"{file_name} has MD5 {actual}, expected {md5}")
        return problems

    def _check_integrity(self) -> bool:
        return not self._integrity_problems()

    def download(self) -> None:
        """Fetch ``url`` into ``root`` and unpack it, unless the batches are already intact."""
        if self._check_integrity():
            return
        download_and_extract_archive(self.url, self.root, filename=self.filename, md5=self.tgz_md5)

    def extra_repr(self) -> str:
        return f"Split: {'Train' if self.train is True else 'Test'}"


CIFAR10._plain_getitem = CIFAR10.__getitem__


class CIFAR100(CIFAR10):
    """`CIFAR-100 <https://www.cs.toronto.edu/~kriz/cifar.html>`_, as torchvision's: CIFAR-10's
    format with ``fine_labels`` as targets and ``fine_label_names`` as classes."""

    base_folder = "cifar-100-python"
    url = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
    filename = "cifar-100-python.tar.gz"
    tgz_md5 = "eb9058c3a382ffc7106e4002c42a8d85"
    train_list = [
        ["train", "16019d7e3df5f24257cddd939b257f8d"],
    ]
    test_list = [
        ["test", "f0ef6b0ae62326f3e7ffdfab6717acfc"],
    ]
    meta = {
        "filename": "meta",
        "key": "fine_label_names",
        "md5": "7973b15100ade9c7d40fb424638fde48",
    }
