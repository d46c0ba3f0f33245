"""Shipping changed workflow code as docs/howto/deploys.md says: the deploy gate
(``workflow_runs check-replay``) also checks the failed runs an operator may resume, and the
page's own recipe for inserting a step works as written."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from django_leases.models import RunStatus
from django_leases.testing import drive
from django_leases.workflows import send_event, start_workflow, step_function, workflow
from django_leases.workflows.replay_check import check_replay

pytestmark = pytest.mark.django_db

ECHO = "tests.deploy-edges.echo"
FLAKY = "tests.deploy-edges.flaky"

#: The code "deployed" now; a test switches it to ship a change.
deployed: dict[str, Any] = {}
#: Step names whose step function ran, in order.
ran: list[str] = []


@step_function(ECHO)
def echo(data: Any, ctx: Any) -> Any:
    ran.append(ctx.step_name)
    return data


@step_function(FLAKY)
def flaky(data: Any, ctx: Any) -> Any:
    ran.append(ctx.step_name)
    if deployed.get("broken", True):
        raise RuntimeError("the payment provider is down")
    return data


@pytest.fixture(autouse=True)
def v1_deployed() -> Iterator[None]:
    deployed.clear()
    ran.clear()
    yield
    deployed.clear()


# -- a failed run is resumable: the deploy gate checks it ---------------------------------------


@workflow("tests.deploy-edges.charge")
def charge(run: Any, input: Any) -> Any:
    run.step("load", ECHO, "load")
    if deployed.get("code") == "inserted":
        run.step("charge-card", ECHO, "charge-card")  # inserted without a patch
    run.step("reserve", ECHO, "reserve")
    return run.step("ship", FLAKY, "ship", retries=0)


def test_a_failed_run_resumed_on_changed_code_is_checked_before_it_replays() -> None:
    """A run failed at its last step (load, reserve recorded). A deploy inserts a step before
    ``reserve`` without ``run.patched``: the gate reports the failed run, which a resume
    would replay on the new code (and run the inserted step in a run that had gone past it
    long ago: a second charge). (Before, the gate read running and suspended runs only.)"""
    run_id = start_workflow("tests.deploy-edges.charge", {})
    run = drive(run_id)
    assert run is not None and run.status == RunStatus.FAILED
    deployed.update(code="inserted", broken=False)
    report = check_replay()
    assert not report.ok, report.summary()
    (diverged,) = report.divergences
    assert diverged.run_id == run_id and diverged.new.name == "charge-card", diverged


# -- the documented "Insert a step" recipe ------------------------------------------------------


@workflow("tests.deploy-edges.refund")
def refund(run: Any, input: Any) -> Any:
    # docs/howto/deploys.md, "Insert a step", verbatim but for the step functions.
    order = run.step("load", ECHO, input)
    if deployed.get("code") == "patched" and run.patched("add-fraud-check"):
        run.step("fraud-check", ECHO, order)
    run.wait_for_event("approval")
    return run.step("pay-back", ECHO, order)


def test_the_documented_insert_recipe_does_not_fail_new_runs() -> None:
    """deploys.md's example, as written (a patch and the step it guards have two names: the
    engine refuses a step named like a patch), takes the old path in an old run and the new
    one in a run started after the deploy. (The page's example once gave both one name, and
    every new run failed at the fraud check.)"""
    old = start_workflow("tests.deploy-edges.refund", {"order": 1})
    drive(old)
    deployed["code"] = "patched"
    new = start_workflow("tests.deploy-edges.refund", {"order": 2})
    run = drive(new)
    assert run is not None
    assert run.status == RunStatus.RUNNING, run.error  # waiting for its approval
    send_event(new, "approval", True)
    run = drive(new)
    assert run is not None and run.status == RunStatus.COMPLETED
