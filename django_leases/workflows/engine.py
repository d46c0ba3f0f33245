"""Orchestration by replay and step execution under fenced step leases."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.db import router, transaction
from django.db.models.functions import Now

from django_leases.models import WorkflowRun
from django_leases.workflows.registry import get_workflow


def start_workflow(name: str, input: Any = None, *, using: str | None = None) -> uuid.UUID:
    """Create a run of workflow ``name`` with JSON ``input`` and its first pass, atomically.

    Safe inside an outer ``transaction.atomic()`` (the webhook view records the delivery and
    starts the run in one transaction). Returns the run id (``uuid.UUID``).

    Raises:
        UnknownWorkflowError: no workflow of that name is registered.
        ValueError: ``input`` is not JSON-serialisable.
    """
    get_workflow(name)
    try:
        json.dumps(input)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"Workflow input must be JSON-serialisable: {exc}") from None
    alias = using or router.db_for_write(WorkflowRun)
    with transaction.atomic(using=alias):
        run = WorkflowRun.objects.using(alias).create(
            workflow=name, input={} if input is None else input, pass_due_at=Now()
        )
    return run.id
