"""The errors the loading machinery raises or carries between processes."""

from __future__ import annotations

from typing import NoReturn

__all__ = ["IterArgumentError", "ArrivalError"]


class IterArgumentError(ValueError, AssertionError):
    """An argument torch checks with an assert at ``iter()`` (``timeout > 0`` without
    workers, ``prefetch_factor`` below 1 with them): torch's type, and a bad argument's."""


class ArrivalError:
    """An answer that could not be unpacked in the main process, raised at its
    batch's turn (a worker's error travels as ``worker.ExceptionWrapper``)."""

    __slots__ = ("_exception",)

    def __init__(self, exception: Exception) -> None:
        self._exception = exception

    def reraise(self) -> NoReturn:
        exception, self._exception = self._exception, None
        try:
            raise exception
        finally:
            del exception  # see ExceptionWrapper.reraise: no cycle through this frame

