"""Operators: run tags (``WorkflowRun.tags`` and the ``WorkflowRunTag`` rows that the tag
filter reads through their index), ``WorkflowRun.forked_from``, ``WorkflowStep.progress`` and
the index behind the search by key."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_leases", "0034_deploys"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkflowRunTag",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("name", models.CharField(max_length=64, verbose_name="name")),
                ("value", models.CharField(blank=True, max_length=255, verbose_name="value")),
            ],
            options={
                "verbose_name": "run tag",
                "verbose_name_plural": "run tags",
            },
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="forked_from",
            field=models.ForeignKey(
                blank=True,
                help_text="The run this one was forked from (fork_run).",
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="forks",
                to="django_leases.workflowrun",
                verbose_name="forked from",
            ),
        ),
        migrations.AddField(
            model_name="workflowrun",
            name="tags",
            field=models.JSONField(
                blank=True,
                help_text="Names and values the run was started with, to find it by.",
                null=True,
                verbose_name="tags",
            ),
        ),
        migrations.AddField(
            model_name="workflowstep",
            name="progress",
            field=models.JSONField(
                blank=True,
                help_text="What the running attempt last said of its progress (ctx.set_progress).",
                null=True,
                verbose_name="progress",
            ),
        ),
        migrations.AddIndex(
            model_name="workflowrun",
            index=models.Index(
                fields=["key"], name="dl_run_key", opclasses=["varchar_pattern_ops"]
            ),
        ),
        migrations.AddField(
            model_name="workflowruntag",
            name="run",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="tag_rows",
                to="django_leases.workflowrun",
            ),
        ),
        migrations.AddIndex(
            model_name="workflowruntag",
            index=models.Index(fields=["name", "value", "run"], name="dl_run_tag_lookup"),
        ),
        migrations.AddConstraint(
            model_name="workflowruntag",
            constraint=models.UniqueConstraint(fields=("run", "name"), name="dl_run_tag_unique"),
        ),
    ]
