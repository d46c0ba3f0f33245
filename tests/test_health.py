"""``manage.py leases_check`` and :mod:`django_leases.health`, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections
from django.db.migrations.recorder import MigrationRecorder
from django.test.utils import CaptureQueriesContext

from django_leases import health
from django_leases.clock import db_now_plus
from django_leases.management.base import EXIT_CODES, USAGE_ERROR
from django_leases.models import Lease, WorkflowRun, WorkflowStep
from tests.helpers import ROOT, manage

BOGUS = "bogus_health"


def by_check(report: health.HealthReport, alias: str = "default") -> dict[str, health.Finding]:
    return {f.check: f for f in report.findings if f.alias == alias}


def run_command(*args: str) -> tuple[int, str]:
    out = StringIO()
    try:
        call_command("leases_check", *args, stdout=out)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


def make_run(**fields: Any) -> WorkflowRun:
    run = WorkflowRun.objects.start("health-test", {"n": 1})
    WorkflowRun.objects.filter(pk=run.pk).update(**fields)
    run.refresh_from_db()
    return run


def make_step(run: WorkflowRun, name: str = "one", **fields: Any) -> WorkflowStep:
    step = WorkflowStep.objects.create(run=run, step_name=name, function_name="fn")
    WorkflowStep.objects.filter(pk=step.pk).update(**fields)
    step.refresh_from_db()
    return step


def unapply_all(app: str) -> list[str]:
    """Record every migration of ``app`` as unapplied (undone by the test's rollback)."""
    names = list(
        MigrationRecorder.Migration.objects.filter(app=app)
        .order_by("-id")
        .values_list("name", flat=True)
    )
    for name in names:
        MigrationRecorder(connection).record_unapplied(app, name)
    return names


@pytest.fixture
def bogus_alias() -> Iterator[str]:
    """A configured database alias whose SQLite file sits in a directory that does not exist."""
    config = dict(connections.settings["default"])
    config.update(
        ENGINE="django.db.backends.sqlite3",
        NAME="/nonexistent-django-leases-dir/health.sqlite3",
        OPTIONS={},
        TEST={},
    )
    connections.settings[BOGUS] = config
    try:
        yield BOGUS
    finally:
        try:
            connections[BOGUS].close()
            del connections[BOGUS]
        except Exception:
            pass
        connections.settings.pop(BOGUS, None)


class LeasesToBogus:
    """A router that sends django-leases' writes to the bogus alias."""

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return BOGUS if model._meta.app_label == "django_leases" else None


# -- a healthy installation -------------------------------------------------------------------


@pytest.mark.django_db
def test_a_migrated_idle_database_is_healthy() -> None:
    report = health.run_checks()
    checks = by_check(report)
    assert [f.status for f in report.findings] == ["ok"] * 6, health.format_text(report)
    assert set(checks) == {
        "database",
        "migrations",
        "replication",
        "workers",
        "lapsed_steps",
        "stuck_runs",
    }
    assert checks["replication"].message in (
        "no standby is connected",
        "no replication state to read on this database",
    )
    assert report.exit_code == health.EXIT_OK == 0
    assert "no workflow worker is running" in checks["workers"].message

    code, out = run_command()
    assert code == 0
    assert out.startswith("django-leases: healthy")
    # "table" is the documented spelling; "text", the older one, prints the same report.
    assert run_command("--format", "table") == run_command("--format", "text") == (0, out)


@pytest.mark.django_db
def test_json_format_is_the_report() -> None:
    code, out = run_command("--format", "json")
    data = json.loads(out)
    assert code == 0
    assert data["healthy"] is True and data["exit_code"] == 0
    assert {c["check"] for c in data["checks"]} == {
        "database",
        "migrations",
        "replication",
        "workers",
        "lapsed_steps",
        "stuck_runs",
    }
    assert data["checks"][0]["details"]["vendor"] == connection.vendor


# -- databases --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_an_unknown_alias_is_bad_usage_not_unreachable() -> None:
    for args in (["--database", "typo"], ["--database", "default", "--database", "typo"]):
        with pytest.raises(CommandError, match="Unknown database alias 'typo'") as refused:
            call_command("leases_check", *args, stdout=StringIO())
        assert refused.value.returncode == USAGE_ERROR == 2


@pytest.mark.django_db
def test_an_unreachable_alias_is_reported_and_its_other_checks_skipped(bogus_alias: str) -> None:
    report = health.run_checks([bogus_alias])
    checks = by_check(report, bogus_alias)
    assert checks["database"].status == "unreachable"
    assert "cannot reach the database" in checks["database"].message
    for name in ("migrations", "replication", "workers", "lapsed_steps", "stuck_runs"):
        assert checks[name].status == "skipped"
    assert report.exit_code == health.EXIT_UNREACHABLE == 4

    code, out = run_command("--database", bogus_alias, "--format", "json")
    assert code == 4
    assert json.loads(out)["checks"][0]["status"] == "unreachable"


@pytest.mark.django_db
def test_the_aliases_checked_by_default_follow_the_router(bogus_alias: str, settings: Any) -> None:
    settings.DATABASE_ROUTERS = [f"{__name__}.LeasesToBogus"]
    assert health.write_aliases() == [bogus_alias]
    code, out = run_command()
    assert code == 4
    assert f"UNREACHABLE database [{bogus_alias}]" in out


@pytest.mark.django_db
def test_unreachable_takes_precedence_over_problems(bogus_alias: str) -> None:
    unapply_all("sessions")
    report = health.run_checks(["default", bogus_alias])
    assert by_check(report)["migrations"].status == "problem"
    assert report.exit_code == 4


def test_an_unknown_alias_is_unreachable() -> None:
    finding = health.check_database("no-such-alias")
    assert finding.status == "unreachable"
    assert "no-such-alias" in finding.message


# -- migrations -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_unapplied_migrations_of_django_leases_are_a_problem() -> None:
    # The latest migration the squashed one replaces (unrecording the squashed migration
    # alone changes nothing: Django counts it applied while all it replaces are).
    recorded = MigrationRecorder.Migration.objects.filter(app="django_leases")
    latest = recorded.exclude(name__contains="_squashed_").latest("id").name
    MigrationRecorder(connection).record_unapplied("django_leases", latest)

    report = health.run_checks()
    finding = by_check(report)["migrations"]
    assert finding.status == "problem"
    assert f"django_leases.{latest}" in finding.details["unapplied"]
    assert "of django_leases" in finding.message
    assert report.exit_code == health.EXIT_PROBLEMS == 3

    code, out = run_command()
    assert code == 3
    assert f"- django_leases.{latest}" in out


@pytest.mark.django_db
def test_unapplied_migrations_of_other_apps_count_too() -> None:
    MigrationRecorder(connection).record_unapplied("sessions", "0001_initial")
    finding = by_check(health.run_checks())["migrations"]
    assert finding.status == "problem"
    assert finding.details["unapplied"] == ["sessions.0001_initial"]
    assert "of django_leases" not in finding.message


@pytest.mark.django_db
def test_without_the_tables_the_workflow_checks_are_skipped() -> None:
    unapply_all("django_leases")
    checks = by_check(health.run_checks())
    assert checks["migrations"].status == "problem"
    # Nothing applied: the first release's squashed migration is what migrate would apply.
    assert "django_leases.0001_squashed_0043_first_release" in set(
        checks["migrations"].details["unapplied"]
    )
    assert {checks[n].status for n in ("workers", "lapsed_steps", "stuck_runs")} == {"skipped"}


# -- workers ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_pass_due_for_longer_than_the_threshold_means_no_worker() -> None:
    run = make_run(pass_due_at=db_now_plus(-120))
    report = health.run_checks(overdue_after=60)
    finding = by_check(report)["workers"]
    assert finding.status == "problem"
    assert finding.details["overdue_passes"] == 1
    assert finding.details["overdue_runs"] == [str(run.pk)]
    assert report.exit_code == 3
    # Due for less than the threshold: a worker may simply not have looked yet.
    assert by_check(health.run_checks(overdue_after=600))["workers"].status == "ok"


@pytest.mark.django_db
def test_a_waiting_step_due_for_too_long_is_overdue_but_an_exhausted_one_is_not() -> None:
    run = make_run(pass_due_at=None)
    make_step(run, "waiting", status="scheduled", available_at=db_now_plus(-120))
    finding = by_check(health.run_checks(overdue_after=60))["workers"]
    assert finding.status == "problem"
    assert finding.details["overdue_steps"] == 1

    WorkflowStep.objects.filter(run=run).update(status="failed", attempt=6, retries=5)
    assert by_check(health.run_checks(overdue_after=60))["workers"].status == "ok"


@pytest.mark.django_db
def test_live_leases_are_evidence_of_busy_workers() -> None:
    run = make_run(pass_due_at=None)
    make_step(run, status="running", lease_expires_at=db_now_plus(300))
    assert Lease.objects.acquire(f"workflow-run:{run.pk}", "w1", ttl=300) is not None
    finding = by_check(health.run_checks())["workers"]
    assert finding.status == "ok"
    assert finding.details["steps_running_under_live_lease"] == 1
    assert finding.details["live_run_leases"] == 1


@pytest.mark.django_db
def test_live_workers_are_counted_exactly_from_their_heartbeat_leases() -> None:
    from django_leases.models import WorkflowWorker

    for n in range(3):
        key = f"workflow-worker:host:{n}"
        WorkflowWorker.objects.register(
            key, host="host", pid=n, concurrency=2, queues=[], wakeup="polling"
        )
        lease = Lease.objects.acquire(key, f"host:{n}", ttl=300)
        assert lease is not None
        if n == 2:
            Lease.objects.release(lease)  # a worker that stopped
    finding = by_check(health.run_checks())["workers"]
    assert finding.details["live_workers"] == 2
    assert finding.details["workers"] == [
        "host:0 (2 thread(s), 0 in flight)",
        "host:1 (2 thread(s), 0 in flight)",
    ]
    assert finding.message.startswith("2 worker(s) alive")


@pytest.mark.django_db
def test_no_worker_running_is_said_exactly() -> None:
    finding = by_check(health.run_checks())["workers"]
    assert finding.status == "ok"
    assert finding.details["live_workers"] == 0
    assert finding.message == "no workflow worker is running; no work is overdue"


# -- lapsed steps -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_step_lapsed_long_ago_and_not_reclaimed_is_a_problem() -> None:
    run = make_run(pass_due_at=None)
    make_step(run, "lost", status="running", attempt=2, lease_expires_at=db_now_plus(-120))
    finding = by_check(health.run_checks(overdue_after=60))["lapsed_steps"]
    assert finding.status == "problem"
    assert finding.details["steps"] == [f"{run.pk}/lost (attempt 2)"]


@pytest.mark.django_db
def test_a_step_lapsed_recently_awaits_a_claim() -> None:
    run = make_run(pass_due_at=None)
    make_step(run, "lost", status="running", lease_expires_at=db_now_plus(-5))
    finding = by_check(health.run_checks(overdue_after=60))["lapsed_steps"]
    assert finding.status == "ok"
    assert finding.details["lapsed"] == 1
    assert "awaiting" in finding.message


# -- stuck runs -------------------------------------------------------------------------------


def age(run: WorkflowRun, seconds: float) -> None:
    WorkflowRun.objects.filter(pk=run.pk).update(updated_at=db_now_plus(-seconds))
    WorkflowStep.objects.filter(run=run).update(updated_at=db_now_plus(-seconds))


@pytest.mark.django_db
def test_a_running_run_with_nothing_due_or_running_is_stuck() -> None:
    run = make_run(pass_due_at=None)
    make_step(run, status="succeeded")
    age(run, 1000)
    report = health.run_checks(stuck_after=300)
    finding = by_check(report)["stuck_runs"]
    assert finding.status == "problem"
    assert finding.details["runs"] == [str(run.pk)]
    assert report.exit_code == 3

    # Recently changed: not stuck yet.
    assert by_check(health.run_checks(stuck_after=3000))["stuck_runs"].status == "ok"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "moving",
    ["pass due", "waiting step", "running step", "live run lease", "not running"],
)
def test_a_run_that_something_will_move_is_not_stuck(moving: str) -> None:
    run = make_run(pass_due_at=None)
    make_step(run, status="succeeded")
    if moving == "pass due":
        WorkflowRun.objects.filter(pk=run.pk).update(pass_due_at=db_now_plus(30))
    elif moving == "waiting step":
        make_step(run, "retry", status="failed", attempt=1, retries=5)
    elif moving == "running step":
        make_step(run, "busy", status="running", lease_expires_at=db_now_plus(300))
    elif moving == "live run lease":
        assert Lease.objects.acquire(f"workflow-run:{run.pk}", "w1", ttl=300) is not None
    else:
        WorkflowRun.objects.filter(pk=run.pk).update(status="suspended")
    age(run, 1000)
    assert by_check(health.run_checks(stuck_after=300))["stuck_runs"].status == "ok"


# -- arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad", [0, -1, float("nan"), float("inf"), Decimal("sNaN"), "60", True, None]
)
def test_bad_thresholds_are_refused(bad: Any) -> None:
    """The one seconds validator's rules, naming the threshold."""
    with pytest.raises(ValueError, match="overdue_after"):
        health.run_checks([], overdue_after=bad)
    with pytest.raises(ValueError, match="stuck_after"):
        health.run_checks([], stuck_after=bad)


@pytest.mark.parametrize("good", [Decimal("5"), timedelta(seconds=5), 5])
def test_thresholds_the_seconds_validator_takes_are_taken(good: Any) -> None:
    report = health.run_checks([], overdue_after=good, stuck_after=good)
    assert report.healthy


@pytest.mark.parametrize("bad", ["0", "-5", "soon", "nan", "inf"])
def test_the_command_refuses_bad_thresholds(bad: str) -> None:
    with pytest.raises(CommandError, match=r"--stuck-after: .*number of seconds"):
        call_command("leases_check", "--stuck-after", bad)


# -- the real command -------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_the_command_exit_status_as_a_process(subprocess_env: dict[str, str]) -> None:
    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return manage("leases_check", *args, env=subprocess_env, timeout=60)

    healthy = check()
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    typo = check("--database", "typo")
    assert typo.returncode == USAGE_ERROR, typo.stdout + typo.stderr
    assert "Unknown database alias 'typo' (configured: 'default')" in typo.stderr
    assert typo.stdout == ""
    helped = check("--help")
    epilog = helped.stdout.split("exit codes:\n", 1)[1]
    shown = [line.split()[0] for line in epilog.splitlines() if line[2:3].strip()]
    assert shown == [row.shown for row in EXIT_CODES["leases_check"].rows] == ["0", "3", "4", "2"]
    run = make_run(pass_due_at=None)
    age(run, 1000)
    stuck = check("--stuck-after", "300", "--format", "json")
    assert stuck.returncode == 3, stuck.stdout + stuck.stderr
    findings = {c["check"]: c for c in json.loads(stuck.stdout)["checks"]}
    assert findings["stuck_runs"]["details"]["runs"] == [str(run.pk)]


# -- the HTTP view ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_health_view_answers_anyone_with_liveness_statuses_only(client: Any) -> None:
    response = client.get("/health/")
    assert response.status_code == 200
    body = response.json()
    assert body["healthy"] is True and body["exit_code"] == 0 and body["scope"] == "liveness"
    assert body["checks"] == [{"check": "database", "alias": "default", "status": "ok"}]


@pytest.mark.django_db
def test_an_anonymous_probe_costs_one_query_however_many_runs_there_are(client: Any) -> None:
    """The full check reads the run, step and lease tables (0.58 s with 20,000 running
    runs): anyone may call the view, so anyone gets liveness, one ``SELECT 1``."""
    for _ in range(3):
        make_run(pass_due_at=db_now_plus(-3600))
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/health/")
    assert response.status_code == 200  # overdue work is the full check's, not liveness'
    assert [q["sql"] for q in queries.captured_queries] == ["SELECT 1"]


@pytest.mark.django_db
def test_the_health_view_gives_staff_the_full_check_with_details(
    client: Any, admin_user: Any
) -> None:
    make_run(pass_due_at=db_now_plus(-3600))  # a pass due an hour ago: no worker took it
    assert client.get("/health/").status_code == 200
    client.force_login(admin_user)
    response = client.get("/health/")
    assert response.status_code == 503
    body = response.json()
    assert body["healthy"] is False and body["scope"] == "full"
    assert {c["check"] for c in body["checks"]} >= {"database", "migrations", "workers"}
    workers = next(c for c in body["checks"] if c["check"] == "workers")
    assert workers["status"] == "problem" and workers["details"]["overdue_passes"] == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("flags", "scope"),
    [
        ({"is_staff": True}, "full"),
        ({"is_superuser": True}, "full"),
        ({}, "liveness"),
        ({"is_staff": True, "is_active": False}, "liveness"),
    ],
    ids=["staff", "superuser", "user", "inactive-staff"],
)
def test_who_gets_the_full_check(client: Any, flags: dict[str, bool], scope: str) -> None:
    from django.contrib.auth.models import User

    user = User.objects.create_user("probe", password="x", **flags)
    client.force_login(user)
    user.is_active = flags.get("is_active", True)  # force_login refuses an inactive user
    user.save()
    assert client.get("/health/").json()["scope"] == scope


_PROBE_WITH_A_COOKIE = """
import django
django.setup()
from django.test import Client
client = Client(raise_request_exception=False)
client.cookies["sessionid"] = "abcdefghijklmnopqrstuvwxyz012345"
response = client.get("/health/")
print(response.status_code, response.get("Content-Type"), response.json()["exit_code"])
"""


@pytest.mark.timeout(120)
def test_the_health_view_answers_503_json_when_the_database_is_down_and_a_cookie_is_sent() -> None:
    # A browser or an uptime checker keeping cookies sends a session cookie: looking the
    # user up reads the session from the database that is down.
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "DATABASE_URL": "postgres://postgres@127.0.0.1:1/dl_unreachable",  # nobody listens
    }
    child = subprocess.run(
        [sys.executable, "-c", _PROBE_WITH_A_COOKIE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.stdout.strip().splitlines()[-1:] == ["503 application/json 4"], child.stderr


@pytest.mark.django_db
def test_the_health_view_takes_only_get(client: Any) -> None:
    assert client.post("/health/").status_code == 405


# -- the workflow functions (PostgreSQL) ------------------------------------------------------


def _drop_a_workflow_function() -> str:
    """Drop this code's ``pick_pass`` function (not one kept for the previous release)."""
    from django_leases.models.workflow_base import functions

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.proname = %s",
            [functions(connection)["pick_pass"].name],
        )
        (function,) = cursor.fetchone()
        cursor.execute(f"DROP FUNCTION {function}")
    return str(function)


@pytest.mark.postgres_only
@pytest.mark.django_db
def test_leases_check_is_not_healthy_when_workers_refuse_to_start(
    client: Any, admin_user: Any
) -> None:
    from django_leases.exceptions import WorkflowFunctionsMissing
    from django_leases.health import functions_missing

    _drop_a_workflow_function()  # rolled back with the test's transaction
    report = health.run_checks()
    assert not report.healthy, report.as_dict()
    migrations = by_check(report)["migrations"]
    assert migrations.status == "problem"
    assert "dl_pick_pass_" in migrations.message and "--install-functions" in migrations.message
    refused = functions_missing(connection)  # what the worker refuses to start with
    assert isinstance(refused, WorkflowFunctionsMissing)
    assert str(refused) == migrations.message
    client.force_login(admin_user)  # the full check is staff's: anyone gets liveness
    assert client.get("/health/").status_code == 503


@pytest.mark.postgres_only
@pytest.mark.timeout(300)
def test_the_repair_leases_check_gives_for_dropped_functions_reinstalls_them(
    subprocess_env: dict[str, str],
) -> None:
    import re

    from django_leases.health import missing_functions

    _drop_a_workflow_function()
    message = by_check(health.run_checks())["migrations"].message
    commands = re.findall(r"'manage\.py (leases_check --install-functions[^']*)'", message)
    assert len(commands) == 1, message
    try:
        done = manage(*commands[0].split(), env=subprocess_env)
        assert "created dl_pick_pass_" in done.stdout, done.stdout + done.stderr
        assert missing_functions(connection) == []
        assert health.run_checks().healthy
        again = manage(*commands[0].split(), env=subprocess_env)  # nothing left to create
        assert "created" not in again.stdout, again.stdout
        unapplied = manage("migrate", "--check", env=subprocess_env)
        assert unapplied.returncode == 0, unapplied.stdout + unapplied.stderr
    finally:
        if missing_functions(connection):  # leave the test database as it was
            import importlib

            from django_leases.models.workflow import FUNCTIONS_MIGRATION

            migration = importlib.import_module(f"django_leases.migrations.{FUNCTIONS_MIGRATION}")
            with connection.cursor() as cursor:
                for statement in migration.FUNCTIONS.values():
                    cursor.execute(statement)
