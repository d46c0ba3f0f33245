"""Verbose names (and the help texts there were) of the lease, schedule and trigger-source
models, marked for translation.

Django keeps ``verbose_name`` in a migration's state, so it writes these operations; none
changes the schema: ``sqlmigrate`` prints no statement for it on PostgreSQL, SQLite or MariaDB
(``tests/test_translations.py`` keeps it so). The workflow models get theirs with their
reshape.
"""

import django_leases.clock
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_leases', '0028_workflow_functions'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='lease',
            options={'ordering': ('key',), 'permissions': (('force_release_lease', 'Can force-release a lease'),), 'verbose_name': 'lease', 'verbose_name_plural': 'leases'},
        ),
        migrations.AlterModelOptions(
            name='orphantriggersource',
            options={'verbose_name': 'orphaned trigger source', 'verbose_name_plural': 'orphaned trigger sources'},
        ),
        migrations.AlterModelOptions(
            name='triggerevent',
            options={'ordering': ('-received_at',), 'verbose_name': 'trigger event', 'verbose_name_plural': 'trigger events'},
        ),
        migrations.AlterModelOptions(
            name='triggersource',
            options={'ordering': ('name',), 'permissions': (('toggle_triggersource', 'Can enable, disable and tear down trigger sources'),), 'verbose_name': 'trigger source', 'verbose_name_plural': 'trigger sources'},
        ),
        migrations.AlterModelOptions(
            name='workflowschedule',
            options={'ordering': ('name',), 'permissions': (('pause_workflowschedule', 'Can pause and resume workflow schedules'),), 'verbose_name': 'workflow schedule', 'verbose_name_plural': 'workflow schedules'},
        ),
        migrations.AlterField(
            model_name='lease',
            name='acquired_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='acquired at'),
        ),
        migrations.AlterField(
            model_name='lease',
            name='expires_at',
            field=models.DateTimeField(verbose_name='expires at'),
        ),
        migrations.AlterField(
            model_name='lease',
            name='holder',
            field=models.CharField(max_length=255, verbose_name='holder'),
        ),
        migrations.AlterField(
            model_name='lease',
            name='key',
            field=models.CharField(max_length=255, verbose_name='key'),
        ),
        migrations.AlterField(
            model_name='lease',
            name='released_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='released at'),
        ),
        migrations.AlterField(
            model_name='lease',
            name='renewed_at',
            field=models.DateTimeField(blank=True, null=True, verbose_name='renewed at'),
        ),
        migrations.AlterField(
            model_name='lease',
            name='token',
            field=models.BigIntegerField(default=1, help_text='Fencing token; rises on every takeover.', verbose_name='token'),
        ),
        migrations.AlterField(
            model_name='triggerevent',
            name='delivery_id',
            field=models.CharField(max_length=200, verbose_name='delivery id'),
        ),
        migrations.AlterField(
            model_name='triggerevent',
            name='event',
            field=models.CharField(max_length=200, verbose_name='event'),
        ),
        migrations.AlterField(
            model_name='triggerevent',
            name='payload',
            field=models.JSONField(verbose_name='payload'),
        ),
        migrations.AlterField(
            model_name='triggerevent',
            name='received_at',
            field=models.DateTimeField(auto_now_add=True, verbose_name='received at'),
        ),
        migrations.AlterField(
            model_name='triggerevent',
            name='source_name',
            field=models.CharField(max_length=200, verbose_name='source name'),
        ),
        migrations.AlterField(
            model_name='triggersource',
            name='base_url',
            field=models.CharField(blank=True, max_length=500, null=True, verbose_name='base URL'),
        ),
        migrations.AlterField(
            model_name='triggersource',
            name='config',
            field=models.JSONField(blank=True, default=dict, help_text='Non-secret provider config.', verbose_name='config'),
        ),
        migrations.AlterField(
            model_name='triggersource',
            name='declared',
            field=models.BooleanField(default=True, verbose_name='declared'),
        ),
        migrations.AlterField(
            model_name='triggersource',
            name='detail',
            field=models.TextField(blank=True, null=True, verbose_name='detail'),
        ),
        migrations.AlterField(
            model_name='triggersource',
            name='enabled',
            field=models.BooleanField(default=False, verbose_name='enabled'),
        ),
        migrations.AlterField(
            model_name='triggersource',
            name='kind',
            field=models.CharField(default='webhook', max_length=32, verbose_name='kind'),
        ),
        migrations.AlterField(
            model_name='triggersource',
            name='label_prefix',
            field=models.CharField(blank=True, max_length=200, null=True, verbose_name='label prefix'),
        ),
        migrations.AlterField(
            model_name='triggersource',
            name='name',
            field=models.CharField(max_length=200, unique=True, verbose_name='name'),
        ),
        migrations.AlterField(
            model_name='triggersource',
            name='provider',
            field=models.CharField(max_length=64, verbose_name='provider'),
        ),
        migrations.AlterField(
            model_name='triggersource',
            name='state',
            field=models.JSONField(blank=True, null=True, verbose_name='state'),
        ),
        migrations.AlterField(
            model_name='triggersource',
            name='status',
            field=models.CharField(blank=True, max_length=32, null=True, verbose_name='status'),
        ),
        migrations.AlterField(
            model_name='triggersource',
            name='updated_at',
            field=models.DateTimeField(auto_now=True, verbose_name='updated at'),
        ),
        migrations.AlterField(
            model_name='workflowschedule',
            name='catch_up',
            field=models.CharField(choices=[('latest', 'latest'), ('none', 'none')], default='latest', max_length=16, verbose_name='catch up'),
        ),
        migrations.AlterField(
            model_name='workflowschedule',
            name='created_at',
            field=models.DateTimeField(db_default=django_leases.clock.DbNow(), verbose_name='created at'),
        ),
        migrations.AlterField(
            model_name='workflowschedule',
            name='cron',
            field=models.CharField(max_length=200, verbose_name='cron'),
        ),
        migrations.AlterField(
            model_name='workflowschedule',
            name='declared',
            field=models.BooleanField(default=True, verbose_name='declared'),
        ),
        migrations.AlterField(
            model_name='workflowschedule',
            name='input',
            field=models.JSONField(blank=True, default=dict, verbose_name='input'),
        ),
        migrations.AlterField(
            model_name='workflowschedule',
            name='last_run_id',
            field=models.UUIDField(blank=True, null=True, verbose_name='last run id'),
        ),
        migrations.AlterField(
            model_name='workflowschedule',
            name='last_tick',
            field=models.DateTimeField(blank=True, null=True, verbose_name='last tick'),
        ),
        migrations.AlterField(
            model_name='workflowschedule',
            name='name',
            field=models.CharField(max_length=200, unique=True, verbose_name='name'),
        ),
        migrations.AlterField(
            model_name='workflowschedule',
            name='next_tick',
            field=models.DateTimeField(blank=True, null=True, verbose_name='next tick'),
        ),
        migrations.AlterField(
            model_name='workflowschedule',
            name='paused',
            field=models.BooleanField(default=False, verbose_name='paused'),
        ),
        migrations.AlterField(
            model_name='workflowschedule',
            name='timezone',
            field=models.CharField(default='UTC', max_length=64, verbose_name='time zone'),
        ),
        migrations.AlterField(
            model_name='workflowschedule',
            name='updated_at',
            field=models.DateTimeField(db_default=django_leases.clock.DbNow(), verbose_name='updated at'),
        ),
        migrations.AlterField(
            model_name='workflowschedule',
            name='workflow',
            field=models.CharField(max_length=200, verbose_name='workflow'),
        ),
    ]
