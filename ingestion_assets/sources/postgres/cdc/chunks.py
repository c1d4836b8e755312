"""History chunks read beside a running slot: a snapshot that knows exactly which transactions it sees.

A chunk read at any moment meets the log exactly: the transactions of the log that the chunk's snapshot
does not see are known by their xid (the snapshot's xmin, xmax and in-progress list), so the keys they
touched are left to the log, and every other row of the chunk is at least as new as the log before it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from ingestion_assets.sources.postgres.cdc.lsn import parse_lsn
from ingestion_assets.sources.postgres.reader import connect

_XID_SPACE = 1 << 32


@dataclass(frozen=True)
class ChunkSnapshot:
    """An exported snapshot (`name`), what it sees (`xmin`, `xmax`, `in_progress`: 64-bit xids), and `lsn`: the
    WAL insert position read right after it was taken, so every transaction it sees committed before `lsn`.

    `committed_unseen`: transactions it does not see whose sessions wait for a synchronous standby to confirm
    their commit: the commit is written and the log delivers it, yet it stays invisible to new snapshots until
    the standby answers (pg_stat_activity shows them to a role that may read every session's activity).
    """

    name: str
    xmin: int
    xmax: int
    in_progress: frozenset[int]
    lsn: int
    committed_unseen: frozenset[int] = frozenset()  # 32-bit xids it does not see, commits waiting for a standby

    def sees(self, xid: int) -> bool:
        """Whether a committed transaction (its 32-bit xid, as the log names it) is visible in the snapshot."""
        ahead = (xid - self.xmax) % _XID_SPACE  # the xid's distance past xmax, modulo wraparound
        if ahead < _XID_SPACE // 2:
            return False  # started at or after xmax: after the snapshot
        full = self.xmax - (_XID_SPACE - ahead)
        return full < self.xmin or full not in self.in_progress

    def unseen_of(self, xids: array[int]) -> list[int]:
        """Those of `xids` (32 bits, as the log names them; committed: the log delivered them) that the
        snapshot does not see: decoded once their commit record was flushed, still in the process table when it
        was taken (moments; as long as a synchronous standby takes to answer), listed as running or at or past
        its xmax."""
        if not xids:
            return []
        applied = pa.Array.from_buffers(pa.uint32(), len(xids), [None, pa.py_buffer(xids)])  # no copy
        ahead = pc.subtract(applied, pa.scalar(self.xmax % _XID_SPACE, pa.uint32()))  # wraps, as xids do
        unseen = pc.less(ahead, pa.scalar(_XID_SPACE // 2, pa.uint32()))
        if self.in_progress:
            running = pa.array([xid % _XID_SPACE for xid in self.in_progress], type=pa.uint32())
            unseen = pc.or_(unseen, pc.is_in(applied, value_set=running))
        return sorted(set(applied.filter(unseen).to_pylist()))


def parse_snapshot(text: str) -> tuple[int, int, frozenset[int]]:
    """`pg_current_snapshot()` as text: 'xmin:xmax:xip,xip,...'."""
    xmin, xmax, listed = text.split(":")
    return int(xmin), int(xmax), frozenset(int(x) for x in listed.split(",") if x)


@contextlib.contextmanager
def chunk_snapshot(url: str) -> Iterator[ChunkSnapshot]:
    """Open a repeatable-read transaction, export its snapshot and hold it until the block ends (readers
    import it by name with `use_snapshot`)."""
    conn = connect(url, "ingest-cdc-chunk")
    try:
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            # One statement: the snapshot is taken as it starts, the insert position read after it.
            cur.execute(
                "SELECT pg_export_snapshot(), pg_current_snapshot()::text, pg_current_wal_insert_lsn()::text, "
                "ARRAY(SELECT backend_xid::text FROM pg_stat_activity WHERE wait_event = 'SyncRep' "
                "AND backend_xid IS NOT NULL)"
            )
            name, snapshot, lsn, waiting = cur.fetchone()
            xmin, xmax, in_progress = parse_snapshot(snapshot)
            snap = ChunkSnapshot(name, xmin, xmax, in_progress, parse_lsn(lsn))
            unseen = frozenset(x for x in map(int, waiting) if not snap.sees(x))
            yield dataclasses.replace(snap, committed_unseen=unseen)
            cur.execute("COMMIT")
    finally:
        conn.close()


def wal_insert_position(url: str) -> int:
    """Where the server writes WAL now (no snapshot held: the log can be caught up to it first, so a copy's
    snapshot is then held only while the little written since is applied)."""
    conn = connect(url, "ingest-cdc-chunk")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_current_wal_insert_lsn()::text")
            return parse_lsn(cur.fetchone()[0])
    finally:
        conn.close()
