"""Ours: a one-step no-op workflow (found by django_leases' autodiscovery of ``workflows``)."""

from __future__ import annotations

from typing import Any

from django_leases.workflows import step_function, workflow

WORKFLOW = "bench-noop"
STEP_FUNCTION = "bench.noop"


@step_function(STEP_FUNCTION)
def noop_step(data: Any, ctx: Any) -> None:
    """Does nothing; the run's cost is the engine's alone."""
    return None


@workflow(WORKFLOW)
def noop_workflow(run: Any, payload: Any) -> Any:
    """One step, its result is the run's output."""
    return run.step("noop", STEP_FUNCTION)
