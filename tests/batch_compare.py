"""Comparing batches: fastload's against torch's, and fastload's against numpy references."""

from __future__ import annotations

import collections
import collections.abc
import sys

import numpy as np


def _is_tensor(obj) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def assert_same_as_torch(ours, theirs, path="batch", tensors=False):
    """``ours`` (numpy) is ``theirs`` (torch) with arrays in place of tensors;
    with ``tensors``, ``ours`` has tensors there too, as ``theirs`` has."""
    if _is_tensor(theirs):
        expected = theirs.numpy()
        if tensors:
            assert _is_tensor(ours), f"{path}: {type(ours)} is not a tensor"
            ours = ours.numpy()
        assert type(ours) is np.ndarray, f"{path}: {type(ours)} is not an ndarray"
        assert ours.dtype == expected.dtype, f"{path}: dtype {ours.dtype} != torch's {expected.dtype}"
        assert ours.shape == expected.shape, f"{path}: shape {ours.shape} != torch's {expected.shape}"
        np.testing.assert_array_equal(ours, expected, err_msg=path)
        return
    if isinstance(theirs, np.ndarray):  # a leaf torch left alone (beside a string, say)
        assert type(ours) is np.ndarray, f"{path}: {type(ours)} is not an ndarray"
        assert ours.dtype == theirs.dtype, f"{path}: dtype {ours.dtype} != torch's {theirs.dtype}"
        np.testing.assert_array_equal(ours, theirs, err_msg=path)
        return
    if isinstance(theirs, collections.abc.Mapping):
        assert type(ours) is type(theirs), f"{path}: {type(ours)} is not {type(theirs)}"
        assert list(ours.keys()) == list(theirs.keys()), path
        if isinstance(theirs, collections.defaultdict):
            assert ours.default_factory is theirs.default_factory, path
        for key in theirs:
            assert_same_as_torch(ours[key], theirs[key], f"{path}[{key!r}]", tensors)
        return
    if isinstance(theirs, tuple) and hasattr(theirs, "_fields"):
        assert type(ours) is type(theirs), f"{path}: {type(ours)} is not {type(theirs)}"
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            assert_same_as_torch(a, b, f"{path}[{i}]", tensors)
        return
    if isinstance(theirs, (str, bytes)) or not isinstance(theirs, collections.abc.Sequence):
        assert type(ours) is type(theirs), f"{path}: {type(ours)} is not {type(theirs)}"
        assert ours == theirs or (ours != ours and theirs != theirs), path  # NaN == NaN
        return
    # A sequence: the same container type (a batch of strings inside a
    # sequence comes back as zip's tuple in both).
    assert type(ours) is type(theirs), f"{path}: {type(ours)} is not {type(theirs)}"
    assert len(ours) == len(theirs), path
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert_same_as_torch(a, b, f"{path}[{i}]", tensors)


def assert_same(ours, expected, path="batch"):
    """``ours`` equals the numpy-land ``expected`` exactly (types, dtypes, values)."""
    assert type(ours) is type(expected), f"{path}: {type(ours)} is not {type(expected)}"
    if isinstance(expected, np.ndarray):
        assert ours.dtype == expected.dtype, f"{path}: {ours.dtype} != {expected.dtype}"
        assert ours.shape == expected.shape, f"{path}: {ours.shape} != {expected.shape}"
        np.testing.assert_array_equal(ours, expected, err_msg=path)
    elif isinstance(expected, collections.abc.Mapping):
        assert list(ours.keys()) == list(expected.keys()), path
        for key in expected:
            assert_same(ours[key], expected[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(ours) == len(expected), path
        for i, (a, b) in enumerate(zip(ours, expected)):
            assert_same(a, b, f"{path}[{i}]")
    else:
        assert ours == expected or (ours != ours and expected != expected), path


def torch_twin(torch, dataset):
    """A ``torch.utils.data.Dataset`` giving ``dataset``'s samples, for torch's loader."""
    class Twin(torch.utils.data.Dataset):
        def __len__(self):
            return len(dataset)

        def __getitem__(self, i):
            return dataset[i]

    return Twin()
