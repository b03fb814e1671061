"""An opt-in pytest plugin: the test process (and the workers it forks) sees
``FAKE_CPUS`` CPUs (default 64), to show the suite holds on a large machine.

    PYTHONPATH=tests FAKE_CPUS=64 python -m pytest -p fake_cpus

It patches ``os.sched_getaffinity`` and ``os.cpu_count``, which torch and
fastload both read for the worker-count warning; processes started afresh
(spawn, subprocesses) see the real machine.
"""

import os

_CPUS = int(os.environ.get("FAKE_CPUS", "64"))

os.sched_getaffinity = lambda pid: set(range(_CPUS))
os.cpu_count = lambda: _CPUS


def pytest_report_header(config):
    return f"fake_cpus: os.sched_getaffinity(0) and os.cpu_count() report {_CPUS} CPUs"
