"""examples/train_ddp.py as CI runs it: trained under torchrun on 2 ranks until past a
checkpoint (a pre-emption after it), resumed from that checkpoint on 1 rank to the end
of the epoch; every sample of the epoch is trained on once across the two runs."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from ranks import run_torchrun  # noqa: E402

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "examples", "train_ddp.py")
IMAGES = 64
TINY = ["--images", str(IMAGES), "--image-size", "64", "--classes", "4", "--crop", "32",
        "--batch-size", "8", "--workers", "1", "--epochs", "1", "--checkpoint-every", "2"]


def logged(prefix: str, ranks: int) -> list[dict]:
    lines = []
    for rank in range(ranks):
        with open(f"{prefix}.rank{rank}") as f:
            lines += [json.loads(line) for line in f]
    return lines


def summary(output: str) -> dict:
    return json.loads([line for line in output.splitlines() if line.startswith("{")][-1])


@pytest.mark.timeout(300)
def test_the_example_resumes_on_another_world_size_with_each_sample_once(torch, tmp_path):
    env = {"FASTLOAD_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    checkpoint = str(tmp_path / "ckpt.pt")
    first, second = str(tmp_path / "first"), str(tmp_path / "second")
    common = [EXAMPLE, *TINY, "--checkpoint", checkpoint]

    # 2 ranks stop at step 3: the checkpoint of step 2 is the last one, step 3 is lost.
    out = run_torchrun(2, [*common, "--max-steps", "3", "--log-indices", first], 150, env)
    assert summary(out)["last_step"] == 3
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    assert (saved["world_size"], saved["step"], saved["epoch"]) == (2, 2, 0)
    assert len(saved["loader_states"]) == 2

    out = run_torchrun(1, [*common, "--resume", "--log-indices", second], 150, env)
    result = summary(out)
    assert result["ranks"] == 1 and result["loader"] == "fastload"

    before = [line for line in logged(first, 2) if line["step"] <= saved["step"]]
    after = logged(second, 1)
    assert {line["epoch"] for line in before + after} == {0}
    assert [line["step"] for line in after] == list(range(3, 3 + len(after)))
    seen = Counter(i for line in before + after for i in line["indices"])
    assert set(seen) == set(range(IMAGES))
    assert sum(seen.values()) - IMAGES <= 1  # padding: at most one per split, here none
    # The checkpoint at the epoch's end is the second run's, on 1 rank.
    final = torch.load(checkpoint, map_location="cpu", weights_only=True)
    assert (final["world_size"], final["epoch"], final["epoch_step"]) == (1, 1, 0)


def test_the_example_loads_its_checkpoint_with_weights_only(torch, tmp_path):
    # A checkpoint naming a global outside torch's weights_only allowlist is refused
    # before anything of it is used: the example never runs pickled code it loads.
    import argparse
    import fractions
    import importlib.util
    import pickle

    spec = importlib.util.spec_from_file_location("train_ddp_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    path = str(tmp_path / "crafted.pt")
    torch.save({"model": {}, "optimizer": {}, "loader_states": [None], "world_size": 1,
                "epoch": 0, "step": 0, "epoch_step": 0, "extra": fractions.Fraction(1, 3)}, path)
    options = argparse.Namespace(checkpoint=path, loader="fastload")
    with pytest.raises(pickle.UnpicklingError, match="weights_only"):
        example.restore(options, 0, 1, None, None, None, None)
