"""``tests.sched.tick``: the workflow the per-second schedule of this app's settings starts."""

from __future__ import annotations

from typing import Any

from django_leases.workflows import workflow


@workflow("tests.sched.tick")
def tick(run: Any, input: Any) -> Any:
    """Return the input: each run only stands for its tick."""
    return input


@workflow("tests.sched.slow")
def slow(run: Any, input: Any) -> Any:
    """Stay live for ``input["nap"]`` seconds (a durable sleep), longer than a tick."""
    run.sleep("nap", input["nap"])
    return input
