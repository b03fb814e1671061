"""Elastic resume (fastload/elastic.py): an epoch of a DistributedSampler, checkpointed at a
step every rank reached, finished on another world size, num_workers or rank.

The ranks are samplers built with explicit ``num_replicas`` and ``rank`` in this process;
``test_real_ranks_resume_on_another_world_size`` runs them as processes under gloo.  The
reference for what a resumed rank gets is torch's DistributedSampler (no shuffle) over the
samples of the epoch's order that no rank had seen, in that order.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload as fl
from fastload import DataLoader

sys.path.insert(0, os.path.dirname(__file__))
from ranks import run_ranks  # noqa: E402

N, BATCH, SEED, EPOCH = 23, 3, 5, 4


def make(world, rank, workers=0, n=N, batch_size=BATCH, seed=SEED, shuffle=True,
         sampler_drop_last=False, drop_last=False, sampler_class=None):
    dataset = fl.ArrayDataset(np.arange(n))
    cls = sampler_class or fl.DistributedSampler
    sampler = cls(dataset, num_replicas=world, rank=rank, shuffle=shuffle, seed=seed,
                  drop_last=sampler_drop_last)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=workers,
                        drop_last=drop_last)
    return loader, sampler


def values(batches) -> list[int]:
    return [v for batch in batches for v in batch]


def run_until(world, cut, epoch=EPOCH, **kwargs):
    """Every rank of ``world`` hands out ``cut`` batches of ``epoch``; returns their
    batches and their states (taken at that step)."""
    seen, states = [], []
    for rank in range(world):
        loader, sampler = make(world, rank, **kwargs)
        sampler.set_epoch(epoch)
        iterator = iter(loader)
        seen.append([next(iterator)[0].tolist() for _ in range(cut)])
        states.append(loader.state_dict())
        del iterator
    return seen, states


def resume_on(world, state, workers=0, epoch_after=None, **kwargs):
    """Every rank of ``world`` loads ``state`` and finishes the epoch; with
    ``epoch_after``, then runs that epoch too.  Returns each rank's batches (per epoch)."""
    out = []
    for rank in range(world):
        loader, sampler = make(world, rank, workers=workers, **kwargs)
        loader.load_state_dict(state)
        epochs = [[batch[0].tolist() for batch in loader]]
        if epoch_after is not None:
            sampler.set_epoch(epoch_after)
            epochs.append([batch[0].tolist() for batch in loader])
        out.append(epochs)
    return out


def epoch_order(epoch=EPOCH, n=N, seed=SEED, shuffle=True) -> list[int]:
    """The whole epoch's order: the sampler on a world of one."""
    sampler = fl.DistributedSampler(range(n), num_replicas=1, rank=0, seed=seed, shuffle=shuffle)
    sampler.set_epoch(epoch)
    return list(sampler)


def expected_resumed(torch, seen, world, sampler_drop_last=False, drop_last=False,
                     batch_size=BATCH, **order_kwargs) -> list[list[int]]:
    """Each new rank's samples: torch's split of what no old rank had seen, in epoch order."""
    seen = set(values(values(seen)))
    unseen = [i for i in epoch_order(**order_kwargs) if i not in seen]
    shares = []
    for rank in range(world):
        split = torch.utils.data.DistributedSampler(unseen, num_replicas=world, rank=rank,
                                                    shuffle=False, drop_last=sampler_drop_last)
        share = [unseen[i] for i in split]
        if drop_last:
            share = share[:len(share) - len(share) % batch_size]
        shares.append(share)
    return shares


def cut_points(world, **kwargs) -> list[int]:
    loader, _ = make(world, 0, **kwargs)
    batches = len(loader)
    return sorted({1, batches // 2, batches - 1} - {0})


WORLDS = [(2, 1), (1, 2), (2, 3), (3, 2)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("old, new", WORLDS, ids=[f"{a}to{b}" for a, b in WORLDS])
def test_another_world_size_finishes_the_epoch_with_each_unseen_sample_once(torch, old, new,
                                                                            workers):
    for cut in cut_points(old):
        seen, states = run_until(old, cut)
        for state in (states[0], states[-1]):  # any old rank's state says the same
            resumed = resume_on(new, state, workers=workers, epoch_after=EPOCH + 1)
            shares = [values(epochs[0]) for epochs in resumed]
            assert shares == expected_resumed(torch, seen, new), (old, new, cut)
            # Every new rank steps as often; together with the old ranks every sample of
            # the epoch is seen, twice only as padding (fewer than a world's worth each time).
            assert len({len(epochs[0]) for epochs in resumed}) == 1
            everything = values(values(seen)) + values(shares)
            assert set(everything) == set(range(N))
            assert len(everything) - N <= (old - 1) + (new - 1)
            # The next epoch is a fresh run's on the new world size.
            fresh = []
            for rank in range(new):
                loader, sampler = make(new, rank)
                sampler.set_epoch(EPOCH + 1)
                fresh.append([batch[0].tolist() for batch in loader])
            assert [epochs[1] for epochs in resumed] == fresh


@pytest.mark.parametrize("old, new", WORLDS, ids=[f"{a}to{b}" for a, b in WORLDS])
@pytest.mark.parametrize("sampler_drop_last, drop_last", [(True, False), (False, True), (True, True)])
def test_drop_last_rules_apply_to_what_is_left(torch, old, new, sampler_drop_last, drop_last):
    settings = dict(sampler_drop_last=sampler_drop_last, drop_last=drop_last)
    for cut in cut_points(old, **settings):
        seen, states = run_until(old, cut, **settings)
        resumed = resume_on(new, states[0], **settings)
        shares = [values(epochs[0]) for epochs in resumed]
        assert shares == expected_resumed(torch, seen, new, **settings)
        assert len({len(epochs[0]) for epochs in resumed}) == 1
        everything = values(values(seen)) + values(shares)
        padding = 0 if sampler_drop_last else (old - 1) + (new - 1)  # the sampler's drop_last never pads
        assert len(everything) - len(set(everything)) <= padding


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, 2])
def test_the_same_world_size_and_rank_resume_exact_to_the_batch(world, workers):
    for cut in cut_points(world):
        _, states = run_until(world, cut)
        for rank in range(world):
            loader, sampler = make(world, rank)
            sampler.set_epoch(EPOCH)
            expected = [batch[0].tolist() for batch in loader][cut:]
            resumed, _ = make(world, rank, workers=workers)
            resumed.load_state_dict(states[rank])
            assert [batch[0].tolist() for batch in resumed] == expected


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("sampler_drop_last", [False, True])
def test_rank_zeros_state_resumes_every_rank_of_the_same_world_exactly(world, sampler_drop_last):
    # Checkpoints often keep rank 0's loader state only: every rank reached that
    # step, so each continues its own share, the padded samples included.
    for cut in cut_points(world):
        _, states = run_until(world, cut, sampler_drop_last=sampler_drop_last)
        for rank in range(world):
            loader, sampler = make(world, rank, sampler_drop_last=sampler_drop_last)
            sampler.set_epoch(EPOCH)
            expected = [batch[0].tolist() for batch in loader][cut:]
            resumed, _ = make(world, rank, sampler_drop_last=sampler_drop_last)
            resumed.load_state_dict(states[0])
            assert [batch[0].tolist() for batch in resumed] == expected


def test_a_state_from_an_epoch_every_rank_finished_resumes_nothing_of_it():
    # All batches handed out, the loop not yet ended: the epoch is over everywhere.
    _, states = run_until(3, len(make(3, 0)[0]), sampler_drop_last=True)
    assert resume_on(2, states[0], sampler_drop_last=True) == [[[]], [[]]]


def test_a_state_between_epochs_starts_the_next_epoch_on_the_new_world_size():
    loader, sampler = make(2, 0)
    sampler.set_epoch(EPOCH)
    list(loader)
    state = loader.state_dict()
    resumed, sampler = make(3, 1)
    resumed.load_state_dict(state)
    sampler.set_epoch(EPOCH + 1)
    fresh, fresh_sampler = make(3, 1)
    fresh_sampler.set_epoch(EPOCH + 1)
    assert [b[0].tolist() for b in resumed] == [b[0].tolist() for b in fresh]


def test_a_resumed_epoch_checkpointed_again_resumes_anywhere(torch):
    # 2 ranks -> 3 ranks after 2 batches -> 2 ranks after 1 more; and on the
    # second world size itself, each rank exact to the batch.
    seen, states = run_until(2, 2)
    middle, middle_states = [], []
    for rank in range(3):
        loader, _ = make(3, rank)
        loader.load_state_dict(states[0])
        iterator = iter(loader)
        middle.append([next(iterator)[0].tolist()])
        middle_states.append(loader.state_dict())
        rest = [batch[0].tolist() for batch in iterator]
        again, _ = make(3, rank, workers=2)
        again.load_state_dict(middle_states[rank])
        assert [batch[0].tolist() for batch in again] == rest
    assert middle_states[0]["distributed"] == {"num_replicas": 3, "rank": 0, "start": 2 * 3 * 2}
    last = resume_on(2, middle_states[1])
    shares = [values(epochs[0]) for epochs in last]
    assert shares == expected_resumed(torch, seen + middle, 2)
    everything = values(values(seen + middle)) + values(shares)
    assert set(everything) == set(range(N)) and len(everything) - N <= 1 + 2 + 1


def test_a_loaded_state_not_yet_resumed_is_returned_for_the_new_world_size():
    _, states = run_until(2, 2)
    loader, _ = make(3, 2)
    loader.load_state_dict(states[0])
    state = loader.state_dict()
    assert state["distributed"] == {"num_replicas": 3, "rank": 2, "start": 12}
    assert state["batches_yielded"] == 0
    again, _ = make(3, 2)
    again.load_state_dict(state)
    assert [b[0].tolist() for b in again] == [b[0].tolist() for b in loader]


def test_torchs_distributed_sampler_resumes_elastically_too(torch):
    cls = torch.utils.data.DistributedSampler
    seen, states = run_until(2, 3, sampler_class=cls)
    resumed = resume_on(3, states[1], sampler_class=cls, workers=2)
    full = cls(range(N), num_replicas=1, rank=0, seed=SEED)
    full.set_epoch(EPOCH)
    order = list(full)
    unseen = [i for i in order if i not in set(values(values(seen)))]
    expected = [[unseen[i] for i in cls(unseen, num_replicas=3, rank=r, shuffle=False)]
                for r in range(3)]
    assert [values(epochs[0]) for epochs in resumed] == expected


def test_a_loader_without_batching_resumes_elastically():
    def make_single(world, rank):
        dataset = fl.ArrayDataset(np.arange(N))
        sampler = fl.DistributedSampler(dataset, num_replicas=world, rank=rank, seed=SEED)
        sampler.set_epoch(EPOCH)
        return DataLoader(dataset, batch_size=None, sampler=sampler)

    seen = []
    for rank in range(2):
        iterator = iter(make_single(2, rank))
        seen += [int(next(iterator)[0]) for _ in range(5)]
    loader = make_single(2, 0)
    iterator = iter(loader)
    for _ in range(5):
        next(iterator)
    state = loader.state_dict()
    rest = [int(sample[0]) for rank in range(3)
            for sample in _loaded(make_single(3, rank), state)]
    assert set(seen + rest) == set(range(N)) and len(seen + rest) - N <= 1 + 2


def _loaded(loader, state):
    loader.load_state_dict(state)
    return loader


@pytest.mark.parametrize("change, reason", [
    (dict(n=N + 1), "dataset_length=23, this one has dataset_length=24"),
    (dict(batch_size=BATCH + 1), "batch_size=3, this one has"),
    (dict(seed=SEED + 1), "seed=5, this one has"),
    (dict(shuffle=False), "shuffle=True, this one has"),
    (dict(sampler_drop_last=True), "drop_last=False, this one has"),
], ids=["dataset length", "batch size", "seed", "shuffle", "sampler drop_last"])
def test_a_state_that_cannot_apply_on_another_world_size_is_refused(change, reason):
    _, states = run_until(2, 2)
    loader, _ = make(3, 0, **change)
    with pytest.raises(ValueError, match=reason):
        loader.load_state_dict(states[0])


def test_a_state_with_batches_handed_out_of_order_resumes_only_on_its_own_rank():
    state = run_until(2, 2)[1][0]
    state["yielded_after"] = [state["batches_yielded"] + 1]
    make(2, 0)[0].load_state_dict(state)
    with pytest.raises(ValueError, match=r"in_order=False.*own world size \(2\) and rank \(0\)"):
        make(3, 0)[0].load_state_dict(state)


@pytest.mark.parametrize("record", [
    {"num_replicas": 0, "rank": 0, "start": 0}, {"num_replicas": 2, "rank": 2, "start": 0},
    {"num_replicas": 2, "rank": 0, "start": -1}, {"num_replicas": 2, "rank": 0}, "2 ranks",
])
def test_a_malformed_distributed_record_is_refused(record):
    state = run_until(2, 1)[1][0]
    state["distributed"] = record
    with pytest.raises(ValueError, match="'distributed' must hold"):
        make(3, 0)[0].load_state_dict(state)


def test_a_start_past_the_dataset_is_refused():
    state = run_until(2, 1)[1][0]
    state["distributed"] = {"num_replicas": 2, "rank": 0, "start": N + 1}
    with pytest.raises(ValueError, match=f"reached sample {N + 1}.*has {N} samples"):
        make(2, 0)[0].load_state_dict(state)


def test_the_state_stays_a_small_plain_dict():
    state = run_until(2, 2)[1][0]
    assert json.loads(json.dumps(state["distributed"])) == state["distributed"]
    # Between epochs, a state also holds torch's global generator as it was (about
    # 5 KB, rng.py's pinned state), whatever the dataset's length.
    assert len(repr(make(2, 0, n=10 ** 6)[0].state_dict())) < 12_000


RANK_SCRIPT = r"""
import json, os, sys
import numpy as np
import torch.distributed as dist
import fastload as fl

# Three processes of one launch (each imports torch once): ranks 0 and 1 first
# form a group of 2 of their own and stop after 3 steps; then all three form
# run_ranks' group of 3 and finish the epoch from rank 0's state.
first, second, state_file = sys.argv[1], sys.argv[2], sys.argv[3]
init_method = os.environ["FASTLOAD_TEST_INIT_METHOD"]  # file://STORE?rank=R&world_size=3
rank = int(os.environ["RANK"])


def make_loader():
    dataset = fl.ArrayDataset(np.arange(23))
    sampler = fl.DistributedSampler(dataset, seed=5)   # rank and world size from the group
    loader = fl.DataLoader(dataset, batch_size=3, sampler=sampler, num_workers=2)
    sampler.set_epoch(4)
    return loader


if rank < 2:
    os.environ["WORLD_SIZE"] = "2"  # as a launcher of 2 ranks would set it
    store = init_method.split("?")[0]
    dist.init_process_group("gloo", init_method=f"{store}-first?rank={rank}&world_size=2")
    loader, seen = make_loader(), []
    for step, batch in enumerate(loader, 1):
        seen += batch[0].tolist()
        if step == 3:
            break
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, loader.state_dict())
    if rank == 0:
        with open(state_file, "w") as f:
            json.dump(states, f)
    with open(first % rank, "w") as f:
        json.dump(seen, f)
    del loader
    dist.barrier()
    dist.destroy_process_group()
    os.environ["WORLD_SIZE"] = "3"

# Rank 0 wrote the states before it joins this group: every rank finds them.
dist.init_process_group("gloo", init_method=init_method)
with open(state_file) as f:
    states = json.load(f)
loader = make_loader()
loader.load_state_dict(states[0])
seen = [v for batch in loader for v in batch[0].tolist()]
with open(second % dist.get_rank(), "w") as f:
    json.dump(seen, f)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.timeout(180)
def test_real_ranks_resume_on_another_world_size(torch, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    state_file = str(tmp_path / "states.json")
    first = str(tmp_path / "first-%d.json")
    second = str(tmp_path / "second-%d.json")
    run_ranks(3, [sys.executable, str(script), first, second, state_file], timeout=150)
    seen = [json.load(open(first % r)) for r in range(2)]
    rest = [json.load(open(second % r)) for r in range(3)]
    assert all(len(s) == 9 for s in seen)
    assert len({len(r) for r in rest}) == 1
    everything = values(seen) + values(rest)
    assert set(everything) == set(range(N)) and len(everything) - N <= 1 + 2


def test_persistent_workers_resume_elastically_and_go_on_to_the_next_epoch(torch):
    seen, states = run_until(2, 2)
    shares, next_epochs = [], []
    for rank in range(3):
        dataset = fl.ArrayDataset(np.arange(N))
        sampler = fl.DistributedSampler(dataset, num_replicas=3, rank=rank, seed=SEED)
        loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, num_workers=2,
                            persistent_workers=True)
        loader.load_state_dict(states[1])
        shares.append([v for batch in loader for v in batch[0].tolist()])
        sampler.set_epoch(EPOCH + 1)
        next_epochs.append([batch[0].tolist() for batch in loader])
    assert shares == expected_resumed(torch, seen, 3)
    fresh = []
    for rank in range(3):
        loader, sampler = make(3, rank)
        sampler.set_epoch(EPOCH + 1)
        fresh.append([batch[0].tolist() for batch in loader])
    assert next_epochs == fresh


@pytest.mark.filterwarnings("ignore:DataLoader.state_dict. the order of")  # a caller's sampler
def test_a_subclass_of_distributed_sampler_resumes_only_on_its_own_world_size():
    class Mine(fl.DistributedSampler):
        pass

    _, states = run_until(2, 2, sampler_class=Mine)
    make(2, 0, sampler_class=Mine)[0].load_state_dict(states[0])
    with pytest.raises(ValueError, match=r"num_replicas=2 and rank=0, this one has .*"
                                         r"num_replicas=3 and rank=0; only .* not .*Mine"):
        make(3, 0, sampler_class=Mine)[0].load_state_dict(states[0])


@settings(max_examples=120, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 40), batch_size=st.integers(1, 6),
       worlds=st.lists(st.integers(1, 4), min_size=2, max_size=3),
       sampler_drop_last=st.booleans(), drop_last=st.booleans(), shuffle=st.booleans(),
       cuts=st.lists(st.floats(0, 1), min_size=2, max_size=2))
def test_any_chain_of_world_sizes_sees_each_sample_once(torch, n, batch_size, worlds,
                                                         sampler_drop_last, drop_last, shuffle,
                                                         cuts):
    # Hop from world size to world size, each hop's ranks stopping at a step all reached.
    # On another world size every new rank takes one state (rank 0's or the last rank's)
    # and gets torch's split of the samples of the epoch's order nobody has seen; on the
    # same world size each rank takes its own and goes on exactly (the same samples; the
    # padding, if any, repeats the epoch's head instead of the suffix's).  Every rank has
    # as many batches; once a world has finished its shares, the epoch is over.
    options = dict(n=n, batch_size=batch_size, sampler_drop_last=sampler_drop_last,
                   drop_last=drop_last, shuffle=shuffle)

    def hop_loaders(world, states, hop):
        loaders = []
        for rank in range(world):
            loader, sampler = make(world, rank, **options)
            sampler.set_epoch(EPOCH)
            if states is not None:
                same = states[0]["distributed"]["num_replicas"] == world
                loader.load_state_dict(states[rank] if same else states[-(hop % 2)])
            loaders.append(loader)
        return loaders

    states, seen, over = None, [], False
    for hop, world in enumerate(worlds):
        batches = [[batch[0].tolist() for batch in loader]
                   for loader in hop_loaders(world, states, hop)]
        assert len({len(b) for b in batches}) == 1
        if states is not None:
            shares = [values(b) for b in batches]
            expected = [[] for _ in range(world)] if over else expected_resumed(
                torch, [seen], world, sampler_drop_last=sampler_drop_last, drop_last=drop_last,
                batch_size=batch_size, n=n, shuffle=shuffle)
            if worlds[hop - 1] != world:
                assert shares == expected, hop
            else:
                assert [len(s) for s in shares] == [len(s) for s in expected], hop
                assert set(values(shares)) - set(values(seen)) == set(values(expected)), hop
        if hop == len(worlds) - 1:
            seen += values(batches)
            break
        cut = round(cuts[hop] * len(batches[0]))
        over = over or cut == len(batches[0])
        previous, states = states, []
        for loader in hop_loaders(world, previous, hop):
            iterator = iter(loader)
            seen += [next(iterator)[0].tolist() for _ in range(cut)]
            states.append(loader.state_dict())
            del iterator
    everything = values(seen)
    assert set(everything) <= set(range(n))
    if not (sampler_drop_last or drop_last or over):
        assert set(everything) == set(range(n))
    if sampler_drop_last:
        assert len(everything) == len(set(everything))
