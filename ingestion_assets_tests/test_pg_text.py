"""The parsers of PostgreSQL's text that Arrow has no parser for, against PostgreSQL's own arithmetic: temporal
values to Arrow's integers and back, arrays into elements, ISO 8601 intervals into months, days, microseconds."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ingestion_assets.loading.metadata_columns import sortable_text
from ingestion_assets.sources.postgres import arrays, temporal
from ingestion_assets.sources.postgres.values import interval_text
from ingestion_assets_tests.helpers import SourceDb

EPOCHS = """
SELECT v::text, (extract(epoch FROM v) * 1000000)::bigint FROM unnest(%s::timestamptz[]) v
UNION ALL SELECT v::text, v - date '1970-01-01' FROM unnest(%s::date[]) v
"""
MOMENTS = [
    "4713-11-24 00:00:00 BC",
    "0044-03-15 10:00:00.5 BC",
    "0001-12-31 23:59:59.999999 BC",
    "0001-01-01 00:00:00",
    "1582-10-04 12:00:00",
    "1900-02-28 23:00:00",
    "2000-02-29 00:00:00.000001",
    "12345-06-07 08:09:10.123456",
    "294246-12-31 23:59:59.999999",
]
DAYS = ["4713-11-24 BC", "0001-01-01 BC", "0001-01-01", "2024-02-29", "99999-12-31", "5874897-12-31"]


def test_temporal_texts_parse_to_postgres_own_epoch_and_format_back(source_db: SourceDb) -> None:
    with source_db.connect() as conn, conn.cursor() as cur:
        cur.execute(EPOCHS, ([m + "+00" for m in MOMENTS], DAYS))
        rows = cur.fetchall()
    assert len(rows) == len(MOMENTS) + len(DAYS)
    for text, expected in rows:
        kind = "timestamptz" if ":" in text else "date"
        assert temporal.parse(text, kind) == expected, text
        assert temporal.format_value(expected, kind) == text  # PostgreSQL's own text, as COPY prints it
    json_form = "0044-03-15T10:00:00.5+00:00 BC"  # what row_to_json prints
    assert temporal.parse(json_form, "timestamptz") == temporal.parse("0044-03-15 10:00:00.5+00 BC", "timestamptz")


@given(
    st.integers(min_value=temporal.days_from_civil(-4712, 1, 1), max_value=temporal.days_from_civil(5874897, 12, 31))
)
def test_days_and_civil_dates_are_inverse(days: int) -> None:
    assert temporal.days_from_civil(*temporal.civil_from_days(days)) == days


def test_special_values_and_what_does_not_fit() -> None:
    assert temporal.parse("infinity", "date") == temporal.DATE_INFINITY
    assert temporal.parse("-infinity", "timestamp") == -temporal.TIMESTAMP_INFINITY
    assert temporal.parse("24:00:00", "time") == temporal.US_PER_DAY
    assert temporal.format_value(temporal.US_PER_DAY, "time") == "24:00:00"
    assert temporal.parse("2024-01-01 05:30:00+05:30", "timestamptz") == temporal.parse(
        "2024-01-01 00:00:00", "timestamp"
    )
    with pytest.raises(temporal.Unfit, match="later than the latest timestamp"):
        temporal.parse("294247-01-10 04:00:54.775807+00", "timestamptz")


@pytest.mark.parametrize(
    ("text", "elements"),
    [
        ("{}", []),
        ("{1,NULL,-3}", ["1", None, "-3"]),
        (
            '{"a b",NULL,"NULL","x\\"y","","back\\\\slash","{",",",ü}',
            ["a b", None, "NULL", 'x"y', "", "back\\slash", "{", ",", "ü"],
        ),
        ('{"line\nbreak"," lead"}', ["line\nbreak", " lead"]),
        ('{"2024-01-01 00:00:00+00",infinity}', ["2024-01-01 00:00:00+00", "infinity"]),
    ],
)
def test_array_text_splits_into_its_elements(text: str, elements: list[str | None]) -> None:
    assert arrays.elements(text) == elements


@pytest.mark.parametrize(
    ("text", "why"),
    [("{{1,2},{3,4}}", "multi-dimensional"), ("[0:1]={1,2}", "explicit bounds"), ('{"unterminated}', "not an array")],
)
def test_arrays_a_list_cannot_hold_are_refused(text: str, why: str) -> None:
    with pytest.raises(temporal.Unfit, match=why):
        arrays.elements(text)


def test_iso_intervals_keep_months_days_and_microseconds_apart(source_db: SourceDb) -> None:
    samples = [
        "1 year 2 mons -3 days 04:05:06.789",
        "-1 years -2 mons +3 days -04:05:06.789",
        "-0.5 seconds",
        "0",
        "1 mon",
        "30 days",
        "24 hours",
        "1 day -0.000001 seconds",
    ]
    with source_db.connect() as conn, conn.cursor() as cur:
        cur.execute("SET IntervalStyle = 'iso_8601'")
        for sample in samples:
            cur.execute("SELECT %s::interval::text", (sample,))
            iso = cur.fetchone()[0]
            cur.execute("SET IntervalStyle = 'postgres'")
            cur.execute("SELECT %s::interval::text = %s::interval::text", (interval_text(iso), sample))
            assert cur.fetchone()[0], (sample, iso, interval_text(iso))
            cur.execute("SET IntervalStyle = 'iso_8601'")
    assert interval_text("P1M") == "1 months 0 days 0 microseconds"
    assert interval_text("PT-0.5S") == "0 months 0 days -500000 microseconds"
    with pytest.raises(temporal.Unfit, match="no DuckDB INTERVAL"):
        interval_text("infinity")


def test_versions_of_several_cursor_columns_sort_as_their_values_beyond_four_digit_years() -> None:
    """A version made of several cursor columns is text; BC, years past 9999 and infinity keep their order."""
    texts = [
        "-infinity",
        "4713-11-24 00:00:00+00 BC",
        "0044-03-15 10:00:00.5+00 BC",
        "0001-01-01 00:00:00+00",
        "2024-01-01 00:00:00+00",
        "9999-12-31 23:59:59.999999+00",
        "10000-01-01 00:00:00+00",
        "infinity",
    ]
    moments = pa.array([temporal.parse(t, "timestamptz") for t in texts]).cast(pa.timestamp("us", tz="UTC"))
    days = pa.array([temporal.parse(t.split(" ")[0] + (" BC" if "BC" in t else ""), "date") for t in texts], pa.int32())
    for column in (moments, days.cast(pa.date32())):
        versions = sortable_text([column, pa.array([7] * len(texts))]).to_pylist()
        assert versions == sorted(versions) and len(set(versions)) == len(texts)


def test_versions_of_several_cursor_columns_sort_as_their_values_with_nulls_texts_and_numbers() -> None:
    """NULL below every value, a text below its extensions whatever follows it, numbers by value."""
    import decimal
    import itertools

    parts = {
        "text": (pa.string(), [None, "", "\x01", "\x01a", "a", "a\x01", "a!", "ab", "a|", "é"]),
        "int": (pa.int64(), [None, -(2**63), -1, 0, 9, 10, 2**63 - 1]),
        "float": (
            pa.float64(),
            [None, float("-inf"), -1e300, -1.5, -0.0, 1e-300, 2.5, 10.0, float("inf"), float("nan")],
        ),
        "decimal": (
            pa.decimal128(38, 2),
            [
                None,
                decimal.Decimal("-999999999999999999999999999999999999.99"),
                decimal.Decimal("-1.5"),
                decimal.Decimal("0"),
                decimal.Decimal("9.99"),
                decimal.Decimal("10"),
            ],
        ),
        "timestamp": (pa.timestamp("us", tz="UTC"), [None, 0, 1, 10**6]),
    }
    for (_, (first_type, firsts)), (_, (second_type, seconds)) in itertools.product(parts.items(), repeat=2):
        pairs = list(itertools.product(range(len(firsts)), range(len(seconds))))  # value order: by index
        first = pa.array([firsts[i] for i, _ in pairs], first_type)
        second = pa.array([seconds[j] for _, j in pairs], second_type)
        versions = sortable_text([first, second]).to_pylist()
        order = sorted(range(len(pairs)), key=lambda n: versions[n].encode())
        assert [pairs[n] for n in order] == sorted(pairs), (first_type, second_type)


def test_api_versions_order_as_their_values() -> None:
    """dlt keeps the highest version of a key within a slice: version 10 must be above 9, 1e3 above 2.5."""
    from ingestion_assets.loading.metadata_columns import version_text

    for values in ([-(2**63), -5, 0, 9, 10, 2**63 - 1], [float("-inf"), -1.5, 0.0, 2.5, 1e3, float("inf")]):
        texts = [version_text(v) for v in values]
        assert texts == sorted(texts)  # type: ignore[type-var]
    assert version_text("2024-01-01T00:00:00Z") == "2024-01-01T00:00:00Z" and version_text(None) is None
