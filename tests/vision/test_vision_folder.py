"""fastload.vision.folder: torchvision's ImageFolder/DatasetFolder rules, compact storage,
reduced-size JPEG decoding and errors for bad files.

Expected values are written out by hand from torchvision's documented rules
(torchvision itself is not installed here).
"""

from __future__ import annotations

import io
import os
import pickle
import random

import numpy as np
import pytest
from PIL import Image, UnidentifiedImageError

from fastload.dataset import Dataset
from fastload.rng import seed_transform_rng
from fastload.vision import (
    IMG_EXTENSIONS,
    DatasetFolder,
    ImageFolder,
    default_loader,
    find_classes,
    has_file_allowed_extension,
    make_dataset,
    pil_loader,
)
from fastload.vision import transforms as T
from fastload.vision.sample_table import SampleTable
from decode_spy import record_reductions
from images import save_image, smooth_photo, write_bytes
from required import require


def _tree(root, files):
    for relative in files:
        path = os.path.join(root, relative)
        if relative.lower().endswith(IMG_EXTENSIONS):
            save_image(path, seed=len(path))
        else:
            write_bytes(path, b"not an image")


@pytest.fixture
def layout(tmp_path):
    """A folder exercising every ordering rule; returns (root, expected classes, expected samples)."""
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    _tree(root, [
        "cat/a.jpg", "cat/B.JPG", "cat/c.png", "cat/notes.txt", "cat/.hidden.jpg",
        "cat/sub/d.jpeg", "cat/sub/sub2/e.PNG", "cat/sub-x/f.bmp",
        "dog/z.bmp", "dog/a.webp", "dog/readme.md",
        ".hiddenclass/x.jpg",
        "loose_file.jpg",
    ])
    _tree(outside, ["linked_class/l1.jpg", "linked_sub/s1.tif"])
    os.symlink(outside / "linked_class", root / "linked", target_is_directory=True)
    os.symlink(outside / "linked_sub", root / "cat" / "linksub", target_is_directory=True)
    r = str(root)
    classes = [".hiddenclass", "cat", "dog", "linked"]
    samples = [
        (f"{r}/.hiddenclass/x.jpg", 0),
        # files of one directory sorted by code point: '.' < 'B' < 'a'
        (f"{r}/cat/.hidden.jpg", 1),
        (f"{r}/cat/B.JPG", 1),
        (f"{r}/cat/a.jpg", 1),
        (f"{r}/cat/c.png", 1),
        # walk triples sorted by dirpath: cat/linksub < cat/sub < cat/sub-x < cat/sub/sub2
        (f"{r}/cat/linksub/s1.tif", 1),
        (f"{r}/cat/sub/d.jpeg", 1),
        (f"{r}/cat/sub-x/f.bmp", 1),
        (f"{r}/cat/sub/sub2/e.PNG", 1),
        (f"{r}/dog/a.webp", 2),
        (f"{r}/dog/z.bmp", 2),
        (f"{r}/linked/l1.jpg", 3),
    ]
    return r, classes, samples


def test_layout_and_ordering_follow_torchvision(layout):
    root, classes, samples = layout
    ds = ImageFolder(root)
    assert isinstance(ds, Dataset)
    assert ds.classes == classes
    assert ds.class_to_idx == {name: i for i, name in enumerate(classes)}
    assert ds.samples == samples
    assert list(ds.samples) == samples
    assert ds.imgs == samples
    assert list(ds.targets) == [t for _, t in samples]
    assert ds.extensions == IMG_EXTENSIONS
    assert ds.root == root
    assert ds.loader is default_loader
    assert len(ds) == len(samples)
    assert find_classes(root) == (classes, ds.class_to_idx)
    assert make_dataset(root, extensions=IMG_EXTENSIONS) == samples
    assert DatasetFolder.make_dataset(root, ds.class_to_idx, extensions=IMG_EXTENSIONS) == samples


def test_samples_are_stored_compactly_and_read_as_a_list(layout):
    # The paths in one bytes object, offsets and targets in numpy: a few
    # objects, however many samples (forked workers share their pages).
    root, _, samples = layout
    ds = ImageFolder(root)
    table = ds.samples
    assert isinstance(table, SampleTable)
    assert isinstance(table._blob, bytes)
    assert all(isinstance(getattr(table, slot), np.ndarray) for slot in ("_offsets", "_targets"))
    assert table.nbytes < sum(len(p) for p, _ in samples) + 16 * (len(samples) + 1)
    assert table[0] == samples[0] and table[-1] == samples[-1]
    assert table[2:5] == samples[2:5] and table[::-3] == samples[::-3]
    assert table[np.int64(3)] == samples[3]
    assert isinstance(table[0][0], str) and type(table[0][1]) is int
    with pytest.raises(IndexError):
        table[len(samples)]
    with pytest.raises(TypeError):
        table["0"]
    assert table != samples[:-1] and table != [("x", 0)] * len(samples)
    assert ds.targets[-1] == samples[-1][1] and ds.targets[1:3] == [1, 1]
    targets = np.asarray(ds.targets)
    assert targets.dtype == np.int64 and not targets.flags.writeable
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.samples == samples and list(clone.targets) == list(ds.targets)


def test_reassigning_samples_keeps_them_compact(layout):
    root, _, samples = layout
    ds = ImageFolder(root)
    ds.samples = [s for s in samples if s[1] == 2]
    assert isinstance(ds.samples, SampleTable)
    assert ds.samples == samples[9:11] and ds.imgs == samples[9:11]
    assert list(ds.targets) == [2, 2] and len(ds) == 2
    assert ds[1][1] == 2


@pytest.mark.parametrize("change", [
    lambda ds: ds.samples.__setitem__(0, ds.samples[1]),
    lambda ds: ds.samples.__delitem__(0),
    lambda ds: random.Random(0).shuffle(ds.samples),
    lambda ds: ds.samples.append(ds.samples[0]),
    lambda ds: ds.imgs.sort(),
    lambda ds: ds.targets.__setitem__(0, 1),
    lambda ds: ds.targets.pop(),
], ids=["set", "del", "shuffle", "append", "imgs sort", "targets set", "targets pop"])
def test_changing_samples_in_place_says_to_assign_a_list(layout, change):
    # torchvision's samples and targets are lists that code edits in place;
    # ours are compact tables: the error says what to do instead.
    root, _, samples = layout
    ds = ImageFolder(root)
    with pytest.raises((TypeError, AttributeError), match=r"cannot be changed in place .*"
                       r"dataset\.(samples|targets) = "):
        change(ds)
    assert ds.samples == samples  # nothing changed
    # What the message suggests works.
    relabelled = [(path, 3 - target) for path, target in ds.samples]
    ds.samples = relabelled
    assert ds[0][1] == 3 - samples[0][1] and list(ds.targets) == [t for _, t in relabelled]


def test_the_tables_concatenate_and_repeat_into_lists_as_torchvisions_lists_do(layout):
    # Merging two folders' samples (and the like) is list arithmetic in
    # torchvision code: it gives new lists, which can then be assigned whole.
    root, _, samples = layout
    ds, other = ImageFolder(root), ImageFolder(root)
    targets = [t for _, t in samples]
    merged = ds.samples + other.samples
    assert type(merged) is list and merged == samples + samples
    assert ds.samples + [("x.jpg", 0)] == samples + [("x.jpg", 0)]
    assert [("x.jpg", 0)] + ds.samples == [("x.jpg", 0)] + samples
    assert ds.targets + [7] == targets + [7] and [7] + ds.targets == [7] + targets
    assert ds.imgs * 2 == samples * 2 and 2 * ds.targets == targets * 2
    assert ds.targets * np.int64(2) == targets * 2  # as a list takes it (not numpy's product)
    ds.samples += other.samples[:2]  # rebinds, as the sum is a new list: assigned whole
    assert isinstance(ds.samples, SampleTable) and ds.samples == samples + samples[:2]
    assert list(ds.targets) == targets + targets[:2] and other.samples == samples
    with pytest.raises(TypeError):
        ds.samples + ("x.jpg", 0)


def test_missing_attributes_of_the_tables_are_plain_attribute_errors(layout):
    ds = ImageFolder(layout[0])
    for table in (ds.samples, ds.targets):
        assert not hasattr(table, "append")
        with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
            table.nothing


def test_unicode_and_undecodable_file_names_round_trip(tmp_path):
    root = tmp_path / "root"
    save_image(root / "ünï" / "b€.jpg")
    raw_dir = os.fsencode(str(root / "ünï"))
    raw_name = raw_dir + b"/bad\xff.jpg"  # not UTF-8: os.walk hands it back surrogate-escaped
    with open(raw_name, "wb") as f:
        f.write((root / "ünï" / "b€.jpg").read_bytes())
    ds = ImageFolder(str(root))
    assert [os.fsencode(p) for p, _ in ds.samples] == [raw_name, raw_dir + "/b€.jpg".encode()]
    assert ds[0][0].size == (40, 30)


def test_extensions_filter_and_empty_classes(tmp_path):
    root = str(tmp_path)
    _tree(root, ["a/1.png", "a/2.jpg", "b/3.jpg", "c/4.txt"])
    with pytest.raises(FileNotFoundError) as raised:
        DatasetFolder(root, pil_loader, extensions=(".png",))
    message = str(raised.value)
    assert "Found no valid file for the classes b, c." in message
    assert "Supported extensions are: .png" in message
    with pytest.raises(FileNotFoundError, match="Supported extensions are: .jpg, .png"):
        DatasetFolder(root, pil_loader, extensions=(".jpg", ".png"))
    ds = DatasetFolder(root, pil_loader, extensions=(".png",), allow_empty=True)
    assert ds.classes == ["a", "b", "c"]
    assert ds.samples == [(f"{root}/a/1.png", 0)]
    ds = DatasetFolder(root, pil_loader, extensions=".jpg", allow_empty=True)  # one string works too
    assert ds.samples == [(f"{root}/a/2.jpg", 0), (f"{root}/b/3.jpg", 1)]
    with pytest.raises(FileNotFoundError, match="Found no valid file for the classes c"):
        ImageFolder(root)
    assert len(ImageFolder(root, allow_empty=True)) == 3


def test_is_valid_file_replaces_extensions(tmp_path):
    root = str(tmp_path)
    _tree(root, ["a/keep_1.jpg", "a/drop.jpg", "b/keep_2.txt"])
    seen = []

    def keep(path):
        seen.append(path)
        return os.path.basename(path).startswith("keep")

    ds = ImageFolder(root, is_valid_file=keep)
    assert ds.extensions is None
    assert ds.samples == [(f"{root}/a/keep_1.jpg", 0), (f"{root}/b/keep_2.txt", 1)]
    assert seen == [f"{root}/a/drop.jpg", f"{root}/a/keep_1.jpg", f"{root}/b/keep_2.txt"]
    # An empty class reports no extensions when is_valid_file chose.
    with pytest.raises(FileNotFoundError) as raised:
        ImageFolder(root, is_valid_file=lambda p: p.endswith(".jpg"))
    assert "classes b." in str(raised.value) and "Supported extensions" not in str(raised.value)


def _torchvision_samples(root, extensions):
    """torchvision's make_dataset, written out: the extension test on the full path."""
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    samples = []
    for index, name in enumerate(classes):
        for dirpath, _, filenames in sorted(os.walk(os.path.join(root, name), followlinks=True)):
            for filename in sorted(filenames):
                path = os.path.join(dirpath, filename)
                if path.lower().endswith(extensions if isinstance(extensions, str) else tuple(extensions)):
                    samples.append((path, index))
    return samples


def test_extension_reaching_into_the_directory_is_checked_on_the_path(tmp_path):
    # The scan tests names, not paths, unless an extension holds a separator:
    # then it must still match across it, as torchvision's path check does.
    root = str(tmp_path)
    _tree(root, ["cat/x.png", "cat/sub/a.jpg", "cat/a.jpg", "dog/x.png", "dog/sub/b.jpg"])
    for extensions in [("t/x.png",), "sub/a.jpg", (".jpg", "g/x.png"), ("/x.png", ".JPG")]:
        expected = _torchvision_samples(root, extensions)
        assert expected  # each reaches a path
        ds = DatasetFolder(root, len, extensions=extensions, allow_empty=True)
        assert ds.samples == expected, extensions
        assert make_dataset(root, extensions=extensions, allow_empty=True) == expected
    assert DatasetFolder(root, len, extensions=("t/x.png",), allow_empty=True).samples == \
        [(f"{root}/cat/x.png", 0)]


def test_name_check_matches_path_check_for_case_folding_edges(tmp_path):
    # str.lower is per character except a final sigma, whose context the
    # separator before the name cuts; names whose lower case changes length too.
    root = str(tmp_path)
    names = ["Σ", "AΣ", "A.Σ", "ΣΑ", "İ.PNG", "x.İPNG", ".jpg", "JPG", "a.JPEG", "é.png", "a.png.txt",
             "ǅ.PNG"]
    for class_name in ["AΣ", "plain", "Σ"]:
        os.makedirs(f"{root}/{class_name}/sub.Σ")
        for name in names:
            write_bytes(f"{root}/{class_name}/{name}", b"")
            write_bytes(f"{root}/{class_name}/sub.Σ/{name}", b"")
    with open(os.fsencode(root) + b"/plain/raw\xff.png", "wb"):
        pass
    for extensions in [IMG_EXTENSIONS, ("ς",), ("σ",), ("ς", "σ", ".png"), "i̇png", ("png",), ("",), ()]:
        expected = _torchvision_samples(root, extensions)
        ds = DatasetFolder(root, len, extensions=extensions, allow_empty=True)
        assert ds.samples == expected, extensions
        assert list(ds.targets) == [t for _, t in expected]


def test_extensions_that_are_not_strings_fail_as_torchvision_does(tmp_path):
    _tree(str(tmp_path), ["a/1.jpg"])
    with pytest.raises(TypeError):
        DatasetFolder(str(tmp_path), len, extensions=(b".jpg",))


def test_class_outside_the_root_stores_full_paths(tmp_path):
    # A find_classes override may name a class by absolute path: os.path.join
    # then leaves the root, and the table must not assume the common prefix.
    root, elsewhere = str(tmp_path / "root"), str(tmp_path / "elsewhere")
    _tree(root, ["a/1.jpg", "a/2.png"])
    _tree(elsewhere, ["x/3.jpg"])

    class Outside(ImageFolder):
        def find_classes(self, directory):
            return ["a", elsewhere], {"a": 1, elsewhere: 0}

    ds = Outside(root)
    assert ds.samples == [(f"{elsewhere}/x/3.jpg", 0), (f"{root}/a/1.jpg", 1), (f"{root}/a/2.png", 1)]
    assert ds.samples._prefix == ""
    assert ImageFolder(root).samples._prefix == root + "/"


def test_all_classes_empty_gives_an_empty_table(tmp_path):
    _tree(str(tmp_path), ["a/1.txt", "b/2.txt"])
    ds = ImageFolder(str(tmp_path), allow_empty=True)
    assert len(ds) == 0 and list(ds.samples) == [] and ds.samples == [] and list(ds.targets) == []
    with pytest.raises(IndexError):
        ds[0]


def test_sample_table_item_indexing_and_construction():
    pairs = [("/r/a/ü.jpg", 3), ("/r/b/x.png", 1), ("/r/c/y.png", 2)]
    table = SampleTable.from_pairs(pairs, prefix="/r/")
    assert [table.item(i) for i in range(-3, 3)] == pairs + pairs
    assert table.item(np.int64(1)) == pairs[1] and table.item(True) == pairs[1]
    assert type(table.item(0)[1]) is int and type(table.target(-1)) is int
    for bad in (3, -4, 10**20, -(10**20)):
        with pytest.raises(IndexError, match=f"sample index {bad} is out of range for 3 samples"):
            table.item(bad)
    with pytest.raises(TypeError):
        table.item(1.0)
    # Built from arrays that do not view a bytes object (a copy is taken), or from bytes.
    blob = np.frombuffer(b"xxa.jpgb.png", dtype=np.uint8)[2:]
    for path_bytes in (blob, blob.copy(), bytes(blob), np.array(blob, dtype=np.int64)):
        other = SampleTable("/q/", path_bytes, np.array([0, 5, 10]), np.array([0, 1], dtype=np.int32))
        assert other == [("/q/a.jpg", 0), ("/q/b.png", 1)]
        assert pickle.loads(pickle.dumps(other)) == other
        assert other._targets.dtype == np.int64


def test_extensions_and_is_valid_file_both_or_neither_is_an_error(tmp_path):
    _tree(str(tmp_path), ["a/1.jpg"])
    message = "Both extensions and is_valid_file cannot be None or not None at the same time"
    with pytest.raises(ValueError, match=message):
        DatasetFolder(str(tmp_path), pil_loader)
    with pytest.raises(ValueError, match=message):
        DatasetFolder(str(tmp_path), pil_loader, extensions=(".jpg",), is_valid_file=bool)
    with pytest.raises(ValueError, match=message):
        make_dataset(str(tmp_path))
    with pytest.raises(ValueError, match="class_to_idx parameter cannot be None"):
        DatasetFolder.make_dataset(str(tmp_path), None, extensions=(".jpg",))


def test_no_class_folder_is_an_error(tmp_path):
    save_image(tmp_path / "lonely.jpg")
    with pytest.raises(FileNotFoundError, match="Couldn't find any class folder in"):
        ImageFolder(str(tmp_path))


def test_has_file_allowed_extension():
    assert has_file_allowed_extension("x/IMG.JPEG", IMG_EXTENSIONS)
    assert has_file_allowed_extension("a.Png", ".png")
    assert not has_file_allowed_extension("a.png.txt", IMG_EXTENSIONS)
    assert has_file_allowed_extension("a.tiff", [".tif", ".tiff"])


def test_getitem_applies_loader_and_transforms(tmp_path):
    root = str(tmp_path)
    save_image(f"{root}/a/gray.png", size=(20, 10))
    Image.open(f"{root}/a/gray.png").convert("L").save(f"{root}/a/gray.png")
    save_image(f"{root}/b/rgb.jpg", size=(20, 10))
    ds = ImageFolder(root, transform=T.ToArray(), target_transform=lambda t: t * 10)
    image, target = ds[0]
    assert image.shape == (3, 10, 20) and image.dtype == np.uint8 and target == 0
    assert ds[-1][1] == 10
    loaded = ImageFolder(root)[0][0]
    assert isinstance(loaded, Image.Image) and loaded.mode == "RGB"
    custom = ImageFolder(root, loader=lambda path: os.path.basename(path))
    assert custom[1] == ("rgb.jpg", 1)


def test_repr_names_root_and_transform(tmp_path):
    _tree(str(tmp_path), ["a/1.jpg"])
    ds = ImageFolder(str(tmp_path), transform=T.Compose([T.CenterCrop(4), T.ToArray()]),
                     target_transform=T.Normalize([0], [1]))
    # torchvision's text, down to its indentation (read off torchvision 0.29).
    assert repr(ds) == (
        "Dataset ImageFolder\n"
        "    Number of datapoints: 1\n"
        f"    Root location: {tmp_path}\n"
        "    StandardTransform\n"
        "Transform: Compose(\n"
        "               CenterCrop(size=(4, 4))\n"
        "               ToArray()\n"
        "           )\n"
        "Target transform: Normalize(mean=[0], std=[1])")
    assert repr(ImageFolder(str(tmp_path))) == (
        f"Dataset ImageFolder\n    Number of datapoints: 1\n    Root location: {tmp_path}")


def test_folder_datasets_are_vision_datasets_as_torchvisions(tmp_path, monkeypatch):
    # torchvision's test_datasets smoke tests check isinstance(dataset, VisionDataset).
    from fastload.vision import VisionDataset

    _tree(str(tmp_path), ["a/1.jpg", "b/2.png"])
    flip = T.RandomHorizontalFlip()
    folder = DatasetFolder(str(tmp_path), loader=lambda path: path, extensions=(".jpg", ".png"),
                           transform=flip)
    images = ImageFolder(str(tmp_path), target_transform=str)
    for ds in (folder, images):
        assert isinstance(ds, VisionDataset) and isinstance(ds, Dataset)
        assert ds.root == str(tmp_path)
    assert folder.transform is flip and folder.target_transform is None
    assert folder.transforms.transform is flip and folder.transforms.target_transform is None
    assert images.target_transform is str and images.transforms(1, 2) == (1, "2")
    # VisionDataset's repr (its "Number of datapoints" and "Root location" lines)
    assert repr(images).splitlines()[:3] == [
        "Dataset ImageFolder", "    Number of datapoints: 2", f"    Root location: {tmp_path}"]
    monkeypatch.setenv("HOME", str(tmp_path))
    assert ImageFolder("~").root == str(tmp_path)  # expanded, as VisionDataset does


def test_transforms_pairs_the_two_transforms_as_torchvision(tmp_path):
    _tree(str(tmp_path), ["a/1.jpg"])
    assert ImageFolder(str(tmp_path)).transforms is None
    ds = ImageFolder(str(tmp_path), target_transform=lambda t: t + 10)
    image, target = ds.transforms("image", 2)
    assert (image, target) == ("image", 12)
    ds = ImageFolder(str(tmp_path), transform=str.upper)
    assert ds.transforms("image", 2) == ("IMAGE", 2)


# -- bad files ------------------------------------------------------------


def test_corrupt_files_raise_their_own_type_naming_path_and_index(tmp_path):
    root = str(tmp_path)
    good = save_image(f"{root}/a/0_good.jpg", size=(64, 48))
    with open(good, "rb") as f:
        jpeg = f.read()
    truncated = write_bytes(f"{root}/a/1_truncated.jpg", jpeg[: len(jpeg) // 2])
    not_image = write_bytes(f"{root}/a/2_text.jpg", b"hello, I am not a JPEG")
    for transform in (None, T.Compose([T.RandomResizedCrop(8), T.ToArray()])):
        ds = ImageFolder(root, transform=transform)
        ds[0]
        with pytest.raises(OSError) as raised:
            ds[1]
        assert truncated in str(raised.value) and "sample 1" in str(raised.value)
        assert isinstance(raised.value.__cause__, OSError)
        with pytest.raises(UnidentifiedImageError) as raised:
            ds[2]
        assert not_image in str(raised.value) and "sample 2" in str(raised.value)
    os.remove(truncated)
    os.remove(not_image)
    ds = ImageFolder(root, transform=T.ToArray())
    assert [ds[i][0].shape for i in range(len(ds))] == [(3, 48, 64)]


def test_a_missing_file_is_named_on_the_planned_path_too(tmp_path):
    root = str(tmp_path)
    path = save_image(f"{root}/a/0.jpg", size=(64, 48))
    for transform in (None, T.Compose([T.RandomResizedCrop(8), T.ToArray()])):
        ds = ImageFolder(root, transform=transform)
        os.rename(path, path + ".gone")
        with pytest.raises(FileNotFoundError) as raised:
            ds[0]
        assert "cannot load sample 0" in str(raised.value) and raised.value.filename == path
        os.rename(path + ".gone", path)


@pytest.mark.parametrize("make_transform", [
    lambda: T.Resize(0), lambda: T.Resize(-1),
    lambda: T.Compose([T.Resize(-1), T.RandomHorizontalFlip(), T.ToArray()]),
    lambda: T.Compose([T.RandomResizedCrop(16, scale=(1.0, 0.08)), T.ToArray()])],
    ids=["Resize(0)", "Resize(-1)", "Resize(-1) fused", "RandomResizedCrop bad scale"])
@pytest.mark.filterwarnings("ignore:Scale and ratio should be of kind")
def test_a_transforms_own_error_is_not_blamed_on_a_good_file(tmp_path, make_transform):
    # As with torchvision (its loader, then the transform): the file is fine,
    # the transform's argument is not; the error is the transform's, as it is.
    root = str(tmp_path)
    path = save_image(f"{root}/a/0.jpg", size=(64, 48))
    transform = make_transform()
    with pytest.raises(Exception) as expected:
        transform(pil_loader(path))
    for loader in (default_loader, lambda p: pil_loader(p)):  # planned, then not
        with pytest.raises(type(expected.value)) as raised:
            ImageFolder(root, transform=transform, loader=loader)[0]
        assert str(raised.value) == str(expected.value)
        assert "cannot load sample" not in str(raised.value)
        assert raised.value.__notes__ == [f"raised by a transform of sample 0 ({path!r})"]


def test_error_without_a_one_message_constructor_keeps_its_type(tmp_path):
    _tree(str(tmp_path), ["a/1.jpg"])

    class PickyError(Exception):
        def __init__(self, code, detail):
            super().__init__(code, detail)

    def loader(path):
        raise PickyError(7, "nope")

    with pytest.raises(PickyError) as raised:
        ImageFolder(str(tmp_path), loader=loader)[0]
    assert any("1.jpg" in note for note in getattr(raised.value, "__notes__", []))


# -- reduced-size JPEG decoding -------------------------------------------


@pytest.fixture
def draft_spy(monkeypatch):
    """Records the scale of every JPEG decoded at reduced size (Pillow's draft or simplejpeg)."""
    return record_reductions(monkeypatch)


@pytest.fixture
def big_jpeg_folder(tmp_path):
    root = str(tmp_path)
    os.makedirs(f"{root}/a")
    for index, size in enumerate([(2000, 1500), (1600, 2400), (1203, 901)]):
        smooth_photo(*size, seed=index).save(f"{root}/a/{index}.jpg", quality=92)
    return root


def _mean_abs_error(a, b):
    return float(np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16)).mean())


# The bound stated in fastload.vision.decode: mean absolute error under 1 level
# (of 255) between reduced-size and full decoding, for smooth images (typically ~0.1).
DRAFT_MEAN_ERROR_BOUND = 1.0


def test_resize_decodes_at_reduced_size_within_error_bound(big_jpeg_folder, draft_spy):
    resize = T.Resize(200)
    ds = ImageFolder(big_jpeg_folder, transform=T.Compose([resize, T.ToArray()]))
    for index, (path, _) in enumerate(ds.samples):
        drafted = ds[index][0]
        full = T.ToArray()(resize(pil_loader(path)))
        assert drafted.shape == full.shape
        assert _mean_abs_error(drafted, full) < DRAFT_MEAN_ERROR_BOUND
    # 1500/200 -> 4, 1600/200 -> 8 (short side 1600 -> 200 is exactly 8x), 901/200 -> 4
    assert draft_spy == [4, 8, 4]


def test_random_resized_crop_drafts_with_the_same_draws(big_jpeg_folder, draft_spy):
    crop = T.RandomResizedCrop(224, scale=(0.3, 1.0))
    pipeline = T.Compose([crop, T.RandomHorizontalFlip(), T.ToArray()])
    ds = ImageFolder(big_jpeg_folder, transform=pipeline)
    for batch in range(4):
        for index, (path, _) in enumerate(ds.samples):
            seed_transform_rng(11, batch * 10 + index)
            drafted = ds[index][0]
            seed_transform_rng(11, batch * 10 + index)
            full = pipeline(pil_loader(path))
            assert _mean_abs_error(drafted, full) < DRAFT_MEAN_ERROR_BOUND, (batch, index)
    assert draft_spy and all(scale in (2, 4) for scale in draft_spy)


def test_no_draft_when_the_box_is_too_small_or_filter_is_nearest(big_jpeg_folder, draft_spy):
    for transform in (T.RandomResizedCrop(1000, scale=(0.08, 0.1)),
                      T.Resize(200, interpolation=T.InterpolationMode.NEAREST)):
        ds = ImageFolder(big_jpeg_folder, transform=transform)
        for index, (path, _) in enumerate(ds.samples):
            seed_transform_rng(3, index)
            planned = ds[index][0]
            seed_transform_rng(3, index)
            assert np.array_equal(np.asarray(planned), np.asarray(transform(pil_loader(path))))
    assert draft_spy == []


def test_planned_path_is_exact_for_non_jpeg(tmp_path, draft_spy):
    root = str(tmp_path)
    os.makedirs(f"{root}/a")
    smooth_photo(900, 700).save(f"{root}/a/big.png")
    pipeline = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(), T.ToArray()])
    ds = ImageFolder(root, transform=pipeline)
    for batch in range(5):
        seed_transform_rng(5, batch)
        planned = ds[0][0]
        seed_transform_rng(5, batch)
        assert np.array_equal(planned, pipeline(pil_loader(f"{root}/a/big.png")))
    assert draft_spy == []


def test_seeded_transforms_are_deterministic(big_jpeg_folder):
    pipeline = T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.ToArray()])
    ds = ImageFolder(big_jpeg_folder, transform=pipeline)
    seed_transform_rng(42, 7)
    first = [ds[i][0] for i in range(len(ds))]
    seed_transform_rng(42, 7)
    again = [ds[i][0] for i in range(len(ds))]
    seed_transform_rng(42, 8)
    other = [ds[i][0] for i in range(len(ds))]
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_grayscale_and_cmyk_jpegs_draft_to_rgb(tmp_path, draft_spy):
    root = str(tmp_path)
    os.makedirs(f"{root}/a")
    photo = smooth_photo(1600, 1200)
    photo.convert("L").save(f"{root}/a/gray.jpg")
    photo.convert("CMYK").save(f"{root}/a/cmyk.jpg")
    ds = ImageFolder(root, transform=T.Compose([T.Resize(150), T.ToArray()]))
    for index, (path, _) in enumerate(ds.samples):
        drafted = ds[index][0]
        assert drafted.shape == (3, 150, 200)
        full = T.ToArray()(T.Resize(150)(pil_loader(path)))
        assert _mean_abs_error(drafted, full) < DRAFT_MEAN_ERROR_BOUND
    assert draft_spy == [8, 8]


class GrayResize(T.Resize):
    """Overrides __call__ alone: its plan_region (Resize's) does not describe it."""

    def __call__(self, img):
        return super().__call__(img).convert("L")


class TaggedResize(T.Resize):
    """Changes nothing that is called: still planned."""


class DictCompose(T.Compose):
    def __call__(self, img):
        return {"image": super().__call__(img)}


def test_a_transform_subclass_that_overrides_call_is_called(big_jpeg_folder, draft_spy):
    ds = ImageFolder(big_jpeg_folder, transform=GrayResize(50))
    assert ds[0][0].mode == "L" and ds[0][0].size == (66, 50)
    ds = ImageFolder(big_jpeg_folder, transform=T.Compose([GrayResize(50), T.ToArray()]))
    assert ds[0][0].shape == (1, 50, 66)
    ds = ImageFolder(big_jpeg_folder, transform=DictCompose([T.Resize(50), T.ToArray()]))
    assert ds[0][0]["image"].shape == (3, 50, 66)
    assert draft_spy == []  # none of them was planned
    ds = ImageFolder(big_jpeg_folder, transform=TaggedResize(50))
    assert ds[0][0].size == (66, 50)
    assert draft_spy == [8]


def test_custom_loader_is_never_planned(big_jpeg_folder, draft_spy):
    ds = ImageFolder(big_jpeg_folder, transform=T.Resize(100), loader=lambda p: pil_loader(p))
    assert ds[0][0].size == (133, 100)
    assert draft_spy == []


def test_drafted_bytes_in_memory_match_file(tmp_path):
    # A JPEG read through the planned path equals the same bytes decoded with Pillow directly.
    buffer = io.BytesIO()
    smooth_photo(320, 240).save(buffer, "JPEG")
    write_bytes(tmp_path / "a" / "x.jpg", buffer.getvalue())
    ds = ImageFolder(str(tmp_path), transform=T.Resize(240))  # same size: identity, full decode
    assert np.array_equal(np.asarray(ds[0][0]),
                          np.asarray(Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")))


# -- with the DataLoader ----------------------------------------------------


def test_seeded_loader_gives_the_same_images_for_any_num_workers(big_jpeg_folder, tmp_path):
    import fastload

    for index in range(6):  # a few small files beside the big ones: several batches
        save_image(f"{big_jpeg_folder}/b/{index}.png", size=(90, 70), seed=index)
    ds = ImageFolder(big_jpeg_folder, transform=T.Compose([
        T.RandomResizedCrop(48), T.RandomHorizontalFlip(), T.ToArray()]))
    runs = []
    for workers, context in [(0, None), (2, None), (2, "spawn")]:
        loader = fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers,
                                     generator=1234, multiprocessing_context=context)
        runs.append([(images.copy(), targets.copy()) for images, targets in loader])
    for other in runs[1:]:
        assert len(other) == len(runs[0]) == 3
        for (images, targets), (images_again, targets_again) in zip(runs[0], other):
            assert images.shape == (len(targets), 3, 48, 48) and images.dtype == np.uint8
            assert np.array_equal(images, images_again) and np.array_equal(targets, targets_again)


def _private_growth_after_reading(samples, connection):
    import psutil

    me = psutil.Process()
    before = me.memory_full_info().uss
    for _path, _target in samples:  # iteration
        pass
    for index in range(len(samples)):  # what a worker's __getitem__ calls amount to
        _path, _target = samples[index]
    connection.send(me.memory_full_info().uss - before)


@pytest.mark.parametrize("compact", [True, False])
def test_forked_readers_do_not_copy_the_sample_table(compact):
    """Reading every sample in a forked child must not make the table's pages private.

    The control (a list of tuples, as torchvision stores samples) shows the
    measurement is sensitive: refcount writes copy tens of MB there.
    """
    import multiprocessing

    require("psutil")
    pairs = [(f"/data/imagenet/train/n{k // 1300:08d}/n{k // 1300:08d}_{k}.JPEG", k // 1300)
             for k in range(300_000)]
    samples = SampleTable.from_pairs(pairs, prefix="/data/imagenet/train/") if compact else pairs
    if compact:
        del pairs
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_private_growth_after_reading, args=(samples, sender))
    child.start()
    growth = receiver.recv()
    child.join(timeout=60)
    megabytes = growth / 2**20
    if compact:
        assert megabytes < 4, f"a forked reader copied {megabytes:.1f} MB of the compact table"
    else:
        assert megabytes > 15, f"control: expected the list of tuples to be copied, got {megabytes:.1f} MB"


def test_standard_pipeline_runs_fused_and_gives_the_transforms_own_pixels(tmp_path, monkeypatch,
                                                                          draft_spy):
    # RandomResizedCrop -> RandomHorizontalFlip -> ToArray runs as one fused
    # resize (fastload.vision.resample); the pixels and the random draws must
    # be exactly those of the transforms applied one by one to pil_loader's
    # image.  (224 from images this small never decodes at reduced size.)
    from fastload.vision import decode as decode_module
    from fastload.vision import transforms as transforms_module

    calls = []
    # The fused pass from Pillow's memory, and from simplejpeg's pixels.
    for module, name in ((transforms_module, "resize_to_chw"),
                         (decode_module, "resize_rgb_bytes_to_chw"),
                         (decode_module, "resize_rgb_array_to_chw")):
        def counting(*args, fused=getattr(module, name), **kwargs):
            calls.append(1)
            return fused(*args, **kwargs)

        monkeypatch.setattr(module, name, counting)
    root = str(tmp_path)
    for index, size in enumerate([(500, 375), (333, 500), (96, 64)]):
        save_image(f"{root}/c/{index}.jpg", size=size, seed=index)
    pipeline = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToArray(),
                          T.Normalize([0.5, 0.4, 0.3], [0.2, 0.3, 0.4])])
    ds = ImageFolder(root, transform=pipeline)
    for batch in range(6):
        for index, (path, _) in enumerate(ds.samples):
            seed_transform_rng(9, batch * 10 + index)
            got = ds[index][0]
            seed_transform_rng(9, batch * 10 + index)
            expected = pipeline(pil_loader(path))
            assert got.dtype == expected.dtype == np.float32
            assert np.array_equal(got, expected), (batch, index)
    assert len(calls) == 6 * len(ds)
    assert draft_spy == []


@pytest.mark.parametrize("flip", [True, False], ids=["flip", "no-flip"])
def test_an_empty_crop_of_a_one_pixel_image_gives_the_transforms_own_pixels(tmp_path, flip):
    # A 1x2 image and ratio (3, 4): torchvision's fallback box is 0 pixels
    # high, and Pillow resizes that empty region to zeros.  The fused resize
    # raised "empty array" instead.
    os.makedirs(f"{tmp_path}/c")
    Image.fromarray(np.full((2, 1, 3), 200, np.uint8)).save(f"{tmp_path}/c/a.png")
    steps = [T.RandomResizedCrop(4, ratio=(3.0, 4.0))]
    steps += [T.RandomHorizontalFlip(), T.ToArray()] if flip else [T.ToArray()]
    pipeline = T.Compose(steps)
    ds = ImageFolder(str(tmp_path), transform=pipeline)
    seed_transform_rng(0, 0)
    got = ds[0][0]
    seed_transform_rng(0, 0)
    expected = pipeline(pil_loader(f"{tmp_path}/c/a.png"))
    assert got.shape == expected.shape == (3, 4, 4) and np.array_equal(got, expected)


@pytest.mark.parametrize("resize", [T.Resize(None, max_size=186), T.Resize(10, max_size=20)],
                         ids=repr)
def test_an_output_with_no_pixels_fails_as_pillow_does_naming_the_file(tmp_path, resize):
    # A 1-pixel-wide image resized by its longer side: the width rounds to 0.
    # Called directly, Pillow refuses ("height and width must be > 0"); the
    # planned decode divided by that 0 width.
    os.makedirs(f"{tmp_path}/c")
    Image.fromarray(np.full((554, 1, 3), 90, np.uint8)).save(f"{tmp_path}/c/a.png")
    with pytest.raises(ValueError, match="height and width must be > 0"):
        resize(pil_loader(f"{tmp_path}/c/a.png"))
    for pipeline in (resize, T.Compose([resize, T.ToArray()])):
        with pytest.raises(ValueError) as raised:
            ImageFolder(str(tmp_path), transform=pipeline)[0]
        assert str(raised.value) == "height and width must be > 0"  # Pillow's, as it is
        assert any("a.png" in note for note in raised.value.__notes__)


def test_a_plan_that_changes_nothing_gives_a_plain_image_as_pil_loader_does(tmp_path):
    os.makedirs(f"{tmp_path}/c")
    save_image(f"{tmp_path}/c/a.jpg", size=(40, 30), seed=0)
    for transform in (T.Resize(30), T.Compose([T.Resize((30, 40)), T.RandomHorizontalFlip(0.0)])):
        got = ImageFolder(str(tmp_path), transform=transform)[0][0]
        expected = transform(pil_loader(f"{tmp_path}/c/a.jpg"))
        assert type(got) is type(expected) is Image.Image
        assert np.array_equal(np.asarray(got), np.asarray(expected))


def test_a_missing_file_keeps_errno_and_filename(tmp_path):
    root = str(tmp_path)
    path = save_image(f"{root}/a/0.png", size=(8, 8))
    ds = ImageFolder(root)
    os.remove(path)  # gone after the scan
    with pytest.raises(FileNotFoundError) as raised:
        ds[0]
    assert raised.value.errno == 2 and raised.value.filename == path  # as torchvision's caller sees
    assert "sample 0" in str(raised.value) and path in str(raised.value)


def test_assigned_targets_keep_what_they_hold(tmp_path):
    root = str(tmp_path)
    save_image(f"{root}/a/0.png", size=(8, 8))
    save_image(f"{root}/b/1.png", size=(8, 8))
    ds = ImageFolder(root)
    ds.targets = [1, 0]
    assert list(ds.targets) == [1, 0] and all(type(t) is int for t in ds.targets)
    # torchvision keeps any targets as given: never truncated, never refused.
    for targets in ([0.7, 1], ["cat", "dog"], [2**70, 1], [[0, 1], [1, 0]], [True, False]):
        ds.targets = targets
        assert list(ds.targets) == targets
        assert [type(t) for t in ds.targets] == [type(t) for t in targets]
    assert [target for _, target in (ds[0], ds[1])] == [0, 1]  # __getitem__ reads samples
