"""The channel that wakes idle workflow workers (PostgreSQL LISTEN/NOTIFY).

A leaf: the models notify on it in the transaction that makes work due
(:func:`notify_work_due`), and the worker's listener (:mod:`django_leases.workflows.wakeup`)
listens on it (:func:`channel_name`).
"""

from __future__ import annotations

import hashlib

from django.db import connections

#: Prefix of the notification channel idle workers LISTEN on (the rest is a digest).
CHANNEL_PREFIX = "django_leases_work_"

#: The workflow step table's name (``WorkflowStep._meta.db_table``; a test keeps them equal).
STEP_TABLE = "django_leases_workflowstep"


def channel_name(using: str) -> str:
    """The notification channel of the workflow tables on database alias ``using``.

    A ``str`` of at most 63 characters (PostgreSQL's identifier limit): :data:`CHANNEL_PREFIX`
    and a digest of the database name, its ``OPTIONS["options"]`` (where a ``search_path``
    would be set) and the step table's name, so two projects on one server — or one database
    with a schema each — never wake each other's workers, while every process of one project,
    whatever its alias, shares one channel.
    """
    settings_dict = connections[using].settings_dict
    parts = (
        str(settings_dict.get("NAME") or ""),
        str((settings_dict.get("OPTIONS") or {}).get("options") or ""),
        STEP_TABLE,
    )
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]
    return CHANNEL_PREFIX + digest


def notify_work_due(using: str) -> None:
    """Tell idle workers that workflow work is due now; call it inside the transaction that
    makes the work due (``using`` is that transaction's database alias).

    PostgreSQL: ``SELECT pg_notify(<channel>, '')`` on the caller's connection; the
    notification is delivered at commit and dropped on rollback. Other databases: nothing
    (their workers poll). Database errors propagate (the caller's transaction is failing).
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [channel_name(using)])


__all__ = ["CHANNEL_PREFIX", "STEP_TABLE", "channel_name", "notify_work_due"]
