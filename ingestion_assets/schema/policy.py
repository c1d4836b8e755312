"""What each schema policy does with each kind of change."""

from __future__ import annotations

from dataclasses import dataclass, field

from ingestion_assets.schema.changes import SchemaChange

# policy -> change kind -> action
_ACTIONS: dict[str, dict[str, str]] = {
    "evolve": {"added": "apply", "dropped": "apply", "widened": "apply", "incompatible": "pause"},
    "propagate": {"added": "apply", "dropped": "apply", "widened": "apply", "incompatible": "apply"},
    "columns_only": {"added": "apply", "dropped": "apply", "widened": "pause", "incompatible": "pause"},
    "pause": {"added": "pause", "dropped": "pause", "widened": "pause", "incompatible": "pause"},
    "ignore": {"added": "skip", "dropped": "apply", "widened": "pause", "incompatible": "pause"},
}


@dataclass
class Decision:
    apply: list[SchemaChange] = field(default_factory=list)
    pause: list[SchemaChange] = field(default_factory=list)
    skip: list[SchemaChange] = field(default_factory=list)  # added columns the stream does not read

    @property
    def skipped_columns(self) -> set[str]:
        return {c.column for c in self.skip}


def decide(policy: str, changes: list[SchemaChange], accepted: bool) -> Decision:
    """`accepted` (after `ingest schema accept`) applies what the policy would have paused on."""
    decision = Decision()
    for change in changes:
        action = _ACTIONS[policy][change.kind]
        if action == "pause" and accepted:
            action = "apply"
        if change.kind == "incompatible" and change.new is None:
            action = "pause"  # a key or cursor column is gone: no acceptance can make the stream work
        getattr(decision, action).append(change)
    return decision
