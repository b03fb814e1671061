"""fastload: a faster, torch-free drop-in for ``torch.utils.data``.

The public names of the contract (../shared/API.md), nothing else.
"""

from fastload.collate import default_collate, default_convert
from fastload.dataloader import DataLoader
from fastload.dataset import (ArrayDataset, ChainDataset, ConcatDataset, Dataset, IterableDataset,
                              StackDataset, Subset, random_split)
from fastload.sampler import (BatchSampler, BucketBatchSampler, DistributedSampler, RandomSampler,
                              Sampler, SequentialSampler, SubsetRandomSampler,
                              WeightedRandomSampler)
from fastload.worker import WorkerInfo, get_worker_info

# A submodule, as torch.utils.data.distributed is after `import torch.utils.data`.
import fastload.distributed  # noqa: E402,F401

__version__ = "0.1.0"

__all__ = [
    "Dataset", "IterableDataset", "ArrayDataset", "ConcatDataset", "ChainDataset", "Subset",
    "StackDataset", "random_split",
    "Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler",
    "WeightedRandomSampler", "BatchSampler", "BucketBatchSampler", "DistributedSampler",
    "DataLoader", "default_collate", "default_convert", "get_worker_info", "WorkerInfo",
]
