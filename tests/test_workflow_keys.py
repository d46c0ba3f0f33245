"""Idempotent starts (DESIGN §5a): ``start_workflow(name, input, key=...)`` returns the run
already started with that key for that workflow and creates nothing — decided by a unique
constraint, so concurrent starts with one key make one run. Both paths of the rule (the
tuned statement and the portable ORM one) are run on PostgreSQL."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection, transaction

from django_leases.models import WorkflowRun
from django_leases.models.passes import RunPasses
from django_leases.workflows import start_workflow
from tests.helpers import race_in_processes, tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_same_key_returns_the_existing_run_and_creates_nothing(sql_path: str) -> None:
    first = start_workflow("tests.sub.two-steps", {"n": 1}, key="order-17")
    rows = list(WorkflowRun.objects.values())
    again = start_workflow("tests.sub.two-steps", {"n": 2}, key="order-17")
    assert again == first
    assert list(WorkflowRun.objects.values()) == rows, "nothing written, not even a pass"
    assert WorkflowRun.objects.get(pk=first).input == {"n": 1}
    run = WorkflowRun.objects.start("tests.sub.two-steps", {}, key="order-17")
    assert (run.id, run.started) == (first, False)


def test_keys_are_per_workflow_and_runs_without_a_key_never_collide(sql_path: str) -> None:
    a = start_workflow("tests.sub.two-steps", {}, key="k")
    b = WorkflowRun.objects.start("tests.sub.other", {}, key="k").id
    assert a != b
    c = start_workflow("tests.sub.two-steps", {})
    d = start_workflow("tests.sub.two-steps", {})
    assert len({a, b, c, d}) == 4
    assert WorkflowRun.objects.id_for_key("tests.sub.two-steps", "k") == a
    assert WorkflowRun.objects.id_for_key("tests.sub.two-steps", "nope") is None


@pytest.mark.parametrize("bad", ["", "x" * 256, 17, "nul\x00"])
def test_a_bad_key_is_refused_with_nothing_written(bad: Any, sql_path: str) -> None:
    with pytest.raises(ValueError, match="Run key"):
        start_workflow("tests.sub.two-steps", {}, key=bad)
    assert not WorkflowRun.objects.exists()


def test_a_keyed_start_inside_the_callers_transaction_keeps_that_transaction_usable(
    sql_path: str,
) -> None:
    first = start_workflow("tests.sub.two-steps", {}, key="in-tx")
    with transaction.atomic():
        again = start_workflow("tests.sub.two-steps", {}, key="in-tx")
        fresh = start_workflow("tests.sub.two-steps", {}, key="other")
    assert again == first
    assert WorkflowRun.objects.filter(pk=fresh).exists()


def test_concurrent_starts_with_one_key_make_one_run(sql_path: str) -> None:
    def start() -> str:
        return str(start_workflow("tests.sub.two-steps", {}, key="raced"))

    outcomes = race_in_processes(*([start] * 8))
    errors = [error for _, error in outcomes if error]
    assert not errors, "\n\n".join(errors)  # a str: printed whole
    assert len({value for value, _ in outcomes}) == 1
    assert WorkflowRun.objects.filter(key="raced").count() == 1


def test_a_keyed_start_rolled_back_by_a_deadlock_starts_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """MariaDB / MySQL: starts racing on one key can deadlock (the race above met it under
    load), and InnoDB then rolls the whole transaction back. A start that owns its
    transaction runs it again rather than failing; inside the caller's transaction, or on
    another database (where the error is no deadlock rollback), the error is raised."""
    real = RunPasses._create_tagged
    deadlocks = [OperationalError(1213, "Deadlock found when trying to get lock")]

    def deadlocking(self: RunPasses, alias: str, **columns: Any) -> Any:
        if deadlocks:
            raise deadlocks.pop()
        return real(self, alias, **columns)

    monkeypatch.setattr(RunPasses, "_create_tagged", deadlocking)
    with tuned_sql(False):
        if connection.vendor == "mysql":
            run = WorkflowRun.objects.start("tests.sub.two-steps", {}, key="deadlocked")
            assert run.started and not deadlocks
            deadlocks.append(OperationalError(1213, "Deadlock found when trying to get lock"))
            with pytest.raises(OperationalError), transaction.atomic():
                WorkflowRun.objects.start("tests.sub.two-steps", {}, key="inside")
        else:
            with pytest.raises(OperationalError):
                WorkflowRun.objects.start("tests.sub.two-steps", {}, key="deadlocked")
    assert list(WorkflowRun.objects.values_list("key", flat=True)) == (
        ["deadlocked"] if connection.vendor == "mysql" else []
    )


def test_the_command_takes_a_key() -> None:
    out = StringIO()
    call_command("start_workflow", "tests.sub.two-steps", "--key", "cli", stdout=out)
    call_command("start_workflow", "tests.sub.two-steps", "--key", "cli", stdout=out)
    first, second = out.getvalue().split()
    assert first == second and WorkflowRun.objects.count() == 1
