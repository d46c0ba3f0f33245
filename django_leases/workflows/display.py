"""What operators are shown of runs, waits and queues: the admin's pages, ``workflow_runs
show`` and ``workflow_queues`` call these, so that every view says the same thing.

Reads only: the rules these describe live with the models (:mod:`django_leases.models`).
Times are shown in the current time zone (the site's), with its name, so "sleeping until
14:00:00" is never read in the wrong zone.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Q
from django.utils import timezone
from django.utils.translation import gettext

from django_leases.conf import QueueLimits, queue_limits
from django_leases.frozen import frozen
from django_leases.models import StepStatus, WorkflowRun, WorkflowStep, WorkflowWait
from django_leases.models.claims import KeyCounts
from django_leases.workflows.values import RunStatus, WaitKind, WaitStatus, attempts_left_q


def _alias(instance: Any) -> str:
    return instance._state.db or "default"


def waiting_on(run: WorkflowRun) -> list[str]:
    """What a running ``run`` waits for now: each ``waiting`` wait as :func:`describe_wait`
    says it, and its unfinished steps ("waiting for step 'x'", or "waiting for N parallel
    steps"). Empty for a run that is not running."""
    if run.status != RunStatus.RUNNING:
        return []
    alias = _alias(run)
    found = [
        describe_wait(wait)
        for wait in WorkflowWait.objects.db_manager(alias).filter(
            run_id=run.pk, status=WaitStatus.WAITING
        )
    ]
    steps = (
        WorkflowStep.objects.db_manager(alias)
        .filter(run_id=run.pk)
        .filter(
            Q(status__in=(StepStatus.PENDING, StepStatus.SCHEDULED, StepStatus.RUNNING))
            | (Q(status=StepStatus.FAILED) & attempts_left_q())
        )
    )
    names = list(steps.order_by("id").values_list("step_name", flat=True)[:2])
    if len(names) == 1:
        found.append(gettext("waiting for step %(name)r") % {"name": names[0]})
    elif names:
        found.append(gettext("waiting for %(count)d parallel steps") % {"count": steps.count()})
    return found


def run_overview(run: WorkflowRun) -> dict[str, Any]:
    """``run``, its steps and its waits as one JSON-ready ``dict`` (timestamps and ids left
    as ``datetime`` / ``UUID``): what ``workflow_runs show`` prints."""
    alias = _alias(run)
    steps = WorkflowStep.objects.db_manager(alias).filter(run_id=run.pk).order_by("id")
    waits = WorkflowWait.objects.db_manager(alias).filter(run_id=run.pk).order_by("id")
    return {
        "id": run.pk,
        "workflow": run.workflow,
        "status": run.status,
        "key": run.key,
        "tags": run.tags or {},
        "parent": run.parent_id,
        "forked_from": run.forked_from_id,
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "pass_due_at": run.pass_due_at,
        "input": run.input,
        "output": run.output,
        "error": run.error,
        "waiting_on": waiting_on(run),
        "steps": [
            {
                "name": step.step_name,
                "function": step.function_name,
                "status": step.status,
                "attempt": step.attempt,
                "max_attempts": step.max_attempts,
                "available_at": step.available_at,
                "result": step.result,
                "error": step.error,
                "progress": step.progress,
            }
            for step in steps
        ],
        "waits": [
            {
                "name": wait.name,
                "kind": wait.kind,
                "status": wait.status,
                "what": describe_wait(wait),
                "child": wait.child_id,
                "reached_at": wait.reached_at,
                "due_at": wait.due_at,
                "done_at": wait.done_at,
                "payload": wait.payload,
            }
            for wait in waits
        ],
        "children": list(
            WorkflowRun.objects.db_manager(alias)
            .filter(parent_id=run.pk)
            .order_by("created_at", "id")
            .values("id", "workflow", "status")
        ),
    }


def describe_wait(wait: WorkflowWait) -> str:
    """What the run waits for: "sleeping until …", "waiting for event …", "waiting for
    child …", or how it ended."""
    if wait.kind == WaitKind.SLEEP:
        if wait.status == WaitStatus.DONE:
            return gettext("slept until %(time)s") % {"time": _shown(wait.due_at)}
        return gettext("sleeping until %(time)s") % {"time": _shown(wait.due_at)}
    if wait.kind == WaitKind.EVENT:
        if wait.status == WaitStatus.DONE:
            return gettext("event %(name)r received") % {"name": wait.name}
        if wait.status == WaitStatus.TIMED_OUT:
            return gettext("event %(name)r timed out") % {"name": wait.name}
        if wait.due_at is None:
            return gettext("waiting for event %(name)r") % {"name": wait.name}
        return gettext("waiting for event %(name)r until %(time)s") % {
            "name": wait.name,
            "time": _shown(wait.due_at),
        }
    if wait.status == WaitStatus.DONE:
        return gettext("child %(run)s finished") % {"run": wait.child_id}
    return gettext("waiting for child %(run)s") % {"run": wait.child_id}


def event_sent(wait: WorkflowWait) -> str:
    """What became of the event just sent to ``wait`` (the command's and the admin's
    answer, one sentence): delivered, or — for a wait the run has not reached yet, early or
    a mistyped name no wait will ever consume — kept, with what the run waits for now."""
    names = {"name": wait.name, "run": wait.run_id}
    if wait.reached_at is not None:
        return gettext("Event %(name)r sent to run %(run)s.") % names
    run = WorkflowRun._default_manager.using(_alias(wait)).filter(pk=wait.run_id).first()
    now = "" if run is None else "; ".join(waiting_on(run))
    if not now:
        return (
            gettext("Event %(name)r sent to run %(run)s: kept until the run reaches wait %(name)r.")
            % names
        )
    return gettext(
        "Event %(name)r sent to run %(run)s: kept until the run reaches wait %(name)r "
        "(it is now %(now)s)."
    ) % {**names, "now": now}


def _shown(when: datetime | None) -> str:
    """A wait's time: in the current time zone, with its name."""
    if when is None:
        return "?"
    if timezone.is_aware(when):
        return f"{timezone.localtime(when):%Y-%m-%d %H:%M:%S %Z}"
    return f"{when:%Y-%m-%d %H:%M:%S}"


#: How many of a keyed queue's busiest keys operators are shown.
BUSIEST_KEYS = 10


@frozen
class QueueOverview:
    """One queue as an operator sees it (:func:`queue_overview`).

    Attributes:
        name: the queue.
        configured: whether ``DJANGO_LEASES["QUEUES"]`` names it (``"default"`` always is).
        waiting: due steps of running runs not yet claimed.
        running: steps running with a live lease (what the concurrency limit counts).
        concurrency: the limit (``int``), or ``None``.
        rate: the rate as configured (``"10/s"``), or ``None``.
        oldest_waiting: seconds (``float``) the longest-waiting due step has been due, on the
            database clock; ``None`` when none waits.
        key_concurrency: the per-key limit (``int``), or ``None``.
        key_rate: the per-key rate as configured, or ``None``.
        keys: in a keyed queue, its busiest keys (most running, then most waiting; at most
            :data:`BUSIEST_KEYS`), each with its running and waiting steps.
    """

    name: str
    configured: bool
    waiting: int
    running: int
    concurrency: int | None
    rate: str | None
    oldest_waiting: float | None
    key_concurrency: int | None = None
    key_rate: str | None = None
    keys: tuple[KeyCounts, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """The row as a JSON object (``manage.py workflow_queues --format json``)."""
        return {
            "name": self.name,
            "configured": self.configured,
            "waiting": self.waiting,
            "running": self.running,
            "concurrency": self.concurrency,
            "rate": self.rate,
            "oldest_waiting_seconds": self.oldest_waiting,
            "key_concurrency": self.key_concurrency,
            "key_rate": self.key_rate,
            "keys": [
                {"key": key.key, "running": key.running, "waiting": key.waiting}
                for key in self.keys
            ],
        }


def queue_overview(using: str | None = None) -> list[QueueOverview]:
    """Every queue — the configured ones, ``"default"``, and any a step of a running run
    names — with its waiting and running steps (:meth:`WorkflowStepQuerySet.queue_counts
    <django_leases.models.workflow.WorkflowStepQuerySet.queue_counts>`), limits and the age
    of its oldest waiting step, by name; a keyed queue also with its busiest keys
    (:meth:`WorkflowStepQuerySet.key_counts
    <django_leases.models.workflow.WorkflowStepQuerySet.key_counts>`). ``using``: database
    alias (default: the router's).

    Raises:
        QueueConfigError: ``DJANGO_LEASES["QUEUES"]`` is not usable.
    """
    limits = queue_limits()
    steps = WorkflowStep.objects if using is None else WorkflowStep.objects.db_manager(using)
    counts = steps.all().queue_counts()
    found = []
    for name in sorted(set(limits) | set(counts)):
        queue = limits.get(name, QueueLimits(name))
        count = counts.get(name)
        found.append(
            QueueOverview(
                name=name,
                configured=name in limits,
                waiting=0 if count is None else count.waiting,
                running=0 if count is None else count.running,
                concurrency=queue.concurrency,
                rate=queue.rate,
                oldest_waiting=None if count is None else count.oldest_waiting,
                key_concurrency=queue.key_concurrency,
                key_rate=queue.key_rate,
                keys=(
                    tuple(steps.all().key_counts(name, limit=BUSIEST_KEYS))
                    if queue.keyed and count is not None
                    else ()
                ),
            )
        )
    return found


__all__ = [
    "BUSIEST_KEYS",
    "QueueOverview",
    "describe_wait",
    "event_sent",
    "queue_overview",
    "run_overview",
    "waiting_on",
]
