"""Reading one endpoint incrementally, page by page, each page with the position to checkpoint after it."""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ingestion_assets.sources.json_numbers import is_number, json_text
from ingestion_assets.sources.rest.client import RestClient
from ingestion_assets.sources.rest.errors import ApiError, BadPayload
from ingestion_assets.sources.rest.paginators import PaginationSpec, Paginator, json_path

logger = logging.getLogger(__name__)
Position = dict[str, str | None]  # field -> exact text of its value, as in the postgres source
PAGE_TOKEN = "page_token"  # the position of a full read: the token of the next page
# Where the next read must start (inclusive) when it is earlier than the cursor: the moment the read that
# wrote the position began. A record changed while the read ran can carry a timestamp the read had already
# passed (it tied a page's last record, with a lower key); starting the next read there finds it.
REREAD_FROM = "_reread_from"


@dataclass(frozen=True)
class EndpointSpec:
    """One readable endpoint. Define a custom stream the same way: path, where the records are, their key.

    With a `cursor_field` (the catalog's `cursor`) the read is incremental: records must come sorted by
    (cursor, primary key) ascending and the API must filter them with `cursor_param` >= a value (inclusive). Without one
    every read is a full read, resumable from its page token.
    """

    path: str
    primary_key: tuple[str, ...] = ("id",)
    records_path: str = "data"  # dotted path to the list of records in the JSON body; "" for a bare list
    cursor_field: str | None = "updated_at"
    cursor_param: str | None = "updated_since"
    pagination: PaginationSpec = field(default_factory=PaginationSpec)
    page_size: int = 100
    params: Mapping[str, str | int] = field(default_factory=dict)  # sent with every request
    overlap_seconds: float = 0.0  # re-read this much before the position, for APIs whose clocks lag

    @property
    def name(self) -> str:
        return self.path.strip("/").replace("/", "_") or "root"


@dataclass(frozen=True)
class Page:
    records: list[dict[str, Any]]
    position: Position  # the checkpoint once this page and every page before it is committed
    index: int  # 0-based within the read
    doubt: str | None = None  # the last page, when its end is not certain (why): no basis for deletes


def read_pages(
    client: RestClient, endpoint: EndpointSpec, start: Position | None = None
) -> Generator[Page, None, None]:
    """Every record changed since `start` (None: everything), a page at a time; `close()` it to stop early.

    A resumed read asks for `cursor >= start[cursor] - overlap`, so records sharing the boundary's
    timestamp are read again rather than lost; the loader's merge on the primary key absorbs them.
    """
    paginator = endpoint.pagination.make(endpoint.page_size)
    params = {**endpoint.params, **window_params(endpoint, start)}
    if endpoint.cursor_field is None and start and start.get(PAGE_TOKEN):
        paginator.resume(str(start[PAGE_TOKEN]))
    position: Position = dict(start or {})
    index = 0
    began: datetime | None = None  # the server's time at the first answer: a lower bound for late changes
    while paginator.has_more:
        url, query = paginator.request(endpoint.path, params)
        try:
            response, body = client.request_json("GET", url, query)
        except ApiError as error:
            if not paginator.ends_with(error):
                raise
            logger.info("GET %s: no page past the last (%s): the read ends here", endpoint.path, error.status)
            paginator.end()  # as an empty page would: the position of a finished read
            yield Page(records=[], position=next_position(endpoint, position, [], paginator, began), index=index)
            return
        began = began or client.server_time(response)
        records = page_records(body, endpoint)
        paginator.advance(response, body, records)
        position = next_position(endpoint, position, records, paginator, began)
        yield Page(records=records, position=position, index=index, doubt=paginator.doubt)
        index += 1


def window_params(endpoint: EndpointSpec, start: Position | None) -> dict[str, str]:
    """The filter that starts a read at `start`."""
    if not (endpoint.cursor_field and endpoint.cursor_param and start and start.get(endpoint.cursor_field)):
        return {}
    since = str(start.get(REREAD_FROM) or start[endpoint.cursor_field])
    if endpoint.overlap_seconds:
        since = _format_like(since, _timestamp(since, endpoint) - timedelta(seconds=endpoint.overlap_seconds))
    return {endpoint.cursor_param: since}


def page_records(body: Any, endpoint: EndpointSpec) -> list[dict[str, Any]]:
    """The page's records. A record whose key or cursor is missing or unusable stays in the list: the stream
    parks it with its reason (`positioned` keeps it out of the position) and the rest of the page loads."""
    records = json_path(body, endpoint.records_path)
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise BadPayload(
            f"GET {endpoint.path}: no list of objects at records_path {endpoint.records_path!r}; {describe_body(body)}"
        )
    return records


def usable(value: Any) -> bool:
    """A key or cursor value a position and a merge can hold: a JSON string (not empty) or number."""
    return (isinstance(value, str) and value != "") or is_number(value)


def positioned(endpoint: EndpointSpec, record: dict[str, Any]) -> bool:
    """Whether the record can stand for a position: its cursor and every key field usable."""
    needed = (*endpoint.primary_key, *((endpoint.cursor_field,) if endpoint.cursor_field else ()))
    return all(usable(record.get(name)) for name in needed)


def unusable_field(record: dict[str, Any], primary_key: Sequence[str], cursor: str | None) -> tuple[str, str] | None:
    """The first key or cursor field a record cannot be merged or ordered by: ("primary_key" or "cursor", why,
    naming the field and its value), or None."""
    fields = [("primary_key", name) for name in primary_key]
    fields += [("cursor", cursor)] if cursor else []
    for setting, name in fields:
        if usable(value := record.get(name)):
            continue
        if name not in record:
            found = f"missing (the record's fields: {sorted(record)[:20]})"
        elif value is None:
            found = "null"
        else:
            found = f"{_describe_value(value)}, not a string or number"
        return setting, f"{'primary key' if setting == 'primary_key' else 'cursor'} {name!r} is {found}"
    return None


def missing_everywhere(
    records: Sequence[Any], primary_key: Sequence[str], cursor: str | None
) -> tuple[str, str] | None:
    """The key or cursor field that no record has (("primary_key" or "cursor", the field)), when there are at
    least two records, all objects: the setting names a field the API does not send. None otherwise (one
    record, or one that has it: a record to park, not a setting to fix)."""
    if len(records) < 2 or not all(isinstance(r, dict) for r in records):
        return None
    fields = [("primary_key", name) for name in primary_key] + ([("cursor", cursor)] if cursor else [])
    return next(((setting, name) for setting, name in fields if all(name not in r for r in records)), None)


def _describe_value(value: Any) -> str:
    """A JSON value for an error: its kind and (cut) text."""
    kind = {dict: "an object", list: "a list", bool: "a boolean", str: "empty text"}.get(type(value), "a value")
    text = json_text(value)
    return f"{kind} {text[:60]}{'...' if len(text) > 60 else ''}"


def describe_body(body: Any, limit: int = 20) -> str:
    """What the body holds, to find the right records_path: its keys, and which of them hold lists."""
    if isinstance(body, list):
        return "the body itself is a list: set records_path to '' (empty)"
    if not isinstance(body, dict):
        return f"the body is a JSON {type(body).__name__}, not an object holding a list"
    keys = sorted(str(k) for k in body)
    lists = sorted(str(k) for k, v in body.items() if isinstance(v, list))
    nested = sorted(
        f"{k}.{n}" for k, v in body.items() if isinstance(v, dict) for n, w in v.items() if isinstance(w, list)
    )
    found = f"; lists are at {', '.join(lists + nested)[:300]}" if lists or nested else "; none of them holds a list"
    return f"the body's keys are {keys[:limit]}{' ...' if len(keys) > limit else ''}{found}: set records_path to one"


def next_position(
    endpoint: EndpointSpec,
    before: Position,
    records: list[dict[str, Any]],
    paginator: Paginator,
    began: datetime | None = None,
) -> Position:
    """The position after `records`: the last record's (cursor, primary key), never moving backwards, and
    (for a timestamp cursor) where the next read starts if this read began after the cursor."""
    if endpoint.cursor_field is None:
        return {PAGE_TOKEN: paginator.token} if paginator.has_more else {}
    last = next((r for r in reversed(records) if positioned(endpoint, r)), None)
    if last is None:  # no record of the page can stand for a position (they are parked): it stays
        return before
    after: Position = {name: exact_text(last[name]) for name in (endpoint.cursor_field, *endpoint.primary_key)}
    stamp, earlier = _moment(after[endpoint.cursor_field]), _moment(before.get(endpoint.cursor_field))
    if stamp is None:
        return after  # not a timestamp: the exact position is all there is
    if earlier is not None and stamp < earlier:  # still re-reading what lies before the start
        return before
    if began is not None and began < stamp:
        after[REREAD_FROM] = _format_like(str(after[endpoint.cursor_field]), began)
    return after


def exact_text(value: Any) -> str | None:
    """A JSON value as the text the API sent: strings as they are, numbers and the rest as JSON."""
    if value is None or isinstance(value, str):
        return value
    return json_text(value)  # numbers with their digits (json.dumps fails on them)


def _moment(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _timestamp(text: str, endpoint: EndpointSpec) -> datetime:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ValueError(
            f"{endpoint.path}: overlap_seconds needs an ISO 8601 cursor, and cursor {endpoint.cursor_field} is {text!r}"
        ) from exc
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _format_like(example: str, moment: datetime) -> str:
    text = moment.astimezone(UTC).isoformat(timespec="microseconds")
    return text.replace("+00:00", "Z") if example.endswith("Z") else text
