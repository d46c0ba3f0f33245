"""The cost of exactly once: a transactional step writing one row against a plain step writing
the same row, drained by one worker thread and by four (PostgreSQL).

Each contender is a workflow of ``--steps`` steps; each step inserts one row into a table of
the benchmark's own and returns. ``plain``: ``@step_function`` (its result is written with the
next step's claim, one write per step); ``transactional``: ``@step_function(...,
transactional=True)`` (the insert and the fenced result write in one transaction, the step row
locked first). ``--runs`` runs of each are started, then one in-process ``Worker`` with 1 and
with 4 threads drains them (``run(once=True)``). Measured per step: SQL statements sent by the
worker's connections (every ``execute`` Django sends; ``BEGIN`` / ``COMMIT`` of a transaction
are not statements here), the worker
process's CPU seconds (user + system, from ``/proc``), and wall time; the load average is
recorded beside each figure. Both contenders run in one session, alternating, with the same
connection settings (``CONN_MAX_AGE = None``). A second stage times a fenced ``UPDATE`` of
one row (``FencedQuerySet.fenced_update``'s statement, the stored-fence half) on a table
without and with the ``FenceTrigger`` trigger, ``--updates`` times each, alternating. Usage::

    .venv/bin/python bench/exactly_once.py [--database-url postgres://.../x_bench] [--runs 200]

The database name must contain ``bench`` (it is created if missing, and its tables emptied).
JSON goes to ``bench/results/exactly-once-<date>.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    RESULTS_DIR,
    libpq_conninfo,
    load_average,
    machine_facts,
    process_cpu_seconds,
    versions,
    write_report,
)

TABLE = "bench_exactly_rows"
CONTENDERS = ("plain", "transactional")


def ensure_database(database_url: str) -> None:
    """Create the benchmark database if it does not exist (its name must contain bench)."""
    import psycopg
    from psycopg import sql

    conninfo = libpq_conninfo(database_url)
    name = conninfo.rsplit("/", 1)[1].split("?", 1)[0]
    if "bench" not in name:
        raise SystemExit(f"the database name must contain 'bench', not {name!r}")
    server = conninfo.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(server, autocommit=True) as connection:
        found = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
        if found.fetchone() is None:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


class Counter:
    """Statements sent by every connection of this process while :attr:`on`."""

    def __init__(self) -> None:
        self.on = False
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if self.on:
            with self._lock:
                self.count += 1
        return execute(sql, params, many, context)

    def install(self) -> None:
        from django.db import connection
        from django.db.backends.signals import connection_created

        def attach(sender: Any, connection: Any, **kwargs: Any) -> None:
            if self not in connection.execute_wrappers:
                connection.execute_wrappers.append(self)

        connection_created.connect(attach, weak=False)
        connection.ensure_connection()
        attach(None, connection)


def declare(steps: int) -> None:
    """The two contenders' step functions and workflows."""
    from django.db import connection

    from django_leases.workflows import step_function, workflow

    def insert(data: Any, ctx: Any) -> Any:
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {TABLE} (run_id, step) VALUES (%s, %s)",
                [str(ctx.run_id), ctx.step_name],
            )
        return {"n": data}

    step_function("bench.exactly.plain")(insert)
    step_function("bench.exactly.transactional", transactional=True)(
        lambda data, ctx: insert(data, ctx)
    )
    for contender in CONTENDERS:

        def flow(run: Any, input: Any, contender: str = contender) -> Any:
            return [run.step(f"s{n}", f"bench.exactly.{contender}", n) for n in range(steps)]

        workflow(f"bench.exactly.{contender}")(flow)


def reset() -> None:
    from django.db import connection

    from django_leases.models import Lease, WorkflowRun

    WorkflowRun.objects.all().delete()
    Lease.objects.filter(key__startswith="workflow-").delete()
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {TABLE}")


def measure(
    contender: str, workers: int, runs: int, steps: int, counter: Counter
) -> dict[str, Any]:
    """Start ``runs`` runs of ``contender`` and drain them with ``workers`` threads."""
    from django.db import connection

    from django_leases.models import WorkflowRun
    from django_leases.workflows import start_workflow
    from django_leases.workflows.worker import Worker

    reset()
    for n in range(runs):
        start_workflow(f"bench.exactly.{contender}", {"n": n})
    load_before = load_average()
    cpu_before = process_cpu_seconds(os.getpid())
    counter.count = 0
    counter.on = True
    began = time.monotonic()
    Worker(concurrency=workers, poll_interval=0.05).run(once=True, handle_signals=False)
    wall = time.monotonic() - began
    counter.on = False
    cpu = (process_cpu_seconds(os.getpid()) or 0.0) - (cpu_before or 0.0)
    completed = WorkflowRun.objects.filter(status="completed").count()
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*), count(DISTINCT (run_id, step)) FROM {TABLE}")
        rows, distinct = cursor.fetchone()
    total = runs * steps
    if completed != runs or distinct != total:
        raise SystemExit(f"{contender}/{workers}: {completed} runs completed, {distinct} rows")
    return {
        "contender": contender,
        "workers": workers,
        "runs": runs,
        "steps": total,
        "rows": rows,
        "wall_seconds": round(wall, 3),
        "steps_per_second": round(total / wall, 1),
        "statements_per_step": round(counter.count / total, 2),
        "cpu_ms_per_step": round(1000 * cpu / total, 3),
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }


def trigger_cost(updates: int, rounds: int) -> list[dict[str, Any]]:
    """Microseconds per fenced ``UPDATE`` of one row, without and with the trigger."""
    from django.db import connection, transaction

    from django_leases.fencing import trigger_sql

    quote = connection.ops.quote_name
    tables = {"without trigger": "bench_fenced_plain", "with trigger": "bench_fenced_guarded"}
    with connection.cursor() as cursor:
        for table in tables.values():
            cursor.execute(f"DROP TABLE IF EXISTS {table}")
            cursor.execute(
                f"CREATE TABLE {table} (id int PRIMARY KEY, balance int NOT NULL, "
                "fenced_by varchar(255) NOT NULL, fence bigint NOT NULL)"
            )
            cursor.execute(f"INSERT INTO {table} VALUES (1, 0, '', 0)")
        for statement in trigger_sql("postgresql", tables["with trigger"], quote)[0]:
            cursor.execute(statement)
    found = []
    token = 0
    for _ in range(rounds):
        for label, table in tables.items():
            statement = (
                f"UPDATE {table} SET balance = balance + 1, fenced_by = %s, fence = %s "
                "WHERE id = 1 AND (fenced_by <> %s OR fence <= %s)"
            )
            began = time.perf_counter()
            # One transaction: the statement and its trigger, not a commit's fsync, per update.
            with transaction.atomic(), connection.cursor() as cursor:
                for _ in range(updates):
                    token += 1
                    cursor.execute(statement, ["bench", token, "bench", token])
            spent = time.perf_counter() - began
            found.append(
                {
                    "table": label,
                    "updates": updates,
                    "us_per_update": round(1e6 * spent / updates, 1),
                    "load_average": load_average(),
                }
            )
            print(f"fenced UPDATE {label:>15}: {found[-1]['us_per_update']:7.1f} µs", flush=True)
    with connection.cursor() as cursor:
        for table in tables.values():
            cursor.execute(f"DROP TABLE IF EXISTS {table}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--database-url",
        default=os.environ.get(
            "BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/django_leases_bench_exactly"
        ),
    )
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=3, help="steps per run")
    parser.add_argument("--workers", default="1,4", help="worker threads, comma-separated")
    parser.add_argument("--repeat", type=int, default=2, help="alternating rounds")
    parser.add_argument("--updates", type=int, default=2000, help="fenced UPDATEs per round")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args()

    ensure_database(args.database_url)
    from bench.leases import configure_django

    configure_django(args.database_url, {})
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE TABLE IF NOT EXISTS {TABLE} "
            "(id bigserial PRIMARY KEY, run_id uuid NOT NULL, step text NOT NULL)"
        )
    declare(args.steps)
    counter = Counter()
    counter.install()
    results = []
    for _ in range(args.repeat):
        for workers in [int(w) for w in args.workers.split(",")]:
            for contender in CONTENDERS:
                found = measure(contender, workers, args.runs, args.steps, counter)
                results.append(found)
                print(
                    f"{contender:>13} {workers} worker(s): {found['steps_per_second']:8.1f} "
                    f"steps/s  {found['statements_per_step']:5.2f} statements/step  "
                    f"{found['cpu_ms_per_step']:6.2f} ms CPU/step  load "
                    f"{found['load_average_before'][0]:.2f}",
                    flush=True,
                )
    reset()
    trigger = trigger_cost(args.updates, args.repeat)
    report = {
        "benchmark": "exactly-once",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "database": "postgresql",
        "connection": "CONN_MAX_AGE=None (persistent), the same for both contenders",
        "machine": machine_facts(),
        "versions": versions(()),
        "settings": vars(args) | {"output": str(args.output)},
        "results": results,
        "fence_trigger": trigger,
    }
    path = args.output or RESULTS_DIR / f"exactly-once-{datetime.now(UTC):%Y-%m-%d-%H%M}.json"
    write_report(path, report)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
