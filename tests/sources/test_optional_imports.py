"""The core needs none of the sources' dependencies: ``import fastload`` imports none."""

import subprocess
import sys

from paths import REPO_DIR


def test_importing_fastload_and_loading_arrays_imports_no_source_dependency():
    code = ("import sys, numpy as np, fastload as fl\n"
            "list(fl.DataLoader(fl.ArrayDataset(np.arange(10)), batch_size=4))\n"
            "print(sorted(m for m in ('pyarrow', 'datasets', 'fsspec', 'webdataset', 'aiohttp')"
            " if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_DIR, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert out.strip() == "[]"
