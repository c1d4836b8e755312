"""ingestion_assets: data ingestion data engineers can trust, as checkpointed Dagster assets over dlt."""
