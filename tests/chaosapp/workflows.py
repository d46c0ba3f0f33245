"""The chaos test's workflow: three steps, each recording every execution in a table.

``chaos.three-steps`` runs ``first`` → ``second`` → ``third`` with the step function
``chaos.record``. Each execution inserts a row into :data:`TABLE` (run, step, attempt, worker
pid, a fresh token, ``started_at`` on the database clock) before it works, sleeps a random
``CHAOS_STEP_MIN``–``CHAOS_STEP_MAX`` seconds (the environment; default 0.05–0.4), stamps
``finished_at`` and returns ``{"token", "attempt", "pid"}``. The stored step result therefore
names the execution that produced it, and the table shows every execution that did not
land: killed ones never finish, superseded ones finish but their result is refused.

The table is created by the test (:func:`create_table_sql`, PostgreSQL, MariaDB / MySQL or
SQLite), not by a migration; its times come from the database clock (:func:`now_sql`).
:func:`record_execution` is the recording itself (the task chaos test's ``@task`` records
through it too); :func:`executions` and :func:`busy_pids` read the table back.
"""

from __future__ import annotations

import os
import random
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from django.db import connection as default_connection
from django.db import connections

from django_leases.workflows import step_function, workflow

TABLE = "chaos_execution"
CREATE_TABLE = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    id bigserial PRIMARY KEY,
    run_id uuid NOT NULL,
    step_name text NOT NULL,
    attempt integer NOT NULL,
    pid integer NOT NULL,
    token text NOT NULL,
    started_at timestamptz NOT NULL,
    finished_at timestamptz
)
"""
#: MariaDB / MySQL: the same table (UTC times, the run id as text).
CREATE_TABLE_MYSQL = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    id bigint AUTO_INCREMENT PRIMARY KEY,
    run_id char(36) NOT NULL,
    step_name varchar(255) NOT NULL,
    attempt integer NOT NULL,
    pid integer NOT NULL,
    token varchar(64) NOT NULL,
    started_at datetime(6) NOT NULL,
    finished_at datetime(6)
) ENGINE=InnoDB
"""


#: SQLite: the same table (times as ISO text, UTC).
CREATE_TABLE_SQLITE = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    id integer PRIMARY KEY AUTOINCREMENT,
    run_id char(36) NOT NULL,
    step_name text NOT NULL,
    attempt integer NOT NULL,
    pid integer NOT NULL,
    token text NOT NULL,
    started_at text NOT NULL,
    finished_at text
)
"""


def create_table_sql(connection: Any) -> str:
    """The execution table's ``CREATE TABLE`` for ``connection``'s database."""
    return {"mysql": CREATE_TABLE_MYSQL, "sqlite": CREATE_TABLE_SQLITE}.get(
        connection.vendor, CREATE_TABLE
    )


def empty_table_sql(connection: Any) -> str:
    """The statement that empties the execution table on ``connection``'s database."""
    return f"DELETE FROM {TABLE}" if connection.vendor == "sqlite" else f"TRUNCATE {TABLE}"


def now_sql(connection: Any) -> str:
    """The database clock in SQL: statement time (UTC on MariaDB / MySQL and SQLite)."""
    return {
        "mysql": "UTC_TIMESTAMP(6)",
        "sqlite": "strftime('%Y-%m-%d %H:%M:%f', 'now')",
    }.get(connection.vendor, "statement_timestamp()")


def record_execution(run_id: Any, step_name: str, attempt: int) -> dict[str, Any]:
    """Record one execution of ``step_name`` of run ``run_id`` (its ``attempt``, this
    process's pid, a fresh token), work ``CHAOS_STEP_MIN``–``CHAOS_STEP_MAX`` seconds, stamp
    its end; returns ``{"token", "attempt", "pid"}``, which names this execution."""
    token = uuid.uuid4().hex
    pid = os.getpid()
    connection = connections["default"]
    now = now_sql(connection)
    with connection.cursor() as cursor:
        insert = (
            f"INSERT INTO {TABLE} (run_id, step_name, attempt, pid, token, started_at) "
            f"VALUES (%s, %s, %s, %s, %s, {now})"
        )
        params = [str(run_id), step_name, attempt, pid, token]
        if connection.vendor == "postgresql":
            cursor.execute(f"{insert} RETURNING id", params)
            (row_id,) = cursor.fetchone()
        else:
            cursor.execute(insert, params)
            row_id = cursor.lastrowid
    low = float(os.environ.get("CHAOS_STEP_MIN", "0.05"))
    high = float(os.environ.get("CHAOS_STEP_MAX", "0.4"))
    time.sleep(random.uniform(low, high))
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET finished_at = {now} WHERE id = %s", [row_id])
    return {"token": token, "attempt": attempt, "pid": pid}


def _aware(value: Any) -> Any:
    """A time the raw cursor read, aware as the ORM's are (MySQL's come naive, in UTC)."""
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def db_now() -> datetime:
    """The database clock as :func:`now_sql` reads it (PostgreSQL, MariaDB / MySQL)."""
    with default_connection.cursor() as cursor:
        cursor.execute(f"SELECT {now_sql(default_connection)}")
        (now,) = cursor.fetchone()
    return _aware(now)  # type: ignore[no-any-return]


def busy_pids() -> set[int]:
    """Worker pids with an execution in flight (recorded, not finished)."""
    with default_connection.cursor() as cursor:
        cursor.execute(f"SELECT DISTINCT pid FROM {TABLE} WHERE finished_at IS NULL")
        return {row[0] for row in cursor.fetchall()}


def executions() -> list[dict[str, Any]]:
    """Every recorded execution, oldest first: ``run_id`` (text), ``step_name``,
    ``attempt``, ``pid``, ``token``, ``started_at``, ``finished_at`` (``None``: unfinished)."""
    with default_connection.cursor() as cursor:
        cursor.execute(
            f"SELECT run_id, step_name, attempt, pid, token, started_at, finished_at "
            f"FROM {TABLE} ORDER BY id"
        )
        names = [c[0] for c in cursor.description]
        rows = [dict(zip(names, map(_aware, row), strict=True)) for row in cursor.fetchall()]
    for row in rows:
        row["run_id"] = str(row["run_id"])
    return rows


STEPS = ("first", "second", "third")


@workflow("chaos.three-steps")
def three_steps(run: Any, input: Any) -> Any:
    """Three recorded steps in a row; the output lists the tokens of the results used."""
    tokens: list[str] = []
    for name in STEPS:
        result = run.step(name, "chaos.record", {"n": input["n"], "after": tokens[-1:]}, retries=50)
        tokens.append(result["token"])
    return {"n": input["n"], "tokens": tokens}


@step_function("chaos.record")
def record(data: Any, ctx: Any) -> dict[str, Any]:
    """Record this execution, work a little, stamp its end and return its token."""
    return record_execution(ctx.run_id, ctx.step_name, ctx.attempt)


@workflow("chaos.waits")
def waits(run: Any, input: Any) -> Any:
    """A fan-out of three recorded steps, a short durable sleep, an event sent from outside
    (``go``) and a child run of ``chaos.three-steps``; the output gathers what each gave."""
    n = input["n"]
    fanned = run.parallel(
        [(f"fan-{i}", "chaos.record", {"n": n, "after": []}) for i in range(3)], retries=50
    )
    run.sleep("nap", float(os.environ.get("CHAOS_SLEEP", "0.5")))
    event = run.wait_for_event("go")
    child = run.child("kid", "chaos.three-steps", {"n": n})
    return {
        "n": n,
        "fanned": [result["token"] for result in fanned],
        "event": event,
        "child": child["tokens"],
    }
