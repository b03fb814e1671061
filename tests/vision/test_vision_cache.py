"""The decoded-image cache behind ImageFolder / DatasetFolder (fastload.vision.cache).

References are written here with Pillow from the cache's specification: the
file decoded and converted as the loader converts it (the default loader's
JPEGs at the smallest of 1/2, 1/4, 1/8 scale whose pixels still cover the
cached size), shrunk with LANCZOS from the whole frame so the longer side is
``cache_max_side`` (never enlarged), and for ``cache_format="jpeg"``
re-encoded at quality 90 and decoded again.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest
from PIL import Image

from fastload.rng import seed_transform_rng
from fastload.vision import DatasetFolder, ImageFolder, cache_checksums, cache_store
from fastload.vision import transforms as T
from fastload.vision.cache import DecodedImageCache, cached_size
from images import cache_fill_reference, save_folder, save_image
from paths import REPO_DIR, TESTS_DIR

HERE, ROOT = TESTS_DIR, REPO_DIR

# (class, name, size): small files within a 64-pixel cache side, and larger
# ones (landscape, portrait) that the cache shrinks.
FILES = [("a", "0.jpg", (40, 30)), ("a", "1.png", (64, 48)), ("a", "2.jpg", (150, 100)),
         ("b", "3.jpg", (90, 200)), ("b", "4.png", (33, 64)), ("b", "5.jpg", (64, 64))]
SIDE = 64


@pytest.fixture
def folder(tmp_path):
    return save_folder(tmp_path / "images", FILES)


@pytest.fixture
def small_folder(tmp_path):
    """Images within the cache side only: 12 files, two classes.  All under 48 pixels
    high, so that no crop of them has 2x a 24-pixel output in both directions:
    without a cache too they are decoded in full (no reduced-size JPEG decode)."""
    root = tmp_path / "small"
    for index in range(12):
        size = (40 + 2 * index, 46 - index)
        ext = "jpg" if index % 3 else "png"
        save_image(root / "ab"[index % 2] / f"{index}.{ext}", size=size, seed=100 + index)
    return str(root)


def pixels(img) -> np.ndarray:
    return np.asarray(img)


def run_python(code: str, timeout: float = 90, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def cache_files(directory) -> list[str]:
    return sorted(os.listdir(directory))


# -- what is stored --------------------------------------------------------


def test_cached_size_keeps_the_longer_side_within_the_bound():
    assert cached_size(40, 30, 64) == (40, 30)
    assert cached_size(64, 64, 64) == (64, 64)
    assert cached_size(150, 100, 64) == (64, 43)
    assert cached_size(90, 200, 64) == (29, 64)
    assert cached_size(1000, 1, 64) == (64, 1)


@pytest.mark.parametrize("fmt", ["raw", "jpeg"])
def test_pixels_are_the_covering_decode_resized_in_every_epoch(folder, tmp_path, fmt):
    ds = ImageFolder(folder, cache=tmp_path / "cache", cache_max_side=SIDE, cache_format=fmt)
    for epoch in range(2):
        for index, (path, target) in enumerate(ds.samples):
            img, label = ds[index]
            assert label == target
            assert type(img) is Image.Image and img.mode == "RGB"
            expected = cache_fill_reference(path, SIDE, fmt)
            assert img.size == expected.size
            assert np.array_equal(pixels(img), pixels(expected)), (epoch, path)
    stats = ds.image_cache.stats()
    assert stats["stored"] == len(FILES) and stats["hits"] == len(FILES)
    assert stats["entries"] == len(FILES)


def test_jpeg_entries_are_smaller_than_raw_ones(folder, tmp_path):
    sizes = {}
    for fmt in ("raw", "jpeg"):
        ds = ImageFolder(folder, cache=tmp_path / fmt, cache_max_side=SIDE, cache_format=fmt)
        for index in range(len(ds)):
            ds[index]
        sizes[fmt] = ds.image_cache.stats()["stored_bytes"]
    pixels_stored = sum(w * h * 3 for w, h in (cached_size(*size, SIDE) for _, _, size in FILES))
    assert pixels_stored <= sizes["raw"] < pixels_stored + 64 * len(FILES)  # entries 64-aligned
    assert sizes["jpeg"] < sizes["raw"]


def test_transforms_run_on_the_cached_image_as_if_it_were_the_file(folder, tmp_path):
    transform = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToArray()])
    ds = ImageFolder(folder, transform=transform, cache=tmp_path / "c", cache_max_side=SIDE)
    for epoch in range(2):
        for index, (path, _) in enumerate(ds.samples):
            seed_transform_rng(7 + index, epoch)
            got, _ = ds[index]
            seed_transform_rng(7 + index, epoch)
            expected = transform(cache_fill_reference(path, SIDE))
            assert np.array_equal(got, expected), (epoch, path)


def test_a_separate_entry_per_cache_side_and_per_loader(folder, tmp_path):
    cache = tmp_path / "c"
    ImageFolder(folder, cache=cache, cache_max_side=SIDE)[2]
    bigger = ImageFolder(folder, cache=cache, cache_max_side=128)
    img, _ = bigger[2]
    assert img.size == (128, 85) and bigger.image_cache.stats()["hits"] == 0

    def grey(path):
        with open(path, "rb") as f:
            return Image.open(f).convert("L")

    greys = DatasetFolder(folder, grey, extensions=(".jpg", ".png"), cache=cache,
                          cache_max_side=SIDE)
    for epoch in range(2):
        img, _ = greys[2]
        assert img.mode == "L" and img.size == (64, 43)
        expected = grey(greys.samples[2][0]).resize((64, 43), Image.Resampling.LANCZOS)
        assert np.array_equal(pixels(img), pixels(expected))
    assert greys.image_cache.stats() == dict(greys.image_cache.stats(), hits=1, stored=1)


def test_a_loader_output_the_store_cannot_hold_passes_through(folder, tmp_path):
    ds = DatasetFolder(folder, lambda path: np.full(3, 7), extensions=(".jpg",),
                       transform=lambda a: a * 2, cache=tmp_path / "c")
    sample, _ = ds[0]
    assert np.array_equal(sample, np.full(3, 14))
    assert ds.image_cache.stats()["stored"] == 0


def test_bad_cache_arguments_are_refused(folder, tmp_path):
    with pytest.raises(ValueError, match="cache_format"):
        ImageFolder(folder, cache=tmp_path, cache_format="png")
    with pytest.raises(ValueError, match="cache_max_side"):
        ImageFolder(folder, cache=tmp_path, cache_max_side=0)
    with pytest.raises(ValueError, match="cache_max_bytes"):
        ImageFolder(folder, cache=tmp_path, cache_max_bytes=-1)
    with pytest.raises(TypeError, match="cache must be a directory path"):
        ImageFolder(folder, cache=3)
    assert ImageFolder(folder).image_cache is None


def test_a_pickled_dataset_opens_the_store_again(folder, tmp_path):
    ds = ImageFolder(folder, cache=tmp_path / "c", cache_max_side=SIDE)
    for index in range(len(ds)):
        ds[index]
    again = pickle.loads(pickle.dumps(ds))
    assert again.image_cache.stats()["hits"] == 0
    for index in range(len(ds)):
        assert np.array_equal(pixels(again[index][0]), pixels(ds[index][0]))
    assert again.image_cache.stats()["hits"] == len(ds) and again.image_cache.stats()["stored"] == 0


# -- files that change -----------------------------------------------------


def test_a_changed_or_replaced_file_is_decoded_again(folder, tmp_path):
    cache = tmp_path / "c"
    ds = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    path = ds.samples[0][0]
    ds[0]
    # Changed in place: same inode, new content and mtime.
    save_image(path, size=(40, 30), seed=999)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    fresh = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    assert np.array_equal(pixels(fresh[0][0]), pixels(cache_fill_reference(path, SIDE)))
    assert fresh.image_cache.stats()["hits"] == 0
    # Replaced by another file (a new inode), even with the old size and mtime.
    stat = os.stat(path)
    replacement = os.path.join(os.path.dirname(path), "new.tmp")
    save_image(replacement, size=(40, 30), seed=1234, image_format="JPEG")
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(replacement, path)
    img, _ = fresh[0]
    assert np.array_equal(pixels(img), pixels(cache_fill_reference(path, SIDE)))
    assert fresh.image_cache.stats()["hits"] == 0


def test_a_removed_file_raises_as_without_the_cache(folder, tmp_path):
    cached = ImageFolder(folder, cache=tmp_path / "c", cache_max_side=SIDE)
    plain = ImageFolder(folder)
    cached[1]
    os.remove(cached.samples[1][0])
    with pytest.raises(FileNotFoundError) as with_cache:
        cached[1]
    with pytest.raises(FileNotFoundError) as without:
        plain[1]
    assert str(with_cache.value) == str(without.value)
    assert with_cache.value.errno == errno.ENOENT


# -- bounds and failures ---------------------------------------------------


def test_past_max_bytes_images_are_loaded_but_not_cached(folder, tmp_path):
    bound = 2 * 64 * 64 * 3
    ds = ImageFolder(folder, cache=tmp_path / "c", cache_max_side=SIDE, cache_max_bytes=bound)
    first = [pixels(ds[index][0]) for index in range(len(ds))]
    stats = ds.image_cache.stats()
    assert 1 <= stats["stored"] < len(FILES)
    kept = 0
    for index, (path, _) in enumerate(ds.samples):
        # Cached, or loaded exactly as without a cache; the same in every epoch.
        img = pixels(ds[index][0])
        assert np.array_equal(img, first[index])
        if np.array_equal(img, pixels(cache_fill_reference(path, SIDE))):
            kept += 1
        else:
            assert np.array_equal(img, pixels(cache_fill_reference(path, side=10**6)))
    assert kept >= stats["stored"]
    assert cache_store.data_bytes(str(tmp_path / "c")) == stats["stored_bytes"] <= bound
    assert stats["over_bound"] + stats["not_cached"] > 0


def test_a_cache_directory_that_cannot_be_made_warns_once(folder, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_bytes(b"")
    with pytest.warns(RuntimeWarning, match=str(blocker / "cache")) as caught:
        ds = ImageFolder(folder, cache=blocker / "cache")
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for index, (path, _) in enumerate(ds.samples):
            assert np.array_equal(pixels(ds[index][0]), pixels(cache_fill_reference(path, side=10**6)))


@pytest.mark.parametrize("failure", [errno.EROFS, errno.EACCES])
def test_a_read_only_cache_warns_once_and_loading_goes_on(folder, tmp_path, monkeypatch, failure):
    real_open = os.open

    def refusing(path, flags, *args, **kwargs):
        if str(tmp_path / "c") in os.fspath(path) and flags & (os.O_WRONLY | os.O_RDWR):
            raise OSError(failure, os.strerror(failure), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(cache_store.os, "open", refusing)
    transform = T.Compose([T.CenterCrop(20), T.ToArray()])
    ds = ImageFolder(folder, transform=transform, cache=tmp_path / "c", cache_max_side=SIDE)
    plain = ImageFolder(folder, transform=transform)
    with pytest.warns(RuntimeWarning) as caught:
        for epoch in range(2):
            for index in range(len(ds)):
                assert np.array_equal(ds[index][0], plain[index][0])
    assert len(caught) == 1
    assert str(tmp_path / "c") in str(caught[0].message)
    assert ds.image_cache.stats()["stored"] == 0


@pytest.mark.parametrize("partial", [False, True])
def test_a_full_disk_warns_once_and_leaves_no_entry(folder, tmp_path, monkeypatch, partial):
    real_pwrite = os.pwrite

    def full(fd, data, offset):
        if partial and len(data) > 8:  # some bytes land, then the disk is full
            return real_pwrite(fd, bytes(data)[:len(data) // 2], offset)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cache_store.os, "pwrite", full)
    cache = tmp_path / "c"
    ds = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    with pytest.warns(RuntimeWarning, match=str(cache)) as caught:
        for index, (path, _) in enumerate(ds.samples):
            assert np.array_equal(pixels(ds[index][0]), pixels(cache_fill_reference(path, side=10**6)))
    assert len(caught) == 1 and "No space left" in str(caught[0].message)
    monkeypatch.undo()
    again = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    again.image_cache.refresh()
    assert again.image_cache.stats()["entries"] == 0
    for index, (path, _) in enumerate(again.samples):  # adopts the pair, fills it right
        assert np.array_equal(pixels(again[index][0]), pixels(cache_fill_reference(path, SIDE)))
    assert len(cache_files(cache)) == 2
    last = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    for index, (path, _) in enumerate(last.samples):
        assert np.array_equal(pixels(last[index][0]), pixels(cache_fill_reference(path, SIDE)))
    assert last.image_cache.stats()["hits"] == len(FILES)


def test_damaged_records_and_bytes_are_never_read(folder, tmp_path):
    cache = tmp_path / "c"
    ds = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    for index in range(len(ds)):
        ds[index]
    index_file = next(str(cache / n) for n in cache_files(cache) if n.endswith(".index"))
    data_file = index_file[:-len(".index")] + ".data"
    with open(index_file, "r+b") as f:  # a record's key byte flipped: fails its checksum
        f.seek(cache_store.RECORD_SIZE + 9)
        byte = f.read(1)
        f.seek(cache_store.RECORD_SIZE + 9)
        f.write(bytes([byte[0] ^ 0xFF]))
        f.seek(0, os.SEEK_END)
        f.write(b"\x01" * 40)  # and a torn record at the end
    with open(data_file, "r+b") as f:  # a pixel of the first entry changed: fails its checksum
        f.seek(5)
        byte = f.read(1)
        f.seek(5)
        f.write(bytes([byte[0] ^ 0xFF]))
    again = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    for index, (path, _) in enumerate(again.samples):
        assert np.array_equal(pixels(again[index][0]), pixels(cache_fill_reference(path, SIDE)))
    assert again.image_cache.stats()["hits"] == len(FILES) - 2


# -- several processes -----------------------------------------------------

FILL = """
import sys
from fastload.vision import ImageFolder
ds = ImageFolder({root!r}, cache={cache!r}, cache_max_side={side})
order = list(range(len(ds)))
if {reverse}:
    order.reverse()
for index in order:
    ds[index]
stats = ds.image_cache.stats()
print(stats["hits"], stats["stored"], stats["not_cached"])
"""


@pytest.mark.timeout(120)
def test_a_second_process_reads_without_decoding(folder, tmp_path):
    cache = str(tmp_path / "c")
    first = run_python(FILL.format(root=folder, cache=cache, side=SIDE, reverse=False))
    assert first.stdout.split() == ["0", str(len(FILES)), "0"]
    second = run_python("""
        from PIL import Image
        import numpy as np
        from fastload.vision import ImageFolder
        opened = []
        real = Image.open
        Image.open = lambda *a, **k: opened.append(a) or real(*a, **k)
        ds = ImageFolder({root!r}, cache={cache!r}, cache_max_side={side})
        for index in range(len(ds)):
            ds[index]
        print(ds.image_cache.stats()["hits"], ds.image_cache.stats()["stored"], len(opened))
    """.format(root=folder, cache=cache, side=SIDE))
    assert second.stdout.split() == [str(len(FILES)), "0", "0"]


@pytest.mark.timeout(120)
def test_two_processes_fill_one_cache_at_once(tmp_path):
    root = tmp_path / "many"
    for index in range(40):
        save_image(root / "ab"[index % 2] / f"{index}.jpg", size=(50 + index, 80 - index),
                   seed=index)
    cache = str(tmp_path / "c")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]))
    # Each child waits for the other before filling and before exiting, so the
    # two really write at once (each holding its own file pair).
    barrier = textwrap.dedent("""
        import os, time
        def meet(name, me, deadline=60):
            open(os.path.join({tmp!r}, name + str(me)), "w").close()
            end = time.monotonic() + deadline
            while not os.path.exists(os.path.join({tmp!r}, name + str(1 - me))):
                assert time.monotonic() < end, "the other child never came"
                time.sleep(0.01)
    """).format(tmp=str(tmp_path))
    children = []
    for me, reverse in enumerate((False, True)):
        fill = FILL.format(root=str(root), cache=cache, side=SIDE, reverse=reverse)
        fill = fill.replace("order = list", f"meet('ready', {me})\norder = list")
        code = barrier + fill + f"\nmeet('done', {me})\n"
        children.append(subprocess.Popen([sys.executable, "-c", code], env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for child in children:
        out, err = child.communicate(timeout=90)
        assert child.returncode == 0, err
    assert len([n for n in cache_files(cache) if n.endswith(".index")]) == 2
    ds = ImageFolder(str(root), cache=cache, cache_max_side=SIDE)
    for index, (path, _) in enumerate(ds.samples):
        assert np.array_equal(pixels(ds[index][0]), pixels(cache_fill_reference(path, SIDE)))
    assert ds.image_cache.stats()["hits"] == 40 and ds.image_cache.stats()["stored"] == 0


KILLED = """
import os, signal
from fastload.vision import ImageFolder, cache_store
calls = [0]
real_pwrite, real_write = os.pwrite, os.write
def kill_now():
    os.kill(os.getpid(), signal.SIGKILL)
def pwrite(fd, data, offset):
    calls[0] += 1
    if {where!r} == "data" and calls[0] == {at}:
        real_pwrite(fd, bytes(data)[:len(data) // 2], offset)
        kill_now()
    return real_pwrite(fd, data, offset)
def write(fd, data):
    if {where!r} == "index" and calls[0] == {at} and len(data) == cache_store.RECORD_SIZE:
        real_write(fd, bytes(data)[:20])
        kill_now()
    return real_write(fd, data)
os.pwrite, os.write = pwrite, write
ds = ImageFolder({root!r}, cache={cache!r}, cache_max_side={side})
for index in range(len(ds)):
    ds[index]
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["data", "index"])
def test_a_killed_writer_leaves_only_complete_entries(folder, tmp_path, where):
    cache = str(tmp_path / "c")
    at = 4
    killed = run_python(KILLED.format(where=where, at=at, root=folder, cache=cache, side=SIDE),
                        check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    after = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    for index, (path, _) in enumerate(after.samples):
        assert np.array_equal(pixels(after[index][0]), pixels(cache_fill_reference(path, SIDE)))
    stats = after.image_cache.stats()
    assert stats["hits"] == at - 1 and stats["stored"] == len(FILES) - (at - 1)
    # The new run adopted the dead writer's files: the torn tail is gone.
    assert len(cache_files(cache)) == 2
    index_file = next(os.path.join(cache, n) for n in cache_files(cache) if n.endswith(".index"))
    assert os.path.getsize(index_file) == len(FILES) * cache_store.RECORD_SIZE
    last = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    for index, (path, _) in enumerate(last.samples):
        assert np.array_equal(pixels(last[index][0]), pixels(cache_fill_reference(path, SIDE)))
    assert last.image_cache.stats()["hits"] == len(FILES)


@pytest.mark.timeout(120)
def test_a_writer_killed_at_any_moment_leaves_a_readable_cache(tmp_path):
    root = tmp_path / "many"
    for index in range(30):
        save_image(root / "ab"[index % 2] / f"{index}.jpg", size=(160, 120), seed=index)
    cache = str(tmp_path / "c")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, HERE, os.environ.get("PYTHONPATH", "")]))
    for delay in (0.4, 0.8):
        child = subprocess.Popen([sys.executable, "-c", FILL.format(
            root=str(root), cache=cache, side=SIDE, reverse=False) + "\nimport time; time.sleep(60)"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    ds = ImageFolder(str(root), cache=cache, cache_max_side=SIDE)
    for index, (path, _) in enumerate(ds.samples):
        assert np.array_equal(pixels(ds[index][0]), pixels(cache_fill_reference(path, SIDE)))
    stats = ds.image_cache.stats()
    assert stats["hits"] + stats["stored"] == 30


# -- with the DataLoader ---------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
def test_loader_batches_from_the_cache_equal_an_uncached_loader(small_folder, tmp_path, workers,
                                                                no_leaks):
    import fastload

    transform = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.ToArray()])
    cached = ImageFolder(small_folder, transform=transform, cache=tmp_path / "c",
                         cache_max_side=SIDE)
    plain = ImageFolder(small_folder, transform=transform)
    loaders = [fastload.DataLoader(ds, batch_size=4, shuffle=True, num_workers=workers,
                                   generator=321) for ds in (cached, plain)]
    for epoch in range(3):
        got = [(x.copy(), y.copy()) for x, y in loaders[0]]
        expected = [(x.copy(), y.copy()) for x, y in loaders[1]]
        assert len(got) == len(expected) == 3
        for (x, y), (x_expected, y_expected) in zip(got, expected):
            assert np.array_equal(x, x_expected) and np.array_equal(y, y_expected), epoch
    check = DecodedImageCache(tmp_path / "c", max_side=SIDE)
    check.refresh()
    assert check.stats()["entries"] == 12
    if workers == 0:
        assert cached.image_cache.stats()["hits"] == 24


def _uss_growth_after_lookups(cache, keys, connection):
    import psutil

    me = psutil.Process()
    before = me.memory_full_info().uss
    found = 0
    for row in range(len(keys)):
        found += cache._table.find(int(keys[row, 0]), int(keys[row, 1])) is not None
    connection.send((found, me.memory_full_info().uss - before))


@pytest.mark.timeout(120)
def test_forked_workers_share_the_index_pages(tmp_path):
    import multiprocessing

    cache = DecodedImageCache(tmp_path / "c")
    count = 200_000
    keys = np.random.default_rng(0).integers(0, 2**63, (count, 2)).astype(np.uint64)
    records = np.zeros(count, cache_store.RECORD)
    records["magic"], records["version"] = int.from_bytes(b"FLC1", "little"), cache_store.VERSION
    records["key_hi"], records["key_lo"] = keys[:, 0], keys[:, 1]
    records["length"], records["width"], records["height"] = 1, 1, 1
    records["check"] = cache_checksums.record_checks(records)
    (tmp_path / "c" / "w.index").write_bytes(records.tobytes())
    (tmp_path / "c" / "w.data").write_bytes(b"x")
    cache.refresh()
    assert cache.stats()["entries"] == count
    table_bytes = cache._table._main[1].nbytes + cache._table._main[0].nbytes
    receiving, sending = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(
        target=_uss_growth_after_lookups, args=(cache, keys[::4], sending))
    child.start()
    assert receiving.poll(90)
    found, growth = receiving.recv()
    child.join(timeout=30)
    assert found == count // 4
    # Looking up writes nothing to the table's pages (a copy would be ~table_bytes).
    assert growth < table_bytes / 4, (growth, table_bytes)


@pytest.mark.parametrize("flip", [False, True])
def test_stored_pixels_resize_as_pillow_crops_and_resizes(flip):
    from fastload.vision.resample import resize_rgb_bytes_to_chw

    rng = np.random.default_rng(3)
    img = Image.fromarray(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8))
    stored = memoryview(img.tobytes())  # exactly the entry: no byte after the last pixel
    boxes = [(0, 0, 53, 37), (10, 5, 53, 37), (0, 0, 20, 11), (7, 3, 40, 30), (52, 36, 53, 37)]
    for box in boxes:
        for size in [(16, 16), (53, 37), (70, 9), (box[2] - box[0], box[3] - box[1])]:
            for resample in (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC,
                             Image.Resampling.LANCZOS):
                expected = img.crop(box).resize(size, resample)
                if flip:
                    expected = expected.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
                got = resize_rgb_bytes_to_chw(stored, 53, 37, box, size, resample, flip)
                assert np.array_equal(got, np.asarray(expected).transpose(2, 0, 1)), \
                    (box, size, resample)
    with pytest.raises(ValueError, match="not inside"):
        resize_rgb_bytes_to_chw(stored, 53, 37, (0, 0, 54, 37), (8, 8), Image.Resampling.BILINEAR)


def test_jpeg_entries_transform_as_the_re_encoded_file_would(folder, tmp_path):
    # A folder holding, at the same places, the re-encoded JPEGs themselves.
    twin = tmp_path / "twin"
    for label, name, _ in FILES:
        path = os.path.join(folder, label, name)
        buffer = io.BytesIO()
        cache_fill_reference(path, SIDE).save(buffer, "JPEG", quality=90)
        os.makedirs(twin / label, exist_ok=True)
        (twin / label / name).write_bytes(buffer.getvalue())
    transform = T.Compose([T.RandomResizedCrop(20), T.RandomHorizontalFlip(), T.ToArray()])
    cached = ImageFolder(folder, transform=transform, cache=tmp_path / "c", cache_max_side=SIDE,
                         cache_format="jpeg")
    files = ImageFolder(str(twin), transform=transform, is_valid_file=lambda p: True)
    for epoch in range(2):
        for index in range(len(cached)):
            seed_transform_rng(index, epoch)
            got, _ = cached[index]
            seed_transform_rng(index, epoch)
            expected, _ = files[index]
            assert np.array_equal(got, expected), (epoch, index)
    assert cached.image_cache.stats()["hits"] == len(FILES)
