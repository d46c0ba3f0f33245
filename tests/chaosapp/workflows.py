"""The chaos test's workflow: three steps, each recording every execution in a table.

``chaos.three-steps`` runs ``first`` → ``second`` → ``third`` with the step function
``chaos.record``. Each execution inserts a row into :data:`TABLE` (run, step, attempt, worker
pid, a fresh token, ``started_at`` on the database clock) before it works, sleeps a random
``CHAOS_STEP_MIN``–``CHAOS_STEP_MAX`` seconds (the environment; default 0.05–0.4), stamps
``finished_at`` and returns ``{"token", "attempt", "pid"}``. The stored step result therefore
names the execution that produced it, and the table shows every execution that did not
land: killed ones never finish, superseded ones finish but their result is refused.

The table is created by the test (:func:`create_table_sql`, PostgreSQL or MariaDB / MySQL), not
by a migration; its times come from the database clock (:func:`now_sql`).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from typing import Any

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


def create_table_sql(connection: Any) -> str:
    """The execution table's ``CREATE TABLE`` for ``connection``'s database."""
    return CREATE_TABLE_MYSQL if connection.vendor == "mysql" else CREATE_TABLE


def now_sql(connection: Any) -> str:
    """The database clock in SQL: statement time (UTC on MariaDB / MySQL)."""
    return "UTC_TIMESTAMP(6)" if connection.vendor == "mysql" else "statement_timestamp()"


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
    token = uuid.uuid4().hex
    pid = os.getpid()
    connection = connections["default"]
    now = now_sql(connection)
    with connection.cursor() as cursor:
        insert = (
            f"INSERT INTO {TABLE} (run_id, step_name, attempt, pid, token, started_at) "
            f"VALUES (%s, %s, %s, %s, %s, {now})"
        )
        params = [str(ctx.run_id), ctx.step_name, ctx.attempt, pid, token]
        if connection.vendor == "mysql":
            cursor.execute(insert, params)
            row_id = cursor.lastrowid
        else:
            cursor.execute(f"{insert} RETURNING id", params)
            (row_id,) = cursor.fetchone()
    low = float(os.environ.get("CHAOS_STEP_MIN", "0.05"))
    high = float(os.environ.get("CHAOS_STEP_MAX", "0.4"))
    time.sleep(random.uniform(low, high))
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {TABLE} SET finished_at = {now} WHERE id = %s", [row_id])
    return {"token": token, "attempt": ctx.attempt, "pid": pid}


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
