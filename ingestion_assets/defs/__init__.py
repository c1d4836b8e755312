"""Dagster wiring: the asset factory and everything that makes streams visible in the UI."""
