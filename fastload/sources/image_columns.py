"""``Image()`` columns of a Hugging Face dataset through fastload's vision pipeline.

A torchvision user of ``datasets`` writes a batch transform that runs the
image transform on each PIL image ``datasets`` decoded::

    ds.with_transform(ImageColumnTransform(train_transform, column="image"))

``ImageColumnTransform`` is that function: called by ``datasets`` (torch's
DataLoader, ``ds[i]``) with a batch whose ``column`` holds PIL images, it
returns the batch with each image replaced by ``transform(image.convert("RGB"))``
(RGB as ``ImageFolder``'s loader gives; a ``None`` stays ``None``; with
``Image(decode=False)`` the ``{"bytes", "path"}`` values are decoded here).

fastload's DataLoader, given such a dataset, makes the same samples without
``datasets`` decoding anything (``ImageColumnRows``): each row's image bytes
are read from the Arrow table and decoded as ``ImageFolder`` decodes a file
(``fastload.vision.decode``: a JPEG at 1/2, 1/4 or 1/8 size when the first
step's crop allows, ``RandomResizedCrop``/``Resize`` fused with the flip and
``ToArray``), with the same random draws; the other columns come as
``datasets`` gives them unformatted.  Pixel values differ from a full decode
only by that resampling error, as ``ImageFolder``'s do; an image with an
EXIF orientation is turned upright first, as ``datasets`` does.  A batch
that the table cannot answer this way (an image stored only by a remote
path, an index that is not an integer in range) is made by the dataset's
own ``__getitems__``.
"""

from __future__ import annotations

import io
import os
from typing import Any, Callable

import numpy as np

from fastload.vision.decode import decode_planned_stream, render_planned, split_planned_head

__all__ = ["ImageColumnTransform", "ImageColumnRows"]


def _needs_orientation_check(data: Any) -> bool:
    """Whether an EXIF orientation may be in ``data``: a JPEG has one only in an
    ``Exif`` APP1 segment near its start; other formats are checked by Pillow."""
    head = bytes(data[:65536])
    return not head.startswith(b"\xff\xd8") or b"Exif\x00\x00" in head


def _upright(img: Any) -> Any:
    """``img`` turned as its EXIF orientation says (what ``datasets`` does on decode)."""
    from PIL import Image, ImageOps

    if img.getexif().get(Image.ExifTags.Base.Orientation) is not None:
        img.load()
        return ImageOps.exif_transpose(img)
    return img


def decode_image(data: Any, transform: Callable[[Any], Any] | None) -> Any:
    """``transform(RGB image of the encoded ``data``)`` through the planned decode."""
    from PIL import Image

    head, rest = split_planned_head(transform) if transform is not None else (None, ())
    if head is not None and not _needs_orientation_check(data):
        sample, rest = decode_planned_stream(io.BytesIO(data), head, rest)
    else:
        img = _upright(Image.open(io.BytesIO(data)))
        img.load()
        img = img if img.mode == "RGB" else img.convert("RGB")
        if head is not None:
            sample, rest = render_planned(img, head, rest)
        else:
            sample, rest = img, (transform,) if transform is not None else ()
    for step in rest:
        sample = step(sample)
    return sample


class ImageColumnTransform:
    """A ``datasets`` batch transform: see the module."""

    def __init__(self, transform: Callable[[Any], Any] | None = None,
                 column: str = "image") -> None:
        if not isinstance(column, str):
            raise TypeError(f"column should be a column's name (str), "
                            f"but got {type(column).__name__}")
        self.transform = transform
        self.column = column

    def __repr__(self) -> str:
        return f"ImageColumnTransform({self.transform!r}, column={self.column!r})"

    def image(self, value: Any) -> Any:
        """One value of the column, as the transform makes it."""
        if value is None:
            return None
        if isinstance(value, dict):  # Image(decode=False): {"bytes": ..., "path": ...}
            data = value.get("bytes")
            if data is None:
                with open(value["path"], "rb") as file:
                    data = file.read()
            return decode_image(data, self.transform)
        img = value if value.mode == "RGB" else value.convert("RGB")
        return img if self.transform is None else self.transform(img)

    def __call__(self, batch: dict) -> dict:
        if self.column not in batch:
            raise KeyError(f"ImageColumnTransform: the batch has no column {self.column!r} "
                           f"(its columns: {list(batch)})")
        out = dict(batch)
        out[self.column] = [self.image(value) for value in batch[self.column]]
        return out


def _image_feature(feature: Any) -> bool:
    return type(feature).__name__ == "Image" \
        and type(feature).__module__.startswith("datasets.")


class ImageColumnRows:
    """``dataset.__getitems__``'s samples of a dataset whose transform is an
    ``ImageColumnTransform``, the images decoded from the Arrow table (see the module)."""

    def __init__(self, dataset: Any, step: ImageColumnTransform, columns: list[str]) -> None:
        self.dataset = dataset
        self.step = step
        self.columns = columns
        self.others = [name for name in columns if name != step.column]
        self._plain = None  # the other columns, unformatted: made when first read
        table = dataset.data.table
        chunks = [chunk for chunk in table.column(step.column).chunks if len(chunk)]
        self._chunk_starts = np.cumsum([0] + [len(chunk) for chunk in chunks])
        self._chunks = chunks
        self._children: list | None = None
        self._indices = None if dataset._indices is None else \
            dataset._indices.column(0).to_numpy().astype(np.int64, copy=False)

    @classmethod
    def of(cls, dataset: Any) -> "ImageColumnRows | None":
        """The reader of ``dataset``'s samples when its transform is an
        ``ImageColumnTransform`` over an ``Image()`` column, else None."""
        if getattr(dataset, "_format_type", None) != "custom":
            return None
        step = dataset._format_kwargs.get("transform")
        if type(step) is not ImageColumnTransform:
            return None
        wanted = dataset._format_columns
        if wanted is not None and dataset._output_all_columns:
            return None  # the other columns come out unformatted, beside the transform's
        columns = [name for name in dataset.column_names if wanted is None or name in wanted]
        if step.column not in columns or not _image_feature(dataset.features[step.column]):
            return None
        import pyarrow as pa

        kind = dataset.data.table.schema.field(step.column).type
        if not pa.types.is_struct(kind) or kind.get_field_index("bytes") < 0 \
                or kind.get_field_index("path") < 0:
            return None
        return cls(dataset, step, columns)

    def _encoded(self, row: int) -> tuple[Any, str | None] | None:
        """``(bytes or None, path or None)`` of table row ``row``; None for a null image."""
        if self._children is None:
            self._children = []
            for chunk in self._chunks:
                names = [chunk.type.field(i).name for i in range(chunk.type.num_fields)]
                fields = chunk.flatten()  # the children as this (maybe sliced) chunk sees them
                self._children.append((chunk, fields[names.index("bytes")],
                                       fields[names.index("path")]))
        number = int(np.searchsorted(self._chunk_starts, row, side="right")) - 1
        chunk, data, path = self._children[number]
        local = row - int(self._chunk_starts[number])
        if not chunk[local].is_valid:
            return None
        value = data[local]
        return (value.as_buffer() if value.is_valid else None), path[local].as_py()

    def __call__(self, keys: list) -> list:
        length = len(self.dataset)
        if not all(type(key) is int and -length <= key < length for key in keys):
            return self.dataset.__getitems__(keys)  # its own indexing answers (and raises)
        rows = [key % length for key in keys]
        table_rows = rows if self._indices is None else self._indices[rows].tolist()
        encoded = [self._encoded(row) for row in table_rows]
        if any(found is not None and found[0] is None
               and not (found[1] and os.path.isfile(found[1])) for found in encoded):
            return self.dataset.__getitems__(keys)  # stored by a remote path: datasets reads it
        if self.others:
            if self._plain is None:
                self._plain = self.dataset.with_format(None).select_columns(self.others)
            others = self._plain.__getitems__(rows)
        else:
            others = [{} for _ in rows]
        samples = []
        for key, found, other in zip(keys, encoded, others):
            samples.append({name: other[name] if name != self.step.column
                            else self._image(key, found) for name in self.columns})
        return samples

    def _image(self, key: int, found: tuple[Any, str | None] | None) -> Any:
        if found is None:
            return None
        data, path = found
        try:
            if data is None:
                with open(path, "rb") as file:
                    data = file.read()
            return decode_image(data, self.step.transform)
        except Exception as error:
            error.add_note(f"raised by the image of sample {key} (column {self.step.column!r})")
            raise
