"""The ``Lease`` model and its QuerySet: acquire, refresh, release, current, fenced.

Rules (DESIGN §4, reference lease-service tests L1–L8):

* a new key is granted with token 1;
* the live holder re-acquiring keeps its token and gets a new expiry;
* another holder is refused while the lease is live (``acquire`` never waits);
* a lapsed or released lease passes to *any* holder, the old one included, with token + 1;
* ``refresh`` and ``release`` act only when key, holder **and** token match; a lapsed lease
  cannot be refreshed even if nobody took it; a stale release is a silent no-op;
* every "live / lapsed" decision is made on the database clock inside the statement.

Each rule is written twice, side by side in its method behind :func:`django_leases.db.tuned`:
on PostgreSQL and SQLite each of acquire, refresh and release is **one statement** in
autocommit (an ``INSERT … ON CONFLICT DO UPDATE … WHERE`` upsert, or a guarded ``UPDATE``);
on MariaDB / MySQL acquire is one ``INSERT … ON DUPLICATE KEY UPDATE`` and refresh a guarded
``UPDATE`` followed by a read of the row, in autocommit (release is one ``UPDATE`` either way);
the row lock the statement takes makes it a compare-and-set, so exactly one of many
concurrent acquirers wins. Elsewhere, or with ``DJANGO_LEASES["TUNED_SQL"] = False``, a
portable ORM path (``SELECT … FOR UPDATE`` then ``UPDATE`` in one transaction) keeps the same
rules; the conformance suite runs both on PostgreSQL.

**Epochs** (PostgreSQL, both paths). A new grant's token is never below
``(timeline - 1) × EPOCH_SPAN + 1``, the *epoch floor* of the server's current WAL timeline
(:data:`PG_EPOCH_FLOOR`): on a database that never failed over (timeline 1) tokens are
1, 2, 3…; after a promotion (timeline 2) the next grant of every key is at least
1,000,000,000,001, above every token the old primary can have issued — also those its
asynchronous standby never received. ``docs/operations/replication.md`` has the why and the
measurements.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, connections, models, transaction
from django.db.models import (
    BigIntegerField,
    BooleanField,
    Case,
    Expression,
    ExpressionWrapper,
    F,
    Q,
    Value,
    When,
)
from django.db.models.functions import Greatest
from django.dispatch import Signal
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_leases import clock, db
from django_leases.clock import DbNow
from django_leases.exceptions import LeaseLostError
from django_leases.renewal import UNKNOWN, Unknown
from django_leases.signals import lease_acquired, lease_released
from django_leases.validation import MAX_KEY_LENGTH, check_lease_name, check_token, ttl_seconds

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models.sql.compiler import SQLCompiler

_RETURNED = (
    "id",
    "key",
    "holder",
    "token",
    "expires_at",
    "acquired_at",
    "renewed_at",
    "released_at",
)


#: The columns an :func:`acquire_statement` returns, in order.
RETURNED_COLUMNS = _RETURNED

#: Tokens per epoch: on PostgreSQL, timeline ``n`` grants tokens above ``(n - 1) × EPOCH_SPAN``
#: (decimal, so a token reads as its epoch and its count: 2000000000007 is the 7th of
#: timeline 3's first grants' series). 10^12 takeovers of one key within one timeline (31
#: years at 1,000 a second) would reach the next epoch's floor; 9.2 million timelines fit a
#: ``bigint``.
EPOCH_SPAN = 10**12

#: PostgreSQL: the epoch floor of the server's current WAL timeline, ``(timeline - 1) ×``
#: :data:`EPOCH_SPAN` (0 on a database that never failed over), as an SQL expression.
#:
#: The timeline is read from the name of the WAL segment being written
#: (``pg_walfile_name(pg_current_wal_lsn())``, whose first 8 hex digits are the timeline of
#: WAL *insertion*): a promoted server sets it before it accepts its first write, so the
#: first grant after a promotion already has the new epoch. (``pg_control_checkpoint()``'s
#: ``timeline_id`` would not do: it changes only once the checkpoint the promotion requests
#: has completed, which is spread over ``checkpoint_completion_target`` — 133 s measured on a
#: 16 MB ``shared_buffers`` server — while the server takes writes all along.) About
#: 0.3 µs of server time; on a standby it raises, as every write does there.
PG_EPOCH_FLOOR = (
    "((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1)"
    f" * {EPOCH_SPAN})"
)


def epoch_floor_sql(connection: BaseDatabaseWrapper) -> str | None:
    """The SQL expression of the epoch floor new tokens must exceed on ``connection``:
    :data:`PG_EPOCH_FLOOR` on PostgreSQL, ``None`` elsewhere (SQLite has no replication;
    MariaDB / MySQL has no timeline to read: see ``docs/operations/replication.md``)."""
    return PG_EPOCH_FLOOR if connection.vendor == "postgresql" else None


def token_epoch(token: int) -> int:
    """The epoch of a fencing token (``int`` ≥ 1): 0 for tokens of a database that never
    failed over, ``n - 1`` for tokens granted on PostgreSQL timeline ``n``."""
    return (int(token) - 1) // EPOCH_SPAN


class EpochFloor(Expression):
    """The epoch floor (:func:`epoch_floor_sql`) as an ORM expression: 0 where there is none."""

    output_field = BigIntegerField()

    def as_sql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper
    ) -> tuple[str, tuple[str | int, ...]]:
        return epoch_floor_sql(connection) or "0", ()


def grant_sql(connection: BaseDatabaseWrapper) -> str:
    """The last five columns of a fresh grant (``token, expires_at, acquired_at,
    renewed_at, released_at``) for :func:`acquire_statement`'s rows, on the database clock;
    takes one parameter, the TTL through :func:`~django_leases.clock.seconds_param`."""
    now = clock.now_sql(connection)
    return f"1, {clock.now_plus_sql(connection)}, {now}, {now}, NULL"


def released_grant_sql(connection: BaseDatabaseWrapper) -> str:
    """:func:`grant_sql`'s five columns for a grant released as it is made (expiry and
    release at DB now): for a statement that does the holder's whole work in itself and
    needs only that nobody else holds the key live meanwhile. Takes no parameter; use it
    with :func:`acquire_statement`'s ``released=True``."""
    now = clock.now_sql(connection)
    return f"1, {now}, {now}, {now}, {now}"


def next_token_sql(token: str, floor: str | None) -> str:
    """SQL for the token a takeover grants after ``token`` (an SQL expression): ``token + 1``,
    and with an epoch ``floor`` (:func:`epoch_floor_sql`) at least ``floor + 1``."""
    if floor is None:
        return f"{token} + 1"
    return f"GREATEST({token} + 1, {floor} + 1)"


def acquire_statement(
    connection: BaseDatabaseWrapper,
    table: str,
    rows: str,
    *,
    released: bool = False,
    floor: str | None = None,
) -> str:
    """The acquire rules (module docstring) as one ``INSERT … ON CONFLICT DO UPDATE … WHERE``
    over ``rows``: a ``VALUES`` list or ``SELECT`` giving ``key, holder`` followed by
    :func:`grant_sql`'s columns. It returns the granted rows (``RETURNED_COLUMNS``); a key
    held live by another holder gives no row. The one place the acquire rule is written for
    SQL: ``acquire`` uses it, and so does a statement that takes a lease along with other
    work (the workflow worker's pick of a run, which takes the run lease with it).
    ``released``: the rows are :func:`released_grant_sql`'s, and a takeover keeps their
    release time (the grant is over as it is made). ``floor``: the epoch floor
    (:func:`epoch_floor_sql`) a takeover's token must exceed (``rows`` then give a new key
    ``floor + 1`` themselves); ``None`` keeps ``token + 1``."""
    now = clock.now_sql(connection)
    kept = f"(l.holder = excluded.holder AND l.expires_at > {now})"
    return (
        f"INSERT INTO {table} AS l "
        "(key, holder, token, expires_at, acquired_at, renewed_at, released_at) "
        f"{rows} "
        "ON CONFLICT (key) DO UPDATE SET "
        f"token = CASE WHEN {kept} THEN l.token ELSE {next_token_sql('l.token', floor)} END, "
        f"acquired_at = CASE WHEN {kept} THEN l.acquired_at ELSE excluded.acquired_at END, "
        "holder = excluded.holder, expires_at = excluded.expires_at, "
        "renewed_at = excluded.renewed_at, "
        f"released_at = {'excluded.released_at' if released else 'NULL'} "
        f"WHERE l.expires_at <= {now} OR l.holder = excluded.holder "
        f"RETURNING {', '.join(_RETURNED)}"
    )


def mysql_acquire_statement(connection: BaseDatabaseWrapper, table: str) -> str:
    """MariaDB / MySQL: the acquire rules (module docstring) as one ``INSERT … ON DUPLICATE
    KEY UPDATE`` taking four parameters: key, holder and the TTL twice (through
    :func:`~django_leases.clock.seconds_param`). It has no ``WHERE``: a key held live by
    another holder keeps every column as it was, so its holder is not the caller's.

    MySQL assigns left to right, each assignment seeing the columns already assigned: the
    token, times and ``released_at`` are decided first on the old holder and expiry, then
    the holder, then the expiry (whose test then sees the new holder on a grant, the old one
    on a refusal). MariaDB appends ``RETURNING`` (:data:`RETURNED_COLUMNS`) to it."""
    q = connection.ops.quote_name
    now = clock.now_sql(connection)
    grant = f"({q('expires_at')} <= {now} OR {q('holder')} = VALUES({q('holder')}))"
    kept = f"({q('holder')} = VALUES({q('holder')}) AND {q('expires_at')} > {now})"
    columns = ", ".join(q(c) for c in _RETURNED[1:])
    return (
        f"INSERT INTO {table} ({columns}) "
        f"VALUES (%s, %s, 1, {clock.now_plus_sql(connection)}, {now}, {now}, NULL) "
        "ON DUPLICATE KEY UPDATE "
        f"{q('token')} = IF({grant}, IF({kept}, {q('token')}, {q('token')} + 1), {q('token')}), "
        f"{q('acquired_at')} = IF({grant}, IF({kept}, {q('acquired_at')}, {now}), "
        f"{q('acquired_at')}), "
        f"{q('renewed_at')} = IF({grant}, {now}, {q('renewed_at')}), "
        f"{q('released_at')} = IF({grant}, NULL, {q('released_at')}), "
        f"{q('holder')} = IF({grant}, VALUES({q('holder')}), {q('holder')}), "
        f"{q('expires_at')} = IF({grant}, {clock.now_plus_sql(connection)}, {q('expires_at')})"
    )


def release_held_statement(table: str, key_where: str) -> str:
    """PostgreSQL: :meth:`LeaseQuerySet.release_held` as one statement; ``key_where`` is the
    condition picking the key (``"key = %s"``, or one that also requires work done in the
    same statement), followed by two parameters: holder and token. It returns one row,
    ``live``, when it released the lease."""
    return (
        f"WITH old AS (SELECT id, expires_at > statement_timestamp() AS live FROM {table} "
        f"WHERE {key_where} AND holder = %s AND token = %s AND released_at IS NULL FOR UPDATE) "
        f"UPDATE {table} AS l SET released_at = statement_timestamp(), "
        "expires_at = CASE WHEN l.expires_at > statement_timestamp() "
        "THEN statement_timestamp() ELSE l.expires_at END "
        "FROM old WHERE l.id = old.id AND l.released_at IS NULL RETURNING old.live"
    )


# -- PostgreSQL: the lease operations as functions frozen in a migration ------------------------

#: The migration that installs :func:`lease_functions` (frozen text; the test suite checks
#: that the code's definitions and the migration's agree).
LEASE_FUNCTIONS_MIGRATION = "0030_lease_epochs"

#: The table the functions work on (the model's ``db_table``, quoted).
_PG_TABLE = '"django_leases_lease"'

#: Seconds → microseconds: the TTL goes to the functions as a whole number of microseconds,
#: so the expiry they compute is exactly ``renewed_at + timedelta(microseconds=ttl_us)``.
_MICROSECONDS = 1_000_000


def _pg_acquire_body(table: str) -> str:
    # acquire_statement's rules, returning only what a Lease needs beyond what the caller
    # sent: id, token, expiry and the time of the grant (renewed_at is expiry - TTL).
    # The steady state first: the key's row exists, so a guarded UPDATE with the upsert's own
    # SET and WHERE grants it (no identity value drawn, no speculative insert); only when it
    # matched nothing (a new key, or held live by another holder) does the upsert run, which
    # inserts, or refuses, or wins a race with a concurrent first acquire exactly as before.
    # The epoch floor is read only where a token is made (a takeover, a new key), never on
    # the live holder's re-acquire.
    now = "statement_timestamp()"
    expiry = f"{now} + p_ttl_us * interval '1 microsecond'"
    floor = PG_EPOCH_FLOOR
    sql = acquire_statement(
        _PgRules(),  # type: ignore[arg-type]  # only .vendor is read
        table,
        f"VALUES (p_key, p_holder, {floor} + 1, {expiry}, {now}, {now}, NULL)",
        floor=floor,
    )
    head, _, _ = sql.rpartition(" RETURNING ")
    returning = (
        "RETURNING l.id, l.token, l.expires_at, l.acquired_at "
        "INTO r_id, r_token, r_expires_at, r_acquired_at;"
    )
    kept = f"(l.holder = p_holder AND l.expires_at > {now})"
    update = (
        f"UPDATE {table} AS l SET "
        f"token = CASE WHEN {kept} THEN l.token ELSE {next_token_sql('l.token', floor)} END, "
        f"acquired_at = CASE WHEN {kept} THEN l.acquired_at ELSE {now} END, "
        f"holder = p_holder, expires_at = {expiry}, renewed_at = {now}, released_at = NULL "
        f"WHERE l.key = p_key AND (l.expires_at <= {now} OR l.holder = p_holder) "
    )
    return f"{update}{returning}\n    IF NOT FOUND THEN\n        {head} {returning}\n    END IF;"


class _PgRules:
    """Stands in for a PostgreSQL connection where only the clock's SQL is asked for."""

    vendor = "postgresql"


def _pg_function(name: str, arguments: str, returns: str, body: str) -> tuple[str, str]:
    digest = hashlib.sha256(f"{arguments}|{returns}|{body}".encode()).hexdigest()[:12]
    full = f"{name}_{digest}"
    returned = f" {returns}" if returns else ""
    return full, (
        f"CREATE OR REPLACE FUNCTION {full}({arguments}){returned}"
        " LANGUAGE plpgsql VOLATILE AS $dl$\n#variable_conflict use_column\nBEGIN\n    "
        f"{body}\nEND\n$dl$"
    )


def lease_functions(table: str = _PG_TABLE) -> dict[str, str]:
    """PostgreSQL: ``acquire``, ``refresh`` and ``release`` as PL/pgSQL functions, the
    ``CREATE OR REPLACE FUNCTION`` statement of each by its name (``dl_lease_<op>_<hash>``,
    the hash of its definition, so a changed rule is a new function beside the old one).

    Why functions: PostgreSQL caches the plan of a PL/pgSQL function's statement for the
    session, so a call costs the server about what a prepared statement does — without a
    protocol-level prepared statement, which a pooler in transaction mode (PgBouncer before
    1.21, or without ``max_prepared_statements``) cannot keep: a function is in the database,
    every server connection has it, inside ``atomic()`` or not. They return only what the
    caller needs: acquire ``(id, token, expires_at, acquired_at)`` (all NULL when refused),
    refresh the new ``expires_at`` (NULL when not held), release whether it released. The TTL
    is a whole number of microseconds (``bigint``). Frozen in migration
    :data:`LEASE_FUNCTIONS_MIGRATION`; ``table`` is the quoted table name."""
    live = "key = p_key AND holder = p_holder AND token = p_token AND released_at IS NULL"
    made = dict(
        (
            _pg_function(
                "dl_lease_acquire",
                "p_key text, p_holder text, p_ttl_us bigint, OUT r_id bigint, "
                "OUT r_token bigint, OUT r_expires_at timestamptz, OUT r_acquired_at timestamptz",
                "",
                _pg_acquire_body(table),
            ),
            _pg_function(
                "dl_lease_refresh",
                "p_key text, p_holder text, p_token bigint, p_ttl_us bigint, "
                "OUT r_expires_at timestamptz",
                "",
                # released_at IS NULL: see LeaseQuerySet.refresh.
                f"UPDATE {table} SET expires_at = statement_timestamp() + p_ttl_us * "
                "interval '1 microsecond', renewed_at = statement_timestamp() "
                f"WHERE {live} AND expires_at > statement_timestamp() "
                "RETURNING expires_at INTO r_expires_at;",
            ),
            _pg_function(
                "dl_lease_release",
                "p_key text, p_holder text, p_token bigint",
                "RETURNS boolean",
                f"UPDATE {table} SET released_at = statement_timestamp(), expires_at = CASE "
                "WHEN expires_at > statement_timestamp() THEN statement_timestamp() "
                f"ELSE expires_at END WHERE {live};\n    RETURN FOUND;",
            ),
        )
    )
    return made


_FUNCTIONS = lease_functions()
_name = {
    op: next(n for n in _FUNCTIONS if n.startswith(f"dl_lease_{op}_"))
    for op in ("acquire", "refresh", "release")
}
#: The calls of the functions, as the tuned PostgreSQL path sends them (one statement each).
PG_ACQUIRE = f"SELECT * FROM {_name['acquire']}(%s, %s, %s)"
PG_REFRESH = f"SELECT {_name['refresh']}(%s, %s, %s, %s)"
PG_RELEASE = f"SELECT {_name['release']}(%s, %s, %s)"
del _name

#: Aliases whose database a call found without this code's lease functions (dropped, or a
#: release deployed before its ``migrate``), for the life of the process: their leases take
#: the plain statements from then on (:func:`_call_function`).
_without_functions: set[str] = set()


class _FunctionGone(Exception):
    """A lease function was missing outside a transaction: the operation runs again on the
    plain statements."""


def _calls_functions(connection: BaseDatabaseWrapper) -> bool:
    """Whether leases on ``connection`` call :func:`lease_functions`: PostgreSQL on the tuned
    path, and none of them found missing in this process."""
    return (
        connection.vendor == "postgresql"
        and db.tuned(connection, "postgresql")
        and connection.alias not in _without_functions
    )


def _call_function(connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any]) -> Any:
    """One of :data:`PG_ACQUIRE`, :data:`PG_REFRESH`, :data:`PG_RELEASE` on ``connection``;
    returns its row. A missing function is not the caller's failure: the alias takes the
    plain statements for the rest of the process, a warning says so once, and outside a
    transaction :class:`_FunctionGone` has the operation run again that way at once. Inside
    one the error is raised (the failed call aborted that transaction; the next call is
    plain).

    Raises:
        DatabaseError: the database failed, or a function was missing inside a transaction.
    """
    try:
        return db.hot_fetchone(connection, sql, params)
    except DatabaseError as exc:
        db.functions_gone(
            exc,
            connection.alias,
            _without_functions,
            "Database %(alias)r lacks a lease function of this version (%(error)s): leases "
            "there take plain statements from now on. Run 'manage.py migrate', or where every "
            "migration is applied, 'manage.py leases_check --install-functions'.",
        )
        if not db.outside_transactions(connection):
            raise
        raise _FunctionGone from exc


#: Leases per statement of :meth:`LeaseQuerySet.refresh_many` where each needs parameters of
#: its own in the SQL (MariaDB / MySQL, the portable path).
_REFRESH_CHUNK = 500


#: A lease's grant: its key, holder and token.
_Grant = tuple[str, str, int]


def _grant(lease: Lease) -> _Grant:
    """``lease``'s grant, which names it whether it was read from a row or built by hand."""
    return (lease.key, lease.holder, lease.token)


def announce(signal: Signal, lease: Lease, alias: str) -> None:
    """Send lease signal ``signal`` (``lease_acquired``, ``lease_released``) for ``lease`` once
    the transaction open on database ``alias`` commits — at once outside a transaction, never
    if it rolls back: receivers hear of grants and releases that happened, each once.
    ``send_robust``: a failing receiver is logged, and never makes a granted lease look
    refused (it would stay taken, unknown to anyone, until it lapsed). Under manual
    transaction management, at once (:func:`db.after_commit`)."""
    db.after_commit(lambda: signal.send_robust(sender=Lease, lease=lease), alias)


def _check_lease(lease: object) -> None:
    """Refuse what is not a :class:`Lease` (``ValueError``), or one whose key, holder or
    token no lease row could hold (one built by hand): never a database error."""
    if not isinstance(lease, Lease):
        raise ValueError(f"Expected a Lease (as returned by acquire), not {type(lease).__name__}")
    check_lease_name(lease.key, "key")
    check_lease_name(lease.holder, "holder")
    check_token(lease.token, "Lease token")


def _held_q(lease: Lease, *, live: bool = False) -> Q:
    """The row of ``lease`` while its holder still has it: key, holder and token match and
    it was not released (and, with ``live``, has not lapsed on the database clock)."""
    held = Q(key=lease.key, holder=lease.holder, token=lease.token, released_at__isnull=True)
    return held & Q(expires_at__gt=DbNow()) if live else held


def _released_expiry() -> Case:
    """``expires_at`` of a release: a live lease ends now; a lapsed one keeps its expiry."""
    return Case(When(expires_at__gt=DbNow(), then=DbNow()), default=F("expires_at"))


class LeaseState(models.TextChoices):
    """What an operator sees: held now, expired on the database clock, or given back."""

    LIVE = "live", _("live")
    LAPSED = "lapsed", _("lapsed")
    RELEASED = "released", _("released")


#: The vendors with one-statement acquire, refresh and release.
_TUNED = ("postgresql", "sqlite")


class LeaseQuerySet(db.RoutedQuerySet["Lease"]):
    """Domain methods of ``Lease.objects``. Each opens whatever transaction it needs."""

    # -- helpers ---------------------------------------------------------------------------

    def _alias(self) -> str:
        return self.write_alias()

    def _connection(self) -> BaseDatabaseWrapper:
        return connections[self.write_alias()]

    def _table(self, connection: BaseDatabaseWrapper) -> str:
        return str(connection.ops.quote_name(self.model._meta.db_table))

    def _from_row(self, connection: BaseDatabaseWrapper, row: Sequence[Any]) -> Lease:
        values = list(row)
        # The raw cursor returns SQLite's text timestamps, and MySQL's naive ones; convert
        # as Django's field does (MySQL: only with USE_TZ, as Django's own converter).
        if connection.vendor == "sqlite" or (connection.vendor == "mysql" and settings.USE_TZ):
            convert = connection.ops.convert_datetimefield_value  # type: ignore[attr-defined]
            for index in range(4, 8):
                if values[index] is not None:
                    values[index] = convert(values[index], None, connection)
        return self.model.from_db(self._alias(), _RETURNED, values)

    def _refreshed(
        self, connection: BaseDatabaseWrapper, lease: Lease, expires_at: datetime, ttl_us: int
    ) -> Lease:
        """``lease`` as a refresh on PostgreSQL's tuned path left it: the new ``expires_at``
        the statement returned, and ``renewed_at`` that less the TTL (``ttl_us``,
        microseconds), so the statement need not return the row."""
        renewed_at = expires_at - timedelta(microseconds=ttl_us)
        values = (
            lease.pk,
            lease.key,
            lease.holder,
            lease.token,
            expires_at,
            lease.acquired_at,
            renewed_at,
            None,
        )
        return self.model.from_db(connection.alias, _RETURNED, values)

    # -- the lease operations -----------------------------------------------------------------

    def acquire(self, key: str, holder: str, ttl: float | timedelta) -> Lease | None:
        """Take ``key`` for ``holder`` for ``ttl`` (a ``timedelta`` or seconds > 0).

        Returns the granted :class:`Lease` (with its fencing ``token``), or ``None`` when
        another holder has it live. Never waits.

        Raises ``ValueError`` for a bad key, holder or TTL, before anything is written.
        """
        check_lease_name(key, "key")
        check_lease_name(holder, "holder")
        return self.acquire_checked(key, holder, ttl_seconds(ttl))

    def acquire_checked(self, key: str, holder: str, seconds: float) -> Lease | None:
        """:meth:`acquire` for arguments the caller has already checked (``key`` and
        ``holder`` valid names, ``seconds`` a valid TTL as a ``float``, as
        :func:`~django_leases.validation.ttl_seconds` returns it): ``hold_lease`` checks them
        once per hold, not once per call. Returns the :class:`Lease` or ``None``."""
        connection = self._connection()
        lease: Lease | None
        if _calls_functions(connection):
            try:
                lease = self._acquire_pg(connection, key, holder, seconds)
            except _FunctionGone:
                lease = self._acquire_sql(connection, key, holder, seconds)
        elif db.tuned(connection, "mysql"):
            lease = self._acquire_mysql(connection, key, holder, seconds)
        elif db.tuned(connection, *_TUNED):
            lease = self._acquire_sql(connection, key, holder, seconds)
        else:
            lease = self._acquire_orm(key, holder, seconds)
        if lease is not None:
            announce(lease_acquired, lease, connection.alias)
        return lease

    def _acquire_pg(
        self, connection: BaseDatabaseWrapper, key: str, holder: str, seconds: float
    ) -> Lease | None:
        ttl_us = round(seconds * _MICROSECONDS)
        row = _call_function(connection, PG_ACQUIRE, (key, holder, ttl_us))
        if row is None or row[0] is None:
            return None
        pk, token, expires_at, acquired_at = row
        renewed_at = expires_at - timedelta(microseconds=ttl_us)
        values = (pk, key, holder, token, expires_at, acquired_at, renewed_at, None)
        return self.model.from_db(connection.alias, _RETURNED, values)

    def _acquire_sql(
        self, connection: BaseDatabaseWrapper, key: str, holder: str, seconds: float
    ) -> Lease | None:
        sql = acquire_statement(
            connection, self._table(connection), f"VALUES (%s, %s, {grant_sql(connection)})"
        )
        params = (key, holder, clock.seconds_param(connection, seconds))
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        return None if row is None else self._from_row(connection, row)

    def _acquire_mysql(
        self, connection: BaseDatabaseWrapper, key: str, holder: str, seconds: float
    ) -> Lease | None:
        sql = mysql_acquire_statement(connection, self._table(connection))
        ttl = clock.seconds_param(connection, seconds)
        params = (key, holder, ttl, ttl)
        returned = ", ".join(connection.ops.quote_name(c) for c in _RETURNED)
        if connection.mysql_is_mariadb:  # type: ignore[attr-defined]  # Django's MySQL backend
            # One statement: MariaDB returns the row as the upsert left it.
            with connection.cursor() as cursor:
                cursor.execute(f"{sql} RETURNING {returned}", params)
                row = cursor.fetchone()
        else:
            # MySQL 8 has no RETURNING: the row is read under the lock the upsert took.
            with transaction.atomic(using=self._alias()), connection.cursor() as cursor:
                cursor.execute(sql, params)
                cursor.execute(
                    f"SELECT {returned} FROM {self._table(connection)} "
                    f"WHERE {connection.ops.quote_name('key')} = %s",
                    [key],
                )
                row = cursor.fetchone()
        if row is None or row[_RETURNED.index("holder")] != holder:
            return None  # held live by another holder: the upsert changed nothing
        return self._from_row(connection, row)

    def from_returned(self, connection: BaseDatabaseWrapper, row: Sequence[Any]) -> Lease:
        """The :class:`Lease` from the columns an :func:`acquire_statement` returned (in
        ``RETURNED_COLUMNS`` order), e.g. as part of a larger statement's row."""
        return self._from_row(connection, row)

    def _acquire_orm(self, key: str, holder: str, seconds: float) -> Lease | None:
        alias = self._alias()
        expiry = clock.db_now_plus(seconds)
        qs = self.model._default_manager.using(alias)
        # A placeholder row (token 0, lapsed long ago) so there is a row to lock; it then
        # takes the takeover path below and comes out with token 1 (the epoch floor + 1).
        long_ago = datetime(2000, 1, 1, tzinfo=UTC if settings.USE_TZ else None)
        placeholder = [self.model(key=key, holder=holder, token=0, expires_at=long_ago)]

        def ensure_row() -> None:
            # Only for a key never seen: InnoDB's duplicate-key check of an insert takes a
            # shared lock on an existing row, which a takeover does not need.
            if not qs.filter(key=key).exists():
                qs.bulk_create(placeholder, ignore_conflicts=True)

        outside = db.outside_transactions(connections[alias])
        if outside:
            # Its own statement, committed at once: that shared lock, kept to the locking
            # read below, would deadlock two acquirers (each holding it, each waiting to lock
            # the row).
            ensure_row()
        with transaction.atomic(using=alias):
            if not outside:
                ensure_row()
            live = ExpressionWrapper(Q(expires_at__gt=DbNow()), output_field=BooleanField())
            current = qs.select_for_update().annotate(live=live).get(key=key)
            is_live = bool(current.live)  # type: ignore[attr-defined]  # the annotation
            if is_live and current.holder != holder:
                return None
            kept = is_live and current.holder == holder
            updates: dict[str, Any] = {
                "holder": holder,
                "expires_at": expiry,
                "renewed_at": DbNow(),
                "released_at": None,
            }
            if not kept:
                token: Any = F("token") + 1
                if epoch_floor_sql(connections[alias]) is not None:
                    token = Greatest(token, EpochFloor() + 1)
                updates["token"] = token
                updates["acquired_at"] = DbNow()
            qs.filter(pk=current.pk).update(**updates)
            return qs.get(pk=current.pk)

    def refresh(self, lease: Lease, ttl: float | timedelta) -> Lease | None:
        """Extend a held lease to database now + ``ttl`` (``timedelta`` or seconds > 0).

        Returns the refreshed lease (same token), or ``None`` when ``lease`` is no longer held:
        lapsed on the database clock (even if nobody took it), released, or taken by another
        holder or token. Raises ``ValueError`` for a bad TTL or when ``lease`` is not a
        :class:`Lease`. Reference rules L4, L6, L7.
        """
        _check_lease(lease)
        return self.refresh_checked(lease, ttl_seconds(ttl))

    def refresh_checked(self, lease: Lease, seconds: float) -> Lease | None:
        """:meth:`refresh` for arguments the caller has already checked (``lease`` a
        :class:`Lease`, ``seconds`` a valid TTL as a ``float``): the renewal loop of
        ``hold_lease`` checks them once per hold. Returns the refreshed lease or ``None``."""
        connection = self._connection()
        if _calls_functions(connection):
            ttl_us = round(seconds * _MICROSECONDS)
            with contextlib.suppress(_FunctionGone):  # then the plain statement, below
                row = _call_function(
                    connection, PG_REFRESH, (lease.key, lease.holder, lease.token, ttl_us)
                )
                expires_at = None if row is None else row[0]
                if expires_at is None:
                    return None
                return self._refreshed(connection, lease, expires_at, ttl_us)
        if db.tuned(connection, "mysql"):
            return self._refresh_mysql(connection, lease, seconds)
        if not db.tuned(connection, *_TUNED):
            alias = self._alias()
            qs = self.model._default_manager.using(alias)
            held = qs.filter(_held_q(lease, live=True))
            with transaction.atomic(using=alias):
                updated = held.update(expires_at=clock.db_now_plus(seconds), renewed_at=DbNow())
                return qs.get(key=lease.key) if updated else None
        now = clock.now_sql(connection)
        # ``released_at IS NULL``: a renewal that was already waiting for the row lock when
        # the holder released (PostgreSQL re-checks the WHERE on the new row, but with the
        # statement's start time) must not bring the released lease back.
        sql = (
            f"UPDATE {self._table(connection)} "
            f"SET expires_at = {clock.now_plus_sql(connection)}, renewed_at = {now} "
            f"WHERE key = %s AND holder = %s AND token = %s AND released_at IS NULL "
            f"AND expires_at > {now} "
            f"RETURNING {', '.join(_RETURNED)}"
        )
        params = (clock.seconds_param(connection, seconds), lease.key, lease.holder, lease.token)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        return None if row is None else self._from_row(connection, row)

    def refresh_many(
        self, held: Sequence[tuple[Lease, float | timedelta]]
    ) -> list[Lease | Unknown | None]:
        """Refresh several held leases at once: :meth:`refresh`'s rule for each
        ``(lease, ttl)`` of ``held`` (``ttl`` a ``timedelta`` or seconds > 0, its own for
        each lease), on the database clock, in **one statement** where the database allows.

        Returns one entry per item, in order: the refreshed lease (same token), ``None``
        when that lease is no longer held (lapsed, released, or taken by another holder or
        token), or :data:`~django_leases.renewal.UNKNOWN` when its row was locked by another
        transaction (a ``fenced()`` block, a ``SELECT … FOR UPDATE``): that row is skipped,
        not waited for, so one locked row never holds up the renewal of the others; nothing
        is said of that lease (PostgreSQL, MariaDB >= 10.6, MySQL >= 8; SQLite locks the
        whole database, not rows). A failure of the statement raises (Django's
        ``DatabaseError``): it says nothing of any lease. Raises ``ValueError`` for a bad
        TTL, or an item that is not a :class:`Lease`, before anything is sent.

        The renewal loop of the process (:class:`~django_leases.renewal.Renewer`) sends this
        once per tick for every lease whose renewal is due. Tuned PostgreSQL: one statement
        (the held rows read, the unlocked ones locked with ``SKIP LOCKED`` and updated, in
        ``WITH`` parts); SQLite: one ``UPDATE … FROM json_each(…) RETURNING``; MariaDB /
        MySQL: the held rows locked (``SKIP LOCKED``), updated and read back, in one
        transaction, per 500 leases; portable path: the same through the ORM.
        """
        checked: list[tuple[Lease, float]] = []
        for lease, ttl in held:
            _check_lease(lease)
            checked.append((lease, ttl_seconds(ttl)))
        if not checked:
            return []
        connection = self._connection()
        if connection.vendor == "postgresql" and db.tuned(connection, "postgresql"):
            return self._refresh_many_pg(connection, checked)
        if db.tuned(connection, "sqlite"):
            return list(self._refresh_many_sqlite(connection, checked))
        # By grant, not row id: a lease built by hand (key, holder, token) has no id, and a
        # lapsed grant and its successor's may be asked together.
        found: dict[_Grant, Lease] = {}
        locked: set[_Grant] = set()
        for start in range(0, len(checked), _REFRESH_CHUNK):
            chunk = checked[start : start + _REFRESH_CHUNK]
            with transaction.atomic(using=self._alias()):
                if db.tuned(connection, "mysql"):
                    rows = self._refresh_many_mysql(connection, chunk)
                else:
                    rows = self._refresh_many_orm(chunk)
                renewed = {_grant(row): row for row in rows.values()}
                found.update(renewed)
                if len(renewed) < len(chunk):
                    locked.update(self._held_elsewhere(chunk, renewed))
        return [
            UNKNOWN if _grant(lease) in locked else found.get(_grant(lease)) for lease, _ in checked
        ]

    def _held_elsewhere(
        self, held: Sequence[tuple[Lease, float]], renewed: dict[_Grant, Lease]
    ) -> set[_Grant]:
        """The grants of ``held`` that a refresh skipped (not in ``renewed``) and that are
        still held as of this read (a plain read: it waits for no lock) — their rows were
        locked by another transaction; the others are no longer held."""
        skipped = {_grant(lease) for lease, _ in held} - set(renewed)
        rows = self.model._default_manager.using(self._alias()).filter(
            key__in=[key for key, _, _ in skipped], released_at__isnull=True, expires_at__gt=DbNow()
        )
        return {
            (key, holder, token)
            for key, holder, token in rows.values_list("key", "holder", "token")
            if (key, holder, token) in skipped
        }

    def _refresh_many_pg(
        self, connection: BaseDatabaseWrapper, held: Sequence[tuple[Lease, float]]
    ) -> list[Lease | Unknown | None]:
        """Tuned PostgreSQL: one statement. ``held`` reads the rows still held (no lock),
        ``locked`` locks those no other transaction has locked (``SKIP LOCKED``; ``NO KEY
        UPDATE``, the lock the ``UPDATE`` takes), ``renewed`` extends them (the guard
        checked again on the row as locked: a takeover committed since the read is not
        renewed). A row held but not renewed was locked elsewhere: unknown. Each part
        reaches the lease rows by key or id, never by a scan of the table, and the last one
        finds the rows not renewed with a hashed ``NOT IN`` (a join of the two parts was
        planned as a nested loop: a million comparisons for 1,000 leases)."""
        table = self._table(connection)
        guard = (
            "l.key = v.key AND l.holder = v.holder AND l.token = v.token "
            "AND l.released_at IS NULL AND l.expires_at > statement_timestamp()"
        )
        ttl_us = [round(seconds * _MICROSECONDS) for _, seconds in held]
        sql = (
            "WITH v AS (SELECT * FROM unnest(%s::text[], %s::text[], %s::bigint[], "
            "%s::bigint[]) AS v(key, holder, token, ttl_us)), "
            f"held AS (SELECT l.id, v.* FROM v JOIN {table} AS l ON {guard}), "
            f"locked AS (SELECT held.* FROM held JOIN {table} AS l USING (id) "
            "FOR NO KEY UPDATE OF l SKIP LOCKED), "
            f"renewed AS (UPDATE {table} AS l SET expires_at = statement_timestamp() "
            "+ v.ttl_us * interval '1 microsecond', renewed_at = statement_timestamp() "
            f"FROM locked AS v WHERE l.id = v.id AND {guard} "
            "RETURNING l.id, l.key, l.holder, l.token, l.expires_at) "
            "SELECT key, holder, token, expires_at FROM renewed UNION ALL "
            "SELECT key, holder, token, NULL FROM held WHERE id NOT IN (SELECT id FROM renewed)"
        )
        params = (
            [lease.key for lease, _ in held],
            [lease.holder for lease, _ in held],
            [lease.token for lease, _ in held],
            ttl_us,
        )
        with db.cursor(connection) as cursor:
            cursor.execute(sql, params)
            # By grant, not key: a lapsed grant and its successor's may be asked together
            # (two holds of one key in a process), and only the current one is answered.
            expiries = {(key, holder, token): at for key, holder, token, at in cursor.fetchall()}
        refreshed: list[Lease | Unknown | None] = []
        for (lease, _ttl), micros in zip(held, ttl_us, strict=True):
            grant = (lease.key, lease.holder, lease.token)
            if grant not in expiries:
                refreshed.append(None)
                continue
            expires_at = expiries[grant]
            if expires_at is None:
                refreshed.append(UNKNOWN)
                continue
            refreshed.append(self._refreshed(connection, lease, expires_at, micros))
        return refreshed

    def _refresh_many_sqlite(
        self, connection: BaseDatabaseWrapper, held: Sequence[tuple[Lease, float]]
    ) -> list[Lease | None]:
        table = self._table(connection)
        now = clock.now_sql(connection)
        expiry = clock.now_plus_sql(connection).replace("%s", "v.ttl")
        rows = [
            [lease.key, lease.holder, lease.token, clock.seconds_param(connection, seconds)]
            for lease, seconds in held
        ]
        returned = ", ".join(f"{table}.{column}" for column in _RETURNED)
        sql = (
            f"UPDATE {table} SET expires_at = {expiry}, renewed_at = {now} "
            "FROM (SELECT json_extract(value, '$[0]') AS k, json_extract(value, '$[1]') AS h, "
            "json_extract(value, '$[2]') AS t, json_extract(value, '$[3]') AS ttl "
            "FROM json_each(%s)) AS v "
            f"WHERE {table}.key = v.k AND {table}.holder = v.h AND {table}.token = v.t "
            f"AND {table}.released_at IS NULL AND {table}.expires_at > {now} "
            f"RETURNING {returned}"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [json.dumps(rows)])
            renewed = [self._from_row(connection, row) for row in cursor.fetchall()]
        found = {_grant(row): row for row in renewed}  # by grant: see refresh_many
        return [found.get(_grant(lease)) for lease, _ in held]

    def _refresh_many_mysql(
        self, connection: BaseDatabaseWrapper, held: Sequence[tuple[Lease, float]]
    ) -> dict[int, Lease]:
        """MariaDB / MySQL, inside the caller's transaction: the rows of ``held`` still held
        locked (``SKIP LOCKED`` where the server has it: a row locked elsewhere is left
        out), their expiry extended by one ``UPDATE`` (a ``CASE`` on the row id: the TTL of
        the grant the row holds, not of a lapsed grant of the same key asked beside it),
        and read back. Returns the renewed rows by id."""
        q = connection.ops.quote_name
        table = self._table(connection)
        now = clock.now_sql(connection)
        expiry = clock.now_plus_sql(connection)
        keys = ", ".join(["%s"] * len(held))
        grants = ", ".join(["(%s, %s, %s)"] * len(held))
        guard = (
            f"{q('key')} IN ({keys}) AND ({q('key')}, {q('holder')}, {q('token')}) IN ({grants}) "
            f"AND {q('released_at')} IS NULL AND {q('expires_at')} > {now}"
        )
        guard_params: list[Any] = [lease.key for lease, _ttl in held]
        for lease, _ttl in held:
            guard_params += [lease.key, lease.holder, lease.token]
        skip = " SKIP LOCKED" if connection.features.has_select_for_update_skip_locked else ""
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {q('id')}, {q('key')}, {q('holder')}, {q('token')} FROM {table} "
                f"WHERE {guard} FOR UPDATE{skip}",
                guard_params,
            )
            wanted = {(lease.key, lease.holder, lease.token): seconds for lease, seconds in held}
            locked = {row[0]: wanted[tuple(row[1:])] for row in cursor.fetchall()}
            if not locked:
                return {}
            ttls = set(locked.values())
            if len(ttls) == 1:
                expires, expires_params = expiry, [clock.seconds_param(connection, ttls.pop())]
            else:
                expires = (
                    f"CASE {q('id')} " + " ".join(f"WHEN %s THEN {expiry}" for _ in locked) + " END"
                )
                expires_params = []
                for pk, seconds in locked.items():
                    expires_params += [pk, clock.seconds_param(connection, seconds)]
            ids = ", ".join(["%s"] * len(locked))
            cursor.execute(
                f"UPDATE {table} SET {q('expires_at')} = {expires}, {q('renewed_at')} = {now} "
                f"WHERE {q('id')} IN ({ids})",
                [*expires_params, *locked],
            )
            returned = ", ".join(q(column) for column in _RETURNED)
            cursor.execute(f"SELECT {returned} FROM {table} WHERE {q('id')} IN ({ids})", [*locked])
            rows = cursor.fetchall()
        return {row[0]: self._from_row(connection, row) for row in rows}

    def _refresh_many_orm(self, held: Sequence[tuple[Lease, float]]) -> dict[int, Lease]:
        """The portable path, inside the caller's transaction: the held, live rows of
        ``held`` locked (``SKIP LOCKED`` where the database has it), each TTL's rows
        updated, and read back. Returns the renewed rows by id."""
        alias = self._alias()
        qs = self.model._default_manager.using(alias)
        wanted = {(lease.key, lease.holder, lease.token): seconds for lease, seconds in held}
        skip = connections[alias].features.has_select_for_update_skip_locked
        live = (
            qs.select_for_update(skip_locked=skip)
            .filter(
                key__in=[key for key, _, _ in wanted],
                released_at__isnull=True,
                expires_at__gt=DbNow(),
            )
            .values_list("pk", "key", "holder", "token")
        )
        by_ttl: dict[float, list[int]] = {}
        for pk, key, holder, token in live:
            seconds = wanted.get((key, holder, token))
            if seconds is not None:
                by_ttl.setdefault(seconds, []).append(pk)
        for seconds, pks in by_ttl.items():
            qs.filter(pk__in=pks).update(expires_at=clock.db_now_plus(seconds), renewed_at=DbNow())
        renewed = [pk for pks in by_ttl.values() for pk in pks]
        return {row.pk: row for row in qs.filter(pk__in=renewed)} if renewed else {}

    def _refresh_mysql(
        self, connection: BaseDatabaseWrapper, lease: Lease, seconds: float
    ) -> Lease | None:
        """MariaDB / MySQL: the guarded UPDATE in autocommit, then the row read back (no
        RETURNING on UPDATE there): two round trips where the portable path's transaction
        takes five. The count is of *matched* rows (Django connects with CLIENT.FOUND_ROWS),
        so a renewal that writes the values already there is a success."""
        q = connection.ops.quote_name
        table = self._table(connection)
        now = clock.now_sql(connection)
        held = f"{q('key')} = %s AND {q('holder')} = %s AND {q('token')} = %s"
        sql = (
            f"UPDATE {table} SET {q('expires_at')} = {clock.now_plus_sql(connection)}, "
            f"{q('renewed_at')} = {now} "
            f"WHERE {held} AND {q('released_at')} IS NULL AND {q('expires_at')} > {now}"
        )
        guard = (lease.key, lease.holder, lease.token)
        with connection.cursor() as cursor:
            cursor.execute(sql, (clock.seconds_param(connection, seconds), *guard))
            if cursor.rowcount != 1:
                return None
            returned = ", ".join(q(column) for column in _RETURNED)
            cursor.execute(f"SELECT {returned} FROM {table} WHERE {held}", guard)
            row = cursor.fetchone()
        return None if row is None else self._from_row(connection, row)

    def release(self, lease: Lease) -> bool:
        """Give ``lease`` back so the key is free at once; the row and its token stay.

        Acts only when key, holder and token match and the lease was not released already;
        a stale release (the lease passed on) is a silent no-op. Returns ``True`` when this
        call released the lease, ``False`` for a no-op. Raises ``ValueError`` when ``lease``
        is not a :class:`Lease`. Reference rules L5, L6.
        """
        _check_lease(lease)
        return self.release_checked(lease)

    def release_checked(self, lease: Lease) -> bool:
        """:meth:`release` for a ``lease`` the caller knows is a :class:`Lease` (a hold's
        own). Returns whether this call released it."""
        connection = self._connection()
        released = self._release_pg(connection, lease) if _calls_functions(connection) else None
        if released is not None:
            pass  # the function released it, or found nothing to release
        elif db.tuned(connection, *_TUNED):
            now = clock.now_sql(connection)
            sql = (
                f"UPDATE {self._table(connection)} SET released_at = {now}, "
                f"expires_at = CASE WHEN expires_at > {now} THEN {now} ELSE expires_at END "
                "WHERE key = %s AND holder = %s AND token = %s AND released_at IS NULL"
            )
            with connection.cursor() as cursor:
                cursor.execute(sql, (lease.key, lease.holder, lease.token))
                released = cursor.rowcount
        else:
            released = (
                self.rows()
                .filter(_held_q(lease))
                .update(released_at=DbNow(), expires_at=_released_expiry())
            )
        if released:
            announce(lease_released, lease, self._alias())
        return bool(released)

    def _release_pg(self, connection: BaseDatabaseWrapper, lease: Lease) -> int | None:
        """:meth:`release_checked` by its function: 1 released, 0 not (``None``: the
        function was missing; release by the plain statement)."""
        try:
            row = _call_function(connection, PG_RELEASE, (lease.key, lease.holder, lease.token))
        except _FunctionGone:
            return None
        return 1 if row is not None and row[0] else 0

    def release_held(self, lease: Lease) -> bool | None:
        """Release ``lease`` and say whether it was still held up to that moment.

        The final check and the release of a holder that vouches for its body, in one round
        trip where the database allows: ``True`` when this call released a **live** lease
        (holder and token match, not released, not lapsed on the database clock); ``False``
        when the row matched but had lapsed (it is released all the same, as :meth:`release`
        would); ``None`` when nothing matched (released already, or passed on). Sends
        ``lease_released`` as :meth:`release` does. Tuned (PostgreSQL): one statement;
        elsewhere a locked read and a guarded update in one transaction. Raises
        ``ValueError`` when ``lease`` is not a :class:`Lease`.
        """
        _check_lease(lease)
        connection = self._connection()
        if db.tuned(connection, "postgresql"):
            sql = release_held_statement(self._table(connection), "key = %s")
            with connection.cursor() as cursor:
                cursor.execute(sql, (lease.key, lease.holder, lease.token))
                row = cursor.fetchone()
            live = None if row is None else bool(row[0])
        else:
            alias = self._alias()
            with transaction.atomic(using=alias):
                held = (
                    self.rows()
                    .select_for_update()
                    .filter(_held_q(lease))
                    .annotate(
                        live=ExpressionWrapper(
                            Q(expires_at__gt=DbNow()), output_field=BooleanField()
                        )
                    )
                    .values_list("pk", "live")
                    .first()
                )
                if held is not None:
                    self.rows().filter(pk=held[0], released_at__isnull=True).update(
                        released_at=DbNow(), expires_at=_released_expiry()
                    )
            live = None if held is None else bool(held[1])
        if live is not None:
            announce(lease_released, lease, self._alias())
        return live

    def holding(self, lease: Lease) -> LeaseQuerySet:
        """The row of ``lease`` while its holder still has it live (holder and token match,
        not released, not lapsed on the database clock), else no row: for ``Exists()`` in
        a fenced write of the application's own rows (:mod:`django_leases.fencing`).
        Raises ``ValueError`` when ``lease`` is not a :class:`Lease`."""
        _check_lease(lease)
        return self.using(self._alias()).filter(_held_q(lease, live=True))

    def current(self, key: str) -> Lease | None:
        """The live lease on ``key`` (``str``), or ``None`` when absent, lapsed or released.

        Raises ``ValueError`` for a bad key.
        """
        check_lease_name(key, "key")
        return self.filter(key=key, released_at__isnull=True, expires_at__gt=DbNow()).first()

    # -- the coroutine forms: the sync methods through sync_to_async(thread_sensitive=True),
    # as Django's own async QuerySet methods (aget, acreate, …) run theirs: on the caller's
    # sync thread and connection (an async view's request thread; a TestCase's test thread).

    async def aacquire(self, key: str, holder: str, ttl: float | timedelta) -> Lease | None:
        """The coroutine form of :meth:`acquire`: same arguments (``ttl`` a ``timedelta`` or
        seconds > 0), return value (the granted :class:`Lease`, or ``None`` when another
        holder has it live; never waits) and errors (``ValueError`` for a bad key, holder
        or TTL, before anything is written)."""
        return await sync_to_async(self.acquire, thread_sensitive=True)(key, holder, ttl)

    async def arefresh(self, lease: Lease, ttl: float | timedelta) -> Lease | None:
        """The coroutine form of :meth:`refresh`: the refreshed lease (same token), or
        ``None`` when ``lease`` is no longer held (lapsed on the database clock, released or
        taken). Raises ``ValueError`` for a bad TTL (``timedelta`` or seconds > 0) or when
        ``lease`` is not a :class:`Lease`."""
        return await sync_to_async(self.refresh, thread_sensitive=True)(lease, ttl)

    async def arelease(self, lease: Lease) -> bool:
        """The coroutine form of :meth:`release`: ``True`` when this call released
        ``lease``, ``False`` for a stale release (a silent no-op). Raises ``ValueError``
        when ``lease`` is not a :class:`Lease`."""
        return await sync_to_async(self.release, thread_sensitive=True)(lease)

    async def acurrent(self, key: str) -> Lease | None:
        """The coroutine form of :meth:`current`: the live lease on ``key`` (``str``), or
        ``None`` when absent, lapsed or released. Raises ``ValueError`` for a bad key."""
        return await sync_to_async(self.current, thread_sensitive=True)(key)

    @contextmanager
    def fenced(self, lease: Lease) -> Iterator[Lease]:
        """Run a block of writes that cannot interleave with a takeover of ``lease``.

        Opens a transaction, locks the lease row (``SELECT … FOR UPDATE``; on SQLite the
        IMMEDIATE transaction's write lock) and checks holder, token and liveness on the
        database clock. Yields the locked row. Raises :class:`LeaseLostError` when the lease
        is not held, and ``ValueError`` when ``lease`` is not a :class:`Lease`. Any writes in
        the block commit with the check, or not at all.
        """
        _check_lease(lease)
        alias = self._alias()
        with transaction.atomic(using=alias):
            row = (
                self.model._default_manager.using(alias)
                .select_for_update()
                .filter(_held_q(lease, live=True))
                .first()
            )
            if row is None:
                raise LeaseLostError(lease.key)
            yield row

    def with_state(self) -> LeaseQuerySet:
        """Annotate ``state`` (live / lapsed / released) and ``seconds_left``, on the DB clock."""
        return self.annotate(
            state=Case(
                When(released_at__isnull=False, then=Value(LeaseState.RELEASED.value)),
                When(expires_at__gt=DbNow(), then=Value(LeaseState.LIVE.value)),
                default=Value(LeaseState.LAPSED.value),
                output_field=models.CharField(),
            ),
            db_now=DbNow(),
        )

    def force_release(self, key: str) -> bool:
        """Operator's release of whatever lease holds ``key``, whoever holds it.

        The token keeps rising for the next holder, and the ex-holder's next refresh or
        ``fenced()`` block fails. Returns ``True`` if a live lease was released.
        """
        check_lease_name(key, "key")
        lease = self.current(key)
        if lease is None:
            return False
        # The release statement's own answer: a new holder may take the key right after it.
        return self.release(lease)


class Lease(models.Model):
    """A named lease: at most one live holder per key, and a fencing token that only rises.

    A released lease keeps its row so the next holder's token is higher than every token
    handed out before. Times are set by the database clock.
    """

    key = models.CharField(_("key"), max_length=MAX_KEY_LENGTH)
    holder = models.CharField(_("holder"), max_length=MAX_KEY_LENGTH)
    token = models.BigIntegerField(
        _("token"), default=1, help_text=_("Fencing token; rises on every takeover.")
    )
    # Not indexed on purpose: a refresh then changes no indexed column, so PostgreSQL can
    # make it a HOT update (no index writes). Lookups go through the key.
    expires_at = models.DateTimeField(_("expires at"))
    acquired_at = models.DateTimeField(_("acquired at"), null=True, blank=True)
    renewed_at = models.DateTimeField(_("renewed at"), null=True, blank=True)
    released_at = models.DateTimeField(_("released at"), null=True, blank=True)

    objects: ClassVar[LeaseQuerySet] = LeaseQuerySet.as_manager()  # type: ignore[assignment]

    class Meta:
        app_label = "django_leases"
        ordering = ("key",)
        verbose_name = _("lease")
        verbose_name_plural = _("leases")
        permissions = (("force_release_lease", "Can force-release a lease"),)
        constraints = (
            # A constraint rather than unique=True: on PostgreSQL unique=True on a CharField
            # also builds a varchar_pattern_ops index for LIKE, which every write would pay.
            # ON CONFLICT (key) in acquire relies on this one.
            models.UniqueConstraint(fields=["key"], name="dl_lease_unique_key"),
        )

    def __str__(self) -> str:
        return gettext("%(key)s (token %(token)s, held by %(holder)s)") % {
            "key": self.key,
            "token": self.token,
            "holder": self.holder,
        }

    def seconds_left(self, db_now: datetime) -> float:
        """Seconds until expiry measured against ``db_now`` (never negative)."""
        return max(0.0, (self.expires_at - db_now).total_seconds())
