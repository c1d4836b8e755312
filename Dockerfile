FROM python:3.11-slim
WORKDIR /opt/dagster/app
COPY pyproject.toml README.md ./
COPY ingestion_assets ./ingestion_assets
RUN pip install --no-cache-dir .
RUN printf 'load_from:\n  - grpc_server:\n      host: user-code\n      port: 4000\n      location_name: ingestion_assets\n' > /opt/dagster/workspace.yaml
