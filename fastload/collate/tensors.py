"""torch tensors in a numpy library: recognised without importing torch, their
bytes read as numpy arrays, and made over a batch's arrays so that they keep the
ring slot under them alive.

fastload never imports torch itself: a tensor exists only when the caller
loaded torch, so ``sys.modules`` is where these functions look.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import numpy as np


def _is_torch_tensor(obj: Any) -> bool:
    """A ``torch.Tensor``, subclasses included (``Parameter``, torchvision's tv_tensors)."""
    # Never import torch here: a tensor exists only if the user loaded torch.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _is_plain_torch_tensor(obj: Any) -> bool:
    """Exactly a ``torch.Tensor``: a subclass carries more than its bytes."""
    torch = sys.modules.get("torch")
    return torch is not None and type(obj) is torch.Tensor


def tensor_is_its_bytes(tensor: Any) -> bool:
    """A tensor whose bytes are all it is: on the CPU, strided, without autograd
    history, neither nested nor quantized.  Any other is more than a buffer can
    carry (see ``TorchStacked``)."""
    return tensor.device.type == "cpu" and not tensor.requires_grad and not tensor.is_nested \
        and not tensor.is_quantized and str(tensor.layout) == "torch.strided"


def tensor_as_numpy(tensor: Any) -> np.ndarray:
    """A CPU tensor's data as an ndarray (shared where torch allows).

    A dtype numpy lacks (bfloat16, the float8s, complex32) comes as unsigned
    ints of its size, its dtype tagged with the torch dtype's name, so that
    ``ArraySlot.build`` can view the bytes as that dtype again.
    """
    tensor = tensor.detach().cpu()
    try:
        return tensor.numpy()
    except RuntimeError:
        if not (tensor.is_conj() or tensor.is_neg()):
            raise
        # A lazy conj() or negation (a bit on the tensor, not in its bytes),
        # which numpy() refuses: its values, materialized, as torch's collate takes them.
        return tensor_as_numpy(tensor.resolve_conj().resolve_neg())
    except TypeError:
        import torch

        size = tensor.element_size()
        array = tensor.view(getattr(torch, f"uint{8 * size}")).numpy()
        return array.view(np.dtype(f"u{size}", metadata={"torch_dtype": str(tensor.dtype)}))


def _numpy_dtype_of(torch_dtype: Any) -> np.dtype:
    """The dtype of ``tensor_as_numpy`` for tensors of ``torch_dtype``."""
    import torch

    return tensor_as_numpy(torch.empty((), dtype=torch_dtype)).dtype


# NOTE [ Tensors keep their slot ]
# A tensor made by torch.from_numpy keeps its array (and so the ring slot
# under it) alive through its storage's memory.  torch's share_memory_(),
# which torch.multiprocessing's queues call too, moves a storage that is not
# in torch's shared memory to new memory and lets go of the old; a numpy view
# taken from the tensor before (``.numpy()``, based on a tensor sharing the
# storage) would then point into a slot given to a later batch.  So the
# array is also kept for as long as the storage object lives: torch keeps a
# storage's Python object as long as any tensor uses the storage, and a weak
# reference to it dies with the last.  Its callback is the dict's own
# ``pop``: no Python code runs then (see NOTE [ Leases ] in _ring/slots.py), and the
# slot comes back at once.
_arrays_of_storages: dict = {}


def _tensor_keeping(array: np.ndarray, torch: Any) -> Any:
    """``torch.from_numpy(array)``, keeping ``array`` while the tensor's storage lives
    (NOTE [ Tensors keep their slot ])."""
    tensor = torch.from_numpy(_as_torch_can_share(array))
    _arrays_of_storages[weakref.ref(tensor.untyped_storage(), _arrays_of_storages.pop)] = array
    return tensor


def _as_torch_can_share(array: np.ndarray) -> np.ndarray:
    """``array``, or a copy torch can make a tensor of: torch has no big-endian
    tensors and no negative strides (fastload collates big-endian arrays, and a
    ``collate_fn`` may return a reversed view; ``output="torch"`` gives their
    values), nor read-only ones (a tensor over a read-only map, ``np.memmap``'s
    mode "r", crashes the process when written)."""
    if not array.dtype.isnative:
        return array.astype(array.dtype.newbyteorder("="))
    if not array.flags.writeable or any(stride < 0 for stride in array.strides):
        return array.copy()
    return array
