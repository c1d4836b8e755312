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
