"""The demo: a seeded `shop` database on the embedded server and a catalog that ingests it."""
