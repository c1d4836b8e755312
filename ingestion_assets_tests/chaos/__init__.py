"""Real chaos runs through Dagster: `python -m ingestion_assets_tests.chaos --trials N` (see RELIABILITY.md)."""
