"""``Image()`` columns of a Hugging Face dataset through fastload's vision pipeline.

The dataset: encoded JPEGs (large enough to be decoded at reduced size, one
with an EXIF orientation, one grayscale), a PNG and a missing image, beside
a label.  References: ``datasets``' own decoding of the same column (then
the transform, in torch's DataLoader over the same object), and a full
Pillow decode with the same random draws (the crop parameters) for the
crops decoded at reduced size, within the error bound ``fastload.vision.decode``
states (as tests/vision/test_vision_folder.py holds ImageFolder to it).
"""

import io

import numpy as np
import pytest
from PIL import Image

from images import smooth_photo

import fastload as fl
from fastload.rng import seed_transform_rng
from fastload.vision import transforms as T
from required import deferred

datasets = deferred("datasets")

from fastload.sources import ImageColumnTransform  # noqa: E402
from fastload.sources.image_columns import ImageColumnRows  # noqa: E402

pytestmark = [pytest.mark.timeout(120), pytest.mark.imports_heavy_library]

# fastload.vision.decode's bound on reduced-size decoding: a mean absolute error under 1 level.
DRAFT_MEAN_ERROR_BOUND = 1.0


def _encoded(img, fmt, **save):
    out = io.BytesIO()
    img.save(out, format=fmt, **save)
    return out.getvalue()


def _rotated_jpeg():
    exif = Image.Exif()
    exif[Image.ExifTags.Base.Orientation] = 6  # stored sideways: turned 90 degrees on decode
    return _encoded(smooth_photo(300, 200, seed=9), "JPEG", quality=90, exif=exif.tobytes())


def _images():
    return [
        _encoded(smooth_photo(900, 700, seed=0), "JPEG", quality=92),
        _encoded(smooth_photo(640, 960, seed=1), "JPEG", quality=90),
        _rotated_jpeg(),
        _encoded(smooth_photo(120, 90, seed=3), "PNG"),
        _encoded(smooth_photo(700, 500, seed=4).convert("L"), "JPEG", quality=90),
        None,
        _encoded(smooth_photo(1000, 800, seed=6), "JPEG", quality=92),
        _encoded(smooth_photo(80, 60, seed=7), "JPEG", quality=95),
    ]


@pytest.fixture(scope="module")
def image_dataset():
    images = _images()
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64"),
                                  "name": datasets.Value("string")})
    return datasets.Dataset.from_dict(
        {"image": [None if data is None else {"bytes": data, "path": None} for data in images],
         "label": list(range(len(images))), "name": [f"img{i}" for i in range(len(images))]},
        features=features)


def _mean_abs_error(a, b):
    return float(np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16)).mean())


def _without_datasets_decoding(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("datasets decoded an image on fastload's path")

    monkeypatch.setattr(datasets.features.image.Image, "decode_example", refuse)


def test_the_transform_is_what_datasets_gives_then_the_transform(image_dataset):
    pipeline = T.Compose([T.Resize(48), T.CenterCrop(40), T.ToArray()])
    ds = image_dataset.with_transform(ImageColumnTransform(pipeline))
    for index in range(len(ds)):
        sample = ds[index]
        decoded = image_dataset[index]["image"]
        assert sample["label"] == index and sample["name"] == f"img{index}"
        if decoded is None:
            assert sample["image"] is None
        else:
            np.testing.assert_array_equal(sample["image"], pipeline(decoded.convert("RGB")))


def test_fastload_decodes_the_column_itself_and_matches_datasets(image_dataset, monkeypatch):
    # Resize(420) reads too few pixels from any of these images to decode them reduced:
    # every image is exactly the one datasets decodes, then the transform.
    pipeline = T.Compose([T.Resize(420), T.CenterCrop(400), T.ToArray()])
    ds = image_dataset.with_transform(ImageColumnTransform(pipeline))
    rows = [0, 1, 2, 3, 4, 6, 7]
    expected = [ds[i] for i in rows]
    _without_datasets_decoding(monkeypatch)
    reader = ImageColumnRows.of(ds)
    assert reader is not None
    for ours, theirs in zip(reader(rows), expected, strict=True):
        assert list(ours) == ["image", "label", "name"]
        assert ours["label"] == theirs["label"] and ours["name"] == theirs["name"]
        np.testing.assert_array_equal(ours["image"], theirs["image"])
    assert reader([5])[0]["image"] is None


def test_random_crops_decoded_reduced_have_the_reference_draws_and_pixels(image_dataset,
                                                                          monkeypatch):
    pipeline = T.Compose([T.RandomResizedCrop(64, scale=(0.3, 1.0)), T.RandomHorizontalFlip(),
                          T.ToArray()])
    ds = image_dataset.with_transform(ImageColumnTransform(pipeline))
    reader = ImageColumnRows.of(ds)
    full = {i: Image.open(io.BytesIO(image_dataset.data.table.column("image")[i]["bytes"]
                                     .as_py())) for i in (0, 1, 6)}
    _without_datasets_decoding(monkeypatch)
    for batch in range(3):
        seed_transform_rng(21, batch)
        ours = reader([0, 1, 6])
        seed_transform_rng(21, batch)
        for sample, index in zip(ours, (0, 1, 6)):
            reference = pipeline(full[index].convert("RGB"))  # the same draws, in the same order
            assert sample["image"].shape == reference.shape == (3, 64, 64)
            assert _mean_abs_error(sample["image"], reference) < DRAFT_MEAN_ERROR_BOUND


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_gives_torchs_batches(image_dataset, torch, workers, monkeypatch):
    pipeline = T.Compose([T.Resize(420), T.CenterCrop(224), T.ToArray(),
                          T.Normalize([0.5, 0.4, 0.3], [0.2, 0.25, 0.3])])
    ds = image_dataset.select([0, 1, 2, 3, 4, 6, 7]).with_transform(
        ImageColumnTransform(pipeline))
    with monkeypatch.context() as patch:
        _without_datasets_decoding(patch)  # (forked workers inherit it)
        ours = list(fl.DataLoader(ds, batch_size=3, num_workers=workers,
                                  timeout=60 if workers else 0))
    theirs = list(torch.utils.data.DataLoader(ds, batch_size=3))
    for a, b in zip(ours, theirs, strict=True):
        assert list(a) == list(b) == ["image", "label", "name"]
        assert a["image"].dtype == np.float32 and a["image"].shape == tuple(b["image"].shape)
        np.testing.assert_array_equal(a["image"], b["image"].numpy())
        np.testing.assert_array_equal(a["label"], b["label"].numpy())
        assert list(a["name"]) == list(b["name"])


def test_shuffled_and_column_subsets_follow_the_dataset(image_dataset, monkeypatch):
    pipeline = T.Compose([T.Resize(420), T.CenterCrop(100), T.ToArray()])
    shuffled = image_dataset.shuffle(seed=3).with_transform(
        ImageColumnTransform(pipeline), columns=["label", "image"])
    expected = [shuffled[i] for i in range(len(shuffled))]
    reader = ImageColumnRows.of(shuffled)
    _without_datasets_decoding(monkeypatch)
    for ours, theirs in zip(reader(list(range(len(shuffled)))), expected, strict=True):
        assert list(ours) == list(theirs) == ["image", "label"]
        assert ours["label"] == theirs["label"]
        if theirs["image"] is None:
            assert ours["image"] is None
        else:
            np.testing.assert_array_equal(ours["image"], theirs["image"])


def test_what_fastload_does_not_decode_itself_goes_through_datasets(image_dataset):
    step = ImageColumnTransform(T.ToArray())
    assert ImageColumnRows.of(image_dataset) is None  # no transform
    assert ImageColumnRows.of(image_dataset.with_transform(lambda batch: batch)) is None
    # The other columns beside the transform's, unformatted: datasets' own path.
    assert ImageColumnRows.of(image_dataset.with_transform(step, columns=["image"],
                                                           output_all_columns=True)) is None
    named = ImageColumnRows.of(image_dataset.with_transform(ImageColumnTransform(None, "label")))
    assert named is None  # not an Image() column
    reader = ImageColumnRows.of(image_dataset.with_transform(step))
    with pytest.raises(IndexError):
        reader([len(image_dataset)])  # the dataset's own indexing answers


def test_decode_false_values_and_bad_bytes(image_dataset, tmp_path):
    raw = image_dataset.cast_column("image", datasets.Image(decode=False))
    step = ImageColumnTransform(T.Compose([T.Resize(420), T.ToArray()]))
    decoding = image_dataset.with_transform(step)
    for index in (0, 3):
        np.testing.assert_array_equal(step.image(raw[index]["image"]), decoding[index]["image"])
    broken = datasets.Dataset.from_dict(
        {"image": [{"bytes": b"not an image", "path": None}]},
        features=datasets.Features({"image": datasets.Image()}))
    reader = ImageColumnRows.of(broken.with_transform(step))
    with pytest.raises(Image.UnidentifiedImageError) as caught:
        reader([0])
    assert "sample 0 (column 'image')" in "".join(caught.value.__notes__)
    with pytest.raises(KeyError, match="no column 'picture'"):
        ImageColumnTransform(None, "picture")({"image": []})


def test_images_stored_by_local_path_are_read_from_the_file(tmp_path, monkeypatch):
    path = tmp_path / "photo.jpg"
    smooth_photo(320, 240, seed=5).save(path, quality=90)
    stored = datasets.Dataset.from_dict(
        {"image": [{"bytes": None, "path": str(path)}], "label": [4]},
        features=datasets.Features({"image": datasets.Image(), "label": datasets.Value("int8")}))
    pipeline = T.Compose([T.Resize(200), T.ToArray()])
    ds = stored.with_transform(ImageColumnTransform(pipeline))
    expected = ds[0]
    reader = ImageColumnRows.of(ds)
    with monkeypatch.context() as patch:
        _without_datasets_decoding(patch)
        ours = reader([0])[0]
    np.testing.assert_array_equal(ours["image"], expected["image"])
    assert ours["label"] == expected["label"] == 4
    path.unlink()
    with pytest.raises(FileNotFoundError):  # (datasets' own path answers for a missing file)
        reader([0])
