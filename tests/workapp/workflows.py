"""``tests.sub.two-steps``: two steps of ``tests.sub.echo``, which returns its data."""

from __future__ import annotations

from typing import Any

from django_leases.workflows import step_function, workflow


@step_function("tests.sub.echo")
def echo(data: Any, ctx: Any) -> Any:
    """Return the step's data (and the attempt that ran it)."""
    return {"data": data, "attempt": ctx.attempt}


@workflow("tests.sub.two-steps")
def two_steps(run: Any, input: Any) -> Any:
    """Two steps in a row; the output is both results."""
    first = run.step("first", "tests.sub.echo", {"n": 1})
    return [first, run.step("second", "tests.sub.echo", {"n": 2})]
