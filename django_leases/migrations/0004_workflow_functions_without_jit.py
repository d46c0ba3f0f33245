"""PostgreSQL: the workflow worker's hot-path functions again, without JIT compilation.

The run-completing function of ``0003`` planned a sort of nothing (sorts switched off) when it
had no next run to pick, which cost ~1e10 and made PostgreSQL JIT-compile it on a fresh
connection: 1 to 4.5 s per call. Its two cases are now two functions, and no function is
JIT-compiled. The functions ``0003`` installed are dropped. Elsewhere than PostgreSQL this
migration does nothing.
"""

from django.db import migrations


def install(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        return
    from django_leases.workflows import pgfunctions

    pgfunctions.install(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("django_leases", "0003_workflow_functions")]

    operations = [migrations.RunPython(install, migrations.RunPython.noop, elidable=False)]
