"""Loading: one dlt pipeline per stream run, merge hints, metadata columns."""
