"""Noticing a positional listing (page numbers, offsets) that shifted under a read: a key served twice."""

from __future__ import annotations

import logging
from typing import Any

from ingestion_assets.sources.json_numbers import json_text

logger = logging.getLogger(__name__)
WATCHED_KEYS = 1_000_000  # keys remembered per read (~150 MB at most); later ones are checked, not remembered


class ShiftWatch:
    """The keys a page or offset read has served, and the earliest cursor the read must be done again from.

    A listing sorted by the cursor, read by position: a record changed after its page was served moves to the
    end, every record behind it moves up one place, and the one at the next page boundary is never served. It
    lies after the moved record's old place, so reading again from the moved record's old cursor finds it; the
    key served twice is the sign (a key listing, without a cursor, retires nothing on such a read). Records
    deleted during the read shift the listing the same way without a sign: the README says so.
    """

    def __init__(self, stream: str, primary_key: tuple[str, ...], cursor_field: str | None) -> None:
        self.stream, self.primary_key, self.cursor_field = stream, primary_key, cursor_field
        self.served: dict[tuple[str | None, ...], Any] = {}  # key -> the floor of its first serving (below)
        self._previous_floor: Any = None  # the least cursor of the page before the one being seen
        self.reread_from: Any = None  # the earliest such cursor of a key served twice (None: no shift seen)
        self.doubt: str | None = None
        self.full = False  # WATCHED_KEYS remembered: later keys are no longer

    def see(self, records: list[dict[str, Any]], order_key: Any) -> None:
        floor = self._floor(records, order_key)
        for record in records:
            key = tuple(_text(record.get(name)) for name in self.primary_key)
            if key not in self.served:
                if len(self.served) < WATCHED_KEYS:
                    self.served[key] = floor
                elif not self.full:
                    self.full = True
                    logger.info(
                        "stream %s: past %d records, a page or offset read remembers no more keys: a shift of the "
                        "listing is noticed only for the first %d records served",
                        self.stream or "(standalone)",
                        WATCHED_KEYS,
                        WATCHED_KEYS,
                    )
                continue
            first = self.served[key]
            if self.doubt is None:
                shown = ", ".join(f"{n}={v}" for n, v in zip(self.primary_key, key, strict=True))
                self.doubt = f"the listing shifted during the read: key {shown} was served twice"
                logger.warning(
                    "stream %s: %s: records changed while it was read by page or offset, and a record at a page "
                    "boundary may have been skipped; the next read starts again from %s",
                    self.stream or "(standalone)",
                    self.doubt,
                    f"{self.cursor_field} {_text(first)} (the least of its first page and the page before)"
                    if self.cursor_field and first is not None
                    else "the top (this full read retires no keys)",
                )
            if first is not None and (self.reread_from is None or order_key(first) < order_key(self.reread_from)):
                self.reread_from = first

    def _floor(self, records: list[dict[str, Any]], order_key: Any) -> Any:
        """Where a read again must start to find what a shift at this page skipped: the least cursor of this page
        and of the page before. Not the moved record's own cursor: a server that fills in current values after
        sorting serves it in its old place with its new cursor, past the record the shift skipped (recheck25)."""
        cursors = [r.get(self.cursor_field) for r in records] if self.cursor_field else []
        known = [c for c in [*cursors, self._previous_floor] if c is not None]
        floor = min(known, key=order_key) if known else None
        page = [c for c in cursors if c is not None]
        self._previous_floor = min(page, key=order_key) if page else self._previous_floor
        return floor


def _text(value: Any) -> str | None:
    return value if value is None or isinstance(value, str) else json_text(value)
