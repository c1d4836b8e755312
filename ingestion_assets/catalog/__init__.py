"""The user's stream catalog (YAML): sources, their streams and the destination, validated on load."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError, model_validator

from ingestion_assets.catalog.base import DeadLetters, Freshness, Reference, Retries, Tls, _Model
from ingestion_assets.catalog.destination import Destination
from ingestion_assets.catalog.execution import CeleryExecution, Execution, host_bound
from ingestion_assets.catalog.files import CsvOptions, FilesSource, FilesStream, PathKeyPartitions, PathTimePartitions
from ingestion_assets.catalog.postgres import KeyPartitions, PostgresSource, PostgresStream, Reconcile, TimePartitions
from ingestion_assets.catalog.rest import RestAuth, RestSource, RestStream

Source = Annotated[PostgresSource | RestSource | FilesSource, Field(discriminator="type")]
AnyStream = PostgresStream | RestStream | FilesStream
__all__ = [
    "AnyStream",
    "Catalog",
    "CatalogError",
    "CeleryExecution",
    "CsvOptions",
    "DeadLetters",
    "Destination",
    "Execution",
    "FilesSource",
    "FilesStream",
    "Freshness",
    "KeyPartitions",
    "PathKeyPartitions",
    "PathTimePartitions",
    "PostgresSource",
    "PostgresStream",
    "Reconcile",
    "Reference",
    "RestAuth",
    "RestSource",
    "RestStream",
    "Retries",
    "TimePartitions",
    "Tls",
    "load_catalog",
]

NAME_PATTERN = re.compile(r"^[a-z_][a-z0-9_]*$")


class CatalogError(ValueError):
    """The catalog cannot be used; the message names the file, the key path and what is wrong."""

    def __init__(self, path: Path | str, problems: list[str]) -> None:
        self.path = str(path)
        self.problems = problems
        super().__init__(f"invalid catalog {path}:\n" + "\n".join(f"  - {p}" for p in problems))


class Catalog(_Model):
    destination: Destination = Field(default_factory=lambda: Destination())
    sources: dict[str, Source] = Field(min_length=1)
    execution: Execution = Field(default_factory=lambda: Execution())

    @model_validator(mode="after")
    def _names(self) -> Catalog:
        for source_name, source in self.sources.items():
            _check_name(("sources", source_name), source_name)
            for stream_name in source.streams:
                _check_name(("sources", source_name, "streams", stream_name), stream_name)
        if self.destination.type == "postgres":
            for source_name in self.sources:
                _check_postgres_schema(source_name)
        if self.destination.type == "duckdb":
            stem = Path(self.destination.path or "warehouse.duckdb").name.split(".")[0]
            if stem in self.sources:
                raise ValueError(
                    f"destination.path: the DuckDB file is named like the source {stem!r}, whose rows land in a "
                    f"schema {stem!r}; DuckDB then cannot tell the file from the schema in `{stem}.<table>`. "
                    "Rename the file or the source"
                )
        return self

    @model_validator(mode="after")
    def _destination_fits(self) -> Catalog:
        if problems := self.destination.refused_streams(self.streams()):
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _one_host_parts(self) -> Catalog:
        if self.execution.distributed and (problems := host_bound(self)):
            raise ValueError("; ".join(problems))
        return self

    def streams(self) -> list[tuple[str, PostgresSource | RestSource | FilesSource, str, AnyStream]]:
        return [
            (source_name, source, stream_name, stream)
            for source_name, source in self.sources.items()
            for stream_name, stream in source.streams.items()
        ]


def _check_name(key_path: tuple[str, ...], name: str) -> None:
    if not NAME_PATTERN.match(name):
        raise ValueError(
            f"{'.'.join(key_path)}: name {name!r} must be lower-case letters, digits and underscores "
            "(it becomes a Dagster asset key and a table name)"
        )


def _check_postgres_schema(name: str) -> None:
    """PostgreSQL reserves schema names starting with `pg_`: a source's schema, or dlt's `<source>_staging` (which
    a merge and the dead letters go through), named so fails its first load after `ingest check` passed."""
    refused = next((schema for schema in (name, f"{name}_staging") if schema.startswith("pg_")), None)
    if refused is None:
        return
    instead = name.replace("pg_", "pg", 1) if name.startswith("pg_") else "postgres"
    raise ValueError(
        f"sources.{name}: on a PostgreSQL destination the source {name!r} lands in schema {name!r} and dlt's staging "
        f"schema {name + '_staging'!r}, and PostgreSQL refuses the schema name {refused!r} (names starting with "
        f"`pg_` are reserved for its system schemas). Rename the source (e.g. {instead!r}; its asset keys and "
        "target schema follow the name)"
    )


def load_catalog(path: Path | str) -> Catalog:
    """Read and validate a catalog file; every problem is reported with its key path."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as exc:
        raise CatalogError(path, ["file not found (set INGEST_CATALOG to your catalog's path)"]) from exc
    except UnicodeDecodeError as exc:
        raise CatalogError(path, [f"not UTF-8 text (byte {exc.start}): save the catalog as UTF-8"]) from exc
    except OSError as exc:
        raise CatalogError(path, [f"cannot read it: {exc.strerror}"]) from exc
    except yaml.YAMLError as exc:
        raise CatalogError(path, [f"not valid YAML: {exc}"]) from exc
    if not isinstance(raw, dict):
        raise CatalogError(path, ["the top level must be a mapping with `sources` (and `destination`)"])
    try:
        return Catalog.model_validate(raw)
    except ValidationError as exc:
        raise CatalogError(path, [_describe(error) for error in exc.errors()]) from exc


_UNION_TAGS = {("sources", 2): {"postgres", "rest", "files"}}


def _without_union_tags(loc: tuple[Any, ...]) -> list[Any]:
    """Pydantic puts the tag of a discriminated union in the path (sources.shop.postgres.streams...): drop it."""
    parts = list(loc)
    if len(parts) > 2 and parts[0] == "sources" and parts[2] in _UNION_TAGS[("sources", 2)]:
        del parts[2]
    for index in range(len(parts) - 1, 0, -1):
        if parts[index - 1] == "partitions" and parts[index] in ("time", "key"):
            del parts[index]
    return parts


def _describe(error: Any) -> str:
    key_path = ".".join(str(part) for part in _without_union_tags(error["loc"]))
    if error["type"] == "union_tag_invalid":
        key_path += f".{error['ctx']['discriminator'].strip(chr(39))}"
    message = str(error["msg"]).removeprefix("Value error, ")
    if not key_path:  # whole-catalog checks put the key path in the message
        return message
    if error["type"] == "extra_forbidden":
        message = "unknown key (check its spelling against the README's catalog format)"
    elif error["type"] == "missing":
        message = "required key is missing"
    return f"{key_path}: {message}"
