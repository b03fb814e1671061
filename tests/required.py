"""The test extra's reference libraries (pyarrow, datasets, webdataset, fsspec, ...).

A test that compares with one skips where it is not installed, as torch's
differential tests do, and fails instead when FASTLOAD_REQUIRE_TORCH is set
(as .ci/run does after installing the test extra), so CI cannot go green
without running it.
"""

import importlib
import os

import pytest


def require(module_name: str):
    """The module ``module_name``, or a skip (a failure under FASTLOAD_REQUIRE_TORCH)."""
    try:
        return importlib.import_module(module_name)
    except ImportError as error:
        if os.environ.get("FASTLOAD_REQUIRE_TORCH"):
            pytest.fail(f"{module_name} is required here (FASTLOAD_REQUIRE_TORCH is set) but "
                        f"cannot be imported: {error}", pytrace=False)
        pytest.skip(f"needs {module_name}: pip install -e '.[test]'", allow_module_level=True)
