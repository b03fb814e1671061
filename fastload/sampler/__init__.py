"""Samplers: which dataset indices an epoch visits, and in what order.

torch.utils.data's sampler family, one module per kind; the protocol the
loader's fast path relies on is described in ``base.py``.
"""

from fastload.sampler.base import RandomSampler, Sampler, SequentialSampler, SubsetRandomSampler
from fastload.sampler.batch import BatchSampler
from fastload.sampler.bucket import BucketBatchSampler
from fastload.sampler.distributed import DistributedSampler
from fastload.sampler.weighted import WeightedRandomSampler

__all__ = [
    "BatchSampler",
    "BucketBatchSampler",
    "DistributedSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
]

# Each class answers to its public path, as before the family was split: it is
# what repr and pickles show and what a saved state_dict names a sampler by.
for _sampler in (BatchSampler, BucketBatchSampler, DistributedSampler, RandomSampler, Sampler,
                 SequentialSampler, SubsetRandomSampler, WeightedRandomSampler):
    _sampler.__module__ = __name__
del _sampler
