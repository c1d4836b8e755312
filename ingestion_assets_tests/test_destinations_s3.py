"""The Delta destination on object storage for real: an S3 server (moto) on loopback, credentials by reference."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from ingestion_assets_tests.destination_targets import delta_rows, use_destination
from ingestion_assets_tests.helpers import StreamHarness, normalize

KEYS = {"aws_access_key_id": "testing-key", "aws_secret_access_key": "testing-secret", "region_name": "us-east-1"}


@pytest.fixture
def s3_endpoint(tmp_path: Path) -> Iterator[str]:
    """moto's S3 server in its own process: delta-rs holds the GIL while it waits on S3, so a server thread in
    this process could never answer it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = Path(sys.executable).parent / "moto_server"
    log = (tmp_path / "moto.log").open("wb")
    process = subprocess.Popen([str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(endpoint, process)
        yield endpoint
    finally:
        process.kill()  # a test server: nothing of it is kept
        process.wait(timeout=30)
        log.close()


def _wait_until_up(endpoint: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited with {process.returncode}")
        try:
            urllib.request.urlopen(endpoint, timeout=2).close()
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"moto_server did not answer on {endpoint}")


@pytest.mark.slow
@pytest.mark.parametrize("table_format", ["delta", "iceberg"])
def test_a_table_stream_merges_into_a_lake_on_s3(
    harness: StreamHarness, s3_endpoint: str, tmp_path: Path, table_format: str
) -> None:
    bucket = f"lake-{uuid.uuid4().hex[:8]}"
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, **KEYS)
    s3.create_bucket(Bucket=bucket)
    secret = tmp_path / "lake_credentials.json"
    secret.write_text(json.dumps({**KEYS, "endpoint_url": s3_endpoint}))
    harness.source.execute(
        "CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(10, 2), updated_at timestamptz NOT NULL);"
        "INSERT INTO items SELECT g, 'item ' || g, g * 1.5, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 s' "
        "FROM generate_series(1, 300) g"
    )
    harness.write_catalog({"items": {"table": "items", "primary_key": "id", "cursor": "updated_at", "slice_rows": 200}})
    destination: dict[str, Any] = {
        "type": "filesystem",
        "bucket_url": f"s3://{bucket}/lake",
        "credentials": {"file": str(secret)},
        "table_format": table_format,
    }
    use_destination(harness, destination)
    harness.materialize()
    harness.source.execute("UPDATE items SET name = 'renamed', updated_at = now() WHERE id % 50 = 0")
    harness.materialize()
    options = {
        "aws_access_key_id": KEYS["aws_access_key_id"],
        "aws_secret_access_key": KEYS["aws_secret_access_key"],
        "aws_region": KEYS["region_name"],
        "aws_endpoint_url": s3_endpoint,
        "aws_allow_http": "true",
    }
    url = f"s3://{bucket}/lake/{harness.source_name}/items"
    columns = ["id", "name", "price", "updated_at"]
    if table_format == "delta":
        assert delta_rows(url, columns, "id", options) == harness.source.rows("items", "id")
    else:
        assert _iceberg_rows(s3, s3_endpoint, bucket, url, columns) == harness.source.rows("items", "id")
    checkpoint = harness.checkpoint("items")
    assert checkpoint is not None
    assert checkpoint.details["target"]["where"] == f"{table_format}:s3://{bucket}/lake"
    assert "testing-secret" not in json.dumps(checkpoint.details)


def _iceberg_rows(s3: Any, endpoint: str, bucket: str, url: str, columns: list[str]) -> list[Any]:
    """The Iceberg table's rows at its newest metadata file, read by pyiceberg from the S3 server."""
    from pyiceberg.table import StaticTable

    prefix = url.removeprefix(f"s3://{bucket}/") + "/metadata/"
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
    newest = sorted(o["Key"] for o in listed if o["Key"].endswith(".metadata.json"))[-1]
    properties = {
        "s3.endpoint": endpoint,
        "s3.access-key-id": KEYS["aws_access_key_id"],
        "s3.secret-access-key": KEYS["aws_secret_access_key"],
        "s3.region": KEYS["region_name"],
    }
    table = StaticTable.from_metadata(f"s3://{bucket}/{newest}", properties).scan(selected_fields=tuple(columns))
    rows = sorted(table.to_arrow().to_pylist(), key=lambda row: row["id"])
    return [tuple(normalize(row[c]) for c in columns) for row in rows]
