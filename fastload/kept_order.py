"""A sampler fastload does not own: how a loader's state keeps its order.

fastload restores the order of its own samplers (their seed streams), of a
sampler drawing from a ``torch.Generator`` and of torch's seeded samplers
(``resume.seed_streams``).  Any other sampler keeps its order through its own
``state_dict()``, taken at the epoch's start and loaded before the epoch is
drawn again, or, without one, through the epoch's batches as it drew them,
kept in the state: torch's ``RandomSampler`` with ``generator=None`` draws
from the global generator, and resuming must not depend on where that stands.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import numpy as np

from fastload.resume import _OWN_SAMPLER_MODULES, _is_plain_batch_sampler, _is_torch_class, \
    _type_name, sampler_chain, torch_generator_of

__all__ = ["KEEP_STATE", "KEEP_ORDER", "order_keeping", "warn_if_order_unknown",
           "kept_order_section"]

# How the order of the sampler that decides it is kept (``order_keeping``):
# None: fastload restores it (its own samplers' seed streams, a torch.Generator,
# torch's seeded samplers, plain sequences); "state": its own state_dict(),
# taken at the epoch's start, restored before the epoch is drawn again;
# "order": the epoch's batches as it drew them, kept in the state.
KEEP_STATE, KEEP_ORDER = "state", "order"


def order_keeping(loader: Any) -> tuple[str | None, Any]:
    """``(how, sampler)``: how a state keeps the order of the sampler that decides it.

    A sampler fastload does not own, without a state of its own or a
    generator (torch's RandomSampler with ``generator=None`` draws from the
    global generator), has its epoch drawn whole at its first batch and kept:
    its draws are the ones it makes when iterated, and resuming replays the
    kept batches, so the rest of the epoch is the uninterrupted run's however
    the global generator stands then.  One without a length cannot be drawn
    whole: it is replayed from the epoch's start (``warn_if_order_unknown``).
    """
    # A plain BatchSampler only groups what its sampler yields: look through it.
    chain = [obj for obj in sampler_chain(loader) if not _is_plain_batch_sampler(obj)]
    if not chain or getattr(loader, "_iterable", False):
        return None, None
    source = chain[0]
    if _restores_order(source):
        return None, None
    if callable(getattr(source, "state_dict", None)) \
            and callable(getattr(source, "load_state_dict", None)):
        return KEEP_STATE, source
    try:
        len(source)
    except Exception:
        return None, source
    return KEEP_ORDER, source


def _restores_order(source: Any) -> bool:
    # torch's DistributedSampler draws from its seed and epoch (a state keeps the epoch).
    return type(source).__module__ in _OWN_SAMPLER_MODULES \
        or _is_torch_class(source, "torch.utils.data.sampler", "SequentialSampler") \
        or _is_torch_class(source, "torch.utils.data.distributed", "DistributedSampler") \
        or torch_generator_of(source) is not None \
        or isinstance(source, (range, list, tuple, np.ndarray))


def warn_if_order_unknown(loader: Any) -> None:
    """Warn (once per loader) when the sampler that decides the order is one whose
    order a state can neither restore nor keep (no state, no generator, no length)."""
    if loader._warned_unknown_order:
        return
    how, source = order_keeping(loader)
    if how is not None or source is None:
        return
    loader._warned_unknown_order = True
    warnings.warn(f"DataLoader.state_dict: the order of {_type_name(source)} is not one "
                  f"fastload can save (it has no state_dict(), no generator and no len()); "
                  f"resuming replays it from the start of the epoch and skips the batches "
                  f"already handed out, which is exact only if it yields the same order again "
                  f"(seed it for each epoch, or use fastload's samplers)", stacklevel=3)


def kept_order_section(progress: Any, loader: Any) -> dict:
    """The state's entries for a sampler fastload does not own (``order_keeping``)."""
    how, sampler = order_keeping(loader)
    started = progress is not None and not progress.finished
    if how == KEEP_STATE:
        # Mid-epoch: its state at the epoch's start; between epochs: now (the next start).
        state = progress.sampler_state if started else sampler.state_dict()
        return {"sampler_state": copy.deepcopy(state)}
    if how == KEEP_ORDER and started and progress.order is not None:
        return {"order": [batch.tolist() if isinstance(batch, np.ndarray) else batch
                          for batch in progress.order]}
    return {}
