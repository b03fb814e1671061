"""pin_memory=True: torch's checks and warnings, and every batch pinned with torch's function.

No accelerator exists where these tests run, so one is faked (NOTE [ Where
batches are pinned ] in fastload/_loading/pinning.py): ``torch.accelerator`` says one
is there, and ``Tensor.pin_memory`` returns a copy marked as pinned.  torch's
own DataLoader runs under the same fakes, so each test compares the two.
"""

import collections
import warnings

import numpy as np
import pytest
from batch_compare import assert_same_as_torch, torch_twin

import fastload as fl
import fastload._loading.pinning

Pair = collections.namedtuple("Pair", "left right")


class Nested(fl.Dataset):
    """Samples nesting arrays in a dict, a namedtuple and a list, beside strings and numbers."""

    def __len__(self):
        return 10

    def __getitem__(self, i):
        return {"image": np.full((2, 3), i, np.float32), "name": f"s{i}",
                "pair": Pair(np.arange(3) + i, [np.int64(i), i * 0.5])}


@pytest.fixture
def accelerator(torch, monkeypatch):
    """A fake accelerator of type ``accelerator.type`` ("cuda"; set it before loading).

    ``accelerator.pinned`` holds every tensor the fake ``Tensor.pin_memory`` made;
    ``accelerator.calls`` each top-level call of torch's ``pin_memory(data, device)``.
    """
    from torch.utils.data._utils import pin_memory as torch_pinning

    class Fake:
        type = "cuda"

    fake = Fake()
    # On the instance: a class is freed only by a garbage collection, and these
    # lists hold the test's batches (tests/loading/test_workers.py counts what is kept).
    fake.pinned, fake.calls = [], []
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator",
                        lambda check_available=False: torch.device(fake.type))
    # What torch's pin-memory thread calls (its loader runs under these fakes too).
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda index: None)

    def pin(tensor, device=None):
        copy = tensor.clone()
        fake.pinned.append(copy)
        return copy

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    real_pin_memory = torch_pinning.pin_memory
    depth = [0]

    def recorded(data, device=None):
        if depth[0] == 0:
            fake.calls.append((data, device))
        depth[0] += 1
        try:
            return real_pin_memory(data, device)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(torch_pinning, "pin_memory", recorded)
    return fake


def tensor_leaves(batch, torch):
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return [t for value in batch.values() for t in tensor_leaves(value, torch)]
    if isinstance(batch, (list, tuple)):
        return [t for value in batch for t in tensor_leaves(value, torch)]
    return []


def is_pinned(tensor, accelerator):
    return any(tensor is pinned for pinned in accelerator.pinned)


def load(library, dataset, accelerator, **kwargs):
    """The batches and the warnings of one epoch; the pin calls it made."""
    accelerator.calls.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(library.DataLoader(dataset, batch_size=4, pin_memory=True, **kwargs))
    warned = [(w.category, str(w.message)) for w in caught
              if "worker processes in total" not in str(w.message)]
    return batches, warned, list(accelerator.calls)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_batch_is_pinned_as_torchs_with_the_accelerators_device(torch, accelerator,
                                                                       num_workers, no_leaks):
    dataset = Nested()
    theirs, their_warnings, their_calls = load(torch.utils.data, torch_twin(torch, dataset),
                                               accelerator, num_workers=num_workers)
    ours, our_warnings, our_calls = load(fl, dataset, accelerator, num_workers=num_workers,
                                         output="torch")
    assert our_warnings == their_warnings == []  # an accelerator: no warning
    # torch's function, called once a batch with the accelerator's type, as torch calls it.
    assert [device for _, device in our_calls] == [device for _, device in their_calls] \
        == ["cuda"] * 3
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs):
        assert_same_as_torch(a, b, tensors=True)  # same values, same nesting
        leaves = tensor_leaves(a, torch)
        assert len(leaves) == len(tensor_leaves(b, torch)) == 4
        assert all(is_pinned(t, accelerator) for t in leaves + tensor_leaves(b, torch))
        assert a["name"] == b["name"]  # strings pass through


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_pin_memory_device_is_deprecated_as_in_torch(torch, accelerator, num_workers, no_leaks):
    # torch 2.x warns that pin_memory_device is ignored and pins for the
    # current accelerator; the iterator says so in torch's attributes.
    dataset = Nested()
    _, their_warnings, their_calls = load(torch.utils.data, torch_twin(torch, dataset),
                                          accelerator, num_workers=num_workers,
                                          pin_memory_device="cuda:1")
    _, our_warnings, our_calls = load(fl, dataset, accelerator, num_workers=num_workers,
                                      output="torch", pin_memory_device="cuda:1")
    assert our_warnings == their_warnings
    assert [str(m) for _, m in our_warnings] == [
        "pin_memory_device is deprecated, the current accelerator will be used as the "
        "device,ignore pin_memory_device='cuda:1'."]
    assert [d for _, d in our_calls] == [d for _, d in their_calls] == ["cuda"] * 3
    for library, data in ((fl, dataset), (torch.utils.data, torch_twin(torch, dataset))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            iterator = iter(library.DataLoader(data, pin_memory=True, pin_memory_device="cuda:1",
                                               num_workers=num_workers))
        assert (iterator._pin_memory, iterator._pin_memory_device) == (True, "cuda")
        del iterator


def test_an_mps_accelerator_is_not_pinned_for_as_in_torch(torch, accelerator):
    accelerator.type = "mps"
    dataset = Nested()
    theirs, their_warnings, their_calls = load(torch.utils.data, torch_twin(torch, dataset),
                                               accelerator)
    ours, our_warnings, our_calls = load(fl, dataset, accelerator, output="torch")
    assert our_warnings == their_warnings
    assert [str(m) for _, m in our_warnings] == [
        "'pin_memory' argument is set as true but not supported on MPS now, device pinned "
        "memory won't be used."]
    assert our_calls == their_calls == [] and accelerator.pinned == []
    with pytest.warns(UserWarning, match="not supported on MPS"):
        iterator = iter(fl.DataLoader(dataset, pin_memory=True))
    assert (iterator._pin_memory, iterator._pin_memory_device) == (False, "mps")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_numpy_batches_are_left_as_they_are_and_said_so(torch, accelerator, num_workers, no_leaks):
    ours, warned, calls = load(fl, Nested(), accelerator, num_workers=num_workers)
    # torch's function passes over anything but tensors: the batch is as without pinning.
    plain = list(fl.DataLoader(Nested(), batch_size=4, num_workers=num_workers))
    assert len(calls) == 3 and accelerator.pinned == []
    for a, b in zip(ours, plain):
        assert type(a["image"]) is np.ndarray
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["pair"].left, b["pair"].left)
    assert len(warned) == 1 and warned[0][0] is UserWarning
    assert "output='numpy'" in warned[0][1] and "output='torch'" in warned[0][1]


@pytest.mark.timeout(60)
def test_tensors_a_collate_fn_returns_are_pinned_with_numpy_output(torch, accelerator, no_leaks):
    def collate(samples):
        return {"x": torch.stack([torch.from_numpy(s["image"]) for s in samples]),
                "names": [s["name"] for s in samples]}

    ours, _, calls = load(fl, Nested(), accelerator, num_workers=2, collate_fn=collate)
    assert len(calls) == 3
    assert all(is_pinned(batch["x"], accelerator) for batch in ours)
    assert ours[0]["names"] == ["s0", "s1", "s2", "s3"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_failed_pin_raises_torchs_type(torch, accelerator, monkeypatch, num_workers, no_leaks):
    def fail(tensor, device=None):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(torch.Tensor, "pin_memory", fail)
    for library, data, output in ((fl, Nested(), {"output": "torch"}),
                                  (torch.utils.data, torch_twin(torch, Nested()), {})):
        loader = library.DataLoader(data, batch_size=4, pin_memory=True, num_workers=num_workers,
                                    **output)
        iterator = iter(loader)
        with pytest.raises(RuntimeError, match="CUDA error: out of memory"):
            next(iterator)
        # Now, not when the error's traceback goes (torch's workers then wait to time out).
        if hasattr(iterator, "_shutdown_workers"):  # torch's single-process iterator has none
            iterator._shutdown_workers()


def test_without_torch_the_warning_is_torchs(torch, monkeypatch):
    # No torch, no accelerator: the same warning as torch gives on a machine without one.
    monkeypatch.setattr(fastload._loading.pinning, "_torch_or_none", lambda: None)
    with pytest.warns(UserWarning) as ours:
        iterator = iter(fl.DataLoader(Nested(), pin_memory=True))
    assert [str(w.message) for w in ours] == [
        "'pin_memory' argument is set as true but no accelerator is found, then device pinned "
        "memory won't be used."]
    assert (iterator._pin_memory, iterator._pin_memory_device) == (False, None)
    assert type(next(iterator)["image"]) is np.ndarray


def test_no_accelerator_gives_torchs_warning_and_pins_nothing(torch):
    if torch.accelerator.is_available():
        # torch's loader pins there and warns nothing: the tests above cover that case.
        pytest.skip(f"this test is for a machine without an accelerator; this one has "
                    f"{torch.accelerator.current_accelerator()}")

    def warned(library, data):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            iterator = iter(library.DataLoader(data, pin_memory=True))
        return [(w.category, str(w.message)) for w in caught], iterator

    ours, our_iterator = warned(fl, Nested())
    theirs, their_iterator = warned(torch.utils.data, torch_twin(torch, Nested()))
    assert ours == theirs and len(ours) == 1
    assert (our_iterator._pin_memory, our_iterator._pin_memory_device) \
        == (their_iterator._pin_memory, their_iterator._pin_memory_device) == (False, None)
