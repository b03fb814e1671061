"""``TarShards``: WebDataset tar shards as a map-style dataset, by global sample index.

Members are grouped into samples as webdataset groups them: a member's key
is its path up to the first dot of its base name, its extension the rest
(lower-cased); consecutive members with the same key make one sample;
members that are not regular files, whose names have no extension, or that
are metadata (``__name__``) are skipped; an extension twice in one sample is
an error.  ``ds[i]`` is ``{"__key__": key, "__url__": shard, ext: value,
...}``: with ``decode=True`` (the default) the common extensions are decoded
as webdataset's ``decode()`` decodes them (``txt``/``text`` to str,
``cls``/``cls2``/``index``/``inx``/``id`` to int, ``json``/``jsn`` with
``json.loads``, ``npy`` with ``numpy.load`` without pickles, image
extensions to an RGB ``PIL.Image`` that fastload.vision transforms take);
anything else, and everything with ``decode=False``, stays ``bytes``.
Pickled members (``pyd``, ``pickle``) stay bytes: loading one would run
code from the file.  ``transform``, when given, is applied to each sample.

The member index of every shard is built once from its tar headers and kept
(``tar_index``); a sample is then one read per member.  A path may be a URL
(``https://``, ``s3://``: ``remote``, with ``storage_options`` passed to
fsspec and ``timeout`` per request); its index is kept only in ``index_dir``.
A batch (``__getitems__``, which the DataLoader calls with a batch's indices)
asks for all its remote samples' bytes at once (at most ``max_concurrency``
requests in flight) and makes each sample as its bytes arrive, in order.
Every sampler, ``DistributedSampler``, resume and elastic resume apply as to
any dataset.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from typing import Any, Callable

import numpy as np

from fastload.dataset import Dataset
from fastload.sources.tables import as_paths, checked_index
from fastload.sources.remote import RemoteClient, RemoteObject, is_url
from fastload.sources.tar_index import LocalFile, shard_members

__all__ = ["TarShards", "decode_member", "IMAGE_EXTENSIONS"]

IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "bmp", "gif",
                              "tif", "tiff", "webp"})
_KEY_AND_EXTENSION = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext
_METADATA = re.compile(r"__[^/]*__($|/)")


def decode_member(extension: str, data: bytes) -> Any:
    """A member's value as webdataset's default decoders give it (see the module)."""
    last = extension.rsplit(".", 1)[-1]
    if last in ("txt", "text"):
        return data.decode("utf-8")
    if last in ("cls", "cls2", "index", "inx", "id"):
        return int(data)
    if last in ("json", "jsn"):
        return json.loads(data)
    if last == "npy":
        return np.load(io.BytesIO(data), allow_pickle=False)
    if last in IMAGE_EXTENSIONS:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as image:
            return image.convert("RGB")
    return data


def _group(shard: str, names: list[str]) -> tuple[list[str], list[list[tuple[str, int]]]]:
    """Samples of one shard: their keys, and each one's (extension, member number)."""
    keys: list[str] = []
    samples: list[list[tuple[str, int]]] = []
    for number, name in enumerate(names):
        if _METADATA.match(name):
            continue
        match = _KEY_AND_EXTENSION.match(name)
        if match is None:
            continue
        key, extension = match.group(1), match.group(2).lower()
        if not keys or keys[-1] != key:
            keys.append(key)
            samples.append([])
        if any(extension == seen for seen, _ in samples[-1]):
            raise ValueError(f"{shard}: {name}: the extension {extension!r} appears twice in "
                             f"the sample {key!r}")
        samples[-1].append((extension, number))
    return keys, samples


class TarShards(Dataset):
    """``TarShards(paths, index_dir=None, decode=True, transform=None, *,
    storage_options=None, timeout=30.0, max_concurrency=32)``: see the module."""

    def __init__(self, paths: Any, index_dir: str | None = None, decode: bool = True,
                 transform: Callable[[dict], Any] | None = None, *,
                 storage_options: dict | None = None, timeout: float = 30.0,
                 max_concurrency: int = 32) -> None:
        self.paths = as_paths(paths, "TarShards")
        self.index_dir = None if index_dir is None else os.fspath(index_dir)
        self.decode = bool(decode)
        self.transform = transform
        # Each shard read by ranges: a local file, or an object behind a URL (all
        # of them through one client, so a batch's ranges are read together).
        self._client = RemoteClient(storage_options, timeout, max_concurrency=max_concurrency)
        self._sources = [RemoteObject(path, client=self._client) if is_url(path)
                         else LocalFile(path) for path in self.paths]
        keys, shard_of, extensions, offsets, sizes, firsts = [], [], [], [], [], [0]
        for number, shard in enumerate(self.paths):
            names, member_offsets, member_sizes = shard_members(shard, self._sources[number],
                                                                self.index_dir)
            shard_keys, samples = _group(shard, names)
            keys.extend(shard_keys)
            shard_of.extend([number] * len(samples))
            for sample in samples:
                for extension, member in sample:
                    extensions.append(extension)
                    offsets.append(member_offsets[member])
                    sizes.append(member_sizes[member])
                firsts.append(firsts[-1] + len(sample))
        # Flat numpy tables: forked workers share them without touching each sample.
        self.keys = np.array(keys, dtype=str)
        self._shard_of = np.array(shard_of, dtype=np.int32)
        self._extensions = np.array(extensions, dtype=str)
        self._offsets = np.array(offsets, dtype=np.int64)
        self._sizes = np.array(sizes, dtype=np.int64)
        self._firsts = np.array(firsts, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        return f"TarShards({len(self.paths)} shards, {len(self)} samples)"

    def __getitem__(self, index: Any) -> Any:
        row = checked_index(index, len(self))
        return self._sample(row, self._sources[int(self._shard_of[row])].read)

    def _sample(self, row: int, read: Callable[[int, int], bytes]) -> Any:
        """Sample ``row``, its members read by ``read(offset, size)`` from its shard."""
        shard = int(self._shard_of[row])
        sample: dict[str, Any] = {"__key__": str(self.keys[row]), "__url__": self.paths[shard]}
        for member in range(int(self._firsts[row]), int(self._firsts[row + 1])):
            size = int(self._sizes[member])
            data = read(int(self._offsets[member]), size)
            extension = str(self._extensions[member])
            if len(data) != size:
                raise ValueError(f"{self.paths[shard]}: truncated tar shard: the member "
                                 f"{sample['__key__']}.{extension} ends past the end of the file")
            sample[extension] = decode_member(extension, data) if self.decode else data
        return sample if self.transform is None else self.transform(sample)

    def _span(self, row: int) -> tuple[int, int]:
        """The bytes of sample ``row`` in its shard: its members lie one after another."""
        first, last = int(self._firsts[row]), int(self._firsts[row + 1]) - 1
        if last < first:
            return 0, 0
        return int(self._offsets[first]), int(self._offsets[last]) + int(self._sizes[last])

    def __getitems__(self, indices: list) -> list:
        """The samples of ``indices`` (a batch).  The remote ones' bytes are all asked for
        at once and each sample is made as its bytes arrive, in the batch's order."""
        rows = [checked_index(index, len(self)) for index in indices]
        remote = [(self.paths[shard], *self._span(row)) for row in rows
                  if isinstance(self._sources[shard := int(self._shard_of[row])], RemoteObject)]
        if not remote:
            return [self._sample(row, self._sources[int(self._shard_of[row])].read)
                    for row in rows]
        samples = []
        with contextlib.closing(self._client.stream(remote)) as arriving:
            for row in rows:
                source = self._sources[int(self._shard_of[row])]
                if not isinstance(source, RemoteObject):
                    samples.append(self._sample(row, source.read))
                    continue
                start, data = self._span(row)[0], next(arriving)
                samples.append(self._sample(
                    row, lambda offset, size: data[offset - start:offset - start + size]))
        return samples

    def close(self) -> None:
        """Close the shards this process opened (they are reopened when read again)."""
        for source in self._sources:
            if isinstance(source, LocalFile):
                source.close()

    def __del__(self) -> None:
        try:
            self.close()
        except (OSError, AttributeError, TypeError):
            pass
