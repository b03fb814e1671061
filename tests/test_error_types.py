"""The errors a loader raises at run time have torch's types (and its words where practical).

Code written for torch catches what torch raises: each test puts torch's
DataLoader and fastload's in the same situation and compares the exceptions.
Situations where torch raises nothing (it hangs, or a forked child takes the
parent's batches) are fastload's own and tested in test_faults.py.
"""

import pickle
import re
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest

import fastload as fl

REPO_DIR = str(Path(__file__).resolve().parent.parent)


@pytest.fixture
def failing(torch):
    """tests/failing_datasets.py: its datasets subclass torch's, so it imports torch,
    which this module leaves to the tests that use it (tests/conftest.py says why)."""
    import failing_datasets

    return failing_datasets


def _raised(library, dataset, **kwargs):
    """The exception one epoch of ``library``'s DataLoader raises (None if none)."""
    loader = library.DataLoader(dataset, **kwargs)
    iterator = None
    try:
        iterator = iter(loader)
        for _ in iterator:
            pass
    except Exception as error:
        return error
    finally:
        # The error's traceback keeps the iterator alive; shut its workers down
        # now rather than when the test's locals go (torch's then wait to time out).
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
    return None


def _both(torch, dataset, **kwargs):
    return _raised(fl, dataset, **kwargs), _raised(torch.utils.data, dataset, **kwargs)


def _first_line(error):
    return str(error).splitlines()[0] if str(error) else ""


def _assert_torchs_type(ours, theirs):
    assert theirs is not None and ours is not None, (ours, theirs)
    # Ours may be a subclass (a SharedMemoryError is a RuntimeError): what
    # catches torch's catches ours.
    assert isinstance(ours, type(theirs)), (type(ours), type(theirs), ours, theirs)


# -- an exception in the caller's code, re-raised in the main process -------

class TwoArguments(Exception):
    def __init__(self, a, b):
        super().__init__(a, b)


class KeywordMessage(Exception):
    def __init__(self, *, message):
        super().__init__(message)
        self.message = message


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("error", [ValueError("bad"), KeyError("k"), IndexError("far"),
                                   OSError(5, "disk"), TwoArguments(1, 2),
                                   KeywordMessage(message="m")], ids=lambda e: type(e).__name__)
def test_a_datasets_exception_is_reraised_as_torchs(torch, failing, no_leaks, num_workers, error):
    # In a worker: the same type ("Caught ... in DataLoader worker process 1."
    # first), or RuntimeError for a type that does not take one message.
    ours, theirs = _both(torch, failing.RaisesAt3(error), batch_size=2, num_workers=num_workers)
    assert type(ours) is type(theirs)
    assert _first_line(ours) == _first_line(theirs)
    if num_workers:
        assert _first_line(ours) == f"Caught {type(error).__name__} in DataLoader worker process 1."


def init_fails(worker_id):
    raise ValueError(f"worker {worker_id} cannot start")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["worker_init_fn", "iter", "stream"])
def test_errors_of_worker_init_fn_and_iterable_datasets_are_torchs(torch, failing, no_leaks,
                                                                   case):
    if case == "worker_init_fn":
        ours, theirs = _both(torch, failing.RaisesAt3(None), batch_size=2, num_workers=2,
                             worker_init_fn=init_fails)
    else:
        ours, theirs = _both(torch, failing.Stream(case == "iter"), batch_size=None,
                             num_workers=2)
    assert type(ours) is type(theirs)
    assert _first_line(ours) == _first_line(theirs)


# -- a bad batch (the default collate) ----------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", ["ragged", "none", "object", "missing key", "list length"])
def test_a_batch_default_collate_refuses_raises_torchs_type(torch, failing, no_leaks, num_workers,
                                                            kind):
    ours, theirs = _both(torch, failing.OddSampleAt3(kind), batch_size=2, num_workers=num_workers)
    _assert_torchs_type(ours, theirs)
    if num_workers:
        assert _first_line(ours) == f"Caught {type(ours).__name__} in DataLoader worker process 1."


# -- a worker that dies, a timeout ---------------------------------------------

# torch's words when its SIGCHLD handler sees the exit (its poll says
# "DataLoader worker (pid(s) <pid>) exited unexpectedly").
_TORCHS_EXIT = (r"DataLoader worker \(pid \d+\) exited unexpectedly with exit code 3\. Details "
                r"are lost due to multiprocessing\. Rerunning with num_workers=0 may give better "
                r"error trace\.")
_TORCHS_POLL = r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("how", ["os._exit", "sys.exit", "SIGKILL", "SIGSEGV"])
def test_a_worker_that_dies_is_torchs_runtime_error(torch, failing, no_leaks, how):
    ours, theirs = _both(torch, failing.DiesAt3(how), batch_size=2, num_workers=2)
    assert type(ours) is type(theirs) is RuntimeError
    if how.startswith("SIG"):
        text = signal.strsignal(getattr(signal, how))
        assert re.fullmatch(rf"DataLoader worker \(pid \d+\) is killed by signal: {text} "
                            rf"\({how}\)\.", str(ours)), str(ours)
        assert re.fullmatch(rf"DataLoader worker \(pid \d+\) is killed by signal: {text}\. |"
                            + _TORCHS_POLL, str(theirs)), str(theirs)
    else:
        assert re.fullmatch(_TORCHS_EXIT, str(ours)), str(ours)
        assert re.fullmatch(_TORCHS_EXIT + "|" + _TORCHS_POLL, str(theirs)), str(theirs)


@pytest.mark.timeout(90)
def test_a_timeout_is_torchs_runtime_error(torch, failing, no_leaks):
    ours, theirs = _both(torch, failing.DiesAt3("sleep"), batch_size=2, num_workers=2,
                         timeout=0.5)
    assert type(ours) is type(theirs) is RuntimeError
    assert str(ours) == str(theirs) == "DataLoader timed out after 0.5 seconds"


def test_a_timeout_without_workers_is_torchs_assertion_error(torch, failing):
    ours, theirs = _both(torch, failing.RaisesAt3(None), timeout=1)
    assert isinstance(ours, AssertionError) and isinstance(theirs, AssertionError)


def test_pickling_an_iterator_is_torchs_not_implemented_error(torch, failing, no_leaks):
    for library in (fl, torch.utils.data):
        iterator = iter(library.DataLoader(failing.RaisesAt3(None), num_workers=2))
        with pytest.raises(NotImplementedError):
            pickle.dumps(iterator)
        iterator._shutdown_workers()


# -- spawn: what must be pickled -----------------------------------------------

def lambda_collate(batch):  # replaced by a lambda below: pickled by reference, it fails
    return batch


lambda_collate = lambda batch: batch  # noqa: E731


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:Got pickle error when attempting to start a worker")
@pytest.mark.parametrize("what", ["lambda collate_fn", "local worker_init_fn"])
def test_spawn_with_what_cannot_be_pickled_is_torchs_pickling_error(torch, failing, no_leaks,
                                                                    what):
    def local_init(worker_id):
        pass

    argument = {"collate_fn": lambda_collate} if what == "lambda collate_fn" \
        else {"worker_init_fn": local_init}
    ours, theirs = _both(torch, failing.RaisesAt3(None), batch_size=2, num_workers=2,
                         multiprocessing_context="spawn", **argument)
    assert type(ours) is type(theirs)
    assert str(theirs) in str(ours)  # torch's words, with which object and what to do


@pytest.mark.timeout(120)
def test_spawn_with_a_class_the_worker_cannot_import_is_torchs_runtime_error(torch, no_leaks):
    # Pickled by reference in the main process, where its module exists only
    # in sys.modules: a spawned worker cannot import it.  torch's worker dies
    # unpickling it; ours says what it could not unpickle.
    module = types.ModuleType("only_in_the_main_process")
    exec("class Rows:\n"
         "    def __len__(self):\n"
         "        return 4\n"
         "    def __getitem__(self, i):\n"
         "        return i\n", module.__dict__)
    module.Rows.__module__ = module.__name__
    sys.modules[module.__name__] = module
    try:
        ours, theirs = _both(torch, module.Rows(), batch_size=2, num_workers=1,
                             multiprocessing_context="spawn")
    finally:
        del sys.modules[module.__name__]
    assert type(ours) is type(theirs) is RuntimeError
    assert "could not unpickle the dataset" in str(ours) and "only_in_the_main_process" in str(ours)


# -- resources: open files, /dev/shm -------------------------------------------

_FD_SCRIPT = """
import os, resource, sys
sys.path[:0] = [{repo!r}]
import torch
import fastload as fl

class Holder:
    def __init__(self, tensor):
        self.tensor = tensor

class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return 400

    def __getitem__(self, i):
        return torch.full((4,), i, dtype=torch.float32)

def hold_an_epoch(library):
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 4096))
    collate = {{"default": None, "holder": lambda b: Holder(torch.stack(b))}}[{collate!r}]
    try:
        held = list(library.DataLoader(Rows(), batch_size=2, num_workers=2, collate_fn=collate))
        print("HELD", len(held), flush=True)
    except Exception as exc:
        print("ERROR", type(exc).__name__, "MESSAGE", exc, flush=True)

# torch is imported once (its import is most of a run); each library runs in a child
# forked before any loader, as a fresh process would, under a soft limit of 64 files.
for name, library in (("fastload", fl), ("torch", torch.utils.data)):
    print("LIBRARY", name, flush=True)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            hold_an_epoch(library)
            code = 0
        finally:
            os._exit(code)
    print("CHILD", pid, "EXIT", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
os._exit(0)  # nothing of this process's to clean up: skip tearing torch's modules down
"""

_TORCHS_FD_WORDS = ("Too many open files. Communication with the workers is no longer possible. "
                    "Please increase the limit using `ulimit -n` in the shell")


def _fd_limit_results(out):
    """{library: (exception type, message)} from _FD_SCRIPT's output."""
    results = {}
    for block in out.split("LIBRARY ")[1:]:
        name, rest = block.split("\n", 1)
        assert rest.startswith("ERROR "), (name, out)
        kind, message = rest[len("ERROR "):].split(" MESSAGE ", 1)
        message = message.rsplit("\nCHILD ", 1)[0]  # the parent's line follows the child's
        results[name] = kind, message
    return results


@pytest.mark.timeout(120)
@pytest.mark.parametrize("collate", ["default", "holder"])
def test_holding_batches_past_the_open_file_limit_is_torchs_runtime_error(torch, tmp_path,
                                                                          no_leaks, collate):
    # "holder": a batch torch's pickler sends with a descriptor per tensor, in
    # both libraries; the receive fails when none is left.
    script = tmp_path / "fd_limit.py"
    script.write_text(_FD_SCRIPT.format(repo=REPO_DIR, collate=collate))
    proc = subprocess.Popen([sys.executable, str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    no_leaks.watch_pid(proc.pid)
    out, err = proc.communicate(timeout=100)
    for pid in re.findall(r"^CHILD (\d+) ", out, re.M):
        no_leaks.watch_pid(int(pid))
    assert proc.returncode == 0 and re.findall(r" EXIT (-?\d+)$", out, re.M) == ["0", "0"], \
        (out, err[-2000:])
    results = _fd_limit_results(out)
    assert sorted(results) == ["fastload", "torch"], out
    (our_type, ours), (their_type, theirs) = results["fastload"], results["torch"]
    assert our_type == their_type == "RuntimeError"
    assert ours.startswith(_TORCHS_FD_WORDS) and theirs.startswith(_TORCHS_FD_WORDS), (ours, theirs)
    # torch's test_fd_limit_exceeded checks for both phrases
    assert "set_sharing_strategy" in ours and "set_sharing_strategy" in theirs, (ours, theirs)


_SHM_SCRIPT = """
import sys
sys.path[:0] = [{repo!r}]
import numpy as np
import torch
import fastload as fl

class Big(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.zeros(1 << 20, np.float32)  # 4 MiB: a batch of two is 8 MiB

for library in (fl, torch.utils.data):
    try:
        for _ in library.DataLoader(Big(), batch_size=2, num_workers=2, timeout=60):
            pass
        print("NONE")
    except Exception as exc:
        print("ERROR", isinstance(exc, RuntimeError), type(exc).__name__)
"""


@pytest.mark.timeout(180)
def test_a_too_small_dev_shm_is_torchs_runtime_error(torch, tmp_path):
    mount = "mount -t tmpfs -o size=4m tmpfs /dev/shm"
    probe = subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private /dev/shm here: {probe.stderr.strip()}")
    script = tmp_path / "small_shm.py"
    script.write_text(_SHM_SCRIPT.format(repo=REPO_DIR))
    # POSIX segments, the ring's fallback: its memory files do not live in /dev/shm.
    command = f"{mount} && FASTLOAD_RING=posix exec {sys.executable} {script}"
    result = subprocess.run(["unshare", "-m", "sh", "-c", command],
                            capture_output=True, text=True, timeout=170)
    lines = [line for line in result.stdout.splitlines() if line.startswith(("ERROR", "NONE"))]
    # torch: "Caught RuntimeError in DataLoader worker process 0 ... unable to
    # allocate shared memory"; ours: a SharedMemoryError, a RuntimeError.
    assert lines == ["ERROR True SharedMemoryError", "ERROR True RuntimeError"], \
        (result.stdout, result.stderr[-3000:])
