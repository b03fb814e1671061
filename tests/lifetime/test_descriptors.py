"""Descriptors numbered 1024 and above (a process with many files open): the
loader's liveness checks take them, where ``select.select`` raised ValueError."""

import json
import os
import resource
import subprocess
import sys

import pytest

from paths import REPO_DIR

# In a child of its own: it raises its own open-file limit (never the test
# process's) and takes the low descriptors, so every pipe, sentinel and ring
# file the loader opens is numbered past 1024.
HIGH_DESCRIPTORS_SCRIPT = r"""
import json, os, resource
import numpy as np
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
held = []
while not held or held[-1] < 1100:
    held.append(os.open(os.devnull, os.O_RDONLY))

import fastload as fl
from fastload._lifetime.descriptors import readable

out = {}
r, w = os.pipe()
out["pipe_numbers"] = [r, w]
out["readable_before"] = readable(r)
os.write(w, b"x")
out["readable_after"] = readable(r, 1.0)

dataset = fl.ArrayDataset(np.arange(64))
for workers in (2, "auto"):
    loader = fl.DataLoader(dataset, batch_size=8, num_workers=workers)
    out[str(workers)] = [int(batch[0].sum()) for _ in range(2) for batch in loader]
print(json.dumps(out))
"""


@pytest.mark.timeout(120)
def test_a_loader_works_when_its_descriptors_are_numbered_past_1024():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard < 1200:
        # Only a privileged process may raise its hard limit: no descriptor here can
        # reach 1024, so the case this test is about cannot arise on this machine.
        pytest.skip(f"the hard open-file limit is {hard}: no descriptor can be numbered "
                    f"past 1024 (the test opens 1100)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [REPO_DIR,
                                                                     os.environ.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, "-c", HIGH_DESCRIPTORS_SCRIPT], env=env,
                            timeout=100, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert min(out["pipe_numbers"]) > 1024
    assert out["readable_before"] is False and out["readable_after"] is True
    want = [sum(range(k, k + 8)) for k in range(0, 64, 8)] * 2
    assert out["2"] == want and out["auto"] == want
