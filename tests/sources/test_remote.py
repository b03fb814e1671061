"""Tar shards behind http:// URLs: ranged reads, retries, timeouts and named errors.

nginx (tests/nginx_server.py) serves the happy path, as a real server answers
ranges; a small server of ours (tests/range_server.py) injects faults per
request.  Both listen on 127.0.0.1 only; nothing leaves the machine.
"""

import os
import time

import pytest
from required import deferred, require, require_installed

wds = deferred("webdataset")
require_installed("fsspec")
require_installed("aiohttp")

import fastload as fl  # noqa: E402
from fastload.sources import ShardStream, TarShards  # noqa: E402
from fastload.sources.remote import RemoteObject, is_url  # noqa: E402
from nginx_server import NginxServer, nginx_binary  # noqa: E402
from range_server import RangeServer  # noqa: E402

pytestmark = [pytest.mark.timeout(120), pytest.mark.imports_heavy_library]


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    with wds.ShardWriter(str(root / "part-%02d.tar"), maxcount=7, verbose=0) as sink:
        for i in range(20):
            sink.write({"__key__": f"k{i:03d}", "cls": str(i), "bin": os.urandom(700 + i)})
    names = sorted(p.name for p in root.glob("part-*.tar"))
    with RangeServer(str(root), stall_seconds=10.0) as server:
        yield server, [str(root / name) for name in names], [f"{server.url}/{n}" for n in names]


def _same(ours, theirs):
    assert len(ours) == len(theirs)
    for i in range(len(theirs)):
        a, b = ours[i], theirs[i]
        assert a.keys() == b.keys() and a["__key__"] == b["__key__"]
        assert a["cls"] == b["cls"] and a["bin"] == b["bin"]


def test_urls_are_told_from_paths():
    assert is_url("https://host/a.tar") and is_url("s3://bucket/a.tar")
    assert not is_url("/data/a.tar") and not is_url("file:///data/a.tar")
    assert not is_url("relative/a.tar")


@pytest.mark.parametrize("workers", [0, 2])
def test_shards_over_http_are_the_local_shards(served, tmp_path, workers):
    server, paths, urls = served
    local = TarShards(paths)
    remote = TarShards(urls, index_dir=str(tmp_path))
    _same(remote, local)
    assert len(list(tmp_path.glob("*.fastload-idx.npz"))) == len(urls)  # kept in index_dir
    loader = fl.DataLoader(remote, batch_size=3, shuffle=True, generator=1, num_workers=workers,
                           timeout=60 if workers else 0)
    keys = [k for batch in loader for k in batch["__key__"]]
    assert sorted(keys) == sorted(local.keys.tolist())
    local.close()


def test_a_kept_index_saves_reading_the_headers_again(served, tmp_path):
    server, _, urls = served
    TarShards(urls, index_dir=str(tmp_path))
    before = sum(server.requests.values())
    TarShards(urls, index_dir=str(tmp_path))
    assert sum(server.requests.values()) - before == len(urls)  # one HEAD each, no ranges


def test_a_server_answering_503_twice_is_retried(served):
    server, paths, urls = served
    name = urls[0].rsplit("/", 1)[1]
    server.faults[name] += [503, 503]
    remote = TarShards(urls[:1])
    assert remote[0]["cls"] == 0 and not server.faults[name]
    server.faults[name] += ["reset"]
    remote._sources[0]._blocks.clear()
    assert remote[3]["cls"] == 3


def test_a_server_that_keeps_failing_gives_up_naming_the_object(served):
    server, _, urls = served
    source = RemoteObject(urls[0], retries=2, backoff=0.01)
    # fsspec asks for the size with a HEAD, then a GET: six 503s fail three attempts.
    server.faults[urls[0].rsplit("/", 1)[1]] += [503] * 6
    with pytest.raises(OSError, match="part-00.tar.*failed 3 times"):
        source.length


def test_a_stalled_server_times_out_naming_the_object(served):
    server, _, urls = served
    source = RemoteObject(urls[0], timeout=1.0, retries=1, backoff=0.01)
    server.faults[urls[0].rsplit("/", 1)[1]] += ["stall"] * 4  # HEAD and GET, twice
    start = time.monotonic()
    with pytest.raises(OSError, match="part-00.tar"):
        source.length
    assert time.monotonic() - start < 5.5  # four 1 s timeouts and a backoff, not the stalls


def test_missing_and_forbidden_objects_are_named(served):
    server, _, urls = served
    with pytest.raises(FileNotFoundError, match="missing.tar"):
        TarShards([f"{server.url}/missing.tar"])
    with pytest.raises(PermissionError, match="forbidden/a.tar.*403"):
        RemoteObject(f"{server.url}/forbidden/a.tar").read(0, 10)


def test_a_stream_over_http_splits_and_resumes_as_a_local_one(served):
    server, paths, urls = served

    def keys(shards):
        stream = ShardStream(shards, shuffle_buffer=4, seed=2, num_replicas=1, rank=0,
                             transform=lambda s: s["__key__"])
        return [k for batch in fl.DataLoader(stream, batch_size=4) for k in batch]

    assert keys(urls) == keys(paths)


def test_arrow_and_parquet_files_over_http_are_the_local_ones(tmp_path):
    pa = require("pyarrow")
    import pyarrow.parquet as pq

    from arrow_tables import numeric_table
    from fastload.sources import ArrowDataset, ParquetDataset

    root = tmp_path / "tables"
    root.mkdir()
    table = numeric_table(40)
    pq.write_table(table, str(root / "t.parquet"), row_group_size=9)
    with pa.OSFile(str(root / "t.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table, max_chunksize=11)
    with RangeServer(str(root)) as server:
        server.faults["t.parquet"] += [503]
        for remote, local in ((ParquetDataset(f"{server.url}/t.parquet", cached_row_groups=2),
                               ParquetDataset(str(root / "t.parquet"))),
                              (ArrowDataset(f"{server.url}/t.arrow"),
                               ArrowDataset(str(root / "t.arrow")))):
            batches = list(fl.DataLoader(remote, batch_size=8, shuffle=True, generator=3))
            expected = list(fl.DataLoader(local, batch_size=8, shuffle=True, generator=3))
            for ours, theirs in zip(batches, expected, strict=True):
                for key in theirs:
                    assert (ours[key] == theirs[key]).all(), key
        with pytest.raises(FileNotFoundError, match="gone.parquet"):
            ParquetDataset(f"{server.url}/gone.parquet")
        with pytest.raises(FileNotFoundError, match="gone.arrow"):
            ArrowDataset(f"{server.url}/gone.arrow")
        with pytest.raises(PermissionError, match="forbidden/t.parquet.*403"):
            ParquetDataset(f"{server.url}/forbidden/t.parquet")  # refused, not "malformed"


@pytest.fixture
def nginx():
    """nginx is required when FASTLOAD_REQUIRE_NGINX is set (.ci/run installs it)."""
    if nginx_binary() is None:
        if os.environ.get("FASTLOAD_REQUIRE_NGINX"):
            pytest.fail("nginx is required here (FASTLOAD_REQUIRE_NGINX is set) but is not "
                        "installed: apt-get install nginx-light")
        pytest.skip("nginx is not installed (apt-get install nginx-light)")
    return NginxServer


@pytest.mark.parametrize("workers", [0, 2])
def test_shards_served_by_nginx_are_the_local_shards(served, nginx, tmp_path, workers):
    _, paths, _ = served
    with nginx(os.path.dirname(paths[0])) as server:
        urls = [f"{server.url}/{os.path.basename(p)}" for p in paths]
        remote = TarShards(urls, index_dir=str(tmp_path))
        local = TarShards(paths)
        assert remote._sources[0].identity() is not None  # nginx's ETag keys the index
        _same(remote, local)
        loader = fl.DataLoader(remote, batch_size=4, shuffle=True, generator=5,
                               num_workers=workers, timeout=60 if workers else 0)
        expected = fl.DataLoader(local, batch_size=4, shuffle=True, generator=5)
        for ours, theirs in zip(loader, expected, strict=True):
            assert ours["__key__"] == theirs["__key__"] and ours["bin"] == theirs["bin"]
        local.close()
