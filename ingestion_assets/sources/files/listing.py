"""List a stream's files on any fsspec filesystem with what tells a new or rewritten file apart: modified time,
size and etag; open them for reading with errors of the storage kept apart from errors of the bytes."""

from __future__ import annotations

import datetime as dt
import io
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
from fsspec.implementations.local import LocalFileSystem

from ingestion_assets.catalog.files import COMPRESSION_SUFFIXES, FORMAT_SUFFIXES


class StorageError(OSError):
    """Reading from the storage failed (network, permission, throttling): the run retries, nothing is parked."""

    transient = True


class MissingLocation(StorageError):
    """The folder (or the bucket) the url names does not exist: a wrong url or path, not an empty drop. Permanent:
    a retry lists the same nothing, and taking it as empty would end the run with 0 rows and no word."""

    transient = False
    advice = "check the source's `url` (and the bucket's name); an empty folder that exists is fine"


@dataclass(frozen=True)
class FileInfo:
    path: str  # as the filesystem names it (no protocol)
    modified_at: dt.datetime  # UTC
    size: int
    etag: str | None

    @property
    def fingerprint(self) -> list[Any]:
        """What changes when the file is rewritten in place (its modified time may not: copies keep it)."""
        return [self.modified_at.isoformat(), self.size, self.etag]

    @property
    def order(self) -> tuple[dt.datetime, str]:
        return self.modified_at, self.path


def filesystem(url: str, options: dict[str, Any]) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem of `url` and the root path on it (a plain folder is a local one)."""
    fs, root = fsspec.core.url_to_fs(url, **options)
    return fs, root.rstrip("/")


def list_files(fs: fsspec.AbstractFileSystem, root: str, pattern: str) -> list[FileInfo]:
    """Every file matching `pattern` under `root`, listed afresh (fsspec caches listings per instance)."""
    fs.invalidate_cache()
    try:
        found = fs.glob(f"{root}/{pattern.lstrip('/')}", detail=True)
    except FileNotFoundError:
        found = {}
    except OSError as exc:
        raise StorageError(f"cannot list {root}/{pattern}: {exc}") from exc
    if not found:
        _check_location(fs, root)
    infos = [_info(path, detail) for path, detail in found.items() if detail.get("type", "file") == "file"]
    return sorted(infos, key=lambda info: info.order)


def _check_location(fs: fsspec.AbstractFileSystem, root: str) -> None:
    """Raise MissingLocation unless `root` is there: a folder on a disk; on an object store, where folders are only
    prefixes (an empty one is no object at all), its bucket."""
    try:
        if isinstance(fs, LocalFileSystem):
            if not fs.isdir(root):
                raise MissingLocation(f"the folder {root} does not exist")
        elif not fs.exists(root.split("/", 1)[0]):
            raise MissingLocation(f"the bucket {root.split('/', 1)[0]} does not exist")
    except MissingLocation:
        raise
    except OSError as exc:
        raise StorageError(f"cannot look up {root}: {exc}") from exc


def _info(path: str, detail: dict[str, Any]) -> FileInfo:
    modified = next((detail[k] for k in ("mtime", "LastModified", "updated", "last_modified") if k in detail), None)
    if isinstance(modified, int | float):
        moment = dt.datetime.fromtimestamp(modified, dt.UTC)
    elif isinstance(modified, dt.datetime):
        moment = modified if modified.tzinfo else modified.replace(tzinfo=dt.UTC)
    elif isinstance(modified, str):
        moment = dt.datetime.fromisoformat(modified.replace("Z", "+00:00"))
    else:
        moment = dt.datetime.fromtimestamp(0, dt.UTC)
    etag = detail.get("ETag") or detail.get("etag") or detail.get("md5Hash")
    return FileInfo(
        path, moment.astimezone(dt.UTC), int(detail.get("size") or 0), str(etag).strip('"') if etag else None
    )


def file_format(path: str, given: str | None) -> tuple[str | None, str | None]:
    """(format, compression) of a file by its suffixes, e.g. orders.csv.gz -> (csv, gzip)."""
    name = path.rsplit("/", 1)[-1].lower()
    compression = next((c for s, c in COMPRESSION_SUFFIXES.items() if name.endswith(s)), None)
    if compression is not None:
        name = name.rsplit(".", 1)[0]
    kind = given or FORMAT_SUFFIXES.get(file_suffix(path) or "")
    return kind, compression


def file_suffix(path: str) -> str | None:
    """The format suffix of a file's name (`.tsv` for orders.tsv.gz), lower case; None for an unknown one."""
    name = path.rsplit("/", 1)[-1].lower()
    if any(name.endswith(s) for s in COMPRESSION_SUFFIXES):
        name = name.rsplit(".", 1)[0]
    return next((s for s in FORMAT_SUFFIXES if name.endswith(s)), None)


class _Guarded(io.RawIOBase):
    """A storage file whose read errors say they come from the storage, not from the file's bytes."""

    def __init__(self, handle: Any, path: str) -> None:
        self._handle, self._path = handle, path

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(self._handle.seekable())

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._handle.seek(offset, whence))

    def tell(self) -> int:
        return int(self._handle.tell())

    def readinto(self, buffer: Any) -> int:
        try:
            data = self._handle.read(len(buffer))
        except OSError as exc:
            raise StorageError(f"reading {self._path} failed: {exc}") from exc
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._handle.close()
        super().close()


def open_bytes(fs: fsspec.AbstractFileSystem, path: str, compression: str | None) -> pa.NativeFile:
    """The file's bytes as Arrow reads them, decompressed on the fly (a stream: never the whole file)."""
    try:
        handle = fs.open(path, "rb") if not isinstance(fs, LocalFileSystem) else open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StorageError(f"cannot open {path}: {exc}") from exc
    raw = pa.PythonFile(io.BufferedReader(_Guarded(handle, path), 1 << 20), mode="r")
    return pa.CompressedInputStream(raw, compression) if compression else raw


def open_seekable(fs: fsspec.AbstractFileSystem, path: str) -> pa.NativeFile:
    """A random-access handle (Parquet reads its footer first, then row group by row group)."""
    if isinstance(fs, LocalFileSystem):
        return pa.OSFile(path, "rb")
    try:
        handle = fs.open(path, "rb")
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise StorageError(f"cannot open {path}: {exc}") from exc
    return pa.PythonFile(_Guarded(handle, path), mode="r")
