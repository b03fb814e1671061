"""Image folders shared by the tests of ``fastload.cli``."""

from __future__ import annotations

import pytest

from fastload.cli import write_image_folder


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    write_image_folder(root, 10, (64, 48), classes=4, seed=3)
    return str(root)


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory):
    # Large enough that most RandomResizedCrop(224) boxes allow a reduced-size decode.
    root = tmp_path_factory.mktemp("photos")
    write_image_folder(root, 4, (1600, 1200), classes=2, seed=5)
    return str(root)
