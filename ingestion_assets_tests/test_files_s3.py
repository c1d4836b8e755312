"""Files source on S3 for real: moto's S3 server on a loopback port, read through s3fs (no mocked calls);
credentials by reference; drops over rounds, a rewrite in place (new etag), a corrupt object parked."""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ingestion_assets_tests.files_helpers import Drops, csv_text


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, Any]]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield {"endpoint_url": f"http://{host}:{port}", "key": "testing", "secret": "testing-secret"}
    finally:
        server.stop()


@pytest.fixture
def bucket(s3: dict[str, Any], tmp_path: Path) -> Iterator[tuple[Any, str]]:
    import s3fs

    fs = s3fs.S3FileSystem(key=s3["key"], secret=s3["secret"], client_kwargs={"endpoint_url": s3["endpoint_url"]})
    name = f"drops-{tmp_path.name.lower().replace('_', '-')[-40:]}".strip("-")
    fs.mkdir(name)
    try:
        yield fs, name
    finally:
        fs.rm(name, recursive=True)


def _rows(first: int, count: int, tag: str = "v1") -> list[tuple[Any, ...]]:
    return [(i, f"{tag}-{i}", round(i * 0.5, 2)) for i in range(first, first + count)]


def _parquet(rows: list[tuple[Any, ...]]) -> bytes:
    table = pa.table({"id": [r[0] for r in rows], "name": [r[1] for r in rows], "amount": [r[2] for r in rows]})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=40)
    return buffer.getvalue()


@pytest.mark.slow  # moto's server takes ~10 s to start here, the loads as long again
def test_drops_on_s3_load_incrementally_rewrites_merge_and_corrupt_objects_park(
    s3: dict[str, Any], bucket: tuple[Any, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs, name = bucket
    secret_file = tmp_path / "s3_secret"
    secret_file.write_text(s3["secret"])
    monkeypatch.setenv("FILES_TEST_S3_KEY", s3["key"])
    drops = Drops(
        tmp_path,
        url=f"s3://{name}/partner",
        storage_options={
            "key": {"env": "FILES_TEST_S3_KEY"},
            "secret": {"file": str(secret_file)},
            "endpoint_url": s3["endpoint_url"],
        },
    )
    drops.catalog(path="**/*.*", primary_key="id", files_per_slice=2)
    fs.pipe(f"{name}/partner/day1/a.csv.gz", gzip.compress(csv_text(_rows(1, 100)).encode()))
    fs.pipe(f"{name}/partner/day1/b.parquet", _parquet(_rows(101, 100)))
    fs.pipe(f"{name}/elsewhere/c.csv", csv_text(_rows(900, 5)).encode())  # outside the url's prefix
    assert drops.run().result.rows == 200
    assert drops.rows() == _rows(1, 200)

    fs.pipe(
        f"{name}/partner/day2/c.jsonl",
        "".join(f'{{"id": {i}, "name": "j-{i}", "amount": 1.5}}\n' for i in range(201, 211)),
    )
    fs.pipe(f"{name}/partner/day2/broken.parquet", b"PAR1 this is not parquet")
    changed = _rows(1, 100, tag="v2")
    fs.pipe(f"{name}/partner/day1/a.csv.gz", gzip.compress(csv_text(changed).encode()))  # rewritten: new etag
    outcome = drops.run()
    assert outcome.result.rows == 110
    expected = sorted(changed + _rows(101, 100) + [(i, f"j-{i}", 1.5) for i in range(201, 211)])
    assert drops.rows() == expected
    parked = dict(drops.dead_letters())
    assert list(parked) == ["day2/broken.parquet:file"]
    assert "not readable as Parquet" in parked["day2/broken.parquet:file"]
    checkpoint = drops.store.latest(None)
    assert checkpoint is not None and s3["secret"] not in str(checkpoint.position) + str(checkpoint.details)
    assert drops.run().result.rows == 0


@pytest.mark.slow  # moto's server takes ~10 s to start here
def test_a_bucket_that_does_not_exist_fails_the_run_and_check_and_an_empty_prefix_is_empty(
    s3: dict[str, Any], bucket: tuple[Any, str], tmp_path: Path
) -> None:
    """Found by the files attack: a wrong bucket listed as empty, and the run ended successfully with 0 rows."""
    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.checks import check_catalog
    from ingestion_assets.sources.files import MissingLocation

    fs, name = bucket
    options = {"key": s3["key"], "secret": {"env": "FILES_TEST_S3_SECRET"}, "endpoint_url": s3["endpoint_url"]}
    wrong = Drops(tmp_path / "wrong", url=f"s3://{name}-missing/partner", storage_options=options)
    wrong.catalog(path="**/*.csv", primary_key="id")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FILES_TEST_S3_SECRET", s3["secret"])
        with pytest.raises(MissingLocation) as failed:
            wrong.run()
        told = f"stream drops.orders: the bucket {name}-missing does not exist (url s3://{name}-missing/partner)"
        assert str(failed.value) == told
        problems = check_catalog(wrong.settings, load_catalog(wrong.root / "catalog.yaml"))
        assert len(problems) == 1 and problems[0].startswith(told)
        right = Drops(tmp_path / "right", url=f"s3://{name}/partner", storage_options=options)
        right.catalog(path="**/*.csv", primary_key="id")
        assert right.run().result.rows == 0  # the bucket is there, nothing dropped yet under the prefix
        assert check_catalog(right.settings, load_catalog(right.root / "catalog.yaml")) == []
        fs.pipe(f"{name}/partner/day1/a.csv", csv_text(_rows(1, 4)).encode())
        assert right.run().result.rows == 4
        assert right.rows() == _rows(1, 4)


def test_an_object_moved_to_a_new_key_keeps_the_version_of_its_first_read(
    s3: dict[str, Any], bucket: tuple[Any, str], tmp_path: Path
) -> None:
    """Found by the README-only attack: an object copied to a new key (and the original deleted) has a new modified
    time and the same etag; its rows won the version guard over a file read after the original, and id 2 went
    back from `paid` to `new`, no warning. Content already read under another name keeps that read's version."""
    fs, name = bucket
    options = {"key": s3["key"], "secret": s3["secret"], "endpoint_url": s3["endpoint_url"]}
    drops = Drops(tmp_path, url=f"s3://{name}/in", storage_options=options)
    drops.catalog(path="*.csv", primary_key="id")
    fs.pipe(f"{name}/in/o1.csv", b"id,name\n1,first\n2,new\n")
    drops.run()
    fs.pipe(f"{name}/in/o2.csv", b"id,name\n2,paid\n")
    drops.run()
    fs.copy(f"{name}/in/o1.csv", f"{name}/in/o9.csv")
    fs.rm(f"{name}/in/o1.csv")
    drops.run()
    assert drops.rows("id, name") == [(1, "first"), (2, "paid")]


@pytest.mark.slow  # moto's server takes ~10 s to start here
def test_two_uploads_in_one_second_sharing_a_key_are_named(
    s3: dict[str, Any], bucket: tuple[Any, str], tmp_path: Path
) -> None:
    """S3's LastModified has whole seconds: b.csv uploaded before a.csv in the same second is ordered after it by
    path, and its older value wins. The run cannot know the order, and says so."""
    fs, name = bucket
    options = {"key": s3["key"], "secret": s3["secret"], "endpoint_url": s3["endpoint_url"]}
    drops = Drops(tmp_path, url=f"s3://{name}/in", storage_options=options)
    drops.catalog(path="*.csv", primary_key="id")
    for _ in range(10):  # until both uploads land in one second (a pair may straddle a second's end)
        fs.pipe(f"{name}/in/b.csv", b"id,name\n1,uploaded-first\n")
        fs.pipe(f"{name}/in/a.csv", b"id,name\n1,uploaded-second\n")
        fs.invalidate_cache()
        if fs.info(f"{name}/in/a.csv")["LastModified"] == fs.info(f"{name}/in/b.csv")["LastModified"]:
            break
    outcome = drops.run()
    assert drops.rows("id, name") == [(1, "uploaded-first")]  # the path decided, as the warning says
    assert outcome.result.figures["files_same_modified_time_keys_examples"] == "a.csv and b.csv (key id=1)"
