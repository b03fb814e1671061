"""``TarShards``: WebDataset shards read by index as webdataset's own reader reads them."""

import io
import json
import os
import pickle
import tarfile

import numpy as np
import pytest
from required import deferred, require

wds = deferred("webdataset")
Image = require("PIL.Image")

import fastload as fl  # noqa: E402
from fastload.sources import TarShards  # noqa: E402
from fastload.sources.tar_index import index_path, read_members  # noqa: E402

pytestmark = pytest.mark.imports_heavy_library


def _jpeg(i):
    out = io.BytesIO()
    Image.new("RGB", (8 + i % 5, 6), (i * 7 % 256, 40, 200)).save(out, format="JPEG")
    return out.getvalue()


def _sample(i):
    key = f"s{i:04d}" if i % 7 else f"deep/dir/{'long' * 30}_{i:04d}"  # > 100 characters
    return {"__key__": key, "jpg": _jpeg(i), "cls": str(i % 10).encode(),
            "txt": f"caption {i}".encode(), "json": json.dumps({"i": i}).encode(),
            "npy": _npy(np.arange(i % 4 + 1, dtype=np.float32)), "bin": bytes([i % 256]) * 3}


def _npy(array):
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


@pytest.fixture
def shards(tmp_path):
    """Three shards of 13, 13 and 4 samples, as webdataset's ShardWriter writes them."""
    pattern = str(tmp_path / "shard-%03d.tar")
    with wds.ShardWriter(pattern, maxcount=13, verbose=0) as sink:
        for i in range(30):
            sink.write(_sample(i))
    return sorted(str(p) for p in tmp_path.glob("shard-*.tar"))


def _theirs(paths, decode):
    dataset = wds.WebDataset(paths, shardshuffle=False, empty_check=False)
    return list(dataset.decode("pil") if decode else dataset)


def _assert_same_sample(ours, theirs):
    assert set(ours) == set(theirs) - {"__local_path__"}
    for key, value in theirs.items():
        if key == "__local_path__":
            continue
        if isinstance(value, Image.Image):
            np.testing.assert_array_equal(np.asarray(ours[key]), np.asarray(value), err_msg=key)
        elif isinstance(value, np.ndarray):
            np.testing.assert_array_equal(ours[key], value, err_msg=key)
            assert ours[key].dtype == value.dtype
        else:
            assert ours[key] == value and type(ours[key]) is type(value), key


@pytest.mark.parametrize("decode", [False, True])
def test_samples_are_webdatasets_in_order(shards, decode):
    dataset = TarShards(shards, decode=decode)
    theirs = _theirs(shards, decode)
    assert len(dataset) == len(theirs) == 30
    for i, sample in enumerate(theirs):
        _assert_same_sample(dataset[i], sample)
    assert dataset[-1]["__key__"] == theirs[-1]["__key__"]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_long_names_in_every_tar_format_are_read(tmp_path, fmt):
    path = str(tmp_path / "long.tar")
    names = ["a" * 60 + "/" + "b" * 60 + "/key.txt", "short.cls", "c" * 150 + ".bin"]
    if fmt == tarfile.USTAR_FORMAT:
        names[2] = "d" * 90 + "/" + "e" * 90 + ".bin"  # fits in prefix + name
    with tarfile.open(path, "w", format=fmt) as tar:
        folder = tarfile.TarInfo("adir")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)  # not a regular file: skipped
        for number, name in enumerate(names):
            info = tarfile.TarInfo(name)
            info.size = number + 1
            tar.addfile(info, io.BytesIO(b"x" * info.size))
    found, offsets, sizes = read_members(path)
    assert found == names and sizes.tolist() == [1, 2, 3]
    with open(path, "rb") as file:
        data = file.read()
    assert [data[o:o + s] for o, s in zip(offsets.tolist(), sizes.tolist())] == \
        [b"x", b"xx", b"xxx"]


def test_the_index_is_kept_beside_the_shard_and_rebuilt_when_it_changes(shards, tmp_path):
    TarShards(shards)
    kept = index_path(shards[0], None)
    assert os.path.exists(kept)
    before = os.stat(kept).st_mtime_ns
    TarShards(shards)
    assert os.stat(kept).st_mtime_ns == before  # read, not rebuilt
    with wds.TarWriter(shards[0]) as sink:  # the shard rewritten: 2 samples
        for i in range(2):
            sink.write(_sample(i))
    assert len(TarShards(shards)) == 2 + 13 + 4
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".fastload-idx-")]


def test_a_read_only_folder_keeps_the_index_in_index_dir(shards, tmp_path):
    index_dir = tmp_path / "indexes"
    index_dir.mkdir()
    for path in shards:
        os.remove(index_path(path, None)) if os.path.exists(index_path(path, None)) else None
    dataset = TarShards(shards, index_dir=str(index_dir))
    assert len(os.listdir(index_dir)) == 3
    assert not any(os.path.exists(index_path(p, None)) for p in shards)
    assert dataset[20]["__key__"] == _theirs(shards, False)[20]["__key__"]


def test_a_truncated_shard_is_named(shards, tmp_path):
    broken = str(tmp_path / "broken.tar")
    with open(shards[0], "rb") as file:
        data = file.read()
    with open(broken, "wb") as file:
        file.write(data[:len(data) // 2 + 100])
    with pytest.raises(ValueError, match="broken.tar: truncated tar file"):
        TarShards(broken)
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"z" * 2048)
    with pytest.raises(ValueError, match="junk.tar.*checksum|junk.tar.*bad number"):
        TarShards(str(junk))


def test_a_shard_truncated_after_indexing_is_named_on_read(shards):
    dataset = TarShards(shards[-1:])
    os.truncate(shards[-1], 1024)
    with pytest.raises(ValueError, match="shard-002.tar: truncated tar shard"):
        [dataset[i] for i in range(len(dataset))]
    dataset.close()


def test_an_extension_twice_in_a_sample_is_an_error(tmp_path):
    path = str(tmp_path / "twice.tar")
    with tarfile.open(path, "w") as tar:
        for name in ("k.txt", "k.TXT"):
            info = tarfile.TarInfo(name)
            tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ValueError, match="'txt' appears twice"):
        TarShards(path)


def test_it_pickles_without_open_files(shards):
    dataset = TarShards(shards, decode=False)
    dataset[0]
    again = pickle.loads(pickle.dumps(dataset))
    assert again[29] == dataset[29]
    dataset.close()
    again.close()


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_once_an_epoch_over_ranks_and_workers(shards, ranks, workers):
    dataset = TarShards(shards[:2], transform=lambda s: {"key": s["__key__"], "cls": s["cls"]})
    seen = []
    for rank in range(ranks):
        sampler = fl.DistributedSampler(dataset, num_replicas=ranks, rank=rank, seed=3,
                                        drop_last=True)
        loader = fl.DataLoader(dataset, batch_size=3, sampler=sampler, num_workers=workers,
                               timeout=60 if workers else 0)
        seen.extend(key for batch in loader for key in batch["key"])
    # 26 samples: drop_last drops what does not divide evenly, never twice one.
    assert len(seen) == len(set(seen)) == 26 - 26 % ranks
    assert set(seen) <= set(dataset.keys.tolist())


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shuffled_epoch_resumes_mid_way_with_the_rest_of_it(shards, workers):
    def make():
        dataset = TarShards(shards, decode=False, transform=lambda s: s["__key__"])
        return fl.DataLoader(dataset, batch_size=4, shuffle=True, generator=7,
                             num_workers=workers, timeout=60 if workers else 0)

    whole = [batch for batch in make()]
    loader, seen = make(), []
    for batch in loader:
        seen.append(batch)
        if len(seen) == 3:
            break
    state = loader.state_dict()
    again = make()
    again.load_state_dict(state)
    assert seen + list(again) == whole
    assert sorted(key for batch in whole for key in batch) == \
        sorted(TarShards(shards).keys.tolist())
