"""django-leases in a project with more than one database, routed as Django's documentation
shows.

The router used here is the one Django's documentation shows (by app label, ignoring the
``instance`` hint): every django_leases model is read and written on :data:`LEASES`, a
SQLite file django-leases' migrations are applied to; ``default`` (the suite's test
database) keeps the rest and, as a second shard, django-leases' tables too. A run started
there with ``using="default"`` and driven there (``drive(using=...)``, a worker's
``--database default``) must keep working on ``default``.

:data:`BARE` is a database the router never lets django-leases migrate to: ``migrate``
records django-leases' migrations there (Django records a migration whose operations the
router skipped) and creates no table.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib.util import find_spec
from io import StringIO
from typing import Any

import pytest
from django.core import checks as django_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections
from django.db.utils import load_backend

from django_leases.models import WorkflowRun, WorkflowSchedule
from django_leases.testing import drive
from django_leases.workflows import start_workflow, step_function, workflow
from django_leases.workflows.schedules import declaration

LEASES = "multidb_leases"
BARE = "multidb_bare"


class LeasesElsewhere:
    """django_leases on :data:`LEASES`; :data:`BARE` gets no django_leases table."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return LEASES if model._meta.app_label == "django_leases" else None

    db_for_write = db_for_read

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if db == LEASES:
            return app_label == "django_leases"
        if db == BARE:
            return app_label != "django_leases"
        return None


@step_function("tests.multidb.echo")
def _echo(data: Any, ctx: Any) -> Any:
    return data


@workflow("tests.multidb.child")
def _child(run: Any, input: Any) -> Any:
    return run.step("s", "tests.multidb.echo", {"child": input})


@workflow("tests.multidb.parent")
def _parent(run: Any, input: Any) -> Any:
    return {"kid": run.child("kid", "tests.multidb.child", 5)}


def _sqlite_config(name: str) -> dict[str, Any]:
    config = dict(connections.settings["default"])
    config.update(
        ENGINE="django.db.backends.sqlite3",
        NAME=name,
        USER="",
        PASSWORD="",
        HOST="",
        PORT="",
        OPTIONS={"transaction_mode": "IMMEDIATE", "timeout": 20},
        TEST={},
    )
    return config


def _add_alias(alias: str, config: dict[str, Any], *, in_settings: bool) -> None:
    """Add ``alias``: to ``DATABASES`` (``in_settings``: commands and checks see it), or as
    a connection of this thread only, which Django's test case allows as one created on the
    fly (tests/test_routed_transactions.py does the same)."""
    if in_settings:
        connections.settings[alias] = config
    else:
        connections[alias] = load_backend(config["ENGINE"]).DatabaseWrapper(config, alias)


def _drop_alias(alias: str) -> None:
    try:
        connections[alias].close()
        del connections[alias]
    except Exception:
        pass
    connections.settings.pop(alias, None)


def _route_to_leases(settings: Any, path: str, *, in_settings: bool) -> None:
    _add_alias(LEASES, _sqlite_config(path), in_settings=in_settings)
    settings.DATABASE_ROUTERS = [f"{__name__}.LeasesElsewhere"]
    call_command("migrate", "django_leases", database=LEASES, verbosity=0, skip_checks=True)


@pytest.fixture
def leases_elsewhere(settings: Any, tmp_path: Any) -> Iterator[str]:
    """:data:`LEASES` (a SQLite file, django-leases migrated there; this thread's
    connection) and the router to it."""
    try:
        _route_to_leases(settings, str(tmp_path / "leases.sqlite3"), in_settings=False)
        yield LEASES
    finally:
        _drop_alias(LEASES)


@pytest.fixture
def bare(settings: Any, tmp_path: Any, django_db_blocker: Any, request: Any) -> Iterator[str]:
    """:data:`LEASES` and :data:`BARE` in ``DATABASES``, the router sending django_leases to
    :data:`LEASES`. :data:`BARE` has django-leases' migrations recorded and no table: a
    SQLite file, or (``request.param == "postgresql"``) a fresh PostgreSQL database on the
    suite's server. The test takes no ``django_db`` (commands and checks must meet the
    aliases themselves); nothing is written to ``default``."""
    on_postgres = getattr(request, "param", None) == "postgresql"
    name = f"{connection.settings_dict['NAME']}_multidb_bare"
    with django_db_blocker.unblock():
        try:
            _route_to_leases(settings, str(tmp_path / "leases.sqlite3"), in_settings=True)
            if on_postgres:
                with connection.cursor() as cursor:
                    cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')
                    cursor.execute(f'CREATE DATABASE "{name}"')
                config = dict(connections.settings["default"])
                config.update(NAME=name, TEST={})
            else:
                config = _sqlite_config(str(tmp_path / "bare.sqlite3"))
            _add_alias(BARE, config, in_settings=True)
            call_command("migrate", "django_leases", database=BARE, verbosity=0)
            yield BARE
        finally:
            _drop_alias(BARE)
            _drop_alias(LEASES)
            if on_postgres:
                with connection.cursor() as cursor:
                    cursor.execute(f'DROP DATABASE IF EXISTS "{name}"')


# -- checks and commands on a database the router keeps django-leases off ----------------------


@pytest.mark.postgres_only
@pytest.mark.parametrize("bare", ["postgresql"], indirect=True)
def test_e013_is_not_reported_for_a_database_the_router_keeps_django_leases_off(
    bare: str, django_db_blocker: Any
) -> None:
    """``check --database`` (and so every ``migrate`` after the first) must not fail with
    E013 on a database that holds no django-leases table by the router's choice: the
    functions are missing there because the tables are, as they should be."""
    with django_db_blocker.unblock():
        messages = django_checks.run_checks(databases=[bare], tags=["database"])
        assert [m.id for m in messages if m.id == "django_leases.E013"] == []
        # A second ``migrate`` of that database runs the same check first.
        call_command("migrate", "django_leases", database=bare, verbosity=0)


def test_a_command_on_a_database_without_django_leases_tables_exits_4_not_a_traceback(
    bare: str, django_db_blocker: Any
) -> None:
    """docs/reference/commands.md: a database that never had django-leases' tables is exit 4
    with "django-leases' tables are not on database …", no traceback; here the migrations
    are recorded (the router skipped them) and the tables absent."""
    with django_db_blocker.unblock(), pytest.raises(CommandError) as refused:
        call_command("workflow_runs", "list", "--database", bare, stdout=StringIO())
    assert refused.value.returncode == 4
    assert f"django-leases' tables are not on database {bare!r}" in str(refused.value)


# -- a run on a database other than the router's -----------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_child_run_on_a_database_other_than_the_routers(leases_elsewhere: str) -> None:
    """``start_workflow(using=)`` and ``drive(using=)`` put a run on ``default``; its
    ``run.child`` must start the child there too, not fail the run with Django's
    "the current database router prevents this relation"."""
    run_id = start_workflow("tests.multidb.parent", {}, using="default")
    run = drive(run_id, using="default")
    assert run is not None
    assert (run.status, run.error) == ("completed", None)
    assert run.output == {"kid": {"child": 5}}
    assert not WorkflowRun.objects.using(leases_elsewhere).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(
    not (find_spec("django.tasks") or find_spec("django_tasks")), reason="needs the Tasks API"
)
def test_a_task_schedule_tick_on_a_database_other_than_the_routers(
    leases_elsewhere: str,
) -> None:
    """A worker serving ``--database default`` fires task schedules through
    ``start_scheduled_task(alias="default", ...)`` (``enqueue_for_tick(using=...)``): the
    task run is enqueued on that database (before, every tick raised Django's "the current
    database router prevents this relation", so the schedule never fired)."""
    from django_leases.tasks import start_scheduled_task

    run_id, started = start_scheduled_task(
        "default", "tests.workapp.tasks.add", [1, 2], {}, f"schedule:multidb:{uuid.uuid4()}"
    )
    assert started
    assert WorkflowRun.objects.using("default").filter(pk=run_id).exists()
    assert not WorkflowRun.objects.using(leases_elsewhere).exists()


@pytest.mark.django_db(transaction=True)
def test_backfill_on_a_database_other_than_the_routers(leases_elsewhere: str) -> None:
    """``workflow_schedules backfill NAME --database default`` (and
    ``WorkflowSchedule.objects.db_manager("default").backfill``) must start the ticks' runs
    on that database, not refuse with "the current database router prevents this
    relation"."""
    schedules = WorkflowSchedule.objects.db_manager("default")
    schedules.sync([declaration("multidb-yearly", "tests.multidb.child", "0 0 1 1 *")])
    start = datetime(2020, 6, 1, tzinfo=UTC)  # ticks 2021-01-01 and 2022-01-01
    done = schedules.backfill("multidb-yearly", start, datetime(2022, 6, 1, tzinfo=UTC))
    assert done is not None
    runs = WorkflowRun.objects.using("default").filter(workflow="tests.multidb.child")
    assert runs.count() == 2


@pytest.mark.django_db(transaction=True)
def test_leases_check_of_a_database_sees_the_workers_serving_it(leases_elsewhere: str) -> None:
    """``leases_check --database default`` (``health.run_checks(["default"])``) reads that
    database's workers and leases, as it reads its runs and steps: a worker alive on
    ``default`` (``run_workflow_worker --database default``, its row and heartbeat lease
    there) is seen (before, they were read from the router's database and it was reported
    as "no workflow worker is running")."""
    from django_leases import health
    from django_leases.models import Lease, WorkflowWorker

    key = "workflow-worker:multidb-host:1"
    WorkflowWorker.objects.db_manager("default").register(
        key, host="multidb-host", pid=1, concurrency=2, queues=[], wakeup="polling"
    )
    assert Lease.objects.db_manager("default").acquire(key, "multidb-host:1", ttl=300) is not None
    report = health.run_checks(["default"])
    (workers,) = [f for f in report.findings if f.check == "workers" and f.alias == "default"]
    assert workers.details["live_workers"] == 1, workers.message
