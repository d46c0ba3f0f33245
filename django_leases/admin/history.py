"""The admin's history (``LogEntry``) of changes made to django-leases' rows, whether from the
admin or from the command line.

Changes from the admin are logged as the operator who made them. Changes from
``manage.py workflow_runs`` / ``trigger_sources`` / ``leases`` (the subcommands that change
state) are logged as the **system user** :data:`SYSTEM_USERNAME`: a user created on first
need, inactive and with no usable password, so nobody can sign in as it. Its entries say
which command made the change, as which OS user, on which host (``LogEntry`` has no other
place for it). Where ``django.contrib.admin`` is not installed, or the project's user model
cannot have such a user created (required fields without defaults), nothing is logged and
the command says so once on stderr; the change itself is made all the same.

The entries are records and keep the words they were written in (English, those of the
code), whoever reads them later, as log lines do; the messages the admin shows an operator
after an operation are in the operator's language.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
from typing import TYPE_CHECKING, Any

from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.db import DatabaseError, IntegrityError, models, router, transaction

if TYPE_CHECKING:  # annotations only: the lifecycle loads when an operation runs
    from django_leases.triggers.lifecycle import LifecycleResult

__all__ = [
    "ADDITION",
    "CHANGE",
    "DELETION",
    "SYSTEM_USERNAME",
    "command_origin",
    "lifecycle_flag",
    "lifecycle_message",
    "log_change",
    "system_user",
]

logger = logging.getLogger("django_leases.admin")

#: The username of the user the command line's changes are logged as.
SYSTEM_USERNAME = "django-leases"

#: Past tense of each trigger-source operation, as its history entries say it.
_SAID = {
    "enable": "Enabled",
    "disable": "Disabled",
    "teardown": "Tore down",
    "forget": "Forgot",
}


def lifecycle_flag(result: LifecycleResult) -> int:
    """The ``LogEntry`` flag of a lifecycle operation's ``result``: ``DELETION`` once the
    row is gone, else ``CHANGE``."""
    return DELETION if result.status is None and result.enabled is None else CHANGE


def lifecycle_message(operation: str, result: LifecycleResult) -> str:
    """The history message of trigger-source ``operation`` (``"enable"``, ``"disable"``,
    ``"teardown"``, ``"forget"``) that came to ``result`` (never a secret)."""
    message = f"{_SAID[operation]} the trigger source"
    if not result.changed and operation in ("enable", "disable"):
        message += f" (it was {'on' if operation == 'enable' else 'off'} already)"
    if lifecycle_flag(result) == CHANGE:
        message += f"; status {result.status}"
    if not result.ok:
        message += "; the provider step failed"
    return message


def command_origin(command: str) -> str:
    """``"from the command line (manage.py <command>, OS user <u> on <host>, pid <n>)"``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (containers)
        user = f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return (
        f"from the command line (manage.py {command}, OS user {user} on "
        f"{socket.gethostname()}, pid {os.getpid()})"
    )


def system_user(using: str | None = None) -> Any:
    """The system user (``SYSTEM_USERNAME``) on database ``using`` (default: where the
    router writes users), created inactive with an unusable password on first need.

    Raises ``DatabaseError`` (``IntegrityError`` among them) or ``TypeError`` /
    ``ValueError`` when the project's user model cannot have it created."""
    user_model = get_user_model()
    alias = using or router.db_for_write(user_model)
    manager = user_model._default_manager.db_manager(alias)
    lookup = {user_model.USERNAME_FIELD: SYSTEM_USERNAME}
    found = manager.filter(**lookup).first()
    if found is not None:
        return found
    user = user_model(**lookup)
    if hasattr(user, "is_active"):
        user.is_active = False
    user.set_unusable_password()
    try:
        with transaction.atomic(using=alias):
            user.save(using=alias)
    except IntegrityError:
        again = manager.filter(**lookup).first()  # created by another process meanwhile
        if again is None:
            raise
        return again
    return user


def log_change(
    obj: models.Model,
    message: str,
    *,
    flag: int = CHANGE,
    user_id: Any = None,
    command: str | None = None,
) -> LogEntry | None:
    """Write one admin history entry about ``obj`` (a model instance, possibly deleted since:
    its ``pk`` is kept).

    Args:
        obj: the row the change was made to (its concrete model's content type is used).
        message: what was done (never a secret).
        flag: ``ADDITION``, ``CHANGE`` or ``DELETION``.
        user_id: the admin user who made it; ``None`` with ``command``: the system user.
        command: the ``manage.py`` command line that made it (``"trigger_sources enable"``),
            said in the message.

    Returns the entry, or ``None`` when it could not be written for a command (the system
    user cannot be created, or the database refused: logged as a warning; the change stands).
    """
    if command is not None:
        message = f"{message}; {command_origin(command)}"
    try:
        if user_id is None:
            user_id = system_user(router.db_for_write(LogEntry)).pk
        return LogEntry.objects.create(
            user_id=user_id,
            content_type=ContentType.objects.get_for_model(obj, for_concrete_model=True),
            object_id=str(obj.pk),
            object_repr=str(obj)[:200],
            action_flag=flag,
            change_message=message,
        )
    except (DatabaseError, TypeError, ValueError) as exc:
        if command is None:
            raise
        logger.warning("Could not record %r in the admin's history: %s", message, exc)
        return None
