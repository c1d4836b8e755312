"""Stream state: read, write and reset checkpoints in the Dagster instance."""
