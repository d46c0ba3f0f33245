"""Queue settings and queue keys: a value ``DJANGO_LEASES["QUEUES"]`` accepts (an integer from 1
to ``MAX_QUEUE_LIMIT`` for ``concurrency`` / ``key_concurrency``, ``"N/s"`` with N in that range
for a rate) is honoured alike by the tuned and the portable claim, and one past it is refused
when the setting is read — never a statement that fails and sends the process down the
portable path for good (docs/howto/queues.md, fairness.md); a bad task queue key is refused,
nothing stored (docs/howto/fairness.md, *Django tasks*)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from django_leases.conf import MAX_QUEUE_LIMIT, parse_queues
from django_leases.models import WorkflowRun, WorkflowStep
from django_leases.models.workflow_base import without_functions
from django_leases.workflows import start_workflow, workflow
from tests.helpers import limited_queues, tuned_sql

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 60.0
HUGE = MAX_QUEUE_LIMIT
QUEUES: dict[str, dict[str, Any]] = {
    "ql-conc": {"concurrency": HUGE},
    "ql-key": {"key_concurrency": HUGE},
    "ql-rate": {"rate": f"{HUGE}/s"},
}
FUNCTIONS = {"tests.ql.conc": "ql-conc", "tests.ql.key": "ql-key", "tests.ql.rate": "ql-rate"}


@workflow("tests.ql.idle")
def _idle(run: Any, input: Any) -> Any:
    return None


@pytest.fixture(autouse=True)
def _queues() -> Iterator[None]:
    with limited_queues(QUEUES, FUNCTIONS):
        yield


@pytest.mark.parametrize("sql_path", ["tuned", "portable"])
@pytest.mark.parametrize("function", sorted(FUNCTIONS))
def test_the_largest_limit_the_settings_accept_admits_a_step_on_both_paths(
    sql_path: str, function: str
) -> None:
    """Rule: the largest limit parse_queues accepts is a limit, not an error: a worker of
    the queue claims its one due step, the tuned path as the portable one, and the tuned
    path stays in use."""
    with tuned_sql(sql_path == "tuned"):
        run_id = start_workflow("tests.ql.idle", {}, queue_key="k")
        WorkflowStep.objects.schedule(run_id, "s", function, {}, queue=FUNCTIONS[function])
        claim = WorkflowStep.objects.claim_due(LEASE, queues=[FUNCTIONS[function]])
        assert claim is not None and claim.step_name == "s"
    assert connection.alias not in without_functions


@pytest.mark.parametrize(
    "limits",
    [
        {"concurrency": MAX_QUEUE_LIMIT + 1},
        {"key_concurrency": 2**63},
        {"rate": f"{MAX_QUEUE_LIMIT + 1}/s"},
        {"key_rate": f"{2**63}/m"},
    ],
)
def test_a_limit_past_the_largest_is_refused_with_the_setting(limits: dict[str, Any]) -> None:
    """Rule: a limit past ``MAX_QUEUE_LIMIT`` is refused where the setting is read (check
    E016 reports it), naming the queue."""
    with pytest.raises(ValueError, match="huge"):
        parse_queues({"huge": limits})


def test_an_int_task_queue_key_too_long_as_text_is_refused() -> None:
    """Rule: a task's queue key is a str of 1–255 characters or an int (as text); anything
    else — here an int of 5000 digits — is refused (InvalidTask, or TaskArgumentsError as
    arguments that are not storable JSON), nothing stored."""
    pytest.importorskip("django_leases.tasks_api")
    from django_leases.exceptions import TaskArgumentsError
    from django_leases.tasks_api import InvalidTask
    from tests.workapp import tasks as t

    keyed = {
        "BACKEND": "django_leases.tasks.TaskBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"queue_key_kwarg": "tenant"},
    }
    with override_settings(TASKS={"default": keyed}):
        before = WorkflowRun.objects.count()
        with pytest.raises((InvalidTask, TaskArgumentsError), match="tenant"):
            t.echo.enqueue(tenant=10**5000)
        assert WorkflowRun.objects.count() == before
