"""A file copied to another name (S3 copy: same size and etag) and one of the two deleted: the rows stay while a
listed file of the same content holds them (issue 17). Real S3 (moto's server on loopback), real DuckDB."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ingestion_assets.streams.runner import PartitionOutcome
from ingestion_assets_tests.files_helpers import Drops, target_of
from ingestion_assets_tests.test_files_s3 import bucket, s3  # noqa: F401  (the S3 fixtures)


def _drops(server: dict[str, Any], name: str, tmp_path: Path, deletes: str) -> Drops:
    options = {"key": server["key"], "secret": server["secret"], "endpoint_url": server["endpoint_url"]}
    drops = Drops(tmp_path, url=f"s3://{name}/in", storage_options=options)
    drops.catalog(path="*.csv", primary_key="id", deletes=deletes)
    return drops


def _copy_then_delete_the_copy(fs: Any, name: str, drops: Drops) -> PartitionOutcome:
    """a.csv (keys 1, 2) and b.csv (key 9) loaded; a.csv copied to c.csv (same size and etag) and loaded; c.csv
    deleted: the last run's outcome."""
    fs.pipe(f"{name}/in/a.csv", b"id,name\n1,a1\n2,a1\n")
    fs.pipe(f"{name}/in/b.csv", b"id,name\n9,b\n")
    drops.run()
    time.sleep(1.1)  # S3's modified times are whole seconds: the copy is later
    fs.copy(f"{name}/in/a.csv", f"{name}/in/c.csv")
    drops.run()
    fs.rm(f"{name}/in/c.csv")
    return drops.run()


@pytest.mark.parametrize("deletes", ["hard", "soft"])
def test_deleting_a_copy_keeps_the_rows_its_original_still_holds(
    s3: dict[str, Any],  # noqa: F811
    bucket: tuple[Any, str],  # noqa: F811
    tmp_path: Path,
    deletes: str,
) -> None:
    """Found by the files attack (s11): a.csv copied to c.csv (same size and etag) gave c.csv keys 1 and 2 (their
    `_ingest_file`); deleting c.csv then deleted keys 1 and 2 although a.csv, the same content, was still listed.
    The copy's rows move back to the listed file of its fingerprint, as a rename moves them."""
    fs, name = bucket
    drops = _drops(s3, name, tmp_path, deletes)
    outcome = _copy_then_delete_the_copy(fs, name, drops)
    live = "id, name, _ingest_file, _ingest_deleted_at IS NULL" if deletes == "soft" else "id, name, _ingest_file"
    alive = (True,) if deletes == "soft" else ()
    assert drops.rows(live) == [(1, "a1", "a.csv", *alive), (2, "a1", "a.csv", *alive), (9, "b", "b.csv", *alive)]
    assert outcome.result.figures["rows_retired"] == 0
    assert drops.run().result.rows == 0  # nothing is read again, nothing changes
    assert drops.rows("id, name, _ingest_file")[:2] == [(1, "a1", "a.csv"), (2, "a1", "a.csv")]


def test_a_copy_deleted_after_its_original_changed_retires_the_keys_only_the_copy_held(
    s3: dict[str, Any],  # noqa: F811
    bucket: tuple[Any, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """The rule is the fingerprint, not the name: once a.csv is rewritten (key 2 gone from it), the deleted copy's
    content is in no listed file, and the key only the copy still held is retired; so are the keys of a copy whose
    original is deleted in the same run."""
    fs, name = bucket
    drops = _drops(s3, name, tmp_path, "hard")
    fs.pipe(f"{name}/in/a.csv", b"id,name\n1,a1\n2,a1\n")
    drops.run()
    time.sleep(1.1)
    fs.copy(f"{name}/in/a.csv", f"{name}/in/c.csv")
    drops.run()
    time.sleep(1.1)
    fs.pipe(f"{name}/in/a.csv", b"id,name\n1,a2\n")  # rewritten: a new etag
    drops.run()
    fs.rm(f"{name}/in/c.csv")
    drops.run()
    assert drops.rows("id, name, _ingest_file") == [(1, "a2", "a.csv")]
    fs.pipe(f"{name}/in/d.csv", b"id,name\n5,d\n")
    drops.run()
    time.sleep(1.1)
    fs.copy(f"{name}/in/d.csv", f"{name}/in/e.csv")
    drops.run()
    fs.rm(f"{name}/in/d.csv")
    fs.rm(f"{name}/in/e.csv")
    drops.run()
    assert drops.rows("id, name, _ingest_file") == [(1, "a2", "a.csv")]


@pytest.mark.parametrize("table_format", ["delta", pytest.param("iceberg", marks=pytest.mark.slow)])
def test_deleting_a_copy_keeps_the_rows_in_a_lake(
    s3: dict[str, Any],  # noqa: F811
    bucket: tuple[Any, str],  # noqa: F811
    tmp_path: Path,
    table_format: str,
) -> None:
    """The same in a lake: the rows move through the table format (a Delta or Iceberg update), none is retired."""
    from ingestion_assets_tests.destination_targets import lake_rows

    fs, name = bucket
    drops = _drops(s3, name, tmp_path, "hard")
    lake = tmp_path / "lake"
    drops.use_destination({"type": "filesystem", "bucket_url": str(lake), "table_format": table_format})
    outcome = _copy_then_delete_the_copy(fs, name, drops)
    assert outcome.result.figures["rows_retired"] == 0
    rows = lake_rows(table_format, str(lake / "drops" / "orders"), ["id", "_ingest_file", "_ingest_deleted_at"], "id")
    assert rows == [(1, "a.csv", None), (2, "a.csv", None), (9, "b.csv", None)]
    assert drops.run().result.rows == 0


def test_deleting_a_copy_keeps_the_rows_in_postgres(
    s3: dict[str, Any],  # noqa: F811
    bucket: tuple[Any, str],  # noqa: F811
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """The same on the embedded PostgreSQL: the rows' `_ingest_file` is updated there, none is retired."""
    fs, name = bucket
    with target_of("postgres", tmp_path, request) as target:
        drops = _drops(s3, name, tmp_path, "soft")
        drops.use_destination({"type": "postgres", "credentials": {"file": str(tmp_path / "target_url")}})
        outcome = _copy_then_delete_the_copy(fs, name, drops)
        query = "SELECT id, name, _ingest_file, _ingest_deleted_at IS NULL FROM drops.orders ORDER BY id"
        assert target.query(query) == [(1, "a1", "a.csv", True), (2, "a1", "a.csv", True), (9, "b", "b.csv", True)]
        assert outcome.result.figures["files_deleted_content_still_listed"] == 1


def test_deleting_a_copy_older_than_the_lookback_window_keeps_the_rows(
    s3: dict[str, Any],  # noqa: F811
    bucket: tuple[Any, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """The copy's fingerprint must outlive the window: a file whose rows the target holds leaves the checkpoint once
    older than `lookback_seconds`, and the deleted copy's content was then unknown; a fingerprint another listed
    file shares stays."""
    fs, name = bucket
    drops = _drops(s3, name, tmp_path, "hard")
    drops.catalog(path="*.csv", primary_key="id", deletes="hard", lookback_seconds=1)
    fs.pipe(f"{name}/in/a.csv", b"id,name\n1,a1\n2,a1\n")
    drops.run()
    time.sleep(1.1)
    fs.copy(f"{name}/in/a.csv", f"{name}/in/c.csv")
    drops.run()
    time.sleep(2.1)
    fs.pipe(f"{name}/in/d.csv", b"id,name\n5,d\n")  # the window moves on past c.csv
    drops.run()
    fs.rm(f"{name}/in/c.csv")
    drops.run()
    assert drops.rows("id, name, _ingest_file") == [(1, "a1", "a.csv"), (2, "a1", "a.csv"), (5, "d", "d.csv")]
