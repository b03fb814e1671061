"""Remote reads go out together: a batch's samples, a read over many blocks, row groups.

The server (tests/range_server.py, 127.0.0.1 only) holds every request for
``latency`` seconds and records the most it was answering at once: requests
made one after another never overlap, requests made together do.  Nothing
here is timed; each test also checks the bytes against the local files.
"""

import os

import numpy as np
import pytest
from required import deferred, require, require_installed

wds = deferred("webdataset")
require_installed("fsspec")
require_installed("aiohttp")

import fastload as fl  # noqa: E402
from fastload.sources import TarShards  # noqa: E402
from fastload.sources.remote import RemoteClient, RemoteObject  # noqa: E402
from fastload.sources.remote_client import merge_spans  # noqa: E402
from range_server import RangeServer  # noqa: E402

pytestmark = [pytest.mark.timeout(120), pytest.mark.imports_heavy_library]

LATENCY = 0.3


@pytest.fixture
def shards(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    with wds.ShardWriter(str(root / "part-%02d.tar"), maxcount=6, verbose=0) as sink:
        for i in range(24):  # 4 shards, samples far enough apart to be read one by one
            sink.write({"__key__": f"k{i:03d}", "cls": str(i), "bin": os.urandom(20_000 + i)})
    return root, sorted(p.name for p in root.glob("part-*.tar"))


def _same(ours, theirs):
    assert ours["__key__"] == theirs["__key__"]
    assert ours["cls"] == theirs["cls"] and ours["bin"] == theirs["bin"]


def test_merge_spans_joins_neighbours_and_overlaps_only():
    assert merge_spans([(100, 200), (0, 50), (40, 60), (300, 400)], gap=10) == \
        [(0, 60), (100, 200), (300, 400)]
    assert merge_spans([(0, 10), (15, 20)], gap=5) == [(0, 20)]
    assert merge_spans([(5, 5)]) == []


def test_a_batch_reads_its_samples_together_and_they_are_the_local_ones(shards, tmp_path):
    root, names = shards
    with RangeServer(str(root)) as server:
        remote = TarShards([f"{server.url}/{n}" for n in names], index_dir=str(tmp_path))
        local = TarShards([str(root / n) for n in names])
        server.latency, server.most_in_flight = LATENCY, 0  # indexed: from here on, slow
        order = [0, 7, 13, 19, 2, 9, 15, 22]  # two per shard, none adjacent
        batch = remote.__getitems__(order)
        assert server.most_in_flight >= len(order) // 2
        for sample, index in zip(batch, order):
            _same(sample, local[index])
        # Through the loader, with workers: every batch is staged, the data the local data.
        loader = fl.DataLoader(remote, batch_size=6, shuffle=True, generator=4, num_workers=2,
                               timeout=60)
        expected = fl.DataLoader(local, batch_size=6, shuffle=True, generator=4)
        for ours, theirs in zip(loader, expected, strict=True):
            assert ours["__key__"] == theirs["__key__"] and ours["bin"] == theirs["bin"]
        local.close()


def test_no_more_requests_than_max_concurrency_are_in_flight(shards, tmp_path):
    root, names = shards
    with RangeServer(str(root)) as server:
        remote = TarShards([f"{server.url}/{n}" for n in names], index_dir=str(tmp_path),
                           max_concurrency=3)
        local = TarShards([str(root / n) for n in names])
        server.latency, server.most_in_flight = LATENCY, 0
        order = list(range(0, 24, 2))  # twelve spans
        for sample, index in zip(remote.__getitems__(order), order):
            _same(sample, local[index])
        assert server.most_in_flight == 3
        local.close()
    with pytest.raises(ValueError, match="max_concurrency"):
        RemoteClient(max_concurrency=0)


def test_a_read_over_several_blocks_asks_for_them_together(shards):
    root, names = shards
    path = root / names[0]
    with RangeServer(str(root), latency=LATENCY) as server:
        source = RemoteObject(f"{server.url}/{names[0]}", block_size=4096)
        source.length  # the size first (a HEAD), alone
        server.most_in_flight = 0
        data = source.read(1000, 6 * 4096)
        assert server.most_in_flight == 7  # the blocks 0..6 at once
        with open(path, "rb") as file:
            assert data == file.read()[1000:1000 + 6 * 4096]
        before = sum(server.requests.values())
        assert source.read(5000, 100) == data[4000:4100]  # cached blocks: no request
        assert sum(server.requests.values()) == before


def test_failed_ranges_among_many_are_retried_and_a_missing_object_named(shards, tmp_path):
    root, names = shards
    with RangeServer(str(root), stall_seconds=10.0) as server:
        client = RemoteClient(timeout=1.0, retries=2, backoff=0.01)
        url = f"{server.url}/{names[1]}"
        # One range meets a 503, one a reset, one a stall past the timeout: all asked again.
        server.faults[names[1]] += [503, "reset", "stall"]
        spans = [(url, start, start + 700) for start in range(0, 7000, 1000)]
        with open(root / names[1], "rb") as file:
            whole = file.read()
        assert client.fetch(spans) == [whole[s:e] for _, s, e in spans]
        assert not server.faults[names[1]]
        with pytest.raises(FileNotFoundError, match="gone.tar"):
            client.fetch(spans + [(f"{server.url}/gone.tar", 0, 10)])
        server.faults[names[1]] += [503] * 20
        with pytest.raises(OSError, match=f"{names[1]}.*failed 3 times"):
            client.fetch(spans)


def test_a_parquet_batch_reads_its_row_groups_together(tmp_path):
    pa = require("pyarrow")
    import pyarrow.parquet as pq

    from fastload.sources import ParquetDataset

    root = tmp_path / "tables"
    root.mkdir()
    # Ten row groups of about 1 MiB each: more than the block cache's read-ahead holds.
    vectors = np.random.default_rng(0).standard_normal((20_000, 64), dtype=np.float32)
    table = pa.table({"label": pa.array(np.arange(20_000)),
                      "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), 64)})
    pq.write_table(table, str(root / "t.parquet"), row_group_size=2_000)
    with RangeServer(str(root)) as server:
        remote = ParquetDataset(f"{server.url}/t.parquet", cached_row_groups=8)
        local = ParquetDataset(str(root / "t.parquet"))
        server.latency, server.most_in_flight = LATENCY, 0
        rows = np.array([2_003, 6_025, 10_047, 14_069, 16_071], dtype=np.int64)  # 5 groups
        batch = next(iter(fl.DataLoader(remote, batch_sampler=[rows.tolist()])))
        assert server.most_in_flight >= 4
        expected = next(iter(fl.DataLoader(local, batch_sampler=[rows.tolist()])))
        for key in expected:
            np.testing.assert_array_equal(batch[key], expected[key], err_msg=key)


def test_a_stream_yields_in_order_retrying_what_failed(shards):
    root, names = shards
    with RangeServer(str(root), stall_seconds=10.0) as server:
        client = RemoteClient(timeout=1.0, retries=2, backoff=0.01, max_concurrency=4)
        url = f"{server.url}/{names[2]}"
        with open(root / names[2], "rb") as file:
            whole = file.read()
        spans = [(url, start, start + 900) for start in range(9000, 0, -1000)]  # last first
        server.latency = LATENCY
        arriving = client.stream(spans)
        assert next(arriving) == whole[9000:9900]
        assert server.most_in_flight == 4  # the first came with three others, at most four
        arriving.close()  # the rest cancelled
        server.latency = 0
        server.faults[names[2]] += [503, "stall", "reset"]
        assert list(client.stream(spans)) == [whole[s:e] for _, s, e in spans]
        assert not server.faults[names[2]]
        with pytest.raises(FileNotFoundError, match="gone.tar"):
            list(client.stream(spans[:2] + [(f"{server.url}/gone.tar", 0, 10)]))
