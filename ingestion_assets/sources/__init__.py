"""Plain dlt sources (no Dagster import): each reads one kind of system and yields slices."""
