"""``generator=None`` with torch imported: ``torch.manual_seed`` governs fastload's order,
and fastload draws from torch's default generator exactly as torch's loader does, so a
script's later torch draws (weight init, dropout) are what they would be under torch's
loader (NOTE [ torch's global seed ] in fastload/rng.py).  Without torch, OS entropy."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastload as fl

pytestmark = pytest.mark.timeout(180)

N = 23
WEIGHTS = [float(i % 5) + 0.5 for i in range(N)]


def data() -> list:
    return list(range(N))


# Each way of choosing the order, built from either library's module (torch.utils.data
# or fastload), as the loader's keyword arguments.
SETUPS = {
    "shuffle": lambda m: dict(shuffle=True, batch_size=4),
    "in order": lambda m: dict(batch_size=4),
    "random": lambda m: dict(sampler=m.RandomSampler(data()), batch_size=4),
    "random with replacement": lambda m: dict(
        sampler=m.RandomSampler(data(), replacement=True, num_samples=30), batch_size=4),
    "random num_samples": lambda m: dict(sampler=m.RandomSampler(data(), num_samples=50),
                                         batch_size=4),
    "subset": lambda m: dict(sampler=m.SubsetRandomSampler([3, 1, 4, 15, 9, 2, 6]),
                             batch_size=3),
    "weighted": lambda m: dict(sampler=m.WeightedRandomSampler(WEIGHTS, 30), batch_size=4),
    "weighted without replacement": lambda m: dict(
        sampler=m.WeightedRandomSampler(WEIGHTS, 12, replacement=False), batch_size=4),
    "batch sampler": lambda m: dict(
        batch_sampler=m.BatchSampler(m.RandomSampler(data()), 5, drop_last=False)),
    "no batching": lambda m: dict(shuffle=True, batch_size=None),
    "distributed": lambda m: dict(
        sampler=m.DistributedSampler(data(), num_replicas=2, rank=1), batch_size=4),
}

WORKERS = {"0": dict(num_workers=0), "2": dict(num_workers=2),
           "2 persistent": dict(num_workers=2, persistent_workers=True)}


def as_lists(batch) -> list:
    return np.asarray(batch).tolist()


def two_epochs(loader) -> list:
    return [[as_lists(b) for b in loader] for _ in range(2)]


def one_epoch(loader) -> list:
    return [as_lists(b) for b in loader]


def break_then_epoch(loader) -> list:
    seen = []
    for i, batch in enumerate(loader):
        seen.append(as_lists(batch))
        if i == 1:
            break
    return [seen, one_epoch(loader)]


def iter_twice(loader) -> list:
    # Made and dropped, then made again and read once: torch draws at both.
    iter(loader)
    second = iter(loader)
    return [as_lists(next(second))]


def length_then_epoch(loader) -> list:
    return [len(loader), one_epoch(loader)]


PATTERNS = {"two epochs": two_epochs, "one epoch": one_epoch, "break": break_then_epoch,
            "iter twice": iter_twice, "len": length_then_epoch}


def modules(torch):
    import torch.utils.data as td

    return {"torch": td, "fastload": fl}


def run(torch, library, setup, workers, pattern, seed=7) -> tuple[list, float]:
    """The batches ``pattern`` saw, and the next torch draw after it, from ``seed``."""
    torch.manual_seed(seed)
    m = modules(torch)[library]
    loader = m.DataLoader(data(), **SETUPS[setup](m), **WORKERS[workers])
    seen = PATTERNS[pattern](loader)
    return seen, torch.rand(1).item()


# -- torch's later draws are those torch's loader leaves ----------------------------

@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("setup", SETUPS)
def test_the_next_torch_draw_after_two_epochs_is_torchs(torch, setup, workers):
    _, ours = run(torch, "fastload", setup, workers, "two epochs")
    _, theirs = run(torch, "torch", setup, workers, "two epochs")
    assert ours == theirs


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("pattern", ["one epoch", "break", "iter twice", "len"])
@pytest.mark.parametrize("setup", ["shuffle", "subset", "weighted", "batch sampler"])
def test_the_next_torch_draw_after_any_iteration_pattern_is_torchs(torch, setup, workers,
                                                                   pattern):
    _, ours = run(torch, "fastload", setup, workers, pattern)
    _, theirs = run(torch, "torch", setup, workers, pattern)
    assert ours == theirs


def test_an_iterator_made_and_never_read_draws_as_torchs(torch):
    for library in ("torch", "fastload"):
        torch.manual_seed(3)
        m = modules(torch)[library]
        iter(m.DataLoader(data(), shuffle=True))  # the base seed only: no next()
        draw = torch.rand(1).item()
        if library == "torch":
            expected = draw
    assert draw == expected


class Stream(fl.IterableDataset):
    def __iter__(self):
        return iter(range(10))


@pytest.mark.parametrize("workers", WORKERS)
def test_the_next_torch_draw_after_an_iterable_dataset_is_torchs(torch, workers):
    import torch.utils.data as td

    class TorchStream(td.IterableDataset):
        def __iter__(self):
            return iter(range(10))

    draws = []
    for m, dataset in ((td, TorchStream()), (fl, Stream())):
        torch.manual_seed(2)
        loader = m.DataLoader(dataset, batch_size=3, **WORKERS[workers])
        two_epochs(loader)
        draws.append(torch.rand(1).item())
    assert draws[0] == draws[1]


@pytest.mark.parametrize("fractions", [False, True])
def test_random_split_draws_and_splits_as_torchs(torch, fractions):
    lengths = [0.3, 0.5, 0.2] if fractions else [7, 10, 6]
    splits = {}
    for library, m in modules(torch).items():
        torch.manual_seed(11)
        parts = m.random_split(data(), lengths)
        splits[library] = ([list(p.indices) for p in parts], torch.rand(1).item())
    # torch's own randperm on its default generator: torch's split, and torch's next draw.
    assert splits["fastload"] == splits["torch"]


@pytest.mark.parametrize("setup", ["subset", "weighted", "weighted without replacement"])
def test_samplers_that_draw_straight_from_torchs_generator_give_torchs_order(torch, setup):
    # torch's randperm / multinomial run on the default generator itself: fastload runs
    # the same op, so the order is torch's (RandomSampler's is fastload's own, seeded by
    # torch's draw).
    ours, _ = run(torch, "fastload", setup, "0", "two epochs")
    theirs, _ = run(torch, "torch", setup, "0", "two epochs")
    assert ours == theirs


# -- torch.manual_seed makes fastload's order repeat ------------------------------

@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("setup", [s for s in SETUPS if s not in ("in order", "distributed")])
def test_the_same_global_seed_gives_the_same_batches(torch, setup, workers):
    first = run(torch, "fastload", setup, workers, "two epochs", seed=5)
    again = run(torch, "fastload", setup, workers, "two epochs", seed=5)
    other = run(torch, "fastload", setup, workers, "two epochs", seed=6)
    assert first == again
    assert first[0][0] != first[0][1]  # epochs differ
    assert other[0] != first[0]


@pytest.mark.parametrize("fractions", [False, True])
def test_random_split_repeats_under_the_same_global_seed(torch, fractions):
    lengths = [0.25, 0.75] if fractions else [5, 18]

    def split(seed):
        torch.manual_seed(seed)
        return [list(p.indices) for p in fl.random_split(data(), lengths)]

    assert split(1) == split(1)
    assert split(1) != split(2)


def test_a_sampler_of_non_integer_indices_repeats_under_the_same_global_seed(torch):
    def order(seed):
        torch.manual_seed(seed)
        return list(fl.SubsetRandomSampler(["a", "b", "c", "d", "e", "f", "g"]))

    assert order(4) == order(4)
    assert order(4) != order(5)
    ours = order(4)
    torch.manual_seed(4)
    assert ours == list(torch.utils.data.SubsetRandomSampler(["a", "b", "c", "d", "e", "f", "g"]))


def test_a_given_generator_is_untouched_by_the_global_seed(torch):
    def batches(seed):
        torch.manual_seed(seed)
        return one_epoch(fl.DataLoader(data(), shuffle=True, generator=3))

    assert batches(1) == batches(2)


def test_a_distributed_sampler_without_a_seed_uses_seed_0_whatever_the_global_seed(torch):
    def order(seed):
        torch.manual_seed(seed)
        return list(fl.DistributedSampler(data(), num_replicas=2, rank=0))

    assert order(1) == order(2) == list(fl.DistributedSampler(data(), num_replicas=2, rank=0,
                                                              seed=0))


# -- worker seeds ---------------------------------------------------------------------

class WorkerSeeds(fl.Dataset):
    """Each sample: the worker's seed and the first draw of numpy's global generator there."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        info = fl.get_worker_info()
        return np.array([info.seed, np.random.randint(1 << 30)], dtype=np.int64)


def worker_seeds(torch, seed, persistent=False) -> list:
    torch.manual_seed(seed)
    loader = fl.DataLoader(WorkerSeeds(), batch_size=2, num_workers=2,
                           persistent_workers=persistent)
    return [[as_lists(b) for b in loader] for _ in range(2)]


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_seeds_repeat_under_the_same_global_seed(torch, persistent):
    first = worker_seeds(torch, 21, persistent)
    assert first == worker_seeds(torch, 21, persistent)
    assert first != worker_seeds(torch, 22, persistent)


def test_worker_seeds_are_torchs(torch):
    # The base seed is the same draw of the default generator torch makes, so each
    # worker's seed (base_seed + id) is the one torch's worker would get.
    import torch.utils.data as td

    class TorchWorkerSeeds(td.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return td.get_worker_info().seed

    torch.manual_seed(8)
    theirs = [int(s) for b in td.DataLoader(TorchWorkerSeeds(), batch_size=1, num_workers=2)
              for s in b]
    torch.manual_seed(8)
    ours = [int(b[0][0]) for b in fl.DataLoader(WorkerSeeds(), batch_size=1, num_workers=2)][:4]
    assert ours == theirs


# -- resuming -------------------------------------------------------------------------

RESUMED = {"shuffle": lambda m: dict(shuffle=True, batch_size=3),
           "subset": SETUPS["subset"], "weighted": SETUPS["weighted"],
           "random sampler": SETUPS["random"]}


@pytest.mark.parametrize("epoch", [0, 1])
@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("setup", RESUMED)
def test_a_mid_epoch_state_with_the_global_rng_state_continues_as_uninterrupted(
        torch, setup, workers, epoch):
    # The usual checkpoint: the loader's state and torch's RNG state, taken together;
    # in the second epoch, a persistent iterator's base seed was not torch's draw.
    def make():
        return fl.DataLoader(data(), **RESUMED[setup](fl), **WORKERS[workers])

    torch.manual_seed(9)
    loader = make()
    for _ in range(epoch):
        one_epoch(loader)
    iterator = iter(loader)
    head = [as_lists(next(iterator)) for _ in range(2)]
    state = pickle.loads(pickle.dumps(loader.state_dict()))
    rng = torch.get_rng_state()
    rest = [as_lists(b) for b in iterator]
    expected = (rest, one_epoch(loader), torch.rand(1).item())
    del iterator, loader

    torch.manual_seed(12345)  # a new process: whatever the global state was
    resumed = make()
    torch.set_rng_state(rng)
    resumed.load_state_dict(state)
    assert ([as_lists(b) for b in resumed], one_epoch(resumed), torch.rand(1).item()) == expected
    assert head  # the epoch was really cut


def test_a_state_taken_mid_resumed_epoch_is_the_loaded_one(torch):
    torch.manual_seed(2)
    loader = fl.DataLoader(data(), batch_size=3, sampler=fl.SubsetRandomSampler(range(12)))
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    resumed = fl.DataLoader(data(), batch_size=3, sampler=fl.SubsetRandomSampler(range(12)))
    resumed.load_state_dict(state)
    running = iter(resumed)
    next(running)
    assert resumed.state_dict() == dict(state, batches_yielded=2)


def test_a_state_between_epochs_leaves_the_order_to_the_global_generator(torch):
    def make():
        return fl.DataLoader(data(), batch_size=4, shuffle=True)

    torch.manual_seed(1)
    loader = make()
    one_epoch(loader)
    state, rng = loader.state_dict(), torch.get_rng_state()
    expected = (one_epoch(loader), torch.rand(1).item())
    resumed = make()
    torch.set_rng_state(rng)
    resumed.load_state_dict(state)
    assert (one_epoch(resumed), torch.rand(1).item()) == expected


def test_a_state_dict_is_a_copy_not_a_live_record(torch):
    torch.manual_seed(0)
    loader = fl.DataLoader(data(), batch_size=4, sampler=fl.RandomSampler(data()))
    iterator = iter(loader)  # the base seed is drawn; the sampler's at next()
    state = loader.state_dict()
    before = pickle.dumps(state)
    next(iterator)
    assert pickle.dumps(state) == before
    assert loader.state_dict() != state  # now the sampler's draw is part of it


def test_a_broken_torch_default_state_is_refused(torch):
    torch.manual_seed(0)
    loader = fl.DataLoader(data(), batch_size=4, shuffle=True)
    state = loader.state_dict()
    broken = dict(state, rng_states=[("torch.default_generator", ("x",))] * 2)
    with pytest.raises(ValueError, match="does not fit"):
        loader.load_state_dict(broken)


# -- without torch --------------------------------------------------------------------

WITHOUT_TORCH = textwrap.dedent("""
    import sys
    import numpy as np
    import fastload as fl
    assert "torch" not in sys.modules
    np.random.seed(0)
    loader = fl.DataLoader(list(range(40)), batch_size=8, shuffle=True)
    order = [np.asarray(b).tolist() for b in loader]
    split = [list(p.indices) for p in fl.random_split(list(range(40)), [0.5, 0.5])]
    subset = list(fl.SubsetRandomSampler(list(range(40))))
    assert "torch" not in sys.modules
    print(repr((order, split, subset)))
""")


def test_without_torch_every_run_draws_fresh_entropy():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(fl.__file__)), os.environ.get("PYTHONPATH", "")]))
    runs = [subprocess.run([sys.executable, "-c", WITHOUT_TORCH], capture_output=True,
                           text=True, timeout=120, env=env) for _ in range(2)]
    for run_ in runs:
        assert run_.returncode == 0, run_.stderr
    first, second = (eval(r.stdout) for r in runs)
    for a, b in zip(first, second):
        assert a != b


def test_a_pickled_sampler_and_loader_still_follow_the_global_seed(torch):
    sampler = fl.RandomSampler(data())
    sampler._seed_source.get_state()  # a live record, which stays behind
    copies = [pickle.loads(pickle.dumps(sampler)),
              pickle.loads(pickle.dumps(fl.DataLoader(data(), batch_size=4, shuffle=True)))]
    for copy_ in copies:
        orders = []
        for _ in range(2):
            torch.manual_seed(3)
            orders.append([as_lists(i) for i in copy_])
        assert orders[0] == orders[1]
