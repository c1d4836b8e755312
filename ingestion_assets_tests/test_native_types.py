"""Values the destination can hold arrive as values of its own types, compared value by value with what the
source holds: real as FLOAT, ±infinity and BC timestamps, intervals, uuids, arrays as LISTs; PostgreSQL's
exact text where DuckDB has no type, which PostgreSQL reads back to the identical value."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest

from ingestion_assets.catalog import Destination, Reference
from ingestion_assets.loading.metadata_columns import with_metadata
from ingestion_assets.loading.pipeline import Loader, TargetTable
from ingestion_assets.sources.postgres import temporal
from ingestion_assets_tests.helpers import StreamHarness, postgres_text


def _load(harness: StreamHarness, table: str, ddl: str, **stream: Any) -> None:
    harness.source.execute(ddl)
    harness.write_catalog({table: {"table": table, "primary_key": "id", "slice_rows": 3, **stream}})
    harness.materialize()


def _target_types(harness: StreamHarness, table: str) -> dict[str, str]:
    rows = harness.query_target(
        "SELECT column_name, data_type FROM information_schema.columns "
        f"WHERE table_schema = '{harness.source_name}' AND table_name = '{table}'"
    )
    return {str(name): str(kind) for name, kind in rows}


def _target_texts(harness: StreamHarness, table: str, column: str) -> dict[int, str | None]:
    rows = harness.query_target(f'SELECT id, "{column}"::VARCHAR FROM "{harness.source_name}"."{table}"')
    return {int(key): postgres_text(text) for key, text in rows}


def _reads_back(harness: StreamHarness, table: str, column: str, sql_type: str) -> None:
    """Every target value, given to PostgreSQL as text of `sql_type`, is the source's value (compared as
    PostgreSQL prints both, which tells apart what `=` would not: -0 and 0, 1 mon and 30 days)."""
    texts = _target_texts(harness, table, column)
    source = dict(harness.query_source(f"SELECT id, {column}::text FROM {table}"))
    assert sorted(texts) == sorted(source), f"{column}: rows differ"
    for key, text in texts.items():
        back = harness.query_source(f"SELECT (%s::{sql_type})::text".replace("%s", _quoted(text)))[0][0]
        assert back == source[key], (
            f"{column} of row {key}: target {text!r} reads back as {back!r}, not {source[key]!r}"
        )


def _quoted(text: str | None) -> str:
    return "NULL" if text is None else "'" + text.replace("'", "''") + "'"


def _dead_letters(harness: StreamHarness) -> dict[str, str]:
    rows = harness.query_target_if_exists(
        f'SELECT record_key, error FROM "{harness.source_name}"._ingest_dead_letter ORDER BY record_key'
    )
    return {str(key): str(error) for key, error in rows}


REALS = """
CREATE TABLE reals (id int PRIMARY KEY, r real, updated_at timestamptz NOT NULL DEFAULT now());
INSERT INTO reals (id, r) VALUES (1, 3.4e38), (2, 1.17549435e-38), (3, '-0'), (4, 'NaN'), (5, 'Infinity'),
    (6, '-Infinity'), (7, 1e-45), (8, 0.1), (9, -3.4028235e38), (10, NULL);
"""


def test_real_lands_as_a_32_bit_float(harness_on_any: StreamHarness) -> None:
    _load(harness_on_any, "reals", REALS, cursor="updated_at")
    assert _target_types(harness_on_any, "reals")["r"] == "FLOAT"
    _reads_back(harness_on_any, "reals", "r", "real")


TEMPORALS = """
CREATE TABLE moments (id int PRIMARY KEY, at timestamptz, local timestamp, day date, clock time, until timestamptz);
INSERT INTO moments VALUES
 (1, 'infinity', 'infinity', 'infinity', '24:00:00', '2024-01-01 00:00:00+00'),
 (2, '-infinity', '-infinity', '-infinity', '00:00:00', '2024-01-02 00:00:00+00'),
 (3, '0044-03-15 10:00:00.5+00 BC', '4713-11-24 00:00:00 BC', '4713-11-24 BC', '23:59:59.999999', 'infinity'),
 (4, '12345-06-07 08:09:10.123456+00', '294246-12-31 23:59:59.999999', '5874897-12-31', NULL, 'infinity'),
 (5, '2024-02-29 23:59:59.999999+00', '0001-01-01 00:00:00', '0001-01-01', '12:00:00', '-infinity'),
 (6, NULL, NULL, NULL, NULL, NULL);
"""


def test_infinite_bc_and_far_timestamps_and_dates_arrive_as_values(harness_on_any: StreamHarness) -> None:
    _load(harness_on_any, "moments", TEMPORALS, cursor="until")
    assert _dead_letters(harness_on_any) == {}
    for column, sql_type in [("at", "timestamptz"), ("local", "timestamp"), ("day", "date"), ("clock", "time")]:
        _reads_back(harness_on_any, "moments", column, sql_type)
    checkpoint = harness_on_any.checkpoint("moments")
    assert checkpoint is not None and checkpoint.position == {"until": "infinity", "id": "4"}

    # the checkpoint at infinity: a row at it with a higher key still arrives
    harness_on_any.source.execute("INSERT INTO moments (id, at, until) VALUES (7, 'infinity', 'infinity')")
    harness_on_any.materialize()
    assert sorted(_target_texts(harness_on_any, "moments", "until")) == [1, 2, 3, 4, 5, 6, 7]
    _reads_back(harness_on_any, "moments", "at", "timestamptz")


INTERVALS = """
CREATE TABLE spans (id int PRIMARY KEY, span interval, updated_at timestamptz NOT NULL DEFAULT now());
INSERT INTO spans (id, span) VALUES (1, '1 year 2 mons -3 days 04:05:06.789'), (2, '-1 years -2 mons +3 days -04:05:06.789'),
    (3, '1 mon'), (4, '30 days'), (5, '24 hours'), (6, '0'), (7, '-0.000001 seconds'), (8, NULL),
    (9, '178956970 years 6 mons 2147483646 days 2562047788:00:54.775806'),
    (10, '-178956970 years -6 mons -2147483646 days -2562047788:00:54.775806');
"""


def test_intervals_land_as_interval_keeping_months_days_and_microseconds_apart(harness_on_any: StreamHarness) -> None:
    _load(harness_on_any, "spans", INTERVALS, cursor="updated_at")
    assert _target_types(harness_on_any, "spans")["span"] == "INTERVAL"
    _reads_back(harness_on_any, "spans", "span", "interval")
    parts = harness_on_any.query_target(
        f"SELECT id, datepart('month', span), datepart('day', span), datepart('hour', span) "
        f'FROM "{harness_on_any.source_name}".spans WHERE id IN (3, 4, 5) ORDER BY id'
    )
    assert parts == [(3, 1, 0, 0), (4, 0, 30, 0), (5, 0, 0, 24)]  # a month, 30 days and 24 hours stay three values


LISTS = r"""
CREATE TABLE lists (
    id int PRIMARY KEY, ints int[], texts text[], floats float8[], reals real[], flags bool[], amounts numeric(10,2)[],
    days date[], moments timestamptz[], ids uuid[], spans interval[], grid int[][], uid uuid, doc jsonb, raw json,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO lists (id, ints, texts, floats, reals, flags, amounts, days, moments, ids, spans, grid, uid, doc, raw) VALUES
 (1, '{1,NULL,-3}', array['a b', NULL, 'NULL', 'x"y', '', 'back\slash', '{', ' lead', 'a,b', 'ü 🙂'],
  '{1.5,NaN,Infinity,-Infinity,-0,5e-324}', '{3.4e38,-0,1.17549435e-38}', '{t,f,NULL}', '{1.50,NULL,-0.01}',
  '{2024-02-29,infinity,"0044-03-15 BC"}', '{"2024-01-01 00:00:00.000001+00",-infinity}',
  '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}', '{"1 mon","-1 days +00:00:00.5"}', '{{1,2},{3,4}}',
  '00000000-0000-0000-0000-000000000000', '{"b": [1, 2.5], "a": null}', '{"keep":  "spacing", "a": 1}'),
 (2, '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', '{}', NULL, 'null', '[]'),
 (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '{7}', NULL, NULL, NULL);
"""
LIST_TYPES = {
    "ints": ("INTEGER[]", "int4"),
    "texts": ("VARCHAR[]", "text"),
    "floats": ("DOUBLE[]", "float8"),
    "reals": ("FLOAT[]", "float4"),
    "flags": ("BOOLEAN[]", "bool"),
    "amounts": ("DECIMAL(10,2)[]", "numeric(10,2)"),
    "days": ("DATE[]", "date"),
    "moments": ("TIMESTAMP WITH TIME ZONE[]", "timestamptz"),
    "ids": ("UUID[]", "uuid"),
    "spans": ("INTERVAL[]", "interval"),
}


def test_arrays_land_as_lists_of_their_element_type_and_uuid_and_json_as_themselves(
    harness_on_any: StreamHarness,
) -> None:
    harness = harness_on_any
    _load(harness, "lists", LISTS, cursor="updated_at")
    types = _target_types(harness, "lists")
    assert {name: types[name] for name in LIST_TYPES} == {name: kind for name, (kind, _) in LIST_TYPES.items()}
    assert (types["grid"], types["uid"], types["doc"], types["raw"]) == ("VARCHAR", "UUID", "JSON", "JSON")
    for name, (_, element) in LIST_TYPES.items():
        _elements_read_back(harness, name, element)
    _reads_back(harness, "lists", "grid", "int[]")  # declared two-dimensional: PostgreSQL's exact text
    _reads_back(harness, "lists", "uid", "uuid")
    _reads_back(harness, "lists", "doc", "jsonb")
    _reads_back(harness, "lists", "raw", "json")  # json keeps its text as written

    # a later run merges into the LIST columns it created (through dlt's staging table)
    harness.source.execute("UPDATE lists SET ints = '{9,NULL}', texts = '{\"}\"}', updated_at = now() WHERE id = 2")
    harness.materialize()
    assert _target_types(harness, "lists") == types
    for name in ("ints", "texts"):
        _elements_read_back(harness, name, LIST_TYPES[name][1])


def _elements_read_back(harness: StreamHarness, column: str, element: str) -> None:
    """Each element of each target LIST reads back in PostgreSQL as the source array's element, in order, with
    NULL elements kept; an empty array stays empty and a NULL array NULL."""
    target = {
        int(key): None if items is None else [postgres_text(item) for item in items]
        for key, items in harness.query_target(
            f'SELECT id, list_transform("{column}", lambda x: x::VARCHAR) FROM "{harness.source_name}".lists'
        )
    }
    source = dict(
        harness.query_source(
            f"SELECT id, CASE WHEN {column} IS NOT NULL THEN coalesce((SELECT array_agg(e::text ORDER BY n) "
            f"FROM unnest({column}) WITH ORDINALITY u(e, n)), '{{}}') END FROM lists"
        )
    )
    assert sorted(target) == sorted(source)
    for key, items in target.items():
        back = None if items is None else [_read_back(harness, item, element) for item in items]
        assert back == source[key], f"{column} of row {key}: target {items!r} reads back as {back!r}"


def _read_back(harness: StreamHarness, text: str | None, sql_type: str) -> str | None:
    return harness.query_source(f"SELECT ({_quoted(text)}::{sql_type})::text")[0][0]  # type: ignore[no-any-return]


UNFIT = """
CREATE TABLE unfit (id int PRIMARY KEY, at timestamptz, ints int[], amounts numeric(10,2)[], span interval,
                    updated_at timestamptz NOT NULL DEFAULT now());
INSERT INTO unfit (id, at, ints, amounts) VALUES (1, '294247-01-10 04:00:54.775806+00', '{1}', '{1.25}'),
    (2, '294247-01-10 04:00:54.775807+00', NULL, NULL), (3, '294276-12-31 23:59:59.999999+00', NULL, NULL),
    (4, NULL, '{{1,2},{3,4}}', NULL), (5, NULL, '[0:1]={1,2}', NULL), (6, NULL, NULL, '{1,NaN}');
"""


def test_values_no_duckdb_type_holds_are_parked_with_their_reason(harness_on_any: StreamHarness) -> None:
    harness = harness_on_any
    harness.source.execute(UNFIT)
    infinite_interval = harness.query_source("SHOW server_version_num")[0][0] >= "170000"
    if infinite_interval:  # PostgreSQL 17 added infinite intervals; DuckDB has none
        harness.source.execute("INSERT INTO unfit (id, span) VALUES (7, 'infinity')")
    harness.write_catalog({"unfit": {"table": "unfit", "primary_key": "id", "cursor": "updated_at"}})
    harness.materialize()
    parked = _dead_letters(harness)
    expected = {
        "2": "at: 294247-01-10T04:00:54.775807+00:00 is later than the latest timestamp",
        "3": "at: 294276-12-31T23:59:59.999999+00:00 is later than the latest timestamp",
        "4": "ints: {{1,2},{3,4}} is a multi-dimensional array",
        "5": "ints: [0:1]={1,2} is an array with explicit bounds",
        "6": "amounts: {1.00,NaN}: element NaN has no exact decimal value",
    }
    if infinite_interval:
        expected["7"] = "span: infinity has no DuckDB INTERVAL value"
    assert sorted(parked) == sorted(expected)
    for key, start in expected.items():
        assert parked[key].startswith(start), parked[key]
    assert _target_texts(harness, "unfit", "at") == {1: "294247-01-10 04:00:54.775806+00"}
    raw = harness.query_target(
        f"SELECT raw_record FROM \"{harness.source_name}\"._ingest_dead_letter WHERE record_key = '4'"
    )[0][0]
    assert '"ints": "{{1,2},{3,4}}"' in raw  # the raw record keeps the value as PostgreSQL wrote it


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_the_version_guard_compares_infinite_versions_under_a_composite_key(
    harness: StreamHarness, destination: str
) -> None:
    """Partitions and a live tail write one table in any order: a version at infinity is the newest, and a
    slice with LIST columns is checked like any other (Arrow's join carries no lists)."""
    if destination == "postgres":
        url_file = harness.tmp_path / "warehouse_url"
        url_file.write_text(harness.source.url)
        target = Destination(type="postgres", credentials=Reference(file=str(url_file)))
        dataset = f"{harness.source.schema}_wh"
    else:
        target = Destination(type="duckdb", path=str(harness.warehouse))
        dataset = harness.source_name
    harness.write_catalog({"x": {"table": "x", "primary_key": "id"}})
    loader = Loader(
        settings=harness.settings,
        destination=target,
        target=TargetTable(dataset, "versions", ("region", "id"), "merge"),
        pipeline_name=f"guard_{destination}_{harness.source_name}",
        guard_versions=True,
    )

    def rows(version: int, ids: list[int], label: str) -> pa.Table:
        columns: dict[str, pa.Array] = {
            "region": pa.array(["eu"] * len(ids)),
            "id": pa.array(ids, pa.int64()),
            "label": pa.array([label] * len(ids)),
            "until": pa.array([version] * len(ids), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        }
        if destination == "duckdb":
            columns["tags"] = pa.array([[label, None]] * len(ids), pa.list_(pa.string()))
        return with_metadata(pa.table(columns), ["until"], dt.datetime.now(dt.UTC), 1)

    older = temporal.parse("2024-01-01 00:00:00+00", "timestamptz")
    assert loader.load(rows(temporal.TIMESTAMP_INFINITY, [1, 2], "live")) == 2
    assert loader.load(rows(older, [1, 2, 3], "history")) == 1  # only (eu, 3) is not older than what is there
    assert loader.load(rows(temporal.TIMESTAMP_INFINITY, [2], "replay")) == 1  # an equal version applies
    with loader.client() as client:
        table = client.make_qualified_table_name("versions")
        found = client.execute_sql(f"SELECT id, label, CAST(until AS VARCHAR) FROM {table} ORDER BY id")
    assert [tuple(r) for r in found] == [
        (1, "live", "infinity"),
        (2, "replay", "infinity"),
        (3, "history", "2024-01-01 00:00:00+00"),
    ]
