"""Tests of PostgreSQL change data capture against real servers with logical decoding."""
