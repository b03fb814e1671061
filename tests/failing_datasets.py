"""Datasets that fail on purpose, in torch's and fastload's loaders alike, for
tests/test_error_types.py.

They subclass torch's ``Dataset`` and ``IterableDataset`` (an iterable dataset
must, for torch's DataLoader to iterate it), so importing this module imports
torch: the tests import it through their ``failing`` fixture, never at
collection (tests/conftest.py says why).  Their classes live in a module, not in
a test, so that workers can unpickle them by name.
"""

import faulthandler
import os
import signal
import sys
import time

import numpy as np
from torch.utils.data import Dataset, IterableDataset


class RaisesAt3(Dataset):
    def __init__(self, error):
        self.error = error

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            raise self.error
        return np.full(3, i, np.float32)


class Stream(IterableDataset):
    def __init__(self, fail_at_iter):
        self.fail_at_iter = fail_at_iter

    def __iter__(self):
        if self.fail_at_iter:
            raise ValueError("no stream")
        yield 1
        yield 2
        raise OSError(5, "the stream broke")


class OddSampleAt3(Dataset):
    """Samples default_collate cannot batch: sample 3 differs from the others."""

    def __init__(self, kind):
        self.kind = kind

    def __len__(self):
        return 8

    def __getitem__(self, i):
        odd = i == 3
        if self.kind == "ragged":
            return np.zeros(4 if odd else 3, np.float32)
        if self.kind == "none":
            return None if odd else np.zeros(3, np.float32)
        if self.kind == "object":
            return object() if odd else np.zeros(3, np.float32)
        if self.kind == "missing key":
            return {"b": 1} if odd else {"a": 1}
        if self.kind == "list length":
            return [1, 2, 3] if odd else [1, 2]
        raise AssertionError(self.kind)


class DiesAt3(Dataset):
    def __init__(self, how):
        self.how = how

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if i == 3:
            if self.how == "os._exit":
                os._exit(3)
            if self.how == "sys.exit":
                sys.exit(3)
            if self.how == "sleep":
                time.sleep(2)
            else:
                faulthandler.disable()  # pytest's, inherited: no dump of a death on purpose
                os.kill(os.getpid(), getattr(signal, self.how))
        return np.full(3, i, np.float32)
