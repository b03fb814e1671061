"""The cached synthetic folder ``python -m fastload bench`` loads when given no ROOT."""

from __future__ import annotations

import os

import pytest
from PIL import Image

import fastload.cli.synthetic_folder as synthetic_folder
from fastload.cli import synthetic_image_folder
from fastload.vision import ImageFolder


def test_synthetic_folder_has_requested_count_classes_and_size(tmp_path):
    root = synthetic_image_folder(10, (40, 30), 3, cache_dir=str(tmp_path))
    ds = ImageFolder(root)
    assert len(ds) == 10
    assert ds.classes == ["class_00", "class_01", "class_02"]
    assert [list(ds.targets).count(k) for k in range(3)] == [4, 3, 3]  # extras to the first classes
    for path, _ in ds.samples:
        with Image.open(path) as img:
            assert img.format == "JPEG" and img.size == (40, 30)
    assert os.listdir(tmp_path) == [os.path.basename(root)]  # no temporary build left behind


def test_synthetic_folder_is_cached_and_reused(tmp_path, monkeypatch):
    first = synthetic_image_folder(6, (20, 20), 2, cache_dir=str(tmp_path))
    stamp = os.stat(os.path.join(first, "class_00", "img_00000.jpg")).st_mtime_ns

    def must_not_generate(*args, **kwargs):
        raise AssertionError("the cached folder should have been reused")

    monkeypatch.setattr(synthetic_folder, "write_image_folder", must_not_generate)
    assert synthetic_image_folder(6, (20, 20), 2, cache_dir=str(tmp_path)) == first
    assert os.stat(os.path.join(first, "class_00", "img_00000.jpg")).st_mtime_ns == stamp
    # Different parameters are a different folder.
    monkeypatch.undo()
    other = synthetic_image_folder(6, (20, 10), 2, cache_dir=str(tmp_path))
    assert other != first and len(ImageFolder(other)) == 6


def test_failed_build_leaves_no_folder(tmp_path, monkeypatch):
    def explode(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(synthetic_folder, "write_image_folder", explode)
    with pytest.raises(OSError, match="disk full"):
        synthetic_image_folder(4, (8, 8), 2, cache_dir=str(tmp_path))
    assert os.listdir(tmp_path) == []
