"""A page-numbered API stream whose listing shifts under a run (a record updated after its page was served moves
to the end): the record skipped at the page boundary is loaded by the next run, from the checkpoint's re-read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.rest.scripted import Answer, ScriptedApi, json_answer, write_scripted_catalog


def test_a_record_skipped_by_a_shifting_listing_is_loaded_by_the_next_run(
    harness: StreamHarness, scripted_api: Callable[..., ScriptedApi]
) -> None:
    # before: record 11 was never served, the checkpoint passed its cursor, and no later run read it (run ok)
    rows = [{"id": i, "updated_at": f"2024-05-01T00:00:{i:02d}Z", "name": f"m{i}"} for i in range(1, 31)]
    served = {"pages": 0}

    def listing(query: dict[str, str]) -> Answer:
        listed = sorted(rows, key=lambda r: (r["updated_at"], r["id"]))
        listed = [r for r in listed if r["updated_at"] >= query.get("updated_since", "")]
        size, page = int(query["per_page"]), int(query.get("page", "1"))
        answer = json_answer({"data": listed[(page - 1) * size : page * size]})
        served["pages"] += 1
        if served["pages"] == 1:  # after the first page of the first run: record 5 changes, moving to the end
            rows[4].update(updated_at="2024-05-01T00:01:00Z", name="m5 changed")
        return answer

    api = scripted_api(routes={"/items": listing})
    stream: dict[str, Any] = {
        "path": "/items",
        "primary_key": "id",
        "cursor": "updated_at",
        "cursor_param": "updated_since",
        "pagination": {"style": "page", "size_param": "per_page"},
        "page_size": 10,
        "retries": {"max_attempts": 1},
    }
    write_scripted_catalog(harness, api, "items", stream)
    query = f'SELECT id, updated_at, name FROM "{harness.source_name}".items ORDER BY id'
    harness.materialize()
    assert 11 not in [int(r[0]) for r in harness.query_target(query)]  # what the shift did to the first run
    harness.materialize()
    landed = [(int(i), at.strftime("%Y-%m-%dT%H:%M:%SZ"), name) for i, at, name in harness.query_target(query)]
    assert landed == [(r["id"], r["updated_at"], r["name"]) for r in rows]
