"""The catalog of PostgreSQL sources: table streams, their cursor, partitions, schema and bad-row policies."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from ingestion_assets.catalog.base import DeadLetters, Freshness, Reference, Retries, Tls, _Model, as_list, valid_cron


class TimePartitions(_Model):
    """Backfill chunks by a time column: one Dagster partition per hour, day, week or month (UTC)."""

    by: Literal["time"]
    column: str = Field(description="partition on the cursor column so updated rows move to the newest partition")
    start: dt.date
    granularity: Literal["hourly", "daily", "weekly", "monthly"] = "daily"


class KeyPartitions(_Model):
    """Backfill chunks by integer key ranges of `chunk` keys, plus a `live` partition for changes."""

    by: Literal["key"]
    column: str | None = Field(None, description="an integer column; default: the (single) primary key")
    chunk: Annotated[int, Field(gt=0)]
    live: bool = Field(True, description="add the `live` partition: incremental by cursor over the whole table")


class LateCommits(_Model):
    """How a polled stream keeps its checkpoint behind transactions that may still commit older rows."""

    enabled: bool = Field(True, description="false: checkpoint at the last row read (writers never commit late)")
    wait_seconds: Annotated[float, Field(ge=0)] = Field(
        5.0, description="before reading, wait this long at most for transactions open at the run's start to end"
    )
    max_reader_seconds: Annotated[float, Field(gt=0)] | None = Field(
        3600.0,
        description="a transaction open this long without writing anything is taken for a reader (report, "
        "pg_dump) and no longer holds the checkpoint back (a warning names it); null: never",
    )


SchemaPolicy = Literal["evolve", "propagate", "columns_only", "pause", "ignore"]


class Reconcile(_Model):
    """What each run compares with the target, how often the whole table is compared, and what a full
    comparison does with target rows the source no longer has (polling cannot see hard deletes)."""

    scope: Literal["window", "full", "off"] = Field(
        "window", description="every run: the rows it read (window), the whole table or partition (full), nothing"
    )
    full_every_seconds: Annotated[float, Field(ge=0)] | None = Field(
        None, description="also compare the whole table (or partition) when the last full comparison is this old"
    )
    deletes: Literal["report", "hard", "soft"] = Field(
        "report",
        description="rows a full comparison finds only in the target: report them, delete them, or keep them "
        "with _ingest_deleted_at set",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_scope(cls, value: Any) -> Any:
        """`reconcile: window` (the shape before deletes could be detected) stays valid; YAML reads a bare
        `off` as false."""
        if value is False:
            return {"scope": "off"}
        return {"scope": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _deletes_need_full(self) -> Reconcile:
        if self.deletes != "report" and self.scope != "full" and self.full_every_seconds is None:
            raise ValueError(
                "deletes are found by a full comparison: set `full_every_seconds` (or `scope: full`) with `deletes`"
            )
        return self

    @property
    def applies_deletes(self) -> bool:
        return self.deletes != "report"


def split_table_name(value: str) -> tuple[str, str]:
    """`schema.table` or `table` (schema public) into its two names, each as it is (no case folding), or in
    double quotes as SQL writes it (`"my.schema"."Weird Table"`, a quote doubled inside), which lets a name hold
    a dot or a quote."""
    parts: list[str] = []
    rest = value
    while True:
        if rest.startswith('"'):
            end, name = 1, []
            while end < len(rest):
                if rest[end] == '"' and rest[end + 1 : end + 2] == '"':
                    name.append('"')
                    end += 2
                elif rest[end] == '"':
                    break
                else:
                    name.append(rest[end])
                    end += 1
            else:
                raise ValueError(f"unterminated quoted name in {value!r}")
            parts.append("".join(name))
            rest = rest[end + 1 :]
        else:
            name_end = rest.find(".") if "." in rest else len(rest)
            parts.append(rest[:name_end])
            rest = rest[name_end:]
        if not rest:
            break
        if not rest.startswith(".") or len(parts) > 1:
            raise ValueError(f"expected `schema.table` or `table` (a name may be double-quoted), got {value!r}")
        rest = rest[1:]
    if "" in parts or len(parts) > 2:
        raise ValueError(f"expected `schema.table` or `table` (a name may be double-quoted), got {value!r}")
    return ("public", parts[0]) if len(parts) == 1 else (parts[0], parts[1])


class PostgresStream(_Model):
    table: str = Field(description="`schema.table` or `table` (schema public)")
    primary_key: list[str] = Field(min_length=1)
    cursor: list[str] = Field(default_factory=list, description="cursor column(s); empty: full read")
    write_disposition: Literal["merge", "append", "replace"] = "merge"
    slice_rows: Annotated[int, Field(gt=0)] = 250_000
    lookback_seconds: Annotated[float, Field(ge=0)] = Field(
        0.0,
        description="re-read this far behind the checkpoint's cursor (a timestamp): catches rows written late "
        "with a cursor at or before it (clock resolution, long transactions); the merge absorbs the re-read",
    )
    late_commits: LateCommits = Field(default_factory=lambda: LateCommits())
    partitions: Annotated[TimePartitions | KeyPartitions, Field(discriminator="by")] | None = None
    max_partitions_per_run: Annotated[int, Field(gt=0)] | Literal["all"] = Field(
        "all",
        description="`all`: a backfill range is one run (what `dagster asset materialize --partition-range` "
        "needs); N: the UI launches runs of N partitions, in parallel up to the source's pool",
    )
    retries: Retries = Field(default_factory=lambda: Retries())
    drain_seconds: Annotated[float, Field(gt=0)] = 60.0
    schema_policy: SchemaPolicy = Field(
        "evolve",
        description="evolve: add columns, apply widened types, keep dropped ones, pause on incompatible changes; "
        "propagate: apply everything; columns_only: add columns, pause on type changes; pause: pause on any "
        "change; ignore: skip added and dropped columns, pause on type changes",
    )
    dead_letters: DeadLetters = Field(default_factory=lambda: DeadLetters())
    reconcile: Reconcile = Field(
        default_factory=lambda: Reconcile(),
        description="after each run compare source and target (counts and key checksums): `window`, `full`, "
        "`off`, or {scope, full_every_seconds, deletes} to find and apply hard deletes on a cadence",
    )
    deletes: Literal["hard", "soft"] = Field(
        "hard", description="cdc: delete the row, or keep it with _ingest_deleted_at"
    )
    truncate: Literal["apply", "refuse"] = Field("refuse", description="cdc: empty the target on TRUNCATE, or stop")
    freshness: Freshness | None = Field(None, description="{max_lag, warn_lag}: how stale the stream may be")

    _listify = field_validator("primary_key", "cursor", mode="before")(as_list)

    @model_validator(mode="after")
    def _partitions_fit(self) -> PostgresStream:
        if self.partitions is None:
            return self
        if self.write_disposition == "replace":
            raise ValueError("a partitioned stream cannot `replace`: each partition is one chunk of the table")
        if isinstance(self.partitions, KeyPartitions):
            if self.partitions.column is None and len(self.primary_key) != 1:
                raise ValueError("key partitions over a composite primary key need `partitions.column`")
            if self.partitions.live and not self.cursor:
                raise ValueError("the `live` key partition needs a `cursor` (or set `partitions.live: false`)")
        return self

    @model_validator(mode="after")
    def _deletes_fit(self) -> PostgresStream:
        if self.reconcile.applies_deletes and self.write_disposition != "merge":
            raise ValueError(
                f"reconcile.deletes: {self.reconcile.deletes} needs write_disposition merge "
                "(append keeps every version; replace re-reads the whole table every run)"
            )
        return self

    @property
    def partition_column(self) -> str | None:
        if self.partitions is None:
            return None
        return self.partitions.column or self.primary_key[0]

    @field_validator("table")
    @classmethod
    def _table_shape(cls, value: str) -> str:
        split_table_name(value)  # raises ValueError with the form it expects
        return value

    @property
    def schema_name(self) -> str:
        return split_table_name(self.table)[0]

    @property
    def table_name(self) -> str:
        return split_table_name(self.table)[1]


class Cdc(_Model):
    """Log-based capture through a logical replication slot and a publication (both created if missing)."""

    slot: str | None = Field(None, description="default ingest_<source>")
    publication: str | None = Field(None, description="default ingest_<source>")
    max_changes: Annotated[int, Field(gt=0)] = 50_000
    max_seconds: Annotated[float, Field(gt=0)] = 10.0
    max_batches_per_run: Annotated[int, Field(gt=0)] = 20
    max_retained_wal_mb: Annotated[int, Field(gt=0)] = 1024
    on_wal_gap: Literal["fail", "resync"] = "fail"
    snapshot_slice_rows: Annotated[int, Field(gt=0)] = 250_000
    history_chunk: Annotated[int, Field(gt=0)] | None = Field(
        None,
        description="copy the history as Dagster backfill partitions of this many primary-key values (every "
        "stream needs one integer primary key column), beside the `live` partition that applies the log; "
        "unset: the first run copies all history under the slot's snapshot",
    )
    lock_wait_seconds: Annotated[float, Field(gt=0)] = Field(
        900.0, description="how long a run waits for another run of the source to release the slot"
    )
    retries: Retries = Field(default_factory=lambda: Retries())
    drain_seconds: Annotated[float, Field(gt=0)] = 60.0
    live_seconds: Annotated[float, Field(gt=0)] | None = Field(
        None,
        description="a log run stays up this long holding the replication session, loading and checkpointing "
        "each batch as it fills (cdc.max_changes or cdc.batch_seconds); SIGTERM drains it; unset: a run "
        "reads at most max_batches_per_run batches and ends when caught up",
    )
    batch_seconds: Annotated[float, Field(gt=0)] = Field(
        0.5, description="live runs: a batch is loaded at most this long after its first transaction arrived"
    )


class PostgresSource(_Model):
    type: Literal["postgres"]
    connection: Reference
    tls: Tls | None = Field(None, description="verify-full TLS (and client certificates) on every connection")
    mode: Literal["tables", "cdc"] = "tables"
    cdc: Cdc = Field(default_factory=lambda: Cdc())
    max_concurrency: Annotated[int, Field(gt=0)] = 4
    schedule: str | None = Field(None, description="cron: when the daemon syncs this source's streams")

    _cron = field_validator("schedule")(valid_cron)
    streams: dict[str, PostgresStream] = Field(min_length=1)

    @model_validator(mode="after")
    def _cdc_streams(self) -> PostgresSource:
        if self.mode == "cdc":
            detecting = [name for name, s in self.streams.items() if s.reconcile.applies_deletes]
            if detecting:
                raise ValueError(
                    f"cdc streams receive deletes from the log (`deletes: hard|soft`): drop `reconcile.deletes` "
                    f"of {detecting}"
                )
            partitioned = [name for name, s in self.streams.items() if s.partitions is not None]
            if partitioned:
                raise ValueError(
                    f"cdc streams copy their history under the slot's snapshot, or as `cdc.history_chunk` "
                    f"partitions of the source: drop `partitions` of {partitioned}"
                )
            if self.cdc.history_chunk is not None:
                composite = [name for name, s in self.streams.items() if len(s.primary_key) != 1]
                if composite:
                    raise ValueError(
                        f"cdc.history_chunk splits history by one integer primary key column; streams {composite} "
                        "have composite keys: unset history_chunk (one snapshot copy) or give them a single key"
                    )
                if self.cdc.on_wal_gap == "resync":
                    raise ValueError(
                        "cdc.on_wal_gap: resync re-copies history in one run, which history_chunk partitions do not "
                        "do: use on_wal_gap: fail, then `ingest state reset` and backfill the partitions again"
                    )
        return self
