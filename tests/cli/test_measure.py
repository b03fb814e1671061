"""The measurements behind ``python -m fastload bench``, called directly."""

from __future__ import annotations

import pytest

from fastload.cli import measure_fastload, measure_pipeline_limit


def test_measure_functions_return_rates(tiny_folder):
    limit = measure_pipeline_limit(tiny_folder, workers=2)
    assert limit["images"] == 40 and limit["limit_images_per_s"] == pytest.approx(2 * limit["images_per_s"])
    result = measure_fastload(tiny_folder, workers=0, batch_size=16, max_images=20)
    assert result["images"] == 20 and result["images_per_s"] > 0 and result["input_mb_per_s"] > 0
