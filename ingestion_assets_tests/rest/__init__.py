"""Tests of the HTTP API source against the demo API on loopback."""
