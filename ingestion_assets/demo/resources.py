"""The demo API's data: seeded records, the changes tests and the demo make to them, and listing pages."""

from __future__ import annotations

import base64
import binascii
import bisect
import copy
import json
import random
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

if TYPE_CHECKING:
    from ingestion_assets.demo.api_server import DemoConfig


class Reply(Exception):
    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status, self.body, self.headers = status, body, headers or {}


def error_reply(status: int, code: str, description: str, headers: dict[str, str] | None = None) -> Reply:
    return Reply(status, {"error": code, "error_description": description}, headers)


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _record(resource: str, rng: random.Random, rid: int, stamp: str) -> dict[str, Any]:
    if resource == "customers":
        address = {"city": rng.choice(["Berlin", "Lyon", "Boston"]), "zip": f"{rng.randrange(100000):05d}"}
        return {
            "id": rid,
            "name": f"Customer {rid}",
            "email": None if rid % 5 == 0 else f"c{rid}@example.com",
            "tags": rng.sample(["vip", "b2b", "new", "eu"], rng.randint(0, 2)),
            "address": address,
            "updated_at": stamp,
        }
    items = [
        {
            "sku": f"SKU-{rng.randrange(1000):04d}",
            "qty": rng.randint(1, 5),
            "price": f"{rng.randrange(100, 9999) / 100:.2f}",
        }
        for _ in range(rng.randint(1, 3))
    ]
    customer = rng.randint(1, 50)
    return {
        "id": rid,
        "number": f"{rid:08d}",
        "status": rng.choice(["new", "paid", "shipped"]),
        "items": items,
        "customer": {"id": customer, "name": f"Customer {customer}"},
        "note": None if rid % 3 else "ring twice",
        "updated_at": stamp,
    }


def _cursor_key(text: str | None) -> tuple[str, int] | None:
    if not text:
        return None
    try:
        stamp, rid = json.loads(base64.urlsafe_b64decode(text.encode()))
        return str(stamp), int(rid)
    except (ValueError, TypeError, binascii.Error) as exc:
        raise error_reply(400, "invalid_cursor", "the cursor is not one this API issued") from exc


def _since(text: str | None) -> str | None:
    try:
        moment = datetime.fromisoformat(text) if text else None
    except ValueError as exc:
        raise error_reply(400, "invalid_request", "updated_since must be an ISO 8601 timestamp") from exc
    if moment is not None and moment.tzinfo is None:
        raise error_reply(400, "invalid_request", "updated_since needs a time zone")
    return None if moment is None else _stamp(moment)


def _number(query: dict[str, str], name: str, default: int, low: int, high: int) -> int:
    try:
        return max(low, min(high, int(query.get(name, default))))
    except ValueError as exc:
        raise error_reply(400, "invalid_request", f"{name} must be an integer") from exc


class Resources:
    """Records by resource and id; every change bumps a version, so the sorted order is kept until then."""

    def __init__(self, config: DemoConfig, data_dir: Path | None, rng: random.Random) -> None:
        self._config, self._rng = config, rng
        self._lock = threading.Lock()
        self._file = data_dir / "demo_api.json" if data_dir else None
        self._rows = self._load() if self._file and self._file.exists() else self._seed()
        self._version = 0  # bumped by every change: the cached order below is then stale
        self._order: dict[str, tuple[Any, list[dict[str, Any]]]] = {}

    def _seed(self) -> dict[str, dict[int, dict[str, Any]]]:
        rng, base = random.Random(self._config.seed), datetime(2024, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
        rows: dict[str, dict[int, dict[str, Any]]] = {}
        for name, count in (("customers", self._config.customers), ("orders", self._config.orders)):
            stamps = [_stamp(base + timedelta(seconds=i // self._config.tie_group)) for i in range(count)]
            rows[name] = {i + 1: _record(name, rng, i + 1, stamp) for i, stamp in enumerate(stamps)}
        return rows

    def _load(self) -> dict[str, dict[int, dict[str, Any]]]:
        assert self._file is not None
        return {name: {int(k): v for k, v in rows.items()} for name, rows in json.loads(self._file.read_text()).items()}

    def mutate(self, resource: str, inserts: int = 0, updates: int = 0) -> str:
        """Insert and update records, all stamped with one new `updated_at` (ties on purpose); returns it."""
        with self._lock:
            rows = self._rows[resource]
            stamp = max([_stamp(datetime.now(UTC)), *(r["updated_at"] for r in rows.values())])
            changed = self._rng.sample(sorted(rows), min(updates, len(rows)))
            changed += range(max(rows, default=0) + 1, max(rows, default=0) + 1 + inserts)
            rows.update({rid: _record(resource, self._rng, rid, stamp) for rid in changed})
            self._version += 1
            if self._file:
                self._file.write_text(json.dumps(self._rows))
        return stamp

    def delete(self, resource: str, count: int, mark: bool) -> list[int]:
        """Delete `count` random records; returns their ids. `mark`: they stay as tombstones `{id, deleted: true,
        updated_at}` with a new timestamp (an API with a deletion flag); else they vanish from every listing."""
        with self._lock:
            rows = self._rows[resource]
            live = sorted(rid for rid, r in rows.items() if not r.get("deleted"))
            gone = self._rng.sample(live, min(count, len(live)))
            stamp = max([_stamp(datetime.now(UTC)), *(r["updated_at"] for r in rows.values())])
            self._version += 1
            for rid in gone:
                if mark:
                    rows[rid] = {"id": rid, "deleted": True, "updated_at": stamp}
                else:
                    del rows[rid]
        return sorted(gone)

    def patch(self, resource: str, count: int, fields: dict[str, Any]) -> list[int]:
        """Set `fields` on `count` random live records (a new field, another type), as a changed API would;
        they get a new `updated_at`. Returns their ids."""
        with self._lock:
            rows = self._rows[resource]
            chosen = self._rng.sample(sorted(k for k, r in rows.items() if not r.get("deleted")), count)
            stamp = max([_stamp(datetime.now(UTC)), *(r["updated_at"] for r in rows.values())])
            for rid in chosen:
                rows[rid] = {**rows[rid], **copy.deepcopy(fields), "updated_at": stamp}
            self._version += 1
        return sorted(chosen)

    def put(self, resource: str, records: list[dict[str, Any]]) -> None:
        """Add or replace records as given (their `id` and every field, Decimal numbers served with their digits),
        all stamped with one new `updated_at`."""
        with self._lock:
            rows = self._rows[resource]
            stamp = max([_stamp(datetime.now(UTC)), *(r["updated_at"] for r in rows.values())])
            rows.update({record["id"]: {**copy.deepcopy(record), "updated_at": stamp} for record in records})
            self._version += 1

    def records(self, resource: str, since: str | None = None) -> list[dict[str, Any]]:
        """The resource's records in (updated_at, id) order, from `since` (inclusive) on."""
        with self._lock:
            return copy.deepcopy(self._sorted(resource, since))

    def _sorted(self, resource: str, since: str | None) -> list[dict[str, Any]]:
        """Under the lock; not copied: the caller copies what it hands out. The order is kept until the next
        change, so a page costs a bisection rather than a sort (a benchmark's server must not be the limit)."""
        key = (resource, len(self._rows[resource]), self._version)
        if self._order.get(resource, (None, []))[0] != key:
            rows = sorted(self._rows[resource].values(), key=lambda r: (r["updated_at"], r["id"]))
            self._order[resource] = (key, rows)
        rows = self._order[resource][1]
        if since is None:
            return rows
        return rows[bisect.bisect_left(rows, since, key=lambda r: r["updated_at"]) :]

    def listing(
        self,
        path: str,
        resource: str,
        query: dict[str, str],
        url: str,
        repeat_cursor: bool,
        newest_first: bool = False,
        exclusive_since: bool = False,
    ) -> Reply:
        """One page of GET /v1/<resource> (or /v1/<resource>/ids): cursor, link, page or offset pagination;
        `newest_first` lists in descending (updated_at, id) order, `exclusive_since` filters updated_since `>`."""
        keys_only = resource.endswith("/ids")  # GET /v1/<resource>/ids: a key listing, larger pages
        resource = resource.removesuffix("/ids")
        size = _number(query, "per_page" if "page" in query else "limit", 50, 1, 5000 if keys_only else 500)
        size = min(size, self._config.page_cap or size)
        since, after = _since(query.get("updated_since")), _cursor_key(query.get("cursor"))
        with self._lock:
            ordered = self._sorted(resource, since)
            if exclusive_since and since is not None:
                ordered = [r for r in ordered if r["updated_at"] > since]
            if newest_first:
                ordered = ordered[::-1]
            if "page" in query:
                start = (_number(query, "page", 1, 1, 1_000_000) - 1) * size
            elif "offset" in query:
                start = _number(query, "offset", 0, 0, 1_000_000_000)
            elif newest_first and after:
                start = next((i for i, r in enumerate(ordered) if (r["updated_at"], r["id"]) < after), len(ordered))
            else:
                start = bisect.bisect_right(ordered, after, key=lambda r: (r["updated_at"], r["id"])) if after else 0
            rows = copy.deepcopy(ordered[start : start + size + 1])
        last = rows[size - 1] if len(rows) > size else None
        if keys_only:
            rows = [{"id": r["id"]} | ({"deleted": True} if r.get("deleted") else {}) for r in rows]
        if "page" in query:
            page = _number(query, "page", 1, 1, 1_000_000)
            if page > 1 and not rows and self._config.page_past_end == "404":
                raise error_reply(404, "not_found", "Invalid page.")
            return Reply(200, {"data": rows[:size], "page": page, "per_page": size, "total": len(ordered)})
        if "offset" in query:
            return Reply(200, {"data": rows[:size], "offset": start, "limit": size, "total": len(ordered)})
        token = (
            base64.urlsafe_b64encode(json.dumps([last["updated_at"], last["id"]]).encode()).decode() if last else None
        )
        if token and repeat_cursor and query.get("cursor"):
            token = query["cursor"]
        link = {"Link": f'<{url}{path}?{urlencode({**query, "cursor": token})}>; rel="next"'} if token else {}
        return Reply(200, {"data": rows[:size], "next_cursor": token}, link)
