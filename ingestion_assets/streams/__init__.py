"""Streams: a source read, a target table and the checkpoint protocol put together, without Dagster."""
