"""Naive times (``USE_TZ = False``, a ``TIME_ZONE`` with daylight saving) keep their meaning
across the changes, when the wall clock skips an hour (spring) or reads one twice (autumn):
the library keeps its own times in UTC there. MariaDB's clock is moved into those hours with
``SET timestamp`` (which freezes ``UTC_TIMESTAMP()``, the clock the library reads); the other
backends' clocks cannot be moved (PostgreSQL's columns hold instants; SQLite's clock is UTC).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import override_settings

from django_leases.clock import DbNow, to_aware, to_stored
from django_leases.models import Lease, WorkflowRun, WorkflowSchedule
from django_leases.workflows import registry

NAIVE_WORKFLOW = "tests.naive_dst.noop"
# 2025-10-26: Paris goes from CEST (+02) back to CET (+01) at 01:00 UTC; the wall clock
# reads 02:00–02:59 twice (00:00–00:59 UTC, then 01:00–01:59 UTC).
FIRST_PASS = datetime(2025, 10, 26, 0, 0, tzinfo=UTC)  # 02:00 CEST
SECOND_PASS = datetime(2025, 10, 26, 1, 0, tzinfo=UTC)  # 02:00 CET


@pytest.fixture
def paris_mariadb() -> Iterator[None]:
    """USE_TZ off, TIME_ZONE Europe/Paris, on MariaDB; the database clock frozen at
    00:00:01 UTC on the autumn night (02:00:01 CEST, first pass of the repeated hour)."""
    if connection.vendor != "mysql":
        pytest.skip("only MariaDB's clock can be moved (SET timestamp)")
    registry._workflows[NAIVE_WORKFLOW] = lambda run, input: input
    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Paris"):
        connection.close()
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SET timestamp = %s", [FIRST_PASS.timestamp() + 1])
        try:
            yield
        finally:
            connection.close()
            registry._workflows.pop(NAIVE_WORKFLOW, None)
    connection.close()


@pytest.mark.django_db(transaction=True)
def test_hourly_tick_of_the_second_pass_is_not_due_during_the_first(paris_mariadb: None) -> None:
    """Rule: a schedule fires each tick once, when it is due on the database clock: the
    01:00 UTC tick (02:00 CET, second pass) is not due at 00:00:01 UTC, and the 00:00 UTC
    tick is fired once, not again."""
    WorkflowSchedule.objects.create(
        name="naive-dst",
        workflow=NAIVE_WORKFLOW,
        cron="0 * * * *",
        timezone="UTC",
        overlap="allow",
        next_tick=to_stored(FIRST_PASS, connection.alias),
    )
    fired = WorkflowSchedule.objects.fire_due()
    assert [(f.action, f.tick) for f in fired] == [("started", FIRST_PASS)], fired
    row = WorkflowSchedule.objects.get(name="naive-dst")
    assert to_aware(row.next_tick, connection.alias) == SECOND_PASS  # type: ignore[arg-type]


def set_db_clock(moment: datetime) -> None:
    """Freeze this MariaDB session's clock at ``moment`` (aware)."""
    with connection.cursor() as cursor:
        cursor.execute("SET timestamp = %s", [moment.timestamp()])


# 2026-03-29: Paris goes from CET (+01) to CEST (+02) at 01:00 UTC; 02:00–02:59 never happens.
SPRING_CHANGE = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)


@pytest.mark.django_db(transaction=True)
def test_delayed_start_is_not_due_before_its_delay_in_spring(paris_mariadb: None) -> None:
    """Rule: a run started with ``run_after=3600`` stays pending (not due) for an hour of the
    database clock, also across the spring change."""
    set_db_clock(SPRING_CHANGE - timedelta(seconds=1))  # 01:59:59 CET
    run = WorkflowRun.objects.start(NAIVE_WORKFLOW, {}, run_after=3600)
    set_db_clock(SPRING_CHANGE + timedelta(seconds=1))  # two seconds later: 03:00:01 CEST
    due = WorkflowRun.objects.filter(pk=run.pk, pass_due_at__lte=DbNow())
    assert not due.exists(), "a run delayed by an hour is due two seconds later"


@pytest.mark.django_db(transaction=True)
def test_deadline_does_not_fail_the_run_before_its_time_in_spring(paris_mariadb: None) -> None:
    """Rule: a run with ``deadline=3600`` is not failed before an hour of the database clock
    has passed, also across the spring change."""
    set_db_clock(SPRING_CHANGE - timedelta(seconds=1))
    run = WorkflowRun.objects.start(NAIVE_WORKFLOW, {}, deadline=3600)
    set_db_clock(SPRING_CHANGE + timedelta(seconds=1))
    assert WorkflowRun.objects.expire_deadlines() == []
    assert WorkflowRun.objects.get(pk=run.pk).status == "running"


@pytest.mark.django_db(transaction=True)
def test_deadline_fails_the_run_once_its_time_has_passed_in_autumn(paris_mariadb: None) -> None:
    """Rule: a run with ``deadline=3600`` still running is failed once an hour of the
    database clock has passed (not two), also across the autumn change."""
    run = WorkflowRun.objects.start(NAIVE_WORKFLOW, {}, deadline=3600)  # at 02:00:01 CEST
    set_db_clock(FIRST_PASS + timedelta(seconds=3602))  # 02:00:03 CET, an hour later
    assert WorkflowRun.objects.expire_deadlines() == [run.pk]


@pytest.mark.django_db(transaction=True)
def test_a_lease_taken_before_the_spring_change_does_not_lapse_early(paris_mariadb: None) -> None:
    """Rule: a lease taken 5 s before the spring change with a 30 s TTL is still held 6 s
    later (when the wall clock has jumped an hour ahead): nobody else takes it."""
    set_db_clock(SPRING_CHANGE - timedelta(seconds=5))
    assert Lease.objects.acquire("dst-spring", "first", 30) is not None
    set_db_clock(SPRING_CHANGE + timedelta(seconds=1))
    assert Lease.objects.acquire("dst-spring", "second", 30) is None
    current = Lease.objects.current("dst-spring")
    assert current is not None and current.holder == "first"


@pytest.mark.django_db(transaction=True)
def test_a_lease_taken_before_the_autumn_change_lapses_on_time(paris_mariadb: None) -> None:
    """Rule: a lease taken 5 s before the autumn change with a 30 s TTL has lapsed 31 s
    later (when the wall clock has gone an hour back), not an hour after."""
    change = SECOND_PASS  # 03:00 CEST becomes 02:00 CET
    set_db_clock(change - timedelta(seconds=5))
    assert Lease.objects.acquire("dst-autumn", "first", 30) is not None
    set_db_clock(change + timedelta(seconds=26))
    taken = Lease.objects.acquire("dst-autumn", "second", 30)
    assert taken is not None and taken.holder == "second"
