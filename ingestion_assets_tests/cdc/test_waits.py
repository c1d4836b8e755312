"""What a copy waiting at the source says of the transactions it waits for (no server needed)."""

from __future__ import annotations

import datetime as dt

from ingestion_assets.sources.postgres.cdc.waits import SHOWN, describe_open

NOW = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def test_each_open_transaction_is_named_with_what_the_role_may_see() -> None:
    opened = NOW - dt.timedelta(minutes=3, seconds=12, microseconds=5)
    rows = [
        (41, "900", "billing", "idle in transaction", opened, opened + dt.timedelta(seconds=2)),
        (42, "901", None, None, None, None),  # another role's session, without pg_read_all_stats
    ]
    said = describe_open(rows, NOW)
    assert said.startswith("waiting for 2 transaction(s) open at the source to end: ")
    assert "pid 41 (xid 900, application 'billing', idle in transaction, transaction open 0:03:12, " in said
    assert "last query started 2026-01-02 03:00:54 UTC)" in said
    assert "pid 42 (xid 901; its times are hidden from this role: grant it pg_read_all_stats)" in said
    many = describe_open([(p, str(p), "", "active", NOW, NOW) for p in range(SHOWN + 3)], NOW)
    assert many.count("pid ") == SHOWN and " and 3 more." in many
    assert "shows none open now" in describe_open([], NOW)
