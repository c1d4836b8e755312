"""Types DuckDB has no equal for arrive as PostgreSQL's exact text; a PostgreSQL destination holds them as
themselves; a target an older version created keeps the text columns it has."""

from __future__ import annotations

from typing import Any

import psycopg2
import pytest

from ingestion_assets.cli import main
from ingestion_assets.sources.postgres import introspect
from ingestion_assets_tests.helpers import StreamHarness
from ingestion_assets_tests.test_native_types import _dead_letters, _reads_back, _target_texts, _target_types

OTHERS = """
CREATE TYPE mood AS ENUM ('happy', 'sad');
CREATE DOMAIN positive AS int CHECK (VALUE > 0);
CREATE TYPE pair AS (label text, span interval, at timestamptz, ratio real);
CREATE TABLE others (
    id int PRIMARY KEY, ir int4range, tr tstzrange, nr numrange, mr int4multirange, cash money, bits bit(8),
    vbits varbit, ip inet, net cidr, mac macaddr, mac8 macaddr8, feeling mood, amount positive,
    thing pair, words tsvector, query tsquery, pt point, bx box, poly polygon, circ circle, clock timetz,
    lsn pg_lsn, big numeric, wide numeric(50,10), moods mood[], updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO others (id, ir, tr, nr, mr, cash, bits, vbits, ip, net, mac, mac8, feeling, amount, thing, words,
                    query, pt, bx, poly, circ, clock, lsn, big, wide, moods) VALUES
 (1, '[1,5)', '[2024-01-01 00:00:00.000001+00,infinity)', '(1.5,2.25]', '{[1,3),[5,7)}', '-1234.56', B'10100001',
  B'101', '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03', '08:00:2b:01:02:03:04:05', 'sad', 5, ROW('a "b", c', '1 mon -2 days 00:00:01.5', '2024-01-01 00:00:00+00', 3.4e38), 'fat:2 cat:1,3',
  'fat & (rat | cat)', '(1.5,-2)', '(1,2),(3,4)', '((0,0),(1,1),(1,0))', '<(1,2),3>', '10:00:00.5+05:30',
  '16/B374D848', '123456789012345678901234567890.123456789012345678901234567890', 1e-10, '{happy,sad,NULL}'),
 (2, 'empty', '(,)', 'empty', '{}', '0', B'00000000', B'', '::1', '::/0', '00:00:00:00:00:00',
  '00:00:00:00:00:00:00:00', 'happy', 1, ROW(NULL, NULL, NULL, NULL), '', 'a', '(0,0)', '(0,0),(0,0)', '((0,0))',
  '<(0,0),0>', '00:00:00+00', '0/0', 'NaN', 0, '{}'),
 (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL);
"""
XML = """ALTER TABLE others ADD COLUMN doc xml; UPDATE others SET doc = '<a x="1">t &amp; u</a>' WHERE id = 1;
UPDATE others SET doc = '' WHERE id = 2"""
TEXT_TYPES = {
    "ir": "int4range",
    "tr": "tstzrange",
    "nr": "numrange",
    "mr": "int4multirange",
    "cash": "money",
    "bits": "bit(8)",
    "vbits": "varbit",
    "ip": "inet",
    "net": "cidr",
    "mac": "macaddr",
    "mac8": "macaddr8",
    "feeling": "mood",
    "thing": "pair",
    "words": "tsvector",
    "query": "tsquery",
    "pt": "point",
    "bx": "box",
    "poly": "polygon",
    "circ": "circle",
    "clock": "timetz",
    "lsn": "pg_lsn",
    "big": "numeric",
    "wide": "numeric",
}


def test_types_without_a_duckdb_equal_arrive_as_text_postgres_reads_back(harness_on_any: StreamHarness) -> None:
    harness_on_any.source.execute(OTHERS)
    text_types = dict(TEXT_TYPES)
    if harness_on_any.query_source("SELECT count(*) FROM pg_proc WHERE proname = 'xml_is_well_formed'")[0][0]:
        try:
            harness_on_any.source.execute(XML)
            text_types["doc"] = "xml"
        except psycopg2.errors.FeatureNotSupported:  # a server built without libxml (the embedded one)
            pass
    harness_on_any.write_catalog({"others": {"table": "others", "primary_key": "id", "cursor": "updated_at"}})
    harness_on_any.materialize()
    types = _target_types(harness_on_any, "others")
    assert {name: types[name] for name in text_types} == dict.fromkeys(text_types, "VARCHAR")
    assert (types["amount"], types["moods"]) == ("INTEGER", "VARCHAR[]")  # a domain lands as its base type
    for column, sql_type in {**text_types, "amount": "positive"}.items():
        _reads_back(harness_on_any, "others", column, sql_type)
    assert _dead_letters(harness_on_any) == {}


NATIVE_IN_POSTGRES = """
CREATE TYPE mood AS ENUM ('happy', 'sad');
CREATE TABLE natives (
    id int PRIMARY KEY, r real, span interval, uid uuid, ints int[], texts text[], grid int[][], nr numrange,
    ip inet, big numeric, wide numeric(50,10), at timestamptz, local timestamp, day date, clock time, feeling mood,
    moods mood[], updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO natives (id, r, span, uid, ints, texts, grid, nr, ip, big, wide, at, local, day, clock, feeling, moods)
VALUES
 (1, 3.4e38, '1 year 2 mons -3 days 04:05:06.789', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{1,NULL}',
  array['a b', NULL, 'NULL', 'x"y', ''], '{{1,2},{3,4}}', '(1.5,2.25]', '::1', 'NaN', 1e-10, 'infinity',
  '4713-11-24 00:00:00 BC', '0044-03-15 BC', '24:00:00', 'sad', '{happy}'),
 (2, '-0', '1 mon', NULL, '[0:1]={5,6}', '{}', '{}', 'empty', '10.0.0.0/8', 1, 0, '-infinity', '12345-01-01 00:00:00',
  '-infinity', '00:00:00', 'happy', '{}'),
 (3, 'NaN', '30 days', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '2024-02-29 12:00:00.000001+00',
  '2024-02-29 12:00:00', '2024-02-29', '12:00:00.5', NULL, NULL);
"""
POSTGRES_TYPES = {
    "r": "real",
    "span": "interval",
    "uid": "uuid",
    "ints": "integer[]",
    "texts": "text[]",
    "grid": "integer[]",
    "nr": "numrange",
    "ip": "inet",
    "big": "numeric",
    "wide": "numeric(50,10)",
    "feeling": "character varying",  # the enum type is the source's own: text
    "moods": "character varying",
}


def test_a_postgres_destination_holds_postgres_types_as_themselves(harness: StreamHarness) -> None:
    harness.source.execute(NATIVE_IN_POSTGRES)
    harness.write_catalog(
        {"natives": {"table": "natives", "primary_key": "id", "cursor": "updated_at"}}, destination="postgres"
    )
    harness.materialize()
    target = f'"{harness.source_name}".natives'
    types = dict(
        harness.query_source(
            "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
            f"WHERE attrelid = '{target}'::regclass AND attnum > 0"
        )
    )
    assert {name: types[name] for name in POSTGRES_TYPES} == POSTGRES_TYPES
    columns = [c for c in harness.source.columns("natives") if c != "updated_at"]
    differing = (
        f"SELECT s.id, {', '.join(f's.{c}::text, t.{c}::text' for c in columns)} FROM natives s "
        f"FULL JOIN {target} t USING (id) WHERE "
        + " OR ".join(f"s.{c}::text IS DISTINCT FROM t.{c}::text" for c in columns)
    )
    assert harness.query_source(differing) == []  # compared as PostgreSQL prints them (-0, 1 mon vs 30 days ...)

    # a later run merges into the table it made, through dlt's staging table, with the same types
    harness.source.execute("UPDATE natives SET span = '-1 mon', ints = '{{7}}', updated_at = now() WHERE id = 3")
    harness.materialize()
    assert harness.query_source(differing) == []


LEGACY = """
CREATE DOMAIN positive AS int CHECK (VALUE > 0);
CREATE TABLE legacy (id int PRIMARY KEY, uid uuid, span interval, ints int[], amount positive, r real,
                     updated_at timestamptz NOT NULL DEFAULT clock_timestamp());
INSERT INTO legacy (id, uid, span, ints, amount, r) VALUES
    (1, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '1 mon -2 days 00:00:01.5', '{1,NULL,"3"}', 7, 3.4e38);
"""


def _as_before_native_types(monkeypatch: pytest.MonkeyPatch) -> None:
    """Land columns as versions before native types did: anything but the fixed types as text, real as DOUBLE."""
    real_column_of = introspect.column_of

    def old_column_of(*args: Any) -> introspect.Column:
        column = real_column_of(*args)
        if column.type_name == "float4":
            return introspect.Column(column.name, column.type_name, column.sql_type, column.nullable, column.arrow_type)
        return column.as_text() if column.type_name in ("uuid", "interval", "_int4", "positive") else column

    monkeypatch.setattr(introspect, "column_of", old_column_of)


def test_a_target_an_older_version_created_keeps_its_text_columns_until_a_refresh(
    harness: StreamHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    harness.source.execute(LEGACY)
    harness.write_catalog({"legacy": {"table": "legacy", "primary_key": "id", "cursor": "updated_at"}})
    with monkeypatch.context() as old_version:
        _as_before_native_types(old_version)
        harness.materialize()
    before = _target_types(harness, "legacy")
    assert (before["uid"], before["span"], before["ints"], before["amount"], before["r"]) == (
        *("VARCHAR",) * 4,
        "DOUBLE",
    )

    # upgraded: the same values again and a change, merged through dlt's staging table
    harness.source.execute(
        "INSERT INTO legacy (id, uid, span, ints, amount, r) SELECT 2, uid, span, ints, amount, r FROM legacy;"
        "UPDATE legacy SET amount = 8, updated_at = clock_timestamp() WHERE id = 1"
    )
    harness.materialize()
    harness.materialize()
    assert _target_types(harness, "legacy") == before  # no pause, no type change under the rows already there
    for column in ("uid", "span", "ints", "amount"):
        texts = _target_texts(harness, "legacy", column)
        assert texts[2] == (texts[1] if column != "amount" else "7"), f"{column}: new rows in the old form"
    assert _target_texts(harness, "legacy", "span")[1] == "P1M-2DT1.5S"  # PostgreSQL's iso_8601 text, as before
    assert _dead_letters(harness) == {}

    # a refresh builds a new table: native types from then on, also for later merges
    for key, value in harness.cli_env().items():
        monkeypatch.setenv(key, value)
    assert main(["refresh", f"{harness.source_name}.legacy", "--later"]) == 0
    harness.materialize()
    harness.source.execute("UPDATE legacy SET span = '-1 mon', updated_at = clock_timestamp() WHERE id = 2")
    harness.materialize()
    after = _target_types(harness, "legacy")
    assert (after["uid"], after["span"], after["ints"], after["amount"], after["r"]) == (
        "UUID",
        "INTERVAL",
        "INTEGER[]",
        "INTEGER",
        "FLOAT",
    )
    for column, sql_type in {"uid": "uuid", "span": "interval", "amount": "int", "r": "real"}.items():
        _reads_back(harness, "legacy", column, sql_type)


def test_empty_strings_and_any_bytes_arrive_exactly_in_postgres(harness: StreamHarness) -> None:
    """'' stays apart from NULL (dlt's COPY made both NULL), bytes that are not UTF-8 or hold a backslash arrive
    as they are (Arrow's CSV wrote them raw), on the first load and on a merge."""
    harness.source.execute(r"""
CREATE TABLE blobs (k text PRIMARY KEY, s text, b bytea, j jsonb, updated_at timestamptz NOT NULL DEFAULT now());
INSERT INTO blobs (k, s, b, j) VALUES
 ('', '', '\xff00fe', '""'), ('null', NULL, NULL, NULL), ('slash', '\', '\x5c7834315c', '"\\"'),
 ('empty bytes', ' ', '', '{}'), ('zero', 'x', '\x00', 'null');
""")
    harness.write_catalog({"blobs": {"table": "blobs", "primary_key": "k", "cursor": "updated_at"}}, "postgres")
    harness.materialize()
    harness.assert_target_equals_source("blobs", "blobs", "k", json_columns=["j"])
    harness.source.execute(r"UPDATE blobs SET s = '', b = '\x5c', updated_at = now() WHERE k IN ('null', 'zero')")
    harness.materialize()
    harness.assert_target_equals_source("blobs", "blobs", "k", json_columns=["j"])


def test_temporal_and_json_columns_keep_their_types_in_postgres_when_the_first_rows_are_extremes(
    harness: StreamHarness,
) -> None:
    """A first slice whose temporal values travel as text (infinity, BC, 24:00) still creates timestamptz, date
    and time columns; json stays json (jsonb would drop a duplicate key and reorder)."""
    harness.source.execute("""
CREATE TABLE extremes (id int PRIMARY KEY, ts timestamptz, d date, tm time, js json,
                       updated_at timestamptz NOT NULL DEFAULT now());
INSERT INTO extremes VALUES (1, 'infinity', '0044-03-15 BC', '24:00', '{"b": 2, "a": 1, "b": 3}'),
                            (2, '-infinity', 'infinity', '00:00', '[]');
""")
    harness.write_catalog({"extremes": {"table": "extremes", "primary_key": "id", "cursor": "updated_at"}}, "postgres")
    harness.materialize()
    types = dict(
        harness.query_target(
            "SELECT column_name, data_type FROM information_schema.columns "
            f"WHERE table_schema = '{harness.source_name}' AND table_name = 'extremes'"
        )
    )
    assert [types[c] for c in ("ts", "d", "tm", "js")] == [
        "timestamp with time zone",
        "date",
        "time without time zone",
        "json",
    ]
    texts = "SELECT id, ts::text, d::text, tm::text, js::text FROM {} ORDER BY id"
    assert harness.query_target(texts.format(f'"{harness.source_name}".extremes')) == harness.query_source(
        texts.format("extremes")
    )
