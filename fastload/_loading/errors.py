"""The errors the loading machinery raises, or carries from a worker to the main process."""

from __future__ import annotations

import pickle
import sys
import traceback
from typing import NoReturn

__all__ = ["IterArgumentError", "ArrivalError", "ExceptionWrapper", "WorkerDied"]


class IterArgumentError(ValueError, AssertionError):
    """An argument torch checks with an assert at ``iter()`` (``timeout > 0`` without
    workers, ``prefetch_factor`` below 1 with them): torch's type, and a bad argument's."""


class ArrivalError:
    """An answer that could not be unpacked in the main process, raised at its
    batch's turn (a worker's error travels as an ``ExceptionWrapper``)."""

    __slots__ = ("_exception",)

    def __init__(self, exception: Exception) -> None:
        self._exception = exception

    def reraise(self) -> NoReturn:
        exception, self._exception = self._exception, None
        try:
            raise exception
        finally:
            del exception  # see ExceptionWrapper.reraise: no cycle through this frame


class WorkerDied(RuntimeError):
    """A worker process ended without being asked to."""


class ExceptionWrapper:
    """An exception caught in a worker, carried to the main process and re-raised there
    with the same type where possible, the worker id and the worker's traceback."""

    def __init__(self, where: str, exc_info: tuple | None = None) -> None:
        exc_type, exc_value, exc_tb = exc_info or sys.exc_info()
        self.exc_type = exc_type
        self.where = where
        self.text = "".join(traceback.format_exception(exc_type, exc_value, exc_tb))

    def __reduce__(self):
        # The type must unpickle in the main process; fall back to RuntimeError.
        try:
            pickle.dumps(self.exc_type)
            exc_type = self.exc_type
        except Exception:
            exc_type = RuntimeError
        return (_rebuild_wrapper, (exc_type, self.where, self.text))

    def reraise(self) -> None:
        message = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {self.text}"
        if self.exc_type is KeyError:
            # KeyError repr()s its argument, which would mangle the traceback.
            message = _KeyErrorMessage(message)
        try:
            if getattr(self.exc_type, "message", None):
                # Types that declare a ``message`` (often keyword-only), as torch handles them.
                exception = self.exc_type(message=message)
            else:
                exception = self.exc_type(message)
        except Exception:
            # Some exception types need other arguments.
            raise RuntimeError(message) from None
        try:
            raise exception
        finally:
            # The traceback holds this frame: without this, exception -> traceback
            # -> frame -> exception would keep the iterator (and its workers)
            # alive until the garbage collector runs.
            del exception


class _KeyErrorMessage(str):
    def __repr__(self) -> str:
        return self


def _rebuild_wrapper(exc_type: type, where: str, text: str) -> ExceptionWrapper:
    wrapper = ExceptionWrapper.__new__(ExceptionWrapper)
    wrapper.exc_type, wrapper.where, wrapper.text = exc_type, where, text
    return wrapper
