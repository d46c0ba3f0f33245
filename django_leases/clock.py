"""The database clock: every lease and step-lease comparison is judged by it.

Application servers' clocks may disagree by seconds; the database is the one clock.
Expressions here are evaluated inside the statement that uses them:

* PostgreSQL: ``statement_timestamp()`` (what Django's ``Now()`` compiles to), never the
  transaction-start ``now()``;
* SQLite: ``strftime('%Y-%m-%d %H:%M:%f', 'now')``, millisecond precision, constant within
  one statement, in the text form Django stores datetimes in.

The ORM side uses :func:`db_now` (Django's ``Now()``) and :func:`db_now_plus`.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.expressions import Combinable
from django.db.models.functions import Now


def db_now() -> Now:
    """Django's ``Now()``: statement time on PostgreSQL, ``'now'`` on SQLite."""
    return Now()


def db_now_plus(seconds: float) -> Combinable:
    """An ORM expression for *database now + seconds* (a ``DateTimeField`` value)."""
    return ExpressionWrapper(
        Now() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def now_sql(connection: BaseDatabaseWrapper) -> str:
    """SQL for the database's current time on ``connection``.

    ``%`` is doubled, so the text is meant for a query executed *with* parameters.
    """
    if connection.vendor == "postgresql":
        return "statement_timestamp()"
    if connection.vendor == "sqlite":
        return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
    raise NotImplementedError(connection.vendor)


def now_plus_sql(connection: BaseDatabaseWrapper) -> str:
    """SQL for database now + a number of seconds, taking one parameter.

    Pass the parameter through :func:`seconds_param`.
    """
    if connection.vendor == "postgresql":
        return "(statement_timestamp() + make_interval(secs => %s))"
    if connection.vendor == "sqlite":
        return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"
    raise NotImplementedError(connection.vendor)


def seconds_param(connection: BaseDatabaseWrapper, seconds: float) -> float | str:
    """The parameter :func:`now_plus_sql` expects for ``seconds``."""
    if connection.vendor == "sqlite":
        return f"{seconds:+.3f} seconds"
    return seconds


__all__ = ["db_now", "db_now_plus", "now_plus_sql", "now_sql", "seconds_param"]
