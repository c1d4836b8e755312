"""What a checkpoint is, independent of where it is stored."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Checkpoint:
    position: dict[str, Any] | None  # None: start from the beginning (never run, or reset)
    run_id: str
    committed_at: dt.datetime
    storage_id: int
    details: dict[str, Any]  # everything else stored with it (rows, slice, generation, refresh ...)

    @property
    def data_committed_at(self) -> dt.datetime:
        """When the rows it covers were last committed: a failure note (a run that committed nothing, stored to
        count its attempts) keeps the time of the commit before it instead of its own."""
        noted = self.details.get(DATA_COMMITTED_AT)
        return dt.datetime.fromisoformat(noted) if isinstance(noted, str) else self.committed_at


DATA_COMMITTED_AT = "data_committed_at"
