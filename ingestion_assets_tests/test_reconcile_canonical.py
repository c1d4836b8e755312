"""The canonical text reconciliation hashes is the same on the source and on either target, per type, for
the values the loader actually wrote; and names dlt normalises (keywords, mixed case, spaces) still match."""

from __future__ import annotations

import pyarrow as pa
import pytest

from ingestion_assets.catalog import load_catalog
from ingestion_assets.checks import check_catalog
from ingestion_assets.sources.postgres.introspect import Column
from ingestion_assets.streams.reconcile.canonical import Expr, NotComparable, kind_of, row_hash
from ingestion_assets_tests.helpers import StreamHarness

KINDS = r"""
CREATE TABLE kinds (
    id bigint PRIMARY KEY, small int2, big int8, label text, code varchar(10), fixed char(5), ref uuid,
    at timestamptz, local timestamp, day date, amount numeric(12,3), exact numeric, flag boolean, raw bytea,
    updated_at timestamptz NOT NULL
);
INSERT INTO kinds VALUES
 (1, -32768, 9223372036854775807, 'héllo ✓', '007', 'ab', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11',
  '2024-03-01 12:34:56.123456+02', '2024-03-01 12:34:56.000001', '1999-12-31', -12.5, 1.10, true, '\x00ff',
  '2024-01-01 00:00:01+00'),
 (2, 0, -1, '', '', '', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A12', '1969-12-31 23:59:59.999999+00',
  '1900-01-01 00:00:00', '1970-01-01', 0, -0.000001, false, '\x', '2024-01-01 00:00:02+00'),
 (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '2024-01-01 00:00:03+00'),
 (4, 1, 1, E'tab\there "q", comma\nline', 'x', 'abcde', '00000000-0000-0000-0000-000000000000',
  '2262-04-11 23:47:16.854775+00', '1677-09-22 00:12:44', '0001-01-01', 123456789.001, 12345678901234567890.5,
  true, '\x5c27', '2024-01-01 00:00:04+00');
"""
COLUMNS = [
    "id",
    "small",
    "big",
    "label",
    "code",
    "fixed",
    "ref",
    "at",
    "local",
    "day",
    "amount",
    "exact",
    "flag",
    "raw",
]


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_each_type_prints_the_same_canonical_text_on_both_sides(
    harness_on_any: StreamHarness, destination: str
) -> None:
    """Also on PostgreSQL 15 with INGEST_TEST_PG_URL (bit_xor, numeric extract(epoch), exported snapshots)."""
    harness = harness_on_any
    harness.source.execute(KINDS)
    columns = COLUMNS
    if destination == "postgres":
        # Loading into PostgreSQL (dlt's CSV path) rejects non-UTF-8 bytes and turns '' into NULL: both are the
        # loader's fidelity, reported apart; here only the canonical text of what did arrive is compared.
        harness.source.execute(
            "ALTER TABLE kinds DROP COLUMN raw; UPDATE kinds SET label = 'e', code = 'e' WHERE id = 2"
        )
        columns = [c for c in COLUMNS if c != "raw"]
    harness.write_catalog({"kinds": {"table": "kinds", "primary_key": "id", "cursor": "updated_at"}}, destination)
    harness.materialize()
    assert harness.target_count("kinds") == 4
    dialect = "duckdb" if destination == "duckdb" else "postgres"
    plan = harness.stream("kinds").plan()
    exprs = {name: (kind_of(plan.shape.column(name)), f't."{name}"') for name in columns}
    table = f'"{harness.source_name}".kinds'
    for name, (kind, expr) in exprs.items():
        source = harness.query_source(f"SELECT id, {kind.text('postgres', expr)} FROM kinds t ORDER BY t.id")
        target = harness.query_target(f"SELECT id, {kind.text(dialect, expr)} FROM {table} t ORDER BY t.id")
        assert source == target, f"{name} ({kind.name}) differs: source {source}, target {target}"
        assert any(text is not None for _, text in source)

    def hashes(side: str, relation: str) -> list[tuple[object, ...]]:
        keys = [Expr(exprs["id"][1], exprs["id"][0], False, "BIGINT")]
        versions = [Expr(e, k, True, k.target_type) for n, (k, e) in exprs.items() if n != "id"]
        query = f"SELECT id, {row_hash(side, keys, versions)} FROM {relation} t ORDER BY t.id"  # type: ignore[arg-type]
        return (
            harness.query_source(query) if side == "postgres" and relation == "kinds" else harness.query_target(query)
        )

    assert hashes("postgres", "kinds") == hashes(dialect, table)


def test_a_float_key_or_cursor_is_refused_with_its_reason(harness: StreamHarness) -> None:
    with pytest.raises(NotComparable, match="'score' \\(double precision\\)"):
        kind_of(Column("score", "float8", "double precision", False, pa.float64()))
    harness.source.execute("CREATE TABLE scores (id int PRIMARY KEY, score float8 NOT NULL)")
    detect = {"scope": "full", "deletes": "hard"}
    harness.write_catalog({"scores": {"table": "scores", "primary_key": "id", "cursor": "score", "reconcile": detect}})
    (problem,) = check_catalog(harness.settings, load_catalog(harness.settings.catalog_path))
    assert problem.startswith(f"stream {harness.source_name}.scores: reconcile.deletes cannot be detected")


WEIRD = """
CREATE TABLE "Weird Table" ("Order ID" int PRIMARY KEY, "select" timestamptz NOT NULL, "Name" text);
INSERT INTO "Weird Table" SELECT g, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 second', 'n' || g
FROM generate_series(1, 50) g;
"""


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_keywords_mixed_case_and_spaces_in_names(harness: StreamHarness, destination: str) -> None:
    harness.source.execute(WEIRD)
    spec = {"table": "Weird Table", "primary_key": "Order ID", "cursor": "select"}
    harness.write_catalog({"weird": {**spec, "reconcile": {"full_every_seconds": 0, "deletes": "hard"}}}, destination)
    harness.materialize()
    harness.source.execute('DELETE FROM "Weird Table" WHERE "Order ID" IN (3, 4)')
    result = harness.materialize()
    check = next(e for e in result.get_asset_check_evaluations() if e.check_name == "reconciliation")
    assert check.passed and check.metadata["deletions applied"].value == 2, check.metadata
    kept = harness.query_target(f'SELECT order_id FROM "{harness.source_name}".weird ORDER BY 1')
    assert [r[0] for r in kept] == [k for k in range(1, 51) if k not in (3, 4)]
