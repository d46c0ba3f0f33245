"""System checks: settings that would silently break leases, workflows or trigger sources.

Registered when the app is ready (``apps.py``, :data:`~django_leases.apps.SYSTEM_CHECKS`
names the entry points below and their tags; this module loads when checks first run); run
by ``manage.py check``, ``migrate``, ``runserver`` and ``test``. Each check has a stable id
and a hint:

=======================  ==========================================================================
id                       what it reports
=======================  ==========================================================================
``django_leases.W001``   SQLite without ``transaction_mode`` IMMEDIATE (or EXCLUSIVE): read-decide-
                         write blocks are not serialised (``select_for_update()`` is a no-op there)
``django_leases.W002``   SQLite with a busy timeout (``timeout``, or ``PRAGMA busy_timeout``)
                         shorter than Python's default of 5 s: a writer waits at most that
                         long for another's transaction, then fails with "database is locked"
                         (at once with 0), so renewals and claims fail under load. No
                         ``timeout`` means the 5 s default, which is not reported
``django_leases.E003``   SQLite older than 3.35: no ``RETURNING``, which acquire/refresh need
``django_leases.W004``   ``ATOMIC_REQUESTS`` on the lease database: a lease taken in a request is
                         invisible to the renewal thread until the request ends
``django_leases.E005``   the database router sends django-leases writes to an alias that is not
                         in ``DATABASES``
``django_leases.W006``   the lease database is a private in-memory SQLite database: every thread
                         (renewals, workers) gets its own, empty database
``django_leases.E007``   ``AUTOCOMMIT`` off on the lease database: acquire and release never
                         commit, so no other process sees them
``django_leases.W008``   a declared trigger source has no signing secret: every delivery gets 401
                         (none in ``WEBHOOK_SECRETS`` nor in the credential store, for a
                         ``manual`` source or an enabled one). A database check (``check
                         --database``, ``migrate``), silent before django-leases' migrations
``django_leases.W009``   a trigger source starts a workflow that no code registers: its deliveries
                         fail and are not recorded
``django_leases.E010``   ``WEBHOOK_MAX_BODY`` or ``WEBHOOK_SECRETS`` is not usable
``django_leases.W011``   django-leases reads routed to another database than its writes: a replica
                         lags, so ``current()`` and the admin show stale leases
``django_leases.W012``   PostgreSQL above READ COMMITTED: concurrent acquires and renewals raise
                         serialisation errors instead of answering
``django_leases.E013``   PostgreSQL with ``TUNED_SQL`` on, migrations applied, but the workflow
                         or lease functions this code calls are missing: workers refuse to
                         start (a database check: ``check --database``, ``migrate``)
``django_leases.W014``   the credential store cannot be read (the database is unreachable or
                         refused the query): whether each declared source without a
                         ``WEBHOOK_SECRETS`` entry has a signing secret is unknown. A database
                         check, as W008
``django_leases.E015``   ``DJANGO_LEASES`` is not a dict, or has a key django-leases does not
                         know (a misspelling): it is ignored and the setting keeps its default.
                         The message names the key meant where one is close
``django_leases.E016``   a ``DJANGO_LEASES`` value of the wrong type or range (a TTL or timeout
                         not above 0, a ``MAX_TTL`` above ``TTL_CEILING`` (100 years: an
                         expiry the database may not store), ``WORKER_WAKEUP`` not ``"auto"`` /
                         ``"poll"``, ``TUNED_SQL`` not a bool…), which would be misread or
                         refused at use; also a ``DEFAULT_TTL`` or ``STEP_LEASE_TTL`` left at
                         its default that the ``MAX_TTL`` or ``RENEWAL_FLOOR`` set refuses
``django_leases.E017``   MariaDB / MySQL at an isolation level other than READ COMMITTED (in
                         ``OPTIONS["isolation_level"]``, or the session's, with ``--database``):
                         under REPEATABLE READ a read inside a transaction (``current()``…)
                         shows its first read's snapshot: a lease since passed on keeps its
                         old holder and token
``django_leases.E018``   MariaDB / MySQL ``OPTIONS["client_flag"]`` without ``CLIENT.FOUND_ROWS``:
                         an UPDATE then counts changed rows, not matched ones, so a renewal
                         within the same microsecond (a no-op) reads as "lease lost"
``django_leases.E019``   MariaDB / MySQL: a django-leases table (or, before ``migrate``, the
                         default storage engine) is not InnoDB: no transactions, no row locks
``django_leases.W020``   MariaDB / MySQL session ``sql_mode`` without ``STRICT_TRANS_TABLES``: a
                         value that does not fit is cut or zeroed with a warning, not refused
``django_leases.E021``   MariaDB / MySQL: Django stores datetimes in a named time zone there
                         (``DATABASES[...]["TIME_ZONE"]``) and the server's time zone tables do
                         not know it: the database clock (``CONVERT_TZ``) would be NULL
``django_leases.W022``   MariaDB / MySQL: a text column of the django_leases tables (a lease or
                         run key, a name, a delivery id) has a collation that is case- or
                         accent-insensitive, or pads spaces: "a", "A" and "a " would be one
                         lease, and a delivery id differing only in case a repeat
``django_leases.E023``   a ``@step_function`` names a queue that ``DJANGO_LEASES["QUEUES"]`` does
                         not configure (``"default"`` always is): its steps would wait for a
                         worker of a queue nobody runs with ``--queue`` and get no limits
``django_leases.E026``   a schedule that would never fire as declared: in
                         ``DJANGO_LEASES["SCHEDULES"]`` an entry that is not a dict, lacks
                         ``workflow`` or ``cron``, has an unknown key, a cron expression cronsim
                         cannot read (or one that never matches), an unknown time zone, a
                         ``catch_up`` other than ``"latest"`` / ``"none"``, input that is not
                         storable JSON (as a run's input: no NUL, no lone surrogate, no keys
                         written alike, nested at most 100 levels), a workflow no loaded
                         code registers, a ``task`` its Tasks backend would refuse to enqueue
                         as declared (a queue it does not take, a bad queue key, arguments
                         that would not read back as written), or the name of a
                         ``@workflow(schedule=...)`` schedule. (A bad ``@workflow`` schedule
                         raises ``ValueError`` at import already.)
``django_leases.E031``   ``DJANGO_LEASES["PRUNE"]`` cannot be used as set, so no prune would run:
                         ``schedule`` or ``older_than`` missing, an unknown key, a cron
                         expression cronsim cannot read (or one that never matches), an
                         ``older_than`` that is not seconds ≥ 0 or a ``timedelta`` (or is
                         above 100 years), a ``batch_size`` that is not an int from 1 to 10000,
                         an unknown time zone, a ``queue`` that ``QUEUES`` does not configure,
                         or a schedule named ``django_leases.prune`` already. (A ``PRUNE``
                         that is neither ``None`` nor a dict is ``E016``.)
``django_leases.I032``   PostgreSQL through psycopg2 rather than psycopg 3: supported, but no
                         statement is prepared and idle workflow workers poll (every
                         ``WORKER_POLL_INTERVAL``) instead of being woken by LISTEN/NOTIFY.
                         Said once, naming every such database
``django_leases.E033``   a declared trigger source needs what the ``webhooks`` extra installs and
                         it is missing: cryptography (a secret kept in the credential store,
                         i.e. no ``WEBHOOK_SECRETS`` entry) or httpx (the ``github`` and
                         ``stripe`` providers' API calls). Said once, naming the sources and
                         ``pip install "django-leases[webhooks]"``
``django_leases.W034``   ``check --deploy``: ``BASE_URL`` on plain http, so deliveries (and their
                         signatures) to the registered address cross the network unencrypted
``django_leases.W035``   ``check --deploy``: ``GITHUB_API_URL`` or ``STRIPE_API_URL`` on plain
                         http, so the API token is sent unencrypted
``django_leases.W040``   trigger sources are declared but the URLconf does not include
                         ``django_leases.urls``: they have no URL to receive on, so enabling
                         one fails and ``trigger_sources list`` shows URL ``-``
``django_leases.W032``   the lease database has standbys (replicas) its commits do not wait for:
                         promoting one loses acknowledged lease grants and fenced writes
                         (:func:`django_leases.db.replication`; PostgreSQL, MariaDB)
``django_leases.W036``   transactional step functions (``@step_function(..., transactional=True)``)
                         on a SQLite workflow database: each holds the database's write lock
                         for as long as it runs, so every other writer waits, and fails with
                         "database is locked" once the busy timeout has passed
``django_leases.W041``   MariaDB / MySQL: that database ``TIME_ZONE`` has daylight saving: its
                         wall clock skips and repeats an hour, so a lease taken just before a
                         change lapses early (two holders) or an hour late
=======================  ==========================================================================

W008, W014, E013, E019–W022, W032, W041 (and E017's session half) ask the database: they are tagged
``database`` and run with ``check --database``, ``migrate`` and the test runner, on the
databases named; every other check reads settings and code only. W034 and W035 run with
``check --deploy``.
"""

from __future__ import annotations

import difflib
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.apps import apps
from django.conf import settings as django_settings
from django.core import checks
from django.db import connections, router
from django.urls import NoReverseMatch, reverse
from django.utils.translation import gettext as _

from django_leases import clock, db
from django_leases.conf import (
    DEFAULTS,
    MAX_POLL_INTERVAL,
    WEBHOOKS_EXTRA,
    check_byte_limit,
    leases_settings,
    parse_queues,
)
from django_leases.models import TriggerSecret, TriggerSource, WorkflowRun
from django_leases.models.trigger import check_base_url
from django_leases.models.workflow import FUNCTIONS_MIGRATION
from django_leases.triggers.providers import get_provider
from django_leases.triggers.providers.stripe import check_api_version
from django_leases.triggers.registry import declarations
from django_leases.validation import (
    TTL_CEILING,
    refused_ttl_settings,
    renewable_ttl_seconds,
    seconds,
    ttl_seconds,
)
from django_leases.workflows.registry import (
    UnknownWorkflowError,
    get_workflow,
    prune_problems,
    schedule_problems,
    step_functions,
)

if TYPE_CHECKING:
    from django.apps import AppConfig
    from django.db.models import Model

    from django_leases.triggers.registry import TriggerDeclaration

#: Python's ``sqlite3`` busy timeout, seconds: what a connection whose ``OPTIONS`` set no
#: ``timeout`` gets (``PRAGMA busy_timeout`` reads 5000 on such a connection).
SQLITE_DEFAULT_TIMEOUT = 5.0
#: Shortest busy timeout (seconds) W002 accepts: the default every Django project has. A
#: shorter one was chosen on purpose, and makes writers give up sooner than by default.
MIN_BUSY_TIMEOUT = SQLITE_DEFAULT_TIMEOUT
#: Oldest SQLite with ``RETURNING`` (which the single-statement lease operations use).
MIN_SQLITE = (3, 35, 0)


def sqlite_version() -> tuple[int, ...]:
    """The SQLite library version this process links (a tuple, e.g. ``(3, 45, 1)``)."""
    return tuple(sqlite3.sqlite_version_info)


def _our_models() -> list[type[Model]]:
    return list(apps.get_app_config("django_leases").get_models())


def _write_aliases() -> tuple[set[str], list[checks.CheckMessage]]:
    """Aliases the router sends our writes to; an error for each one not in DATABASES."""
    found: set[str] = set()
    errors: list[checks.CheckMessage] = []
    for model in _our_models():
        alias = router.db_for_write(model)
        if alias in connections:
            found.add(alias)
            continue
        errors.append(
            checks.Error(
                f"The database router sends {model._meta.label} writes to {alias!r}, "
                "which is not in DATABASES.",
                hint="Fix the router (db_for_write) or add the database to DATABASES.",
                obj=model,
                id="django_leases.E005",
            )
        )
    return found, errors


def check_sqlite_settings(
    alias: str, settings_dict: Mapping[str, Any]
) -> list[checks.CheckMessage]:
    """W001, W002, W006 and E003 for one SQLite database's settings."""
    messages: list[checks.CheckMessage] = []
    options = settings_dict.get("OPTIONS") or {}
    mode = str(options.get("transaction_mode") or "").upper()
    if mode not in ("IMMEDIATE", "EXCLUSIVE"):
        messages.append(
            checks.Warning(
                f"SQLite database {alias!r} starts transactions DEFERRED: two processes can "
                "both read a lease row and decide on it, and one then fails with "
                "'database is locked' instead of waiting.",
                hint=f'Set DATABASES[{alias!r}]["OPTIONS"]["transaction_mode"] = "IMMEDIATE".',
                id="django_leases.W001",
            )
        )
    timeout = _busy_timeout(options)
    if timeout is None:
        messages.append(
            checks.Warning(
                f"SQLite database {alias!r} has OPTIONS['timeout'] = {options['timeout']!r}, "
                "not a number of seconds: Python's sqlite3 refuses to connect with it.",
                hint=f'Set DATABASES[{alias!r}]["OPTIONS"]["timeout"] = 20 (seconds).',
                id="django_leases.W002",
            )
        )
    elif timeout < MIN_BUSY_TIMEOUT:
        waits = "fails at once" if timeout <= 0 else f"waits at most {timeout:g} s, then fails"
        messages.append(
            checks.Warning(
                f"SQLite database {alias!r} has a busy timeout of {timeout:g} s, shorter than "
                f"Python's default of {SQLITE_DEFAULT_TIMEOUT:g} s: a writer that meets "
                f"another connection's transaction {waits} with 'database is locked', so "
                "lease renewals and claims fail under load.",
                hint=f'Set DATABASES[{alias!r}]["OPTIONS"]["timeout"] = 20 (seconds), or '
                f"leave it out for the {SQLITE_DEFAULT_TIMEOUT:g} s default.",
                id="django_leases.W002",
            )
        )
    name = str(settings_dict.get("NAME") or "")
    in_memory = name in ("", ":memory:") or "mode=memory" in name
    if in_memory and "cache=shared" not in name:
        messages.append(
            checks.Warning(
                f"SQLite database {alias!r} is a private in-memory database: each thread's "
                "connection opens a separate empty one, so the hold_lease renewal thread and "
                "worker threads never see the lease rows.",
                hint="Use a database file (with WAL), or a shared-cache URI "
                "('file:name?mode=memory&cache=shared' with uri=True).",
                id="django_leases.W006",
            )
        )
    version = sqlite_version()
    if version < MIN_SQLITE:
        messages.append(
            checks.Error(
                f"SQLite {'.'.join(map(str, version))} has no RETURNING clause, which "
                "django-leases' acquire, refresh and release statements need.",
                hint="Use SQLite 3.35 or newer (e.g. a newer Python build, or pysqlite3).",
                id="django_leases.E003",
            )
        )
    return messages


def _busy_timeout(options: Mapping[str, Any]) -> float | None:
    """Seconds of busy timeout a connection with ``options`` gets: a ``PRAGMA busy_timeout``
    in ``init_command`` (run after connecting, so it wins), else ``timeout``, else Python's
    default (:data:`SQLITE_DEFAULT_TIMEOUT`). ``None``: a ``timeout`` that is not a number,
    with which ``sqlite3.connect`` refuses to connect."""
    found = SQLITE_DEFAULT_TIMEOUT
    if "timeout" in options:
        value = options["timeout"]
        if not isinstance(value, int | float):
            return None
        found = float(value)
    init = str(options.get("init_command") or "").lower().replace(" ", "")
    marker = "busy_timeout="
    if marker in init:
        digits = ""
        for char in init.split(marker, 1)[1]:
            if not char.isdigit():
                break
            digits += char
        if digits:
            found = int(digits) / 1000.0
    return found


def check_database_settings(
    alias: str, vendor: str, settings_dict: Mapping[str, Any]
) -> list[checks.CheckMessage]:
    """Every per-database check (W001–W012 except the router's) for one alias."""
    messages: list[checks.CheckMessage] = []
    if vendor == "sqlite":
        messages.extend(check_sqlite_settings(alias, settings_dict))
    if settings_dict.get("ATOMIC_REQUESTS"):
        messages.append(
            checks.Warning(
                f"ATOMIC_REQUESTS is on for {alias!r}, the django-leases database: a lease "
                "taken inside a request stays uncommitted until the request ends, so the "
                "renewal thread (its own connection) cannot see it and its renewals wait on "
                "the row lock; other processes see no holder.",
                hint="Turn ATOMIC_REQUESTS off, or mark the views that take leases with "
                "@transaction.non_atomic_requests.",
                id="django_leases.W004",
            )
        )
    if settings_dict.get("AUTOCOMMIT") is False:
        messages.append(
            checks.Error(
                f"AUTOCOMMIT is off for {alias!r}, the django-leases database: acquire, "
                "refresh and release never commit, so no other process sees them.",
                hint="Leave AUTOCOMMIT at its default (True).",
                id="django_leases.E007",
            )
        )
    if vendor == "postgresql":
        messages.extend(_check_isolation(alias, settings_dict))
    if vendor == "mysql":
        messages.extend(check_mysql_settings(alias, settings_dict))
    return messages


#: The isolation level leases need on MariaDB / MySQL (Django's default there).
MYSQL_ISOLATION = "read committed"
#: ``MySQLdb.constants.CLIENT.FOUND_ROWS``: UPDATE reports matched rows, not changed ones.
MYSQL_FOUND_ROWS = 2


def check_transactional_steps(
    transactional: Sequence[str], databases: Mapping[str, tuple[str, Mapping[str, Any]]]
) -> list[checks.CheckMessage]:
    """W036: ``transactional`` (names of transactional step functions) while a workflow
    database (``databases``: alias → (vendor, settings dict)) is SQLite."""
    if not transactional:
        return []
    messages: list[checks.CheckMessage] = []
    for alias, (vendor, settings_dict) in sorted(databases.items()):
        if vendor != "sqlite":
            continue
        timeout = _busy_timeout(settings_dict.get("OPTIONS") or {})
        waited = SQLITE_DEFAULT_TIMEOUT if timeout is None else timeout
        names = ", ".join(sorted(transactional))
        messages.append(
            checks.Warning(
                f"Transactional step functions ({names}) run on SQLite database {alias!r}: "
                "each holds the database's write lock for as long as it runs, so every other "
                f"writer waits, and fails with 'database is locked' after {waited:g} s (the "
                "busy timeout).",
                hint=f"Keep them shorter than {waited:g} s (run.step(..., timeout=...)), or "
                "run the workflows on PostgreSQL or MariaDB.",
                id="django_leases.W036",
            )
        )
    return messages


def _mysql_isolation_error(alias: str, level: str) -> checks.CheckMessage:
    return checks.Error(
        f"MariaDB / MySQL database {alias!r} runs at isolation level {level.upper()}: a "
        "read inside a transaction (Lease.objects.current(), your reads in a fenced() block) "
        "shows the snapshot of the transaction's first read, so a lease that has since "
        "passed on still shows its old holder and token (READ UNCOMMITTED: a takeover that "
        "may yet roll back).",
        hint='Use READ COMMITTED (Django\'s default): OPTIONS["isolation_level"] = '
        '"read committed", or leave it unset.',
        id="django_leases.E017",
    )


def check_mysql_settings(alias: str, settings_dict: Mapping[str, Any]) -> list[checks.CheckMessage]:
    """E017 (the setting) and E018 for one MariaDB / MySQL alias, from its settings alone."""
    messages: list[checks.CheckMessage] = []
    options = settings_dict.get("OPTIONS") or {}
    level = options.get("isolation_level", MYSQL_ISOLATION)
    if level and str(level).lower() != MYSQL_ISOLATION:
        messages.append(_mysql_isolation_error(alias, str(level)))
    flags = options.get("client_flag")
    if flags is not None and not int(flags) & MYSQL_FOUND_ROWS:
        messages.append(
            checks.Error(
                f'OPTIONS["client_flag"] of MariaDB / MySQL database {alias!r} lacks '
                "CLIENT.FOUND_ROWS: an UPDATE then counts the rows it changed, not the rows "
                "it matched, so a renewal or fenced write that changes nothing (within the "
                "same microsecond) is taken for a lost lease or a stale attempt.",
                hint="Include MySQLdb.constants.CLIENT.FOUND_ROWS in client_flag (Django sets "
                "it when client_flag is not given).",
                id="django_leases.E018",
            )
        )
    return messages


def check_mysql_database(connection: Any) -> list[checks.CheckMessage]:
    """E017 (the session's level), E019, W020, E021, W041 and W022 for one MariaDB / MySQL
    connection, by asking the server. Database errors propagate."""
    alias = connection.alias
    messages: list[checks.CheckMessage] = []
    with connection.cursor() as cursor:
        variable = "tx_isolation" if connection.mysql_is_mariadb else "transaction_isolation"
        if connection.mysql_is_mariadb and connection.mysql_version >= (11, 1):
            variable = "transaction_isolation"
        cursor.execute(f"SELECT @@SESSION.{variable}, @@SESSION.sql_mode")
        level, sql_mode = cursor.fetchone()
        level = str(level).replace("-", " ").lower()
        if level != MYSQL_ISOLATION:
            messages.append(_mysql_isolation_error(alias, level))
        if "STRICT_TRANS_TABLES" not in str(sql_mode).upper().split(","):
            messages.append(
                checks.Warning(
                    f"MariaDB / MySQL database {alias!r} runs without STRICT_TRANS_TABLES in "
                    "its sql_mode: a value that does not fit a column is cut or zeroed with "
                    "a warning instead of refused.",
                    hint='Add "init_command": "SET sql_mode = \'STRICT_TRANS_TABLES\'" to its '
                    "OPTIONS (or set it on the server).",
                    id="django_leases.W020",
                )
            )
        tables = [model._meta.db_table for model in _our_models()]
        cursor.execute(
            "SELECT TABLE_NAME, ENGINE FROM information_schema.TABLES "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME IN "
            f"({', '.join(['%s'] * len(tables))})",
            tables,
        )
        engines = {name: str(engine or "") for name, engine in cursor.fetchall()}
        if not engines:
            cursor.execute("SELECT @@SESSION.default_storage_engine")
            default = str(cursor.fetchone()[0])
            other = {"(default_storage_engine)": default} if default.lower() != "innodb" else {}
        else:
            other = {name: engine for name, engine in engines.items() if engine.lower() != "innodb"}
        if other:
            listed = ", ".join(f"{name} ({engine})" for name, engine in sorted(other.items()))
            messages.append(
                checks.Error(
                    f"MariaDB / MySQL database {alias!r}: not InnoDB: {listed}. Without "
                    "InnoDB there are no transactions and no row locks, so fencing and "
                    "exactly-one-winner acquires do not hold.",
                    hint="Convert the tables (ALTER TABLE ... ENGINE=InnoDB) or set "
                    "default_storage_engine = InnoDB before migrating.",
                    id="django_leases.E019",
                )
            )
        zone = clock.mysql_zone(connection)
        if zone is not None:
            cursor.execute("SELECT CONVERT_TZ('2000-01-01 00:00:00', '+00:00', %s)", [zone])
            if cursor.fetchone()[0] is None:
                messages.append(
                    checks.Error(
                        f"MariaDB / MySQL database {alias!r}: Django stores datetimes there "
                        f"in time zone {zone!r}, which the server's time zone tables do not "
                        "know: the database clock (CONVERT_TZ(UTC_TIMESTAMP(6), ...)) would "
                        "be NULL, and no lease could be taken.",
                        hint="Load the time zone tables (mysql_tzinfo_to_sql /usr/share/zoneinfo"
                        " | mysql mysql), or store datetimes in UTC (no database TIME_ZONE).",
                        id="django_leases.E021",
                    )
                )
            if _has_daylight_saving(zone):
                messages.append(
                    checks.Warning(
                        f"MariaDB / MySQL database {alias!r}: Django stores datetimes there as "
                        f"wall-clock times of {zone!r}, a zone with daylight saving. Its wall "
                        "clock skips an hour each spring and repeats one each autumn: a lease "
                        "or step lease taken just before a change lapses early (another "
                        "holder may take it while the first still works) or an hour late, and "
                        "times in the repeated hour are ambiguous.",
                        hint="Leave DATABASES[...]['TIME_ZONE'] unset (UTC), as Django "
                        "recommends for any database it alone writes.",
                        id="django_leases.W041",
                    )
                )
        messages.extend(_inexact_collations(cursor, connection))
    return messages


def _has_daylight_saving(zone: str) -> bool:
    """Whether time zone ``zone`` (an IANA name) changes its UTC offset in the course of this
    year or the next. A fixed offset (``+02:00``) never does; a name unknown here is E021's
    to report, not this."""
    try:
        info = ZoneInfo(zone)
    except (ValueError, ZoneInfoNotFoundError):
        return False
    year = datetime.now(UTC).year
    offsets = {
        datetime(when, month, 1, tzinfo=info).utcoffset()
        for when in (year, year + 1)
        for month in range(1, 13)
    }
    return len(offsets) > 1


#: How many columns a W022 names before it only counts the rest.
_COLUMNS_SHOWN = 4


def _inexact_collations(cursor: Any, connection: Any) -> list[checks.CheckMessage]:
    """W022: one warning per collation that does not tell every string apart (it ignores case
    or accents, or pads spaces) among the ``CHAR`` / ``VARCHAR`` columns of django-leases'
    tables — lease keys, run and debounce keys, names, delivery ids, queue keys, each
    compared (or made unique) in the database with its column's collation."""
    tables = [model._meta.db_table for model in _our_models()]
    cursor.execute(
        "SELECT COLLATION_NAME, TABLE_NAME, COLUMN_NAME FROM information_schema.COLUMNS "
        "WHERE TABLE_SCHEMA = DATABASE() AND DATA_TYPE IN ('char', 'varchar') "
        f"AND COLLATION_NAME IS NOT NULL AND TABLE_NAME IN ({', '.join(['%s'] * len(tables))}) "
        "ORDER BY COLLATION_NAME, TABLE_NAME, COLUMN_NAME",
        tables,
    )
    by_collation: dict[str, list[str]] = {}
    for collation, table, column in cursor.fetchall():
        by_collation.setdefault(str(collation), []).append(f"{table}.{column}")
    messages: list[checks.CheckMessage] = []
    for collation, columns in by_collation.items():
        if _exact_collation(cursor, connection, collation):
            continue
        shown = ", ".join(columns[:_COLUMNS_SHOWN])
        if len(columns) > _COLUMNS_SHOWN:
            shown += f" and {len(columns) - _COLUMNS_SHOWN} more"
        messages.append(
            checks.Warning(
                f"MariaDB / MySQL database {connection.alias!r}: {shown} compare text with "
                f"collation {collation}, which ignores case or accents or pads spaces: "
                '"a", "A" and "a " would be one lease key, one run key or trigger source, '
                "and a webhook delivery whose id differs from an earlier one only in case "
                "would be dropped as its repeat.",
                hint="Create the database with a binary NO PAD collation (MariaDB "
                "utf8mb4_nopad_bin, MySQL 8 utf8mb4_0900_bin), or convert the "
                "django_leases tables to it.",
                id="django_leases.W022",
            )
        )
    return messages


def _exact_collation(cursor: Any, connection: Any, collation: str) -> bool:
    """Whether ``collation`` tells every distinct string apart (binary and NO PAD)."""
    name = collation.lower()
    if not (name.endswith("_bin") or name == "binary"):
        return False
    if connection.mysql_is_mariadb:
        return "nopad" in name
    cursor.execute(
        "SELECT PAD_ATTRIBUTE FROM information_schema.COLLATIONS WHERE COLLATION_NAME = %s",
        [collation],
    )
    found = cursor.fetchone()
    return bool(found) and str(found[0]).upper() == "NO PAD"


def _check_isolation(alias: str, settings_dict: Mapping[str, Any]) -> list[checks.CheckMessage]:
    level = (settings_dict.get("OPTIONS") or {}).get("isolation_level")
    if level is None:
        return []
    try:
        # deferred: imports psycopg, which a project on another backend need not load
        from django.db.backends.postgresql.psycopg_any import IsolationLevel

        strict = IsolationLevel(level) in (
            IsolationLevel.REPEATABLE_READ,
            IsolationLevel.SERIALIZABLE,
        )
    except (ImportError, ValueError):
        return []
    if not strict:
        return []
    return [
        checks.Warning(
            f"PostgreSQL database {alias!r} runs at isolation level {IsolationLevel(level).name}:"
            " concurrent acquires, renewals and claims raise serialisation errors instead of "
            "answering 'taken' or 'lost'.",
            hint="Use READ COMMITTED (the default) for the django-leases database.",
            id="django_leases.W012",
        )
    ]


def check_webhook_settings(
    declared: Iterable[TriggerDeclaration],
    secrets: object,
    max_body: object,
    workflow_registered: Callable[[str], bool],
    stored: set[str] | None = None,
    enabled: set[str] | None = None,
    unreadable: str = "the credential store could not be read",
    *,
    consult_store: bool = True,
) -> list[checks.CheckMessage]:
    """W008, W009, W014 and E010 for the trigger-source declarations and webhook settings.

    ``consult_store=False`` leaves W008 and W014 out (what the store holds is not known
    without asking the database: :func:`stored_secrets_check` asks it). ``stored``: names
    with a secret in the credential store; ``None`` when the store could not be read,
    ``unreadable`` saying why (W014 then, for each source that has no ``WEBHOOK_SECRETS``
    entry: nothing is known either way). ``enabled``: names of enabled sources. A source
    whose provider registers the webhook itself (GitHub, Stripe) gets its secret at setup, so
    only an enabled one without it is reported; a ``manual`` one needs an operator to store
    it.
    """
    messages: list[checks.CheckMessage] = []
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body <= 0:
        messages.append(
            checks.Error(
                f'DJANGO_LEASES["WEBHOOK_MAX_BODY"] must be a positive int (bytes), '
                f"not {max_body!r}.",
                hint="E.g. 1048576 for 1 MiB.",
                id="django_leases.E010",
            )
        )
    known: Mapping[Any, Any] = secrets if isinstance(secrets, Mapping) else {}
    usable_secrets = isinstance(secrets, Mapping) and all(
        isinstance(key, str) and isinstance(value, str) for key, value in known.items()
    )
    if not usable_secrets:
        messages.append(
            checks.Error(
                'DJANGO_LEASES["WEBHOOK_SECRETS"] must be a dict of source name → secret (str).',
                hint="E.g. {'github-pushes': env('GITHUB_WEBHOOK_SECRET')}.",
                id="django_leases.E010",
            )
        )
    declared = list(declared)
    if usable_secrets and consult_store:
        messages.extend(check_secrets(declared, known, stored, enabled, unreadable))
    for declaration in declared:
        for name in declaration.started_workflows():
            if not workflow_registered(name):
                messages.append(
                    checks.Warning(
                        f"Trigger source {declaration.name!r} starts workflow {name!r}, "
                        "which no loaded code registers: its deliveries will fail and not "
                        "be recorded.",
                        hint=f"Register it with @workflow({name!r}) in an app's workflows.py.",
                        id="django_leases.W009",
                    )
                )
    return messages


def check_secrets(
    declared: Iterable[TriggerDeclaration],
    secrets: Mapping[str, str],
    stored: set[str] | None,
    enabled: set[str] | None,
    unreadable: str,
) -> list[checks.CheckMessage]:
    """W008 and W014 for the declared sources without a ``WEBHOOK_SECRETS`` entry
    (``secrets``), given what the credential store holds (``stored``; ``None``: it could not
    be read, ``unreadable`` saying why) and the enabled sources' names (``enabled``)."""
    messages: list[checks.CheckMessage] = []
    for declaration in declared:
        name = declaration.name
        if secrets.get(name):
            continue
        provider = get_provider(declaration.provider)
        manual = provider is None or not provider.manages_registration
        if stored is None:
            messages.append(_unknown_secret(name, manual, unreadable))
        elif name not in stored and (manual or name in (enabled or set())):
            messages.append(_missing_secret(name, manual))
    return messages


def _missing_secret(name: str, manual: bool) -> checks.CheckMessage:
    """W008: source ``name`` has no signing secret anywhere."""
    hint = (
        f"Store it with manage.py trigger_sources set-secret {name} "
        f'(or credentials.set_secret), or add DJANGO_LEASES["WEBHOOK_SECRETS"][{name!r}].'
        if manual
        else "Disable and enable the source again: its setup stores a new secret."
    )
    return checks.Warning(
        f"Trigger source {name!r} has no signing secret (none is stored): every delivery "
        "to it will be refused with 401.",
        hint=hint,
        id="django_leases.W008",
    )


def _unknown_secret(name: str, manual: bool, unreadable: str) -> checks.CheckMessage:
    """W014: whether source ``name`` has a signing secret cannot be told (``unreadable``)."""
    needs = (
        "A manual source needs one stored by an operator"
        if manual
        else "Its provider's setup stores one when the source is enabled"
    )
    return checks.Warning(
        f"Could not check whether trigger source {name!r} has a signing secret: "
        f"{unreadable}. {needs}.",
        hint="Make the database reachable and apply the migrations (manage.py migrate), "
        "then run manage.py check again. A secret already stored is kept as it is.",
        id="django_leases.W014",
    )


# -- DJANGO_LEASES -------------------------------------------------------------------------------


def _number(value: object, what: str, *, above_zero: bool = True) -> None:
    """An ``int`` or ``float`` (not ``bool``) of seconds, above 0 (or at least 0)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} must be a number of seconds, not {type(value).__name__}")
    seconds(value, what, above_minimum=above_zero)


def _poll_interval(value: object, what: str) -> None:
    """:func:`_number`, at most :data:`~django_leases.conf.MAX_POLL_INTERVAL` (a day)."""
    _number(value, what)
    seconds(value, what, above_minimum=True, maximum=MAX_POLL_INTERVAL)


def _optional(rule: Callable[[object, str], None]) -> Callable[[object, str], None]:
    def check(value: object, what: str) -> None:
        if value is not None:
            rule(value, what)

    return check


def _boolean(value: object, what: str) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{what} must be True or False, not {value!r}")


def _wakeup(value: object, what: str) -> None:
    if value not in ("auto", "poll"):
        raise ValueError(f'{what} must be "auto" or "poll", not {value!r}')


def _api_url(value: object, what: str) -> None:
    if not isinstance(value, str) or not value.startswith(("http://", "https://")):
        raise ValueError(f"{what} must be an http(s) URL, not {value!r}")


def _credential(value: object, what: str) -> None:
    # Never quoted: the value is a token or a key.
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty str, not {type(value).__name__}")


def _secret_keys(value: object, what: str) -> None:
    # Never quoted: the values are keys.
    if find_spec("cryptography") is None:
        raise ValueError(
            f"{what} is set, but cryptography is not installed to use the keys: "
            'pip install "django-leases[webhooks]"'
        )
    # deferred: cryptography is the optional webhooks extra, costly to import
    from cryptography.fernet import Fernet

    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        raise ValueError(f"{what} must be a list of Fernet keys, newest first")
    if not value:
        raise ValueError(f"{what} is empty: nothing could decrypt the stored secrets")
    for position, key in enumerate(value, 1):
        try:
            Fernet(key)
        except (ValueError, TypeError):
            raise ValueError(
                f"{what} item {position} is not a Fernet key (32 bytes, URL-safe base64: "
                "Fernet.generate_key())"
            ) from None


def _stripe_version(value: object, what: str) -> None:
    try:
        check_api_version(value)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def _base_url(value: object, what: str) -> None:

    try:
        check_base_url(value)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def _grace(value: object, what: str) -> None:
    _number(value, what, above_zero=False)  # 0: no grace at all


def _bytes(value: object, what: str) -> None:
    check_byte_limit(value, what)


def _queues(value: object, what: str) -> None:
    """``QUEUES``: queue name -> ``{"concurrency": int ≥ 1, "rate": "N/s|m|h",
    "key_concurrency": int ≥ 1, "key_rate": "N/s|m|h"}`` (each optional)."""
    parse_queues(value)


def check_step_queues(declared: Mapping[str, str], configured: object) -> list[checks.CheckMessage]:
    """E023 for each step function (``declared``: name -> queue) whose queue the
    ``QUEUES`` setting (``configured``) does not name; nothing when the setting itself is
    broken (E016 reports that)."""
    try:
        known = parse_queues(configured)
    except ValueError:
        return []
    messages: list[checks.CheckMessage] = []
    for name, queue in sorted(declared.items()):
        if queue not in known:
            messages.append(
                checks.Error(
                    f"Step function {name!r} names queue {queue!r}, which "
                    f'DJANGO_LEASES["QUEUES"] does not configure: no limit would apply and '
                    f"no worker started with --queue would take its steps.",
                    hint=f'Add DJANGO_LEASES["QUEUES"][{queue!r}] = {{}} (with '
                    f'"concurrency" / "rate" as needed), or name a configured queue '
                    f"(known: {', '.join(sorted(known))}).",
                    id="django_leases.E023",
                )
            )
    return messages


def _lease_ttl(value: object, what: str) -> None:
    renewable_ttl_seconds(value)


def _max_ttl(value: object, what: str) -> None:
    _number(value, what)
    seconds(value, what, maximum=TTL_CEILING)  # beyond it an expiry may not be storable


def _step_ttl(value: object, what: str) -> None:
    ttl_seconds(value)


def _prune(value: object, what: str) -> None:
    if value is not None and not isinstance(value, Mapping):
        raise ValueError(
            f'{what} must be None (no pruning) or a dict such as {{"schedule": "17 * * * *", '
            f'"older_than": timedelta(days=30)}}, not {type(value).__name__} (its keys are '
            "check E031's)"
        )


def _schedules(value: object, what: str) -> None:
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{what} must be a dict of schedule name -> schedule, not {type(value).__name__} "
            "(its entries are check E026's)"
        )


#: The rule each ``DJANGO_LEASES`` key's value must follow (E016): a callable that raises
#: ``ValueError`` saying what is wrong. ``WEBHOOK_MAX_BODY`` and ``WEBHOOK_SECRETS`` are
#: E010's (:func:`check_webhook_settings`).
SETTING_RULES: dict[str, Callable[[object, str], None]] = {
    "DEFAULT_TTL": _lease_ttl,
    "RENEWAL_FLOOR": _number,
    "MAX_TTL": _max_ttl,
    "STEP_LEASE_TTL": _step_ttl,
    "WORKER_POLL_INTERVAL": _optional(_poll_interval),
    "WORKER_WAKEUP": _wakeup,
    "WORKER_SHUTDOWN_GRACE": _grace,
    "HOLD_LEASE_KILL_GRACE": _grace,
    "MAX_EVENT_PAYLOAD": _bytes,
    "BASE_URL": _optional(_base_url),
    "SECRET_KEYS": _optional(_secret_keys),
    "PROVIDER_TIMEOUT": _number,
    "GITHUB_API_URL": _api_url,
    "GITHUB_TOKEN": _optional(_credential),
    "STRIPE_API_URL": _api_url,
    "STRIPE_API_KEY": _optional(_credential),
    "STRIPE_TOLERANCE": _number,
    "STRIPE_API_VERSION": _optional(_stripe_version),
    "TUNED_SQL": _boolean,
    "PREPARED_STATEMENTS": _boolean,
    "SCHEDULES": _schedules,
    "PRUNE": _prune,
    "QUEUES": _queues,
}

#: Keys whose values are secrets: a message about them never quotes the value.
_SECRET_SETTINGS = frozenset({"GITHUB_TOKEN", "STRIPE_API_KEY", "SECRET_KEYS", "WEBHOOK_SECRETS"})


def _meant(key: object, known: Iterable[str]) -> str | None:
    """The known key ``key`` most likely misspells (``difflib``), or ``None``."""
    if not isinstance(key, str):
        return None
    names = list(known)
    upper = key.strip().upper().replace("-", "_").replace(" ", "_")
    if upper in names:
        return upper
    close = difflib.get_close_matches(upper, names, n=1, cutoff=0.6)
    return close[0] if close else None


def check_leases_settings(configured: object) -> list[checks.CheckMessage]:
    """E015 and E016 for ``settings.DJANGO_LEASES`` (``configured``; ``None`` when unset)."""
    if configured is None:
        return []
    if not isinstance(configured, Mapping):
        return [
            checks.Error(
                f"DJANGO_LEASES must be a dict, not {type(configured).__name__}: "
                "every django-leases setting keeps its default.",
                hint='E.g. DJANGO_LEASES = {"DEFAULT_TTL": 30}.',
                id="django_leases.E015",
            )
        ]
    messages: list[checks.CheckMessage] = []
    for key, value in configured.items():
        if key not in DEFAULTS:
            meant = _meant(key, DEFAULTS)
            hint = (
                f"Did you mean {meant!r}?"
                if meant
                else "The keys are listed in the settings reference: "
                + ", ".join(sorted(DEFAULTS))
                + "."
            )
            messages.append(
                checks.Error(
                    f"DJANGO_LEASES has an unknown key {key!r}: django-leases ignores it, "
                    "and the setting it was meant to change keeps its default.",
                    hint=hint,
                    id="django_leases.E015",
                )
            )
            continue
        rule = SETTING_RULES.get(key)
        if rule is None:
            continue
        what = f"DJANGO_LEASES[{key!r}]"
        try:
            rule(value, what)
        except ValueError as exc:
            problem = str(exc)
            if key not in _SECRET_SETTINGS and what not in problem:
                problem = f"{what} = {value!r}: {problem}"
            messages.append(
                checks.Error(
                    problem,
                    hint=f"Fix the value, or remove the key for the default "
                    f"({'unset' if DEFAULTS[key] is None else repr(DEFAULTS[key])}).",
                    id="django_leases.E016",
                )
            )
    return messages + _defaults_refused(configured)


#: The settings that limit the lease TTL settings (:func:`~validation.refused_ttl_settings`).
_TTL_LIMITS = ("MAX_TTL", "RENEWAL_FLOOR")


def _defaults_refused(configured: Mapping[Any, Any]) -> list[checks.CheckMessage]:
    """E016 for a lease TTL setting left at its default that the limits set refuse
    (``{"MAX_TTL": 10}`` refuses the default ``DEFAULT_TTL`` and ``STEP_LEASE_TTL`` of 30 s):
    every hold and every worker would fail. A TTL set in ``configured`` was judged with the
    others; a limit that is itself refused is reported alone."""
    limits = [key for key in _TTL_LIMITS if key in configured]
    for key in limits:
        try:
            SETTING_RULES[key](configured[key], key)
        except ValueError:
            return []  # that limit's own E016 says what to fix first
    if not limits:
        return []
    set_as = ", ".join(f"DJANGO_LEASES[{key!r}] = {configured[key]!r}" for key in limits)
    return [
        checks.Error(
            f"DJANGO_LEASES[{key!r}] is left at its default ({DEFAULTS[key]!r} s), which "
            f"{set_as} refuses: {why}",
            hint=f"Set {key} within the limits, or change {' / '.join(limits)}.",
            id="django_leases.E016",
        )
        for key, why in refused_ttl_settings().items()
        if key not in configured
    ]


def check_schedules(problems: Iterable[str]) -> list[checks.CheckMessage]:
    """E026: one error per schedule problem (``registry.schedule_problems()``)."""
    return [
        checks.Error(
            problem,
            hint='Fix the entry of DJANGO_LEASES["SCHEDULES"] (see the schedules how-to); a '
            "schedule that cannot be read is never synced and never starts a run.",
            id="django_leases.E026",
        )
        for problem in problems
    ]


def check_prune(problems: Iterable[str]) -> list[checks.CheckMessage]:
    """E031: one error per problem of ``DJANGO_LEASES["PRUNE"]``
    (``registry.prune_problems()``)."""
    return [
        checks.Error(
            problem,
            hint='Fix DJANGO_LEASES["PRUNE"] (keys: "schedule" and "older_than", optionally '
            '"batch_size", "timezone", "queue"; see the schedules how-to), or remove it: '
            "until it is usable, no prune runs.",
            id="django_leases.E031",
        )
        for problem in problems
    ]


def check_postgresql_driver(aliases: Iterable[str]) -> list[checks.CheckMessage]:
    """I032: one message for the PostgreSQL databases among ``aliases`` that Django runs on
    psycopg2 (``db.psycopg3`` is false); nothing when every one has psycopg 3."""
    on_psycopg2 = sorted(
        alias
        for alias in aliases
        if connections[alias].vendor == "postgresql" and not db.psycopg3(connections[alias])
    )
    if not on_psycopg2:
        return []
    return [
        checks.Info(
            _(
                "PostgreSQL database(s) %(aliases)s run on psycopg2: django-leases works, but "
                "prepares no statement there and idle workflow workers poll (every "
                "WORKER_POLL_INTERVAL) instead of being woken at once by LISTEN/NOTIFY."
            )
            % {"aliases": ", ".join(repr(alias) for alias in on_psycopg2)},
            hint=_(
                "Install psycopg 3 (pip install 'django-leases[postgres]') for both; to stay on "
                'psycopg2, add "django_leases.I032" to SILENCED_SYSTEM_CHECKS.'
            ),
            id="django_leases.I032",
        )
    ]


#: Providers whose API calls need httpx (the ``webhooks`` extra).
HTTP_PROVIDERS = frozenset({"github", "stripe"})


def missing_webhook_modules() -> list[str]:
    """The distributions of the ``webhooks`` extra (``conf.WEBHOOKS_EXTRA``) not installed."""
    return [name for name in WEBHOOKS_EXTRA if find_spec(name) is None]


def check_webhooks_extra(
    declared: Iterable[TriggerDeclaration], secrets: object, missing: Sequence[str]
) -> list[checks.CheckMessage]:
    """E033: the declared sources that need a ``missing`` module of the ``webhooks`` extra —
    cryptography unless ``secrets`` (``WEBHOOK_SECRETS``) has the source's secret, httpx for
    the ``github`` and ``stripe`` providers — in one message."""
    if not missing:
        return []
    known: Mapping[Any, Any] = secrets if isinstance(secrets, Mapping) else {}
    needed: dict[str, list[str]] = {}
    for declaration in declared:
        wants = []
        if not known.get(declaration.name):
            wants.append("cryptography")
        if declaration.provider in HTTP_PROVIDERS:
            wants.append("httpx")
        for module in wants:
            if module in missing:
                needed.setdefault(module, []).append(declaration.name)
    if not needed:
        return []
    sources = sorted({name for names in needed.values() for name in names})
    return [
        checks.Error(
            _(
                "Trigger source(s) %(sources)s need what the webhooks extra installs, which is "
                "missing: %(modules)s."
            )
            % {
                "sources": ", ".join(repr(name) for name in sources),
                "modules": "; ".join(
                    f"{module} ({WEBHOOKS_EXTRA[module]})" for module in sorted(needed)
                ),
            },
            hint=_('Install it: pip install "django-leases[webhooks]".'),
            id="django_leases.E033",
        )
    ]


def receive_route_missing() -> bool:
    """Whether the URLconf lacks ``django_leases.urls`` (the receive view's named route).
    ``False`` too when the URLconf cannot be loaded at all: Django's own URL checks say so."""
    try:
        reverse("django_leases:receive-webhook", args=["probe"])
    except NoReverseMatch:
        return True
    except Exception:
        return False
    return False


def check_receive_route(
    declared: Iterable[TriggerDeclaration], route_missing: bool
) -> list[checks.CheckMessage]:
    """W040: sources are declared, but ``django_leases.urls`` is not in the URLconf."""
    names = sorted(declaration.name for declaration in declared)
    if not names or not route_missing:
        return []
    return [
        checks.Warning(
            _(
                "Trigger source(s) %(sources)s are declared, but the URLconf does not include "
                "django_leases.urls: they have no URL to receive deliveries on."
            )
            % {"sources": ", ".join(repr(name) for name in names)},
            hint=_(
                "Add path('leases/', include('django_leases.urls')) (any prefix) to your "
                "ROOT_URLCONF."
            ),
            id="django_leases.W040",
        )
    ]


def check_routing(models: Iterable[type[Model]], aliases: set[str]) -> list[checks.CheckMessage]:
    """W011: reads of our models routed elsewhere than their writes."""
    messages: list[checks.CheckMessage] = []
    for model in models:
        read, write = router.db_for_read(model), router.db_for_write(model)
        if write in aliases and read != write:
            messages.append(
                checks.Warning(
                    f"The database router reads {model._meta.label} from {read!r} but writes "
                    f"it to {write!r}: a lagging replica shows lapsed or released leases as "
                    "held (and the reverse).",
                    hint="Route django_leases reads to the database its writes go to.",
                    obj=model,
                    id="django_leases.W011",
                )
            )
    return messages


def _stored_secrets() -> tuple[set[str] | None, set[str] | None, str]:
    """Names with a stored secret and names of enabled sources, or ``(None, None, why)``
    when the database cannot be read (unreachable, not migrated yet, or not allowed here)."""
    alias = router.db_for_read(TriggerSecret)
    try:
        stored = set(TriggerSecret.objects.using(alias).values_list("name", flat=True))
        enabled = set(
            TriggerSource.objects.using(router.db_for_read(TriggerSource))
            .filter(enabled=True)
            .values_list("name", flat=True)
        )
    except Exception as exc:  # any failure only means the store cannot be consulted now
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        shown = f"{type(exc).__name__}: {reason}" if reason else type(exc).__name__
        return None, None, f"the credential store on database {alias!r} could not be read ({shown})"
    return stored, enabled, ""


def django_leases_checks(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The registered entry point: every check above against the running settings."""

    def registered(name: str) -> bool:
        try:
            get_workflow(name)
        except UnknownWorkflowError:
            return False
        return True

    aliases, messages = _write_aliases()
    messages.extend(check_leases_settings(getattr(django_settings, "DJANGO_LEASES", None)))
    messages.extend(
        check_step_queues(
            {name: options.queue for name, options in step_functions().items()},
            leases_settings.QUEUES,
        )
    )
    for alias in sorted(aliases):
        connection = connections[alias]
        messages.extend(check_database_settings(alias, connection.vendor, connection.settings_dict))
    messages.extend(check_postgresql_driver(aliases))
    workflows = router.db_for_write(WorkflowRun)
    if workflows in connections:
        messages.extend(
            check_transactional_steps(
                [name for name, options in step_functions().items() if options.transactional],
                {workflows: (connections[workflows].vendor, connections[workflows].settings_dict)},
            )
        )
    messages.extend(check_routing(_our_models(), aliases))
    messages.extend(check_schedules(schedule_problems()))
    messages.extend(check_prune(prune_problems()))
    declared = declarations()
    messages.extend(
        check_webhooks_extra(declared, leases_settings.WEBHOOK_SECRETS, missing_webhook_modules())
    )
    messages.extend(check_receive_route(declared, bool(declared) and receive_route_missing()))
    messages.extend(
        check_webhook_settings(
            declared,
            leases_settings.WEBHOOK_SECRETS,
            leases_settings.WEBHOOK_MAX_BODY,
            registered,
            consult_store=False,  # the database is stored_secrets_check's
        )
    )
    return messages


def _migrated(alias: str) -> bool | None:
    """Whether django-leases' first migration is applied on ``alias``; ``None`` when the
    database cannot tell (unreachable)."""
    # deferred: the migration machinery, loaded only when a database check runs
    from django.db.migrations.recorder import MigrationRecorder

    try:
        applied = MigrationRecorder(connections[alias]).applied_migrations()
    except Exception:
        return None
    return ("django_leases", "0001_initial") in applied


def stored_secrets_check(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Iterable[str] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    """W008 and W014: whether each declared source without a ``WEBHOOK_SECRETS`` entry has a
    signing secret in the credential store. A database check (Django runs it with
    ``check --database``, ``migrate`` and the test runner, on the databases named): silent
    on a database django-leases' migrations have not reached yet, where ``migrate`` creates
    the store (``check --database`` after it says what is missing)."""
    declared = declarations()
    secrets = leases_settings.WEBHOOK_SECRETS
    if not declared or not databases or not isinstance(secrets, Mapping):
        return []
    alias = router.db_for_read(TriggerSecret)
    if alias not in set(databases) or _migrated(alias) is False:
        return []
    stored, enabled, unreadable = _stored_secrets()
    return check_secrets(declared, secrets, stored, enabled, unreadable)


#: The URL settings check ``--deploy`` wants on https (W034: where providers send
#: deliveries; W035: where the GitHub and Stripe providers send our API tokens).
_DEPLOY_URLS = {
    "BASE_URL": "django_leases.W034",
    "GITHUB_API_URL": "django_leases.W035",
    "STRIPE_API_URL": "django_leases.W035",
}


def check_deploy_urls(configured: object) -> list[checks.CheckMessage]:
    """W034 and W035 for ``settings.DJANGO_LEASES`` (``configured``): a URL setting on plain
    http. Values that are not strings are E016's."""
    values = dict(configured) if isinstance(configured, Mapping) else {}
    messages: list[checks.CheckMessage] = []
    for key, check_id in _DEPLOY_URLS.items():
        value = values.get(key, DEFAULTS[key])
        if not isinstance(value, str) or not value.lower().startswith("http://"):
            continue
        if key == "BASE_URL":
            message = _(
                'DJANGO_LEASES["BASE_URL"] is %(url)r, plain http: trigger sources are '
                "registered at providers with that address, so deliveries and their "
                "signatures would cross the network unencrypted."
            )
        else:
            message = _(
                "DJANGO_LEASES[%(key)r] is %(url)r, plain http: the provider's API token "
                "would be sent over it unencrypted."
            )
        messages.append(
            checks.Warning(
                message % {"key": key, "url": value},
                hint=_("Use an https:// URL in production."),
                id=check_id,
            )
        )
    return messages


def deploy_checks(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """The ``check --deploy`` checks: W034 and W035 (:func:`check_deploy_urls`)."""
    return check_deploy_urls(getattr(django_settings, "DJANGO_LEASES", None))


def workflow_functions_check(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Iterable[str] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    """E013, and E017–W022 on MariaDB / MySQL (:func:`check_mysql_database`).

    Only on a database the routers let django-leases' tables be on
    (:func:`~django_leases.health.holds_tables`).
    E013: on each PostgreSQL database checked that has django-leases' migrations applied,
    the hot-path functions of the running code (``models.workflow.functions`` and
    ``models.lease.lease_functions``) are installed.
    Their names carry a hash of their statements: code whose statements changed without a
    migration that installs them finds none, and workers refuse to start."""
    # deferred: the migration machinery (health loads the executor), only for a database check
    from django.db.migrations.recorder import MigrationRecorder

    from django_leases.health import functions_missing, holds_tables

    messages: list[checks.CheckMessage] = []
    for alias in databases or ():
        if not holds_tables(alias):
            continue  # the routers keep django-leases off it: nothing of ours to check
        connection = connections[alias]
        if connection.vendor == "mysql":
            messages.extend(check_mysql_database(connection))
            continue
        if not db.tuned(connection, "postgresql"):
            continue
        try:
            applied = MigrationRecorder(connection).applied_migrations()
            if ("django_leases", FUNCTIONS_MIGRATION) not in applied:
                continue  # not migrated yet: migrate installs them
            missing = functions_missing(connection)
        except Exception:  # an unreachable database is reported elsewhere
            continue
        if missing is not None:
            messages.append(
                checks.Error(
                    f"The PostgreSQL functions of this version of django-leases are not "
                    f"installed; workers refuse to start. {missing}",
                    id="django_leases.E013",
                )
            )
    return messages


def check_replication(alias: str, warning: str | None) -> list[checks.CheckMessage]:
    """W032 for ``alias`` from :meth:`django_leases.db.Replication.warning`'s text (``None``:
    nothing to report)."""
    if warning is None:
        return []
    return [
        checks.Warning(
            _("Database %(alias)r: %(warning)s.") % {"alias": alias, "warning": warning},
            hint=_(
                "Set synchronous_standby_names and synchronous_commit = on (or remote_apply) "
                "on PostgreSQL, or semi-synchronous replication on MariaDB, or make sure your "
                "failover promotes only a synchronous standby. Silence this check "
                "(SILENCED_SYSTEM_CHECKS) once you have chosen to fail over asynchronously."
            ),
            id="django_leases.W032",
        )
    ]


def replication_checks(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Iterable[str] | None = None,
    **kwargs: Any,
) -> list[checks.CheckMessage]:
    """W032 on each database checked that django-leases writes to: one query of the
    server's replication state (:func:`django_leases.db.replication`)."""
    ours, _errors = _write_aliases()
    messages: list[checks.CheckMessage] = []
    for alias in databases or ():
        if alias not in ours:
            continue
        try:
            state = db.replication(connections[alias])
        except Exception:  # an unreachable database is reported elsewhere
            continue
        messages.extend(check_replication(alias, None if state is None else state.warning()))
    return messages
