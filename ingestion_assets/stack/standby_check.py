"""Before a promotion: does the standby follow the current primary (same system, timeline, upstream)?

A standby left behind by a restore still follows the stopped old primary: promoting it would silently roll
Dagster's storage back past the restore (checkpoints ahead of the target, rows skipped). So a promotion is
refused unless the standby is a replica of the server that is primary now."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import psycopg2
import psycopg2.extensions

from ingestion_assets.stack.embedded import EmbeddedPostgres, EmbeddedServerError


class PromotionRefused(RuntimeError):
    """The standby is not a replica of the current primary; nothing was stopped or promoted."""


@dataclass(frozen=True)
class Control:
    """What pg_controldata says of a data folder (readable whether its server runs or not)."""

    system: str
    timeline: int
    checkpoint_lsn: int


def control(server: EmbeddedPostgres) -> Control:
    out = server.run_tool(["pg_controldata", "-D", str(server.data_dir)]).stdout
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    try:
        return Control(
            fields["Database system identifier"],
            int(fields["Latest checkpoint's TimeLineID"]),
            lsn(fields["Latest checkpoint location"]),
        )
    except (KeyError, ValueError) as exc:
        raise EmbeddedServerError(f"pg_controldata of {server.data_dir} did not say {exc}") from exc


def lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


class NotStreaming(PromotionRefused):
    """The primary runs and the standby does not stream from it (yet: a standby just started connects soon)."""


def check_follows(standby: EmbeddedPostgres, primary: EmbeddedPostgres, patience: float = 15.0) -> list[str]:
    """Refuse unless `standby` replicates `primary`, and, while the primary runs, has replayed its WAL up to
    where it was at the check; returns notes (how far behind it may be) to print."""
    deadline = time.monotonic() + patience
    while True:
        try:
            notes = _check_once(standby, primary)
            break
        except NotStreaming:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    if primary.is_running():
        wait_caught_up(standby, primary, CATCH_UP_SECONDS)
    return notes


CATCH_UP_SECONDS = 10.0  # a standby that streams replays the primary's WAL within milliseconds


def wait_caught_up(standby: EmbeddedPostgres, primary: EmbeddedPostgres, patience: float) -> None:
    """Refuse unless the standby replays the running primary's WAL up to where it was now within `patience`:
    a standby whose WAL receiver or replay is stuck cannot finish a promotion (it would finish on its own
    later, a second primary) and would lose what it has not replayed."""
    wanted = _lsn_of(primary, "pg_current_wal_flush_lsn()")
    deadline = time.monotonic() + patience
    while (replayed := _lsn_of(standby, "pg_last_wal_replay_lsn()")) < wanted:
        if time.monotonic() > deadline:
            raise PromotionRefused(
                f"the standby under {standby.root} has replayed WAL only up to {_text(replayed)} after "
                f"{patience:.0f}s, while the running primary {primary.root} is at {_text(wanted)}: its WAL receiver "
                "or replay is stuck (see its server.log); nothing was stopped or promoted. Fix or rebuild the "
                "standby (remove that folder, `ingest up --standby`)"
            )
        time.sleep(0.2)


def _lsn_of(server: EmbeddedPostgres, expression: str) -> int:
    with contextlib.closing(psycopg2.connect(server.url(), connect_timeout=10)) as conn, conn.cursor() as cur:
        cur.execute(f"SELECT coalesce({expression}, '0/0')::text")
        row = cur.fetchone()
    return lsn(str(row[0])) if row else 0


def _text(position: int) -> str:
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


def _check_once(standby: EmbeddedPostgres, primary: EmbeddedPostgres) -> list[str]:
    with contextlib.closing(psycopg2.connect(standby.url(), connect_timeout=10)) as conn, conn.cursor() as cur:
        cur.execute(
            "SELECT pg_is_in_recovery(), current_setting('primary_conninfo'), system_identifier::text, "
            "coalesce(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::text FROM pg_control_system()"
        )
        in_recovery, conninfo, system, received = cur.fetchone() or (None, "", "", None)
        cur.execute("SELECT status, received_tli, sender_port FROM pg_stat_wal_receiver")
        receiver = cur.fetchone()
    if not in_recovery:
        raise PromotionRefused(f"{standby.root} is a primary of its own, not a standby: nothing to promote")
    ours, theirs = control(primary), control(standby)
    upstream = psycopg2.extensions.parse_dsn(conninfo).get("port") if conninfo else None
    where = f"the standby under {standby.root}"
    if upstream is None or int(upstream) != primary.port():
        raise PromotionRefused(
            f"{where} follows the server on port {upstream or '(none)'}, but the primary is {primary.root} on port "
            f"{primary.port()} (a restore or promotion replaced the server it followed): promoting it would roll "
            "Dagster's storage back. Rebuild it from the primary: remove that folder and run `ingest up --standby`"
        )
    if system != ours.system:
        raise PromotionRefused(f"{where} is a copy of another database system than the primary {primary.root}")
    timeline = int(receiver[1]) if receiver and receiver[1] else theirs.timeline
    if timeline != ours.timeline:
        raise PromotionRefused(
            f"{where} is on timeline {timeline}, the primary {primary.root} on timeline {ours.timeline}: it does not "
            "follow the primary's history; rebuild it (remove that folder, `ingest up --standby`)"
        )
    return _lag(where, primary, receiver, received, ours)


def _lag(
    where: str, primary: EmbeddedPostgres, receiver: tuple[str, int, int] | None, received: str | None, ours: Control
) -> list[str]:
    if primary.is_running() and (receiver is None or receiver[0] != "streaming"):
        raise NotStreaming(
            f"{where} is not streaming from the running primary {primary.root} (status "
            f"{receiver[0] if receiver else 'no WAL receiver'}): it may be far behind"
        )
    if received is not None and lsn(received) < ours.checkpoint_lsn:
        raise PromotionRefused(
            f"{where} has WAL up to {received}, older than the primary's last checkpoint: it stopped following "
            "long ago; rebuild it (remove that folder, `ingest up --standby`) or restore from the archive"
        )
    return [
        f"{where} had received WAL up to {received}; asynchronous replication may lose the last moments "
        "before the primary stopped (their checkpoints are older ones: the next runs only replay)"
    ]
