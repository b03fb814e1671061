"""The one-time warning when forked workers would copy a large Python list."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fastload as fl
from fastload._loading import copy_on_read


class _Records(fl.Dataset):
    def __init__(self, records):
        self.records = records

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return i


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(copy_on_read, "_warned", False)
    monkeypatch.setattr(copy_on_read, "LARGE", 1000)


@pytest.mark.timeout(60)
def test_a_large_list_is_named_once_with_the_fix(fresh, no_leaks):
    loader = fl.DataLoader(_Records([{"file": "x"}] * 1000), batch_size=4, num_workers=2,
                           multiprocessing_context="fork")
    with pytest.warns(UserWarning, match=r"attribute 'records' is a Python list of 1000 items.*"
                                         r"fl\.SharedList\(records\)"):
        assert [b.tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(loader)  # once per process


@pytest.mark.timeout(60)
@pytest.mark.parametrize("records, method", [
    ([{"file": "x"}] * 999, "fork"),                  # small
    (fl.SharedList([{"file": "x"}] * 1000), "fork"),  # the fix
    (np.zeros(5000), "fork"),                          # an array: shared as it is
    ([{"file": "x"}] * 1000, "spawn"),                # pickled: nothing is copied on read
])
def test_no_warning_where_nothing_is_copied_page_by_page(fresh, records, method, no_leaks):
    loader = fl.DataLoader(_Records(records), batch_size=4, num_workers=2,
                           multiprocessing_context=method)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(loader)) == 2
