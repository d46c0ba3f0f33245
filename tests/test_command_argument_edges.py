"""Command arguments a shell can type, or code can pass through ``call_command``, that used
to end in a traceback or a misleading error: every one is a ``CommandError`` (a usage error)
that says what is wrong, and nothing is written."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from django_leases.models import WorkflowRun

#: More digits than Python's ``int()`` reads (4,300 by default).
MANY_DIGITS = "1" * 5000


def _run(*args: str) -> None:
    call_command(*args, stdout=StringIO(), stderr=StringIO())


@pytest.mark.django_db
def test_an_input_holding_a_number_of_too_many_digits_is_a_command_error() -> None:
    with pytest.raises(CommandError, match="--input is not valid JSON"):
        _run("start_workflow", "tests.idle", "--input", MANY_DIGITS)
    assert WorkflowRun.objects.count() == 0


@pytest.mark.django_db
def test_an_integer_option_of_many_digits_is_out_of_range_and_not_echoed_whole() -> None:
    with pytest.raises(CommandError, match="must be from 1 to 10000") as raised:
        _run("workflow_runs", "list", "--limit", MANY_DIGITS)
    assert len(str(raised.value)) < 300, "the whole value was echoed back"
    with pytest.raises(CommandError, match="not an integer") as raised:
        _run("workflow_runs", "list", "--limit", "x" * 5000)
    assert len(str(raised.value)) < 300


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args",
    [
        ("workflow_runs", "list", "--key", "a\x00b"),
        ("workflow_runs", "list", "--workflow", "a\x00b"),
        ("workflow_runs", "cancel", "--workflow", "a\x00b"),
        ("workflow_schedules", "pause", "a\x00b"),
        ("trigger_sources", "disable", "a\x00b"),
    ],
    ids=["runs-key", "runs-workflow", "cancel-workflow", "schedule", "source"],
)
def test_a_name_holding_nul_is_refused_before_any_lookup(args: tuple[str, ...]) -> None:
    """A shell cannot pass a NUL, but ``call_command`` can; PostgreSQL's text refuses one
    with a ``DataError`` at the lookup."""
    with pytest.raises(CommandError, match="NUL"):
        _run(*args)
