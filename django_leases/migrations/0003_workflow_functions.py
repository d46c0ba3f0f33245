"""PostgreSQL: the workflow worker's first hot-path functions, now installed by ``0004``.

This migration used to install the functions of the code that ran it. Migrations must not
build their SQL from live code, so it does nothing now: ``0004_workflow_functions`` installs
the functions as frozen text and drops the ones this migration installed on databases that
ran it before.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_leases", "0002_trigger_secrets")]

    operations = [migrations.RunPython(migrations.RunPython.noop, migrations.RunPython.noop)]
