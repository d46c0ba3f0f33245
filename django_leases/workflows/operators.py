"""What operators do from code: fork a run from a step (:func:`fork_run`).

The rule is ``WorkflowRun.objects.fork`` (:mod:`django_leases.models.forks`); the admin's
"Fork from a step" action and ``manage.py workflow_runs fork`` call it too.
"""

from __future__ import annotations

import uuid

from django.db import router

from django_leases.models import WorkflowRun
from django_leases.validation import parse_run_id
from django_leases.workflows.registry import get_workflow


def fork_run(run_id: uuid.UUID | str, *, from_step: str, using: str | None = None) -> uuid.UUID:
    """Start a new run of run ``run_id``'s workflow with its input and tags, whose steps
    recorded before step ``from_step`` keep their results (and whose waits reached before
    it keep their outcomes), and which runs ``from_step`` and everything after it again with
    the code deployed now. The new run's ``forked_from`` is ``run_id``; the original is not
    changed (a running original goes on). ``using``: database alias (default: the router's
    choice).

    The answer to "a step failed on a consumed event of the wrong shape": deploy code that
    reads that shape (or that waits for a new event under another name), then fork the run
    from the step that failed.

    Returns the new run's id (``uuid.UUID``).

    Raises:
        WorkflowRun.DoesNotExist: no such run (nothing written).
        UnknownWorkflowError: its workflow is not registered in this process.
        ValueError: a malformed run id or step name, or a step the run never reached
            (nothing written).
    """
    alias = using or router.db_for_write(WorkflowRun)
    runs = WorkflowRun.objects.db_manager(alias)
    workflow = runs.filter(pk=parse_run_id(run_id)).values_list("workflow", flat=True).first()
    if workflow is None:
        raise WorkflowRun.DoesNotExist(f"No workflow run with id {run_id}")
    get_workflow(workflow)
    return runs.fork(run_id, from_step).pk


__all__ = ["fork_run"]
