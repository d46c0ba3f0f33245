"""PostgreSQL functions for the workflow worker's hot path: plans cached per connection.

Django sends parameters bound on the client (its default, which works behind any pooler), so
PostgreSQL plans every statement it receives afresh. The worker's two statements per run are
large (a step's claim with its attempt row; a result with its attempt row, the run's
completion, the run lease's release and the next run's pick with its lease), and planning them
cost more than running them. Wrapped in PL/pgSQL functions, their plans are cached by each
server connection (PL/pgSQL prepares the statements of a function on first use), and the
statement sent is a short ``SELECT * FROM function(…)``. Unlike protocol-level prepared
statements, this needs nothing from the client or from a pooler in transaction mode.

The function bodies are not written here: they are the very statements the store sends
otherwise (``store._insert_claimed_sql``, ``store._completion_sql``), built with the
functions' arguments in place of values (:class:`~django_leases.workflows.store.Arg`). A
function's name ends with a hash of its definition, so code whose statements changed never
calls a function installed for other statements: it sends its statements as such (and the
``django_leases.W013`` check says a migration is missing) until the new functions are
installed. Migrations install them with :func:`install`.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from typing import Any

from django.db import models

from django_leases.workflows import store
from django_leases.workflows.store import Arg

#: The migration that installs them (the latest that does).
MIGRATION = "0004_workflow_functions_without_jit"


class Function:
    """One function: its ``short`` name and arguments; :meth:`body` builds its statement
    and :meth:`returns` gives the SQL types of its result columns."""

    def __init__(self, short: str, *args: Arg) -> None:
        self.short = short
        self.args = args

    def body(self, connection: Any) -> tuple[str, list[Any]]:
        raise NotImplementedError

    def returns(self, connection: Any) -> tuple[str, ...]:
        raise NotImplementedError

    def definition(self, connection: Any) -> tuple[str, str]:
        """``(name, CREATE OR REPLACE FUNCTION …)`` for ``connection``'s database."""
        sql, params = self.body(connection)
        text = " ".join((sql % tuple(_literal(p) for p in params)).split())
        signature = ", ".join(f"{arg.name} {arg.sql_type}" for arg in self.args)
        columns = ", ".join(f"r{n} {t}" for n, t in enumerate(self.returns(connection)))
        template = (
            "CREATE OR REPLACE FUNCTION {name}(" + signature + ") "
            "RETURNS TABLE(" + columns + ") LANGUAGE plpgsql VOLATILE "
            # Every row these statements touch is found through an index (a primary key,
            # a unique key, the due-work indexes' order). The cached plan is made when the
            # tables may still be small, where a sequential scan or a sort looks cheaper
            # and would then stay while the tables grow: so those are ruled out here. Each
            # statement has a plan without them (tests/test_hot_path_plans.py); one that
            # had none would cost ~1e10, so JIT compilation (seconds, for statements that
            # run in a fraction of a millisecond) is switched off for them as well.
            "SET enable_seqscan = off SET enable_bitmapscan = off SET enable_sort = off "
            "SET jit = off "
            "AS $dl$\n"
            "#variable_conflict use_column\n"
            "BEGIN\n    RETURN QUERY " + text + ";\nEND\n$dl$"
        )
        digest = hashlib.sha256(template.encode()).hexdigest()[:12]
        name = f"dl_{self.short}_{digest}"
        return name, template.replace("{name}", name, 1)


def _literal(value: Any) -> str:
    if isinstance(value, Arg):
        return value.name
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"no SQL literal for {value!r}")


def _column_type(model: type[models.Model], name: str, connection: Any) -> str:
    """The SQL type of a column for a result list: without a length (``varchar``)."""
    sql_type = model._meta.get_field(name).db_type(connection) or ""
    return sql_type.split("(")[0]


class _InsertClaimed(Function):
    def body(self, connection: Any) -> tuple[str, list[Any]]:
        return store._insert_claimed_sql(*self.args)

    def returns(self, connection: Any) -> tuple[str, ...]:
        return ("bigint",)


class _CompleteRun(Function):
    def body(self, connection: Any) -> tuple[str, list[Any]]:
        return store._completion_sql(connection, *self.args)

    def returns(self, connection: Any) -> tuple[str, ...]:
        """written, completed, live; then (picking) the next pass's state and its lease."""
        from django_leases.models import Lease, WorkflowRun
        from django_leases.models.lease import RETURNED_COLUMNS

        written = ("bigint", "bigint", "boolean")
        if len(self.args) == len(_COMPLETION_ARGS):
            return written
        return (
            *written,
            *(_column_type(WorkflowRun, name, connection) for name in ("id", "workflow", "status")),
            "text",  # input::text
            _column_type(WorkflowRun, "pass_requests", connection),
            "text",  # the steps as JSON text
            *(_column_type(Lease, name, connection) for name in RETURNED_COLUMNS),
        )


#: ``_insert_claimed_pg`` with ``finish_pass``: returns the new step's id (or no row).
INSERT_CLAIMED = _InsertClaimed(
    "insert_claimed",
    Arg("p_run_id", "uuid"),
    Arg("p_step_name", "text"),
    Arg("p_function_name", "text"),
    Arg("p_data", "text"),
    Arg("p_retries", "bigint"),
    Arg("p_retry_delay", "double precision"),
    Arg("p_seconds", "double precision"),
    Arg("p_finish_pass", "bigint"),
)

_COMPLETION_ARGS = (
    Arg("p_step_id", "bigint"),
    Arg("p_payload", "text"),
    Arg("p_attempt", "bigint"),
    Arg("p_output", "text"),
    Arg("p_key", "text"),
    Arg("p_holder", "text"),
    Arg("p_token", "bigint"),
)

#: ``set_result_completing_run`` without a next pass to pick.
COMPLETE_RUN = _CompleteRun("complete_run", *_COMPLETION_ARGS)

#: ``set_result_completing_run`` that also picks the next due pass with its run lease.
COMPLETE_RUN_PICKING = _CompleteRun(
    "complete_run_picking",
    *_COMPLETION_ARGS,
    Arg("p_next_holder", "text"),
    Arg("p_next_ttl", "double precision"),
)

FUNCTIONS: tuple[Function, ...] = (INSERT_CLAIMED, COMPLETE_RUN, COMPLETE_RUN_PICKING)

#: The prefix of every function's name (``dl_<short>_<hash>``); see :func:`install`.
_PREFIXES = ("dl_insert_claimed_", "dl_complete_run_")


def definitions(connection: Any) -> dict[str, tuple[str, str]]:
    """Every function's ``(name, CREATE OR REPLACE FUNCTION …)`` for ``connection``, by
    short name."""
    return {function.short: function.definition(connection) for function in FUNCTIONS}


_lock = threading.Lock()
_calls: dict[str, dict[str, str]] = {}
_installed: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def call(function: Function, connection: Any) -> str:
    """``SELECT * FROM <name>(%s, …)``: the current code's ``function`` on ``connection``."""
    with _lock:
        calls = _calls.get(connection.alias)
        if calls is None:
            calls = {
                short: f"SELECT * FROM {name}({', '.join(['%s'] * len(f.args))})"
                for f in FUNCTIONS
                for short, (name, _) in [(f.short, f.definition(connection))]
            }
            _calls[connection.alias] = calls
    return calls[function.short]


def ready(connection: Any) -> bool:
    """Whether the current code's functions are installed in ``connection``'s database:
    looked up once per server connection (a reconnect looks again)."""
    connection.ensure_connection()
    raw = connection.connection
    known = _installed.get(raw)
    if known is None:
        names = [name for name, _ in definitions(connection).values()]
        with connection.cursor() as cursor:
            # Resolved as the calls will be: through the connection's search_path.
            cursor.execute(
                "SELECT count(*) FROM unnest(%s::text[]) AS name "
                "WHERE to_regproc(name) IS NOT NULL",
                [names],
            )
            known = cursor.fetchone()[0] == len(names)
        _installed[raw] = known
    return known


def install(connection: Any) -> None:
    """Create (or replace) the current code's functions in ``connection``'s database and drop
    the ones earlier code installed (PostgreSQL; what the migrations run). Only functions of
    the schema the current functions are created in are dropped."""
    current = {name for name, _ in definitions(connection).values()}
    with connection.cursor() as cursor:
        for _, sql in definitions(connection).values():
            cursor.execute(sql)
        cursor.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p "
            "WHERE p.pronamespace = (SELECT pronamespace FROM pg_proc WHERE oid = %s::regproc) "
            "AND p.proname LIKE ANY(%s) AND NOT p.proname = ANY(%s)",
            [
                sorted(current)[0],
                [prefix.replace("_", "\\_") + "%" for prefix in _PREFIXES],
                sorted(current),
            ],
        )
        for (stale,) in cursor.fetchall():
            cursor.execute(f"DROP FUNCTION {stale}")
    _installed.clear()
