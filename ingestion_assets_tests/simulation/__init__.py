"""Deterministic simulation of the checkpoint protocol: `make simulate SEED=...` or `RUNS=N`."""
