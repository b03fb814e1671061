"""fastload.vision MNIST, FashionMNIST, CIFAR10, CIFAR100: torchvision's files, attributes,
samples and errors, and whole batches gathered from ``data`` equal to the per-sample path's.

Files are written by a reference writer built from the format descriptions
(``classic_files``); samples are checked against a reference reading of the
same bytes.  torchvision is not installed: torch's DataLoader runs over a
torch-side dataset doing what torchvision's does (a PIL image per sample, then
ToTensor and Normalize written with torch ops).
"""

from __future__ import annotations

import gzip
import os
import pickle

import numpy as np
import pytest
from PIL import Image

import fastload as fl
from fastload.vision import CIFAR10, CIFAR100, MNIST, FashionMNIST
from fastload.vision import transforms as T
from fastload.vision.image_batches import pixel_table
from classic_files import (CIFAR10_NAMES, MNIST_NAMES, cifar10_files, cifar100_files, cifar_lists,
                           idx_bytes, image_from_row, pickle_bytes, read_idx_reference,
                           write_files, write_mnist)

MNIST_NORM = T.Normalize((0.1307,), (0.3081,))
CIFAR_NORM = T.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))


@pytest.fixture
def cifar10_root(tmp_path, monkeypatch):
    """A CIFAR-10 folder of small batches; the class's MD5 table set to them, as a user
    with a local copy would set it."""
    files, truth = cifar10_files()
    write_files(tmp_path / "cifar-10-batches-py", files)
    for name, value in cifar_lists(CIFAR10, files).items():
        monkeypatch.setattr(CIFAR10, name, value)
    return tmp_path, truth


@pytest.fixture
def cifar100_root(tmp_path, monkeypatch):
    files, truth = cifar100_files()
    write_files(tmp_path / "cifar-100-python", files)
    for name, value in cifar_lists(CIFAR100, files).items():
        monkeypatch.setattr(CIFAR100, name, value)
    return tmp_path, truth


# -- MNIST ------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("cls, folder", [(MNIST, "MNIST"), (FashionMNIST, "FashionMNIST")])
def test_mnist_samples_match_the_files(tmp_path, cls, folder, gz):
    arrays = write_mnist(tmp_path, folder=folder, gz=gz)
    for train, prefix in ((True, "train"), (False, "t10k")):
        ds = cls(str(tmp_path), train=train)
        raw = os.path.join(str(tmp_path), folder, "raw")
        name = f"{prefix}-images-idx3-ubyte"
        path = os.path.join(raw, name + (".gz" if gz else ""))
        with (gzip.open if gz else open)(path, "rb") as f:
            images = read_idx_reference(f.read())
        labels = arrays[f"{prefix}-labels-idx1-ubyte"]
        assert len(ds) == len(images)
        assert ds.data.dtype == np.uint8 and ds.data.shape == images.shape
        assert ds.targets.dtype == np.int64 and ds.targets.tolist() == labels.tolist()
        for i in (0, 3, len(ds) - 1):
            img, target = ds[i]
            assert isinstance(img, Image.Image) and img.mode == "L" and img.size == (28, 28)
            np.testing.assert_array_equal(np.asarray(img), images[i])
            assert type(target) is int and target == labels[i]
        assert ds.train is train and ds.root == str(tmp_path)
        assert ds.raw_folder == raw
        assert ds.processed_folder == os.path.join(str(tmp_path), folder, "processed")
        assert ds.class_to_idx == {c: i for i, c in enumerate(cls.classes)}
    assert MNIST.classes[0] == "0 - zero" and FashionMNIST.classes[-1] == "Ankle boot"


def test_mnist_attributes_are_torchvisions():
    assert [name for name, _ in MNIST.resources] == [n + ".gz" for n in MNIST_NAMES]
    assert all(len(md5) == 32 for _, md5 in MNIST.resources + FashionMNIST.resources)
    assert MNIST.training_file == "training.pt" and MNIST.test_file == "test.pt"
    assert all(m.endswith("/") for m in MNIST.mirrors + FashionMNIST.mirrors)
    assert FashionMNIST.resources != MNIST.resources


def test_mnist_repr_is_torchvisions(tmp_path):
    write_mnist(tmp_path)
    assert repr(MNIST(tmp_path, train=False)) == (
        f"Dataset MNIST\n    Number of datapoints: 12\n    Root location: {tmp_path}\n"
        f"    Split: Test")
    ds = MNIST(str(tmp_path), transform=T.Compose([T.ToArray(), MNIST_NORM]),
               target_transform=int)
    assert repr(ds) == (
        f"Dataset MNIST\n    Number of datapoints: 40\n    Root location: {tmp_path}\n"
        f"    Split: Train\n    StandardTransform\n"
        f"Transform: Compose(\n"
        f"               ToArray()\n"
        f"               Normalize(mean=(0.1307,), std=(0.3081,))\n"
        f"           )\n"
        f"Target transform: {int!r}")


def test_mnist_missing_dataset_says_where_it_looked(tmp_path):
    with pytest.raises(RuntimeError, match="Dataset not found. You can use download=True to "
                                           "download it") as error:
        MNIST(tmp_path)
    assert os.path.join(str(tmp_path), "MNIST", "raw") in str(error.value)
    # One file of four missing is a missing dataset too, as torchvision checks all four.
    write_mnist(tmp_path)
    os.remove(tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte")
    with pytest.raises(RuntimeError, match="t10k-labels-idx1-ubyte"):
        MNIST(tmp_path, train=True)


def _corrupt(path, data):
    with open(path, "wb") as f:
        f.write(data)


@pytest.mark.parametrize("damage, message", [
    ("magic", "not an IDX file"),
    ("truncated", "disagree with the file's size"),
    ("longer", "disagree with the file's size"),
    ("dims", "disagree with the file's size"),
    ("header", "truncated IDX file"),
    ("labels_2d", "expected uint8 labels"),
])
def test_mnist_bad_idx_files_name_the_file(tmp_path, damage, message):
    arrays = write_mnist(tmp_path)
    raw = tmp_path / "MNIST" / "raw"
    images = idx_bytes(arrays["train-images-idx3-ubyte"])
    target = raw / "train-images-idx3-ubyte"
    if damage == "magic":
        _corrupt(target, b"\x00\x00\x07\x03" + images[4:])
    elif damage == "truncated":
        _corrupt(target, images[:-100])
    elif damage == "longer":
        _corrupt(target, images + b"\x00")
    elif damage == "dims":  # says 41 images where the file holds 40
        _corrupt(target, images[:4] + (41).to_bytes(4, "big") + images[8:])
    elif damage == "header":
        _corrupt(target, images[:10])
    else:
        target = raw / "train-labels-idx1-ubyte"
        _corrupt(target, idx_bytes(arrays["train-labels-idx1-ubyte"].reshape(4, 10)))
    with pytest.raises(ValueError, match=message) as error:
        MNIST(tmp_path)
    assert str(target) in str(error.value)


def test_mnist_truncated_gzip_and_label_count_name_the_file(tmp_path):
    arrays = write_mnist(tmp_path, gz=True)
    raw = tmp_path / "MNIST" / "raw"
    path = raw / "train-images-idx3-ubyte.gz"
    data = path.read_bytes()
    _corrupt(path, data[:len(data) // 2])
    with pytest.raises(ValueError, match="gzip|disagree") as error:
        MNIST(tmp_path)
    assert str(path) in str(error.value)
    _corrupt(path, data)
    labels = raw / "train-labels-idx1-ubyte.gz"
    _corrupt(labels, gzip.compress(idx_bytes(arrays["train-labels-idx1-ubyte"][:-1])))
    with pytest.raises(ValueError, match="39 labels for 40 images") as error:
        MNIST(tmp_path)
    assert str(labels) in str(error.value)


# -- CIFAR ------------------------------------------------------------------


@pytest.mark.parametrize("bytes_keys", [False, True])
def test_cifar10_samples_match_the_files(tmp_path, monkeypatch, bytes_keys):
    files, truth = cifar10_files(bytes_keys=bytes_keys)
    write_files(tmp_path / "cifar-10-batches-py", files)
    for name, value in cifar_lists(CIFAR10, files).items():
        monkeypatch.setattr(CIFAR10, name, value)
    for split in ("train", "test"):
        ds = CIFAR10(tmp_path, train=split == "train")
        rows, labels = truth[split]
        assert len(ds) == len(rows)
        assert ds.data.dtype == np.uint8 and ds.data.shape == (len(rows), 32, 32, 3)
        assert type(ds.targets) is list and ds.targets == labels
        assert ds.classes == CIFAR10_NAMES
        assert ds.class_to_idx == {c: i for i, c in enumerate(CIFAR10_NAMES)}
        for i in range(len(ds)):
            img, target = ds[i]
            assert isinstance(img, Image.Image) and img.mode == "RGB" and img.size == (32, 32)
            np.testing.assert_array_equal(np.asarray(img), image_from_row(rows[i]))
            assert type(target) is int and target == labels[i]
    assert repr(ds) == (f"Dataset CIFAR10\n    Number of datapoints: 5\n"
                        f"    Root location: {tmp_path}\n    Split: Test")


def test_cifar100_reads_fine_labels_and_names(cifar100_root):
    root, truth = cifar100_root
    ds = CIFAR100(root)
    rows, fine = truth["train"]
    assert ds.targets == fine and ds.classes == truth["classes"]
    for i in (0, len(ds) - 1):
        np.testing.assert_array_equal(np.asarray(ds[i][0]), image_from_row(rows[i]))
        assert ds[i][1] == fine[i]
    assert len(CIFAR100(root, train=False)) == 6


def test_cifar_attributes_are_torchvisions():
    assert CIFAR10.base_folder == "cifar-10-batches-py"
    assert CIFAR10.filename == "cifar-10-python.tar.gz" and CIFAR10.url.endswith(CIFAR10.filename)
    assert [n for n, _ in CIFAR10.train_list] == ["data_batch_%d" % i for i in range(1, 6)]
    assert CIFAR10.test_list[0][0] == "test_batch"
    assert CIFAR10.meta["filename"] == "batches.meta" and CIFAR10.meta["key"] == "label_names"
    assert CIFAR100.base_folder == "cifar-100-python" and CIFAR100.meta["key"] == "fine_label_names"
    assert [n for n, _ in CIFAR100.train_list] == ["train"] and len(CIFAR10.tgz_md5) == 32


def test_cifar_missing_or_corrupt_dataset(tmp_path, cifar10_root):
    with pytest.raises(RuntimeError, match="Dataset not found or corrupted. You can use "
                                           "download=True to download it") as error:
        CIFAR10(tmp_path / "elsewhere")
    assert os.path.join(str(tmp_path / "elsewhere"), "cifar-10-batches-py") in str(error.value)
    root, _ = cifar10_root
    batch = root / "cifar-10-batches-py" / "data_batch_3"
    batch.write_bytes(batch.read_bytes()[:-10])
    with pytest.raises(RuntimeError, match="data_batch_3 has MD5"):
        CIFAR10(root)


def test_cifar_missing_meta_says_so(cifar10_root):
    root, _ = cifar10_root
    os.remove(root / "cifar-10-batches-py" / "batches.meta")
    with pytest.raises(RuntimeError, match="Dataset metadata file not found or corrupted") as error:
        CIFAR10(root)
    assert "batches.meta" in str(error.value)


@pytest.mark.parametrize("entry, message", [
    ({"data": np.zeros((4, 3000), np.uint8), "labels": [0] * 4}, r"shape \(N, 3072\)"),
    ({"data": np.zeros((4, 3072), np.int16), "labels": [0] * 4}, "uint8"),
    ({"data": np.zeros((4, 3072), np.uint8)}, "no 'labels' or 'fine_labels'"),
    ({"labels": [0] * 4}, "no 'data'"),
    ({"data": np.zeros((4, 3072), np.uint8), "labels": [0] * 3}, "3 labels for 4 images"),
    ([1, 2, 3], "holds a dict"),
])
def test_cifar_bad_batches_name_the_file(tmp_path, monkeypatch, entry, message):
    files, _ = cifar10_files()
    files["data_batch_2"] = pickle.dumps(entry, protocol=2)
    write_files(tmp_path / "cifar-10-batches-py", files)
    for name, value in cifar_lists(CIFAR10, files).items():
        monkeypatch.setattr(CIFAR10, name, value)
    with pytest.raises(ValueError, match=message) as error:
        CIFAR10(tmp_path)
    assert str(tmp_path / "cifar-10-batches-py" / "data_batch_2") in str(error.value)


class _Alarm:
    def __reduce__(self):
        return (os.system, ("echo should-not-run",))


def test_cifar_pickle_naming_other_globals_is_refused(tmp_path, monkeypatch):
    files, _ = cifar10_files()
    files["test_batch"] = pickle.dumps({"data": _Alarm(), "labels": []}, protocol=2)
    files["data_batch_5"] = pickle_bytes({"data": np.zeros((1, 3072), np.uint8)})[:-20]
    write_files(tmp_path / "cifar-10-batches-py", files)
    for name, value in cifar_lists(CIFAR10, files).items():
        monkeypatch.setattr(CIFAR10, name, value)
    with pytest.raises(ValueError, match="refusing global") as error:
        CIFAR10(tmp_path, train=False)
    assert "test_batch" in str(error.value)
    with pytest.raises(ValueError, match="not a readable CIFAR pickle") as error:
        CIFAR10(tmp_path, train=True)
    assert "data_batch_5" in str(error.value)


# -- whole batches ----------------------------------------------------------


class PerSampleMNIST(MNIST):
    """MNIST whose __getitem__ is overridden: the loader must go sample by sample."""

    @property
    def raw_folder(self):  # a subclass's files are under its own name, as in torchvision
        return os.path.join(self.root, "MNIST", "raw")

    def __getitem__(self, index):
        return super().__getitem__(index)


class PerSampleCIFAR10(CIFAR10):
    def __getitem__(self, index):
        return super().__getitem__(index)


def test_pixel_table_recognises_only_batchable_chains():
    assert pixel_table(None, 1) is None
    assert pixel_table(T.ToArray(), 1) == (np.uint8, None)
    assert pixel_table(T.Compose([T.ToArray()]), 3) == (np.uint8, None)
    dtype, table = pixel_table(T.Compose([T.Compose([T.ToArray()]), MNIST_NORM, MNIST_NORM]), 1)
    assert dtype == np.float32 and table.shape == (1, 256)
    assert pixel_table(T.Compose([T.ToArray(), lambda a: a]), 1) is None
    assert pixel_table(T.Compose([T.CenterCrop(20), T.ToArray()]), 1) is None
    assert pixel_table(T.Compose([MNIST_NORM, T.ToArray()]), 1) is None
    assert pixel_table(T.Compose([T.ToArray(), CIFAR_NORM]), 1) is None  # 3 means, 1 channel

    class MyToArray(T.ToArray):
        def __call__(self, pic):
            return super().__call__(pic) // 2
    assert pixel_table(MyToArray(), 1) is None


TRANSFORMS = {
    "ToArray": lambda norm: T.ToArray(),
    "Normalize": lambda norm: T.Compose([T.ToArray(), norm]),
    "two Normalize": lambda norm: T.Compose([T.Compose([T.ToArray(), norm]),
                                             T.Normalize(0.25, 2.0)]),
}


def _batches(loader):
    return [(images.copy(), targets.copy()) for images, targets in loader]


def _assert_same_batches(ours, theirs):
    assert len(ours) == len(theirs)
    for (a_images, a_targets), (b_images, b_targets) in zip(ours, theirs):
        assert a_images.dtype == b_images.dtype and a_images.shape == b_images.shape
        # bit for bit: compare the bytes, so -0.0 and NaN would count too
        assert a_images.tobytes() == b_images.tobytes()
        assert a_targets.dtype == b_targets.dtype == np.int64
        np.testing.assert_array_equal(a_targets, b_targets)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
def test_mnist_whole_batches_equal_per_sample_batches(tmp_path, transform, num_workers):
    write_mnist(tmp_path, n_train=70)
    fast = MNIST(tmp_path, transform=TRANSFORMS[transform](MNIST_NORM))
    slow = PerSampleMNIST(tmp_path, transform=TRANSFORMS[transform](MNIST_NORM))
    assert fast._fastload_batch(np.arange(3)) is not None
    kwargs = dict(batch_size=16, shuffle=True, num_workers=num_workers)
    ours = _batches(fl.DataLoader(fast, generator=7, **kwargs))
    theirs = _batches(fl.DataLoader(slow, generator=7, **kwargs))
    _assert_same_batches(ours, theirs)
    expected = np.stack([np.asarray(fast[i][0]) for i in range(len(fast))])
    assert sum(len(t) for _, t in ours) == 70
    assert ours[0][0].shape[1:] == expected.shape[1:]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
def test_cifar_whole_batches_equal_per_sample_batches(tmp_path, monkeypatch, transform,
                                                      num_workers):
    files, _ = cifar10_files(n_per_batch=9)
    write_files(tmp_path / "cifar-10-batches-py", files)
    for name, value in cifar_lists(CIFAR10, files).items():
        monkeypatch.setattr(CIFAR10, name, value)
    fast = CIFAR10(tmp_path, transform=TRANSFORMS[transform](CIFAR_NORM))
    slow = PerSampleCIFAR10(tmp_path, transform=TRANSFORMS[transform](CIFAR_NORM))
    assert fast._fastload_batch(np.arange(3)) is not None
    kwargs = dict(batch_size=8, shuffle=True, num_workers=num_workers)
    _assert_same_batches(_batches(fl.DataLoader(fast, generator=3, **kwargs)),
                         _batches(fl.DataLoader(slow, generator=3, **kwargs)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_whole_batches_make_no_pil_images(tmp_path, monkeypatch, num_workers):
    write_mnist(tmp_path)
    ds = MNIST(tmp_path, transform=T.Compose([T.ToArray(), MNIST_NORM]))
    reference = _batches(fl.DataLoader(PerSampleMNIST(tmp_path, transform=ds.transform),
                                       batch_size=10))

    def no_images(*args, **kwargs):
        raise AssertionError("a PIL image was made on the whole-batch path")
    monkeypatch.setattr(Image, "fromarray", no_images)  # forked workers inherit it
    ours = _batches(fl.DataLoader(ds, batch_size=10, num_workers=num_workers,
                                  multiprocessing_context="fork" if num_workers else None))
    _assert_same_batches(ours, reference)
    # A Subset (random_split's kind) of the dataset is gathered whole too.
    part = fl.Subset(ds, [5, 1, 30, 2, 2])
    (images, targets), = _batches(fl.DataLoader(part, batch_size=5, num_workers=num_workers))
    np.testing.assert_array_equal(targets, ds.targets[[5, 1, 30, 2, 2]])
    np.testing.assert_array_equal(images[2], reference[3][0][0])


def test_per_sample_path_when_the_batch_path_does_not_apply(tmp_path, monkeypatch):
    write_mnist(tmp_path)
    # A target_transform, or a transform that is not ToArray/Normalize: sample by sample.
    ds = MNIST(tmp_path, transform=T.ToArray(), target_transform=lambda t: t + 100)
    assert ds._fastload_batch(np.arange(4)) is None
    images, targets = next(iter(fl.DataLoader(ds, batch_size=4)))
    assert targets.tolist() == [int(t) + 100 for t in ds.targets[:4]]
    ds = MNIST(tmp_path, transform=T.Compose([T.CenterCrop(20), T.ToArray()]))
    images, _ = next(iter(fl.DataLoader(ds, batch_size=4)))
    assert images.shape == (4, 1, 20, 20)
    np.testing.assert_array_equal(images[1, 0], ds.data[1, 4:24, 4:24])
    # No transform: PIL images, which default_collate refuses, as torch's does.
    with pytest.raises(TypeError, match="PIL"):
        next(iter(fl.DataLoader(MNIST(tmp_path), batch_size=4)))
    # A Normalize that cannot apply raises its own error from the per-sample path.
    ds = MNIST(tmp_path, transform=T.Compose([T.ToArray(), CIFAR_NORM]))
    with pytest.raises(RuntimeError, match="mean"):
        next(iter(fl.DataLoader(ds, batch_size=4)))


def test_whole_batches_follow_changes_to_data_and_targets(tmp_path, cifar10_root):
    write_mnist(tmp_path)
    ds = MNIST(tmp_path, transform=T.ToArray())
    ds.data, ds.targets = ds.data[10:20], ds.targets[10:20].copy()
    ds.targets[0] = 9
    images, targets = next(iter(fl.DataLoader(ds, batch_size=20)))
    assert images.shape == (10, 1, 28, 28) and targets[0] == 9
    np.testing.assert_array_equal(images[:, 0], ds.data)
    root, _ = cifar10_root
    cifar = CIFAR10(root, transform=T.ToArray())
    cifar.targets[3] = 7
    _, targets = next(iter(fl.DataLoader(cifar, batch_size=5)))
    assert targets[3] == 7
    cifar.targets[2] = np.int32(4)  # a numpy scalar: the batch is made sample by sample
    _, targets = next(iter(fl.DataLoader(cifar, batch_size=5)))
    assert targets[2] == 4 and cifar._fastload_batch(np.arange(5)) is None
    with pytest.raises(IndexError):
        next(iter(fl.DataLoader(cifar, sampler=[0, 1, 500], batch_size=3)))


# -- against torch's DataLoader ---------------------------------------------


def _torch_reference(torch, data, targets, mode, mean, std, as_int):
    """What torchvision's dataset does: a PIL image per sample, then ToTensor and
    Normalize, written with torch ops."""
    mean_t = torch.tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(-1, 1, 1)

    class Reference(torch.utils.data.Dataset):
        def __len__(self):
            return len(data)

        def __getitem__(self, index):
            img = Image.fromarray(data[index], mode=mode)
            pixels = torch.from_numpy(np.array(img, np.uint8, copy=True))
            if pixels.ndim == 2:
                pixels = pixels.unsqueeze(-1)
            tensor = pixels.permute(2, 0, 1).contiguous().to(torch.float32).div(255)
            tensor = tensor.sub_(mean_t).div_(std_t)
            target = int(targets[index]) if as_int else targets[index]
            return tensor, target

    return Reference()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_mnist_batches_equal_torch_dataloader(torch, tmp_path, num_workers):
    write_mnist(tmp_path, n_train=50)
    ds = MNIST(tmp_path, transform=T.Compose([T.ToArray(), MNIST_NORM]))
    reference = _torch_reference(torch, ds.data, ds.targets, "L", (0.1307,), (0.3081,), True)
    order = np.random.default_rng(0).permutation(50).tolist()
    ours = list(fl.DataLoader(ds, batch_size=16, sampler=order, num_workers=num_workers))
    theirs = list(torch.utils.data.DataLoader(reference, batch_size=16, sampler=order,
                                              num_workers=num_workers))
    assert len(ours) == len(theirs) == 4
    for (images, targets), (t_images, t_targets) in zip(ours, theirs):
        assert images.dtype == np.float32 and images.tobytes() == t_images.numpy().tobytes()
        assert targets.dtype == np.int64 and targets.tolist() == t_targets.tolist()
        assert t_targets.dtype == torch.int64


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_cifar_batches_equal_torch_dataloader(torch, cifar10_root, num_workers):
    root, _ = cifar10_root
    mean, std = CIFAR_NORM.mean, CIFAR_NORM.std
    ds = CIFAR10(root, transform=T.Compose([T.ToArray(), CIFAR_NORM]))
    reference = _torch_reference(torch, ds.data, ds.targets, "RGB", mean, std, False)
    ours = list(fl.DataLoader(ds, batch_size=7, num_workers=num_workers))
    theirs = list(torch.utils.data.DataLoader(reference, batch_size=7, num_workers=num_workers))
    assert len(ours) == len(theirs) == 5
    for (images, targets), (t_images, t_targets) in zip(ours, theirs):
        assert images.shape == tuple(t_images.shape) == (len(targets), 3, 32, 32)
        assert images.tobytes() == t_images.numpy().tobytes()
        assert targets.tolist() == t_targets.tolist() and targets.dtype == np.int64


def test_torch_dataloader_runs_over_fastload_datasets(torch, tmp_path):
    # Code written for torchvision runs unchanged under torch's own loader too.
    write_mnist(tmp_path)
    ds = MNIST(tmp_path, transform=T.Compose([T.ToArray(), MNIST_NORM]))
    images, targets = next(iter(torch.utils.data.DataLoader(ds, batch_size=8)))
    ours, our_targets = next(iter(fl.DataLoader(ds, batch_size=8)))
    assert images.numpy().tobytes() == ours.tobytes()
    assert targets.tolist() == our_targets.tolist()


@pytest.mark.parametrize("kind", ["tuple", "list", "array"])
def test_whole_batches_follow_a_changed_normalize(tmp_path, kind):
    write_mnist(tmp_path)
    wrap = {"tuple": tuple, "list": list, "array": lambda v: np.array(v, np.float64)}[kind]
    norm = T.Normalize(wrap([0.5]), wrap([0.25]))
    ds = MNIST(tmp_path, transform=T.Compose([T.ToArray(), norm]))
    slow = PerSampleMNIST(tmp_path, transform=ds.transform)
    first = _batches(fl.DataLoader(ds, batch_size=16))
    _assert_same_batches(first, _batches(fl.DataLoader(slow, batch_size=16)))
    if kind == "tuple":
        norm.mean = (0.125,)
    else:
        norm.mean[0] = 0.125  # in place
    second = _batches(fl.DataLoader(ds, batch_size=16))
    _assert_same_batches(second, _batches(fl.DataLoader(slow, batch_size=16)))
    assert first[0][0].tobytes() != second[0][0].tobytes()


@pytest.mark.timeout(180)
def test_whole_batches_under_spawn(tmp_path, cifar10_root):
    # The dataset travels pickled to spawned workers and is still gathered whole there.
    root, _ = cifar10_root
    ds = CIFAR10(root, transform=T.Compose([T.ToArray(), CIFAR_NORM]))
    slow = PerSampleCIFAR10(root, transform=ds.transform)
    ours = _batches(fl.DataLoader(ds, batch_size=8, num_workers=2, multiprocessing_context="spawn"))
    _assert_same_batches(ours, _batches(fl.DataLoader(slow, batch_size=8)))


def test_gather_image_rows_kernel_against_numpy():
    from fastload import _core
    rng = np.random.default_rng(5)
    rgb = rng.integers(0, 256, (9, 4, 5, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (9, 4, 5), dtype=np.uint8)
    rows = np.array([3, -1, 0, 3], np.int64)  # negatives wrap, as numpy indexing does
    out = np.empty((4, 3, 4, 5), np.uint8)
    _core.gather_image_rows(rgb, rows, out)
    np.testing.assert_array_equal(out, rgb[rows].transpose(0, 3, 1, 2))
    table = rng.random((3, 256)).astype(np.float32)
    floats = np.empty((4, 3, 4, 5), np.float32)
    _core.gather_image_rows(rgb, rows, floats, table)
    expected = np.stack([table[c][rgb[rows][..., c]] for c in range(3)], axis=1)
    np.testing.assert_array_equal(floats, expected)
    out = np.empty((4, 1, 4, 5), np.uint8)
    _core.gather_image_rows(gray, rows, out)
    np.testing.assert_array_equal(out[:, 0], gray[rows])
    with pytest.raises(IndexError, match="index 9 is out of range"):
        _core.gather_image_rows(gray, np.array([1, 9], np.int64), np.empty((2, 1, 4, 5), np.uint8))
    with pytest.raises(ValueError, match="out must be"):
        _core.gather_image_rows(gray, rows, np.empty((4, 4, 5), np.uint8))
    with pytest.raises(ValueError, match="table must be"):
        _core.gather_image_rows(rgb, rows, floats, table[:2])
    with pytest.raises(ValueError, match="source must be"):
        _core.gather_image_rows(rgb[:, ::2], rows, floats, table)


@pytest.mark.parametrize("dtype", ["<i4", ">i8", "u1", "<i8"])
def test_array_targets_collate_as_per_sample(cifar10_root, dtype):
    root, _ = cifar10_root
    fast = CIFAR10(root, transform=T.ToArray())
    slow = PerSampleCIFAR10(root, transform=T.ToArray())
    fast.targets = slow.targets = np.array(fast.targets, dtype=dtype)
    ours, = _batches(fl.DataLoader(fast, batch_size=30))
    theirs, = _batches(fl.DataLoader(slow, batch_size=30))
    assert ours[1].dtype == theirs[1].dtype and ours[1].tolist() == theirs[1].tolist()
    assert ours[0].tobytes() == theirs[0].tobytes()
