"""The replication protocol's CopyData messages, read and written through libpq on psycopg2's own connection.

psycopg2's reader answers a keepalive that asks for a reply by itself, and when it holds that everything it
received was confirmed (always, before the first data message) it first moves the position it reports to the
keepalive's WAL end. A server shutting down asks exactly so, after its shutdown checkpoint: the slot was then
acknowledged past the stored checkpoint, and saved there when it took a new restart point on the way (a
standby snapshot the server logs every 15 s). Reading here, nothing is ever sent that the caller did not write.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import struct
from typing import Any

import psycopg2._psycopg

# dlsym on psycopg2's extension finds libpq's functions in the library it was linked with, binary wheel or not.
_PQ = ctypes.CDLL(psycopg2._psycopg.__file__)
_PQ.PQgetCopyData.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
_PQ.PQconsumeInput.argtypes = [ctypes.c_void_p]
_PQ.PQfreemem.argtypes = [ctypes.c_void_p]
_PQ.PQfreemem.restype = None
_PQ.PQputCopyData.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
_PQ.PQflush.argtypes = [ctypes.c_void_p]
_PQ.PQerrorMessage.argtypes = [ctypes.c_void_p]
_PQ.PQerrorMessage.restype = ctypes.c_char_p
_PQ.PQgetResult.argtypes = [ctypes.c_void_p]
_PQ.PQgetResult.restype = ctypes.c_void_p
_PQ.PQresultErrorField.argtypes = [ctypes.c_void_p, ctypes.c_int]
_PQ.PQresultErrorField.restype = ctypes.c_char_p
_PQ.PQresultErrorMessage.argtypes = [ctypes.c_void_p]
_PQ.PQresultErrorMessage.restype = ctypes.c_char_p
_PQ.PQclear.argtypes = [ctypes.c_void_p]
_PQ.PQclear.restype = None
_SQLSTATE = ord("C")  # PG_DIAG_SQLSTATE

_XLOG_DATA = struct.Struct(">QQq")  # 'w': data start, WAL end, send time
_KEEPALIVE = struct.Struct(">Qq?")  # 'k': WAL end, send time, reply requested
_STATUS = struct.Struct(">cQQQq?")  # 'r': written, flushed, applied, now, reply requested
_PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)


class CopyBothError(Exception):
    """The stream failed or ended; the message is libpq's or the server's. `sqlstate`: the server's error code
    when it ended the stream with one; `lost`: the connection broke, or the server ended the stream because an
    operator or its shutdown ended the session (class 57, connection class 08), not because of what was asked."""

    def __init__(self, message: str, sqlstate: str | None = None, lost: bool = False) -> None:
        super().__init__(message)
        self.sqlstate, self.lost = sqlstate, lost


class CopyBoth:
    """`read()` returns the next data message as (data start, payload), or None when none is ready. Keepalives
    are taken in: `wal_end` is the furthest WAL end the server reported, `reply_asked` whether one asked for a
    status update (never answered here). `send_status(lsn)` reports `lsn` written and flushed."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn  # kept: its PGconn lives as long as the psycopg2 connection
        self._pg = ctypes.c_void_p(conn.pgconn_ptr)
        self.wal_end = 0
        self.reply_asked = False

    def read(self) -> tuple[int, bytes] | None:
        consumed = False
        while True:
            buffer = ctypes.c_void_p()
            size = _PQ.PQgetCopyData(self._pg, ctypes.byref(buffer), 1)
            if size == 0:
                if consumed:
                    return None
                if not _PQ.PQconsumeInput(self._pg):
                    raise CopyBothError(self._error(), lost=True)
                consumed = True
                continue
            if size == -1:
                raise self._ended()
            if size < 0:
                raise CopyBothError(self._error(), lost=True)
            try:
                message = ctypes.string_at(buffer, size)
            finally:
                _PQ.PQfreemem(buffer)
            data = self._take(message)
            if data is not None:
                return data

    def _take(self, message: bytes) -> tuple[int, bytes] | None:
        kind = message[:1]
        if kind == b"w" and len(message) > 1 + _XLOG_DATA.size:
            start, end, _sent = _XLOG_DATA.unpack_from(message, 1)
            self.wal_end = max(self.wal_end, end)
            return start, message[1 + _XLOG_DATA.size :]
        if kind == b"k" and len(message) >= 1 + _KEEPALIVE.size:
            end, _sent, reply = _KEEPALIVE.unpack_from(message, 1)
            self.wal_end = max(self.wal_end, end)
            self.reply_asked = self.reply_asked or reply
            return None
        raise CopyBothError(f"unexpected replication message {kind!r} of {len(message)} bytes")

    def send_status(self, lsn: int) -> None:
        now = int((dt.datetime.now(dt.UTC) - _PG_EPOCH).total_seconds() * 1_000_000)
        status = _STATUS.pack(b"r", lsn, lsn, lsn, now, False)
        if _PQ.PQputCopyData(self._pg, status, len(status)) != 1 or _PQ.PQflush(self._pg) != 0:
            raise CopyBothError(self._error(), lost=True)

    def _ended(self) -> CopyBothError:
        """The server ended the copy: its final result says why (a terminated session says so with 57P01)."""
        sqlstate, said = None, ""
        while (result := _PQ.PQgetResult(self._pg)) is not None:
            try:
                code = _PQ.PQresultErrorField(result, _SQLSTATE)
                if code and sqlstate is None:
                    sqlstate = code.decode("ascii", "replace")
                    said = (_PQ.PQresultErrorMessage(result) or b"").decode("utf-8", "replace").strip()
            finally:
                _PQ.PQclear(result)
        said = said or self._error() or "(no error given)"
        lost = sqlstate is None or sqlstate.startswith(("57", "08"))
        return CopyBothError(f"the server ended the stream: {said}", sqlstate=sqlstate, lost=lost)

    def _error(self) -> str:
        said = _PQ.PQerrorMessage(self._pg) or b""
        return said.decode("utf-8", "replace").strip()
