"""Bounds-checked reads of the big-endian fields of one pgoutput message; every failure is a ProtocolError."""

from __future__ import annotations

import datetime as dt
import struct

from ingestion_assets.sources.postgres.cdc.errors import ProtocolError
from ingestion_assets.sources.postgres.cdc.messages import UNCHANGED_TOAST, Message, OldKind, TupleData, Value

PG_EPOCH = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
OLD_KINDS: dict[int, OldKind] = {ord("K"): "key", ord("O"): "full"}
_NULL, _TOAST, _TEXT, _BINARY = ord("n"), ord("u"), ord("t"), ord("b")
_I32 = struct.Struct(">i")


class FieldReader:
    """Reads big-endian fields from one message; every read is bounds-checked."""

    def __init__(self, payload: bytes, kind: int) -> None:
        self.data = payload
        self.offset = 1
        self.kind = chr(kind) if 32 <= kind < 127 else f"0x{kind:02x}"

    def fail(self, what: str, offset: int | None = None) -> ProtocolError:
        at = self.offset if offset is None else offset
        return ProtocolError(
            f"pgoutput message {self.kind!r}: {what} at offset {at} of {len(self.data)} bytes; "
            "the replication stream is corrupt or from an unsupported protocol version"
        )

    def _unpack(self, fmt: str, size: int, what: str) -> int:
        if self.offset + size > len(self.data):
            raise self.fail(f"truncated {what}")
        (value,) = struct.unpack_from(fmt, self.data, self.offset)
        self.offset += size
        return int(value)

    def u8(self, what: str) -> int:
        return self._unpack(">B", 1, what)

    def i16(self, what: str) -> int:
        return self._unpack(">h", 2, what)

    def u32(self, what: str) -> int:
        return self._unpack(">I", 4, what)

    def i32(self, what: str) -> int:
        return self._unpack(">i", 4, what)

    def u64(self, what: str) -> int:
        return self._unpack(">Q", 8, what)

    def timestamp(self, what: str) -> dt.datetime:
        start = self.offset
        micros = self._unpack(">q", 8, what)
        try:
            return PG_EPOCH + dt.timedelta(microseconds=micros)
        except OverflowError:
            raise self.fail(f"{what} {micros} out of range", start) from None

    def raw(self, size: int, what: str) -> bytes:
        if size < 0 or self.offset + size > len(self.data):
            raise self.fail(f"truncated {what} (length {size})")
        value = self.data[self.offset : self.offset + size]
        self.offset += size
        return value

    def text(self, size: int, what: str) -> str:
        start = self.offset
        try:
            return self.raw(size, what).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8", start) from None

    def string(self, what: str) -> str:
        end = self.data.find(b"\0", self.offset)
        if end < 0:
            raise self.fail(f"unterminated {what}")
        value = self.text(end - self.offset, what)
        self.offset += 1
        return value

    def xid_if(self, in_stream: bool) -> int | None:
        return self.u32("xid") if in_stream else None

    def tuple_data(self) -> TupleData:
        """The columns of one row: the hot loop of decoding, so it reads the bytes directly (same checks)."""
        count = self.i16("column count")
        if count < 0:
            raise self.fail(f"negative column count {count}", self.offset - 2)
        data, end, offset = self.data, len(self.data), self.offset
        values: list[Value] = []
        for index in range(count):
            if offset >= end:
                self.offset = offset
                raise self.fail(f"truncated column {index} kind")
            marker = data[offset]
            offset += 1
            if marker == _NULL:
                values.append(None)
            elif marker == _TOAST:
                values.append(UNCHANGED_TOAST)
            elif marker in (_TEXT, _BINARY):
                if offset + 4 > end:
                    self.offset = offset
                    raise self.fail(f"truncated column {index} length")
                (size,) = _I32.unpack_from(data, offset)
                offset += 4
                if size < 0 or offset + size > end:
                    self.offset = offset
                    raise self.fail(f"truncated {_what(index, marker)} (length {size})")
                chunk = data[offset : offset + size]
                if marker == _TEXT:
                    try:
                        values.append(chunk.decode("utf-8"))
                    except UnicodeDecodeError:
                        raise self.fail(f"{_what(index, marker)} is not UTF-8", offset) from None
                else:
                    values.append(chunk)
                offset += size
            else:
                self.offset = offset
                raise self.fail(f"unknown column {index} kind {marker!r}", offset - 1)
        self.offset = offset
        return tuple(values)

    def old_tuple(self) -> tuple[OldKind, TupleData]:
        marker = self.u8("old tuple marker")
        kind = OLD_KINDS.get(marker)
        if kind is None:
            raise self.fail(f"expected 'K' or 'O', got {marker!r}", self.offset - 1)
        return kind, self.tuple_data()

    def expect(self, marker: str) -> None:
        got = self.u8(f"{marker!r} marker")
        if got != ord(marker):
            raise self.fail(f"expected {marker!r}, got {got!r}", self.offset - 1)

    def finish(self, message: Message) -> Message:
        if self.offset != len(self.data):
            raise self.fail(f"{len(self.data) - self.offset} unexpected trailing bytes")
        return message


def _what(index: int, marker: int) -> str:
    return f"column {index} {'text' if marker == _TEXT else 'binary'}"
