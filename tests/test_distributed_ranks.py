"""DistributedSampler under real ranks: processes in a gloo group on 127.0.0.1 (started by
the test with torchrun's environment, or by ``torchrun`` itself), each iterating a
fastload DataLoader with 2 workers.

fastload's order differs from torch's by design (another permutation), so each rank's
indices are compared with torch's DistributedSampler by what the padding and drop_last
rules decide: how many indices each rank gets, how many batches, which samples are
repeated or dropped (as many), and that the ranks' shares are otherwise disjoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from ranks import LOOPBACK_ENV, run_ranks, run_torchrun  # noqa: E402

# (dataset length, batch size, loader drop_last, sampler drop_last)
CASES = [(n, b, dl, sdl) for n in (7, 23, 24) for b in (2, 5) for dl in (False, True)
         for sdl in (False, True)]

RANK_SCRIPT = r"""
import json, os, sys, time
import numpy as np
import psutil
import torch.distributed as dist
import fastload as fl

# run_ranks' own file store; under torchrun (None) its env:// rendezvous
dist.init_process_group("gloo", init_method=os.environ.get("FASTLOAD_TEST_INIT_METHOD"))
rank, world = dist.get_rank(), dist.get_world_size()
# The group decides, not the environment (torchrun's RANK would agree anyway).
os.environ["RANK"], os.environ["WORLD_SIZE"] = "99", "100"
cases, out = json.loads(sys.argv[1]), sys.argv[2]
results = []
for n, batch_size, drop_last, sampler_drop_last in cases:
    dataset = fl.ArrayDataset(np.arange(n))
    sampler = fl.DistributedSampler(dataset, seed=7, drop_last=sampler_drop_last)
    assert (sampler.rank, sampler.num_replicas) == (rank, world)
    loader = fl.DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=2,
                           drop_last=drop_last)
    epochs = []
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        epochs.append([batch[0].tolist() for batch in loader])
    results.append({"case": [n, batch_size, drop_last, sampler_drop_last], "epochs": epochs,
                    "len": len(loader)})
    del loader
# Every rank ends with no worker left (workers exit after their epoch).
deadline = time.monotonic() + 20
while psutil.Process().children() and time.monotonic() < deadline:
    time.sleep(0.05)
with open(out % rank, "w") as f:
    json.dump({"rank": rank, "world": world, "results": results,
               "children": len(psutil.Process().children())}, f)
dist.barrier()
dist.destroy_process_group()
"""


def torch_shares(torch, n, world, sampler_drop_last, batch_size, drop_last):
    """torch's DistributedSampler per rank (epoch 0, seed 7), cut as the loader batches it."""
    shares = []
    for rank in range(world):
        share = list(torch.utils.data.DistributedSampler(range(n), num_replicas=world, rank=rank,
                                                         seed=7, drop_last=sampler_drop_last))
        if drop_last:
            share = share[:len(share) - len(share) % batch_size]
        shares.append(share)
    return shares


def check_rank_outputs(torch, outputs, world):
    assert [o["rank"] for o in outputs] == list(range(world))
    assert all(o["world"] == world and o["children"] == 0 for o in outputs)
    for position, case in enumerate(CASES):
        n, batch_size, drop_last, sampler_drop_last = case
        ranks = [o["results"][position] for o in outputs]
        assert all(r["case"] == list(case) for r in ranks)
        expected = torch_shares(torch, n, world, sampler_drop_last, batch_size, drop_last)
        for epoch in (0, 1):
            batches = [r["epochs"][epoch] for r in ranks]
            # Every rank steps as often, as len(loader) says; batches as torch's.
            assert {len(b) for b in batches} == {ranks[0]["len"]}, case
            assert [[len(x) for x in b] for b in batches] == \
                [[len(x) for x in b] for b in _batched(expected, batch_size)], case
            shares = [[v for x in b for v in x] for b in batches]
            seen = Counter(v for share in shares for v in share)
            torch_seen = Counter(v for share in expected for v in share)
            # As many samples seen, as many repeated (padding), as many never seen.
            assert sorted(seen.values()) == sorted(torch_seen.values()), case
            assert n - len(seen) == n - len(torch_seen), case
            assert set(seen) <= set(range(n))
            if not sampler_drop_last and not drop_last:
                assert set(seen) == set(range(n)), case
        # set_epoch reorders (the same on every rank: the shares stay disjoint above).
        orders = [[r["epochs"][epoch] for r in ranks] for epoch in (0, 1)]
        if sum(len(b) for b in orders[0]) >= 2:
            assert orders[0] != orders[1], f"set_epoch changed no order: {case}"


def _batched(shares, batch_size):
    return [[share[i:i + batch_size] for i in range(0, len(share), batch_size)]
            for share in shares]


# Each world size is run once: 3 ranks started by the test, 2 by torchrun.  The
# script and the checks are the same for both, so 2 ranks under run_ranks would
# repeat torchrun's 2 with only the test's own rendezvous changed.
@pytest.mark.timeout(240)
def test_ranks_split_the_dataset_by_torchs_rules(torch, tmp_path):
    world = 3
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    out = str(tmp_path / "rank-%d.json")
    run_ranks(world, [sys.executable, str(script), json.dumps(CASES), out], timeout=200)
    check_rank_outputs(torch, [json.load(open(out % r)) for r in range(world)], world)


@pytest.mark.timeout(240)
def test_ranks_started_by_torchrun(torch, tmp_path):
    # The world size of 2 (see above) and torchrun's env:// rendezvous.
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    out = str(tmp_path / "rank-%d.json")
    cases = json.dumps(CASES)
    run_torchrun(2, [str(script), cases, out], timeout=200)
    check_rank_outputs(torch, [json.load(open(out % r)) for r in range(2)], 2)


NO_TORCH_SCRIPT = r"""
import sys
import numpy as np
import fastload as fl

dataset = fl.ArrayDataset(np.arange(23))
sampler = fl.DistributedSampler(dataset, seed=3)
loader = fl.DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=2)
batches = [b[0].tolist() for b in loader]
state = loader.state_dict()
assert (sampler.rank, sampler.num_replicas) == (1, 3), (sampler.rank, sampler.num_replicas)
assert state["distributed"]["num_replicas"] == 3
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
print(sum(batches, []))
"""


@pytest.mark.timeout(120)
def test_rank_and_world_size_come_from_the_environment_without_torch(tmp_path):
    env = dict(os.environ, RANK="1", WORLD_SIZE="3", LOCAL_RANK="1", **LOOPBACK_ENV)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "-c", NO_TORCH_SCRIPT], env=env, timeout=100,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    indices = json.loads(result.stdout)
    assert len(indices) == 8  # ceil(23 / 3)


@pytest.mark.timeout(60)
def test_without_a_group_or_environment_the_error_says_what_to_set(monkeypatch):
    import fastload as fl

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is initialised in this test process")
    with pytest.raises(ValueError, match="WORLD_SIZE from the environment"):
        fl.DistributedSampler(range(4))
