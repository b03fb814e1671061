"""What keys a decoded-image cache entry (fastload.vision.cache_key, DecodedImageCache._key):
everything that decides its pixels, so no run is served another loader's, format's,
size's or layout's pixels.

References are Pillow's, from the cache's specification (test_vision_cache.py's
``reference``): the file decoded in full as the loader decodes it, shrunk with
LANCZOS to ``cache_max_side``, re-encoded at quality 90 for ``cache_format="jpeg"``.
"""

from __future__ import annotations

import enum
import functools
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from PIL import Image

from fastload.vision import DatasetFolder, ImageFolder, cache_checksums, cache_store
from fastload.vision.cache_key import UnidentifiedLoader, loader_identity
from images import cache_fill_reference, save_folder
from paths import REPO_DIR, TESTS_DIR

SIDE = 64
FILES = [("a", "0.jpg", (40, 30)), ("a", "1.png", (64, 48)), ("b", "2.jpg", (150, 100)),
         ("b", "3.png", (33, 64))]
EXTENSIONS = (".jpg", ".png")


@pytest.fixture
def folder(tmp_path):
    return save_folder(tmp_path / "images", FILES)


def load(path: str, mode: str = "RGB") -> Image.Image:
    with open(path, "rb") as f:
        return Image.open(f).convert(mode)


def expected(path: str, mode: str = "RGB") -> np.ndarray:
    """What a custom loader's image is cached as: loaded in full, then shrunk to SIDE."""
    img = load(path, mode)
    if max(img.size) > SIDE:
        scale = SIDE / max(img.size)
        size = (SIDE, max(1, round(img.height * scale))) if img.width >= img.height else \
            (max(1, round(img.width * scale)), SIDE)
        img = img.resize(size, Image.Resampling.LANCZOS)
    return np.asarray(img)


def run_all(ds) -> list[np.ndarray]:
    return [np.asarray(ds[index][0]) for index in range(len(ds))]


def folder_of(folder, loader, cache, **options) -> DatasetFolder:
    return DatasetFolder(folder, loader, extensions=EXTENSIONS, cache=cache,
                         cache_max_side=SIDE, **options)


# -- loaders told apart ----------------------------------------------------


def test_partials_of_one_function_with_other_arguments_never_share_entries(folder, tmp_path):
    cache = tmp_path / "c"
    greys = folder_of(folder, functools.partial(load, mode="L"), cache)
    run_all(greys)
    colours = folder_of(folder, functools.partial(load, mode="RGB"), cache)
    for got, (path, _) in zip(run_all(colours), colours.samples):
        assert got.shape[-1:] == (3,) and np.array_equal(got, expected(path, "RGB"))
    assert colours.image_cache.stats()["hits"] == 0
    again = folder_of(folder, functools.partial(load, mode="L"), cache)  # a new, equal partial
    for got, (path, _) in zip(run_all(again), again.samples):
        assert np.array_equal(got, expected(path, "L"))
    assert again.image_cache.stats()["hits"] == len(FILES)


def test_two_lambdas_never_share_entries(folder, tmp_path):
    cache = tmp_path / "c"
    run_all(folder_of(folder, lambda path: load(path, "L"), cache))
    colours = folder_of(folder, lambda path: load(path, "RGB"), cache)
    for got, (path, _) in zip(run_all(colours), colours.samples):
        assert np.array_equal(got, expected(path, "RGB"))
    assert colours.image_cache.stats()["hits"] == 0


def test_closures_defaults_and_globals_are_part_of_a_function_s_identity():
    def closing_over(mode):
        return lambda path: load(path, mode)

    assert loader_identity(closing_over("L")) == loader_identity(closing_over("L"))
    assert loader_identity(closing_over("L")) != loader_identity(closing_over("RGB"))

    def defaulting(path, mode="L"):
        return load(path, mode)

    def defaulting_rgb(path, mode="RGB"):
        return load(path, mode)

    defaulting_rgb.__qualname__ = defaulting.__qualname__
    assert loader_identity(defaulting) != loader_identity(defaulting_rgb)

    namespace: dict = {"__name__": "user_loaders", "load": load}
    exec("MODE = 'L'\ndef loader(path):\n    return load(path, MODE)\n", namespace)
    before = loader_identity(namespace["loader"])
    namespace["MODE"] = "RGB"  # the same function object, reading another global value
    assert loader_identity(namespace["loader"]) != before


def test_code_that_differs_only_in_an_attribute_name_differs():
    rotate = lambda img: img.rotate(90)  # noqa: E731
    spin = lambda img: img.rotate(90)  # noqa: E731
    flip = lambda img: img.transpose(90)  # noqa: E731
    assert loader_identity(rotate) == loader_identity(spin)
    assert loader_identity(rotate) != loader_identity(flip)


class Colour(enum.Enum):
    GREY = "L"
    FULL = "RGB"


def test_partial_arguments_are_described_recursively():
    inner = functools.partial(load, mode="L")
    assert loader_identity(functools.partial(inner)) != loader_identity(
        functools.partial(functools.partial(load, mode="RGB")))
    assert loader_identity(functools.partial(load, mode=Colour.GREY)) != loader_identity(
        functools.partial(load, mode=Colour.FULL))
    assert loader_identity(functools.partial(load, 1.5, (1, "x"), np.float32(2))) == \
        loader_identity(functools.partial(load, 1.5, (1, "x"), np.float32(2)))
    assert loader_identity(functools.partial(load, 1)) != loader_identity(
        functools.partial(load, True))


def test_an_identity_is_the_same_in_another_process():
    code = textwrap.dedent("""
        import functools
        from fastload.vision import decode
        from fastload.vision.cache_key import loader_identity
        print(loader_identity(functools.partial(decode.pil_loader)).hex(),
              loader_identity(lambda p: decode.pil_loader(p).convert("L")).hex())
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO_DIR, TESTS_DIR]))
    outputs = set()
    for seed in ("1", "2"):  # str hashes differ between the two
        done = subprocess.run([sys.executable, "-c", code], env=dict(env, PYTHONHASHSEED=seed),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout)
    assert len(outputs) == 1


def load_first(path: str, modes: list[str]) -> Image.Image:
    return load(path, modes[0])


class CallableLoader:
    def __init__(self, mode):
        self.mode = mode

    def __call__(self, path):
        return load(path, self.mode)


@pytest.mark.parametrize("make", [
    lambda: CallableLoader("L"),
    lambda: functools.partial(load_first, modes=["L"]),   # a partial over a list
    lambda: (lambda state: (lambda path: load(path, state[0])))(["L"]),  # a closure over one
], ids=["callable object", "partial over a list", "closure over a list"])
def test_a_loader_without_identity_is_not_cached_and_warned_of_once(folder, tmp_path, make):
    loader = make()
    with pytest.raises(UnidentifiedLoader):
        loader_identity(loader)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = folder_of(folder, loader, tmp_path / "c")
        for _ in range(2):
            for got, (path, _) in zip(run_all(ds), ds.samples):
                assert np.array_equal(got, np.asarray(load(path, "L")))  # as uncached: full size
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == 1 and "cache_key=" in messages[0], messages
    stats = ds.image_cache.stats()
    assert stats["stored"] == 0 and stats["hits"] == 0 and stats["not_cached"] == 2 * len(FILES)


def test_cache_key_names_a_loader_the_cache_cannot_identify(folder, tmp_path):
    cache = tmp_path / "c"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = folder_of(folder, CallableLoader("L"), cache, cache_key="grey v1")
        run_all(first)
        second = folder_of(folder, CallableLoader("L"), cache, cache_key="grey v1")
        for got, (path, _) in zip(run_all(second), second.samples):
            assert np.array_equal(got, expected(path, "L"))
    assert second.image_cache.stats()["hits"] == len(FILES)
    other = folder_of(folder, CallableLoader("RGB"), cache, cache_key="colour v1")
    for got, (path, _) in zip(run_all(other), other.samples):
        assert np.array_equal(got, expected(path, "RGB"))
    assert other.image_cache.stats()["hits"] == 0


def test_bad_cache_keys_are_refused(folder, tmp_path):
    with pytest.raises(TypeError, match="cache_key"):
        ImageFolder(folder, cache=tmp_path / "c", cache_key=3)
    with pytest.raises(ValueError, match="cache_key"):
        ImageFolder(folder, cache=tmp_path / "c", cache_key="")


# -- settings told apart ---------------------------------------------------


@pytest.mark.parametrize("first, second", [("jpeg", "raw"), ("raw", "jpeg")])
def test_a_run_never_reads_entries_another_format_stored(folder, tmp_path, first, second):
    cache = tmp_path / "c"
    run_all(ImageFolder(folder, cache=cache, cache_max_side=SIDE, cache_format=first))
    ds = ImageFolder(folder, cache=cache, cache_max_side=SIDE, cache_format=second)
    for epoch in range(2):
        for got, (path, _) in zip(run_all(ds), ds.samples):
            assert np.array_equal(got, np.asarray(cache_fill_reference(path, SIDE, second))), \
                (epoch, path)
    assert ds.image_cache.stats()["hits"] == len(FILES)  # its own entries, the second epoch


def test_a_run_never_reads_entries_stored_at_another_side(folder, tmp_path):
    cache = tmp_path / "c"
    run_all(ImageFolder(folder, cache=cache, cache_max_side=32))
    ds = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    for got, (path, _) in zip(run_all(ds), ds.samples):
        assert np.array_equal(got, np.asarray(cache_fill_reference(path, SIDE)))
    assert ds.image_cache.stats()["hits"] == 0


def test_records_of_another_layout_are_never_read_and_their_pair_is_reused(folder, tmp_path):
    cache = tmp_path / "c"
    ds = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    run_all(ds)
    ds.image_cache._writer.close()  # the writer is gone: its pair may be taken over
    index_file, = (cache / name for name in os.listdir(cache) if name.endswith(".index"))
    records = np.frombuffer(index_file.read_bytes(), cache_store.RECORD).copy()
    records["version"] = 1  # what an older fastload wrote, its keys laid out otherwise
    records["check"] = cache_checksums.record_checks(records)
    index_file.write_bytes(records.tobytes())
    again = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    for got, (path, _) in zip(run_all(again), again.samples):
        assert np.array_equal(got, np.asarray(cache_fill_reference(path, SIDE)))
    assert again.image_cache.stats()["hits"] == 0
    assert again.image_cache.stats()["stored"] == len(FILES)
    # The old records were cut off with the pair's uncommitted tail: only the new ones remain.
    assert len(os.listdir(cache)) == 2
    assert index_file.stat().st_size == len(FILES) * cache_store.RECORD_SIZE


def test_builtins_and_classes_are_known_by_the_name_that_finds_them():
    import math
    import zlib

    assert loader_identity(functools.partial(load, mode=math.floor)) != loader_identity(
        functools.partial(load, mode=math.ceil))
    assert loader_identity(zlib.crc32) == loader_identity(zlib.crc32)
    assert loader_identity(functools.partial(load, mode=np.uint8)) != loader_identity(
        functools.partial(load, mode=np.int8))
    with pytest.raises(UnidentifiedLoader, match="bound to an object"):
        loader_identity({}.get)  # a builtin method of one dict: its state is the dict's

    class Local:
        pass

    with pytest.raises(UnidentifiedLoader, match="does not find"):
        loader_identity(functools.partial(load, mode=Local))
