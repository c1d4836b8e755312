"""Benchmark: an API stream under a request budget, against dlt's stock `rest_api` source on the same server.

The demo API runs in its own process on loopback (4,000 orders, cursor pages, OAuth 2, a server-side
token bucket that answers 429 beyond the allowed rate) with a fixed latency per request. For each
latency the benchmark runs, one after another in the same run:

- **asset**: the product's stream (`PartitionJob`: read, load into DuckDB by merge, checkpoint per slice)
  with the catalog's rate limit set to the server's;
- **coalesce**: the same with `max_pages_per_slice: 40`: a slice also takes the pages already waiting;
- **eager**: the same with `gather_seconds: 0`: a slice loads as soon as it is read, while the read goes on;
- **dlt**: stock dlt `rest_api_source` (cursor paginator, OAuth 2 client credentials, merge into DuckDB);
  it has no rate limiter of its own and relies on retrying 429s;
- **httpx**: the floor, latency-bound settings only: a bare httpx loop following the cursor with nothing
  else in its process. What a sequential read can reach on this machine and server at that moment.

The paths take turns, `--repeat` rounds, so that the machine's load falls on each alike. It reports
requests/s while reading (the server's own log, first to last request), as a share of
min(allowed rate, 1 / latency), the 429s, and records/s with no rate limit at all; then per path the
fastest and the median round, and the median's ratio to stock dlt's. Usage:

    .venv/bin/python bench/api_rate.py                       # 1 ms and 50 ms, 20 req/s allowed, 3 rounds
    .venv/bin/python bench/api_rate.py --latencies 0.05 --paths asset,dlt,httpx --repeat 5 --no-unlimited
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
WORK = Path(__file__).resolve().parent / ".work" / "api_rate"
sys.path.insert(0, str(ROOT))

from ingestion_assets.demo.api_server import DemoConfig  # noqa: E402

CONFIG = DemoConfig()


class _MemoryStore:
    """Checkpoints in memory: the benchmark measures reading and loading, not Dagster's storage."""

    def __init__(self) -> None:
        self.checkpoints: list[tuple[Any, dict[str, Any]]] = []

    def latest(self, partition: str | None) -> Any:
        return None

    def commit(self, partition: str | None, position: Any, **details: Any) -> None:
        self.checkpoints.append((position, details))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _serve(orders: int, latency: float, rate: float, burst: int) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    command = [sys.executable, "-m", "ingestion_assets.demo.api_server", "--port", str(port), "--orders", str(orders)]
    command += ["--latency", str(latency), "--rate", str(rate), "--burst", str(burst), "--token-ttl", "3600"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(f"{url}/v1/orders", timeout=1)
            return process, url
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("the demo API did not start")


def _requests(url: str) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {CONFIG.admin_token}"}
    log = httpx.get(f"{url}/admin/requests", headers=headers, timeout=30).json()["data"]
    return [e for e in log if e["path"] == "/v1/orders" and e["client"]]


def _run_asset(url: str, rate: float, burst: int, page_size: int, warehouse: Path, variant: str = "asset") -> int:
    import yaml

    from ingestion_assets.catalog import load_catalog
    from ingestion_assets.defs.assets import catalog_streams
    from ingestion_assets.settings import Settings
    from ingestion_assets.streams.runner import PartitionJob

    secrets = WORK / "secrets"
    secrets.mkdir(parents=True, exist_ok=True)
    (secrets / "id").write_text(CONFIG.client_id)
    (secrets / "secret").write_text(CONFIG.client_secret)
    auth = {"type": "oauth2_client_credentials", "token_url": "/oauth/token"}
    auth |= {"client_id": {"file": str(secrets / "id")}, "client_secret": {"file": str(secrets / "secret")}}
    stream = {"path": "/v1/orders", "primary_key": "id", "page_size": page_size, "pages_per_slice": 10}
    if variant == "coalesce":  # a slice also takes the pages waiting: fewer, larger loads
        stream["max_pages_per_slice"] = 40
    if variant == "eager":  # a slice loads as soon as it is read, while the read goes on (the former default)
        stream["gather_seconds"] = 0
    source = {"type": "rest", "base_url": url, "auth": auth, "streams": {"orders": stream}}
    source["rate_limit"] = {"requests_per_second": rate, "burst": burst}
    catalog = {"destination": {"type": "duckdb", "path": str(warehouse)}, "sources": {"bench": source}}
    path = WORK / "catalog.yaml"
    path.write_text(yaml.safe_dump(catalog))
    settings = Settings(home=WORK / "home", catalog_path=path)
    (api,) = catalog_streams(settings, load_catalog(path))
    outcome = PartitionJob(api, _MemoryStore()).run()  # type: ignore[arg-type]
    return outcome.result.rows


def _run_dlt(url: str, page_size: int, warehouse: Path) -> int:
    import dlt
    from dlt.sources.helpers.rest_client.auth import OAuth2ClientCredentials
    from dlt.sources.rest_api import rest_api_source

    auth = OAuth2ClientCredentials(
        access_token_url=f"{url}/oauth/token", client_id=CONFIG.client_id, client_secret=CONFIG.client_secret
    )
    paginator = {"type": "cursor", "cursor_path": "next_cursor", "cursor_param": "cursor"}
    endpoint = {"path": "/v1/orders", "params": {"limit": page_size}, "data_selector": "data"}
    source = rest_api_source(
        {
            "client": {"base_url": url, "auth": auth, "paginator": paginator},  # type: ignore[typeddict-item]
            "resource_defaults": {"primary_key": "id", "write_disposition": "merge"},
            "resources": [{"name": "orders", "endpoint": endpoint}],  # type: ignore[list-item]
        }
    )
    pipeline = dlt.pipeline(
        pipeline_name="bench_dlt_rest",
        pipelines_dir=str(WORK / "dlt"),
        destination=dlt.destinations.duckdb(str(warehouse)),
    )
    info = pipeline.run(source, dataset_name="bench")
    info.raise_on_failed_jobs()
    return int(pipeline.last_trace.last_normalize_info.row_counts.get("orders", 0))


def _run_bare(url: str, page_size: int) -> int:
    """The floor: a bare httpx loop following the cursor, nothing else in its process (no checks, no loading)."""
    with httpx.Client(base_url=url, timeout=30) as http:
        form = {"grant_type": "client_credentials"}
        token = http.post("/oauth/token", data=form, auth=(CONFIG.client_id, CONFIG.client_secret)).json()
        headers = {"Authorization": f"Bearer {token['access_token']}"}
        rows, cursor = 0, None
        while True:
            params: dict[str, Any] = {"limit": page_size} | ({"cursor": cursor} if cursor else {})
            response = http.get("/v1/orders", params=params, headers=headers)
            if response.status_code == 429:  # only without a limit of ours: wait as asked
                time.sleep(float(response.headers.get("Retry-After", "1")))
                continue
            body = response.json()
            rows, cursor = rows + len(body["data"]), body["next_cursor"]
            if not cursor:
                return rows


def _measure(path: str, latency: float, rate: float, burst: int, orders: int, page_size: int) -> dict[str, Any]:
    """One path against a fresh server; `rate` 0: no limit on either side."""
    server_rate, client_rate = (rate, rate) if rate else (1e6, 1e6)
    process, url = _serve(orders, latency, server_rate, max(burst, 1) if rate else 10**6)
    warehouse = WORK / f"{path}.duckdb"
    shutil.rmtree(WORK / "home", ignore_errors=True)
    shutil.rmtree(WORK / "dlt", ignore_errors=True)
    warehouse.unlink(missing_ok=True)
    try:
        began = time.monotonic()
        if path == "dlt":
            rows = _run_dlt(url, page_size, warehouse)
        elif path == "httpx":
            rows = _run_bare(url, page_size)
        else:
            rows = _run_asset(url, client_rate, burst or 1000, page_size, warehouse, variant=path)
        seconds = time.monotonic() - began
        log = _requests(url)
    finally:
        process.terminate()
        process.wait()
    times = sorted(e["at"] for e in log)
    log.sort(key=lambda e: e["received"])
    # Where a gap goes: the server's own time (request received to answer written, the latency and its
    # wake-up), and the client's (answer written to the next request received: reading the answer, the
    # client's work, sending the next request).
    server = sorted(e["answered"] - e["received"] for e in log if "answered" in e) or [0.0]
    client = sorted(b["received"] - a["answered"] for a, b in itertools.pairwise(log) if "answered" in a) or [0.0]
    span = max(times) - min(times) if len(times) > 1 else 0.0
    gaps = sorted(b - a for a, b in itertools.pairwise(times)) or [0.0]
    achieved = (len(times) - 1) / span if span else 0.0
    ceiling = min(rate, 1 / latency) if rate else 1 / latency
    return {
        "path": path,
        "latency_ms": latency * 1000,
        "allowed": rate or None,
        "requests": len(times),
        "429s": sum(1 for e in log if e["status"] == 429),
        "requests_per_s": achieved,
        "share": achieved / ceiling,
        "records": rows,
        "seconds": seconds,
        "records_per_s": rows / seconds if seconds else 0.0,
        "gap_ms_p50": gaps[len(gaps) // 2] * 1000,
        "gap_ms_p90": gaps[len(gaps) * 9 // 10] * 1000,
        "gap_ms_max": gaps[-1] * 1000,
        "server_ms_p50": server[len(server) // 2] * 1000,
        "server_ms_mean": statistics.mean(server) * 1000,
        "client_ms_p50": client[len(client) // 2] * 1000,
        "client_ms_mean": statistics.mean(client) * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latencies", default="0.001,0.05")
    parser.add_argument("--rate", type=float, default=20.0, help="requests/s the server allows (and we configure)")
    parser.add_argument("--burst", type=int, default=5)
    parser.add_argument("--orders", type=int, default=4000)
    parser.add_argument("--page-size", type=int, default=50)
    parser.add_argument("--paths", default="asset,coalesce,dlt,httpx")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; the paths take turns within each round")
    parser.add_argument("--unlimited", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    paths, lines = args.paths.split(","), []
    for latency in [float(x) for x in args.latencies.split(",")]:
        for _ in range(args.repeat):  # turns, so that the machine's load falls on every path alike
            for path in paths:
                if path == "httpx" and 1 / latency > args.rate:
                    continue  # the floor has no limiter: it measures latency-bound reading only
                lines.append(_measure(path, latency, args.rate, args.burst, args.orders, args.page_size))
                _print(lines[-1])
    if args.unlimited:  # records/s with no limit anywhere, 1 ms latency
        for _ in range(args.repeat):
            for path in (p for p in paths if p != "httpx"):
                lines.append(_measure(path, 0.001, 0.0, 0, args.orders, args.page_size))
                _print(lines[-1])
    (WORK / "results.json").write_text(json.dumps(lines, indent=2))
    _summarize(lines)


def _summarize(lines: list[dict[str, Any]]) -> None:
    """Per path and setting: fastest and median, and the median's ratio to stock dlt's in the same run."""
    groups: dict[tuple[float, float | None], dict[str, list[dict[str, Any]]]] = {}
    for line in lines:
        groups.setdefault((line["latency_ms"], line["allowed"]), {}).setdefault(line["path"], []).append(line)
    print("\nsummary (fastest / median of each path's rounds):")
    for (latency, allowed), by_path in groups.items():
        key, unit = ("share", "%") if allowed else ("records_per_s", " records/s")
        medians = {path: statistics.median(x[key] for x in runs) for path, runs in by_path.items()}
        for path, runs in by_path.items():
            values = [x[key] for x in runs]
            scale = 100 if allowed else 1
            ratio = f", median / dlt's {medians[path] / medians['dlt']:.2f}x" if "dlt" in medians else ""
            setting = f"{allowed:.0f} req/s allowed" if allowed else "no limit"
            print(
                f"  {path:<8} latency {latency:>3.0f} ms, {setting:<18}"
                f" {key}: fastest {max(values) * scale:,.1f}{unit}, median {medians[path] * scale:,.1f}{unit}{ratio};"
                f" 429s {sum(x['429s'] for x in runs)}; median of means: server"
                f" {statistics.median(x['server_ms_mean'] for x in runs):.1f} ms,"
                f" client {statistics.median(x['client_ms_mean'] for x in runs):.1f} ms a request"
            )


def _print(line: dict[str, Any]) -> None:
    allowed = f"{line['allowed']:.0f} req/s allowed" if line["allowed"] else "no limit"
    print(
        f"{line['path']:<8} latency {line['latency_ms']:>4.0f} ms, {allowed:<18} {line['requests']:>4} requests "
        f"{line['requests_per_s']:>7.1f} req/s = {line['share']:>6.1%} of min(allowed, 1/latency), "
        f"{line['429s']:>3} x 429, {line['records']:>5} records in {line['seconds']:>6.2f} s "
        f"= {line['records_per_s']:>7,.0f} records/s; gaps p50/p90/max {line['gap_ms_p50']:.0f}/"
        f"{line['gap_ms_p90']:.0f}/{line['gap_ms_max']:.0f} ms; server {line['server_ms_mean']:.1f} ms, "
        f"client {line['client_ms_mean']:.1f} ms a request (mean)",
        flush=True,
    )


if __name__ == "__main__":
    main()
