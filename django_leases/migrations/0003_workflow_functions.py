"""PostgreSQL: the workflow worker's hot-path functions (see ``workflows.pgfunctions``).

Elsewhere this migration does nothing. It installs the functions of the code that runs it;
a later change to those statements comes with a migration of its own that installs them
again (``django_leases.W013`` says when one is missing).
"""

from django.db import migrations


def install(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        return
    from django_leases.workflows import pgfunctions

    pgfunctions.install(schema_editor.connection)


class Migration(migrations.Migration):
    dependencies = [("django_leases", "0002_trigger_secrets")]

    operations = [migrations.RunPython(install, migrations.RunPython.noop, elidable=False)]
