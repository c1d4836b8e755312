"""The schema manager: what changed in a source's columns since the last run, and what to do about it."""
