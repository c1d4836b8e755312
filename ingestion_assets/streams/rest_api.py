"""An HTTP API stream: pages read incrementally through the governed client, loaded and checkpointed in
slices of N pages, nested data split into child tables by dlt."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pyarrow as pa

from ingestion_assets.catalog import Destination, RestSource, RestStream
from ingestion_assets.loading.dead_letters import DEAD_LETTER_SCHEMA, dead_letter_limit, key_part
from ingestion_assets.loading.destinations import destination_label, target_names
from ingestion_assets.loading.metadata_columns import (
    DELETED_AT,
    EXTRACTED_AT,
    GENERATION,
    META,
    POSITION,
    version_text,
)
from ingestion_assets.loading.naming import TargetNames
from ingestion_assets.loading.pipeline import Loader, TargetTable, pipeline_name
from ingestion_assets.loading.targets import make_loader
from ingestion_assets.observe.commit_latency import CommitLatency
from ingestion_assets.references import resolve, tls_files
from ingestion_assets.settings import Settings
from ingestion_assets.sources.json_numbers import json_text
from ingestion_assets.sources.json_strings import SURROGATE_ESCAPE, lone_surrogate, surrogate_problem
from ingestion_assets.sources.rest import (
    Clock,
    EndpointSpec,
    FieldMissing,
    Page,
    PaginationSpec,
    RestClient,
    RetryPolicy,
    missing_everywhere,
    read_pages,
)
from ingestion_assets.sources.rest.incremental import unusable_field, usable
from ingestion_assets.sources.rest.read_ahead import BackgroundLoads, ReadAhead, favour_the_reader
from ingestion_assets.sources.slices import Slice
from ingestion_assets.streams.postgres_table import RunOptions, Target
from ingestion_assets.streams.rest_credentials import build_auth
from ingestion_assets.streams.rest_deletes import is_deletion, load_slice
from ingestion_assets.streams.rest_fields import name_collision, non_finite_fields, raw_text
from ingestion_assets.streams.rest_key_listing import KeyListingResult, retire_unlisted
from ingestion_assets.streams.rest_schema import ApiSchemaStep, api_schema_step
from ingestion_assets.sync import CheckpointSink, Faults, SliceOutcome, SyncResult, run_slices


@dataclass(frozen=True)
class RestApiStream:
    settings: Settings
    destination: Destination
    source_name: str
    source: RestSource
    name: str
    spec: RestStream
    # How time passes and where requests go: the system clock and the network unless a simulation swaps them.
    clock: Clock | None = field(default=None, repr=False, compare=False)
    transport: httpx.BaseTransport | None = field(default=None, repr=False, compare=False)

    @property
    def qualified_name(self) -> str:
        return f"{self.source_name}.{self.name}"

    def resume_position(self, position: dict[str, Any] | None, complete: bool) -> dict[str, Any] | None:
        """Incremental: after the last record. A full read resumes from its page token until complete."""
        if not self.spec.cursor and complete:
            return None
        return position

    def loader(self, target: Target, partition: str | None, plan: Any = None) -> Loader:
        return make_loader(
            settings=self.settings,
            destination=self.destination,
            target=TargetTable(
                dataset=self.source_name,
                table=target.table,
                primary_key=tuple(self.spec.primary_key),
                write_disposition=self.spec.write_disposition,
            ),
            pipeline_name=pipeline_name(self.source_name, target.table, partition),
            max_table_nesting=self.spec.max_table_nesting,
            # a refresh's shadow records its binding (and parks its rows) under the stream's name, as the table
            # it becomes: the swap leaves the stream's row in `_ingest_bindings` the one the checkpoint names
            stream_table=target.stream_table,
        )

    def endpoint(self) -> EndpointSpec:
        page = self.spec.pagination
        return EndpointSpec(
            path=self.spec.path,
            primary_key=tuple(self.spec.primary_key),
            records_path=self.spec.records_path,
            cursor_field=self.spec.cursor,
            cursor_param=self.spec.cursor_param if self.spec.cursor else None,
            pagination=PaginationSpec(
                style=page.style,
                size_param=page.size_param,
                token_path=page.token_path,
                token_param=page.token_param,
                page_param=page.page_param,
                offset_param=page.offset_param,
                after_param=page.after_param,
                has_more_path=page.has_more_path,
                id_field=page.id_field or self.spec.primary_key[0],
                stream=self.qualified_name,
            ),
            page_size=self.spec.page_size,
            params=dict(self.spec.params),
            overlap_seconds=self.spec.overlap_seconds,
        )

    def client(self) -> RestClient:
        where = f"sources.{self.source_name}"
        base = self.source.base_url
        base_url = base if isinstance(base, str) else resolve(base, self.settings, f"{where}.base_url")
        limits = self.source.http_retries
        tls = None if self.source.tls is None else tls_files(self.source.tls, self.settings, f"{where}.tls")
        return RestClient(
            base_url,
            build_auth(self.source.auth, base_url, self.settings, f"{where}.auth", tls),
            rate=self.source.rate_limit.requests_per_second,
            burst=self.source.rate_limit.burst,
            retry=RetryPolicy(
                max_attempts=limits.max_attempts,
                max_elapsed_seconds=limits.max_elapsed_seconds,
                max_rate_limited_seconds=limits.max_rate_limited_seconds,
            ),
            timeout=self.source.timeout_seconds,
            clock=self.clock,
            transport=self.transport,
            tls=tls,
        )

    def run(self, after: dict[str, Any] | None, sink: CheckpointSink, options: RunOptions) -> SyncResult:
        loader = options.loader or self.loader(options.target, options.partition)
        loader.run_id = options.run_id
        if after is None and loader.use_initial_load_path() and options.log is not None:
            options.log.info("%s: empty target, first full read: loading slices by append", self.qualified_name)
        client = self.client()
        slices = self._slices(client, after, read_ahead=options.read_ahead > 0)
        schema = options.schema if isinstance(options.schema, ApiSchemaStep) else api_schema_step(self, {})
        latency = CommitLatency.for_stream(self.spec.cursor, options.stored)

        def load(piece: Slice) -> SliceOutcome:
            if piece.index == 0:
                self._refuse_missing_field(piece.table)  # nothing loaded or parked yet
            good, dead = self._split(piece.table, options)  # this source's slices hold records, not Arrow
            good = schema.settle(good, loader)  # a change the policy pauses on stops before this slice loads
            loaded = load_slice(
                loader, good, dead, self.spec.deletes, schema.column_hints(), self.spec.cursor, self.qualified_name
            )
            latency.observe(good, dt.datetime.now(dt.UTC))  # committed: the load returned
            return SliceOutcome(loaded=loaded, dead_letters=0 if dead is None else dead.num_rows)

        # Reading ahead, the loads run below the page reader's CPU priority (the simulation keeps one thread).
        loads = BackgroundLoads() if options.read_ahead > 0 else None
        try:
            with favour_the_reader():  # the loader's Python work must not stall the page reader
                result = run_slices(
                    slices,
                    load if loads is None else lambda piece: loads.run(lambda: load(piece)),
                    sink,
                    started_from=after,
                    faults=options.faults or Faults.from_env(),
                    log=options.log,
                    stop=options.stop,
                    after_commit=lambda result: dead_letter_limit(self.qualified_name, self.spec.dead_letters, result),
                    read_ahead=0,  # pages are read ahead instead (below): a slice forms when the loader is free
                )
            result.figures = client.figures.as_metadata()
            latency.finish(result.details, result.figures)
            return result
        finally:
            slices.close()  # stops the page reader before its client closes
            client.close()
            if loads is not None:
                loads.close()

    def retire_unlisted(self, loader: Loader) -> KeyListingResult | None:
        """After a completed read: the periodic key listing, if the stream has one and it is due."""
        if self.spec.deletes is None or self.spec.deletes.key_listing is None:
            return None
        with self.client() as client:
            return retire_unlisted(client, self.endpoint(), loader, self.spec.deletes, self.qualified_name)

    def _slices(
        self, client: RestClient, after: dict[str, Any] | None, read_ahead: bool
    ) -> Generator[Slice, None, None]:
        """Slices of `pages_per_slice` pages, a slice's position its last page's. With `read_ahead`, pages are
        fetched into a bounded queue in a thread while the loader works, and a slice also takes the pages
        already waiting (up to `max_pages_per_slice`, if set): reading does not wait on loading, and a loader
        that falls behind may catch up with fewer, larger loads. A slice first waits (up to `gather_seconds`)
        for the queue to fill or the read to end: loads that start while the read is ahead take the cores
        the page reader needs between an answer and the next request. Without `read_ahead` (the simulation)
        all runs in one thread."""
        pages = read_pages(client, self.endpoint(), after)
        spec = self.spec
        if not read_ahead:
            yield from self._fixed_slices(pages)
            return
        ahead = ReadAhead(pages, spec.read_ahead_pages)
        try:
            index = 0
            most = max(spec.pages_per_slice, spec.max_pages_per_slice or 0)
            while batch := ahead.take(spec.pages_per_slice, most, gather=spec.gather_seconds):
                yield Slice([r for page in batch for r in page.records], dict(batch[-1].position), index)
                index += 1
        finally:
            ahead.close()

    def _fixed_slices(self, pages: Iterator[Page]) -> Iterator[Slice]:
        pending: list[dict[str, Any]] = []
        count, index = 0, 0
        position: dict[str, Any] = {}
        for page in pages:
            pending.extend(page.records)
            position, count = page.position, count + 1
            if count == self.spec.pages_per_slice:
                yield Slice(pending, dict(position), index)
                pending, count, index = [], 0, index + 1
        if count:
            yield Slice(pending, dict(position), index)

    def _split(self, records: list[Any], options: RunOptions) -> tuple[list[dict[str, Any]], pa.Table | None]:
        """Records without their primary key, or not objects at all, are parked; the rest get metadata."""
        now = dt.datetime.now(dt.UTC)
        names = target_names(self.destination)  # once per slice, not per record
        good, dead = [], []
        for record in records:
            problem = self._problem(record, names)
            if problem is not None:
                dead.append(self._dead_letter(record, problem, options, now))
                continue
            version = record.get(self.spec.cursor) if self.spec.cursor else None
            if not usable(version):  # a full read, or a tombstone with only its key: its version is when it was read
                version = now.isoformat()
            good.append(
                {
                    **record,
                    EXTRACTED_AT: now,
                    POSITION: version_text(version),
                    GENERATION: options.target.generation,
                    DELETED_AT: None,
                    META: None,
                }
            )
        return good, pa.Table.from_pylist(dead, schema=DEAD_LETTER_SCHEMA) if dead else None

    def _problem(self, record: Any, names: TargetNames) -> str | None:
        if not isinstance(record, dict):
            return f"record is a JSON {type(record).__name__}, not an object"
        if (unusable := self._unusable_key_or_cursor(record)) is not None:
            return unusable
        text = json_text(record)
        if len(text) > self.spec.dead_letters.max_value_bytes:
            return f"record of {len(text):,} bytes is over the size limit of {self.spec.dead_letters.max_value_bytes:,}"
        if "\\u0000" in text and (fields := _nul_fields(record)):
            into = destination_label(self.destination)
            return (
                f"field(s) {fields} hold a NUL character (\\u0000), which the load into {into} would not keep as "
                "written (it drops the character or refuses the row)"
            )
        if SURROGATE_ESCAPE.search(text) and (lone := lone_surrogate(record)) is not None:
            return surrogate_problem(lone)  # Arrow cannot encode it: the whole load failed
        if ("NaN" in text or "Infinity" in text) and (fields := non_finite_fields(record)):
            return (
                f"field(s) {fields} hold NaN or Infinity (not JSON numbers), which the load would write as NULL; "
                'the raw record shows them as the strings "NaN", "Infinity", "-Infinity"'
            )
        if (collision := name_collision(record, names, self.spec.max_table_nesting, self.name)) is not None:
            return f"stream {self.qualified_name}: {collision}"
        return None

    def _tombstone(self, record: dict[str, Any]) -> bool:
        marker = self.spec.deletes.marker if self.spec.deletes is not None else None
        return marker is not None and is_deletion(record, marker)

    def _unusable_key_or_cursor(self, record: dict[str, Any]) -> str | None:
        """Why a record cannot be merged (its key) or ordered (its cursor), naming the stream, field and value. A
        tombstone needs only its key: many APIs' delete events carry no cursor (it is placed by when it was read)."""
        cursor = None if self._tombstone(record) else self.spec.cursor
        if (unusable := unusable_field(record, self.spec.primary_key, cursor)) is None:
            return None
        setting, why = unusable
        advice = f"if every record is like this, check the stream's {setting} in the catalog"
        return f"stream {self.qualified_name}: {why}; {advice}"

    def _refuse_missing_field(self, records: list[Any]) -> None:
        """Every record of the run's first slice lacks the same key or cursor field: the catalog names a field the
        API does not send. Parking them all (a small run under the dead-letter limit "succeeded" with nothing
        loaded) would hide a setting to fix; the run stops at once instead."""
        records = [r for r in records if not (isinstance(r, dict) and self._tombstone(r))]  # key-only, rightly
        if (missing := missing_everywhere(records, self.spec.primary_key, self.spec.cursor)) is None:
            return
        setting, name = missing
        fields = sorted(str(k) for k in records[0])
        shown = f"{fields[:20]}{' ...' if len(fields) > 20 else ''}"
        raise FieldMissing(
            f"stream {self.qualified_name}: none of the {len(records)} records of the run's first page(s) has the "
            f"{'primary key' if setting == 'primary_key' else 'cursor'} field {name!r} (a record's fields: {shown}): "
            f"set the stream's `{setting}` in the catalog to a field the API sends; nothing was loaded or parked"
        )

    def _dead_letter(self, record: Any, problem: str, options: RunOptions, now: dt.datetime) -> dict[str, Any]:
        keys = [record.get(k) for k in self.spec.primary_key] if isinstance(record, dict) else []
        cursor = record.get(self.spec.cursor) if isinstance(record, dict) and self.spec.cursor else None
        key = "|".join("" if k is None else key_part(str(k)) for k in keys)
        return {
            "stream": self.name,
            "partition": options.partition or "",
            "record_key": _storable(key) or _fingerprint(record),
            "run_id": options.run_id,
            "position": json_text({self.spec.cursor: cursor} if self.spec.cursor else {}),
            "error": problem,
            "raw_record": raw_text(record),
            "dead_lettered_at": now,
        }


def _nul_fields(value: Any, path: str = "") -> list[str]:
    """The dotted paths of the strings (values or keys) in a record that hold a NUL character."""
    if isinstance(value, str):
        return [path or "."] if "\x00" in value else []
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            found += ([where] if "\x00" in str(key) else []) + _nul_fields(item, where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _nul_fields(item, f"{path}[{index}]")
    return found


def _storable(text: str) -> str:
    """A key as text any target stores: a lone surrogate in it written as its escape (`\\ud800`)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _fingerprint(record: Any) -> str:
    """A stable key for a record that has none, so re-reading it updates its entry instead of adding one."""
    return "unkeyed:" + hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:16]
