"""A dataset's own state in ``DataLoader.state_dict``: an IterableDataset (or a
map-style dataset) that defines ``state_dict`` / ``load_state_dict`` is saved and
restored through them, each worker's copy at the batch boundary the caller has
seen, so a resumed run continues an uninterrupted one exactly."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap

import pytest

import fastload as fl
from fastload import DataLoader

from stateful_datasets import (CountingStream, NoisyTable, PlainStream, RefusingStream, as_lists,
                               shard_bounds)

pytestmark = pytest.mark.timeout(180)

LOADERS = [dict(num_workers=0), dict(num_workers=2), dict(num_workers=2, persistent_workers=True)]
LOADER_IDS = ["0", "2", "2p"]


def stream_loader(total=23, batch_size=4, **kwargs):
    return DataLoader(CountingStream(total), batch_size=batch_size, **kwargs)


def table_loader(n=22, batch_size=4, **kwargs):
    return DataLoader(NoisyTable(n), batch_size=batch_size, shuffle=True, generator=3, **kwargs)


MAKERS = {"iterable": stream_loader, "map": table_loader}


def cut_points(total_batches):
    return sorted({0, 1, total_batches // 2, total_batches - 1, total_batches})


def taken_then_state(loader, cut):
    """The first ``cut`` batches, then the state, taken while the iterator (and
    its workers, running ahead) is still alive."""
    iterator = iter(loader)
    seen = as_lists(next(iterator) for _ in range(cut))
    state = loader.state_dict()
    del iterator
    return seen, state


def resumed(make, state, epochs=2):
    loader = make()
    loader.load_state_dict(state)
    return [as_lists(loader) for _ in range(epochs)]


@pytest.mark.parametrize("kind", ["iterable", "map"])
@pytest.mark.parametrize("kwargs", LOADERS, ids=LOADER_IDS)
def test_resuming_at_any_cut_continues_the_uninterrupted_run(kind, kwargs):
    def make():
        return MAKERS[kind](**kwargs)

    reference = make()
    expected = [as_lists(reference) for _ in range(2)]
    if kwargs.get("persistent_workers") or kwargs["num_workers"] == 0:
        # The datasets' generators carry over: the second epoch differs.
        assert expected[0] != expected[1]
    for cut in cut_points(len(expected[0])):
        seen, state = taken_then_state(make(), cut)
        state = pickle.loads(pickle.dumps(state))  # saved with a checkpoint
        rest = resumed(make, state)
        assert seen + rest[0] == expected[0], f"cut after {cut} batches"
        assert rest[1] == expected[1], f"next epoch, cut after {cut} batches"


@pytest.mark.parametrize("kwargs", LOADERS, ids=LOADER_IDS)
def test_a_resumed_stream_gives_the_batches_of_torchs_uninterrupted_loader(torch, kwargs):
    # torch's loader takes the workers' streams in turn, as fastload's; a run
    # cut and resumed by fastload gives what torch's gives without a cut.
    class TorchStream(CountingStream, torch.utils.data.IterableDataset):
        pass

    theirs_loader = torch.utils.data.DataLoader(TorchStream(23), batch_size=4, **kwargs)
    theirs = [as_lists(theirs_loader) for _ in range(2)]

    def make():
        return DataLoader(TorchStream(23), batch_size=4, **kwargs)

    ours = make()
    assert [as_lists(ours) for _ in range(2)] == theirs
    for cut in (1, 4):
        seen, state = taken_then_state(make(), cut)
        rest = resumed(make, state)
        assert seen + rest[0] == theirs[0], f"cut after {cut} batches"
        assert rest[1] == theirs[1], f"next epoch, cut after {cut} batches"


@pytest.mark.parametrize("kind", ["iterable", "map"])
@pytest.mark.parametrize("kwargs", LOADERS, ids=LOADER_IDS)
def test_resuming_in_a_later_epoch(kind, kwargs):
    # Persistent workers' copies carry their state (and a stream that ended)
    # into the next epoch: a worker with no batch handed out yet this epoch is
    # where the last epoch left it, its stream started over.
    def make():
        return MAKERS[kind](**kwargs)

    reference = make()
    expected = [as_lists(reference) for _ in range(3)]
    for cut in (0, 1, 2):
        loader = make()
        assert as_lists(loader) == expected[0]
        seen, state = taken_then_state(loader, cut)
        rest = resumed(make, pickle.loads(pickle.dumps(state)))
        assert seen + rest[0] == expected[1], f"cut after {cut} batches"
        assert rest[1] == expected[2], f"next epoch, cut after {cut} batches"


@pytest.mark.parametrize("kind", ["iterable", "map"])
@pytest.mark.parametrize("kwargs", LOADERS, ids=LOADER_IDS)
def test_a_state_taken_after_the_epoch_ended_gives_the_next_epoch(kind, kwargs):
    def make():
        return MAKERS[kind](**kwargs)

    reference = make()
    expected = [as_lists(reference) for _ in range(3)]
    loader = make()
    assert as_lists(loader) == expected[0]
    state = loader.state_dict()
    assert state["batches_yielded"] == 0
    assert resumed(make, state) == expected[1:]


@pytest.mark.parametrize("kwargs", LOADERS, ids=LOADER_IDS)
def test_a_state_taken_after_a_break_resumes(kwargs):
    # The loop is left (the iterator dropped) before the state is taken.
    expected = as_lists(stream_loader(**kwargs))
    loader, seen = stream_loader(**kwargs), []
    for batch in loader:
        seen += as_lists([batch])
        if len(seen) == 3:
            break
    assert seen + resumed(lambda: stream_loader(**kwargs), loader.state_dict(), 1)[0] == expected


@pytest.mark.parametrize("kwargs", LOADERS[1:], ids=LOADER_IDS[1:])
@pytest.mark.parametrize("total,batch_size", [(40, 4), (25, 3), (7, 4)])
def test_workers_whose_streams_end_at_different_times(kwargs, total, batch_size):
    # Uneven shards: one worker ends long before the other, with a short last
    # batch or none; (7, 4): a worker whose shard is smaller than a batch.
    def make():
        return stream_loader(total, batch_size, **kwargs)

    expected = as_lists(make())
    records = [r for batch in expected for r in batch["record"]]
    assert sorted(records) == list(range(total))
    for cut in range(len(expected) + 1):
        seen, state = taken_then_state(make(), cut)
        assert seen + resumed(make, state, 1)[0] == expected, f"cut after {cut} batches"


@pytest.mark.parametrize("kwargs", LOADERS, ids=LOADER_IDS)
@pytest.mark.parametrize("batching", [dict(batch_size=None), dict(batch_size=4, drop_last=True)],
                         ids=["unbatched", "drop_last"])
def test_unbatched_and_drop_last_streams_resume(kwargs, batching):
    def make():
        return DataLoader(CountingStream(23), **batching, **kwargs)

    expected = as_lists(make())
    for cut in cut_points(len(expected)):
        seen, state = taken_then_state(make(), cut)
        assert seen + resumed(make, state, 1)[0] == expected, f"cut after {cut} batches"


def test_the_state_says_which_workers_are_exhausted_and_which_is_next():
    # Worker 0 has records 0-9 (3 batches), worker 1 records 10-14 (2 batches, the second short).
    assert shard_bounds(15, 2) == [(0, 10), (10, 15)]
    loader = stream_loader(15, 4, num_workers=2)
    iterator = iter(loader)
    records = [next(iterator)["record"].tolist() for _ in range(4)]
    assert records == [[0, 1, 2, 3], [10, 11, 12, 13], [4, 5, 6, 7], [14]]
    section = loader.state_dict()["dataset"]
    assert section["num_workers"] == 2 and section["kind"] == "iterable"
    assert section["batches_yielded"] == 4 and section["next_worker"] == 0
    assert section["workers"][0]["ended"] is False
    assert section["workers"][0]["state"]["position"] == 8
    # Worker 1 gave its short last batch: its stream is over whatever its counter says.
    assert section["workers"][1]["ended"] is True
    assert section["workers"][1]["state"]["position"] == 0
    assert next(iterator)["record"].tolist() == [8, 9]
    section = loader.state_dict()["dataset"]
    assert section["next_worker"] == 1 and section["batches_yielded"] == 5
    assert [w["ended"] for w in section["workers"]] == [True, True]
    assert list(iterator) == []
    del iterator


@pytest.mark.parametrize("kind", ["iterable", "map"])
def test_a_persistent_loader_resumes_its_own_state(kind, no_leaks):
    # load_state_dict on the loader whose workers are alive: their copies have
    # moved on, and are given the state again (or replaced, where the state
    # needs a copy as it came).
    def make():
        return MAKERS[kind](num_workers=2, persistent_workers=True)

    expected = as_lists(make())
    for cut in (1, 3):
        loader = make()
        seen, state = taken_then_state(loader, cut)
        assert len(as_lists(loader)) > 0  # a whole epoch more: the copies move on
        loader.load_state_dict(state)
        assert seen + as_lists(loader) == expected


@pytest.mark.timeout(240)
@pytest.mark.parametrize("kind", ["iterable", "map"])
@pytest.mark.parametrize("kwargs", LOADERS, ids=LOADER_IDS)
def test_a_pickled_state_resumes_in_a_fresh_process(tmp_path, kind, kwargs):
    def make():
        return MAKERS[kind](**kwargs)

    expected = [as_lists(make_loader) for make_loader in [make()]][0]
    seen, state = taken_then_state(make(), 2)
    state_file, out_file = tmp_path / "state.pkl", tmp_path / "batches.pkl"
    state_file.write_bytes(pickle.dumps(state))
    script = textwrap.dedent(f"""
        import pickle, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_resume_iterable import MAKERS
        from stateful_datasets import as_lists
        loader = MAKERS[{kind!r}](**{kwargs!r})
        with open({str(state_file)!r}, "rb") as f:
            loader.load_state_dict(pickle.load(f))
        with open({str(out_file)!r}, "wb") as f:
            pickle.dump(as_lists(loader), f)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.dirname(os.path.dirname(fl.__file__)), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-c", script], check=True, timeout=150, env=env)
    assert seen + pickle.loads(out_file.read_bytes()) == expected


@pytest.mark.timeout(240)
def test_spawned_workers_take_their_state():
    def make():
        return stream_loader(23, 4, num_workers=2, multiprocessing_context="spawn")

    expected = as_lists(make())
    seen, state = taken_then_state(make(), 3)
    assert seen + resumed(make, state, 1)[0] == expected


@pytest.mark.parametrize("kwargs", LOADERS, ids=LOADER_IDS)
def test_an_iterable_dataset_without_state_methods_is_replayed_with_one_warning(kwargs):
    def make():
        return DataLoader(PlainStream(), batch_size=2, **kwargs)

    expected = [batch.tolist() for batch in make()]
    iterator = iter(make_loader := make())
    seen = [next(iterator).tolist() for _ in range(3)]
    state = make_loader.state_dict()
    del iterator
    loader = make()
    loader.load_state_dict(state)
    with pytest.warns(UserWarning, match=r"reads 6 samples of PlainStream's stream again") \
            as caught:
        rest = [batch.tolist() for batch in loader]
    assert len([w for w in caught if "again" in str(w.message)]) == 1
    assert seen + rest == expected


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("kind", ["iterable", "map"])
@pytest.mark.parametrize("recorded,wanted", [(2, 3), (2, 0), (0, 2)])
def test_a_state_of_other_num_workers_is_refused(kind, recorded, wanted):
    state = taken_then_state(MAKERS[kind](num_workers=recorded), 1)[1]
    loader = MAKERS[kind](num_workers=wanted)
    reason = "each worker reads its own stream" if kind == "iterable" \
        else "each worker's copy of the dataset has a state of its own"
    loader.load_state_dict(state)  # refused when the epoch starts, as torchdata does
    with pytest.raises(ValueError, match=rf"num_workers={recorded}, this one has "
                                         rf"num_workers={wanted}: {reason}") as refused:
        iter(loader)
    assert isinstance(refused.value, AssertionError)  # torchdata's type for it
    loader.num_workers = recorded  # the state waits for a loader that can take it
    loader.prefetch_factor = 2 if recorded else None
    assert len(list(loader)) > 0


def test_states_of_other_datasets_are_refused():
    stream_state = stream_loader().state_dict()
    with pytest.raises(ValueError, match="holds no state of the IterableDataset CountingStream"):
        stream_loader().load_state_dict({**stream_state, "dataset": None})
    map_state = table_loader().state_dict()
    plain = DataLoader(fl.ArrayDataset(list(range(22))), batch_size=4, shuffle=True, generator=3)
    with pytest.raises(ValueError, match="ArrayDataset does not define state_dict"):
        plain.load_state_dict(map_state)
    broken = stream_loader(num_workers=2).state_dict()
    broken["dataset"]["workers"] = [None]
    with pytest.raises(ValueError, match="must list 2 workers' states"):
        stream_loader(num_workers=2).load_state_dict(broken)
    broken = stream_loader().state_dict()
    broken["dataset"]["main"] = {"position": 3}
    with pytest.raises(ValueError, match="dataset main is not a dataset snapshot"):
        stream_loader().load_state_dict(broken)


def test_a_map_state_without_the_dataset_part_still_loads():
    # States saved before datasets' own states were kept: the order resumes,
    # the dataset stays as it was built.
    loader = table_loader()
    seen, state = taken_then_state(loader, 2)
    del state["dataset"]
    rest = table_loader()
    rest.load_state_dict(state)
    assert len(as_lists(rest)) == len(as_lists(table_loader())) - 2


def test_a_worker_whose_load_state_dict_raises_reports_it(no_leaks):
    def make():
        return DataLoader(RefusingStream(), batch_size=4, num_workers=2)

    state = taken_then_state(make(), 2)[1]
    loader = make()
    loader.load_state_dict(state)
    with pytest.raises(KeyError, match="this stream cannot be restored"):
        list(loader)


def test_in_order_false_continues_each_workers_stream():
    # Out of order the interleaving follows arrival, in any run; each worker's
    # own stream continues exactly.
    def make():
        return stream_loader(31, 3, num_workers=2, in_order=False)

    expected = sorted(map(str, as_lists(make())))
    seen, state = taken_then_state(make(), 4)
    assert sorted(map(str, seen + resumed(make, state, 1)[0])) == expected
