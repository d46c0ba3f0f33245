"""A worker started inside a test's transaction fails at once with a clear message (its
threads could never see that transaction's rows), never a hang or a silent exit 0."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from django_leases.exceptions import MisuseError
from django_leases.workflows.engine import start_workflow
from django_leases.workflows.worker import Worker


@pytest.mark.django_db  # one transaction around the test, as TestCase
def test_the_worker_refuses_to_run_inside_a_transaction() -> None:
    start_workflow("tests.sub.two-steps", {})
    with pytest.raises(MisuseError, match=r"cannot run inside transaction\.atomic\(\)") as caught:
        Worker(1).run(once=True, handle_signals=False)
    assert isinstance(caught.value, RuntimeError)


@pytest.mark.django_db
def test_the_command_says_so_and_exits_non_zero() -> None:
    with pytest.raises(CommandError, match="TransactionTestCase"):
        call_command("run_workflow_worker", "--once", verbosity=0)
