"""The admin's permission matrix: every URL that changes state from the admin — the run page's
operate URLs, the trigger-source switch and orphan buttons, and every list action — asked by
staff with neither, only the view, only the operate, or both permissions.

As Django's admin does for actions, an operation needs the model's **view** permission *and*
the operate permission: with either one alone (or neither) the answer is 403 (or, for a list
action, the changelist's 403 / "no action"), nothing changes, nothing is logged and no
provider is called. With both, the operation lands and is logged.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.test import Client
from django.urls import reverse

from django_leases.models import Lease, TriggerSource, WorkflowRun, WorkflowSchedule
from django_leases.testing.providers import FakeProvider
from django_leases.triggers import lifecycle
from tests.helpers import failed_run, fake_sources, make_orphan, staff_client

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "https://app.example.com"


@dataclass(frozen=True)
class World:
    """What every case starts from: a failed and a running run, a live lease, an enabled
    and a disabled declared source and an orphan registered at the fake provider."""

    failed: WorkflowRun
    running: WorkflowRun
    lease: Lease
    provider: FakeProvider
    active: WorkflowSchedule
    paused: WorkflowSchedule

    def source_pk(self, name: str) -> int:
        return int(TriggerSource.objects.get(name=name).pk)


@pytest.fixture
def world() -> Iterator[World]:
    with fake_sources("perm-on", "perm-off", "perm-gone") as provider:
        lifecycle.reconcile(base_url=BASE)
        lifecycle.enable("perm-on")
        make_orphan("perm-gone")
        LogEntry.objects.all().delete()
        provider.calls.clear()
        failed = failed_run("build-preview", "build", "previews.build", "compiler crashed")
        running = WorkflowRun.objects.start("build-preview", {})
        lease = Lease.objects.acquire(f"perm-{uuid.uuid4().hex[:8]}", "holder-a", 60)
        assert lease is not None
        active, paused = (
            WorkflowSchedule.objects.create(
                name=f"perm-{state}", workflow="build-preview", cron="0 3 * * *", paused=paused
            )
            for state, paused in (("active", False), ("paused", True))
        )
        yield World(failed, running, lease, provider, active, paused)


@dataclass(frozen=True)
class Operation:
    """One state-changing admin URL: how to post it, which permissions it needs, and how to
    tell whether it landed."""

    name: str
    view: str
    operate: str
    post: Callable[[Client, World], Any]
    landed: Callable[[World], bool]


def _operate(model: str, pk: Any, operation: str) -> str:
    return reverse(f"admin:django_leases_{model}_operate", args=[pk, operation])


def _action(model: str, action: str, pk: Any) -> Callable[[Client, World], Any]:
    return lambda client, world: client.post(
        reverse(f"admin:django_leases_{model}_changelist"),
        {"action": action, "_selected_action": [str(pk(world))]},
    )


def _status(run: Callable[[World], WorkflowRun]) -> Callable[[World], str]:
    return lambda world: WorkflowRun.objects.get(pk=run(world).pk).status


def _enabled(name: str) -> bool:
    return bool(TriggerSource.objects.get(name=name).enabled)


def _gone(name: str) -> bool:
    return not TriggerSource.objects.filter(name=name).exists()


def _paused(schedule: Callable[[World], WorkflowSchedule]) -> Callable[[World], bool]:
    return lambda world: bool(WorkflowSchedule.objects.get(pk=schedule(world).pk).paused)


def _released(world: World) -> bool:
    return Lease.objects.current(world.lease.key) is None


RUN_VIEW, RUN_OPERATE = "view_workflowrun", "operate_workflowrun"
SOURCE_VIEW, ORPHAN_VIEW, TOGGLE = (
    "view_triggersource",
    "view_orphantriggersource",
    "toggle_triggersource",
)

OPERATIONS = [
    # The run page's operate URLs and the run list's actions.
    Operation(
        "run resume",
        RUN_VIEW,
        RUN_OPERATE,
        lambda c, w: c.post(_operate("workflowrun", w.failed.pk, "resume")),
        lambda w: _status(lambda w: w.failed)(w) == "running",
    ),
    Operation(
        "run cancel",
        RUN_VIEW,
        RUN_OPERATE,
        lambda c, w: c.post(_operate("workflowrun", w.running.pk, "cancel")),
        lambda w: _status(lambda w: w.running)(w) == "cancelled",
    ),
    Operation(
        "run retry-step",
        RUN_VIEW,
        RUN_OPERATE,
        lambda c, w: c.post(_operate("workflowrun", w.failed.pk, "retry-step"), {"step": "build"}),
        lambda w: _status(lambda w: w.failed)(w) == "running",
    ),
    Operation(
        "action resume_runs",
        RUN_VIEW,
        RUN_OPERATE,
        _action("workflowrun", "resume_runs", lambda w: w.failed.pk),
        lambda w: _status(lambda w: w.failed)(w) == "running",
    ),
    Operation(
        "action cancel_runs",
        RUN_VIEW,
        RUN_OPERATE,
        _action("workflowrun", "cancel_runs", lambda w: w.running.pk),
        lambda w: _status(lambda w: w.running)(w) == "cancelled",
    ),
    # The trigger sources' switch, the orphans' buttons, and their actions.
    Operation(
        "source enable",
        SOURCE_VIEW,
        TOGGLE,
        lambda c, w: c.post(_operate("triggersource", w.source_pk("perm-off"), "enable")),
        lambda w: _enabled("perm-off"),
    ),
    Operation(
        "source disable",
        SOURCE_VIEW,
        TOGGLE,
        lambda c, w: c.post(_operate("triggersource", w.source_pk("perm-on"), "disable")),
        lambda w: not _enabled("perm-on"),
    ),
    Operation(
        "action enable_sources",
        SOURCE_VIEW,
        TOGGLE,
        _action("triggersource", "enable_sources", lambda w: w.source_pk("perm-off")),
        lambda w: _enabled("perm-off"),
    ),
    Operation(
        "action disable_sources",
        SOURCE_VIEW,
        TOGGLE,
        _action("triggersource", "disable_sources", lambda w: w.source_pk("perm-on")),
        lambda w: not _enabled("perm-on"),
    ),
    Operation(
        "orphan forget",
        ORPHAN_VIEW,
        TOGGLE,
        lambda c, w: c.post(_operate("orphantriggersource", w.source_pk("perm-gone"), "forget")),
        lambda w: _gone("perm-gone"),
    ),
    Operation(
        "orphan teardown",
        ORPHAN_VIEW,
        TOGGLE,
        lambda c, w: c.post(_operate("orphantriggersource", w.source_pk("perm-gone"), "teardown")),
        lambda w: _gone("perm-gone"),
    ),
    Operation(
        "action forget_sources",
        ORPHAN_VIEW,
        TOGGLE,
        _action("orphantriggersource", "forget_sources", lambda w: w.source_pk("perm-gone")),
        lambda w: _gone("perm-gone"),
    ),
    Operation(
        "action teardown_sources",
        ORPHAN_VIEW,
        TOGGLE,
        _action("orphantriggersource", "teardown_sources", lambda w: w.source_pk("perm-gone")),
        lambda w: _gone("perm-gone"),
    ),
    # The schedules list's actions.
    Operation(
        "action pause",
        "view_workflowschedule",
        "pause_workflowschedule",
        _action("workflowschedule", "pause", lambda w: w.active.pk),
        _paused(lambda w: w.active),
    ),
    Operation(
        "action resume",
        "view_workflowschedule",
        "pause_workflowschedule",
        _action("workflowschedule", "resume", lambda w: w.paused.pk),
        lambda w: not _paused(lambda w: w.paused)(w),
    ),
    # The leases list's one write.
    Operation(
        "action force_release",
        "view_lease",
        "force_release_lease",
        _action("lease", "force_release", lambda w: w.lease.pk),
        _released,
    ),
]

GRANTS = {
    "neither": lambda op: (),
    "view only": lambda op: (op.view,),
    "operate only": lambda op: (op.operate,),
    "both": lambda op: (op.view, op.operate),
}


@pytest.mark.parametrize("grant", list(GRANTS))
@pytest.mark.parametrize("operation", OPERATIONS, ids=[op.name for op in OPERATIONS])
def test_an_operation_needs_both_the_view_and_the_operate_permission(
    world: World, operation: Operation, grant: str
) -> None:
    client = staff_client(*GRANTS[grant](operation))
    response = operation.post(client, world)
    if grant == "both":
        assert response.status_code == 302, response
        assert operation.landed(world), f"{operation.name} did not land with both permissions"
        assert LogEntry.objects.count() == 1
        return
    # An operate URL answers 403; a list action posted without the view permission gets the
    # changelist's 403, and with the view permission alone the action is not offered (the
    # changelist answers again, listing nothing done).
    is_action = operation.name.startswith("action ")
    expected = 200 if is_action and grant == "view only" else 403
    assert response.status_code == expected, f"{operation.name} with {grant}: {response}"
    assert not operation.landed(world), f"{operation.name} landed with {grant}"
    assert not LogEntry.objects.exists()
    assert world.provider.calls == []


def test_an_unknown_object_is_not_revealed_without_the_view_permission(world: World) -> None:
    """Without the view permission an operate URL answers 403 whether or not the id exists
    (no "No such …" message that would tell the two apart)."""
    client = staff_client(RUN_OPERATE, TOGGLE)
    for url in (
        _operate("workflowrun", uuid.uuid4(), "resume"),
        _operate("workflowrun", world.failed.pk, "resume"),
        _operate("triggersource", 987654, "enable"),
        _operate("triggersource", world.source_pk("perm-off"), "enable"),
        _operate("orphantriggersource", 987654, "forget"),
        _operate("orphantriggersource", world.source_pk("perm-gone"), "forget"),
    ):
        assert client.post(url).status_code == 403, url
