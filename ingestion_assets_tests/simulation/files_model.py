"""The files simulation's model of a drop folder: each file's versions (what its bytes say: good rows with the
row numbers the reader gives them, bad lines with the dead-letter keys they must be parked under, or a broken
file), written as CSV, JSON lines or Parquet (gzip on some) and stamped with a modified time set explicitly."""

from __future__ import annotations

import datetime as dt
import gzip
import io
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

FORMATS = ("csv", "csv.gz", "jsonl", "jsonl.gz", "parquet", "parquet-gzip")
CSV_WRONG_COUNT = ("oops", "1,2", "7,x,1,2,3,4,5")  # few texts: a file may hold the same bad line twice
JSONL_BAD = (b"{oops", b"[1, 2]", b"42", b"\xff\xfe{}")


@dataclass(frozen=True)
class Record:
    id: int
    name: str
    value: int
    extra: str | None = None


@dataclass(frozen=True)
class Bad:
    """A bad line and where the reader must park it: `key` as in the dead-letter table (line3, row2, file)."""

    key: str
    line: int  # its line in the file (0: the whole file)
    row: int | None  # CSV value errors: the row's number among the well-formed rows
    ordinal: int  # CSV lines with the wrong number of fields: the how-manieth such line


@dataclass
class Content:
    """One version of a file. `rows`: (row number as the reader gives it, record); `bad`: what must be parked."""

    kind: str  # one of FORMATS
    rows: list[tuple[int, Record]] = field(default_factory=list)
    bad: list[Bad] = field(default_factory=list)
    data: bytes = b""
    mtime: int = 0  # unix seconds, set with os.utime

    @property
    def broken(self) -> bool:
        return any(b.key == "file" for b in self.bad)

    def records_of(self, key: int) -> list[tuple[int, Record]]:
        return [(row, record) for row, record in self.rows if record.id == key]

    def row(self, number: int) -> Record | None:
        return next((record for row, record in self.rows if row == number), None)


def suffix(kind: str) -> str:
    return ".parquet" if kind.startswith("parquet") else f".{kind}"


def render(kind: str, items: list[Record | str | bytes], extra: bool, rng: random.Random) -> Content:
    """The bytes of a file holding `items` in order: records, and bad lines (text: a CSV line with the wrong
    number of fields; `"badvalue"` / `"badutf8"`: a CSV row whose value or text does not read; bytes: a JSON line
    that is not an object). Parquet holds records only."""
    content = Content(kind)
    if kind.startswith("csv"):
        data = _csv(content, items, extra)
    elif kind.startswith("jsonl"):
        data = _jsonl(content, items)
    else:
        records = [r for r in items if isinstance(r, Record)]
        content.rows = [(n, r) for n, r in enumerate(records, start=1)]
        data = _parquet(records, extra, rng.randint(2, 6), "gzip" if kind == "parquet-gzip" else "snappy")
    content.data = gzip.compress(data, mtime=0) if kind.endswith(".gz") else data
    return content


def broken(kind: str, items: list[Record | str | bytes], extra: bool, rng: random.Random) -> Content:
    """A file cut short (a truncated gzip stream or a Parquet file without its footer): parked whole, no row of
    it loads (the readers stream small files in one block, which fails as a whole)."""
    whole = render(kind, [r for r in items if isinstance(r, Record)], extra, rng)
    cut = rng.randint(len(whole.data) // 3, len(whole.data) - 1)
    return Content(kind, [], [Bad("file", 0, None, 0)], whole.data[:cut])


def _csv(content: Content, items: list[Record | str | bytes], extra: bool) -> bytes:
    lines = [b"id,name,value" + (b",extra" if extra else b"")]
    row = wrong = 0
    for item in items:
        line = len(lines) + 1
        if isinstance(item, Record):
            row += 1
            content.rows.append((row, item))
            lines.append(_csv_line(item, extra).encode())
        elif item in ("badvalue", "badutf8"):
            row += 1  # a well-formed row: it takes its number, then is parked by it
            content.bad.append(Bad(f"row{row}", line, row, 0))
            tail = b",e0" if extra else b""
            lines.append(
                b"%d,n%d,abc" % (900_000 + line, line) + tail if item == "badvalue" else b"1,x\xff\xfey,3" + tail
            )
        else:
            assert isinstance(item, str)
            wrong += 1
            content.bad.append(Bad(f"line{line}", line, None, wrong))
            lines.append(item.encode())
    return b"\n".join(lines) + b"\n"


def _csv_line(record: Record, extra: bool) -> str:
    return f"{record.id},{record.name},{record.value}" + (f",{record.extra}" if extra else "")


def _jsonl(content: Content, items: list[Record | str | bytes]) -> bytes:
    lines: list[bytes] = []
    for item in items:
        line = len(lines) + 1
        if isinstance(item, Record):
            fields: dict[str, Any] = {"id": item.id, "name": item.name, "value": item.value}
            if item.extra is not None:
                fields["extra"] = item.extra
            content.rows.append((line, item))  # a JSON line's row number is its line
            lines.append(json.dumps(fields).encode())
        else:
            content.bad.append(Bad(f"line{line}", line, None, 0))
            lines.append(item if isinstance(item, bytes) else item.encode())
    return b"\n".join(lines) + b"\n"


def _parquet(records: list[Record], extra: bool, group_rows: int, compression: str) -> bytes:
    columns: dict[str, pa.Array] = {
        "id": pa.array([r.id for r in records], pa.int64()),
        "name": pa.array([r.name for r in records], pa.string()),
        "value": pa.array([r.value for r in records], pa.int64()),
    }
    if extra:
        columns["extra"] = pa.array([r.extra for r in records], pa.string())
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer, row_group_size=group_rows, compression=compression)
    return buffer.getvalue()


def put(folder: Path, staging: Path, relative: str, data: bytes, mtime: int) -> int:
    """Write the file whole (a temporary file renamed over it: a reader holding the old one keeps reading the
    old bytes) and set its modified time; returns its size."""
    temporary = staging / relative.replace("/", "_")
    temporary.write_bytes(data)
    os.utime(temporary, (mtime, mtime))
    target = folder / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(temporary, target)
    return target.stat().st_size


def fingerprint(mtime: int, size: int) -> list[Any]:
    """As the listing of a local folder gives it (modified time, size, no etag)."""
    return [dt.datetime.fromtimestamp(mtime, dt.UTC).isoformat(), size, None]


def version(mtime: int, path: str, row: int) -> str:
    """A row's version as the product writes it in `_ingest_position`: modified time, path, row."""
    moment = dt.datetime.fromtimestamp(mtime, dt.UTC)
    return f"{moment.strftime('%Y-%m-%dT%H:%M:%S.%f')}|{path}|{row:012d}"


@dataclass
class Drop:
    """A path of the folder: its versions (each with the fingerprint the listing gives it), whether it is there
    now, and whether it holds bad lines (such files are never rewritten or deleted: their dead letters stay)."""

    path: str
    versions: list[tuple[list[Any], Content]] = field(default_factory=list)
    present: bool = True
    frozen: bool = False
    changed: int = 0  # the tick of its last change

    @property
    def content(self) -> Content:
        return self.versions[-1][1]

    @property
    def mtime(self) -> int:
        return self.content.mtime

    def since(self, fp: list[Any]) -> list[Content] | None:
        """The versions from the one with fingerprint `fp` on (None: the file never had it)."""
        for index, (known, _content) in enumerate(self.versions):
            if known == fp:
                return [c for _f, c in self.versions[index:]]
        return None

    def fingerprints(self) -> list[list[Any]]:
        return [f for f, _c in self.versions]
