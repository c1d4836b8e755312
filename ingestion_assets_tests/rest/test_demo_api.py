"""The demo API itself: its admin endpoints, filters and errors, its data folder, and running it as a process."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from ingestion_assets.demo.api_server import DemoApi
from ingestion_assets_tests.rest.conftest import StartApi

ADMIN = {"Authorization": "Bearer demo-admin-token"}


def bearer(api: DemoApi) -> dict[str, str]:
    form = {"grant_type": "client_credentials", "client_id": "demo-client", "client_secret": "demo-client-secret"}
    token = httpx.post(f"{api.url}/oauth/token", data=form).json()["access_token"]  # client id and secret in the form
    return {"Authorization": f"Bearer {token}"}


def test_admin_endpoints_change_data_and_show_the_request_log(api: DemoApi) -> None:
    with httpx.Client(base_url=api.url) as http:
        assert http.post("/admin/mutate", json={"resource": "orders", "updates": 3}).status_code == 401
        stamp = http.post("/admin/mutate", json={"resource": "orders", "inserts": 2, "updates": 3}, headers=ADMIN)
        changed = [r for r in api.records("orders") if r["updated_at"] == stamp.json()["updated_at"]]
        assert len(changed) == 5 and {138, 139} <= {r["id"] for r in changed}
        assert http.post("/admin/faults", json={"kind": "5xx", "count": 1}, headers=ADMIN).status_code == 200
        assert http.get("/v1/orders", headers=bearer(api)).status_code == 503
        log = http.get("/admin/requests", headers=ADMIN).json()["data"]
    assert [(e["method"], e["path"], e["status"]) for e in log[:4]] == [
        ("POST", "/admin/mutate", 401),
        ("POST", "/admin/mutate", 200),
        ("POST", "/admin/faults", 200),
        ("POST", "/oauth/token", 200),
    ]
    assert log[4]["client"] == "demo-client" and log[4]["status"] == 503


def test_updated_since_is_inclusive_and_errors_are_json(api: DemoApi) -> None:
    with httpx.Client(base_url=api.url, headers=bearer(api)) as http:
        since = "2024-01-01T00:00:18.123456+00:00"
        body = http.get("/v1/orders", params={"updated_since": since, "limit": 50}).json()
        assert body == {"data": api.records("orders")[-11:], "next_cursor": None}  # ids 127..137 from 00:00:18
        assert body["data"][0]["number"] == "00000127" and body["data"][0]["items"][0]["sku"].startswith("SKU-")
        naive = http.get("/v1/orders", params={"updated_since": "2024-01-01T00:00:00"})
        assert naive.status_code == 400 and naive.json()["error"] == "invalid_request"
        assert http.get("/v1/orders", params={"cursor": "nonsense"}).json()["error"] == "invalid_cursor"
        missing = http.get("/v1/invoices")
        assert missing.status_code == 404 and missing.json()["error"] == "not_found"
    assert httpx.get(f"{api.url}/v1/orders").json()["error"] == "invalid_token"


def test_the_data_folder_keeps_records_across_restarts(start_api: StartApi, tmp_path: Path) -> None:
    first = start_api(data_dir=tmp_path)
    first.mutate("customers", inserts=3, updates=4)
    before = first.records("customers")
    first.stop()
    assert start_api(data_dir=tmp_path).records("customers") == before


def test_it_runs_as_a_process(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "ingestion_assets.demo.api_server",
        "--port",
        str(port),
        "--data-dir",
        str(tmp_path),
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                response = httpx.get(f"http://127.0.0.1:{port}/v1/orders", timeout=1)
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, "the demo API did not come up"
                time.sleep(0.1)
        assert response.status_code == 401 and response.json()["error"] == "invalid_token"
    finally:
        process.terminate()
        process.wait(timeout=10)
