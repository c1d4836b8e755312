"""The files simulation's invariants: what the target holds (rows, flags, dead letters), what the model of the
files says it must hold, and the checks at every stored checkpoint and at the end (see files.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from ingestion_assets.state.model import Checkpoint
from ingestion_assets_tests.simulation.files_model import Content, Drop, Record, version
from ingestion_assets_tests.simulation.harness import SimulationFailure


@dataclass(frozen=True)
class Held:
    """A target row: its version, values, file and row, as the target holds them."""

    position: str
    record: Record
    file: str
    row: int


class FilesInvariants:
    """Checks for FilesSimulation, which holds the folder's model (`drops`) and the stream's settings."""

    seed: int
    name: str
    mode: str
    keyed: bool
    deletes: str
    warehouse: Path
    drops: dict[str, Drop]
    events: list[str]

    @property
    def replay(self) -> str:
        raise NotImplementedError

    # --- the target ------------------------------------------------------------------------------
    def _target(self) -> tuple[list[dict[str, Any]], set[str]]:
        """The target's rows and the stream's dead-letter keys."""
        if not self.warehouse.exists():
            return [], set()
        with duckdb.connect(str(self.warehouse), read_only=True) as con:
            try:
                rows = con.sql(f'SELECT * FROM "{self.name}".items').to_arrow_table().to_pylist()
            except duckdb.CatalogException:
                rows = []
            try:
                dead = con.execute(
                    f"SELECT record_key FROM \"{self.name}\"._ingest_dead_letter WHERE stream = 'items'"
                ).fetchall()
            except duckdb.CatalogException:
                dead = []
        return rows, {str(key) for (key,) in dead}

    def _held(self) -> tuple[dict[Any, Held], dict[Any, Held], set[str]]:
        """Live rows and flagged (soft-deleted) rows by key (keyed: id; keyless: file and row), dead letters."""
        rows, dead = self._target()
        live: dict[Any, Held] = {}
        flagged: dict[Any, Held] = {}
        for row in rows:
            record = Record(int(row["id"]), row["name"], int(row["value"]), row.get("extra"))
            held = Held(str(row["_ingest_position"]), record, row["_ingest_file"], int(row["_ingest_file_row"]))
            key = record.id if self.keyed else (held.file, held.row)
            into = flagged if row.get("_ingest_deleted_at") is not None else live
            if key in live or key in flagged:
                raise SimulationFailure(f"seed {self.seed}: key {key} twice in the target; replay with `{self.replay}`")
            into[key] = held
        return live, flagged, dead

    # --- the model ---------------------------------------------------------------------------------
    def _contributing(self) -> list[Drop]:
        """Files whose rows the target should hold: those there now, and deleted ones when deletes are kept."""
        return [d for d in self.drops.values() if d.present or self.deletes == "keep"]

    def _winners(self) -> dict[int, Held]:
        """Keyed: each key's newest version (modified time, path, row) over the files' current versions."""
        best: dict[int, Held] = {}
        for drop in self._contributing():
            content = drop.content
            for row, record in content.rows:
                held = Held(version(content.mtime, drop.path, row), record, drop.path, row)
                if record.id not in best or held.position > best[record.id].position:
                    best[record.id] = held
        return best

    def _expected(self) -> tuple[dict[Any, Held], set[Any], set[str]]:
        """The live rows, the flagged keys (soft deletes) and the dead letters the target must hold now."""
        if self.keyed:
            live: dict[Any, Held] = dict(self._winners())
        else:
            live = {
                (d.path, row): Held(version(d.mtime, d.path, row), record, d.path, row)
                for d in self._contributing()
                for row, record in d.content.rows
            }
        gone = [d for d in self.drops.values() if not d.present]
        flagged: set[Any] = set()
        if self.deletes == "soft":
            flagged = {r.id if self.keyed else (d.path, row) for d in gone for row, r in d.content.rows}
        dead = {f"{d.path}:{b.key}" for d in self.drops.values() for b in d.content.bad}
        return live, flagged, dead

    # --- invariants --------------------------------------------------------------------------------
    def _check_checkpoint(self, stored: Checkpoint) -> None:
        """Every file the position says is read (and the part of the file it stopped inside) is in the target."""
        position = stored.position
        if not position:
            return
        claims: list[tuple[str, list[Any], tuple[int, int] | None]] = [
            (path, list(fp), None) for path, fp in (position.get("seen") or {}).items()
        ]
        partial = position.get("partial")
        if partial:
            upto = (int(partial["rows"]), int(partial.get("bad", 0)))
            claims.append((partial["path"], list(partial["fingerprint"]), upto))
        live, _flagged, dead = self._held()
        for path, fp, upto in claims:
            drop = self.drops.get(path)
            if drop is None:
                self._fail(f"checkpoint names {path}, a file never dropped")
                return
            if not drop.present and self.deletes != "keep":
                continue  # its rows may be retired already (the next run says so in its checkpoint)
            contents = drop.since(fp)
            if contents is None:
                self._fail(f"checkpoint claims {path} at {fp}, which the file never had (it had {drop.fingerprints()})")
                return
            claimed = contents[0]
            for bad in claimed.bad:
                if (upto is None or self._given(claimed, bad.key, bad.line, bad.row, bad.ordinal, upto)) and (
                    f"{path}:{bad.key}" not in dead
                ):
                    self._fail(f"checkpoint {self._text(position)} claims {path} but its {bad.key} is not parked")
            for row, record in claimed.rows:
                if upto is not None and row > upto[0]:
                    continue
                problem = self._holds(live, path, row, record, claimed, contents)
                if problem:
                    self._fail(
                        f"checkpoint {self._text(position)} is ahead of the target: {path} row {row} ({record}) "
                        f"is {problem}"
                    )

    @staticmethod
    def _given(content: Content, key: str, line: int, row: int | None, ordinal: int, upto: tuple[int, int]) -> bool:
        """Whether a read that stopped at (rows, bad lines) given had parked this bad line already."""
        rows, bad = upto
        if key == "file":
            return False
        if row is not None:
            return row <= rows
        return ordinal <= bad if content.kind.startswith("csv") else line <= rows

    def _holds(
        self, live: dict[Any, Held], path: str, row: int, record: Record, claimed: Content, contents: list[Content]
    ) -> str | None:
        """None when the target holds the row at its version, a newer one, or as a later version of the file."""
        held = live.get(record.id if self.keyed else (path, row))
        if held is None:
            return "missing"
        later_records = {
            r for c in contents for _n, r in (c.records_of(record.id) if self.keyed else [(row, c.row(row))])
        }
        if self.keyed and held.position > version(claimed.mtime, path, row):
            return None
        times = {version(c.mtime, path, 0)[:26] for c in contents}
        if held.file == path and held.record in later_records and held.position[:26] in times:
            return None
        return f"held as {held}"

    def _check_final(self) -> None:
        live, flagged, dead = self._held()
        want_live, want_flagged, want_dead = self._expected()
        missing = sorted(k for k in want_live if k not in live)
        stale = sorted(k for k in want_live if k in live and live[k] != want_live[k])
        extra = sorted(k for k in live if k not in want_live)
        wrong_flags = sorted(set(flagged) ^ want_flagged)
        if missing or stale or extra or wrong_flags or dead != want_dead:
            example = [(live[k], want_live[k]) for k in stale[:2]]
            self._fail(
                f"({self.mode}): {len(missing)} rows missing {missing[:5]}, {len(stale)} stale {stale[:5]} "
                f"(held, wanted: {example}), {len(extra)} not in the files {extra[:5]}, flagged wrongly "
                f"{wrong_flags[:5]}, dead letters missing {sorted(want_dead - dead)[:5]} and unexpected "
                f"{sorted(dead - want_dead)[:5]} after {len(self.events)} events (last: {self.events[-4:]})"
            )

    @staticmethod
    def _text(position: dict[str, Any]) -> str:
        return f"(newest {position.get('path')}, {len(position.get('seen') or {})} seen, partial {position.get('partial')})"

    def _fail(self, message: str) -> None:
        raise SimulationFailure(f"seed {self.seed} {message}; replay with `{self.replay}`")
