"""`ingest check`: fail fast, before any sync, on what would fail halfway through one."""

from __future__ import annotations

from ingestion_assets.catalog import Catalog, FilesSource, PostgresSource, PostgresStream, RestSource, TimePartitions
from ingestion_assets.errors import SourceUnavailable
from ingestion_assets.loading.destinations import target_names
from ingestion_assets.loading.naming import NameCollision
from ingestion_assets.references import UnresolvedReference, postgres_url
from ingestion_assets.settings import Settings
from ingestion_assets.sources.postgres import dry_run, plan_table_read
from ingestion_assets.sources.postgres.query import ReadPlan
from ingestion_assets.sources.postgres.reader import reaching
from ingestion_assets.sources.tls import TlsError

KEY_CHECK_SECONDS = 30.0  # a declared key's GROUP BY in `ingest check`: the source's statement_timeout for it


def check_catalog(settings: Settings, catalog: Catalog, notes: list[str] | None = None) -> list[str]:
    """Every problem found, each naming the source or stream (or the destination) and what to change; `notes`
    receives what was not checked, and why (a key check skipped or stopped by its time limit)."""
    from ingestion_assets.destination_check import check_destination

    notes = notes if notes is not None else []
    problems: list[str] = check_destination(settings, catalog)
    for source_name, source in catalog.sources.items():
        if isinstance(source, PostgresSource):
            problems += _check_postgres(settings, catalog, source_name, source, notes)
        elif isinstance(source, FilesSource):
            problems += _check_files(settings, catalog, source_name, source)
        else:
            problems += _check_rest(settings, catalog, source_name, source)
    return problems


def _check_files(settings: Settings, catalog: Catalog, source_name: str, source: FilesSource) -> list[str]:
    """Each stream's files can be listed (the storage answers, the credentials resolve)."""
    from ingestion_assets.sources.files import MissingLocation, StorageError
    from ingestion_assets.streams.files import FileSourceStream, relative_path
    from ingestion_assets.streams.files_partitions import unplaced

    problems: list[str] = []
    for stream_name, stream in source.streams.items():
        files = FileSourceStream(settings, catalog.destination, source_name, source, stream_name, stream)
        try:
            listed = files.files()
        except MissingLocation as exc:  # it names the stream and the url
            problems.append(f"{exc}: {exc.advice}")
            continue
        except (UnresolvedReference, StorageError, ValueError, ImportError) as exc:  # ImportError: no fsspec driver
            problems.append(f"stream {source_name}.{stream_name}: cannot list {stream.path}: {exc}")
            continue
        root = files.filesystem()[1]
        stray = unplaced(stream, [relative_path(f.path, root) for f in listed])
        if stray:
            problems.append(
                f"stream {source_name}.{stream_name}: {len(stray)} file(s) match {stream.path} but no partition "
                "reads them (their path does not match partitions.pattern or is dated before the first window: "
                "partitions.start, or the Sunday or 1st after it for weekly or monthly windows), "
                f"e.g. {stray[:3]}: narrow `path`, or fix the pattern or the start"
            )
    return problems


def _check_postgres(
    settings: Settings, catalog: Catalog, source_name: str, source: PostgresSource, notes: list[str]
) -> list[str]:
    where = f"sources.{source_name}.connection"
    try:
        url = postgres_url(source.connection, source.tls, settings, where)
    except (UnresolvedReference, TlsError) as exc:
        return [str(exc)]
    problems: list[str] = []
    try:
        with reaching(url, where, source.connection.describe()):
            if source.mode == "cdc":
                problems += _check_cdc(url, source_name, source)
            problems += _check_postgres_streams(catalog, url, source_name, source, notes)
    except SourceUnavailable as exc:
        return [*problems, str(exc)]
    return problems


def _check_postgres_streams(
    catalog: Catalog, url: str, source_name: str, source: PostgresSource, notes: list[str]
) -> list[str]:
    """Each stream's table and columns, its real read run with `LIMIT 0`, and a declared key's uniqueness."""
    import psycopg2

    problems: list[str] = []
    for stream_name, stream in source.streams.items():
        assert isinstance(stream, PostgresStream)
        name = f"stream {source_name}.{stream_name}"
        try:
            plan = plan_table_read(
                url, stream.schema_name, stream.table_name, tuple(stream.cursor), tuple(stream.primary_key)
            )
            views = source.mode != "cdc"  # a publication holds tables only: renaming in a view is no way out there
            problems += _target_name_problems(catalog, name, plan.shape.column_names, views)
            dry_run(url, plan)
            if source.mode != "cdc" and stream.write_disposition == "merge" and stream.primary_key:
                problems += _check_key(url, name, stream, notes)
            if source.mode != "cdc" and isinstance(stream.partitions, TimePartitions):
                problems += _check_windows(url, f"{source_name}.{stream_name}", stream, plan, notes)
        except psycopg2.Error as exc:
            if exc.pgcode is None:
                raise  # no answer from the server: the connection, said once for the source
            problems.append(f"{name}: its read fails on the server: {_first_line(exc)}")
            continue
        except LookupError as exc:
            problems.append(f"{name}: {exc}")
            continue
        if stream.reconcile.applies_deletes:
            problems += _check_reconcile(f"{source_name}.{stream_name}", stream, plan)
    return problems


def _check_windows(url: str, name: str, stream: PostgresStream, plan: ReadPlan, notes: list[str]) -> list[str]:
    """Rows no time window reads: before the first window or NULL fail the check (they would never load, as files
    dated before the start do); future-dated ones are a note (their window reads them when it comes)."""
    import datetime as dt

    import psycopg2.errors

    from ingestion_assets.partitions import windows_span
    from ingestion_assets.sources.postgres.outside import rows_outside
    from ingestion_assets.sources.postgres.reader import connect
    from ingestion_assets.streams.outside_windows import never_read, outside_text

    partitions = stream.partitions
    assert isinstance(partitions, TimePartitions)
    first, end = windows_span(partitions, dt.datetime.now(dt.UTC))
    conn = connect(url, "ingest-check-windows")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT set_config('statement_timeout', %s, false)", (f"{int(KEY_CHECK_SECONDS * 1000)}ms",))
        found = rows_outside(conn, plan, partitions.column, first.isoformat(), end.isoformat())
    except psycopg2.errors.QueryCanceled:
        notes.append(f"stream {name}: the rows in no time window were not counted within {KEY_CHECK_SECONDS:g} s")
        return []
    finally:
        conn.close()
    counted = {**found.__dict__, "column": partitions.column, "first_window": first.isoformat()}
    said = outside_text(name, {**counted, "newest_window_end": end.isoformat()})
    if said is None:
        return []
    if never_read(counted):
        return [said]
    notes.append(said)
    return []


def _check_key(url: str, name: str, stream: PostgresStream, notes: list[str]) -> list[str]:
    """A declared primary_key no unique index guarantees holds one row per value (the run checks it again on a
    stream's first full read: here it fails before any sync, and before a CDC-less view is trusted)."""
    from ingestion_assets.sources.postgres.reader import connect
    from ingestion_assets.sources.postgres.unique_key import look_at_key, repeated_key_error

    key = tuple(stream.primary_key)
    conn = connect(url, "ingest-check-key")
    try:
        look = look_at_key(conn, stream.schema_name, stream.table_name, key, KEY_CHECK_SECONDS)
    finally:
        conn.close()
    if look.guaranteed:
        notes.append(f"{name}: primary_key {list(key)} is unique by the source's own index: not looked at")
    elif look.timed_out:
        notes.append(
            f"{name}: primary_key {list(key)} has no unique index and its look for repeated values stopped "
            f"after {KEY_CHECK_SECONDS:g} s (statement_timeout): not checked here; a first full read checks it "
            "before loading"
        )
    elif look.repeated:
        return [repeated_key_error(name.removeprefix("stream "), key, list(look.repeated), look.count)]
    return []


def _target_name_problems(catalog: Catalog, stream: str, columns: list[str], views: bool) -> list[str]:
    try:
        target_names(catalog.destination).check(stream, columns, views)
    except NameCollision as exc:
        return [str(exc)]
    return []


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _check_reconcile(name: str, stream: PostgresStream, plan: ReadPlan) -> list[str]:
    """Deletes are detected by checksums of the key and cursor: every such column must have a canonical text."""
    from ingestion_assets.streams.reconcile import NotComparable
    from ingestion_assets.streams.reconcile.canonical import kind_of

    try:
        for column in [*stream.primary_key, *stream.cursor]:
            kind_of(plan.shape.column(column))
    except NotComparable as exc:
        return [f"stream {name}: reconcile.deletes cannot be detected: {exc}; remove `reconcile.deletes`"]
    return []


def _check_rest(settings: Settings, catalog: Catalog, source_name: str, source: RestSource) -> list[str]:
    """One small request per endpoint: credentials, scopes and paths fail here, not mid-sync."""
    from ingestion_assets.defs.assets import catalog_streams
    from ingestion_assets.sources.rest import ApiError, read_pages
    from ingestion_assets.streams.rest_api import RestApiStream

    problems: list[str] = []
    for stream in catalog_streams(settings, catalog):
        if not isinstance(stream, RestApiStream) or stream.source_name != source_name:
            continue
        try:
            with stream.client() as client:
                pages = read_pages(client, stream.endpoint(), None)
                next(pages, None)
                pages.close()
        except (ApiError, UnresolvedReference, TlsError) as exc:
            said = str(exc)  # a request's error names its stream already
            problems.append(
                said
                if said.startswith(f"stream {stream.qualified_name}: ")
                else f"stream {stream.qualified_name}: {said}"
            )
    return problems


def _check_cdc(url: str, source_name: str, source: PostgresSource) -> list[str]:
    """wal_level, slot, publication, replica identity and keys: what `mode: cdc` needs of the server."""
    import psycopg2

    from ingestion_assets.sources.postgres.cdc import DeclaredKey, check_cdc
    from ingestion_assets.streams.cdc.paused import unpublish_for_source

    slot = source.cdc.slot or f"ingest_{source_name}"
    publication = source.cdc.publication or f"ingest_{source_name}"
    tables = [(s.schema_name, s.table_name) for s in source.streams.values()]
    keys = [
        DeclaredKey(f"{source_name}.{name}", (s.schema_name, s.table_name), tuple(s.primary_key))
        for name, s in source.streams.items()
    ]
    try:
        # The one change a check makes: a table that lost its key leaves the product's own publication at
        # once, since while it is published the application's own UPDATEs and DELETEs on it fail.
        messages, said = unpublish_for_source(url, source_name, source)
        problems = [f"source {source_name} (cdc): {m}" for m in messages]
        # Else read-only: the run creates or extends the publication, and only once every check passed (a
        # table published without a key would make the application's own UPDATEs on it fail).
        found = check_cdc(url, slot, publication, tables, expect_slot=False, will_publish=True, keys=keys)
    except psycopg2.Error as exc:
        if exc.pgcode is None:
            raise  # no answer from the server: the connection, said once for the source
        return [f"source {source_name} (cdc): its checks fail on the server: {_first_line(exc)}"]
    unsaid = [p for p in found if p.subject.removeprefix("table ").replace('"', "") not in said]
    problems += [f"source {source_name} (cdc): {p}" for p in unsaid]
    return problems
