"""Behind PgBouncer in transaction mode: workers, ``hold_lease``, migrations and the admin.

The test starts Debian's ``pgbouncer`` on a private port (``pool_mode = transaction``, a small
pool so server connections are shared) in front of the suite's PostgreSQL, and runs the
commands through it as child processes. Two ways to be there:

* as Django asks, with ``DISABLE_SERVER_SIDE_CURSORS = True``: django-leases then neither
  prepares statements nor LISTENs, and workers say at start that they poll;
* without it: the pooler is seen before the first statement (the port the client reached is
  not the server's), so nothing is prepared (logged once); were it not, the first prepared
  statement the pooler refuses switches prepared statements off for the alias and the
  statement is sent again; nothing fails.

PgBouncer (``apt-get install pgbouncer``) is needed: without it the test is skipped on a
user's machine and fails under ``CI=true`` (``.ci/run`` installs it).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from django_leases.models import Lease, RunStatus, WorkflowRun
from django_leases.workflows.engine import start_workflow
from tests.helpers import manage, running_pgbouncer, start_process, unique_key, wait_until

pytestmark = [pytest.mark.postgres_only, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def pgbouncer() -> Iterator[int]:
    """A PgBouncer in transaction mode, a pool of 3, in front of 127.0.0.1:5432; yields its
    port."""
    with running_pgbouncer("transaction", pool_size=3) as port:
        yield port


def _env(base: dict[str, str], port: int, *, declared: bool) -> dict[str, str]:
    """The child's environment: its default database is the test database, through the
    pooler; ``declared``: with ``DISABLE_SERVER_SIDE_CURSORS``."""
    env = dict(base)
    url = f"postgres://postgres@127.0.0.1:{port}/{connection.settings_dict['NAME']}"
    env["DATABASE_URL"] = url + ("?disable_server_side_cursors=true" if declared else "")
    env["LEASES_LOG_LEVEL"] = "INFO"
    return env


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("declared", [True, False], ids=["declared", "undeclared"])
def test_a_worker_behind_the_pooler_runs_every_run(
    pgbouncer: int, subprocess_env: dict[str, str], declared: bool
) -> None:
    run_ids = [start_workflow("tests.sub.two-steps", {}) for _ in range(5)]
    done = manage(
        "run_workflow_worker", "--once", env=_env(subprocess_env, pgbouncer, declared=declared)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    statuses = set(WorkflowRun.objects.filter(pk__in=run_ids).values_list("status", flat=True))
    assert statuses == {RunStatus.COMPLETED}, done.stdout + done.stderr
    # A refusal of a prepared statement (the pooler's server connection already has one of
    # that name, or does not know it) is handled and said once; nothing else about it.
    refusals = done.stderr.count("refused a prepared statement")
    assert refusals == (0 if declared else refusals) and refusals <= 1, done.stderr
    others = done.stderr.replace("refused a prepared statement", "")
    assert "Traceback" not in done.stderr and "failed" not in others, done.stderr


@pytest.mark.django_db(transaction=True)
@pytest.mark.psycopg3_only  # on psycopg2 the worker polls for that reason first (test_db.py)
def test_a_worker_behind_a_declared_pooler_says_it_polls(
    pgbouncer: int, subprocess_env: dict[str, str]
) -> None:
    env = _env(subprocess_env, pgbouncer, declared=True)
    worker = subprocess.Popen(
        [sys.executable, "manage.py", "run_workflow_worker", "--poll-interval", "0.2"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        first = worker.stdout.readline()
        assert "polling every 0.2 s" in first and "DISABLE_SERVER_SIDE_CURSORS" in first, first
        run_id = start_workflow("tests.sub.two-steps", {})
        wait_until(
            lambda: WorkflowRun.objects.get(pk=run_id).status == RunStatus.COMPLETED,
            60,
            what="the run completing through the pooler",
        )
    finally:
        worker.terminate()
        _, errors = worker.communicate(timeout=60)
    assert worker.returncode == 0, errors
    assert "prepared statement" not in errors, errors


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("declared", [True, False], ids=["declared", "undeclared"])
def test_hold_lease_behind_the_pooler_holds_and_releases(
    pgbouncer: int, subprocess_env: dict[str, str], declared: bool
) -> None:
    key = unique_key("pooled")
    go_on = Path(tempfile.mkdtemp(prefix="dl-pooled-")) / "go-on"
    # The child holds the lease until the test has seen a renewal land through the pooler.
    child = (
        "import os, pathlib, sys, time\n"
        "while not pathlib.Path(sys.argv[1]).exists():\n"
        "    time.sleep(0.05)\n"
        "print(os.environ['DJANGO_LEASES_TOKEN'])\n"
    )
    python_child = [sys.executable, "-c", child, str(go_on)]
    holder = start_process(
        [sys.executable, "manage.py", "hold_lease", key, "--ttl", "3", "--", *python_child],
        env=_env(subprocess_env, pgbouncer, declared=declared),
    )

    def renewed() -> bool:
        assert holder.poll() is None, holder.communicate()
        lease = Lease.objects.filter(key=key).first()
        return lease is not None and lease.renewed_at > lease.acquired_at

    wait_until(renewed, 60, what="a renewal through the pooler")
    go_on.touch()
    stdout, stderr = holder.communicate(timeout=60)
    shutil.rmtree(go_on.parent, ignore_errors=True)
    assert holder.returncode == 0, stdout + stderr
    assert stdout.strip().splitlines()[-1] == "1"
    lease = Lease.objects.with_state().get(key=key)
    assert lease.state == "released"  # type: ignore[attr-defined]
    assert lease.renewed_at > lease.acquired_at


@pytest.mark.django_db(transaction=True)
def test_migrations_and_the_admin_work_behind_the_pooler(
    pgbouncer: int, subprocess_env: dict[str, str]
) -> None:
    env = _env(subprocess_env, pgbouncer, declared=True)
    backwards = manage("migrate", "django_leases", "0034_deploys", "--verbosity", "0", env=env)
    assert backwards.returncode == 0, backwards.stderr
    forwards = manage("migrate", "--verbosity", "0", env=env)
    assert forwards.returncode == 0, forwards.stderr
    check = manage("check", "--database", "default", env=env)
    assert check.returncode == 0 and "E013" not in check.stderr, check.stderr
    admin = manage(
        "shell",
        "-c",
        "from django.contrib.auth.models import User; from django.test import Client; "
        "user = User.objects.create_superuser('pooled-admin', 'a@example.com', 'pw'); "
        "client = Client(); client.force_login(user); "
        "print(*(client.get(f'/admin/django_leases/{m}/').status_code "
        "for m in ('lease', 'workflowrun', 'triggersource')))",
        env=env,
    )
    assert admin.returncode == 0, admin.stderr
    assert admin.stdout.splitlines()[-1].split() == ["200", "200", "200"], admin.stdout


@pytest.mark.psycopg3_only  # the listener is a psycopg 3 connection
def test_the_wakeup_listener_keeps_the_options_django_was_given(pgbouncer: int) -> None:
    """The listener's keep-alive must not become a prepared statement: it kept every option
    Django connects with but ``prepare_threshold=None``, and psycopg's default prepares a
    query on its fifth run, which a transaction pooler then fails on (another client's
    server connection does not know it, or already has it)."""
    import psycopg

    from django_leases.workflows.wakeup import WakeupListener

    listener = WakeupListener("default", lambda: None)
    params = dict(listener._params)
    assert "prepare_threshold" in params and params["prepare_threshold"] is None
    params.update(host="127.0.0.1", port=pgbouncer)
    with psycopg.connect(**params, autocommit=True) as pooled:
        assert pooled.prepare_threshold is None
        for _ in range(12):  # more than psycopg's default threshold of five
            pooled.execute("SELECT 1")
        left = pooled.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()
        assert left is not None and left[0] == 0, "a prepared statement was left on the server"


#: A child's lease traffic through the pooler: threads (more than its server connections, so
#: they are shared) acquiring, refreshing and releasing, in autocommit and inside atomic()
#: blocks with savepoints, and reconnecting between cycles as CONN_MAX_AGE = 0 does.
_LEASE_TRAFFIC = """
import threading
from django.db import connection, transaction
from django_leases.models import Lease
errors = []
def work(n):
    try:
        for i in range(60):
            key = f"pooled-traffic:{n}:{i % 3}"
            lease = Lease.objects.acquire(key, f"h{n}", 30)
            assert lease is not None, key
            assert Lease.objects.refresh(lease, 30) is not None, key
            assert Lease.objects.release(lease), key
            with transaction.atomic():
                lease = Lease.objects.acquire(key, f"h{n}", 30)
                try:
                    with transaction.atomic():
                        assert Lease.objects.refresh(lease, 30) is not None, key
                        raise KeyError(key)
                except KeyError:
                    pass
                assert Lease.objects.release(lease), key
            if i % 10 == 0:
                connection.close()
    except Exception as exc:
        errors.append(repr(exc))
    finally:
        connection.close()
threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
for t in threads: t.start()
for t in threads: t.join()
print("errors:", errors)
"""


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("declared", [True, False], ids=["declared", "undeclared"])
def test_lease_operations_behind_the_pooler_never_meet_a_prepared_statement(
    pgbouncer: int, subprocess_env: dict[str, str], declared: bool
) -> None:
    """Debian's PgBouncer (1.18: no prepared statements across server connections) in
    transaction mode: the tuned lease path's functions need none, so nothing is refused."""
    done = manage(
        "shell", "-c", _LEASE_TRAFFIC, env=_env(subprocess_env, pgbouncer, declared=declared)
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "errors: []", done.stdout + done.stderr
    assert "prepared statement" not in done.stderr and "Traceback" not in done.stderr
    assert Lease.objects.filter(key__startswith="pooled-traffic:").count() == 18
    assert not Lease.objects.filter(key__startswith="pooled-traffic:", released_at=None)


@pytest.mark.django_db(transaction=True)
def test_a_connection_through_the_pooler_is_seen_as_one(pgbouncer: int) -> None:
    """Undeclared (no DISABLE_SERVER_SIDE_CURSORS), a connection through PgBouncer prepares
    nothing from its first statement: its port is not the server's."""
    from django.db.backends.postgresql.base import DatabaseWrapper

    from django_leases import db

    through = DatabaseWrapper(
        {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": str(pgbouncer)},
        alias="through-the-pooler",
    )
    try:
        assert not db.prepares(through)
        with db.cursor(through) as cursor:
            assert cursor.execute("SELECT %s::int * 2", [21]).fetchone() == (42,)
    finally:
        through.close()
        db._direct.pop("through-the-pooler", None)
        db._unprepared.discard("through-the-pooler")
