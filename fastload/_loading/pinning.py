"""``pin_memory=True``: torch's warnings, and batches pinned as torch pins them.

NOTE [ Where batches are pinned ]
torch pins every batch in the main process, with
``torch.utils.data._utils.pin_memory.pin_memory(batch, device)`` (in its
single-process iterator inline, with workers in a thread), after checking
for an accelerator.  fastload makes the same checks, gives the same warnings,
and calls that same function on each batch as it is handed out: tensors
(nested in any structure, and any object with a ``pin_memory`` method) are
copied into pinned memory, everything else is left as it is.  The copy is
the caller's, so the batch's ring slot comes back as soon as the views it
was built from are dropped.  No thread: the copy runs in ``next()``.  With
``output="numpy"`` the batches are numpy arrays, which torch's function
leaves as they are (a tensor a ``collate_fn`` returns is still pinned);
that is said once, as a warning.  Torch is imported only when
``pin_memory=True``: without it no accelerator can be used.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["pin_device", "pin_batch"]


def _torch_or_none() -> Any:
    try:
        import torch
    except ImportError:
        return None
    return torch


def pin_device(pin_memory: bool, pin_memory_device: str, output: str,
               stacklevel: int = 2) -> tuple[bool, str | None]:
    """torch's ``(_pin_memory, _pin_memory_device)`` for a new iterator: whether batches
    are pinned, and the current accelerator's type; with torch's warnings, in torch's order.

    ``stacklevel`` counts from the caller of this function, as ``warnings.warn``'s does.
    """
    if not pin_memory:
        return False, None
    level = stacklevel + 1
    if pin_memory_device:
        warnings.warn("pin_memory_device is deprecated, the current accelerator will be used "
                      f"as the device,ignore pin_memory_device='{pin_memory_device}'.",
                      stacklevel=level)  # torch's words (its missing space too)
    torch = _torch_or_none()
    if torch is None or not torch.accelerator.is_available():
        warnings.warn("'pin_memory' argument is set as true but no accelerator is found, "
                      "then device pinned memory won't be used.", stacklevel=level)
        return False, None
    accelerator = torch.accelerator.current_accelerator()
    device = accelerator.type if accelerator is not None else None
    if device == "mps":
        # torch's exception: pinning fails on MPS, so it is switched off there.
        warnings.warn("'pin_memory' argument is set as true but not supported on MPS now, "
                      "device pinned memory won't be used.", stacklevel=level)
        return False, device
    if output == "numpy":
        warnings.warn("pin_memory=True pins tensors, but with output='numpy' batches are numpy "
                      "arrays, which stay in shared memory unpinned (as torch's pin_memory "
                      "leaves anything but tensors); use output='torch' for pinned batches.",
                      stacklevel=level)
    return True, device


def pin_batch(batch: Any, device: str | None) -> Any:
    """``batch`` with its tensors in pinned memory: torch's own function, as torch calls it."""
    from torch.utils.data._utils import pin_memory as torch_pinning

    return torch_pinning.pin_memory(batch, device)
