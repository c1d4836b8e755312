"""Property-based tests: generated rows (good and bad values) and schema changes never lose or double a row;
the catalog loader turns any input into a Catalog or a CatalogError, nothing else."""

from __future__ import annotations

import datetime as dt
import itertools
import json
from decimal import Decimal
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingestion_assets.catalog import Catalog, CatalogError, load_catalog
from ingestion_assets_tests.helpers import StreamHarness, postgres_text

_COUNTER = itertools.count()

NAIVE_BOUNDS = {"min_value": dt.datetime(1, 1, 2), "max_value": dt.datetime(9999, 12, 30)}  # noqa: DTZ001 - hypothesis wants naive bounds
timestamps = st.one_of(
    st.datetimes(**NAIVE_BOUNDS, timezones=st.just(dt.UTC)).map(lambda d: d.isoformat()),
    st.sampled_from(["infinity", "-infinity", "0100-01-01 00:00:00+00 BC"]),
    st.none(),
)
amounts = st.one_of(
    st.decimals(min_value=Decimal("-99999999.99"), max_value=Decimal("99999999.99"), places=2, allow_nan=False).map(
        str
    ),
    st.just("NaN"),
    st.none(),
)
texts = st.one_of(st.text(max_size=30).map(lambda t: t.replace("\x00", "")), st.just("y" * 600), st.none())
rows = st.lists(st.tuples(timestamps, amounts, texts), min_size=1, max_size=40)
changes = st.sampled_from([None, "add", "widen", "drop"])


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(first=rows, second=rows, change=changes)
def test_every_row_is_loaded_or_parked_never_both_never_neither(
    harness: StreamHarness,
    first: list[tuple[str | None, ...]],
    second: list[tuple[str | None, ...]],
    change: str | None,
) -> None:
    table = f"gen_{next(_COUNTER)}"
    harness.source.execute(
        f"CREATE TABLE {table} (id int PRIMARY KEY, at timestamptz, amount numeric(10,2), note text, qty int,"
        " updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
    )
    _insert(harness, table, first, 0)
    harness.write_catalog(
        {
            table: {
                "table": table,
                "primary_key": "id",
                "cursor": "updated_at",
                "slice_rows": 7,
                "retries": {"max_attempts": 1},
                "dead_letters": {"max_value_bytes": 500, "max_share": 1.0},
            }
        }
    )
    harness.materialize()
    if change == "add":
        harness.source.execute(f"ALTER TABLE {table} ADD COLUMN extra text")  # NULL for the rows already read
    elif change == "widen":
        harness.source.execute(f"ALTER TABLE {table} ALTER COLUMN qty TYPE bigint")
    elif change == "drop":
        harness.source.execute(f"ALTER TABLE {table} DROP COLUMN note")
    _insert(harness, table, second, len(first))
    harness.materialize()

    keys = {str(r[0]) for r in harness.query_source(f"SELECT id FROM {table}")}
    loaded = {str(r[0]) for r in harness.query_target_if_exists(f'SELECT id FROM "{harness.source_name}"."{table}"')}
    parked = {
        str(r[0])
        for r in harness.query_target_if_exists(
            f"SELECT record_key FROM \"{harness.source_name}\"._ingest_dead_letter WHERE stream = '{table}'"
        )
    }
    assert not loaded & parked, "a row is both loaded and parked"
    assert loaded | parked == keys, "a row is neither loaded nor parked"
    if not loaded:
        return
    in_target = {str(r[0]) for r in harness.query_target(f'DESCRIBE "{harness.source_name}"."{table}"')}
    columns = [c for c in harness.source.columns(table) if c not in ("updated_at", "at") and c in in_target]
    ids = ", ".join(sorted(loaded))
    source = harness.source.rows(f"(SELECT {', '.join(columns)} FROM {table} WHERE id IN ({ids})) s", "id")
    target = harness.target_rows(table, columns, "id")
    assert target == source
    # timestamps as text: Python's datetime holds neither infinity nor BC, which now load as themselves
    at_source = harness.query_source(f"SELECT id, at::text FROM {table} WHERE id IN ({ids}) ORDER BY id")
    at_target = harness.query_target(f'SELECT id, "at"::VARCHAR FROM "{harness.source_name}"."{table}" ORDER BY id')
    assert [(k, postgres_text(v)) for k, v in at_target] == at_source


def _insert(harness: StreamHarness, table: str, values: list[tuple[str | None, ...]], offset: int) -> None:
    with harness.source.connect() as conn, conn.cursor() as cur:
        for index, (at, amount, note) in enumerate(values, start=offset + 1):
            cur.execute(
                f"INSERT INTO {table} (id, at, amount, qty) VALUES (%s, %s, %s, %s)",
                (index, at, amount, index * 1_000),
            )
            cur.execute(f"UPDATE {table} SET note = %s WHERE id = %s", (note, index)) if _has(
                cur, table, "note"
            ) else None
        conn.commit()


def _has(cur: object, table: str, column: str) -> bool:
    cur.execute(  # type: ignore[attr-defined]
        "SELECT 1 FROM information_schema.columns WHERE table_name = %s AND column_name = %s", (table, column)
    )
    return cur.fetchone() is not None  # type: ignore[attr-defined]


yaml_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=12)),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=25,
)
catalog_like = st.fixed_dictionaries(
    {"sources": st.dictionaries(st.sampled_from(["shop", "Bad-Name", "x"]), yaml_values, max_size=2)},
    optional={"destination": yaml_values},
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(document=st.one_of(yaml_values, catalog_like))
def test_any_yaml_document_is_a_catalog_or_a_catalog_error(tmp_path: Path, document: object) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(document))
    _load_cleanly(path)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=400))
def test_any_bytes_are_a_catalog_or_a_catalog_error(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "fuzz.yaml"
    path.write_bytes(raw)
    _load_cleanly(path)


def _load_cleanly(path: Path) -> None:
    try:
        assert isinstance(load_catalog(path), Catalog)
    except CatalogError as exc:
        assert str(path) in str(exc)
        json.dumps(exc.problems)  # the problems are plain text
