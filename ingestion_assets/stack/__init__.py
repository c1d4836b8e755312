"""The embedded stack: PostgreSQL for Dagster storage and the demo source, and the instance config."""
