"""The worker and its database connection on PostgreSQL: a database that refuses writes (a
standby, a read-only role), a pooler in session mode, timeouts set on the role, a server
restarted under a running worker. The read-only probe itself is tested on every backend in
``tests/test_db_read_only.py``."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from django_leases import db
from django_leases.models import RunStatus, WorkflowRun
from django_leases.workflows.engine import start_workflow
from tests.helpers import manage, running_pgbouncer, start_process, unique_key, wait_until

pytestmark = [pytest.mark.postgres_only]

ROLE = "dl_test_connection_role"


def _admin(sql: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql)


@pytest.fixture
def role(transactional_db: None) -> Iterator[str]:
    """A login role of our own (a member of the test user, so it may use the test tables),
    for role-level settings; dropped after."""
    user = connection.settings_dict.get("USER") or "postgres"
    _admin(f"DROP ROLE IF EXISTS {ROLE}")
    _admin(f"CREATE ROLE {ROLE} LOGIN INHERIT IN ROLE {user}")
    try:
        yield ROLE
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                [ROLE],
            )
        _admin(f"DROP ROLE IF EXISTS {ROLE}")


def _as(env: dict[str, str], role: str) -> dict[str, str]:
    env = dict(env)
    env["DATABASE_URL"] = env["DATABASE_URL"].replace("postgres://postgres@", f"postgres://{role}@")
    env["LEASES_LOG_LEVEL"] = "INFO"
    return env


@pytest.mark.django_db(transaction=True)
def test_a_worker_refuses_to_start_on_a_database_that_refuses_writes(
    role: str, subprocess_env: dict[str, str]
) -> None:
    """A database that answers but refuses writes (a standby behind the address after a
    failover; here ``default_transaction_read_only = on`` on the role) is not unreachable:
    the worker says at once that it refuses writes (exit 4, the database cannot serve it),
    instead of failing each unit of work and ending "the database stayed unreachable".
    ``hold_lease`` says so plainly too, and does not run its program."""
    _admin(f"ALTER ROLE {role} SET default_transaction_read_only = on")
    start_workflow("tests.sub.two-steps", {})
    env = _as(subprocess_env, role)
    done = manage("run_workflow_worker", "--once", env=env, timeout=180)
    assert done.returncode == 4, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "refuses writes" in last and "read-only" in last, last
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    held = manage(
        "hold_lease",
        unique_key("ro"),
        "--ttl",
        "3",
        "--",
        sys.executable,
        "-c",
        "print('RAN')",
        env=env,
    )
    assert held.returncode == 1 and "read-only transaction" in held.stderr
    assert "RAN" not in held.stdout


# -- poolers, role settings, restarts --------------------------------------------------------


@pytest.fixture
def session_pooler() -> Iterator[int]:
    """PgBouncer in *session* mode in front of 127.0.0.1:5432; yields its port."""
    with running_pgbouncer("session") as port:
        yield port


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_session_mode_pooler_needs_no_setting(
    session_pooler: int, subprocess_env: dict[str, str]
) -> None:
    """PgBouncer in session mode on its own port: the worker runs the work with no setting.
    It cannot tell the mode from the client, so it prepares nothing there and says so once
    (on psycopg 3; psycopg2 prepares nothing anywhere, and has nothing to say), but its
    warning does not tell a session pooler's operator to set ``DISABLE_SERVER_SIDE_CURSORS``
    (which would turn LISTEN off): it says that session mode needs nothing."""
    env = dict(subprocess_env)
    env["DATABASE_URL"] = (
        f"postgres://postgres@127.0.0.1:{session_pooler}/{connection.settings_dict['NAME']}"
    )
    env["LEASES_LOG_LEVEL"] = "INFO"
    run_id = start_workflow("tests.sub.two-steps", {})
    done = manage("run_workflow_worker", "--once", env=env)
    assert done.returncode == 0, done.stderr
    assert WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED
    warnings = [line for line in done.stderr.splitlines() if "in between?" in line]
    if not db.psycopg3(connection):
        assert warnings == [], done.stderr  # psycopg2 prepares nothing: nothing to look for
        return
    assert len(warnings) == 1, done.stderr
    assert "In session mode, or through a tunnel: nothing to set" in warnings[0]


@pytest.mark.django_db(transaction=True)
def test_role_timeouts_do_not_break_a_worker(role: str, subprocess_env: dict[str, str]) -> None:
    """Short ``idle_in_transaction_session_timeout``, ``statement_timeout`` and
    ``lock_timeout`` on the role: the worker's transactions stay within them."""
    _admin(f"ALTER ROLE {role} SET idle_in_transaction_session_timeout = '300ms'")
    _admin(f"ALTER ROLE {role} SET statement_timeout = '1s'")
    _admin(f"ALTER ROLE {role} SET lock_timeout = '200ms'")
    ids = [start_workflow("tests.sub.two-steps", {}) for _ in range(5)]
    env = _as(subprocess_env, role)
    done = manage("run_workflow_worker", "--once", "--concurrency", "3", env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    statuses = set(WorkflowRun.objects.filter(pk__in=ids).values_list("status", flat=True))
    assert statuses == {RunStatus.COMPLETED}
    assert "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.fixture(scope="module")
def private_cluster(django_db_blocker: Any) -> Iterator[Any]:
    psycopg = pytest.importorskip("psycopg")
    from tests.pgcluster import Clusters, server_bindir

    settings = connection.settings_dict
    with (
        django_db_blocker.unblock(),
        psycopg.connect(
            host=settings["HOST"] or "127.0.0.1",
            port=settings["PORT"] or 5432,
            user=settings["USER"] or "postgres",
            dbname="postgres",
        ) as server,
    ):
        major = int(server.info.server_version) // 10000
    bindir = server_bindir(major)
    if bindir is None:
        pytest.skip("no server programs")
    with Clusters(bindir) as made:
        cluster = made.primary("restart").start()
        cluster.execute("CREATE DATABASE app")
        yield cluster


def _cluster_env(cluster: Any) -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:{cluster.port}/app"
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONUNBUFFERED"] = "1"
    env["LEASES_LOG_LEVEL"] = "INFO"
    return env


def _statuses(cluster: Any) -> list[str]:
    return [
        r[0] for r in cluster.execute("SELECT status FROM django_leases_workflowrun", dbname="app")
    ]


@pytest.mark.slow
def test_a_worker_survives_a_database_restart(private_cluster: Any) -> None:
    """A server stopped and started under a running worker: the worker reconnects, runs the
    work started after the restart, and stops cleanly on SIGTERM."""
    cluster = private_cluster
    env = _cluster_env(cluster)
    done = manage("migrate", "--noinput", env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    worker = start_process(
        [
            sys.executable,
            "manage.py",
            "run_workflow_worker",
            "--poll-interval",
            "0.2",
            "--concurrency",
            "2",
        ],
        env=env,
    )
    assert manage("start_workflow", "tests.sub.two-steps", env=env).returncode == 0
    wait_until(lambda: _statuses(cluster) == ["completed"], 60, what="first run")
    cluster.stop()
    cluster.start()
    started = manage("start_workflow", "tests.sub.two-steps", env=env)
    assert started.returncode == 0, started.stderr

    def both() -> bool:
        assert worker.poll() is None, worker.communicate()
        return sorted(_statuses(cluster)) == ["completed", "completed"]

    try:
        wait_until(both, 60, what="second run after the restart")
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err[-3000:]
