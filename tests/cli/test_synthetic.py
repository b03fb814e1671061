"""Synthetic image folders: the same pixels whatever the number of processes writing them."""

from __future__ import annotations

import os

from fastload.cli import write_image_folder


def test_synthetic_generation_is_deterministic_across_worker_counts(tmp_path):
    one = write_image_folder(tmp_path / "one", [20, 3], (24, 16), seed=5, workers=1)
    two = write_image_folder(tmp_path / "two", [20, 3], (24, 16), seed=5, workers=2)
    assert [os.path.relpath(p, tmp_path / "one") for p in one] == \
        [os.path.relpath(p, tmp_path / "two") for p in two]
    for a, b in zip(one, two):
        with open(a, "rb") as fa, open(b, "rb") as fb:
            assert fa.read() == fb.read()
