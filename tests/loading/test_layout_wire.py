"""Layouts sent once per worker: what the main process rebuilds is the batch the worker made."""

import collections
import pickle
import types

import numpy as np
import pytest

import fastload as fl
from fastload import DataLoader
from fastload.collate import collate_into, pack_into
from fastload._loading.wire.layouts import _MAX_LAYOUTS, LayoutReceiver, LayoutSender

pytestmark = pytest.mark.timeout(120)


def flatten(batch):
    if isinstance(batch, np.ndarray):
        return ("array", batch.dtype.str, batch.shape, batch.tobytes())
    if isinstance(batch, dict):
        return (type(batch).__name__, tuple((k, flatten(v)) for k, v in batch.items()))
    if isinstance(batch, (list, tuple)):
        return (type(batch).__name__, tuple(flatten(v) for v in batch))
    return ("value", batch)


def records(start, n, width=4):
    return [{"x": np.full(width, i, dtype=np.float32), "y": i, "name": f"r{i}"}
            for i in range(start, start + n)]


def send_and_rebuild(sender, receiver, samples, pack=False):
    """One batch through the wire, as a worker and the main process handle it."""
    layout, buffer = pack_into(samples) if pack else collate_into(samples)
    expected = flatten(layout.build(buffer))
    wire = pickle.loads(pickle.dumps(sender.encode(layout)))
    rebuilt, values = receiver.decode(wire)
    return wire, expected, flatten(rebuilt.build(buffer, values))


def test_a_repeated_layout_is_sent_once_and_values_still_arrive():
    sender, receiver = LayoutSender(), LayoutReceiver()
    wires = []
    for start in (0, 8, 16):
        wire, expected, got = send_and_rebuild(sender, receiver, records(start, 8))
        assert got == expected
        wires.append(wire)
    assert wires[0][1] is not None                  # the layout, once
    assert wires[1][1] is None and wires[2][1] is None
    assert wires[0][0] == wires[1][0] == wires[2][0]
    # One leaf's values: its eight names, joined into one string.
    assert pickle.loads(wires[2][2]) == (["\0".join(f"r{i}" for i in range(16, 24))], [(0, False)])


def test_changed_layouts_get_their_own_numbers_and_old_ones_are_reused():
    sender, receiver = LayoutSender(), LayoutReceiver()
    batches = [records(0, 8), records(8, 8, width=6), records(16, 5), records(24, 8)]
    wires = []
    for samples in batches:
        wire, expected, got = send_and_rebuild(sender, receiver, samples)
        assert got == expected
        wires.append(wire)
    ids = [w[0] for w in wires]
    assert ids[0] != ids[1] != ids[2] and ids[3] == ids[0]
    assert [w[1] is None for w in wires] == [False, False, False, True]


@pytest.mark.parametrize("change", ["dtype", "keys", "shape", "sequence type"])
def test_a_layout_differing_in_one_detail_is_not_taken_for_the_last(change):
    sender, receiver = LayoutSender(), LayoutReceiver()
    first = [(np.zeros(3, np.int32), "a"), (np.ones(3, np.int32), "b")]
    second = {
        "dtype": [(np.zeros(3, np.int64), "a"), (np.ones(3, np.int64), "b")],
        "keys": [{"k": np.zeros(3, np.int32)}, {"k": np.ones(3, np.int32)}],
        "shape": [(np.zeros(4, np.int32), "a"), (np.ones(4, np.int32), "b")],
        "sequence type": [[np.zeros(3, np.int32), "a"], [np.ones(3, np.int32), "b"]],
    }[change]
    send_and_rebuild(sender, receiver, first)
    wire, expected, got = send_and_rebuild(sender, receiver, second)
    assert wire[1] is not None and got == expected


def test_mappings_with_state_are_compared_by_their_pickled_form():
    sender, receiver = LayoutSender(), LayoutReceiver()
    for start in (0, 4):
        samples = [collections.OrderedDict(a=np.full(2, i), b=f"n{i}") for i in range(start, start + 4)]
        wire, expected, got = send_and_rebuild(sender, receiver, samples)
        assert got == expected and expected[0] == "OrderedDict"
    assert wire[1] is None  # equal pickled layouts share a number all the same


def test_layouts_past_the_limit_travel_whole_and_are_not_kept():
    sender, receiver = LayoutSender(), LayoutReceiver()
    for width in range(1, _MAX_LAYOUTS + 4):
        wire, expected, got = send_and_rebuild(sender, receiver, records(0, 3, width=width))
        assert got == expected
        assert wire[1] is not None
        assert (wire[0] == -1) == (width > _MAX_LAYOUTS)
    assert len(receiver._layouts) == _MAX_LAYOUTS


def test_unpicklable_values_fail_in_encode_without_taking_a_number():
    sender, receiver = LayoutSender(), LayoutReceiver()
    bad = [{"x": np.zeros(2), "f": lambda: 0}, {"x": np.ones(2), "f": lambda: 1}]
    layout, _ = pack_into(bad)
    with pytest.raises(Exception):
        sender.encode(layout)
    # The next layout, the same shape with plain values, is sent whole: no
    # number was taken that the main process never received.
    wire, expected, got = send_and_rebuild(sender, receiver, [{"x": np.zeros(2), "f": 0},
                                                              {"x": np.ones(2), "f": 1}], pack=True)
    assert wire[1] is not None and got == expected


def test_a_kept_layout_does_not_hold_the_values_of_the_last_batch():
    sender, receiver = LayoutSender(), LayoutReceiver()
    send_and_rebuild(sender, receiver, records(0, 4))
    layout = receiver._layouts[0]
    assert [leaf.value for leaf in layout.value_leaves()] == [None]


def test_workers_rebuild_batches_whose_layout_keeps_changing():
    class Changing(fl.Dataset):
        """Widths cycle through more layouts than a worker keeps, then repeat."""

        def __len__(self):
            return 6 * (_MAX_LAYOUTS + 10)

        def __getitem__(self, i):
            width = 1 + (i // 3) % (_MAX_LAYOUTS + 5)
            return {"x": np.full(width, i, dtype=np.int16), "tag": f"t{i}", "i": i}

    single = [flatten(b) for b in DataLoader(Changing(), batch_size=3)]
    multi = [flatten(b) for b in DataLoader(Changing(), batch_size=3, num_workers=2,
                                            persistent_workers=True)]
    assert len(single) == 2 * (_MAX_LAYOUTS + 10) and multi == single


class Tag(str):
    """A str subclass: must come back as itself, so it is never joined."""


@pytest.mark.parametrize("names, joined", [
    (["a", "bb", "", "ccc"], True),
    (["", ""], True),
    (["only"], True),
    (["é", "日本", "\udcff"], True),          # any code point, lone surrogates too
    (["a\0b", "c"], False),                  # a NUL would split it
    (["a", Tag("b")], False),                 # a subclass would come back as str
    (["a", 1, None], False),                  # torch keeps whatever follows a first str
], ids=["plain", "empty strings", "one", "unicode", "nul", "subclass", "mixed"])
def test_string_fields_come_back_exactly(names, joined):
    # A mapping's strings collate to a list, a sequence's (torch's zip) to a tuple.
    for samples, path in (([{"name": n} for n in names], "name"), ([(n,) for n in names], 0)):
        layout, buffer = collate_into(samples)
        expected = layout.build(buffer)[path]
        wire = pickle.loads(pickle.dumps(LayoutSender().encode(layout)))
        rebuilt, values = LayoutReceiver().decode(wire)
        got = rebuilt.build(buffer, values)[path]
        assert type(got) is type(expected) and list(got) == list(expected)
        assert [type(v) for v in got] == [type(v) for v in expected]
        _, joined_positions = pickle.loads(wire[2])
        assert bool(joined_positions) == joined


def test_several_value_leaves_each_come_back_in_place():
    samples = [{"a": f"a{i}", "b": (f"b{i}", Tag(f"t{i}")), "c": i, "d": f"d{i}"}
               for i in range(5)]
    sender, receiver = LayoutSender(), LayoutReceiver()
    for _ in range(2):  # the layout whole, then by number
        layout, buffer = collate_into(samples)
        expected = flatten(layout.build(buffer))
        wire = pickle.loads(pickle.dumps(sender.encode(layout)))
        rebuilt, values = receiver.decode(wire)
        batch = rebuilt.build(buffer, values)
        assert flatten(batch) == expected
        assert all(type(t) is Tag for t in batch["b"][1])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_string_fields_match_torch(torch, num_workers):
    data = [{"path": f"img/{i:03d}.jpg", "pair": (f"l{i}", f"r{i}"), "id": i} for i in range(10)]
    ours = list(DataLoader(data, batch_size=4, num_workers=num_workers))
    theirs = list(torch.utils.data.DataLoader(data, batch_size=4))
    for mine, yours in zip(ours, theirs, strict=True):
        assert mine["path"] == yours["path"] and type(mine["path"]) is list
        assert [type(part) for part in mine["pair"]] == [type(part) for part in yours["pair"]]
        assert [list(part) for part in mine["pair"]] == [list(part) for part in yours["pair"]]
        assert mine["id"].tolist() == yours["id"].tolist()


class _Named(fl.Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, i):
        return {"x": np.full(2, i, np.float32), "name": f"s{i}"}


@pytest.mark.timeout(60)
def test_a_layout_lost_in_the_main_process_is_sent_again(monkeypatch):
    # An exception (one a signal handler of the caller's raised) interrupts the
    # arrival of a worker's first layout: the batches that refer to it fail,
    # and the worker is told to send its layouts again; before, every later
    # batch of that worker failed with KeyError, in every epoch.
    real_decode = LayoutReceiver.decode
    dropped = []

    def interrupted_once(self, wire):
        if wire[1] is not None and not dropped:
            dropped.append(wire[0])
            raise TimeoutError("raised by a signal handler")
        return real_decode(self, wire)

    monkeypatch.setattr(LayoutReceiver, "decode", interrupted_once)
    loader = DataLoader(_Named(), batch_size=4, num_workers=2, persistent_workers=True)
    outcomes = []
    iterator = iter(loader)
    for k in range(len(loader)):
        try:
            outcomes.append(next(iterator)["name"])
        except (TimeoutError, RuntimeError) as error:
            outcomes.append(type(error).__name__)
    assert outcomes[0] == "TimeoutError"
    failed = [k for k, outcome in enumerate(outcomes) if not isinstance(outcome, list)]
    assert len(failed) <= 3, outcomes  # the batches made before the worker heard
    assert all(outcomes[k] == [f"s{i}" for i in range(4 * k, 4 * k + 4)]
               for k in range(len(outcomes)) if k not in failed)
    second = [batch["name"] for batch in loader]  # the same workers, next epoch
    assert second == [[f"s{i}" for i in range(k, k + 4)] for k in range(0, 32, 4)]


class Ticket:
    """An object with a reduction registered on ``ForkingPickler``, as torch
    registers its tensors' (``redeemed`` only when that reduction carried it)."""

    def __init__(self, number, redeemed=False):
        self.number = number
        self.redeemed = redeemed


REDEEMED = []


def _reduce_ticket(ticket):
    return _redeem, (ticket.number,)


def _redeem(number):
    REDEEMED.append(number)
    return Ticket(number, redeemed=True)


class Stamped(collections.UserDict):
    """A mapping with state: its batch is a clone of the first sample, sent in the layout."""

    def __init__(self, items, ticket):
        super().__init__(items)
        self.ticket = ticket


@pytest.fixture
def tickets(monkeypatch):
    from multiprocessing.reduction import ForkingPickler

    monkeypatch.setitem(ForkingPickler._extra_reducers, Ticket, _reduce_ticket)
    REDEEMED.clear()
    yield REDEEMED
    REDEEMED.clear()


def test_values_travel_with_the_reductions_registered_on_forkingpickler(tickets):
    sender, receiver = LayoutSender(), LayoutReceiver()
    for number in (1, 2):
        layout, buffer = pack_into({"x": np.full(2, number), "ticket": Ticket(number)})
        rebuilt, values = receiver.decode(pickle.loads(pickle.dumps(sender.encode(layout))))
        batch = rebuilt.build(buffer, values)
        assert batch["ticket"].redeemed and batch["ticket"].number == number
    assert tickets == [1, 2]  # each unpickled once


def test_a_layout_holding_such_an_object_is_sent_whole_every_time_and_not_kept(tickets):
    # Its reduction may hand over a resource to the one process that unpickles
    # it: equal bytes are no sign that the main process holds it already.
    sender, receiver = LayoutSender(), LayoutReceiver()
    for start in (0, 4):
        samples = [Stamped({"x": np.full(2, i)}, Ticket(start)) for i in range(start, start + 4)]
        layout, buffer = collate_into(samples)
        wire = pickle.loads(pickle.dumps(sender.encode(layout)))
        assert wire[0] == -1 and wire[1] is not None
        batch = receiver.decode(wire)[0].build(buffer)
        assert type(batch) is Stamped and batch.ticket.redeemed and batch.ticket.number == start
        assert batch["x"].tolist() == [[i, i] for i in range(start, start + 4)]
    assert receiver._layouts == {}
    assert tickets == [0, 4]


def test_the_values_of_a_batch_whose_layout_was_lost_are_still_unpickled(tickets):
    from fastload._loading.wire.layouts import LayoutLost

    sender = LayoutSender()
    wires = [sender.encode(pack_into({"x": np.zeros(2), "ticket": Ticket(n)})[0]) for n in (1, 2)]
    assert wires[1][1] is None  # sent by number
    with pytest.raises(LayoutLost):
        LayoutReceiver().decode(wires[1])  # the receiver never got the first
    assert tickets == [2]


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor", "ignore:TypedStorage is deprecated")
def test_tensors_torchs_reduction_would_rebuild_wrong_keep_their_own_pickling(torch):
    # torch's shared-memory reduction rebuilds a tensor from its storage and
    # strides: a quantized tensor would lose its quantizer, a lazily
    # conjugated or negated one its bit (and so its values).
    complex_tensor = torch.tensor([1.0 + 2.0j, 3.0 - 1.0j])
    sent = types.SimpleNamespace(  # an object: a custom collate_fn's value, pickled whole
        quantized=torch.quantize_per_tensor(torch.tensor([1.0, 2.5]), 0.5, 1, torch.quint8),
        conjugated=complex_tensor.conj(), negated=complex_tensor.conj().imag)
    layout, buffer = pack_into(sent)
    rebuilt, values = LayoutReceiver().decode(LayoutSender().encode(layout))
    got = rebuilt.build(buffer, values)
    assert got.quantized.is_quantized
    assert (got.quantized.q_scale(), got.quantized.q_zero_point()) == (0.5, 1)
    assert torch.equal(got.quantized.dequantize(), sent.quantized.dequantize())
    assert got.conjugated.is_conj() and torch.equal(got.conjugated, sent.conjugated)
    assert got.negated.is_neg() and torch.equal(got.negated, sent.negated)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_tasks_are_pickled_plainly_unless_a_tensor_would_not_unpickle(torch, tickets):
    from fastload._loading.wire.picklers import dumps_task
    from fastload._loading.wire.messages import batch_task

    # Plain, as before: ints, arrays, tensors whose dtype plain pickling
    # rebuilds, and objects with a ForkingPickler reduction (a task is no
    # batch value: only tensors plain pickling breaks take the reductions).
    for indices in ([3, 1, 2], np.arange(3), torch.arange(3), list(torch.arange(3)),
                    torch.arange(3).to(torch.bfloat16), [Ticket(7)]):
        task = batch_task(0, (0, None, 0, "x"), False, indices)
        assert dumps_task(task) == pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL)
    assert tickets == []
    for dtype in ("uint16", "uint32", "uint64", "float8_e4m3fn", "complex32"):
        indices = torch.arange(3).to(getattr(torch, dtype))
        for sent in (indices, list(indices), {"nested": [indices]}):
            with pytest.raises(AttributeError):  # what the worker met before
                pickle.loads(pickle.dumps(sent, protocol=pickle.HIGHEST_PROTOCOL))
            back = pickle.loads(dumps_task(batch_task(1, (0,), False, sent)))[-1]
            assert type(back) is type(sent)
            assert _tensor_leaves(back, torch) == _tensor_leaves(sent, torch), (dtype, sent)


def _tensor_leaves(obj, torch):
    """(dtype, shape, bytes) of every tensor in nested lists and dicts."""
    if isinstance(obj, torch.Tensor):
        return [(obj.dtype, tuple(obj.shape), obj.reshape(-1).view(torch.uint8).tolist())]
    items = obj.values() if isinstance(obj, dict) else obj
    return [leaf for item in items for leaf in _tensor_leaves(item, torch)]
