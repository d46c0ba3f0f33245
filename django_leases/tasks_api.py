"""The Django Tasks names the backend uses, from wherever this Django has them.

Django 6 ships the Tasks framework as ``django.tasks``; on Django 5.2 the ``django-tasks``
backport (``pip install django-leases[tasks]``) provides the same API as ``django_tasks``,
with two exceptions spelled differently (``InvalidTaskError`` and
``InvalidTaskBackendError`` there). Every other module reads them from here, so the
difference lives in one place. Importing this module without either raises
``ImportError`` with the install line. Type checking reads Django 6's names (django-stubs).
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING

#: Where the names came from: ``"django.tasks"`` (Django 6) or ``"django_tasks"`` (backport).
SOURCE: str

# Type checking reads Django 6's names; at run time, whichever this Django has.
if TYPE_CHECKING or find_spec("django.tasks") is not None:
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        TaskError,
    )
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json

    SOURCE = "django.tasks"
else:
    try:
        from django_tasks import DEFAULT_TASK_BACKEND_ALIAS, task_backends
    except ImportError as exc:
        raise ImportError(
            "django_leases.tasks needs Django 6 (django.tasks) or, on Django 5.2, the "
            "django-tasks backport: pip install 'django-leases[tasks]'"
        ) from exc
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        DEFAULT_TASK_PRIORITY,
        DEFAULT_TASK_QUEUE_NAME,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
        task,
    )
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import normalize_json

    SOURCE = "django_tasks"

__all__ = [
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "SOURCE",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]
