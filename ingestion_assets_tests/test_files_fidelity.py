"""Files whose values or shapes are at the edge of what a reader or a target holds: a huge CSV field or JSON
line, CSV columns typed differently from file to file, Parquet types a target cannot hold. Each value loads
exactly, or its row, file or stream stops with a message naming what and why; never a silent change."""

from __future__ import annotations

import datetime as dt
import io
import json
from decimal import Decimal
from pathlib import Path

import psycopg2
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

import ingestion_assets.sources.files.csv as csv_reader
from ingestion_assets.settings import Settings
from ingestion_assets_tests.conftest import SOURCE_DATABASE
from ingestion_assets_tests.files_helpers import Drops
from ingestion_assets_tests.helpers import SourceDb

BASE = 1_700_000_000.0
HUGE = "x" * (20 << 20)  # a 20 MB field


@pytest.fixture
def drops(tmp_path: Path) -> Drops:
    return Drops(tmp_path)


def test_a_20mb_csv_field_and_json_line_load_whole(drops: Drops) -> None:
    """A row longer than the CSV reader's block parked the file after its first rows ("straddling object")."""
    drops.catalog(path="*", primary_key="id")
    drops.write("a.csv", f'id,name,amount\n1,a,1\n2,"{HUGE}",2\n3,c,3\n', BASE + 1)
    records = [{"id": 4, "name": "d", "amount": 4}, {"id": 5, "name": HUGE, "amount": 5}]
    drops.write("b.jsonl", "".join(json.dumps(r) + "\n" for r in records), BASE + 2)
    drops.run()
    lengths = [(1, 1, 1), (2, len(HUGE), 2), (3, 1, 3), (4, 1, 4), (5, len(HUGE), 5)]
    assert drops.rows("id, length(name), amount") == lengths


def test_a_csv_row_longer_than_the_limit_parks_the_file_naming_the_setting(drops: Drops) -> None:
    drops.catalog(path="*.csv", primary_key="id", csv={"max_row_bytes": 1 << 20})
    drops.write("a.csv", f"id,name,amount\n1,a,1\n2,{HUGE[: 2 << 20]},2\n", BASE + 1)
    drops.write("b.csv", "id,name,amount\n3,c,3\n", BASE + 2)
    drops.run()
    assert drops.rows() == [(1, "a", 1), (3, "c", 3)]  # the rows before it load, as from a truncated file
    ((key, error),) = drops.dead_letters()
    assert key == "a.csv:file"
    assert "longer than csv.max_row_bytes (1048576 bytes): raise csv.max_row_bytes" in error


def test_csv_values_keep_their_digits_whatever_file_or_batch_they_are_in(
    drops: Drops, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inference typed a code 007 as the integer 7, an integer past int64 or a decimal of 19 digits as a double
    (1e+20): values changed silently. Codes are text, the numbers exact decimals; a file or batch that needs a
    wider type than the target holds widens it, said in the run's schema changes."""
    monkeypatch.setattr(csv_reader, "BLOCK_BYTES", 64)  # small blocks: each file is read in several batches
    drops.catalog(path="*.csv", primary_key="id")
    early = "".join(f"{i},{i},{i},0.5,2024-01-0{i}\n" for i in range(1, 6))
    drops.write("1.csv", "id,code,big,ratio,day\n" + early + "6,007,6,0.5,2024-01-06\n", BASE + 1)
    drops.write("2.csv", "id,code,big,ratio,day\n7,0042,99999999999999999999,0.1234567890123456789,soon\n", BASE + 2)
    outcome = drops.run()
    loaded = drops.rows("id, code, big, ratio, day")
    assert loaded[4:] == [
        (5, "5", 5, Decimal("0.5"), "2024-01-05"),
        (6, "007", 6, Decimal("0.5"), "2024-01-06"),
        (7, "0042", Decimal("99999999999999999999"), Decimal("0.1234567890123456789"), "soon"),
    ]
    assert sorted(outcome.schema_changes) == [
        "column 'big' changed type bigint -> numeric(20,0) (widened)",
        "column 'code' changed type bigint -> text (widened)",
        "column 'day' changed type date -> text (widened)",
        "column 'ratio' changed type numeric(1,1) -> numeric(19,19) (widened)",
    ]


def test_csv_leading_zeros_alone_stay_text_and_plain_numbers_stay_numbers(drops: Drops) -> None:
    drops.catalog(path="*.csv", primary_key="id")
    drops.write(
        "1.csv",
        "id,zip,qty,price,seen,opens\n1,01234,3,1.25,2024-01-02 10:00:00,09:30:00\n2,90210,-4,1e3,,\n",
        BASE + 1,
    )
    drops.run()
    # written without a zone: a timestamp without one (it was read as UTC into a zoned column)
    assert drops.rows("id, zip, qty, price, seen::varchar, opens") == [
        (1, "01234", 3, 1.25, "2024-01-02 10:00:00", dt.time(9, 30)),
        (2, "90210", -4, 1000.0, None, None),
    ]


def test_only_an_unquoted_empty_csv_field_is_null_unless_the_stream_says_more(drops: Drops) -> None:
    """Found by the README-only attack: `NULL`, `null`, a quoted "NULL" and a quoted empty "" became SQL NULL
    (pyarrow's null texts). A quoted empty field is the empty string, `NULL` is text; `csv.null_values` adds
    texts that mean NULL (unquoted ones)."""
    text = 'id,name\n1,NULL\n2,null\n3,"NULL"\n4,""\n5,\n6,x\n'
    drops.catalog(path="*.csv", primary_key="id")
    drops.write("a.csv", text, BASE)
    drops.run()
    assert drops.rows("id, name") == [(1, "NULL"), (2, "null"), (3, "NULL"), (4, ""), (5, None), (6, "x")]
    declared = Drops(drops.root / "declared")
    declared.catalog(path="*.csv", primary_key="id", csv={"null_values": ["", "NULL"]})
    declared.write("a.csv", text, BASE)
    declared.run()
    assert declared.rows("id, name") == [(1, None), (2, "null"), (3, "NULL"), (4, ""), (5, None), (6, "x")]
    typed = Drops(drops.root / "typed")  # every field quoted: a missing number is "", in a typed column a NULL
    typed.catalog(path="*.csv", primary_key="id", csv={"column_types": {"amount": "int64"}})
    typed.write("a.csv", 'id,n,amount,name\n"1","","","x"\n"2","2.5","7",""\n', BASE)
    typed.run()
    assert typed.rows("id, n, amount, name") == [(1, None, None, "x"), (2, 2.5, 7, "")]


def _unfit_parquet() -> bytes:
    """Types a target cannot hold as they are: the last row's timestamp and time have nanoseconds."""
    second = 1_700_000_000_000_000_000
    table = pa.table(
        {
            "id": [1, 2, 3],
            "u64": pa.array([1, 2**63 + 5, 2**64 - 1], pa.uint64()),
            "d256": pa.array([Decimal("1.50"), Decimal("1" * 45 + ".25"), None], pa.decimal256(50, 2)),
            "d76": pa.array([Decimal("-2.5"), None, Decimal("9" * 30)], pa.decimal256(38, 1)),
            "ts_ns": pa.array([second + 123_456_000, second, second + 789], pa.timestamp("ns", tz="UTC")),
            "t_ns": pa.array([1_000_001_000, 0, 5], pa.time64("ns")),
            "ls": pa.array(["a", "é", None], pa.large_string()),
            "lb": pa.array([b"\x00\xff", b"", None], pa.large_binary()),
            "dict": pa.array(["x", "y", "x"]).dictionary_encode(),
            "f16": pa.array([15872, 31743, 0], pa.uint16()).view(pa.float16()),  # 1.5, 65504, 0
            "dur": pa.array([5_000, 1, 0], pa.duration("ms")),
            "nest": pa.array(
                [{"u": 2**64 - 1, "at": [second + 1], "m": [("k", Decimal("0.1234567890123456789"))]}, None, None],
                pa.struct(
                    [
                        ("u", pa.uint64()),
                        ("at", pa.list_(pa.timestamp("ns"))),
                        ("m", pa.map_(pa.string(), pa.decimal128(20, 19))),
                    ]
                ),
            ),
        }
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    return buffer.getvalue()


UNFIT_COLUMNS = "id, u64, d256, d76, ts_ns, t_ns, ls, lb, dict, f16, dur, nest"
UNFIT_ROWS = [
    (
        1,
        Decimal(1),
        "1.50",
        Decimal("-2.5"),
        dt.datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=dt.UTC),
        dt.time(0, 0, 1, 1),
        "a",
        b"\x00\xff",
        "x",
        1.5,
        5_000_000,
        '{"u": 18446744073709551615, "at": ["2023-11-14 22:13:20.000000001"], "m": {"k": "0.1234567890123456789"}}',
    ),
    (
        2,
        Decimal(2**63 + 5),
        "1" * 45 + ".25",
        None,
        dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC),
        dt.time(0),
        "é",
        b"",
        "y",
        65504.0,
        1_000,
        None,
    ),
]


@pytest.mark.parametrize("destination", ["duckdb", "postgres"])
def test_parquet_types_a_target_cannot_hold_load_exactly_or_park_their_rows(
    drops: Drops, destination: str, request: pytest.FixtureRequest
) -> None:
    """uint64 past int64 failed the run with a raw Arrow error, a 50-digit decimal with "precision should be
    between 1 and 38", a nanosecond timestamp with "would lose data", a duration with dlt's "unsupported", a
    struct on PostgreSQL with dlt's CSV writer error, and a nanosecond time lost its nanoseconds silently. Each
    loads exactly now (numeric(20,0), the decimal's text, microseconds, nested values as JSON text with every
    digit), and a row whose time has nanoseconds is parked naming the file, row, column, type and value."""
    drops.catalog(path="*.parquet", primary_key="id")
    if destination == "postgres":
        settings: Settings = request.getfixturevalue("session_settings")
        db = SourceDb(settings.embedded.url(SOURCE_DATABASE), "drops")
        url = drops.root / "url"
        url.write_text(db.url)
        catalog = yaml.safe_load(drops.settings.catalog_path.read_text())
        catalog["destination"] = {"type": "postgres", "credentials": {"file": str(url)}}
        drops.settings.catalog_path.write_text(yaml.safe_dump(catalog))
    drops.write("a.parquet", _unfit_parquet(), BASE + 1)
    try:
        outcome = drops.run()
        if destination == "postgres":
            loaded = _postgres_rows(db.url, UNFIT_COLUMNS)
            parked = _postgres_rows(db.url, "record_key, error", "_ingest_dead_letter")
        else:
            loaded, parked = drops.rows(UNFIT_COLUMNS), drops.dead_letters()
    finally:
        if destination == "postgres":
            db.drop_schema()
    assert loaded == UNFIT_ROWS
    assert outcome.result.dead_letters == 1
    ((key, error),) = parked
    assert key == "a.parquet:row3"
    assert "file a.parquet row 3: column 'ts_ns' (timestamp[ns, tz=UTC]) is 2023-11-14 22:13:20.000000789" in error
    assert "column 't_ns' (time64[ns]) is 00:00:00.000000005: the target counts microseconds" in error


def _postgres_rows(url: str, columns: str, table: str = "orders") -> list[tuple[object, ...]]:
    with psycopg2.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SET TimeZone = 'UTC'")
        cur.execute(f"SELECT {columns} FROM drops.{table} ORDER BY 1")
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in cur.fetchall()]


def test_json_numbers_keep_their_digits(drops: Drops) -> None:
    """A JSON decimal of 19 digits was parsed as a double (0.12345678901234568): numbers with a point are exact
    decimals, integers past int64 too; a number past a double's range (with an exponent) makes its column text."""
    drops.catalog(path="*.jsonl", primary_key="id")
    lines = [
        '{"id": 1, "ratio": 0.1234567890123456789, "big": 99999999999999999999, "x": 1.5, "huge": 1e400, "tiny": 1e-400}',
        '{"id": 2, "ratio": 0.5, "big": 7, "x": 2, "huge": null, "tiny": 0.0}',
    ]
    drops.write("a.jsonl", "\n".join(lines) + "\n", BASE + 1)
    drops.run()
    assert drops.rows("id, ratio, big, x, huge, tiny") == [
        (1, Decimal("0.1234567890123456789"), Decimal("99999999999999999999"), Decimal("1.5"), "1e400", "1e-400"),
        (2, Decimal("0.5"), 7, 2, None, "0.0"),
    ]
