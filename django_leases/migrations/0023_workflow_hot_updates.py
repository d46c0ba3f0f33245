"""Room for HOT updates of runs and steps (PostgreSQL).

* The running steps' partial index ``dl_step_running`` is on ``queue`` (not on
  ``lease_expires_at``, and ``dl_step_queue_running`` goes): a step lease renewal then changes
  no indexed column, so PostgreSQL can write it as a heap-only (HOT) update, with no new
  index entry. Running steps are few (one per busy worker thread): the claim's look for a
  lapsed lease and a limited queue's count read them whole.
* ``fillfactor = 80`` on the run and step tables (PostgreSQL only; applies to the pages
  written from now on): a fifth of each new page stays free, so an update that changes no
  indexed column (a lease renewal, a parallel branch counted off its run) finds room on the
  row's own page, which a HOT update needs. Elsewhere than PostgreSQL it does nothing.
"""

from django.db import migrations, models

#: The tables, and the fill factor their new pages get.
TABLES = ("django_leases_workflowrun", "django_leases_workflowstep")
FILLFACTOR = 80


def set_fillfactor(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.connection.ops.quote_name
    for table in TABLES:
        schema_editor.execute(f"ALTER TABLE {quote(table)} SET (fillfactor = {FILLFACTOR})")


def reset_fillfactor(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor != "postgresql":
        return
    quote = schema_editor.connection.ops.quote_name
    for table in TABLES:
        schema_editor.execute(f"ALTER TABLE {quote(table)} RESET (fillfactor)")


class Migration(migrations.Migration):
    dependencies = [
        ("django_leases", "0022_workflow_functions"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="workflowstep",
            name="dl_step_running",
        ),
        migrations.RemoveIndex(
            model_name="workflowstep",
            name="dl_step_queue_running",
        ),
        migrations.AddIndex(
            model_name="workflowstep",
            index=models.Index(
                condition=models.Q(("status", "running")),
                fields=["queue"],
                name="dl_step_running",
            ),
        ),
        migrations.RunPython(set_fillfactor, reset_fillfactor, elidable=False),
    ]
