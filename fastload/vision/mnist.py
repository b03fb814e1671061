"""``MNIST`` and ``FashionMNIST``: torchvision's classes, read from the IDX files.

The layout is torchvision's: ``root/<ClassName>/raw/`` holding
``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte`` (each also found
as the published ``.gz``).  ``data`` is a uint8 ``(N, 28, 28)`` array,
``targets`` an int64 array (torchvision has tensors), and a sample is
``(PIL image of mode "L", int)`` before transforms.  With ``ToArray()`` (then
``Normalize``) as the transform, the DataLoader gathers whole batches from
``data`` (see ``image_batches``).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image

from .download import DownloadError, check_integrity, download_url, extract_archive
from .idx import read_image_file, read_label_file
from .image_batches import InMemoryImages

__all__ = ["MNIST", "FashionMNIST"]


class MNIST(InMemoryImages):
    """`MNIST <http://yann.lecun.com/exdb/mnist/>`_, as ``torchvision.datasets.MNIST``.

    Args:
        root: the directory holding ``MNIST/raw/`` (for a subclass, ``<ClassName>/raw/``).
        train: the training set (``train-*``) or else the test set (``t10k-*``).
        transform: applied to each PIL image.
        target_transform: applied to each target (an int).
        download: fetch the files from ``mirrors`` first (each of ``resources``,
            MD5-checked), unless they are already there.
    """

    mirrors = [
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "http://yann.lecun.com/exdb/mnist/",
    ]
    resources = [
        ("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
        ("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"),
        ("t10k-images-idx3-ubyte.gz", "9fb629c4189551a2d022fa330f9573f3"),
        ("t10k-labels-idx1-ubyte.gz", "ec29112dd5afa0611ce80d1b7f02629c"),
    ]
    training_file = "training.pt"
    test_file = "test.pt"
    classes = ["0 - zero", "1 - one", "2 - two", "3 - three", "4 - four",
               "5 - five", "6 - six", "7 - seven", "8 - eight", "9 - nine"]

    _channels = 1
    _int_targets = True

    def __init__(self, root: str | os.PathLike, train: bool = True,
                 transform: Callable | None = None, target_transform: Callable | None = None,
                 download: bool = False) -> None:
        super().__init__(root, transform=transform, target_transform=target_transform)
        self.train = train
        if download:
            self.download()
        missing = self._missing_files()
        if missing:
            raise RuntimeError(f"Dataset not found. You can use download=True to download it "
                               f"(looked in {self.raw_folder} for {', '.join(missing)}, "
                               f"plain or .gz)")
        self.data, self.targets = self._load_data()

    def _load_data(self) -> tuple[np.ndarray, np.ndarray]:
        prefix = "train" if self.train else "t10k"
        images = read_image_file(self._stored(f"{prefix}-images-idx3-ubyte"))
        labels_path = self._stored(f"{prefix}-labels-idx1-ubyte")
        labels = read_label_file(labels_path)
        if len(labels) != len(images):
            raise ValueError(f"{labels_path}: {len(labels)} labels for {len(images)} images")
        return images, labels

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        """``(image, target)``: a PIL image of mode ``L`` (then ``transform``), and an int."""
        img, target = self.data[index], int(self.targets[index])
        img = Image.fromarray(np.asarray(img), mode="L")
        if self.transform is not None:
            img = self.transform(img)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return img, target

    @property
    def raw_folder(self) -> str:
        return os.path.join(self.root, self.__class__.__name__, "raw")

    @property
    def processed_folder(self) -> str:
        return os.path.join(self.root, self.__class__.__name__, "processed")

    @property
    def class_to_idx(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.classes)}

    # Legacy aliases torchvision keeps (with a warning there too).
    @property
    def train_labels(self) -> np.ndarray:
        warnings.warn("train_labels has been renamed targets")
        return self.targets

    @property
    def test_labels(self) -> np.ndarray:
        warnings.warn("test_labels has been renamed targets")
        return self.targets

    @property
    def train_data(self) -> np.ndarray:
        warnings.warn("train_data has been renamed data")
        return self.data

    @property
    def test_data(self) -> np.ndarray:
        warnings.warn("test_data has been renamed data")
        return self.data

    def _raw_names(self) -> list[str]:
        """The raw file names ``resources`` unpack to (``x.gz`` -> ``x``)."""
        names = []
        for filename, _ in self.resources:
            name = os.path.basename(filename)
            names.append(name[:-len(".gz")] if name.endswith(".gz") else name)
        return names

    def _stored(self, name: str) -> str:
        """The path of raw file ``name``: plain if present, else its ``.gz``."""
        plain = os.path.join(self.raw_folder, name)
        return plain if os.path.isfile(plain) or not os.path.isfile(plain + ".gz") else plain + ".gz"

    def _missing_files(self) -> list[str]:
        return [name for name in self._raw_names() if not os.path.isfile(self._stored(name))]

    def _check_exists(self) -> bool:
        return not self._missing_files()

    def download(self) -> None:
        """Fetch and unpack each of ``resources`` not yet unpacked in ``raw_folder`` (an
        archive already there with the right MD5 is only unpacked), from the first
        of ``mirrors`` that delivers it with the right MD5."""
        names = self._raw_names()
        if all(os.path.isfile(os.path.join(self.raw_folder, name)) for name in names):
            return
        os.makedirs(self.raw_folder, exist_ok=True)
        for (filename, md5), name in zip(self.resources, names):
            if os.path.isfile(os.path.join(self.raw_folder, name)):
                continue
            archive = os.path.join(self.raw_folder, filename)
            if not check_integrity(archive, md5):
                self._download_from_mirrors(filename, md5)
            if filename.endswith(".gz"):
                extract_archive(archive, self.raw_folder)

    def _download_from_mirrors(self, filename: str, md5: str | None) -> None:
        failures = []
        for mirror in self.mirrors:
            url = f"{mirror}{filename}"
            try:
                download_url(url, self.raw_folder, filename, md5)
                return
            except DownloadError as error:
                print(f"Failed to download (trying next):\n{error}\n")
                failures.append(str(error))
        raise RuntimeError(f"Error downloading {filename} to {self.raw_folder}: every mirror "
                           f"failed:\n" + "\n".join(failures))

    def extra_repr(self) -> str:
        return f"Split: {'Train' if self.train is True else 'Test'}"


MNIST._plain_getitem = MNIST.__getitem__


class FashionMNIST(MNIST):
    """`Fashion-MNIST <https://github.com/zalandoresearch/fashion-mnist>`_, as torchvision's:
    MNIST's format and arguments, under ``root/FashionMNIST/raw/``."""

    mirrors = ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"]
    resources = [
        ("train-images-idx3-ubyte.gz", "8d4fb7e6c68d591d4c3dfef9ec88bf0d"),
        ("train-labels-idx1-ubyte.gz", "25c81989df183df01b3e8a0aad5dffbe"),
        ("t10k-images-idx3-ubyte.gz", "bef4ecab320f06d8554ea6380940ec79"),
        ("t10k-labels-idx1-ubyte.gz", "bb300cfdad3c16e7a12a480ee83cd310"),
    ]
    classes = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
               "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
