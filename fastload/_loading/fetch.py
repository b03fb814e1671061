"""From a batch of indices to a batch: fetch the samples, collate them.

``BatchSource`` is shared by the single-process iterator and the workers, so
both paths run the same code and give identical batches.  It knows three ways
to make a batch:

* the ArrayDataset fast path: an ``ArrayDataset`` (or ``Subset``s of one)
  with the default collate is gathered column by column with one
  ``_core.gather_rows`` call per array, straight into the destination buffer,
  with no per-sample Python at all;
* a dataset that writes whole batches itself (MNIST's and CIFAR's ``data``
  through ``ToArray``/``Normalize``): ``dataset._fastload_batch(rows)``, on it
  or on ``Subset``s of it, returns a ``WholeBatch`` (the columns' dtypes and
  shapes, and a ``fill`` that writes them into the destination buffer) or
  None, when this batch must be made sample by sample;
* a Hugging Face ``datasets.Dataset`` whose format allows it (numpy or
  torch, fixed-width numeric columns, no transform): gathered the same way,
  column by column from its memory-mapped Arrow buffers
  (``fastload.sources.hugging_face``), and its ``pad_collate`` batches
  likewise, ragged columns padded straight from the Arrow buffers;
* the default collate: samples are fetched (``__getitems__`` when the dataset
  has it; a Hugging Face dataset whose transform is an ``ImageColumnTransform``
  has its images decoded by fastload, ``fastload.sources.image_columns``) and
  the ``_core`` kernels copy them into the buffer;
* any other ``collate_fn``: its output is packed into the buffer as it is.

The first two are ``default_collate`` only while ``default_collate_fn_map``
holds fastload's own entries; once it is changed, the default collate is
torch's recursion over the map (NOTE [ The collate_fn_map ] in collate/fn_map.py)
and its output is packed as a custom ``collate_fn``'s is.  That is checked
for every batch, as torch looks the map up at every call.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any, Callable

import numpy as np

from fastload import _core
from fastload.collate import (BatchLayout, ArraySlot, MappingNode, PlannedLayouts, SequenceNode,
                              collate_into, default_collate, default_convert, fn_map_is_pristine,
                              is_string_or_object_dtype, pack_into, private_buffer, to_torch)
from fastload.dataset import ArrayDataset, Subset, int64_indices
from fastload._loading.settings import BatchSettings
from fastload._loading.stage_clock import SAMPLE_SECONDS, StageTotals
from fastload.collate import PadCollate
from fastload.rng import seed_transform_rng

__all__ = ["BatchSource", "array_rows", "whole_batch_rows"]


def array_rows(dataset: Any) -> tuple[tuple[np.ndarray, ...], np.ndarray | None] | None:
    """``(arrays, row_map)`` when ``dataset`` is an ArrayDataset, or Subsets of one.

    ``row_map`` composes the Subsets' indices (None for the ArrayDataset
    itself), so a batch's rows are ``row_map[indices]``.  Returns None when the
    fast path does not apply (another dataset, non-integer subset indices, or
    arrays default_collate would refuse).
    """
    return _array_columns(_under_subsets(dataset))


def whole_batch_rows(dataset: Any) -> tuple[Any, np.ndarray | None] | None:
    """``(base, row_map)`` when ``dataset`` (or the dataset under its Subsets) makes
    whole batches itself (``_fastload_batch``), as ``array_rows`` for ArrayDataset."""
    return _self_gathering(_under_subsets(dataset))


def _array_columns(found: tuple[Any, np.ndarray | None] | None
                   ) -> tuple[tuple[np.ndarray, ...], np.ndarray | None] | None:
    if found is None or type(found[0]) is not ArrayDataset:
        return None
    dataset, row_map = found
    if any(is_string_or_object_dtype(a.dtype) for a in dataset.arrays):
        return None
    return dataset.arrays, row_map


def _self_gathering(found: tuple[Any, np.ndarray | None] | None
                    ) -> tuple[Any, np.ndarray | None] | None:
    if found is None:
        return None
    if _is_hugging_face_dataset(found[0]):
        # Imported only for a dataset of the `datasets` package (already imported, then).
        from fastload.sources.hugging_face import ArrowColumnBatches

        batches = ArrowColumnBatches.of(found[0])
        return None if batches is None else (batches, found[1])
    if not callable(getattr(found[0], "_fastload_batch", None)):
        return None
    return found


def _numpy_row_reader(dataset: Any) -> Callable[[int], tuple] | None:
    """``index -> numpy row`` for an ArrayDataset given tensors (or Subsets of
    one), whose own rows are tensors: without auto-collation the loader hands
    out what ``output=`` says, numpy rows for ``"numpy"``."""
    found = _under_subsets(dataset)
    if found is None or type(found[0]) is not ArrayDataset or found[0]._from_tensors is None:
        return None
    base, row_map = found
    if row_map is None:
        return base.numpy_row
    return lambda index: base.numpy_row(row_map[index])


def _padded_gathering(found: tuple[Any, np.ndarray | None] | None
                      ) -> tuple[Any, np.ndarray | None] | None:
    """``(batches, row_map)`` when pad_collate's batches of the dataset are gathered
    whole (a Hugging Face dataset's, ``_fastload_padded_batch``), else None."""
    found = _self_gathering(found)
    if found is None or not callable(getattr(found[0], "_fastload_padded_batch", None)):
        return None
    return found


def _is_hugging_face_dataset(dataset: Any) -> bool:
    """A ``datasets.Dataset`` (or a subclass), told without importing ``datasets``."""
    return any(cls.__module__.partition(".")[0] == "datasets" and cls.__name__ == "Dataset"
               for cls in type(dataset).__mro__)


def _under_subsets(dataset: Any) -> tuple[Any, np.ndarray | None] | None:
    """``(dataset under the plain Subsets, composed row map)``, or None when a
    Subset's indices are not integers or point past the Subset under it."""
    row_map = None
    while isinstance(dataset, Subset) and type(dataset).__getitem__ is Subset.__getitem__ \
            and type(dataset).__getitems__ is Subset.__getitems__:
        indices = int64_indices(dataset.indices)  # a list is read once, here
        if indices is None:
            return None
        try:
            row_map = indices if row_map is None else indices[row_map]
        except IndexError:
            # An outer index past the inner Subset: it fails (as in torch) only
            # in a batch that uses it, sample by sample.
            return None
        dataset = dataset.dataset
    return dataset, (None if row_map is None else np.ascontiguousarray(row_map, np.int64))


# Batch sizes whose ArrayDataset layout a BatchSource keeps (usually two: full and last).
_KEPT_ARRAY_LAYOUTS = 16


class BatchSource:
    """Makes the batches of one DataLoader, in the main process or in a worker."""

    def __init__(self, dataset: Any, settings: BatchSettings) -> None:
        self.dataset = dataset
        # Copied out of ``settings``: read on the per-sample path.
        iterable, auto_collation, collate_fn, _, _ = settings
        self.iterable = iterable
        self.auto_collation = auto_collation
        self.collate_fn = collate_fn
        self.batch_size = settings.batch_size
        self.drop_last = settings.drop_last
        self.default_collate = collate_fn is default_collate
        # pad_collate lays its batches out as default_collate does: into the buffer (a ring slot).
        self._layout_collate = collate_fn.collate_into if type(collate_fn) is PadCollate else None
        # A Subset's indices are read once, here, for all three gathers.
        found = _under_subsets(dataset) if auto_collation and not iterable \
            and (self.default_collate or self._layout_collate is not None) else None
        self._arrays = _array_columns(found) if self.default_collate else None
        self._whole = _self_gathering(found) if self.default_collate and self._arrays is None \
            else None
        self._padded = _padded_gathering(found) if self._layout_collate is not None else None
        self._numpy_rows = _numpy_row_reader(dataset) if not auto_collation \
            and collate_fn is default_convert and not iterable else None
        self._array_layouts: dict[Any, BatchLayout] = {}
        self._planned = PlannedLayouts()  # NOTE [ Layouts planned once ] (_plan_key.pxi)
        getitems = getattr(dataset, "__getitems__", None)
        self._getitems = getitems if callable(getitems) else None
        if self._getitems is not None and _is_hugging_face_dataset(dataset):
            # Image() columns decoded by fastload's vision pipeline, not by datasets.
            from fastload.sources.image_columns import ImageColumnRows

            self._getitems = ImageColumnRows.of(dataset) or self._getitems
        # output="torch" in the main process: collated batches are built as tensors.
        self.as_torch = False
        self._base_seed = 0
        self._iterator = None
        self._exhausted = False
        # Seconds spent per stage on the batches made here (loader.report()).
        self.totals = StageTotals()

    def open_stream(self) -> None:
        """Start an IterableDataset's stream: ``iter(dataset)``, once an epoch.

        Samples are then taken with ``next()`` only, as torch takes them: an
        iterator whose ``__iter__`` starts over (or that has none) must not
        be iterated again, which ``islice`` over it would do batch after
        batch.  (Nor may a sample be compared with anything, as the
        two-argument ``iter()`` does with its sentinel: an array would raise.)
        """
        self._iterator = iter(self.dataset)

    @property
    def stream(self) -> Any:
        """The epoch's open iterator of an IterableDataset, or None."""
        return self._iterator

    @property
    def base_seed(self) -> int:
        return self._base_seed

    def replay(self, batches: Any) -> None:
        """Fetch batches again and drop them, to bring a copy where a state says it
        was: a count of a stream's batches, or a map-style copy's index batches.
        A batch that raised before raises again here and is dropped too."""
        if self.iterable:
            for _ in range(batches):
                try:
                    self._fetch(None, False)
                except StopIteration:
                    return
            return
        for indices in batches:
            try:
                self._fetch(indices, False)
            except Exception:
                pass

    @property
    def stream_ended(self) -> bool:
        """An IterableDataset's stream gave its last batch: the next one is its end
        (a resume sets it, see ``dataset_state``)."""
        return self._exhausted

    @stream_ended.setter
    def stream_ended(self, ended: bool) -> None:
        self._exhausted = ended

    def start_epoch(self, base_seed: int) -> None:
        """Begin an epoch: new transform seeds; an IterableDataset starts over."""
        self._base_seed = base_seed
        self._iterator = None
        self._exhausted = False

    # -- fetching ------------------------------------------------------------

    def _fetch(self, indices: Any, kernel_batch: bool) -> Any:
        """The samples of one batch (a list), or one sample without auto-collation.

        ``kernel_batch``: ``indices`` is our BatchSampler's int64 array, which
        the dataset sees as the list ``BatchSampler.__iter__`` would give.
        """
        if self.iterable:
            if self._exhausted:
                raise StopIteration
            if self._iterator is None:
                self.open_stream()
            if not self.auto_collation:
                try:
                    return next(self._iterator)
                except StopIteration:
                    self._exhausted = True
                    raise
            # next() only, sample by sample, as torch takes them (see open_stream).
            samples = []
            stream = self._iterator
            for _ in range(self.batch_size):
                try:
                    samples.append(next(stream))
                except StopIteration:
                    break
            if len(samples) < self.batch_size:
                self._exhausted = True
                if not samples or self.drop_last:
                    raise StopIteration
            return samples
        if not self.auto_collation:
            if self._numpy_rows is not None and isinstance(indices, (int, np.integer)):
                return self._numpy_rows(indices)
            return self.dataset[indices]
        keys = indices.tolist() if kernel_batch else indices
        if self._getitems is not None:
            return self._getitems(keys)
        dataset = self.dataset
        return [dataset[key] for key in keys]

    def _integer_rows(self, indices: Any, kernel_batch: bool) -> np.ndarray | None:
        """``indices`` as a flat integer array for the gather kernel, or None when
        they are not all integers (a float, a string, a bool): then the batch
        is made sample by sample, so the dataset's own indexing answers, as
        torch's ``TensorDataset`` does, instead of a cast truncating 1.7 to 1."""
        if (self._arrays is None and self._whole is None and self._padded is None) \
                or not fn_map_is_pristine():
            return None
        if kernel_batch:  # our BatchSampler's int64 array
            return indices
        rows = int64_indices(indices)
        # An empty batch goes to default_collate, which refuses it.
        return None if rows is None or rows.size == 0 else rows

    def _gather(self, rows: np.ndarray, allocate: Callable[[int], np.ndarray]
                ) -> tuple[BatchLayout, np.ndarray] | None:
        """The batch of ``rows`` gathered without fetching samples, or None when
        the dataset says this one must be made sample by sample."""
        if self._arrays is not None:
            return self._gather_arrays(rows, allocate)
        if self._padded is not None:
            return self._gather_padded(rows, allocate)
        dataset, row_map = self._whole
        rows = rows.astype(np.int64, copy=False)
        if row_map is not None:
            rows = row_map[rows]
        batch = dataset._fastload_batch(np.ascontiguousarray(rows))
        if batch is None:
            return None
        key = (batch.columns, batch.keys, batch.tensors)
        layout = self._array_layouts.get(key)
        if layout is None:  # kept as _gather_arrays keeps its layouts
            if len(self._array_layouts) >= _KEPT_ARRAY_LAYOUTS:
                self._array_layouts.clear()
            slots = [ArraySlot(dtype, shape) for dtype, shape in batch.columns]
            root = SequenceNode(None, slots) if batch.keys is None \
                else MappingNode(dict.fromkeys(batch.keys), slots)
            layout = BatchLayout(root)
            layout.assign_offsets()
            if batch.tensors:
                layout.as_torch()
            self._array_layouts[key] = layout
        buffer = allocate(layout.nbytes)
        batch.fill([slot.view(buffer) for slot in layout.root.children])
        return layout, buffer

    def _gather_padded(self, rows: np.ndarray, allocate: Callable[[int], np.ndarray]
                       ) -> tuple[BatchLayout, np.ndarray] | None:
        batches, row_map = self._padded
        rows = rows.astype(np.int64, copy=False)
        if row_map is not None:
            rows = row_map[rows]
        made = batches._fastload_padded_batch(np.ascontiguousarray(rows), self.collate_fn)
        if made is None:
            return None
        layout, fill = made
        buffer = allocate(layout.nbytes)
        fill(buffer)
        return layout, buffer

    def _gather_arrays(self, rows: np.ndarray, allocate: Callable[[int], np.ndarray]
                       ) -> tuple[BatchLayout, np.ndarray]:
        arrays, row_map = self._arrays
        rows = rows.astype(np.int64, copy=False)
        if row_map is not None:
            rows = row_map[rows]
        rows = np.ascontiguousarray(rows)
        n = rows.shape[0]
        layout = self._array_layouts.get(n)
        if layout is None:
            # Every batch of n rows has the same layout: one object, reused
            # (it is never changed after this).  A sampler of ever-new batch
            # sizes must not grow this without end.
            if len(self._array_layouts) >= _KEPT_ARRAY_LAYOUTS:
                self._array_layouts.clear()
            layout = BatchLayout(SequenceNode(None, [ArraySlot(a.dtype, (n,) + a.shape[1:])
                                                     for a in arrays]))
            layout.assign_offsets()
            self._array_layouts[n] = layout
        buffer = allocate(layout.nbytes)
        for array, slot in zip(arrays, layout.root.children):
            _core.gather_rows(array, rows, slot.view(buffer))
        return layout, buffer

    # -- making batches ------------------------------------------------------

    def make(self, batch_no: int, indices: Any, kernel_batch: bool) -> Any:
        """One batch as the caller sees it (single-process loading); see ``_fetch``."""
        seed_transform_rng(self._base_seed, batch_no)
        start = perf_counter()
        rows = self._integer_rows(indices, kernel_batch)
        gathered = None if rows is None else self._gather(rows, private_buffer)
        if gathered is not None:
            layout, buffer = gathered
        else:
            sample_seconds = SAMPLE_SECONDS.decode, SAMPLE_SECONDS.transform
            data = self._fetch(indices, kernel_batch)
            fetched = perf_counter()
            if self.default_collate and fn_map_is_pristine():
                layout, buffer = collate_into(data, planned=self._planned)
            elif self._layout_collate is not None:
                layout, buffer = self._layout_collate(data)
            else:
                batch = self.collate_fn(data)
                self._count(start, fetched, sample_seconds)
                # as_torch with a changed map: no layout says which leaves are data.
                return to_torch(batch) if self.as_torch else batch
        if self.as_torch:
            layout.as_torch()
        # The values come out of the layout: a kept one holds none between batches.
        batch = layout.build(buffer, layout.detach_values())
        if gathered is not None:  # as in make_into: all of it counts as fetching
            self.totals.made(perf_counter() - start, 0.0, 0.0, 0.0)
        else:
            self._count(start, fetched, sample_seconds)
        return batch

    def make_into(self, batch_no: int, indices: Any, kernel_batch: bool,
                  allocate: Callable[[int], np.ndarray]) -> BatchLayout:
        """One batch written into ``allocate``'s buffer; returns its layout (workers)."""
        seed_transform_rng(self._base_seed, batch_no)
        start = perf_counter()
        rows = self._integer_rows(indices, kernel_batch)
        gathered = None if rows is None else self._gather(rows, allocate)
        if gathered is not None:
            # Gathered straight into the buffer: all of it counts as fetching.
            self.totals.made(perf_counter() - start, 0.0, 0.0, 0.0)
            return gathered[0]
        sample_seconds = SAMPLE_SECONDS.decode, SAMPLE_SECONDS.transform
        data = self._fetch(indices, kernel_batch)
        fetched = perf_counter()
        if self.default_collate and fn_map_is_pristine():
            layout = collate_into(data, allocate, self._planned)[0]
        elif self._layout_collate is not None:
            layout = self._layout_collate(data, allocate)[0]
        else:
            layout = pack_into(self.collate_fn(data), allocate)[0]
        self._count(start, fetched, sample_seconds)
        return layout

    def _count(self, start: float, fetched: float, sample_seconds: tuple[float, float]) -> None:
        """Add a batch made from ``start``, fetched at ``fetched``, collated until now.
        ``sample_seconds``: ``SAMPLE_SECONDS`` as the fetch began (its decode and transform)."""
        decode, transform = sample_seconds
        self.totals.made(fetched - start, SAMPLE_SECONDS.decode - decode,
                         SAMPLE_SECONDS.transform - transform, perf_counter() - fetched)
