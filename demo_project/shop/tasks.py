"""The shop's Django ``@task``: e-mail a receipt, on the ``mail`` queue.

``send_receipt_email`` is a Django Tasks task (``django.tasks`` on Django 6, the
``django-tasks`` backport on Django 5.2) run by ``django_leases.tasks.TaskBackend`` on the
workflow workers. The demo sends no mail: the task journals its attempt
(:class:`~demo_project.journal.models.StepExecution`, keyed by the task result's id, with
the worker's pid and the attempt's own start and finish) and returns what it would have sent.
The ``mail`` queue is limited to one running task across every worker
(``DJANGO_LEASES["QUEUES"]``), which the tour checks from those journal entries.
"""

from __future__ import annotations

import os
import time
import uuid
from types import SimpleNamespace
from typing import Any

from demo_project.journal.steps import journalled
from django_leases.tasks_api import TaskContext, task

#: The queue the receipts go to (``TASKS["default"]["QUEUES"]`` lists it).
MAIL_QUEUE = "mail"
#: The step name the journal entries of this task carry.
JOURNAL_STEP = "send-receipt-email"


def sending_seconds() -> float:
    """How long "sending" one receipt takes, seconds (``DEMO_MAIL_SECONDS``, default 0.3)."""
    return float(os.environ.get("DEMO_MAIL_SECONDS", "0.3"))


@task(queue_name=MAIL_QUEUE, takes_context=True)
def send_receipt_email(context: TaskContext[Any, Any], order: str, email: str) -> dict[str, Any]:
    """ "Send" the receipt of ``order`` (``str``) to ``email`` (``str``): journal the attempt
    and wait :func:`sending_seconds` in place of an SMTP call.

    Returns ``{"order", "to", "pid", "attempt"}`` (JSON), the task result's return value.
    Raises nothing of its own; an error of the journal's database fails the attempt."""
    ctx = SimpleNamespace(
        run_id=uuid.UUID(str(context.task_result.id)),
        step_name=JOURNAL_STEP,
        attempt=context.attempt,
    )
    with journalled(ctx, "task:send_receipt_email"):
        time.sleep(sending_seconds())
        return {"order": order, "to": email, "pid": os.getpid(), "attempt": context.attempt}
