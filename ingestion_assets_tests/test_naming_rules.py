"""Our spelling of dlt's naming conventions gives dlt's names: a run that loads nothing names its target's
columns without importing dlt, and a load (through dlt) must find the same names."""

from __future__ import annotations

import random
import string

import pytest

from ingestion_assets.loading.naming_rules import normalize

AWKWARD = [
    "id",
    "Order ID",
    "orderId",
    "OrderID",
    "HTTPServerError",
    "already_snake",
    "__leading",
    "trailing__",
    "123abc",
    "9",
    "a+b-c*d@e|f",
    "naïve café",
    "Ünïcödé",
    "spaces  inside",
    "  padded  ",
    "x__y___z",
    "select",
    "CamelCaseWithNumbers2Go",
    "ThisColumnNameIsCamelCaseAndGrowsPastTheLimitWhenSnakeCased",
    'quote"d',
    "it's",
    "new\nline",
    "arrow▶sep",
    "_dlt_id",
    "a" * 70,
    "B" * 64,
    "Mixed_CASE_" * 8,
    "-",
    "é",
    "_",
    "__",
    "a_",
    "tab\there",
    "dot.name",
    "slash/name",
]


def _names(count: int) -> list[str]:
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits + " _-+*@|.'\"\n▶éÜ😀"
    return AWKWARD + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 90))) for _ in range(count)]


@pytest.mark.parametrize("convention", ["snake_case", "direct"])
@pytest.mark.parametrize("max_length", [None, 63, 64])
def test_names_are_dlts(convention: str, max_length: int | None) -> None:
    import importlib

    dlt_naming = importlib.import_module(f"dlt.common.normalizers.naming.{convention}").NamingConvention(max_length)
    for name in _names(2000):
        if not name.strip():
            continue
        expected = (dlt_naming.normalize_identifier(name), dlt_naming.normalize_table_identifier(name))
        assert (normalize(convention, name, max_length),) * 2 == expected, name
