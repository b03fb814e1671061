"""Seeding torch before every batch (``num_workers="auto"``) as ``torch.manual_seed``
does, without its cost where that cost buys nothing.

``torch.manual_seed`` seeds the CPU generator and every accelerator's: one
already started at once, one not yet started by queueing the seed for its
start, formatting a stack trace for each one it queues (CUDA, XPU, MTIA) at
every call.  Run before every batch, that costs more than a light batch's
own work.  An accelerator that can never start in this process has no
generator to seed: one this torch was not built with, or one the caller
started before forking this worker (torch skips that one too: a "bad
fork").  When every accelerator is of those kinds only the CPU generator is
seeded; otherwise, or when torch's make-up cannot be read,
``torch.manual_seed`` runs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["seed_torch"]

# torch's accelerators whose seeding torch.manual_seed queues when not yet started.
_QUEUED_ACCELERATORS = ("cuda", "xpu", "mtia")

# Whether only torch's CPU generator can draw in this process (None: not decided
# yet), decided at its first batch.  Neither what torch was built with nor a bad
# fork changes later, and a process forked from this one inherits both.
_cpu_only: bool | None = None


def seed_torch(torch: Any, seed: int) -> None:
    """Leave torch's generators as ``torch.manual_seed(seed)`` would."""
    global _cpu_only
    if _cpu_only is None:
        _cpu_only = only_the_cpu_generator(torch)
    if _cpu_only:
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def only_the_cpu_generator(torch: Any) -> bool:
    """Whether no accelerator can start in this process: each is either not built
    into this torch or was started by the process this one forked from.  False
    when any part of that cannot be read (a torch this was not written for)."""
    try:
        for name in _QUEUED_ACCELERATORS:
            module = getattr(torch, name, None)
            if module is None:
                continue  # a torch older than that accelerator
            if module._is_compiled() and not module._is_in_bad_fork():
                return False
        if torch._C._has_mps:
            return False
        # A third-party device (PrivateUse1) that torch.manual_seed seeds too.
        if hasattr(torch, torch._C._get_privateuse1_backend_name()):
            return False
        return True
    except Exception:
        return False
