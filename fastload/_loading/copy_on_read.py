"""A one-time warning when forked workers would copy a large Python list.

Reading a Python container touches the reference counts of what it holds,
so each forked worker copies, page by page, a list its dataset reads from
(NOTE [ Copy-on-read ] in ``fastload/shared_list.py``).  The dataset's own
attributes are looked at once per loader iteration (a shallow look: cheap),
and a list, tuple or dict of ``LARGE`` items or more is named once per
process, with the fix.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["LARGE", "warn_of_large_containers"]

# Items from which a container's copies in every worker are worth a warning:
# a list of 100,000 small records is tens of MB per worker.
LARGE = 100_000

_warned = False


def warn_of_large_containers(dataset: Any, start_method: str) -> None:
    """Warn (once per process) if forked workers would copy a large container of ``dataset``'s."""
    global _warned
    if _warned or start_method != "fork":
        return
    try:
        attributes = vars(dataset)
    except TypeError:  # no __dict__ (slots, a C type)
        return
    for name, value in attributes.items():
        if type(value) in (list, tuple, dict) and len(value) >= LARGE:
            _warned = True
            warnings.warn(
                f"the dataset's attribute {name!r} is a Python {type(value).__name__} of "
                f"{len(value)} items: each forked worker copies it page by page as reading it "
                f"touches reference counts (torch's issue 13246). Keep per-sample records in "
                f"fl.SharedList(records), or arrays in numpy arrays, which workers share.",
                UserWarning, stacklevel=5)
            return
