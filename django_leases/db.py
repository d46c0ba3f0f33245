"""The database layer below the models: routed QuerySets, the one switch between the portable
ORM path and tuned SQL, prepared statements, and closing a thread's connections.

**The switch.** A rule of the models (``Lease.objects.acquire``, a step's fenced write…) is
written once as portable ORM code and, where a vendor gives a faster way, once as a tuned
statement beside it in the same method::

    if db.tuned(connection, "postgresql"):
        ...  # the tuned statement (django_leases.workflows.sql, or the model module's own)
    else:
        ...  # the portable ORM path, with the same rules

:func:`tuned` is the only place that decides: ``DJANGO_LEASES["TUNED_SQL"]`` (default
``True``) and the vendors the caller names. With ``TUNED_SQL = False`` every rule takes its
portable path on every database; the test suite runs the conformance suites on PostgreSQL
both ways, so the portable path meets real row locks too.

**Prepared statements.** Django binds parameters on the client, so PostgreSQL parses and
plans every statement it receives. :func:`cursor` gives the tuned statements a cursor that
has the server prepare them instead (psycopg's ``prepare=True``), where that is safe:

* on PostgreSQL with psycopg 3 (:func:`psycopg3`; Django's psycopg2 backend has no
  server-side binding, so nothing is prepared there), outside ``transaction.atomic()`` (a
  statement that fails inside a transaction would abort the caller's transaction);
* unless ``DJANGO_LEASES["PREPARED_STATEMENTS"]`` is ``False``, or the database's
  ``DISABLE_SERVER_SIDE_CURSORS`` is ``True`` (Django's documented setting for a pooler in
  transaction mode, such as PgBouncer before 1.21, which cannot keep prepared statements);
* only on a direct connection: once per alias and process, the port the client connected to
  is compared with the one the server listens on, and a difference (a pooler in between)
  stops preparing on the alias — behind a transaction-mode pooler another client's prepared
  statement may carry the name psycopg gives ours, and would run with our parameters;
* and until a statement fails because the server does not know (or already knows) its
  prepared statement, which is what a transaction-mode pooler does: prepared statements are
  then switched off for that database alias for the life of the process (logged once), and
  the statement is sent again unprepared. Nothing ran the first time, so nothing runs twice.

**Drivers.** Django's PostgreSQL backend runs on psycopg 3 when it is installed, else on
psycopg2; :func:`psycopg3` tells which. Both are supported: with psycopg2 no statement is
prepared and idle workers poll instead of being woken by LISTEN/NOTIFY (the listener is a
psycopg 3 connection), which system check ``django_leases.I032`` says once.

**Hot statements.** :func:`hot_fetchone` runs the lease operations' one statement each (calls
of the PL/pgSQL functions of the lease functions migration,
``models.lease.LEASE_FUNCTIONS_MIGRATION``, whose plans PostgreSQL caches per session without
any prepared statement, so nothing depends on a pooler) on one psycopg cursor kept per
connection, with the checks Django's cursor makes, instead of a new cursor and wrapper per
call.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast

from django.db import connections, models, router, transaction
from django.db.utils import DatabaseError, InterfaceError, OperationalError

from django_leases.conf import leases_settings
from django_leases.frozen import frozen
from django_leases.process import TIMERS

if TYPE_CHECKING:
    # deferred: psycopg is loaded only on a PostgreSQL database that uses it
    import psycopg
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.utils import CursorWrapper

logger = logging.getLogger("django_leases.db")

#: What a statement raises when the database fails it: a ``DatabaseError``, or an
#: ``InterfaceError`` (a connection the driver found closed), which Django does not count
#: among the former.
DATABASE_FAULTS = (DatabaseError, InterfaceError)

#: Vendors that have tuned statements for at least one rule.
TUNED_VENDORS = frozenset({"postgresql", "sqlite"})


#: MariaDB / MySQL error numbers of a deadlock and of a lock wait that timed out: InnoDB rolls
#: the whole transaction back (racing inserts of one unique key deadlock there, each keeping a
#: shared lock on the winner's key after its duplicate-key error).
_MYSQL_RETRYABLE = (1213, 1205)


#: PostgreSQL's SQLSTATE for a write refused in a read-only transaction (a hot standby,
#: ``default_transaction_read_only``), and MariaDB / MySQL's error numbers for it (a read-only
#: transaction; a server started ``--read-only``, whose error also names the option).
_READ_ONLY_SQLSTATE = "25006"
_MYSQL_READ_ONLY_TRANSACTION = 1792
_MYSQL_OPTION_PREVENTS = 1290


def refused_as_read_only(exc: BaseException) -> bool:
    """Whether ``exc`` is the database refusing a write because it is read-only: a
    PostgreSQL hot standby or ``default_transaction_read_only``, a MariaDB / MySQL
    read-only transaction or ``--read-only`` server, a SQLite file opened read-only."""
    cause = exc.__cause__ or exc
    if _READ_ONLY_SQLSTATE in (getattr(cause, "sqlstate", None), getattr(cause, "pgcode", None)):
        return True
    code = exc.args[0] if exc.args else None
    if code == _MYSQL_READ_ONLY_TRANSACTION or "attempt to write a readonly database" in str(exc):
        return True  # the latter: SQLite's, for a read-only file or query_only
    return code == _MYSQL_OPTION_PREVENTS and "read-only" in str(exc)


#: PostgreSQL's SQLSTATE for "function … does not exist" (``undefined_function``).
_UNDEFINED_FUNCTION_SQLSTATE = "42883"


def undefined_function(exc: BaseException) -> bool:
    """Whether ``exc`` (a Django ``DatabaseError``) is PostgreSQL saying a called function
    does not exist: one of our versioned functions dropped, or not installed yet."""
    cause = exc.__cause__ or exc
    states = (getattr(cause, "sqlstate", None), getattr(cause, "pgcode", None))
    return _UNDEFINED_FUNCTION_SQLSTATE in states


def functions_gone(exc: BaseException, alias: str, gone: set[str], warning: str) -> None:
    """For ``exc`` saying a called function does not exist (:func:`undefined_function`):
    record ``alias`` in ``gone`` (the caller's set of aliases whose calls take plain
    statements from then on) and, the first time, log ``warning`` (``%(alias)r`` and
    ``%(error)s`` filled in). Raises ``exc`` itself for any other error."""
    if not undefined_function(exc):
        raise exc
    if alias not in gone:
        gone.add(alias)
        logger.warning(warning, {"alias": alias, "error": exc})


def read_only_reason(connection: BaseDatabaseWrapper) -> str | None:
    """Why ``connection``'s database refuses writes — a PostgreSQL standby in recovery or a
    read-only session, a MariaDB / MySQL read-only session, SQLite's ``query_only`` — or
    ``None`` when it takes them. One query; a database error propagates."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_is_in_recovery(), current_setting('transaction_read_only')")
            recovery, read_only = cursor.fetchone()
            if recovery:
                return "it is a standby in recovery (pg_is_in_recovery())"
            if read_only == "on":
                return "its sessions are read-only (default_transaction_read_only)"
        elif connection.vendor == "mysql":
            # MariaDB names it tx_read_only; MySQL 8, transaction_read_only.
            mariadb = getattr(connection, "mysql_is_mariadb", True)
            variable = "tx_read_only" if mariadb else "transaction_read_only"
            cursor.execute(f"SELECT @@{variable}")
            if int(cursor.fetchone()[0]):
                return f"its sessions are read-only ({variable})"
        elif connection.vendor == "sqlite":
            cursor.execute("PRAGMA query_only")
            if int(cursor.fetchone()[0]):
                return "it is opened read-only (PRAGMA query_only)"
    return None


def rolled_back_whole(connection: BaseDatabaseWrapper, exc: BaseException) -> bool:
    """Whether ``exc``, raised on ``connection``, is a MariaDB / MySQL deadlock or lock-wait
    timeout, after which the server rolled the whole transaction back: a caller that owns
    the transaction (it was not inside another) may run it again from its start."""
    code = exc.args[0] if exc.args else None
    return connection.vendor == "mysql" and code in _MYSQL_RETRYABLE


def outside_transactions(connection: BaseDatabaseWrapper) -> bool:
    """Whether the caller holds no transaction on ``connection``: in no ``atomic()`` block,
    and not in a manual one either (``transaction.set_autocommit(False)``). Connecting afresh
    or running a transaction again from its start loses nothing of the caller's then."""
    if connection.in_atomic_block:
        return False
    # Not connected yet: no transaction (set_autocommit(False) connects first).
    return connection.connection is None or bool(connection.autocommit)


#: How many times :func:`again_after_whole_rollback` runs a transaction in all.
WHOLE_ROLLBACK_ROUNDS = 5

_T = TypeVar("_T")


def again_after_whole_rollback(
    alias: str, run: Callable[[], _T], rounds: int = WHOLE_ROLLBACK_ROUNDS
) -> _T:
    """Call ``run`` — a function of no arguments that runs one whole transaction of its own
    on database ``alias`` (``str``) and returns its result — and call it again, up to
    ``rounds`` (``int`` ≥ 1) calls in all, each time MariaDB / MySQL rolled that transaction
    back whole (:func:`rolled_back_whole`: a deadlock or lock-wait timeout, typically with a
    concurrent writer of the same unique key). Only when the caller holds no transaction on
    ``alias`` (:func:`outside_transactions`): inside the caller's, the rollback took the
    caller's work too, so the error is raised at once. Returns what ``run`` returned.

    Raises:
        OperationalError: ``run``'s, when it is not such a rollback, when the caller is in
            a transaction, or on the last round.
        Exception: whatever else ``run`` raises, at once.
    """
    connection = connections[alias]
    owned = outside_transactions(connection)
    for round_ in range(1, rounds):
        try:
            return run()
        except OperationalError as exc:
            if not (owned and rolled_back_whole(connection, exc)):
                raise
            logger.debug("transaction rolled back whole on %r (round %d): again", alias, round_)
    return run()


def tuned(connection: BaseDatabaseWrapper, *vendors: str) -> bool:
    """Whether a rule takes its tuned statement on ``connection``: ``TUNED_SQL`` is on and the
    connection's vendor is one of ``vendors`` (the vendors the statement is written for)."""
    return bool(leases_settings.TUNED_SQL) and connection.vendor in vendors


@functools.cache
def _django_uses_psycopg3() -> bool:
    # Django's own choice (psycopg 3 if importable, else psycopg2), made once per process.
    # deferred: imports psycopg (or psycopg2): only asked on a PostgreSQL database
    from django.db.backends.postgresql.psycopg_any import is_psycopg3

    return bool(is_psycopg3)


def psycopg3(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` is PostgreSQL through psycopg 3 (``False`` on psycopg2 and on
    every other vendor). Without psycopg 3 nothing is prepared (:func:`prepares`) and
    workers poll (``workflows.wakeup.listens``)."""
    return connection.vendor == "postgresql" and _django_uses_psycopg3()


_M = TypeVar("_M", bound=models.Model)


class RoutedQuerySet(models.QuerySet[_M]):
    """A QuerySet whose domain methods run on the database the router picks for writes (or
    the one ``using()`` / ``db_manager()`` named)."""

    def write_alias(self) -> str:
        """The database alias this QuerySet's writes go to."""
        # _db is the alias using() set: Django's own attribute, not in the stubs.
        return self._db or router.db_for_write(self.model)  # type: ignore[attr-defined]

    def connection(self) -> BaseDatabaseWrapper:
        """The connection (of the calling thread) for :meth:`write_alias`."""
        return connections[self.write_alias()]

    def rows(self) -> models.QuerySet[_M]:
        """Every row, on :meth:`write_alias`, with no filter of this QuerySet applied."""
        return self.model._default_manager.using(self.write_alias()).all()

    def table(self) -> str:
        """The model's table name, quoted for :meth:`connection`."""
        return str(self.connection().ops.quote_name(self.model._meta.db_table))


_QS = TypeVar("_QS", bound=models.QuerySet[Any])


#: Django's warning that a database ignores the conditions of partial indexes (MariaDB,
#: MySQL): ``Index(condition=...)`` is then created as a full index.
PARTIAL_INDEX_WARNING = "models.W037"


def without_partial_index_warning(messages: list[Any]) -> list[Any]:
    """``messages`` (a model's system check messages) without :data:`PARTIAL_INDEX_WARNING`.

    For django-leases' own models only: their partial indexes narrow what PostgreSQL and
    SQLite index to the rows the hot queries read; where conditions are ignored the full
    index serves the same queries (``docs/operations/backends.md``), so the warning gives an
    operator nothing to do. Your models' warnings are untouched."""
    return [message for message in messages if message.id != PARTIAL_INDEX_WARNING]


def for_update(qs: _QS, alias: str) -> _QS:
    """``qs`` locking its rows; ``FOR NO KEY UPDATE`` where the database has it (it does not
    block the key-share lock an insert of a row referencing one of them takes)."""
    if connections[alias].features.has_select_for_no_key_update:
        return qs.select_for_update(no_key=True)
    return qs.select_for_update()


def disown_after_fork(wrapper: BaseDatabaseWrapper) -> None:
    """In a forked child, for a connection the parent opened (``wrapper``, a Django
    connection): its socket, the parent's session copied by the fork, is pointed at
    ``/dev/null`` in this process, so that nothing the child does with the copy — a close,
    a collected object — reaches the parent's session. Nothing for SQLite or a closed
    connection."""
    raw = wrapper.connection
    if raw is None or wrapper.vendor == "sqlite":
        return
    try:
        fd = int(raw.fileno())  # psycopg 3, psycopg2 and mysqlclient all have it
    except Exception:  # already unusable: nothing to protect
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


# -- prepared statements ------------------------------------------------------------------------

_unprepared_lock = threading.Lock()
#: Aliases on which a pooler refused a prepared statement (for the life of the process).
_unprepared: set[str] = set()
#: Aliases whose connections were found to reach the server directly (``True``) or through
#: a proxy (``False``), by :func:`_behind_a_proxy`.
_direct: dict[str, bool] = {}

#: SQLSTATEs of "prepared statement does not exist" and "... already exists".
_POOLER_SQLSTATES = frozenset({"26000", "42P05"})


def prepares(connection: BaseDatabaseWrapper) -> bool:
    """Whether :func:`cursor` has the server prepare statements on ``connection`` now (see
    the module docstring for the rules)."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return False
    if not leases_settings.PREPARED_STATEMENTS or not psycopg3(connection):
        return False
    if connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        return False
    with _unprepared_lock:
        if connection.alias in _unprepared:
            return False
        known = _direct.get(connection.alias)
    if known is not None:
        return known
    return not _behind_a_proxy(connection)


def _behind_a_proxy(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` reaches PostgreSQL through something in between (a pooler):
    the port the client connected to is not the one the server listens on. Asked once per
    alias and process; a proxy found stops preparing on the alias for good (said once).

    A pooler in transaction mode hands each transaction to any server connection, where
    another client's prepared statement may carry the name psycopg gives ours (``_pg3_0``,
    ``_pg3_1``…): the server would run *that* statement with our parameters. Waiting for a
    refusal is not enough, so preparing needs a direct connection, found up front. A pooler
    listening on the server's own port number (on another host) is not seen: declare it
    with ``DISABLE_SERVER_SIDE_CURSORS``, as Django asks."""
    client_port, server_port = _ports(connection)
    direct = client_port == server_port
    with _unprepared_lock:
        first = connection.alias not in _direct
        _direct[connection.alias] = direct
        if not direct:
            _unprepared.add(connection.alias)
    if first and not direct:
        # Which mode the pooler is in cannot be seen from here: the advice is for the one
        # that needs a setting, and says that the others need none.
        logger.warning(
            "Database %r is reached on port %s and the server listens on %s: a pooler or a "
            "tunnel in between? django-leases prepares no statements on it. A pooler in "
            "transaction mode: set DISABLE_SERVER_SIDE_CURSORS = True (workers then poll "
            "instead of LISTEN). In session mode, or through a tunnel: nothing to set",
            connection.alias,
            client_port,
            server_port,
        )
    return not direct


def _pooler_refused(exc: BaseException) -> bool:
    cause = exc.__cause__ or exc
    return getattr(cause, "sqlstate", None) in _POOLER_SQLSTATES


def _stop_preparing(connection: BaseDatabaseWrapper, exc: BaseException) -> None:
    with _unprepared_lock:
        first = connection.alias not in _unprepared
        _unprepared.add(connection.alias)
    if first:
        logger.warning(
            "Database %r refused a prepared statement (%s): a pooler in transaction mode? "
            "django-leases sends its statements unprepared on it from now on; set "
            "DISABLE_SERVER_SIDE_CURSORS = True for it (or DJANGO_LEASES"
            '["PREPARED_STATEMENTS"] = False) to say so up front',
            connection.alias,
            exc,
        )


def _ports(connection: BaseDatabaseWrapper) -> tuple[int, int]:
    """The port ``connection``'s client connected to, and the one its server listens on."""
    connection.ensure_connection()
    client_port = int(connection.connection.info.port)
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('port')::int")
        server_port = int(cursor.fetchone()[0])
    return client_port, server_port


class _Statements:
    """What :func:`cursor` yields: ``execute`` sends one statement, prepared where
    :func:`prepares` allows, and the rows are read from it as from a DB-API cursor."""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self._connection = connection
        self._cursor: CursorWrapper | None = None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> _Statements:
        """Send ``sql`` with ``params`` (``%s`` placeholders); returns ``self``."""
        connection = self._connection
        self.close()
        if prepares(connection):
            try:
                self._cursor = _preparing_cursor(connection)
                self._cursor.execute(sql, params)
                return self
            except DatabaseError as exc:
                if not _pooler_refused(exc):
                    raise
                _stop_preparing(connection, exc)
                self.close()
        self._cursor = connection.cursor()
        self._cursor.execute(sql, params)
        return self

    def _current(self) -> CursorWrapper:
        if self._cursor is None:
            raise RuntimeError("no statement was executed")
        return self._cursor

    def fetchone(self) -> Any:
        return self._current().fetchone()

    def fetchall(self) -> list[Any]:
        return list(self._current().fetchall())

    @property
    def rowcount(self) -> int:
        return int(self._current().rowcount)

    def close(self) -> None:
        if self._cursor is not None:
            self._cursor.close()
            self._cursor = None


@functools.cache
def _preparing_class() -> type[psycopg.Cursor[Any]]:
    # deferred: psycopg is loaded only on a PostgreSQL database that uses it
    import psycopg

    class PreparingCursor(psycopg.Cursor[Any]):
        """A server-binding cursor whose every statement is prepared on the server."""

        def execute(
            self, query: Any, params: Any = None, *, prepare: bool | None = None, **kwargs: Any
        ) -> Any:
            # Django connects with prepare_threshold=None, which psycopg reads as "never
            # prepare" even when asked to; lifted for this statement only (Django's own
            # client-side-binding cursors never prepare anyway).
            owner = self.connection
            threshold = owner.prepare_threshold
            if threshold is None:
                owner.prepare_threshold = 2**31 - 1
            try:
                done = super().execute(query, params, prepare=True, **kwargs)
            finally:
                owner.prepare_threshold = threshold
            if self._query is None:  # what Django logs the statement as (DEBUG, tests)
                with contextlib.suppress(Exception):
                    self._query = self._convert_query(query, params)
            return done

    return PreparingCursor


def _preparing_cursor(connection: BaseDatabaseWrapper) -> CursorWrapper:
    """A Django cursor (instrumented as Django's own: ``execute_wrapper``, query logging)
    around a psycopg server-binding cursor that prepares every statement it sends."""
    connection.ensure_connection()
    raw = _preparing_class()(connection.connection)
    # Django's private wrapping of a new cursor (not in the stubs): the same as its own cursors.
    return cast("CursorWrapper", connection._prepare_cursor(raw))  # type: ignore[attr-defined]


@contextmanager
def cursor(connection: BaseDatabaseWrapper) -> Iterator[_Statements]:
    """A cursor for tuned statements on ``connection``: prepared on the server where
    :func:`prepares` allows, Django's own cursor otherwise. Database errors propagate (as
    Django's ``DatabaseError`` subclasses), but for a pooler's refusal of a prepared
    statement, which is handled here."""
    statements = _Statements(connection)
    try:
        yield statements
    finally:
        statements.close()


# -- hot statements -----------------------------------------------------------------------------


def _hot_cursor(connection: BaseDatabaseWrapper) -> Any:
    """The psycopg cursor kept on ``connection`` for :func:`hot_fetchone` (one per open
    database connection and time zone, so a reconnect or a changed ``TIME_ZONE`` makes a new
    one), set up as Django sets up its own cursors."""
    raw = connection.connection
    zone = connection.timezone
    kept = getattr(connection, "_dl_hot_cursor", None)
    if kept is not None and kept[0] is raw and kept[1] is zone:
        return kept[2]
    # Django's create_cursor, without the wrapper: its cursor class (client-side binding or
    # not, as OPTIONS say) and the time zone its timestamps are read in.
    cursor = connection.create_cursor()
    connection._dl_hot_cursor = (raw, zone, cursor)  # type: ignore[attr-defined]
    return cursor


def hot_fetchone(connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]) -> Any:
    """Run one hot statement on ``connection`` (PostgreSQL) and return its first row (a
    tuple, or ``None``).

    The lease operations call this once per acquire, refresh and release, where Django's own
    cursor (a new psycopg cursor and its wrapper per call) costs about as much client CPU as
    the statement. It does what Django's cursor does that matters — the async-safety check,
    the connection made or replaced (``CONN_MAX_AGE``, ``CONN_HEALTH_CHECKS``; and, outside
    a transaction, one the driver already found closed), the thread
    check, the refusal inside a broken ``atomic()`` block, Django's database exceptions (and
    the connection marked unusable after one) — on one psycopg cursor kept for the
    connection. While Django logs queries (``DEBUG``, ``CaptureQueriesContext``) or an
    ``execute_wrapper`` is installed, the statement goes through Django's cursor instead, so
    it is logged and wrapped as every other. Raises Django's ``DatabaseError`` subclasses.
    """
    if connection.queries_logged or connection.execute_wrappers:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchone()
    connection.close_if_health_check_failed()
    raw = connection.connection
    if raw is not None and getattr(raw, "closed", False) and outside_transactions(connection):
        # A connection the driver already found dead (psycopg2 keeps it, closed, and
        # Django reconnects only when it has none): outside a transaction nothing is lost
        # by connecting afresh.
        connection.close()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    if connection.needs_rollback:
        connection.validate_no_broken_transaction()
    with connection.wrap_database_errors:  # a dead connection fails here already
        cursor = _hot_cursor(connection)
        cursor.execute(sql, params)
        return cursor.fetchone()


# -- bounded statements -------------------------------------------------------------------------


def _socket_of(connection: BaseDatabaseWrapper) -> int:
    """The socket (file descriptor) of ``connection``'s open connection, ``-1`` when there is
    none. Asked on the thread that owns the connection (mysqlclient refuses ``fileno()`` from
    another while a statement runs)."""
    raw = getattr(connection, "connection", None)
    pgconn = getattr(raw, "pgconn", None)  # psycopg 3
    if pgconn is not None:
        return int(getattr(pgconn, "socket", -1))
    try:  # psycopg2, mysqlclient: the connection's fileno()
        return -1 if raw is None or getattr(raw, "closed", False) else int(raw.fileno())
    except Exception:
        return -1


def _cut(fd: int, alias: str, why: str) -> None:
    """Shut socket ``fd`` of database ``alias``'s connection down (both ways), from another
    thread: the statement its owner waits on fails at once with a connection error; the
    owner reconnects later."""
    logger.warning("Cutting database connection %r: %s", alias, why)
    try:
        with socket.socket(fileno=os.dup(fd)) as dup:
            dup.shutdown(socket.SHUT_RDWR)
    except OSError:
        logger.debug("cutting connection %r failed", alias, exc_info=True)


class Bound:
    """What :func:`bounded` yields: ``cut`` turns ``True`` when it cut the connection."""

    def __init__(self) -> None:
        self.cut = False


@contextmanager
def bounded(connection: BaseDatabaseWrapper, seconds: float, what: str) -> Iterator[Bound]:
    """Give the statements of the block at most ``seconds`` (``float``) on ``connection``.

    A server that stops answering — a black-holed network, a frozen server — leaves a client
    waiting for a reply for as long as TCP keeps the connection, which can be many minutes.
    Past ``seconds``, the connection's socket is shut down from the process's timer thread,
    so the waiting statement raises a connection error (``django.db.OperationalError`` /
    ``InterfaceError``) and the caller handles it as any lost connection. ``what`` names the
    statements for the log. PostgreSQL and MariaDB / MySQL (SQLite has no network). A
    connection attempt itself is bounded by ``connect_timeout`` only (psycopg's default is
    130 s; ``OPTIONS["connect_timeout"]`` sets it, on MariaDB too, whose client otherwise
    waits on an unanswering server for as long as TCP tries).
    """
    bound = Bound()
    if connection.vendor not in ("postgresql", "mysql"):
        yield bound
        return
    connection.ensure_connection()
    fd = _socket_of(connection)
    if fd < 0:
        yield bound
        return
    lock = threading.Lock()
    running = [True]

    def cut() -> None:
        with lock:  # never once the block is over: the connection may be in use again
            if running[0]:
                bound.cut = True
                _cut(fd, connection.alias, f"{what} had no answer within {seconds:g} s")

    timer = TIMERS.at(time.monotonic() + seconds, cut)
    try:
        yield bound
    finally:
        with lock:
            running[0] = False
        timer.cancel()


# -- replication --------------------------------------------------------------------------------

#: PostgreSQL ``synchronous_commit`` values under which a commit waits for the synchronous
#: standbys (``remote_write``: received, not yet flushed there; ``on``: flushed;
#: ``remote_apply``: applied).
WAITING_COMMITS = frozenset({"on", "remote_apply", "remote_write"})

_PG_REPLICATION = (
    "SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit'), "
    "r.application_name, r.sync_state, a.datid IS NOT NULL "
    "FROM (SELECT 1) AS one LEFT JOIN pg_stat_replication AS r ON true "
    "LEFT JOIN pg_stat_activity AS a ON a.pid = r.pid"
)

_MARIADB_REPLICATION = (
    "SHOW GLOBAL STATUS WHERE Variable_name IN "
    "('Slaves_connected', 'Rpl_semi_sync_master_status', 'Rpl_semi_sync_master_clients')"
)


@frozen
class Replication:
    """What a primary says of the standbys (replicas) streaming from it now: see
    :func:`replication`.

    Attributes:
        standbys: how many are connected (``int``; logical replication subscribers are left
            out where the server shows which they are).
        asynchronous: how many of them a commit does not wait for (``int``): a promotion of
            one of them loses the commits it had not received yet.
        names: the ``application_name`` of each asynchronous one where the server shows it.
        why: what makes them asynchronous (the settings), or why that is not known.
        known: ``False`` when the server does not show which standbys are synchronous (a
            role without ``pg_read_all_stats``): ``asynchronous`` is then 0.
    """

    standbys: int
    asynchronous: int
    names: tuple[str, ...] = ()
    why: str = ""
    known: bool = True

    def warning(self) -> str | None:
        """The warning an operator should read (``str``), or ``None`` when every connected
        standby is synchronous (or none is connected)."""
        if not self.asynchronous:
            return None
        which = f" ({', '.join(self.names)})" if self.names else ""
        return (
            f"{self.asynchronous} of {self.standbys} standby(s) replicate asynchronously"
            f"{which}: {self.why}. Promoting one loses the commits it had not received: "
            "lease grants, releases and fenced writes the holders were told had succeeded. "
            "Tokens stay unique across the promotion on PostgreSQL (their epoch rises with "
            "the timeline), but a holder may be told it holds a lease the new primary never "
            "heard of. Fail over only to a synchronous standby, or make them synchronous "
            "(synchronous_standby_names, synchronous_commit = on or remote_apply); see "
            "docs/operations/replication.md"
        )


def replication(connection: BaseDatabaseWrapper) -> Replication | None:
    """Ask the server of ``connection`` which standbys stream from it now and whether its
    commits wait for them: one query. ``None`` where it cannot say (SQLite; MySQL, whose
    status does not count replicas; a server that refused the query).

    PostgreSQL: the physical WAL senders of ``pg_stat_replication``; a commit waits for a
    standby when ``synchronous_standby_names`` names it (``sync_state`` ``sync`` or
    ``quorum``) and the connection's own ``synchronous_commit`` is one of
    :data:`WAITING_COMMITS`. A standby ``potential`` or ``async`` is not waited for.
    MariaDB: ``Slaves_connected`` replicas, of which ``Rpl_semi_sync_master_clients`` are
    semi-synchronous while ``Rpl_semi_sync_master_status`` is ON (it turns OFF, the primary
    going on alone, after ``rpl_semi_sync_master_timeout``)."""
    try:
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(_PG_REPLICATION)
                rows = cursor.fetchall()
            return _pg_replication(rows)
        if connection.vendor == "mysql" and getattr(connection, "mysql_is_mariadb", False):
            with connection.cursor() as cursor:
                cursor.execute(_MARIADB_REPLICATION)
                status = {str(name): str(value) for name, value in cursor.fetchall()}
            return _mariadb_replication(status)
    except DatabaseError:
        logger.debug("reading the replication state of %r failed", connection.alias, exc_info=True)
    return None


def _pg_replication(rows: Sequence[Sequence[Any]]) -> Replication:
    names_setting, commit = str(rows[0][0]).strip(), str(rows[0][1])
    senders = [row for row in rows if row[2] is not None]
    known = all(row[3] is not None for row in senders)
    standbys = [row for row in senders if not row[4]] if known else senders
    if not standbys:
        return Replication(0, 0)
    every = tuple(str(row[2]) for row in standbys)
    if not names_setting:
        why = "synchronous_standby_names is empty"
        if not known:
            why += " (WAL senders counted, logical subscribers among them if any)"
        return Replication(len(standbys), len(standbys), every, why, known)
    if commit not in WAITING_COMMITS:
        return Replication(
            len(standbys),
            len(standbys),
            every,
            f"synchronous_commit = {commit} on this connection: commits do not wait for any",
            known,
        )
    if not known:
        return Replication(
            len(standbys),
            0,
            why="which standbys are synchronous is shown only to a role with pg_read_all_stats",
            known=False,
        )
    late = tuple(str(row[2]) for row in standbys if row[3] in ("async", "potential"))
    why = f"synchronous_standby_names = {names_setting!r} does not cover them"
    return Replication(len(standbys), len(late), late, why)


def _mariadb_replication(status: dict[str, str]) -> Replication | None:
    if "Slaves_connected" not in status:
        return None
    replicas = int(status["Slaves_connected"] or 0)
    if not replicas:
        return Replication(0, 0)
    if status.get("Rpl_semi_sync_master_status", "OFF").upper() != "ON":
        return Replication(replicas, replicas, why="semi-synchronous replication is off")
    clients = int(status.get("Rpl_semi_sync_master_clients") or 0)
    late = max(0, replicas - clients)
    return Replication(replicas, late, why="they are not semi-synchronous replicas")


def transaction_failed(connection: BaseDatabaseWrapper) -> bool:
    """Whether the transaction open on ``connection`` can only be rolled back: marked for
    rollback by Django (an exception left an inner ``atomic`` block), or — PostgreSQL — a
    statement in it failed and was caught without a savepoint (every later statement would
    fail "current transaction is aborted"). ``False`` outside a transaction."""
    if not connection.in_atomic_block:
        return False
    if connection.needs_rollback:
        return True
    raw = connection.connection
    if connection.vendor != "postgresql" or raw is None:
        return False
    # libpq's PQTRANS_INERROR (3), as psycopg 3 and psycopg2 report it.
    if psycopg3(connection):
        return int(raw.info.transaction_status) == 3
    return int(raw.get_transaction_status()) == 3


def after_commit(func: Callable[[], object], using: str) -> None:
    """Call ``func`` once the transaction open on database ``using`` commits: at once in
    autocommit, never if it rolls back (``transaction.on_commit``). Under manual transaction
    management (``set_autocommit(False)`` outside ``atomic()``), where Django keeps no
    ``on_commit`` callbacks, at once as well: what was written is not known to commit, but a
    statement of ours must not fail for it."""
    connection = connections[using]
    if connection.in_atomic_block or connection.get_autocommit():
        transaction.on_commit(func, using=using)
    else:
        func()


# -- threads ------------------------------------------------------------------------------------


def close_thread_connections() -> None:
    """Close every database connection the calling thread opened (Django's connections are
    per thread); errors while closing are logged and ignored. For threads that end (renewal,
    worker threads) and for a thread that lost its connection (the next query reconnects)."""
    for conn in connections.all(initialized_only=True):
        try:
            conn.close()
        except Exception:
            logger.debug("closing connection %r failed", conn.alias, exc_info=True)


__all__ = [
    "DATABASE_FAULTS",
    "TUNED_VENDORS",
    "WAITING_COMMITS",
    "Bound",
    "Replication",
    "RoutedQuerySet",
    "bounded",
    "close_thread_connections",
    "cursor",
    "hot_fetchone",
    "prepares",
    "psycopg3",
    "replication",
    "transaction_failed",
    "tuned",
]
