"""Run real ranks for the multi-rank tests: N processes under gloo on 127.0.0.1.

``run_ranks`` starts the ranks itself with torchrun's environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``) and ``FASTLOAD_TEST_INIT_METHOD``, a ``file://``
store of its own (with the rank and world size) that a rank script passes to
``init_process_group`` as ``init_method``; ``run_torchrun`` starts ``torchrun``
(``python -m torch.distributed.run``) with ``--standalone``, whose agent binds
its store on port 0 and tells the ranks the port; ``run_launcher`` any program
that starts its own ranks (PyTorch Lightning's ``strategy="ddp"``).  No port is
picked here by binding and closing a socket, which another process could take
before it is used.  Each run is its own session, so that on a deadline, a
failure, or after success, the whole tree (ranks and their loader workers) is
killed by its process-group id: nothing outlives a test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

# gloo binds to the address the host name resolves to unless told an interface.
LOOPBACK_ENV = {"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}


def _kill_session(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _base_env(extra: dict | None) -> dict:
    env = dict(os.environ)
    env.update(LOOPBACK_ENV)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def _wait_all(processes: list, logs: list, timeout: float, what: str) -> list[str]:
    """Wait for every process until ``timeout``; kill all sessions in any case; raise
    AssertionError with their output if one failed or the deadline passed.  Returns the
    outputs (stdout and stderr together)."""
    deadline = time.monotonic() + timeout
    failed = None
    try:
        for process in processes:
            left = deadline - time.monotonic()
            try:
                code = process.wait(timeout=max(left, 0.01))
            except subprocess.TimeoutExpired:
                failed = f"{what}: still running after {timeout} s"
                break
            if code != 0 and failed is None:
                failed = f"{what}: process {process.pid} exited with {code}"
                # The others wait for it at a collective: no use waiting for them.
                break
    finally:
        for process in processes:
            _kill_session(process)
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read().decode(errors="replace"))
        log.close()
    if failed is not None:
        raise AssertionError(failed + "\n" + "\n----\n".join(out[-4000:] for out in outputs))
    return outputs


def run_ranks(world: int, argv: list[str], timeout: float, env: dict | None = None) -> list[str]:
    """Run ``argv`` as ranks ``0..world-1`` of one gloo job; returns each rank's output.

    The ranks meet in a file store of this run's own (``FASTLOAD_TEST_INIT_METHOD``)."""
    with tempfile.TemporaryDirectory(prefix="fastload-ranks-") as directory:
        store = os.path.join(directory, "store")
        processes, logs = [], []
        for rank in range(world):
            rank_env = _base_env(env)
            rank_env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                            LOCAL_WORLD_SIZE=str(world),
                            FASTLOAD_TEST_INIT_METHOD=f"file://{store}?rank={rank}"
                                                      f"&world_size={world}")
            log = tempfile.TemporaryFile()
            logs.append(log)
            processes.append(subprocess.Popen(argv, env=rank_env, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        return _wait_all(processes, logs, timeout, f"{world} ranks of {argv[1:3]}")


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """``torchrun`` on this host only: ``--standalone``, a store its agent binds on a
    port the system picks (and keeps), which it hands to the ranks."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc_per_node", str(nproc), *argv]


def run_torchrun(nproc: int, argv: list[str], timeout: float, env: dict | None = None) -> str:
    """Run ``torchrun ... argv`` (``argv`` starts with the script); returns its output."""
    return run_launcher(torchrun_command(nproc, argv), timeout, env, f"torchrun x{nproc} {argv[:1]}")


def run_launcher(argv: list[str], timeout: float, env: dict | None = None,
                 what: str | None = None) -> str:
    """Run ``argv``, a program that starts its ranks itself (torchrun, PyTorch Lightning's
    ``strategy="ddp"``), with the loopback environment; returns its output."""
    log = tempfile.TemporaryFile()
    process = subprocess.Popen(argv, env=_base_env(env), stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    return _wait_all([process], [log], timeout, what or f"{argv[1:2]}")[0]
