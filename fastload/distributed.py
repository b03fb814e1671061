"""``torch.utils.data.distributed``'s name for the distributed sampler.

Code written for torch imports it from there
(``from torch.utils.data.distributed import DistributedSampler``); the same
line with ``fastload.distributed`` gets fastload's, which lives in
``fastload.sampler.distributed`` with the rest of the sampler family.
"""

from fastload.sampler import DistributedSampler

__all__ = ["DistributedSampler"]
