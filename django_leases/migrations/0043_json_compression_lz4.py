"""On PostgreSQL 14 and later, where the server has LZ4, the package's JSON columns compress
with LZ4 instead of pglz.

A step's result, a run's input or output, an event's payload: a value past about 2 KB is
compressed (TOAST) as it is written. pglz spends about 3 ms of server time on each 100 KB
value (and gives up on one that does not compress); LZ4 about a fifth of that, and reads
back faster. Only values written from now on change; nothing is rewritten. Each column is
changed under a short ``lock_timeout``: one whose lock is not had at once (a long
transaction holds the table) keeps pglz, and the migration says so; run it again later with
``migrate django_leases 0042`` then ``migrate``, or leave it (nothing depends on it).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

#: How long each column's change waits for its table's lock, in milliseconds.
LOCK_TIMEOUT_MS = 2000


def _json_columns(apps: Any) -> dict[str, list[str]]:
    """Each table of the app's models and its JSON columns."""
    found: dict[str, list[str]] = {}
    for model in apps.get_app_config("django_leases").get_models():
        for field in model._meta.local_fields:
            if field.get_internal_type() == "JSONField":
                found.setdefault(model._meta.db_table, []).append(field.column)
    return found


def _compress(method: str) -> Any:
    def change(apps: Any, schema_editor: Any) -> None:
        connection = schema_editor.connection
        if connection.vendor != "postgresql" or connection.pg_version < 140000:
            return
        quote = schema_editor.quote_name
        with connection.cursor() as cursor:
            for table, columns in _json_columns(apps).items():
                changes = ", ".join(
                    f"ALTER COLUMN {quote(column)} SET COMPRESSION {method}" for column in columns
                )
                cursor.execute("SAVEPOINT dl_compression")
                try:
                    cursor.execute(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}")
                    cursor.execute(f"ALTER TABLE {quote(table)} {changes}")
                except Exception as error:  # no LZ4 in this server, or the lock not had
                    cursor.execute("ROLLBACK TO SAVEPOINT dl_compression")
                    print(f"\n  {table} keeps its compression: {error}".rstrip())
                else:
                    cursor.execute("RELEASE SAVEPOINT dl_compression")

    return change


class Migration(migrations.Migration):
    dependencies = [
        ("django_leases", "0042_step_fence_floor_functions"),
    ]

    operations = [
        migrations.RunPython(_compress("lz4"), _compress("default"), elidable=True),
    ]
