"""`ingest dlq discard`: a person closes dead letters on purpose (a row gone from the source, one that came back
under another key), and the discard is recorded on the stream's asset in Dagster."""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
from typing import Any

from ingestion_assets.errors import ServerUnavailable
from ingestion_assets.settings import Settings

DISCARDED = "ingest/dead letters discarded"  # the observation's metadata entry: what left, when, why, by whom
RECORDED_KEYS = 1000  # dead letters named one by one in that entry; past it, only counted
_ERROR_CHARS = 300


def dlq_discard(settings: Settings, args: argparse.Namespace) -> int:
    """A dry run unless --yes; an unknown key is an error and nothing leaves."""
    from ingestion_assets.cli.quality import replay_failures, stream_and_store
    from ingestion_assets.loading.parked import UnknownDeadLetters, discard_parked

    stream, store = stream_and_store(settings, args.stream)
    name = stream.qualified_name
    latest = store.latest(None)
    loader = dead_letter_loader(stream, max(int(latest.details.get("generation", 1)) if latest else 1, 1))
    failures: tuple[type[BaseException], ...] = (ServerUnavailable, *replay_failures())  # destination down, locked
    try:
        rows = discard_parked(loader, None if args.all else args.key, apply=args.yes)
    except UnknownDeadLetters as exc:
        unknown, parked = exc.args
        raise SystemExit(
            f"error: {name}: no dead letter with key {', '.join(map(repr, unknown))} ({parked} key(s) parked; "
            f"`ingest dlq list {name}` prints them as --key takes them): nothing discarded"
        ) from exc
    except failures as exc:
        text = " ".join(str(exc).split()) or type(exc).__name__
        said = f"error: {name}: dlq discard failed: {text} (`ingest dlq list {name}`: what is parked)"
        raise SystemExit(said) from exc
    if not rows:
        print(f"{name}: no parked rows: nothing to discard")
        return 0
    verb = "discarded" if args.yes else "would discard"
    for row in rows:
        partition = f" partition {row['partition']}" if row["partition"] else ""
        print(f"  {verb} key {row['record_key']}{partition}  ({row['error']})")
    if not args.yes:
        print(f"{name}: {len(rows)} dead letter(s) would be discarded; dry run, nothing removed: add --yes")
        return 0
    _record(store, rows, args.reason)
    print(
        f"{name}: {len(rows)} dead letter(s) discarded"
        f"{f' ({args.reason})' if args.reason else ''}; recorded on the asset as `{DISCARDED}`"
    )
    return 0


def dead_letter_loader(stream: Any, generation: int = 1) -> Any:
    """The stream's loader, for its dead letters only: a table stream's is given no source columns, so it never
    reads the source (gone or down, which is when a person lists or discards what it left parked)."""
    from ingestion_assets.sources.postgres.introspect import TableShape
    from ingestion_assets.sources.postgres.query import ReadPlan
    from ingestion_assets.streams.postgres_table import PostgresTableStream, Target

    plan = None
    if isinstance(stream, PostgresTableStream):
        plan = ReadPlan(TableShape(stream.source_name, stream.name, ()), (), tuple(stream.spec.primary_key))
    return stream.loader(Target(stream.name, generation), None, plan)


def _record(store: Any, rows: list[dict[str, Any]], reason: str | None) -> None:
    """An observation of the stream's asset (the Dagster UI's events of the asset): not a checkpoint, so no run
    reads it back; the dead letters' raw records are not kept (`ingest dlq list` before discarding shows them)."""
    import dagster as dg

    named = [
        {
            "key": row["record_key"],
            "partition": row["partition"] or None,
            "error": str(row["error"])[:_ERROR_CHARS],
            "parked by run": row["run_id"],
            "parked at": _text(row["dead_lettered_at"]),
        }
        for row in rows[:RECORDED_KEYS]
    ]
    entry = {
        "count": len(rows),
        "reason": reason,
        "by": _user(),
        "at": dt.datetime.now(dt.UTC).isoformat(),
        "dead letters": named,
        "not named (over the limit)": len(rows) - len(named),
    }
    metadata = {DISCARDED: dg.MetadataValue.json(entry), "dead letters discarded": len(rows)}
    store.observe(metadata)


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name in this environment (a container's numeric user)
        return None


def _text(value: Any) -> str | None:
    return value.isoformat() if isinstance(value, dt.datetime) else None if value is None else str(value)
