"""fastload: a faster, torch-free drop-in for ``torch.utils.data``.

The public names of the contract (../shared/API.md), nothing else.
"""

import importlib.util as _importlib_util

try:
    from fastload import _core  # noqa: F401
except ImportError as _error:
    # `python -m fastload` (or a script) run from the repository's root imports
    # the source tree before the installed package; without a built extension
    # there, say what to do instead of a bare circular-import message.
    if _importlib_util.find_spec("fastload._core") is not None:
        raise
    raise ImportError(
        f"fastload's compiled extension fastload._core is missing from {__path__[0]!r}. This is "
        "a source tree that was not built in place, imported before the installed package (the "
        "current directory comes first on sys.path). Install it in place with `pip install -e .` "
        "(which builds the extension there), or run from another directory.") from _error

from fastload.collate import default_collate, default_convert
from fastload.dataloader import DataLoader
from fastload.dataset import (ArrayDataset, ChainDataset, ConcatDataset, Dataset, IterableDataset,
                              StackDataset, Subset, random_split)
from fastload.sampler import (BatchSampler, BucketBatchSampler, DistributedSampler, RandomSampler,
                              Sampler, SequentialSampler, SubsetRandomSampler,
                              WeightedRandomSampler)
from fastload.shared_list import SharedList
from fastload._loading.worker_info import WorkerInfo, get_worker_info

# A submodule, as torch.utils.data.distributed is after `import torch.utils.data`.
import fastload.distributed  # noqa: E402,F401

__version__ = "0.1.0"

__all__ = [
    "Dataset", "IterableDataset", "ArrayDataset", "ConcatDataset", "ChainDataset", "Subset",
    "StackDataset", "random_split", "SharedList",
    "Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler",
    "WeightedRandomSampler", "BatchSampler", "BucketBatchSampler", "DistributedSampler",
    "DataLoader", "default_collate", "default_convert", "get_worker_info", "WorkerInfo",
]
