"""Auto mode seeds every batch's generators: as random.seed, numpy.random.seed and
torch.manual_seed leave them, through torch's CPU generator alone where no
accelerator can start in the process."""

import random
import types

import numpy as np
import pytest

from fastload._loading import torch_seeding
from fastload._loading.torch_seeding import only_the_cpu_generator, seed_torch
from fastload._loading.worker_info import batch_seed, seed_for_batch


def _accelerator(compiled, started_before_the_fork=False):
    return types.SimpleNamespace(_is_compiled=lambda: compiled,
                                 _is_in_bad_fork=lambda: started_before_the_fork)


def _torch_made_of(mps=False, backend="privateuseone", **modules):
    """A stand-in for torch's make-up: no accelerator built in unless given."""
    parts = {name: _accelerator(False) for name in ("cuda", "xpu", "mtia")}
    parts.update(modules)
    return types.SimpleNamespace(
        _C=types.SimpleNamespace(_has_mps=mps, _get_privateuse1_backend_name=lambda: backend),
        **{name: module for name, module in parts.items() if module is not None})


@pytest.mark.parametrize("torch, cpu_only", [
    (_torch_made_of(), True),
    (_torch_made_of(cuda=_accelerator(True)), False),
    (_torch_made_of(cuda=_accelerator(True, started_before_the_fork=True)), True),
    (_torch_made_of(xpu=_accelerator(True)), False),
    (_torch_made_of(mtia=_accelerator(True)), False),
    (_torch_made_of(mtia=None), True),
    (_torch_made_of(mps=True), False),
    (_torch_made_of(backend="npu", npu=_accelerator(True)), False),
    (types.SimpleNamespace(cuda=_accelerator(False)), False),
], ids=["cpu-build", "cuda-may-start", "cuda-started-by-the-parent", "xpu", "mtia",
        "a-torch-before-mtia", "mps", "a-third-party-device", "unreadable"])
def test_only_the_cpu_generator_is_seeded_where_no_accelerator_can_start(torch, cpu_only):
    assert only_the_cpu_generator(torch) is cpu_only


def _recording(torch, calls):
    torch.default_generator = types.SimpleNamespace(manual_seed=lambda s: calls.append(("cpu", s)))
    torch.manual_seed = lambda s: calls.append(("all devices", s))
    return torch


def test_the_process_decides_once_and_seeds_the_way_it_decided(monkeypatch):
    calls = []
    monkeypatch.setattr(torch_seeding, "_cpu_only", None)
    cpu_build = _recording(_torch_made_of(), calls)
    seed_torch(cpu_build, 5)
    seed_torch(cpu_build, 6)
    assert calls == [("cpu", 5), ("cpu", 6)]

    calls.clear()
    monkeypatch.setattr(torch_seeding, "_cpu_only", None)
    with_cuda = _recording(_torch_made_of(cuda=_accelerator(True)), calls)
    seed_torch(with_cuda, 7)
    seed_torch(with_cuda, 8)
    assert calls == [("all devices", 7), ("all devices", 8)]


def test_a_batchs_torch_generator_is_as_torch_manual_seed_leaves_it(torch):
    saved = torch.get_rng_state()
    try:
        for batch_no in (0, 3):
            seed_for_batch(7, batch_no)
            drawn = torch.rand(5)
            torch.manual_seed(batch_seed(7, batch_no))
            assert torch.equal(drawn, torch.rand(5))
    finally:
        torch.set_rng_state(saved)


def test_a_batchs_python_and_numpy_generators_are_as_their_seed_functions_leave_them():
    saved = random.getstate(), np.random.get_state()
    try:
        random.gauss(0, 1)  # leaves the second of its pair of normals waiting
        seed_for_batch(7, 3)
        drawn = (random.random(), random.gauss(0, 1), np.random.randint(1 << 30))
        random.gauss(0, 1)
        seed = batch_seed(7, 3)
        random.seed(seed)
        np.random.seed(seed % 2**32)
        assert drawn == (random.random(), random.gauss(0, 1), np.random.randint(1 << 30))
        assert len({seed, batch_seed(7, 4), batch_seed(8, 3)}) == 3
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
