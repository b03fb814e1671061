"""The test extra's reference libraries (pyarrow, datasets, webdataset, fsspec, ...).

A test that compares with one skips where it is not installed, as torch's
differential tests do, and fails instead when FASTLOAD_REQUIRE_TORCH is set
(as .ci/run does after installing the test extra), so CI cannot go green
without running it.
"""

import importlib
import importlib.util
import os

import pytest


def require(module_name: str):
    """The module ``module_name``, or a skip (a failure under FASTLOAD_REQUIRE_TORCH)."""
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        _missing(module_name, f"cannot be imported: {error}")


def require_installed(module_name: str) -> None:
    """As ``require``, for a library only the test's subprocesses import (importing
    it here would slow every later test's forks)."""
    if importlib.util.find_spec(module_name) is None:
        _missing(module_name, "is not installed")


def deferred(module_name: str):
    """``module_name`` for a test module's tests, imported at their first use of it.

    Whether it is installed is checked at once, as ``require_installed`` checks
    (a skip of the whole module, or a failure under FASTLOAD_REQUIRE_TORCH); the
    import, as ``require`` does it, waits until a test reads an attribute.  Such
    a module is marked ``imports_heavy_library``: tests/conftest.py runs it last.
    """
    require_installed(module_name.partition(".")[0])  # a submodule's spec imports its package
    return _Deferred(module_name)


class _Deferred:
    """Stands for a module not imported yet: see ``deferred``."""

    def __init__(self, module_name: str) -> None:
        self._module_name = module_name

    def __getattr__(self, attribute: str):
        if attribute.startswith("_"):  # pytest's collection probes objects for such names
            raise AttributeError(f"{attribute!r}: a deferred module gives only public names")
        return getattr(require(self._module_name), attribute)


def _missing(module_name: str, why: str) -> None:
    if os.environ.get("FASTLOAD_REQUIRE_TORCH"):
        pytest.fail(f"{module_name} is required here (FASTLOAD_REQUIRE_TORCH is set) but "
                    f"{why}: pip install -e '.[test]'", pytrace=False)
    pytest.skip(f"needs {module_name}: pip install -e '.[test]'", allow_module_level=True)
