"""An open pgoutput stream from a logical replication slot: started with psycopg2, its messages read and
its status written by `copydata.CopyBoth`, so the slot moves only through `send_flush` (see copydata.py for
what psycopg2's own reader would send).

A stream sends no periodic status and sets its own wal_sender_timeout beyond the read, so the server never
asks an idle reader for a reply. A server that asks all the same is shutting down: it waits for its client
to confirm everything sent, so the stream closes at once (a fast shutdown is not held up) and raises
SourceStopping; the next run resumes from its stored checkpoint.
"""

from __future__ import annotations

import select
import types
from typing import Any

import psycopg2
import psycopg2.extras

from ingestion_assets.sources.postgres.cdc.copydata import CopyBoth, CopyBothError
from ingestion_assets.sources.postgres.cdc.errors import (
    CdcError,
    SlotInUseError,
    SlotMissingError,
    SourceStopping,
    StreamLost,
)
from ingestion_assets.sources.postgres.cdc.lsn import format_lsn, parse_lsn
from ingestion_assets.sources.postgres.cdc.messages import Message
from ingestion_assets.sources.postgres.cdc.pgoutput import Decoder
from ingestion_assets.sources.postgres.cdc.slots import valid_slot_name, wait_until_free


def protocol_version(server_version: int) -> int:
    """The newest pgoutput protocol the server speaks: 1 (10-13), 2 streaming (14), 3 two-phase (15), 4 (16+)."""
    if server_version >= 160000:
        return 4
    if server_version >= 150000:
        return 3
    if server_version >= 140000:
        return 2
    return 1


def replication_connection(url: str, session_seconds: float, work_mem_kb: int | None = None) -> Any:
    """A logical replication connection whose walsender will not ask for a reply within `session_seconds`."""
    timeout_ms = int((2 * session_seconds + 60) * 1000)
    # Values come as the walsender's output functions print them: make that the text COPY reads print too.
    options = (
        f"-c wal_sender_timeout={timeout_ms} -c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=iso_8601"
        " -c extra_float_digits=3 -c bytea_output=hex"
    )
    if work_mem_kb is not None:
        options += f" -c logical_decoding_work_mem={int(work_mem_kb)}kB"
    return psycopg2.connect(
        url,
        connection_factory=psycopg2.extras.LogicalReplicationConnection,
        options=options,
        client_encoding="UTF8",
        application_name="ingest-cdc",
    )


class ReplicationStream:
    """START_REPLICATION on `slot` from `start_lsn`; `next()` returns decoded messages in stream order."""

    def __init__(
        self,
        url: str,
        slot: str,
        publication: str,
        start_lsn: int = 0,
        *,
        streaming: bool = False,
        messages: bool = False,
        session_seconds: float = 60.0,
        work_mem_kb: int | None = None,
        slot_wait_seconds: float = 10.0,
    ) -> None:
        self.url, self.slot, self.publication, self.start_lsn = url, valid_slot_name(slot), publication, start_lsn
        self.streaming, self.messages = streaming, messages
        self.session_seconds, self.work_mem_kb, self.slot_wait_seconds = session_seconds, work_mem_kb, slot_wait_seconds
        self.decoder = Decoder()
        self.wal_end = 0  # the furthest WAL position the server reported, from data messages and keepalives
        self.server_lsn = 0  # the server's flushed WAL position when the stream started
        self.proto_version = 0
        self._conn: Any = None
        self._cur: Any = None
        self._copy: CopyBoth | None = None

    def __enter__(self) -> ReplicationStream:
        self._conn = replication_connection(self.url, self.session_seconds, self.work_mem_kb)
        try:
            self._cur = self._conn.cursor()
            self._preflight()
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn, self._copy = None, None

    def _preflight(self) -> None:
        """Fail with the fix rather than stream nothing: PostgreSQL 16+ skips a missing publication silently."""
        self._cur.execute("SELECT count(*) FROM pg_publication WHERE pubname = %s", (self.publication,))
        if self._cur.fetchone()[0] == 0:
            raise CdcError(
                f"publication {self.publication!r} does not exist in this database; create it with "
                f"ensure_publication() or CREATE PUBLICATION {self.publication} FOR TABLE ..."
            )
        row = wait_until_free(self._cur, self.slot, self.slot_wait_seconds)
        if row["plugin"] != "pgoutput" or row["database"] != row["current_database"]:
            raise CdcError(
                f"replication slot {self.slot!r} uses plugin {row['plugin']!r} in database {row['database']!r}; "
                f"this reader needs a pgoutput slot in {row['current_database']!r}: use another slot name"
            )
        self._cur.execute("IDENTIFY_SYSTEM")
        self.server_lsn = parse_lsn(self._cur.fetchone()[2])

    def _start(self) -> None:
        self.proto_version = protocol_version(self._conn.server_version)
        options = {"proto_version": str(self.proto_version), "publication_names": self.publication}
        if self.proto_version >= 2:
            options["messages"] = "true" if self.messages else "false"
            options["streaming"] = "on" if self.streaming else "off"
        elif self.streaming:
            raise CdcError("streaming of in-progress transactions needs PostgreSQL 14 or newer")
        try:
            self._cur.start_replication(
                slot_name=self.slot,
                decode=False,
                start_lsn=self.start_lsn,
                options=options,
            )
        except psycopg2.errors.UndefinedObject as exc:
            raise SlotMissingError(f"replication slot {self.slot!r} does not exist: {exc}") from exc
        except psycopg2.errors.ObjectInUse as exc:
            raise SlotInUseError(f"replication slot {self.slot!r} was taken by another process: {exc}") from exc
        self._copy = CopyBoth(self._conn)

    def next(self, timeout: float) -> tuple[int, Message] | None:
        """The next message and the WAL position the server gave it, or None after `timeout` seconds."""
        message = self._read()
        if message is None and timeout > 0:
            select.select([self._conn], [], [], timeout)
            message = self._read()
        if message is None:
            return None
        return message[0], self.decoder.decode(message[1])

    def send_flush(self, lsn: int) -> None:
        """Report everything before `lsn` stored: the slot moves there, and only there."""
        try:
            self._open().send_status(lsn)
        except CopyBothError as exc:
            kind = StreamLost if exc.lost else CdcError
            raise kind(f"acknowledging {format_lsn(lsn)} on slot {self.slot!r} failed: {exc}") from exc

    def _read(self) -> tuple[int, bytes] | None:
        copy = self._open()
        try:
            message = copy.read()
        except CopyBothError as exc:
            kind = StreamLost if exc.lost else CdcError
            resumes = "; the slot stays at the last stored checkpoint, where a retry resumes" if exc.lost else ""
            raise kind(
                f"reading replication slot {self.slot!r} (publication {self.publication!r}; session started at "
                f"{format_lsn(self.start_lsn)}, WAL seen up to {format_lsn(max(self.wal_end, copy.wal_end))}) "
                f"failed: {exc}{resumes}"
            ) from exc
        self.wal_end = max(self.wal_end, copy.wal_end)
        if copy.reply_asked:
            self.close()
            raise SourceStopping(
                f"the server of replication slot {self.slot!r} asked the reader to confirm what it was sent: it is "
                "shutting down. The session was closed so as not to hold the shutdown up; the slot stays at the "
                "last stored checkpoint, and the next run resumes from there"
            )
        return message

    def _open(self) -> CopyBoth:
        if self._copy is None:
            raise CdcError(f"replication slot {self.slot!r}: the stream is closed")
        return self._copy
