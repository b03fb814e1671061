"""Folder datasets: ``root/<class>/**/<file>``, with torchvision's rules and a compact table.

The scan is torchvision's, step for step, so ``classes``, ``class_to_idx`` and
the order of ``samples`` are identical to ``torchvision.datasets.ImageFolder``
on the same directory:

* classes are the sorted names of the entries of ``root`` that are
  directories (symlinks to directories count; hidden ones too);
* each class directory is walked with ``os.walk(followlinks=True)``, the
  ``(dirpath, dirnames, filenames)`` triples sorted (so by ``dirpath``) and
  the file names within each sorted;
* a file is kept when its lower-cased name ends with one of ``extensions``
  (or when ``is_valid_file(path)`` says so).

What differs is storage: ``samples`` is a ``SampleTable`` (numpy arrays, see
``sample_table``), so forked DataLoader workers reading it do not copy it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from time import perf_counter
from typing import Any

from ..dataset import int64_indices
from .._loading.stage_clock import SAMPLE_SECONDS
from .cache import make_image_cache
from .decode import decode_planned, default_loader, pil_loader, split_planned_head
from .sample_table import SampleTable, SampleTableBuilder, TargetList
from .vision import StandardTransform, VisionDataset

__all__ = [
    "IMG_EXTENSIONS",
    "has_file_allowed_extension",
    "is_image_file",
    "find_classes",
    "make_dataset",
    "DatasetFolder",
    "ImageFolder",
    "default_loader",
    "pil_loader",
    "StandardTransform",
]

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def has_file_allowed_extension(filename: str, extensions: str | tuple[str, ...]) -> bool:
    """Whether ``filename``, lower-cased, ends with ``extensions`` (one string or a tuple)."""
    return filename.lower().endswith(extensions if isinstance(extensions, str) else tuple(extensions))


def is_image_file(filename: str) -> bool:
    """Whether ``filename`` has one of ``IMG_EXTENSIONS``."""
    return has_file_allowed_extension(filename, IMG_EXTENSIONS)


def find_classes(directory: str | os.PathLike) -> tuple[list[str], dict[str, int]]:
    """The sorted sub-directory names of ``directory``, and their indices.

    Raises ``FileNotFoundError`` when there are none.
    """
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    return classes, {name: index for index, name in enumerate(classes)}


_SEPARATORS = tuple(sep for sep in (os.sep, os.altsep) if sep)


def _checks_by_name(extensions: str | tuple[str, ...]) -> bool:
    """Whether testing the file *name* against ``extensions`` decides as testing the path does.

    ``path.lower().endswith(ext)`` only looks past the name when ``ext`` reaches
    the separator before it, so any extension holding a separator (or one that
    is not a string, which must fail as torchvision's check fails) sends every
    file through ``has_file_allowed_extension`` on its full path instead.
    """
    listed = (extensions,) if isinstance(extensions, str) else tuple(extensions)
    return all(isinstance(ext, str) and not any(sep in ext for sep in _SEPARATORS)
               for ext in listed)


def _scan(directory: str, class_to_idx: dict[str, int] | None,
          extensions: str | tuple[str, ...] | None,
          is_valid_file: Callable[[str], bool] | None,
          allow_empty: bool) -> Iterator[tuple[str, list[str], int]]:
    """Yield ``(dirpath, kept file names, class_index)`` per directory in torchvision's order.

    The paths torchvision lists are ``os.path.join(dirpath, name)`` for each
    kept name, in that order.  After the last directory, empty classes are
    checked as torchvision checks them.
    """
    if class_to_idx is None:
        _, class_to_idx = find_classes(directory)
    elif not class_to_idx:
        raise ValueError("'class_to_index' must have at least one entry to collect any samples.")
    if (extensions is None) == (is_valid_file is None):
        raise ValueError("Both extensions and is_valid_file cannot be None or not None at the same time")
    by_name = extensions is not None and _checks_by_name(extensions)
    if by_name:
        # A lower-cased name ends with an extension exactly when its path does:
        # the path is "<dir>/<name>", no extension holds a separator, and the
        # separator also stops str.lower's only context rule (a final sigma).
        endings = extensions if isinstance(extensions, str) else tuple(extensions)
    elif extensions is not None:
        allowed = extensions

        def is_valid_file(path: str) -> bool:
            return has_file_allowed_extension(path, allowed)

    found_classes = set()
    join = os.path.join
    for class_name in sorted(class_to_idx.keys()):
        class_index = class_to_idx[class_name]
        class_dir = join(directory, class_name)
        if not os.path.isdir(class_dir):
            continue
        for dirpath, _, filenames in sorted(os.walk(class_dir, followlinks=True)):
            filenames.sort()
            if by_name and join(dirpath, "")[-1:] in _SEPARATORS:
                kept = [name for name in filenames if name.lower().endswith(endings)]
            elif by_name:  # a bare drive ("C:") as dirpath: check whole paths as torchvision does
                kept = [name for name in filenames
                        if has_file_allowed_extension(join(dirpath, name), extensions)]
            else:
                kept = [name for name in filenames if is_valid_file(join(dirpath, name))]
            if kept:
                found_classes.add(class_name)
            yield dirpath, kept, class_index

    empty_classes = set(class_to_idx.keys()) - found_classes
    if empty_classes and not allow_empty:
        message = f"Found no valid file for the classes {', '.join(sorted(empty_classes))}. "
        if extensions is not None:
            listed = extensions if isinstance(extensions, str) else ", ".join(extensions)
            message += f"Supported extensions are: {listed}"
        raise FileNotFoundError(message)


def _iter_samples(directory: str, class_to_idx: dict[str, int] | None,
                  extensions: str | tuple[str, ...] | None,
                  is_valid_file: Callable[[str], bool] | None,
                  allow_empty: bool) -> Iterator[tuple[str, int]]:
    """Yield ``(path, class_index)`` in torchvision's order, then check for empty classes."""
    join = os.path.join
    for dirpath, names, class_index in _scan(directory, class_to_idx, extensions,
                                             is_valid_file, allow_empty):
        for name in names:
            yield join(dirpath, name), class_index


def _scan_table(directory: str, class_to_idx: dict[str, int],
                extensions: str | tuple[str, ...] | None,
                is_valid_file: Callable[[str], bool] | None,
                allow_empty: bool) -> SampleTable:
    """The scan of ``_iter_samples`` packed straight into a ``SampleTable``, a directory at a time."""
    prefix = os.path.join(directory, "")
    # Every walked dirpath starts with its class directory; when all of those
    # lie under the root (no absolute class names), the root is stored once.
    if not all(os.path.join(directory, name).startswith(prefix) for name in class_to_idx):
        prefix = ""
    builder = SampleTableBuilder(prefix)
    cut = len(prefix)
    for dirpath, names, class_index in _scan(directory, class_to_idx, extensions,
                                             is_valid_file, allow_empty):
        if names:
            builder.add(os.path.join(dirpath, "")[cut:], names, class_index)
    return builder.build()


def make_dataset(directory: str | os.PathLike, class_to_idx: dict[str, int] | None = None,
                 extensions: str | tuple[str, ...] | None = None,
                 is_valid_file: Callable[[str], bool] | None = None,
                 allow_empty: bool = False) -> list[tuple[str, int]]:
    """torchvision's ``make_dataset``: the list of ``(path, class_index)`` under ``directory``.

    Exactly one of ``extensions`` and ``is_valid_file`` must be given
    (``ValueError`` otherwise).  A class with no valid file raises
    ``FileNotFoundError`` naming it (and the supported extensions) unless
    ``allow_empty``.
    """
    directory = os.path.expanduser(os.fspath(directory))
    return list(_iter_samples(directory, class_to_idx, extensions, is_valid_file, allow_empty))


class _SampleFileErrors:
    """A context in which sample ``index``'s file is read: an exception raised in it
    is re-raised naming the sample and its path (``_error_naming_sample``), and
    ``raised`` records that it was.

    Only the reading: a transform's own error (a bad argument) keeps its
    message, as it would after torchvision's loader.
    """

    __slots__ = ("path", "index", "raised")

    def __init__(self, path: str, index: int) -> None:
        self.path, self.index, self.raised = path, index, False

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> bool:
        if not isinstance(error, Exception):
            return False  # no error, or a KeyboardInterrupt / SystemExit: as it is
        self.raised = True
        renamed = _error_naming_sample(error, self.path, self.index)
        if renamed is error:
            return False  # annotated in place: let it go on
        raise renamed from error


def _error_naming_sample(error: BaseException, path: str, index: int) -> BaseException:
    """The same kind of error, with a message that names the sample and its file.

    ``type(error)(message)`` keeps ``except OSError`` / ``except
    PIL.UnidentifiedImageError`` working, and the original's attributes are
    copied over (an ``OSError`` keeps its ``errno`` and ``filename``, as
    torchvision's caller would see them); for exception types whose
    constructor does not take one message, the note is attached instead.
    """
    message = f"cannot load sample {index} from {path!r}: {error}"
    args: tuple = (message,)
    if isinstance(error, OSError) and error.errno is not None:
        # OSError(errno, strerror, filename) prints "[Errno n] strerror: 'filename'".
        strerror = f"cannot load sample {index} from {path!r}: {error.strerror}"
        args = (error.errno, strerror) + ((error.filename,) if error.filename is not None else ())
        message = str(OSError(*args))
    try:
        renamed = type(error)(*args)
    except Exception:
        renamed = None
    if renamed is not None and str(renamed) == message:
        renamed.__dict__.update(getattr(error, "__dict__", {}))
        return renamed
    if hasattr(error, "add_note"):
        error.add_note(message)
        return error
    return RuntimeError(message)


class DatasetFolder(VisionDataset):
    """A map-style dataset of files arranged as ``root/<class>/**/<file>``, as torchvision's.

    Args:
        root: the directory holding one sub-directory per class.
        loader: turns a file path into a sample.
        extensions: lower-case file endings to keep; exclusive with ``is_valid_file``.
        transform: applied to each loaded sample.
        target_transform: applied to each class index.
        is_valid_file: ``path -> bool``, which files to keep; exclusive with ``extensions``.
        allow_empty: allow classes with no valid file instead of raising.
        cache: a directory for a decoded-image cache (``fastload.vision.cache``),
            or None (the default) for none: the first epoch stores each image,
            shrunk to ``cache_max_side`` on its longer side; later epochs and
            runs read it from there, and transforms run on it as if it were the file.
        cache_max_side: the longest side an image is cached at (never enlarged).
        cache_max_bytes: past this many bytes in the store, images are not cached.
        cache_format: ``"raw"`` (uint8 pixels) or ``"jpeg"`` (re-encoded at
            quality 90: smaller, for datasets whose raw pixels would not fit).
        cache_key: a name for ``loader`` that the cache keys its entries on
            instead of identifying the loader itself (a partial's function and
            arguments, a function's code...); needed for a loader it cannot
            identify (a callable object, say), which is otherwise not cached.

    Attributes (torchvision's): ``root``, ``loader``, ``extensions``, ``classes``,
    ``class_to_idx``, ``samples`` (a list-like of ``(path, class_index)``,
    stored as numpy arrays), ``targets`` (a list-like of ints),
    ``transform``, ``target_transform``; and ``image_cache`` (the
    ``DecodedImageCache``, or None).

    A file that cannot be loaded raises its original exception type (e.g.
    ``PIL.UnidentifiedImageError``, ``OSError``) with a message naming the
    sample index and the path.
    """

    image_cache = None  # for instances made without __init__ (copies, subclasses)

    def __init__(self, root: str | os.PathLike, loader: Callable[[str], Any],
                 extensions: str | tuple[str, ...] | None = None,
                 transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[int], Any] | None = None,
                 is_valid_file: Callable[[str], bool] | None = None,
                 allow_empty: bool = False, *, cache: str | os.PathLike | None = None,
                 cache_max_side: int = 512, cache_max_bytes: int | None = None,
                 cache_format: str = "raw", cache_key: str | None = None) -> None:
        # Checked first: a bad cache argument fails before a long scan.
        self.image_cache = make_image_cache(cache, cache_max_side, cache_max_bytes, cache_format,
                                            cache_key, loader)
        # root, transform, target_transform and their combined transforms, as torchvision's.
        super().__init__(root, transform=transform, target_transform=target_transform)
        classes, class_to_idx = self.find_classes(self.root)
        if type(self).make_dataset is DatasetFolder.make_dataset:
            # Stream the scan straight into the table: no list of a million tuples.
            directory = os.path.expanduser(os.fspath(self.root))
            table = _scan_table(directory, class_to_idx, extensions, is_valid_file, allow_empty)
        else:  # a subclass chose its own samples; keep them, compactly
            pairs = self.make_dataset(self.root, class_to_idx=class_to_idx, extensions=extensions,
                                      is_valid_file=is_valid_file, allow_empty=allow_empty)
            table = SampleTable.from_pairs(pairs, prefix=os.path.join(os.fspath(self.root), ""))
        self.loader = loader
        self.extensions = extensions
        self.classes = classes
        self.class_to_idx = class_to_idx
        self.samples = table

    @staticmethod
    def make_dataset(directory: str | os.PathLike, class_to_idx: dict[str, int],
                     extensions: str | tuple[str, ...] | None = None,
                     is_valid_file: Callable[[str], bool] | None = None,
                     allow_empty: bool = False) -> list[tuple[str, int]]:
        """The ``(path, class_index)`` list; override to change how samples are found."""
        if class_to_idx is None:
            # Unlike the module function, the method needs the classes found by find_classes.
            raise ValueError("The class_to_idx parameter cannot be None.")
        return make_dataset(directory, class_to_idx, extensions=extensions,
                            is_valid_file=is_valid_file, allow_empty=allow_empty)

    def find_classes(self, directory: str | os.PathLike) -> tuple[list[str], dict[str, int]]:
        """The class names and their indices; override for another class layout."""
        return find_classes(directory)

    # ``samples`` is reassignable, as torchvision's plain attribute is (people
    # filter it); whatever is assigned is stored compactly again.
    @property
    def samples(self) -> SampleTable:
        return self._samples

    @samples.setter
    def samples(self, pairs: Sequence[tuple[str, int]]) -> None:
        if not isinstance(pairs, SampleTable):
            pairs = SampleTable.from_pairs(pairs, prefix=os.path.join(os.fspath(self.root), ""))
        self._samples = pairs
        self._targets = TargetList(pairs.targets_array)

    @property
    def targets(self) -> Sequence[Any]:
        return self._targets

    @targets.setter
    def targets(self, values: Sequence[Any]) -> None:
        # As in torchvision, targets is a separate attribute: __getitem__ reads
        # samples.  Integer targets are kept compact; any others (floats,
        # strings, lists) as the list torchvision would keep, never truncated.
        array = int64_indices(values)
        # A copy: the caller's array stays theirs to change.
        self._targets = TargetList(array.copy()) if array is not None else list(values)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        """``(transform(loader(path)), target_transform(target))`` of sample ``index``."""
        path, target = self._samples.item(index)
        transform, loader = self.transform, self.loader
        if transform is not None and (loader is default_loader or loader is pil_loader):
            head, rest = split_planned_head(transform)
        else:
            head = None
        reading = _SampleFileErrors(path, index)
        start = perf_counter()
        try:
            # The decoded-image cache, when on, serves the image (or decodes
            # and stores it); None means: load it as without a cache.
            cached = None if self.image_cache is None else \
                self.image_cache.load(path, loader, transform, reading)
            if cached is not None:
                sample, rest = cached
            elif head is not None:
                sample, rest = decode_planned(path, head, rest, reading)
            else:
                with reading:
                    sample = loader(path)
                rest = (transform,) if transform is not None else ()
            # The loader's report: decoding (with the first transform, where it
            # is fused into the decode) apart from the transforms after it.
            decoded = perf_counter()
            for step in rest:
                sample = step(sample)
            if self.target_transform is not None:
                target = self.target_transform(target)
            SAMPLE_SECONDS.decode += decoded - start
            SAMPLE_SECONDS.transform += perf_counter() - decoded
        except Exception as error:
            if not reading.raised:
                # A transform's error: its own type and message, as torchvision
                # raises it, and a note (in the traceback) of the sample it met.
                error.add_note(f"raised by a transform of sample {index} ({path!r})")
            raise
        return sample, target

    def __len__(self) -> int:
        return len(self._samples)

class ImageFolder(DatasetFolder):
    """torchvision's ``ImageFolder``: a ``DatasetFolder`` of images with ``IMG_EXTENSIONS``.

    With the default loader and a transform whose first step is ``Resize`` or
    ``RandomResizedCrop`` (alone or first in a ``Compose``), JPEGs are decoded
    at 1/2, 1/4 or 1/8 size whenever the region that step reads still has at
    least as many pixels as its output; see ``fastload.vision.decode``.  The
    random draws and the region covered are those of a full decode; pixel
    values differ only by resampling error.  ``imgs`` is ``samples``.
    ``cache=DIR`` keeps decoded images for later epochs and runs (see
    ``DatasetFolder`` and ``fastload.vision.cache``).
    """

    def __init__(self, root: str | os.PathLike, transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[int], Any] | None = None,
                 loader: Callable[[str], Any] = default_loader,
                 is_valid_file: Callable[[str], bool] | None = None,
                 allow_empty: bool = False, *, cache: str | os.PathLike | None = None,
                 cache_max_side: int = 512, cache_max_bytes: int | None = None,
                 cache_format: str = "raw", cache_key: str | None = None) -> None:
        super().__init__(root, loader, IMG_EXTENSIONS if is_valid_file is None else None,
                         transform=transform, target_transform=target_transform,
                         is_valid_file=is_valid_file, allow_empty=allow_empty, cache=cache,
                         cache_max_side=cache_max_side, cache_max_bytes=cache_max_bytes,
                         cache_format=cache_format, cache_key=cache_key)

    @property
    def imgs(self) -> SampleTable:
        return self.samples

    @imgs.setter
    def imgs(self, pairs: Sequence[tuple[str, int]]) -> None:
        self.samples = pairs
