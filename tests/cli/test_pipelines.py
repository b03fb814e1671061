"""fastload's side of the bench: which JPEG decode its pipeline plans, and ``--decode full``."""

from __future__ import annotations

import pytest

from fastload.cli import reduced_decode_shares, standard_transform
from fastload.cli.pipelines import image_folder


def test_reduced_decode_shares_follow_image_size(tiny_folder, photo_folder):
    small = reduced_decode_shares(tiny_folder)
    assert small == {1: 1.0, 2: 0.0, 4: 0.0, 8: 0.0}
    large = reduced_decode_shares(photo_folder, probe=8)
    assert sum(large.values()) == pytest.approx(1.0)
    assert large[1] < 1.0  # some crops of a 1600x1200 photo are over twice 224 each way


def test_full_decode_folder_never_drafts(photo_folder, monkeypatch):
    from decode_spy import record_reductions

    drafts = record_reductions(monkeypatch)  # Pillow's draft or simplejpeg's scaled decode
    full = image_folder(photo_folder, standard_transform(), "full")
    auto = image_folder(photo_folder, standard_transform(), "auto")
    for index in range(len(full)):
        full[index]
    assert drafts == []
    for index in range(len(auto)):
        auto[index]
    assert drafts, "the default decode should have drafted some of the 1600x1200 photos"
    with pytest.raises(ValueError, match="decode"):
        image_folder(photo_folder, None, "fast")


def test_torch_side_with_draft_decodes_at_the_smallest_scale_still_covering_the_output(
        photo_folder, monkeypatch, torch):
    from PIL import Image

    from fastload.cli import TorchvisionStylePipeline

    samples = list(image_folder(photo_folder).samples)
    sizes = []
    real_convert = Image.Image.convert
    monkeypatch.setattr(Image.Image, "convert",
                        lambda self, *a, **k: sizes.append(self.size) or real_convert(self, *a, **k))
    full = TorchvisionStylePipeline(samples, 224)
    reduced = TorchvisionStylePipeline(samples, 224, draft=True)
    torch.manual_seed(3)
    expected_full = full[0][0]
    torch.manual_seed(3)
    got = reduced[0][0]
    # 1600x1200 at 1/4 is 400x300, the smallest at least 224 each way.
    assert sizes == [(1600, 1200), (400, 300)]
    assert got.shape == expected_full.shape == (3, 224, 224)
    assert not torch.equal(got, expected_full)
