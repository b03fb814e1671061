"""Tar shards, Parquet and Arrow files behind s3:// URLs, read through s3fs.

moto's S3 server (started here on 127.0.0.1, with dummy credentials given
only through ``storage_options``) stands in for S3: the same files read
remotely give exactly the samples they give read locally, and a missing
object or refused access raises the error naming the object (moto lets any
credentials in unless told, through its ``/moto-api/reset-auth``, to check
them).  No AWS host is contacted: the endpoint is the local server and
instance metadata is off.
"""

import os
import socket
import time

import pytest
from required import deferred, require_installed

wds = deferred("webdataset")
pa = deferred("pyarrow")
pq = deferred("pyarrow.parquet")
require_installed("s3fs")
moto_server = deferred("moto.server")
boto3 = deferred("boto3")

import fastload as fl  # noqa: E402
from arrow_tables import numeric_table  # noqa: E402
from fastload.sources import ArrowDataset, ParquetDataset, TarShards  # noqa: E402

pytestmark = [pytest.mark.timeout(120), pytest.mark.imports_heavy_library]

BUCKET = "fastload-test"
KEY, SECRET = "fastload-dummy-key", "fastload-dummy-secret"
START_DEADLINE = 30.0


def _wait_for_port(host, port, deadline):
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """``(endpoint, local root, shard names)``: moto on 127.0.0.1 holding the bucket's files."""
    patch = pytest.MonkeyPatch()
    # botocore asks the environment for a region and, failing credentials, the
    # instance metadata host: neither must reach out, and the caller's own AWS_*
    # settings must not leak into (or be taken from) the test.
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        patch.delenv(name)
    patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    patch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    patch.setenv("AWS_CONFIG_FILE", os.devnull)
    patch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        if not _wait_for_port(host, port, time.monotonic() + START_DEADLINE):
            raise RuntimeError(f"moto's S3 server did not listen on {host}:{port} "
                               f"within {START_DEADLINE} s")
        endpoint = f"http://{host}:{port}"
        root = _write_files(tmp_path_factory.mktemp("s3"))
        client = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY,
                              aws_secret_access_key=SECRET, region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        for name in sorted(os.listdir(root)):
            client.upload_file(str(root / name), BUCKET, name)
        yield endpoint, root
    finally:
        server.stop()
        patch.undo()


def _write_files(root):
    with wds.ShardWriter(str(root / "part-%02d.tar"), maxcount=7, verbose=0) as sink:
        for i in range(20):
            sink.write({"__key__": f"k{i:03d}", "cls": str(i), "bin": os.urandom(700 + i)})
    table = numeric_table(40)
    pq.write_table(table, str(root / "t.parquet"), row_group_size=9)
    with pa.OSFile(str(root / "t.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
        w.write_table(table, max_chunksize=11)
    return root


def _options(endpoint, key=KEY, secret=SECRET):
    return {"key": key, "secret": secret, "client_kwargs": {"endpoint_url": endpoint}}


def _shards(root):
    return sorted(name for name in os.listdir(root) if name.endswith(".tar"))


@pytest.mark.parametrize("workers", [0, 2])
def test_shards_in_s3_are_the_local_shards(s3, tmp_path, workers):
    endpoint, root = s3
    names = _shards(root)
    assert len(names) == 3
    local = TarShards([str(root / name) for name in names])
    remote = TarShards([f"s3://{BUCKET}/{name}" for name in names], index_dir=str(tmp_path),
                       storage_options=_options(endpoint))
    assert remote._sources[0].identity() is not None  # the ETag keys the kept index
    assert len(remote) == len(local) == 20
    for i in range(len(local)):
        ours, theirs = remote[i], local[i]
        assert ours.keys() == theirs.keys() and ours["__key__"] == theirs["__key__"]
        assert ours["cls"] == theirs["cls"] and ours["bin"] == theirs["bin"]
    loader = fl.DataLoader(remote, batch_size=3, shuffle=True, generator=4, num_workers=workers,
                           timeout=60 if workers else 0)
    expected = fl.DataLoader(local, batch_size=3, shuffle=True, generator=4)
    for ours, theirs in zip(loader, expected, strict=True):
        assert ours["__key__"] == theirs["__key__"] and ours["bin"] == theirs["bin"]
        assert (ours["cls"] == theirs["cls"]).all()
    local.close()


@pytest.mark.parametrize("kind", ["parquet", "arrow"])
def test_tables_in_s3_are_the_local_tables(s3, kind):
    endpoint, root = s3
    make = {"parquet": ParquetDataset, "arrow": ArrowDataset}[kind]
    remote = make(f"s3://{BUCKET}/t.{kind}", storage_options=_options(endpoint))
    local = make(str(root / f"t.{kind}"))
    assert len(remote) == len(local) == 40
    batches = fl.DataLoader(remote, batch_size=8, shuffle=True, generator=3)
    expected = fl.DataLoader(local, batch_size=8, shuffle=True, generator=3)
    for ours, theirs in zip(batches, expected, strict=True):
        assert ours.keys() == theirs.keys()
        for key in theirs:
            assert (ours[key] == theirs[key]).all(), key


def test_missing_objects_are_named(s3):
    endpoint, _ = s3
    options = _options(endpoint)
    with pytest.raises(FileNotFoundError, match=f"s3://{BUCKET}/missing.tar"):
        TarShards([f"s3://{BUCKET}/missing.tar"], storage_options=options)
    with pytest.raises(FileNotFoundError, match=f"s3://{BUCKET}/gone.parquet"):
        ParquetDataset(f"s3://{BUCKET}/gone.parquet", storage_options=options)
    with pytest.raises(FileNotFoundError, match=f"s3://{BUCKET}/gone.arrow"):
        ArrowDataset(f"s3://{BUCKET}/gone.arrow", storage_options=options)


@pytest.fixture
def enforced_auth(s3):
    """moto checking every request's credentials against its IAM (it lets all in by default)."""
    import urllib.request

    endpoint, _ = s3

    def reset(count):
        request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", data=count.encode(),
                                         headers={"Content-Type": "text/plain"}, method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200

    reset("0")
    try:
        yield endpoint
    finally:
        reset("inf")


def test_refused_credentials_are_named(s3, enforced_auth):
    endpoint, _ = s3
    options = _options(endpoint, key="not-a-key", secret="not-a-secret")
    opens = {"part-00.tar": lambda url: TarShards([url], storage_options=options),
             "t.parquet": lambda url: ParquetDataset(url, storage_options=options),
             "t.arrow": lambda url: ArrowDataset(url, storage_options=options)}
    for name, open_it in opens.items():
        url = f"s3://{BUCKET}/{name}"
        with pytest.raises(PermissionError, match=url):
            open_it(url)
