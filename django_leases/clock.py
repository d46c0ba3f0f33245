"""The database clock: every lease and step-lease comparison is judged by it.

Application servers' clocks may disagree by seconds; the database is the one clock.
Expressions here are evaluated inside the statement that uses them, at **statement time**
(one value for the whole statement, so a comparison and the expiry it writes agree):

* PostgreSQL: ``statement_timestamp()`` (what Django's ``Now()`` compiles to), never the
  transaction-start ``now()``;
* SQLite: ``strftime('%Y-%m-%d %H:%M:%f', 'now')``, millisecond precision, constant within
  one statement, in the text form Django stores datetimes in;
* MariaDB / MySQL: ``UTC_TIMESTAMP(6)``, microseconds, in UTC (:func:`mysql_zone`). Only a
  ``DATABASES[...]["TIME_ZONE"]`` naming another zone (with ``USE_TZ = True``: Django then
  reads every datetime of that database in that zone) makes it
  ``CONVERT_TZ(UTC_TIMESTAMP(6), '+00:00', '<zone>')``, which needs the server's time zone
  tables (a system check says when they are missing, another when the zone has daylight
  saving: its wall clock skips an hour and repeats one). With ``USE_TZ = False`` the library's
  own times are naive UTC there, as on SQLite: a wall clock in ``TIME_ZONE`` would go back an
  hour each autumn, and a lease taken before the change would lapse an hour late (one taken
  before the spring change, early).

  MariaDB and MySQL have two kinds of clock function. ``NOW()``, ``CURRENT_TIMESTAMP``,
  ``UTC_TIMESTAMP()`` and ``UNIX_TIMESTAMP()`` give the time the statement **began** (the
  calling statement's, inside a trigger or stored routine; frozen by ``SET timestamp``);
  ``SYSDATE()`` gives the time of its own **evaluation**, a new value on every call. Django's
  ``Now()`` is ``CURRENT_TIMESTAMP(6)``, statement time but in the *session* time zone, which
  is the server's unless set, so it is not used. ``SYSDATE()`` is not used either: it has no
  UTC form (it is session-local, ambiguous in a daylight-saving fall-back hour), a statement
  that writes ``expires_at = now + ttl`` and checks ``expires_at > now`` would see two
  different "nows", the optimizer cannot use it to bound an index range (the worker's
  due-work scans), and statement-based replication marks it unsafe. So every comparison uses
  statement time, as on PostgreSQL: a statement that waited for a row lock re-reads the row
  (READ COMMITTED) and judges it against the time it began, which can only refuse a
  takeover that became possible during the wait, never grant one early; the holder, token
  and ``released_at`` guards are re-checked on the latest row.

The ORM side uses :func:`db_now` (:class:`DbNow`) and :func:`db_now_plus`.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from django.conf import settings as django_settings
from django.db import connections, router
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.expressions import Combinable
from django.db.models.functions import Now
from django.utils import timezone as django_timezone

#: What a time zone name may contain to be written into SQL (IANA names, ``+hh:mm``).
_ZONE_NAME = re.compile(r"[A-Za-z0-9/_+:-]+")


def mysql_zone(connection: BaseDatabaseWrapper) -> str | None:
    """The zone the database clock is written in on a MariaDB / MySQL ``connection``:
    ``None`` for UTC, which it is unless ``USE_TZ`` is on and the database's
    ``DATABASES[...]["TIME_ZONE"]`` names another (Django's ``connection.timezone_name``,
    the zone Django then reads that database's datetimes in). With ``USE_TZ`` off the
    library's times are naive UTC (see the module's docstring).

    Raises ``ValueError`` for a name that is not a time zone name."""
    if not django_settings.USE_TZ:
        return None
    name = str(connection.timezone_name)
    if name.upper() in {"UTC", "ETC/UTC", "+00:00", "Z"}:
        return None
    if not _ZONE_NAME.fullmatch(name):
        raise ValueError(f"Not a time zone name: {name!r}")
    return name


def _mysql_now(connection: BaseDatabaseWrapper) -> str:
    zone = mysql_zone(connection)
    if zone is None:
        return "UTC_TIMESTAMP(6)"
    return f"CONVERT_TZ(UTC_TIMESTAMP(6), '+00:00', '{zone}')"


class DbNow(Now):
    """Django's ``Now()``, but on MariaDB / MySQL ``UTC_TIMESTAMP(6)`` (in the connection's
    storage zone, see :func:`mysql_zone`) instead of the session-local
    ``CURRENT_TIMESTAMP(6)``. The same SQL as ``Now()`` everywhere else."""

    def as_mysql(self, compiler: Any, connection: BaseDatabaseWrapper, **extra: Any) -> Any:
        """The SQL on MariaDB / MySQL: ``UTC_TIMESTAMP(6)``, converted to the connection's
        storage zone where that is not UTC (Django's ``as_sql`` return value)."""
        return self.as_sql(compiler, connection, template=_mysql_now(connection), **extra)


def db_now() -> DbNow:
    """The database's current time as an ORM expression (statement time; see the module
    docstring for each vendor's SQL)."""
    return DbNow()


def db_now_plus(seconds: float) -> Combinable:
    """An ORM expression for *database now + seconds* (``float``; a ``DateTimeField`` value)."""
    return ExpressionWrapper(
        DbNow() + Value(timedelta(seconds=seconds)), output_field=DateTimeField()
    )


def now_sql(connection: BaseDatabaseWrapper) -> str:
    """SQL for the database's current time on ``connection``.

    ``%`` is doubled, so the text is meant for a query executed *with* parameters.
    """
    if connection.vendor == "postgresql":
        return "statement_timestamp()"
    if connection.vendor == "sqlite":
        return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')"
    if connection.vendor == "mysql":
        return _mysql_now(connection)
    raise NotImplementedError(connection.vendor)


def now_plus_sql(connection: BaseDatabaseWrapper) -> str:
    """SQL for database now + a number of seconds, taking one parameter.

    Pass the parameter through :func:`seconds_param`.
    """
    if connection.vendor == "postgresql":
        return "(statement_timestamp() + make_interval(secs => %s))"
    if connection.vendor == "sqlite":
        return "strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s)"
    if connection.vendor == "mysql":
        return f"({_mysql_now(connection)} + INTERVAL %s MICROSECOND)"
    raise NotImplementedError(connection.vendor)


def seconds_param(connection: BaseDatabaseWrapper, seconds: float) -> float | int | str:
    """The parameter :func:`now_plus_sql` expects for ``seconds`` (``float``): a modifier
    text on SQLite, whole microseconds on MariaDB / MySQL, the seconds elsewhere."""
    if connection.vendor == "sqlite":
        return f"{seconds:+.3f} seconds"
    if connection.vendor == "mysql":
        return round(seconds * 1_000_000)
    return seconds


def _zone_of(alias: str) -> Any:
    """The zone the library's naive datetimes are in on ``alias`` when ``USE_TZ`` is off: UTC
    on SQLite (the database clock, ``strftime('now')``, is UTC there) and on MariaDB / MySQL
    (:func:`mysql_zone`); on PostgreSQL, whose columns hold instants, the connection's zone
    (``TIME_ZONE``) — never the zone a request activated. (Django's ``connection.timezone``
    is ``None`` without ``USE_TZ``, which would mean the active zone to ``make_aware`` /
    ``make_naive``.)"""
    connection = connections[alias]
    if connection.vendor in ("sqlite", "mysql"):
        return UTC
    return ZoneInfo(connection.timezone_name)


def to_aware(value: datetime, alias: str) -> datetime:
    """A datetime read from database ``alias`` as an aware UTC ``datetime``."""
    if django_timezone.is_naive(value):
        value = django_timezone.make_aware(value, _zone_of(alias))
    return value.astimezone(UTC)


def to_stored(value: datetime | None, alias: str) -> datetime | None:
    """An aware ``datetime`` as it is written to database ``alias``: in UTC (PostgreSQL
    refuses a UTC offset beyond ±15:59 that Python allows, up to ±23:59), or naive in the
    database's zone when ``USE_TZ`` is off; ``None`` stays ``None``."""
    if value is None:
        return value
    if django_settings.USE_TZ:
        return value.astimezone(UTC) if value.tzinfo is not None else value
    return django_timezone.make_naive(value, _zone_of(alias))


class AutoTimeField(DateTimeField):  # type: ignore[type-arg]
    """Django's ``DateTimeField`` for ``auto_now`` / ``auto_now_add`` columns of the library's
    models, whose value is in the zone the library keeps its own times in on the model's
    database (:func:`to_stored`). With ``USE_TZ`` on that is Django's own value. With it off,
    Django writes naive ``TIME_ZONE`` times, while the database clock writes naive UTC on
    SQLite and MariaDB / MySQL: a run would be created hours after it finished, a task
    enqueued after it started. Deconstructs as ``DateTimeField``: no migration."""

    def pre_save(self, model_instance: Any, add: bool) -> Any:
        """The value saved (and set on ``model_instance``): now, for an ``auto_now`` field,
        or an ``auto_now_add`` one on insert (``add``); else the instance's own value."""
        if django_settings.USE_TZ or not (self.auto_now or (self.auto_now_add and add)):
            return super().pre_save(model_instance, add)
        # The database the instance is saved to: known once it was saved; else the router's.
        alias = model_instance._state.db or router.db_for_write(type(model_instance))
        value = to_stored(datetime.now(UTC), alias)
        setattr(model_instance, self.attname, value)
        return value

    def deconstruct(self) -> Any:
        """As Django's ``DateTimeField`` (the migrations name no class of ours)."""
        name, _path, args, kwargs = super().deconstruct()
        return name, "django.db.models.DateTimeField", args, kwargs


__all__ = [
    "AutoTimeField",
    "DbNow",
    "db_now",
    "db_now_plus",
    "mysql_zone",
    "now_plus_sql",
    "now_sql",
    "seconds_param",
    "to_aware",
    "to_stored",
]
