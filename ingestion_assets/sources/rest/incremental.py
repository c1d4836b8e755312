"""Reading one endpoint incrementally, page by page, each page with the position to checkpoint after it."""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

from ingestion_assets.sources.json_numbers import is_number, json_text
from ingestion_assets.sources.rest.client import RestClient
from ingestion_assets.sources.rest.errors import ApiError, BadPayload
from ingestion_assets.sources.rest.paginators import PaginationSpec, Paginator, json_path
from ingestion_assets.sources.rest.shifts import ShiftWatch

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

    With a `cursor_field` (the catalog's `cursor`) the read is incremental: the API must filter records with
    `cursor_param` >= a value (inclusive). In any order: a read's checkpoints advance before it ends only while the
    records have come in ascending (cursor, primary key) order (`ServedOrder`). Without a cursor every read is a
    full read, resumable from its page token.
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
    order = ServedOrder(endpoint, dict(start or {}))
    watch = ShiftWatch(paginator.stream, endpoint.primary_key, endpoint.cursor_field) if paginator.shifts else None
    index = 0
    began: datetime | None = None  # the server's time at the first answer: a lower bound for late changes
    while paginator.has_more:
        url, query = paginator.request(endpoint.path, params)
        try:
            response, body = client.request_json("GET", url, query, stream=endpoint.pagination.stream)
        except ApiError as error:
            if not paginator.ends_with(error):
                raise
            logger.info("GET %s: no page past the last (%s): the read ends here", endpoint.path, error.status)
            paginator.end()  # as an empty page would: the position of a finished read
            position = held(endpoint, next_position(endpoint, order, paginator, began), watch)
            yield Page(records=[], position=position, index=index, doubt=watch.doubt if watch else None)
            return
        began = began or client.server_time(response)
        records = page_records(body, endpoint)
        records = paginator.advance(response, body, records)
        order.see(records)
        if watch is not None:
            watch.see([r for r in records if positioned(endpoint, r)], order_key)  # parked ones stand for nothing
        position = held(endpoint, next_position(endpoint, order, paginator, began), watch)
        doubt = paginator.doubt or (watch.doubt if watch else None)
        yield Page(records=records, position=position, index=index, doubt=doubt)
        index += 1


def held(endpoint: EndpointSpec, position: Position, watch: ShiftWatch | None) -> Position:
    """The position, starting the next read no later than where a listing shifted under this one (`ShiftWatch`)."""
    if watch is None or watch.reread_from is None or not endpoint.cursor_field:
        return position
    since = position.get(REREAD_FROM) or position.get(endpoint.cursor_field)
    if since is None or order_key(watch.reread_from) >= order_key(since):
        return position  # a position at the read's start (or before the shift) reads it again already
    return {**position, REREAD_FROM: exact_text(watch.reread_from)}


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


class ServedOrder:
    """What a read has seen of the order the API serves its records in, to know which position it may claim.

    A checkpoint written in the middle of a read claims "every record at or below it is read". That holds only
    if the records come in ascending (cursor, primary key) order: an API listing newest first (Stripe's and
    GitHub's default) has not yet sent the oldest ones when a page boundary comes. So before the read ends a
    position is claimed only once the order is proven ascending (every record so far in order, over two pages
    at least), and then at the end of the last group of equal cursors the read has finished (the record before
    the last record's cursor group): the next read, which asks from the claimed cursor, then finds the rest of a
    group a stop cut in two even from an API whose filter is exclusive (`>`). Otherwise the read's start stays
    claimed until the read ends, when every record is read and the greatest (cursor, key) stands for it.
    """

    def __init__(self, endpoint: EndpointSpec, start: Position) -> None:
        self.endpoint, self.start = endpoint, start
        self.fields = (endpoint.cursor_field, *endpoint.primary_key) if endpoint.cursor_field else ()
        self.ascending, self.pages = True, 0
        self.last: tuple[tuple[Any, ...], dict[str, Any]] | None = None  # the last positioned record (key, record)
        self.finished: tuple[tuple[Any, ...], dict[str, Any]] | None = None  # the last of the group before last's
        self.greatest: tuple[tuple[Any, ...], dict[str, Any]] | None = None

    def see(self, records: list[dict[str, Any]]) -> None:
        self.pages += 1
        if not self.fields:
            return
        for record in records:
            values = [record.get(name) for name in self.fields]
            if not all((type(v) is str and v) or type(v) is int or usable(v) for v in values):
                continue  # parked by the stream (`positioned`): it stands for no position
            key = tuple(map(order_key, values))
            last = self.last
            if last is not None:
                if key < last[0]:
                    self.ascending = False
                elif key[0] != last[0][0]:
                    self.finished = last
            self.last = (key, record)
            if self.greatest is None or key > self.greatest[0]:
                self.greatest = self.last

    def claim(self, complete: bool) -> dict[str, Any] | None:
        """The record that stands for the position now, or None (the read's start stays)."""
        if complete:
            return None if self.greatest is None else self.greatest[1]
        if self.ascending and self.pages >= 2 and self.finished is not None:
            return self.finished[1]
        return None


def next_position(
    endpoint: EndpointSpec,
    order: ServedOrder,
    paginator: Paginator,
    began: datetime | None = None,
) -> Position:
    """The position after the pages `order` has seen: the (cursor, primary key) of the record it claims, never
    before the read's start, and (for a timestamp cursor) where the next read starts if this read began after
    the cursor."""
    if endpoint.cursor_field is None:
        return {PAGE_TOKEN: paginator.token} if paginator.has_more else {}
    before = order.start
    record = order.claim(complete=not paginator.has_more and paginator.doubt is None)  # an end in doubt: no end
    if record is None:  # nothing read that may stand for a position yet (or the order is not ascending)
        return dict(before)
    after: Position = {name: exact_text(record[name]) for name in (endpoint.cursor_field, *endpoint.primary_key)}
    if before.get(endpoint.cursor_field) is not None:
        start = tuple(order_key(before.get(name)) for name in order.fields)
        if tuple(order_key(after[name]) for name in order.fields) < start:  # re-read what lies before the start
            return dict(before)
    stamp = _moment(after[endpoint.cursor_field])
    if stamp is not None and began is not None and began < stamp:
        after[REREAD_FROM] = _format_like(str(after[endpoint.cursor_field]), began)
    return after


@lru_cache(maxsize=4096, typed=True)
def order_key(value: Any) -> tuple[int, Any]:
    """A cursor or key value's place in order, from the value or its exact text (a position holds text): numbers
    as numbers, timestamps as moments, other text as text (kinds apart: values of mixed kinds still compare)."""
    if value is None:
        return (0, "")
    if isinstance(value, int) and not isinstance(value, bool):
        return (1, value)
    text = value if isinstance(value, str) else str(exact_text(value))
    if ("-" in text[1:] or ":" in text) and (moment := _moment(text)) is not None:
        return (2, moment)
    try:
        number = Decimal(text)
    except InvalidOperation:
        return (3, text)
    return (1, number) if number.is_finite() else (3, text)


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
