"""A PostgreSQL destination that keeps '' apart from NULL.

dlt loads PostgreSQL with CSV that Arrow writes (every string quoted, a NULL as nothing) and COPYs it with
FORCE_NULL on every nullable column, which turns a quoted empty string into NULL as well: '' arrived as NULL.
Our copy job reads the same files with COPY's own CSV rule (only an unquoted empty field is NULL).
"""

from __future__ import annotations

import csv
from typing import Any

from dlt.common.storages.file_storage import FileStorage
from dlt.common.storages.load_storage import ParsedLoadJobFileName
from dlt.destinations import postgres
from dlt.destinations.impl.postgres.postgres import PostgresClient, PostgresCsvCopyJob

LOADER_FILE_FORMAT = "csv"


class ExactCsvCopyJob(PostgresCsvCopyJob):
    def run(self) -> None:
        client = self._job_client.sql_client
        with FileStorage.open_zipsafe_ro(self._file_path, "rb") as f:
            header = next(csv.reader([f.readline().decode("utf-8")]))
            f.seek(0)
            columns = ",".join(client.escape_column_name(name, quote=True) for name in header)
            table = client.make_qualified_table_name(self.load_table_name)
            statement = f"COPY {table} ({columns}) FROM STDIN WITH (FORMAT CSV, HEADER true, NULL '', ENCODING 'utf-8')"
            with client.begin_transaction(), client.native_connection.cursor() as cursor:
                cursor.copy_expert(statement, f, size=1 << 20)


class ExactPostgresClient(PostgresClient):
    def create_load_job(self, table: Any, file_path: str, load_id: str, restore: bool = False) -> Any:
        if ParsedLoadJobFileName.parse(file_path).file_format == "csv":
            return ExactCsvCopyJob(file_path)
        return super().create_load_job(table, file_path, load_id, restore)


class ExactPostgres(postgres):
    @property
    def client_class(self) -> type[PostgresClient]:
        return ExactPostgresClient
