"""fastload.vision.plain_pickle: CIFAR's pickles read opcode by opcode, never run.

Legitimate pickles (every protocol, and the published CIFAR files' own form:
Python 2's cPickle, protocol 2, numpy 1's arrays, written by
``classic_files.python2_pickle``) must give exactly what
``pickle.loads(..., encoding="bytes")`` gives.  Crafted pickles, written here
opcode by opcode from the pickle format's description, must each raise
``pickle.UnpicklingError`` (``ValueError`` naming the file, through CIFAR10),
and never run anything, crash, or allocate what the file does not hold.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest

from fastload.vision import CIFAR10, CIFAR100
from fastload.vision.plain_pickle import read_plain_pickle
from classic_files import (cifar10_files, cifar100_files, image_from_row, install_cifar,
                           python2_pickle, write_files)
from paths import REPO_DIR


def _same(ours, theirs) -> bool:
    """Equal values of equal types; arrays bit for bit, with equal dtype, shape and layout,
    and writable, as pickle makes them."""
    if isinstance(theirs, (np.ndarray, np.generic)):
        if type(ours) is not type(theirs) or ours.dtype != theirs.dtype \
                or np.shape(ours) != np.shape(theirs) or ours.tobytes("A") != theirs.tobytes("A"):
            return False
        return isinstance(theirs, np.generic) or (
            ours.flags.f_contiguous == theirs.flags.f_contiguous and ours.flags.writeable)
    if isinstance(theirs, dict):
        return type(ours) is dict and list(ours) == list(theirs) \
            and all(_same(ours[k], theirs[k]) for k in theirs)
    if isinstance(theirs, (list, tuple)):
        return type(ours) is type(theirs) and len(ours) == len(theirs) \
            and all(_same(a, b) for a, b in zip(ours, theirs))
    return type(ours) is type(theirs) and ours == theirs


PLAIN_VALUES = {
    "batch": {"data": np.arange(24, dtype=np.uint8).reshape(2, 12), "labels": [3, 1],
              b"batch_label": b"training batch 1 of 5", "filenames": ["a.png", "b.png"]},
    "scalars": [None, True, False, 0, -1, 255, 65536, -2**31, 2**40, 2**200, 1.5, "é", b"",
                b"\x00\xff", (1, "x"), (), {"k": ()}],
    "big-endian": np.arange(6, dtype=">i4").reshape(2, 3),
    "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    "numeric": [np.array([True, False]), np.arange(3, dtype=np.int8), np.ones(2, np.complex64),
                np.zeros((0, 3), np.float16), np.zeros((), np.uint16)],
    "numpy scalars": [np.int64(-7), np.float32(2.5), np.uint8(200)],
    "shared": [[1, 2]] * 3,  # memoized once, referenced thrice
}


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("name", sorted(PLAIN_VALUES))
def test_plain_values_read_as_pickle_reads_them(name, protocol):
    data = pickle.dumps(PLAIN_VALUES[name], protocol=protocol)
    ours = read_plain_pickle(data)
    assert _same(ours, pickle.loads(data, encoding="bytes"))
    if name == "shared":
        assert ours[0] is ours[1] is ours[2]


@pytest.mark.parametrize("make", [cifar10_files, cifar100_files])
def test_published_form_reads_bit_identically(make):
    files, _ = make(python2=True)
    for name, data in files.items():
        assert data.startswith(b"\x80\x02}q\x01(U")  # cPickle's protocol 2 and str keys
        theirs = pickle.loads(data, encoding="bytes")
        assert _same(read_plain_pickle(data), theirs), name
        assert all(type(key) is bytes for key in theirs)


def test_published_form_through_the_datasets(tmp_path, monkeypatch):
    for cls, make in ((CIFAR10, cifar10_files), (CIFAR100, cifar100_files)):
        files, truth = make(python2=True)
        install_cifar(cls, tmp_path, files, monkeypatch)
        ds = cls(tmp_path, train=False)
        rows, labels = truth["test"]
        assert ds.targets == labels and len(ds) == len(rows)
        for i in range(len(ds)):
            np.testing.assert_array_equal(np.asarray(ds[i][0]), image_from_row(rows[i]))
    assert CIFAR100(tmp_path).classes == truth["classes"]
    assert CIFAR10(tmp_path).classes[:2] == ["airplane", "automobile"]


# -- crafted pickles, opcode by opcode --------------------------------------


def _str(text: str) -> bytes:
    """BINUNICODE."""
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _int(value: int) -> bytes:
    return b"J" + struct.pack("<i", value)


def _dtype(code: str, state: bytes) -> bytes:
    """numpy.dtype(code, False, True), then BUILD with the opcodes of ``state`` (a tuple)."""
    return _global("numpy", "dtype") + _str(code) + b"\x89\x88\x87R" + state + b"b"


def _plain_state(order: str = "|", flags: int = 0) -> bytes:
    return b"(K\x03" + _str(order) + b"NNN" + _int(-1) + _int(-1) + _int(flags) + b"t"


def _array(shape: tuple, dtype: bytes, raw: bytes, raw_length: int | None = None) -> bytes:
    """numpy's array form: _reconstruct(ndarray, (0,), b"b"), BUILD (1, shape, dtype, False,
    raw) with ``raw`` under a BINSTRING whose length field says ``raw_length``."""
    length = len(raw) if raw_length is None else raw_length
    return (_global("numpy.core.multiarray", "_reconstruct") + _global("numpy", "ndarray")
            + b"K\x00\x85U\x01b\x87R" + b"(K\x01(" + b"".join(_int(d) for d in shape) + b"t"
            + dtype + b"\x89T" + struct.pack("<i", length) + raw + b"tb")


def _batch(data_value: bytes) -> bytes:
    """{"data": <data_value>, "labels": [0]}, protocol 2."""
    return b"\x80\x02}" + _str("data") + data_value + b"s" + _str("labels") + b"]K\x00as."


OBJECT_DTYPE = _dtype("O8", _plain_state(flags=0))  # flags cleared: raw bytes become pointers
U1 = _dtype("u1", _plain_state())

CRAFTED = {
    # an object array from raw bytes: the pointers 0x4141... (the crash on the old reader)
    "object dtype via setstate": (_batch(_array((2,), OBJECT_DTYPE, b"A" * 16)), "'O8'"),
    "object array as numpy pickles it": (pickle.dumps(np.array([1, "x"], object), protocol=2),
                                         "'O8'"),
    "numeric code, object flags": (_batch(_array((2,), _dtype("i8", _plain_state(flags=63)),
                                                 b"A" * 16)), "dtype state"),
    "structured dtype": (pickle.dumps(np.zeros(2, [("a", "u1"), ("b", "<i4")]), protocol=2),
                         "'V"),
    "nested dtype state": (_batch(_array((2,), _dtype("u1", b"(K\x03" + _str("|") + U1
                                                             + b"K\x02\x86NN" + _int(-1)
                                                             + _int(-1) + b"K\x00t"), b"AA")),
                           "dtype state"),
    "datetime dtype": (pickle.dumps(np.zeros(2, "M8[s]"), protocol=2), "'M8'"),
    "unicode dtype": (pickle.dumps(np.zeros(2, "U3"), protocol=2), "'U3'"),
    "huge shape": (_batch(_array((10**6, 3072), U1, b"\x00" * 3072)), "needs 3072000000 bytes"),
    "shape overflowing int64": (_batch(_array((2**31 - 1,) * 4, U1, b"")), "needs"),
    "negative shape": (_batch(_array((-1, 3072), U1, b"")), "non-negative"),
    "length field past the end": (_batch(_array((1, 3072), U1, b"\x00" * 10, 3072)),
                                  "3072 bytes needed"),
    "BINBYTES8 claiming 2**62": (b"\x80\x04\x8e" + struct.pack("<Q", 2**62) + b"xx.",
                                 "bytes needed"),
    "os.system": (b"\x80\x02" + _global("posix", "system") + _str("touch ran") + b"\x85R.",
                  "refusing global posix.system"),
    "builtins.eval": (b"\x80\x02" + _global("builtins", "eval") + _str("1") + b"\x85R.",
                      "refusing global builtins.eval"),
    "getattr chain": (b"\x80\x02" + _global("builtins", "getattr") + _global("numpy", "dtype")
                      + _str("__class__") + b"\x86R.", "refusing global builtins.getattr"),
    "STACK_GLOBAL gadget": (b"\x80\x04" + b"\x8c\x02os\x8c\x06system\x93" + _str("true")
                            + b"\x85R.", "refusing global os.system"),
    "copyreg reconstructor": (b"\x80\x02" + _global("copy_reg", "_reconstructor")
                              + _global("numpy", "ndarray") + b"\x85R.",
                              "refusing global copy_reg._reconstructor"),
    "NEWOBJ": (b"\x80\x02" + _global("numpy", "ndarray") + b")\x81.", "NEWOBJ"),
    "persistent id": (b"\x80\x02K\x01Q.", "not one this reader knows"),
    "allowed global, wrong arguments": (b"\x80\x02" + _global("numpy", "dtype")
                                        + _global("numpy", "ndarray") + b"\x85R.", "REDUCE"),
    "_reconstruct of another class": (b"\x80\x02" + _global("numpy.core.multiarray",
                                                            "_reconstruct")
                                      + _global("numpy", "dtype") + b"K\x00\x85U\x01b\x87R.",
                                      "REDUCE of reconstruct"),
    "codecs with another encoding": (b"\x80\x02" + _global("_codecs", "encode") + _str("x")
                                     + _str("rot13") + b"\x86R.", "REDUCE of encode"),
    "BUILD on a dict": (b"\x80\x02}}b.", "BUILD of a dict"),
    "array state set twice": (b"\x80\x02" + _array((1,), U1, b"A") + b"(K\x01(K\x01t" + U1
                              + b"\x89U\x01Atb.", "BUILD of a ndarray"),
    "dtype left as a value": (b"\x80\x02]" + U1 + b"a.", "not a complete value"),
    "unbuilt array in a list": (b"\x80\x02]" + _global("numpy.core.multiarray", "_reconstruct")
                                + _global("numpy", "ndarray") + b"K\x00\x85U\x01b\x87Ra.",
                                "not a complete value"),
    "object scalar": (b"\x80\x02" + _global("numpy.core.multiarray", "scalar")
                      + _dtype("O8", _plain_state(flags=0)) + _str("A" * 8) + b"\x86R.", "'O8'"),
    "truncated": (pickle.dumps({"data": np.zeros(3, np.uint8)}, protocol=2)[:-9], "truncated"),
    "no STOP": (b"\x80\x02K\x01", "no STOP"),
    "stack underflow": (b"\x80\x02s.", "malformed"),
    "unhashable key": (b"\x80\x02}]K\x01s.", "unhashable"),
}


@pytest.mark.parametrize("name", sorted(CRAFTED))
def test_crafted_pickles_are_refused(tmp_path, monkeypatch, name):
    data, message = CRAFTED[name]
    monkeypatch.chdir(tmp_path)  # where "touch ran" would leave its mark
    tracemalloc.start()
    try:
        with pytest.raises(pickle.UnpicklingError, match=message.replace("(", r"\(")):
            read_plain_pickle(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000 + 4 * len(data)
    assert os.listdir(tmp_path) == []


def test_every_truncation_and_byte_flip_is_an_unpickling_error_or_a_value():
    # Nothing a damaged file holds gets past the reader as another exception.
    data = pickle.dumps({"data": np.arange(6, dtype=np.uint8).reshape(2, 3), "labels": [1, 2],
                         "n": 2**70, "s": "é"}, protocol=2)
    python2 = python2_pickle({"data": np.zeros((1, 4), np.uint8), "labels": [300]})
    for source in (data, python2):
        for end in range(len(source)):
            with pytest.raises(pickle.UnpicklingError):
                read_plain_pickle(source[:end])
        for i in range(len(source)):
            for flip in (0x01, 0x80, 0xFF):
                try:
                    read_plain_pickle(source[:i] + bytes([source[i] ^ flip]) + source[i + 1:])
                except pickle.UnpicklingError:
                    pass


def test_a_large_memo_index_allocates_nothing():
    # LONG_BINPUT 2**28: pickle's C unpickler would size its memo to 2**29 slots.
    tracemalloc.start()
    try:
        assert read_plain_pickle(b"\x80\x02K\x01r\x00\x00\x00\x10.") == 1
        assert tracemalloc.get_traced_memory()[1] < 100_000
    finally:
        tracemalloc.stop()


def test_deep_and_recursive_structures_do_not_exhaust_the_stack():
    deep = b"\x80\x02" + b"]" * 30_000 + b"a" * 29_999 + b"."
    value = read_plain_pickle(deep)
    for _ in range(1000):
        value = value[0]
    looped = read_plain_pickle(b"\x80\x02]q\x00h\x00a.")  # a list that holds itself
    assert looped[0] is looped


def _cifar_folder(root, batch: bytes) -> None:
    files, _ = cifar10_files()
    files["test_batch"] = batch
    write_files(root / "cifar-10-batches-py", files)


# Run in a child so that a reader that crashes (as the allowlist unpickler did,
# dereferencing the file's bytes as pointers) fails this test instead of pytest.
_LOAD_TEST_BATCH = textwrap.dedent("""
    import sys
    sys.path.insert(0, {repo!r})
    from fastload.vision import CIFAR10
    CIFAR10.train_list, CIFAR10.test_list = [], [["test_batch", None]]
    CIFAR10.meta = dict(CIFAR10.meta, md5=None)
    try:
        ds = CIFAR10(sys.argv[1], train=False)
        print("LOADED", list(ds.targets), flush=True)
    except ValueError as error:
        print("REFUSED", error, flush=True)
""")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("target", ["data", "labels"])
def test_object_dtype_batch_is_refused_not_run(tmp_path, target):
    array = _array((2,), OBJECT_DTYPE, struct.pack("<QQ", 0x4141414141414141, 0x10))
    batch = (b"\x80\x02}" + _str(target) + array + b"s"
             + _str("labels" if target == "data" else "data")
             + (b"]K\x00a" if target == "data" else _array((1, 3072), U1, bytes(3072)))
             + b"s.")
    _cifar_folder(tmp_path, batch)
    proc = subprocess.run([sys.executable, "-c", _LOAD_TEST_BATCH.format(repo=REPO_DIR),
                           str(tmp_path)], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout.startswith("REFUSED"), proc.stdout
    assert str(tmp_path / "cifar-10-batches-py" / "test_batch") in proc.stdout
    assert "not a plain numeric dtype" in proc.stdout


@pytest.mark.parametrize("name", ["huge shape", "getattr chain", "structured dtype"])
def test_crafted_batches_raise_value_error_naming_the_file(tmp_path, monkeypatch, name):
    files, _ = cifar10_files()
    files["data_batch_3"] = CRAFTED[name][0]
    install_cifar(CIFAR10, tmp_path, files, monkeypatch)
    with pytest.raises(ValueError, match="not a readable CIFAR pickle") as error:
        CIFAR10(tmp_path)
    assert str(tmp_path / "cifar-10-batches-py" / "data_batch_3") in str(error.value)
    assert isinstance(error.value.__cause__, pickle.UnpicklingError)


@pytest.mark.parametrize("entry, message", [
    ({"data": np.zeros((1, 3072), np.uint8), "labels": ["cat"]}, "labels must be ints"),
    ({"data": np.zeros((1, 3072), np.uint8), "labels": 7}, "labels must be a list"),
    ({"data": np.zeros((1, 3072), np.float32), "labels": [0]}, "uint8"),
])
def test_wrong_values_in_a_batch_name_the_file(tmp_path, monkeypatch, entry, message):
    files, _ = cifar10_files()
    files["test_batch"] = pickle.dumps(entry, protocol=2)
    install_cifar(CIFAR10, tmp_path, files, monkeypatch)
    with pytest.raises(ValueError, match=message) as error:
        CIFAR10(tmp_path, train=False)
    assert "test_batch" in str(error.value)


def test_meta_file_names_must_be_strings(tmp_path, monkeypatch):
    files, _ = cifar10_files()
    files["batches.meta"] = pickle.dumps({"label_names": [1, 2]}, protocol=2)
    install_cifar(CIFAR10, tmp_path, files, monkeypatch)
    with pytest.raises(ValueError, match="'label_names' must be a list of strings") as error:
        CIFAR10(tmp_path, train=False)
    assert "batches.meta" in str(error.value)


def test_a_symbol_in_a_tuple_among_many_dict_entries_is_found():
    # Tuples holding a dtype, deep among a dict's entries: the check must reach each.
    entries = b"".join(_str(f"k{i}") + b"K\x01" for i in range(50))
    data = b"\x80\x02}(" + entries + _str("last") + U1 + b"\x85u."
    with pytest.raises(pickle.UnpicklingError, match="inside a tuple"):
        read_plain_pickle(data)
